"""The engine across processes: service.py serves an ASREngine on a Unix socket to the server's
worker processes (one WorkerConnection per worker), engine_client.py's EngineClient offers the same
stream API (EngineAPI) in a worker process, over engine_connection.py's EngineConnection (the
socket, its sending and reading threads), and messages.py is what the two say to each other."""
