"""Stream a WAV file over raw TCP (newline-delimited JSON) with a plain socket, the way original
parakeet-streaming clients do; only reading the file uses the package (any 16 kHz mono float32
source will do).

    python examples/tcp_client.py examples/journey.wav [host] [port]
"""
import base64
import json
import socket
import sys

from parakeet_stream.audio import AudioError, read_audio  # any 16 kHz mono float32 source will do

PACKET_SAMPLES = 1600  # 100 ms


def main(path: str, host: str = "127.0.0.1", port: str = "8765") -> int:
    """0 once the final result came; 1 when the file cannot be read or the server ended the stream without it."""
    try:
        samples = read_audio(path)
    except AudioError as exc:  # one line: no such file, empty, not audio
        print(f"error: {exc}", file=sys.stderr)
        return 1
    pcm16 = (samples.clip(-1, 1) * 32767).astype("<i2").tobytes()
    with socket.create_connection((host, int(port))) as sock:
        lines = sock.makefile("rwb")
        for i in range(0, len(pcm16), 2 * PACKET_SAMPLES):
            chunk = base64.b64encode(pcm16[i : i + 2 * PACKET_SAMPLES]).decode()
            send(lines, {"type": "audio", "data": chunk, "encoding": "pcm16", "final": False})
        send(lines, {"type": "audio", "data": "", "encoding": "pcm16", "final": True})
        for line in lines:
            message = json.loads(line)
            if message["type"] == "result":
                print(f"\r{message['text']}", end="", flush=True)
                if message["is_final"]:
                    print()
                    return 0
            elif message["type"] == "error":
                print(f"\nerror {message['code']}: {message['message']}", file=sys.stderr)
    print("\nthe connection ended without the final result: the text above is incomplete", file=sys.stderr)
    return 1


def send(lines, message: dict) -> None:
    lines.write(json.dumps(message).encode() + b"\n")
    lines.flush()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
