"""Fused, vocabulary-chunked One-vs-Rest Cauchy head + loss that never materialises (N, V) tensors.

Shape legend: N positions that have a target (ignored positions are dropped by the caller *before* this
module is called), C causal size, V vocabulary rows, K the width of one vocabulary slice (``chunk_size``).

For position i and vocabulary row k the head gives ``S_ik ~ Cauchy(loc_ik, scale_ik)`` with

    loc_ik = loc_U_i · W_k + b_k      scale_ik = s_i · |W_k| + γ   (s = decision_scale, γ = token noise)
    d_ik   = loc_ik − t_k
    P_ik   = P(S_ik > t_k) = atan2(scale, −d)/π               1 − P_ik = atan2(scale, d)/π

and the per-position OvR binary cross-entropy against the one-hot target y_i (docs/design.md, "Losses") is

    ℓ_i = −Σ_{k ≠ y_i} log(1 − P_ik) − log P_{i y_i}.

Both logs come from the tail mass ``u = atan2(scale, |d|)/π = min(P, 1 − P)`` (full relative precision):
the side that holds ``u`` takes ``log u``, the other side ``log1p(−u)``; no log of a number next to 1 is
ever taken, so terms of size 1e-7 keep their digits (the sum runs over 151,936 of them).

Derivatives (∂ atan2(y, x)/∂y = x/(x²+y²), ∂ atan2(y, x)/∂x = −y/(x²+y²)), with ``r² = d² + scale²``
and ``q_ik = 1/(π·r²·(1 − P))`` for non-target entries, ``q_ik = −1/(π·r²·P)`` for the target entry:

    ∂ℓ_i/∂d_ik = scale_ik·q_ik                    ∂ℓ_i/∂scale_ik = −d_ik·q_ik.

With the reduction weights w_i (loss = Σ_i w_i ℓ_i), ``A = w ⊙ scale ⊙ q`` (N,K) and
``B = −w ⊙ d ⊙ q`` (N,K) per slice give every gradient by matrix products:

    ∂loc_U = Σ_slices A·W_slice        ∂s = Σ_slices B·|W_slice|
    ∂W_slice = Aᵀ·loc_U + sign(W_slice) ⊙ (Bᵀ·s)        ∂b_slice = Σ_i A        ∂t_slice = −Σ_i A
    ∂γ = Σ_slices Σ_ik B

OvR has no normaliser across the vocabulary, so every slice is independent: the forward pass computes the
loss *and* all gradients slice by slice, and backward only scales the stored gradients by the scalar
``grad_output``. Memory: a few (N, K) fp32 work buffers plus ∂W (V, C); never (N, V).

Sampled negatives (``negatives=m``): the target terms and every row that is the target of *some* position
in the batch (the target union T, |T| = U) are computed exactly; the remaining V − U rows are estimated by
m rows drawn uniformly without replacement from them (one set shared by the batch), each weighted by the
inverse inclusion probability (V − U)/m. Loss and gradients are unbiased estimates of the exact ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .cauchy import linear_transform, ovr_log_probs, ovr_probability
from .losses import ovr_bce_per_position

__all__ = [
    "FusedOvrOutput",
    "SampledRows",
    "fused_ovr_loss",
    "model_classification_loss",
    "reference_ovr_loss",
    "sample_negative_rows",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass
class FusedOvrOutput:
    """Result of the OvR classification loss.

    loss: () the reduced loss ``Σ_i w_i·ℓ_i`` (divided by V when ``reduction="mean"``); differentiable.
    loss_per_position: (N,) ``ℓ_i = Σ_k BCE_ik`` (an unbiased estimate under sampled negatives); detached.
    target_prob: (N,) ``P(S_{i,y_i} > t_{y_i})``, the OvR probability of each target; detached.
    p_num: (N,) ``P(S_<NUM> > C_<NUM>)`` when ``num_token_id`` was given, else None; differentiable.
    """

    loss: Tensor
    loss_per_position: Tensor
    target_prob: Tensor
    p_num: Tensor | None = None


@dataclass
class SampledRows:
    """A shared set of vocabulary rows for sampled negatives.

    rows: (U+m,) long, the target union T (sorted) followed by the m sampled negatives.
    column_weights: (U+m,) float, 1 for T and (V − U)/m for each sampled row.
    target_columns: (N,) long, the column of each position's target inside ``rows``.
    """

    rows: Tensor
    column_weights: Tensor
    target_columns: Tensor


# ----------------------------------------------------------------------------------------------------------
# Input checks and shared helpers
# ----------------------------------------------------------------------------------------------------------


def _check_inputs(
    loc_U: Tensor, decision_scale: Tensor, weight: Tensor, bias: Tensor | None, threshold: Tensor, target_ids: Tensor
) -> None:
    """Raise ``ValueError`` naming the first input whose shape or values do not fit."""
    if loc_U.dim() != 2 or decision_scale.shape != loc_U.shape:
        raise ValueError(
            f"loc_U and decision_scale must both be (N, C), got {tuple(loc_U.shape)} and {tuple(decision_scale.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != loc_U.shape[1]:
        raise ValueError(f"weight must be (V, C={loc_U.shape[1]}), got {tuple(weight.shape)}")
    vocab = weight.shape[0]
    if bias is not None and bias.shape != (vocab,):
        raise ValueError(f"bias must be (V={vocab},) or None, got {tuple(bias.shape)}")
    if threshold.shape not in ((), (vocab,)):
        raise ValueError(f"threshold must be a scalar or (V={vocab},), got {tuple(threshold.shape)}")
    if target_ids.shape != (loc_U.shape[0],) or target_ids.dtype != torch.long:
        raise ValueError(
            f"target_ids must be a (N={loc_U.shape[0]},) long tensor, got {tuple(target_ids.shape)} {target_ids.dtype}"
        )
    if target_ids.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab):
        raise ValueError(
            f"target_ids must lie in [0, {vocab}) (drop ignored positions before the loss), "
            f"got range [{int(target_ids.min())}, {int(target_ids.max())}]"
        )


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """The slices are computed in fp32, or in fp64 when the inputs are fp64 (gradcheck)."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def _as_threshold(threshold: Tensor | float, like: Tensor) -> Tensor:
    """A float threshold becomes a 0-dim fp32 tensor on ``like``'s device."""
    if isinstance(threshold, Tensor):
        return threshold
    return torch.tensor(float(threshold), dtype=torch.float32, device=like.device)


def _as_token_noise(token_noise: Tensor | float | None, like: Tensor) -> Tensor:
    """``γ`` as a 0-dim tensor (``None``: 0, no token noise); raises ``ValueError`` for any other shape."""
    if token_noise is None:
        token_noise = 0.0
    if not isinstance(token_noise, Tensor):
        return torch.tensor(float(token_noise), dtype=torch.float32, device=like.device)
    if token_noise.dim() != 0:
        raise ValueError(f"token_noise must be a scalar (0-dim) scale, got shape {tuple(token_noise.shape)}")
    return token_noise


def _position_weights(
    num_positions: int, position_weights: Tensor | None, reduction: str, vocab: int, like: Tensor
) -> Tensor:
    """Per-position weights ``w_i`` of ``loss = Σ_i w_i·ℓ_i``: ``1/N`` by default, divided by V for ``"mean"``."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if position_weights is None:
        weights = torch.full(
            (num_positions,), 1.0 / max(num_positions, 1), dtype=compute_dtype(like), device=like.device
        )
    else:
        if position_weights.shape != (num_positions,):
            raise ValueError(f"position_weights must be (N={num_positions},), got {tuple(position_weights.shape)}")
        weights = position_weights.detach().to(compute_dtype(like))
    return weights / vocab if reduction == "mean" else weights  # (N,)


def _checked_inputs(
    loc_U: Tensor, decision_scale: Tensor, weight: Tensor, bias: Tensor | None, threshold: Tensor | float,
    target_ids: Tensor, token_noise: Tensor | float | None, position_weights: Tensor | None, reduction: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """What both loss entry points start from: the threshold () or (V,) and token noise () as tensors, and the
    per-position weights ``w_i`` (N,) (`_position_weights`), once every input is checked (`_check_inputs`)."""
    threshold = _as_threshold(threshold, loc_U)
    token_noise = _as_token_noise(token_noise, loc_U)
    _check_inputs(loc_U, decision_scale, weight, bias, threshold, target_ids)
    row_weights = _position_weights(loc_U.shape[0], position_weights, reduction, weight.shape[0], loc_U)  # (N,)
    return threshold, token_noise, row_weights


def sample_negative_rows(
    target_ids: Tensor, vocab: int, negatives: int, generator: torch.Generator | None = None
) -> SampledRows:
    """Target union T plus ``m`` rows drawn uniformly without replacement from the other ``V − U`` rows.

    Each sampled row has inclusion probability ``m/(V − U)``, so weighting it by ``(V − U)/m`` makes
    ``Σ_{k ∈ T} f_k + (V − U)/m · Σ_{k ∈ sample} f_k`` an unbiased estimate of ``Σ_k f_k``.
    When ``m ≥ V − U`` every row is taken with weight 1 (the exact loss).
    """
    if not (isinstance(negatives, int) and negatives > 0):
        raise ValueError(f"negatives must be a positive int, got {negatives!r}")
    device = target_ids.device
    union, target_columns = torch.unique(target_ids, sorted=True, return_inverse=True)  # (U,), (N,)
    is_candidate = torch.ones(vocab, dtype=torch.bool, device=device)
    is_candidate[union] = False
    candidates = is_candidate.nonzero().squeeze(1)  # (V−U,)
    num_candidates = candidates.numel()
    if negatives >= num_candidates:
        picked, weight = candidates, 1.0
    else:
        order = torch.randperm(num_candidates, generator=generator, device=generator.device if generator else device)
        picked, weight = candidates[order[:negatives].to(device)], num_candidates / negatives  # (m,)
    rows = torch.cat([union, picked])  # (U+m,)
    column_weights = torch.cat(
        [torch.ones(union.numel(), device=device), torch.full((picked.numel(),), weight, device=device)]
    )  # (U+m,)
    return SampledRows(rows=rows, column_weights=column_weights, target_columns=target_columns)


def _num_token_probability(
    loc_U: Tensor,
    decision_scale: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    threshold: Tensor,
    token_noise: Tensor,
    num_token_id: int,
) -> Tensor:
    """``P(S_<NUM> > t_<NUM>) = atan2(s·|w| + γ, −(loc_U·w + b − t))/π`` for one row ``w``; plain autograd, fp32
    (fp64 for fp64 inputs).

    → (N,)
    """
    dtype = compute_dtype(loc_U)
    row = weight[num_token_id].to(dtype)  # (C,)
    shift = -(threshold[num_token_id] if threshold.dim() else threshold).to(dtype)
    if bias is not None:
        shift = shift + bias[num_token_id].to(dtype)
    distance = loc_U.to(dtype) @ row + shift  # (N,)
    scale = decision_scale.to(dtype) @ row.abs() + token_noise.to(dtype)  # (N,)
    return torch.atan2(scale, -distance) / math.pi


# ----------------------------------------------------------------------------------------------------------
# The fused autograd function
# ----------------------------------------------------------------------------------------------------------


class _SliceInputs(NamedTuple):
    """What the slice loop reads, in the order `_FusedOvrFunction` takes them; the first six are the
    differentiable ones (the order of ``needs`` and of `_SliceGrads`). ``weight``, ``bias`` and ``threshold`` hold
    every vocabulary row, or only the sampled ones (U+m rows) under sampled negatives."""

    loc_U: Tensor  # (N,C)
    decision_scale: Tensor  # (N,C)
    weight: Tensor  # (V,C)
    bias: Tensor | None  # (V,)
    threshold: Tensor  # () or (V,)
    token_noise: Tensor  # () γ
    target_ids: Tensor  # (N,) long, each target's row of ``weight``
    row_weights: Tensor  # (N,) w_i
    column_weights: Tensor | None  # (V,) c_k of the sampled rows; None: every row counts once


@dataclass
class _SliceGrads:
    """Gradient accumulators (compute dtype, ∂W in the weight's dtype) filled slice by slice; None where no
    gradient is needed."""

    loc_U: Tensor | None  # (N,C)
    scale: Tensor | None  # (N,C)
    weight: Tensor | None  # (V,C) in the weight's dtype
    bias: Tensor | None  # (V,)
    threshold: Tensor | None  # () or (V,)
    token_noise: Tensor | None  # ()


@dataclass
class _Workspace:
    """Buffers reused by every slice (fresh large allocations cost page faults on every slice):
    five float (N, K) buffers and a bool (N, K) mask for the scores; float (K, C) buffers for the rows:
    |W| and sign(W), plus W in the compute dtype and a ∂W staging buffer when the weight is bf16/fp16.
    All flat; the views cut the slice's shapes."""

    scores: Tensor  # (5, N·K)
    mask: Tensor  # (N·K,)
    rows: Tensor  # (2 or 4, K·C)

    @classmethod
    def allocate(
        cls, num_positions: int, chunk_size: int, causal_size: int, like: Tensor, cast_rows: bool
    ) -> "_Workspace":
        return cls(
            scores=torch.empty(5, num_positions * chunk_size, dtype=like.dtype, device=like.device),  # (5, N·K)
            mask=torch.empty(num_positions * chunk_size, dtype=torch.bool, device=like.device),  # (N·K,)
            rows=torch.empty(4 if cast_rows else 2, chunk_size * causal_size, dtype=like.dtype, device=like.device),
        )

    def score_views(self, num_positions: int, width: int) -> tuple[Tensor, ...]:
        """Five float (N, width) views, then the bool (N, width) mask."""
        size = num_positions * width
        floats = tuple(buffer[:size].view(num_positions, width) for buffer in self.scores)  # (N,K) each
        return (*floats, self.mask[:size].view(num_positions, width))

    def row_views(self, width: int, causal_size: int) -> tuple[Tensor | None, ...]:
        """Four (width, C) views: |W|, sign(W), W in the compute dtype, ∂W staging (the last two None for fp32)."""
        size = width * causal_size
        views = [buffer[:size].view(width, causal_size) for buffer in self.rows]  # (K,C) each
        return tuple(views + [None] * (4 - len(views)))


def _log_p_from_tail(tail: Tensor, above: Tensor) -> Tensor:
    """``log P`` from the tail mass ``u = min(P, 1 − P)`` and ``above = d ≥ 0``: ``log1p(−u)`` where
    ``P ≥ ½``, ``log u`` where ``P < ½`` (never ``log`` of a number next to 1)."""
    return torch.where(above, torch.log1p(-tail), torch.log(tail))


def _process_slice(
    start: int,
    stop: int,
    loc_U: Tensor,
    scale_in: Tensor,
    token_noise: Tensor,
    weight: Tensor,
    shift: Tensor,
    target_ids: Tensor,
    row_weights: Tensor,
    column_weights: Tensor | None,
    workspace: _Workspace,
    loss: Tensor,
    target_log_prob: Tensor,
    grads: _SliceGrads | None,
) -> None:
    """Loss terms and gradients of vocabulary rows ``[start, stop)``; accumulates into ``loss`` and ``grads``.

    With ``u = atan2(s, |d|)/π = min(P, 1−P)``: ``log(1−P) = log u`` where ``d ≥ 0`` and ``log1p(−u)`` where
    ``d < 0``; the target entries are then switched to ``−log P``.

    loc_U, scale_in: (N,C), token_noise: () γ, shift = b − t: (V,), loss, target_log_prob: (N,), all in the
    compute dtype; weight: (V,C) in its own dtype.
    """
    (num_positions, causal_size), width = loc_U.shape, stop - start
    abs_w, sign_w, w_buffer, staging = workspace.row_views(width, causal_size)  # (K,C) each
    w_slice = weight[start:stop]  # (K,C)
    if w_buffer is not None:
        w_slice = w_buffer.copy_(w_slice)
    torch.abs(w_slice, out=abs_w)
    d, sc, u, tmp, extra, above = workspace.score_views(num_positions, width)  # (N,K) each

    torch.addmm(shift[start:stop], loc_U, w_slice.t(), out=d)  # d = loc − t
    torch.mm(scale_in, abs_w.t(), out=sc).add_(token_noise)  # scale = s·|W| + γ
    torch.abs(d, out=tmp)
    torch.atan2(sc, tmp, out=u).mul_(1.0 / math.pi)  # u = min(P, 1 − P)
    torch.ge(d, 0, out=above)  # P ≥ ½
    torch.neg(u, out=tmp).log1p_()  # log(1 − u)
    torch.log(u, out=extra)  # log u
    torch.where(above, extra, tmp, out=tmp)  # log(1 − P)

    # Target entries of this slice (column weight 1 by construction): −log(1−P) is replaced by −log P.
    rows = ((target_ids >= start) & (target_ids < stop)).nonzero().squeeze(1)  # (n_t,)
    cols = target_ids[rows] - start  # (n_t,)
    t_d, t_s = d[rows, cols], sc[rows, cols]  # (n_t,) each
    t_log_p = _log_p_from_tail(u[rows, cols], t_d >= 0)  # (n_t,)
    target_log_prob[rows] = t_log_p
    loss.index_add_(0, rows, tmp[rows, cols] - t_log_p)
    row_sum = tmp.sum(1) if column_weights is None else tmp @ column_weights[start:stop]  # (N,)
    loss.sub_(row_sum)

    if grads is None:
        return
    # q = w/(π·r²·(1−P)) off target, −w/(π·r²·P) on target; A = s·q, −B = d·q.
    torch.sub(torch.ones((), dtype=u.dtype, device=u.device), u, out=extra)
    torch.where(above, u, extra, out=extra)  # 1 − P
    torch.mul(d, d, out=tmp)
    tmp.addcmul_(sc, sc).mul_(extra)  # r²·(1 − P)
    torch.div(row_weights.unsqueeze(1) / math.pi, tmp, out=tmp)  # q
    if column_weights is not None:
        tmp.mul_(column_weights[start:stop])
    tmp[rows, cols] = -row_weights[rows] / (math.pi * (t_d * t_d + t_s * t_s) * t_log_p.exp())
    grad_d = sc.mul_(tmp)  # A = ∂L/∂d (N,K)
    neg_grad_scale = d.mul_(tmp)  # −B = −∂L/∂scale (N,K)
    if grads.weight is not None:
        torch.sign(w_slice, out=sign_w)
    _accumulate_slice_grads(
        start, stop, loc_U, scale_in, w_slice, abs_w, sign_w, staging, grad_d, neg_grad_scale, grads
    )


def _accumulate_slice_grads(
    start: int,
    stop: int,
    loc_U: Tensor,
    scale_in: Tensor,
    w_slice: Tensor,
    abs_w: Tensor,
    sign_w: Tensor,
    staging: Tensor | None,
    grad_d: Tensor,
    neg_grad_scale: Tensor,
    grads: _SliceGrads,
) -> None:
    """``∂loc_U += A·W``, ``∂s −= (−B)·|W|``, ``∂W = Aᵀ·loc_U − sign(W) ⊙ ((−B)ᵀ·s)``,
    ``∂b = Σ_i A``, ``∂t = −Σ_i A``, ``∂γ −= Σ_ik (−B)``.

    w_slice, abs_w, sign_w, staging: (K,C); grad_d = A, neg_grad_scale = −B: (N,K).
    """
    if grads.loc_U is not None:
        grads.loc_U.addmm_(grad_d, w_slice)
    if grads.scale is not None:
        grads.scale.addmm_(neg_grad_scale, abs_w, alpha=-1.0)
    if grads.token_noise is not None:
        grads.token_noise.sub_(neg_grad_scale.sum())
    if grads.weight is not None:
        target = grads.weight[start:stop]  # (K,C)
        out = target if target.dtype == grad_d.dtype else staging
        torch.mm(neg_grad_scale.t(), scale_in, out=out).mul_(sign_w)  # sign(W) ⊙ (−B)ᵀ·s
        out.addmm_(grad_d.t(), loc_U, beta=-1.0)
        if out is not target:
            target.copy_(out)
    if grads.bias is None and grads.threshold is None:
        return
    column_sum = grad_d.sum(0)  # (K,)
    if grads.bias is not None:
        grads.bias[start:stop] = column_sum
    if grads.threshold is not None:
        if grads.threshold.dim():
            grads.threshold[start:stop] = -column_sum
        else:
            grads.threshold.sub_(column_sum.sum())


def _run_slices(
    inputs: _SliceInputs, chunk_size: int, needs: tuple[bool, ...]
) -> tuple[Tensor, Tensor, _SliceGrads | None]:
    """Per-position loss ℓ (N,), log P of each target (N,) and the gradients of ``Σ_i w_i·ℓ_i`` w.r.t. the
    inputs flagged in ``needs`` (loc_U, decision_scale, weight, bias, threshold, token_noise), one vocabulary slice
    at a time."""
    loc_U, weight, bias, threshold = inputs.loc_U, inputs.weight, inputs.bias, inputs.threshold
    num_positions, vocab = loc_U.shape[0], weight.shape[0]
    device, dtype = loc_U.device, compute_dtype(loc_U)
    loc_c, scale_c = loc_U.to(dtype), inputs.decision_scale.to(dtype)  # (N,C)
    shift = -threshold.to(dtype).expand(vocab)  # (V,)  b − t
    if bias is not None:
        shift = shift + bias.to(dtype)
    noise_c = inputs.token_noise.detach().to(dtype)  # () γ
    grads = _allocate_grads(needs, loc_c, weight, bias, threshold)
    loss = torch.zeros(num_positions, dtype=dtype, device=device)  # (N,)
    target_log_prob = torch.zeros(num_positions, dtype=dtype, device=device)  # (N,)
    chunk = max(1, min(chunk_size, vocab))
    workspace = _Workspace.allocate(num_positions, chunk, loc_c.shape[1], loc_c, cast_rows=weight.dtype != dtype)
    rows_w = inputs.row_weights.to(dtype)  # (N,)
    cols_w = inputs.column_weights.to(dtype) if inputs.column_weights is not None else None  # (V,)
    for start in range(0, vocab, chunk):
        stop = min(start + chunk, vocab)
        _process_slice(
            start, stop, loc_c, scale_c, noise_c, weight, shift, inputs.target_ids, rows_w, cols_w, workspace, loss,
            target_log_prob, grads,
        )
    return loss, target_log_prob, grads


class _FusedOvrFunction(torch.autograd.Function):
    """``Σ_i w_i·ℓ_i`` with every gradient computed during the forward pass (see the module docstring).

    The first backward hands the stored gradients over (so autograd takes ∂W (V,C) without a copy); a
    further backward through the same graph (``retain_graph=True``, gradcheck) recomputes them.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, chunk_size: int, *flat_inputs: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``flat_inputs``: the fields of `_SliceInputs` in order, one argument each so that autograd sees every
        tensor. → the reduced loss (), ℓ (N,) and log P of each target (N,)."""
        inputs = _SliceInputs(*flat_inputs)
        loss, target_log_prob, grads = _run_slices(inputs, chunk_size, ctx.needs_input_grad[1:])
        ctx.grads = grads
        ctx.chunk_size = chunk_size
        ctx.input_dtypes = (
            inputs.loc_U.dtype, inputs.decision_scale.dtype, inputs.threshold.dtype, inputs.token_noise.dtype
        )
        if grads is not None:
            ctx.save_for_backward(*inputs)  # references only: used if backward runs a second time
        reduced = (inputs.row_weights * loss).sum()  # ()
        ctx.mark_non_differentiable(loss, target_log_prob)
        return reduced, loss, target_log_prob

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_per_position: Tensor, _grad_target: Tensor):  # type: ignore[override]
        grads: _SliceGrads | None = ctx.grads
        ctx.grads = None  # hand the tensors over so autograd can take ∂W without a copy
        if grads is None:
            grads = _run_slices(_SliceInputs(*ctx.saved_tensors), ctx.chunk_size, ctx.needs_input_grad[1:])[2]
        assert grads is not None
        loc_dtype, scale_dtype, threshold_dtype, noise_dtype = ctx.input_dtypes
        unit = bool((grad_loss == 1).all())

        def scaled(tensor: Tensor | None, dtype: torch.dtype | None = None) -> Tensor | None:
            if tensor is None:
                return None
            out = tensor if unit else tensor * grad_loss.to(tensor.dtype)
            return out if dtype is None else out.to(dtype)

        return (
            None,  # chunk_size
            scaled(grads.loc_U, loc_dtype),
            scaled(grads.scale, scale_dtype),
            scaled(grads.weight),
            scaled(grads.bias),
            scaled(grads.threshold, threshold_dtype),
            scaled(grads.token_noise, noise_dtype),
            None,  # target_ids
            None,  # row_weights
            None,  # column_weights
        )


def _needs_gradients(differentiable_inputs: tuple[Tensor | None, ...]) -> bool:
    """True when autograd will record the loss: grad mode is on and some input requires a gradient.

    (Inside ``autograd.Function.forward`` ``ctx.needs_input_grad`` follows ``requires_grad`` only, not the
    grad mode, so this is decided before the function is applied.)"""
    if not torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in differentiable_inputs)


def _allocate_grads(
    needs: tuple[bool, ...], loc_c: Tensor, weight: Tensor, bias: Tensor | None, threshold: Tensor
) -> _SliceGrads | None:
    """Zeroed accumulators (compute dtype) for the inputs that need a gradient; None when none does."""
    if not any(needs[:6]):
        return None
    device = loc_c.device
    return _SliceGrads(
        loc_U=torch.zeros_like(loc_c) if needs[0] else None,  # (N,C)
        scale=torch.zeros_like(loc_c) if needs[1] else None,  # (N,C)
        weight=torch.empty_like(weight) if needs[2] else None,  # (V,C), every slice writes its rows
        bias=torch.empty(weight.shape[0], dtype=bias.dtype, device=device) if bias is not None and needs[3] else None,
        threshold=torch.zeros(threshold.shape, dtype=loc_c.dtype, device=device) if needs[4] else None,
        token_noise=torch.zeros((), dtype=loc_c.dtype, device=device) if needs[5] else None,
    )


# ----------------------------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------------------------


def fused_ovr_loss(
    loc_U: Tensor,
    decision_scale: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    threshold: Tensor | float,
    target_ids: Tensor,
    *,
    chunk_size: int = 8192,
    reduction: str = "sum",
    position_weights: Tensor | None = None,
    num_token_id: int | None = None,
    negatives: int | None = None,
    generator: torch.Generator | None = None,
    token_noise: Tensor | float | None = None,
    implementation: str = "fused",
) -> FusedOvrOutput:
    """OvR Cauchy head + binary cross-entropy, fused and chunked over the vocabulary.

    ``loss = Σ_i w_i·ℓ_i`` with ``ℓ_i = Σ_k BCE(P_ik, y_ik)`` exactly as
    ``losses.ovr_bce_per_position(loc_U @ Wᵀ + b, decision_scale @ |W|ᵀ + γ, threshold, target_ids)``;
    ``w_i = 1/N`` (``reduction="sum"``: sum over the vocabulary, mean over positions) or ``1/(N·V)``
    (``"mean"``), or ``position_weights`` (N,) (then divided by V for ``"mean"``).

    loc_U, decision_scale: (N,C), only the positions that have a target (drop ignored ones first);
    weight: (V,C); bias: (V,) or None; threshold: () or (V,) or a float; target_ids: (N,) long in [0, V);
    token_noise: ``γ`` () ≥ 0, every token's own noise scale (None: 0). ``negatives=m`` replaces the exact sum by the unbiased sampled estimate (module docstring);
    ``generator`` makes the draw reproducible. Inputs in bf16/fp16 are computed in fp32 per slice and their
    gradients cast back. The returned gradients are exact for ``loss``; ``loss_per_position`` is detached.
    ``implementation="reference"`` computes the same with plain autograd (`reference_ovr_loss`).
    """
    if implementation not in ("fused", "reference"):
        raise ValueError(f"implementation must be 'fused' or 'reference', got {implementation!r}")
    threshold, token_noise, row_weights = _checked_inputs(
        loc_U, decision_scale, weight, bias, threshold, target_ids, token_noise, position_weights, reduction
    )
    if implementation == "reference":
        return _reference_loss(loc_U, decision_scale, weight, bias, threshold, token_noise, target_ids, row_weights,
                               num_token_id, negatives, generator)
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    vocab = weight.shape[0]
    head_weight, head_bias, head_threshold, targets, column_weights = weight, bias, threshold, target_ids, None
    if negatives is not None:
        sampled = sample_negative_rows(target_ids, vocab, negatives, generator)
        head_weight = weight.index_select(0, sampled.rows)  # (U+m,C)
        head_bias = bias.index_select(0, sampled.rows) if bias is not None else None  # (U+m,)
        head_threshold = threshold.index_select(0, sampled.rows) if threshold.dim() else threshold
        targets, column_weights = sampled.target_columns, sampled.column_weights
    inputs = _SliceInputs(
        loc_U, decision_scale, head_weight, head_bias, head_threshold, token_noise, targets, row_weights, column_weights
    )
    if _needs_gradients(inputs[:6]):
        loss, per_position, target_log_prob = _FusedOvrFunction.apply(chunk_size, *inputs)
    else:
        # No graph will be built (torch.no_grad / inference_mode, or nothing requires a gradient): the loss
        # only, with no gradient accumulators and no gradient products per slice.
        per_position, target_log_prob, _ = _run_slices(inputs, chunk_size, (False,) * 6)
        loss = (row_weights * per_position).sum()  # ()
    p_num = None
    if num_token_id is not None:
        p_num = _num_token_probability(loc_U, decision_scale, weight, bias, threshold, token_noise, num_token_id)
    return FusedOvrOutput(loss=loss, loss_per_position=per_position, target_prob=target_log_prob.exp(), p_num=p_num)


def reference_ovr_loss(*args, **kwargs) -> FusedOvrOutput:
    """`fused_ovr_loss` (same arguments, same result) written directly from `losses.ovr_bce_per_position` with
    plain autograd: it materialises (N, V) tensors, and is the fused path's oracle in tests and benchmarks."""
    return fused_ovr_loss(*args, implementation="reference", **kwargs)


def _reference_loss(
    loc_U: Tensor, decision_scale: Tensor, weight: Tensor, bias: Tensor | None, threshold: Tensor,
    token_noise: Tensor, target_ids: Tensor, row_weights: Tensor, num_token_id: int | None, negatives: int | None,
    generator: torch.Generator | None,
) -> FusedOvrOutput:
    """The reference computation on checked inputs (`_checked_inputs`); bf16/fp16 inputs are promoted to fp32,
    as the fused path computes."""
    vocab = weight.shape[0]
    up = (lambda t: t.float() if t is not None and t.dtype in _LOW_PRECISION else t)  # noqa: E731
    head_weight, head_bias, head_threshold = up(weight), up(bias), up(threshold)
    loc_S, scale_S = linear_transform(up(loc_U), up(decision_scale), head_weight, head_bias)  # (N,V) each
    scale_S = scale_S + up(token_noise).to(scale_S.dtype)
    if negatives is None:
        per_position = ovr_bce_per_position(loc_S, scale_S, head_threshold, target_ids)  # (N,)
        target_log_p = ovr_log_probs(
            loc_S.gather(1, target_ids[:, None]), scale_S.gather(1, target_ids[:, None]),
            head_threshold[target_ids, None] if head_threshold.dim() else head_threshold,
        )[0].squeeze(1)  # (N,)
    else:
        sampled = sample_negative_rows(target_ids, vocab, negatives, generator)
        per_position, target_log_p = _reference_sampled_terms(loc_S, scale_S, head_threshold, sampled)
    loss = (row_weights.to(per_position.dtype) * per_position).sum()  # ()
    p_num = None
    if num_token_id is not None:
        p_num = ovr_probability(
            loc_S[:, num_token_id],
            scale_S[:, num_token_id],
            head_threshold[num_token_id] if head_threshold.dim() else head_threshold,
        )
    return FusedOvrOutput(
        loss=loss, loss_per_position=per_position.detach(), target_prob=target_log_p.detach().exp(), p_num=p_num
    )


def _reference_sampled_terms(
    loc_S: Tensor, scale_S: Tensor, threshold: Tensor, sampled: SampledRows
) -> tuple[Tensor, Tensor]:
    """Weighted BCE over the sampled columns, ``Σ_j c_j·BCE_ij`` (targets exact): per position (N,), and
    log P of each target (N,)."""
    columns = sampled.rows
    sub_threshold = threshold[columns] if threshold.dim() else threshold
    log_p, log_not_p = ovr_log_probs(loc_S[:, columns], scale_S[:, columns], sub_threshold)  # (N,U+m) each
    one_hot = torch.zeros_like(log_p, dtype=torch.bool)
    one_hot.scatter_(1, sampled.target_columns.unsqueeze(1), True)  # (N,U+m)
    terms = -torch.where(one_hot, log_p, log_not_p)  # (N,U+m)
    per_position = terms @ sampled.column_weights.to(terms.dtype)  # (N,)
    return per_position, log_p.gather(1, sampled.target_columns.unsqueeze(1)).squeeze(1)


def model_classification_loss(
    loc_U: Tensor,
    decision_scale: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    threshold: Tensor,
    target_ids: Tensor,
    *,
    position_weight: float,
    num_token_id: int,
    **options: Any,
) -> tuple[Tensor, Tensor]:
    """The model's call: ``(Σ_i position_weight·ℓ_i, P_<NUM> (N,))`` from `fused_ovr_loss` (``options``: its
    keywords ``chunk_size``, ``negatives``, ``generator``, ``token_noise``, ``implementation``).

    ``position_weight`` is the same for every position (``1/N``, or ``1/(N·V)`` for ``ovr_reduction="mean"``).
    """
    weights = torch.full((loc_U.shape[0],), float(position_weight), dtype=torch.float32, device=loc_U.device)  # (N,)
    out = fused_ovr_loss(loc_U, decision_scale, weight, bias, threshold, target_ids, position_weights=weights,
                         num_token_id=num_token_id, **options)
    assert out.p_num is not None
    return out.loss, out.p_num
