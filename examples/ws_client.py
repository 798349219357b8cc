"""Stream a WAV file at real time over WebSocket with parakeet_stream.client, at the
file's own sample rate (the server resamples), printing each caption as it arrives.

    python examples/ws_client.py examples/journey.wav [ws://127.0.0.1:8000/]
"""
import sys

import trio

from parakeet_stream.audio import AudioError, read_file
from parakeet_stream.client import connect, send_paced


async def main(path: str, url: str = "ws://127.0.0.1:8000/") -> int:
    """0 once the final result came; 1 when the file cannot be read or the server ended the stream without it."""
    try:
        samples, rate = read_file(path)
    except AudioError as exc:  # one line: no such file, empty, not audio
        print(f"error: {exc}", file=sys.stderr)
        return 1
    samples = samples.mean(axis=1)
    async with connect(url, sample_rate=rate) as stream, trio.open_nursery() as nursery:
        nursery.start_soon(send_paced, stream, samples, rate, 0.1, True)
        while (message := await stream.receive()) is not None:
            show(message)
            if message.get("is_final"):
                nursery.cancel_scope.cancel()
                return 0
        nursery.cancel_scope.cancel()
    print("\nthe connection ended without the final result: the text above is incomplete", file=sys.stderr)
    return 1


def show(message: dict) -> None:
    if message["type"] == "queued":
        print(f"queued at {message['position']}, about {message['estimated_wait_s']} s")
    elif message["type"] == "result" and message["is_final"]:
        print("\nfinal:", message["text"])
    elif message["type"] == "result":
        print(message["delta"], end="", flush=True)
        if message["utterance_end"]:
            print("  [end of utterance]")
    elif message["type"] == "error":
        print(f"error {message['code']}: {message['message']}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(trio.run(main, *sys.argv[1:3]))
