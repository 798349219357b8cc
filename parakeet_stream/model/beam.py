"""Batched beam search for the streams that boost key phrases: `beam` hypotheses per stream, the
streams of a batch searched at once, the phrases scored inside the beam (boosting.py).

Frame-synchronous, as icefall's modified beam search, with up to `symbols` labels per frame: at
each frame, each of a stream's hypotheses either ends the frame (blank) or writes a label; the
labels' hypotheses are cut back to `beam` and may write again, up to `symbols` times, the last
time ending the frame as greedy decoding does after `max_symbols`. The frame's ended hypotheses
are merged where they wrote the same labels (their probabilities summed, as icefall does), and the
best `beam` go on. A hypothesis's score is its log-probability plus its context score (what its
phrase matches have banked and earned), so a started phrase stays in the beam while the audio
allows, and gives its loan back where it breaks.

Across chunks the beams live in a BeamPool, a row per slot and hypothesis; what a pass wrote comes
to the host packed (`BeamPass.packed`), where the engine commits what every hypothesis agrees on
(engine/runner/beams.py). Labels are compared by a rolling hash of everything a hypothesis wrote.

On CPU a frame stops writing once no label hypothesis can still enter the beam; with `fixed`
(CUDA graphs) every frame runs all `symbols` rounds, in shapes that never depend on the data.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .boosting import BoostPool, Matches
from .rnnt import GreedyDecoder

NEG_INF = float("-inf")
HASH = 1_000_003  # the rolling hash's multiplier (int64 arithmetic wraps)
HEAD = 7  # BeamPass.packed's fields per hypothesis before its labels


@dataclass
class Hyps:
    """A batch's hypotheses, [B, K] each (h, c: [layers, B * K, H]; g [B * K, J]); for one pass's
    labels, `written` [B, K, L, 3] (label, frame, probability) and `count` [B, K]."""

    score: torch.Tensor
    node: torch.Tensor
    banked: torch.Tensor
    last: torch.Tensor
    heard: torch.Tensor
    loan: torch.Tensor  # what the open match has earned: given back if it breaks
    hash: torch.Tensor
    eou: torch.Tensor  # the end-of-utterance label's best probability since the last other label
    greedy: torch.Tensor  # bool: the greedy decoder's path (the most likely label each time), always kept
    origin: torch.Tensor  # the hypothesis at the pass's start it descends from
    h: torch.Tensor
    c: torch.Tensor
    g: torch.Tensor
    written: torch.Tensor | None = None
    count: torch.Tensor | None = None

    @property
    def matches(self) -> Matches:
        return Matches(self.node.flatten(), self.banked.flatten(), self.last.flatten(), self.heard.flatten())

    def copy(self, **changes) -> "Hyps":
        """The same tensors, `changes` replaced."""
        return Hyps(**{f.name: changes.get(f.name, getattr(self, f.name)) for f in fields(self)})

    def pick(self, index: torch.Tensor) -> "Hyps":
        """The hypotheses at `index` [B, K'] of each stream's row."""
        b, k = index.shape
        flat = (index + torch.arange(b, device=index.device).unsqueeze(1) * self.score.size(1)).flatten()
        out = {}
        for f in fields(self):
            x = getattr(self, f.name)
            if f.name in ("h", "c"):
                out[f.name] = x[:, flat]
            elif f.name == "g":
                out[f.name] = x[flat]
            elif x is not None:
                out[f.name] = x.flatten(0, 1)[flat].view(b, k, *x.shape[2:])
        return Hyps(**out)

    def where(self, keep: torch.Tensor, other: "Hyps") -> "Hyps":
        """Per stream (`keep` [B]): these hypotheses, else `other`'s."""
        k = self.score.size(1)
        out = {}
        for f in fields(self):
            x, y = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("h", "c"):
                out[f.name] = torch.where(keep.repeat_interleave(k).view(1, -1, 1), x, y)
            elif f.name == "g":
                out[f.name] = torch.where(keep.repeat_interleave(k).unsqueeze(1), x, y)
            else:
                out[f.name] = torch.where(keep.view(-1, *[1] * (x.dim() - 1)), x, y)
        return Hyps(**out)

    @staticmethod
    def cat(parts: list["Hyps"]) -> "Hyps":
        """Every part's hypotheses side by side: [B, K1 + K2 + ...]."""
        out = {}
        b = parts[0].score.size(0)
        for f in fields(Hyps):
            xs = [getattr(p, f.name) for p in parts]
            if f.name in ("h", "c"):
                out[f.name] = torch.cat([x.view(x.size(0), b, -1, x.size(-1)) for x in xs], 2).flatten(1, 2)
            elif f.name == "g":
                out[f.name] = torch.cat([x.view(b, -1, x.size(-1)) for x in xs], 1).flatten(0, 1)
            else:
                out[f.name] = torch.cat(xs, 1)
        return Hyps(**out)


class BeamPool:
    """The beams of every slot between passes: `beam` hypotheses per slot, on the device."""

    def __init__(self, decoder: GreedyDecoder, rows: int, beam: int, device):
        self.beam = beam
        start = decoder.initial_state(1, device)
        n = rows * beam
        self.h, self.c, self.g = start.h.repeat(1, n, 1), start.c.repeat(1, n, 1), start.g.repeat(n, 1)
        self.start = start
        self.score = torch.full((rows, beam), NEG_INF, device=device)
        self.node = torch.zeros(rows, beam, dtype=torch.long, device=device)
        self.banked = torch.zeros(rows, beam, device=device)
        self.last = torch.full((rows, beam), -1, dtype=torch.long, device=device)
        self.heard = torch.zeros(rows, beam, device=device)
        self.loan = torch.zeros(rows, beam, device=device)
        self.hash = torch.zeros(rows, beam, dtype=torch.long, device=device)
        self.eou = torch.zeros(rows, beam, device=device)
        self.greedy = torch.zeros(rows, beam, dtype=torch.bool, device=device)

    @staticmethod
    def slot_bytes(decoder: GreedyDecoder, beam: int) -> int:
        cfg = decoder.cfg
        # the LSTM state and predictor output, five float32, three int64 and one bool field per hypothesis
        return beam * (4 * (2 * cfg.pred_rnn_layers * cfg.pred_hidden + cfg.joint_hidden) + 5 * 4 + 3 * 8 + 1)

    def reset(self, slots: torch.Tensor) -> None:
        """The streams at `slots` start over: one hypothesis, nothing written."""
        rows = self._rows(slots)
        self.h[:, rows], self.c[:, rows], self.g[rows] = self.start.h, self.start.c, self.start.g
        self.score[slots] = NEG_INF
        self.score[slots, 0] = 0.0
        self.node[slots], self.banked[slots], self.last[slots], self.heard[slots] = 0, 0.0, -1, 0.0
        self.loan[slots] = 0.0
        self.hash[slots], self.eou[slots] = 0, 0.0
        self.greedy[slots] = False
        self.greedy[slots, 0] = True

    def drop(self, slot: int, beams: list[int]) -> None:
        """Hypotheses `beams` of `slot` leave the beam (they disagree with what was committed)."""
        self.score[slot, beams] = NEG_INF

    def lead(self, slot: int, beam: int) -> None:
        """Hypothesis `beam` of `slot` is the greedy path from now on (-1: none is)."""
        self.greedy[slot] = False
        if beam >= 0:
            self.greedy[slot, beam] = True

    def gather(self, slots: torch.Tensor) -> Hyps:
        rows = self._rows(slots)
        b, k = len(slots), self.beam
        origin = torch.arange(k, device=slots.device).expand(b, k)
        return Hyps(self.score[slots], self.node[slots], self.banked[slots], self.last[slots], self.heard[slots],
                    self.loan[slots], self.hash[slots],
                    self.eou[slots], self.greedy[slots], origin, self.h[:, rows], self.c[:, rows], self.g[rows])

    def scatter(self, slots: torch.Tensor, hyps: Hyps) -> None:
        rows = self._rows(slots)
        self.h[:, rows], self.c[:, rows], self.g[rows] = hyps.h, hyps.c, hyps.g
        self.score[slots], self.node[slots], self.banked[slots] = hyps.score, hyps.node, hyps.banked
        self.last[slots], self.heard[slots], self.loan[slots] = hyps.last, hyps.heard, hyps.loan
        self.hash[slots], self.eou[slots], self.greedy[slots] = hyps.hash, hyps.eou, hyps.greedy

    def _rows(self, slots: torch.Tensor) -> torch.Tensor:
        return (slots.unsqueeze(1) * self.beam + torch.arange(self.beam, device=slots.device)).flatten()


class BeamPass:
    """One beam-search pass over a batch of encoder outputs (a streaming chunk per stream)."""

    def __init__(self, decoder: GreedyDecoder, enc: torch.Tensor, lengths: torch.Tensor, hyps: Hyps,
                 boost: BoostPool, slots: torch.Tensor, symbols: int, eou: int | None = None,
                 widths: tuple[int, int] | None = None):
        """enc [B, T, D] (float32), valid frames `lengths` [B]; hyps: the streams' beams before it
        (BeamPool.gather); slots: the streams' slots in `boost`; symbols: labels per frame at most;
        eou: the end-of-utterance label (None: none); widths: the boosting tables' widths to read
        (None: the full ones, fixed shapes)."""
        self.decoder, self.lengths, self.boost, self.slots = decoder, lengths, boost, slots
        self.symbols, self.eou, self.widths = symbols, eou, widths
        self.f = decoder.joint.enc(enc)
        b, frames = self.f.shape[:2]
        self.beam = hyps.score.size(1)
        self.hyp_slots = slots.repeat_interleave(self.beam)
        room = frames * symbols
        written = torch.zeros(b, self.beam, room + 1, 3, device=enc.device)
        self.hyps = hyps.copy(written=written, count=torch.zeros(b, self.beam, dtype=torch.long, device=enc.device))

    def run(self, fixed: bool = False) -> "BeamPass":
        frames = self.f.size(1) if fixed else int(self.lengths.max())
        for t in range(frames):
            ended = self._frame(t, fixed)
            self.hyps = ended.where(t < self.lengths, self.hyps)
        best = self.hyps.score.amax(1, keepdim=True)
        self.hyps.score = self.hyps.score - torch.where(best > NEG_INF, best, 0.0)  # scores stay near 0
        return self

    def _frame(self, t: int, fixed: bool) -> Hyps:
        """The hypotheses after frame t: up to `symbols` labels written on it, the best `beam` of
        those that ended it, merged where they wrote the same labels."""
        hyps, ended = self.hyps.copy(), []
        b, k = hyps.score.shape
        f = self.f[:, t].unsqueeze(1)
        for round_ in range(self.symbols):
            logp = self.decoder.joint(f, hyps.g.view(b, k, -1)).float().log_softmax(-1)
            if self.eou is not None:
                hyps.eou = torch.maximum(hyps.eou, logp[..., self.eou].exp())
            best = logp.argmax(-1)
            blank = best == logp.size(-1) - 1
            ended.append(hyps.copy(score=hyps.score + logp[..., -1], greedy=hyps.greedy & blank))
            hyps, label = self._write(hyps, logp, t, torch.where(hyps.greedy & ~blank, best, -1))
            last = round_ == self.symbols - 1
            if not (last or fixed or _can_enter(hyps, ended, k)):
                break  # before the prediction network: none of these labels is kept
            hyps = self._predict(hyps, label)
            if last:
                ended.append(hyps)
        return _merge(Hyps.cat(ended), k)

    def _write(self, hyps: Hyps, logp: torch.Tensor, t: int, greedy: torch.Tensor) -> tuple[Hyps, torch.Tensor]:
        """The `beam` hypotheses that write a label now, and their labels [B, K]; their prediction
        network not yet run (`_predict`). As `_merge` keeps them: half the best by score (with their
        phrase matches), the rest the best of the others without the loan of their open match, so
        a label the audio prefers is written beside the ones a phrase pulls in; and the greedy
        path's next label, `greedy` [B, K] (-1: none), whatever its score."""
        b, k, labels = logp.shape
        grow = self.boost.expand(self.hyp_slots, hyps.matches, logp.flatten(0, 1), self.widths)
        gain = (grow.after - (hyps.banked + hyps.loan).view(-1, 1)).view(b, k, labels)
        cand = (hyps.score.unsqueeze(2) + logp + gain)[..., :-1].flatten(1)  # not blank
        loan = (grow.after - grow.banked).view(b, k, labels)[..., :-1].flatten(1)
        kept = greedy.amax(1)
        greedy_at = (greedy.argmax(1) * (labels - 1) + kept).where(kept >= 0, -1)
        at = _keeping(_two_halves(cand, loan, k), greedy_at)
        score = cand.gather(1, at)
        parent, label = at // (labels - 1), at % (labels - 1)
        flat = (parent + torch.arange(b, device=at.device).unsqueeze(1) * k).flatten()
        chosen = flat * labels + label.flatten()
        out = hyps.pick(parent)
        out.score = score
        out.node, out.banked, out.last, out.heard = (x.flatten()[chosen].view(b, k)
                                                     for x in (grow.node, grow.banked, grow.last, grow.heard))
        out.loan = loan.gather(1, at)
        out.greedy = at == greedy_at.unsqueeze(1)
        out.hash = out.hash * HASH + label + 1
        if self.eou is not None:
            out.eou = torch.where(label == self.eou, out.eou, 0.0)
        p = logp.flatten(0, 1)[flat, label.flatten()].exp().view(b, k)
        entry = torch.stack([label.float(), torch.full_like(p, t), p], -1)
        out.written.scatter_(2, out.count.view(b, k, 1, 1).expand(b, k, 1, 3), entry.unsqueeze(2))
        out.count = out.count + 1
        return out, label

    def _predict(self, hyps: Hyps, label: torch.Tensor) -> Hyps:
        """The prediction network on each hypothesis's new `label`: its state and output for the next round."""
        o, (hyps.h, hyps.c) = self.decoder.predictor.step(label.flatten(), hyps.h, hyps.c)
        hyps.g = self.decoder.joint.pred(o)
        return hyps

    def packed(self) -> torch.Tensor:
        """[B, K, HEAD + 3 L] int32, per hypothesis: labels written, origin, score, final score (the
        context score as at the end of the stream), end-of-utterance probability (float32 bits),
        whether it is the greedy path, its context score as at the end (bits), then the labels,
        their frames and their probabilities (bits); one copy brings a pass to the host."""
        hyps = self.hyps
        end = self.boost.final(self.hyp_slots, hyps.matches).view_as(hyps.score)
        final = hyps.score - hyps.banked - hyps.loan + end
        w = hyps.written[:, :, :-1]
        bits = lambda x: x.float().contiguous().view(torch.int32)  # noqa: E731
        head = [hyps.count.int(), hyps.origin.int(), bits(hyps.score), bits(final), bits(hyps.eou),
                hyps.greedy.int(), bits(end)]
        return torch.cat([torch.stack(head, -1), w[..., 0].int(), w[..., 1].int(), bits(w[..., 2])], -1)


def _can_enter(hyps: Hyps, ended: list[Hyps], k: int) -> bool:
    """Whether any labelled hypothesis scores above some stream's k-th best ended one (ending the
    frame can only lower it), or is the greedy path (always kept)."""
    ended_scores = torch.cat([e.score for e in ended], 1)
    kth = ended_scores.topk(min(k, ended_scores.size(1)), 1).values[:, -1]
    return bool(((hyps.score.amax(1) > kth) | hyps.greedy.any(1)).any())


def _two_halves(score: torch.Tensor, loan: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k] indices into each row of `score`: the best half by score (the larger half), then the
    best of the others by score less their `loan`."""
    lead = (k + 1) // 2
    top = score.topk(lead, 1).indices
    rest = (score - loan).scatter(1, top, NEG_INF).topk(k - lead, 1).indices
    return torch.cat([top, rest], 1)


def _keeping(at: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """`at` [B, k] with each row's `want` [B] (-1: none) in it, in place of its last entry."""
    missing = (want >= 0) & ~(at == want.unsqueeze(1)).any(1)
    at = at.clone()
    at[:, -1] = torch.where(missing, want, at[:, -1])
    return at


def _merge(hyps: Hyps, k: int) -> Hyps:
    """The best k of each stream's hypotheses, those that wrote the same labels merged into the best
    of them (their probabilities summed). Half the beam goes to the best by score, the rest to the
    best of the others without their open match's loan, so hypotheses pulled in by a phrase never
    push out every one that the audio alone prefers (where the phrase breaks, those are needed)."""
    score, hashes = hyps.score, hyps.hash
    n = score.size(1)
    alive = score > NEG_INF
    same = (hashes.unsqueeze(2) == hashes.unsqueeze(1)) & alive.unsqueeze(2) & alive.unsqueeze(1)
    merged = torch.where(same, score.unsqueeze(1), NEG_INF).logsumexp(2)
    order = torch.arange(n, device=score.device)
    ahead = (score.unsqueeze(1) > score.unsqueeze(2)) | ((score.unsqueeze(1) == score.unsqueeze(2))
                                                          & (order.view(1, 1, n) < order.view(1, n, 1)))
    first = ~(same & ahead).any(2)
    merged = torch.where(first & alive, merged, NEG_INF)
    greedy = (same & hyps.greedy.unsqueeze(1)).any(2) & first & alive
    at = _keeping(_two_halves(merged, hyps.loan, k), torch.where(greedy.any(1), greedy.int().argmax(1), -1))
    out = hyps.pick(at)
    out.score = merged.gather(1, at)
    out.greedy = greedy.gather(1, at)
    return out
