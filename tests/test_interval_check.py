"""The interval check (`causal_qwen.training.interval_check`) and the default recipe of a four-key config."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from causal_qwen import from_qwen
from causal_qwen.training.collator import NumericCollator, TokenizedDataset
from causal_qwen.core.cauchy import scale_mle
from causal_qwen.training.interval_check import (central_coverage, check_intervals, floor_intervals, slice_predictions,
                                                    standardized_errors)

from .conftest import SMALL_NUM_ID, small_qwen

pytestmark = pytest.mark.usefixtures("one_thread")


def numbers_dataset(values: list[float]) -> TokenizedDataset:
    """One short document per value: ``w <NUM>=v w``."""
    return TokenizedDataset([{"input_ids": [5, SMALL_NUM_ID, 7], "numeric_values": [0.0, v, 0.0]} for v in values])


def cauchy_values(count: int, scale: float, generator: torch.Generator) -> list[float]:
    return (scale * torch.tan(math.pi * (torch.rand(count, generator=generator, dtype=torch.float64) - 0.5))).tolist()


def test_too_narrow_intervals_are_widened_to_half_coverage_and_good_ones_kept():
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1e-3)
    generator = torch.Generator().manual_seed(0)
    values = cauchy_values(400, 1e4, generator)  # far wider than scale_Y
    data, collator = numbers_dataset(values), NumericCollator(pad_token_id=0)
    narrow = standardized_errors(model, data, collator, batch_size=32, target_ordinals=None)
    assert narrow.numel() == 400 and central_coverage(narrow, 0.5) < 0.3

    report = check_intervals(model, data, collator, batch_size=32)
    assert report is not None and report.rescaled and report.numbers == 400 and report.likelihood_ratio > 100
    assert report.factor == pytest.approx(scale_mle(narrow))  # the Cauchy scale that fits the slice best
    assert model.config.number_scale_factor == pytest.approx(report.factor)
    assert abs(report.coverage_50_after - 0.5) <= 0.06 and abs(report.coverage_90_after - 0.9) <= 0.05
    again = standardized_errors(model, data, collator, batch_size=32, target_ordinals=None)  # the model itself
    assert central_coverage(again, 0.5) == pytest.approx(report.coverage_50_after)

    kept = check_intervals(model, data, collator, batch_size=32)  # now calibrated on this slice: left alone
    assert kept is not None and not kept.rescaled and kept.factor == pytest.approx(1.0, abs=0.01)
    assert model.config.number_scale_factor == pytest.approx(report.factor)
    assert check_intervals(model, numbers_dataset(values[:5]), collator, batch_size=8) is None  # too few numbers
    wide = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1e3)
    narrowed = check_intervals(wide, numbers_dataset(cauchy_values(100, 1.0, generator)), collator, 32)
    assert narrowed is not None and narrowed.rescaled and narrowed.factor < 0.1  # too wide: narrowed
    assert narrowed.coverage_50_before > 0.9 and abs(narrowed.coverage_50_after - 0.5) <= 0.11


def test_a_few_numbers_that_miss_by_far_are_enough_to_widen():
    """Nine numbers, two inside the 50% interval and the rest ten to forty scales out: the coverage alone (2 of 9)
    is within two binomial deviations of a half, but how far they fall is not, so the likelihood-ratio test widens;
    nine numbers that agree with the intervals are left alone."""
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1.0)
    collator = NumericCollator(pad_token_id=0)
    _, loc, scale = (float(t[0]) for t in slice_predictions(model, numbers_dataset([0.0]), collator, 1, None))
    offsets = [0.3, -0.5, 10.0, -12.0, 15.0, -20.0, 25.0, 30.0, -40.0]
    far = [loc + offset * scale for offset in offsets]
    report = check_intervals(model, numbers_dataset(far), collator, batch_size=16)
    assert report is not None and report.coverage_50_before == pytest.approx(2 / 9)
    assert report.rescaled and report.factor > 5 and report.coverage_90_after > report.coverage_90_before
    model.config.number_scale_factor = 1.0  # back to the intervals the offsets were drawn for
    agreeing = [loc + offset * scale for offset in (0.2, -0.4, 0.7, -1.1, 1.5, -0.9, 2.5, -0.3, 0.6)]
    kept = check_intervals(model, numbers_dataset(agreeing), collator, batch_size=16)
    assert kept is not None and not kept.rescaled and kept.likelihood_ratio < 3.84


def test_target_ordinals_pick_one_number_per_document():
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1.0)
    two = TokenizedDataset([{"input_ids": [5, SMALL_NUM_ID, 6, SMALL_NUM_ID], "numeric_values": [0.0, 1.0, 0.0, 2.0]}
                            for _ in range(3)])
    collator = NumericCollator(pad_token_id=0)
    every = standardized_errors(model, two, collator, batch_size=2, target_ordinals=None)
    second = standardized_errors(model, two, collator, batch_size=2, target_ordinals=[1, 1, 1])
    assert every.numel() == 6 and second.numel() == 3
    torch.testing.assert_close(second, every[1::2])


def readings_config(tmp_path, name: str, rows: list[str], split_at: str):
    """A four-key config (data, template, target, split) over a CSV ``day,reading`` of ``rows``: its path."""
    (tmp_path / f"{name}.csv").write_text("\n".join(["day,reading", *rows]) + "\n", encoding="utf-8")
    config_file = tmp_path / f"{name}.yaml"
    config_file.write_text(
        f"data: {tmp_path / f'{name}.csv'}\ntemplate: 'On {{day}} the reading was {{reading}}.'\n"
        f"target: reading\nsplit_by: day\nsplit_at: '{split_at}'\n", encoding="utf-8")
    return config_file


def test_a_four_key_config_trains_the_tiny_preset_with_the_random_recipe(tmp_path):
    """data, template, target and split only (plus where to write and, to keep the test short, three steps): the
    random recipe fills the rest, says so, keeps the latest training rows for the location and interval checks (in
    that order) and saves a model whose number_scale_factor is what the interval check decided."""
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training

    rows = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d},{20 + 5 * math.sin(i / 9):.1f}" for i in range(120)]
    config_file = readings_config(tmp_path, "four", rows, "2020-04-01")
    config = load_train_config(config_file, [f"output_dir={tmp_path / 'run'}", "max_steps=3", "report_to=none",
                                             "progress_bar=false", "eval_steps=0", "save_steps=0"])
    assert config.recipe == "random" and config.batch_size == 64 and config.interval_check == 0.1
    lines: list[str] = []
    result = run_training(config, report=lines.append)
    assert any(line.startswith("recipe: random (base random:tiny); from the recipe:") for line in lines), lines
    kept = [line for line in lines if line.startswith("interval check: ")]
    assert kept and "of the 84 training documents kept out" in kept[0], lines
    checked = [line for line in lines if line.startswith("interval check on ")]
    # the recipe checks locations on a seeded slice only: the latest rows of a split in time are no sample of later
    assert config.location_check == "seeded" and "to check the number intervals" in kept[0], lines
    assert not any(line.startswith("location check on ") for line in lines), lines
    assert result.location_check is None
    assert checked and result.interval_check is not None and result.interval_check.numbers >= 8, lines
    saved = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    assert saved.config.number_scale_factor == pytest.approx(result.interval_check.scale_factor)
    assert result.global_step == 3


def test_the_random_recipe_checks_locations_on_a_seeded_slice(tmp_path):
    """A random split (``validation_split``): the slice kept out of training is a seeded pick, a sample of the rows
    held out, so the random recipe runs the location check on it before the interval check."""
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training

    rows = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d},{20 + 5 * math.sin(i / 9):.1f}" for i in range(120)]
    config_file = readings_config(tmp_path, "seeded", rows, "2020-04-01")
    config_file.write_text(config_file.read_text(encoding="utf-8").replace("split_by: day\nsplit_at: '2020-04-01'\n",
                                                                           "validation_split: 0.25\n"))
    config = load_train_config(config_file, [f"output_dir={tmp_path / 'run'}", "max_steps=3", "report_to=none",
                                             "progress_bar=false", "eval_steps=0", "save_steps=0"])
    lines: list[str] = []
    result = run_training(config, report=lines.append)
    kept = [line for line in lines if line.startswith("interval check: ")]
    assert kept and "to check the number locations and intervals" in kept[0], lines
    located = [index for index, line in enumerate(lines) if line.startswith("location check on ")]
    checked = [index for index, line in enumerate(lines) if line.startswith("interval check on ")]
    assert located and checked and located[0] < checked[0], lines
    assert result.location_check is not None and result.location_check.numbers >= 8


def test_a_target_that_never_varies_or_lies_past_max_length_stops_train_with_the_reason(tmp_path, caplog):
    """A constant target has no spread to learn (a Cauchy of scale 0 made the first step's loss nan, with advice to
    lower the learning rates); a target past ``max_length`` in every row left nothing to forecast (the warm start
    fitted the other numbers, then the same nan). Both stop before any model is built, naming the cause; a target
    cut from some rows only is a warning."""
    from causal_qwen.training.collator import tokenize_documents
    from causal_qwen.training.data import Document
    from causal_qwen.core.tokenizer import NumericTokenizer
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training

    rows = [f"2020-01-{1 + i:02d},42" for i in range(28)]
    config_file = readings_config(tmp_path, "constant", rows, "2020-01-20")
    config = load_train_config(config_file, [f"output_dir={tmp_path / 'run'}", "max_steps=1", "report_to=none"])
    with pytest.raises(ValueError, match=r"target 'reading' is 42 in every one of the 19 training rows: there is "
                                         r"nothing to forecast"):
        run_training(config)
    assert not (tmp_path / "run" / "final").exists()

    tokenizer = NumericTokenizer.default()
    long = Document(text="word " * 40 + "then 7.5 points.", source="t.csv", row=1, target_ordinal=0, target_value=7.5)
    short = Document(text="then 7.5 points.", source="t.csv", row=2, target_ordinal=0, target_value=7.5)
    with pytest.raises(ValueError, match=r"t\.csv: the target number lies past max_length=16 tokens in 1 of 1 "
                                         r"documents \(the longest has 4[0-9] tokens\): raise max_length"):
        tokenize_documents([long], tokenizer, max_length=16)
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.collator"):
        assert len(tokenize_documents([long, short], tokenizer, max_length=16)) == 2
    assert "in 1 of 2 documents" in caplog.text and "before the cut only" in caplog.text


def test_one_number_after_the_same_words_in_every_row_trains(tmp_path):
    """``The reading was {reading}.``: the features before the number are the same in every row, so the ridge start
    fits a constant (W_reg = 0), which without the numbers' own noise gave scale_Y = 0 and a nan loss at step 1.
    W_reg now keeps its converted values, the location starts at the fitted constant, and the run trains."""
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training

    rows = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d},{20 + 5 * math.sin(i / 9):.1f}" for i in range(84)]
    config_file = readings_config(tmp_path, "one", rows, "2020-03-01")
    config = load_train_config(config_file, [f"output_dir={tmp_path / 'run'}", "max_steps=2", "report_to=none",
                                             "progress_bar=false", "eval_steps=0", "save_steps=0",
                                             "template='The reading was {reading}.'", "logging_steps=1"])
    lines: list[str] = []
    result = run_training(config, report=lines.append)
    assert result.global_step == 2 and math.isfinite(result.train_loss)
    assert any(line.startswith("regression warm start:") for line in lines), lines


def test_the_floor_widens_to_the_out_of_fold_error_and_never_narrows():
    """No slice: the median scale at the training numbers is raised to the warm start's out-of-fold error ``r̃``
    (f = r̃ / s̃) when it lies below, and left alone when it lies above or too few numbers are read."""
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1e-2)
    data, collator = numbers_dataset([float(v) for v in range(12)]), NumericCollator(pad_token_id=0)
    _, _, scale = slice_predictions(model, data, collator, 8, None)
    median_scale = float(scale.median())
    report = floor_intervals(model, data, collator, 8, out_of_fold_mdae=50 * median_scale)
    assert report is not None and report.rescaled and report.numbers == 12
    assert report.median_scale == pytest.approx(median_scale) and report.factor == pytest.approx(50.0)
    assert model.config.number_scale_factor == pytest.approx(50.0)
    _, _, widened = slice_predictions(model, data, collator, 8, None)
    assert float(widened.median()) == pytest.approx(50 * median_scale, rel=1e-5)  # the model itself now
    kept = floor_intervals(model, data, collator, 8, out_of_fold_mdae=median_scale)  # narrower than it is: kept
    assert kept is not None and not kept.rescaled and kept.factor < 1
    assert model.config.number_scale_factor == pytest.approx(50.0) and "kept" in kept.line()
    assert floor_intervals(model, numbers_dataset([1.0, 2.0]), collator, 8, out_of_fold_mdae=1e6) is None
    assert floor_intervals(model, data, collator, 8, out_of_fold_mdae=float("nan")) is None
    assert model.config.number_scale_factor == pytest.approx(50.0)


def test_a_table_too_small_for_a_slice_floors_its_intervals_also_when_resumed(tmp_path):
    """Twenty rows of a drifting series: no check slice can be kept (8 numbers would be 40% of them), so after
    training the widths are floored at the warm start's out-of-fold error, written to ``warm_start.json`` so that a
    resumed run floors at the same figure; the saved model carries the factor."""
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.readout_steps import WARM_START_FILE
    from causal_qwen.training.training import run_training

    rows = [f"2021-01-{1 + i:02d},{100 + 7 * i + 9 * math.sin(i):.1f}" for i in range(26)]
    config_file = readings_config(tmp_path, "small", rows, "2021-01-21")
    settings = [f"output_dir={tmp_path / 'run'}", "max_steps=40", "report_to=none", "progress_bar=false",
                "eval_steps=0", "save_steps=20"]
    lines: list[str] = []
    result = run_training(load_train_config(config_file, settings), report=lines.append)
    assert result.interval_check is None, lines
    assert [line for line in lines if line.startswith("interval check")] == [
        "interval check: no slice kept out: 20 training documents are too few for 8 numbers in a quarter of them; "
        "every row trains, and neither the locations nor the intervals are checked on rows kept out (the interval "
        "floor stands in when the warm start scores 10 numbers or more)"], lines
    floor = result.interval_floor
    assert floor is not None and floor.numbers == 20, lines
    warm = json.loads((tmp_path / "run" / WARM_START_FILE).read_text(encoding="utf-8"))
    assert floor.out_of_fold_mdae == pytest.approx(warm["out_of_fold_mdae"]) and warm["scored"] == 20
    assert floor.rescaled and floor.factor > 1, floor  # 40 steps on 20 rows: in-sample widths below r̃
    assert any(line.startswith("interval floor") and "widened" in line for line in lines), lines
    saved = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    assert saved.config.number_scale_factor == pytest.approx(floor.scale_factor)

    (tmp_path / "run" / "final").rename(tmp_path / "first-final")  # as if killed after the last checkpoint
    resumed = run_training(load_train_config(config_file, settings), resume=True, report=lines.append)
    assert resumed.interval_floor is not None
    assert resumed.interval_floor.out_of_fold_mdae == pytest.approx(floor.out_of_fold_mdae)
    assert resumed.interval_floor.scale_factor == pytest.approx(floor.scale_factor, rel=1e-4)



def test_a_table_too_small_for_the_floor_says_its_widths_are_unchecked(tmp_path):
    """Seven training rows: no slice, and the warm start's errors are in-sample (fewer than 2·FOLDS numbers), so no
    floor stands in either; training says so instead of leaving the slice's promise of a floor unkept."""
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training

    rows = [f"2021-01-{1 + i:02d},{100 + 7 * i + 9 * math.sin(i):.1f}" for i in range(10)]
    config_file = readings_config(tmp_path, "tiny_table", rows, "2021-01-08")
    settings = [f"output_dir={tmp_path / 'run'}", "max_steps=2", "report_to=none", "progress_bar=false",
                "eval_steps=0", "save_steps=0"]
    lines: list[str] = []
    result = run_training(load_train_config(config_file, settings), report=lines.append)
    assert result.interval_check is None and result.interval_floor is None, lines
    assert [line for line in lines if line.startswith("interval floor")] == [
        "interval floor: none: the warm start scored 7 numbers, fewer than 10 (its errors are in-sample), so nothing "
        "checks the widths; they are as training left them"], lines

def test_the_forward_floor_applies_after_a_split_by_a_column_with_the_backbone_frozen():
    """`interval_floor` chooses the warm start's forward error after a split by a column when the backbone is frozen
    (the pretrained recipe's read-out is the forecast), the out-of-fold error when no slice was kept, the larger of
    the two when both apply, and none for a backbone that trains with a slice, a random split, or a report written
    before the forward error was measured."""
    from causal_qwen.training.data import Document
    from causal_qwen.training.interval_check import FLOOR_FORWARD, FLOOR_NO_SLICE
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.readout_steps import interval_floor
    from causal_qwen.training.warm_start import WarmStartReport

    documents = [Document(text="day: <NUM>", source="t.csv", row=i, split_value=f"2020-01-{i + 1:02d}")
                 for i in range(20)]
    warm = WarmStartReport(numbers=20, scored=20, ridge=1.0, train_mdae=1.0, out_of_fold_mdae=2.0, seconds=0.1,
                           forward_mdae=3.0)

    def config(**settings):
        return TrainConfig(model="random:tiny", data="t.csv", interval_check=0.1, **settings)

    by_day = {"split_by": "day", "split_at": "2020-03-01"}
    slice_kept = documents[-2:]
    assert interval_floor(config(freeze_backbone=True, **by_day), documents, slice_kept, warm) == (3.0, FLOOR_FORWARD)
    assert interval_floor(config(freeze_backbone=False, **by_day), documents, slice_kept, warm) is None
    assert interval_floor(config(freeze_backbone=False, **by_day), documents, [], warm) == (2.0, FLOOR_NO_SLICE)
    narrower = WarmStartReport(**{**warm.to_dict(), "forward_mdae": 1.5})
    assert interval_floor(config(freeze_backbone=True, **by_day), documents, [], narrower) == (2.0, FLOOR_NO_SLICE)
    random_split = config(freeze_backbone=True, validation_split=0.1)
    assert interval_floor(random_split, documents, slice_kept, warm) is None
    older = WarmStartReport(**{**warm.to_dict(), "forward_mdae": None})  # a warm_start.json of an earlier version
    assert interval_floor(config(freeze_backbone=True, **by_day), documents, slice_kept, older) is None
    too_few = WarmStartReport(**{**warm.to_dict(), "scored": 9})
    assert interval_floor(config(freeze_backbone=True, **by_day), documents, [], too_few) is None


def test_a_frozen_backbone_after_a_time_split_floors_at_the_forward_error(tmp_path):
    """Through `run_training`: a drifting series split by its date, the backbone frozen (features cached) as in the
    pretrained recipe. The slice is kept and checked, then the widths are floored at the warm start's forward error,
    the line says so, and the saved model carries the factor."""
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.readout_steps import WARM_START_FILE
    from causal_qwen.training.training import run_training

    rows = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d},{100 + 0.8 * i + 6 * math.sin(i / 3):.1f}" for i in range(120)]
    config_file = readings_config(tmp_path, "drift", rows, "2020-04-01")
    settings = [f"output_dir={tmp_path / 'run'}", "max_steps=3", "report_to=none", "progress_bar=false",
                "eval_steps=0", "save_steps=0", "freeze_backbone=true"]
    lines: list[str] = []
    result = run_training(load_train_config(config_file, settings), report=lines.append)
    assert result.interval_check is not None, lines  # the slice was kept and checked first
    floor = result.interval_floor
    warm = json.loads((tmp_path / "run" / WARM_START_FILE).read_text(encoding="utf-8"))
    assert floor is not None and floor.floor == "forward", lines
    assert floor.out_of_fold_mdae == pytest.approx(warm["forward_mdae"])
    assert warm["forward_mdae"] > warm["out_of_fold_mdae"]  # the drift: a forecaster misses by more
    floor_lines = [line for line in lines if line.startswith("interval floor (a split by a column")]
    assert floor_lines and "forward error" in floor_lines[0], lines
    saved = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    assert saved.config.number_scale_factor == pytest.approx(floor.scale_factor)
    assert floor.scale_factor == pytest.approx(result.interval_check.scale_factor * max(floor.factor, 1.0), rel=1e-5)


def test_a_warm_start_report_that_is_not_one_is_refused_by_name(tmp_path):
    from causal_qwen.training.readout_steps import WARM_START_FILE, load_warm_start, save_warm_start
    from causal_qwen.training.warm_start import WarmStartReport

    assert load_warm_start(tmp_path) is None  # a run folder of an earlier version: no floor, no error
    report = WarmStartReport(numbers=30, scored=10, ridge=1.0, train_mdae=1.5, out_of_fold_mdae=2.5, seconds=0.1)
    save_warm_start(tmp_path, report)
    assert load_warm_start(tmp_path) == report
    (tmp_path / WARM_START_FILE).write_text('{"numbers": 3}', encoding="utf-8")
    with pytest.raises(ValueError, match="warm_start.json is not a warm start report"):
        load_warm_start(tmp_path)
    save_warm_start(tmp_path, None)  # a run without a warm start leaves no report of an earlier one
    assert not (tmp_path / WARM_START_FILE).exists()


@pytest.mark.parametrize("frozen", [False, True], ids=["backbone-trains", "features-cached"])
def test_the_regression_read_out_is_refitted_to_every_training_row_after_the_checks(tmp_path, monkeypatch, frozen):
    """``refit_after_check: true``: before the checks the read-out is refitted to the rows trained on, so that the
    interval check measures the head that is then saved up to the slice's rows (the check sees exactly that
    ridge fit); after it the saved regression head is the ridge fit, at the same ridge, of the trained model's
    features on all 84 training rows (the slice included), while the interval factor the check set on the slice
    stays; off (the random recipe's default), no refit. With the backbone frozen the training rows' features come
    from the cache and only the slice is read anew."""
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.core.tokenizer import NumericTokenizer
    from causal_qwen.training import readout_steps
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training
    from causal_qwen.training.warm_start import choose_ridge, read_positions, ridge_fit

    days = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d}" for i in range(120)]
    readings = [f"{20 + 5 * math.sin(i / 9) + 0.1 * i:.1f}" for i in range(120)]
    (tmp_path / "readings.csv").write_text(
        "day,reading\n" + "".join(f"{d},{r}\n" for d, r in zip(days, readings)), encoding="utf-8")
    config_file = tmp_path / "four.yaml"
    config_file.write_text(
        f"data: {tmp_path / 'readings.csv'}\ntemplate: 'On {{day}} the reading was {{reading}}.'\n"
        "target: reading\nsplit_by: day\nsplit_at: '2020-04-01'\n", encoding="utf-8")
    common = ["max_steps=3", "report_to=none", "progress_bar=false", "eval_steps=0", "save_steps=0"]
    if frozen:
        common += ["freeze_backbone=true", "numeric_embedding_learning_rate=0", "regression_warm_start=auto"]
    off = run_training(load_train_config(config_file, [f"output_dir={tmp_path / 'off'}", *common]))
    assert off.regression_refit is None
    lines: list[str] = []
    checked_heads: list[tuple[torch.Tensor, torch.Tensor]] = []  # the read-out each interval check measured

    def check_recording(model, *args, **kwargs):
        head = model.action.regression_head
        checked_heads.append((head.weight.detach().double().reshape(-1).clone(), head.bias.detach().double().clone()))
        return check_intervals(model, *args, **kwargs)

    monkeypatch.setattr(readout_steps, "check_intervals", check_recording)
    config = load_train_config(config_file, [f"output_dir={tmp_path / 'on'}", "refit_after_check=true", *common])
    result = run_training(config, report=lines.append)
    refit, before = result.regression_refit, result.regression_refit_before
    assert refit is not None and refit.numbers == 84
    assert before is not None and before.numbers == 84 - result.interval_check.numbers
    assert refit.ridge == before.ridge and refit.out_of_fold_by_ridge == before.out_of_fold_by_ridge
    assert refit.ridge == config.regression_warm_start or (frozen and refit.out_of_fold_by_ridge)
    steps = ("regression refit to the rows trained on, before the checks: ", "interval check on ",
             "regression refit to every training row: 84 numbers")
    assert [step for line in lines for step in steps if line.startswith(step)] == list(steps), lines
    assert any(line.startswith("feature cache: the frozen backbone read ") for line in lines) == frozen, lines
    saved = CausalQwenForCausalLM.from_pretrained(result.final_dir).eval()
    assert saved.config.number_scale_factor == pytest.approx(result.interval_check.scale_factor)
    tokenizer = NumericTokenizer.from_pretrained(result.final_dir)
    encoded = tokenizer([f"On {d} the reading was {r}." for d, r in zip(days[:84], readings[:84])])
    dataset = TokenizedDataset([{"input_ids": ids, "numeric_values": values}
                                for ids, values in zip(encoded["input_ids"], encoded["numeric_values"])])
    batches = torch.utils.data.DataLoader(dataset, batch_size=32, collate_fn=NumericCollator(tokenizer.pad_token_id))
    with torch.no_grad():
        positions = read_positions(saved, batches)
    assert len(positions.number_values) == 84
    trained_on = 84 - result.interval_check.numbers  # the slice is the latest rows
    if frozen:  # auto: the ridge is chosen on the rows trained on (the 84 minus the latest slice), as the start's
        chosen, _ = choose_ridge(positions.number_features[:trained_on], positions.number_values[:trained_on])
        assert refit.ridge == chosen
    (checked_weight, checked_bias), = checked_heads  # one check, on the refit to the rows trained on
    weight, bias = ridge_fit(positions.number_features[:trained_on], positions.number_values[:trained_on],
                             refit.ridge)
    torch.testing.assert_close(checked_weight, weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(checked_bias.reshape(()), bias, rtol=1e-5, atol=1e-4)
    weight, bias = ridge_fit(positions.number_features, positions.number_values, refit.ridge)
    head = saved.action.regression_head
    torch.testing.assert_close(head.weight.double().reshape(-1), weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(head.bias.double().reshape(()), bias, rtol=1e-5, atol=1e-4)
    unrefitted = CausalQwenForCausalLM.from_pretrained(off.final_dir).action.regression_head
    assert not torch.allclose(unrefitted.bias, head.bias)


def test_a_document_that_opens_with_a_number_counts_it():
    """``1992: <NUM> ... <NUM>``: no position predicts the opening number, but it is the document's number 0, so
    target ordinal 2 is the third number (as `Document.target_ordinal` counts), in the slice and the warm start."""
    from causal_qwen.core.losses import next_number_ordinals
    from causal_qwen.training.warm_start import _target_marks

    N = SMALL_NUM_ID
    labels = torch.tensor([[N, 5, N, 6, N], [5, N, 6, N, -100]])
    predicts, ordinal = next_number_ordinals(labels, N)
    assert predicts.tolist() == [[False, True, False, True], [True, False, True, False]]
    assert ordinal[predicts].tolist() == [1, 2, 0, 1]
    assert _target_marks(labels, N, [2, 1], 0).nonzero().tolist() == [[0, 3], [1, 2]]

    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1.0)
    opening = TokenizedDataset([{"input_ids": [N, 5, N, 6, N], "numeric_values": [1992.0 + d, 0.0, 10.0 + d, 0.0, 2.0 + d]}
                                for d in range(3)])
    values, _, _ = slice_predictions(model, opening, NumericCollator(pad_token_id=0), 2, [2, 2, 2])
    assert values.tolist() == [2.0, 3.0, 4.0]  # the third number of each document, not none


def test_a_later_slice_only_widens():
    """``widen_only`` (a slice of the latest rows): intervals the slice finds too wide are kept, as a later period
    may need them, and it says so; intervals it finds too narrow are still widened."""
    generator = torch.Generator().manual_seed(4)
    collator = NumericCollator(pad_token_id=0)
    wide = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1e3)
    kept = check_intervals(wide, numbers_dataset(cauchy_values(100, 1.0, generator)), collator, 32, widen_only=True)
    assert kept is not None and kept.factor < 0.1 and kept.likelihood_ratio > 3.84 and not kept.rescaled
    assert wide.config.number_scale_factor == 1.0 and "a later period is not narrowed for" in kept.line()
    narrow = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none", number_noise_init=1e-3)
    widened = check_intervals(narrow, numbers_dataset(cauchy_values(100, 1e4, generator)), collator, 32, widen_only=True)
    assert widened is not None and widened.rescaled and widened.factor > 10


def test_the_slice_is_later_for_a_split_in_time_only():
    from causal_qwen.training.data import Document
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.readout_steps import keep_check_slice, slice_is_later

    def documents(values):
        return [Document(text=f"day {i}: <NUM>", source="t.csv", row=i, split_value=v) for i, v in enumerate(values)]

    by_day = TrainConfig(model="random:tiny", data="t.csv", split_by="day", split_at="2020-03-01", interval_check=0.3)
    dated = documents([f"2020-01-{d:02d}" for d in range(1, 31)])
    kept, check = keep_check_slice(by_day, dated)
    assert check and slice_is_later(by_day, kept, check)
    one_fold = documents(["0"] * 30)  # a fold column: every training row shares its value, a seeded pick
    kept, check = keep_check_slice(by_day, one_fold)
    assert check and not slice_is_later(by_day, kept, check)
    random_split = TrainConfig(model="random:tiny", data="t.csv", validation_split=0.1, interval_check=0.3)
    assert not slice_is_later(random_split, *keep_check_slice(random_split, dated))


def test_the_slice_is_a_seeded_pick_when_the_latest_value_holds_too_many_rows():
    """A yearly table split by its year column: the latest tenth of the values is the last year, which held 12 of
    a 21-row table's documents (57%) out of training; now a later slice larger than a quarter gives way to a seeded
    pick of the rows (as a column of one value does), and the run says why. Many years keep a slice of whole years
    (eight numbers at least: three years here)."""
    from causal_qwen.training.data import Document
    from causal_qwen.training.readout_steps import keep_check_slice, slice_is_later
    from causal_qwen.training.train_config import TrainConfig

    def documents(years):
        return [Document(text=f"{y}: <NUM>", source="t.csv", row=i, split_value=str(y)) for i, y in enumerate(years)]

    by_year = TrainConfig(model="random:tiny", data="t.csv", split_by="year", split_at="1856", interval_check=0.1)
    two_years = documents([1854] * 30 + [1855] * 30)
    lines: list[str] = []
    kept, check = keep_check_slice(by_year, two_years, lines.append)
    assert len(check) == 8 and len(kept) == 52 and {doc.split_value for doc in check} == {"1854", "1855"}
    assert not slice_is_later(by_year, kept, check)
    assert lines == ["interval check: 8 of the 60 training documents kept out of training (a random 13% of the rows; "
                     "the latest values of 'year' hold 30 of the 60 training documents (rows share a value), more "
                     "than the 15 a check may take) to check the number intervals"]
    many_years = documents([year for year in range(1900, 1920) for _ in range(3)])
    kept, check = keep_check_slice(by_year, many_years)
    assert len(check) == 9 and {doc.split_value for doc in check} == {"1917", "1918", "1919"} and len(kept) == 51
