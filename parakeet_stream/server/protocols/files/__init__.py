"""File transcription: upload bodies read within their limits (exchange, spool, form), audio
files decoded block by block (decode), fed to the engine as bulk streams (feed: the one place
that feeds bulk work) and gathered into a transcript (transcript); upload holds what every upload API shares,
batch runs many files for parakeet-transcribe. The HTTP APIs themselves are
protocols/openai_files.py and protocols/deepgram_files.py."""
