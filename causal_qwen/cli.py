"""The ``causal-qwen`` command line: one sub-command per module in `causal_qwen.commands`.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
function taking the parsed arguments and returning the exit status. Only this layer prints (and the progress bars of
`causal_qwen.progress` on stderr, which ``--quiet`` turns off and ``--progress`` shows in a log too). Command modules
import torch, transformers and the heavy parts of the package inside their ``run`` functions, so that
``causal-qwen --help`` and ``--version`` answer in a fraction of a second.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import sys
import threading

from . import __version__

COMMAND_MODULES = (
    "convert",
    "compare",
    "train",
    "generate",
    "predict",
    "eval", "plot", "demo",
)


class OneLineErrors(argparse.ArgumentParser):
    """argparse's parser with its usage errors in one line on stderr (exit status 2), as every other error of the
    command line, instead of the usage block above the message."""

    arguments: list[str] = []  # the command line being parsed (`main` sets it), for the hint below

    def error(self, message: str):
        command = next((word for word in self.arguments if word in PROMPT_COMMANDS), None)
        hint = ""
        words = self.arguments
        options = [word.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(word) for word in words]
        loose = [word for index, word in enumerate(words)  # a negative number that is no option's value
                 if _NEGATIVE_NUMBER.fullmatch(word) and not (index > 0 and options[index - 1])]
        if command is not None and loose:
            hint = f"; a prompt that starts with '-' goes after '--' (causal-qwen {command} ... -- -3.5e2)"
        self.exit(2, f"{self.prog}: error: {message}{hint} (--help lists the options)\n")


PROMPT_COMMANDS = ("generate", "predict")
_NEGATIVE_NUMBER = re.compile(r"-[\d.][\d.,eE+-]*")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog="causal-qwen",
        description="CausalQwen: convert Qwen2 models to causal LMs with Cauchy abduction/action heads, "
        "verify, fine-tune, generate, evaluate and plot.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"causal_qwen.commands.{name}").register(subparsers)
    return parser


class PlainFormatter(logging.Formatter):
    """``warning: message``, as the commands write their own warnings (``--verbose`` adds the level and the logger
    that wrote each line)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    OneLineErrors.arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s") if args.verbose else PlainFormatter())
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[handler])
    if not args.verbose:
        _quiet_loading_bars()
    from . import progress

    shown = progress.mode()
    progress.configure("never" if getattr(args, "quiet", False) else "always" if getattr(args, "progress", False)
                       else "auto")
    previous = _stop_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"causal-qwen {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of the output went away (`causal-qwen train --keys | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 1
    except (KeyboardInterrupt, Terminated) as stop:  # Ctrl-C or `kill`: one line, not a traceback
        # (a checkpoint being written stays in staging)
        again = ""
        if args.command == "train":  # training tells whether a checkpoint was saved before the stop
            again = "; `causal-qwen train CONFIG --resume` continues from the newest complete checkpoint" \
                if getattr(stop, "resumable", True) else "; no checkpoint was saved yet: run the same command again"
        what = "terminated" if isinstance(stop, Terminated) else "interrupted"
        print(f"causal-qwen {args.command}: {what}{again}", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
    finally:
        progress.configure(shown)  # an in-process caller keeps its own setting
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(BaseException):
    """SIGTERM (``kill``, ``timeout``) while a command runs: it ends as Ctrl-C does, with one line."""


def _stop_on_sigterm():
    """Raise `Terminated` on SIGTERM in the main thread; the handler it replaces (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise Terminated()

    return signal.signal(signal.SIGTERM, stop)


def _quiet_loading_bars() -> None:
    """No "Loading weights" / "Writing model shards" bars from transformers (training's step bar stays)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
