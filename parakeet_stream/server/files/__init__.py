"""File transcription: upload bodies read within their limits (exchange, spool, form), audio
files decoded block by block (decode), fed to the engine (feed) and gathered into a transcript
(transcript); upload holds what every upload API shares. The APIs themselves are
protocols/openai_files.py and protocols/deepgram_files.py; parakeet-transcribe uses decode,
feed and transcript too."""
