"""How far a frozen base read out linearly can go on the unseen tables: every ridge, the best one in hindsight.

    python benchmarks/readout_ceiling.py --base PATH.gguf [--tables NAME,...] [--json] [--workdir DIR]
    python benchmarks/readout_ceiling.py --base random:tiny --quick      (smoke run: figures meaningless)

The pretrained recipe keeps Qwen's backbone frozen and reads each number out of its features by a ridge fit
(`causal_qwen.training.warm_start`: ``[W_reg, b_reg]``, the ridge ``λ`` chosen by the out-of-fold error on the rows
it trains on; after training refitted to those rows for the interval check, then to every training row), so the
ridge fit *is* the recipe's point forecast. Like the recipe, every fit here reads the targets (every number when
fewer than ten are targets: `warm_start.scored_numbers`). This benchmark
reads the base's features at every number of each unseen table (`benchmarks/unseen_tables.py`: issue 31's six
by default, the second set's by name; the same documents, split and check slice as ``causal-qwen train`` with the
recipe) and prints, per table:

- the held-out MdAE of the ridge fit to every training row at each ``λ`` of `LAMBDAS`;
- ``auto``: the ``λ`` the recipe chooses (`warm_start.choose_ridge` on the rows trained on, the targets scored) and
  its held-out MdAE; ``best``: the smallest held-out MdAE over `LAMBDAS` — a ``λ`` chosen *with the held-out
  answers*, which no rule can beat, so a table where ``best`` stays above a baseline is out of reach of any choice
  of ridge on these features;
- the simple baselines of issue 31's check (training median, per-group median, last value seen per group);
- ``smallest_out_of_fold``: the ``λ`` of `warm_start.RIDGE_GRID` with the smallest out-of-fold error (the rule
  without `choose_ridge`'s one-standard-error step toward stronger ridges) and its held-out MdAE; the errors
  themselves in ``out_of_fold_by_ridge``;
- ``held / slice``: the held-out MdAE of the ``auto`` read-out over the check slice's MdAE of the read-out fitted
  before the slice. A 50% interval of constant width covers half of the held-out numbers when its half-width is
  their MdAE, and the interval check can only learn the slice's errors, so this ratio is the factor by which a
  width measured on the training rows falls short (1: the slice foresees the held-out errors); none for a table
  too small for a slice (ohlc).

Three other read-outs answer "would another fit do better?" (`variants`), each on the same features:

- ``cauchy``: the ridge-penalised Cauchy fit (`cauchy_ridge_fit`), the likelihood training minimises, robust to
  the numbers a least-squares fit chases; held-out MdAE per ``λ``, the ``λ`` its out-of-fold error chooses, and
  the best in hindsight;
- ``recency`` (time splits): the ridge fit with each row weighted ``2^(−(1 − t)/h)`` by its place ``t`` in the
  training period (`recency_weights`), for every half-life ``h`` of `HALF_LIVES` and ``λ``: the best in hindsight,
  which weighting the latest rows can reach at most;
- ``horizon_slice`` (time splits): ``held / slice`` again with a check slice as long a share of the training
  rows as the held-out period is (at most half): whether a slice that looks as far ahead as the forecast would
  have foreseen the held-out errors.

One more asks whether the features are what holds the read-out back on tables whose predictors are numbers
(``values``): a frozen base reads a number only through ``φ(v) = sign(v)·ln(1 + |v|)·w_num``, a row it never
trained, so the exact values of a sentence's earlier numbers are all but lost to a linear read-out. It fits the
ridge to the features and, beside them, the values of the `PRIOR_NUMBERS` numbers before each number in its
document (`heads.EarlierNumbers`; each column scaled to the features' size and penalised
`warm_start.EARLIER_RIDGE_SHARE` as much, so the values enter as least squares would take them, `warm_start.earlier_ridge`):
held-out MdAE at the ``λ`` its own out-of-fold error chooses and the best in hindsight, and which of the two
read-outs the recipes' rule would keep, reading only the training rows (`warm_start.keeps_earlier`: the values
when they lower the error of each block, forward for a time split and out of fold otherwise, by more than two
of the blocks' standard errors). The benchmark's features are the converted model's, before training.

``--json`` prints ``{"tables": {NAME: {...}}, "seconds": ...}``. On Qwen2.5-Coder-0.5B and 2 CPU cores the six tables
take about 15 minutes, nearly all of it the backbone's one pass over airports' 3,372 sentences.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, when run from elsewhere

import number_tables  # noqa: E402
import unseen_tables  # noqa: E402

LAMBDAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
"""The relative ridges tried: the recipe's grid (`warm_start.RIDGE_GRID`) and two weaker ones below it."""
HALF_LIVES = (2.0, 1.0, 0.5, 0.25, 0.1, 0.05)
"""The recency weights' half-lives tried, as shares of the training period."""
CAUCHY_ITERATIONS = 30
"""Reweighting rounds of `cauchy_ridge_fit`."""
MAX_HORIZON_SHARE = 0.5
"""The longest check slice of ``horizon_slice``, as a share of the training rows."""
READ_BATCH = 32
PRIOR_NUMBERS = 3
"""How many of a document's earlier numbers the ``values`` read-out reads beside the features (the recipes')."""


def read_numbers(model, tokenizer, docs: list, max_length: int, add_eos: bool) -> dict[str, Tensor]:
    """Every number's features ``X`` (M,C) float64, value ``y`` (M,) and ``is_target`` (M,) bool, the documents in
    the order given (`warm_start.read_positions`, the warm start's own pass)."""
    from causal_qwen.training.collator import NumericCollator, tokenize_documents
    from causal_qwen.training.readout_steps import target_ordinals
    from causal_qwen.training.warm_start import read_positions

    dataset = tokenize_documents(docs, tokenizer, max_length, add_eos)
    batches = DataLoader(dataset, batch_size=READ_BATCH, collate_fn=NumericCollator(pad_token_id=tokenizer.pad_token_id))
    positions = read_positions(model, batches, target_ordinals=target_ordinals(dataset, docs))
    return {"X": positions.number_features, "y": positions.number_values, "is_target": positions.number_is_target,
            "R": earlier_values(batches, model.config.num_token_id)}


def earlier_values(batches, num_id: int) -> Tensor:
    """(M, `PRIOR_NUMBERS`) float64: for every number `read_positions` reads from ``batches`` (in its order), the
    values of the numbers before it in its document (`heads.EarlierNumbers.values` at the position that predicts
    it)."""
    from causal_qwen.core.heads import EarlierNumbers
    from causal_qwen.core.losses import shift_targets

    # its values only: the target plays no part in them, and with no row break marked a document is one row
    reader = EarlierNumbers(PRIOR_NUMBERS, target=1, vocab_size=1)
    rows = []
    for batch in batches:
        ids, numbers, mask = batch["input_ids"], batch["numeric_values"], batch.get("attention_mask")
        targets = shift_targets(batch.get("labels", ids), numbers.double(), mask)  # read_positions' own positions
        earlier, _ = reader.values(ids, numbers, num_id)  # (B,S,K)
        earlier = earlier[:, :-1].reshape(-1, PRIOR_NUMBERS)  # (B·(S−1),K)
        rows.append(earlier[targets.positions][targets.token_ids == num_id])
    return torch.cat(rows)


def table_numbers(model, tokenizer, table, workdir: Path, model_name: str) -> dict[str, dict[str, Tensor]]:
    """The numbers of the rows the recipe trains on (``kept``, in the out-of-fold order), of its check slice
    (``slice``; none for a table too small for one) and of the held-out rows (``held``), read as ``causal-qwen
    train`` would split them."""
    from causal_qwen.training.recipes import recipe_settings
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.readout_steps import keep_check_slice, out_of_fold_order
    from causal_qwen.training.training import read_split_documents

    data = workdir / f"{table.name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in table.rows), encoding="utf-8")
    config = TrainConfig(model=model_name, data=str(data), template=table.template, target=table.target,
                         split_by=table.time or "fold", split_at=table.split_at or 1, output_dir=str(workdir / "unused"),
                         interval_check=recipe_settings("pretrained")["interval_check"])
    train_docs, held_docs = read_split_documents(config)
    kept_docs, slice_docs = keep_check_slice(config, train_docs)
    parts = {"kept": out_of_fold_order(config, kept_docs), "slice": slice_docs, "held": held_docs}
    numbers = {name: read_numbers(model, tokenizer, docs, config.max_length, config.add_eos)
               for name, docs in parts.items() if docs}
    numbers.setdefault("slice", {key: value[:0] for key, value in numbers["kept"].items()})  # no slice: none read
    return {name: numbers[name] for name in parts}


def fitted(numbers: dict[str, Tensor]) -> dict[str, Tensor]:
    """The numbers a read-out is fitted to, as the recipe's warm start and refits choose them
    (`warm_start.scored_numbers`): the targets, or every number when fewer than ``2·FOLDS`` are targets."""
    from causal_qwen.training.warm_start import scored_numbers

    rows = scored_numbers(numbers["is_target"])  # (M,)
    return {key: value[rows] for key, value in numbers.items()}


def target_mdae(numbers: dict[str, Tensor], weight: Tensor, bias: Tensor) -> float:
    """``median |y − (W·x + b)|`` over the target numbers."""
    target = numbers["is_target"]
    return float((numbers["y"][target] - (numbers["X"][target] @ weight + bias)).abs().median())


def ceiling(numbers: dict[str, dict[str, Tensor]]) -> dict[str, Any]:
    """The read-out figures of the module docstring for one table's numbers (`table_numbers`)."""
    from causal_qwen.training.warm_start import choose_ridge, ridge_fit

    kept, check, held = numbers["kept"], numbers["slice"], numbers["held"]
    every = fitted({key: torch.cat([kept[key], check[key]]) for key in kept})  # the refit's rows: kept and slice
    trained = fitted(kept)  # the rows the ridge is chosen on and the first refit reads
    auto, out_of_fold = choose_ridge(trained["X"], trained["y"])
    by_ridge = {f"{ridge:g}": target_mdae(held, *ridge_fit(every["X"], every["y"], ridge)) for ridge in LAMBDAS}
    best = min(LAMBDAS, key=lambda ridge: by_ridge[f"{ridge:g}"])
    figures = {"numbers": {name: int(part["is_target"].sum()) for name, part in numbers.items()},
               "held_mdae_by_ridge": by_ridge, "auto_ridge": auto, "auto_mdae": by_ridge[f"{auto:g}"],
               "best_ridge": best, "best_mdae": by_ridge[f"{best:g}"], "slice_mdae": None, "held_over_slice": None,
               "out_of_fold_by_ridge": out_of_fold, "smallest_out_of_fold_ridge": None,
               "smallest_out_of_fold_mdae": None}
    if out_of_fold:  # the ridge of the smallest e(λ), without the one-standard-error step toward stronger ones
        smallest = float(min(out_of_fold, key=out_of_fold.get))
        figures["smallest_out_of_fold_ridge"] = smallest
        figures["smallest_out_of_fold_mdae"] = by_ridge[f"{smallest:g}"]
    if bool(check["is_target"].any()):
        figures["slice_mdae"] = target_mdae(check, *ridge_fit(trained["X"], trained["y"], auto))
        figures["held_over_slice"] = figures["auto_mdae"] / max(figures["slice_mdae"], 1e-12)
    return figures


def weighted_ridge_fit(features: Tensor, values: Tensor, ridge: float, weights: Tensor) -> tuple[Tensor, Tensor]:
    """``(W (C,), b ())`` minimising ``Σ_m w_m·(W·x_m + b − y_m)² + λ·(Σ_m w_m·‖x_m‖²/C)·‖W‖²``; with every
    ``w_m = 1`` this is the warm start's ridge (`warm_start.ridge_fit`). features (M,C), values (M,), weights (M,)."""
    causal_size = features.shape[1]
    total = weights.sum()
    mean_x = (weights[:, None] * features).sum(dim=0) / total  # (C,) weighted, so the bias stays unpenalised
    mean_y = (weights * values).sum() / total
    centred = features - mean_x  # (M,C)
    penalty = ridge * float((weights[:, None] * features.square()).sum()) / causal_size
    eye = torch.eye(causal_size, dtype=features.dtype, device=features.device)
    gram = centred.T @ (weights[:, None] * centred) + penalty * eye  # (C,C)
    weight = torch.linalg.solve(gram, centred.T @ (weights * (values - mean_y)))  # (C,)
    return weight, mean_y - mean_x @ weight


def cauchy_ridge_fit(features: Tensor, values: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """The ridge-penalised Cauchy read-out by iteratively reweighted least squares: from the ridge fit, repeat
    `CAUCHY_ITERATIONS` times ``r = y − (X·W + b)``, ``γ = median |r|`` (a Cauchy's scale is its median absolute
    deviation), ``w_m = 1 / (1 + (r_m/γ)²)`` and ``(W, b) = weighted_ridge_fit(X, y, λ, w)``: at a fixed point the
    gradient of ``Σ_m log(1 + (r_m/γ)²)`` is the weighted least-squares one, so far-off numbers pull on the fit as
    little as they do on the Cauchy likelihood."""
    weights = torch.ones_like(values)  # (M,)
    weight, bias = weighted_ridge_fit(features, values, ridge, weights)
    for _ in range(CAUCHY_ITERATIONS):
        residuals = values - (features @ weight + bias)  # (M,)
        spread = residuals.abs().median().clamp_min(1e-12)
        weights = 1.0 / (1.0 + (residuals / spread).square())
        weight, bias = weighted_ridge_fit(features, values, ridge, weights)
    return weight, bias


def document_times(is_target: Tensor) -> Tensor:
    """Each number's place in the training period (M,) float64 in [0, 1): its document's index over the number of
    documents. The numbers come in the documents' time order and each document's target is its last number
    (every number counts as its own document when none is a target)."""
    marks = is_target.long() if bool(is_target.any()) else torch.ones_like(is_target, dtype=torch.long)
    document = torch.cumsum(marks, dim=0) - marks  # (M,) the targets seen before this number
    return document.double() / float(marks.sum())


def recency_weights(times: Tensor, half_life: float) -> Tensor:
    """``w_m = 2^(−(1 − t_m)/h)`` (M,): the latest rows weigh about 1, a row ``h`` of the period earlier half."""
    return torch.pow(2.0, -(1.0 - times) / half_life)


def variants(numbers: dict[str, dict[str, Tensor]], time_split: bool, auto_mdae: float) -> dict[str, Any]:
    """The other read-outs of the module docstring for one table's numbers (`table_numbers`): ``cauchy`` always,
    ``recency`` and ``horizon_slice`` when the split is in time (None otherwise). ``auto_mdae``: the held-out MdAE
    of the ``auto`` ridge read-out (`ceiling`), the numerator of ``horizon_slice``'s ratio."""
    from causal_qwen.training.warm_start import choose_ridge, ridge_fit

    kept, check, held = numbers["kept"], numbers["slice"], numbers["held"]
    every = {key: torch.cat([kept[key], check[key]]) for key in kept}  # the training rows, in time order
    every["time"] = document_times(every["is_target"])  # (M,) each number's place in the training period
    every, trained = fitted(every), fitted(kept)  # the numbers the fits read
    by_ridge = {f"{ridge:g}": target_mdae(held, *cauchy_ridge_fit(every["X"], every["y"], ridge)) for ridge in LAMBDAS}
    auto, _ = choose_ridge(trained["X"], trained["y"], fit=cauchy_ridge_fit)
    best = min(LAMBDAS, key=lambda ridge: by_ridge[f"{ridge:g}"])
    figures: dict[str, Any] = {
        "cauchy": {"held_mdae_by_ridge": by_ridge, "auto_ridge": auto, "auto_mdae": by_ridge[f"{auto:g}"],
                   "best_ridge": best, "best_mdae": by_ridge[f"{best:g}"]},
        "recency": None, "horizon_slice": None}
    if not time_split:
        return figures

    times = every["time"]  # (M,)
    weighted = {(life, ridge): target_mdae(held, *weighted_ridge_fit(every["X"], every["y"], ridge,
                                                                     recency_weights(times, life)))
                for life in HALF_LIVES for ridge in LAMBDAS}
    life, ridge = min(weighted, key=weighted.get)
    figures["recency"] = {"best_half_life": life, "best_ridge": ridge, "best_mdae": weighted[(life, ridge)]}

    trained_docs, held_docs = int(every["is_target"].sum()), int(held["is_target"].sum())
    share = min(held_docs / max(trained_docs, 1), MAX_HORIZON_SHARE)
    before = times < 1.0 - share  # (M,) the numbers of the documents before the longer slice
    early = {key: value[before] for key, value in every.items()}
    late = {key: value[~before] for key, value in every.items()}
    chosen, _ = choose_ridge(early["X"], early["y"])
    slice_mdae = target_mdae(late, *ridge_fit(early["X"], early["y"], chosen))
    figures["horizon_slice"] = {"share": share, "ridge": chosen, "slice_mdae": slice_mdae,
                                "held_over_slice": auto_mdae / max(slice_mdae, 1e-12)}
    return figures


def value_read_out(numbers: dict[str, dict[str, Tensor]], time_split: bool, auto_ridge: float,
                   auto_mdae: float) -> dict[str, Any]:
    """The ``values`` figures of the module docstring for one table's numbers (`table_numbers`); ``auto_ridge``,
    ``auto_mdae``: the features' own read-out (`ceiling`), which the rule weighs the values against."""
    from causal_qwen.training.warm_start import (block_errors, choose_ridge, earlier_ridge, earlier_scales,
                                                 keeps_earlier, ridge_fit)

    kept, check, held = numbers["kept"], numbers["slice"], numbers["held"]
    every = fitted({key: torch.cat([kept[key], check[key]]) for key in kept})
    trained = fitted(kept)
    value_ridge_fit = earlier_ridge(PRIOR_NUMBERS)
    scale = earlier_scales(every["X"], every["R"])  # (K,) from the training rows, for every part alike
    widened = {name: {**part, "X": torch.cat([part["X"], part["R"] * scale], dim=1)}  # (M, C+K)
               for name, part in (("every", every), ("trained", trained), ("held", held))}
    by_ridge = {f"{ridge:g}": target_mdae(widened["held"], *value_ridge_fit(widened["every"]["X"], every["y"], ridge))
                for ridge in LAMBDAS}
    auto, _ = choose_ridge(widened["trained"]["X"], trained["y"], fit=value_ridge_fit)
    best = min(LAMBDAS, key=lambda ridge: by_ridge[f"{ridge:g}"])
    feature_errors = block_errors(trained["X"], trained["y"], auto_ridge, ridge_fit, time_split)
    value_errors = block_errors(widened["trained"]["X"], trained["y"], auto, value_ridge_fit, time_split)
    chosen = "values" if keeps_earlier(feature_errors, value_errors) else "features"
    return {"values": {
        "held_mdae_by_ridge": by_ridge, "auto_ridge": auto, "auto_mdae": by_ridge[f"{auto:g}"], "best_ridge": best,
        "best_mdae": by_ridge[f"{best:g}"],
        "block_errors": {"features": None if feature_errors is None else feature_errors.tolist(),
                         "values": None if value_errors is None else value_errors.tolist()},
        "chosen": chosen, "chosen_mdae": by_ridge[f"{auto:g}"] if chosen == "values" else auto_mdae}}


def best_in_hindsight(figures: dict[str, Any]) -> float:
    """The smallest held-out MdAE of any read-out of one table: ridge, Cauchy fit, recent rows weighted, the
    earlier numbers' values beside the features."""
    recency = figures["recency"]
    return min(figures["best_mdae"], figures["cauchy"]["best_mdae"], math.inf if recency is None else recency["best_mdae"],
               figures["values"]["best_mdae"])


def simple_baselines(table) -> dict[str, float]:
    """The held-out MdAE of issue 31's simple baselines: the training median, and the per-group median and the last
    value seen (per group) where the table has a category or a time split (`number_tables.simple_baselines`)."""
    from causal_qwen.evaluation import baselines
    from causal_qwen.evaluation.metrics import median_absolute_error

    train, held = table.train_rows(), table.held_out_rows()
    true = torch.tensor([float(row[table.target]) for row in held], dtype=torch.float64)
    forecasts = {"median": baselines.fit_median(train, held, table.target),
                 **number_tables.simple_baselines(table, train, held)}
    return {name: median_absolute_error(true, forecast.point) for name, forecast in forecasts.items()}


def format_figures(name: str, figures: dict[str, Any]) -> str:
    """One table's figures as a few lines of text."""
    ridges = ", ".join(f"{ridge} {mdae:.4g}" for ridge, mdae in figures["held_mdae_by_ridge"].items())
    simple = ", ".join(f"{base} {mdae:.4g}" for base, mdae in figures["baselines"].items())
    ratio = "n/a" if figures["held_over_slice"] is None else f"{figures['held_over_slice']:.2f}"
    counts = figures["numbers"]
    return (f"{name}: {counts['kept']} kept / {counts['slice']} slice / {counts['held']} held-out targets\n"
            f"    held-out MdAE by ridge: {ridges}\n"
            f"    auto λ {figures['auto_ridge']:g}: {figures['auto_mdae']:.4g}; best λ {figures['best_ridge']:g}: "
            f"{figures['best_mdae']:.4g}; simple baselines: {simple} (best {figures['best_simple']:.4g}: "
            f"{'reached' if figures['best_mdae'] <= figures['best_simple'] else 'out of reach'})\n"
            f"    held / slice MdAE of the auto read-out: {ratio}"
            + ("" if figures["smallest_out_of_fold_ridge"] is None else
               f"\n    smallest out-of-fold error (no one-standard-error step): λ "
               f"{figures['smallest_out_of_fold_ridge']:g}: {figures['smallest_out_of_fold_mdae']:.4g}")
            + "".join(f"\n    {line}" for line in variant_lines(figures)))


def variant_lines(figures: dict[str, Any]) -> list[str]:
    """The `variants` figures as text, one line each."""
    cauchy, recency, horizon = figures["cauchy"], figures["recency"], figures["horizon_slice"]
    lines = [f"Cauchy fit: auto λ {cauchy['auto_ridge']:g}: {cauchy['auto_mdae']:.4g}; best λ {cauchy['best_ridge']:g}: "
             f"{cauchy['best_mdae']:.4g}"]
    if recency is not None:
        lines.append(f"recent rows weighted: best half-life {recency['best_half_life']:g}, λ {recency['best_ridge']:g}: "
                     f"{recency['best_mdae']:.4g}")
    if horizon is not None:
        lines.append(f"slice of {horizon['share']:.2f} of the training rows (as long as the held-out period): "
                     f"held / slice {horizon['held_over_slice']:.2f}")
    values = figures["values"]
    lines.append(f"with the earlier numbers' values: auto λ {values['auto_ridge']:g}: {values['auto_mdae']:.4g}; best λ "
                 f"{values['best_ridge']:g}: {values['best_mdae']:.4g}; the rule keeps the {values['chosen']}: "
                 f"{values['chosen_mdae']:.4g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base to read: a Qwen2.5 .gguf file (or random:tiny with --quick)")
    parser.add_argument("--tables", default=",".join(unseen_tables.UNSEEN_TABLES),
                        help="comma-separated unseen tables: issue 31's six (the default) or the second set's "
                             f"({', '.join(unseen_tables.SECOND_SET)})")
    parser.add_argument("--quick", action="store_true", help="smoke run on a few rows of each table (figures meaningless)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--workdir", default=None, help="folder for the tables' data files (default: a temporary one)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.tables.split(",") if name.strip()]
    unknown = [name for name in names if name not in unseen_tables.ALL_TABLES]
    if unknown or not names:
        parser.error(f"--tables: unknown tables {unknown} (unseen tables: {', '.join(unseen_tables.ALL_TABLES)})")
    if not args.base.startswith("random:") and not Path(args.base).is_file():
        parser.error(f"--base {args.base!r} is not a file")

    from causal_qwen.conversion.loading import convert_base

    stream = sys.stderr if args.json else sys.stdout
    started = time.perf_counter()
    model, tokenizer = convert_base(args.base)
    model.eval()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="readout-ceiling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"base": args.base, "quick": args.quick, "tables": {}}
    for name in names:
        table = unseen_tables.ALL_TABLES[name]()
        if args.quick:
            table.rows = table.train_rows()[:40] + table.held_out_rows()[:12]
        numbers = table_numbers(model, tokenizer, table, workdir, args.base)
        figures = ceiling(numbers)
        figures.update(variants(numbers, time_split=table.time is not None, auto_mdae=figures["auto_mdae"]))
        figures.update(value_read_out(numbers, table.time is not None, figures["auto_ridge"], figures["auto_mdae"]))
        figures["baselines"] = simple_baselines(table)
        figures["best_simple"] = min(figures["baselines"].values())
        result["tables"][name] = figures
        print(format_figures(name, figures), file=stream, flush=True)
    reached = [name for name, figures in result["tables"].items() if figures["best_mdae"] <= figures["best_simple"]]
    any_reached = [name for name, figures in result["tables"].items() if best_in_hindsight(figures) <= figures["best_simple"]]
    ruled = [name for name, figures in result["tables"].items()
             if figures["values"]["chosen_mdae"] <= figures["best_simple"]]
    result["best_reaches_a_simple_baseline"] = reached
    result["any_read_out_reaches_a_simple_baseline"] = any_reached
    result["values_rule_reaches_a_simple_baseline"] = ruled
    result["seconds"] = time.perf_counter() - started
    print(f"the best ridge reaches the best simple baseline on {len(reached)} of {len(names)} tables "
          f"({', '.join(reached) or 'none'}); the best of every read-out, in hindsight, on {len(any_reached)} "
          f"({', '.join(any_reached) or 'none'}); the auto read-out or, where the rule keeps them, the values on "
          f"{len(ruled)} ({', '.join(ruled) or 'none'}); {result['seconds']:.0f} s", file=stream, flush=True)
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
