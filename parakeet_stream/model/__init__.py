"""Everything that defines and loads the network. Imports run one way:

config -> layers (features, subsampling, attention, conformer, rnnt, tokenizer) -> parakeet (the
model, read from a folder) -> precision -> convert (.nemo to a folder) -> registry (named models)
-> hub (Hugging Face) -> loading (a model by name).
"""
