"""Transcribe a WAV file with the official Deepgram SDK, pointed at parakeet-stream by its
environment only: the same code runs against Deepgram's cloud.

    pip install -e '.[examples]'    # deepgram-sdk
    python examples/deepgram_client.py examples/journey.wav [ws://127.0.0.1:8000] [API_KEY]
"""
import sys
import threading
import time

import numpy as np
from deepgram import DeepgramClient
from deepgram.environment import DeepgramClientEnvironment

from parakeet_stream.audio import AudioError, read_file

CHUNK_SECONDS = 0.1


def main(path: str, server: str = "ws://127.0.0.1:8000", key: str = "unused") -> None:
    try:
        samples, rate = read_file(path, "int16")
    except AudioError as exc:  # one line: no such file, empty, not audio
        sys.exit(f"error: {exc}")
    pcm = samples.mean(axis=1).astype(np.int16).tobytes()
    http = server.replace("ws", "http", 1)
    environment = DeepgramClientEnvironment(base=http, production=server, agent=server, agent_rest=http)
    client = DeepgramClient(api_key=key, environment=environment)
    with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=rate, interim_results="true", utterance_end_ms="1000"
    ) as socket:
        threading.Thread(target=send_paced, args=(socket, pcm, rate), daemon=True).start()
        complete = False
        for message in socket:  # until the server closes after Metadata
            show(message)
            complete = complete or message.type == "Metadata"
    if not complete:
        sys.exit("the connection ended before its Metadata: the transcript above is incomplete")


def send_paced(socket, pcm: bytes, rate: int) -> None:
    step = int(rate * CHUNK_SECONDS) * 2
    for start in range(0, len(pcm), step):
        socket.send_media(pcm[start : start + step])
        time.sleep(CHUNK_SECONDS)  # real time, as a microphone would
    socket.send_close_stream()


def show(message) -> None:
    if message.type == "Results":
        words = message.channel.alternatives[0].words
        timing = f" [{words[0].start:.2f}-{words[-1].end:.2f} s]" if words else ""
        mark = "final" if message.is_final else "interim"
        print(f"{mark}: {message.channel.alternatives[0].transcript}{timing}")
    elif message.type == "UtteranceEnd":
        print(f"-- utterance ended at {message.last_word_end:.2f} s")
    elif message.type == "Metadata":
        print(f"{message.duration:.2f} s of audio, request {message.request_id}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
