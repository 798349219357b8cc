"""The lookahead modes an engine serves, and what each means in audio."""

from __future__ import annotations

from typing import Iterable

from ..audio import SAMPLE_RATE
from ..model.config import Lookahead
from ..model.parakeet import ParakeetModel
from .errors import EngineError
from .inbox import Inbox


class ServedModes:
    """The model's lookahead modes served (all of them unless `modes` names some) and the default
    one; EngineError `bad_lookahead` for any other."""

    def __init__(self, model: ParakeetModel, modes: Iterable[Lookahead] | None, default: Lookahead | None):
        self.model = model
        self.served = self._served(modes)
        self.default = self.check(default or next(
            mode for mode in (model.cfg.default_lookahead, *self.served) if mode in self.served))

    def check(self, lookahead) -> Lookahead:
        mode = self._model_mode(lookahead)
        if mode not in self.served:
            raise EngineError("bad_lookahead", f"lookahead {mode[0]},{mode[1]} is not served here "
                                               f"(served: {', '.join(f'{a},{b}' for a, b in self.served)})")
        return mode

    def chunk_seconds(self, mode: Lookahead) -> float:
        spec = self.model.encoder.chunk_spec(mode)
        return spec.chunk_frames * self.model.cfg.features.hop_length / SAMPLE_RATE

    def first_chunk_seconds(self) -> float:
        """Audio a new stream sends before its first chunk is ready, in its quickest mode."""
        first = min(self.model.encoder.chunk_spec(mode).first_frames for mode in self.served)
        return (first - 1) * self.model.cfg.features.hop_length / SAMPLE_RATE

    def inbox(self, mode: Lookahead) -> Inbox:
        """A new stream's audio inbox in `mode`."""
        features = self.model.cfg.features
        return Inbox(self.model.encoder.chunk_spec(mode), features.hop_length, features.n_fft)

    def _served(self, modes: Iterable[Lookahead] | None) -> list[Lookahead]:
        if modes is None:
            return list(self.model.cfg.encoder.att_context_sizes)
        served = list(dict.fromkeys(self._model_mode(mode) for mode in modes))
        if not served:
            raise EngineError("bad_lookahead", "no lookahead mode to serve")
        return served

    def _model_mode(self, lookahead) -> Lookahead:
        try:
            return self.model.encoder.check_lookahead(lookahead)
        except (ValueError, TypeError, IndexError) as exc:
            raise EngineError("bad_lookahead", str(exc)) from None
