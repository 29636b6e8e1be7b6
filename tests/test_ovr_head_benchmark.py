"""benchmarks/ovr_head.py cannot break silently: its quickest form (``--smoke``: every part on toy sizes) runs as a
script from the repository root, as from a fresh clone, and reports every part's figures; a part that cannot run
stops the script with exit status 1 (it once skipped its training-step part with exit status 0 after a module
moved)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import load_benchmark

REPO = Path(__file__).resolve().parents[1]
# The figures each part must report (docs/benchmarks.md's table).
PART_A = ("head_mem_ratio", "head_time_ratio", "head_time_vs_matmul", "sampled_speedup")
PART_B = ("step_mem_ratio", "step_raw_peak_ratio", "step_time_ratio")


def test_smoke_run_measures_every_part():
    done = subprocess.run([sys.executable, "benchmarks/ovr_head.py", "--smoke", "--json", "--threads", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["smoke"] is True and figures["step_base"] == "random:tiny"
    for key in PART_A + PART_B:
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    assert not [key for key in figures if "skip" in key], "no part is skipped"


@pytest.fixture
def ovr_head():
    return load_benchmark("ovr_head.py", "ovr_head_benchmark")


def test_a_part_that_cannot_run_is_an_error(ovr_head, monkeypatch, capsys):
    def failing(args, name, **kwargs):
        raise ovr_head.PartFailed(f"worker {name} failed (exit status 1):\nModuleNotFoundError: no module")

    monkeypatch.setattr(ovr_head, "run_worker", failing)
    assert ovr_head.main(["--part", "b", "--smoke", "--json"]) == 1
    captured = capsys.readouterr()
    assert "ovr_head: part (b) failed: worker step failed" in captured.err and captured.out == ""


def test_a_failing_worker_in_the_smoke_run_is_reported(ovr_head, monkeypatch):
    """In ``--smoke`` the workers run in the script's own process: an exception there is a failed part too."""
    def broken(**kwargs):
        raise ImportError("cannot import name 'build_preset'")

    monkeypatch.setitem(ovr_head.WORKERS, "step", broken)
    args = ovr_head.parse_args(["--smoke"])
    with pytest.raises(ovr_head.PartFailed, match="worker step failed: ImportError: cannot import name"):
        ovr_head.part_b(args)
