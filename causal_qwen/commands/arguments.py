"""Argument types that check a value's range as the command line is read, so a bad option is named (by its flag)
before any model loads."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """An integer ≥ 1."""
    value = _parsed(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer ≥ 0."""
    value = _parsed(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ≥ 0."""
    value = _parsed(text, float, "a number")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in (0, 1]."""
    value = _parsed(text, float, "a number")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text!r}")
    return value


def _parsed(text: str, kind: type, name: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {name}, got {text!r}") from None
