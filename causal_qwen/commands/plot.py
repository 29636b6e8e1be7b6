"""``causal-qwen plot KIND``: PNG figures of a model's predictions or of a training run.

Kinds: ``numbers`` (predictive Cauchy densities with the true values), ``calibration`` (nominal vs empirical
coverage beside the histogram of the probability integral transform F(y)), ``next-token`` (top-k OvR probabilities next to softmax), ``individuals`` (2-D PCA of ``loc_U``,
marker size from ``scale_U``), ``training`` (curves from ``metrics.jsonl``), ``frontier`` (diversity against
fluency of causal mode and Qwen's sampling, from ``benchmarks/individual.py --json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import positive_int
from .eval import (add_data_arguments, add_model_arguments, check_number_choice, check_writable_file, data_spec,
                   load_model)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="write PNG figures: number densities, calibration, next-token probabilities, individuals, training, "
        "frontier",
        description="Write one PNG figure (matplotlib). Run 'causal-qwen plot KIND --help' for each kind.",
    )
    subparsers_of_kinds = parser.add_subparsers(dest="kind", metavar="KIND")
    subparsers_of_kinds.required = True

    def kind(name: str, help: str) -> argparse.ArgumentParser:
        """One KIND's parser, its --help opening with what it draws."""
        return subparsers_of_kinds.add_parser(name, help=help, description=f"Draw {help}.")

    numbers = kind("numbers", "predictive Cauchy densities of numbers, true values marked")
    _model_and_data(numbers)
    numbers.add_argument("--count", type=int, default=6, help="how many numbers to draw (default 6)")
    numbers.add_argument("--unit", default="value", help="x-axis label, e.g. 'temp_max (C)'")
    numbers.set_defaults(func=run_numbers)

    calibration = kind("calibration", "nominal vs empirical coverage of the central intervals, "
                       "beside the PIT histogram")
    _model_and_data(calibration)
    calibration.set_defaults(func=run_calibration)

    individuals = kind("individuals", "2-D PCA of loc_U at number positions (size: scale_U)")
    _model_and_data(individuals)
    individuals.set_defaults(func=run_individuals)

    next_token = kind("next-token", "top-k next-token OvR probabilities next to softmax ones")
    add_model_arguments(next_token)
    next_token.add_argument("--text", required=True, help="the text whose next token to show")
    next_token.add_argument("--top-k", type=positive_int, default=10, help="candidates to show (default 10)")
    next_token.add_argument("--out", required=True, help="output .png file")
    next_token.set_defaults(func=run_next_token)

    training = kind("training", "training curves from a run's metrics.jsonl")
    training.add_argument("metrics", help="metrics.jsonl written by causal-qwen train (or its output folder, or the run's final/)")
    training.add_argument("--out", required=True, help="output .png file")
    training.set_defaults(func=run_training)

    frontier = kind("frontier", "diversity (distinct-2) against fluency (perplexity) of causal mode "
                    "at several τ and Qwen at several temperatures")
    frontier.add_argument("--from", dest="bench", required=True, metavar="BENCH.json",
                          help="the JSON written by benchmarks/individual.py --json (its 'frontier' list)")
    frontier.add_argument("--out", required=True, help="output .png file")
    frontier.set_defaults(func=run_frontier)


def _model_and_data(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_data_arguments(parser)
    parser.add_argument("--number-index", type=int, default=None,
                        help="only the k-th number of each document (0 the first, -1 the last); default: the "
                        "target field's number when there is a target, else all")
    parser.add_argument("--all-numbers", action="store_true", help="every number, target or not")
    parser.add_argument("--batch-size", type=int, default=8, help="documents per batch (default 8)")
    parser.add_argument("--out", required=True, help="output .png file")


def check_png_file(path: str) -> None:
    """Raise ``ValueError`` when ``path`` (``--out``) is no .png file or cannot be written, before any work is
    done."""
    if Path(path).suffix.lower() != ".png":
        raise ValueError(f"plot output must be a .png file, got {path!r}")
    check_writable_file(path)


def _number_predictions(args: argparse.Namespace, keep_individuals: bool = False):
    from ..evaluation.evaluation import evaluate_data

    check_png_file(args.out)
    check_number_choice(args)
    spec = data_spec(args)
    model, tokenizer = load_model(args)
    result = evaluate_data(model, tokenizer, spec, batch_size=args.batch_size,
                           keep_individuals=keep_individuals, language=False)
    numbers = result.selected_numbers(args.number_index, args.all_numbers)
    if len(numbers) == 0:
        raise ValueError(f"{spec.path}: the data has no numbers to plot (no <NUM> targets)")
    return numbers, spec.path


def run_numbers(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise ValueError(f"--count must be positive, got {args.count}")
    import torch

    from ..evaluation import plots

    numbers, _ = _number_predictions(args)
    chosen = torch.linspace(0, len(numbers) - 1, min(args.count, len(numbers))).round().long().unique()  # spread out
    picked = numbers.subset(chosen)
    titles = [f"document {int(d)}, number {int(o)}" for d, o in zip(picked.document, picked.ordinal)]
    path = plots.plot_number_densities(picked.value, picked.loc, picked.scale, args.out, titles=titles,
                                       unit=args.unit)
    print(f"wrote {path}")
    return 0


def run_calibration(args: argparse.Namespace) -> int:
    from ..evaluation import plots

    numbers, data = _number_predictions(args)
    path = plots.plot_calibration({data: numbers.pit()}, args.out)
    print(f"wrote {path}")
    return 0


def run_individuals(args: argparse.Namespace) -> int:
    from ..evaluation import plots

    numbers, _ = _number_predictions(args, keep_individuals=True)
    if len(numbers) < 2:
        raise ValueError("the individual space needs at least 2 number positions")
    path = plots.plot_individual_space(numbers.loc_U, numbers.scale_U, args.out, color_values=numbers.value,
                                       color_label="true value of the predicted number")
    print(f"wrote {path}")
    return 0


def run_next_token(args: argparse.Namespace) -> int:
    from ..evaluation import plots
    from ..evaluation.predict import predict_next

    check_png_file(args.out)
    model, tokenizer = load_model(args)
    view = predict_next(model, tokenizer, args.text, top_k=args.top_k)
    candidates = view.candidates
    path = plots.plot_next_token(
        [c.token for c in candidates],
        [c.ovr_probability for c in candidates],
        [c.softmax_probability for c in candidates],
        args.out,
        context=args.text,
    )
    print(f"wrote {path}")
    return 0


def run_training(args: argparse.Namespace) -> int:
    from ..evaluation import plots
    from ..training.monitoring import read_metrics

    check_png_file(args.out)
    metrics = Path(args.metrics)
    if metrics.is_dir():  # the run's folder, or its final/ (or a checkpoint-N/) inside it
        inside = [folder / "metrics.jsonl" for folder in (metrics, metrics.parent)]
        metrics = next((file for file in inside if file.is_file()), inside[0])
    if not metrics.is_file():
        raise ValueError(f"metrics file {str(metrics)!r} does not exist")
    path = plots.plot_training_curves(read_metrics(metrics), args.out)
    print(f"wrote {path}")
    return 0


def run_frontier(args: argparse.Namespace) -> int:
    import json

    from ..evaluation import plots

    check_png_file(args.out)
    bench = Path(args.bench)
    if not bench.is_file():
        raise ValueError(f"benchmark file {str(bench)!r} does not exist")
    try:
        figures = json.loads(bench.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(bench)!r} is not a JSON file: {error}") from error
    if not isinstance(figures, dict) or not isinstance(figures.get("frontier"), list):
        raise ValueError(f"{str(bench)!r} holds no 'frontier' list (write it with benchmarks/individual.py --json)")
    tau = figures.get("causal_temperature")
    if tau is not None and not (isinstance(tau, (int, float)) and not isinstance(tau, bool)):
        raise ValueError(f"{str(bench)!r}: causal_temperature {tau!r} is not a number")
    path = plots.plot_frontier(figures["frontier"], args.out, calibrated_tau=float(tau) if tau is not None else None)
    print(f"wrote {path}")
    return 0
