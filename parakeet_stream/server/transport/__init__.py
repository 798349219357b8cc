"""The transports under one connection, the lowest layer of the server: the Channel a connection
reads messages from and writes them to (channel.py; tcp.py: newline-delimited JSON, websocket.py:
WebSocket frames, ws_adapter.py: the one place that touches trio-websocket's private names), the
Wakeup that lets engine threads wake a trio task (wakeup.py), and the error codes shared by every
door and protocol (codes.py)."""
