"""Evaluation metrics: does the model predict tokens well, and does its number uncertainty mean something?

Shape legend: B batch, S sequence, C causal size, V vocabulary rows, N positions with a target,
M positions whose target is ``<NUM>``, n a chunk of positions.

Targets follow the training convention (docs/design.md, "Losses"): position i predicts ``labels[i+1]`` and, when that is
``<NUM>``, the value ``numeric_values[i+1]``. Padded positions and ``-100`` labels are skipped.

Language metrics, over the N target positions (each position weighs the same, as in Qwen's own loss):

    perplexity             = exp( mean_i −log softmax(loc_S_i)[t_i] )
    token_accuracy_softmax = mean_i [argmax_k loc_S_ik = t_i]                       (traditional decision)
    token_accuracy_ovr     = mean_i [argmax_k P_ik = t_i],  P_ik = P(S_ik > C_k)     (standard decision)
    ovr_target_prob        = mean_i P_{i,t_i}
    ovr_prob_sum           = mean_i Σ_k P_ik

Number metrics, over the M positions whose target is ``<NUM>`` with value y (a Cauchy has no mean, so the
point prediction is the median ``loc_Y``); the formulas live in `causal_qwen.evaluation.metrics`:

    num_mdae      = median_absolute_error(y, loc_Y)
    num_mape      = mean_absolute_percentage_error(y, loc_Y)           (over the y ≠ 0)
    num_nll       = log_score(log(π·scale_Y) + log1p(((y − loc_Y)/scale_Y)²))
    num_log_score = num_nll  (the log score: mean negative log density of the true value, nats; lower is better)
    coverage_p    = coverage(y, loc_Y ± scale_Y·tan(π·p/2))            (central p-interval)
    coverage_p_p_value = coverage_p_value(M·coverage_p, M, p)          (exact two-sided binomial test: how rarely
                    calibrated intervals show a coverage so far from p on M numbers; NaN without numbers)
    num_scale_error_spearman = spearman(scale_Y, |y − loc_Y|)  (does a wider interval mean a larger error? NaN
                    when every scale is equal)
    num_tail_ratio = tail_ratio(z), z = |y − loc_Y| / scale_Y  (interval shape: 6.31 for Cauchy-shaped errors)

The probability integral transform ``PIT_j = F_j(y_j) = ½ + atan((y_j − loc_Y_j)/scale_Y_j)/π`` is uniform on
[0, 1] for a calibrated model (`NumberPredictions.pit`; the plots draw its histogram).

Calibration uses the *central rank* ``r_j = (2/π)·|atan((y_j − loc_Y_j)/scale_Y_j)|`` = ``|2F(y_j) − 1|``:
``y_j`` lies in the central p-interval iff ``r_j ≤ p``, so for a calibrated model ``r`` is uniform on [0, 1]
and the empirical coverage at every nominal level p equals p.

Bits per byte of the raw text (`text_bits`, `qwen_text_bits`): one likelihood for two ways of reading
numbers. Each text is scored as it is trained, on its own (a training document has no context token before
it): token i+1 from position i of the text itself, and the first token, which no position of the text
predicts, from the model's prediction after a lone ``<|endoftext|>`` (the same for every text), so every token
is predicted:

    bits_per_byte = Σ_texts Σ_tokens −log2 p(token) / Σ_texts (UTF-8 bytes of the text)

CausalQwen: a text token's p is softmax(loc_S)[token] (``token_probability="softmax"``; or the OvR
probabilities normalised over the vocabulary, ``"ovr"``: P_k/Σ_j P_j). A number written as the string s with
value v is one ``<NUM>`` token, and its p is ``p(<NUM>) · P(v − h ≤ Y ≤ v + h)`` with ``Y ~ Cauchy(loc_Y,
scale_Y)`` and h half a unit of the last digit written (``12.8`` → 0.05, ``1,200`` → 0.5, ``3e5`` → 5e4): the
probability of every value that is written as that same string. Qwen: the product of its own tokens'
softmax probabilities (the digits of a number are ordinary tokens). No end-of-text token is scored.

The vocabulary-wide scores are built from ``loc_U``/``scale_U`` for a chunk of target positions at a time,
so at most (n, V) floats exist at once — never (B, S, V).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch
from torch import Tensor

from ..core import cauchy, losses
from ..core.decisions import causal_scores, constant_scale
from ..core.files import finite_or_none
from ..core.row_blocks import row_blocks
from ..progress import bar as progress_bar
from .metrics import (
    CALIBRATION_LEVELS,
    calibration_table,
    check_level,
    coverage,
    coverage_p_value,
    log_score,
    mean_absolute_percentage_error,
    median_absolute_error,
    spearman,
    tail_ratio,
)

logger = logging.getLogger(__name__)

METRIC_SETS = ("auto", "all", "language", "numbers")
# Floats per (n, V) work tensor: 2**24 fp32 = 64 MiB; a chunk holds a handful of them.
SCORE_ELEMENTS_PER_CHUNK = 1 << 24


# ---------------------------------------------------------------------------------------------------------
# Per-number predictions
# ---------------------------------------------------------------------------------------------------------
@dataclass
class NumberPredictions:
    """The regression head's prediction at every ``<NUM>`` target (M of them).

    value, loc, scale: (M,) float64 — the true value, the Cauchy median ``loc_Y`` and scale ``scale_Y``.
    document: (M,) long — index of the document (in evaluation order); position: (M,) long — the position i
    that predicts the number (the number itself sits at i+1); ordinal: (M,) long — 0 for the first number of
    its document; from_end: (M,) long — 0 for the last number of its document.
    loc_U, scale_U: (M,C) the individual representation at those positions, kept only when asked for.
    """

    value: Tensor
    loc: Tensor
    scale: Tensor
    document: Tensor
    position: Tensor
    ordinal: Tensor
    from_end: Tensor
    loc_U: Tensor | None = None
    scale_U: Tensor | None = None

    FIELDS = ("value", "loc", "scale", "document", "position", "ordinal", "from_end", "loc_U", "scale_U")

    @classmethod
    def empty(cls) -> "NumberPredictions":
        floats = torch.zeros(0, dtype=torch.float64)
        longs = torch.zeros(0, dtype=torch.long)
        return cls(floats, floats, floats, longs, longs, longs, longs)

    @classmethod
    def concatenate(cls, parts: list["NumberPredictions"]) -> "NumberPredictions":
        if not parts:
            return cls.empty()
        joined = {}
        for name in cls.FIELDS:
            pieces = [getattr(part, name) for part in parts]
            joined[name] = None if any(piece is None for piece in pieces) else torch.cat(pieces)
        return cls(**joined)

    def __len__(self) -> int:
        return int(self.value.numel())

    def select(self, number_index: int | None) -> "NumberPredictions":
        """Keep the ``number_index``-th number of each document (``-1`` the last, ``-2`` the one before, …);
        ``None`` keeps all."""
        if number_index is None:
            return self
        if not isinstance(number_index, int) or isinstance(number_index, bool):
            raise TypeError(f"number_index must be an int or None, got {type(number_index).__name__}")
        keep = self.ordinal == number_index if number_index >= 0 else self.from_end == -number_index - 1  # (M,)
        return self.subset(keep)

    def subset(self, keep: Tensor) -> "NumberPredictions":
        """The numbers where ``keep`` (a boolean mask or index tensor) selects."""
        return NumberPredictions(
            **{name: None if getattr(self, name) is None else getattr(self, name)[keep] for name in self.FIELDS}
        )

    def central_rank(self) -> Tensor:
        """``r = (2/π)·|atan((y − loc)/scale)|`` (M,): y is inside the central p-interval iff ``r ≤ p``."""
        return (2.0 / math.pi) * torch.atan((self.value - self.loc).abs() / self.scale)

    def pit(self) -> Tensor:
        """The probability integral transform ``F(y) = ½ + atan((y − loc)/scale)/π`` (M,)."""
        return 0.5 + torch.atan((self.value - self.loc) / self.scale) / math.pi

    def standardized_error(self) -> Tensor:
        """``z = |y − loc| / scale`` (M,): y is inside the central p-interval iff ``z ≤ tan(π·p/2)``."""
        return (self.value - self.loc).abs() / self.scale

    def interval(self, coverage: float) -> tuple[Tensor, Tensor]:
        """Central ``coverage`` interval ``loc ± scale·tan(π·coverage/2)``: (M,), (M,)."""
        return cauchy.central_interval(self.loc, self.scale, coverage)

    def coverage(self, level: float) -> float:
        """Fraction of the true values inside their central ``level`` interval (`metrics.coverage`)."""
        check_level(level)
        return coverage(self.value, *self.interval(level))


def number_metrics(predictions: NumberPredictions, levels: Iterable[float] = CALIBRATION_LEVELS) -> dict[str, Any]:
    """The number metrics of the module docstring for ``predictions`` (NaN when there are none), each formula
    from `causal_qwen.evaluation.metrics`."""
    levels = tuple(levels)
    count = len(predictions)
    mape, mape_count = mean_absolute_percentage_error(predictions.value, predictions.loc)
    score = log_score(cauchy.nll(predictions.value, predictions.loc, predictions.scale))  # mean over (M,)
    return {
        "num_count": count,
        "num_mdae": median_absolute_error(predictions.value, predictions.loc),
        "num_mape": mape,
        "num_mape_count": mape_count,
        "num_nll": score,
        "num_log_score": score,
        "num_scale_error_spearman": spearman(predictions.scale, (predictions.value - predictions.loc).abs()),
        "num_median_scale": float(predictions.scale.quantile(0.5)) if count else float("nan"),
        "coverage_50": predictions.coverage(0.5),
        "coverage_90": predictions.coverage(0.9),
        **{f"coverage_{round(100 * level)}_p_value": _coverage_p_value(predictions, level) for level in (0.5, 0.9)},
        "num_tail_ratio": tail_ratio(predictions.standardized_error()),
        "calibration": calibration_table(predictions.coverage, levels) if count else [],
    }


def _coverage_p_value(predictions: NumberPredictions, level: float) -> float:
    """`metrics.coverage_p_value` of the central ``level`` intervals' coverage (NaN without predictions)."""
    count = len(predictions)
    if count == 0:
        return float("nan")
    return coverage_p_value(round(predictions.coverage(level) * count), count, level)


# ---------------------------------------------------------------------------------------------------------
# Accumulating over batches
# ---------------------------------------------------------------------------------------------------------
@dataclass
class TokenTotals:
    """Running sums of the language metrics over target positions."""

    count: int = 0
    nll_sum: float = 0.0
    correct_softmax: int = 0
    correct_ovr: int = 0
    target_prob_sum: float = 0.0
    prob_sum_sum: float = 0.0
    ovr_nll_sum: float = 0.0
    standard_agree: int = 0
    causal_agree: int = 0

    def add(self, other: "TokenTotals") -> None:
        self.count += other.count
        self.nll_sum += other.nll_sum
        self.correct_softmax += other.correct_softmax
        self.correct_ovr += other.correct_ovr
        self.target_prob_sum += other.target_prob_sum
        self.prob_sum_sum += other.prob_sum_sum
        self.ovr_nll_sum += other.ovr_nll_sum
        self.standard_agree += other.standard_agree
        self.causal_agree += other.causal_agree

    def metrics(self) -> dict[str, Any]:
        if self.count == 0:
            nan = float("nan")
            return dict(token_count=0, perplexity=nan, nll=nan, token_accuracy_softmax=nan, token_accuracy_ovr=nan,
                        ovr_target_prob=nan, ovr_prob_sum=nan, ovr_perplexity=nan, ovr_ppl_ratio=nan,
                        standard_agreement=nan, causal_agreement=nan)
        mean_nll = self.nll_sum / self.count
        mean_ovr_nll = self.ovr_nll_sum / self.count
        return {
            "token_count": self.count,
            "nll": mean_nll,
            "perplexity": math.exp(mean_nll) if mean_nll < 700 else float("inf"),
            "token_accuracy_softmax": self.correct_softmax / self.count,
            "token_accuracy_ovr": self.correct_ovr / self.count,
            "ovr_target_prob": self.target_prob_sum / self.count,
            "ovr_prob_sum": self.prob_sum_sum / self.count,
            "ovr_perplexity": _safe_exp(mean_ovr_nll),
            "ovr_ppl_ratio": _safe_exp(mean_ovr_nll - mean_nll),
            "standard_agreement": self.standard_agree / self.count,
            "causal_agreement": self.causal_agree / self.count,
        }


def _safe_exp(value: float) -> float:
    return math.exp(value) if value < 700 else float("inf")


@dataclass
class TargetNumbers:
    """The number each document's target field renders as. ordinal, value: (D,) — its index among the
    document's numbers and the field's value (`causal_qwen.training.data.Document.target_ordinal`)."""

    field: str
    ordinal: Tensor
    value: Tensor

    @classmethod
    def from_documents(cls, documents, target: str | None) -> "TargetNumbers | None":
        """From documents read with a ``target`` (None when there is none or a document lacks it)."""
        if target is None or not documents or any(doc.target_ordinal is None for doc in documents):
            return None
        ordinal = torch.tensor([doc.target_ordinal for doc in documents], dtype=torch.long)
        value = torch.tensor([doc.target_value for doc in documents], dtype=torch.float64)
        return cls(target, ordinal, value)


def select_target(numbers: NumberPredictions, target: TargetNumbers) -> NumberPredictions:
    """The predictions at each document's target number, checked against the field's value (``ValueError``
    when the template's text around the field splits or joins numbers, so the place is not the field's)."""
    keep = numbers.ordinal == target.ordinal[numbers.document]  # (M,)
    picked = numbers.subset(keep)
    expected = target.value[picked.document]  # (K,)
    wrong = ~torch.isclose(picked.value, expected, rtol=1e-9, atol=0.0)
    if bool(wrong.any()):
        first = int(wrong.nonzero()[0, 0])
        raise ValueError(
            f"document {int(picked.document[first])}: the number where target field '{target.field}' should be "
            f"is {float(picked.value[first]):g}, not the field's value {float(expected[first]):g} (the template's "
            "text around the field splits or joins numbers); pass --number-index or --all-numbers instead"
        )
    missing = target.ordinal.numel() - len(picked)
    if missing:
        logger.warning("%d of %d documents lost their target number '%s' to max_length", missing,
                       target.ordinal.numel(), target.field)
    return picked


@dataclass
class Evaluation:
    """What `evaluate_batches` found: the language totals and every number prediction (and, when the documents
    were read with a target field, where its number sits in each: ``target``)."""

    tokens: TokenTotals = field(default_factory=TokenTotals)
    numbers: NumberPredictions = field(default_factory=NumberPredictions.empty)
    documents: int = 0
    language: bool = True
    bits: "TextBits | None" = None
    target: TargetNumbers | None = None

    def metrics(
        self, number_index: int | None = None, levels: Iterable[float] = CALIBRATION_LEVELS, metric_set: str = "auto",
        all_numbers: bool = False,
    ) -> dict[str, Any]:
        """The flat metrics dictionary (JSON-ready). ``metric_set``: ``"language"``, ``"numbers"``, ``"all"``
        (both; the number part must exist) or ``"auto"`` (numbers only when there are some). Number metrics
        cover the ``number_index``-th number of each document when given (``ValueError`` when no document has
        one), else the target field's number when there is a ``target`` and not ``all_numbers``, else every
        number."""
        if metric_set not in METRIC_SETS:
            raise ValueError(f"metric set must be one of {METRIC_SETS}, got {metric_set!r}")
        result: dict[str, Any] = {"documents": self.documents}
        if metric_set in ("all", "language") and not self.language:
            raise ValueError("language metrics were asked for but this evaluation skipped them (language=False)")
        if metric_set in ("auto", "all", "language") and self.language:
            result.update(self.tokens.metrics())
            if self.bits is not None:
                result.update(self.bits.metrics())
        if metric_set != "language":
            selected = self.selected_numbers(number_index, all_numbers)
            if len(selected) == 0 and metric_set != "auto":
                where = "" if number_index is None else f" at number index {number_index}"
                raise ValueError(
                    f"number metrics were asked for but the data has no numbers{where} "
                    f"(no <NUM> targets among {self.tokens.count} target tokens)"
                )
            if len(selected):
                result.update(number_metrics(selected, levels))
                result["number_index"] = number_index
                if number_index is None and self.target is not None and not all_numbers:
                    result["number_target"] = self.target.field
        return result

    def selected_numbers(self, number_index: int | None = None, all_numbers: bool = False) -> NumberPredictions:
        """The numbers `metrics` scores (see there)."""
        if number_index is not None:
            selected = self.numbers.select(number_index)
            if len(selected) == 0:
                raise ValueError(self._index_out_of_range(number_index))
            return selected
        if self.target is not None and not all_numbers:
            return select_target(self.numbers, self.target)
        return self.numbers

    def _index_out_of_range(self, number_index: int) -> str:
        if len(self.numbers) == 0:
            return (f"--number-index {number_index}: the data has no numbers (no <NUM> targets among "
                    f"{self.tokens.count} target tokens)")
        most = int(self.numbers.ordinal.max()) + 1
        return (f"--number-index {number_index} is out of range: the documents hold at most {most} numbers each "
                f"(0..{most - 1} from the start, -1..-{most} from the end)")


# Figures that exist whenever their part was measured (tokens, bytes or numbers counted): one that is NaN or
# infinite means the model's outputs are not finite. Other figures may be undefined (the Spearman of equal
# scales, a MAPE without a non-zero value) and are then written as null.
FINITE_FIGURES = {
    "token_count": ("nll", "perplexity", "token_accuracy_softmax", "token_accuracy_ovr", "ovr_target_prob",
                    "ovr_prob_sum", "ovr_perplexity"),
    "text_bytes": ("bits_per_byte", "text_bits"),
    "num_count": ("num_mdae", "num_nll", "num_log_score", "num_median_scale", "coverage_50", "coverage_90"),
}


def checked_metrics(metrics: dict[str, Any], source: str = "the model") -> dict[str, Any]:
    """``metrics`` ready for strict JSON: ``ValueError`` naming the figures when one of `FINITE_FIGURES` is NaN
    or infinite (the outputs of ``source`` are not finite: damaged weights, a diverged run); any other
    non-finite figure (undefined) becomes None."""
    broken = [
        f"{key} {metrics[key]}"
        for count_key, keys in FINITE_FIGURES.items()
        if metrics.get(count_key)
        for key in keys
        if isinstance(metrics.get(key), float) and not math.isfinite(metrics[key])
    ]
    if broken:
        raise ValueError(f"{source} gives non-finite figures ({', '.join(broken)}): its outputs are NaN or "
                         "infinite (damaged weights, or a training run that diverged)")
    return {key: finite_or_none(value) for key, value in metrics.items()}


@torch.no_grad()
def evaluate_batches(
    model,
    batches: Iterable[dict[str, Tensor]],
    chunk_positions: int | None = None,
    keep_individuals: bool = False,
    language: bool = True,
    progress=None,
) -> Evaluation:
    """Run ``model`` over ``batches`` (dicts with ``input_ids``, ``numeric_values``, ``attention_mask`` and
    optionally ``labels``, all (B,S)) and accumulate every metric of the module docstring.

    ``chunk_positions``: target positions scored against the whole vocabulary at once (default: as many as
    fit in `SCORE_ELEMENTS_PER_CHUNK` floats). ``keep_individuals``: also keep ``loc_U``/``scale_U`` (M,C) at
    the positions that predict numbers. ``language=False`` skips the vocabulary-wide scores (only the number
    metrics are then available; far cheaper for a large vocabulary). ``progress``: optional callable taking
    the batch index.
    """
    was_training = model.training
    model.eval()
    evaluation = Evaluation(language=language)
    parts: list[NumberPredictions] = []
    try:
        with cauchy.reuse_abs_weights():  # |W_cls| is built once for all chunks of all batches
            for index, batch in enumerate(batches):
                totals, numbers, documents = _evaluate_batch(
                    model, batch, chunk_positions, evaluation.documents, keep_individuals, language
                )
                evaluation.tokens.add(totals)
                parts.append(numbers)
                evaluation.documents += documents
                if progress is not None:
                    progress(index)
    finally:
        model.train(was_training)
    evaluation.numbers = NumberPredictions.concatenate(parts)
    logger.info(
        "evaluated %d documents: %d target tokens, %d number targets",
        evaluation.documents, evaluation.tokens.count, len(evaluation.numbers),
    )
    return evaluation


def _evaluate_batch(
    model,
    batch: dict[str, Tensor],
    chunk_positions: int | None,
    document_offset: int,
    keep_individuals: bool,
    language: bool,
) -> tuple[TokenTotals, NumberPredictions, int]:
    input_ids, numeric_values, attention_mask, labels = _batch_tensors(model, batch)
    out = model(input_ids=input_ids, numeric_values=numeric_values, attention_mask=attention_mask, return_scores=False)
    targets = losses.shift_targets(labels, numeric_values, attention_mask)
    batch_size, length = input_ids.shape
    causal_size = out.loc_U.shape[-1]
    if language:
        loc_U = out.loc_U[:, :-1].reshape(-1, causal_size)[targets.positions]  # (N,C)
        scale_U = out.scale_U[:, :-1].reshape(-1, causal_size)[targets.positions]  # (N,C)
        totals = token_totals(model, loc_U, scale_U, targets.token_ids, chunk_positions)
    else:
        totals = TokenTotals(count=int(targets.positions.numel()))

    num_id = model.config.num_token_id
    valid = torch.zeros(batch_size * (length - 1), dtype=torch.bool, device=input_ids.device)
    valid[targets.positions] = True
    predicts_number, ordinal = losses.next_number_ordinals(labels, num_id)  # (B,S-1) each
    is_number = valid.view(batch_size, length - 1) & predicts_number  # (B,S-1)
    count = (labels == num_id).long().sum(dim=1, keepdim=True)  # (B,1) a first-token number counts too
    from_end = count - 1 - ordinal  # (B,S-1)
    rows, cols = is_number.nonzero(as_tuple=True)  # (M,), (M,)
    numbers = NumberPredictions(
        value=numeric_values[:, 1:][rows, cols].double().cpu(),
        loc=out.loc_Y[:, :-1][rows, cols].double().cpu(),
        scale=out.scale_Y[:, :-1][rows, cols].double().cpu(),
        document=(rows + document_offset).cpu(),
        position=cols.cpu(),
        ordinal=ordinal[rows, cols].cpu(),
        from_end=from_end[rows, cols].cpu(),
    )
    if keep_individuals:
        numbers.loc_U = out.loc_U[:, :-1][rows, cols].float().cpu()  # (M,C)
        numbers.scale_U = out.scale_U[:, :-1][rows, cols].float().cpu()  # (M,C)
    return totals, numbers, batch_size


def _batch_tensors(model, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``input_ids, numeric_values, attention_mask, labels`` on the model's device; labels default to
    ``input_ids`` with ``-100`` at padding."""
    if not isinstance(batch, dict) or "input_ids" not in batch:
        raise ValueError("each batch must be a dict with at least 'input_ids'")
    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be (B, S) with S >= 2, got {tuple(input_ids.shape)}")
    numeric_values = batch.get("numeric_values")
    numeric_values = torch.zeros(input_ids.shape) if numeric_values is None else numeric_values
    numeric_values = numeric_values.to(device=device, dtype=torch.float64)  # the values as written; the model casts
    attention_mask = batch.get("attention_mask")
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    labels = batch.get("labels")
    if labels is None:
        labels = input_ids.masked_fill(attention_mask == 0, losses.IGNORE_INDEX)
    return input_ids, numeric_values, attention_mask, labels.to(device)


def token_totals(model, loc_U: Tensor, scale_U: Tensor, target_ids: Tensor, chunk_positions: int | None) -> TokenTotals:
    """Language sums over N positions, scoring ``chunk`` positions against all V ids at a time.

    loc_U, scale_U: (N,C); target_ids: (N,)
    """
    vocab = model.config.vocab_size
    chunk = chunk_positions or max(1, SCORE_ELEMENTS_PER_CHUNK // vocab)
    totals = TokenTotals()
    constants = decision_constants(model)
    for start in range(0, target_ids.numel(), chunk):
        part = slice(start, start + chunk)
        loc_S, scale_S = model.action.classify(loc_U[part], scale_U[part])  # (n,V) each
        add_token_scores(totals, model, loc_S, scale_S, target_ids[part], constants)
    return totals


def decision_constants(model) -> tuple[Tensor, Tensor]:
    """The thresholds () or (V,) and the median individual's decision scale ``|W_cls| |b_noise| + γ_S`` (V,),
    float32: what `add_token_scores` reads besides the scores."""
    thresholds = model.ovr_thresholds().detach().float()  # () or (V,)
    noise_scale, _, _ = constant_scale(model.action)  # (V,) causal mode's position-free scale, cached
    return thresholds, noise_scale


def add_token_scores(
    totals: TokenTotals, model, loc_S: Tensor, scale_S: Tensor, target_ids: Tensor, constants: tuple[Tensor, Tensor]
) -> None:
    """Fold n positions into ``totals``: softmax NLL and accuracy over ``loc_S``, the OvR probabilities' sum,
    target probability and normalised NLL ``−log(P_t / Σ_k P_k)``, the standard decision's accuracy, and the
    standard and median-individual causal decisions' agreement with the greedy ``argmax loc_S``.

    loc_S, scale_S: (n,V); target_ids: (n,); constants: `decision_constants`. Taken a block of positions at a
    time (`row_blocks`)."""
    for rows in row_blocks(*loc_S.shape):
        _add_block_scores(totals, model, loc_S[rows], scale_S[rows], target_ids[rows], constants)


def _add_block_scores(
    totals: TokenTotals, model, loc_S: Tensor, scale_S: Tensor, target_ids: Tensor, constants: tuple[Tensor, Tensor]
) -> None:
    """`add_token_scores` for one block: loc_S, scale_S (n,V); target_ids (n,)."""
    thresholds, noise_scale = constants
    targets = target_ids.unsqueeze(1)  # (n,1)
    loc_S = loc_S.float()
    scale_S = scale_S.float()
    totals.count += int(target_ids.numel())
    log_softmax = torch.log_softmax(loc_S, dim=-1)  # (n,V)
    totals.nll_sum -= float(log_softmax.gather(1, targets).double().sum())
    greedy = loc_S.argmax(dim=-1)  # (n,) the base's (softmax) choice
    totals.correct_softmax += int((greedy == target_ids).sum())
    del log_softmax
    probs = model.ovr_probabilities(loc_S, scale_S)  # (n,V)
    # The standard decision: argmax of P_k, taken as argmax of (loc − C)/scale (P saturates at 1 in float32).
    standard_choice = ((loc_S - thresholds) / scale_S.clamp_min(torch.finfo(torch.float32).tiny)).argmax(-1)
    totals.correct_ovr += int((standard_choice == target_ids).sum())
    target_probs = probs.gather(1, targets)[:, 0].double()  # (n,) P_t
    row_sums = probs.sum(dim=-1).double()  # (n,) Σ_k P_k, summed pairwise in float32 (a float64 sum is far slower)
    totals.target_prob_sum += float(target_probs.sum())
    totals.prob_sum_sum += float(row_sums.sum())
    totals.ovr_nll_sum += float((row_sums.log() - target_probs.log()).sum())  # −log(P_t / Σ_k P_k)
    totals.standard_agree += int((standard_choice == greedy).sum())
    # Causal decision with the individual at its median (u = loc_U): only the exogenous noise is left.
    causal_choice = causal_scores(loc_S, noise_scale, thresholds).argmax(dim=-1)  # (n,) `decisions.causal_scores`
    totals.causal_agree += int((causal_choice == greedy).sum())


# ---------------------------------------------------------------------------------------------------------
# From a data file
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalData:
    """How to read the evaluation documents (`causal_qwen.training.data` does the reading).

    path: JSONL, text or CSV file (or ``vega:NAME``); format / template / text_field / text_unit / numeric_fields:
    as in `causal_qwen.training.data.DataSource`; split_by + split_at: evaluate only the rows whose ``split_by``
    value is ``>= split_at`` (the held-out part of a split by date); validation_split (+ seed, or with split_by): the
    validation side of training's split by fraction; max_length: tokens per document (longer are cut);
    target: a template field whose number the number metrics score; skip_bad_rows: skip rows that cannot become
    documents (as training did with the same setting) instead of stopping.
    """

    path: str
    format: str = "auto"
    template: str | None = None
    text_field: str = "text"
    text_unit: str = "line"
    split_by: str | None = None
    split_at: Any = None
    max_length: int = 512
    add_eos: bool = True
    numeric_fields: tuple[str, ...] | None = None
    validation_split: float = 0.0
    seed: int = 0
    target: str | None = None
    skip_bad_rows: bool = False


def load_documents(spec: EvalData) -> list:
    """The `Document`s to evaluate (only the held-out side when ``split_at`` is given)."""
    return load_split_documents(spec)[1]


def load_split_documents(spec: EvalData) -> tuple[list, list]:
    """``(training side, documents to evaluate)``: with a split, its two sides; without, ``([], every document)``."""
    from ..training.data import DataSource, SplitSpec, read_documents, split_documents

    if spec.split_by is not None and spec.split_at is None and not spec.validation_split:
        raise ValueError("split_by needs split_at (evaluate rows whose split_by value is >= split_at)")
    if spec.split_at is not None and spec.split_by is None:
        raise ValueError("split_at needs split_by (evaluate rows whose split_by value is >= split_at)")
    source = DataSource(
        path=spec.path, format=spec.format, template=spec.template, text_field=spec.text_field,
        text_unit=spec.text_unit, split_by=spec.split_by, numeric_fields=spec.numeric_fields, target=spec.target,
        skip_bad_rows=spec.skip_bad_rows,
    )
    documents = read_documents(source)
    if spec.split_by is not None or spec.validation_split:
        split = SplitSpec(fraction=spec.validation_split if spec.split_at is None else 0.0, split_by=spec.split_by,
                          split_at=spec.split_at, seed=spec.seed)
        return split_documents(documents, split)
    return [], documents


def training_median_mdae(training: list, evaluated: list) -> float | None:
    """``median_i |y_i − m|`` over the evaluated documents' target values, ``m`` the median of the training side's:
    the error of forecasting one constant, the first baseline a forecast must beat (None without targets)."""
    known = [doc.target_value for doc in training if doc.target_value is not None]
    scored = [doc.target_value for doc in evaluated if doc.target_value is not None]
    if not known or not scored:
        return None
    median = torch.tensor(known, dtype=torch.float64).quantile(0.5)
    return float((torch.tensor(scored, dtype=torch.float64) - median).abs().quantile(0.5))


def iterate_batches(examples, collator, batch_size: int) -> Iterator[dict[str, Tensor]]:
    """Consecutive padded batches of ``batch_size`` examples (evaluation order = file order)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    for start in range(0, len(examples), batch_size):
        yield collator([examples[i] for i in range(start, min(start + batch_size, len(examples)))])


def evaluate_documents(
    model,
    tokenizer,
    documents,
    batch_size: int = 8,
    max_length: int = 512,
    add_eos: bool = True,
    keep_individuals: bool = False,
    language: bool = True,
    bits: bool = False,
    target: str | None = None,
) -> Evaluation:
    """Tokenize ``documents`` (with `causal_qwen.training.collator`), pad them right in batches and evaluate.
    ``bits``: also `text_bits` of the documents' whole texts (not cut at ``max_length``), with language.
    ``target``: the field the documents were read with a target for (number metrics then score it)."""
    from ..training.collator import NumericCollator, tokenize_documents

    examples = tokenize_documents(documents, tokenizer, max_length=max_length, add_eos=add_eos)
    pad_id = tokenizer.pad_token_id if getattr(tokenizer, "pad_token_id", None) is not None else tokenizer.eos_token_id
    collator = NumericCollator(pad_token_id=pad_id, padding_side="right")
    with progress_bar(total=len(examples), desc="eval: documents", unit="doc") as bar:
        evaluation = evaluate_batches(
            model, iterate_batches(examples, collator, batch_size), keep_individuals=keep_individuals,
            language=language, progress=lambda index: bar.update(min(batch_size, len(examples) - index * batch_size)),
        )
    evaluation.target = TargetNumbers.from_documents(documents, target)
    if bits and language:
        whole = texts_within_positions(model, tokenizer, [doc.text for doc in documents])
        evaluation.bits = text_bits(model, tokenizer, whole, batch_size=batch_size) if whole else None
    return evaluation


def texts_within_positions(model, tokenizer, texts: list[str]) -> list[str]:
    """The ``texts`` whose tokens fit the model's positions (all when the config names no limit): bits per byte
    read each text whole, so a longer one is left out of them, with a warning (the other metrics read it cut at
    ``max_length``)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return texts
    lengths = tokenizer(texts, padding=True)["attention_mask"].sum(dim=1).tolist()  # tokens, as text_bits reads them
    kept = [text for text, length in zip(texts, lengths) if length <= limit]
    if len(kept) < len(texts):
        logger.warning("bits per byte leave out %d of %d texts longer than the model's %s positions (they read each "
                       "text whole; the other metrics read them cut at max_length)%s", len(texts) - len(kept),
                       len(texts), f"{limit:,}", "" if kept else ": no bits per byte")
    return kept


def evaluate_data(
    model, tokenizer, spec: EvalData, batch_size: int = 8, keep_individuals: bool = False, language: bool = True,
    bits: bool = False,
) -> Evaluation:
    """`load_documents` then `evaluate_documents`."""
    documents = load_documents(spec)
    return evaluate_documents(
        model, tokenizer, documents, batch_size=batch_size, max_length=spec.max_length, add_eos=spec.add_eos,
        keep_individuals=keep_individuals, language=language, bits=bits, target=spec.target,
    )


# ---------------------------------------------------------------------------------------------------------
# Bits per byte of the raw text
# ---------------------------------------------------------------------------------------------------------
TOKEN_PROBABILITIES = ("softmax", "ovr")


def number_half_unit(spelled: str, decimal_comma: bool = False) -> float:
    """Half a unit of the last digit written in ``spelled`` (a number as `causal_qwen.core.numbers.find_numbers`
    reads it): ``"12.8"`` → 0.05, ``"-3"`` → 0.5, ``"1,200"`` → 0.5, ``"2.5e3"`` → 50."""
    from ..core.numbers import find_numbers

    spans = find_numbers(spelled.strip(), decimal_comma=decimal_comma)
    if len(spans) != 1 or spans[0].text != spelled.strip():
        raise ValueError(f"not a number as the tokenizer reads one: {spelled!r}")
    return 0.5 * spans[0].unit


def cauchy_interval_log_mass(low: Tensor, high: Tensor, loc: Tensor, scale: Tensor,
                             width: Tensor | None = None) -> Tensor:
    """``log P(low ≤ Y ≤ high)`` for ``Y ~ Cauchy(loc, scale)`` (float64, broadcast; low < high). ``width``:
    ``high − low`` where it is known better than the difference of the rounded ends (a number written with more
    digits than float64 keeps, ``3.14159265358979323846`` ± 5e-21, whose ends both round to the value).

    With ``a = (high − loc)/scale`` and ``b = (low − loc)/scale``, ``π·P = atan a − atan b
    = atan((a − b)/(1 + ab)) + π·[1 + ab < 0]``: no cancellation when both lie far in the same tail; ``a − b`` is
    taken as ``(high − low)/scale``, which keeps an interval far narrower than its distance from ``loc`` (the
    number 1e-37 with ``loc`` 10) from vanishing.
    """
    a = (high.double() - loc.double()) / scale.double()
    b = (low.double() - loc.double()) / scale.double()
    width = ((high.double() - low.double()) if width is None else width.double()) / scale.double()  # a − b
    denominator = 1 + a * b
    angle = torch.atan(width / denominator) + math.pi * (denominator < 0).double()
    return torch.log(angle / math.pi)


def best_scale_interval_log_mass(error: Tensor, half: Tensor) -> Tensor:
    """``log max_γ P(v − h ≤ Y ≤ v + h)`` for ``Y ~ Cauchy(v + e, γ)`` (float64, broadcast): the most a Cauchy
    centred ``|e|`` = ``error`` away from the value can put on the value's interval (half-width ``h`` = ``half``)
    when its scale is chosen knowing the answer. For ``|e| > h`` the best scale is ``γ = √(e² − h²)`` and the mass
    ``atan(h / √(e² − h²)) / π``; for ``|e| ≤ h`` it tends to 1 as γ → 0.
    """
    error, half = error.double().abs(), half.double()
    outside = error > half
    gap = torch.sqrt((error**2 - half**2).clamp_min(0)).where(outside, torch.ones_like(error))
    return torch.where(outside, torch.log(torch.atan(half / gap) / math.pi), torch.zeros_like(error))


@dataclass
class TextBits:
    """Totals of `text_bits` / `qwen_text_bits`: bits over every token of the texts, and the part spent on
    tokens inside numbers (CausalQwen: the ``<NUM>`` tokens with their value; Qwen: the tokens that overlap a
    number's characters). CausalQwen's number bits split into the ``<NUM>`` token's ``−log₂ P(<NUM>)``
    (``num_token_bits``) and the value's ``−log₂`` interval mass (the rest); Qwen has no such split (0).
    ``value_bits_best_scale``: what the values would cost with each number's scale chosen knowing the answer
    (`best_scale_interval_log_mass`): the part of the value bits that no calibration of the scales removes.
    ``number_bits_by_order[k]``: the bits of every text's k-th number (with a template, one field), over
    ``numbers_by_order[k]`` numbers; ``number_bits`` and ``numbers`` are their sums."""

    bits: float = 0.0
    num_token_bits: float = 0.0
    value_bits_best_scale: float = 0.0
    number_bits_by_order: list[float] = field(default_factory=list)
    numbers_by_order: list[int] = field(default_factory=list)
    bytes: int = 0
    number_bytes: int = 0
    tokens: int = 0
    texts: int = 0

    @property
    def number_bits(self) -> float:
        return sum(self.number_bits_by_order)

    @property
    def numbers(self) -> int:
        return sum(self.numbers_by_order)

    def add_numbers(self, bits: Iterable[float]) -> None:
        """Count one text's numbers, ``bits`` in the order they are written."""
        for order, number_bits in enumerate(bits):
            if order == len(self.numbers_by_order):
                self.number_bits_by_order.append(0.0)
                self.numbers_by_order.append(0)
            self.number_bits_by_order[order] += number_bits
            self.numbers_by_order[order] += 1

    def metrics(self) -> dict[str, Any]:
        nan = float("nan")
        return {
            "bits_per_byte": self.bits / self.bytes if self.bytes else nan,
            "number_bits_per_byte": self.number_bits / self.number_bytes if self.number_bytes else nan,
            "other_bits_per_byte": (self.bits - self.number_bits) / (self.bytes - self.number_bytes)
            if self.bytes > self.number_bytes else nan,
            "text_bits": self.bits,
            "text_bytes": self.bytes,
            "number_bits": self.number_bits,
            "num_token_bits": self.num_token_bits,
            "number_value_bits": self.number_bits - self.num_token_bits,
            "number_value_bits_best_scale": self.value_bits_best_scale,
            "bits_per_number": self.number_bits / self.numbers if self.numbers else nan,
            "bits_per_number_by_order": [bits / count for bits, count in zip(self.number_bits_by_order,
                                                                             self.numbers_by_order)],
            "number_bytes": self.number_bytes,
            "bits_tokens": self.tokens,
            "bits_numbers": self.numbers,
            "bits_texts": self.texts,
        }


def _check_texts(texts) -> list[str]:
    texts = list(texts)
    if not texts or not all(isinstance(text, str) and text for text in texts):
        raise ValueError("bits per byte needs a non-empty list of non-empty strings")
    return texts


@torch.no_grad()
def _check_within_positions(model, lengths: Tensor, first: int) -> None:
    """Raise ``ValueError`` when a text of the batch starting at text ``first`` holds more tokens (``lengths``
    (B,)) than the model has positions: bits per byte read each text whole, in one pass, and a model read past
    the positions it was trained on gives figures that mean nothing."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > limit:
        index = first + int(lengths.argmax())
        raise ValueError(f"text {index} is {longest:,} tokens long, more than the model's {limit:,} positions; "
                         "bits per byte read each text whole: split it into shorter texts")


@torch.no_grad()  # no autograd graph of the whole pass (and no warning from float() of a tensor that has one)
def text_bits(model, tokenizer, texts, token_probability: str = "softmax", batch_size: int = 8) -> TextBits:
    """CausalQwen's bits on ``texts`` (module docstring). ``tokenizer``: its `NumericTokenizer`. A progress bar on
    stderr (`causal_qwen.progress`) counts the texts."""
    from ..core.numbers import find_numbers

    if token_probability not in TOKEN_PROBABILITIES:
        raise ValueError(f"token_probability must be one of {TOKEN_PROBABILITIES}, got {token_probability!r}")
    texts = _check_texts(texts)
    context = tokenizer.eos_token_id
    num_id = model.config.num_token_id
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    totals = TextBits()
    try:
        with cauchy.reuse_abs_weights():
            lone = torch.tensor([[context]], device=device)  # (1,1)
            alone = model(input_ids=lone, numeric_values=torch.zeros(1, 1, device=device), return_scores=False)
            start_state = {name: getattr(alone, name) for name in ("loc_U", "scale_U", "loc_Y", "scale_Y")}
            with progress_bar(total=len(texts), desc="eval: bits per byte", unit="doc") as bar:
                for start in range(0, len(texts), batch_size):
                    batch = texts[start : start + batch_size]
                    encoded = tokenizer(batch, padding=True, padding_side="right")
                    _check_within_positions(model, encoded["attention_mask"].sum(dim=1), start)
                    ids = encoded["input_ids"].to(device)  # (B,S)
                    values = encoded["numeric_values"].to(device)  # (B,S)
                    keep = encoded["attention_mask"].to(device).bool()  # (B,S)
                    out = model(input_ids=ids, numeric_values=values, attention_mask=keep.long(), return_scores=False)
                    # the prediction for token j: position j-1 of the text, and the start's for j = 0
                    loc_U, scale_U, loc_Y, scale_Y = (_after_start(start_state[name], getattr(out, name))
                                                      for name in ("loc_U", "scale_U", "loc_Y", "scale_Y"))
                    rows, cols = keep.nonzero(as_tuple=True)  # (N,), (N,)
                    token_ids = ids[rows, cols]  # (N,)
                    log_p = _token_log_probs(model, loc_U[rows, cols], scale_U[rows, cols], token_ids,
                                             token_probability)  # (N,) natural log
                    is_number = token_ids == num_id  # (N,)
                    half_units = []
                    for text in batch:
                        half_units += [0.5 * span.unit for span in tokenizer.find_numbers(text)]
                    if len(half_units) != int(is_number.sum()):
                        raise RuntimeError("the <NUM> tokens do not match the numbers found in the texts")
                    v = values[rows, cols][is_number].double()  # (M,)
                    h = torch.tensor(half_units, dtype=torch.float64, device=device)  # (M,)
                    loc = loc_Y[rows, cols][is_number].double()
                    scale = scale_Y[rows, cols][is_number].double()
                    number_log_p = log_p[is_number] + cauchy_interval_log_mass(v - h, v + h, loc, scale, 2 * h)  # (M,)
                    nats = -float(log_p[~is_number].sum()) - float(number_log_p.sum())
                    totals.bits += nats / math.log(2)
                    totals.num_token_bits += -float(log_p[is_number].sum()) / math.log(2)
                    totals.value_bits_best_scale += -float(best_scale_interval_log_mass(v - loc, h).sum()) / math.log(2)
                    number_rows = rows[is_number]  # (M,) the text of each number, in the order written
                    for row in range(len(batch)):
                        totals.add_numbers((-number_log_p[number_rows == row] / math.log(2)).tolist())
                    totals.tokens += int(token_ids.numel())
                    totals.texts += len(batch)
                    for text in batch:
                        totals.bytes += len(text.encode("utf-8"))
                        totals.number_bytes += sum(len(span.text.encode("utf-8")) for span in find_numbers(text))
                    bar.update(len(batch))
    finally:
        model.train(was_training)
    return totals


def _after_start(start: Tensor, states: Tensor) -> Tensor:
    """The prediction for each token of a text (B,S,...): the start's (1,1,...) for the first, then position
    j-1's of the text's own pass ``states`` (B,S,...) for token j."""
    return torch.cat([start.expand(states.shape[0], 1, *states.shape[2:]).to(states.dtype), states[:, :-1]], dim=1)


def _token_log_probs(model, loc_U: Tensor, scale_U: Tensor, token_ids: Tensor, token_probability: str) -> Tensor:
    """``log p(token)`` (N,) float64 from the individual representation (N,C), a chunk of positions at a time."""
    vocab = model.config.vocab_size
    chunk = max(1, SCORE_ELEMENTS_PER_CHUNK // vocab)
    parts = []
    for start in range(0, token_ids.numel(), chunk):
        part = slice(start, start + chunk)
        loc_S, scale_S = model.action.classify(loc_U[part], scale_U[part])  # (n,V) each
        if token_probability == "softmax":
            log_probs = torch.log_softmax(loc_S.double(), dim=-1)  # (n,V)
        else:
            log_p, _ = cauchy.ovr_log_probs(loc_S.double(), scale_S.double(), model.ovr_thresholds().double())
            log_probs = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)  # (n,V)
        parts.append(log_probs.gather(1, token_ids[part].unsqueeze(1))[:, 0])
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


@torch.no_grad()
def qwen_text_bits(model, tokenizer, texts, batch_size: int = 8) -> TextBits:
    """A plain causal LM's bits on ``texts`` (module docstring); ``tokenizer``: its Hugging Face (fast)
    tokenizer, asked for character offsets to tell the tokens inside numbers."""
    from ..core.numbers import find_numbers

    texts = _check_texts(texts)
    context = tokenizer.eos_token_id
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    totals = TextBits()
    try:
        start_logits = model(input_ids=torch.tensor([[context]], device=device)).logits  # (1,1,V)
        for index, text in enumerate(texts):
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = torch.tensor([encoded["input_ids"]], device=device)  # (1,S)
            _check_within_positions(model, torch.tensor([ids.shape[1]]), index)
            logits = _after_start(start_logits, model(input_ids=ids).logits)[0].double()  # (S,V)
            log_p = torch.log_softmax(logits, dim=-1).gather(1, ids[0].unsqueeze(1))[:, 0]  # (S,)
            spans = find_numbers(text)
            overlaps = torch.tensor([[s.start < end and start < s.end for s in spans]
                                     for start, end in encoded["offset_mapping"]], dtype=torch.bool,
                                    device=device).reshape(len(log_p), len(spans))  # (S,numbers)
            owner = overlaps & (overlaps.cumsum(dim=1) == 1)  # (S,numbers) a token counts for its first number
            totals.add_numbers([-float(log_p[owner[:, k]].sum()) / math.log(2) for k in range(len(spans))])
            totals.bits += -float(log_p.sum()) / math.log(2)
            totals.tokens += int(log_p.numel())
            totals.texts += 1
            totals.bytes += len(text.encode("utf-8"))
            totals.number_bytes += sum(len(span.text.encode("utf-8")) for span in spans)
    finally:
        model.train(was_training)
    return totals
