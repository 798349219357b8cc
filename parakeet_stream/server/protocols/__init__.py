"""The APIs the server speaks, one module each (native, OpenAI Realtime, vLLM, Deepgram live and Flux, and the
file upload APIs openai_files.py and deepgram_files.py), the registry that lists them
(registry.py), the doors that route a TCP or WebSocket client to one (doors.py), file
transcription (files/) and NVIDIA Riva ASR over gRPC (riva/)."""
