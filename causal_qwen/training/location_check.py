"""The location check: on the training rows kept out for the interval check, the number locations are shrunk
toward the training median when that median predicts the slice better than the model does.

Shape legend: M numbers read (one per document with a target, else every number); G grid values; B bootstrap draws.

Why: a model that reads nothing useful from a table's text (a tiny random base memorising 40 rows, a read-out
fitted to numbers whose level drifts) can do worse than a constant. What it can always estimate is the training
median ``m0`` (the median of the targets of the rows it trained on). So, on the slice kept out of training
(`causal_qwen.training.interval_check`, the latest rows when the split is by a date), with targets ``y_m`` and the
model's locations ``loc_Y,m``, the check picks the shrink weight

    α* = argmin_{α ∈ GRID} median_m |y_m − (α·loc_Y,m + (1 − α)·m0)|,    GRID = 0, 0.05, …, 1

(ties → the largest α, so a model that is as good as the blend keeps its own location), and applies it when two
things hold. The median alone (α = 0) predicts the slice better than the model (its MdAE strictly lower): the
check answers a forecast worse than a constant, and does not tune one that beats it, since a blend weight fitted to
the slice's own errors followed the slice and not the rows after it (docs/benchmarks.md, "The location check shrinks
only a forecast the median beats": seattle-temps' October slice pulled its November forecast toward the warm
median). And the blend beats the model on the slice beyond noise: in at least `BOOTSTRAP_SHARE` (90%) of
`BOOTSTRAP_DRAWS` paired bootstrap resamples of the slice (the same M numbers drawn with replacement for both), the
blend's MdAE is strictly below the model's (α = 1). Below `MIN_NUMBERS` numbers the check is skipped, as the
interval check is.

Applied to the regression head's weights, so nothing new is needed at inference: `ActionNetwork.regress` forms
``loc_Y = W_reg·loc_U + b_reg`` with no normalisation of the targets, hence

    W_reg ← α·W_reg,    b_reg ← α·b_reg + (1 − α)·m0    ⇒    loc_Y' = α·loc_Y + (1 − α)·m0

exactly (up to the rounding of the weights' dtype) at every later position. The scale reads ``|W_reg|`` too:
``scale_Y' = f·(α·(scale_U + |b_noise|) @ |W_reg|ᵀ + γ_Y)`` (``f`` = ``number_scale_factor``, ``γ_Y`` the numbers'
own noise when the model has it), so the widths shrink with the location's dependence on ``U``; the interval
check, which runs next on the same slice, measures the shrunk model and rescales them. A model without its own
number noise carries its whole width on ``|W_reg|``, so for it the grid stops at 0.05 (α = 0 would leave
``scale_Y = 0``). The individual's quantile in causal mode (`decisions.individual_number`) reads ``W_reg`` only
through ratios and is unchanged for α > 0.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from .interval_check import MIN_NUMBERS, slice_predictions

logger = logging.getLogger(__name__)

GRID = tuple(step / 20 for step in range(21))  # α = 0, 0.05, …, 1
BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_SHARE = 0.9  # the blend must beat the model in this share of the resamples
BOOTSTRAP_SEED = 0


@dataclass
class LocationCheckReport:
    """numbers: ``M``; median: ``m0``, the training targets' median; alpha: ``α*`` (1 when no blend beats the
    model); support: the share of bootstrap resamples in which the ``α*`` blend's MdAE is below the model's (0 when
    the median does not beat the model: not drawn); shrunk: whether ``α*`` was applied to the head; mdae_before: the
    slice's MdAE of the model as trained;
    mdae_median: that of the training median alone (α = 0); mdae_blend: that of the ``α*`` blend; mdae_after: that
    of the model as it is now (the blend's when shrunk)."""

    numbers: int
    median: float
    alpha: float
    support: float
    shrunk: bool
    mdae_before: float
    mdae_median: float
    mdae_blend: float
    mdae_after: float

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        if self.shrunk:
            what = (f"locations shrunk toward the training median (alpha {self.alpha:.2f}, better in "
                    f"{self.support:.0%} of resamples)")
        elif self.mdae_median >= self.mdae_before:
            what = "locations kept (the model beats the training median; only a forecast the median beats is shrunk)"
        elif self.alpha < 1:
            what = (f"locations kept (the alpha {self.alpha:.2f} blend, MdAE {self.mdae_blend:.4g}, is better in only "
                    f"{self.support:.0%} of resamples)")
        else:
            what = "locations kept (no blend with the training median does better)"
        return (f"location check on {self.numbers} numbers of training rows kept out of training: MdAE "
                f"{self.mdae_before:.4g} (forecasting the training median, {self.median:.4g}: {self.mdae_median:.4g}); "
                f"{what}; now "
                f"{self.mdae_after:.4g}")


def median_absolute_error(errors: Tensor, dim: int = -1) -> Tensor:
    """``median |e|`` along ``dim`` (the mean of the two middle values for an even count, as the benchmarks')."""
    return errors.abs().quantile(0.5, dim=dim)


def blend_errors(value: Tensor, loc: Tensor, median: float, alphas: Tensor) -> Tensor:
    """``y − (α·loc_Y + (1 − α)·m0)`` (G,M) for each α of ``alphas`` (G,); value, loc: (M,)."""
    blend = alphas[:, None] * loc[None, :] + (1 - alphas[:, None]) * median  # (G,M)
    return value[None, :] - blend


def choose_alpha(value: Tensor, loc: Tensor, median: float, grid: tuple[float, ...] = GRID) -> tuple[float, Tensor]:
    """``(α*, MdAE per α (G,))``: the α of ``grid`` whose blend has the smallest MdAE, the largest α on a tie."""
    alphas = torch.tensor(grid, dtype=torch.float64)  # (G,)
    mdae = median_absolute_error(blend_errors(value, loc, median, alphas))  # (G,)
    best = mdae.min()
    return float(alphas[mdae == best].max()), mdae


def bootstrap_support(value: Tensor, loc: Tensor, median: float, alpha: float,
                      draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> float:
    """Share of ``draws`` paired resamples of the M numbers in which the ``alpha`` blend's MdAE is strictly below
    the model's own (α = 1)."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(value.numel(), (draws, value.numel()), generator=generator)  # (B,M)
    errors = blend_errors(value, loc, median, torch.tensor([alpha, 1.0], dtype=torch.float64))  # (2,M)
    blend, own = median_absolute_error(errors[0][picks]), median_absolute_error(errors[1][picks])  # (B,) each
    return float((blend < own).double().mean())


def training_median(documents: list, every_number: bool) -> float | None:
    """``m0``: the median target of ``documents`` (the rows trained on), or of every number they hold when
    ``every_number`` (the check then reads every number too); None when they hold none."""
    from ..core.numbers import find_numbers

    if every_number:
        values = [number.value for doc in documents for number in find_numbers(doc.text)]
    else:
        values = [doc.target_value for doc in documents if doc.target_value is not None]
    if not values:
        return None
    return float(torch.tensor(values, dtype=torch.float64).quantile(0.5))


@torch.no_grad()
def shrink_regression_head(model, alpha: float, median: float) -> None:
    """``W_reg ← α·W_reg``, ``b_reg ← α·b_reg + (1 − α)·m0`` (and the earlier numbers' ``w_e ← α·w_e``), in float64,
    stored in the head's dtype: every later ``loc_Y`` is ``α·loc_Y + (1 − α)·m0``. Through LoRA's wrapper this is
    the trained (saved) copy of the head."""
    head = model.action.regression_head
    head.weight.copy_((alpha * head.weight.double()).to(head.weight.dtype))
    head.bias.copy_((alpha * head.bias.double() + (1 - alpha) * median).to(head.bias.dtype))
    earlier = model.action.earlier_numbers
    if earlier is not None:
        earlier.weight.copy_((alpha * earlier.weight.double()).to(earlier.weight.dtype))


def check_location(model, dataset, collator, batch_size: int, median: float,
                   target_ordinals: list[int | None] | None = None) -> LocationCheckReport | None:
    """Measure the locations on ``dataset`` (the slice kept out) against the training median ``median`` and shrink
    the regression head as the module docstring says; None (nothing changed) when the slice holds fewer than
    `MIN_NUMBERS` numbers."""
    value, loc, _ = slice_predictions(model, dataset, collator, batch_size, target_ordinals)  # (M,) each
    finite = torch.isfinite(value) & torch.isfinite(loc)
    value, loc = value[finite], loc[finite]
    if value.numel() < MIN_NUMBERS:
        logger.info("location check: %d numbers in the slice, fewer than %d: skipped", value.numel(), MIN_NUMBERS)
        return None
    grid = GRID if model.action.number_noise is not None else tuple(a for a in GRID if a > 0)
    alpha, mdae = choose_alpha(value, loc, median, grid)
    before, blend = float(mdae[-1]), float(mdae[grid.index(alpha)])
    by_median = float(median_absolute_error(value - median))
    considered = alpha < 1 and by_median < before  # a forecast the constant beats
    support = bootstrap_support(value, loc, median, alpha) if considered else 0.0
    shrunk = considered and support >= BOOTSTRAP_SHARE
    if shrunk:
        shrink_regression_head(model, alpha, median)
    report = LocationCheckReport(numbers=int(value.numel()), median=median, alpha=alpha, support=support,
                                 shrunk=shrunk, mdae_before=before, mdae_median=by_median, mdae_blend=blend,
                                 mdae_after=blend if shrunk else before)
    logger.info("location check: %s", report.to_dict())
    return report
