"""How far a frozen base read out linearly can go on the unseen tables: every ridge, the best one in hindsight.

    python benchmarks/readout_ceiling.py --base PATH.gguf [--tables NAME,...] [--json] [--workdir DIR]
    python benchmarks/readout_ceiling.py --base random:tiny --quick      (smoke run: figures meaningless)

The pretrained recipe keeps Qwen's backbone frozen and reads each number out of its features by a ridge fit
(`causal_qwen.training.warm_start`: ``[W_reg, b_reg]``, the ridge ``λ`` chosen by the out-of-fold error on the rows
it trains on, then refitted to every training row after the interval check). Fine-tuning at the recipe's 10⁻⁵
moves that read-out little, so the ridge fit *is* the recipe's point forecast, up to those steps. This benchmark
reads the base's features at every number of each unseen table (`benchmarks/unseen_tables.py`; the same
documents, split and check slice as ``causal-qwen train`` with the recipe) and prints, per table:

- the held-out MdAE of the ridge fit to every training number at each ``λ`` of `LAMBDAS`;
- ``auto``: the ``λ`` the recipe chooses (`warm_start.choose_ridge` on the rows trained on, the targets scored) and
  its held-out MdAE; ``best``: the smallest held-out MdAE over `LAMBDAS` — a ``λ`` chosen *with the held-out
  answers*, which no rule can beat, so a table where ``best`` stays above a baseline is out of reach of any choice
  of ridge on these features;
- the simple baselines of issue 31's check (training median, per-group median, last value seen per group);
- ``held / slice``: the held-out MdAE of the ``auto`` read-out over the check slice's MdAE of the read-out fitted
  before the slice. A 50% interval of constant width covers half of the held-out numbers when its half-width is
  their MdAE, and the interval check can only learn the slice's errors, so this ratio is the factor by which a
  width measured on the training rows falls short (1: the slice foresees the held-out errors).

``--json`` prints ``{"tables": {NAME: {...}}, "seconds": ...}``. On Qwen2.5-Coder-0.5B and 2 CPU cores the six tables
take about 15 minutes, nearly all of it the backbone's one pass over airports' 3,372 sentences.
"""

from __future__ import annotations

import argparse
import json
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
READ_BATCH = 32


def read_numbers(model, tokenizer, docs: list, max_length: int, add_eos: bool) -> dict[str, Tensor]:
    """Every number's features ``X`` (M,C) float64, value ``y`` (M,) and ``is_target`` (M,) bool, the documents in
    the order given (`warm_start.read_positions`, the warm start's own pass)."""
    from causal_qwen.training.collator import NumericCollator, tokenize_documents
    from causal_qwen.training.training import target_ordinals
    from causal_qwen.training.warm_start import read_positions

    dataset = tokenize_documents(docs, tokenizer, max_length, add_eos)
    batches = DataLoader(dataset, batch_size=READ_BATCH, collate_fn=NumericCollator(pad_token_id=tokenizer.pad_token_id))
    positions = read_positions(model, batches, target_ordinals=target_ordinals(dataset, docs))
    return {"X": positions.number_features, "y": positions.number_values, "is_target": positions.number_is_target}


def table_numbers(model, tokenizer, table, workdir: Path, model_name: str) -> dict[str, dict[str, Tensor]]:
    """The numbers of the rows the recipe trains on (``kept``, in the out-of-fold order), of its check slice
    (``slice``) and of the held-out rows (``held``), read as ``causal-qwen train`` would split them."""
    from causal_qwen.training.recipes import recipe_settings
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.training import keep_check_slice, out_of_fold_order, read_split_documents

    data = workdir / f"{table.name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in table.rows), encoding="utf-8")
    config = TrainConfig(model=model_name, data=str(data), template=table.template, target=table.target,
                         split_by=table.time or "fold", split_at=table.split_at or 1, output_dir=str(workdir / "unused"),
                         interval_check=recipe_settings("pretrained")["interval_check"])
    train_docs, held_docs = read_split_documents(config)
    kept_docs, slice_docs = keep_check_slice(config, train_docs)
    parts = {"kept": out_of_fold_order(config, kept_docs), "slice": slice_docs, "held": held_docs}
    return {name: read_numbers(model, tokenizer, docs, config.max_length, config.add_eos) for name, docs in parts.items()}


def target_mdae(numbers: dict[str, Tensor], weight: Tensor, bias: Tensor) -> float:
    """``median |y − (W·x + b)|`` over the target numbers."""
    target = numbers["is_target"]
    return float((numbers["y"][target] - (numbers["X"][target] @ weight + bias)).abs().median())


def ceiling(numbers: dict[str, dict[str, Tensor]]) -> dict[str, Any]:
    """The read-out figures of the module docstring for one table's numbers (`table_numbers`)."""
    from causal_qwen.training.warm_start import choose_ridge, ridge_fit

    kept, check, held = numbers["kept"], numbers["slice"], numbers["held"]
    every = {key: torch.cat([kept[key], check[key]]) for key in kept}  # the refit's rows: kept and slice
    auto, _ = choose_ridge(kept["X"], kept["y"], scored=kept["is_target"])
    by_ridge = {f"{ridge:g}": target_mdae(held, *ridge_fit(every["X"], every["y"], ridge)) for ridge in LAMBDAS}
    best = min(LAMBDAS, key=lambda ridge: by_ridge[f"{ridge:g}"])
    figures = {"numbers": {name: int(part["is_target"].sum()) for name, part in numbers.items()},
               "held_mdae_by_ridge": by_ridge, "auto_ridge": auto, "auto_mdae": by_ridge[f"{auto:g}"],
               "best_ridge": best, "best_mdae": by_ridge[f"{best:g}"], "slice_mdae": None, "held_over_slice": None}
    if bool(check["is_target"].any()):
        figures["slice_mdae"] = target_mdae(check, *ridge_fit(kept["X"], kept["y"], auto))
        figures["held_over_slice"] = figures["auto_mdae"] / max(figures["slice_mdae"], 1e-12)
    return figures


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
            f"    held / slice MdAE of the auto read-out: {ratio}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base to read: a Qwen2.5 .gguf file (or random:tiny with --quick)")
    parser.add_argument("--tables", default=",".join(unseen_tables.UNSEEN_TABLES),
                        help="comma-separated unseen tables (default: all six)")
    parser.add_argument("--quick", action="store_true", help="smoke run on a few rows of each table (figures meaningless)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--workdir", default=None, help="folder for the tables' data files (default: a temporary one)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.tables.split(",") if name.strip()]
    unknown = [name for name in names if name not in unseen_tables.UNSEEN_TABLES]
    if unknown or not names:
        parser.error(f"--tables: unknown tables {unknown} (unseen tables: {', '.join(unseen_tables.UNSEEN_TABLES)})")
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
        table = unseen_tables.UNSEEN_TABLES[name]()
        if args.quick:
            table.rows = table.train_rows()[:40] + table.held_out_rows()[:12]
        figures = ceiling(table_numbers(model, tokenizer, table, workdir, args.base))
        figures["baselines"] = simple_baselines(table)
        figures["best_simple"] = min(figures["baselines"].values())
        result["tables"][name] = figures
        print(format_figures(name, figures), file=stream, flush=True)
    reached = [name for name, figures in result["tables"].items() if figures["best_mdae"] <= figures["best_simple"]]
    result["best_reaches_a_simple_baseline"] = reached
    result["seconds"] = time.perf_counter() - started
    print(f"the best ridge reaches the best simple baseline on {len(reached)} of {len(names)} tables "
          f"({', '.join(reached) or 'none'}); {result['seconds']:.0f} s", file=stream, flush=True)
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
