"""Shared helpers for the upload tests: audio files in memory, and a bare HTTP/1.1 client that can
send any head and body (or stop half way). (Imported by test_uploads_*; holds no tests.)"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import orjson
import soundfile as sf
import trio

from parakeet_stream.client import encode_audio

TIMEOUT = 30


def audio_file(samples: np.ndarray, rate: int = 16000, fmt: str = "WAV", subtype: str = "PCM_16",
               channels: int = 1) -> bytes:
    """`samples` in a file; PCM16 as the native protocol quantizes (x 32768, rounded), so that
    both paths carry the same samples."""
    if subtype == "PCM_16":
        samples = np.frombuffer(encode_audio(samples, "pcm16"), "<i2")
    data = np.repeat(samples[:, None], channels, axis=1) if channels > 1 else samples
    out = io.BytesIO()
    sf.write(out, data, rate, format=fmt, subtype=subtype)
    return out.getvalue()


def multipart(fields: dict[str, str], file: bytes | None, boundary: str = "b0undary",
              filename: str = "audio.wav") -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    if file is not None:
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n")
        parts.append(head.encode() + file + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return orjson.loads(self.body)


def head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def post(port: int, path: str, body: bytes, content_type: str, **headers: str) -> Answer:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **headers}
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head(path, headers) + body)
        return await read_answer(stream)


async def read_answer(stream: trio.SocketStream) -> Answer:
    """The whole answer, read until the server closes (it always does)."""
    data = b""
    with trio.fail_after(TIMEOUT):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return Answer(int(lines[0].split()[1]), headers, body)


def openai_error(answer: Answer, status: int, code: str) -> dict:
    """The answer is OpenAI's error shape with this status and code; returns the error."""
    assert answer.status == status, (answer.status, answer.body)
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert error["message"]
    return error
