"""Finding numbers in text, and writing them back.

CausalQwen reads every number in a text as one ``<NUM>`` token plus its value. This module decides
what counts as a number (:func:`find_numbers`) and how a value is spelled when it is written back
(:func:`format_number`). It knows nothing about tokenizers or tensors.

Grammar
-------
Only ASCII digits ``0-9`` make numbers. A *run* is one or more *elements* joined by single commas::

    run      := element ("," element)*
    element  := sign? mantissa exponent?
    sign     := "-" | "−" (U+2212)     only at the start of the text or right after whitespace or
                                       one of  ( [ { < > = : ; , / * | " '  （ ［ ｛ ＜ ＞ ＝ ： ； ， 、
    mantissa := digits ("." digits)?  |  "." digits      (".5" only when not right after "." or a digit)
    exponent := ("e" | "E") ("+" | "-")? digits

A "+" is never part of a number (``+5`` is the text "+" and the number 5), and a hyphen after a digit
joins two numbers rather than negating the second: ``2024-11-22`` gives 2024, 11, 22 and ``3-5``
gives 3, 5.

A run is read as **one number with thousands separators** when it is exactly
``d{1,3}(,ddd)+`` (optionally followed by a fraction and an exponent): ``1,234.5`` is 1234.5 and
``1,234,567`` is 1234567. Any other run is a **list**: ``1,2,3`` gives 1, 2, 3 and ``1,2345`` gives
1, 2345.

A run stays text (gives no number at all) when

* it is **glued** on the left: the character before it is a glue character; or a "." whose own
  left neighbour is a glue character (``1.2.3``, ``v.5``); or a hyphen ("-" or "−") whose own
  left neighbour is a glue character other than an ASCII digit (``COVID-19``, ``B-52``); or a ","
  right after an ASCII digit (the tail of a run that is itself text); or a "+" right after "e"/"E"
  (an unfinished exponent, as in ``0E+.1``);
* it is **glued** on the right: the next character is a glue character (``3rd``, ``5km``, ``1e5x``),
  or a "." followed by a digit (``1.2.3``, ``192.168.0.1``, ``22.11.2024``);
* a value does not round to a finite float32 (``|v|`` beyond about ``3.4028235e38``, e.g. ``1e999``):
  the model reads float32;
* it is a list whose canonical spelling (:func:`format_number` of each value joined by ",") would read
  as one thousands-separated number (``1,1e2`` would be written back as ``1,100``).

A **glue character** is ``_``, a combining mark, or a letter or digit of a script written with spaces
between words (Latin, Greek, Cyrillic, ...). Letters of CJK, kana, Hangul, Thai, Lao, Khmer, Myanmar,
Tibetan, Yi and Bopomofo do not glue, because numbers in those scripts are written directly against
words: ``价格是99.9元`` gives 99.9, while ``H2O``, ``v2``, ``abc123`` give no number.

The rules make writing back stable: replacing every number by :func:`format_number` of its value and
running :func:`find_numbers` again finds the same values (up to float32 rounding) at the same places
between the same text. :func:`join_numbers` writes numbers between text pieces that did not come from
reading a text (a model's output: two numbers in a row, a number right before a letter) and adds a space
wherever a number would otherwise not read back as itself.
"""

from __future__ import annotations

import math
import re
import struct
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

__all__ = ["NumberSpan", "find_numbers", "format_number", "join_numbers", "to_float32"]

_SIGNS = "-\u2212"
_SIGN_CONTEXT = r"\s([{<>=:;,/*|\"'\uff08\uff3b\uff5b\uff1c\uff1e\uff1d\uff1a\uff1b\uff0c\u3001"
_ELEMENT = (
    rf"(?:(?:^|(?<=[{_SIGN_CONTEXT}]))[{_SIGNS}])?"  # sign, only where a number may start
    r"(?:[0-9]+(?:\.[0-9]+)?|(?<![.0-9])\.[0-9]+)"  # mantissa
    r"(?:[eE][-+]?[0-9]+)?"  # exponent
)
_ELEMENT_RE = re.compile(_ELEMENT)
_RUN_RE = re.compile(rf"{_ELEMENT}(?:,{_ELEMENT})*")
_THOUSANDS_RE = re.compile(rf"[{_SIGNS}]?[0-9]{{1,3}}(?:,[0-9]{{3}})+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")

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
    """One number found in a text: ``text[start:end] == self.text`` reads as ``value``."""

    start: int
    end: int
    value: float
    text: str


def to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (as a Python float); ±inf past the float32 range."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def format_number(value: float) -> str:
    """The canonical spelling of ``value`` as the model sees it (float32).

    The shortest decimal that rounds back to the same float32, written positionally for
    ``1e-5 <= |v| < 1e16`` (``99.99``, ``0.0015``, ``100``: integers without ``.0``) and in scientific
    notation otherwise (``1e+20``, ``1.5e-30``). ``-0.0`` is written ``0``; non-finite values are
    written ``inf``, ``-inf``, ``nan`` (these are not read back as numbers).
    """
    f32 = to_float32(value)
    if math.isnan(f32) or math.isinf(f32):
        return str(f32)
    if f32 == 0.0:
        return "0"
    digits, spelled = _shortest_digits(f32)
    exponent = Decimal(spelled).adjusted()
    if -5 <= exponent < 16:
        return format(Decimal(spelled), "f")
    return f"{f32:.{digits - 1}e}"


def _shortest_digits(f32: float) -> tuple[int, str]:
    """Fewest significant digits (and the ``%g`` spelling) that round back to the float32 ``f32``."""
    for digits in range(1, 10):
        spelled = f"{f32:.{digits}g}"
        if to_float32(float(spelled)) == f32:
            return digits, spelled
    raise AssertionError(f"no 9-digit spelling round-trips float32 {f32!r}")  # 9 digits always suffice


def find_numbers(text: str) -> list[NumberSpan]:
    """Every number in ``text``, left to right, by the grammar in the module docstring.

    >>> [n.value for n in find_numbers("The item costs 99.99 dollars, -15.5 on 2024-11-22.")]
    [99.99, -15.5, 2024.0, 11.0, 22.0]
    """
    if not isinstance(text, str):
        raise TypeError(f"find_numbers expects a str, got {type(text).__name__}")
    spans: list[NumberSpan] = []
    for run in _RUN_RE.finditer(text):
        if _glued_left(text, run.start()) or _glued_right(text, run.end()):
            continue
        spans.extend(_read_run(run))
    return spans


def _read_run(run: re.Match[str]) -> list[NumberSpan]:
    """The numbers of one unglued run: one thousands-separated number, a list, or none."""
    if _THOUSANDS_RE.fullmatch(run.group()):
        elements = [(run.start(), run.end(), run.group())]
    else:
        elements = [(m.start(), m.end(), m.group()) for m in _ELEMENT_RE.finditer(run.string, run.start(), run.end())]
    spans = [NumberSpan(start, end, _parse(spelled), spelled) for start, end, spelled in elements]
    if not all(math.isfinite(to_float32(span.value)) for span in spans):
        return []
    if len(spans) > 1 and _THOUSANDS_RE.fullmatch(",".join(format_number(span.value) for span in spans)):
        return []  # written back, the list would read as one number
    return spans


# Separators tried around a written number, fewest first: (before, after).
_SEPARATOR_CHOICES = (("", ""), (" ", ""), ("", " "), (" ", " "))
# Characters of context either side that decide how a number reads back (glue, signs, lists, dots).
_CONTEXT_CHARS = 16


def join_numbers(pieces: Sequence[str], values: Sequence[float]) -> str:
    """``pieces[0] + n_0 + pieces[1] + n_1 + … + pieces[-1]``, each ``n_k`` = :func:`format_number` of
    ``values[k]``, with a space added before and/or after ``n_k`` only where, without it, ``n_k`` would not
    read back (by :func:`find_numbers`) as one number of the same float32 value at that place.

    Text read by :func:`find_numbers` and written back gets no space (the rules make that stable); a model's
    output can need one: numbers ``5`` and ``-3`` in a row are written ``5 -3`` (``5-3`` reads 5, 3), and
    ``5`` followed by the text ``C`` is written ``5 C`` (``5C`` is a word). Non-finite values are written
    as they are (they never read back as numbers).
    """
    if len(pieces) != len(values) + 1:
        raise ValueError(f"join_numbers needs one more text piece than numbers, got {len(pieces)} and {len(values)}")
    spelled = [format_number(value) for value in values]
    written = pieces[0]
    for index, number in enumerate(spelled):
        following = pieces[index + 1] + (spelled[index + 1] if index + 1 < len(spelled) else "")
        before, after = _separators(written[-_CONTEXT_CHARS:], number, following[:_CONTEXT_CHARS], values[index])
        written += before + number + after + pieces[index + 1]
    return written


def _separators(left: str, number: str, right: str, value: float) -> tuple[str, str]:
    """The first of `_SEPARATOR_CHOICES` with which ``left + number + right`` reads ``number`` back."""
    target = to_float32(value)
    if not math.isfinite(target):
        return "", ""
    for before, after in _SEPARATOR_CHOICES:
        start = len(left) + len(before)
        spans = find_numbers(left + before + number + after + right)
        if any(span.start == start and span.end == start + len(number) and to_float32(span.value) == target
               for span in spans):
            return before, after
    return " ", " "


def _parse(spelled: str) -> float:
    """Value of one element or thousands-separated number (``inf`` when out of float range)."""
    return float(spelled.replace(",", "").replace("\u2212", "-"))


def _glued_left(text: str, start: int) -> bool:
    """Whether the run starting at ``start`` continues a word or dotted/hyphenated token on its left."""
    if start == 0:
        return False
    before = text[start - 1]
    if _is_glue(before):
        return True
    if start == 1:
        return False
    before2 = text[start - 2]
    if before == ".":
        return _is_glue(before2)
    if before in _SIGNS:
        return _is_glue(before2) and not _is_ascii_digit(before2)
    if before == ",":
        return _is_ascii_digit(before2)
    return before == "+" and before2 in "eE"


def _glued_right(text: str, end: int) -> bool:
    """Whether the run ending at ``end`` continues into a word or dotted token on its right."""
    if end == len(text):
        return False
    after = text[end]
    if _is_glue(after):
        return True
    return after == "." and end + 1 < len(text) and _is_ascii_digit(text[end + 1])


def _is_ascii_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def _is_glue(ch: str) -> bool:
    """``_``, a combining mark, or a letter/digit of a script that separates words with spaces."""
    if ch == "_":
        return True
    if ch.isalnum():
        return not unicodedata.name(ch, "").startswith(_SPACELESS_SCRIPTS)
    return unicodedata.category(ch).startswith("M")
