"""Request parsing that never raises: grpc's own answer to a message that is not valid protobuf
is UNKNOWN with the parser's exception logged as a traceback. The interceptor below gives every
handler a parser that returns a `Malformed` marker instead, which the handlers answer with
INVALID_ARGUMENT and a clear message."""
from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError


class Malformed:
    """Stands for a request that could not be parsed."""


def tolerant(parse: Callable[[bytes], object]) -> Callable[[bytes], object]:
    def run(data: bytes) -> object:
        try:
            return parse(data)
        except DecodeError:
            return Malformed()

    return run


class TolerantParsing(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return handler._replace(request_deserializer=tolerant(handler.request_deserializer))
