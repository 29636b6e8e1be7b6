"""The causal modules on top of Qwen's features (docs/design.md: "Data flow", "Initialisation").

Shape legend: B batch, S sequence, H hidden size, C causal size, V vocabulary rows.

    e       = embed_tokens(ids) + phi(v)            phi(v) = sign(v)·ln(1+|v|)·w_num       (B,S,H)
    loc_U   = W_loc z + b_loc                                                              (B,S,C)
    scale_U = softplus(W_scale z + b_scale)                                                (B,S,C)
    s       = scale_U + |b_noise|                                                          (B,S,C)
    loc_S   = W_cls loc_U + b_cls,   scale_S = s @ |W_cls|ᵀ + γ_S                          (B,S,V)
    γ_S     = |token_noise|          every token's own exogenous noise, one scalar              ()
    loc_Y   = W_reg loc_U + b_reg (+ w_e·e, below),   scale_Y = s @ |W_reg|ᵀ (+ γ_Y, below)  (B,S)
    γ_Y     = softplus(w_η · loc_U + b_η)   the numbers' own exogenous noise (optional)         (B,S)
    e       = the values of the row's last K numbers, where k numbers have been read (optional) (B,S,K)
    P_k     = P(S_k > t_k)           t: the One-vs-Rest thresholds, () or (V,)             (B,S,V)
"""

from __future__ import annotations

from collections.abc import Sequence

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


class EarlierNumbers(nn.Module):
    """The values of a row's earlier numbers, read by the number read-out beside ``U`` (docs/design.md, "Earlier
    numbers"): at a position where exactly ``k`` numbers of the row have been read (``target``: the position
    before the row's number ``k``, counted from 0, the table's target), ``loc_Y`` gains

        w_e · e,    e = (v_{k−1}, v_{k−2}, …, v_{k−K})   the values of the last ``K`` numbers read (numbers
                                                        counted from 0, the latest first, 0 for v_j with j < 0),

    and elsewhere nothing. A row starts where the text starts and after every token marked 1 in ``row_break`` (V,)
    (training marks the tokens that hold a line break, when no training row holds one: a text of several rows,
    one a line, then reads each row's own numbers); none marked, the text is one row. A frozen base reads a
    number only through ``φ(v)``, a row it never trained, so a linear read-out of its features all but loses the
    exact values of a sentence's other numbers; this term reads them as they are. There, too, ``scale_Y`` is multiplied by ``c_e`` (``width``, 1 until training sets it): the widths
    are shared by every number of a sentence, while the read-out with the values can be far sharper at its target
    (`causal_qwen.training.interval_check.set_earlier_width`). ``w_e`` (K,) and ``c_e`` () are buffers set by the
    closed-form fits of training (`causal_qwen.training.warm_start`), never by gradients: the values come in their
    own units (thousands of payrolls, fractions of a dollar), where an optimizer's step would not be the same size
    for any two tables."""

    def __init__(self, count: int, target: int, vocab_size: int) -> None:
        super().__init__()
        self.target = target
        self.register_buffer("weight", torch.zeros(count, dtype=torch.float32))  # (K,) w_e
        self.register_buffer("width", torch.ones((), dtype=torch.float32))  # () c_e
        self.register_buffer("row_break", torch.zeros(vocab_size, dtype=torch.float32))  # (V,) 1: ends a row

    def reset_parameters(self) -> None:
        """``w_e = 0``, ``c_e = 1``, no row breaks: the design's read-out until a fit sets them (and a folder saved
        before ``c_e`` or ``row_break`` existed loads with its widths as saved and reads a text as one row;
        Hugging Face's loading leaves the buffers it read alone)."""
        init.zeros_(self.weight)
        init.ones_(self.width)
        init.zeros_(self.row_break)

    def mark_row_breaks(self, token_ids: Sequence[int]) -> None:
        """Make ``token_ids`` (and only them) end a row."""
        self.row_break.zero_()
        if len(token_ids):
            self.row_break[torch.as_tensor(list(token_ids), dtype=torch.long, device=self.row_break.device)] = 1.0

    def values(self, input_ids: Tensor, numeric_values: Tensor | None, num_token_id: int) -> tuple[Tensor, Tensor]:
        """``(e (B,S,K) float64, read (B,S) long)``: at each position the values of the row's last ``K`` numbers at
        or before it, the latest first (0 where the row has read fewer), and how many numbers the row has read."""
        is_number = input_ids == num_token_id  # (B,S)
        counted = is_number.long().cumsum(dim=1)  # (B,S) since the text's start; the n-th number's value: column n
        ends_row = self.row_break[input_ids.clamp(0, self.row_break.numel() - 1)] > 0  # (B,S)
        before_row = torch.where(ends_row, counted, 0).cummax(dim=1).values  # (B,S) numbers of the earlier rows
        read = counted - before_row  # (B,S) numbers this row has read
        columns = int(counted.max()) + 1 if counted.numel() else 1
        by_ordinal = torch.zeros(input_ids.shape[0], columns, dtype=torch.float64, device=input_ids.device)
        if numeric_values is not None:
            by_ordinal.scatter_(1, counted * is_number, numeric_values.double() * is_number)  # others: column 0
        earlier = [torch.where(read > back, by_ordinal.gather(1, (counted - back).clamp_min(0)), 0.0)
                   for back in range(self.weight.numel())]  # K × (B,S), 0 before the row's first number
        return torch.stack(earlier, dim=-1), read

    def forward(self, input_ids: Tensor, numeric_values: Tensor | None, num_token_id: int) -> Tensor:
        """The term (B,S,2) float32 `ActionNetwork.regress` reads: ``[..., 0] = [read = k]·(w_e · e)``, added to
        ``loc_Y``, and ``[..., 1]`` = ``c_e`` where ``read = k``, else 1, multiplying ``scale_Y``."""
        earlier, read = self.values(input_ids, numeric_values, num_token_id)
        applies = read == self.target  # (B,S)
        shift = torch.where(applies, earlier @ self.weight.double(), 0.0)  # (B,S)
        width = torch.where(applies, self.width.double(), 1.0)  # (B,S)
        return torch.stack([shift, width], dim=-1).float()


class ActionNetwork(nn.Module):
    """Maps the individual ``U`` plus exogenous noise ``Cauchy(0, |b_noise|)`` linearly to decisions.

    Classification: ``S = W_cls U + b_cls + ε_S`` (V OvR scores), each token with its own exogenous noise
    ``ε_S,k ~ Cauchy(0, γ_S)``, ``γ_S = |token_noise|`` (0 in the literal design; the calibration at conversion
    puts the decision scale there, docs/design.md "Calibration at conversion"); regression:
    ``Y = W_reg U + b_reg`` (``+ η`` with a `NumberNoise`, when ``number_noise`` is set; ``+ w_e·e``, the width
    there ×``c_e``, with `EarlierNumbers`, when ``earlier_numbers`` is set: how many, and the ordinal ``k`` of the
    number they serve).
    """

    def __init__(self, causal_size: int, vocab_size: int, number_noise: bool = False,
                 earlier_numbers: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.classification_head = nn.Linear(causal_size, vocab_size)
        self.regression_head = nn.Linear(causal_size, 1)
        self.b_noise = nn.Parameter(torch.zeros(causal_size))  # (C,)
        self.token_noise = nn.Parameter(torch.zeros(()))  # () γ_S = |token_noise|
        self.number_noise = NumberNoise(causal_size) if number_noise else None
        self.earlier_numbers = EarlierNumbers(*earlier_numbers, vocab_size) if earlier_numbers else None

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

    def regress(self, loc_U: Tensor, scale_U: Tensor, scale_factor: float = 1.0,
                earlier_term: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``loc_Y = W_reg loc_U + b_reg (+ e_shift)``, ``scale_Y = f·((scale_U + |b_noise|) @ |W_reg|ᵀ (+ γ_Y))
        (·e_width)``: (B,S) each (``scale_Y`` in the scales' dtype, as in `classify`); ``f`` = ``scale_factor``, the
        interval check's factor (`CausalQwenConfig.number_scale_factor`, 1 unless training rescaled the intervals);
        ``earlier_term`` (B,S,2): `EarlierNumbers`' ``(e_shift, e_width)`` at these positions."""
        head = self.regression_head
        loc_Y, scale_Y = linear_transform(loc_U, self.decision_scale(scale_U), head.weight, head.bias)
        loc_Y, scale_Y = loc_Y.squeeze(-1), scale_Y.squeeze(-1)  # (B,S) each
        if self.number_noise is not None:
            scale_Y = scale_Y + self.number_noise(loc_U).to(scale_Y.dtype)
        if scale_factor != 1.0:
            scale_Y = scale_Y * scale_factor
        if earlier_term is not None:
            loc_Y = loc_Y + earlier_term[..., 0].to(loc_Y.dtype)
            scale_Y = scale_Y * earlier_term[..., 1].to(scale_Y.dtype)
        return loc_Y, scale_Y
