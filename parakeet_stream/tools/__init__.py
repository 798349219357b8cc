"""Command-line tools over the model and the engine: parakeet-transcribe, parakeet-convert,
parakeet-bench, and the model fetch that scripts/serve.sh runs."""
