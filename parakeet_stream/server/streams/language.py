"""A stream's language as a protocol asks for it: checked against the model before any segment
opens, so each protocol refuses it in its own shape."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...engine import EngineError
from ..transport.codes import ProtocolError

if TYPE_CHECKING:
    from ...engine.api import EngineAPI


def checked_language(engine: EngineAPI, requested: str | None) -> str | None:
    """The model's name for `requested` ("de" -> "de-DE"; None: the model's default, None for a
    model without languages); ProtocolError `unsupported_language` where it has no such language."""
    try:
        return engine.check_language(requested)
    except EngineError as exc:
        raise ProtocolError(exc.code, exc.message) from None
