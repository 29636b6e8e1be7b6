"""benchmarks/number_tables.py and its baselines: hand-computed baseline figures, a --quick smoke run of the whole
benchmark on tiny data, and the real-weight harness run end to end on the tiny preset (figures meaningless)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from causal_qwen.core.numbers import find_numbers
from causal_qwen.core.cauchy import scale_mle
from causal_qwen.evaluation import baselines

from .conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("number_tables.py", "number_tables")


def rows(xs, ys):
    return [{"x": str(x), "y": str(y)} for x, y in zip(xs, ys)]


# ---- baselines by hand -----------------------------------------------------------------------------------
def test_median_baseline_is_a_laplace_by_hand():
    forecast = baselines.fit_median(rows([0] * 4, [1, 2, 3, 10]), rows([0, 0], [2.5, 5.0]), "y")
    assert forecast.point.tolist() == [2.5, 2.5]  # median of 1, 2, 3, 10
    assert forecast.scale.tolist() == [2.5, 2.5]  # mean |y - 2.5| = (1.5 + 0.5 + 0.5 + 7.5) / 4
    figures = baselines.forecast_figures(forecast, torch.tensor([2.5, 5.0]))
    assert figures["mdae"] == pytest.approx(1.25)  # errors 0 and 2.5
    assert figures["log_score"] == pytest.approx(math.log(5.0) + 0.5)  # log(2b) + |z|, z = 0 and 1
    # central 50% Laplace interval: ± b·ln 2 = ± 1.73: the first value inside, the second outside
    assert figures["coverage_50"] == 0.5
    assert math.isnan(figures["scale_error_spearman"])  # one scale for every row: no ranking


def test_least_squares_gaussian_and_cauchy_by_hand():
    train = rows([0, 1, 2, 3], [1.0, 2.0, 5.0, 6.0])  # β = (0.8, 1.8), residuals 0.2, -0.6, 0.6, -0.2
    held_out = rows([4, 5], [8.0, 10.0])
    gaussian = baselines.fit_least_squares(train, held_out, ["x"], "y", "gaussian")
    assert gaussian.point.tolist() == pytest.approx([8.0, 9.8])
    sigma = math.sqrt((0.04 + 0.36 + 0.36 + 0.04) / 4)
    assert gaussian.scale.tolist() == pytest.approx([sigma, sigma])
    figures = baselines.forecast_figures(gaussian, torch.tensor([8.0, 10.0]))
    z = 0.2 / sigma
    assert figures["log_score"] == pytest.approx(0.5 * math.log(2 * math.pi * sigma**2) + 0.25 * z * z)
    assert baselines.half_width("gaussian", 0.5) == pytest.approx(0.6744897501960817)
    assert baselines.half_width("laplace", 0.9) == pytest.approx(math.log(10))
    cauchy = baselines.fit_least_squares(train, held_out, ["x"], "y", "cauchy")
    gamma = float(cauchy.scale[0])
    r2 = torch.tensor([0.04, 0.36, 0.36, 0.04], dtype=torch.float64)
    assert float(((r2 - gamma**2) / (r2 + gamma**2)).mean()) == pytest.approx(0.0, abs=1e-9)  # the ML equation
    with pytest.raises(ValueError, match="family"):
        baselines.fit_least_squares(train, held_out, ["x"], "y", "laplace")


def test_one_scale_baselines_take_their_scale_out_of_fold():
    """A least-squares fit that interpolates its training rows (a one-hot level per row) has in-sample residuals
    0; the one-scale baselines read the out-of-fold residuals (each row predicted by the fit to the other folds), so
    their scale is the error a new row meets, not the 1e-6 floor."""
    generator = torch.Generator().manual_seed(1)
    levels = [f"k{index:02d}" for index in range(40)]  # a level per row
    y = torch.randn(40, generator=generator, dtype=torch.float64) * 3 + 10
    train = [{"kind": level, "y": str(float(value))} for level, value in zip(levels, y)]
    matrix, _ = baselines.design_matrix(train, ["kind"], {})  # (40,40): one coefficient per level
    in_sample = y - matrix @ baselines.least_squares(matrix, y)
    residuals = baselines.out_of_fold_residuals(matrix, y)
    forecast = baselines.fit_least_squares(train, train[:2], ["kind"], "y", "cauchy")
    assert float(forecast.scale[0]) == pytest.approx(float(scale_mle(residuals)))
    assert float(in_sample.abs().max()) < 1e-9 and float(scale_mle(in_sample)) < 1e-5  # the floor
    assert float(forecast.scale[0]) > 1.0  # the rows' own noise (3) shows
    gaussian = baselines.fit_least_squares(train, train[:2], ["kind"], "y", "gaussian")
    assert float(gaussian.scale[0]) == pytest.approx(float(residuals.pow(2).mean().sqrt()))


def test_gradient_boosting_quantiles_follow_the_noise():
    pytest.importorskip("sklearn")
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(1500, generator=generator, dtype=torch.float64) * 10
    y = x + x * torch.randn(1500, generator=generator, dtype=torch.float64)  # spread grows with x
    train, held_out = rows(x[:1000].tolist(), y[:1000].tolist()), rows(x[1000:].tolist(), y[1000:].tolist())
    forecast = baselines.fit_gradient_boosting(train, held_out, ["x"], "y")
    low90, low50, high50, high90 = (*forecast.intervals[0.9][:1], *forecast.intervals[0.5], forecast.intervals[0.9][1])
    assert bool(((low90 <= low50) & (low50 <= forecast.point) & (forecast.point <= high50) & (high50 <= high90)).all())
    assert torch.allclose(forecast.scale, ((high50 - low50) / 2).clamp_min(1e-6))
    figures = baselines.forecast_figures(forecast, y[1000:])
    assert figures["scale_error_spearman"] > 0.2  # wider where the errors are larger
    assert 0.35 <= figures["coverage_50"] <= 0.65 and 0.8 <= figures["coverage_90"] <= 0.97


def test_forecast_figures_reject_mismatched_rows():
    forecast = baselines.fit_median(rows([0] * 3, [1, 2, 3]), rows([0], [2]), "y")
    with pytest.raises(ValueError, match="rows"):
        baselines.forecast_figures(forecast, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="family"):
        baselines.half_width("student", 0.5)


# ---- the benchmark -----------------------------------------------------------------------------------------
def test_tables_and_splits(bench):
    tables = {name: make() for name, make in bench.TABLES.items()}
    assert set(tables) == set(bench.TABLE_NAMES)
    seattle, cars, barley = tables["seattle-weather"], tables["cars"], tables["barley"]
    assert len(seattle.held_out_rows()) == 365 and all(r["date"] >= "2015" for r in seattle.held_out_rows())
    assert len(cars.rows) == 392 and len(cars.held_out_rows()) == 98  # 406 cars, 14 with a missing field
    assert len(barley.rows) == 120 and len(barley.held_out_rows()) == 36
    # The sentence writes the model year as the source's date (text to the number grammar); the baselines read
    # it as the number of the year.
    assert cars.predictors == ["Origin", "Model_year", "Cylinders", "Displacement", "Horsepower", "Weight_in_lbs",
                               "Acceleration"]
    assert all(row["Year"] == row["Model_year"] + "-01-01" for row in cars.rows)
    sentence = cars.template.format(**cars.rows[0])
    assert [n.value for n in find_numbers(sentence)] == [float(cars.rows[0][name]) for name in cars.numeric_fields]
    assert cars.numeric_fields == ["Cylinders", "Displacement", "Horsepower", "Weight_in_lbs", "Acceleration",
                                   "Miles_per_Gallon"]
    assert barley.numeric_fields == ["year", "yield"]
    assert [r["fold"] for r in bench.cars().rows] == [r["fold"] for r in cars.rows]  # a fixed split


def test_settings_and_overrides(bench):
    overrides = bench.parse_overrides(["max_steps=5", "cars:learning_rate=0.01", "model_config.ovr_negatives=64",
                                       "barley:template={variety}: {yield}"])
    cars = bench.training_settings("cars", overrides)
    assert cars["max_steps"] == 5 and cars["learning_rate"] == 0.01
    assert cars["model_config"]["ovr_negatives"] == 64 and cars["model_config"]["ovr_reduction"] == "mean"
    assert bench.training_settings("seattle-weather", overrides)["learning_rate"] == bench.TRAINING["learning_rate"]
    assert bench.training_settings("barley", overrides)["template"] == "{variety}: {yield}"
    with pytest.raises(ValueError, match="unknown table"):
        bench.parse_overrides(["trees:max_steps=3"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        bench.parse_overrides(["max_steps"])


def test_quick_run_prints_every_figure(bench, capsys, tmp_path):
    assert bench.main(["--quick", "--json", "--workdir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    for name in bench.TABLE_NAMES:  # progress on stderr, a line per logging step while CausalQwen trains
        assert f"    {name}: step 2/2, loss " in captured.err, name
    assert "NaN" not in printed and "Infinity" not in printed  # strict JSON: n/a figures are null
    result = json.loads(printed)
    assert set(result["tables"]) == set(bench.TABLE_NAMES)
    for name, table in result["tables"].items():
        for model in bench.MODEL_NAMES:
            figures = table[model]
            for key in ("mdae", "log_score", "coverage_50", "coverage_90", "scale_error_spearman", "train_seconds",
                        "calibration"):
                assert key in figures, (name, model, key)
            assert len(figures["calibration"]) == 10
            if model != "causal_qwen":
                assert math.isfinite(figures["mdae"]) and math.isfinite(figures["log_score"])
        assert table["causal_qwen"]["steps"] == bench.QUICK_TRAINING["max_steps"]
        assert set(table["acceptance"]) == set(bench.ACCEPTANCE)
        assert table["rows"]["held_out"] == 32
    assert set(result["acceptance"]) == set(bench.TABLE_NAMES)


def test_group_median_and_last_value_by_hand():
    train = [{"g": "a", "t": "2020-01", "y": "1"}, {"g": "a", "t": "2020-03", "y": "3"},
             {"g": "a", "t": "2020-02", "y": "7"}, {"g": "b", "t": "2020-01", "y": "10"}]
    held = [{"g": "a", "t": "2020-04", "y": "4"}, {"g": "b", "t": "2020-04", "y": "9"},
            {"g": "c", "t": "2020-04", "y": "0"}]
    grouped = baselines.fit_group_median(train, held, "g", "y")
    assert grouped.point.tolist() == [3.0, 10.0, 5.0]  # medians of a (1, 3, 7), b (10), and overall (1, 3, 7, 10)
    assert grouped.scale.tolist() == [2.0, 1e-12, 3.25]  # mean |y - median| per group (b: one value, none)
    last = baselines.fit_last_value(train, held, "t", "y", group="g")
    assert last.point.tolist() == [3.0, 10.0, 3.0]  # a's latest (2020-03), b's, and the overall latest
    assert last.scale.tolist() == [5.0, 5.0, 5.0]  # a: |7-1|, |3-7| -> 5; b has one value: the mean of the others
    ungrouped = baselines.fit_last_value(train, held, "t", "y")
    assert ungrouped.point.tolist() == [3.0] * 3


def test_unseen_tables_quick_run(bench, capsys, tmp_path):
    """--unseen: the unseen tables with the default recipe, the per-group median and the last value where the
    table has a category and a time split, and the issue's acceptance keys (figures meaningless in a smoke run)."""
    assert bench.main(["--unseen", "stocks,la-riots", "--quick", "--json", "--workdir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["tables"] == {} and set(result["unseen"]) == {"stocks", "la-riots"}
    stocks, riots = result["unseen"]["stocks"], result["unseen"]["la-riots"]
    for model in ("causal_qwen", "median", "least_squares", "gradient_boosting", "cauchy_homoscedastic",
                  "group_median", "last_value"):
        assert math.isfinite(stocks[model]["mdae"]), model
    assert "group_median" in riots and "last_value" not in riots  # a random split has no last value
    assert stocks["causal_qwen"]["recipe"] == "random"
    assert {"interval_check", "interval_floor"} <= set(stocks["causal_qwen"])  # the training's reports
    assert set(stocks["acceptance"]) == set(bench.UNSEEN_ACCEPTANCE)
    assert set(result["unseen_acceptance"]) == set(bench.UNSEEN_ACCEPTANCE)
    assert "stocks: recipe: random" in captured.err
    tests = stocks["coverage_tests"]["causal_qwen"]
    assert set(tests) == {"coverage_50", "coverage_90"} and all(0 <= p <= 1 for p in tests.values())
    chance = result["unseen_calibrated_chance"]
    assert set(chance) == set(bench.COVERAGE_BANDS)
    for figures in chance.values():
        assert set(figures["per_table"]) == {"stocks", "la-riots"}
        assert figures["every_table"] == pytest.approx(math.prod(figures["per_table"].values()))
    assert "a calibrated forecaster passes" in captured.err
    assert (tmp_path / "run-stocks" / "final").is_dir()  # --workdir keeps the runs
    with pytest.raises(SystemExit):
        bench.main(["--unseen", "no-such-table"])


def test_calibrated_chance_reads_each_table_s_held_out_count(bench):
    """The chance that calibrated intervals pass a coverage band grows with the held-out count, and an observed
    coverage far from its level gets a small binomial p-value."""
    def table(count, coverage_50, coverage_90):
        return {"causal_qwen": {"count": count, "coverage_50": coverage_50, "coverage_90": coverage_90}}

    tables = {"small": table(15, 0.07, 0.8), "large": table(843, 0.5, 0.9)}
    chance = bench.calibrated_chance(tables)["0.35 <= coverage_50 <= 0.65"]
    assert chance["per_table"]["small"] == pytest.approx(0.698, abs=1e-3)  # 6 to 9 of 15 covered
    assert chance["per_table"]["large"] == pytest.approx(1.0)
    assert chance["every_table"] == pytest.approx(chance["per_table"]["small"])
    small = bench.coverage_tests(tables["small"])["causal_qwen"]
    assert small["coverage_50"] < 0.001  # 1 of 15 inside a calibrated 50% interval: 16 / 2^15 two-sided
    assert bench.coverage_tests(tables["large"])["causal_qwen"]["coverage_50"] > 0.9


def test_real_set_is_checked_before_any_work(bench, capsys, tmp_path):
    """--real-set needs --real-base, and a wrong key fails at once (exit 2), not after the tables' minutes."""
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--real-set", "learning_rate=1e-4"])
    assert stopped.value.code == 2 and "give --real-base too" in capsys.readouterr().err
    base = tmp_path / "base.gguf"
    base.write_bytes(b"")
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--real-base", str(base), "--real-set", "learning_rat=1e-4", "--workdir", str(tmp_path / "w")])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "--real-set" in error and "learning_rat" in error, error
    assert not (tmp_path / "w").exists()  # nothing started


@pytest.mark.slow
def test_real_weight_harness_on_the_tiny_preset(bench, tmp_path):
    """The --real-base path end to end (1 step each, 5 days, 2 samples) on random:tiny: the figures exist and
    the digit-writer's answers are parsed or counted as unparsable."""
    said: list[str] = []
    figures = bench.real_weight_figures("random:tiny", tmp_path, quick=True, progress=said.append,
                                        settings={"causal_overrides": ("learning_rate=2e-5",)})
    for model in ("causal_qwen", "qwen_digits"):  # one line per logging step while a model fine-tunes
        assert any(line.strip().startswith(f"{model}: step 1/1, loss ") for line in said), (model, said)
    assert any(line.strip().startswith("causal_qwen: <NUM> warm start: ") for line in said), said  # the example's
    for model in ("causal_qwen", "qwen_digits"):
        for key in ("mdae", "coverage_50", "coverage_90", "log_score", "scale_error_spearman", "train_seconds",
                    *bench.BITS_FIGURES):
            assert key in figures[model], (model, key)
        assert figures[model]["count"] == 5
        assert 0 < figures[model]["bits_per_byte"] < 64
        assert len(figures[model]["bits_per_number_by_order"]) == 3  # rain, low, high
    causal = figures["causal_qwen"]  # its number bits: the <NUM> token's and the value's
    assert causal["num_token_bits"] > 0 and causal["number_value_bits"] > 0
    assert 0 <= causal["number_value_bits_best_scale"] <= causal["number_value_bits"]
    assert math.isfinite(figures["causal_qwen"]["mdae"])
    assert 0 <= figures["qwen_digits"]["unparsable_samples"] <= 10
    assert set(figures["acceptance"]) == set(bench.REAL_ACCEPTANCE)
    assert figures["settings"]["qwen_digits"]["steps"] == 1
    assert figures["causal_qwen"]["steps"] == 1 and figures["causal_qwen"]["convert_seconds"] > 0
    assert figures["settings"]["causal_qwen"]["learning_rate"] == 2e-5  # the override, over the example's 1e-5


@pytest.mark.slow
def test_real_set_reaches_the_unseen_tables_real_weight_runs(bench, tmp_path):
    """With --unseen, --real-set changes the recipe of each unseen table's real-weight run (here one LoRA step on
    random:tiny standing in for the real base), and nothing of the embedded default's run."""
    from causal_qwen.training.train_config import load_train_config

    converted = bench.convert_tiny(tmp_path)
    items = ["lora=true", "freeze_backbone=false", "max_steps=1", "model_config.number_noise_init=2.0",
             "refit_after_check=true"]
    settings = bench.checked_settings(items, load_train_config(bench.REAL_WEIGHTS["example"], items))
    assert settings == {"lora": True, "freeze_backbone": False, "max_steps": 1,
                        "model_config": {"number_noise_init": 2.0}, "refit_after_check": True}
    assert bench.parse_overrides(["lora_learning_rate=1e-4"]) == {"": {"lora_learning_rate": "1e-4"}}  # YAML: text
    assert bench.checked_settings(["lora_learning_rate=1e-4"], load_train_config(
        bench.REAL_WEIGHTS["example"], ["lora_learning_rate=1e-4"])) == {"lora_learning_rate": 1e-4}  # the float
    result = bench.run_unseen(["la-riots"], converted, tmp_path, progress=lambda line: None, quick=True,
                              real_base="random:tiny", real_settings=settings, keep_runs=False)
    riots = result["tables"]["la-riots"]
    assert riots["causal_qwen_real"]["steps"] == 1 and riots["causal_qwen_real"]["recipe"] == "random"
    assert riots["causal_qwen"]["steps"] == bench.QUICK_TRAINING["max_steps"]
    assert math.isfinite(riots["causal_qwen_real"]["mdae"])
    before, refit = riots["causal_qwen_real"]["regression_refit_before"], riots["causal_qwen_real"]["regression_refit"]
    assert before["numbers"] + riots["causal_qwen_real"]["interval_check"]["numbers"] == refit["numbers"]
    assert riots["causal_qwen"]["regression_refit_before"] is None  # the random recipe does not refit
    # la-riots' age is its sentence's first number: no earlier numbers to offer, and the warm start says so
    assert riots["causal_qwen"]["warm_start"]["earlier_numbers"] == 0
    assert riots["causal_qwen"]["warm_start"]["earlier_block_errors"] is None
    # without --workdir each run folder goes once its table is measured (a real base's is 2.4 GB)
    assert not (tmp_path / "run-la-riots").exists() and not (tmp_path / "real" / "run-la-riots").exists()


def test_every_unseen_table_builds_with_its_target_last(bench):
    """Each unseen table (issue 31's six and the second set) has training and held-out rows, a time split whose
    held-out rows all come after its training rows, and a sentence whose last number is the target."""
    unseen_tables = bench._unseen_tables()
    assert set(unseen_tables.ALL_TABLES) == set(unseen_tables.UNSEEN_TABLES) | set(unseen_tables.SECOND_SET)
    assert len(unseen_tables.SECOND_SET) == 5 and not set(unseen_tables.SECOND_SET) & set(unseen_tables.UNSEEN_TABLES)
    for name, build in unseen_tables.ALL_TABLES.items():
        table = build()
        train, held = table.train_rows(), table.held_out_rows()
        assert train and held, name
        if table.time is not None:
            assert max(row[table.time] for row in train) < min(row[table.time] for row in held), name
        row = train[0]
        sentence = table.template.format(**row)
        assert find_numbers(sentence)[-1].value == float(row[table.target]), name


def test_unseen_selection_names_the_sets(bench, capsys):
    """`--unseen` selects issue 31's six, `--unseen second` the second set, or tables by name; an unknown name
    fails before any work."""
    assert bench.unseen_selection("all") == ["stocks", "seattle-temps", "iowa-electricity", "us-employment",
                                             "airports", "la-riots"]
    assert bench.unseen_selection("second") == ["iris", "sf-temps", "wheat", "driving", "ohlc"]
    assert bench.unseen_selection("wheat, stocks") == ["wheat", "stocks"]
    with pytest.raises(SystemExit):
        bench.main(["--unseen", "iris,no-such-table"])
    assert "no-such-table" in capsys.readouterr().err


def test_set_reaches_the_unseen_tables_tiny_default(bench, capsys, tmp_path):
    """With --unseen, --set changes the tiny default's recipe on every unseen table (or TABLE's only), its values
    read as `causal-qwen train --set` reads them; a wrong key fails at once (exit 2)."""
    assert bench.unseen_overrides(["max_steps=3", "la-riots:location_check=true", "learning_rate=1e-4"]) == {
        "": {"max_steps": 3, "learning_rate": 1e-4}, "la-riots": {"location_check": True}}
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--unseen", "la-riots", "--set", "max_stepz=3", "--workdir", str(tmp_path / "w")])
    assert stopped.value.code == 2 and "max_stepz" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # nothing started
    assert bench.main(["--unseen", "la-riots", "--quick", "--json", "--set", "la-riots:max_steps=3",
                       "--set", "location_check=true"]) == 0
    result = json.loads(capsys.readouterr().out)
    riots = result["unseen"]["la-riots"]["causal_qwen"]
    assert riots["steps"] == 3 and result["unseen_settings"]["la-riots"] == {"max_steps": 3}
    assert riots["location_check"] is not None  # the opt-in check ran on the slice
