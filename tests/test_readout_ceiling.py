"""benchmarks/readout_ceiling.py: the read-out figures on constructed numbers, and a --quick smoke run on the tiny
preset (figures meaningless)."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import load_benchmark


@pytest.fixture(scope="module")
def ceiling_bench():
    return load_benchmark("readout_ceiling.py", "readout_ceiling")


def numbers(features: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"X": features, "y": values, "is_target": torch.ones(len(values), dtype=torch.bool)}


def test_a_linear_series_is_read_exactly_and_a_drift_shows_in_held_over_slice(ceiling_bench):
    """y = 3·x₀ − x₁ + 5 is read out exactly by the weakest ridge (the best), while a held-out period whose level
    has moved by 10 errs 10 against a slice that errs 0: ``held / slice`` is large, and the figures agree with
    each other (auto and best are entries of the per-ridge table)."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(80, 4, generator=generator, dtype=torch.float64)
    values = 3 * features[:, 0] - features[:, 1] + 5
    held_features = torch.randn(20, 4, generator=generator, dtype=torch.float64)
    exact = {"kept": numbers(features[:60], values[:60]), "slice": numbers(features[60:], values[60:]),
             "held": numbers(held_features, 3 * held_features[:, 0] - held_features[:, 1] + 5)}
    figures = ceiling_bench.ceiling(exact)
    assert figures["best_ridge"] == min(ceiling_bench.LAMBDAS) and figures["best_mdae"] < 1e-3
    assert figures["auto_mdae"] == figures["held_mdae_by_ridge"][f"{figures['auto_ridge']:g}"]
    assert figures["best_mdae"] == min(figures["held_mdae_by_ridge"].values())
    assert figures["numbers"] == {"kept": 60, "slice": 20, "held": 20}

    drifted = {**exact, "held": numbers(held_features, 3 * held_features[:, 0] - held_features[:, 1] + 15)}
    moved = ceiling_bench.ceiling(drifted)
    assert moved["held_mdae_by_ridge"]["0.0001"] == pytest.approx(10.0, abs=0.05)
    assert moved["slice_mdae"] < 0.05 and moved["held_over_slice"] > 100


def test_quick_run_prints_every_table(ceiling_bench, capsys, tmp_path):
    assert ceiling_bench.main(["--base", "random:tiny", "--quick", "--json", "--tables", "stocks,la-riots",
                               "--workdir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert set(result["tables"]) == {"stocks", "la-riots"}
    stocks, riots = result["tables"]["stocks"], result["tables"]["la-riots"]
    assert set(stocks["baselines"]) == {"median", "group_median", "last_value"}
    assert set(riots["baselines"]) == {"median", "group_median"}  # a random split has no last value
    for figures in (stocks, riots):
        assert set(figures["held_mdae_by_ridge"]) == {f"{ridge:g}" for ridge in ceiling_bench.LAMBDAS}
        assert figures["best_mdae"] <= figures["auto_mdae"]
        assert figures["numbers"]["slice"] >= 8 and figures["held_over_slice"] > 0
    assert "the best ridge reaches the best simple baseline on" in captured.err


def test_bad_arguments_are_refused(ceiling_bench, tmp_path):
    with pytest.raises(SystemExit):
        ceiling_bench.main(["--base", str(tmp_path / "missing.gguf")])
    with pytest.raises(SystemExit):
        ceiling_bench.main(["--base", "random:tiny", "--tables", "no-such-table"])
