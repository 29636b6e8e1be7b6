"""``causal-qwen train CONFIG.yaml [--set key=value ...] [--resume]``: fine-tune with `transformers.Trainer`.

Runs as it is under ``torchrun --nproc_per_node N`` and ``accelerate launch`` (one process per device).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from ..training.run_folder import OutputLock
from ..training.train_config import describe_keys, load_train_config, valid_keys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="fine-tune a CausalQwen model on text with numbers (YAML config)",
        description="Fine-tune on JSON Lines, plain text or CSV-with-template data as CONFIG says, with "
        "transformers.Trainer: per-group learning rates, backbone freezing or LoRA, checkpoints, evaluation, "
        "TensorBoard, OUTPUT_DIR/metrics.jsonl and OUTPUT_DIR/final. Runs unchanged under torchrun and "
        "accelerate launch. Config keys (--keys says what each does): " + ", ".join(valid_keys()) + ".",
    )
    parser.add_argument("config", nargs="?", help="YAML file of settings: data, template, target and a split (split_by and "
                        "split_at, or validation_split) are enough, the rest comes from the recipe of the base's kind "
                        "(README, 'Training on your own CSV'; examples/seattle_weather.yaml sets more)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting (repeatable; VALUE is read as YAML): --set max_steps=60 "
        "--set model_config.ovr_negatives=2048",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from the newest complete checkpoint in OUTPUT_DIR (or from the CHECKPOINT folder given); "
        "says which; a finished run is left as it is",
    )
    parser.add_argument("--keys", action="store_true",
                        help="print every config key with its default and what it does, then exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.keys:
        print(describe_keys())
        return 0
    if args.config is None:
        raise ValueError("give the training config (a YAML file), or --keys to list its settings")
    config = load_train_config(args.config, args.overrides)
    main_process = int(os.environ.get("RANK", "0")) == 0
    if main_process:  # a folder in use fails at once, before the training stack loads (seconds)
        OutputLock(config.output_dir).check_free()

    from .. import progress
    from ..training.monitoring import ProgressLines, read_metrics
    from ..training.training import run_training

    later = fields_after_target(config)
    pending = [f"warning: target '{config.target}' is not the template's last field: the model forecasts it from the "
               f"text before it, so {', '.join(repr(name) for name in later)} cannot inform it; put the target last"
               ] if later else []

    def report(message: str) -> None:
        if main_process:
            print(message, flush=True)
            if pending and message.startswith("data: "):  # after the rows are read: a bad row's error comes alone
                print(pending.pop(), flush=True)

    # A terminal gets Trainer's step bar; a log file (or --quiet) gets none: there a line per logging step
    # ("step 10/180, loss ...") tells a person reading the log how far the run is (none with --quiet).
    callbacks = []
    if not progress.enabled():
        config.progress_bar = False
        if progress.mode() != "never":
            callbacks.append(ProgressLines(report))
    result = run_training(config, resume=args.resume, report=report, callbacks=callbacks)
    if not main_process or not result.trained:
        return 0
    steps = [r for r in read_metrics(result.metrics_file) if "loss" in r] if result.metrics_file.is_file() else []
    mean = f" (mean loss {result.train_loss:.4g})" if result.train_loss is not None else ""
    start = re.fullmatch(r"checkpoint-(\d+)", Path(str(result.resumed_from or "")).name)  # rotated away by now
    if start and result.train_loss is not None:  # Trainer averages the loss over this session's steps only
        mean = f" ({result.global_step - int(start[1])} of them after resuming, mean loss {result.train_loss:.4g})"
    print(f"trained {result.global_step} steps{mean}")
    if steps:
        last = steps[-1]
        parts = ", ".join(f"{key} {_figure(last[key])}" for key in ("loss", "cls_loss", "reg_loss") if key in last)
        print(f"last logged step {last['step']}: {parts}")
    print(f"metrics: {result.metrics_file}")
    if result.adapter_dir is not None:
        print(f"adapter: {result.adapter_dir}")
    print(f"model:   {result.final_dir}")
    return 0


def fields_after_target(config) -> list[str]:
    """The template's fields written after the target (none without a target or a template)."""
    if config.target is None or config.template is None:
        return []
    from ..training.data import template_fields

    fields = template_fields(config.template)
    return fields[fields.index(config.target) + 1:]


def _figure(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "n/a"
