"""vLLM's realtime example client (from the "Streaming Requests & Realtime API in vLLM"
post), unchanged except for the server URL and the `model` name the post leaves undefined.

    pip install -e '.[examples]'    # librosa, websockets
    python examples/realtime_client.py examples/journey.wav [ws://127.0.0.1:8000/v1/realtime]
"""
import asyncio
import base64
import json
import sys

import librosa
import numpy as np
import websockets

model = "demo"  # any name: the server serves one model


def load_audio_as_pcm16(audio_path: str) -> bytes:
    """Load audio file and convert to PCM16 @ 16kHz."""
    audio, _ = librosa.load(audio_path, sr=16000, mono=True)
    return (audio * 32767).astype(np.int16).tobytes()


async def stream_audio_file(audio_path: str, server_url: str = "ws://localhost:8000/v1/realtime"):
    async with websockets.connect(server_url) as ws:
        response = json.loads(await ws.recv())

        # Load and convert audio to PCM16
        pcm_audio = load_audio_as_pcm16(audio_path)

        # Validate model
        await ws.send(json.dumps({"type": "session.update", "model": model}))

        # Signal start of audio stream
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))

        # Stream audio in 4KB chunks
        for i in range(0, len(pcm_audio), 4096):
            chunk = pcm_audio[i:i + 4096]
            await ws.send(json.dumps({
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(chunk).decode()
            }))

        # Signal end of audio stream
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))

        # Receive transcription
        async for message in ws:
            data = json.loads(message)
            if data["type"] == "transcription.delta":
                print(data["delta"], end="", flush=True)
            elif data["type"] == "transcription.done":
                break
        else:
            sys.exit("\nthe connection ended without transcription.done: the text above is incomplete")


asyncio.run(stream_audio_file(*sys.argv[1:3]))
