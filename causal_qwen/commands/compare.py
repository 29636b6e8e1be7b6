"""``causal-qwen compare``: verify that a conversion reproduces its Qwen base."""

from __future__ import annotations

import argparse
import json
import sys

from ..core.files import write_json_atomic
from .eval import add_device_arguments, check_writable_file, placement


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="verify a conversion against its Qwen base (exit status 1 when a check fails)",
        description="Convert --base and compare the result with the base itself on a few prompts: parameters, "
        "weight inheritance, features, classification scores vs Qwen logits, softmax agreement, abduction and "
        "OvR statistics, <NUM> probability. Exit status 1 when a check fails.",
    )
    parser.add_argument("--base", required=True, help="Qwen2 base: preset, folder, .gguf file or hub id")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --base")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="also write the report as JSON to PATH (to standard output when PATH is omitted or '-')",
    )
    parser.add_argument("--prompt", action="append", default=None, help="a prompt to compare on (repeatable)")
    add_device_arguments(parser)  # both models, base and conversion, on --device in --dtype
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import progress
    from ..evaluation.compare import compare_models, format_report
    from ..conversion.conversion import load_qwen_base
    from ..conversion.loading import convert_base

    check_writable_file(args.json)  # before any work: not after the comparison
    for index, prompt in enumerate(args.prompt or ()):
        if not prompt:
            raise ValueError(f"--prompt {index} is empty")
    device, dtype = placement(args)
    qwen = load_qwen_base(args.base, gguf_file=args.gguf_file, dtype=dtype).to(device)
    causal, tokenizer = convert_base(load_qwen_base(args.base, gguf_file=args.gguf_file, dtype=dtype), device=device)
    kwargs = {"prompts": tuple(args.prompt)} if args.prompt else {}
    report = compare_models(qwen, causal, tokenizer, base_name=str(args.base), **kwargs)
    with progress.bar(total=1, desc="compare: greedy generation parity", unit="check") as bar:
        _add_generation_parity(report, qwen, causal, tokenizer)
        bar.update(1)
    if args.json == "-":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
        if args.json:
            write_json_atomic(args.json, report.to_dict())  # creates a new folder check_writable_file allowed
            print(f"\nJSON report written to {args.json}", file=sys.stderr)
    return 0 if report.passed else 1


def _add_generation_parity(report, qwen, causal, tokenizer) -> None:
    """Greedy traditional generation vs ``Qwen2ForCausalLM.generate`` (from the generation module)."""
    try:
        from ..core.text_generation import greedy_parity
    except ImportError:
        return
    parity = greedy_parity(qwen, causal, tokenizer)
    report.extra.update(parity)
    report.checks["greedy_parity"] = parity["greedy_match_tokens"] == parity["greedy_total_tokens"]
