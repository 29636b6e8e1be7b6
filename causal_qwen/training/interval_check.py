"""The interval check: the width of the number intervals measured on training rows the model never trained on,
and rescaled when it is off.

Shape legend: M numbers read (one per document with a target, else every number).

Why: a scale learned on the rows the location was fitted to is optimistic, the more so when the held-out rows
lie later in time than the training rows (drift). So training keeps a slice of its rows out (``interval_check``:
the latest ones when the split is by a column such as a date, else a seeded pick), and after training reads the
model's predictive Cauchy ``(loc_Y, scale_Y)`` at every number of that slice (the target field's number when the
config names a target). With ``z_m = (y_m − loc_Y,m) / scale_Y,m``, the intervals are right when the ``z_m`` are
standard Cauchy draws; the factor ``f`` that fits them best is the maximum-likelihood scale of a Cauchy centred at
0 on the slice,

    f = argmax_f  ℓ(f),   ℓ(f) = Σ_m [−log(π·f) − log(1 + (z_m/f)²)],   i.e.  (1/M) Σ_m 1/(1 + (z_m/f)²) = 1/2,

and it is applied (``number_scale_factor ← f·number_scale_factor``, every ``scale_Y`` then multiplied by it) when
the likelihood-ratio test rejects ``f = 1`` at 5%: ``2·(ℓ(f) − ℓ(1)) > 3.84`` (χ² with one degree of freedom).
The test reads how far each number falls, not only whether it falls inside the 50% interval, so a handful of
numbers that all miss by ten scales is enough to widen the intervals, while a slice that agrees with them leaves
them as they are.

When the slice is the latest rows (a split in time), the check only widens (``widen_only``): the held-out period
lies further from the rows trained on than the slice does, so the slice's errors are a floor on the errors to come,
and intervals it finds too wide may be just wide enough later. (On us-employment the tiny model's slice, the last
ten months of 2013, covered 10 of 10 at 50%; narrowed ×0.33, its intervals covered 38% of 2014-2015 at 90%.)

The location check (`causal_qwen.training.location_check`) runs on the same slice just before, and may shrink the
regression head toward the training median; this check then measures (and rescales) the shrunk model's widths.

**The floor, when no slice can be kept** (a table of a few dozen rows: a slice of `MIN_NUMBERS` numbers would take
more than a quarter of them). Nothing the model did not train on is left to measure its widths, but the warm start
measured how far a read-out of the same features misses rows it was not fitted to: the median ``r̃`` of its
out-of-fold residuals (`causal_qwen.training.warm_start`, read before the first step). A Cauchy's median absolute
error is its scale, so intervals that those errors do not overrun have a median scale of at least ``r̃`` where the
model trained. With ``s̃`` the median ``scale_Y`` of the trained model at the training numbers the warm start scored,

    f = r̃ / s̃,    applied (``number_scale_factor ← f·number_scale_factor``) when f > 1:

widen only, since the model may have learned more than the read-out, but a model that memorised a few dozen rows
shows in-sample widths far below any error it will make (the tiny default on 22 days of prices: 90% intervals
covering 0.41 of the next days).

**The forward floor, after a split by a column, when the backbone is frozen** (the pretrained recipe). The slice is
one stretch just before the split and the held-out period may be unlike it (real seattle-temps: an October slice
covered 0.42 at 50%, November and December 0.07). With the backbone frozen the saved forecast is the read-out
itself (refitted, `warm_start.refit_regression`), so the warm start's forward error ``r̃_fwd`` — each block of the
training period predicted from the blocks before it only (`warm_start.forward_residuals`) — measures what this
forecast does at a horizon into the unseen, at several points of the training period rather than one. The same
``f = r̃_fwd / s̃`` floors the widths, widen only, after the interval check (the larger of the two floors when
both apply). A model whose backbone trains may learn more than the read-out; there the floor would widen what
needs no widening, so it stays off.

**The width where the earlier numbers are read** (a model with `heads.EarlierNumbers` that the warm start kept).
The widths ``scale_Y`` are trained at every number of a sentence, but the values sharpen only the target's
location (ohlc on real weights: the close's held-out error 3.04 → 0.557 while its median scale stayed 1.35, so the
50% intervals covered every day of July). The warm start measured the error of the read-out with the values on rows
it was not fitted to: ``r̃_e``, forward (each block from the blocks before it) when the rows are in time order, out
of fold otherwise. With ``s̃`` the model's median ``scale_Y`` at the training targets (``c_e = 1``),

    c_e = r̃_e / s̃,    every ``scale_Y`` where the values are read multiplied by it (`set_earlier_width`),

narrowing or widening, since these widths were never fitted to the target alone. It runs before the interval
check, so the check and the floors measure and correct the model with it, as they would any other.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from ..core.cauchy import interval_half_width, log_prob, scale_mle
from ..core.losses import next_number_ordinals

logger = logging.getLogger(__name__)

MIN_NUMBERS = 8  # fewer numbers in the slice: too few to tell a width (the check is skipped)
CHI2_1DF_95 = 3.841  # the likelihood-ratio statistic's 95% point (one degree of freedom)


@dataclass
class IntervalCheckReport:
    """numbers: ``M``; coverage_50/_90 before and after; factor: ``f``; likelihood_ratio: ``2·(ℓ(f) − ℓ(1))``;
    rescaled: whether it was applied; scale_factor: the model's ``number_scale_factor`` afterwards."""

    numbers: int
    coverage_50_before: float
    coverage_90_before: float
    factor: float
    likelihood_ratio: float
    rescaled: bool
    coverage_50_after: float
    coverage_90_after: float
    scale_factor: float
    widen_only: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        if self.rescaled:
            what = f"intervals rescaled by {self.factor:.3g}"
        elif self.widen_only and self.factor < 1 and self.likelihood_ratio > CHI2_1DF_95:
            what = f"intervals kept (factor {self.factor:.3g}: a later period is not narrowed for)"
        else:
            what = f"intervals kept (factor {self.factor:.3g} not significant)"
        return (f"interval check on {self.numbers} numbers of training rows kept out of training: 50% / 90% "
                f"coverage {self.coverage_50_before:.2f} / {self.coverage_90_before:.2f}; {what}; now "
                f"{self.coverage_50_after:.2f} / {self.coverage_90_after:.2f}")


def central_coverage(standardized_error: Tensor, level: float) -> float:
    """Share of ``|z|`` within the central ``level`` interval of a standard Cauchy, ``tan(π·level/2)``."""
    return float((standardized_error.abs() <= interval_half_width(level)).double().mean())


def cauchy_log_likelihood(standardized_error: Tensor, factor: float) -> float:
    """``ℓ(f) = Σ_m log p(z_m)`` under ``Cauchy(0, f)`` for z (M,) (`cauchy.log_prob`)."""
    z = standardized_error.double()
    return float(log_prob(z, torch.zeros_like(z), torch.full_like(z, factor)).sum())


@torch.no_grad()
def slice_predictions(model, dataset, collator, batch_size: int,
                      target_ordinals: list[int | None] | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, loc_Y, scale_Y)`` (M,) each, float64, at the numbers of ``dataset``: per document the number with
    index ``target_ordinals[d]`` among its numbers, or every number when ``target_ordinals`` is None."""
    num_id = model.config.num_token_id
    device = model.action.regression_head.weight.device
    was_training = model.training
    model.eval()
    values, locs, scales, document = [], [], [], 0
    try:
        for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collator):
            batch = {key: value.to(device) for key, value in batch.items()}
            out = model(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"],
                        attention_mask=batch["attention_mask"], use_cache=False, return_scores=False,
                        backbone_features=batch.get("backbone_features"))  # a feature cache, when given one
            # (B,S-1) each: the next token is <NUM>, and that number's index in its document
            is_number, ordinal = next_number_ordinals(batch["labels"], num_id)
            value = batch["numeric_values"][:, 1:].double()  # (B,S-1)
            loc, scale = out.loc_Y[:, :-1].double(), out.scale_Y[:, :-1].double()  # (B,S-1) each
            keep = is_number
            if target_ordinals is not None:
                rows = target_ordinals[document : document + len(is_number)]
                wanted = torch.tensor([-1 if r is None else r for r in rows], device=device)  # (B,)
                keep = keep & (ordinal == wanted[:, None])
            values.append(value[keep])
            locs.append(loc[keep])
            scales.append(scale[keep])
            document += len(is_number)
    finally:
        model.train(was_training)
    if not values:
        empty = torch.zeros(0, dtype=torch.float64)
        return empty, empty, empty
    return torch.cat(values), torch.cat(locs), torch.cat(scales)


def standardized_errors(model, dataset, collator, batch_size: int, target_ordinals: list[int | None] | None) -> Tensor:
    """``z = (y − loc_Y) / scale_Y`` (M,) float64 at the numbers `slice_predictions` reads."""
    value, loc, scale = slice_predictions(model, dataset, collator, batch_size, target_ordinals)
    return (value - loc) / scale


def check_intervals(model, dataset, collator, batch_size: int,
                    target_ordinals: list[int | None] | None = None,
                    widen_only: bool = False) -> IntervalCheckReport | None:
    """Measure the intervals on ``dataset`` (the slice kept out) and rescale them as the module docstring says
    (``widen_only``: never narrow them, for a slice of the latest rows); None (nothing changed) when the slice
    holds fewer than `MIN_NUMBERS` numbers."""
    z = standardized_errors(model, dataset, collator, batch_size, target_ordinals)  # (M,)
    z = z[torch.isfinite(z)]
    if z.numel() < MIN_NUMBERS:
        logger.info("interval check: %d numbers in the slice, fewer than %d: skipped", z.numel(), MIN_NUMBERS)
        return None
    factor = scale_mle(z)
    ratio = 2.0 * (cauchy_log_likelihood(z, factor) - cauchy_log_likelihood(z, 1.0))
    before_50, before_90 = central_coverage(z, 0.5), central_coverage(z, 0.9)
    rescaled = ratio > CHI2_1DF_95 and (factor > 1 or not widen_only)  # f ≥ scale_mle's floor > 0
    config = model.config
    if rescaled:
        config.number_scale_factor = float(config.number_scale_factor * factor)
        z = z / factor
    report = IntervalCheckReport(
        numbers=int(z.numel()), coverage_50_before=before_50, coverage_90_before=before_90, factor=factor,
        likelihood_ratio=ratio, rescaled=rescaled, coverage_50_after=central_coverage(z, 0.5),
        coverage_90_after=central_coverage(z, 0.9), scale_factor=float(config.number_scale_factor),
        widen_only=widen_only,
    )
    logger.info("interval check: %s", report.to_dict())
    return report


def median_scale(model, dataset, collator, batch_size: int, target_ordinals: list[int | None] | None,
                 what: str) -> tuple[int, float] | None:
    """``(M, s̃)``: how many numbers `slice_predictions` reads in ``dataset`` (finite, positive scales) and their
    median ``scale_Y``; None (logged as ``what`` skipped) below `MIN_NUMBERS`."""
    _, _, scale = slice_predictions(model, dataset, collator, batch_size, target_ordinals)  # (M,)
    scale = scale[torch.isfinite(scale) & (scale > 0)]
    if scale.numel() < MIN_NUMBERS:
        logger.info("%s: %d training numbers, fewer than %d: skipped", what, scale.numel(), MIN_NUMBERS)
        return None
    return int(scale.numel()), float(scale.median())


FLOOR_NO_SLICE = "out of fold"  # the floor of a table too small for a slice: ``r̃``
FLOOR_FORWARD = "forward"  # the floor after a split by a column, backbone frozen: ``r̃_fwd``
FLOOR_REASONS = {
    FLOOR_NO_SLICE: "no slice of the training rows kept out to check them",
    FLOOR_FORWARD: "a split by a column and a frozen backbone",
}
ERROR_NAMES = {FLOOR_NO_SLICE: "out-of-fold error", FLOOR_FORWARD: "forward error (each block from the ones before)"}


@dataclass
class IntervalFloorReport:
    """numbers: the training numbers read; out_of_fold_mdae: the floor ``r̃`` (the warm start's median out-of-fold
    residual, or ``r̃_fwd``, its forward one); median_scale: ``s̃``, the trained model's median ``scale_Y`` there;
    factor: ``f = r̃ / s̃``; rescaled: whether it was applied (f > 1); scale_factor: the model's
    ``number_scale_factor`` afterwards; floor: which error set it (`FLOOR_NO_SLICE` or `FLOOR_FORWARD`)."""

    numbers: int
    out_of_fold_mdae: float
    median_scale: float
    factor: float
    rescaled: bool
    scale_factor: float
    floor: str = FLOOR_NO_SLICE

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        if self.rescaled:
            what = f"intervals widened by {self.factor:.3g}"
        else:
            what = "intervals kept (as wide as that or wider)"
        return (f"interval floor ({FLOOR_REASONS[self.floor]}): median scale {self.median_scale:.4g} "
                f"at {self.numbers} training numbers against the warm start's {ERROR_NAMES[self.floor]} "
                f"{self.out_of_fold_mdae:.4g}; {what}")


def floor_intervals(model, dataset, collator, batch_size: int, out_of_fold_mdae: float,
                    target_ordinals: list[int | None] | None = None,
                    floor: str = FLOOR_NO_SLICE) -> IntervalFloorReport | None:
    """Widen the intervals to the warm start's error ``out_of_fold_mdae`` (``floor`` says which, `FLOOR_REASONS`)
    as the module docstring's floors say, reading ``scale_Y`` at the numbers of ``dataset`` (the training rows; per
    document the target's number, or every number when ``target_ordinals`` is None); None (nothing changed) when
    ``out_of_fold_mdae`` is not a positive number or fewer than `MIN_NUMBERS` numbers are read."""
    if floor not in FLOOR_REASONS:
        raise ValueError(f"unknown interval floor {floor!r}; one of {sorted(FLOOR_REASONS)}")
    if not (math.isfinite(out_of_fold_mdae) and out_of_fold_mdae > 0):
        return None
    measured = median_scale(model, dataset, collator, batch_size, target_ordinals, "interval floor")
    if measured is None:
        return None
    numbers, median = measured
    factor = out_of_fold_mdae / median
    rescaled = factor > 1
    config = model.config
    if rescaled:
        config.number_scale_factor = float(config.number_scale_factor * factor)
    report = IntervalFloorReport(numbers=numbers, out_of_fold_mdae=float(out_of_fold_mdae),
                                 median_scale=median, factor=factor, rescaled=rescaled,
                                 scale_factor=float(config.number_scale_factor), floor=floor)
    logger.info("interval floor: %s", report.to_dict())
    return report


@dataclass
class EarlierWidthReport:
    """numbers: the training targets read; error: ``r̃_e``, the warm start's median error of the read-out with the
    earlier numbers (``forward``: each block from the ones before, else out of fold); median_scale: ``s̃``, the
    model's median ``scale_Y`` there before; width: ``c_e = r̃_e / s̃``, now the model's."""

    numbers: int
    error: float
    forward: bool
    median_scale: float
    width: float

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        error = "forward error (each block from the ones before)" if self.forward else "out-of-fold error"
        return (f"earlier numbers' width: median scale {self.median_scale:.4g} at {self.numbers} training targets "
                f"against the warm start's {error} with the values {self.error:.4g}; the widths where the values "
                f"are read multiplied by {self.width:.3g}")


@torch.no_grad()
def set_earlier_width(model, dataset, collator, batch_size: int, error: float, target_ordinals: list[int | None],
                      forward: bool) -> EarlierWidthReport | None:
    """Set the earlier numbers' ``c_e = r̃_e / s̃`` as the module docstring says (``error``: ``r̃_e``; ``forward``:
    which error it is), reading ``scale_Y`` at the targets of ``dataset`` (the training rows) with ``c_e = 1``;
    None (``c_e`` left at 1) when the model reads no earlier numbers, ``error`` is not a positive number, or fewer
    than `MIN_NUMBERS` targets are read."""
    earlier = model.action.earlier_numbers
    if earlier is None or not (math.isfinite(error) and error > 0):
        return None
    earlier.width.fill_(1.0)
    measured = median_scale(model, dataset, collator, batch_size, target_ordinals, "earlier numbers' width")
    if measured is None:
        return None
    numbers, median = measured
    earlier.width.fill_(error / median)
    report = EarlierWidthReport(numbers=numbers, error=float(error), forward=forward, median_scale=median,
                                width=float(earlier.width))
    logger.info("earlier numbers' width: %s", report.to_dict())
    return report
