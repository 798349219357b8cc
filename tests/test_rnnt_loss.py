"""Plain-PyTorch RNN-T loss against brute force (every alignment path enumerated)."""

import itertools
import math

import pytest
import torch

from parakeet_stream.training.objective import eou_outside_window
from parakeet_stream.training.rnnt_loss import (
    rnnt_logprobs,
    rnnt_loss,
    rnnt_loss_from_logprobs,
)

TOL = 1e-5


def brute_force_nll(logits, target, blank, label_ok=lambda t, u: True):
    """-log P(target) for ONE sequence, summing over every alignment path.

    logits: [T, U+1, V] (already cut to this sequence's lengths); target: [U].
    A path is an ordering of T blanks and U labels whose last symbol is a blank;
    only paths emitting each label u at a frame t with `label_ok(t, u)` count.
    """
    T, W, V = logits.shape
    U = W - 1
    lp = logits.log_softmax(-1)
    scores = []
    for label_steps in itertools.combinations(range(T - 1 + U), U):
        label_steps = set(label_steps)
        t = u = 0
        s = lp.new_zeros(())
        for step in range(T - 1 + U):
            if step in label_steps:
                if not label_ok(t, u):
                    s = s + float("-inf")
                s = s + lp[t, u, target[u]]
                u += 1
            else:
                s = s + lp[t, u, blank]
                t += 1
        assert t == T - 1 and u == U
        scores.append(s + lp[T - 1, U, blank])
    assert len(scores) == math.comb(T - 1 + U, U)
    return -torch.logsumexp(torch.stack(scores), 0)


def reference_dp_nll(logits, target, blank):
    """Scalar-loop alpha recursion for ONE sequence (for cases too big to enumerate)."""
    T, W, V = logits.shape
    lp = logits.log_softmax(-1)
    alpha = [[None] * W for _ in range(T)]
    for t in range(T):
        for u in range(W):
            terms = []
            if t == 0 and u == 0:
                terms.append(lp.new_zeros(()))
            if t > 0:
                terms.append(alpha[t - 1][u] + lp[t - 1, u, blank])
            if u > 0:
                terms.append(alpha[t][u - 1] + lp[t, u - 1, target[u - 1]])
            alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
    return -(alpha[T - 1][W - 1] + lp[T - 1, W - 1, blank])


def make_case(B, T, U, V, T_lens, U_lens, seed, dtype=torch.float64, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, U + 1, V, generator=g, dtype=dtype) * scale)
    targets = torch.randint(0, V - 1, (B, U), generator=g)  # never the blank (V - 1)
    # garbage in padded positions must not matter
    for b in range(B):
        logits[b, T_lens[b]:] = 50.0
        logits[b, :, U_lens[b] + 1:] = -50.0
        targets[b, U_lens[b]:] = V - 1
    return logits.requires_grad_(True), targets, torch.tensor(T_lens), torch.tensor(U_lens)


def expected(logits, targets, T_lens, U_lens, blank, ref=brute_force_nll):
    logits_ref = logits.detach().clone().requires_grad_(True)
    losses = torch.stack([
        ref(logits_ref[b, : T_lens[b], : U_lens[b] + 1], targets[b, : U_lens[b]], blank)
        for b in range(logits.shape[0])
    ])
    losses.sum().backward()
    return losses.detach(), logits_ref.grad


CASES = [
    # B, T, U, V, T_lens, U_lens
    (1, 1, 0, 2, [1], [0]),
    (1, 1, 3, 4, [1], [3]),
    (1, 4, 0, 3, [4], [0]),
    (1, 3, 2, 3, [3], [2]),
    (2, 4, 3, 5, [4, 4], [3, 3]),
    (3, 5, 3, 4, [5, 3, 1], [3, 0, 2]),
    (4, 4, 4, 6, [2, 4, 3, 4], [4, 1, 0, 2]),
    (2, 6, 2, 3, [6, 5], [2, 2]),
    (5, 3, 5, 7, [3, 1, 2, 3, 2], [5, 4, 0, 1, 3]),
]


@pytest.mark.parametrize("B,T,U,V,T_lens,U_lens", CASES)
def test_matches_brute_force(B, T, U, V, T_lens, U_lens):
    logits, targets, T_l, U_l = make_case(B, T, U, V, T_lens, U_lens, seed=B * 100 + T * 10 + U)
    want_loss, want_grad = expected(logits, targets, T_lens, U_lens, blank=V - 1)

    loss = rnnt_loss(logits, targets, T_l, U_l, reduction="none")  # blank defaults to V - 1
    assert loss.shape == (B,)
    assert torch.allclose(loss.detach(), want_loss, atol=TOL, rtol=0), (loss, want_loss)
    loss.sum().backward()
    assert torch.allclose(logits.grad, want_grad, atol=TOL, rtol=0), (logits.grad - want_grad).abs().max()


@pytest.mark.parametrize("B,T,U,V,T_lens,U_lens", CASES[3:7])
def test_float32_matches_brute_force(B, T, U, V, T_lens, U_lens):
    logits, targets, T_l, U_l = make_case(B, T, U, V, T_lens, U_lens, seed=7 + B)
    want_loss, want_grad = expected(logits, targets, T_lens, U_lens, blank=V - 1)
    logits32 = logits.detach().float().requires_grad_(True)
    loss = rnnt_loss(logits32, targets, T_l, U_l, reduction="sum")
    assert abs(loss.item() - want_loss.sum().item()) < TOL * 10
    loss.backward()
    assert logits32.grad.dtype == torch.float32
    assert (logits32.grad.double() - want_grad).abs().max() < TOL


def test_other_blank_id():
    B, T, U, V = 3, 4, 3, 5
    logits, _, T_l, U_l = make_case(B, T, U, V, [4, 3, 2], [3, 2, 1], seed=3)
    targets = torch.randint(1, V, (B, U), generator=torch.Generator().manual_seed(4))
    want_loss, want_grad = expected(logits, targets, [4, 3, 2], [3, 2, 1], blank=0)
    loss = rnnt_loss(logits, targets, T_l, U_l, blank=0, reduction="none")
    assert torch.allclose(loss.detach(), want_loss, atol=TOL, rtol=0)
    loss.sum().backward()
    assert torch.allclose(logits.grad, want_grad, atol=TOL, rtol=0)


def test_larger_against_reference_dp():
    B, T, U, V = 3, 17, 9, 11
    T_lens, U_lens = [17, 12, 5], [9, 4, 9]
    logits, targets, T_l, U_l = make_case(B, T, U, V, T_lens, U_lens, seed=11)
    want_loss, want_grad = expected(logits, targets, T_lens, U_lens, blank=V - 1,
                                    ref=reference_dp_nll)
    loss = rnnt_loss(logits, targets, T_l, U_l, reduction="none")
    assert torch.allclose(loss.detach(), want_loss, atol=TOL, rtol=0)
    loss.sum().backward()
    assert torch.allclose(logits.grad, want_grad, atol=TOL, rtol=0)


def test_reductions_and_logprob_entry_point():
    B, T, U, V = 4, 5, 3, 6
    T_lens, U_lens = [5, 4, 2, 5], [3, 0, 2, 1]
    logits, targets, T_l, U_l = make_case(B, T, U, V, T_lens, U_lens, seed=5)
    none = rnnt_loss(logits, targets, T_l, U_l, reduction="none")
    assert torch.allclose(rnnt_loss(logits, targets, T_l, U_l, reduction="sum"), none.sum())
    assert torch.allclose(rnnt_loss(logits, targets, T_l, U_l), none.mean())

    blank_lp, label_lp = rnnt_logprobs(logits, targets)
    assert blank_lp.shape == (B, T, U + 1) and label_lp.shape == (B, T, U)
    lp = logits.detach().log_softmax(-1)
    assert torch.allclose(blank_lp.detach(), lp[..., V - 1])
    blank_lp = blank_lp.detach().requires_grad_(True)
    label_lp = label_lp.detach().requires_grad_(True)
    out = rnnt_loss_from_logprobs(blank_lp, label_lp, T_l, U_l, reduction="mean")
    assert torch.allclose(out, none.mean())
    out.backward()
    # padded positions get no gradient; the occupation of the final blank is 1
    for b in range(B):
        assert blank_lp.grad[b, T_lens[b]:].abs().sum() == 0
        assert blank_lp.grad[b, :, U_lens[b] + 1:].abs().sum() == 0
        assert label_lp.grad[b, :, U_lens[b]:].abs().sum() == 0
        assert abs(blank_lp.grad[b, T_lens[b] - 1, U_lens[b]].item() + 1 / B) < 1e-12
    # every path crosses each time step once: blank occupations sum to 1 per frame
    occ = -blank_lp.grad * B
    for b in range(B):
        assert torch.allclose(occ[b, : T_lens[b]].sum(-1), torch.ones(T_lens[b], dtype=occ.dtype))


def test_no_grad_and_half_precision():
    B, T, U, V = 2, 6, 4, 8
    logits, targets, T_l, U_l = make_case(B, T, U, V, [6, 4], [4, 3], seed=9)
    ref = rnnt_loss(logits.detach(), targets, T_l, U_l, reduction="none")
    with torch.no_grad():
        got = rnnt_loss(logits, targets, T_l, U_l, reduction="none")
    assert torch.allclose(got, ref)
    lb = logits.detach().to(torch.bfloat16).requires_grad_(True)
    out = rnnt_loss(lb, targets, T_l, U_l)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert lb.grad.dtype == torch.bfloat16 and torch.isfinite(lb.grad.float()).all()


def test_bad_lengths_rejected():
    logits, targets, T_l, U_l = make_case(1, 3, 2, 4, [3], [2], seed=1)
    with pytest.raises(ValueError):
        rnnt_loss(logits, targets, torch.tensor([4]), U_l)
    with pytest.raises(ValueError):
        rnnt_loss(logits, targets, torch.tensor([0]), U_l)
    with pytest.raises(ValueError):
        rnnt_loss(logits, targets, T_l, torch.tensor([3]))
    with pytest.raises(ValueError):
        rnnt_loss(logits, targets, T_l, U_l, reduction="avg")


def test_an_eou_window_keeps_only_the_alignments_with_each_eou_inside_it():
    T, V = 7, 5
    logits, targets, T_l, U_l = make_case(2, T, 4, V, [7, 6], [4, 4], seed=5)
    # feature frames (100/s) where the speech before each <EOU> ends; -1: a word
    eou = torch.tensor([[-1, -1, -1, 17], [-1, 9, -1, 35]])
    outside = eou_outside_window(eou, T_l, T, subsampling=8, window=2)
    # frame 16 first reaches encoder frame 2, frame 8 frame 1, frame 34 frame 5 (the last of 6)
    windows = {(0, 3): (2, 4), (1, 1): (1, 3), (1, 3): (5, 7)}
    assert [[t for t in range(T) if not outside[b, t, u]] for (b, u) in windows] == [[2, 3], [1, 2], [5, 6]]

    blank_lp, label_lp = rnnt_logprobs(logits, targets)
    loss = rnnt_loss_from_logprobs(blank_lp, label_lp.masked_fill(outside, float("-inf")), T_l, U_l,
                                   reduction="none")
    free = rnnt_loss(logits, targets, T_l, U_l, reduction="none")
    loss.sum().backward()
    ref = logits.detach().clone().requires_grad_(True)
    want = torch.stack([
        brute_force_nll(ref[b, : T_l[b]], targets[b], V - 1,
                        lambda t, u, b=b: (b, u) not in windows or windows[b, u][0] <= t < windows[b, u][1])
        for b in range(2)])
    want.sum().backward()
    assert torch.allclose(loss.detach(), want.detach(), atol=TOL, rtol=0)
    assert torch.allclose(logits.grad, ref.grad, atol=TOL, rtol=0)
    assert (loss.detach() > free.detach() + 0.1).all()  # fewer alignments: a lower likelihood
