"""Generation with CausalQwen in three modes (docs/design.md, "Decision rules"), a KV cache, left-padded
batches and numbers.

Shape legend: B batch, P prompt length (left padded), H hidden size, C causal size, V vocabulary rows,
M candidate rows of the standard-mode shortcut.

Every step runs the backbone on the new token only (the prefix lives in a `transformers.DynamicCache`)
and evaluates the heads at the last position only:

    z (B,H) → loc_U, scale_U (B,C)                                      abduction
    traditional: loc_S = W_cls loc_U + b_cls (B,V); softmax(loc_S / T) with top-k / top-p, or argmax
    standard:    argmax_k P(S_k > t_k) = argmax_k (loc_S_k − t_k) / scale_S_k,
                 scale_S = |W_cls| s + γ_S,  s = scale_U + |b_noise| (B,C)  (exact shortcut: `ovr_argmax`)
    causal:      u = loc_U + scale_U·tan(π(ε − ½))  (ε (B,C) fixed per sequence: the "individual")
                 loc_S = W_cls u + b_cls,  scale_S = |W_cls| |b_noise| + γ_S (V,)   (constant: cached per model)
                 argmax_k (loc_S_k − t_k) / scale_S_k; rows with scale_S_k = 0 are certain (`causal_argmax`)

t are the One-vs-Rest thresholds. ``loc_S`` and ``scale_S`` are computed in the weights' dtype, as the forward
pass computes them; everything after (``loc_S − t``, the ratio) in float32, so bf16/fp16 models decide as
`predict` and the forward pass do.

When ``<NUM>`` is chosen its value is ``loc_Y = W_reg loc_U + b_reg`` (standard, traditional) or
``W_reg u + b_reg`` (causal); the next step's input is ``embed(<NUM>) + phi(value)``.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from . import cauchy
from .numbers import find_numbers, format_prediction

logger = logging.getLogger(__name__)

MODES = ("standard", "causal", "traditional")
FINISH_REASONS = ("eos", "stop_string", "length")
INTERVAL_COVERAGES = (0.5, 0.9)

__all__ = [
    "MODES",
    "NumberPrediction",
    "GenerationResult",
    "TextPiece",
    "GeneratedBatch",
    "GenerationStream",
    "generate",
    "stream",
    "generate_ids",
    "encode_prompts",
    "greedy_parity",
    "ovr_argmax",
    "ovr_argmax_reference",
    "causal_argmax",
    "causal_scores",
    "sample_individual",
    "clear_generation_caches",
]


# ============================================================================================================
# Results
# ============================================================================================================
@dataclass
class NumberPrediction:
    """One generated ``<NUM>``: its value and (outside causal mode) its Cauchy ``Y ~ Cauchy(median, scale)``.

    token_index: position in the generated ``token_ids``; value: the number fed back.
    median, scale: ``loc_Y``, ``scale_Y``; interval_50, interval_90: central intervals
    ``median ± scale·tan(π·q/2)``. text: the number as written in the text, to the precision its scale
    carries (`causal_qwen.core.numbers.format_prediction`).
    """

    token_index: int
    value: float
    median: float | None = None
    scale: float | None = None
    interval_50: tuple[float, float] | None = None
    interval_90: tuple[float, float] | None = None
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"token_index": self.token_index, "value": self.value, "text": self.text}
        if self.median is not None:
            out.update(
                median=self.median,
                scale=self.scale,
                interval_50=list(self.interval_50) if self.interval_50 else None,
                interval_90=list(self.interval_90) if self.interval_90 else None,
            )
        return out


@dataclass
class GenerationResult:
    """The continuation of one prompt.

    text: the generated text (numbers written with their values; ends at the end of a stop string when one
    was met; end-of-sequence tokens are not written). token_ids: generated ids, EOS included when met.
    numbers: one `NumberPrediction` per generated ``<NUM>``. individual: ε (C,) of causal mode, else None.
    finish_reason: "eos", "stop_string" or "length".
    """

    prompt: str
    text: str
    token_ids: list[int]
    numbers: list[NumberPrediction]
    finish_reason: str
    mode: str
    individual: Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "numbers": [number.to_dict() for number in self.numbers],
            "finish_reason": self.finish_reason,
            "mode": self.mode,
            "individual": self.individual.tolist() if self.individual is not None else None,
        }


@dataclass(frozen=True)
class TextPiece:
    """A piece of streamed text for prompt ``index``; ``finished`` marks its last piece (possibly empty)."""

    index: int
    text: str
    finished: bool = False


@dataclass
class GeneratedBatch:
    """Tensor-level output of `generate_ids`.

    token_ids: (B,T) generated ids, ``pad_token_id`` after a row finished; numeric_values: (B,T) the value of
    each generated ``<NUM>`` (0 elsewhere); lengths: (B,) generated tokens per row (EOS included);
    loc_Y, scale_Y: (B,T) the regression head where a ``<NUM>`` was chosen (NaN elsewhere; NaN scale in causal
    mode); individual: (B,C) ε of causal mode, else None; finish_reasons: one per row.
    """

    token_ids: Tensor
    numeric_values: Tensor
    lengths: Tensor
    loc_Y: Tensor
    scale_Y: Tensor
    finish_reasons: list[str]
    individual: Tensor | None = None
    steps: int = 0


# ============================================================================================================
# Caches of weight-derived tensors (recomputed when a weight changes in place or is replaced)
# ============================================================================================================
_DERIVED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, tuple[tuple, Tensor]]]" = weakref.WeakKeyDictionary()


def _fingerprint(tensors: Sequence[Tensor]) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device) for t in tensors)


def _derived(owner: torch.nn.Module, name: str, sources: Sequence[Tensor], compute: Callable[[], Any]) -> Any:
    """``compute()`` cached on ``owner`` under ``name`` until one of ``sources`` changes (its storage or its
    version counter: in-place updates by optimizers, ``copy_``, ``load_state_dict``). Writes through
    ``param.data`` bypass the version counter: call `clear_generation_caches` after those."""
    key = _fingerprint(sources)
    entries = _DERIVED.setdefault(owner, {})
    entry = entries.get(name)
    if entry is not None and entry[0] == key:
        return entry[1]
    with torch.no_grad():
        value = compute()
    entries[name] = (key, value)
    return value


def clear_generation_caches(model: torch.nn.Module | None = None) -> None:
    """Drop the cached row norms / constant scales (of ``model``, or of every model)."""
    if model is None:
        _DERIVED.clear()
        return
    for module in model.modules():
        _DERIVED.pop(module, None)


@dataclass(frozen=True)
class RowNorms:
    """Per-row norms of ``|W|`` (V,C) that bound ``scale_k = Σ_c |W_kc| s_c`` without forming it.

    l1: ``‖W_k‖₁`` (V,); centred_l2: ``‖ |W_k| − mean_c |W_kc| ‖₂`` (V,); both float32, summed in float64."""

    l1: Tensor
    centred_l2: Tensor

    @classmethod
    def of(cls, weight: Tensor, block: int = 16384) -> "RowNorms":
        l1, square = [], []
        for start in range(0, weight.shape[0], block):
            magnitude = weight[start : start + block].detach().abs().double()  # (block,C)
            l1.append(magnitude.sum(dim=1))  # (block,)
            square.append(magnitude.square().sum(dim=1))  # (block,)
        l1_all, square_all = torch.cat(l1), torch.cat(square)  # (V,) each
        centred = (square_all - l1_all.square() / weight.shape[1]).clamp_min(0).sqrt()  # (V,)
        return cls(l1=l1_all.float(), centred_l2=centred.float())


def _constant_scale(
    weight: Tensor, noise: Tensor, token_noise: Tensor, block: int = 16384
) -> tuple[Tensor, Tensor, bool]:
    """``scale_S = |W_cls| |b_noise| + γ_S`` (V,) in float32 (causal mode's position-free scale), built ``block`` rows
    at a time; ``1/scale_S`` (V,) (``1/tiny`` where the scale is 0); and whether some row's scale is 0 (no exogenous
    noise reaches it: ``noise_mode="zero"`` and ``γ_S = 0``). token_noise: ``γ_S`` ()."""
    noise32 = noise.detach().abs().float()  # (C,)
    parts = [
        F.linear(noise32, weight[start : start + block].detach().abs().float())  # (block,)
        for start in range(0, weight.shape[0], block)
    ]
    scale = torch.cat(parts).add_(token_noise.detach().abs().float())  # (V,)
    inverse = 1.0 / scale.clamp_min(torch.finfo(torch.float32).tiny)  # (V,)
    return scale, inverse, bool((scale == 0).any())


# ============================================================================================================
# Decision rules (pure tensor functions)
# ============================================================================================================
def ovr_argmax_reference(loc_S: Tensor, scale_S: Tensor, threshold: Tensor | float) -> Tensor:
    """Naive standard decision: ``argmax_k (loc_S_k − t_k) / scale_S_k`` (`cauchy.decision_score`: the order of
    ``P(S_k > t_k)`` without its saturation near 1 in float32). loc_S, scale_S: (B,V) → (B,)."""
    return cauchy.decision_score(loc_S, scale_S, threshold).argmax(dim=-1)


def causal_scores(
    loc_S: Tensor, scale_S: Tensor, threshold: Tensor | float, inverse_scale: Tensor | None = None
) -> Tensor:
    """Scores (B,V) float32 whose argmax is ``argmax_k P(S_k > t_k)`` for ``S_k ~ Cauchy(loc_S_k, scale_S_k)`` with
    a position-free scale that may be 0 (causal mode: ``scale_S = |W_cls|·|b_noise|``).

    loc_S: (B,V) (``-inf`` bans a row); scale_S: (V,) float32 ≥ 0; threshold: () or (V,); inverse_scale: (V,)
    ``1/scale_S``, to be given only when every scale is positive (then the scores are ``d·(1/scale_S)``)  →  (B,V).

    With ``d = loc_S − t`` (float32): a row with ``scale_S_k > 0`` has ``P_k = ½ + atan(d_k/scale_S_k)/π`` in
    (0, 1), ordered by ``d_k/scale_S_k`` (`cauchy.decision_score`); a row with ``scale_S_k = 0`` is certain,
    ``P_k = 1`` if ``d_k > 0`` else 0. So where some certain row has ``d > 0`` the scores are ``d`` on those rows (ties between
    them broken by the larger ``d``) and ``-inf`` elsewhere; otherwise ``d/scale_S`` on the rows with a positive
    scale and ``-inf`` on the certain ones; when no row has a positive scale (``b_noise = 0``), ``d`` itself: the
    noise-free decision ``argmax_k loc_S_k(u) − t_k``.
    """
    threshold = torch.as_tensor(threshold, device=loc_S.device).float()
    if inverse_scale is not None:  # every scale is positive (the caller checked once)
        return (loc_S.float() - threshold).mul_(inverse_scale)  # (B,V) d/scale_S, by the cached reciprocal
    zero = scale_S == 0  # (V,)
    if not bool(zero.any()):
        return cauchy.decision_score(loc_S, scale_S, threshold)
    distance = loc_S.float() - threshold  # (B,V) d = loc_S − t
    if bool(zero.all()):
        return distance
    ratio = (distance / scale_S.where(~zero, 1.0)).masked_fill(zero, -math.inf)  # (B,V) d/scale, certain rows out
    certain_win = distance.masked_fill(~zero | (distance <= 0), -math.inf)  # (B,V) d of rows with P = 1
    has_certain_win = (certain_win > -math.inf).any(dim=-1, keepdim=True)  # (B,1)
    return torch.where(has_certain_win, certain_win, ratio)


def causal_argmax(loc_S: Tensor, scale_S: Tensor, threshold: Tensor | float) -> Tensor:
    """The causal decision (B,): ``argmax_k`` of `causal_scores`."""
    return causal_scores(loc_S, scale_S, threshold).argmax(dim=-1)


def constant_scale(action: torch.nn.Module) -> tuple[Tensor, Tensor, bool]:
    """``(scale_S, 1/scale_S, some scale is 0)`` of causal mode for an `ActionNetwork`, cached until ``W_cls``,
    ``b_noise`` or ``γ_S`` change (see `_constant_scale`)."""
    head = action.classification_head
    sources = (head.weight, action.b_noise, action.token_noise)
    return _derived(
        action, "constant_scale", sources, lambda: _constant_scale(head.weight, action.b_noise, action.token_noise)
    )


def position_free_scale(model) -> tuple[Tensor, Tensor] | None:
    """``(scale_S, 1/scale_S)`` (V,) float32 of standard mode when it does not depend on the position, else None.

    With ``W_scale = 0`` (as after the calibration at conversion) ``scale_U = softplus(b_scale)`` is the same at every
    position, so ``scale_S = |W_cls| (softplus(b_scale) + |b_noise|) + γ_S`` is one vector, built once and cached until
    any of those parameters changes; every row's scale must be positive (else None: the general path decides)."""
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


def _shortcut_margin(dtype: torch.dtype) -> float:
    """Relative widening of the scale bounds that covers the rounding of ``scale_S`` and of the bounds."""
    return max(1e-4, 4 * torch.finfo(dtype).eps)


def ovr_argmax(distance: Tensor, s: Tensor, weight: Tensor, norms: RowNorms, token_noise: float = 0.0) -> Tensor:
    """Exact ``argmax_k d_k / scale_k`` with ``scale_k = Σ_c |W_kc| s_c + γ_S``, without forming all of ``|W| s``.

    distance: (B,V) ``d = loc_S − t`` (float32; ``-inf`` bans a row); s: (B,C) positive; weight: (V,C);
    norms: `RowNorms` of ``weight``; token_noise: ``γ_S ≥ 0``  →  (B,) token ids.

    Two bounds on every row's scale, both cheap per row:
      * ``‖W_k‖₁·min(s) ≤ scale_k ≤ ‖W_k‖₁·max(s)`` (tight when ``s`` is nearly constant, as after conversion);
      * with ``s̄ = mean(s)``: ``scale_k = ‖W_k‖₁·s̄ + ⟨|W_k| − mean|W_k|, s − s̄⟩`` (the mean parts cancel, since
        ``Σ_c (s_c − s̄) = 0``), and by Cauchy–Schwarz ``|⟨·,·⟩| ≤ centred_l2_k·‖s − s̄‖₂``. This one stays tight
        when ``s`` varies from component to component and position to position, as after fine-tuning.
    The intersection gives ``scale_k ∈ [lo_k, hi_k]``, so ``z_k = d_k / scale_k ∈ [d_k/hi_k, d_k/lo_k]`` for
    ``d_k ≥ 0`` and ``[d_k/lo_k, d_k/hi_k]`` for ``d_k < 0``. The winner's ``z`` is at least the best lower bound
    ``L``; only the M rows whose upper bound reaches ``L`` can win, and only they get their exact scale, from
    gathered rows of ``|W|`` (one row when ``s`` is constant). The bounds are widened by a relative margin that
    covers float rounding. ``γ_S`` adds to both bounds and to the exact scales.
    """
    tiny = torch.finfo(torch.float32).tiny
    candidates = shortcut_candidates(distance, s, norms, token_noise)  # (M,)
    scale = _gathered_scale(s, weight, candidates).float() + token_noise  # (B,M)
    z = distance.index_select(-1, candidates) / scale.clamp_min(tiny)  # (B,M)
    return candidates[z.argmax(dim=-1)]


def shortcut_candidates(distance: Tensor, s: Tensor, norms: RowNorms, token_noise: float = 0.0) -> Tensor:
    """The M rows (M,) that can win `ovr_argmax` for some row of the batch, by the scale bounds it describes."""
    tiny = torch.finfo(torch.float32).tiny
    margin = _shortcut_margin(s.dtype)
    s32 = s.float()  # (B,C)
    s_mean = s32.mean(dim=-1, keepdim=True)  # (B,1)
    spread = (s32 - s_mean).norm(dim=-1, keepdim=True)  # (B,1) ‖s − s̄‖₂
    l1, centred = norms.l1, norms.centred_l2  # (V,) each
    centre, deviation = l1 * s_mean, centred * spread  # (B,V) each: scale_k = centre ± deviation at most
    slack = (centre + deviation).mul_(margin)  # (B,V) covers the rounding of centre − deviation
    lower = torch.maximum(l1 * (s32.amin(dim=-1, keepdim=True) * (1 - margin)), centre - deviation - slack)  # (B,V)
    upper = torch.minimum(l1 * (s32.amax(dim=-1, keepdim=True) * (1 + margin)), centre + deviation + slack)  # (B,V)
    lower = lower.add_(token_noise).clamp_min_(tiny)
    upper = upper.add_(token_noise).clamp_min_(tiny)
    positive = distance >= 0  # (B,V)
    z_low = torch.where(positive, distance / upper, distance / lower)  # (B,V) lower bound of z_k
    z_high = torch.where(positive, distance / lower, distance / upper)  # (B,V) upper bound of z_k
    reachable = z_high >= z_low.amax(dim=-1, keepdim=True)  # (B,V)
    candidates = (reachable[0] if reachable.shape[0] == 1 else reachable.any(dim=0)).nonzero().squeeze(-1)  # (M,)
    if candidates.numel() == 0:  # only with NaN distances: decide on everything
        candidates = torch.arange(distance.shape[-1], device=distance.device)
    return candidates


def _gathered_scale(s: Tensor, weight: Tensor, rows: Tensor, block: int = 1024) -> Tensor:
    """``s @ |W[rows]|ᵀ`` (B,M), gathering ``block`` rows at a time (no (V,C) temporary)."""
    parts = []
    for start in range(0, rows.numel(), block):
        gathered = weight.index_select(0, rows[start : start + block]).abs_()  # (m,C)
        parts.append(F.linear(s, gathered))  # (B,m)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def sample_individual(
    batch_size: int, causal_size: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """ε ~ U(0,1), shape (B,C) float64, kept away from 0 (``tan(π(ε − ½))`` stays finite and negative)."""
    epsilon = torch.rand((batch_size, causal_size), generator=generator, dtype=torch.float64, device=device)  # (B,C)
    return epsilon.clamp_min(2.0**-53)


def _individual_offsets(epsilon: Tensor) -> Tensor:
    """``tan(π(ε − ½))`` in float64 (B,C): the standard-Cauchy draw of each component."""
    return torch.tan(math.pi * (epsilon.double() - 0.5))


# ============================================================================================================
# Settings and validation
# ============================================================================================================
@dataclass(frozen=True)
class _Settings:
    mode: str
    max_new_tokens: int
    min_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _token_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _build_settings(
    model,
    mode: str,
    max_new_tokens: int,
    min_new_tokens: int,
    do_sample: bool | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int | None,
) -> _Settings:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("min_new_tokens", min_new_tokens, 0)
    if min_new_tokens > max_new_tokens:
        raise ValueError(f"min_new_tokens={min_new_tokens} exceeds max_new_tokens={max_new_tokens}")
    sampling = (("temperature", temperature), ("top_k", top_k), ("top_p", top_p))
    sampling_given = [name for name, value in sampling if value is not None]
    if mode != "traditional" and (sampling_given or do_sample):
        given = sampling_given or ["do_sample"]
        raise ValueError(f"{', '.join(given)} only apply to mode 'traditional' (mode {mode!r} decides by OvR argmax)")
    if temperature is not None and not (
        isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        _check_int("top_k", top_k, 1)
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
    temperature = 1.0 if temperature is None else float(temperature)
    if do_sample is None:
        do_sample = mode == "traditional" and temperature > 0
    if do_sample and temperature == 0:
        raise ValueError("temperature=0 means greedy decoding; do not combine it with do_sample=True")

    generation_config = getattr(model, "generation_config", None)
    eos = _token_id_tuple(eos_token_id) if eos_token_id is not None else ()
    if eos_token_id is None:
        eos = _token_id_tuple(getattr(generation_config, "eos_token_id", None))
        eos = eos or _token_id_tuple(model.config.eos_token_id)
    vocab = model.config.vocab_size
    for token in eos:
        if not 0 <= token < vocab:
            raise ValueError(f"eos_token_id {token} lies outside the vocabulary of {vocab} rows")
    if pad_token_id is None:
        pad_token_id = getattr(generation_config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = eos[0] if eos else 0
    return _Settings(
        mode=mode,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        do_sample=bool(do_sample),
        temperature=temperature,
        top_k=top_k,
        top_p=None if top_p is None else float(top_p),
        eos_token_ids=eos,
        pad_token_id=int(pad_token_id),
    )


def _check_individual(individual: Any, batch_size: int, causal_size: int, device) -> Tensor:
    """ε given by the caller: (C,) for every prompt or (B,C), strictly inside (0,1) → (B,C) float64."""
    if isinstance(individual, GenerationResult):
        individual = individual.individual
    try:
        epsilon = torch.as_tensor(individual, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        kind = type(individual).__name__
        raise TypeError(f"individual must be a tensor or nested list of floats, got {kind}") from error
    given_shape = tuple(epsilon.shape)
    if epsilon.dim() == 1:
        epsilon = epsilon.unsqueeze(0)
    if epsilon.dim() != 2 or epsilon.shape[-1] != causal_size or epsilon.shape[0] not in (1, batch_size):
        raise ValueError(
            f"individual has shape {given_shape}; expected ({causal_size},) or ({batch_size}, {causal_size}) "
            f"(causal size {causal_size}, {batch_size} prompt(s))"
        )
    if not bool(((epsilon > 0) & (epsilon < 1)).all()):
        raise ValueError("individual ε must lie strictly between 0 and 1 in every component")
    return epsilon.expand(batch_size, -1).contiguous().to(device)


# ============================================================================================================
# The decoding loop
# ============================================================================================================
class _Decoder:
    """One batch being decoded: the cache, the running mask and positions, and the per-mode decision.

    input_ids, numeric_values, attention_mask: (B,P) left padded.
    """

    def __init__(
        self,
        model,
        input_ids: Tensor,
        numeric_values: Tensor | None,
        attention_mask: Tensor | None,
        settings: _Settings,
        generator: torch.Generator | None,
        individual: Tensor | None,
    ) -> None:
        self.model = model
        self.settings = settings
        self.generator = generator
        batch, _ = input_ids.shape
        device = input_ids.device
        self.device = device
        self.num_id = int(model.config.num_token_id)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        self.attention_mask = attention_mask.long()  # (B,P)
        # Positions as HF generate makes them: cumsum of the mask, 0 on padding.
        positions = self.attention_mask.cumsum(-1) - 1  # (B,P)
        self.position_ids = positions.masked_fill(self.attention_mask == 0, 0)  # (B,P)
        self.has_padding = bool((self.attention_mask == 0).any())
        self.cache = DynamicCache(config=model.config)
        self.next_input_ids = input_ids  # (B,P) then (B,1)
        self.next_values = numeric_values  # (B,P) then (B,1), or None
        self.next_position_ids = self.position_ids  # (B,P) then (B,1)
        self.running_ids = input_ids  # (B,P+t): only for the logits warpers' signature
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.finish_reasons: list[str | None] = [None] * batch
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        self.step_count = 0
        self.eos = torch.tensor(settings.eos_token_ids, dtype=torch.long, device=device)  # (E,)
        self.epsilon: Tensor | None = None
        self.offsets: Tensor | None = None
        if settings.mode == "causal":
            causal_size = model.config.causal_size
            if individual is None:
                individual = sample_individual(batch, causal_size, generator, device)
            self.epsilon = individual  # (B,C)
            self.offsets = _individual_offsets(self.epsilon)  # (B,C) float64
        self.warpers = self._warpers()

    def _warpers(self) -> LogitsProcessorList:
        s = self.settings
        warpers = LogitsProcessorList()
        if s.mode != "traditional" or not s.do_sample:
            return warpers
        if s.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(s.temperature))
        if s.top_k is not None:
            warpers.append(TopKLogitsWarper(s.top_k))
        if s.top_p is not None and s.top_p < 1.0:
            warpers.append(TopPLogitsWarper(s.top_p))
        return warpers

    @property
    def done(self) -> bool:
        return bool(self.finished.all()) or self.step_count >= self.settings.max_new_tokens

    # ---- one step ------------------------------------------------------------------------------------------
    def step(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Run the backbone on the new input, decide one token per row.

        Returns tokens (B,), values (B,) (the number of a chosen ``<NUM>``, else 0), loc_Y, scale_Y (B,)
        (NaN where no ``<NUM>`` was chosen). Finished rows get ``pad_token_id``.
        """
        model = self.model
        features = self._backbone()  # (B,H)
        loc_U, scale_U = model.abduction(features)  # (B,C) each
        banned = self.eos if self.step_count < self.settings.min_new_tokens else None
        mode = self.settings.mode
        u = None
        if mode == "traditional":
            tokens = self._decide_traditional(loc_U, banned)
        elif mode == "standard":
            tokens = self._decide_standard(loc_U, scale_U, banned)
        else:
            u = loc_U + (scale_U.double() * self.offsets).to(loc_U.dtype)  # (B,C) the individual
            tokens = self._decide_causal(u, banned)
        tokens = torch.where(self.finished, torch.full_like(tokens, self.settings.pad_token_id), tokens)  # (B,)
        values, loc_Y, scale_Y = self._numbers(tokens, loc_U, scale_U, u)
        self._advance(tokens, values)
        return tokens, values, loc_Y, scale_Y

    def _backbone(self) -> Tensor:
        model = self.model
        values = self.next_values
        if values is not None and not bool((values != 0).any()):
            values = None
        embeds = model.embed(self.next_input_ids, values)  # (B,s,H)
        out = model.model(
            inputs_embeds=embeds,
            attention_mask=self.attention_mask if self.has_padding else None,
            position_ids=self.next_position_ids,
            cache=self.cache,
            use_cache=True,
        )
        return out.last_hidden_state[:, -1]  # (B,H)

    def _decide_traditional(self, loc_U: Tensor, banned: Tensor | None) -> Tensor:
        logits = self.model.action.classification_head(loc_U).float()  # (B,V) = loc_S
        if banned is not None and banned.numel():
            logits[:, banned] = -math.inf
        if not self.settings.do_sample:
            return logits.argmax(dim=-1)
        scores = self.warpers(self.running_ids, logits)  # (B,V)
        probs = torch.softmax(scores, dim=-1)  # (B,V)
        return torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(-1)

    def _decide_standard(self, loc_U: Tensor, scale_U: Tensor, banned: Tensor | None) -> Tensor:
        head = self.model.action.classification_head
        loc_S = F.linear(loc_U, head.weight, head.bias)  # (B,V) in the weights' dtype, as in the forward pass
        distance = loc_S.float().sub_(self._thresholds())  # (B,V) d = loc_S − t in float32 (in place: a fresh tensor)
        if banned is not None and banned.numel():
            distance[:, banned] = -math.inf
        fixed = position_free_scale(self.model)
        if fixed is not None:  # scale_S is the same (V,) vector at every position: one multiply decides
            return distance.mul_(fixed[1]).argmax(dim=-1)
        s = self.model.action.decision_scale(scale_U)  # (B,C)
        norms = _derived(head, "row_norms", (head.weight,), lambda: RowNorms.of(head.weight))
        token_noise = float(self.model.action.token_noise_scale().detach())
        return ovr_argmax(distance, s, head.weight, norms, token_noise)

    def _decide_causal(self, u: Tensor, banned: Tensor | None) -> Tensor:
        action = self.model.action
        head = action.classification_head
        loc_S = F.linear(u, head.weight, head.bias).float()  # (B,V)
        if banned is not None and banned.numel():
            loc_S[:, banned] = -math.inf
        scale_S, inverse_scale, has_zero = constant_scale(action)  # (V,) float32, (V,) float32, bool
        return causal_scores(loc_S, scale_S, self._thresholds(), None if has_zero else inverse_scale).argmax(dim=-1)

    def _thresholds(self) -> Tensor:
        """The thresholds t, () or (V,), in float32 (cached until they change)."""
        values = self.model.ovr_thresholds.values
        return _derived(self.model.ovr_thresholds, "float_thresholds", (values,), lambda: values.detach().float())

    def _numbers(
        self, tokens: Tensor, loc_U: Tensor, scale_U: Tensor, u: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Value, ``loc_Y``, ``scale_Y`` (B,) where ``<NUM>`` was chosen: ``W_reg u + b_reg`` for an individual
        ``u`` (causal), else the Cauchy ``(loc_Y, scale_Y)`` with value ``loc_Y``; 0 / NaN elsewhere."""
        is_number = tokens == self.num_id  # (B,)
        values = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)  # (B,)
        loc_Y = torch.full_like(values, math.nan)
        scale_Y = torch.full_like(values, math.nan)
        if not bool(is_number.any()):
            return values, loc_Y, scale_Y
        action = self.model.action
        if u is not None:
            head = action.regression_head
            y = F.linear(u, head.weight, head.bias).squeeze(-1).float()  # (B,)
            values = torch.where(is_number, y, values)
            loc_Y = torch.where(is_number, y, loc_Y)
        else:
            median, scale = action.regress(loc_U, scale_U)  # (B,) each
            values = torch.where(is_number, median.float(), values)
            loc_Y = torch.where(is_number, median.float(), loc_Y)
            scale_Y = torch.where(is_number, scale.float(), scale_Y)
        return values, loc_Y, scale_Y

    def _advance(self, tokens: Tensor, values: Tensor) -> None:
        active = ~self.finished  # (B,)
        self.lengths += active.long()
        self.step_count += 1
        if self.eos.numel():
            hit = active & torch.isin(tokens, self.eos)
            for row in hit.nonzero().flatten().tolist():
                self.finish_row(row, "eos")
        if self.step_count >= self.settings.max_new_tokens:
            for row in (~self.finished).nonzero().flatten().tolist():
                self.finish_row(row, "length")
        self.next_input_ids = tokens.unsqueeze(-1)  # (B,1)
        self.next_values = values.unsqueeze(-1)  # (B,1)
        self.next_position_ids = self.next_position_ids[:, -1:] + 1  # (B,1)
        ones = torch.ones_like(self.attention_mask[:, :1])  # (B,1)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=-1)  # (B,P+t)
        if self.warpers:
            self.running_ids = torch.cat([self.running_ids, self.next_input_ids], dim=-1)

    def finish_row(self, row: int, reason: str) -> None:
        if not bool(self.finished[row]):
            self.finished[row] = True
            self.finish_reasons[row] = reason


def _prepare_generator(seed: int | None, device) -> torch.Generator:
    """A generator seeded by ``seed``; without a seed, one seeded from torch's global RNG (so
    ``torch.manual_seed`` makes runs reproducible)."""
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
        chosen = seed
    else:
        chosen = int(torch.randint(0, 2**62, ()).item())
    generator = torch.Generator(device=device)
    generator.manual_seed(chosen)
    return generator


def _check_model(model) -> None:
    for attribute in ("abduction", "action", "ovr_thresholds", "embed", "model"):
        if not hasattr(model, attribute):
            raise TypeError(f"model must be a CausalQwenForCausalLM, got {type(model).__name__}")


def _start(
    model,
    input_ids: Tensor,
    numeric_values: Tensor | None,
    attention_mask: Tensor | None,
    *,
    mode: str,
    max_new_tokens: int,
    min_new_tokens: int,
    seed: int | None,
    do_sample: bool | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    individual: Any,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int | None,
) -> _Decoder:
    _check_model(model)
    max_new_tokens = _within_positions(model, input_ids, attention_mask, max_new_tokens)
    settings = _build_settings(
        model, mode, max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, pad_token_id
    )
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (batch, length) tensor, got {getattr(input_ids, 'shape', input_ids)!r}")
    batch, length = input_ids.shape
    if batch == 0 or length == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one non-empty prompt")
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected {tuple(input_ids.shape)}"
            )
        if bool((attention_mask[:, -1] == 0).any()):
            raise ValueError("generation needs LEFT padding: the last position of every row must be a real token")
        empty = (attention_mask.sum(-1) == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"prompt {empty[0]} is empty (no unmasked token)")
    if numeric_values is not None:
        numeric_values = model._checked_numeric_values(input_ids, numeric_values)
    if individual is not None and settings.mode != "causal":
        raise ValueError(f"an individual only applies to mode 'causal', not {settings.mode!r}")
    device = input_ids.device
    epsilon = None
    if individual is not None:
        epsilon = _check_individual(individual, batch, model.config.causal_size, device)
    generator = _prepare_generator(seed, device)
    return _Decoder(model, input_ids, numeric_values, attention_mask, settings, generator, epsilon)


def _within_positions(model, input_ids: Any, attention_mask: Tensor | None, max_new_tokens: Any) -> Any:
    """``max_new_tokens``, capped (with a warning) so that no row passes the model's position limit
    (``config.max_position_embeddings``); ``ValueError`` when a prompt alone reaches it."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(limit, int) or not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        return max_new_tokens
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        return max_new_tokens  # _build_settings names the bad value
    lengths = attention_mask.sum(-1) if attention_mask is not None else torch.full((input_ids.shape[0],),
                                                                                   input_ids.shape[1])
    longest, row = int(lengths.max()), int(lengths.argmax())
    if longest >= limit:
        raise ValueError(f"prompt {row} is {longest:,} tokens long; the model reads at most {limit:,} positions "
                         "(config.max_position_embeddings) and needs room for new tokens: shorten the prompt")
    if longest + max_new_tokens > limit:
        logger.warning("max_new_tokens=%s would pass the model's %s positions after a %s-token prompt: "
                       "generating at most %s tokens", f"{max_new_tokens:,}", f"{limit:,}", f"{longest:,}",
                       f"{limit - longest:,}")
        return limit - longest
    return max_new_tokens


def _run_to_end(decoder: _Decoder, on_step: Callable[[_Decoder, Tensor, Tensor], None] | None = None) -> GeneratedBatch:
    tokens_per_step: list[Tensor] = []
    values_per_step: list[Tensor] = []
    loc_per_step: list[Tensor] = []
    scale_per_step: list[Tensor] = []
    with torch.inference_mode():
        while not decoder.done:
            tokens, values, loc_Y, scale_Y = decoder.step()
            tokens_per_step.append(tokens)
            values_per_step.append(values)
            loc_per_step.append(loc_Y)
            scale_per_step.append(scale_Y)
            if on_step is not None:
                on_step(decoder, tokens, values)
    reasons = [reason or "length" for reason in decoder.finish_reasons]
    return GeneratedBatch(
        token_ids=torch.stack(tokens_per_step, dim=1),  # (B,T)
        numeric_values=torch.stack(values_per_step, dim=1),  # (B,T)
        lengths=decoder.lengths.clone(),
        loc_Y=torch.stack(loc_per_step, dim=1),  # (B,T)
        scale_Y=torch.stack(scale_per_step, dim=1),  # (B,T)
        finish_reasons=reasons,
        individual=None if decoder.epsilon is None else decoder.epsilon.clone(),
        steps=decoder.step_count,
    )


def generate_ids(
    model,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    numeric_values: Tensor | None = None,
    *,
    mode: str = "standard",
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    seed: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    individual: Any = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    on_step: Callable[[Any, Tensor, Tensor], None] | None = None,
) -> GeneratedBatch:
    """Generate from token ids (no tokenizer needed). input_ids, attention_mask, numeric_values: (B,P), LEFT padded.

    See `generate` for the options; ``on_step(decoder, tokens (B,), values (B,))`` is called after every step.
    """
    decoder = _start(
        model,
        input_ids,
        numeric_values,
        attention_mask,
        mode=mode,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        seed=seed,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        individual=individual,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    return _run_to_end(decoder, on_step)


# ============================================================================================================
# Text: prompts in, streamed text and results out
# ============================================================================================================
class _RowText:
    """The text of one row as it grows: decoded from its ids and values, cut at the first stop string.

    ``emitted`` is what has been streamed; trailing U+FFFD (an incomplete UTF-8 byte sequence) is held back.
    """

    def __init__(
        self, decode: Callable[[list[int], list[float], list[str]], str], stop_strings: tuple[str, ...]
    ) -> None:
        self.decode = decode
        self.stop_strings = stop_strings
        self.ids: list[int] = []
        self.values: list[float] = []
        self.strings: list[str] = []  # each number as written (format_prediction), "" at other tokens
        self.emitted = ""
        self.checked = 0  # length of the text already searched for stop strings
        self.stopped_text: str | None = None

    def push(self, token: int, value: float, track: bool, string: str = "") -> str:
        """Append one token; when tracking, return the newly visible text."""
        self.ids.append(token)
        self.values.append(value)
        self.strings.append(string)
        if not track:
            return ""
        full = self.decode(self.ids, self.values, self.strings)
        if self.stop_strings:
            self._find_stop(full)
        visible = self.stopped_text if self.stopped_text is not None else full.rstrip("\ufffd")
        return self._emit(visible)

    def _find_stop(self, full: str) -> None:
        """The earliest stop string in the text not yet searched; a match that overlaps a number (the "."
        of ``6.5``) does not count: a number is one value, written whole."""
        numbers: list[tuple[int, int]] | None = None  # number spans, read only once some stop string matches
        best_start, best_end = None, None
        for stop in self.stop_strings:
            start = full.find(stop, max(0, self.checked - len(stop) + 1))
            if start >= 0 and numbers is None:
                numbers = [(span.start, span.end) for span in find_numbers(full)]
            while start >= 0 and any(start < end and start + len(stop) > begin for begin, end in numbers):
                start = full.find(stop, start + 1)
            if start >= 0 and (best_start is None or start < best_start):
                best_start, best_end = start, start + len(stop)
        self.checked = len(full)
        if best_end is not None:
            self.stopped_text = full[:best_end]

    def _emit(self, visible: str) -> str:
        if not visible.startswith(self.emitted):
            logger.debug("decoded text is not prefix-stable; holding the stream until the end")
            return ""
        piece = visible[len(self.emitted) :]
        self.emitted = visible
        return piece

    @property
    def stopped(self) -> bool:
        return self.stopped_text is not None

    def final_text(self) -> str:
        return self.stopped_text if self.stopped_text is not None else self.decode(self.ids, self.values, self.strings)

    def finish(self) -> str:
        """The last piece: what the final text adds to what was streamed."""
        final = self.final_text()
        if not final.startswith(self.emitted):
            logger.warning("streamed text %r is not a prefix of the final text %r", self.emitted, final)
            self.emitted = final
            return ""
        return self._emit(final)


def _as_prompt_list(prompts: str | Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, (bytes, bytearray)):
        raise TypeError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompt {index} must be a string, got {type(prompt).__name__}")
        if prompt == "":
            raise ValueError(f"prompt {index} is empty")
    return prompts


def _as_stop_strings(stop_strings: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop_strings is None:
        return ()
    if isinstance(stop_strings, str):
        stop_strings = (stop_strings,)
    stops = tuple(stop_strings)
    for stop in stops:
        if not isinstance(stop, str) or stop == "":
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
    return stops


def encode_prompts(tokenizer, prompts: Sequence[str], device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Tokenize with LEFT padding: ``input_ids``, ``numeric_values``, ``attention_mask`` (B,P) on ``device``."""
    encoded = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
    batch = {key: encoded[key].to(device) for key in ("input_ids", "attention_mask")}
    values = encoded["numeric_values"] if "numeric_values" in encoded else None
    if values is None:
        values = torch.zeros_like(batch["input_ids"], dtype=torch.float32)
    batch["numeric_values"] = values.to(device=device, dtype=torch.float32)
    return batch


def _decoder_for(tokenizer) -> Callable[[list[int], list[float], list[str]], str]:
    def decode(ids: list[int], values: list[float], strings: list[str]) -> str:
        return tokenizer.decode(ids, numeric_values=values, numeric_strings=strings, skip_special_tokens=False,
                                separate_numbers=True)

    return decode


def _model_device(model) -> torch.device:
    return model.model.embed_tokens.weight.device


class GenerationStream:
    """Generation as an iterator of `TextPiece` (text as it is produced, per prompt).

    Iterate it to the end, then read ``results`` (one `GenerationResult` per prompt). Joining the pieces of
    prompt ``i`` gives exactly ``results[i].text``. Built by `stream`; `generate` drives one too.
    """

    def __init__(
        self,
        model,
        tokenizer,
        prompts: str | Sequence[str],
        *,
        stop_strings: str | Sequence[str] | None = (),
        track_text: bool = True,
        **options,
    ) -> None:
        self.prompts = _as_prompt_list(prompts)
        self.stop_strings = _as_stop_strings(stop_strings)
        self.tokenizer = tokenizer
        self.track_text = track_text or bool(self.stop_strings)
        _check_model(model)
        batch = encode_prompts(tokenizer, self.prompts, _model_device(model))
        options.setdefault("pad_token_id", _tokenizer_pad_id(tokenizer))
        self._decoder = _start(
            model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], **_with_defaults(options)
        )
        self._results: list[GenerationResult] | None = None

    @property
    def results(self) -> list[GenerationResult]:
        if self._results is None:
            raise RuntimeError("GenerationStream.results is available once the stream has been iterated to the end")
        return self._results

    def __iter__(self) -> Iterator[TextPiece]:
        if self._results is not None:
            return
        decoder = self._decoder
        decode = _decoder_for(self.tokenizer)
        rows = [_RowText(decode, self.stop_strings) for _ in self.prompts]
        eos = set(decoder.settings.eos_token_ids)
        collected: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        reported = [False] * len(rows)
        while not decoder.done:
            with torch.inference_mode():
                was_active = (~decoder.finished).tolist()
                step = decoder.step()
            collected.append(step)
            tokens, values = step[0].tolist(), step[1].tolist()
            for index, row in enumerate(rows):
                if not was_active[index]:
                    continue
                if tokens[index] not in eos:
                    string = self._number_text(tokens[index], values[index], step[3][index])
                    piece = row.push(tokens[index], values[index], self.track_text, string)
                    if piece:
                        yield TextPiece(index, piece)
                if row.stopped:
                    decoder.finish_row(index, "stop_string")
            for index, row in enumerate(rows):
                if bool(decoder.finished[index]) and not reported[index]:
                    reported[index] = True
                    yield TextPiece(index, row.finish() if self.track_text else "", finished=True)
        for index, row in enumerate(rows):
            if not reported[index]:
                yield TextPiece(index, row.finish() if self.track_text else "", finished=True)
        self._results = self._build_results(rows, collected)

    def _number_text(self, token: int, value: float, scale: Tensor) -> str:
        """A generated number written to the precision of its scale (NaN in causal mode: all digits)."""
        if token != self._decoder.num_id:
            return ""
        min_decimals = getattr(self.tokenizer, "number_min_decimals", None)
        return format_prediction(value, float(scale), min_decimals=min_decimals)

    def _build_results(self, rows: list[_RowText], collected) -> list[GenerationResult]:
        decoder = self._decoder
        tokens = torch.stack([c[0] for c in collected], dim=1)  # (B,T)
        values = torch.stack([c[1] for c in collected], dim=1)  # (B,T)
        loc_Y = torch.stack([c[2] for c in collected], dim=1)  # (B,T)
        scale_Y = torch.stack([c[3] for c in collected], dim=1)  # (B,T)
        num_id = decoder.num_id
        results = []
        for index, row in enumerate(rows):
            length = int(decoder.lengths[index])
            ids = tokens[index, :length].tolist()
            numbers = [
                _number_prediction(t, float(values[index, t]), float(loc_Y[index, t]), float(scale_Y[index, t]),
                                   row.strings[t] if t < len(row.strings) else None)
                for t in range(length)
                if ids[t] == num_id
            ]
            results.append(
                GenerationResult(
                    prompt=self.prompts[index],
                    text=row.emitted if self.track_text else row.final_text(),
                    token_ids=ids,
                    numbers=numbers,
                    finish_reason=decoder.finish_reasons[index] or "length",
                    mode=decoder.settings.mode,
                    individual=None if decoder.epsilon is None else decoder.epsilon[index].clone(),
                )
            )
        return results


def _number_prediction(
    token_index: int, value: float, median: float, scale: float, text: str | None = None
) -> NumberPrediction:
    if math.isnan(scale):
        return NumberPrediction(token_index=token_index, value=value, text=text)
    loc, width = torch.tensor(median, dtype=torch.float64), torch.tensor(scale, dtype=torch.float64)
    intervals = {}
    for coverage in INTERVAL_COVERAGES:
        low, high = cauchy.central_interval(loc, width, coverage)
        intervals[coverage] = (float(low), float(high))
    return NumberPrediction(
        token_index=token_index,
        value=value,
        median=median,
        scale=scale,
        interval_50=intervals[0.5],
        interval_90=intervals[0.9],
        text=text,
    )


def _tokenizer_pad_id(tokenizer) -> int | None:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(tokenizer, "base", None), "pad_token_id", None)
    return pad


_DEFAULTS: dict[str, Any] = dict(
    mode="standard",
    max_new_tokens=64,
    min_new_tokens=0,
    seed=None,
    do_sample=None,
    temperature=None,
    top_k=None,
    top_p=None,
    individual=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _with_defaults(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown generation option(s): {', '.join(unknown)}; the options are {', '.join(_DEFAULTS)}")
    return {**_DEFAULTS, **options}


def stream(
    model,
    tokenizer,
    prompts: str | Sequence[str],
    *,
    mode: str = "standard",
    max_new_tokens: int = 64,
    stop_strings: str | Sequence[str] | None = (),
    **options,
) -> GenerationStream:
    """Like `generate`, but returns a `GenerationStream`: iterate it for `TextPiece` s, then read ``.results``."""
    return GenerationStream(
        model, tokenizer, prompts, mode=mode, max_new_tokens=max_new_tokens, stop_strings=stop_strings, **options
    )


def generate(
    model,
    tokenizer,
    prompts: str | Sequence[str],
    *,
    mode: str = "standard",
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    seed: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_strings: str | Sequence[str] | None = (),
    individual: Any = None,
    eos_token_id: int | Sequence[int] | None = None,
    callback: Callable[[TextPiece], None] | None = None,
) -> list[GenerationResult]:
    """Generate a continuation of each prompt (batched, left padded, KV cache reused at every step).

    mode: "standard" (deterministic argmax of the OvR probabilities), "causal" (an individual ε per prompt,
    shared across its positions; ``individual`` (C,) or (B,C) replays one) or "traditional" (softmax over
    ``loc_S``; sampling with ``temperature``/``top_k``/``top_p`` unless ``temperature=0`` or ``do_sample=False``:
    greedy). Stops at an end-of-sequence id (the model's generation config, or ``eos_token_id``), at a stop
    string (kept in the text) or after ``max_new_tokens``; ``min_new_tokens`` forbids EOS before that.
    ``seed`` makes sampling (ε, traditional sampling) reproducible. ``callback(piece)`` receives every
    `TextPiece` as it is produced.
    """
    options = dict(
        mode=mode,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        seed=seed,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        individual=individual,
        eos_token_id=eos_token_id,
    )
    generation = GenerationStream(
        model, tokenizer, prompts, stop_strings=stop_strings, track_text=callback is not None, **options
    )
    for piece in generation:
        if callback is not None:
            callback(piece)
    return generation.results


# ============================================================================================================
# Parity with Qwen's own generate (used by `causal-qwen compare`)
# ============================================================================================================
PARITY_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hello",
)


def greedy_parity(
    base_qwen_model,
    causal_model,
    tokenizer,
    prompts: Sequence[str] = PARITY_PROMPTS,
    max_new_tokens: int = 32,
) -> dict[str, int]:
    """Greedy ``Qwen2ForCausalLM.generate`` vs greedy traditional CausalQwen, token for token.

    Runs every prompt alone and all prompts as one left-padded batch. Counts, over Qwen's generated tokens
    (up to and including its first EOS), how many CausalQwen reproduces at the same place:
    ``{"greedy_match_tokens": …, "greedy_total_tokens": …}``. Prompts should hold no numbers (Qwen would
    read ``<NUM>`` without its value).
    """
    from transformers import GenerationConfig

    prompts = _as_prompt_list(list(prompts))
    _check_int("max_new_tokens", max_new_tokens, 1)
    eos = _token_id_tuple(getattr(base_qwen_model.generation_config, "eos_token_id", None)) or _token_id_tuple(
        base_qwen_model.config.eos_token_id
    )
    pad = _tokenizer_pad_id(tokenizer)
    pad = pad if pad is not None else (eos[0] if eos else 0)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        eos_token_id=list(eos) if eos else None,
        pad_token_id=pad,
    )
    device = _model_device(causal_model)
    match = total = 0
    groups = [[prompt] for prompt in prompts] + ([prompts] if len(prompts) > 1 else [])
    for group in groups:
        batch = encode_prompts(tokenizer, group, device)
        if bool((batch["numeric_values"] != 0).any()):
            logger.warning("parity prompt(s) %r hold numbers: Qwen reads <NUM> without its value", group)
        with torch.inference_mode():
            reference = base_qwen_model.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], generation_config=config
            )[:, batch["input_ids"].shape[1] :]  # (B,T')
        ours = generate_ids(
            causal_model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["numeric_values"],
            mode="traditional",
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(eos),
            pad_token_id=pad,
        ).token_ids  # (B,T)
        for row in range(reference.shape[0]):
            expected = reference[row].tolist()
            length = len(expected)
            for t, token in enumerate(expected):
                if token in eos:
                    length = t + 1
                    break
            got = ours[row].tolist()
            total += length
            match += sum(1 for t in range(length) if t < len(got) and got[t] == expected[t])
    logger.info("greedy parity: %d of %d tokens match", match, total)
    return {"greedy_match_tokens": match, "greedy_total_tokens": total}
