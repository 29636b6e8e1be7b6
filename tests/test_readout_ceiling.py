"""benchmarks/readout_ceiling.py: the read-out figures on constructed numbers, and a --quick smoke run on the tiny
preset (figures meaningless)."""

from __future__ import annotations

import json
import math

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
    assert stocks["recency"] is not None and stocks["horizon_slice"] is not None and riots["recency"] is None
    assert "any_read_out_reaches_a_simple_baseline" in result and "values_rule_reaches_a_simple_baseline" in result
    for figures in (stocks, riots):
        assert set(figures["held_mdae_by_ridge"]) == {f"{ridge:g}" for ridge in ceiling_bench.LAMBDAS}
        assert figures["best_mdae"] <= figures["auto_mdae"]
        assert figures["cauchy"]["best_mdae"] <= figures["cauchy"]["auto_mdae"]
        assert figures["numbers"]["slice"] >= 8 and figures["held_over_slice"] > 0
        smallest = figures["smallest_out_of_fold_ridge"]  # the grid's smallest e(λ), read from its own table
        assert figures["out_of_fold_by_ridge"][f"{smallest:g}"] == min(figures["out_of_fold_by_ridge"].values())
        assert figures["smallest_out_of_fold_mdae"] == figures["held_mdae_by_ridge"][f"{smallest:g}"]
        assert smallest <= figures["auto_ridge"]  # the one-standard-error step only strengthens
        values = figures["values"]  # the earlier numbers' values beside the features: stocks and la-riots have none
        assert values["chosen"] == "features" and values["chosen_mdae"] == figures["auto_mdae"]
    assert "the best ridge reaches the best simple baseline on" in captured.err


def test_a_second_set_table_too_small_for_a_slice_is_read(ceiling_bench, capsys, tmp_path):
    """ohlc (second set, 22 training rows): no check slice, so no held / slice ratio; every other figure is there."""
    assert ceiling_bench.main(["--base", "random:tiny", "--quick", "--json", "--tables", "ohlc",
                               "--workdir", str(tmp_path)]) == 0
    ohlc = json.loads(capsys.readouterr().out)["tables"]["ohlc"]
    assert ohlc["numbers"]["slice"] == 0 and ohlc["numbers"]["kept"] == 22
    assert ohlc["slice_mdae"] is None and ohlc["held_over_slice"] is None
    assert ohlc["horizon_slice"] is not None and math.isfinite(ohlc["auto_mdae"])


def test_bad_arguments_are_refused(ceiling_bench, tmp_path):
    with pytest.raises(SystemExit):
        ceiling_bench.main(["--base", str(tmp_path / "missing.gguf")])
    with pytest.raises(SystemExit):
        ceiling_bench.main(["--base", "random:tiny", "--tables", "no-such-table"])


def test_the_weighted_ridge_with_equal_weights_is_the_warm_starts(ceiling_bench):
    from causal_qwen.training.warm_start import ridge_fit

    generator = torch.Generator().manual_seed(1)
    features = torch.randn(50, 6, generator=generator, dtype=torch.float64)
    values = features @ torch.arange(6, dtype=torch.float64) + torch.randn(50, generator=generator, dtype=torch.float64)
    for ridge in (1e-3, 1.0):
        weight, bias = ceiling_bench.weighted_ridge_fit(features, values, ridge, torch.full((50,), 3.0, dtype=torch.float64))
        expected_weight, expected_bias = ridge_fit(features, values, ridge)
        assert torch.allclose(weight, expected_weight) and torch.allclose(bias, expected_bias)


def test_the_cauchy_fit_ignores_far_off_numbers_that_pull_the_ridge(ceiling_bench):
    """y = 2·x₀ + 1 with a tenth of the numbers off by +1000: least squares moves its intercept by about 100, the
    Cauchy fit stays on the line."""
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(200, 3, generator=generator, dtype=torch.float64)
    values = 2 * features[:, 0] + 1 + 0.01 * torch.randn(200, generator=generator, dtype=torch.float64)
    values[::10] += 1000.0
    _, ridge_bias = ceiling_bench.weighted_ridge_fit(features, values, 1e-6, torch.ones(200, dtype=torch.float64))
    weight, bias = ceiling_bench.cauchy_ridge_fit(features, values, 1e-6)
    assert float(ridge_bias) > 50
    assert float(bias) == pytest.approx(1.0, abs=0.05) and float(weight[0]) == pytest.approx(2.0, abs=0.05)


def test_recent_rows_weighted_follow_a_level_shift_and_the_longer_slice_sees_it(ceiling_bench):
    """A constant read-out (features carry nothing) of a series whose level steps from 0 to 10 two thirds of the
    way in: weighting the latest rows brings the forecast toward 10, a slice as long as the held-out period
    (which stays at 10) is a third of the training rows, and the Cauchy fit, robust, stays at the level most rows
    have (0)."""
    count = 90
    is_target = torch.ones(count, dtype=torch.bool)
    times = ceiling_bench.document_times(is_target)
    assert float(times[0]) == 0.0 and float(times[-1]) == pytest.approx(89 / 90)
    weights = ceiling_bench.recency_weights(times, 0.1)
    assert float(weights[-1]) == pytest.approx(2 ** (-(1 / 90) / 0.1)) and float(weights[0]) < 1e-3

    features = torch.ones(count + 30, 2, dtype=torch.float64)  # the same for every row: they carry nothing
    level = torch.cat([torch.zeros(60), torch.full((60,), 10.0)]).double()
    split = {"kept": numbers(features[:80], level[:80]), "slice": numbers(features[80:90], level[80:90]),
             "held": numbers(features[90:], level[90:])}
    figures = ceiling_bench.variants(split, time_split=True, auto_mdae=ceiling_bench.ceiling(split)["auto_mdae"])
    plain = ceiling_bench.target_mdae(split["held"], *ceiling_bench.weighted_ridge_fit(
        features[:90], level[:90], 1.0, torch.ones(90, dtype=torch.float64)))
    assert plain == pytest.approx(10 * 2 / 3, abs=1e-6)  # the mean of the training period
    assert figures["recency"]["best_mdae"] < 0.5
    assert figures["horizon_slice"]["share"] == pytest.approx(1 / 3)
    assert figures["cauchy"]["best_mdae"] == pytest.approx(10.0, abs=0.01)  # robust: the majority level, 0
    assert ceiling_bench.variants(split, time_split=False, auto_mdae=1.0)["recency"] is None


def test_the_read_outs_are_fitted_to_the_targets_as_the_recipe_s(ceiling_bench):
    """Each sentence holds a large number that is not the target (thousands, unrelated to the features) before its
    target ``y = 3·x₀ + 1``: fitted to every number the read-out would be ruled by the large ones; fitted to the
    targets, as the recipe's warm start and refits are (`warm_start.scored_numbers`), it reads ``y`` exactly."""
    generator = torch.Generator().manual_seed(3)

    def sentences(count: int) -> dict[str, torch.Tensor]:
        features = torch.randn(2 * count, 3, generator=generator, dtype=torch.float64)
        values = 1000.0 + 500.0 * torch.rand(2 * count, generator=generator, dtype=torch.float64)
        is_target = torch.arange(2 * count) % 2 == 1  # (2·count,) each sentence's second number
        values[is_target] = 3 * features[is_target, 0] + 1
        return {"X": features, "y": values, "is_target": is_target}

    split = {"kept": sentences(60), "slice": sentences(20), "held": sentences(20)}
    figures = ceiling_bench.ceiling(split)
    assert figures["numbers"] == {"kept": 60, "slice": 20, "held": 20}
    assert figures["best_mdae"] < 1e-3 and figures["auto_mdae"] < 0.05
    assert figures["slice_mdae"] < 0.05
    variants = ceiling_bench.variants(split, time_split=True, auto_mdae=figures["auto_mdae"])
    assert variants["cauchy"]["best_mdae"] < 1e-3 and variants["recency"]["best_mdae"] < 1e-3
    assert variants["horizon_slice"]["slice_mdae"] < 0.05


def value_numbers(features: torch.Tensor, earlier: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
    return {**numbers(features, values), "R": earlier}


def test_the_values_read_out_is_kept_where_a_number_carries_the_target_and_not_where_it_misleads(ceiling_bench):
    """Features that carry nothing and one earlier number ``v``. Where ``y = 2·v + 1`` the value read-out is all but exact
    and the rule keeps it; where ``y`` has nothing to do with ``v`` (noise around 3) the rule keeps the
    features, since the values lower no block's error by more than two standard errors."""
    generator = torch.Generator().manual_seed(3)

    def table(target):
        parts = {}
        for name, count in (("kept", 60), ("slice", 0), ("held", 20)):
            features = torch.randn(count, 4, generator=generator, dtype=torch.float64)
            earlier = torch.zeros(count, ceiling_bench.PRIOR_NUMBERS, dtype=torch.float64)
            earlier[:, 0] = torch.randn(count, generator=generator, dtype=torch.float64) * 10
            parts[name] = value_numbers(features, earlier, target(earlier[:, 0], count))
        return parts

    linear = table(lambda v, count: 2 * v + 1)
    figures = ceiling_bench.ceiling(linear)
    read = ceiling_bench.value_read_out(linear, False, figures["auto_ridge"], figures["auto_mdae"])["values"]
    assert read["chosen"] == "values" and read["chosen_mdae"] < 0.01 * figures["auto_mdae"]
    assert read["best_mdae"] == min(read["held_mdae_by_ridge"].values())

    unrelated = table(lambda v, count: 3 + torch.randn(count, generator=generator, dtype=torch.float64))
    figures = ceiling_bench.ceiling(unrelated)
    for time_split in (False, True):
        read = ceiling_bench.value_read_out(unrelated, time_split, figures["auto_ridge"], figures["auto_mdae"])["values"]
        assert read["chosen"] == "features" and read["chosen_mdae"] == figures["auto_mdae"]
        assert len(read["block_errors"]["features"]) == (4 if time_split else 5)
