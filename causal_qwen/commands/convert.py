"""``causal-qwen convert``: write a converted model and its tokenizer to a folder."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from .eval import add_device_arguments, placement


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a Qwen2 base into a CausalQwen model folder",
        description="Convert a Qwen2/Qwen2.5 base (preset random:tiny, random:tiny-untied, random:qwen2.5-0.5b; "
        "a local folder; a .gguf file; or a hub id) into CausalQwen with the initialisation of docs/design.md, and "
        "write model (safetensors) and tokenizer to --out. The base is loaded, converted and calibrated on --device "
        "and saved in --dtype (its calibrated scales and thresholds in float32).",
    )
    parser.add_argument("--base", required=True, help="Qwen2 base: preset, folder, .gguf file or hub id")
    parser.add_argument("--out", required=True, help="output folder (created; must be empty or absent)")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --base (a folder or hub id)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the conversion's random draws (default 0)")
    parser.add_argument("--decimal-comma", action="store_true",
                        help="the saved tokenizer reads ',' as the decimal point and '.' as the thousands separator "
                        "(German, French, ... text: '3,5' is 3.5, '1.234,5' is 1234.5; docs/number_grammar.md)")
    add_device_arguments(parser)  # the base is loaded, converted, calibrated and saved in --dtype, on --device
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..conversion.loading import convert_base

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a folder; name a new or empty folder")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"output folder {str(out)!r} is not empty")
    if any(parent.exists() and not parent.is_dir() for parent in out.parents):
        raise ValueError(f"--out {str(out)!r} cannot be created: a parent of it is a file")
    device, dtype = placement(args)
    model, tokenizer = convert_base(args.base, gguf_file=args.gguf_file, device=device, dtype=dtype, seed=args.seed)
    tokenizer.decimal_comma = args.decimal_comma  # saved with the tokenizer: generate, predict and eval read so
    target = out.resolve()  # `--out .` or `--out ..`: a name and a parent to stage beside it
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700; the model folder gets a plain mkdir's mode
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():  # an empty folder given (perhaps the working directory): fill it, keep the folder
            for child in staging.iterdir():
                os.replace(child, target / child.name)
            staging.rmdir()
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    parameters = sum(p.numel() for p in model.parameters())
    print(f"wrote CausalQwen model ({parameters:,} parameters, {str(dtype).removeprefix('torch.')}) to {out}")
    return 0


def _umask() -> int:
    """The process's file-creation mask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
