"""Benchmarks, run from the repository's root as modules: `python -m benchmarks.host --help`.

engine, host, files, model, workers, turns: the engine and the server under load;
kernels/: one piece of the model timed alone; vs_parakeet_streaming/: the side-by-side comparison;
common.py: what they share (percentiles, the speech they stream, the machine's facts).
The benchmark of a running server is the installed `parakeet-bench` command (also `python -m benchmarks.server`).
"""
