"""The side-by-side comparison with parakeet-streaming (README.md)."""
