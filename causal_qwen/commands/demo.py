"""``causal-qwen demo [--base PATH]``: the end-to-end story on the embedded default (random:tiny + Seattle weather),
or on a real Qwen with real sentences in every mode."""

from __future__ import annotations

import argparse
import sys

from .eval import add_device_arguments, placement


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="end-to-end demo: convert random:tiny, verify, fine-tune on Seattle weather, evaluate, plot, generate",
        description="Convert random:tiny, verify the conversion, fine-tune on seattle-weather.csv with the settings "
        "of examples/seattle_weather_demo.yaml (earlier days train, 2015 is held out), evaluate the predicted daily high against a training-median and a linear "
        "baseline, write plots, generate in each mode with a replayed individual. Writes OUT/report.json and PNGs. "
        "Every stage runs on --device; conversion and training keep float32 weights (training with bfloat16 autocast "
        "when --dtype is bfloat16 on a CUDA GPU) and the trained model is evaluated and generates in --dtype.",
    )
    parser.add_argument("--out", default="demo_output",
                        help="output folder (default demo_output): new, empty, or an earlier demo's, whose converted/, "
                        "training/, report.json, compare.json and plots are replaced; a folder holding other files is "
                        "refused")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a few steps, small subsets, the conversion verified on three short prompts "
                             "(figures meaningless)")
    parser.add_argument("--base", default=None, metavar="PATH|HUB_ID",
                        help="run the demo on this Qwen2/Qwen2.5 base (a .gguf file, folder or hub id) instead of "
                             "random:tiny: the settings of examples/seattle_weather.yaml with the pretrained recipe, "
                             "and real sentences in every mode (about 10 minutes for a 0.5B model on 2 CPU cores)")
    parser.add_argument("--config", default=None, metavar="TRAIN.yaml",
                        help="training settings (default examples/seattle_weather_demo.yaml, or "
                             "examples/seattle_weather.yaml with a real --base; the examples `causal-qwen train` reads); "
                             "its data is read and checked as `train` reads it, before the conversion starts, and the "
                             "baselines are scored on the rows the model is (skip_bad_rows skips the same rows)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the config's, 180; 4 "
                        "with --quick)")
    parser.add_argument("--seed", type=int, default=None, help="random seed of training and generation (default: "
                        "the config's, 0)")
    add_device_arguments(parser)  # every stage on --device; --dtype: the trained model's in evaluation and generation
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from ..evaluation.demo import DemoSettings, run_demo

    hf_logging.disable_progress_bar()  # the demo prints its own progress
    device, dtype = placement(args)
    console = sys.stdout

    def progress(message: str) -> None:
        print(message, file=console, flush=True)

    extra = {"config": args.config} if args.config else {}
    settings = DemoSettings(out=args.out, quick=args.quick, max_steps=args.steps, seed=args.seed, device=device,
                            dtype=dtype, base_model=args.base, **extra)
    report = run_demo(settings, progress=progress)
    if not settings.quick:
        progress("acceptance figures:")
        for name, passed in report["acceptance"].items():
            progress(f"  {'PASS' if passed else 'FAIL'}  {name}")
    return 0
