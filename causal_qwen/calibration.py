"""Calibration of the One-vs-Rest decision at conversion: thresholds and scales from the base's own logits.

Shape legend: N calibration positions, K top logits kept per position, H hidden size, C causal size,
V vocabulary rows.

At conversion ``loc_S`` equals Qwen's logits ``l`` and stays so; what decides the OvR probabilities

    P_k = P(S_k > C_k) = atan2(scale_k, −(l_k − C_k)) / π,      scale_k = Σ_c |W_kc| s_c,   s = scale_U + |b_noise|

are the thresholds ``C_k`` and the decision scale ``s``. With the seeds' literal values (``s = 10 + 0.1``,
``C = 100``) every ``P_k`` on real weights is about 0.3 (docs/design.md, "Calibration at conversion"). The
calibration sets them from the base's logits on a fixed calibration text, in three closed steps:

1. **Scale profile** uniform: ``s_c = σ`` for every component, so ``scale_k = σ·n_k`` with ``n_k = ‖W_k‖₁``.
   Then the standard decision ``argmax_k (l_k − C_k)/(σ n_k)`` does not depend on ``σ``.
2. **Thresholds** ``C_k = C₀ + δ_k``. ``C₀`` is the lowest level at which, on average over the calibration
   positions, at most one token's logit lies above it (so ``Σ_k P_k`` can be near 1). The per-token offsets
   ``δ_k`` are fitted so that the standard decision agrees with the base's greedy token: a hinge loss
   ``Σ_j max(0, z_j − z_top + margin)`` over the top-K logits of each position, ``z_k = (l_k − C_k)/n_k``,
   with an L2 pull of ``δ`` towards 0 (tokens never seen near the top keep ``C₀``).
3. **Scale** ``σ``: the value on a log grid that minimises the OvR-normalised negative log-likelihood
   ``−log(P_t / Σ_k P_k)`` of the calibration text's next tokens, among the values whose mean ``Σ_k P_k`` stays
   at most ``max_prob_sum``. ``σ`` is split as ``scale_U = (1 − noise_share)·σ`` (through ``b_scale``, with
   ``W_scale = 0``) and ``|b_noise| = noise_share·σ``.

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

from . import cauchy

logger = logging.getLogger(__name__)

CALIBRATIONS = ("base_agreement", "none")
QWEN25_TEXT_IDS = 151665  # ids below this are Qwen2.5's text and special tokens
DEFAULT_POSITIONS = 4096
WINDOW = 96
TOP_K = 32
HINGE_MARGIN = 0.02  # in units of the median top-2 logit gap
HINGE_STEPS = 300
HINGE_BATCH = 1024
OFFSET_WEIGHT = 1e-4
COARSE_EXPONENTS = tuple(range(-7, 2))  # σ = 10^e, then refined by quarter decades around the best
SCALE_POSITIONS = 256
TEXT_CHARS = 4000  # each text's first characters: enough for two windows
MAX_PROB_SUM = 1.5
NOISE_SHARE = 0.1


@dataclass
class CalibrationReport:
    """What the calibration chose and what it measured on its own text.

    threshold_base: ``C₀``; threshold_offset_std: spread of the fitted ``δ_k``; scale: ``σ``;
    agreement: share of positions where the standard decision equals the base's greedy token;
    prob_sum_mean: mean ``Σ_k P_k``; ovr_nll / softmax_nll: mean next-token NLL, OvR-normalised and softmax.
    """

    positions: int
    threshold_base: float
    threshold_offset_std: float
    scale: float
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


def row_scale(weight: Tensor) -> Tensor:
    """``n_k = ‖W_k‖₁ / mean_k ‖W_k‖₁`` (V,) float32: the relative decision scale of each row under a uniform profile."""
    norms = weight.detach().abs().sum(dim=1, dtype=torch.float64)  # (V,)
    return (norms / norms.mean()).float().clamp_min(torch.finfo(torch.float32).tiny)


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


def base_threshold(top_values: Tensor, max_mean_count: float = 1.0) -> float:
    """``C₀``: the lowest value such that on average at most ``max_mean_count`` of the top logits exceed it."""
    candidates = torch.sort(top_values[:, 0]).values  # (N,) sorted top-1 logits
    for level in candidates.tolist():
        if (top_values > level).sum(dim=1).float().mean().item() <= max_mean_count:
            return float(level)
    return float(candidates[-1])


def fit_threshold_offsets(
    top_values: Tensor, top_ids: Tensor, scale_rows: Tensor, base: float, vocab_size: int, seed: int
) -> Tensor:
    """Per-token offsets ``δ`` (V,) so that ``argmax_k (l_k − C₀ − δ_k)/n_k`` picks the top logit.

    Minimises ``mean_i Σ_j max(0, z_ij − z_i,top + margin) + w·‖δ‖²`` over the top-K of each position
    (Adam, fixed batches drawn with ``seed``). Logits, margin and offsets are measured in units of the median
    gap between the two largest logits, so the fit behaves alike for any spread of logits."""
    unit = float((top_values[:, 0] - top_values[:, 1]).median().clamp_min(torch.finfo(torch.float32).eps))
    top_values = (top_values - base) / unit  # (N,K) in gap units, relative to C₀
    base = 0.0
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(vocab_size, requires_grad=True)
    optimizer = torch.optim.Adam([offsets], lr=0.05)
    positions = len(top_values)
    with torch.enable_grad():
        for _ in range(HINGE_STEPS):
            rows = torch.randint(0, positions, (min(HINGE_BATCH, positions),), generator=generator)  # (b,)
            ids = top_ids[rows]  # (b,K)
            z = (top_values[rows] - base - offsets[ids]) / scale_rows[ids]  # (b,K)
            hinge = torch.relu(z[:, 1:] - z[:, :1] + HINGE_MARGIN).sum(dim=1).mean()
            loss = hinge + OFFSET_WEIGHT * offsets.square().sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return offsets.detach() * unit


@torch.no_grad()
def ovr_figures(
    features: Tensor,
    targets: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    thresholds: Tensor,
    scale_rows: Tensor,
    scales: tuple[float, ...],
    chunk: int = 128,
) -> dict[str, Tensor]:
    """For each ``σ`` in ``scales``: mean ``Σ_k P_k`` and mean OvR-normalised NLL; plus softmax NLL and agreement.

    features (N,H), targets (N,), thresholds (V,) or (), scale_rows (V,).  Returns tensors of shape (len(scales),)
    for ``prob_sum`` and ``ovr_nll``, scalars for ``softmax_nll`` and ``agreement``."""
    w = weight.detach().float()
    b = None if bias is None else bias.detach().float()
    sigma = torch.tensor(scales, dtype=torch.float32)  # (G,)
    prob_sum = torch.zeros(len(scales), dtype=torch.float64)
    ovr_nll = torch.zeros(len(scales), dtype=torch.float64)
    softmax_nll = 0.0
    agree = 0
    for start in range(0, len(features), chunk):
        logits = torch.nn.functional.linear(features[start : start + chunk], w, b)  # (n,V)
        target = targets[start : start + chunk, None]  # (n,1)
        distance = logits - thresholds  # (n,V)
        softmax_nll += (logits.logsumexp(-1) - logits.gather(1, target)[:, 0]).double().sum().item()
        agree += int(((distance / scale_rows).argmax(-1) == logits.argmax(-1)).sum())  # argmax of P_k (σ cancels)
        for g, s in enumerate(sigma.tolist()):
            log_p = torch.log(torch.atan2(s * scale_rows, -distance) / math.pi)  # (n,V) log P_k (atan2: no cancellation)
            total = torch.logsumexp(log_p, dim=-1)  # (n,) log Σ_k P_k
            prob_sum[g] += total.double().exp().sum()
            ovr_nll[g] += (total - log_p.gather(1, target)[:, 0]).double().sum()
    n = len(features)
    return {
        "prob_sum": prob_sum / n,
        "ovr_nll": ovr_nll / n,
        "softmax_nll": torch.tensor(softmax_nll / n),
        "agreement": torch.tensor(agree / n),
    }


def choose_scale(prob_sum: Tensor, ovr_nll: Tensor, max_prob_sum: float) -> int:
    """Index of the scale with the lowest OvR-normalised NLL among those with mean ``Σ P ≤ max_prob_sum``
    (the smallest scale's when none qualifies)."""
    allowed = prob_sum <= max_prob_sum
    if not bool(allowed.any()):
        return int(torch.argmin(prob_sum))
    masked = torch.where(allowed, ovr_nll, torch.full_like(ovr_nll, math.inf))
    return int(torch.argmin(masked))


def search_scale(features: Tensor, targets: Tensor, head, thresholds: Tensor, scale_rows: Tensor) -> tuple[float, dict, int]:
    """``σ`` by `choose_scale` over whole decades, then over quarter decades around the best decade."""
    coarse = tuple(10.0**e for e in COARSE_EXPONENTS)
    figures = ovr_figures(features, targets, head.weight, head.bias, thresholds, scale_rows, coarse)
    centre = math.log10(coarse[choose_scale(figures["prob_sum"], figures["ovr_nll"], MAX_PROB_SUM)])
    fine = tuple(10.0 ** (centre + q / 4) for q in range(-3, 4))
    figures = ovr_figures(features, targets, head.weight, head.bias, thresholds, scale_rows, fine)
    best = choose_scale(figures["prob_sum"], figures["ovr_nll"], MAX_PROB_SUM)
    return fine[best], figures, best


_MEMO: dict[tuple, tuple[Tensor, float, CalibrationReport]] = {}


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
        thresholds, sigma, report = _MEMO[memo_key]
    else:
        vocab_size = head.weight.shape[0]
        if tokenizer is None and vocab_size > QWEN25_TEXT_IDS:
            from .tokenizer import NumericTokenizer

            tokenizer = NumericTokenizer.default()
        if tokenizer is not None and _tokenizer_fits(tokenizer, vocab_size):
            features, targets = collect_features(model, tokenizer, calibration_texts(), positions)
        else:
            logger.info("no tokenizer for this %d-row vocabulary: calibrating on text the base samples itself", vocab_size)
            features, targets = sampled_features(model, positions, seed)
        scale_rows = row_scale(head.weight)
        values, ids = top_logits(features, head.weight, head.bias, TOP_K)
        base = base_threshold(values)
        if config.ovr_threshold_kind == "per_token":
            offsets = fit_threshold_offsets(values, ids, scale_rows, base, head.weight.shape[0], seed)
            thresholds = base + offsets  # (V,)
        else:
            offsets = torch.zeros(())
            thresholds = torch.tensor(base)
        subset = slice(0, min(SCALE_POSITIONS, len(features)))
        sigma, figures, best = search_scale(features[subset], targets[subset], head, thresholds, scale_rows)
        report = CalibrationReport(
            positions=len(features),
            threshold_base=base,
            threshold_offset_std=float(offsets.float().std()) if offsets.numel() > 1 else 0.0,
            scale=sigma,
            agreement=float(figures["agreement"]),
            prob_sum_mean=float(figures["prob_sum"][best]),
            ovr_nll=float(figures["ovr_nll"][best]),
            softmax_nll=float(figures["softmax_nll"]),
            seconds=0.0,
        )
        if memo_key is not None:
            _MEMO[memo_key] = (thresholds, sigma, report)
    apply_calibration(model, thresholds, sigma / float(row_scale_mean(head.weight)))
    report.seconds = time.perf_counter() - started
    logger.info("OvR calibration: %s", report.to_dict())
    return report


def row_scale_mean(weight: Tensor) -> Tensor:
    """``mean_k ‖W_k‖₁``: converts ``σ`` (in units of the mean row) into the per-component scale ``s_c``."""
    return weight.detach().abs().sum(dim=1, dtype=torch.float64).mean()


@torch.no_grad()
def apply_calibration(model, thresholds: Tensor, component_scale: float, noise_share: float = NOISE_SHARE) -> None:
    """Write thresholds (V,) or () and a uniform decision scale ``s_c = component_scale`` into ``model``."""
    thresholds_module = model.ovr_thresholds
    target = thresholds_module.values
    thresholds_module.values.copy_(thresholds.to(target.dtype).expand_as(target))
    scale_U = (1.0 - noise_share) * component_scale
    model.abduction.scale_net.weight.zero_()
    model.abduction.scale_net.bias.fill_(cauchy.inverse_softplus(scale_U))
    model.action.b_noise.fill_(noise_share * component_scale)
    model.config.initial_scale = float(scale_U)
    model.config.noise_init = float(noise_share * component_scale)
    model.config.ovr_threshold = float(thresholds.float().mean())
