"""NVIDIA Riva speech recognition over gRPC (`--grpc-port`), as `nvidia-riva-client` speaks it:
`StreamingRecognize`, `Recognize` and `GetRivaSpeechRecognitionConfig` of
`nvidia.riva.asr.RivaSpeechRecognition`, on the messages the client package ships.

door.py runs grpc's asyncio server on its own thread and loop beside trio; servicer.py gates the
calls; streaming.py and offline.py are the two recognition calls; options.py, audio_input.py and
wav.py read what a call asks for; engine_stream.py feeds the engine; transcript.py writes the
results.
"""
from .door import RivaDoor, serve_riva

__all__ = ["RivaDoor", "serve_riva"]
