"""The decision rules of docs/design.md ("Decision rules"), written once: pure tensor functions that turn the heads'
outputs at a position into scores whose argmax is the mode's decision.

Shape legend: B batch, S positions, C causal size, V vocabulary rows.

    traditional  scores = loc_S = W_cls loc_U + b_cls                      (softmax sampling / greedy on top)
    standard     scores = (loc_S − t) / scale_S,  scale_S = |W_cls| (scale_U + |b_noise|) + γ_S
                 argmax_k scores = argmax_k P(S_k > t_k)
    causal       u = loc_U + τ_i·scale_U ⊙ c,  c = tan(π(ε − ½)),  ε ~ U(0,1)^C   (the individual)
                 τ_i = τ·ρ(g_i),  ρ(g) = (π/4)·g / tan((π/2)·tanh(g/2)),  g_i = loc_S(1) − loc_S(2)
                 scores = (W_cls u + b_cls − t) / scale_S°  on the K candidates (−inf elsewhere),
                 scale_S° = |W_cls| (max(1 − τ_i, 0)·scale_U + |b_noise|) + γ_S
                 (for τ_i ≥ 1 the constant |W_cls| |b_noise| + γ_S (V,)); a row with scale_S°_k = 0 is certain

``c`` are the individual's standard-Cauchy coordinates and ``τ`` the causal temperature (``config.causal_temperature``),
the individual's spread at decision time only, so standard mode, the probabilities and the losses never see it. Since
Cauchy scales add, ``U = loc_U + τ_i·scale_U ⊙ c + Cauchy(0, (1 − τ_i)·scale_U)`` for ``τ_i ≤ 1``: the part of the
individual not drawn stays in the decision's scale. So ``τ = 0`` is standard mode's decision exactly (nothing drawn),
``τ_i = 1`` draws ``U ~ Cauchy(loc_U, scale_U)`` itself, and ``τ_i > 1`` widens the draw beyond the abducted spread.

Two things shape the individual's reach at a position (docs/design.md, "The individual's reach"):

* ``ρ(g_i)``, the *spread factor*, of the margin ``g_i`` between the position's two largest logits ``loc_S``. With
  two tokens whose scores move by Cauchy noise of difference scale ``w``, the individual picks the second with
  probability ``½ − atan(g/(τρw))/π``; the softmax picks it with ``1/(1 + e^g)``; the two agree at every margin for
  the one ``τ = 4/(πw)`` exactly when ``ρ = (π/4)·g/tan((π/2)·tanh(g/2))``. So ``ρ(0) = 1`` where the base hesitates
  and ``ρ(g) ≈ (π²/4)·g·e^(−g)`` where it is sure: a Cauchy's heavy tail would otherwise overturn a settled choice
  with probability ``∝ 1/g`` where the softmax does so with ``e^(−g)``.
* The *candidates*: the ``K`` (``config.causal_candidates``) tokens with the highest standard-mode scores. An
  individual chooses among what the population finds plausible; without that, one large coordinate ``c_j`` makes the
  token with the largest ``W_kj`` win whatever the context ("theplr"). ``τ = 0`` still decides as standard mode does
  (its choice is the first candidate).

Constant scales are cached per module until one of their weights changes (`_derived`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from .cauchy import decision_score

__all__ = [
    "decision_scores",
    "spread_factor",
    "individual_number",
    "causal_scores",
    "constant_scale",
    "position_free_scale",
    "cauchy_coordinates",
    "sample_individual",
]

# ============================================================================================================
# Caches of weight-derived tensors (recomputed when a weight changes in place or is replaced)
# ============================================================================================================
_DERIVED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, tuple[tuple, Any]]]" = weakref.WeakKeyDictionary()


def _fingerprint(tensors: Sequence[Tensor]) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device) for t in tensors)


def _derived(owner: torch.nn.Module, name: str, sources: Sequence[Tensor], compute: Callable[[], Any]) -> Any:
    """``compute()`` cached on ``owner`` under ``name`` until one of ``sources`` changes (its storage or its version
    counter: in-place updates by optimizers, ``copy_``, ``load_state_dict``)."""
    key = _fingerprint(sources)
    entries = _DERIVED.setdefault(owner, {})
    entry = entries.get(name)
    if entry is not None and entry[0] == key:
        return entry[1]
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor, usable after inference mode too
        value = compute()
    entries[name] = (key, value)
    return value


def _constant_scale(weight: Tensor, s: Tensor, token_noise: Tensor, block: int = 16384) -> tuple[Tensor, Tensor, bool]:
    """``scale_S = |W| |s| + γ_S`` (V,) float32, built ``block`` rows at a time; ``1/scale_S`` (V,) (``1/tiny`` where
    the scale is 0); and whether some row's scale is 0. s: (C,); token_noise: ``γ_S`` ()."""
    s32 = s.detach().abs().float()  # (C,)
    parts = [
        F.linear(s32, weight[start : start + block].detach().abs().float())  # (block,)
        for start in range(0, weight.shape[0], block)
    ]
    scale = torch.cat(parts).add_(token_noise.detach().abs().float())  # (V,)
    inverse = 1.0 / scale.clamp_min(torch.finfo(torch.float32).tiny)  # (V,)
    return scale, inverse, bool((scale == 0).any())


def constant_scale(action: torch.nn.Module) -> tuple[Tensor, Tensor, bool]:
    """Causal mode's scale ``scale_S° = |W_cls| |b_noise| + γ_S`` of an `ActionNetwork`: ``(scale (V,), 1/scale (V,),
    some row is 0)``, cached until ``W_cls``, ``b_noise`` or ``γ_S`` change."""
    head = action.classification_head
    sources = (head.weight, action.b_noise, action.token_noise)
    return _derived(
        action, "constant_scale", sources, lambda: _constant_scale(head.weight, action.b_noise, action.token_noise)
    )


def position_free_scale(model) -> tuple[Tensor, Tensor] | None:
    """Standard mode's ``(scale_S, 1/scale_S)`` (V,) float32 when it does not depend on the position, else None.

    With ``W_scale = 0`` (as after the calibration at conversion) ``scale_U = softplus(b_scale)`` is the same at every
    position, so ``scale_S = |W_cls| (softplus(b_scale) + |b_noise|) + γ_S`` is one vector, cached until one of those
    parameters changes; every row's scale must be positive (else None: the full scale decides)."""
    scale_net, action = model.abduction.scale_net, model.action
    head = action.classification_head
    sources = (scale_net.weight, scale_net.bias, action.b_noise, action.token_noise, head.weight)

    def build():
        if bool(scale_net.weight.detach().any()):
            return None
        s = action.decision_scale(F.softplus(scale_net.bias.detach().float()))  # (C,)
        scale, inverse, has_zero = _constant_scale(head.weight, s, action.token_noise)  # (V,) each
        return None if has_zero else (scale, inverse)

    return _derived(action, "position_free_scale", sources, build)


def _float_thresholds(model) -> Tensor:
    """The thresholds ``t`` in float32, () or (V,), cached until they change."""
    values = model.ovr_thresholds.values
    return _derived(model.ovr_thresholds, "float_thresholds", (values,), lambda: values.detach().float())


# ============================================================================================================
# Decision rules
# ============================================================================================================
def causal_scores(
    loc_S: Tensor, scale_S: Tensor, threshold: Tensor | float, inverse_scale: Tensor | None = None
) -> Tensor:
    """Scores (...,V) float32 whose argmax is ``argmax_k P(S_k > t_k)`` for ``S_k ~ Cauchy(loc_S_k, scale_S_k)`` with a
    position-free scale that may be 0.

    loc_S: (...,V) (``-inf`` bans a row); scale_S: (V,) ≥ 0; threshold: () or (V,); inverse_scale: (V,) ``1/scale_S``,
    given only when every scale is positive (then the scores are ``d·(1/scale_S)``).

    With ``d = loc_S − t``: a row with ``scale_S_k > 0`` has ``P_k = ½ + atan(d_k/scale_S_k)/π``, ordered by
    ``d_k/scale_S_k``; a row with ``scale_S_k = 0`` is certain, ``P_k = 1`` if ``d_k > 0`` else 0. So where some certain
    row has ``d > 0`` the scores are ``d`` on those rows and ``-inf`` elsewhere; otherwise ``d/scale_S`` on the rows
    with a positive scale and ``-inf`` on the certain ones; with no positive scale at all, ``d`` itself.
    """
    threshold = torch.as_tensor(threshold, device=loc_S.device).float()
    if inverse_scale is not None:
        return (loc_S.float() - threshold).mul_(inverse_scale)
    zero = scale_S == 0  # (V,)
    if not bool(zero.any()):
        return decision_score(loc_S, scale_S, threshold)
    distance = loc_S.float() - threshold  # (...,V)
    if bool(zero.all()):
        return distance
    ratio = (distance / scale_S.where(~zero, 1.0)).masked_fill(zero, -math.inf)  # (...,V) certain rows out
    certain_win = distance.masked_fill(~zero | (distance <= 0), -math.inf)  # (...,V) d of rows with P = 1
    has_certain_win = (certain_win > -math.inf).any(dim=-1, keepdim=True)  # (...,1)
    return torch.where(has_certain_win, certain_win, ratio)


def spread_factor(margin: Tensor) -> Tensor:
    """``ρ(g) = (π/4)·g / tan((π/2)·tanh(g/2)) = (π/4)·g·tan(π·σ(−g))`` (the module docstring; ``σ`` the logistic
    function), float32 of the shape of ``margin``: 1 at ``g = 0``, ``≈ (π²/4)·g·e^(−g)`` for large ``g``, 0 at
    ``g = ∞``, in [0, 1] and falling for every ``g ≥ 0``; a NaN or negative margin counts as 0. The second form,
    in float64, keeps its precision where ``tanh`` rounds to 1."""
    g = torch.nan_to_num(margin.double(), nan=0.0, posinf=math.inf).clamp_min(0.0)
    factor = (math.pi / 4) * g * torch.tan(math.pi * torch.sigmoid(-g))
    factor = torch.where(torch.isinf(g), torch.zeros_like(g), factor)
    return torch.where(g > 1e-6, factor, torch.ones_like(g)).float()


def top_margin(loc_S: Tensor) -> Tensor:
    """``g = loc_S(1) − loc_S(2)`` (...,) float32: the gap between the two largest entries of the last dimension
    (0 with a single entry; ``inf`` gaps, as from banned rows, are kept: ``ρ`` is then ~0)."""
    if loc_S.shape[-1] < 2:
        return loc_S.new_zeros(loc_S.shape[:-1], dtype=torch.float32)
    best = loc_S.float().topk(2, dim=-1).values  # (...,2)
    return best[..., 0] - best[..., 1]


def _standard_scores(model, loc_U: Tensor, scale_U: Tensor) -> tuple[Tensor, Tensor]:
    """``loc_S`` (B,S,V) in the weights' dtype and standard mode's scores (B,S,V) float32, ``loc_S`` formed once."""
    head = model.action.classification_head
    thresholds = _float_thresholds(model)  # () or (V,)
    fixed = position_free_scale(model)
    if fixed is None:
        loc_S, scale_S = model.action.classify(loc_U, scale_U)  # (B,S,V) each
        return loc_S, decision_score(loc_S, scale_S, thresholds)
    loc_S = F.linear(loc_U, head.weight, head.bias)  # (B,S,V)
    return loc_S, (loc_S.float() - thresholds).mul_(fixed[1])


def decision_scores(
    model, loc_U: Tensor, scale_U: Tensor, coordinates: Tensor | None = None, temperature: float = 1.0
) -> tuple[Tensor, Tensor | None]:
    """The standard (``coordinates`` None) or causal decision scores of ``model`` (a `CausalQwenForCausalLM`), and the
    individual ``u`` of causal mode (None in standard mode).

    loc_U, scale_U: (B,S,C); coordinates: c (B,C) or (B,S,C), the individual's standard-Cauchy coordinates;
    temperature: τ ≥ 0  →  scores (B,S,V) float32, u (B,S,C).

    Standard mode multiplies ``loc_S − t`` by the cached ``1/scale_S`` when the scale is position-free, else forms the
    full ``scale_S``. Causal mode forms ``loc_S``, the position's ``τ_i = τ·ρ(g_i)`` and standard mode's scores, and
    then the individual's scores on the ``K = config.causal_candidates`` best of those alone (`_candidate_scores`:
    ``K`` rows of ``W_cls``, not the vocabulary; −inf elsewhere). With ``K = 0`` it scores every token, forming
    ``W_cls loc_U`` and ``W_cls (scale_U ⊙ c)`` in one product (the weight is read once). ``τ = 0`` is standard mode.
    """
    if coordinates is None or temperature == 0:
        return _standard_scores(model, loc_U, scale_U)[1], (None if coordinates is None else loc_U)
    head = model.action.classification_head
    if coordinates.dim() == 2:
        coordinates = coordinates.unsqueeze(1)  # (B,1,C)
    direction = (scale_U.double() * coordinates.double()).expand(loc_U.shape)  # (B,S,C) scale_U ⊙ c, float64
    candidates = int(getattr(getattr(model, "config", None), "causal_candidates", 0) or 0)
    if 0 < candidates < head.weight.shape[0]:
        loc_S, standard = _standard_scores(model, loc_U, scale_U)  # (B,S,V) the population's logits, its scores
        reach = float(temperature) * spread_factor(top_margin(loc_S))  # (B,S) τ_i
        scores = _candidate_scores(model, loc_S, standard, scale_U, direction, reach, candidates)
    else:
        scores, reach = _every_token_scores(model, loc_U, scale_U, direction, float(temperature))
    u = (loc_U.double() + reach.unsqueeze(-1).double() * direction).to(loc_U.dtype)  # (B,S,C) the individual
    return scores, u


def _candidate_scores(
    model, loc_S: Tensor, standard: Tensor, scale_U: Tensor, direction: Tensor, reach: Tensor, candidates: int
) -> Tensor:
    """Causal scores (B,S,V) float32 on each position's ``candidates`` best ``standard`` scores, −inf elsewhere:
    ``(l_k + τ_i·W_k(scale_U ⊙ c) − t_k) / (|W_k| (κ_i·scale_U + |b_noise|) + γ_S)``, ``κ_i = max(1 − τ_i, 0)``,
    formed from the candidates' rows of ``W_cls`` only.

    loc_S, standard: (B,S,V); scale_U: (B,S,C); direction: ``scale_U ⊙ c`` (B,S,C) float64; reach: ``τ_i`` (B,S)."""
    action = model.action
    ids = standard.topk(candidates, dim=-1).indices  # (B,S,K)
    rows = action.classification_head.weight[ids].float()  # (B,S,K,C)
    moves = torch.einsum("bskc,bsc->bsk", rows, direction.float())  # (B,S,K) W_k (scale_U ⊙ c)
    individual_S = loc_S.gather(-1, ids).float() + reach.unsqueeze(-1) * moves  # (B,S,K) W_k u + b_k
    undrawn = (1.0 - reach).clamp_min(0.0).unsqueeze(-1)  # (B,S,1) κ_i, the share of scale_U not drawn
    spread = action.decision_scale(undrawn * scale_U.float()).float()  # (B,S,C) κ·scale_U + |b_noise|
    scale_S = torch.einsum("bskc,bsc->bsk", rows.abs(), spread) + action.token_noise_scale().float()  # (B,S,K)
    thresholds = _float_thresholds(model)  # () or (V,)
    threshold = thresholds if thresholds.dim() == 0 else thresholds[ids]  # () or (B,S,K)
    chosen = causal_scores(individual_S, scale_S, threshold)  # (B,S,K)
    return torch.full_like(standard, -math.inf).scatter_(-1, ids, chosen)


def _every_token_scores(
    model, loc_U: Tensor, scale_U: Tensor, direction: Tensor, temperature: float
) -> tuple[Tensor, Tensor]:
    """Causal scores on the whole vocabulary (B,S,V) float32 (``config.causal_candidates = 0``) and ``τ_i`` (B,S):
    the scores of `_candidate_scores` for every token, with the cached constant ``scale_S°`` where every
    ``τ_i ≥ 1``."""
    head = model.action.classification_head
    thresholds = _float_thresholds(model)  # () or (V,)
    size = direction.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)  # (B,S,1)
    unit = (direction / size).to(loc_U.dtype)  # (B,S,C) in [−1, 1]: scale_U ~ 1e-9 would vanish in float16
    population, moves = F.linear(torch.stack((loc_U, unit)), head.weight)  # (B,S,V) each: W loc_U, W(scale_U ⊙ c)/size
    loc_S = population if head.bias is None else population + head.bias  # (B,S,V) the population's logits
    reach = temperature * spread_factor(top_margin(loc_S))  # (B,S) τ_i
    individual_S = loc_S.float() + (reach.unsqueeze(-1).double() * size).float() * moves.float()  # (B,S,V) W u + b
    undrawn = (1.0 - reach).clamp_min(0.0)  # (B,S) κ_i
    if not bool((undrawn > 0).any()):
        scale_S, inverse_scale, has_zero = constant_scale(model.action)  # (V,), (V,), bool
        return causal_scores(individual_S, scale_S, thresholds, None if has_zero else inverse_scale), reach
    fixed = position_free_scale(model)
    if fixed is None:
        _, scale_S = model.action.classify(loc_U, scale_U * undrawn.unsqueeze(-1).to(scale_U.dtype))  # (B,S,V)
    else:  # |W|(κ·scale_U + |b_noise|) + γ_S = scale_S° + κ·(scale_S − scale_S°)
        constant = constant_scale(model.action)[0]  # (V,)
        scale_S = constant + undrawn.unsqueeze(-1) * (fixed[0] - constant)  # (B,S,V)
    return decision_score(individual_S, scale_S, thresholds), reach


def individual_number(
    action, loc_Y: Tensor, scale_Y: Tensor, scale_U: Tensor, coordinates: Tensor
) -> Tensor:
    """The number an individual writes (B,S): a draw of the model's predictive ``Y ~ Cauchy(loc_Y, scale_Y)`` at the
    quantile the individual's coordinates give it,

        Y = loc_Y + scale_Y·c_Y,    c_Y = Σ_c a_c c_c / Σ_c |a_c|,    a = W_reg ⊙ scale_U,

    where ``c_Y`` is the standard-Cauchy coordinate of ``W_reg U`` (a weighted sum of independent standard Cauchy
    variables divided by the sum of the weights' sizes is exactly standard Cauchy). With ``τ = 1`` and no exogenous
    noise this is ``W_reg u + b_reg`` itself; unlike that, it keeps the spread the model predicts for numbers (its
    number noise included) and does not take the causal temperature, which widens the individual for token choices
    only (``τ·scale_U·|W_reg|`` would put numbers millions away). One individual (sequence scope) sits at one
    quantile of every number it writes. loc_Y, scale_Y: (B,S) the predictive Cauchy (`ActionNetwork.regress`);
    scale_U: (B,S,C); coordinates: c (B,C) or (B,S,C).
    """
    if coordinates.dim() == 2:
        coordinates = coordinates.unsqueeze(1)  # (B,1,C)
    weights = scale_U.double() * action.regression_head.weight[0].double()  # (B,S,C) a
    size = weights.abs().sum(-1)  # (B,S)
    quantile = (weights * coordinates.double()).sum(-1) / size.clamp_min(torch.finfo(torch.float64).tiny)  # (B,S)
    return (loc_Y.double() + scale_Y.double() * quantile.where(size > 0, 0.0)).to(loc_Y.dtype)


# ============================================================================================================
# The individual
# ============================================================================================================
def sample_individual(
    batch_size: int, causal_size: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """ε ~ U(0,1), shape (B,C) float64, kept away from 0 (``tan(π(ε − ½))`` stays finite)."""
    epsilon = torch.rand((batch_size, causal_size), generator=generator, dtype=torch.float64, device=device)
    return epsilon.clamp_min(2.0**-53)


def cauchy_coordinates(epsilon: Tensor) -> Tensor:
    """``c = tan(π(ε − ½))`` (B,C) float64: the individual's standard-Cauchy coordinates."""
    return torch.tan(math.pi * (epsilon.double() - 0.5))
