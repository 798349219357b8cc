"""Evaluations of accuracy, run from the repository's root as modules: `python -m evaluations.phrase_eval`."""
