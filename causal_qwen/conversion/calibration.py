"""Calibration of the One-vs-Rest decision at conversion: thresholds and scales from the base's own logits.

Shape legend: N calibration positions, K top logits kept per position, R tokens seen in those top-K places,
H hidden size, C causal size, V vocabulary rows.

At conversion ``loc_S`` equals Qwen's logits ``l`` and stays so; what decides the OvR probabilities

    P_k = P(S_k > t) = atan2(scale_k, t − l_k) / π,      scale_k = Σ_c |W_kc| s_c + γ_S,   s = scale_U + |b_noise|

are the threshold ``t``, the component scales ``s`` and the token noise ``γ_S``. With the seeds' literal values
(``s = 10 + 0.1``, ``γ_S = 0``, ``t = 100``) every ``P_k`` on real weights is about 0.3 (docs/design.md, "Calibration
at conversion"). The standard decision is ``argmax_k (l_k − t)/scale_k``: with row-dependent scales
(``(|W| s)_k`` follows Qwen's row norms, ±30% from row to row) a token with a slightly lower logit but a larger row
can win, and no choice of ``s`` or of per-token thresholds undoes that for every position. So the calibration puts
all but a share ``ρ = INDIVIDUAL_SHARE`` of the decision scale into ``γ_S``, the same for every token:

    scale_k = σ·((1 − ρ) + ρ·ŝ_k),     ŝ_k = ‖W_k‖₁/κ  (κ: their mean over the tokens seen near the top),

and the standard decision is Qwen's greedy token except where two logits lie within about ``ρ·|l − t|·Δŝ`` of each
other. In three steps, on the base's logits over a fixed calibration text:

1. **Level candidates.** Quantiles of the top-1 logits that on average at most ``MAX_MEAN_ABOVE`` logits exceed
   (`level_candidates`; with a small ``σ`` each ``P_k`` is near 1 above the threshold and near 0 below, so
   ``Σ_k P_k`` is about that count).
2. **Level, scale and margin.** ``(L, σ, m)`` with ``t = L − m·σ``: a few of those levels with whole decades of ``σ``,
   then the best level and its neighbours with quarter decades and a few margins around the best ``σ``, the triple with the lowest OvR-normalised negative
   log-likelihood ``−log(P_t / Σ_k P_k)`` of the calibration text's next tokens among those whose mean ``Σ_k P_k``
   is at most ``MAX_PROB_SUM`` (`search_decision`).
3. **Split.** ``γ_S = (1 − ρ)·σ``; ``s = ρ·σ/κ`` in every component, split as ``scale_U = (1 − noise_share)·s``
   (through ``b_scale``, with ``W_scale = 0``) and ``|b_noise| = noise_share·s``. Per-token thresholds, when the
   model has them, all start at ``t``.
4. **Causal temperature.** With those set, ``config.causal_temperature`` (``τ``, read by causal mode alone) is
   fitted on `TEMPERATURE_POSITIONS` of the same positions so that causal choices per token come closest to the
   base's softmax (`causal_qwen.conversion.causal_temperature`).

The sum ``Σ_k P_k`` grows with ``σ`` roughly as ``V·σ/(π·gap)`` (below its threshold a Cauchy keeps a tail mass
``scale/(π·gap)`` for every one of the V tokens), so sparse probabilities need a small ``σ``; docs/design.md
discusses what that means for causal mode.

Each step shows a progress bar on stderr (`causal_qwen.progress`): on a real base the calibration takes a minute or
more on a CPU. It runs on the model's device; everything is deterministic given ``seed``. The calibration text is the English prose of Python's own
reference documentation (``pydoc_data.topics``, in every CPython), the even-numbered topics; the odd-numbered
ones are kept for evaluation (`held_out_texts`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from .. import progress
from .angle_sums import EXACT_TOP, AngleSums
from .causal_temperature import calibrate_causal_temperature

logger = logging.getLogger(__name__)

CALIBRATIONS = ("base_agreement", "none")
QWEN25_TEXT_IDS = 151665  # ids below this are Qwen2.5's text and special tokens
DEFAULT_POSITIONS = 4096
WINDOW = 96
TOP_K = 32
LEVEL_CANDIDATES = 25  # quantiles of the top-1 logit tried as the level L
COARSE_LEVELS = 6  # of the feasible ones, tried with every decade of σ
COARSE_EXPONENTS = tuple(range(-7, 1))  # σ = 10^e, then refined by quarter decades around the best
MARGINS = (-2.0, 0.0, 2.0)  # m: the threshold sits m decision scales below the level (tried around the best σ)
SCALE_POSITIONS = 256
TEXT_CHARS = 4000  # each text's first characters: enough for two windows
MAX_PROB_SUM = 1.5
ABOVE_TOP = 64  # top logits per position kept to count those above a threshold
MAX_MEAN_ABOVE = 1.0  # logits above the level, on average over the calibration positions
NOISE_SHARE = 0.1  # of the individual's share s: the part in b_noise (the rest is scale_U)
INDIVIDUAL_SHARE = 1e-3  # ρ: the row-dependent share (|W| s)_k of every token's decision scale; γ_S holds the rest
TEMPERATURE_POSITIONS = 512  # of the calibration positions (spread evenly over them), for the causal temperature


@dataclass
class CalibrationReport:
    """What the calibration chose and what it measured on its own text.

    threshold_level: ``L``; margin: ``m``; scale: ``σ``; individual_share: ``ρ``, the row-dependent share of the
    decision scale; agreement: share of calibration positions where the standard decision equals the
    base's greedy token; prob_sum_mean: mean ``Σ_k P_k``; ovr_nll / softmax_nll: mean next-token NLL,
    OvR-normalised and softmax (on the scale-search positions). causal_temperature: ``τ`` (step 4);
    causal_cross_entropy / causal_softmax_entropy: the cross-entropy of causal choices against the softmax at ``τ``
    and the softmax entropy, nats per position over each position's top logits (`CausalTemperatureFit`);
    causal_seconds: the time step 4 took (part of ``seconds``).
    """

    positions: int
    threshold_level: float
    margin: float
    scale: float
    individual_share: float
    agreement: float
    prob_sum_mean: float
    ovr_nll: float
    softmax_nll: float
    seconds: float
    causal_temperature: float = 1.0
    causal_cross_entropy: float = math.nan
    causal_softmax_entropy: float = math.nan
    causal_seconds: float = 0.0

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
    """Backbone features ``z`` (N,H) float32 and next-token ids (N,), on the model's device, over windows of
    ``window`` tokens.

    Each text contributes its first two windows (so the positions come from many texts)."""
    device = model.model.embed_tokens.weight.device
    features, targets = [], []
    count = 0
    with progress.bar(total=max_positions, desc="calibration: reading text", unit="pos") as bar:
        for text in texts:
            encoded = tokenizer([text[:TEXT_CHARS]], return_tensors="pt")
            ids, values = encoded["input_ids"][0].to(device), encoded["numeric_values"][0].to(device)  # (T,)
            for start in range(0, min(len(ids) - 1, 2 * window), window):
                piece_ids = ids[start : start + window + 1]  # (w+1,)
                piece_values = values[start : start + window + 1]
                if len(piece_ids) < 8:
                    continue
                embeds = model.embed(piece_ids[None, :-1], piece_values[None, :-1].to(torch.float32))  # (1,w,H)
                z = model.model(inputs_embeds=embeds, use_cache=False).last_hidden_state[0]  # (w,H)
                features.append(z.float())
                targets.append(piece_ids[1:])
                bar.update(min(len(piece_ids) - 1, max_positions - count))
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

    generator = torch.Generator().manual_seed(seed)  # on the CPU: the same text on every device
    head = model.action.classification_head
    device = head.weight.device
    sequences = max(1, math.ceil(max_positions / length))
    ids = torch.randint(0, head.weight.shape[0], (sequences, 1), generator=generator).to(device)  # (B,1)
    cache = DynamicCache(config=model.config)
    features, tokens = [], [ids]
    for _ in progress.bar(range(length), desc="calibration: sampling text", unit="token"):
        z = model.model(inputs_embeds=model.embed(ids, None), cache=cache, use_cache=True).last_hidden_state[:, -1]  # (B,H)
        probs = torch.softmax(head(z).float(), dim=-1)  # (B,V) Qwen's next-token distribution
        ids = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)  # (B,1)
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
    for start in progress.bar(range(0, len(features), chunk), desc="calibration: top logits", unit="block"):
        logits = torch.nn.functional.linear(features[start : start + chunk], w, b)  # (n,V)
        top = logits.topk(k, dim=-1)
        values.append(top.values)
        ids.append(top.indices)
    return torch.cat(values), torch.cat(ids)


def relative_row_scales(weight: Tensor, top_ids: Tensor, block: int = 16384) -> tuple[Tensor, float]:
    """``ŝ_k = ‖W_k‖₁ / κ`` (V,) float32 and ``κ``, the mean of ``‖W_k‖₁`` over the tokens seen near the top."""
    parts = [weight[start : start + block].detach().abs().float().sum(dim=1) for start in range(0, weight.shape[0], block)]
    norms = torch.cat(parts)  # (V,) ‖W_k‖₁
    kappa = float(norms[top_ids.reshape(-1)].mean())
    return norms / kappa, kappa


def decision_scales(row_scales: Tensor, individual_share: float) -> Tensor:
    """``scale_k / σ = (1 − ρ) + ρ·ŝ_k`` (V,): the shared token noise plus the individual's row-dependent share."""
    return (1.0 - individual_share) + individual_share * row_scales


def standard_agreement(top_values: Tensor, top_ids: Tensor, scales: Tensor, level: float) -> float:
    """Share of positions where ``argmax_k (l_k − L)/scale_k`` over the top-K logits is the top logit."""
    z = (top_values - level) / scales[top_ids]  # (N,K)
    return float((z.argmax(dim=-1) == 0).float().mean())


def level_candidates(top_values: Tensor, max_mean_count: float = MAX_MEAN_ABOVE) -> list[float]:
    """Step 1's candidates for the level ``L``: quantiles of the top-1 logits that on average at most
    ``max_mean_count`` logits exceed (with a small ``σ``, ``Σ_k P_k`` is about that count), lowest first; the
    highest quantile when none qualifies."""
    quantiles = torch.linspace(0.02, 0.98, LEVEL_CANDIDATES)
    candidates = torch.quantile(top_values[:, 0].float().cpu(), quantiles).tolist()
    feasible = [level for level in candidates if float((top_values > level).sum(dim=1).float().mean()) <= max_mean_count]
    return feasible or candidates[-1:]


@torch.no_grad()
def ovr_figures(
    logits: Tensor, targets: Tensor, scales: Tensor, grid: list[tuple[float, float, float]],
    max_prob_sum: float = math.inf, advance: Callable[[int], object] | None = None,
) -> dict[str, Tensor]:
    """For each ``(L, σ, m)`` in ``grid``, with ``t = L − m·σ`` and ``scale_k = σ·r_k`` (``r = scales``, near 1):
    mean ``Σ_k P_k`` and mean OvR-normalised NLL ``−log(P_t / Σ_k P_k)``; plus the softmax NLL.

    At a fixed ``t`` the part of the sum over the tokens below it (``l_k < t``) grows with ``σ``, and the tokens
    above it add at most one each. So the settings of one ``t`` are taken in increasing ``σ``, and once one has a mean
    sum above ``max_prob_sum`` plus the mean count of logits above ``t``, every larger ``σ`` has a sum above
    ``max_prob_sum`` too and is not computed: both of its figures are ``inf``. The sums over the vocabulary come
    from `AngleSums` (each position's top logits exactly, the rest by a power series; angle_sums.py).
    ``advance(n)``: told of every setting done (computed or skipped), for a progress bar.
    logits (N,V), targets (N,), scales (V,)  →  (G,) tensors (float64, on the CPU) and a scalar."""
    logits = logits.float()
    target = targets[:, None]  # (N,1)
    prob_sum = torch.full((len(grid),), math.inf, dtype=torch.float64)
    ovr_nll = torch.full((len(grid),), math.inf, dtype=torch.float64)
    by_threshold: dict[float, list[tuple[float, int]]] = {}  # t → [(σ, grid index)]
    for g, (level, sigma, margin) in enumerate(grid):
        by_threshold.setdefault(level - margin * sigma, []).append((sigma, g))
    top = logits.topk(min(max(EXACT_TOP + 1, ABOVE_TOP), logits.shape[-1]), dim=-1)  # (N,K') descending
    count_above = _AboveCounter(logits, top.values)
    angle_sums = AngleSums(logits, scales, (top.values, top.indices))
    target_logits = logits.gather(1, target)[:, 0]  # (N,)
    target_scales = scales[targets]  # (N,)
    for threshold, members in by_threshold.items():
        mean_above = count_above(threshold)
        done = 0
        for sigma, g in sorted(members):
            level, _, margin = grid[g]
            # π·P_k with no cancellation; every P_k ≥ σ·r_k/(π·(t − l_k)) stays far above float32's smallest normal.
            total = angle_sums(level, sigma, margin) / math.pi  # (N,) Σ_k P_k
            target_p = torch.atan2(sigma * target_scales, threshold - target_logits).double() / math.pi  # (N,) P_t
            prob_sum[g] = float(total.mean())
            ovr_nll[g] = float((total.log() - target_p.log()).mean())
            done += 1
            if advance is not None:
                advance(1)
            if prob_sum[g] - mean_above > max_prob_sum:
                break
        if advance is not None and done < len(members):
            advance(len(members) - done)  # the larger σ of this threshold, skipped
    softmax_nll = (logits.logsumexp(-1) - logits.gather(1, target)[:, 0]).double().mean().cpu()
    return {"prob_sum": prob_sum, "ovr_nll": ovr_nll, "softmax_nll": softmax_nll}


class _AboveCounter:
    """Mean over positions of the number of logits at or above a threshold, read from each position's top
    `ABOVE_TOP` logits (counting over (N,V) booleans is several times slower than an atan2 over them); over
    the whole row only when some position has all of its top logits above."""

    def __init__(self, logits: Tensor, top_values: Tensor | None = None) -> None:
        self.logits = logits  # (N,V)
        if top_values is None:
            top_values = logits.topk(min(ABOVE_TOP, logits.shape[-1]), dim=-1).values
        self.top = top_values  # (N,K) descending

    def __call__(self, threshold: float) -> float:
        counts = (self.top >= threshold).sum(dim=-1)  # (N,)
        if self.top.shape[-1] < self.logits.shape[-1] and bool((counts == self.top.shape[-1]).any()):
            counts = (self.logits >= threshold).sum(dim=-1)
        return float(counts.double().mean())


def choose_scale(prob_sum: Tensor, ovr_nll: Tensor, max_prob_sum: float) -> int:
    """Index of the setting with the lowest OvR-normalised NLL among those with mean ``Σ P ≤ max_prob_sum``
    (the smallest sum's when none qualifies)."""
    allowed = prob_sum <= max_prob_sum
    if not bool(allowed.any()):
        return int(torch.argmin(prob_sum))
    masked = torch.where(allowed, ovr_nll, torch.full_like(ovr_nll, math.inf))
    return int(torch.argmin(masked))


def search_decision(
    features: Tensor, targets: Tensor, head, scales: Tensor, levels: list[float]
) -> tuple[tuple[float, float, float], dict, int]:
    """Step 2: ``(L, σ, m)`` by `choose_scale`: up to `COARSE_LEVELS` of the candidate ``levels`` (spread evenly, the
    lowest included) with whole decades of ``σ`` at ``m = 0``; then the best level and its neighbours among the
    candidates, with quarter decades around the best ``σ`` and each of `MARGINS`."""
    logits = F.linear(features, head.weight.detach().float(), None if head.bias is None else head.bias.detach().float())
    picks = sorted({round(i * (len(levels) - 1) / max(COARSE_LEVELS - 1, 1)) for i in range(COARSE_LEVELS)})
    coarse = [(i, 10.0**e) for i in picks for e in COARSE_EXPONENTS]
    fine_steps = range(-3, 4)  # quarter decades around the coarse σ
    at_most = len(coarse) + 3 * len(fine_steps) * len(MARGINS)
    with progress.bar(total=at_most, desc="calibration: level and scale", unit="setting") as bar:
        figures = ovr_figures(logits, targets, scales, [(levels[i], sigma, 0.0) for i, sigma in coarse], MAX_PROB_SUM,
                              advance=bar.update)
        index, sigma = coarse[choose_scale(figures["prob_sum"], figures["ovr_nll"], MAX_PROB_SUM)]
        near = levels[max(index - 1, 0) : index + 2]
        fine = [(level, sigma * 10.0 ** (q / 4), margin) for level in near for q in fine_steps for margin in MARGINS]
        bar.total = len(coarse) + len(fine)
        figures = ovr_figures(logits, targets, scales, fine, MAX_PROB_SUM, advance=bar.update)
    best = choose_scale(figures["prob_sum"], figures["ovr_nll"], MAX_PROB_SUM)
    return fine[best], figures, best


_MEMO: dict[tuple, tuple[Tensor, Tensor, Tensor, CalibrationReport]] = {}


def calibrate(model, tokenizer=None, *, positions: int = DEFAULT_POSITIONS, seed: int = 0, memo_key: tuple | None = None) -> CalibrationReport:
    """Set the thresholds, ``b_scale``/``W_scale``, ``b_noise``, the token noise ``γ_S`` and
    ``config.causal_temperature`` of a freshly converted ``model`` (see the module docstring); ``loc_S`` is
    untouched. ``tokenizer``: a `NumericTokenizer` for the base's vocabulary (the offline Qwen2.5 one by default).
    ``memo_key``: reuse an earlier result for the same base (and the same tokenizer, settings and seed) within this
    process."""
    started = time.perf_counter()
    config = model.config
    head = model.action.classification_head
    if memo_key is not None:
        memo_key = (memo_key, tuple(head.weight.shape), config.ovr_threshold_kind, positions, seed,
                    tokenizer_fingerprint(tokenizer))
    if memo_key is not None and memo_key in _MEMO:
        thresholds, component_scales, token_noise, report = _MEMO[memo_key]
        apply_calibration(model, thresholds, component_scales, token_noise)
    else:
        thresholds, component_scales, token_noise, report, features = _fit(model, tokenizer, positions, seed)
        apply_calibration(model, thresholds, component_scales, token_noise)
        fit_causal_temperature(model, features, report, seed)
        if memo_key is not None:
            _MEMO[memo_key] = (thresholds, component_scales, token_noise, report)
    model.config.causal_temperature = report.causal_temperature
    report.seconds = time.perf_counter() - started
    logger.info("OvR calibration: %s", report.to_dict())
    return report


def tokenizer_fingerprint(tokenizer) -> str:
    """What identifies the calibration's tokenizer in a memo key: a hash of its whole vocabulary and rules
    (``"default"`` for none: the offline Qwen2.5 one or text the base samples)."""
    if tokenizer is None:
        return "default"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.blake2b(f"{text}|{getattr(tokenizer, 'num_token_id', None)}".encode(), digest_size=16).hexdigest()


def fit_causal_temperature(model, features: Tensor, report: CalibrationReport, seed: int) -> None:
    """Step 4: ``τ`` of the calibrated ``model`` on `TEMPERATURE_POSITIONS` of the calibration ``features`` (N,H),
    written into ``report`` (the caller writes it into the config)."""
    fit = calibrate_causal_temperature(model, features, positions=TEMPERATURE_POSITIONS, seed=seed)
    report.causal_temperature = fit.temperature
    report.causal_cross_entropy = fit.cross_entropy
    report.causal_softmax_entropy = fit.softmax_entropy
    report.causal_seconds = fit.seconds
    logger.info(
        "causal temperature %.6g (%.3g τ₀): cross-entropy of causal choices %.4f nats against the softmax entropy %.4f"
        " (top %d logits, %.3f of the mass outside them; %d positions × %d draws, %.1f s)",
        fit.temperature, fit.temperature / fit.unit if math.isfinite(fit.unit) else 0.0, fit.cross_entropy,
        fit.softmax_entropy, fit.top, fit.outside_mass, fit.positions, fit.draws, fit.seconds,
    )


def _fit(model, tokenizer, positions: int, seed: int) -> tuple[Tensor, Tensor, Tensor, CalibrationReport, Tensor]:
    """Steps 1-3 of the module docstring: thresholds () or (V,), component scales ``s`` (C,), ``γ_S`` (), the report,
    and the calibration features (N,H) for step 4."""
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
    row_scales, kappa = relative_row_scales(head.weight, ids)  # (V,) ŝ_k, κ
    scales = decision_scales(row_scales, INDIVIDUAL_SHARE)  # (V,) scale_k / σ
    subset = slice(0, min(SCALE_POSITIONS, len(features)))
    (level, sigma, margin), figures, best = search_decision(
        features[subset], targets[subset], head, scales, level_candidates(values)
    )
    threshold = torch.tensor(level - margin * sigma)  # () t = L − m σ
    thresholds = threshold.expand(vocab_size).clone() if model.config.ovr_threshold_kind == "per_token" else threshold
    component_scales = torch.full((head.weight.shape[1],), INDIVIDUAL_SHARE * sigma / kappa)  # (C,): (|W| s)_k = ρ σ ŝ_k
    token_noise = torch.tensor((1.0 - INDIVIDUAL_SHARE) * sigma)  # () γ_S
    report = CalibrationReport(
        positions=len(features),
        threshold_level=level,
        margin=margin,
        scale=sigma,
        individual_share=INDIVIDUAL_SHARE,
        agreement=standard_agreement(values, ids, scales, float(threshold)),
        prob_sum_mean=float(figures["prob_sum"][best]),
        ovr_nll=float(figures["ovr_nll"][best]),
        softmax_nll=float(figures["softmax_nll"]),
        seconds=0.0,
    )
    return thresholds, component_scales, token_noise, report, features


@torch.no_grad()
def apply_calibration(
    model, thresholds: Tensor, component_scales: Tensor, token_noise: Tensor, noise_share: float = NOISE_SHARE
) -> None:
    """Write thresholds (V,) or (), the component scales ``s_c`` (C,) and ``γ_S`` () into ``model``: ``W_scale = 0``,
    ``scale_U = (1 − noise_share)·s`` through ``b_scale``, ``|b_noise| = noise_share·s``, ``token_noise = γ_S``."""
    target = model.ovr_thresholds.values
    target.copy_(thresholds.to(target.dtype).expand_as(target))
    scale_U = (1.0 - noise_share) * component_scales.double()  # (C,)
    model.abduction.scale_net.weight.zero_()
    bias = scale_U + torch.log(-torch.expm1(-scale_U))  # softplus⁻¹, exact for small and large values
    model.abduction.scale_net.bias.copy_(bias.to(model.abduction.scale_net.bias.dtype))
    model.action.b_noise.copy_((noise_share * component_scales).to(model.action.b_noise.dtype))
    model.action.token_noise.copy_(token_noise.to(model.action.token_noise.dtype))
    model.config.initial_scale = float(scale_U.mean())
    model.config.noise_init = float(noise_share * component_scales.mean())
    model.config.token_noise_init = float(token_noise)
    model.config.ovr_threshold = float(thresholds.float().mean())
