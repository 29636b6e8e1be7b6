"""Issue 14: nothing lost, nothing silently wrong.

Checkpoints that survive SIGKILL, a lock on the output folder, validation before anything is deleted,
date splits that parse dates, damaged or non-finite weights and metrics as errors, argument limits of
eval and generate, and a command line that starts without importing torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "causal_qwen.cli"]


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``causal-qwen ARGS`` in a fresh interpreter."""
    merged = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([*CLI, *args], cwd=REPO, env=merged, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit status 2 and one line on stderr holding every needle."""
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1, done.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---- start-up ----------------------------------------------------------------------------------------------
def test_help_and_version_start_without_torch():
    code = ("import sys, time; t = time.perf_counter(); from causal_qwen.cli import build_parser; build_parser(); "
            "print(time.perf_counter() - t); print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'transformers', 'numpy', 'tokenizers', 'matplotlib'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    seconds, heavy = done.stdout.splitlines()
    assert heavy == "[]", heavy
    assert float(seconds) < 1.0
    begin = time.perf_counter()
    helped = run_cli("--help")
    assert helped.returncode == 0 and "train" in helped.stdout
    assert time.perf_counter() - begin < 2.0
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("causal-qwen 0.")


def test_command_choices_match_the_library():
    from causal_qwen.commands import eval as eval_command
    from causal_qwen.commands import generate as generate_command
    from causal_qwen.evaluation import METRIC_SETS
    from causal_qwen.generation import MODES

    assert eval_command.METRIC_SETS == METRIC_SETS
    assert generate_command.MODES == MODES
