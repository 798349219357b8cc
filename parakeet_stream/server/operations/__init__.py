"""Running the server: the HTTP port (http.py: /health, /ready, /metrics, the web page, the upload
APIs), Prometheus metrics (metrics.py), the replica's state and HAProxy agent (replica.py), memory
handed back after closes (memory.py), the port check (ports.py), and the worker processes of
`--workers N` (workers.py; one worker's main is ../worker.py)."""
