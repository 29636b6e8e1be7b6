"""A data table as rows, for the baselines that read its columns directly (the model reads the same file as
documents, `causal_qwen.training.data.read_documents`).

Shape legend: R rows.

A table is the CSV/TSV or JSON Lines file at a path or ``vega:NAME``, read as training reads it
(`causal_qwen.training.data.read_rows`: the format by suffix or ``data_format``, a byte-order mark dropped, header
names and the cells after ``, `` stripped of their spaces, tabs between the cells of a ``.tsv``). Each row is a
`TableRow`: a dictionary from column name to what the file holds there (CSV: the text; JSONL: the JSON value) that
knows where it was written, for error messages. `read_training_table` keeps the rows training turns into documents
(with ``skip_bad_rows``, training's skipped rows are left out here too), so the baselines and the model see the
same rows. A number cell is read with the number grammar, as training reads it
(`causal_qwen.training.data.parse_cell_number`: ``"$2,078"``, ``"12%"``, ``"1,234.5"``). A table is split as
training splits documents: the rows whose ``split_by`` value is < ``split_at`` train, the others are held out, the
values compared as numbers or dates (`causal_qwen.training.data.split_key`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ..training.data import DataSource


class TableRow(dict):
    """One row of a table: column name → cell. ``row``: the number a training `Document` of it carries (a CSV file's
    1-based data row, a JSONL file's line); ``where``: the row as training's messages name it
    (``"FILE: row 3 (line 4)"``, ``"FILE: line 4"``)."""

    def __init__(self, cells: dict[str, Any], row: int, where: str) -> None:
        super().__init__(cells)
        self.row = row
        self.where = where


def read_table(data: str, data_format: str = "auto", skip_bad_rows: bool = False) -> list[TableRow]:
    """Every row of ``data`` (a path or ``vega:NAME``; ``data_format`` and ``skip_bad_rows`` as in a training config)
    as training reads it (`causal_qwen.training.data.read_rows`), in file order."""
    from ..training.data import detect_format, read_rows, resolve_data_path

    path = resolve_data_path(data)
    is_csv = detect_format(path, data_format) == "csv"
    rows = read_rows(data, data_format, skip_bad_rows)
    if is_csv:
        return [TableRow(cells, index, f"{path}: row {index} (line {line})")
                for index, (line, cells) in enumerate(rows, start=1)]
    return [TableRow(cells, line, f"{path}: line {line}") for line, cells in rows]


def read_training_table(source: DataSource) -> list[TableRow]:
    """The rows of ``source`` (a `causal_qwen.training.data.DataSource`) that training turns into documents, in file
    order. Every row is checked first as training checks it (`read_documents`: the header, the template's fields,
    the number cells, the target; a bad row raises ``ValueError`` naming the file, row and line), so a table
    training refuses fails here in seconds; with ``source.skip_bad_rows`` the rows training skips are left out."""
    from ..training.data import read_documents

    kept = {document.row for document in read_documents(source)}
    return [row for row in read_table(source.path, source.format, source.skip_bad_rows) if row.row in kept]


def require_columns(rows: Sequence[dict[str, str]], columns: Sequence[str], where: str) -> None:
    """``ValueError`` naming the ``columns`` that the table ``where`` (its ``rows``) lacks."""
    missing = [name for name in columns if rows and name not in rows[0]]
    if missing:
        raise ValueError(f"{where}: fields {missing} of the template/split are not columns")


def split_rows(rows: list[dict[str, str]], split_by: str, split_at: str) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: rows whose ``split_by`` value is < / >= ``split_at``, compared as numbers or dates
    as training splits them (`causal_qwen.training.data.split_key`)."""
    from ..training.data import split_key

    where = [_where(row, index) for index, row in enumerate(rows)]
    key = split_key([row[split_by] for row in rows], split_at, split_by, where)
    cut = key.parse_cut(split_at)
    train = [row for row in rows if key(row[split_by]) < cut]
    held_out = [row for row in rows if key(row[split_by]) >= cut]
    if not train or not held_out:
        raise ValueError(f"splitting by {split_by!r} at {split_at!r} leaves {len(train)} train / {len(held_out)} held-out rows")
    return train, held_out


def column_values(rows: Sequence[dict[str, Any]], column: str) -> Tensor:
    """The numbers in ``column`` of each row, read as training reads a number cell
    (`causal_qwen.training.data.parse_cell_number`: ``"$2,078"`` → 2078.0, ``"12%"`` → 12.0): (R,) float64;
    ``ValueError`` naming the file, row and line of a cell that holds no number."""
    from ..training.data import parse_cell_number

    values = []
    for index, row in enumerate(rows):
        value = parse_cell_number(row.get(column))
        if value is None:
            held = f"holds {row[column]!r}, which is not a number" if column in row else "is missing"
            raise ValueError(f"{_where(row, index)}: column '{column}' {held}")
        values.append(value)
    return torch.tensor(values, dtype=torch.float64)  # (R,)


def _where(row: dict[str, Any], index: int) -> str:
    """Where ``row`` (the ``index``-th, from 0) was written: its `TableRow.where`, else its place in the list."""
    return getattr(row, "where", f"row {index + 1}")
