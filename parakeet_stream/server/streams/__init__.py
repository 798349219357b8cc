"""One client's connection and its audio streams through the engine: the connection's loops and
budgets (connection.py, guard.py, the access log: access.py), what a protocol plugs into (its
`Protocol` entry: protocol.py, its Session: session.py), the segments of a connection (segments.py,
each an EngineStream: stream.py, a door's handle on one engine stream), and what every protocol
reads and writes (schema.py, wire.py, words.py, phrases.py). Of the server's layers it imports
transport/ only (and context.py, which every layer is handed)."""
