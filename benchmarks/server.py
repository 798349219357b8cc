"""The server benchmark: real-time clients against a running server (`parakeet-bench`).

It lives in the installed package (parakeet_stream/tools/bench.py) so that `parakeet-bench` works
wherever parakeet-stream is installed; this module runs the same command from the repository.

    python -m benchmarks.server --url tcp://127.0.0.1:8765 --clients 1,4,16
"""
import sys

from parakeet_stream.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
