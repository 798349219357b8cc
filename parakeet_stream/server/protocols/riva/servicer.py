"""The `nvidia.riva.asr.RivaSpeechRecognition` service: who may call, and how each call ends.

Every call passes the same gates as the other doors: the API key (`authorization: Bearer KEY`
metadata; other metadata, such as NVCF's `function-id`, is ignored), and no new call while
draining. A RivaError ends a call with its gRPC status and message; anything else is a bug,
logged, and answered INTERNAL. The calls in progress are kept so that the drain can reach them.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import PurePath

from riva.client.proto import riva_asr_pb2 as rasr
from riva.client.proto.riva_asr_pb2_grpc import RivaSpeechRecognitionServicer

from ...context import ServerContext
from ...streams import access
from ...streams.guard import bearer_token, key_ok
from .errors import SHUTTING_DOWN, RivaError
from .offline import OfflineCall
from .options import LANGUAGE
from .parsing import Malformed
from .state import DoorState
from .streaming import StreamingCall

log = logging.getLogger(__name__)

PROTOCOL = "riva"  # the metrics label


class RivaServicer(RivaSpeechRecognitionServicer):
    def __init__(self, ctx: ServerContext, state: DoorState) -> None:
        self.ctx = ctx
        self.state = state
        self.calls: set[StreamingCall | OfflineCall] = set()  # touched on the gRPC loop only

    async def StreamingRecognize(self, request_iterator, context):
        call = StreamingCall(self.ctx, context)  # reads with context.read()
        await self._guarded(context, lambda: self._counted(context, call, call.run))

    async def Recognize(self, request, context):
        call = OfflineCall(self.ctx)

        async def run():
            return await call.run(_parsed(request, "RecognizeRequest"))

        return await self._guarded(context, lambda: self._counted(context, call, run))

    async def GetRivaSpeechRecognitionConfig(self, request, context):
        return await self._guarded(context, lambda: self._list_models(context, request))

    def service_config(self, wanted: str) -> rasr.RivaSpeechRecognitionConfigResponse:
        """What we serve, as Riva lists its models: one "online" (streaming) and one "offline"
        entry for the one model, with its rate and lookahead modes."""
        info, name = self.ctx.engine.info, model_name(self.ctx.config.model_name)
        if wanted and wanted != name:
            return rasr.RivaSpeechRecognitionConfigResponse()
        left, right = info.default_lookahead
        common = {
            "language_code": ",".join(info.languages) or LANGUAGE,
            "sample_rate": str(info.sample_rate),
            "lookahead_modes": info.modes_text(),
            "default_lookahead": f"{left},{right}",
            "chunk_ms": str(round(info.chunk_seconds[info.default_lookahead] * 1000)),
            "encodings": "LINEAR_PCM,MULAW,ALAW",
        }
        return rasr.RivaSpeechRecognitionConfigResponse(
            model_config=[
                rasr.RivaSpeechRecognitionConfigResponse.Config(model_name=name, parameters={**common, "type": kind})
                for kind in ("online", "offline")
            ]
        )

    def on_drain(self) -> None:
        for call in list(self.calls):
            call.on_drain()

    def on_finish(self) -> None:
        for call in list(self.calls):
            call.on_finish()

    async def _guarded(self, context, body):
        """Run a call: a RivaError ends it with its status; anything else is a bug (INTERNAL)."""
        try:
            return await body()
        except RivaError as exc:
            await self._abort(context, exc)
        except Exception:
            log.exception("riva call failed")
            await self._abort(context, RivaError("internal_error", "internal server error"))

    async def _counted(self, context, call, run):
        """A recognition call: past the gates, counted as an open call (the drain waits for it)
        and a connection (metrics), and reachable by the drain while it runs."""
        self._authorize(context)
        if not self.state.enter():
            raise RivaError("server_shutdown", SHUTTING_DOWN)
        connections = self.ctx.metrics.connections.labels(PROTOCOL)
        connections.inc()
        self.calls.add(call)
        where, reason = access.opened(_peer(context.peer()), "grpc", PROTOCOL), "internal_error"
        try:
            answer = await run()
            reason = "completed"
            return answer
        except RivaError as exc:
            reason = exc.code
            raise
        except asyncio.CancelledError:  # the client cancelled the call, or left
            reason = "server_shutdown" if self.state.draining else "vanished"
            raise
        finally:
            self.calls.discard(call)
            connections.dec()
            self.state.leave()
            audio = call.stream.received_seconds if call.stream is not None else 0.0
            access.closed(where, reason, audio, call.results_sent)

    async def _list_models(self, context, request) -> rasr.RivaSpeechRecognitionConfigResponse:
        self._authorize(context)
        if self.state.draining:
            raise RivaError("server_shutdown", SHUTTING_DOWN)
        return self.service_config(_parsed(request, "RivaSpeechRecognitionConfigRequest").model_name)

    def _authorize(self, context) -> None:
        expected = self.ctx.config.api_key
        if expected is None:
            return
        metadata = {key.lower(): value for key, value in context.invocation_metadata() or ()}
        if not key_ok(expected, bearer_token(metadata)):
            raise RivaError("unauthorized", "a valid API key is required (metadata 'authorization: Bearer KEY')")

    async def _abort(self, context, exc: RivaError) -> None:
        self.ctx.metrics.error(exc.code)
        await context.abort(exc.status, exc.message)


def _peer(peer: str) -> str:
    """gRPC's "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000" as the other doors write a peer."""
    return peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer


def model_name(model: str) -> str:
    """How --model is listed: its last path component (a folder's path is nobody's business)."""
    return PurePath(model).name or model


def _parsed(request, kind: str):
    if isinstance(request, Malformed):
        raise RivaError("invalid_message", f"the request is not a valid {kind} (protobuf)")
    return request
