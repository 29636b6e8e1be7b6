"""PNG figures (matplotlib, Agg canvas; no global pyplot state): each function draws one figure from plain
tensors or records, writes it to ``path`` and returns the path.

Shape legend: M numbers, P points of the individual space, C causal size, K next-token candidates.

- `plot_number_densities`: the predictive Cauchy density ``f(y) = 1/(π·γ·(1 + ((y − μ)/γ)²))`` of chosen
  numbers (μ = loc_Y, γ = scale_Y), with the central 50%/90% intervals ``μ ± γ·tan(π·p/2)`` shaded and the
  true value marked.
- `plot_calibration`: nominal vs empirical coverage of the central intervals (the diagonal is perfect),
  beside the histogram of the probability integral transform ``F(y)`` (flat when calibrated).
- `plot_next_token`: top-k next-token OvR probabilities ``P_k`` next to the softmax probabilities.
- `plot_individual_space`: a 2-D PCA projection (``torch.pca_lowrank``) of ``loc_U``; marker area grows
  with the mean of ``scale_U`` over the C components.
- `plot_training_curves`: losses and monitoring figures per step from ``metrics.jsonl`` records.
- `plot_forecasts`: held-out true values against the Cauchy median with its 50%/90% bands, and baselines.
- `plot_frontier`: diversity (distinct-2) against fluency (the base's perplexity, log scale) of causal mode at
  several causal temperatures τ and of the base's sampling at several temperatures (``benchmarks/individual.py``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from ..core.cauchy import interval_half_width

logger = logging.getLogger(__name__)

DPI = 110
TRUE_COLOR = "#d62728"
MEDIAN_COLOR = "#1f77b4"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"plot output must be a .png file, got {str(path)!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, bbox_inches="tight")
    except OSError as error:
        raise ValueError(f"cannot write {str(path)!r}: {error}") from error
    logger.info("wrote %s", path)
    return path


def _as_1d(name: str, values: Any) -> Tensor:
    tensor = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty: nothing to plot")
    return tensor


# ---------------------------------------------------------------------------------------------------------
def plot_number_densities(
    values: Sequence[float] | Tensor,
    locs: Sequence[float] | Tensor,
    scales: Sequence[float] | Tensor,
    path: str | Path,
    titles: Sequence[str] | None = None,
    unit: str = "value",
    columns: int = 3,
) -> Path:
    """One panel per number: Cauchy(loc, scale) density, 50%/90% central intervals, the true value marked."""
    values, locs, scales = _as_1d("values", values), _as_1d("locs", locs), _as_1d("scales", scales)
    if not values.numel() == locs.numel() == scales.numel():
        raise ValueError(f"values, locs and scales must have equal lengths, got {values.numel()}, {locs.numel()}, "
                         f"{scales.numel()}")
    if (scales <= 0).any():
        raise ValueError("every scale must be positive")
    count = values.numel()
    columns = max(1, min(columns, count))
    rows = math.ceil(count / columns)
    figure = _figure(4.2 * columns, 3.0 * rows)
    axes = figure.subplots(rows, columns, squeeze=False)
    for index in range(rows * columns):
        axis = axes[index // columns][index % columns]
        if index >= count:
            axis.set_visible(False)
            continue
        y, mu, gamma = float(values[index]), float(locs[index]), float(scales[index])
        half_90 = gamma * interval_half_width(0.9)
        low = min(mu - 1.2 * half_90, y - 0.15 * half_90)
        high = max(mu + 1.2 * half_90, y + 0.15 * half_90)
        grid = torch.linspace(low, high, 600, dtype=torch.float64)  # (600,)
        density = 1.0 / (math.pi * gamma * (1.0 + ((grid - mu) / gamma) ** 2))  # (600,)
        axis.plot(grid.numpy(), density.numpy(), color=MEDIAN_COLOR, lw=1.8, label="predictive density")
        for level, alpha in ((0.9, 0.15), (0.5, 0.3)):
            half = gamma * interval_half_width(level)
            inside = (grid >= mu - half) & (grid <= mu + half)
            axis.fill_between(grid[inside].numpy(), density[inside].numpy(), color=MEDIAN_COLOR, alpha=alpha,
                              label=f"central {int(level * 100)}% interval")
        axis.axvline(mu, color=MEDIAN_COLOR, ls="--", lw=1, label=f"median {mu:.3g}")
        axis.axvline(y, color=TRUE_COLOR, lw=2, label=f"true {y:.3g}")
        title = titles[index] if titles is not None and index < len(titles) else f"number {index + 1}"
        axis.set_title(title, fontsize=9)
        axis.set_xlabel(unit)
        axis.set_ylabel("density")
        axis.set_ylim(bottom=0)
        if index == 0:
            axis.legend(fontsize=7, loc="upper left", framealpha=0.8)
        else:
            axis.text(0.02, 0.96, f"median {mu:.3g}\ntrue {y:.3g}", transform=axis.transAxes, va="top", fontsize=7)
    figure.suptitle("Predictive Cauchy densities of numbers (true value in red)")
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
def plot_calibration(series: Mapping[str, Tensor], path: str | Path, levels: Iterable[float] | None = None,
                     bins: int = 10) -> Path:
    """Calibration, two panels. ``series`` maps a name to the probability integral transforms
    ``PIT = F(y)`` (M,) of its numbers (`NumberPredictions.pit`), each in [0, 1].

    Left, the reliability curve: nominal level p against the empirical coverage of the central p-interval,
    ``mean(r ≤ p)`` with the central rank ``r = |2·PIT − 1|`` (the diagonal is perfect). Right, the PIT
    histogram over ``bins`` equal bins as a density (flat at 1 when calibrated; a hump in the middle: the
    intervals are too wide; a U: too narrow; a slope: the medians are biased).
    """
    from .metrics import CALIBRATION_LEVELS

    if not series:
        raise ValueError("plot_calibration needs at least one series of PIT values")
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    levels = tuple(CALIBRATION_LEVELS if levels is None else levels)
    checked = {}
    for name, values in series.items():
        pit = _as_1d(f"PIT values of {name!r}", values)
        if bool(((pit < 0) | (pit > 1) | pit.isnan()).any()):
            raise ValueError(f"PIT values of {name!r} must lie in [0, 1] (F(y) of each number)")
        checked[name] = pit
    figure = _figure(11, 4.8)
    reliability, histogram = figure.subplots(1, 2)
    reliability.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="perfect calibration")
    fine = torch.linspace(0, 1, 201, dtype=torch.float64)  # (201,)
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)  # (bins+1,)
    width = 1.0 / bins / max(1, len(checked))
    for index, (name, pit) in enumerate(checked.items()):
        ranks = (2 * pit - 1).abs()  # (M,) central ranks
        curve = (ranks.unsqueeze(0) <= fine.unsqueeze(1)).double().mean(dim=1)  # (201,)
        line = reliability.plot(fine.numpy(), curve.numpy(), lw=1.5, label=f"{name} (n={pit.numel()})")[0]
        at_levels = [float((ranks <= p).double().mean()) for p in levels]
        reliability.plot(levels, at_levels, "o", color=line.get_color(), ms=5)
        counts = torch.histc(pit, bins=bins, min=0.0, max=1.0)  # (bins,)
        density = counts / pit.numel() * bins  # (bins,)
        histogram.bar((edges[:-1] + index * width).numpy(), density.numpy(), width=width, align="edge",
                      color=line.get_color(), alpha=0.75, label=name)
    histogram.axhline(1.0, color="grey", ls=":", lw=1, label="calibrated (uniform)")
    reliability.set_xlim(0, 1)
    reliability.set_ylim(0, 1)
    reliability.set_xlabel("nominal coverage of the central interval")
    reliability.set_ylabel("empirical coverage (fraction of true values inside)")
    reliability.set_title("Reliability of the central intervals", fontsize=10)
    reliability.grid(alpha=0.3)
    reliability.legend(fontsize=8, loc="upper left")
    histogram.set_xlim(0, 1)
    histogram.set_xlabel("PIT = F(y), the predictive CDF at the true value")
    histogram.set_ylabel("density")
    histogram.set_title("PIT histogram (flat when calibrated; hump: too wide; U: too narrow)", fontsize=10)
    histogram.grid(alpha=0.3, axis="y")
    histogram.legend(fontsize=8, loc="upper right")
    figure.suptitle("Calibration of the Cauchy number predictions")
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
def plot_next_token(
    tokens: Sequence[str],
    ovr_probabilities: Sequence[float],
    softmax_probabilities: Sequence[float],
    path: str | Path,
    context: str = "",
) -> Path:
    """Top-k candidates (K,) as horizontal bars: OvR ``P_k`` (independent; need not sum to 1) beside softmax."""
    ovr = _as_1d("ovr_probabilities", ovr_probabilities)
    soft = _as_1d("softmax_probabilities", softmax_probabilities)
    if not len(tokens) == ovr.numel() == soft.numel():
        raise ValueError("tokens, ovr_probabilities and softmax_probabilities must have equal lengths")
    # Non-ASCII tokens are shown escaped: the default font lacks CJK and most other scripts.
    labels = [token if token == "<NUM>" else repr(token) if token.isascii() else ascii(token) for token in tokens]
    positions = torch.arange(len(tokens)).numpy()
    figure = _figure(10, 0.45 * len(tokens) + 1.8)
    left, right = figure.subplots(1, 2, sharey=True)
    left.barh(positions, ovr.numpy(), color=MEDIAN_COLOR)
    left.set_title("One-vs-Rest  P(S_k > C_k)")
    left.set_xlabel("OvR probability")
    left.set_ylabel("candidate token (ranked by OvR)")
    right.barh(positions, soft.numpy(), color="#ff7f0e")
    right.set_title("softmax over loc_S")
    right.set_xlabel("softmax probability")
    left.set_yticks(positions)
    left.set_yticklabels(labels, fontsize=8)
    left.invert_yaxis()
    for axis, data in ((left, ovr), (right, soft)):
        axis.set_xlim(0, max(float(data.max()) * 1.15, 1e-6))
        for y, x in zip(positions, data.tolist()):
            axis.text(x, y, f" {x:.3g}", va="center", fontsize=7)
    shown = context if len(context) <= 80 else "…" + context[-79:]
    figure.suptitle(f"Next-token probabilities after: {shown!r}", fontsize=10)
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
def project_2d(loc_U: Tensor) -> tuple[Tensor, Tensor]:
    """PCA of ``loc_U`` (P,C) → coordinates (P,2) and the fraction of variance of each of the 2 axes (2,)."""
    if loc_U.dim() != 2 or loc_U.shape[0] < 2:
        raise ValueError(f"loc_U must be (P, C) with P >= 2 points, got {tuple(loc_U.shape)}")
    data = loc_U.double()
    centred = data - data.mean(dim=0, keepdim=True)  # (P,C)
    q = min(2, *centred.shape)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)  # pca_lowrank draws a random sketch; keep the picture deterministic
        _, singular, basis = torch.pca_lowrank(centred, q=q, center=False)  # basis: (C,q)
    finally:
        torch.random.set_rng_state(generator_state)
    coords = centred @ basis  # (P,q)
    if q < 2:
        coords = torch.cat([coords, torch.zeros(coords.shape[0], 2 - q, dtype=coords.dtype)], dim=1)  # (P,2)
        singular = torch.cat([singular, torch.zeros(2 - q, dtype=singular.dtype)])
    total = centred.pow(2).sum().clamp_min(1e-300)
    return coords, singular[:2].pow(2) / total


def plot_individual_space(
    loc_U: Tensor,
    scale_U: Tensor,
    path: str | Path,
    color_values: Sequence[float] | Tensor | None = None,
    color_label: str = "",
    title: str = "Individual space: PCA of loc_U (marker size ~ mean scale_U)",
) -> Path:
    """Scatter of ``loc_U`` (P,C) projected on its first two principal axes; area ∝ mean ``scale_U`` (P,C)."""
    if scale_U.shape != loc_U.shape:
        raise ValueError(f"scale_U has shape {tuple(scale_U.shape)}, loc_U {tuple(loc_U.shape)}")
    coords, explained = project_2d(loc_U)
    mean_scale = scale_U.double().mean(dim=1)  # (P,)
    spread = (mean_scale - mean_scale.min()) / (mean_scale.max() - mean_scale.min()).clamp_min(1e-12)
    sizes = 12 + 140 * spread  # (P,)
    figure = _figure(6.8, 5.4)
    axis = figure.subplots()
    kwargs: dict[str, Any] = {"s": sizes.numpy(), "alpha": 0.65, "edgecolors": "none"}
    if color_values is not None:
        colors = _as_1d("color_values", color_values)
        if colors.numel() != coords.shape[0]:
            raise ValueError(f"color_values has {colors.numel()} entries for {coords.shape[0]} points")
        points = axis.scatter(coords[:, 0].numpy(), coords[:, 1].numpy(), c=colors.numpy(), cmap="coolwarm", **kwargs)
        figure.colorbar(points, ax=axis, label=color_label or "value")
    else:
        axis.scatter(coords[:, 0].numpy(), coords[:, 1].numpy(), color=MEDIAN_COLOR, **kwargs)
    axis.set_xlabel(f"principal axis 1 ({100 * float(explained[0]):.1f}% of variance)")
    axis.set_ylabel(f"principal axis 2 ({100 * float(explained[1]):.1f}% of variance)")
    axis.set_title(title, fontsize=10)
    low, high = float(mean_scale.min()), float(mean_scale.max())
    axis.text(0.01, 0.01, f"mean scale_U from {low:.3g} (small) to {high:.3g} (large), {coords.shape[0]} points",
              transform=axis.transAxes, fontsize=7, color="dimgrey")
    axis.grid(alpha=0.3)
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
TRAINING_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("loss", "eval_loss")),
    ("classification loss (OvR)", ("cls_loss", "eval_cls_loss")),
    ("regression loss (Cauchy NLL)", ("reg_loss", "eval_reg_loss")),
    ("token accuracy / P(target)", ("token_accuracy", "p_target")),
    ("mean scale_U", ("scale_U_mean",)),
    ("learning rate", ("lr",)),
)


def plot_training_curves(records: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One panel per figure group that has data (``step`` on the x axis), from ``metrics.jsonl`` records
    (``ValueError`` naming a record whose step is no number)."""
    for index, record in enumerate(records):
        step = record.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float))):
            raise ValueError(f"metrics record {index + 1}: step {step!r} is not a number")
    panels = []
    for title, keys in TRAINING_PANELS:
        lines = []
        for key in keys:
            points = [(r["step"], r[key]) for r in records if "step" in r and isinstance(r.get(key), (int, float))]
            if points:
                lines.append((key, points))
        if lines:
            panels.append((title, lines))
    if not panels:
        raise ValueError("the metrics records hold no step with a loss or monitoring figure to plot")
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = _figure(4.6 * columns, 3.8 * rows)
    axes = figure.subplots(rows, columns, squeeze=False)
    for index in range(rows * columns):
        axis = axes[index // columns][index % columns]
        if index >= len(panels):
            axis.set_visible(False)
            continue
        title, lines = panels[index]
        for key, points in lines:
            steps, values = zip(*points)
            style = "o-" if key.startswith("eval_") or len(points) < 3 else "-"
            axis.plot(steps, values, style, ms=3, lw=1.3, label=key)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(title.split(" (")[0])
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("Training curves (metrics.jsonl)")
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
def plot_forecasts(
    x: Sequence[float] | Tensor,
    true: Sequence[float] | Tensor,
    locs: Sequence[float] | Tensor,
    scales: Sequence[float] | Tensor,
    path: str | Path,
    baselines: Mapping[str, Sequence[float] | Tensor] | None = None,
    x_label: str = "held-out row",
    y_label: str = "value",
    title: str = "Held-out predictions: Cauchy median with central 50%/90% intervals",
) -> Path:
    """True values (M,) against the Cauchy medians (M,) with their 50%/90% bands, plus baseline predictions."""
    x, true, locs, scales = (_as_1d(n, v) for n, v in (("x", x), ("true", true), ("locs", locs), ("scales", scales)))
    if not x.numel() == true.numel() == locs.numel() == scales.numel():
        raise ValueError("x, true, locs and scales must have equal lengths")
    figure = _figure(11, 4.2)
    axis = figure.subplots()
    for level, alpha in ((0.9, 0.15), (0.5, 0.3)):
        half = scales * interval_half_width(level)
        axis.fill_between(x.numpy(), (locs - half).numpy(), (locs + half).numpy(), color=MEDIAN_COLOR, alpha=alpha,
                          lw=0, label=f"central {int(level * 100)}% interval")
    axis.plot(x.numpy(), locs.numpy(), color=MEDIAN_COLOR, lw=1.2, label="CausalQwen median loc_Y")
    for (name, values), color in zip((baselines or {}).items(), ("#2ca02c", "#9467bd", "#8c564b")):
        values = _as_1d(name, values)
        axis.plot(x.numpy(), values.numpy(), color=color, lw=1, ls="--", label=name)
    axis.plot(x.numpy(), true.numpy(), ".", color=TRUE_COLOR, ms=4, label="true value")
    half_90 = scales * interval_half_width(0.9)
    bands = torch.cat([locs - half_90, locs + half_90, true])
    low, high = float(bands.quantile(0.01)), float(bands.quantile(0.99))
    margin = 0.05 * (high - low + 1e-9)
    axis.set_ylim(low - margin, high + margin)
    axis.set_xlabel(x_label)
    axis.set_ylabel(y_label)
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncol=3, loc="upper left")
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
FRONTIER_FAMILIES = {"causal": ("tau", "τ", MEDIAN_COLOR, "o"), "qwen": ("temperature", "T", "#ff7f0e", "s")}


def plot_frontier(points: Sequence[Mapping[str, Any]], path: str | Path, calibrated_tau: float | None = None,
                  title: str = "Diversity against fluency: causal mode (τ) and Qwen's sampling (temperature)") -> Path:
    """Distinct-2 (y) against perplexity (x, log scale) of each point, one line per family, labelled with its τ or
    temperature; the point whose τ is ``calibrated_tau`` is ringed.

    points: records ``{"family": "causal", "tau": τ, ...}`` or ``{"family": "qwen", "temperature": T, ...}``, each
    with ``"distinct2"`` and ``"fluency"`` (the perplexity, > 0); the ``frontier`` list of ``benchmarks/individual.py``.
    """
    if not points:
        raise ValueError("the frontier has no points to plot")
    series: dict[str, list[tuple[float, float, float]]] = {family: [] for family in FRONTIER_FAMILIES}
    for index, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise ValueError(f"frontier point {index} is {point!r}, not a record of its figures")
        family = point.get("family")
        if family not in FRONTIER_FAMILIES:
            raise ValueError(f"frontier point {index}: family must be one of {sorted(FRONTIER_FAMILIES)}, "
                             f"got {family!r}")
        key = FRONTIER_FAMILIES[family][0]
        try:
            setting, diversity, fluency = float(point[key]), float(point["distinct2"]), float(point["fluency"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"frontier point {index} ({family}) needs numbers {key!r}, 'distinct2' and 'fluency': "
                             f"{error}") from error
        if not (math.isfinite(fluency) and fluency > 0 and math.isfinite(diversity)):
            raise ValueError(f"frontier point {index} ({family}): the perplexity must be positive and finite and "
                             f"distinct-2 finite, got {fluency} and {diversity}")
        series[family].append((setting, fluency, diversity))
    figure = _figure(7.5, 5.2)
    axis = figure.subplots()
    for family, rows in series.items():
        if not rows:
            continue
        _, symbol, color, marker = FRONTIER_FAMILIES[family]
        rows.sort()
        _, xs, ys = zip(*rows)
        name = "CausalQwen causal mode" if family == "causal" else "Qwen sampling"
        axis.plot(xs, ys, marker=marker, color=color, lw=1.3, ms=6, label=f"{name} ({symbol})")
        for setting, x, y in rows:
            axis.annotate(f"{symbol}={setting:.3g}", (x, y), textcoords="offset points", fontsize=8, color=color,
                          xytext=(5, 5) if family == "causal" else (5, -12))
    if calibrated_tau is not None:
        chosen = [(x, y) for setting, x, y in series["causal"] if math.isclose(setting, calibrated_tau, rel_tol=1e-6)]
        if chosen:
            x, y = chosen[0]
            axis.plot([x], [y], marker="o", ms=15, mfc="none", mec=TRUE_COLOR, mew=2, ls="none",
                      label=f"calibrated τ = {calibrated_tau:.3g}")
    axis.set_xscale("log")
    axis.set_xlabel("perplexity of the continuations under Qwen (lower: more fluent)")
    axis.set_ylabel("distinct-2 (higher: more diverse)")
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    return _save(figure, path)
