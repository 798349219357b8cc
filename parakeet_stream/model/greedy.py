"""Label-looping greedy RNN-T: every stream of a batch looks for its next label at once, in fixed
shapes, with no host sync inside the loop.

One iteration, for every stream of the batch: the joint over the next `window` frames from the
stream's position (all with its current prediction-network output), the first of them whose best
label is not blank, that label emitted, and the prediction network run on the whole batch and kept
only where a label was emitted (masked updates). A stream that emitted `max_symbols` labels on one
frame moves on to the next, as NeMo's greedy decoding does. Each (frame, state) pair scored is one
the frame-by-frame greedy loop scores, so the labels and their frames are the same.

Each label's confidence is its probability under the joint's softmax at the frame it is emitted
(NeMo's `max_prob` token confidence; blank frames are not scored, as NeMo's `exclude_blank`): a float
tensor beside the labels, filled by the same masked updates, so it changes neither labels nor shapes.

With `eou` (the id of a model's end-of-utterance label), the pass also keeps, per stream, the highest
probability the joint gave that label at any (frame, state) pair it scored after the stream's last
other label (that label's own frame and those before it drop out): how sure the model is that the
speaker is done, even where blank still wins (the end-of-turn confidence, server/protocols/flux.py).

Shapes never depend on the data: on a GPU a pass is captured in a CUDA graph, its loop unrolled
to `fixed_iterations(frames)` (enough for a label on every frame and one more: what a chunk of
speech almost always needs, where the most a chunk could need, `max_iterations`, is about ten times
that and every iteration costs the same whether a stream is active or not). A row still active
after them is *unfinished*: its decoder state is left as it was before the pass (`settled`), its
labels are not used, and the runner decodes it again eagerly (engine/runner/step_decoder.py). On CPU a
pass runs eagerly until no stream is active.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Frames scored per stream per iteration by default: a whole streaming chunk (at most 14 encoder
# frames in NVIDIA's modes), while a long utterance does not score all its frames per label.
WINDOW = 16


def fixed_iterations(frames: int) -> int:
    """Iterations of a pass in fixed shapes over chunks of `frames` encoder frames: each iteration
    emits a label or moves a stream past its window, so this covers a label on every frame and one
    more (12.5 labels a second at 80 ms frames; speech through NVIDIA's tokenizers has 3 to 8)."""
    return frames + 2


class GreedyPass:
    """One greedy pass over a batch of encoder outputs; every field is updated in place."""

    def __init__(self, decoder, enc: torch.Tensor, lengths: torch.Tensor, state, window: int | None = None,
                 eou: int | None = None):
        """decoder: rnnt.GreedyDecoder; enc [B, T, D] (float32), valid frames `lengths` [B] (<= T);
        state: the streams' rnnt.DecoderState before it; `window`: frames scored per stream per
        iteration (default: up to WINDOW); `eou`: the end-of-utterance label whose probability to keep (None: none)."""
        self.decoder, self.lengths, self.eou = decoder, lengths, eou
        self.f = decoder.joint.enc(enc)
        b, frames = self.f.shape[:2]
        self.window = max(1, min(window or WINDOW, frames))
        dev = self.f.device
        self.rows, self.offsets = torch.arange(b, device=dev), torch.arange(self.window, device=dev)
        self.max_tokens = frames * decoder.cfg.max_symbols
        # each iteration emits a label or moves a stream a whole window on
        self.max_iterations = self.max_tokens + math.ceil(frames / self.window)
        self.t = torch.zeros(b, dtype=torch.long, device=dev)  # the frame each stream looks from
        self.symbols = torch.zeros_like(self.t)  # labels emitted at frame t
        self.count = torch.zeros_like(self.t)  # labels emitted in this pass
        # labels and their frames; column max_tokens takes the writes of streams that emitted nothing
        self.token = torch.zeros(b, self.max_tokens + 1, dtype=torch.long, device=dev)
        self.frame = torch.zeros_like(self.token)
        self.prob = torch.ones(b, self.max_tokens + 1, dtype=torch.float32, device=dev)
        self.eou_prob = torch.zeros(b, dtype=torch.float32, device=dev)  # since the last other label
        self.h, self.c, self.g = state.h.clone(), state.c.clone(), state.g.clone()
        self.active = self.t < lengths

    def run(self, fixed: bool = False) -> "GreedyPass":
        """Eagerly: on the active streams only, until none is left. `fixed` (a CUDA graph's capture, or
        its stand-in): `fixed_iterations` over the whole batch, rows still active left unfinished."""
        if not fixed:
            while bool(self.active.any()):
                self.iterate_active()
            return self
        for _ in range(min(self.max_iterations, fixed_iterations(self.f.size(1)))):
            self.iterate()
        return self

    def iterate(self) -> None:
        """One iteration over the whole batch, in fixed shapes (masked updates)."""
        dec, w, frames = self.decoder, self.window, self.f.size(1)
        at = self.t.unsqueeze(1) + self.offsets  # [B, window]
        logits = dec.joint(self.f[self.rows.unsqueeze(1), at.clamp(max=frames - 1)], self.g.unsqueeze(1))
        labels = logits.argmax(-1)
        hit = (at < self.lengths.unsqueeze(1)) & (labels != dec.blank)
        first = torch.where(hit, self.offsets, w).amin(1)  # `window` where no label is in it
        emit = first < w
        at_first = first.clamp(max=w - 1)
        label = labels.gather(1, at_first.unsqueeze(1)).squeeze(1)
        scores = logits[self.rows, at_first]
        if self.eou is not None:
            valid = (self.offsets <= first.unsqueeze(1)) & (at < self.lengths.unsqueeze(1))
            self.eou_prob.copy_(self._eou_seen(logits, valid, emit & (label != self.eou), self.eou_prob))
        t = self.t + first
        self.symbols.mul_(t == self.t)  # a new frame: its count starts over
        self.token[self.rows, self.count] = label
        self.frame[self.rows, self.count] = t
        self.prob[self.rows, self.count] = probability(scores, label)
        self.count.add_(emit)
        out, (h, c) = dec.predictor.step(label, self.h, self.c)
        self.h.copy_(torch.where(emit.view(1, -1, 1), h, self.h))
        self.c.copy_(torch.where(emit.view(1, -1, 1), c, self.c))
        self.g.copy_(torch.where(emit.unsqueeze(1), dec.joint.pred(out), self.g))
        self.symbols.add_(emit)
        full = self.symbols >= dec.cfg.max_symbols
        self.t.copy_(t + full)
        self.symbols.masked_fill_(full, 0)
        self.active.copy_(self.t < self.lengths)

    def iterate_active(self) -> None:
        """The same iteration on the active streams only, the prediction network on the emitting ones
        only: what pays where a host sync costs nothing (CPU), as the data-dependent shapes need them."""
        dec, w, frames = self.decoder, self.window, self.f.size(1)
        rows = self.active.nonzero().squeeze(1)
        t0, lengths = self.t[rows], self.lengths[rows]
        at = t0.unsqueeze(1) + self.offsets
        logits = dec.joint(self.f[rows.unsqueeze(1), at.clamp(max=frames - 1)], self.g[rows].unsqueeze(1))
        labels = logits.argmax(-1)
        hit = (at < lengths.unsqueeze(1)) & (labels != dec.blank)
        first = torch.where(hit, self.offsets, w).amin(1)
        emit = first < w
        t = t0 + first
        symbols = self.symbols[rows].masked_fill(t != t0, 0) + emit
        at_first = first.clamp(max=w - 1)
        who, label = rows[emit], labels.gather(1, at_first.unsqueeze(1)).squeeze(1)[emit]
        scores = logits[emit, at_first[emit]]
        if self.eou is not None:
            valid = (self.offsets <= first.unsqueeze(1)) & (at < lengths.unsqueeze(1))
            other = torch.zeros_like(emit)
            other[emit] = label != self.eou
            self.eou_prob[rows] = self._eou_seen(logits, valid, other, self.eou_prob[rows])
        at_count = self.count[who]
        self.token[who, at_count], self.frame[who, at_count] = label, t[emit]
        self.prob[who, at_count] = probability(scores, label)
        self.count[who] = at_count + 1
        if who.numel():
            out, (h, c) = dec.predictor.step(label, self.h[:, who], self.c[:, who])
            self.h[:, who], self.c[:, who], self.g[who] = h, c, dec.joint.pred(out)
        full = symbols >= dec.cfg.max_symbols
        t = t + full
        self.t[rows], self.symbols[rows] = t, symbols.masked_fill(full, 0)
        self.active[rows] = t < lengths

    def _eou_seen(self, logits: torch.Tensor, valid: torch.Tensor, other: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """The rows' highest end-of-utterance probability so far: over the `valid` frames of this
        window (those up to its first label) and `seen`, or 0 where the row emitted another label."""
        logits = logits.float()
        p = (logits[..., self.eou] - logits.logsumexp(-1)).exp()
        best = torch.maximum(seen, torch.where(valid, p, 0.0).amax(1))
        return torch.where(other, 0.0, best)

    def state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, c, g) after the pass."""
        return self.h, self.c, self.g

    def settled(self, before) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, c, g) after the pass where a row finished, `before`'s (the state the pass started from)
        where it is unfinished: decoding that row again starts from there."""
        done = ~self.active
        return (torch.where(done.view(1, -1, 1), self.h, before.h), torch.where(done.view(1, -1, 1), self.c, before.c),
                torch.where(done.unsqueeze(1), self.g, before.g))

    def packed(self) -> torch.Tensor:
        """[B, 1 + 2 (max_tokens + 1)] int32: count, labels, frames; one copy brings a pass to the host."""
        return torch.cat((self.count.unsqueeze(1), self.token, self.frame), dim=1).to(torch.int32)

    def scored(self) -> torch.Tensor:
        """[B, 3 + 3 (max_tokens + 1)] int32: packed(), each label's probability, the stream's
        end-of-utterance probability (float32 bits) and 1 where the row finished (0: unfinished);
        one copy brings a pass and its confidences to the host."""
        return torch.cat((self.packed(), self.prob.view(torch.int32), self.eou_prob.view(torch.int32).unsqueeze(1),
                          (~self.active).to(torch.int32).unsqueeze(1)), dim=1)


def probability(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """[n, V] logits, [n] labels -> [n] each label's probability (its softmax), in float32; for the
    argmax, the same value as the softmax's maximum."""
    return logits.float().softmax(-1).gather(1, label.unsqueeze(1)).squeeze(1)


def unpack(packed: np.ndarray) -> list[list[tuple[int, int]]]:
    """GreedyPass.packed() on the host -> [(label, frame)] per stream."""
    width = (packed.shape[1] - 1) // 2
    return _rows(packed[:, 0], packed[:, 1 : 1 + width], packed[:, 1 + width : 1 + 2 * width])


def unpack_scored(scored: np.ndarray) -> list[list[tuple[int, int, float]]]:
    """GreedyPass.scored() on the host -> [(label, frame, probability)] per stream."""
    width = (scored.shape[1] - 3) // 3
    return _rows(scored[:, 0], scored[:, 1 : 1 + width], scored[:, 1 + width : 1 + 2 * width],
                 scored[:, 1 + 2 * width : 1 + 3 * width].view(np.float32))


def _rows(counts: np.ndarray, *fields: np.ndarray) -> list[list[tuple]]:
    """Each row's first counts[row] entries of every field, zipped: the host's labels of a whole
    batch taken out in one conversion per field (most rows of a chunk have none), not per row."""
    held = np.arange(fields[0].shape[1]) < counts[:, None]
    found = list(zip(*(field[held].tolist() for field in fields)))
    ends = np.cumsum(counts).tolist()
    return [found[start:end] for start, end in zip([0, *ends], ends)]


def eou_probabilities(scored: np.ndarray) -> list[float]:
    """GreedyPass.scored() on the host -> each stream's end-of-utterance probability since its last
    other label (0 without `eou`)."""
    return scored[:, -2:-1].view(np.float32)[:, 0].tolist()


def unfinished(scored: np.ndarray) -> np.ndarray:
    """GreedyPass.scored() on the host -> the rows a fixed pass left unfinished."""
    return np.flatnonzero(scored[:, -1] == 0)
