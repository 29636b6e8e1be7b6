"""A data table as rows of text, for the baselines that read its columns directly (the model reads the same file as
documents, `causal_qwen.training.data.read_documents`).

Shape legend: R rows.

A table is the CSV file at a path or ``vega:NAME`` (`causal_qwen.training.data.resolve_data_path`), each row a
dictionary from column name to the text written there. It is split as training splits documents: the rows whose
``split_by`` value is < ``split_at`` train, the others are held out, the values compared as numbers or dates
(`causal_qwen.training.data.split_key`).
"""

from __future__ import annotations

import csv
from typing import Sequence

import torch
from torch import Tensor


def read_table(data: str) -> list[dict[str, str]]:
    """The CSV rows of ``data`` (a path or ``vega:NAME``) as dictionaries."""
    from ..training.data import resolve_data_path

    with resolve_data_path(data).open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def require_columns(rows: Sequence[dict[str, str]], columns: Sequence[str], where: str) -> None:
    """``ValueError`` naming the ``columns`` that the table ``where`` (its ``rows``) lacks."""
    missing = [name for name in columns if rows and name not in rows[0]]
    if missing:
        raise ValueError(f"{where}: fields {missing} of the template/split are not columns")


def split_rows(rows: list[dict[str, str]], split_by: str, split_at: str) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: rows whose ``split_by`` value is < / >= ``split_at``, compared as numbers or dates
    as training splits them (`causal_qwen.training.data.split_key`)."""
    from ..training.data import split_key

    key = split_key([row[split_by] for row in rows], split_at, split_by)
    cut = key.parse_cut(split_at)
    train = [row for row in rows if key(row[split_by]) < cut]
    held_out = [row for row in rows if key(row[split_by]) >= cut]
    if not train or not held_out:
        raise ValueError(f"splitting by {split_by!r} at {split_at!r} leaves {len(train)} train / {len(held_out)} held-out rows")
    return train, held_out


def column_values(rows: Sequence[dict[str, str]], column: str) -> Tensor:
    """The numbers written in ``column`` of each row: (R,) float64."""
    return torch.tensor([float(row[column]) for row in rows], dtype=torch.float64)
