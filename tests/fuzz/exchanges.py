"""How the Attack of a request/response door is made, and what came back: gRPC calls through
grpc's own client (bytes in, bytes out; it blocks, so each call runs in a worker thread), garbage
on the gRPC port, uploads and plain requests on the HTTP port over a bare socket. An upload's
body is sent while its answer is read, so that an answer before the body's end is seen; a body
that never ends is sent until the answer starts (at most ENDLESS_BYTES)."""
from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import trio
from helpers import Answer, http_status

from .attack import ANSWER_TIMEOUT, Outcome
from .clients import GONE, open_stream, reset
from .hostile import MAX_UPLOAD, Attack
from .hostile_uploads import Endless

SERVICE = "/nvidia.riva.asr.RivaSpeechRecognition/"
LEAVING = ("reset", "silent")  # a call cancelled, an upload's connection closed, without waiting for the answer
GARBAGE_WAIT = 0.3  # seconds to read what the gRPC port answers to garbage (it may keep a valid HTTP/2 connection)
ENDLESS_BYTES = 4 * MAX_UPLOAD


async def copies(attack: Attack, make: Callable[[], Awaitable]) -> list:
    """`make()` attack.copies times at once; their results."""
    results = []

    async def one() -> None:
        results.append(await make())

    async with trio.open_nursery() as nursery:
        for _ in range(attack.copies):
            nursery.start_soon(one)
    return results


# -- gRPC -------------------------------------------------------------------------------------
@dataclass
class Call:
    """A gRPC call as its client saw it."""

    method: str
    responses: list[bytes]
    code: grpc.StatusCode
    details: str
    cancelled: bool = False  # by the client


async def riva(ports: dict, attack: Attack) -> Outcome:
    if attack.query == "h2":
        await garbage(ports["grpc"], attack.frames[0])
        return Outcome(status="h2 garbage")
    calls = await copies(attack, lambda: trio.to_thread.run_sync(call, ports["grpc"], attack))
    return Outcome(messages=calls, status="grpc " + " ".join(sorted({c.code.name for c in calls})))


def call(port: int, attack: Attack) -> Call:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        if attack.query == "StreamingRecognize":
            return streaming(channel, attack)
        try:
            response = channel.unary_unary(SERVICE + attack.query)(attack.frames[0], timeout=ANSWER_TIMEOUT)
        except grpc.RpcError as exc:
            return Call(attack.query, [], exc.code(), exc.details() or "")
        return Call(attack.query, [response], grpc.StatusCode.OK, "")


def streaming(channel: grpc.Channel, attack: Attack) -> Call:
    """Send the frames at the attack's pace, then half-close and read to the end; or, when it
    leaves, cancel the call once the frames are sent (or the server ended it)."""
    leaves = attack.ending in LEAVING
    sent, stop = threading.Event(), threading.Event()

    def requests():
        for frame in attack.frames:
            yield frame
            time.sleep(attack.pace)
        sent.set()
        if leaves:
            stop.wait(ANSWER_TIMEOUT)

    rpc = channel.stream_stream(SERVICE + "StreamingRecognize")(requests(), timeout=ANSWER_TIMEOUT)
    rpc.add_done_callback(lambda _: sent.set())
    responses = []
    try:
        if leaves:
            sent.wait(ANSWER_TIMEOUT)
            time.sleep(0.05 if attack.ending == "silent" else 0)
            rpc.cancel()
        responses.extend(rpc)
        return Call("StreamingRecognize", responses, grpc.StatusCode.OK, "", leaves)
    except grpc.RpcError as exc:
        return Call("StreamingRecognize", responses, exc.code(), exc.details() or "", leaves)
    finally:
        stop.set()


async def garbage(port: int, data: bytes) -> None:
    stream = await open_stream(port)
    async with stream:
        try:
            await stream.send_all(data)
            with trio.move_on_after(GARBAGE_WAIT):
                while await stream.receive_some(65536):
                    pass
        except GONE:
            pass


# -- HTTP -------------------------------------------------------------------------------------
@dataclass
class Upload:
    """One upload's request (the Endless chunk once), how its client ended, and the answer."""

    request: bytes
    ending: str
    answer: Answer | None


async def upload(ports: dict, attack: Attack) -> Outcome:
    uploads = await copies(attack, lambda: upload_once(ports["http"], attack))
    statuses = sorted({str(u.answer.status) if u.answer else "none" for u in uploads})
    return Outcome(messages=uploads, status="http " + " ".join(statuses))


async def upload_once(port: int, attack: Attack) -> Upload:
    stream = await open_stream(port)
    received, answered = bytearray(), trio.Event()
    try:
        if attack.ending in LEAVING:
            with trio.fail_after(ANSWER_TIMEOUT):  # the server reads the body, or closes
                await send_request(stream, attack, answered)
            await trio.sleep(0.05 if attack.ending == "silent" else 0)
            return Upload(b"".join(attack.frames), attack.ending, None)
        with trio.move_on_after(ANSWER_TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_request, stream, attack, answered)
                await receive_answer(stream, received, answered)
                nursery.cancel_scope.cancel()
        return Upload(b"".join(attack.frames), attack.ending, parse_answer(bytes(received)))
    finally:
        if attack.ending == "reset":
            reset(stream)
        else:
            await stream.aclose()


async def send_request(stream: trio.SocketStream, attack: Attack, answered: trio.Event) -> None:
    """The frames at the attack's pace (an Endless one again and again until `answered`), then
    the half-close of a client that closes."""
    try:
        for frame in attack.frames:
            sent = 0
            while isinstance(frame, Endless) and not answered.is_set() and sent < ENDLESS_BYTES:
                await stream.send_all(frame)
                sent += len(frame)
            if not isinstance(frame, Endless):
                await stream.send_all(frame)
            await trio.sleep(attack.pace)
        if attack.ending == "close":
            await stream.send_eof()
    except GONE:
        pass


async def receive_answer(stream: trio.SocketStream, received: bytearray, answered: trio.Event) -> None:
    """Everything until the server closes; `answered` once the final answer (not a 100 Continue) begins."""
    try:
        while data := await stream.receive_some(65536):
            received.extend(data)
            if final(bytes(received)) and not final(bytes(received)).startswith(b"HTTP/1.1 1"):
                answered.set()
    except GONE:
        pass


def final(data: bytes) -> bytes:
    """What the server sent after any interim answer (100 Continue)."""
    while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:
        data = data.split(b"\r\n\r\n", 1)[1]
    return data


def parse_answer(data: bytes) -> Answer | None:
    """The final answer, its chunked body joined; None: none came."""
    data = final(data)
    if not data:
        return None
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return Answer(int(lines[0].split()[1]), headers, body)


def dechunk(body: bytes) -> bytes:
    out = bytearray()
    while True:
        size, _, body = body.partition(b"\r\n")
        if not int(size, 16):
            return bytes(out)
        out += body[: int(size, 16)]
        body = body[int(size, 16) + 2 :]


async def http_request(ports: dict, attack: Attack) -> Outcome:
    status = await http_status(ports["http"], attack.frames[0], ANSWER_TIMEOUT)
    return Outcome(messages=[status], status=f"http {status}")
