"""Forecast metrics: the formulas every forecaster of a number is judged by, written once.

Shape legend: M forecasts (the numbers of an evaluation, or the held-out rows of a table).

For true values y (M,), point forecasts ŷ (M,) (a Cauchy's median ``loc_Y``; a baseline's point), central
p-intervals ``[low_p, high_p]`` (M,) each, scales s (M,) and standardised errors ``z = |y − ŷ| / s``:

    median_absolute_error          MdAE  = median_j |y_j − ŷ_j|
    mean_absolute_percentage_error MAPE  = 100 · mean_{j: y_j ≠ 0} |y_j − ŷ_j| / |y_j|
    log_score                            = mean_j −log f_j(y_j)            (f_j the forecast's density; nats)
    coverage                       cov_p = mean_j [low_p,j ≤ y_j ≤ high_p,j]
    standardized_coverage          cov_p = mean_j [z_j ≤ h_p]             (h_p the family's standard half-width:
                                                                          a Cauchy's tan(π·p/2))
    calibration_table                    = [{nominal p, empirical cov_p} for each level p]
    coverage_chance                      = P(low ≤ K/M ≤ high),  K ~ Binomial(M, p)
    coverage_p_value                     = Σ_{k: P(K=k) ≤ P(K=k_obs)} P(K=k)   (exact two-sided binomial test)
    spearman                       ρ     = Pearson correlation of the average ranks (ties share the mean rank)
    tail_ratio                           = q90(z) / q50(z)   (Cauchy-shaped errors: tan(0.45π) = 6.31; Gaussian: 2.44)

A coverage measured on M numbers is itself a random figure: intervals that cover exactly p of independent errors
show ``K/M`` with ``K ~ Binomial(M, p)``, so on 15 numbers a perfectly calibrated 50% interval lands outside
[0.35, 0.65] three times in ten (`coverage_chance`); `coverage_p_value` says how surprising an observed coverage
is for a calibrated forecaster.

Multiplying every scale by one factor c leaves the tail ratio alone, so it says whether miscalibration is a
matter of width (fixable by c) or of shape: errors lighter-tailed than a Cauchy (ratio < 6.31) cannot have
both a calibrated 50% and a calibrated 90% interval. `rescaling_range` finds every c that puts chosen
coverages inside chosen bands (none, when the shape forbids it); `interval_shape` reports both.

Every function is pure: tensors in, floats out (NaN where a figure is undefined: no forecasts, a constant
ranking).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from ..core import cauchy

CALIBRATION_LEVELS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
# q90/q50 of |z| for z ~ Cauchy(0, 1): tan(π·0.9/2) / tan(π·0.5/2).
CAUCHY_TAIL_RATIO = cauchy.interval_half_width(0.9) / cauchy.interval_half_width(0.5)


# ---------------------------------------------------------------------------------------------------------
# Point forecasts
# ---------------------------------------------------------------------------------------------------------
def median_absolute_error(value: Tensor, prediction: Tensor) -> float:
    """``median |y − ŷ|`` (the mean of the two middle values for an even count); NaN without values."""
    errors = (value - prediction).abs().double()  # (M,)
    if errors.numel() == 0:
        return float("nan")
    return float(errors.quantile(0.5))


def mean_absolute_percentage_error(value: Tensor, prediction: Tensor) -> tuple[float, int]:
    """``100·mean |y − ŷ|/|y|`` over the targets with ``y ≠ 0``, and how many targets that leaves."""
    nonzero = value != 0  # (M,)
    count = int(nonzero.sum())
    if count == 0:
        return float("nan"), 0
    ratios = (value[nonzero] - prediction[nonzero]).abs() / value[nonzero].abs()  # (count,)
    return float(100.0 * ratios.double().mean()), count


# ---------------------------------------------------------------------------------------------------------
# Predictive distributions
# ---------------------------------------------------------------------------------------------------------
def log_score(negative_log_density: Tensor) -> float:
    """``mean_j −log f_j(y_j)`` from the forecasts' negative log densities at the true values (M,); NaN
    without forecasts. Lower is better."""
    if negative_log_density.numel() == 0:
        return float("nan")
    return float(negative_log_density.double().mean())


def check_level(level: float) -> None:
    """``ValueError`` unless ``0 < level < 1`` (a central interval's nominal coverage)."""
    if not 0 < level < 1:
        raise ValueError(f"coverage level must lie strictly between 0 and 1, got {level}")


def coverage(value: Tensor, low: Tensor, high: Tensor) -> float:
    """``mean_j [low_j ≤ y_j ≤ high_j]``: the fraction of true values (M,) inside their intervals (M,) each;
    NaN without values."""
    if value.numel() == 0:
        return float("nan")
    inside = (value >= low) & (value <= high)  # (M,)
    return float(inside.double().mean())


def standardized_coverage(
    standardized_error: Tensor, level: float, half_width: Callable[[float], float] = cauchy.interval_half_width
) -> float:
    """``mean_j [z_j ≤ h(level)]``: the coverage of central ``level`` intervals from the standardised errors
    ``z = |y − ŷ|/scale`` (M,), where ``point ± h(level)·scale`` is the family's central interval (default a
    Cauchy's, ``h = tan(π·level/2)``)."""
    check_level(level)
    return float((standardized_error <= half_width(level)).double().mean())


def calibration_table(coverage_at: Callable[[float], float], levels: Iterable[float] = CALIBRATION_LEVELS) -> list[dict]:
    """``[{"nominal": p, "empirical": coverage_at(p)}, …]`` for each nominal level p."""
    return [{"nominal": float(level), "empirical": coverage_at(level)} for level in levels]


def _binomial_probabilities(count: int, level: float) -> Tensor:
    """``P(K = k)`` for ``k = 0 … count`` (count+1,) float64, ``K ~ Binomial(count, level)`` (in log space: no
    overflow for large counts)."""
    k = torch.arange(count + 1, dtype=torch.float64)
    distribution = torch.distributions.Binomial(total_count=count, probs=torch.tensor(level, dtype=torch.float64))
    return distribution.log_prob(k).exp()


def coverage_chance(count: int, level: float, low: float, high: float = 1.0) -> float:
    """``P(low ≤ K/count ≤ high)`` for ``K ~ Binomial(count, level)``: the chance that intervals covering exactly
    ``level`` of ``count`` independent errors show a coverage inside ``[low, high]``. Errors that follow one
    another in time are not independent and vary more, so for a time split this overstates the chance."""
    check_level(level)
    if count < 1:
        raise ValueError(f"a coverage needs at least one number, got count={count}")
    probabilities = _binomial_probabilities(count, level)  # (count+1,)
    share = torch.arange(count + 1, dtype=torch.float64) / count
    inside = (share >= low - 1e-12) & (share <= high + 1e-12)  # 0.35·20 = 7 must count as inside
    return float(min(1.0, probabilities[inside].sum()))


def coverage_p_value(covered: int, count: int, level: float) -> float:
    """The exact two-sided binomial test of ``covered`` of ``count`` numbers inside central ``level`` intervals:
    ``Σ P(K = k)`` over every k no likelier than ``covered``, ``K ~ Binomial(count, level)``. Small (below 0.05,
    say) when a calibrated forecaster would rarely show so far off a coverage."""
    check_level(level)
    if not 0 <= covered <= count or count < 1:
        raise ValueError(f"covered must lie in [0, count] with count >= 1, got covered={covered}, count={count}")
    probabilities = _binomial_probabilities(count, level)  # (count+1,)
    observed = probabilities[covered]
    return float(min(1.0, probabilities[probabilities <= observed * (1 + 1e-9)].sum()))


# ---------------------------------------------------------------------------------------------------------
# Interval shape
# ---------------------------------------------------------------------------------------------------------
def tail_ratio(standardized_error: Tensor) -> float:
    """``q90(z) / q50(z)`` of the standardised errors z (M,): 6.31 for Cauchy-shaped errors, 2.44 for Gaussian."""
    if standardized_error.numel() == 0:
        return float("nan")
    q50, q90 = standardized_error.double().quantile(torch.tensor([0.5, 0.9], dtype=torch.float64))
    return float(q90 / q50) if q50 > 0 else float("inf")


def rescaling_range(standardized_error: Tensor, bands: dict[float, tuple[float, float]]) -> tuple[float, float] | None:
    """Every factor c with ``low ≤ coverage_p(c) ≤ high`` for each ``p: (low, high)`` of ``bands``, where
    ``coverage_p(c) = mean_j [z_j ≤ c·tan(π·p/2)]`` is the coverage after multiplying every scale by c.

    Each coverage is a non-decreasing step function of c, so the factors that satisfy every band form one
    interval; it is returned as ``(smallest, largest)`` of the step points inside it (exact: only at those
    points does any coverage change), or None when no c satisfies every band.
    """
    z = standardized_error.double().flatten()  # (M,)
    if z.numel() == 0:
        raise ValueError("rescaling_range needs at least one standardised error")
    for level, (low, high) in bands.items():
        if not (0 < level < 1 and 0 <= low <= high <= 1):
            raise ValueError(f"bad coverage band {level}: ({low}, {high})")
    sorted_z = z.sort().values  # (M,)
    half_widths = {level: cauchy.interval_half_width(level) for level in bands}
    # coverage_p is constant on [b_k, b_{k+1}) between consecutive step points b = z_j / tan(π·p/2).
    steps = torch.cat([torch.zeros(1, dtype=torch.float64), *(sorted_z / w for w in half_widths.values())]).unique()
    steps = steps * (1 + 1e-12)  # (K,) just right of each step, so rounding in z/w·w cannot drop that step
    ok = torch.ones_like(steps, dtype=torch.bool)  # (K,)
    for level, (low, high) in bands.items():
        covered = torch.searchsorted(sorted_z, steps * half_widths[level], right=True).double() / z.numel()  # (K,)
        ok &= (covered >= low) & (covered <= high)
    if not ok.any():
        return None
    inside = steps[ok]
    return float(inside.min()), float(inside.max())


def interval_shape(standardized_error: Tensor, bands: dict[float, tuple[float, float]]) -> dict[str, Any]:
    """Whether the Cauchy interval *shape* fits the errors, whatever their width: the `tail_ratio` of
    ``z = |y − loc|/scale`` (M,) beside a Cauchy's own (`CAUCHY_TAIL_RATIO`), and the `rescaling_range` that puts
    every coverage of ``bands`` inside its band (``None``: no single factor can; the errors are lighter- or
    heavier-tailed than a Cauchy)."""
    reachable = rescaling_range(standardized_error, bands)
    return {
        "tail_ratio": tail_ratio(standardized_error),
        "cauchy_tail_ratio": CAUCHY_TAIL_RATIO,
        "rescaling_reaching_bands": list(reachable) if reachable is not None else None,
    }


# ---------------------------------------------------------------------------------------------------------
# Does a wider interval mean a larger error?
# ---------------------------------------------------------------------------------------------------------
def average_ranks(values: Tensor) -> Tensor:
    """Ranks 1..M of ``values`` (M,), ties sharing the mean of their ranks (float64, (M,))."""
    values = values.double().reshape(-1)  # (M,)
    order = values.argsort(stable=True)  # (M,)
    _, inverse, counts = torch.unique_consecutive(values[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()  # (G,) the last rank of each group of ties
    mean_rank = ends - (counts.double() - 1) / 2  # (G,)
    ranks = torch.empty_like(values)  # (M,)
    ranks[order] = mean_rank[inverse]
    return ranks


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's ρ: the Pearson correlation of the average ranks of ``a`` and ``b`` (M,) each. NaN with
    fewer than two values or when either side is constant (no ranking to correlate)."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)  # (M,) each
    if a.numel() != b.numel():
        raise ValueError(f"spearman needs equal lengths, got {a.numel()} and {b.numel()}")
    if a.numel() < 2:
        return float("nan")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denominator if denominator > 0 else float("nan")
