"""Progress of the long steps (conversion and its calibration, evaluation, verification): tqdm bars on stderr.

One switch for the whole process, set by the command line (`configure`): ``"auto"`` (the default) shows bars when
stderr is a terminal, ``"always"`` also when it is not (a log file then gets one plain line per update, at most
every `LOG_INTERVAL` seconds, and one when a step ends), ``"never"`` shows nothing (``--quiet``). The Python API
follows the same switch, so a script run in a terminal sees the bars and a test run sees none.

    for batch in progress.bar(batches, desc="eval: documents", total=len(batches), unit="batch"):
        ...
    with progress.bar(total=len(grid), desc="calibration: level and scale") as bar:
        ... bar.update(1) ...
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

MODES = ("auto", "always", "never")
LOG_INTERVAL = 10.0  # seconds between two lines when stderr is not a terminal
_mode = "auto"


def configure(mode: str) -> None:
    """Show bars ``"auto"`` (when stderr is a terminal), ``"always"`` or ``"never"``."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
    _mode = mode


def mode() -> str:
    """The current switch (`configure`)."""
    return _mode


def _is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def enabled() -> bool:
    """Whether `bar` shows anything now."""
    return _mode == "always" or (_mode == "auto" and _is_terminal())


class _Lines:
    """A stderr for tqdm when it is not a terminal: every refresh on a line of its own (no carriage returns)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip("\n")
        if text.strip():
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def bar(iterable: Iterable | None = None, *, desc: str, total: float | None = None, unit: str = "it", **options: Any):
    """A tqdm bar on stderr (disabled when `enabled` is False): iterate it, or call ``update(n)``; use it as a
    context manager (or ``close()`` it) so that its last state is written. ``options`` go to tqdm."""
    from tqdm import tqdm

    terminal = _is_terminal()
    settings: dict[str, Any] = dict(
        desc=desc, total=total, unit=unit, disable=not enabled(), dynamic_ncols=True, leave=True,
        file=sys.stderr if terminal else _Lines(sys.stderr),
        mininterval=0.2 if terminal else LOG_INTERVAL,
    )
    if not terminal:
        settings["ascii"] = True
    settings.update(options)
    return tqdm(iterable, **settings)
