"""The host side of the beam search (model/beam.py) for streams with key phrases: what each
hypothesis wrote that is not committed yet, and what gets committed.

A stream's text only grows (every API sends deltas), so a label is committed once every hypothesis
that still counts agrees on it (one far behind the best, by its score and by its final score alike,
does not, and leaves the beam if it disagrees), and then it is the stream's for good. Where they
disagree longer, a label older than `max_lag_frames` is committed from the best hypothesis by its
final score (what it would score if the stream ended now: a partial phrase match's loan given back,
so a hypothesis that stalls inside a name to keep its loan does not win) and the hypotheses that
disagree with it leave the beam (`BeamPool.drop`), so text is never later than that. Where that
hypothesis has written the model's end of utterance (`<EOU>`), everything up to it is committed at
once, the same way: an utterance's text and its end must reach a voice agent when the model says
the speaker is done, as the greedy decoder's do, not a lag later.
At the stream's end the best hypothesis by its final score (partial phrase matches given back)
gives the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Label = tuple[int, int, float]  # (label, frame in the stream, probability)


@dataclass
class Written:
    """One stream's hypotheses' uncommitted labels, and what the last pass said of them."""

    beams: list[list[Label]]
    alive: list[bool]
    final: list[float] = field(default_factory=list)  # each hypothesis's score if the stream ended now
    frames: int = 0  # encoder frames decoded so far


@dataclass
class Committed:
    labels: list[Label]  # (label, frame within the chunk, probability), as ResultBuilder takes them
    eou: float  # the best hypothesis's end-of-utterance probability
    drop: list[int]  # hypotheses to take out of the beam


class BeamCommits:
    def __init__(self, beam: int, max_lag_frames: int, margin: float = float("inf"), eou: int | None = None):
        """margin: a hypothesis this far below the best, by its score and by its final score alike,
        has no say in what is agreed (and leaves the beam where it disagrees with what is committed);
        eou: the end-of-utterance label (None: the model has none)."""
        self.beam, self.max_lag, self.margin, self.eou = beam, max_lag_frames, margin, eou
        self.streams: dict[int, Written] = {}

    def start(self, slot: int, beams: bool) -> None:
        """The stream at `slot` starts: with `beams`, one hypothesis, nothing written; without, the
        slot's last stream (perhaps cancelled) is forgotten."""
        self.streams.pop(slot, None)
        if beams:
            self.streams[slot] = Written([[] for _ in range(self.beam)], [k == 0 for k in range(self.beam)])

    def __contains__(self, slot: int) -> bool:
        return slot in self.streams

    def take(self, slot: int, packed: np.ndarray, frames: int) -> Committed:
        """packed: the stream's row of BeamPass.packed() on the host [K, 5 + 3 L]; frames: the
        chunk's encoder frames. -> what is committed by this chunk."""
        w = self.streams[slot]
        base, width = w.frames, (packed.shape[1] - 5) // 3
        count, origin = packed[:, 0], packed[:, 1]
        score, final, eou = (packed[:, k].view(np.float32) for k in (2, 3, 4))
        labels, at = packed[:, 5 : 5 + width], packed[:, 5 + width : 5 + 2 * width]
        probs = packed[:, 5 + 2 * width :].view(np.float32)
        beams, alive = [], []
        for k in range(self.beam):
            n, o = int(count[k]), int(origin[k])
            new = list(zip(labels[k, :n].tolist(), (at[k, :n] + base).tolist(), probs[k, :n].tolist()))
            beams.append(w.beams[o] + new)
            alive.append(bool(np.isfinite(score[k])) and w.alive[o])
        live = [k for k in range(self.beam) if alive[k]]
        best = max(live, key=lambda k: final[k])  # loans given back
        top = max(score[k] for k in live)
        contenders = [k for k in live if score[k] >= top - self.margin or final[k] >= final[best] - self.margin]
        agreed = _common_prefix([beams[k] for k in contenders])
        late = base + frames - self.max_lag
        forced = next((i for i, (_, f, _) in enumerate(beams[best]) if f >= late), len(beams[best]))
        ended = max((i + 1 for i, (lab, _, _) in enumerate(beams[best]) if lab == self.eou), default=0)
        n = max(agreed, forced, ended)
        head = [lab for lab, _, _ in beams[best][:n]]
        drop = [k for k in live if [lab for lab, _, _ in beams[k][:n]] != head]
        for k in drop:
            alive[k] = False
        out = [(lab, f - base, p) for lab, f, p in beams[best][:n]]
        w.beams, w.alive, w.final, w.frames = [b[n:] for b in beams], alive, final.tolist(), base + frames
        return Committed(out, float(eou[best]), drop)

    def finish(self, slot: int) -> list[Label]:
        """The stream ended: the rest of its best hypothesis by final score, frames relative to the
        end of what was decoded (negative)."""
        w = self.streams.pop(slot)
        alive = [k for k in range(self.beam) if w.alive[k]]
        if not w.final or not alive:
            return []
        best = max(alive, key=lambda k: w.final[k])
        return [(lab, f - w.frames, p) for lab, f, p in w.beams[best]]


def _common_prefix(beams: list[list[Label]]) -> int:
    """How many leading labels every hypothesis shares."""
    n = min(map(len, beams))
    for i in range(n):
        if any(b[i][0] != beams[0][i][0] for b in beams[1:]):
            return i
    return n
