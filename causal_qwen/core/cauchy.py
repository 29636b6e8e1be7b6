"""Closed-form Cauchy math: pure functions on tensors, no modules, no config.

A Cauchy variable ``X ~ Cauchy(loc, scale)`` has density
``f(x) = 1 / (π·scale·(1 + ((x - loc)/scale)²))`` and no mean or variance:
summaries are the median ``loc`` and quantile intervals.

Shapes: every function broadcasts; ``...`` is any batch shape, ``C`` the causal size (the width of ``U``),
``V`` the number of decisions (vocabulary entries). The One-vs-Rest *threshold* is written ``t`` (``t_k``
per decision) in formulas here, to keep it apart from the causal size; the code and config call it
``threshold`` / ``ovr_threshold``. See docs/design.md, "Cauchy math".
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = [
    "linear_transform",
    "abs_weight",
    "reuse_abs_weights",
    "add_independent",
    "ovr_probability",
    "ovr_log_probs",
    "decision_score",
    "log_prob",
    "nll",
    "sample",
    "quantile",
    "central_interval",
    "interval_half_width",
    "inverse_softplus",
]


# |W| per weight tensor (by identity, held weakly), inside `reuse_abs_weights` scopes only.
_ABS_WEIGHTS: dict[int, tuple[weakref.ref, tuple, Tensor]] = {}
_REUSE_DEPTH = 0


def _weight_key(weight: Tensor) -> tuple:
    return (weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype, weight.device)


@contextlib.contextmanager
def reuse_abs_weights() -> Iterator[None]:
    """Within this scope `abs_weight` builds ``|W|`` once per weight and reuses it (evaluation loops call the
    heads once per chunk); the copies are dropped when the outermost scope ends.

    A scope, not a global cache: optimizers with fused kernels (``torch.optim.AdamW(fused=True)``, the
    training default) update weights without moving their version counter, so a cache that outlived a
    training step could hand back a stale ``|W|``. Inside a scope a cached copy is still rebuilt when the
    weight's storage, shape, dtype or version changes.
    """
    global _REUSE_DEPTH
    _REUSE_DEPTH += 1
    try:
        yield
    finally:
        _REUSE_DEPTH -= 1
        if _REUSE_DEPTH == 0:
            _ABS_WEIGHTS.clear()


def abs_weight(weight: Tensor) -> Tensor:
    """``|W|`` (V,C), elementwise.

    Inside `reuse_abs_weights`, when no gradient can flow into ``weight`` (grad mode off, or
    ``weight.requires_grad`` False), the result is kept and handed back on the next call for the same,
    unchanged weight (one extra (V,C) tensor per weight while the scope lasts). Otherwise it is
    ``weight.abs()`` (part of the graph when a gradient flows).
    """
    if _REUSE_DEPTH == 0 or (torch.is_grad_enabled() and weight.requires_grad):
        return weight.abs()
    key = _weight_key(weight)
    entry = _ABS_WEIGHTS.get(id(weight))
    if entry is not None and entry[0]() is weight and entry[1] == key:
        return entry[2]
    # A plain tensor even under inference_mode, so that it may later be saved for backward (a trainable input).
    with torch.inference_mode(False), torch.no_grad():
        value = weight.detach().abs()  # (V,C)
    slot = id(weight)

    def forget(_ref: weakref.ref, slot: int = slot) -> None:
        current = _ABS_WEIGHTS.get(slot)
        if current is not None and current[0] is _ref:
            del _ABS_WEIGHTS[slot]

    _ABS_WEIGHTS[slot] = (weakref.ref(weight, forget), key, value)
    return value


def linear_transform(loc: Tensor, scale: Tensor, weight: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Map independent components ``X ~ Cauchy(loc, scale)`` through ``W X + b``.

    ``W X + b ~ Cauchy(W·loc + b, |W|·scale)``; ``|W|`` comes from `abs_weight` (built once per weight
    inside a `reuse_abs_weights` scope).

    loc, scale: (..., C); weight: (V, C); bias: (V,) or None  →  (..., V) in the weight's dtype, (..., V) in the
    scale's. A scale kept wider than a 16-bit weight (float32 scales of a bfloat16/float16 model, ~1e-9 after the
    calibration: 0 in float16) is divided by its largest component before the product in the weight's dtype and
    multiplied back after, so it keeps the weight dtype's relative precision whatever its size.
    """
    out_loc = torch.nn.functional.linear(loc, weight, bias)  # (..., V)
    magnitude = abs_weight(weight)  # (V, C)
    if scale.dtype == weight.dtype or torch.finfo(scale.dtype).bits <= torch.finfo(weight.dtype).bits:
        return out_loc, torch.nn.functional.linear(scale.to(weight.dtype), magnitude)  # (..., V)
    peak = scale.detach().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(scale.dtype).tiny)  # (..., 1)
    unit = torch.nn.functional.linear((scale / peak).to(weight.dtype), magnitude)  # (..., V) in the weight's dtype
    return out_loc, unit.to(scale.dtype) * peak


def add_independent(loc_a: Tensor, scale_a: Tensor, loc_b: Tensor, scale_b: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of independent Cauchys: ``Cauchy(a, s) + Cauchy(b, t) = Cauchy(a + b, s + t)``."""
    return loc_a + loc_b, scale_a + scale_b


def ovr_probability(loc: Tensor, scale: Tensor, threshold: Tensor | float) -> Tensor:
    """``P(S > t) = ½ + atan((loc - t)/scale)/π``, evaluated as ``atan2(scale, t - loc)/π``.

    The atan2 form has no cancellation: for ``loc ≪ t`` it returns the tiny tail mass to full
    relative precision, where ``½ + atan(z)/π`` would round to 0.
    """
    distance = loc - threshold  # (...)
    return torch.atan2(scale, -distance) / math.pi


def ovr_log_probs(loc: Tensor, scale: Tensor, threshold: Tensor | float) -> tuple[Tensor, Tensor]:
    """Stable ``(log P(S > t), log P(S ≤ t))``.

    With ``p = atan2(scale, -(loc - t))/π`` and ``q = atan2(scale, loc - t)/π`` (so ``p + q = 1``, each
    accurate to full relative precision), take the log of whichever is below ½ directly and ``log1p(-other)``
    for the one near 1. ``1 - P`` is never formed by subtraction.
    """
    distance = loc - threshold  # (...)
    p = torch.atan2(scale, -distance) / math.pi
    q = torch.atan2(scale, distance) / math.pi
    p_is_small = p < 0.5
    # Each branch sees a harmless stand-in (½) where it is not chosen, so backward never meets 0·inf.
    log_p = torch.where(p_is_small, torch.log(p.where(p_is_small, 0.5)), torch.log1p(-q.where(~p_is_small, 0.5)))
    log_q = torch.where(~p_is_small, torch.log(q.where(~p_is_small, 0.5)), torch.log1p(-p.where(p_is_small, 0.5)))
    return log_p, log_q


def decision_score(loc: Tensor, scale: Tensor, threshold: Tensor | float) -> Tensor:
    """The One-vs-Rest decision score ``z = (loc - t)/scale``, in float32 (float64 for float64 inputs).

    ``P(S > t) = ½ + atan(z)/π`` increases with ``z``, so ``argmax_k z_k`` is ``argmax_k P_k`` without the
    saturation of ``P`` at 1 in float32 (``P`` rounds to 1 for ``z ≳ 5e6``). bf16/fp16 inputs are promoted
    before the subtraction: ``loc - t`` is never rounded in the low-precision dtype (at ``t ≈ 100`` bf16 steps
    by 0.5). A zero scale is treated as the smallest normal float32 (finite scores).

    loc, scale: (...); threshold: broadcastable to loc  →  (...)
    """
    dtype = torch.float64 if loc.dtype == torch.float64 else torch.float32
    threshold = torch.as_tensor(threshold, device=loc.device).to(dtype)
    tiny = torch.finfo(torch.float32).tiny
    return (loc.to(dtype) - threshold) / scale.to(dtype).clamp_min(tiny)


def log_prob(value: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    """Log-density ``-log(π·scale) - log1p(((value - loc)/scale)²)``."""
    z = (value - loc) / scale
    return -torch.log(math.pi * scale) - log1p_square(z)


# Above this |z|, ``z²`` comes near float32's largest value (3.4e38 at |z| = 1.8e19): `log1p_square` takes logs first.
LARGE_Z = 1e15


def log1p_square(z: Tensor) -> Tensor:
    """``log(1 + z²)``, finite wherever ``z`` is: beyond `LARGE_Z` as ``2·log|z| + log1p(1/z²)``, since ``z²``
    overflows float32 (a number 2e7 away from a median whose scale is 1e-14 would cost an infinite loss)."""
    large = z.abs() > LARGE_Z
    small_z = torch.where(large, torch.zeros_like(z), z)
    large_z = torch.where(large, z.abs(), torch.ones_like(z))
    return torch.where(large, 2.0 * torch.log(large_z) + torch.log1p(large_z.reciprocal().square()),
                       torch.log1p(small_z * small_z))


def nll(value: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    """Negative log-likelihood ``log(π·scale) + log1p(((value - loc)/scale)²)``."""
    return -log_prob(value, loc, scale)


def scale_mle(residuals: Tensor, minimum: float = 1e-6, iterations: int = 200) -> float:
    """The maximum-likelihood ``γ`` of ``r ~ Cauchy(0, γ)`` for residuals r (M,): the root of
    ``(1/M) Σ_m γ²/(r_m² + γ²) = 1/2``, which rises with ``γ``, found by bisection on ``log γ`` in
    ``[minimum, max |r| + 1]``; ``minimum`` when the root lies below it (half of the residuals or more about 0)."""
    squared = residuals.double().reshape(-1).square()  # (M,)
    low, high = math.log(minimum), math.log(float(squared.max().sqrt()) + 1.0)
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        gamma_squared = math.exp(2.0 * middle)
        if float((gamma_squared / (squared + gamma_squared)).mean()) < 0.5:
            low = middle
        else:
            high = middle
    return math.exp(0.5 * (low + high))


def sample(loc: Tensor, scale: Tensor, epsilon: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Reparameterised draw ``loc + scale·tan(π(ε - ½))`` with ``ε ~ U(0, 1)``.

    Pass ``epsilon`` (broadcastable to ``loc``) to replay the same individual.
    """
    if epsilon is None:
        epsilon = torch.rand(loc.shape, generator=generator, dtype=loc.dtype, device=loc.device)
    return loc + scale * torch.tan(math.pi * (epsilon - 0.5))


def quantile(loc: Tensor, scale: Tensor, q: float | Tensor) -> Tensor:
    """Quantile function ``loc + scale·tan(π(q - ½))`` for ``0 < q < 1``."""
    q_tensor = torch.as_tensor(q, dtype=loc.dtype if loc.is_floating_point() else torch.float32, device=loc.device)
    if torch.any((q_tensor <= 0) | (q_tensor >= 1)):
        raise ValueError(f"quantile level must lie strictly between 0 and 1, got {q}")
    return loc + scale * torch.tan(math.pi * (q_tensor - 0.5))


def interval_half_width(coverage: float) -> float:
    """Half-width of the central ``coverage`` interval of a standard Cauchy: ``tan(π·coverage/2)``.

    ``P(|X - loc| ≤ scale·tan(π·p/2)) = p`` for ``X ~ Cauchy(loc, scale)``: 1 for p = 0.5, 6.31 for p = 0.9.
    """
    if isinstance(coverage, (bool, str, bytes)):
        raise TypeError(f"coverage must be a number, got {coverage!r}")
    try:
        level = float(coverage)
    except (TypeError, ValueError):
        raise TypeError(f"coverage must be a number, got {type(coverage).__name__} {coverage!r}") from None
    if not 0 < level < 1:
        raise ValueError(f"coverage must lie strictly between 0 and 1, got {coverage}")
    return math.tan(math.pi * level / 2)


def central_interval(loc: Tensor, scale: Tensor, coverage: float) -> tuple[Tensor, Tensor]:
    """Central interval holding ``coverage`` of the mass: ``loc ± scale·tan(π·coverage/2)``."""
    half_width = scale * interval_half_width(coverage)
    return loc - half_width, loc + half_width


def inverse_softplus(value: float) -> float:
    """``softplus⁻¹(y) = log(expm1(y))``, written as ``y + log(-expm1(-y))`` so large ``y`` stays exact."""
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"softplus inverse needs a finite positive value, got {value}")
    return value + math.log(-math.expm1(-value))
