"""Finding numbers in text, and writing them back.

CausalQwen reads every quantity in a text as one ``<NUM>`` token plus its value, and keeps the number's
*surface string* (``"1,234.50"``) beside the value, so a text comes back exactly as it was written. This
module decides what is a quantity and what stays text (:func:`find_numbers`), how a value is spelled when
no string is known (:func:`format_number`, :func:`join_numbers`) and how a predicted number is printed to
the precision its own uncertainty carries (:func:`format_prediction`). It knows nothing about tokenizers
or tensors. docs/number_grammar.md states the same rules with examples.

Grammar
-------
A *chunk* is a maximal run of digit groups joined by single joiner characters::

    chunk   := lead? group (joiner group)*
    group   := digit+ (("e" | "E") ("+" | "-")? digit+)?          digits: any Unicode decimal digit (Nd)
    joiner  := "." "," "'" "’" ":" "/" "-" "−" " " U+00A0 U+2009 U+202F U+066B U+066C U+FF0E
    lead    := a decimal point right before the first group, not after "." or a digit (".5")

Inside a chunk, groups form **numbers** left to right. With ``decimal_comma=False`` (the default: English
conventions) the decimal point is ``.`` (also ``٫`` U+066B, ``．`` U+FF0E) and the thousands separators
are ``,`` ``'`` ``’`` ``٬`` and the spaces; with ``decimal_comma=True`` (German, French, ...) the roles of
``.`` and ``,`` swap. A number is

    [sign] integer [point fraction] [exponent]

where ``integer`` is one group, or a **thousands-grouped** integer ``d{1,3} (sep ddd)+`` with one and the
same separator throughout (``1,234,567``, ``1'000'000``, ``1 000`` with a no-break or thin space,
``1.234,56`` with ``decimal_comma=True``). Grouping is refused when the same separator goes on with a
group of another length (``1,234,56`` is the list 1, 234, 56) and, for a plain space, unless at least two
groups follow or the one that follows starts with 0 (``1 000`` is one number, ``12 345`` two).

Between numbers: ``,`` (default mode), ``'``, spaces, ``-``, ``−``, ``/`` and ``:`` separate two numbers
(``1,2,3``, ``3-5`` and ``2/3`` give two or three numbers; the second of ``3-5`` is not negative). A
decimal point after a complete number (``1.2.3``, ``192.168.0.1``, ``1e5.5``) makes the whole dotted
chain text; with ``decimal_comma=True`` so does a ``.`` that is not a valid thousands grouping
(``3.14``, ``22.11.2024``) and a second decimal comma (``1,2,3``).

A sign (``-`` or ``−``) belongs to the first number of a chunk only at the start of the text or after
whitespace or one of ``( [ { < > = : ; , / * | " '`` and their full-width forms. ``+`` is never part of
a number.

What stays text
---------------
Identifiers and calendar or clock forms are not quantities; they stay text (no ``<NUM>``, the characters
are tokenized as they are written):

* clock and duration forms: numbers joined by ``:`` where every number after the first has exactly two
  integer digits (``09:05``, ``12:30:45.5``, ``123:45``); other colons are ratios (``1:100``, ``3:2``);
* date and phone forms: three or more integers joined by the same ``-`` or ``/`` (``2024-03-15``,
  ``03/15/2024``, ``555-123-4567``), or two where one has a leading zero (``555-0100``, ``2024-03``);
  dotted dates are dotted chains (``15.03.2024``);
* dates with an English month name (``Jan`` ... ``December``, capitalised or in capitals, optionally with a
  ``.``): a day (1 to 31, optionally ``st``/``nd``/``rd``/``th``) and an optional four-digit year around it
  (``Jan 1 2000``, ``January 1, 2000``, ``1 March 2024``, ``March 15``), or a month and a year (``May 2020``);
  a number that reaches past the date (``Jan 1,234``) is still read;
* leading zeros: an integer part of two or more digits starting with 0 (``007``, ``0100``, ``00.5``);
* long digit runs: more than 15 integer digits (beyond float64's exact integers);
* glued forms: a chunk right after a letter or digit of a script written with spaces between words
  (Latin, Greek, Cyrillic, Arabic, Hebrew, ...), ``_`` or a combining mark (``H2O``, ``v2``, ``x_1``,
  ``abc123``), after a ``.`` or hyphen that follows such a letter (``v.5``, ``COVID-19``, ``B-52``), or
  after ``e+`` (``0E+.1``), up to the first space after its first number (``s1 157.0`` reads 157.0,
  ``x1 234 567`` nothing); a number followed by
  letters that are themselves followed by a digit, ``_`` or a combining mark (``12ab34``, ``0x1F``,
  ``2nd_place``), or followed directly by ``_``, a combining mark or a non-decimal digit (``5²``);
* digits of two scripts in one number (``1٢``);
* magnitudes a float32 cannot hold: a value other than 0 that rounds to inf or to less than float32's
  smallest normal ``1.1754944e-38`` (``1e999``, ``1e-50``), so a value is never read as 0 or inf.

Letters of CJK, kana, Hangul, Thai, Lao, Khmer, Myanmar, Tibetan, Yi and Bopomofo do not glue, because
numbers in those scripts are written directly against words: ``价格是99.9元`` gives 99.9.

Units and ordinals: a number followed by letters (``5km``, ``30kg``, ``3rd``, ``1.5k``) is read as the
number; the letters stay text.

Values are Python floats (float64) from the digits as written, Unicode digits included (``٣`` is 3,
``１２３`` is 123); the string is kept in :attr:`NumberSpan.text`, so nothing about the spelling is lost.
"""

from __future__ import annotations

import math
import re
import struct
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

__all__ = [
    "FLOAT32_MAX",
    "FLOAT32_MIN_NORMAL",
    "MAX_INTEGER_DIGITS",
    "NumberSpan",
    "decimals_written",
    "find_numbers",
    "format_number",
    "format_prediction",
    "join_numbers",
    "to_float32",
]

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
MAX_INTEGER_DIGITS = 15
MAX_LEADING_ZEROS = 6  # a prediction below 1e-6 is written with an exponent (4.9e-06), not as 0.0000049

_SIGNS = "-\u2212"
_SIGN_CONTEXT = frozenset(
    "([{<>=:;,/*|\"'\uff08\uff3b\uff5b\uff1c\uff1e\uff1d\uff1a\uff1b\uff0c\u3001"
    "\uff0f\uff0a\uff5c\uff02\uff07"  # full-width / * | " '
)
_SPACES = " \u00a0\u2009\u202f"
_ALWAYS_POINTS = "\u066b\uff0e"  # Arabic decimal separator, full-width full stop
_ALWAYS_GROUPS = "'\u2019\u066c" + _SPACES  # apostrophes, Arabic thousands separator, spaces
_JOINERS = ".,:/-\u2212" + _ALWAYS_POINTS + _ALWAYS_GROUPS
_GROUP_RE = re.compile(r"(\d+)([eE][-+]?\d+)?")
_ASCII_PLAIN_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# Fast path for CSV-like runs (default mode): plain decimals without leading zeros joined by single commas, with
# no pair that could be a thousands grouping ("1,234").
_SIMPLE_LIST_RE = re.compile(r"(?:0|[1-9][0-9]{0,14})(?:\.[0-9]+)?(?:,(?:0|[1-9][0-9]{0,14})(?:\.[0-9]+)?)+")
_GROUPING_HINT_RE = re.compile(r"(?:^|,)[1-9][0-9]{0,2},[0-9]{3}(?![0-9])")


_MONTH_NAMES = ("Jan(?:uary)?", "Feb(?:ruary)?", "Mar(?:ch)?", "Apr(?:il)?", "May", "June?", "July?", "Aug(?:ust)?",
                "Sep(?:t(?:ember)?)?", "Oct(?:ober)?", "Nov(?:ember)?", "Dec(?:ember)?")  # patterns, stem first


def _written_date_regex() -> re.Pattern[str]:
    """Dates that name their month in English words: ``Jan 1 2000``, ``1 March 2024``, ``May 2020`` (module
    docstring, "What stays text")."""
    title = "|".join(_MONTH_NAMES)
    capitals = "|".join(name.upper() for name in _MONTH_NAMES)  # JAN(?:UARY)?: the group syntax has no letters
    month = rf"(?<![A-Za-z])(?:{title}|{capitals})\.?"
    day = r"(?:0?[1-9]|[12][0-9]|3[01])(?:st|nd|rd|th|ST|ND|RD|TH)?"
    year = r"[0-9]{4}"
    end = r"(?![0-9A-Za-z_])"
    return re.compile(
        rf"{month} {day}(?:,? {year})?{end}"  # Jan 1 2000, January 1, 2000, March 15
        rf"|(?<![0-9.,]){day} {month}(?:,? {year})?{end}"  # 1 March 2024, 15 Mar
        rf"|{month},? {year}{end}"  # May 2020
    )


_WRITTEN_DATE_RE = _written_date_regex()
_MONTH_STEM_RE = re.compile("|".join(stem for name in _MONTH_NAMES for stem in (name[:3], name[:3].upper())))


def _chunk_regex(lead_points: str) -> re.Pattern[str]:
    joiners = re.escape(_JOINERS)
    lead = rf"(?:(?<![.\d])[{re.escape(lead_points)}](?=\d))?"
    return re.compile(rf"{lead}\d+(?:[eE][-+]?\d+)?(?:[{joiners}]\d+(?:[eE][-+]?\d+)?)*")


@dataclass(frozen=True)
class _Mode:
    points: frozenset[str]
    groups: frozenset[str]
    strict_dot: bool  # decimal_comma: a "." that is no valid grouping makes text
    chunk_re: re.Pattern[str]


_MODES = {
    False: _Mode(frozenset("." + _ALWAYS_POINTS), frozenset("," + _ALWAYS_GROUPS), False,
                 _chunk_regex("." + _ALWAYS_POINTS)),
    True: _Mode(frozenset("," + _ALWAYS_POINTS), frozenset("." + _ALWAYS_GROUPS), True, _chunk_regex(_ALWAYS_POINTS)),
}

# Scripts whose words sit directly against numbers (unicodedata name prefixes).
_SPACELESS_SCRIPTS = (
    "CJK ",
    "IDEOGRAPHIC ",
    "HIRAGANA",
    "KATAKANA",
    "HALFWIDTH KATAKANA",
    "HANGUL",
    "HALFWIDTH HANGUL",
    "BOPOMOFO",
    "YI ",
    "THAI ",
    "LAO ",
    "KHMER ",
    "MYANMAR ",
    "TIBETAN ",
)


@dataclass(frozen=True)
class NumberSpan:
    """One number found in a text: ``text[start:end] == self.text`` reads as ``value`` (float64).

    ``unit``: the place value of the last digit written (``"12.8"`` → 0.1, ``"1,200"`` → 1, ``"2.5e3"`` → 100).
    """

    start: int
    end: int
    value: float
    text: str
    unit: float = 1.0


def to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (as a Python float); ±inf past the float32 range."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


# ---------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------
def find_numbers(text: str, decimal_comma: bool = False) -> list[NumberSpan]:
    """Every quantity in ``text``, left to right, by the grammar in the module docstring.

    >>> [(n.value, n.text) for n in find_numbers("Costs $1,234.50 on 2024-03-15, 5km at 09:05.")]
    [(1234.5, '1,234.50'), (5.0, '5')]
    """
    if not isinstance(text, str):
        raise TypeError(f"find_numbers expects a str, got {type(text).__name__}")
    if not isinstance(decimal_comma, bool):
        raise TypeError(f"decimal_comma must be True or False, got {decimal_comma!r}")
    mode = _MODES[decimal_comma]
    spans: list[NumberSpan] = []
    for chunk in mode.chunk_re.finditer(text):
        start, end = chunk.span()
        group = chunk.group()
        if _ASCII_PLAIN_RE.fullmatch(group) and (decimal_comma is False or "." not in group):
            span = _read_plain(text, start, end, group)  # fast path: "42", "12.8"
            if span is not None:
                spans.append(span)
            continue
        if not decimal_comma and _SIMPLE_LIST_RE.fullmatch(group) and not _GROUPING_HINT_RE.search(group):
            spans.extend(_read_simple_list(text, start, end, group))  # fast path: "12.8,5.0,4.7"
            continue
        spans.extend(_read_chunk(text, start, end, mode))
    if spans:
        spans = _outside_written_dates(text, spans)
    return spans


def _outside_written_dates(text: str, spans: list[NumberSpan]) -> list[NumberSpan]:
    """``spans`` without the numbers that lie inside a date naming its month (``Jan 1 2000``)."""
    if _MONTH_STEM_RE.search(text) is None:  # most texts name no month: 1/25 of the full pattern's cost
        return spans
    dates = [match.span() for match in _WRITTEN_DATE_RE.finditer(text)]
    if not dates:
        return spans
    return [span for span in spans if not any(start <= span.start and span.end <= end for start, end in dates)]


def _read_plain(text: str, start: int, end: int, group: str) -> NumberSpan | None:
    """A chunk of ASCII digits with at most one ``.`` (default mode)."""
    sign = _left_context(text, start)
    if sign is None:
        return None
    integer, _, fraction = group.partition(".")
    if (len(integer) > 1 and integer[0] == "0") or len(integer) > MAX_INTEGER_DIGITS:
        return None
    if _glued_right(text, end):
        return None
    value = float(group)
    if not _fits_float32(value) or (value == 0.0 and group.strip("0.")):  # 0.000...1 underflows float64
        return None
    if sign:
        start -= 1
        value = -value
    return NumberSpan(start, end, value, text[start:end], 10.0 ** -len(fraction) if fraction else 1.0)


def _read_simple_list(text: str, start: int, end: int, group: str) -> list[NumberSpan]:
    """A chunk of plain ASCII decimals joined by commas (`_SIMPLE_LIST_RE`, no grouping): a list."""
    sign = _left_context(text, start)
    if sign is None:
        return []
    spans = []
    position = start
    parts = group.split(",")
    for index, part in enumerate(parts):
        begin, finish = position, position + len(part)
        position = finish + 1
        value = float(part)
        if not _fits_float32(value) or (value == 0.0 and part.strip("0.")):  # 0.000...1 underflows float64
            continue
        if index == 0 and sign:
            begin -= 1
            value = -value
        if index == len(parts) - 1 and _glued_right(text, end):
            continue
        fraction = part.partition(".")[2]
        spans.append(NumberSpan(begin, finish, value, text[begin:finish], 10.0 ** -len(fraction) if fraction else 1.0))
    return spans


def _left_context(text: str, start: int) -> bool | None:
    """Whether the chunk at ``start`` is signed (``True``/``False``), or ``None`` when it is glued on the left."""
    if start == 0:
        return False
    before = text[start - 1]
    if _is_glue(before):
        return None
    before2 = text[start - 2] if start >= 2 else None
    if before in _SIGNS:
        if before2 is None or before2.isspace() or before2 in _SIGN_CONTEXT:
            return True
        if _is_glue(before2) and not before2.isdigit():
            return None  # COVID-19, B-52
        return False
    if before2 is None:
        return False
    if before in ".\u066b\uff0e":
        return None if _is_glue(before2) else False  # v.5
    if before == "+" and before2 in "eE":
        return None  # the tail of an unfinished exponent: 0E+.1
    return False


def _glued_right(text: str, end: int) -> bool:
    """Whether the number ending at ``end`` continues into an identifier (``12ab34``, ``0x1F``, ``5²``, ``x_``)."""
    if end == len(text):
        return False
    after = text[end]
    if not _is_glue(after):
        return False
    if not after.isalpha():
        return True  # "_", a combining mark, a non-decimal digit
    index = end + 1
    while index < len(text) and text[index].isalpha() and _is_glue(text[index]):
        index += 1
    return index < len(text) and _is_glue(text[index])  # letters then a digit, "_" or a mark: an identifier


class _Number:
    """A number being read: groups ``first..last`` of a chunk."""

    __slots__ = ("first", "last", "integer", "fraction", "exponent", "grouped", "text_form", "after")

    def __init__(self, first: int) -> None:
        self.first = first
        self.last = first
        self.integer = ""  # the integer digits as written (any script), separators removed
        self.fraction = ""
        self.exponent = ""
        self.grouped = False
        self.text_form = False
        self.after = ""  # the joiner after this number, "" at the end of the chunk


def _read_chunk(text: str, start: int, end: int, mode: _Mode) -> list[NumberSpan]:
    """The quantities of one chunk (module docstring)."""
    lead = text[start] in mode.points and not text[start].isdigit()
    digits_start = start + 1 if lead else start
    sign = _left_context(text, start)
    groups = [(m.start(), m.end(), m.group(1), m.group(2) or "") for m in _GROUP_RE.finditer(text, digits_start, end)]
    joiners = [text[groups[k][1]] for k in range(len(groups) - 1)]
    numbers = _split_numbers(groups, joiners, lead, mode)
    if sign is None:
        # Glued on the left ("s1 157.0", "COVID-19 2020"): the first number is text, and so is the chunk up to the
        # first space after it; what follows that space is read on its own ("x1 234 567" is one grouped number).
        after_first = groups[numbers[0].last][1]
        space = next((k for k in range(after_first, end) if text[k] in _SPACES), None)
        return [] if space is None else _read_chunk(text, space + 1, end, mode)
    _mark_text_forms(numbers)
    if _glued_right(text, end):
        numbers[-1].text_form = True
    spans = []
    for index, number in enumerate(numbers):
        if number.text_form:
            continue
        begin = groups[number.first][0]
        if index == 0 and lead:
            begin -= 1
        signed = index == 0 and sign
        span = _span(text, begin - 1 if signed else begin, groups[number.last][1], number, signed)
        if span is not None:
            spans.append(span)
    return spans


def _split_numbers(
    groups: list[tuple[int, int, str, str]], joiners: list[str], lead: bool, mode: _Mode
) -> list[_Number]:
    """Groups ``(start, end, digits, exponent)`` → numbers: thousands grouping, fraction, dotted chains (module
    docstring)."""
    count = len(groups)
    numbers: list[_Number] = []
    index = 0
    while index < count:
        number = _Number(index)
        is_lead = lead and index == 0
        grouped_end = None if is_lead or count == 1 else _grouped_end(groups, joiners, index, mode)
        if is_lead:
            number.fraction, number.exponent = groups[index][2], groups[index][3]
        elif grouped_end is not None:
            number.grouped = True
            number.integer = "".join(groups[k][2] for k in range(index, grouped_end + 1))
            number.exponent = groups[grouped_end][3]
            number.last = grouped_end
        else:
            number.integer, number.exponent = groups[index][2], groups[index][3]
        last = number.last
        if not number.exponent and not is_lead and last < count - 1 and joiners[last] in mode.points:
            number.fraction, number.exponent = groups[last + 1][2], groups[last + 1][3]
            last = number.last = last + 1
        if last < count - 1:
            number.after = joiners[last]
            if joiners[last] in mode.points or (mode.strict_dot and joiners[last] == "."):
                # a dotted chain (1.2.3, 192.168.0.1) or, with decimal commas, a "." that groups nothing
                number.text_form = True
                dot = joiners[last]
                while last < count - 1 and joiners[last] == dot:
                    last += 1
                number.last = last
                number.after = joiners[last] if last < count - 1 else ""
        numbers.append(number)
        index = number.last + 1
    return numbers


def _grouped_end(
    groups: list[tuple[int, int, str, str]], joiners: list[str], index: int, mode: _Mode
) -> int | None:
    """Index of the last group of a thousands-grouped integer starting at group ``index``, or None."""
    first = groups[index][2]
    count = len(groups)
    if index == count - 1 or len(first) > 3 or groups[index][3] or _digit_value(first[0]) == 0:
        return None  # "0,123" is not a grouping
    separator = joiners[index]
    if separator not in mode.groups:
        return None
    last = index
    while last < count - 1 and joiners[last] == separator:
        if len(groups[last + 1][2]) != 3:
            break
        last += 1
        if groups[last][3]:  # an exponent ends the number
            return last
    if last == index:
        return None
    if last < count - 1 and joiners[last] == separator:
        return None  # the same separator goes on with a group of another length: not a grouping
    if separator == " " and last - index < 2 and _digit_value(groups[index + 1][2][0]) != 0:
        return None  # a plain space groups only where unambiguous
    return last


def _mark_text_forms(numbers: list[_Number]) -> None:
    """Clock, date and phone forms; leading zeros (module docstring, "What stays text")."""
    count = len(numbers)
    index = 0
    while index < count:
        joiner = numbers[index].after
        if joiner not in (":", "-", "\u2212", "/"):
            index += 1
            continue
        same = "-\u2212" if joiner in "-\u2212" else joiner
        last = index
        while last < count - 1 and numbers[last].after and numbers[last].after in same:
            last += 1
        run = numbers[index : last + 1]
        if joiner == ":":
            clock = all(
                len(n.integer) == 2 and not n.exponent and not n.grouped and not n.fraction for n in run[1:-1]
            ) and len(run[-1].integer) == 2 and not run[-1].exponent and not run[-1].grouped
            if clock and not run[0].fraction and not run[0].exponent:
                for number in run:
                    number.text_form = True
        elif all(n.integer and not n.fraction and not n.exponent and not n.grouped for n in run):
            leading_zero = any(len(n.integer) > 1 and _digit_value(n.integer[0]) == 0 for n in run)
            if len(run) >= 3 or leading_zero:
                for number in run:
                    number.text_form = True
        index = last + 1
    for number in numbers:
        integer = number.integer
        if len(integer) > 1 and _digit_value(integer[0]) == 0 and not number.grouped:
            number.text_form = True
        if len(integer) > MAX_INTEGER_DIGITS:
            number.text_form = True


def _span(text: str, start: int, end: int, number: _Number, signed: bool) -> NumberSpan | None:
    """The `NumberSpan` of one number, or None when its digits mix scripts or its magnitude is out of range."""
    digits = number.integer + number.fraction + number.exponent[1:].lstrip("+-")
    if not digits.isascii():
        zeros = {ord(ch) - unicodedata.decimal(ch) for ch in digits}
        if len(zeros) > 1:
            return None
    spelled = (
        ("-" if signed else "")
        + (_ascii_digits(number.integer) or "0")
        + ("." + _ascii_digits(number.fraction) if number.fraction else "")
        + (number.exponent[:1] + _ascii_digits(number.exponent[1:]) if number.exponent else "")
    )
    value = float(spelled)
    underflowed = value == 0.0 and _ascii_digits(number.integer + number.fraction).strip("0") != ""  # 1e-400
    if underflowed or not _fits_float32(value):
        return None
    exponent = _exponent_value(_ascii_digits(number.exponent[1:])) if number.exponent else 0
    unit = 10.0 ** max(-320, min(300, exponent - len(number.fraction)))
    return NumberSpan(start, end, value, text[start:end], unit)


def _exponent_value(written: str) -> int:
    """``int(written)`` (``"+05"``, ``"-3"``) clamped to +-10**6: an exponent of more than 4300 digits (``0e000...1``)
    is no error (Python refuses to convert so long a string to int)."""
    digits = written.lstrip("+-").lstrip("0") or "0"
    magnitude = int(digits) if len(digits) <= 7 else 10**6
    return -min(magnitude, 10**6) if written.startswith("-") else min(magnitude, 10**6)


def _fits_float32(value: float) -> bool:
    """Whether ``value`` is 0 or rounds to a finite, normal float32 (not inf, not a subnormal or 0)."""
    magnitude = abs(value)
    if magnitude == 0.0 or FLOAT32_MIN_NORMAL <= magnitude <= FLOAT32_MAX:
        return True
    rounded = to_float32(magnitude)
    return FLOAT32_MIN_NORMAL <= rounded <= FLOAT32_MAX


def _ascii_digits(digits: str) -> str:
    if digits.isascii():
        return digits
    return "".join(str(unicodedata.decimal(ch)) if ch.isdigit() else ch for ch in digits)


def _digit_value(ch: str) -> int:
    return unicodedata.decimal(ch, -1)


def _is_glue(ch: str) -> bool:
    """``_``, a combining mark, or a letter/digit of a script that separates words with spaces."""
    if ch.isascii():
        return ch.isalnum() or ch == "_"
    if ch.isalnum():
        return not unicodedata.name(ch, "").startswith(_SPACELESS_SCRIPTS)
    # a vowel sign or tone mark of Thai, Lao, Khmer, Myanmar, Tibetan ... belongs to a word of a spaceless script
    return unicodedata.category(ch).startswith("M") and not unicodedata.name(ch, "").startswith(_SPACELESS_SCRIPTS)


def decimals_written(texts: Sequence[str], decimal_comma: bool = False) -> int | None:
    """The most common number of decimals among the numbers in ``texts`` (None when there is none).

    For a training field written ``"12.8"``, ``"-3.1"``, ... this is 1: the fewest decimals a prediction of
    that field is printed with (:func:`format_prediction`, ``min_decimals``).
    """
    counts: dict[int, int] = {}
    for text in texts:
        for span in find_numbers(text, decimal_comma=decimal_comma):
            if span.unit <= 0.0:
                continue
            decimals = max(0, -round(math.log10(span.unit)))
            counts[decimals] = counts.get(decimals, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda decimals: (counts[decimals], -decimals))


# ---------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------
def format_number(value: float, decimal_comma: bool = False) -> str:
    """The canonical spelling of ``value``: the shortest decimal that reads back as the same number.

    A value that is exactly a float32 (as the model writes its numbers) gets the shortest spelling that
    rounds back to that float32 (``99.99``, ``0.33333334``); any other float the shortest that rounds back
    to the same float64 (``123456789``, ``3.14159265358979``). Positional for ``1e-5 <= |v| < 1e15``
    (integers without ``.0``), scientific otherwise (``1e+20``, ``1.5e-30``). ``-0.0`` is written ``0``;
    non-finite values are written ``inf``, ``-inf``, ``nan`` (these are not read back as numbers). A float32 whose
    float64 spelling has at most 15 significant digits (``4294967296``, as read from a text) is written so, not
    rounded to its float32 spelling (``4294967300``). ``decimal_comma``: the decimal point is written ``,``
    (``1234,56``), as a decimal-comma tokenizer reads it.
    """
    return _with_decimal_point(_format_number(value), decimal_comma)


def _with_decimal_point(written: str, decimal_comma: bool) -> str:
    """``written`` (a number spelled with a decimal point ``.`` and no grouping) with ``,`` for its point when
    ``decimal_comma``."""
    return written.replace(".", ",") if decimal_comma else written


def _format_number(value: float) -> str:
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0.0:
        return "0"
    spelled = repr(value)
    digits = len(Decimal(spelled).normalize().as_tuple().digits)
    if digits > MAX_INTEGER_DIGITS and to_float32(value) == value:  # a float32 (a number the model wrote)
        digits, spelled = _shortest_float32(value)
    exponent = Decimal(spelled).adjusted()
    if -5 <= exponent < MAX_INTEGER_DIGITS:
        return format(Decimal(spelled).normalize(), "f")
    return f"{value:.{digits - 1}e}"


def _shortest_float32(f32: float) -> tuple[int, str]:
    """Fewest significant digits (and the ``%g`` spelling) that round back to the float32 ``f32``."""
    for digits in range(1, 10):
        spelled = f"{f32:.{digits}g}"
        if to_float32(float(spelled)) == f32:
            return digits, spelled
    raise AssertionError(f"no 9-digit spelling round-trips float32 {f32!r}")  # 9 digits always suffice


def format_prediction(median: float, scale: float | None, min_decimals: int | None = None,
                      decimal_comma: bool = False) -> str:
    """A predicted number ``Y ~ Cauchy(median, scale)`` written to the precision the prediction carries.

    The 50% interval is ``median ± h`` with ``h = scale·tan(π/4) = scale``; the median is rounded to two
    significant digits of ``h``: to a multiple of ``10^(⌊log10 h⌋ − 1)``. So ``median 6.479088, scale 1.5``
    is written ``6.5`` and ``scale 0.015`` gives ``6.479``. ``min_decimals`` (the decimals the training data
    wrote for that field, when known) is a floor: never fewer decimals than that. A number of more than 15
    integer digits or below ``1e-6`` is written with an exponent (``4.9e-06``). Without a usable scale (None, NaN,
    0 or inf) the median is written by :func:`format_number`. ``decimal_comma``: the decimal point is written ``,``
    (``6,5``), as a decimal-comma tokenizer reads it.
    """
    median = float(median)
    if not math.isfinite(median):
        raise ValueError(f"format_prediction needs a finite median, got {median!r}")
    if min_decimals is not None and (isinstance(min_decimals, bool) or not isinstance(min_decimals, int)
                                     or min_decimals < 0):
        raise ValueError(f"min_decimals must be a non-negative int or None, got {min_decimals!r}")
    if scale is None or not math.isfinite(scale) or scale <= 0.0:
        return format_number(median, decimal_comma)
    step_exponent = math.floor(math.log10(scale)) - 1  # two significant digits of the half-width
    if median != 0.0:  # a float32 median carries at most 9 significant digits
        step_exponent = max(step_exponent, math.floor(math.log10(abs(median))) - 8)
    decimals = max(-step_exponent, min_decimals or 0)
    if decimals > 0:
        written = f"{median:.{decimals}f}"
    else:
        step = 10.0**step_exponent
        written = format(Decimal(round(median / step)) * Decimal(10) ** step_exponent, "f")
    if float(written) == 0.0:
        written = written.lstrip("-")
    if abs(float(written)) >= 10.0**MAX_INTEGER_DIGITS or 0.0 < abs(float(written)) < 10.0**-MAX_LEADING_ZEROS:
        significant = max(1, math.floor(math.log10(abs(median))) - step_exponent + 1)
        written = f"{median:.{significant - 1}e}"
    return _with_decimal_point(written, decimal_comma)


def format_like(value: float, written: str) -> str:
    """``value`` written to the precision of ``written``, a number as `format_prediction` wrote it: as many
    decimals (``format_like(3355.4217, "1200") == "3355"``, ``format_like(7.0312, "6.48") == "7.03"``), or as many
    mantissa digits when ``written`` has an exponent (``format_like(5.1e-06, "4.9e-06") == "5.1e-06"``). So an
    interval's ends read at the precision of the median they surround. A non-finite ``value`` is written ``inf``,
    ``-inf`` or ``nan``."""
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    mantissa, exponent_mark, _ = written.lower().replace(",", ".").partition("e")  # "6,48": a decimal comma
    decimals = len(mantissa.partition(".")[2])
    spelled = f"{value:.{decimals}e}" if exponent_mark else f"{value:.{decimals}f}"
    return spelled.lstrip("-") if float(spelled) == 0.0 else spelled


def format_interval(interval: tuple[float, float], written: str) -> str:
    """``[low, high]`` with both ends at the precision of the median as it is ``written`` (`format_like`)."""
    return f"[{format_like(interval[0], written)}, {format_like(interval[1], written)}]"


# Separators tried around a written number, fewest first: (before, after).
_SEPARATOR_CHOICES = (("", ""), (" ", ""), ("", " "), (" ", " "))
# Characters of context either side that decide how a number reads back (glue, signs, lists, dots).
_CONTEXT_CHARS = 16


def join_numbers(
    pieces: Sequence[str],
    values: Sequence[float],
    strings: Sequence[str | None] | None = None,
    decimal_comma: bool = False,
    separate_strings: bool = False,
) -> str:
    """``pieces[0] + n_0 + pieces[1] + n_1 + … + pieces[-1]``.

    ``n_k`` is ``strings[k]`` when given and non-empty (a number's surface string), else
    :func:`format_number` of ``values[k]``. A formatted number (and, with ``separate_strings``, a given
    string too: numbers a model wrote) gets a space before and/or after it only where, without it, it would
    not read back (by :func:`find_numbers`) as one number at that place: numbers ``5`` and ``-3`` in a row are
    written ``5 -3`` (``5-3`` reads 5, 3), a number after a letter ``low -3.2``. A surface string read from a
    text is written as it is, so a text comes back exactly. Non-finite values are written as they are (they
    never read back as numbers).
    """
    if len(pieces) != len(values) + 1:
        raise ValueError(f"join_numbers needs one more text piece than numbers, got {len(pieces)} and {len(values)}")
    if strings is not None and len(strings) != len(values):
        raise ValueError(f"join_numbers got {len(strings)} strings for {len(values)} numbers")
    given = [bool(strings is not None and strings[index]) for index in range(len(values))]
    spelled = [strings[index] if given[index] else format_number(value, decimal_comma)
               for index, value in enumerate(values)]
    if all(given) and not separate_strings:
        return "".join(piece + number for piece, number in zip(pieces, spelled)) + pieces[-1]
    written = [pieces[0]]
    tail = pieces[0][-_CONTEXT_CHARS:]
    for index, number in enumerate(spelled):
        following = pieces[index + 1] + (spelled[index + 1] if index + 1 < len(spelled) else "")
        if given[index] and not separate_strings:
            before, after = "", ""
        else:
            before, after = _separators(tail, number, following[:_CONTEXT_CHARS], decimal_comma)
        piece = before + number + after + pieces[index + 1]
        written.append(piece)
        tail = (tail + piece)[-_CONTEXT_CHARS:]
    return "".join(written)


def _separators(left: str, number: str, right: str, decimal_comma: bool) -> tuple[str, str]:
    """The first of `_SEPARATOR_CHOICES` with which ``left + number + right`` reads ``number`` as one number
    at its place (a string that is no number at all, ``inf``, is written as it is)."""
    if not find_numbers(number, decimal_comma=decimal_comma):
        return "", ""
    for before, after in _SEPARATOR_CHOICES:
        start = len(left) + len(before)
        spans = find_numbers(left + before + number + after + right, decimal_comma=decimal_comma)
        if any(span.start == start and span.end == start + len(number) for span in spans):
            return before, after
    return " ", " "
