"""The causal modules on top of Qwen's features (docs/design.md: "Data flow", "Initialisation").

Shape legend: B batch, S sequence, H hidden size, C causal size, V vocabulary rows.

    e       = embed_tokens(ids) + phi(v)            phi(v) = sign(v)·ln(1+|v|)·w_num       (B,S,H)
    loc_U   = W_loc z + b_loc                                                              (B,S,C)
    scale_U = softplus(W_scale z + b_scale)                                                (B,S,C)
    s       = scale_U + |b_noise|                                                          (B,S,C)
    loc_S   = W_cls loc_U + b_cls,   scale_S = s @ |W_cls|ᵀ + γ_S                          (B,S,V)
    γ_S     = |token_noise|          every token's own exogenous noise, one scalar              ()
    loc_Y   = W_reg loc_U + b_reg,   scale_Y = s @ |W_reg|ᵀ (+ γ_Y, below)                  (B,S)
    γ_Y     = softplus(w_η · loc_U + b_η)   the numbers' own exogenous noise (optional)         (B,S)
    P_k     = P(S_k > t_k)           t: the One-vs-Rest thresholds, () or (V,)             (B,S,V)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from transformers import initialization as init

from .cauchy import inverse_softplus, linear_transform

# The reset methods below write through `transformers.initialization`, whose functions skip tensors that
# `from_pretrained` has already filled, so loading a checkpoint never overwrites loaded weights.


def _wider(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The dtype both ``a`` and ``b`` fit in (float32 for bfloat16 with float16)."""
    return torch.promote_types(a, b)


def symlog(values: Tensor) -> Tensor:
    """``sign(v)·ln(1 + |v|)``: compresses magnitudes, keeps the sign, ``symlog(0) = 0``."""
    return torch.sign(values) * torch.log1p(values.abs())


class NumericEmbedding(nn.Module):
    """``phi(v) = symlog(v)·w_num`` with a learnable direction ``w_num`` (H,), unit length at init."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.direction = nn.Parameter(torch.zeros(hidden_size))  # (H,)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """A uniformly random unit direction: a standard normal draw divided by its norm."""
        draw = torch.randn(self.direction.shape, generator=generator, dtype=torch.float32)  # (H,)
        init.copy_(self.direction, draw / draw.norm())

    def forward(self, numeric_values: Tensor) -> Tensor:
        # numeric_values: (B,S) -> (B,S,H)
        return symlog(numeric_values).unsqueeze(-1).to(self.direction.dtype) * self.direction


class AbductionNetwork(nn.Module):
    """Infers ``U ~ Cauchy(loc_U, scale_U)`` from features: ``loc_U = W_loc z + b_loc``,
    ``scale_U = softplus(W_scale z + b_scale)``."""

    def __init__(self, hidden_size: int, causal_size: int) -> None:
        super().__init__()
        self.loc_net = nn.Linear(hidden_size, causal_size)
        self.scale_net = nn.Linear(hidden_size, causal_size)

    def reset_parameters(self, initial_scale: float) -> None:
        """Identity location map (``loc_U = z``) and constant ``scale_U = initial_scale``."""
        causal_size, hidden_size = self.loc_net.weight.shape
        init.copy_(self.loc_net.weight, torch.eye(causal_size, hidden_size))  # (C,H)
        init.zeros_(self.loc_net.bias)
        init.zeros_(self.scale_net.weight)
        init.constant_(self.scale_net.bias, inverse_softplus(initial_scale))

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        # features: (B,S,H) -> loc_U: (B,S,C) in the features' dtype, scale_U: (B,S,C) in the scale net's (float32 in
        # a float16/bfloat16 model, which keeps that net float32: a calibrated scale_U of ~1e-9 is 0 in float16)
        loc_U = self.loc_net(features)
        net = self.scale_net
        scale_U = F.softplus(F.linear(features.to(_wider(features.dtype, net.weight.dtype)), net.weight, net.bias))
        return loc_U, scale_U


class OvrThresholds(nn.Module):
    """One-vs-Rest decision thresholds ``t`` (``P_k = P(S_k > t_k)``): a scalar or one per vocabulary id, a
    buffer or a parameter."""

    def __init__(self, vocab_size: int, per_token: bool, learnable: bool) -> None:
        super().__init__()
        values = torch.zeros(vocab_size if per_token else ())  # (V,) or ()
        if learnable:
            self.values = nn.Parameter(values)
        else:
            self.register_buffer("values", values)

    def reset_parameters(self, initial_value: float) -> None:
        init.constant_(self.values, initial_value)

    def resize(self, vocab_size: int) -> None:
        """Follow a vocabulary resize: per-token thresholds keep their first ``min(V, V')`` values and new rows
        get the mean of the old ones (a scalar threshold is left as it is)."""
        old = self.values
        if old.dim() == 0 or old.shape[0] == vocab_size:
            return
        with torch.no_grad():
            kept = old.detach()[:vocab_size]  # (min(V,V'),)
            fill = old.detach().float().mean().to(old.dtype)
            extra = fill.expand(max(vocab_size - old.shape[0], 0))  # (V'-V,) or (0,)
            values = torch.cat([kept, extra]).clone()  # (V',)
        if isinstance(old, nn.Parameter):
            self.values = nn.Parameter(values, requires_grad=old.requires_grad)
        else:
            self.register_buffer("values", values)

    def forward(self) -> Tensor:
        return self.values


class NumberNoise(nn.Module):
    """The numbers' own exogenous noise ``η ~ Cauchy(0, γ_Y)``, ``γ_Y = softplus(w_η · loc_U + b_η)`` (B,S),
    added to ``Y`` (docs/design.md, "Numbers' own noise"): on a real base the decision scale ``s`` is calibrated
    to ~1e-9 logits for sparse One-vs-Rest probabilities, which would leave ``scale_Y = s @ |W_reg|ᵀ`` at ~1e-8
    whatever the number. ``w_η`` reads the individual's location, so the width can differ per example."""

    def __init__(self, causal_size: int) -> None:
        super().__init__()
        # Parameters of this module itself (not of a child nn.Linear), so that loading a checkpoint saved without
        # them initialises them through `reset_parameters` (Hugging Face initialises the modules owning them).
        self.weight = nn.Parameter(torch.zeros(causal_size))  # (C,) w_η
        self.bias = nn.Parameter(torch.zeros(()))  # () b_η

    def reset_parameters(self, initial_scale: float) -> None:
        """``w_η = 0``, ``b_η = softplus⁻¹(initial_scale)``: ``γ_Y = initial_scale`` everywhere."""
        init.zeros_(self.weight)
        init.constant_(self.bias, inverse_softplus(initial_scale))

    def forward(self, loc_U: Tensor) -> Tensor:
        # loc_U: (B,S,C) -> γ_Y: (B,S), in float32 at least (the parameters stay float32 in a 16-bit model)
        dtype = _wider(loc_U.dtype, self.weight.dtype)
        return F.softplus(loc_U.to(dtype) @ self.weight.to(dtype) + self.bias.to(dtype))


class ActionNetwork(nn.Module):
    """Maps the individual ``U`` plus exogenous noise ``Cauchy(0, |b_noise|)`` linearly to decisions.

    Classification: ``S = W_cls U + b_cls + ε_S`` (V OvR scores), each token with its own exogenous noise
    ``ε_S,k ~ Cauchy(0, γ_S)``, ``γ_S = |token_noise|`` (0 in the literal design; the calibration at conversion
    puts the decision scale there, docs/design.md "Calibration at conversion"); regression:
    ``Y = W_reg U + b_reg`` (``+ η`` with a `NumberNoise`, when ``number_noise`` is set).
    """

    def __init__(self, causal_size: int, vocab_size: int, number_noise: bool = False) -> None:
        super().__init__()
        self.classification_head = nn.Linear(causal_size, vocab_size)
        self.regression_head = nn.Linear(causal_size, 1)
        self.b_noise = nn.Parameter(torch.zeros(causal_size))  # (C,)
        self.token_noise = nn.Parameter(torch.zeros(()))  # () γ_S = |token_noise|
        self.number_noise = NumberNoise(causal_size) if number_noise else None

    def reset_parameters(
        self, noise_init: float, noise_mode: str, generator: torch.Generator | None = None, token_noise_init: float = 0.0
    ) -> None:
        """Regression head ``N(0, 1/C)`` with zero bias; ``b_noise`` by mode; ``γ_S = token_noise_init``. (The
        classification head is set by the conversion from Qwen's ``lm_head``.)"""
        causal_size = self.b_noise.numel()
        draw = torch.randn(self.regression_head.weight.shape, generator=generator) / causal_size**0.5  # (1,C)
        init.copy_(self.regression_head.weight, draw)
        init.zeros_(self.regression_head.bias)
        if noise_mode == "constant":
            init.constant_(self.b_noise, noise_init)
        elif noise_mode == "uniform":
            init.copy_(self.b_noise, torch.rand(causal_size, generator=generator) * 2 * noise_init)
        else:
            init.zeros_(self.b_noise)
        init.constant_(self.token_noise, token_noise_init)

    def token_noise_scale(self) -> Tensor:
        """``γ_S = |token_noise|`` (): the scale every token's own exogenous noise adds to ``scale_S``."""
        return self.token_noise.abs()

    def decision_scale(self, scale_U: Tensor) -> Tensor:
        """``s = scale_U + |b_noise|`` (B,S,C): the scale of ``U + ε`` before the linear maps (float32 at least:
        ``b_noise`` stays float32 in a 16-bit model)."""
        return scale_U + self.b_noise.abs()

    def classify(self, loc_U: Tensor, scale_U: Tensor) -> tuple[Tensor, Tensor]:
        """``loc_S = W_cls loc_U + b_cls`` (B,S,V) in the weights' dtype, ``scale_S = (scale_U + |b_noise|) @ |W_cls|ᵀ
        + γ_S`` (B,S,V) in the scales' (float32 in a 16-bit model)."""
        head = self.classification_head
        loc_S, scale_S = linear_transform(loc_U, self.decision_scale(scale_U), head.weight, head.bias)
        return loc_S, scale_S + self.token_noise_scale().to(scale_S.dtype)

    def regress(self, loc_U: Tensor, scale_U: Tensor, scale_factor: float = 1.0) -> tuple[Tensor, Tensor]:
        """``loc_Y = W_reg loc_U + b_reg``, ``scale_Y = f·((scale_U + |b_noise|) @ |W_reg|ᵀ (+ γ_Y))``: (B,S) each
        (``scale_Y`` in the scales' dtype, as in `classify`); ``f`` = ``scale_factor``, the interval check's
        factor (`CausalQwenConfig.number_scale_factor`, 1 unless training rescaled the intervals)."""
        head = self.regression_head
        loc_Y, scale_Y = linear_transform(loc_U, self.decision_scale(scale_U), head.weight, head.bias)
        scale_Y = scale_Y.squeeze(-1)  # (B,S)
        if self.number_noise is not None:
            scale_Y = scale_Y + self.number_noise(loc_U).to(scale_Y.dtype)
        if scale_factor != 1.0:
            scale_Y = scale_Y * scale_factor
        return loc_Y.squeeze(-1), scale_Y
