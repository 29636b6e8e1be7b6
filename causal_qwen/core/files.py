"""Writing a file so that no reader ever finds half of it. Standard library only: a saved model folder carries
this module (the tokenizer's ``save_pretrained`` uses it)."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, fsync and rename (never a half-written file)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
