"""benchmarks/individual.py (the causal individual's benchmark) end to end on the tiny preset, and the frontier plot
drawn from its JSON (`causal-qwen plot frontier`). Figures on random weights are meaningless: keys and types only."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from causal_qwen.cli import main

from .conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / "benchmarks" / "individual.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

FRONTIER = [
    {"family": "causal", "tau": 0.5, "distinct2": 0.61, "fluency": 3.1},
    {"family": "causal", "tau": 1.0, "distinct2": 0.72, "fluency": 4.0},
    {"family": "causal", "tau": 2.0, "distinct2": 0.85, "fluency": 7.5},
    {"family": "qwen", "temperature": 0.7, "distinct2": 0.64, "fluency": 2.9},
    {"family": "qwen", "temperature": 1.0, "distinct2": 0.80, "fluency": 5.2},
]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def test_plot_frontier_writes_a_png(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"causal_temperature": 1.0, "frontier": FRONTIER}))
    out = tmp_path / "frontier.png"
    assert main(["plot", "frontier", "--from", str(bench), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000


def test_plot_frontier_errors(tmp_path, capsys):
    out = str(tmp_path / "f.png")
    assert main(["plot", "frontier", "--from", str(tmp_path / "missing.json"), "--out", out]) == 2
    assert "does not exist" in capsys.readouterr().err
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"causal_temperature": 1.0}))
    assert main(["plot", "frontier", "--from", str(bench), "--out", out]) == 2
    assert "frontier" in capsys.readouterr().err
    bench.write_text(json.dumps({"frontier": [{"family": "causal", "tau": 1.0, "distinct2": 0.5, "fluency": 0.0}]}))
    assert main(["plot", "frontier", "--from", str(bench), "--out", out]) == 2
    assert "positive" in capsys.readouterr().err
    bench.write_text(json.dumps({"frontier": [1, 2]}))
    assert main(["plot", "frontier", "--from", str(bench), "--out", out]) == 2
    assert "frontier point 0 is 1, not a record of its figures" in capsys.readouterr().err
    bench.write_text(json.dumps({"causal_temperature": "abc", "frontier": FRONTIER}))
    assert main(["plot", "frontier", "--from", str(bench), "--out", out]) == 2
    assert "causal_temperature 'abc' is not a number" in capsys.readouterr().err


@pytest.mark.slow
def test_individual_benchmark_quick_on_the_tiny_preset(tmp_path):
    figure = tmp_path / "frontier.png"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--base", "random:tiny", "--quick", "--json", "--threads", "1",
         "--out", str(figure), "--candidates", "5"],
        capture_output=True, text=True, cwd=str(ROOT), env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert _number(result["causal_temperature"]) and result["causal_temperature"] > 0
    assert result["causal_candidates"] == 5
    for scope in ("token_scope", "sequence_scope"):
        for key in ("fluency_ratio", "distinct2_ratio"):
            assert _number(result[scope][key]), (scope, key)
        consistency = result[scope]["consistency"]
        assert 0 <= consistency["same_individual"] <= 1 and 0 <= consistency["different_individuals"] <= 1
        low, high = consistency["ci95"]
        assert -1 <= low <= high <= 1
    for key in ("choice_cross_entropy", "softmax_entropy"):
        assert _number(result["token_scope"][key]) and result["token_scope"][key] >= 0
    assert isinstance(result["replay_equal"], bool)
    assert 0 <= result["individuals_differ"] <= 1
    assert _number(result["causal_speed_ratio"]) and result["causal_speed_ratio"] > 0
    families = [point["family"] for point in result["frontier"]]
    benchmark = _benchmark()
    grid = len(benchmark.FRONTIER_MULTIPLES)  # plus at most AIM_STEPS points aimed at each of two temperatures
    assert grid <= families.count("causal") <= grid + 2 * benchmark.AIM_STEPS and families.count("qwen") == 4
    for point in result["frontier"]:
        assert _number(point["tau" if point["family"] == "causal" else "temperature"])
        assert _number(point["distinct2"]) and _number(point["fluency"]) and point["fluency"] > 0
    taus = [point["tau"] for point in result["frontier"] if point["family"] == "causal"]
    assert any(math.isclose(tau, result["causal_temperature"]) for tau in taus)
    checks = result["acceptance"]
    for name in ("token_distinct2_ratio", "token_fluency_ratio", "frontier_qwen_T0.7", "frontier_qwen_T1.0",
                 "sequence_distinct2_ratio", "sequence_fluency_ratio", "consistency_ci_apart", "individuals_differ",
                 "replay_equal", "causal_speed_ratio"):
        assert set(checks[name]) >= {"value", "threshold", "pass"} and isinstance(checks[name]["pass"], bool), name
    assert isinstance(checks["all_pass"], bool)
    assert figure.read_bytes()[:8] == PNG_SIGNATURE


def _benchmark():
    """benchmarks/individual.py as a module."""
    return load_benchmark("individual.py", "individual_benchmark")


def test_a_tau_is_aimed_between_the_two_points_that_bracket_a_figure():
    aimed = _benchmark().aimed_multiple
    points = {0.25: {"distinct2": 0.60, "perplexity": 2.0}, 0.5: {"distinct2": 0.70, "perplexity": 3.0},
              1.0: {"distinct2": 0.80, "perplexity": 5.0}}
    assert aimed(points, "distinct2", 0.75) == pytest.approx(math.sqrt(0.5), abs=1e-4)  # halfway in log τ
    assert aimed(points, "perplexity", 2.5) == pytest.approx(math.sqrt(0.125), abs=1e-4)  # between 0.25 and 0.5
    assert aimed(points, "distinct2", 0.60) == 0.25 and aimed(points, "perplexity", 5.0) == 1.0
    assert aimed(points, "distinct2", 0.59) is None and aimed(points, "perplexity", 5.1) is None  # outside the grid
    flat = {1.0: {"distinct2": 0.7}, 2.0: {"distinct2": 0.7}}
    assert aimed(flat, "distinct2", 0.7) is None  # a flat stretch says nothing


def test_choice_is_the_first_content_word():
    module = _benchmark()
    prompt_words = set(module.words("My favourite colour is"))
    prompt_words |= set(module.words("If I had to pick one colour, I would pick"))
    assert module.first_content_word(" the colour Blue, definitely.", prompt_words) == "blue"
    assert module.first_content_word(" I'd say apples!", prompt_words) == "apple"
    assert module.first_content_word(" is, is the", prompt_words) is None
    assert module._agreement(["blue", "red", None], ["blue", "blue", None]) == (1 / 3, 1 / 6)
    low, high = module.bootstrap_difference([1.0, 1.0, 0.5], [0.0, 0.5, 0.5])
    assert 0 <= low <= high <= 1
