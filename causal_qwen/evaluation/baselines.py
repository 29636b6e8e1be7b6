"""Baselines for predicting one number of a table row, and the figures every forecaster is judged by.

Shape legend: R held-out rows, T training rows, F design-matrix columns.

A forecast is a predictive distribution per held-out row: a point (its median), a scale, a family, and its
central 50% and 90% intervals. The figures (`forecast_figures`, each formula from
`causal_qwen.evaluation.metrics`), for true values y (R,):

    mdae                  = median_j |y_j − point_j|
    log_score             = mean_j −log f_j(y_j)     (f_j the forecast's density; lower is better)
    coverage_p            = mean_j [low_p,j ≤ y_j ≤ high_p,j]
    scale_error_spearman  = Spearman rank correlation of scale_j and |y_j − point_j|
                            (NaN when every scale is the same: a homoscedastic forecast has no ranking)
    calibration           = [{nominal p, empirical mean_j [|y_j − point_j| ≤ half_width_p(scale_j)]}]

Families and their densities (z = (y − point)/scale), with the central p-interval ``point ± h_p·scale``:

    cauchy    −log f = log(π·scale) + log1p(z²)            h_p = tan(π·p/2)
    gaussian  −log f = ½·log(2π·scale²) + z²/2             h_p = √2·erfinv(p)
    laplace   −log f = log(2·scale) + |z|                  h_p = −log(1 − p)

The baselines, fitted on the training rows only:

    median                ŷ = median(y_train); Laplace(ŷ, b), b = mean |y_train − ŷ| (its maximum likelihood)
    group_median          the same within each value of a category column (`fit_group_median`)
    last_value            the last training value (per group) in time order, b = mean one-step change
                          (`fit_last_value`: the naive forecast of a table split in time)
    least_squares         ŷ = xᵀβ, β = argmin ‖Xβ − y‖²; Gaussian(ŷ, σ), σ² = mean residual² (max likelihood)
    cauchy_homoscedastic  the least-squares ŷ with Cauchy(ŷ, γ), γ the maximum-likelihood scale of the residuals
                          (one γ for every row)
    gradient_boosting     scikit-learn ``HistGradientBoostingRegressor`` with the quantile loss at
                          q = 0.05, 0.25, 0.5, 0.75, 0.95 (five models; each row's five predictions sorted, so
                          the intervals never cross); point = q50; 50% interval [q25, q75], 90% interval
                          [q05, q95]; its density (for the log score and the calibration table) is the Cauchy
                          whose quartiles are q25 and q75: Cauchy(q50, (q75 − q25)/2)

The least-squares residuals are out of fold (`out_of_fold_residuals`): each training row's from the fit to the
other rows, over `FOLDS` seeded random folds (in-sample below ``2·FOLDS`` rows). In-sample residuals would let a
fit that interpolates its rows (a one-hot level per row or two) claim a scale of nearly zero, and its log score
then swing with how the solver treats the rank.

The design matrix X is `design_matrix` (an intercept, numeric fields as values, a date as
day-of-year sin/cos, other fields one-hot over their training levels).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import date
from typing import Any, Sequence

import torch
from torch import Tensor

from ..core import cauchy
from .metrics import (
    CALIBRATION_LEVELS,
    calibration_table,
    check_level,
    coverage,
    log_score,
    median_absolute_error,
    spearman,
    standardized_coverage,
)
from ..training.data import parse_cell_number
from .tables import column_values

FAMILIES = ("cauchy", "gaussian", "laplace")
FOLDS = 5  # folds of the least-squares residuals the one-scale baselines take their scale from
FOLD_SEED = 0
BOOSTING_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


# ---------------------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------------------
def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def negative_log_density(family: str, value: Tensor, point: Tensor, scale: Tensor) -> Tensor:
    """``−log f(value)`` of the family's distribution at ``point``/``scale`` (broadcast; float64)."""
    _check_family(family)
    value, point, scale = value.double(), point.double(), scale.double()
    if family == "cauchy":
        return cauchy.nll(value, point, scale)
    z = (value - point) / scale
    if family == "gaussian":
        return 0.5 * torch.log(2 * math.pi * scale * scale) + 0.5 * z * z
    return torch.log(2 * scale) + z.abs()


def half_width(family: str, level: float) -> float:
    """``h_p``: the central ``level`` interval of the family's standard form is ``[−h_p, h_p]``."""
    _check_family(family)
    check_level(level)
    if family == "cauchy":
        return cauchy.interval_half_width(level)
    if family == "gaussian":
        return math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(level, dtype=torch.float64)))
    return -math.log1p(-level)


# ---------------------------------------------------------------------------------------------------------
# Forecasts and their figures
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Forecast:
    """A predictive distribution per held-out row (all (R,) float64). ``intervals`` maps a level to
    ``(low, high)``; levels missing there come from the family (``point ± h_p·scale``)."""

    family: str
    point: Tensor
    scale: Tensor
    intervals: dict[float, tuple[Tensor, Tensor]]
    train_seconds: float
    description: str

    def interval(self, level: float) -> tuple[Tensor, Tensor]:
        if level in self.intervals:
            return self.intervals[level]
        half = half_width(self.family, level) * self.scale
        return self.point - half, self.point + half


def forecast_figures(forecast: Forecast, value: Tensor, levels: Sequence[float] | None = None) -> dict[str, Any]:
    """The figures of the module docstring for ``forecast`` against the true values ``value`` (R,), each formula
    from `causal_qwen.evaluation.metrics`."""
    value = value.double().reshape(-1)  # (R,)
    if forecast.point.numel() != value.numel():
        raise ValueError(f"the forecast has {forecast.point.numel()} rows, the true values {value.numel()}")
    error = (value - forecast.point).abs()  # (R,)
    figures: dict[str, Any] = {
        "count": int(value.numel()),
        "mdae": median_absolute_error(value, forecast.point),
        "log_score": log_score(negative_log_density(forecast.family, value, forecast.point, forecast.scale)),
    }
    for level in (0.5, 0.9):
        figures[f"coverage_{int(level * 100)}"] = coverage(value, *forecast.interval(level))
    figures["scale_error_spearman"] = spearman(forecast.scale, error)
    standardized_error = error / forecast.scale  # (R,)
    figures["calibration"] = calibration_table(
        lambda level: standardized_coverage(standardized_error, level, lambda p: half_width(forecast.family, p)),
        CALIBRATION_LEVELS if levels is None else levels,
    )
    figures["train_seconds"] = forecast.train_seconds
    figures["distribution"] = forecast.description
    return figures


# ---------------------------------------------------------------------------------------------------------
# The baselines
# ---------------------------------------------------------------------------------------------------------
def laplace_fit(y: Tensor) -> tuple[float, float]:
    """``(median, b)`` of y (T,): the Laplace's maximum-likelihood location and scale ``b = mean |y − median|``."""
    median = float(y.quantile(0.5))
    return median, float((y - median).abs().mean())


def fit_median(train: Sequence[dict], held_out: Sequence[dict], target: str) -> Forecast:
    """Training median with a Laplace scale b = mean |y_train − median|."""
    start = time.perf_counter()
    median, b = laplace_fit(column_values(train, target))
    seconds = time.perf_counter() - start
    count = len(held_out)
    return Forecast("laplace", torch.full((count,), median, dtype=torch.float64),
                    torch.full((count,), max(b, 1e-12), dtype=torch.float64), {}, seconds,
                    f"Laplace(training median {median:.4g}, b = mean |y - median| = {b:.4g})")



def fit_group_median(train: Sequence[dict], held_out: Sequence[dict], group: str, target: str) -> Forecast:
    """Per value of the column ``group``: the training median of that group with its Laplace scale (mean absolute
    deviation); a group the training rows never show gets the overall median and scale."""
    start = time.perf_counter()
    by_group: dict[str, list[float]] = {}
    for row, value in zip(train, column_values(train, target).tolist()):
        by_group.setdefault(row[group], []).append(value)
    fitted = {name: laplace_fit(torch.tensor(values, dtype=torch.float64)) for name, values in by_group.items()}
    default = laplace_fit(column_values(train, target))
    pairs = [fitted.get(row[group], default) for row in held_out]
    pairs = [(median, max(b, 1e-12)) for median, b in pairs]
    seconds = time.perf_counter() - start
    return Forecast("laplace", torch.tensor([p for p, _ in pairs], dtype=torch.float64),
                    torch.tensor([b for _, b in pairs], dtype=torch.float64), {}, seconds,
                    f"Laplace(training median of the row's {group}, b = that group's mean |y - median|)")


def fit_last_value(train: Sequence[dict], held_out: Sequence[dict], order: str, target: str,
                   group: str | None = None) -> Forecast:
    """The last training value (in the order of the sortable column ``order``, per ``group`` when given): the naive
    forecast of a series split in time. Laplace scale: the mean |y_t − y_{t−1}| of consecutive training values of
    the group (the naive forecast's own one-step error); an unseen group gets the overall last value."""
    start = time.perf_counter()
    series: dict[Any, list[tuple[str, float]]] = {}
    values_train = column_values(train, target).tolist()
    for row, value in zip(train, values_train):
        series.setdefault(row[group] if group else None, []).append((row[order], value))
    fitted = {}
    for name, points in series.items():
        values = torch.tensor([value for _, value in sorted(points, key=lambda p: p[0])], dtype=torch.float64)
        step = float(values.diff().abs().mean()) if values.numel() > 1 else float("nan")
        fitted[name] = (float(values[-1]), step)
    steps = [step for _, step in fitted.values() if math.isfinite(step) and step > 0]
    fallback_scale = sum(steps) / len(steps) if steps else 1.0
    everything = sorted(((row[order], value) for row, value in zip(train, values_train)), key=lambda p: p[0])
    default = (everything[-1][1], fallback_scale)
    pairs = [fitted.get(row[group] if group else None, default) for row in held_out]
    pairs = [(point, scale if math.isfinite(scale) and scale > 0 else fallback_scale) for point, scale in pairs]
    seconds = time.perf_counter() - start
    per = f" of the row's {group}" if group else ""
    return Forecast("laplace", torch.tensor([p for p, _ in pairs], dtype=torch.float64),
                    torch.tensor([b for _, b in pairs], dtype=torch.float64), {}, seconds,
                    f"Laplace(last training value{per} by {order}, b = mean |one-step change|)")

# ---------------------------------------------------------------------------------------------------------
# Least squares on a design matrix
# ---------------------------------------------------------------------------------------------------------
def _day_of_year(text: str) -> int | None:
    parts = str(text).replace("/", "-").split("-")
    try:
        return date(int(parts[0]), int(parts[1]), int(parts[2][:2])).timetuple().tm_yday
    except (ValueError, IndexError):
        return None


@dataclass
class LinearBaseline:
    """Least squares ``ŷ = Xβ`` on the named fields (the design matrix (R, F) by `design_matrix`), with the Cauchy
    maximum-likelihood scale and the root mean square of its out-of-fold training residuals."""

    fields: list[str]
    columns: list[str]
    coefficients: list[float]
    categories: dict[str, list[str]]
    cauchy_scale: float
    rms_residual: float

    def predict(self, rows: list[dict[str, str]]) -> Tensor:
        matrix, _ = design_matrix(rows, self.fields, self.categories)  # (R,F)
        return matrix @ torch.tensor(self.coefficients, dtype=torch.float64)  # (R,)


def design_matrix(
    rows: list[dict[str, str]], fields: Sequence[str], categories: dict[str, list[str]] | None = None
) -> tuple[Tensor, list[str]]:
    """(R, F) float64 design matrix: an intercept; each numeric field as its value; a date field as
    ``sin/cos(2π·doy/365.25)``; any other field one-hot over its training ``categories`` (first dropped)."""
    columns: list[Tensor] = [torch.ones(len(rows), dtype=torch.float64)]
    names = ["intercept"]
    categories = {} if categories is None else categories
    for name in fields:
        values = [row[name] for row in rows]
        numbers = [parse_cell_number(v) for v in values]  # read as training reads number cells ("$2,078")
        days = [_day_of_year(v) for v in values]
        if all(n is not None for n in numbers):
            columns.append(torch.tensor(numbers, dtype=torch.float64))
            names.append(name)
        elif all(d is not None for d in days):
            angle = 2 * math.pi * torch.tensor(days, dtype=torch.float64) / 365.25
            columns += [torch.sin(angle), torch.cos(angle)]
            names += [f"sin({name} day of year)", f"cos({name} day of year)"]
        else:
            levels = categories.setdefault(name, sorted(set(values)))
            for level in levels[1:]:
                columns.append(torch.tensor([float(v == level) for v in values], dtype=torch.float64))
                names.append(f"{name}={level}")
    return torch.stack(columns, dim=1), names


def least_squares(matrix: Tensor, y: Tensor) -> Tensor:
    """``β = argmin ‖Xβ − y‖²`` (F,) for X (T,F), y (T,), float64; the minimum-norm one when X is rank-deficient
    (a level no row of the fit has: its coefficient 0), by the SVD driver ``gelsd``: the default ``gelsy`` leaves
    such coefficients to chance, so a fit and its scale changed from run to run."""
    return torch.linalg.lstsq(matrix, y.unsqueeze(1), driver="gelsd").solution.squeeze(1)


def out_of_fold_residuals(matrix: Tensor, y: Tensor, folds: int = FOLDS, seed: int = FOLD_SEED) -> Tensor:
    """``y_t − x_tᵀβ₋ₖ`` (T,): each row's residual from the least-squares fit to the other folds (rows dealt into
    ``folds`` folds in a seeded random order); the in-sample residuals below ``2·folds`` rows."""
    count = len(y)
    if count < 2 * folds:
        return y - matrix @ least_squares(matrix, y)
    fold = torch.empty(count, dtype=torch.long)
    fold[torch.randperm(count, generator=torch.Generator().manual_seed(seed))] = torch.arange(count) % folds
    residuals = torch.empty_like(y)  # (T,)
    for k in range(folds):
        held = fold == k
        beta = least_squares(matrix[~held], y[~held])  # (F,)
        residuals[held] = y[held] - matrix[held] @ beta
    return residuals


def fit_linear_baseline(train: list[dict[str, str]], fields: Sequence[str], target: str) -> LinearBaseline:
    """Least squares on ``fields`` of the training rows, its scales from the out-of-fold residuals."""
    categories: dict[str, list[str]] = {}
    matrix, names = design_matrix(train, fields, categories)  # (R,F)
    y = column_values(train, target)  # (R,)
    beta = least_squares(matrix, y)  # (F,)
    residuals = out_of_fold_residuals(matrix, y)  # (R,)
    return LinearBaseline(list(fields), names, beta.tolist(), categories, cauchy.scale_mle(residuals),
                          float(residuals.pow(2).mean().sqrt()))


def fit_least_squares(train: Sequence[dict], held_out: Sequence[dict], fields: Sequence[str], target: str,
                      family: str = "gaussian") -> Forecast:
    """Least squares on the design matrix of ``fields``; ``family`` ``"gaussian"`` (σ² = mean residual²)
    or ``"cauchy"`` (γ by maximum likelihood on the residuals: `cauchy.scale_mle`), out-of-fold residuals."""
    if family not in ("gaussian", "cauchy"):
        raise ValueError(f"least squares family must be 'gaussian' or 'cauchy', got {family!r}")
    start = time.perf_counter()
    linear = fit_linear_baseline(list(train), fields, target)
    return least_squares_forecast(linear, held_out, family, time.perf_counter() - start)


def least_squares_forecast(linear: LinearBaseline, held_out: Sequence[dict], family: str,
                           train_seconds: float = 0.0) -> Forecast:
    """The forecast of a fitted ``linear`` baseline for the ``held_out`` rows: ``ŷ = Xβ`` with one scale for every
    row, the rms out-of-fold residual (``"gaussian"``) or the Cauchy maximum-likelihood scale (``"cauchy"``)."""
    if family == "gaussian":
        scale = linear.rms_residual
        description = f"Gaussian(least squares, sigma = rms out-of-fold residual = {scale:.4g})"
    else:
        scale = linear.cauchy_scale
        description = f"Cauchy(least squares, gamma = ML scale of the out-of-fold residuals = {scale:.4g})"
    point = linear.predict(list(held_out))  # (R,)
    return Forecast(family, point, torch.full_like(point, max(scale, 1e-12)), {}, train_seconds, description)


def fit_gradient_boosting(train: Sequence[dict], held_out: Sequence[dict], fields: Sequence[str], target: str,
                          seed: int = 0) -> Forecast:
    """Five quantile-loss ``HistGradientBoostingRegressor`` models (module docstring); needs scikit-learn."""
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError as error:  # pragma: no cover - scikit-learn is in the test extra
        raise ValueError("the gradient-boosting baseline needs scikit-learn (pip install scikit-learn)") from error
    start = time.perf_counter()
    categories: dict[str, list[str]] = {}
    matrix, _ = design_matrix(list(train), fields, categories)  # (T,F)
    held_matrix, _ = design_matrix(list(held_out), fields, categories)  # (R,F)
    y = column_values(train, target).numpy()
    predictions = []
    for q in BOOSTING_QUANTILES:
        model = HistGradientBoostingRegressor(loss="quantile", quantile=q, random_state=seed)
        model.fit(matrix[:, 1:].numpy(), y)  # the intercept column is constant
        predictions.append(torch.as_tensor(model.predict(held_matrix[:, 1:].numpy()), dtype=torch.float64))
    stacked = torch.stack(predictions, dim=1).sort(dim=1).values  # (R,5) sorted: no crossing quantiles
    seconds = time.perf_counter() - start
    q05, q25, q50, q75, q95 = stacked.unbind(dim=1)
    scale = ((q75 - q25) / 2).clamp_min(1e-6)  # (R,)
    return Forecast("cauchy", q50, scale, {0.5: (q25, q75), 0.9: (q05, q95)}, seconds,
                    "HistGradientBoostingRegressor, quantile loss at 5/25/50/75/95%; point q50, intervals "
                    "[q25, q75] and [q05, q95]; density Cauchy(q50, (q75 - q25)/2)")


def fit_baselines(train: Sequence[dict], held_out: Sequence[dict], fields: Sequence[str], target: str,
                  seed: int = 0) -> dict[str, Forecast]:
    """Every baseline of the module docstring, fitted on ``train`` and predicting ``held_out``."""
    return {
        "median": fit_median(train, held_out, target),
        "least_squares": fit_least_squares(train, held_out, fields, target, "gaussian"),
        "gradient_boosting": fit_gradient_boosting(train, held_out, fields, target, seed),
        "cauchy_homoscedastic": fit_least_squares(train, held_out, fields, target, "cauchy"),
    }
