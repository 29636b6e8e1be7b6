"""Calibration of the One-vs-Rest decision at conversion: thresholds and scales from the base's own logits.

Shape legend: N calibration positions, K top logits kept per position, R tokens seen in those top-K places,
H hidden size, C causal size, V vocabulary rows.

At conversion ``loc_S`` equals Qwen's logits ``l`` and stays so; what decides the OvR probabilities

    P_k = P(S_k > t_k) = atan2(scale_k, t_k − l_k) / π,      scale_k = Σ_c |W_kc| s_c,   s = scale_U + |b_noise|

are the thresholds ``t_k`` and the component scales ``s``. With the seeds' literal values (``s = 10 + 0.1``,
``t = 100``) every ``P_k`` on real weights is about 0.3 (docs/design.md, "Calibration at conversion"). The
calibration sets them from the base's logits on a fixed calibration text, in three steps:

1. **Profile.** ``s_c = σ·p_c/κ``. The profile ``p`` (C,) makes the row scales ``(|W| p)_k`` as equal as it can over
   the tokens that reach the top-K of the calibration positions (`flat_profile`); ``κ`` is their mean, so
   ``scale_k = σ·ŝ_k`` with ``ŝ_k`` near 1 for those tokens. Equal row scales matter because the standard decision
   is ``argmax_k (l_k − t_k)/scale_k``: with Qwen's plain row norms (``p = 1``, ±30% from row to row) a token with a
   slightly lower logit but a larger row can win; on real Qwen2.5 weights the flat profile halves that spread.
2. **Level.** Thresholds ``t_k = L − m·σ·ŝ_k``, so ``z_k = (l_k − t_k)/scale_k = (l_k − L)/(σ ŝ_k) + m``: the
   standard decision ``argmax_k (l_k − L)/ŝ_k`` depends on ``L`` only. A token whose logit is above ``L`` beats every
   token below it, whatever the row scales, so ``L`` is chosen among quantiles of the top-1 logits as the one with
   the best agreement with the base's greedy token, among the levels that on average at most ``MAX_MEAN_ABOVE``
   logits exceed (`choose_level`; with a small ``σ`` each ``P_k`` is near 1 above its threshold and near 0 below).
3. **Scale and margin.** ``(σ, m)``: the pair on a grid (decades of ``σ``, refined by quarter decades with a few
   margins ``m``) that minimises the OvR-normalised negative log-likelihood ``−log(P_t / Σ_k P_k)`` of the
   calibration text's next tokens, among the pairs whose mean ``Σ_k P_k`` stays at most ``MAX_PROB_SUM``
   (`search_scale`). ``σ`` leaves the standard decision unchanged. ``s`` is split as ``scale_U = (1 − noise_share)·s``
   (through ``b_scale``, with ``W_scale = 0``) and ``|b_noise| = noise_share·s``.

The sum ``Σ_k P_k`` grows with ``σ`` roughly as ``V·σ/(π·gap)`` (below its threshold a Cauchy keeps a tail mass
``scale/(π·gap)`` for every one of the V tokens), so sparse probabilities need a small ``σ``; docs/design.md
discusses what that means for causal mode.

Everything is deterministic given ``seed``. The calibration text is the English prose of Python's own
reference documentation (``pydoc_data.topics``, in every CPython), the even-numbered topics; the odd-numbered
ones are kept for evaluation (`held_out_texts`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

logger = logging.getLogger(__name__)

CALIBRATIONS = ("base_agreement", "none")
QWEN25_TEXT_IDS = 151665  # ids below this are Qwen2.5's text and special tokens
DEFAULT_POSITIONS = 4096
WINDOW = 96
TOP_K = 32
PROFILE_STEPS = 300
LEVEL_CANDIDATES = 25  # quantiles of the top-1 logit tried as the level L
COARSE_EXPONENTS = tuple(range(-7, 1))  # σ = 10^e, then refined by quarter decades around the best
MARGINS = (-2.0, 0.0, 2.0)  # m: the threshold sits m decision scales below the level (tried around the best σ)
SCALE_POSITIONS = 256
TEXT_CHARS = 4000  # each text's first characters: enough for two windows
MAX_PROB_SUM = 1.5
MAX_MEAN_ABOVE = 1.0  # logits above the level, on average over the calibration positions
NOISE_SHARE = 0.1


@dataclass
class CalibrationReport:
    """What the calibration chose and what it measured on its own text.

    threshold_level: ``L``; margin: ``m``; scale: ``σ``; row_scale_spread: standard deviation of ``log ŝ_k`` over the
    tokens seen near the top; agreement: share of calibration positions where the standard decision equals the
    base's greedy token; prob_sum_mean: mean ``Σ_k P_k``; ovr_nll / softmax_nll: mean next-token NLL,
    OvR-normalised and softmax (on the scale-search positions).
    """

    positions: int
    threshold_level: float
    margin: float
    scale: float
    row_scale_spread: float
    agreement: float
    prob_sum_mean: float
    ovr_nll: float
    softmax_nll: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def _topic_texts(parity: int) -> list[str]:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return [topics[name] for index, name in enumerate(sorted(topics)) if index % 2 == parity]


def calibration_texts() -> list[str]:
    """The calibration text: even-numbered topics of Python's reference documentation (English prose)."""
    return _topic_texts(0)


def held_out_texts() -> list[str]:
    """Text the calibration never sees: the odd-numbered topics of the same documentation."""
    return _topic_texts(1)


@torch.no_grad()
def collect_features(model, tokenizer, texts: list[str], max_positions: int, window: int = WINDOW) -> tuple[Tensor, Tensor]:
    """Backbone features ``z`` (N,H) float32 and next-token ids (N,) over windows of ``window`` tokens.

    Each text contributes its first two windows (so the positions come from many texts)."""
    features, targets = [], []
    count = 0
    for text in texts:
        encoded = tokenizer([text[:TEXT_CHARS]], return_tensors="pt")
        ids, values = encoded["input_ids"][0], encoded["numeric_values"][0]  # (T,)
        for start in range(0, min(len(ids) - 1, 2 * window), window):
            piece_ids = ids[start : start + window + 1]  # (w+1,)
            piece_values = values[start : start + window + 1]
            if len(piece_ids) < 8:
                continue
            embeds = model.embed(piece_ids[None, :-1], piece_values[None, :-1].to(torch.float32))  # (1,w,H)
            z = model.model(inputs_embeds=embeds, use_cache=False).last_hidden_state[0]  # (w,H)
            features.append(z.float())
            targets.append(piece_ids[1:])
            count += len(piece_ids) - 1
            if count >= max_positions:
                break
        if count >= max_positions:
            break
    if not features:
        raise ValueError("the calibration text produced no positions")
    return torch.cat(features)[:max_positions], torch.cat(targets)[:max_positions]


@torch.no_grad()
def sampled_features(model, max_positions: int, seed: int, length: int = 64) -> tuple[Tensor, Tensor]:
    """Features (N,H) and next-token ids (N,) of text the base writes itself: ancestral samples at temperature 1
    from random first tokens (seeded). Used when no tokenizer for the base's vocabulary is at hand."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(seed)
    head = model.action.classification_head
    sequences = max(1, math.ceil(max_positions / length))
    ids = torch.randint(0, head.weight.shape[0], (sequences, 1), generator=generator)  # (B,1)
    cache = DynamicCache(config=model.config)
    features, tokens = [], [ids]
    for _ in range(length):
        z = model.model(inputs_embeds=model.embed(ids, None), cache=cache, use_cache=True).last_hidden_state[:, -1]  # (B,H)
        probs = torch.softmax(head(z).float(), dim=-1)  # (B,V) Qwen's next-token distribution
        ids = torch.multinomial(probs, 1, generator=generator)  # (B,1)
        features.append(z.float())
        tokens.append(ids)
    z = torch.stack(features, dim=1).reshape(-1, features[0].shape[-1])  # (B·L,H)
    targets = torch.cat(tokens[1:], dim=1).reshape(-1)  # (B·L,)
    return z[:max_positions], targets[:max_positions]


def _tokenizer_fits(tokenizer, vocab_size: int) -> bool:
    return len(tokenizer) <= vocab_size


@torch.no_grad()
def top_logits(features: Tensor, weight: Tensor, bias: Tensor | None, k: int, chunk: int = 512) -> tuple[Tensor, Tensor]:
    """The ``k`` largest logits per position and their ids: (N,K) each, in descending order."""
    values, ids = [], []
    w = weight.detach().float()
    b = None if bias is None else bias.detach().float()
    for start in range(0, len(features), chunk):
        logits = torch.nn.functional.linear(features[start : start + chunk], w, b)  # (n,V)
        top = logits.topk(k, dim=-1)
        values.append(top.values)
        ids.append(top.indices)
    return torch.cat(values), torch.cat(ids)


def flat_profile(weight: Tensor, top_ids: Tensor, steps: int = PROFILE_STEPS) -> Tensor:
    """Step 1: the component profile ``p`` (C,) > 0 that makes the row scales ``(|W| p)_k`` as equal as it can
    over the tokens that reach the top of the calibration positions.

    Minimises ``Σ_k f_k (log (|W| p)_k − m)²`` with ``f_k`` the share of top-K places held by token ``k`` and ``m``
    their weighted mean log scale (Adam on ``log p``, full batch: deterministic)."""
    counts = torch.bincount(top_ids.reshape(-1), minlength=weight.shape[0]).float()  # (V,)
    rows = counts.nonzero().squeeze(-1)  # (R,) tokens seen near the top
    share = counts[rows] / counts[rows].sum()  # (R,)
    magnitude = weight.detach().index_select(0, rows).abs().float()  # (R,C)
    log_profile = torch.zeros(weight.shape[1], requires_grad=True)  # (C,)
    optimizer = torch.optim.Adam([log_profile], lr=0.05)
    with torch.enable_grad():
        for _ in range(steps):
            log_scale = torch.log(magnitude @ log_profile.exp())  # (R,)
            centre = (share * log_scale).sum()
            loss = (share * (log_scale - centre).square()).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    profile = log_profile.detach().exp()  # (C,)
    return profile / profile.mean()


def relative_row_scales(weight: Tensor, profile: Tensor, top_ids: Tensor, block: int = 16384) -> tuple[Tensor, float]:
    """``ŝ_k = (|W| p)_k / κ`` (V,) float32 and ``κ``, the mean of ``(|W| p)_k`` over the tokens seen near the top."""
    parts = [F.linear(profile, weight[start : start + block].detach().abs().float()) for start in range(0, weight.shape[0], block)]
    scales = torch.cat(parts)  # (V,) (|W| p)_k
    kappa = float(scales[top_ids.reshape(-1)].mean())
    return (scales / kappa).clamp_min(torch.finfo(torch.float32).tiny), kappa


def standard_agreement(top_values: Tensor, top_ids: Tensor, row_scales: Tensor, level: float) -> float:
    """Share of positions where ``argmax_k (l_k − L)/ŝ_k`` over the top-K logits is the top logit."""
    z = (top_values - level) / row_scales[top_ids]  # (N,K)
    return float((z.argmax(dim=-1) == 0).float().mean())


def choose_level(top_values: Tensor, top_ids: Tensor, row_scales: Tensor, max_mean_count: float = MAX_MEAN_ABOVE) -> tuple[float, float]:
    """Step 2: the level ``L`` (among quantiles of the top-1 logits) with the best `standard_agreement`, among the
    levels that on average at most ``max_mean_count`` logits exceed (with a small ``σ``, ``Σ_k P_k`` is about that
    count); and its agreement."""
    quantiles = torch.linspace(0.02, 0.98, LEVEL_CANDIDATES)
    candidates = torch.quantile(top_values[:, 0], quantiles).tolist()
    scored = []
    for q, level in zip(quantiles.tolist(), candidates):
        count = float((top_values > level).sum(dim=1).float().mean())
        feasible = count <= max_mean_count
        scored.append((feasible, standard_agreement(top_values, top_ids, row_scales, level), -abs(q - 0.5), level))
    _, agreement, _, level = max(scored)
    return level, agreement


@torch.no_grad()
def ovr_figures(
    features: Tensor, targets: Tensor, weight: Tensor, bias: Tensor | None, row_scales: Tensor, level: float,
    grid: list[tuple[float, float]], chunk: int = 128,
) -> dict[str, Tensor]:
    """For each ``(σ, m)`` in ``grid``, with ``t_k = L − m·σ·ŝ_k`` and ``scale_k = σ·ŝ_k`` (so
    ``z_k = (l_k − L)/(σ ŝ_k) + m``): mean ``Σ_k P_k`` and mean OvR-normalised NLL ``−log(P_t / Σ_k P_k)``;
    plus the softmax NLL. features (N,H), targets (N,), row_scales (V,)  →  (G,) tensors and a scalar."""
    w = weight.detach().float()
    b = None if bias is None else bias.detach().float()
    prob_sum = torch.zeros(len(grid), dtype=torch.float64)
    ovr_nll = torch.zeros(len(grid), dtype=torch.float64)
    softmax_nll = 0.0
    for start in range(0, len(features), chunk):
        logits = F.linear(features[start : start + chunk], w, b)  # (n,V)
        target = targets[start : start + chunk, None]  # (n,1)
        softmax_nll += (logits.logsumexp(-1) - logits.gather(1, target)[:, 0]).double().sum().item()
        below = level - logits  # (n,V) L − l_k
        for g, (sigma, margin) in enumerate(grid):
            scale = sigma * row_scales  # (V,)
            log_p = torch.log(torch.atan2(scale, below - margin * scale) / math.pi)  # (n,V) log P_k, no cancellation
            total = torch.logsumexp(log_p, dim=-1)  # (n,) log Σ_k P_k
            prob_sum[g] += total.double().exp().sum()
            ovr_nll[g] += (total - log_p.gather(1, target)[:, 0]).double().sum()
    n = len(features)
    return {"prob_sum": prob_sum / n, "ovr_nll": ovr_nll / n, "softmax_nll": torch.tensor(softmax_nll / n)}


def choose_scale(prob_sum: Tensor, ovr_nll: Tensor, max_prob_sum: float) -> int:
    """Index of the setting with the lowest OvR-normalised NLL among those with mean ``Σ P ≤ max_prob_sum``
    (the smallest sum's when none qualifies)."""
    allowed = prob_sum <= max_prob_sum
    if not bool(allowed.any()):
        return int(torch.argmin(prob_sum))
    masked = torch.where(allowed, ovr_nll, torch.full_like(ovr_nll, math.inf))
    return int(torch.argmin(masked))


def search_scale(features: Tensor, targets: Tensor, head, row_scales: Tensor, level: float) -> tuple[float, float, dict, int]:
    """Step 3: ``(σ, m)`` by `choose_scale`: whole decades of ``σ`` at ``m = 0``, then quarter decades around the
    best decade with each of `MARGINS`."""
    coarse = [(10.0**e, 0.0) for e in COARSE_EXPONENTS]
    figures = ovr_figures(features, targets, head.weight, head.bias, row_scales, level, coarse)
    sigma, _ = coarse[choose_scale(figures["prob_sum"], figures["ovr_nll"], MAX_PROB_SUM)]
    fine = [(sigma * 10.0 ** (q / 4), margin) for q in range(-3, 4) for margin in MARGINS]
    figures = ovr_figures(features, targets, head.weight, head.bias, row_scales, level, fine)
    best = choose_scale(figures["prob_sum"], figures["ovr_nll"], MAX_PROB_SUM)
    return fine[best][0], fine[best][1], figures, best


_MEMO: dict[tuple, tuple[Tensor, Tensor, CalibrationReport]] = {}


def calibrate(model, tokenizer=None, *, positions: int = DEFAULT_POSITIONS, seed: int = 0, memo_key: tuple | None = None) -> CalibrationReport:
    """Set the thresholds, ``b_scale``/``W_scale`` and ``b_noise`` of a freshly converted ``model`` (see the module
    docstring); ``loc_S`` is untouched. ``tokenizer``: a `NumericTokenizer` for the base's vocabulary (the offline
    Qwen2.5 one by default). ``memo_key``: reuse an earlier result for the same base within this process."""
    started = time.perf_counter()
    config = model.config
    head = model.action.classification_head
    if memo_key is not None:
        memo_key = (memo_key, tuple(head.weight.shape), config.ovr_threshold_kind, positions, seed)
    if memo_key is not None and memo_key in _MEMO:
        thresholds, component_scales, report = _MEMO[memo_key]
    else:
        thresholds, component_scales, report = _fit(model, tokenizer, positions, seed)
        if memo_key is not None:
            _MEMO[memo_key] = (thresholds, component_scales, report)
    apply_calibration(model, thresholds, component_scales)
    report.seconds = time.perf_counter() - started
    logger.info("OvR calibration: %s", report.to_dict())
    return report


def _fit(model, tokenizer, positions: int, seed: int) -> tuple[Tensor, Tensor, CalibrationReport]:
    """Steps 1-3 of the module docstring: thresholds (V,) or (), component scales ``s`` (C,), the report."""
    head = model.action.classification_head
    vocab_size = head.weight.shape[0]
    if tokenizer is None and vocab_size > QWEN25_TEXT_IDS:
        from ..core.tokenizer import NumericTokenizer

        tokenizer = NumericTokenizer.default()
    if tokenizer is not None and _tokenizer_fits(tokenizer, vocab_size):
        features, targets = collect_features(model, tokenizer, calibration_texts(), positions)
    else:
        logger.info("no tokenizer for this %d-row vocabulary: calibrating on text the base samples itself", vocab_size)
        features, targets = sampled_features(model, positions, seed)
    values, ids = top_logits(features, head.weight, head.bias, min(TOP_K, vocab_size))
    if model.config.ovr_threshold_kind == "per_token":
        profile = flat_profile(head.weight, ids)  # (C,)
    else:  # one threshold for all: keep the plain row norms
        profile = torch.ones(head.weight.shape[1])
    row_scales, kappa = relative_row_scales(head.weight, profile, ids)  # (V,), κ
    level, agreement = choose_level(values, ids, row_scales)
    subset = slice(0, min(SCALE_POSITIONS, len(features)))
    sigma, margin, figures, best = search_scale(features[subset], targets[subset], head, row_scales, level)
    if model.config.ovr_threshold_kind == "per_token":
        thresholds = level - margin * sigma * row_scales  # (V,) t_k = L − m σ ŝ_k
    else:
        thresholds = torch.tensor(level - margin * sigma)
    component_scales = profile * (sigma / kappa)  # (C,) s_c, so that (|W| s)_k = σ ŝ_k
    seen = ids.reshape(-1).unique()
    report = CalibrationReport(
        positions=len(features),
        threshold_level=level,
        margin=margin,
        scale=sigma,
        row_scale_spread=float(row_scales[seen].log().std()),
        agreement=agreement,
        prob_sum_mean=float(figures["prob_sum"][best]),
        ovr_nll=float(figures["ovr_nll"][best]),
        softmax_nll=float(figures["softmax_nll"]),
        seconds=0.0,
    )
    return thresholds, component_scales, report


@torch.no_grad()
def apply_calibration(model, thresholds: Tensor, component_scales: Tensor, noise_share: float = NOISE_SHARE) -> None:
    """Write thresholds (V,) or () and the decision scale ``s_c`` (C,) into ``model``: ``W_scale = 0``,
    ``scale_U = (1 − noise_share)·s`` through ``b_scale``, ``|b_noise| = noise_share·s``."""
    target = model.ovr_thresholds.values
    target.copy_(thresholds.to(target.dtype).expand_as(target))
    scale_U = (1.0 - noise_share) * component_scales.double()  # (C,)
    model.abduction.scale_net.weight.zero_()
    bias = scale_U + torch.log(-torch.expm1(-scale_U))  # softplus⁻¹, exact for small and large values
    model.abduction.scale_net.bias.copy_(bias.to(model.abduction.scale_net.bias.dtype))
    model.action.b_noise.copy_((noise_share * component_scales).to(model.action.b_noise.dtype))
    model.config.initial_scale = float(scale_U.mean())
    model.config.noise_init = float(noise_share * component_scales.mean())
    model.config.ovr_threshold = float(thresholds.float().mean())
