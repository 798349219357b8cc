"""The engine across processes: service.py serves an ASREngine on a Unix socket, client.py's
EngineClient offers the same stream API (EngineAPI) in another process (a server's worker), and
messages.py is what the two say to each other."""
