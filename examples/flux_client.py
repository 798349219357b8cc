"""A voice agent's ear: stream a WAV file to Deepgram Flux's turn-taking API with the official
Deepgram SDK, pointed at parakeet-stream by its environment only, and print each turn as it
starts, is predicted to end, resumes and ends. The same code runs against Deepgram's cloud.

    pip install -e '.[examples]'    # deepgram-sdk
    python examples/flux_client.py examples/journey.wav [ws://127.0.0.1:8000] [API_KEY]

Exits 1 when the stream closes with a turn that never ended.
"""
import sys
import threading
import time

import numpy as np
from deepgram import DeepgramClient
from deepgram.environment import DeepgramClientEnvironment

from parakeet_stream.audio import AudioError, read_file

CHUNK_SECONDS = 0.08  # what Deepgram recommends for Flux
TAIL_SECONDS = 1.0  # silence after the file, as a caller who stopped talking


def main(path: str, server: str = "ws://127.0.0.1:8000", key: str = "unused") -> None:
    try:
        samples, rate = read_file(path, "int16")
    except AudioError as exc:  # one line: no such file, empty, not audio
        sys.exit(f"error: {exc}")
    pcm = samples.mean(axis=1).astype(np.int16).tobytes() + bytes(2 * int(rate * TAIL_SECONDS))
    http = server.replace("ws", "http", 1)
    environment = DeepgramClientEnvironment(base=http, production=server, agent=server, agent_rest=http)
    client = DeepgramClient(api_key=key, environment=environment)
    with client.listen.v2.connect(model="flux-general-en", encoding="linear16", sample_rate=str(rate),
                                  eager_eot_threshold="0.5") as socket:
        threading.Thread(target=send_paced, args=(socket, pcm, rate), daemon=True).start()
        open_turn = False
        for message in socket:  # until the server closes after CloseStream
            if message.type == "TurnInfo":
                open_turn = message.event != "EndOfTurn"
                show(message)
    if open_turn:
        sys.exit("the stream closed during a turn: its last transcript above is not final")


def send_paced(socket, pcm: bytes, rate: int) -> None:
    step = int(rate * CHUNK_SECONDS) * 2
    for start in range(0, len(pcm), step):
        socket.send_media(pcm[start : start + step])
        time.sleep(CHUNK_SECONDS)  # real time, as a microphone would
    socket.send_close_stream()


def show(message) -> None:
    if message.event == "StartOfTurn":
        print(f"turn {message.turn_index} started at {message.audio_window_end:.2f} s")
    elif message.event == "EagerEndOfTurn":
        print(f"  maybe done ({message.end_of_turn_confidence:.2f}): {message.transcript}")
    elif message.event == "TurnResumed":
        print("  ... still talking")
    elif message.event == "EndOfTurn":
        print(f"turn {message.turn_index} ({message.trigger}, {message.end_of_turn_confidence:.2f}): {message.transcript}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
