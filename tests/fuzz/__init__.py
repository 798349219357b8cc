"""One fuzz suite for every door of the server (test_doors.py), memory under hostile churn
(test_churn.py), and the inputs that broke a door once, kept as plain tests (test_found.py).

The doors are listed in doors.py, one entry each: how to open a connection, a generator of its
hostile messages, and how a good stream looks; the streaming doors' generators are in
hostile.py, the gRPC door's in hostile_riva.py, the HTTP uploads' in hostile_uploads.py; the
request/response doors make their requests in exchanges.py and check the answers in
request_doors.py. A door added later is one more entry.

Size: FUZZ_EXAMPLES hostile connections per door (default 100, which fits CI); a release soak
runs e.g. `FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/fuzz`. FUZZ_SEED picks another
seeded sequence (default 0).
"""
