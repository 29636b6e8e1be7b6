"""Writing files so that no reader ever finds half of one. Standard library only: a saved model folder carries
this module (the model's and the tokenizer's ``save_pretrained`` use it)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

Written = TypeVar("Written")

_SHARD = re.compile(r"(.*?)-\d{5}-of-\d{5}")
"""A weight shard's name without its suffix (``model-00001-of-00003``), as transformers names them."""


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, fsync and rename (never a half-written file)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def write_json_atomic(path: str | os.PathLike, value: Any) -> None:
    """Write ``value`` as strict JSON (indented; an undefined figure, NaN or ±inf, as null) through
    `write_text_atomic`, creating the folders above ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(finite_or_none(value), indent=2, allow_nan=False) + "\n")


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float inside it (NaN, ±inf) as None, so that strict JSON can hold it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    return value


def save_through_staging(directory: str | os.PathLike, write: Callable[[Path], Written]) -> Written:
    """Run ``write(staging)`` on a new empty folder beside ``directory``, then move each file it wrote into
    ``directory`` (created if missing) by one rename: a process killed at any moment leaves every file of
    ``directory`` whole, the earlier save's or this one's, never half of one (the renames are not fsynced: a
    power cut is out of scope, as for transformers' own writes). Files of ``directory`` that ``write`` did not
    produce are kept, except weight shards (``model-00001-of-00003.safetensors``) that this save does not
    replace, which transformers' ``save_pretrained`` removes too. The staging folder is removed whatever happens.
    Returns what ``write`` returned."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"cannot save into {directory}: it is a file, not a folder")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.staging-", dir=directory.parent))
    try:
        written = write(staging)
        produced = sorted(path.relative_to(staging) for path in staging.rglob("*") if path.is_file())
        directory.mkdir(exist_ok=True)
        for name in produced:
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, directory / name)
        _remove_stale_shards(directory, {str(name) for name in produced})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _remove_stale_shards(directory: Path, produced: set[str]) -> None:
    """Delete the weight shards of an earlier save in ``directory`` that no file of this save replaces."""
    for path in directory.iterdir():
        stem = path.name.replace(".safetensors", "").replace(".bin", "")
        if path.is_file() and path.name not in produced and _SHARD.fullmatch(stem) and (
                path.name.startswith("model") or path.name.startswith("pytorch_model")):
            path.unlink()
