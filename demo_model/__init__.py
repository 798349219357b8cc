"""The bundled demo model's corpus, tokenizer and trainer, and random-weight full-size models:
`python -m demo_model.train`, `python -m demo_model.random_model small weights/random-small`."""
