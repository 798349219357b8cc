"""A step's results before their text, as columns: one row per chunk result (and per stream's final),
its new tokens in flat arrays. What the engine process sends a worker process for the worker's
streams, one message per step (ipc/service.py), and the worker turns into each stream's StreamResults
with the stream's DecoderProgress (ipc/engine_client.py): the detokenizing and the result objects are the
worker's work, not the engine process's, whose one interpreter serves every worker's streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .ipc.messages import Rows
from .results import DecoderProgress, ResultBuilder, StreamResult

Row = tuple[int, list, int, bool, float | None, float]  # stream id, tokens, frames, final, latency, eou


@dataclass(frozen=True)
class ResultRows:
    sids: np.ndarray  # int64, the row's stream
    frames: np.ndarray  # int32, encoder frames of its chunk (0: a final)
    final: np.ndarray  # bool: the stream's last result
    latency: np.ndarray  # float64 seconds from the chunk's last sample to its result (NaN: a final)
    eou: np.ndarray  # float32, ResultBuilder's `eou`
    counts: np.ndarray  # int32, new tokens of each row
    ids: np.ndarray  # int32, every row's tokens one after the other
    at: np.ndarray  # int32, each token's frame within its chunk
    probs: np.ndarray  # float32, each token's probability

    @classmethod
    def of(cls, rows: list[Row]) -> ResultRows:
        sids, tokens, frames, final, latency, eou = zip(*rows)
        flat = [token for found in tokens for token in found]
        ids, at, probs = zip(*flat) if flat else ((), (), ())
        return cls(np.array(sids, np.int64), np.array(frames, np.int32), np.array(final, bool),
                   np.array([np.nan if v is None else v for v in latency], np.float64), np.array(eou, np.float32),
                   np.array([len(found) for found in tokens], np.int32), np.array(ids, np.int32),
                   np.array(at, np.int32), np.array(probs, np.float32))

    def __len__(self) -> int:
        return self.sids.size

    def message(self) -> Rows:
        return Rows(*(column.tobytes() for column in (self.sids, self.frames, self.final, self.latency, self.eou,
                                                       self.counts, self.ids, self.at, self.probs)))

    @classmethod
    def from_message(cls, message: Rows) -> ResultRows:
        columns = [np.frombuffer(data, dtype) for data, dtype in zip(
            (message.sids, message.frames, message.final, message.latency, message.eou, message.counts, message.ids,
             message.at, message.probs), (np.int64, np.int32, bool, np.float64, np.float32, np.int32, np.int32,
                                           np.int32, np.float32))]
        rows = cls(*columns)
        if not (len(rows.frames) == len(rows.final) == len(rows.latency) == len(rows.eou) == len(rows.counts)
                == len(rows)) or not len(rows.ids) == len(rows.at) == len(rows.probs) == int(rows.counts.sum()):
            raise ValueError("result rows whose columns do not match")
        return rows

    def results(self, builder: ResultBuilder, progress: Callable[[int], DecoderProgress | None]) -> list[StreamResult]:
        """Each row's StreamResult, in order, built with its stream's DecoderProgress (`progress(sid)`;
        None: a stream gone since, its rows skipped)."""
        ends = np.cumsum(self.counts).tolist()
        tokens = list(zip(self.ids.tolist(), self.at.tolist(), self.probs.tolist()))
        out = []
        for sid, frames, final, latency, eou, start, end in zip(
                self.sids.tolist(), self.frames.tolist(), self.final.tolist(), self.latency.tolist(),
                self.eou.tolist(), [0, *ends], ends):
            if (stream := progress(sid)) is not None:
                out.append(builder.build(sid, stream, tokens[start:end], frames, final,
                                         None if latency != latency else latency, eou))
        return out
