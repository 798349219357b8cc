"""Operations scripts; the Python ones run from the repository's root as modules (`python -m scripts.gpu_check`)."""
