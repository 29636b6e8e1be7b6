"""``causal-qwen eval``: language and number metrics of a model on a data file."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

# The metric sets of `causal_qwen.evaluation.evaluation.METRIC_SETS` (spelled here so that --help imports no torch).
METRIC_SETS = ("auto", "all", "language", "numbers")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on a data file: perplexity, token accuracy, number errors, interval coverage",
        description="Language metrics (perplexity from the softmax over loc_S, top-1 accuracy under OvR and "
        "softmax decisions, mean OvR probability of the target, mean sum of OvR probabilities) and number "
        "metrics at <NUM> targets (median absolute error and MAPE of the Cauchy median loc_Y, log score = mean "
        "Cauchy NLL, coverage of the central 50%/90% intervals, Spearman correlation of scale_Y and |error|, "
        "calibration table). With language metrics, bits per byte of the raw text: a number's probability is "
        "P(<NUM>) times the Cauchy mass of the values written as the same string; each text is scored as it is "
        "trained (no context token before it), and bits per number are also given for each text's 1st, 2nd, ... "
        "number.",
    )
    add_model_arguments(parser)
    add_data_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=8, help="documents per batch (default 8)")
    parser.add_argument(
        "--metrics",
        choices=METRIC_SETS,
        default="auto",
        help="which metrics: language, numbers, all (numbers required), auto (numbers when the data has some)",
    )
    parser.add_argument(
        "--number-index",
        type=int,
        default=None,
        help="number metrics on the k-th number of each document only (0 the first, -1 the last); default: the "
        "target field's number when there is a target, else all",
    )
    parser.add_argument("--all-numbers", action="store_true", help="number metrics on every number, target or not")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the metrics as JSON ('-': stdout)")
    parser.set_defaults(func=run)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` or ``--base`` (with ``--gguf-file``), and the `add_device_arguments`."""
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--model", help="a converted or fine-tuned CausalQwen folder")
    group.add_argument("--base", help="a Qwen2 base converted on the fly (preset, folder, .gguf file or hub id)")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --base")
    add_device_arguments(parser)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` (read by `placement`) and ``--quiet``/``--progress`` (read by the command line's
    main, `causal_qwen.progress`): the options shared by every command that runs a model."""
    group = parser.add_argument_group("device and progress")
    group.add_argument("--device", default="auto", metavar="DEVICE",
                       help="where the model runs: auto (the default: cuda when available, else mps, else cpu), "
                       "cpu, cuda, cuda:N or mps")
    group.add_argument("--dtype", default="auto", metavar="DTYPE",
                       help="the model's dtype: auto (the default: bfloat16 on a GPU that supports it, else float32), "
                       "float32, bfloat16 or float16 (the calibrated scales and thresholds always stay float32)")
    shown = group.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    shown.add_argument("--progress", action="store_true",
                       help="progress on stderr even when it is not a terminal (a line per update, for logs; by "
                       "default bars are shown on a terminal only)")


def placement(args: argparse.Namespace):
    """``(torch.device, torch.dtype)`` of ``--device`` and ``--dtype`` (`resolve_device_and_dtype`): a
    ``ValueError`` for an unknown or unavailable one, before any work is done."""
    from ..conversion.devices import resolve_device_and_dtype

    return resolve_device_and_dtype(args.device, args.dtype)


def load_model(args: argparse.Namespace):
    """``(model, tokenizer)`` of ``--model`` or ``--base`` on ``--device`` in ``--dtype`` (`placement`)."""
    from ..conversion.loading import load_model_and_tokenizer

    if args.model is not None and args.gguf_file is not None:
        raise ValueError("--gguf-file names the GGUF file inside --base; a --model folder holds its own weights")
    device, dtype = placement(args)
    return load_model_and_tokenizer(model_dir=args.model, base=args.base, gguf_file=args.gguf_file, device=device,
                                    dtype=dtype)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None, metavar="TRAIN.yaml",
        help="training config whose data, template, split (the held-out rows) and target to use; default: the "
        "train_config.yaml that training saved beside --model (in it or its parent folder), if any",
    )
    parser.add_argument("--data", default=None, help="JSONL, text or CSV file (or vega:NAME); default: the config's")
    parser.add_argument("--data-format", choices=("auto", "jsonl", "csv", "text"), default=None,
                        help="how to read --data (default: the config's for its own file, else by the file's suffix: "
                        ".jsonl/.json JSON Lines, .csv/.tsv CSV, anything else plain text)")
    parser.add_argument("--template", default=None, help="format string turning each CSV/JSONL row into text")
    parser.add_argument("--text-field", default=None, help="JSONL/CSV field holding the text (default 'text')")
    parser.add_argument("--text-unit", choices=("line", "block"), default=None,
                        help="plain text: one document per non-empty line (line) or per blank-line-separated block "
                             "(block); default: the config's, else line")
    parser.add_argument("--split-by", default=None, help="column to split by (with --split-at)")
    parser.add_argument("--split-at", default=None, help="evaluate only rows whose --split-by value is >= this")
    parser.add_argument("--target", default=None, help="template field whose number the number metrics score")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per document (default 512)")


def find_train_config(args: argparse.Namespace) -> Path | None:
    """``--config``, else the ``train_config.yaml`` in the ``--model`` folder or its parent (a run's
    ``final/`` or ``checkpoint-N``), else None."""
    if args.config is not None:
        return Path(args.config)
    if getattr(args, "model", None):
        for folder in (Path(args.model), Path(args.model).parent):
            if (folder / "train_config.yaml").is_file():
                return folder / "train_config.yaml"
    return None


def data_spec(args: argparse.Namespace):
    """The `EvalData` of the command line, completed from the training config (`find_train_config`): data,
    template, text field/unit, numeric fields, max_length and target; its split (the validation rows) when the
    data is the config's. Explicit options win. Tells on stderr which settings came from where."""
    from ..evaluation.evaluation import EvalData
    from ..training.train_config import load_train_config

    path = find_train_config(args)
    config = load_train_config(path) if path is not None else None
    data = args.data or (config.validation_data or config.data if config is not None else None)
    if data is None:
        raise ValueError("--data is required (or --config TRAIN.yaml / a --model folder with its train_config.yaml)")
    if config is not None and not args.data and not data.startswith("vega:") and not Path(data).expanduser().is_file():
        raise ValueError(f"the run's data file {data!r} (from {path}) does not exist: give its new place with --data "
                         "PATH, and the rows to score with --split-by/--split-at (the run's own split is read from "
                         "its data file)")
    from_config = config is not None and _same_file(data, (config.data, config.validation_data))
    split_by = args.split_by
    if args.split_at is not None and split_by is None:
        if not (from_config and config.split_by):
            raise ValueError("--split-at needs --split-by (the column to split by)")
        split_by = config.split_by  # the config's column, cut where the command line says
    split = _config_split(config, data) if from_config and split_by is None else {}

    data_format = args.data_format or (config.data_format if from_config else "auto")
    table = config if config is not None and not _plain_text(data, data_format) else None  # its fields fit no text

    def pick(given, key: str, default, settings=config):
        if given is not None:
            return given
        return getattr(settings, key) if settings is not None and getattr(settings, key) is not None else default

    spec = EvalData(
        path=data, format=data_format, template=pick(args.template, "template", None, table),
        text_field=pick(args.text_field, "text_field", "text", table),
        text_unit=pick(args.text_unit, "text_unit", "line"), max_length=pick(args.max_length, "max_length", 512),
        numeric_fields=tuple(table.numeric_fields) if table is not None and table.numeric_fields else None,
        target=pick(args.target, "target", None, table),
        skip_bad_rows=bool(config is not None and config.skip_bad_rows),
        **{"split_by": split_by, "split_at": args.split_at, **split},
    )
    if spec.template and spec.target:  # a misspelled --target fails before the settings and notes are printed
        from ..training.data import template_place

        template_place(spec.template, spec.target)
    if path is not None:  # on stdout, unless the metrics go there as JSON
        out = sys.stderr if getattr(args, "json", None) == "-" else sys.stdout
        print(f"settings from {path}: {_describe_spec(spec, split)}", file=out)
        for note in _scoring_notes(config, data, spec, from_config, split):
            print(f"note: {note}", file=out)
    return spec


def _scoring_notes(config, data: str, spec, from_config: bool, split: dict) -> list[str]:
    """What makes the figures mean less than a forecast's: rows the model trained on, a field it was not fitted to."""
    notes = []
    if from_config and _same_file(data, (config.data,)) and not split and spec.split_at is None:
        held_out = f"it held out {config.validation_data} instead" if config.validation_data else \
            "its config holds no validation split"
        notes.append(f"the run trained on every row of {data} ({held_out}): these figures measure the fit to rows "
                     "it has seen, not a forecast")
    if config.target and spec.target and spec.target != config.target:
        notes.append(f"the run's intervals were fitted and checked for '{config.target}', not '{spec.target}': "
                     f"the coverage of '{spec.target}' is not calibrated")
    return notes


def trained_rows_note(args: argparse.Namespace, spec, documents: list) -> str | None:
    """A note when a split given on the command line (``--split-by``/``--split-at``) scores rows of the run's data
    file that the run trained on (a cut before the run's own): how many, since their figures measure a fit, not a
    forecast. None otherwise (the run's own split, another file, or no training config)."""
    import dataclasses

    from ..evaluation.evaluation import load_split_documents
    from ..training.data import SplitSpec, describe_split
    from ..training.train_config import load_train_config

    path = find_train_config(args)
    if path is None or spec.split_at is None:
        return None
    config = load_train_config(path)
    if not _same_file(spec.path, (config.data,)) or not (config.split_by or config.validation_split):
        return None
    run_split = _config_split(config, spec.path)
    if run_split.get("split_at") == spec.split_at and run_split.get("split_by") == spec.split_by:
        return None
    trained, _ = load_split_documents(dataclasses.replace(spec, **run_split))
    trained_rows = {(doc.source, doc.row) for doc in trained}
    seen = sum((doc.source, doc.row) in trained_rows for doc in documents)
    if not seen:
        return None
    run = SplitSpec(fraction=0.0 if config.split_at is not None else config.validation_split,
                    split_by=config.split_by, split_at=config.split_at)
    return (f"{seen} of the {len(documents)} rows scored are rows the run trained on (its split: "
            f"{describe_split(run)}): their figures measure the fit to rows it has seen, not a forecast")


def _plain_text(data: str, data_format: str) -> bool:
    """Whether ``data`` reads as plain text (no fields, so no template or target of a training table applies);
    False when it cannot be found (reading it names the problem)."""
    from ..training.data import detect_format, resolve_data_path

    try:
        return detect_format(resolve_data_path(data), data_format) == "text"
    except (ValueError, TypeError, FileNotFoundError):
        return False


def _same_file(data: str, names: tuple) -> bool:
    """Whether ``data`` names one of ``names`` (the config's data files), as written or as the same file."""
    if data in names:
        return True
    return Path(data).is_file() and any(name and Path(name).is_file() and Path(name).samefile(data) for name in names)


def _config_split(config, data: str) -> dict:
    """The validation side of the config's split, as `EvalData` fields (none for its validation_data file)."""
    if data == config.validation_data or (config.split_by is None and not config.validation_split):
        return {}
    return {"split_by": config.split_by, "split_at": config.split_at, "validation_split": config.validation_split,
            "seed": config.seed}


def _describe_spec(spec, split: dict) -> str:
    parts = [f"data {spec.path}"]
    if spec.template:
        parts.append(f"template {spec.template!r}")
    if split.get("split_at") is not None:
        parts.append(f"the rows with {spec.split_by} >= {spec.split_at!r} (training's validation rows)")
    elif split:
        parts.append(f"training's validation rows ({spec.validation_split:.0%})")
    elif spec.split_at is not None:
        parts.append(f"the rows with {spec.split_by} >= {spec.split_at!r}")
    else:
        parts.append("every row")
    if spec.target:
        parts.append(f"target {spec.target}")
    return ", ".join(parts)


def check_writable_file(path: str | None) -> None:
    """Raise ``ValueError`` when ``path`` (an output file) cannot be written (a folder is there, or no writable
    folder holds it), before any work is done."""
    if path is None or path == "-":
        return
    if Path(path).is_dir():
        raise ValueError(f"cannot write {path!r}: it is a folder; name a file")
    parent = Path(path).resolve().parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise ValueError(f"cannot write {path!r}: {str(probe)!r} is not a writable folder")


def check_not_an_input(path: str | None, model: str | None, data: str | None) -> None:
    """Raise ``ValueError`` when ``path`` (``--json``) names a file the command reads, which writing the metrics
    would destroy: the data file, or a file of the ``model`` folder (its config, weights, tokenizer). A metrics
    file an earlier ``eval`` wrote into the folder (`is_metrics_file`) may be written again."""
    if path is None or path == "-":
        return
    out = Path(path).expanduser().resolve()
    if data is not None and not data.startswith("vega:") and out == Path(data).expanduser().resolve():
        raise ValueError(f"--json {path!r} is the data file being scored; name another file for the metrics")
    if model is not None and Path(model).expanduser().resolve() in out.parents and out.is_file() \
            and not is_metrics_file(out):
        raise ValueError(f"--json {path!r} would overwrite {out.name} of the model folder {model!r}; name another "
                         "file for the metrics")


def is_metrics_file(path: Path) -> bool:
    """Whether ``path`` holds metrics as ``eval --json`` writes them (a JSON object naming its model, data and
    documents)."""
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(written, dict) and {"model", "data", "documents"} <= written.keys()


def check_number_choice(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` for ``--number-index`` with ``--all-numbers``: each chooses the numbers scored."""
    if args.number_index is not None and args.all_numbers:
        raise ValueError(f"--number-index {args.number_index} and --all-numbers each choose the numbers to score; "
                         "give one of them")


def run(args: argparse.Namespace) -> int:
    from ..evaluation.evaluation import checked_metrics, evaluate_documents, load_split_documents, training_median_mdae

    check_writable_file(args.json)
    check_number_choice(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    placement(args)  # a bad --device/--dtype fails before the data is read
    if args.model is not None:  # a mistyped --model is named as such, not as a missing --data
        from ..conversion.loading import check_causal_qwen_folder

        check_causal_qwen_folder(Path(args.model))
    spec = data_spec(args)
    check_not_an_input(args.json, args.model, spec.path)
    model, tokenizer = load_model(args)
    training, documents = load_split_documents(spec)
    note = trained_rows_note(args, spec, documents)
    if note is not None:
        print(f"note: {note}", file=sys.stderr if args.json == "-" else sys.stdout)
    result = evaluate_documents(model, tokenizer, documents, batch_size=args.batch_size, max_length=spec.max_length,
                                add_eos=spec.add_eos, language=args.metrics != "numbers",
                                bits=args.metrics != "numbers", target=spec.target)
    metrics = result.metrics(number_index=args.number_index, metric_set=args.metrics, all_numbers=args.all_numbers)
    if metrics.get("number_target") is not None and training:
        metrics["num_mdae_training_median"] = training_median_mdae(training, documents)
    metrics = checked_metrics(metrics, source=f"model {args.model or args.base!r}")
    metrics["model"] = args.model or args.base
    metrics["data"] = spec.path
    text = json.dumps(metrics, indent=2, allow_nan=False)
    if args.json == "-":
        print(text)
        return 0
    print(format_metrics(metrics))
    converted_from = str(getattr(model.config, "converted_from", None) or "")
    if converted_from.startswith("random:") and "perplexity" in metrics:
        print(f"note: a model converted from {converted_from} (random weights) learns a table's numbers, not "
              "language: its perplexity, accuracy and bits per byte say nothing of text (--metrics numbers leaves "
              "them out)")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
        print(f"metrics written to {path}")
    return 0


def format_metrics(metrics: dict) -> str:
    """A two-column text table of the metrics (calibration as its own block)."""
    labels = [
        ("documents", "documents"),
        ("token_count", "target tokens"),
        ("perplexity", "perplexity (softmax over loc_S)"),
        ("token_accuracy_softmax", "top-1 accuracy, softmax (traditional)"),
        ("token_accuracy_ovr", "top-1 accuracy, OvR (standard)"),
        ("ovr_target_prob", "mean OvR probability of the target"),
        ("ovr_prob_sum", "mean sum of OvR probabilities"),
        ("bits_per_byte", "bits per byte of the raw text"),
        ("number_bits_per_byte", "bits per byte of the numbers' characters"),
        ("bits_per_number_by_order", "bits per number, 1st / 2nd / ... of a text"),
        ("num_count", "number targets"),
        ("number_target", "numbers scored: the target field"),
        ("num_mdae", "median absolute error of loc_Y"),
        ("num_mdae_training_median", "the same, forecasting the training rows' median"),
        ("num_mape", "MAPE of loc_Y (%)"),
        ("num_log_score", "log score (mean Cauchy NLL)"),
        ("num_median_scale", "median scale_Y"),
        ("coverage_50", "coverage of central 50% interval"),
        ("coverage_90", "coverage of central 90% interval"),
        ("coverage_50_p_value", "chance calibrated 50% intervals err this far (binomial)"),
        ("coverage_90_p_value", "chance calibrated 90% intervals err this far (binomial)"),
        ("num_scale_error_spearman", "Spearman of scale_Y and |y - loc_Y|"),
        ("num_tail_ratio", "q90/q50 of |y - loc_Y|/scale_Y (Cauchy: 6.31)"),
    ]
    rows = [(label, _fmt(metrics[key]) + _why_missing(key, metrics)) for key, label in labels if key in metrics]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    if metrics.get("calibration"):
        lines += ["", "calibration (central intervals)", f"{'nominal':>8}  {'empirical':>9}"]
        lines += [f"{row['nominal']:>8.2f}  {row['empirical']:>9.3f}" for row in metrics["calibration"]]
    return "\n".join(lines)


def _why_missing(key: str, metrics: dict) -> str:
    """Why a figure that has no value has none (the Spearman correlation needs two numbers and varied ranks)."""
    if key != "num_scale_error_spearman" or metrics[key] is not None:
        return ""
    if (metrics.get("num_count") or 0) < 2:
        return " (fewer than two numbers)"
    return " (scale_Y, or the error, is the same at every number: nothing to rank)"


LIST_SHOWN = 10  # the entries of a list figure the table shows (a long text's bits per number by order: thousands)


def _fmt(value) -> str:
    """A figure as the table shows it; a list as its first `LIST_SHOWN` entries and how many there are."""
    if value is None or (isinstance(value, list) and not value):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, list):
        shown = " / ".join(_fmt(item) for item in value[:LIST_SHOWN])
        return shown if len(value) <= LIST_SHOWN else f"{shown} / … ({len(value):,} in all; --json lists every one)"
    return str(value)
