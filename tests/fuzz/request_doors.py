"""The request/response doors (gRPC, the HTTP uploads): what every answer must be, and their
good calls (an upload's with a live stream beside it, whose results must keep flowing)."""
from __future__ import annotations

import functools
from collections.abc import Callable

import grpc
import h11
import numpy as np
import orjson
import trio
from helpers import Answer, audio_file, multipart, post, result_tokens, transcribe_raw
from riva.client.proto import riva_asr_pb2 as rasr
from riva.client.proto.riva_asr_pb2_grpc import RivaSpeechRecognitionStub
from riva.client.proto.riva_audio_pb2 import AudioEncoding

from parakeet_stream.client import encode_audio

from . import exchanges
from .answers import safe
from .hostile_uploads import BOUNDARY, DEEPGRAM_PATH, OPENAI_PATH

PIECE_BYTES = 3200  # good calls send 100 ms pieces (16 kHz PCM16)


# -- gRPC (NVIDIA Riva) -----------------------------------------------------------------------
# the statuses server/protocols/riva/errors.py documents for what a client sends (never UNKNOWN or INTERNAL)
RIVA_STATUSES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OUT_OF_RANGE}
RIVA_RESPONSES = {"StreamingRecognize": rasr.StreamingRecognizeResponse, "Recognize": rasr.RecognizeResponse,
                  "GetRivaSpeechRecognitionConfig": rasr.RivaSpeechRecognitionConfigResponse}


# HTTP/2's REFUSED_STREAM: a call the connection could not take (more than --max-num-streams plus
# --max-queue at once on it; a cancelled call's place is free for the client before the server
# knows), never started, to be retried; grpc says UNAVAILABLE
REFUSED = "Received RST_STREAM with error code 7"


def check_riva(calls: list[exchanges.Call], close_code: int | None) -> None:
    for call in calls:
        assert call.code in RIVA_STATUSES or (call.cancelled and call.code == grpc.StatusCode.CANCELLED) or (
            call.code == grpc.StatusCode.UNAVAILABLE and REFUSED in call.details), call
        assert call.details != "Deadline Exceeded", call  # the client's own deadline: no answer within 10 s
        safe(call.details)
        for response in call.responses:
            RIVA_RESPONSES[call.method].FromString(response)


def riva_transcript(port: int, speech: np.ndarray) -> str:
    """StreamingRecognize of `speech` in 100 ms pieces: its final results' text."""
    pcm = encode_audio(speech, "pcm16")
    config = rasr.RecognitionConfig(encoding=AudioEncoding.LINEAR_PCM, sample_rate_hertz=16000, language_code="en-US")
    requests = [rasr.StreamingRecognizeRequest(streaming_config=rasr.StreamingRecognitionConfig(config=config))]
    requests += [rasr.StreamingRecognizeRequest(audio_content=pcm[i : i + PIECE_BYTES])
                 for i in range(0, len(pcm), PIECE_BYTES)]
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, shared with no attack
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=own) as channel:
        responses = list(RivaSpeechRecognitionStub(channel).StreamingRecognize(iter(requests), timeout=60))
    return "".join(r.alternatives[0].transcript for response in responses for r in response.results if r.is_final)


async def good_riva(ports: dict, speech: np.ndarray) -> str:
    return await trio.to_thread.run_sync(riva_transcript, ports["grpc"], speech)


# -- HTTP uploads -----------------------------------------------------------------------------
UPLOAD_STATUSES = {200, 400, 401, 408, 413, 429, 431, 501, 503}  # never 500


def head_refused(request: bytes) -> bool:
    """Whether h11 (the HTTP port's parser) refuses the request's head: then no API is known yet,
    and the answer is the HTTP port's own `{"error": reason}`."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(request)
    try:
        return not isinstance(conn.next_event(), h11.Request)
    except h11.RemoteProtocolError:
        return True


def check_uploads(api_answer: Callable[[Answer], None]) -> Callable[[list, int | None], None]:
    """Every client that waited for its answer got one: a documented status, in the API's shape."""

    def check(uploads: list[exchanges.Upload], close_code: int | None) -> None:
        for upload in uploads:
            answer = upload.answer
            # (a half-close after the whole body is taken for a client that left: server/protocols/files/exchange.py)
            assert answer is not None or upload.ending != "probe", upload
            if answer is None:
                continue
            assert answer.status in UPLOAD_STATUSES, (answer, upload.request[:300])
            if head_refused(upload.request):
                assert answer.status in (400, 431, 501) and isinstance(orjson.loads(answer.body)["error"], str), answer
            else:
                api_answer(answer)

    return check


def openai_upload_answer(answer: Answer) -> None:
    kind = answer.headers["content-type"].split(";")[0]
    if answer.status != 200:
        openai_file_error(orjson.loads(answer.body))
    elif kind == "text/event-stream":
        events = [orjson.loads(event.removeprefix(b"data: ")) for event in answer.body.split(b"\n\n") if event]
        assert all(e["type"] == "transcript.text.delta" for e in events[:-1]), events
        if "error" in events[-1]:  # an error after the first text: the stream's last event
            openai_file_error(events[-1])
        else:
            assert events[-1]["type"] == "transcript.text.done", events
    elif kind == "application/json":
        kind = "verbose" if "task" in orjson.loads(answer.body) else "json"
        sdk_types()[kind].model_validate_json(answer.body, strict=True)
    else:
        assert kind in ("text/plain", "application/x-subrip", "text/vtt"), answer
        answer.body.decode()


@functools.cache
def sdk_types() -> dict:
    """The SDKs' own types of a transcription (tests/test_uploads_*.py read them alike)."""
    from deepgram.types.listen_v1response import ListenV1Response
    from openai.types.audio import Transcription, TranscriptionVerbose

    return {"json": Transcription, "verbose": TranscriptionVerbose, "deepgram": ListenV1Response}


def openai_file_error(body: dict) -> None:
    error = body["error"]
    assert set(body) == {"error"} and set(error) == {"message", "type", "param", "code"}, body
    assert error["type"] in ("invalid_request_error", "requests", "server_error") and error["code"], body
    safe(error["message"])


def deepgram_upload_answer(answer: Answer) -> None:
    body = orjson.loads(answer.body)
    if answer.status == 200:
        sdk_types()["deepgram"].model_validate_json(answer.body)  # not strict: its `created` wants a datetime object
    else:
        assert set(body) == {"err_code", "err_msg", "request_id"} and body["err_code"].isupper(), body
        safe(body["err_msg"])


async def good_upload(ports: dict, speech: np.ndarray, path: str, body: bytes, content_type: str,
                      text: Callable[[dict], str]) -> tuple[str, list[int]]:
    """A good upload's text, and the tokens of a live stream on the TCP port beside it."""
    live = {}

    async def stream() -> None:
        live["tokens"] = result_tokens(await transcribe_raw(f"tcp://127.0.0.1:{ports['tcp']}", speech))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        answer = await post(ports["http"], path, body, content_type)
    assert answer.status == 200, answer
    return text(answer.json()), live["tokens"]


async def good_openai_upload(ports: dict, speech: np.ndarray) -> tuple[str, list[int]]:
    body = multipart({"model": "whisper-1"}, audio_file(speech))
    return await good_upload(ports, speech, OPENAI_PATH, body, f"multipart/form-data; boundary={BOUNDARY}",
                             lambda answer: answer["text"])


async def good_deepgram_upload(ports: dict, speech: np.ndarray) -> tuple[str, list[int]]:
    return await good_upload(ports, speech, DEEPGRAM_PATH, audio_file(speech), "audio/wav",
                             lambda answer: answer["results"]["channels"][0]["alternatives"][0]["transcript"])
