"""Closed-form Cauchy math: pure functions on tensors, no modules, no config.

A Cauchy variable ``X ~ Cauchy(loc, scale)`` has density
``f(x) = 1 / (π·scale·(1 + ((x - loc)/scale)²))`` and no mean or variance:
summaries are the median ``loc`` and quantile intervals.

Shapes: every function broadcasts; ``...`` is any batch shape, ``C`` the causal size,
``V`` the number of decisions (vocabulary entries).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "linear_transform",
    "add_independent",
    "ovr_probability",
    "ovr_log_probs",
    "log_prob",
    "nll",
    "sample",
    "quantile",
    "central_interval",
    "inverse_softplus",
]


def linear_transform(loc: Tensor, scale: Tensor, weight: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Map independent components ``X ~ Cauchy(loc, scale)`` through ``W X + b``.

    ``W X + b ~ Cauchy(W·loc + b, |W|·scale)``.

    loc, scale: (..., C); weight: (V, C); bias: (V,) or None  →  (..., V), (..., V)
    """
    out_loc = torch.nn.functional.linear(loc, weight, bias)  # (..., V)
    out_scale = torch.nn.functional.linear(scale, weight.abs())  # (..., V)
    return out_loc, out_scale


def add_independent(loc_a: Tensor, scale_a: Tensor, loc_b: Tensor, scale_b: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of independent Cauchys: ``Cauchy(a, s) + Cauchy(b, t) = Cauchy(a + b, s + t)``."""
    return loc_a + loc_b, scale_a + scale_b


def ovr_probability(loc: Tensor, scale: Tensor, threshold: Tensor | float) -> Tensor:
    """``P(S > C) = ½ + atan((loc - C)/scale)/π``, evaluated as ``atan2(scale, C - loc)/π``.

    The atan2 form has no cancellation: for ``loc ≪ C`` it returns the tiny tail mass to full
    relative precision, where ``½ + atan(z)/π`` would round to 0.
    """
    distance = loc - threshold  # (...)
    return torch.atan2(scale, -distance) / math.pi


def ovr_log_probs(loc: Tensor, scale: Tensor, threshold: Tensor | float) -> tuple[Tensor, Tensor]:
    """Stable ``(log P(S > C), log P(S ≤ C))``.

    With ``p = atan2(scale, -(loc - C))/π`` and ``q = atan2(scale, loc - C)/π`` (so ``p + q = 1``, each
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


def log_prob(value: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    """Log-density ``-log(π·scale) - log1p(((value - loc)/scale)²)``."""
    z = (value - loc) / scale
    return -torch.log(math.pi * scale) - torch.log1p(z * z)


def nll(value: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    """Negative log-likelihood ``log(π·scale) + log1p(((value - loc)/scale)²)``."""
    return -log_prob(value, loc, scale)


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


def central_interval(loc: Tensor, scale: Tensor, coverage: float) -> tuple[Tensor, Tensor]:
    """Central interval holding ``coverage`` of the mass: ``loc ± scale·tan(π·coverage/2)``."""
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must lie strictly between 0 and 1, got {coverage}")
    half_width = scale * math.tan(math.pi * coverage / 2)
    return loc - half_width, loc + half_width


def inverse_softplus(value: float) -> float:
    """``softplus⁻¹(y) = log(expm1(y))``, written as ``y + log(-expm1(-y))`` so large ``y`` stays exact."""
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"softplus inverse needs a finite positive value, got {value}")
    return value + math.log(-math.expm1(-value))
