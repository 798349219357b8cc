"""RNN-T loss in plain PyTorch (no torchaudio, no numba).

The transducer lattice for one sequence has nodes ``(t, u)``, ``0 <= t < T``,
``0 <= u <= U``.  From ``(t, u)`` a blank moves to ``(t + 1, u)`` and the label
``y[u]`` moves to ``(t, u + 1)``; the sequence ends with a blank from
``(T - 1, U)``.  With ``alpha`` the forward variable::

    alpha[0, 0] = 0
    alpha[t, u] = logaddexp(alpha[t-1, u] + blank[t-1, u],
                            alpha[t, u-1] + label[t, u-1])
    log P(y | x) = alpha[T-1, U] + blank[T-1, U]

Both recursions (alpha and the backward variable beta) run over the
anti-diagonals ``n = t + u`` of the lattice, vectorised over the batch and
over every node of a diagonal: ``T + U - 1`` small steps, no loop over the
batch.  The gradient is the usual closed form from ``alpha`` and ``beta``
(the occupation probability of each arc), so no autograd graph is built
through the recursion: memory stays ``O(B * T * U)`` on top of the inputs.

Two entry points:

* :func:`rnnt_loss_from_logprobs` takes only the log-probabilities the
  lattice needs, ``blank_lp[B, T, U+1]`` and ``label_lp[B, T, U]`` (memory
  friendly: a caller can compute them chunk by chunk from the joint without
  ever holding the full ``[B, T, U+1, V]`` log-softmax);
* :func:`rnnt_loss` takes the joint logits ``[B, T, U+1, V]`` and the targets,
  normalises with a log-sum-exp and gathers those two tensors.

The blank id of parakeet-stream models is the LAST vocabulary id (``V - 1``),
which is the default (``blank=-1``).

``reduction``: ``"mean"`` (mean over the batch of the per-sequence negative
log-likelihoods, as torchaudio does), ``"sum"`` or ``"none"`` (shape ``[B]``).
Divide the ``"none"`` output by the target lengths yourself for a per-token
normalisation.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rnnt_loss", "rnnt_loss_from_logprobs", "rnnt_logprobs"]

_NEG_INF = float("-inf")


def _skew(x: Tensor, n_diag: int) -> Tensor:
    """``[B, T, W] -> [B, n_diag, W]`` with ``out[b, n, u] = x[b, n - u, u]`` (-inf off the grid)."""
    B, T, W = x.shape
    n = torch.arange(n_diag, device=x.device)[:, None]
    u = torch.arange(W, device=x.device)[None, :]
    t = n - u  # [n_diag, W]
    valid = (t >= 0) & (t < T)
    idx = t.clamp(0, max(T - 1, 0)).expand(B, n_diag, W)
    out = torch.gather(x, 1, idx)
    return out.masked_fill(~valid, _NEG_INF)


def _unskew(s: Tensor, T: int) -> Tensor:
    """Inverse of :func:`_skew`: ``[B, N, W] -> [B, T, W]`` with ``out[b, t, u] = s[b, t + u, u]``."""
    B, N, W = s.shape
    t = torch.arange(T, device=s.device)[:, None]
    u = torch.arange(W, device=s.device)[None, :]
    idx = (t + u).expand(B, T, W)
    return torch.gather(s, 1, idx)


def _lattice(blank_lp: Tensor, label_lp: Tensor, T_len: Tensor, U_len: Tensor,
             need_grad: bool):
    """Forward-backward over the lattice.  Returns (log P [B], grad_blank, grad_label).

    The gradients are those of ``-log P`` (one per sequence; None when not needed).
    All tensors here are float32/float64 and detached.
    """
    B, T, W = blank_lp.shape  # W = U + 1
    U = W - 1
    dev = blank_lp.device
    N = T + U  # diagonals 0 .. T + U - 1

    t_idx = torch.arange(T, device=dev)[None, :, None]
    u_idx = torch.arange(W, device=dev)[None, None, :]
    node_ok = (t_idx < T_len[:, None, None]) & (u_idx <= U_len[:, None, None])  # [B, T, W]
    blank = blank_lp.masked_fill(~node_ok, _NEG_INF)
    # label[t, u] is the arc (t, u) -> (t, u + 1): needs u < U_b; pad a -inf column to width W
    label = torch.cat([label_lp, blank_lp.new_full((B, T, 1), _NEG_INF)], dim=2)
    label = label.masked_fill(~(node_ok & (u_idx < U_len[:, None, None])), _NEG_INF)

    blank_s = _skew(blank, N)  # [B, N, W]: arc leaving node (n - u, u) by blank
    label_s = _skew(label, N)
    neg = blank_lp.new_full((B, 1), _NEG_INF)

    # ---- alpha over the diagonals ----
    alpha_s = blank_lp.new_full((B, N, W), _NEG_INF)
    a = blank_lp.new_full((B, W), _NEG_INF)
    a[:, 0] = 0.0
    alpha_s[:, 0] = a
    for n in range(1, N):
        from_blank = a + blank_s[:, n - 1]
        from_label = torch.cat([neg, a[:, :-1] + label_s[:, n - 1, :-1]], dim=1)
        a = torch.logaddexp(from_blank, from_label)
        alpha_s[:, n] = a

    end_n = T_len - 1 + U_len  # diagonal of the final node, per sequence
    b_ar = torch.arange(B, device=dev)
    alpha_end = alpha_s[b_ar, end_n, U_len]
    blank_end = blank_lp[b_ar, T_len - 1, U_len]
    log_p = alpha_end + blank_end
    if not need_grad:
        return log_p, None, None

    # ---- beta over the diagonals, last to first ----
    beta_s = blank_lp.new_full((B, N, W), _NEG_INF)
    bnext = blank_lp.new_full((B, W), _NEG_INF)  # diagonal n + 1
    col = torch.arange(W, device=dev)[None, :]
    is_end_col = col == U_len[:, None]  # [B, W]
    for n in range(N - 1, -1, -1):
        via_blank = bnext + blank_s[:, n]
        via_label = torch.cat([bnext[:, 1:] + label_s[:, n, :-1], neg], dim=1)
        bcur = torch.logaddexp(via_blank, via_label)
        at_end = is_end_col & (end_n == n)[:, None]
        bcur = torch.where(at_end, blank_end[:, None].expand(B, W), bcur)
        beta_s[:, n] = bcur
        bnext = bcur

    alpha = _unskew(alpha_s, T)  # [B, T, W]
    beta = _unskew(beta_s, T)
    # beta of the node reached by a blank from (t, u): beta[t + 1, u]; the final
    # blank from (T_b - 1, U_b) reaches the virtual terminal node (log 1 = 0).
    beta_after_blank = torch.cat([beta[:, 1:], beta.new_full((B, 1, W), _NEG_INF)], dim=1)
    beta_after_blank[b_ar, T_len - 1, U_len] = 0.0
    beta_after_label = torch.cat([beta[:, :, 1:], beta.new_full((B, T, 1), _NEG_INF)], dim=2)

    lp = log_p[:, None, None]
    grad_blank = -torch.exp(alpha + blank + beta_after_blank - lp)
    grad_label = -torch.exp(alpha + label + beta_after_label - lp)[:, :, :U]
    # Unreachable sequences (log P = -inf) would give NaN: zero them.
    bad = ~torch.isfinite(log_p)
    if bad.any():
        grad_blank[bad] = 0.0
        grad_label[bad] = 0.0
    return log_p, grad_blank, grad_label


class _RNNTFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, blank_lp, label_lp, T_len, U_len):
        need_grad = bool(ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        work = torch.promote_types(blank_lp.dtype, torch.float32)
        log_p, gb, gl = _lattice(blank_lp.detach().to(work), label_lp.detach().to(work),
                                 T_len, U_len, need_grad)
        if need_grad:
            ctx.save_for_backward(gb, gl)
        ctx.in_dtypes = (blank_lp.dtype, label_lp.dtype)
        return -log_p

    @staticmethod
    def backward(ctx, grad_out):
        gb, gl = ctx.saved_tensors
        g = grad_out.to(gb.dtype)[:, None, None]
        return (gb * g).to(ctx.in_dtypes[0]), (gl * g).to(ctx.in_dtypes[1]), None, None


def _reduce(losses: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def _check_lengths(B: int, T: int, U: int, logit_lengths: Tensor, target_lengths: Tensor,
                   device) -> tuple[Tensor, Tensor]:
    T_len = torch.as_tensor(logit_lengths, device=device).long().reshape(-1)
    U_len = torch.as_tensor(target_lengths, device=device).long().reshape(-1)
    if T_len.numel() != B or U_len.numel() != B:
        raise ValueError(f"need {B} logit and target lengths, got {T_len.numel()} and {U_len.numel()}")
    if B and (int(T_len.min()) < 1 or int(T_len.max()) > T):
        raise ValueError(f"logit_lengths must be in [1, {T}], got {T_len.tolist()}")
    if B and (int(U_len.min()) < 0 or int(U_len.max()) > U):
        raise ValueError(f"target_lengths must be in [0, {U}], got {U_len.tolist()}")
    return T_len, U_len


def rnnt_loss_from_logprobs(blank_lp: Tensor, label_lp: Tensor, logit_lengths: Tensor,
                            target_lengths: Tensor, reduction: str = "mean") -> Tensor:
    """RNN-T negative log-likelihood from per-node log-probabilities.

    Args:
        blank_lp: ``[B, T, U+1]``, ``log p(blank | t, u)``.
        label_lp: ``[B, T, U]``, ``log p(y[u] | t, u)`` (the next target label).
        logit_lengths: ``[B]`` valid frames per sequence (1 .. T).
        target_lengths: ``[B]`` valid labels per sequence (0 .. U).
        reduction: ``"mean"`` over the batch, ``"sum"`` or ``"none"``.

    Values beyond the lengths are ignored (they get zero gradient).  Computed
    in float32 at least (float64 inputs stay float64); gradients come back in
    the input dtypes.
    """
    if blank_lp.dim() != 3 or label_lp.dim() != 3:
        raise ValueError("blank_lp must be [B, T, U+1] and label_lp [B, T, U]")
    B, T, W = blank_lp.shape
    if label_lp.shape != (B, T, W - 1):
        raise ValueError(f"label_lp shape {tuple(label_lp.shape)} != {(B, T, W - 1)}")
    T_len, U_len = _check_lengths(B, T, W - 1, logit_lengths, target_lengths, blank_lp.device)
    losses = _RNNTFunction.apply(blank_lp, label_lp, T_len, U_len)
    return _reduce(losses, reduction)


def rnnt_logprobs(logits: Tensor, targets: Tensor, blank: int = -1) -> tuple[Tensor, Tensor]:
    """``(blank_lp [B, T, U+1], label_lp [B, T, U])`` from joint logits ``[B, T, U+1, V]``.

    Normalises with a log-sum-exp over the vocabulary (autograd flows back to
    ``logits``) without keeping a second full-size log-softmax tensor.
    ``targets`` ``[B, U]`` may hold any id in padded positions (clamped here).
    """
    if logits.dim() != 4:
        raise ValueError("logits must be [B, T, U+1, V]")
    B, T, W, V = logits.shape
    if targets.shape != (B, W - 1):
        raise ValueError(f"targets shape {tuple(targets.shape)} != {(B, W - 1)}")
    blank = blank % V
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    lse = torch.logsumexp(x, dim=-1)  # [B, T, W]
    blank_lp = x[..., blank] - lse
    tgt = targets.long().clamp(0, V - 1)
    idx = tgt[:, None, :, None].expand(B, T, W - 1, 1)
    label_lp = torch.gather(x[:, :, : W - 1], 3, idx).squeeze(3) - lse[:, :, : W - 1]
    return blank_lp, label_lp


def rnnt_loss(logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor,
              blank: int = -1, reduction: str = "mean") -> Tensor:
    """RNN-T loss from joint logits.

    Args:
        logits: ``[B, T, U+1, V]`` un-normalised joint outputs.
        targets: ``[B, U]`` label ids (padding beyond ``target_lengths`` ignored).
        logit_lengths: ``[B]`` frames per sequence.
        target_lengths: ``[B]`` labels per sequence.
        blank: blank id; default ``-1`` = ``V - 1`` (parakeet-stream convention).
        reduction: ``"mean"`` (over the batch), ``"sum"`` or ``"none"``.
    """
    blank_lp, label_lp = rnnt_logprobs(logits, targets, blank)
    return rnnt_loss_from_logprobs(blank_lp, label_lp, logit_lengths, target_lengths, reduction)
