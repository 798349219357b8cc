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

"The best hypothesis" is the greedy decoder's path (the beam always keeps it, model/beam.py)
unless the best by final score holds more of the phrases: a stream whose phrases are not heard
gets the text a stream without phrases gets. Once text holding a phrase is sent, the greedy path
(which disagreed) leaves the beam, and the best by final score speaks until the utterance ends;
then the hypothesis that ended it is the greedy path again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...model.beam import HEAD

Label = tuple[int, int, float]  # (label, frame in the stream, probability)


@dataclass
class Written:
    """One stream's hypotheses' uncommitted labels, and what the last pass said of them."""

    beams: list[list[Label]]
    alive: list[bool]
    final: list[float] = field(default_factory=list)  # each hypothesis's score if the stream ended now
    context: list[float] = field(default_factory=list)  # each one's phrases, as their scores would be at the end
    greedy: list[bool] = field(default_factory=list)  # which one is the greedy path
    frames: int = 0  # encoder frames decoded so far


@dataclass
class Committed:
    labels: list[Label]  # (label, frame within the chunk, probability), as ResultBuilder takes them
    eou: float  # the best hypothesis's end-of-utterance probability
    drop: list[int]  # hypotheses to take out of the beam
    lead: int | None = None  # the hypothesis that is the greedy path from now on (None: as it was; -1: none)


class BeamCommits:
    def __init__(self, beam: int, max_lag_frames: int, margin: float = float("inf"), eou: int | None = None):
        """margin: a hypothesis this far below the best, by its score and by its final score alike,
        has no say in what is agreed (and leaves the beam where it disagrees with what is committed);
        eou: the end-of-utterance label (None: the model has none)."""
        self.beam, self.max_lag, self.margin, self.eou = beam, max_lag_frames, margin, eou
        self.written: dict[int, Written] = {}

    def start(self, slot: int, beams: bool) -> None:
        """The stream at `slot` starts: with `beams`, one hypothesis, nothing written; without, the
        slot's last stream (perhaps cancelled) is forgotten."""
        self.written.pop(slot, None)
        if beams:
            self.written[slot] = Written([[] for _ in range(self.beam)], [k == 0 for k in range(self.beam)])

    def __contains__(self, slot: int) -> bool:
        return slot in self.written

    def take(self, slot: int, packed: np.ndarray, frames: int) -> Committed:
        """packed: the stream's row of BeamPass.packed() on the host [K, HEAD + 3 L]; frames: the
        chunk's encoder frames. -> what is committed by this chunk."""
        w = self.written[slot]
        base, width = w.frames, (packed.shape[1] - HEAD) // 3
        count, origin, greedy = packed[:, 0], packed[:, 1], packed[:, 5].astype(bool)
        score, final, eou, context = (packed[:, k].view(np.float32) for k in (2, 3, 4, 6))
        labels, at = packed[:, HEAD : HEAD + width], packed[:, HEAD + width : HEAD + 2 * width]
        probs = packed[:, HEAD + 2 * width :].view(np.float32)
        beams, alive = [], []
        for k in range(self.beam):
            n, o = int(count[k]), int(origin[k])
            new = list(zip(labels[k, :n].tolist(), (at[k, :n] + base).tolist(), probs[k, :n].tolist()))
            beams.append(w.beams[o] + new)
            alive.append(bool(np.isfinite(score[k])) and w.alive[o])
        live = [k for k in range(self.beam) if alive[k]]
        best = _chosen(live, final, context, greedy)
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
        lead = self._lead(best, beams[best][:n], greedy, drop)
        if lead is not None:
            greedy = np.arange(self.beam) == lead
        w.beams, w.alive, w.final, w.frames = [b[n:] for b in beams], alive, final.tolist(), base + frames
        w.context, w.greedy = context.tolist(), greedy.tolist()
        return Committed(out, float(eou[best]), drop, lead)

    def _lead(self, best: int, sent: list[Label], greedy: np.ndarray, drop: list[int]) -> int | None:
        """What becomes of the greedy path once `sent` is committed from hypothesis `best`: None,
        as it was; -1, none (it disagreed with text sent from a hypothesis holding a phrase: the best
        hypothesis speaks for the rest of the utterance); else the hypothesis that is the greedy path
        from now on (an utterance ended: `best`, so the next utterance starts from the text sent)."""
        path = np.flatnonzero(greedy)
        if sent and sent[-1][0] == self.eou:
            return None if path.size and path[0] == best else best
        return -1 if path.size and path[0] in drop else None

    def finish(self, slot: int) -> list[Label]:
        """The stream ended: the rest of its best hypothesis by final score, frames relative to the
        end of what was decoded (negative)."""
        w = self.written.pop(slot)
        alive = [k for k in range(self.beam) if w.alive[k]]
        if not w.final or not alive:
            return []
        best = _chosen(alive, w.final, w.context, w.greedy)
        return [(lab, f - w.frames, p) for lab, f, p in w.beams[best]]


def _chosen(live: list[int], final, context, greedy) -> int:
    """The hypothesis text is taken from: the best by final score (loans given back) where it holds
    more of the phrases than the greedy path does, else the greedy path (so a stream whose phrases
    are not heard gets what a stream without phrases gets)."""
    best = max(live, key=lambda k: final[k])
    path = next((k for k in live if greedy[k]), None)
    return best if path is None or context[best] > context[path] else path


def _common_prefix(beams: list[list[Label]]) -> int:
    """How many leading labels every hypothesis shares."""
    n = min(map(len, beams))
    for i in range(n):
        if any(b[i][0] != beams[0][i][0] for b in beams[1:]):
            return i
    return n
