"""Transcribe a wav file with the official openai SDK against parakeet-serve's /v1/realtime.

    pip install -e '.[examples]'    # openai[realtime]
    python examples/openai_realtime_client.py examples/journey.wav [ws://127.0.0.1:8000/v1]

The key comes from OPENAI_API_KEY (needed only when the server runs with --api-key). Turn
detection is off here: the whole file is one item, committed at the end. With
`"turn_detection": {"type": "server_vad"}` the server ends an item at each end of utterance.
"""
import asyncio
import base64
import os
import sys

import numpy as np
import soxr
from openai import AsyncOpenAI

from parakeet_stream.audio import AudioError, read_file

RATE = 24000  # OpenAI's PCM rate
CHUNK_BYTES = RATE // 10 * 2  # 100 ms of PCM16


def load_pcm16(path: str) -> bytes:
    try:
        audio, rate = read_file(path)
    except AudioError as exc:  # one line: no such file, empty, not audio
        sys.exit(f"error: {exc}")
    audio = soxr.resample(audio.mean(axis=1), rate, RATE)
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


async def transcribe(path: str, base_url: str = "ws://127.0.0.1:8000/v1") -> None:
    pcm = load_pcm16(path)
    client = AsyncOpenAI(api_key=os.environ.get("OPENAI_API_KEY", "unused"), websocket_base_url=base_url)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        await connection.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": RATE},
                        "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                        "turn_detection": None,
                    }
                },
            }
        )
        for i in range(0, len(pcm), CHUNK_BYTES):
            await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + CHUNK_BYTES]).decode())
        await connection.input_audio_buffer.commit()
        async for event in connection:
            if event.type == "conversation.item.input_audio_transcription.delta":
                print(event.delta, end="", flush=True)
            elif event.type == "conversation.item.input_audio_transcription.completed":
                print(f"\ncompleted: {event.transcript}")
                break
            elif event.type == "error":
                sys.exit(f"error: {event.error.message}")
        else:
            sys.exit("\nthe connection ended without the completed transcript: the text above is incomplete")


asyncio.run(transcribe(*sys.argv[1:3]))
