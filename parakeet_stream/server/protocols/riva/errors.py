"""What a Riva call can end with: our stable error codes (docs/protocol.md section 4) and the
gRPC status each one is answered with."""
from __future__ import annotations

import grpc

STATUS: dict[str, grpc.StatusCode] = {
    "invalid_message": grpc.StatusCode.INVALID_ARGUMENT,  # malformed protobuf, messages out of order
    "invalid_config": grpc.StatusCode.INVALID_ARGUMENT,  # a RecognitionConfig we cannot serve
    "invalid_phrases": grpc.StatusCode.INVALID_ARGUMENT,  # speech_contexts beyond a limit
    "diarization_unavailable": grpc.StatusCode.INVALID_ARGUMENT,  # speakers asked of a server without --diarizer
    "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
    "queue_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "server_shutdown": grpc.StatusCode.UNAVAILABLE,  # draining: reconnect (to another replica)
    "idle_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,  # no config, or no audio, for too long
    "slow_consumer": grpc.StatusCode.DEADLINE_EXCEEDED,  # responses not read within --send-timeout
    "max_stream_seconds": grpc.StatusCode.OUT_OF_RANGE,  # after the final result of the cut stream
    "inference_error": grpc.StatusCode.INTERNAL,
    "internal_error": grpc.StatusCode.INTERNAL,
}


SHUTTING_DOWN = "the server is shutting down: reconnect"


class RivaError(Exception):
    """Ends a call with STATUS[code] and `message` (safe to show the client)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> grpc.StatusCode:
        return STATUS[self.code]
