"""Training documents from JSON Lines, plain text and CSV tables; train/validation splits.

A *document* is one training text plus where it came from (file and row, for error messages) and, when
the data is split by a column, that row's value in the column.

Sources (``DataSource.path``; ``vega:NAME`` names a file shipped with the ``vega-datasets`` package):

- JSON Lines: one object per line; the text is the ``text_field`` value, or the ``template`` filled from
  the object's fields.
- Plain text: one document per non-empty line (``text_unit="line"``) or per blank-line-separated block
  (``text_unit="block"``).
- CSV / TSV: every row becomes a document through the ``template``, a Python format string with named
  fields (``"On {date} Seattle saw {precipitation} mm of rain"``), or is read from a ``text_field`` column.

Template fields that hold numbers (``numeric_fields``, or inferred: the fields whose values are mostly
numbers) are checked on every row; a row with a non-numeric value there raises ``ValueError`` naming the
file and row, or is skipped with a warning when ``skip_bad_rows`` is set; but beside a ``target``, a field that was
only guessed numeric writes such a cell as its text (``"12 Pro"``; `TemplateRenderer`), counted in one warning. A
numeric cell is written into the text as the file spells it (``"12.80"`` stays ``"12.80"``), so the tokenizer reads
the same float64 value and keeps the same string. A numeric cell the tokenizer does not read, in the filled text,
as that one number (a cell it reads as text, ``"007"``, ``"2024-03-15"``, a 16-digit id; as several numbers; or glued
to the template's text around it, ``"v{x}"``) is logged once per field (docs/number_grammar.md); in the ``target``
field it is a bad row, since the model would never see the number it is scored on. A numeric cell may also be
written the way the number grammar reads it (``"29,900"``, ``"29.9%"``): see `parse_cell_number`.

Files are read as UTF-8 text; a leading byte-order mark (Excel's "CSV UTF-8") is dropped, and a file that is
not UTF-8 raises ``ValueError`` naming the file and line, as does a compressed one (``data.csv.gz``).
"""

from __future__ import annotations

import csv
import datetime
import functools
import io
import json
import logging
import math
import random
import re
import string
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

logger = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "text", "csv")
TEXT_UNITS = ("line", "block")
VEGA_PREFIX = "vega:"
_SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv"}


@dataclass(frozen=True)
class Document:
    """One training text. ``row``: 1-based data row (JSONL/text: line number); ``split_value``: the row's
    value in the split column, or None. With a ``target`` field: ``target_ordinal``, the index among the
    text's numbers of the number the field renders as, and ``target_value``, its value (else None)."""

    text: str
    source: str
    row: int
    split_value: Any = None
    target_ordinal: int | None = None
    target_value: float | None = None


@dataclass(frozen=True)
class DataSource:
    """How to read one file into documents (see the module docstring)."""

    path: str
    format: str = "auto"
    text_field: str = "text"
    template: str | None = None
    numeric_fields: Sequence[str] | None = None
    skip_bad_rows: bool = False
    text_unit: str = "line"
    split_by: str | None = None
    target: str | None = None
    """A template field holding the number to score (its place in each text is recorded on the documents)."""


class BadRow(ValueError):
    """A row that cannot become a document; ``str()`` names the file and row."""


# ---- locating files --------------------------------------------------------------------------------------
def resolve_data_path(spec: str) -> Path:
    """A local path, or ``vega:NAME`` for a file shipped with ``vega-datasets`` (``vega:seattle-weather.csv``)."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"data path must be a non-empty string, got {spec!r}")
    if spec.startswith(VEGA_PREFIX):
        return vega_dataset_path(spec[len(VEGA_PREFIX) :])
    path = Path(spec).expanduser()
    if path.is_dir():
        raise ValueError(f"data file {spec!r} is a folder; name a file in it")
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative paths are read from the working directory, {Path.cwd()})"
        raise FileNotFoundError(f"data file {spec!r} does not exist{where}")
    return path


def vega_dataset_path(name: str) -> Path:
    """Path of a file shipped inside the ``vega-datasets`` package (``.csv`` is appended when missing)."""
    import importlib.util

    spec = importlib.util.find_spec("vega_datasets")
    if spec is None or spec.origin is None:
        raise ValueError(f"data 'vega:{name}' needs the vega-datasets package (pip install vega-datasets)")
    data_dir = Path(spec.origin).parent / "_data"
    candidates = [data_dir / name] if Path(name).suffix else [data_dir / f"{name}.csv", data_dir / f"{name}.json"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    available = sorted(p.name for p in data_dir.glob("*") if p.is_file())
    raise ValueError(f"vega-datasets ships no file {name!r}; available: {', '.join(available)}")


def detect_format(path: Path, declared: str = "auto") -> str:
    """``declared`` unless it is ``"auto"``; then by suffix (.jsonl/.json → jsonl, .csv/.tsv → csv, else text)."""
    if declared not in FORMATS:
        raise ValueError(f"data format must be one of {FORMATS}, got {declared!r}")
    if declared != "auto":
        return declared
    return _SUFFIX_FORMATS.get(path.suffix.lower(), "text")


# ---- templates -------------------------------------------------------------------------------------------
def template_fields(template: str) -> list[str]:
    """Named fields of a format string, in order of first use: ``"{a} and {b:.1f}"`` → ``["a", "b"]``."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        bang = re.search(r"\{[^{}:!]*!(?![rsa](?:[}:]|$))", template)  # '{Price!}': not a conversion '{x!r}'
        hint = "; a '!' in a field name starts a conversion (!r, !s, !a): rename the column without '!'" if bang else ""
        raise ValueError(f"template {template!r} is not a valid format string: {error}{hint}") from error
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ValueError(f"template {template!r} uses a positional field '{{{name}}}'; name every field")
        root = name.split(".")[0].split("[")[0]
        if root not in fields:
            fields.append(root)
    if not fields:
        raise ValueError(f"template {template!r} has no named field (e.g. '{{date}}')")
    return fields


def parse_number(value: Any) -> float | None:
    """The finite float a cell holds, or None (empty, text, NaN, inf, an int beyond float's range, bool)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # a JSON integer of hundreds of digits
            return None
    else:
        text = str(value).strip()
        if "_" in text:  # float() accepts "1_000"; a data cell with it is text
            return None
        try:
            number = float(text)
        except ValueError:
            return None
    return number if math.isfinite(number) else None


def parse_cell_number(value: Any) -> float | None:
    """The finite float a numeric cell holds: `parse_number`'s, else the one number the tokenizer's number grammar
    (`causal_qwen.core.numbers.find_numbers`, default mode) reads in the whole cell, with at most a ``+`` or a
    currency sign before it and a ``%`` or ``.`` after it (``"29,900"`` → 29900.0, ``"29.9%"`` → 29.9,
    ``"$1,234.50"`` → 1234.5); None when the cell is not exactly one number (``"5km"``, ``"1-2"``). ``"007"`` is 7.0
    here, as ``float`` reads it; in a sentence the tokenizer reads it as text, which the target check names."""
    number = parse_number(value)
    if number is not None or not isinstance(value, str):
        return number
    return _grammar_number(value.strip())


def _grammar_number(text: str) -> float | None:
    """The value of the one number the number grammar reads in ``text`` (see `parse_cell_number`), or None."""
    from ..core.numbers import find_numbers

    spans = find_numbers(text)
    if len(spans) != 1:
        return None
    span = spans[0]
    before, after = text[: span.start], text[span.end :]
    if before not in ("", "+") and not (len(before) == 1 and unicodedata.category(before) == "Sc"):
        return None
    if after not in ("", "%", "."):
        return None
    return span.value if math.isfinite(span.value) else None


def not_a_number_hint(value: Any) -> str:
    """Why a cell that looks like a number is none (``""`` when there is nothing to add): a decimal comma
    (``"2.078,0"``, ``"3,5"``), which the number grammar's default mode, the one data cells are read with, takes
    for a thousands separator or a list separator."""
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,3}(\.\d{3})*,\d+|[+-]?\d+,\d+", value.strip()):
        return ("; decimal commas are not read in data cells (',' separates thousands or numbers there): write "
                "the number with a decimal point and no thousands dots (2078.0 for 2.078,0)")
    return ""


def infer_numeric_fields(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> list[str]:
    """Template fields whose non-empty values are mostly (more than half) numbers (`parse_cell_number`)."""
    numeric = []
    for field in fields:
        values = [row.get(field) for row in rows if row.get(field) not in (None, "")]
        if values and sum(parse_cell_number(v) is not None for v in values) * 2 > len(values):
            numeric.append(field)
    return numeric


class TemplateRenderer:
    """Fills ``template`` from a row, checking that ``numeric_fields`` hold numbers and that the tokenizer reads
    each of them, in the filled text, as the one number the field renders (`number_read_at`; a field that fails is
    logged once and not checked again).

    ``text_fallback``: numeric fields that were only guessed (`infer_numeric_fields`) and are not the target; a
    non-empty cell there that is not a number (``"12 Pro"`` among model numbers, ``"N/A"`` among zip codes) is
    written as the text it is and counted in `text_cells`, not a bad row: the field stays numeric for its number
    cells (their spelling kept, the tokenizer's reading checked), and a row is not lost for a context cell. An empty
    cell, or a template format spec on the field (``{x:.1f}`` cannot format text), still makes a bad row.
    ``numeric_reasons``: per field, why it is numeric (named in a bad row's message)."""

    def __init__(self, template: str, numeric_fields: Sequence[str], text_fallback: Sequence[str] = (),
                 numeric_reasons: dict[str, str] | None = None) -> None:
        self.template = template
        self.fields = template_fields(template)
        unknown = [f for f in numeric_fields if f not in self.fields]
        if unknown:
            raise ValueError(f"numeric_fields {unknown} are not fields of the template {template!r}")
        self.numeric_fields = list(numeric_fields)
        self._formatted_fields = {
            name.split(".")[0].split("[")[0]
            for _, name, spec, _ in string.Formatter().parse(template)
            if name is not None and spec
        }
        self._places = {field: template_place(template, field) for field in self.numeric_fields}
        self._warned: set[str] = set()
        self.empty_cells: dict[str, int] = {}  # text field → rows that left it empty (filled with "")
        self.text_fallback = [f for f in text_fallback if f in self.numeric_fields and f not in self._formatted_fields]
        self.text_cells: dict[str, list[str]] = {}  # text_fallback field → the non-number cells written as text
        self.numeric_reasons = dict(numeric_reasons or {})

    def fill(self, row: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
        """``(text, values)``: the filled template and the value each field was filled with."""
        values, as_text = {}, set()
        for field in self.fields:
            value = row.get(field)
            if value is None and field in row and field not in self.numeric_fields:
                value = ""  # JSON null in a text field: an empty cell
            if value is None or (isinstance(value, str) and not value.strip() and field in self.numeric_fields):
                raise BadRow(f"{where}: template field '{field}' has no value")
            if isinstance(value, str) and not value.strip():
                self.empty_cells[field] = self.empty_cells.get(field, 0) + 1
            if field in self.numeric_fields:
                number = parse_cell_number(value)
                if number is None and field in self.text_fallback and isinstance(value, str):
                    self.text_cells.setdefault(field, []).append(value)
                    as_text.add(field)
                elif number is None:
                    reason = self.numeric_reasons.get(field)
                    raise BadRow(f"{where}: template field '{field}' holds {value!r}, which is not a number"
                                 f"{not_a_number_hint(value)}" + (f" ({reason})" if reason else ""))
                # Keep the file's spelling ("0.0", "12.8") unless the template formats the number itself.
                value = _spec_value(number, value) if field in self._formatted_fields else str(value).strip()
            values[field] = value
        try:
            text = self.template.format_map(values)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
            objects = [field for field in self.fields if isinstance(values.get(field), dict)]
            if isinstance(error, AttributeError) and objects:  # '{meta.city}' on a JSON object: not a row's fault
                raise ValueError(f"{where}: cannot fill the template {self.template!r}: '{objects[0]}' holds a JSON "
                                 f"object, whose keys a template reads as {{{objects[0]}[key]}}, not "
                                 f"{{{objects[0]}.key}}") from None
            raise BadRow(f"{where}: cannot fill the template {self.template!r}: {error}") from error
        unchecked = [field for field in self.numeric_fields if field not in self._warned and field not in as_text]
        spans = _number_spans(text) if unchecked else []
        for field in unchecked:
            if number_read_at(spans, values, *self._places[field]) is None:
                self._warned.add(field)
                logger.warning("%s: numeric field '%s' holds %r, which the tokenizer does not read as one number "
                               "in the text %r (it stays text, splits or glues to its neighbours; "
                               "docs/number_grammar.md); later rows are not reported", where, field,
                               row.get(field), text)
        return text, values

    def render(self, row: dict[str, Any], where: str) -> str:
        """The filled template (`fill`)."""
        return self.fill(row, where)[0]


def _spec_value(number: float, cell: Any) -> float | int:
    """The value a format spec formats (``{x:,}``, ``{x:03d}``, ``{x:.2f}``): an ``int`` for a cell written as a whole
    number (JSON ``12``, ``"12"``, ``"12,345"``), so that ``{x:,}`` writes ``12,345`` (not ``12,345.0``) and ``{x:d}``
    formats it; else the float."""
    if number.is_integer() and abs(number) < 2**53 and not isinstance(cell, float) \
            and re.fullmatch(r"[+-]?\d{1,3}(,\d{3})*|[+-]?\d+", str(cell).strip()):
        return int(number)
    return number


def template_place(template: str, field: str) -> tuple[str, str]:
    """``(prefix, placeholder)``: the part of ``template`` before the first placeholder of ``field``, and that
    placeholder (``"{y:.1f}"``), both format strings."""
    pieces = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        pieces.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is None:
            continue
        placeholder = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if name.split(".")[0].split("[")[0] == field:
            return "".join(pieces), placeholder
        pieces.append(placeholder)
    raise ValueError(f"the field '{field}' is not a field of the template {template!r}")


def number_read_at(spans: list[tuple[int, int, float]], values: dict[str, Any], prefix: str,
                   placeholder: str) -> int | None:
    """Index, among the numbers the tokenizer reads in a filled text (``spans``: `_number_spans` of it), of the one
    number that ``placeholder`` renders at the place ``prefix`` puts it; None when the rendered value alone is not
    one number (``"007"``, ``"1-2"``) or the text around it changes the reading (``"x-{y}"``, ``"v{y}"``)."""
    start = len(prefix.format_map(values))
    alone = _number_spans(placeholder.format_map(values))
    if len(alone) != 1:
        return None
    begin, end, value = alone[0]
    wanted = (start + begin, start + end, value)
    return spans.index(wanted) if wanted in spans else None


def _number_spans(text: str) -> list[tuple[int, int, float]]:
    """``(start, end, value)`` of every number the tokenizer reads in ``text`` (`find_numbers`)."""
    from ..core.numbers import find_numbers

    return [(span.start, span.end, span.value) for span in find_numbers(text)]


# ---- readers ---------------------------------------------------------------------------------------------
def read_documents(source: DataSource) -> list[Document]:
    """All documents of one source; raises ``ValueError`` on a bad row (unless skipped) or when none are left."""
    if source.text_unit not in TEXT_UNITS:
        raise ValueError(f"text_unit must be one of {TEXT_UNITS}, got {source.text_unit!r}")
    path = resolve_data_path(source.path)
    _check_not_compressed(path)
    data_format = detect_format(path, source.format)
    if data_format == "text":
        if source.template is not None or source.split_by is not None or source.target is not None:
            raise ValueError(f"{path}: plain text files have no fields; template, split_by and target need JSONL or "
                             f"CSV data: if the {path.suffix or 'suffix-less'} file holds a CSV table (or JSON Lines), "
                             "set data_format: csv (or jsonl)")
        documents = list(_read_text(path, source.text_unit))
    else:
        rows, unit = _read_jsonl_rows(path, source.skip_bad_rows) if data_format == "jsonl" \
            else (_read_csv_rows(path), "line")
        documents = _rows_to_documents(path, rows, source, data_format, unit)
    if not documents:
        raise ValueError(f"{path}: the dataset is empty (no documents were read)")
    logger.info("read %d documents from %s", len(documents), path)
    return documents


def read_rows(spec: str, data_format: str = "auto", skip_bad_rows: bool = False) -> list[tuple[int, dict[str, Any]]]:
    """The rows of the CSV/TSV or JSON Lines file ``spec`` (a path or ``vega:NAME``) as `read_documents` reads them
    (format by `detect_format`, byte-order mark dropped, header names stripped, tabs in a ``.tsv``): ``(line, row)``
    pairs, ``line`` the 1-based line the row starts on, ``row`` the column → cell dictionary; ``ValueError`` for a
    plain text file, a repeated column name, a JSONL line that is not an object (skipped with ``skip_bad_rows``)."""
    path = resolve_data_path(spec)
    _check_not_compressed(path)
    data_format = detect_format(path, data_format)
    if data_format == "text":
        raise ValueError(f"{path}: plain text files have no columns; a table needs JSONL or CSV data (set data_format: "
                         "csv or jsonl for a table in a file of another suffix)")
    return _read_jsonl_rows(path, skip_bad_rows)[0] if data_format == "jsonl" else _read_csv_rows(path)


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zip", ".zst", ".7z")


def _check_not_compressed(path: Path) -> None:
    """``ValueError`` for a compressed file (``data.csv.gz``), which the readers do not unpack."""
    if path.suffix.lower() in COMPRESSED_SUFFIXES:
        raise ValueError(f"{path}: compressed files ({path.suffix}) are not read; unpack it first and name the file "
                         f"inside (e.g. {path.stem})")


def read_utf8_text(path: Path) -> str:
    """The text of ``path`` decoded as UTF-8, a leading byte-order mark dropped; ``ValueError`` naming the file
    and line when it is not UTF-8."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line} is not UTF-8 text (byte 0x{error.object[error.start]:02x}); "
                         "save the file as UTF-8 (e.g. Excel's \"CSV UTF-8\")") from None


def _read_text(path: Path, unit: str) -> Iterator[Document]:
    lines = read_utf8_text(path).splitlines()
    if unit == "line":
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield Document(text=line.strip(), source=str(path), row=number)
        return
    block: list[str] = []
    start = 0
    for number, line in enumerate(lines + [""], start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line.rstrip())
        elif block:
            yield Document(text="\n".join(block).strip(), source=str(path), row=start)
            block = []


def _read_jsonl_rows(path: Path, skip_bad_rows: bool) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """The ``(number, record)`` rows of a JSON Lines file, or of a file that is one JSON array of records (a .json
    file as most tools write one: pandas ``orient="records"``, vega-datasets), and what the numbers count:
    ``"line"`` or ``"record"``."""
    text = read_utf8_text(path)
    records = _json_array(text)
    if records is not None:
        return _array_records(path, records, skip_bad_rows), "record"
    rows = []
    with io.StringIO(text, newline=None) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            message = None
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                whole = _whole_file_json(text) if not rows else None
                if whole is dict:
                    raise ValueError(_ONE_OBJECT.format(path=path)) from None
                message = f"{path}: line {number} is not valid JSON ({error})"
            else:
                if not isinstance(record, dict):
                    message = f"{path}: line {number} is a JSON {type(record).__name__}, not an object"
            if message is None:
                rows.append((number, record))
            elif skip_bad_rows:
                logger.warning("skipping: %s", message)
            else:
                raise BadRow(message)
    if len(rows) == 1 and _columns_of_values(rows[0][1]):
        raise ValueError(_ONE_OBJECT.format(path=path))
    return rows, "line"


def _json_array(text: str) -> list | None:
    """The array that the whole ``text`` is, or None (JSON Lines, or no JSON)."""
    if not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def _array_records(path: Path, records: list, skip_bad_rows: bool) -> list[tuple[int, dict[str, Any]]]:
    """``(record number, record)`` of the JSON array ``records`` of the file ``path`` (numbered from 1); an
    element that is no object is a `BadRow` (skipped with ``skip_bad_rows``)."""
    rows = []
    for number, record in enumerate(records, start=1):
        if isinstance(record, dict):
            rows.append((number, record))
            continue
        message = f"{path}: record {number} is a JSON {type(record).__name__}, not an object"
        if not skip_bad_rows:
            raise BadRow(message)
        logger.warning("skipping: %s", message)
    return rows


_ONE_OBJECT = ("{path}: the file is one JSON object, not one per line (JSON Lines); write one record per line, "
               "e.g. pandas to_json(orient=\"records\", lines=True)")


def _whole_file_json(text: str) -> type | None:
    """``list`` or ``dict`` when the whole ``text`` is one JSON array or object written over several lines (a
    ``.json`` file as most tools write one, ``{"data": [...]}`` pretty-printed), not JSON Lines; else None."""
    if not text.lstrip().startswith(("[", "{")):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return type(value) if isinstance(value, (list, dict)) else None


def _columns_of_values(record: dict[str, Any]) -> bool:
    """Whether a JSON object holds a table by columns (pandas' ``{"col": [...], ...}`` or ``{"col": {"0": ...}}``):
    every value a list or an object, one of them with more than one entry."""
    return bool(record) and all(isinstance(value, (list, dict)) for value in record.values()) \
        and any(len(value) > 1 for value in record.values())


def _read_csv_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with io.StringIO(read_utf8_text(path), newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter, skipinitialspace=True)
        if reader.fieldnames is None:
            return []
        reader.fieldnames = _column_names(reader.fieldnames)
        repeated = sorted({name for name in reader.fieldnames if reader.fieldnames.count(name) > 1})
        if repeated:  # a reader keeps only the last of them: a silent choice of one column
            raise ValueError(f"{path}: row 0 (header): the column names {', '.join(map(repr, repeated))} appear more "
                             "than once; give every column its own name")
        rows = []
        first_line = reader.line_num + 1  # a quoted cell may hold newlines: a row is named by the line it starts on
        for row in reader:
            rows.append((first_line, row))
            first_line = reader.line_num + 1
    return rows


def _rows_to_documents(
    path: Path, rows: list[tuple[int, dict[str, Any]]], source: DataSource, data_format: str, unit: str = "line"
) -> list[Document]:
    """``unit``: what a JSON row's number counts in messages (``"line"``, or ``"record"`` of a JSON array)."""
    is_csv = data_format == "csv"
    columns = _csv_columns(path) if is_csv else None
    renderer = None
    if source.template is not None:
        renderer = _template_renderer(path, rows, source, columns)
    elif columns is not None:
        _check_columns(path, columns, [source.text_field], what="text column (set a template or text_field)")
    if source.split_by is not None and columns is not None:
        _check_columns(path, columns, [source.split_by], what="split_by column")

    target = _target_renderer(source, renderer)
    documents, skipped = [], 0
    for index, (line, row) in enumerate(rows, start=1):
        where = f"{path}: row {index} (line {line})" if is_csv else f"{path}: {unit} {line}"
        try:
            if is_csv:
                _check_row_width(row, len(columns), where)
            text, values = renderer.fill(row, where) if renderer is not None \
                else (_text_field(row, source.text_field, where), {})
            split_value = _split_value(row, source.split_by, where)
            ordinal, value = target.locate(row, text, values, where) if target is not None else (None, None)
        except BadRow as error:
            if not source.skip_bad_rows:
                raise BadRow(f"{error} (skip_bad_rows: true in the training config skips such rows with a warning, "
                             "in train and in eval of its run)") from None
            skipped += 1
            if skipped <= 5:
                logger.warning("skipping: %s", error)
            continue
        documents.append(Document(text=text, source=str(path), row=index if is_csv else line, split_value=split_value,
                                  target_ordinal=ordinal, target_value=value))
    if skipped:
        logger.warning("%s: skipped %d bad rows of %d", path, skipped, len(rows))
    if renderer is not None:
        _warn_about_cells(path, renderer, rows)
    return documents


def _template_renderer(path: Path, rows: list[tuple[int, dict[str, Any]]], source: DataSource,
                       columns: list[str] | None) -> TemplateRenderer:
    """The `TemplateRenderer` of ``source.template`` after the checks that concern every row (the template's names
    against the columns, format specs against the fields' cells): ``numeric_fields`` as listed, or guessed
    (`infer_numeric_fields`); with a target, a guessed field other than the target writes its non-number cells as
    text (`TemplateRenderer`'s ``text_fallback``)."""
    names = columns if columns is not None else list(rows[0][1]) if rows else []
    _check_dotted_columns(path, names, source.template)
    fields = template_fields(source.template)
    if columns is not None:
        _check_columns(path, columns, fields, what="template field")
    listed = source.numeric_fields is not None
    numeric = list(source.numeric_fields) if listed else infer_numeric_fields([row for _, row in rows], fields)
    _check_format_specs(path, source.template, numeric, rows)
    reasons = {field: "numeric_fields lists it" if listed else
               "most of its cells are numbers, so it is read as a numeric field; numeric_fields names them yourself"
               for field in numeric}
    if source.target in reasons:
        reasons[source.target] = "it is the target"
    fallback = [field for field in numeric if not listed and source.target is not None and field != source.target]
    logger.info("%s: template fields %s, numeric %s", path, fields, numeric)
    return TemplateRenderer(source.template, numeric, text_fallback=fallback, numeric_reasons=reasons)


def _check_format_specs(path: Path, template: str, numeric: Sequence[str],
                        rows: list[tuple[int, dict[str, Any]]]) -> None:
    """``ValueError`` for a format spec on a text field that cannot format its text (``{date:%B}``): it would fail on
    every row; a spec formats the number of a numeric field (``{price:.1f}``)."""
    for _, name, spec, _ in string.Formatter().parse(template):
        field = None if name is None else name.split(".")[0].split("[")[0]
        if not spec or field in numeric:
            continue
        sample = next((row[field] for _, row in rows if isinstance(row.get(field), str)), None)
        try:
            if sample is not None:
                format(sample, spec)
        except (ValueError, TypeError):
            raise ValueError(f"{path}: template field '{{{name}:{spec}}}': '{field}' is a text field (cells such as "
                             f"{sample!r} are text, not numbers) and a format spec such as ':{spec}' applies to number "
                             f"fields only (numeric_fields); drop ':{spec}' from the template") from None


def _warn_about_cells(path: Path, renderer: TemplateRenderer, rows: list[tuple[int, dict[str, Any]]]) -> None:
    """One warning per field for the cells a template wrote but the reader had doubts about: text fields left empty
    (or JSON null), non-number cells of a guessed numeric field written as text, numbers with a dot that may
    separate thousands (`_thousands_dot_example`)."""
    for field, count in renderer.empty_cells.items():
        logger.warning("%s: %d of %d rows leave the text field '%s' empty; the template writes nothing there "
                       "(fill the cells, or drop the field from the template)", path, count, len(rows), field)
    for field, cells in renderer.text_cells.items():
        logger.warning("%s: %d of %d rows hold text in the field '%s', whose other cells are numbers (such as %r); "
                       "the template writes it as text (numeric_fields names the numeric fields yourself)",
                       path, len(cells), len(rows), field, cells[0])
    for field in renderer.numeric_fields:
        example = _thousands_dot_example([row.get(field) for _, row in rows])
        if example is not None:
            grouped = example.replace(".", "")
            logger.warning("%s: every number of the field '%s' has three digits after a dot (such as %r, read as %s); "
                           "if the dot separates thousands (%s), write the numbers without it (%s) or with a comma "
                           "(\"%s\")", path, field, example, example, grouped, grouped, example.replace(".", ","))


def _thousands_dot_example(cells: Sequence[Any]) -> str | None:
    """The first text cell when every number cell among ``cells`` is written with a dot and three digits after it
    and nothing else (``"2.078"``), which may be a European thousands separator; else None."""
    written = [cell.strip() for cell in cells if isinstance(cell, str) and parse_cell_number(cell) is not None]
    if written and all(re.fullmatch(r"[+-]?[1-9]\d{0,2}\.\d{3}", cell) for cell in written):
        return written[0]
    return None


def _check_row_width(row: dict[Any, Any], width: int, where: str) -> None:
    """`BadRow` for a CSV row with more or fewer cells than the header has columns. ``csv.DictReader`` files extra
    cells under the key None and fills missing ones with None: read as they are, an unquoted ``1,234.5`` would shift
    every later value one column along without a word. Empty cells past the header's columns (rows that end with
    ``,``, as some exports write them) are dropped from ``row``: they hold nothing to shift."""
    if row.get(None) is not None and not any(str(cell).strip() for cell in row[None]):
        del row[None]
    extra = row.get(None)
    cells = width + len(extra) if extra else sum(value is not None for key, value in row.items() if key is not None)
    if cells != width:
        hint = " (a cell holding a comma, such as 1,234.5, must be quoted: \"1,234.5\")" if cells > width else ""
        raise BadRow(f"{where}: {cells} cells where the header has {width} columns{hint}")


class TargetLocator:
    """Where a template field's number sits among a filled text's numbers (`number_read_at`)."""

    def __init__(self, template: str, target: str) -> None:
        self.target = target
        self.place = template_place(template, target)

    def locate(self, row: dict[str, Any], text: str, values: dict[str, Any], where: str) -> tuple[int, float]:
        """``(ordinal, value)`` of the target's number in the row's filled ``text`` (the value as the text writes it,
        after the template's format); `BadRow` when the cell is not a number or the tokenizer does not read it there
        (the model would never see the target)."""
        value = parse_cell_number(row.get(self.target))
        if value is None:
            raise BadRow(f"{where}: target field '{self.target}' holds {row.get(self.target)!r}, which is not a "
                         f"number{not_a_number_hint(row.get(self.target))}")
        spans = _number_spans(text)
        ordinal = number_read_at(spans, values, *self.place)
        if ordinal is None:
            raise BadRow(f"{where}: the tokenizer does not read the target field '{self.target}' "
                         f"({row.get(self.target)!r}) as one number in the text {text!r}: it stays text, splits or "
                         "glues to its neighbours (docs/number_grammar.md); write the cell as a plain number or "
                         "change the template around it")
        return ordinal, spans[ordinal][2]  # the value the text shows ("{y:.1f}" writes 12.84 as 12.8)


def _target_renderer(source: DataSource, renderer: TemplateRenderer | None) -> TargetLocator | None:
    if source.target is None:
        return None
    if renderer is None:
        raise ValueError(f"target '{source.target}' needs a template naming it (the text comes from a template)")
    return TargetLocator(source.template, source.target)


def _csv_columns(path: Path) -> list[str]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with io.StringIO(read_utf8_text(path), newline="") as handle:
        header = next(csv.reader(handle, delimiter=delimiter, skipinitialspace=True), None)
    if header is None:
        raise ValueError(f"{path}: the dataset is empty (no header row)")
    return _column_names(header)


def _column_names(header: Sequence[str]) -> list[str]:
    """A CSV header's names without the spaces around them: ``date, price`` names the columns ``date`` and
    ``price`` (the cells after ``, `` lose their leading spaces too: ``skipinitialspace``)."""
    return [name.strip() for name in header]


def _check_dotted_columns(path: Path, columns: list[str], template: str) -> None:
    """``ValueError`` for a placeholder naming a column with ``:`` or ``!`` in its name (``{Temp: max}``,
    ``{Price!}``), which a format string reads as a format spec or a conversion of another field, or with ``.`` or
    ``[`` (``{Adj. Close}``), read as an attribute or an index of another field (``Adj``)."""
    for column in columns:
        if any(char in column for char in ":!") and any(f"{{{column}{end}" in template for end in "}:!"):
            raise ValueError(f"{path}: template field '{{{column}}}': {dotted_name_problem(column)}")
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name in columns and name.split(".")[0].split("[")[0] not in columns:
            raise ValueError(f"{path}: template field '{{{name}}}': {dotted_name_problem(name)}")


def dotted_name_problem(name: str) -> str:
    """Why a column ``name`` holding ``:`` or ``!`` (``Temp: max``, ``Price!``), ``.`` or ``[`` (``Adj. Close``, R's
    ``Petal.Length``) cannot be a template field, and what to do."""
    marks = [char for char in name if char in ":!"]
    if marks and marks[0] == ":":
        return (f"a ':' in a field name starts a format spec in a format string ('{{{name}}}' formats the field "
                f"'{name.split(':')[0]}' with '{name.split(':', 1)[1]}'), so the column '{name}' cannot be named "
                "there; rename the column in the file (e.g. without ':')")
    if marks:
        return (f"a '!' in a field name starts a conversion (!r, !s, !a) of the field '{name.split('!')[0]}' in a "
                f"format string, so the column '{name}' cannot be named there; rename the column in the file "
                "(e.g. without '!')")
    return (f"a '.' or '[' in a field name reads an attribute or index of the field before it "
            f"('{name.split('.')[0].split('[')[0]}') in a format string, so the column '{name}' cannot be named "
            "there; rename the column in the file (e.g. without '.' and '[')")


def _check_columns(path: Path, columns: list[str], needed: list[str], what: str) -> None:
    import difflib

    for name in needed:
        if name not in columns:
            close = difflib.get_close_matches(name, columns, n=1, cutoff=0.7)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            separator = next((char for char in ";\t|" if len(columns) == 1 and char in columns[0]), None)
            if separator is not None:  # one column that holds the others: another separator than the reader's
                hint = (f"; the header is one column, split by {separator!r}: write the file with ',' between "
                        "fields (tabs in a .tsv file)")
            raise ValueError(
                f"{path}: row 0 (header): {what} '{name}' is not a column (columns: {', '.join(columns)}){hint}"
            )


def _text_field(row: dict[str, Any], field: str, where: str) -> str:
    if field not in row:
        raise BadRow(f"{where}: no '{field}' field (fields: {', '.join(map(str, row)) or 'none'})")
    value = row[field]
    if not isinstance(value, str):
        raise BadRow(f"{where}: field '{field}' holds a {type(value).__name__}, not a string")
    if not value.strip():
        raise BadRow(f"{where}: field '{field}' is empty")
    return value


def _split_value(row: dict[str, Any], split_by: str | None, where: str) -> Any:
    if split_by is None:
        return None
    value = row.get(split_by)
    if value is None or value == "":
        raise BadRow(f"{where}: split_by field '{split_by}' has no value")
    return value


# ---- splitting -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitSpec:
    """Validation split: ``split_by`` + ``split_at`` (rows with value >= split_at validate), ``split_by`` +
    ``fraction`` (the latest values, about that fraction of rows), or ``fraction`` alone (random rows)."""

    fraction: float = 0.0
    split_by: str | None = None
    split_at: Any = None
    seed: int = 0


def split_documents(documents: list[Document], spec: SplitSpec) -> tuple[list[Document], list[Document]]:
    """``(train, validation)``; validation is empty when no split is asked for."""
    if not 0.0 <= spec.fraction < 1.0:
        raise ValueError(f"validation_split must lie in [0, 1), got {spec.fraction!r}")
    if spec.split_at is not None and spec.split_by is None:
        raise ValueError("split_at needs split_by (the column to compare it with)")
    if spec.split_by is not None:
        train, validation = _split_by_value(documents, spec)
    elif spec.fraction > 0:
        order = list(range(len(documents)))
        random.Random(spec.seed).shuffle(order)
        cut = len(documents) - max(1, round(spec.fraction * len(documents)))
        train = [documents[i] for i in sorted(order[:cut])]
        validation = [documents[i] for i in sorted(order[cut:])]
    else:
        return documents, []
    if not train:
        raise ValueError(f"the split {_describe(spec)} leaves no training rows")
    if not validation:
        raise ValueError(f"the split {_describe(spec)} leaves no validation rows")
    return train, validation


def _split_by_value(documents: list[Document], spec: SplitSpec) -> tuple[list[Document], list[Document]]:
    values = [doc.split_value for doc in documents]
    key = split_key(values, spec.split_at, spec.split_by, where=[f"{doc.source}: row {doc.row}" for doc in documents])
    keys = [key(v) for v in values]
    if spec.split_at is not None:
        cut = key.parse_cut(spec.split_at)
    elif spec.fraction > 0:
        ordered = sorted(keys)
        cut = ordered[min(len(ordered) - 1, round(len(ordered) * (1.0 - spec.fraction)))]
    else:
        raise ValueError(f"split_by '{spec.split_by}' needs split_at or validation_split > 0")
    train = [doc for doc, k in zip(documents, keys) if k < cut]
    validation = [doc for doc, k in zip(documents, keys) if k >= cut]
    logger.info("split by %s at %s (%s): %d train, %d validation rows", spec.split_by, key.show(cut), key.describe(),
                len(train), len(validation))
    return train, validation


# Date spellings a split column may use, tried in this order; the first that reads every value of the column
# is the column's format (so "01/02/2009" is month/day when every value reads that way, with a time or without).
DATE_FORMATS = (
    "%Y-%m-%d", "%Y/%m/%d", "%Y.%m.%d", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M",
    "%Y-%m-%dT%H:%M", "%Y/%m/%d %H:%M:%S", "%Y/%m/%d %H:%M", "%m/%d/%Y", "%d/%m/%Y", "%d.%m.%Y", "%d-%m-%Y",
    "%m/%d/%Y %I:%M %p", "%d/%m/%Y %I:%M %p", "%m/%d/%Y %I:%M:%S %p", "%d/%m/%Y %I:%M:%S %p",  # Excel's date-times
    "%m/%d/%Y %H:%M", "%d/%m/%Y %H:%M", "%m/%d/%Y %H:%M:%S", "%d/%m/%Y %H:%M:%S", "%d.%m.%Y %H:%M",
    "%d.%m.%Y %H:%M:%S", "%a, %d %b %Y", "%b %d %Y", "%b %d, %Y", "%B %d %Y", "%B %d, %Y", "%d %b %Y", "%d %B %Y",
    "%d-%b-%Y", "%d-%b-%y", "%m/%d/%y", "%d/%m/%y", "%Y-%m", "%Y/%m", "%m/%Y", "%m-%Y", "%b %Y", "%B %Y",
)
DATE_EXAMPLES = ("2015-01-31, 2015/01/31 18:00, 01/31/2015, 01/31/2015 6:00 PM, 31.01.2015, Jan 31 2015, "
                 "31 January 2015, 31-Jan-15, 2015-01, 01/2015, January 2015")
"""Spellings `DATE_FORMATS` reads, one of a kind each, for error messages (`DATE_FORMATS` holds them all)."""


@dataclass(frozen=True)
class SplitKey:
    """How the values of a split column compare: as numbers, or as dates written in one ``date_format``
    (never as text). Calling it turns one value into its comparable key."""

    column: str
    kind: str  # "number" or "date"
    date_format: str | None = None

    def __call__(self, value: Any) -> Any:
        if self.kind == "number":
            return parse_cell_number(value)
        return parse_date(value, (self.date_format,))

    def parse_cut(self, split_at: Any) -> Any:
        """``split_at`` as a key (a date in the column's format or any format of `DATE_FORMATS`)."""
        if self.kind == "number":
            number = parse_cell_number(split_at)
            if number is None:
                raise ValueError(f"split_at {split_at!r} is not a number, but split_by column '{self.column}' "
                                 "holds numbers")
            return number
        cut = parse_date(split_at, (self.date_format, *DATE_FORMATS))
        if cut is None:
            raise ValueError(f"split_at {split_at!r} is not a date (split_by column '{self.column}' holds dates "
                             f"like {_example_date(self.date_format)!r}); write it e.g. as YYYY-MM-DD")
        return cut

    def describe(self) -> str:
        return "numbers" if self.kind == "number" else f"dates read as {self.date_format}"

    def show(self, key: Any) -> str:
        return f"{key:g}" if self.kind == "number" else key.isoformat(sep=" ").removesuffix(" 00:00:00")


def parse_date(value: Any, formats: Sequence[str]) -> datetime.datetime | None:
    """``value`` (text, `datetime.date` or `datetime.datetime`) as a naive UTC datetime, trying ``formats`` in
    order; None when none reads it. A value with a time-zone offset is converted to UTC (``20:00-05:00`` is 01:00
    the next day); one without is taken as it is written."""
    if isinstance(value, datetime.datetime):
        return _naive_utc(value)
    if isinstance(value, datetime.date):
        return datetime.datetime(value.year, value.month, value.day)
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    for date_format in formats:
        try:
            return _naive_utc(datetime.datetime.strptime(text, date_format))
        except ValueError:
            continue
    try:  # other ISO 8601 forms (time zones, fractions of a second)
        return _naive_utc(datetime.datetime.fromisoformat(text)) if text[:4].isdigit() else None
    except ValueError:
        return None


def _naive_utc(moment: datetime.datetime) -> datetime.datetime:
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)


def _example_date(date_format: str | None) -> str:
    return datetime.datetime(2015, 1, 31).strftime(date_format or "%Y-%m-%d")


def split_key(values: Sequence[Any], split_at: Any, column: str, where: Sequence[str] | None = None) -> SplitKey:
    """The `SplitKey` of a split column: numbers when every value (and ``split_at``) is one, read as template cells
    are (`parse_cell_number`: ``"1,000"`` is 1000), else dates in the first format of `DATE_FORMATS` that reads
    every value. ``ValueError`` naming the row (``where[i]``) and value that is neither, rather than a text
    comparison. Dates with a time-zone offset (``2020-01-01T20:00:00-05:00``) compare as their UTC time (here
    2020-01-02 01:00), and dates without one as if they were UTC, so a date-only ``split_at`` cuts at midnight UTC;
    a column that mixes the two is logged (`_warn_if_mixed_offsets`)."""
    if all(parse_cell_number(v) is not None for v in values):
        if split_at is None or parse_cell_number(split_at) is not None or parse_date(split_at, DATE_FORMATS) is None:
            return SplitKey(column, "number")
        raise ValueError(f"split_at {split_at!r} is a date, but split_by column '{column}' holds numbers (such as "
                         f"{values[0]!r}); give split_at as a number of that column (a year: 2023)")
    best_count = -1
    for date_format in DATE_FORMATS:
        count = 0
        for value in values:
            if parse_date(value, (date_format,)) is None:
                break
            count += 1
        if count == len(values):
            _warn_if_ambiguous(values, date_format, column)
            _warn_if_mixed_offsets(values, column, split_at)
            return SplitKey(column, "date", date_format)
        if count > best_count:
            best_count = count
    index = best_count if best_count >= 0 else 0
    if best_count == 0 and parse_cell_number(values[0]) is not None:  # numbers with something else among them
        index = next(i for i, value in enumerate(values) if parse_cell_number(value) is None)
        place = where[index] if where is not None else f"value {index + 1}"
        raise ValueError(f"{place}: split_by column '{column}' holds {values[index]!r}, which is not a number like "
                         f"the rows before it ({values[0]!r}); split_by needs a column of numbers or dates")
    place = where[index] if where is not None else f"value {index + 1}"
    if best_count == 0 and parse_cell_number(values[0]) is None and parse_date(values[0], DATE_FORMATS) is None:
        raise ValueError(f"{place}: split_by column '{column}' holds {values[0]!r}, which is neither a number nor "
                         f"a date; split_by needs a column of numbers or dates (dates written like "
                         f"{DATE_EXAMPLES}, or ISO 8601)")
    raise ValueError(f"{place}: split_by column '{column}' holds {values[index]!r}, which is not a number and not a "
                     f"date written like the rows before it ({values[0]!r}, read as {_spelling(values[0])}); write "
                     f"every date of the column the same way (dates written like {DATE_EXAMPLES}, "
                     "or ISO 8601)")


def _spelling(value: Any) -> str:
    """The first of `DATE_FORMATS` that reads ``value`` on its own, else ``"ISO 8601"`` (`parse_date` reads ISO
    forms whatever formats it is given)."""
    return next((date_format for date_format in DATE_FORMATS if _reads_as(value, date_format)), "ISO 8601")


def _warn_if_mixed_offsets(values: Sequence[Any], column: str, split_at: Any = None) -> None:
    """Log once when some of a date column's values carry a time-zone offset and others do not, or when they all do
    and ``split_at`` does not: the offsets are converted to UTC and the others taken as UTC already (`parse_date`),
    which may move a row to the other side of the cut."""
    offsets = [_utc_offset(value) for value in values]
    aware = [offset is not None for offset in offsets]
    if any(aware) and not all(aware):
        logger.warning("split_by column '%s' mixes dates with a time-zone offset (such as %r) and dates without one "
                       "(such as %r); offsets are converted to UTC and the others compared as if UTC: write every "
                       "value the same way", column, values[aware.index(True)], values[aware.index(False)])
    shifted = [value for value, offset in zip(values, offsets) if offset]  # an offset other than UTC's ("Z")
    if all(aware) and shifted and split_at is not None and _utc_offset(split_at) is None:
        logger.warning("split_by column '%s' holds dates with a time-zone offset, compared as their UTC time (%r is "
                       "%s), and split_at %r, without one, as UTC: give split_at an offset to cut at another time",
                       column, shifted[0], parse_date(shifted[0], ()).isoformat(sep=" "), split_at)


def _utc_offset(value: Any) -> datetime.timedelta | None:
    """The time-zone offset a date value carries (a `datetime.datetime` with ``tzinfo``, ISO text with ``Z`` or
    ``+hh:mm``), or None."""
    if isinstance(value, datetime.datetime):
        return value.utcoffset()
    try:
        return datetime.datetime.fromisoformat(" ".join(value.split())).utcoffset() if isinstance(value, str) else None
    except ValueError:
        return None


def _warn_if_ambiguous(values: Sequence[Any], date_format: str, column: str) -> None:
    swapped = {"%m/%d/%Y": "%d/%m/%Y", "%m/%d/%y": "%d/%m/%y", "%m/%d/%Y %I:%M %p": "%d/%m/%Y %I:%M %p",
               "%m/%d/%Y %I:%M:%S %p": "%d/%m/%Y %I:%M:%S %p", "%m/%d/%Y %H:%M": "%d/%m/%Y %H:%M",
               "%m/%d/%Y %H:%M:%S": "%d/%m/%Y %H:%M:%S"}.get(date_format)
    if swapped and all(parse_date(v, (swapped,)) is not None for v in values):
        written = next((v for v in values if _reads_as(v, date_format)), values[0])  # not an ISO value
        _warn_once(f"split_by column '{column}': dates such as {written!r} read as month/day/year ({date_format}); "
                   "every value also reads as day/month/year")
    if "%y" in date_format:
        years = {parse_date(v, (date_format,)).year for v in values}
        if min(years) < 2000 <= max(years):
            logger.warning("split_by column '%s': two-digit years read as 1969-1999 for 69-99 and 2000-2068 for "
                           "00-68 (years %d to %d here); write four-digit years if the table spans another century",
                           column, min(years), max(years))


def _reads_as(value: Any, date_format: str) -> bool:
    """Whether ``date_format`` itself reads ``value`` (not the ISO forms `parse_date` reads whatever the format)."""
    try:
        datetime.datetime.strptime(" ".join(str(value).split()), date_format)
        return True
    except ValueError:
        return False


@functools.lru_cache(maxsize=256)
def _warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time only: a split column is read again for the check slice and the
    warm start's order."""
    logger.warning("%s", message)


def describe_split(spec: SplitSpec) -> str:
    """The split asked for, in words: ``"split by date at '2015/01/01'"``, ``"random 10% of the rows"``."""
    if spec.split_by is not None:
        if spec.split_at is not None:
            return f"split by {spec.split_by} at {spec.split_at!r}"
        return f"the latest {spec.fraction:.0%} of {spec.split_by} values"
    if spec.fraction > 0:
        return f"a random {spec.fraction:.0%} of the rows"
    return "no validation split"


def _describe(spec: SplitSpec) -> str:
    if spec.split_by is not None:
        at = f"split_at={spec.split_at!r}" if spec.split_at is not None else f"validation_split={spec.fraction}"
        return f"(split_by='{spec.split_by}', {at})"
    return f"(validation_split={spec.fraction})"
