"""Micro-benchmarks of one piece of the model: `python -m benchmarks.kernels.decode --help`."""
