"""Evaluation metrics: hand-computed fixtures, brute-force agreement, Qwen perplexity parity, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from causal_qwen import CausalQwenForCausalLM, from_qwen
from causal_qwen.evaluation import evaluation
from causal_qwen.evaluation import metrics as forecast_metrics
from causal_qwen.evaluation.evaluation import NumberPredictions, evaluate_batches, number_metrics

from .conftest import SMALL_NUM_ID, small_qwen


def hand_predictions() -> NumberPredictions:
    """Four numbers: errors 2, 3, 0, 0.8 with scales 1, 1, 2, 1; the last true value is 0."""
    return NumberPredictions(
        value=torch.tensor([10.0, 20.0, 30.0, 0.0], dtype=torch.float64),
        loc=torch.tensor([12.0, 17.0, 30.0, 0.8], dtype=torch.float64),
        scale=torch.tensor([1.0, 1.0, 2.0, 1.0], dtype=torch.float64),
        document=torch.tensor([0, 0, 1, 1]),
        position=torch.tensor([3, 7, 3, 7]),
        ordinal=torch.tensor([0, 1, 0, 1]),
        from_end=torch.tensor([1, 0, 1, 0]),
    )


def test_number_metrics_against_hand_computed_values():
    metrics = number_metrics(hand_predictions())
    assert metrics["num_count"] == 4
    assert metrics["num_mdae"] == pytest.approx(1.4)  # median of 0, 0.8, 2, 3
    assert metrics["num_mape"] == pytest.approx(100 * (0.2 + 0.15 + 0.0) / 3)  # y = 0 left out
    assert metrics["num_mape_count"] == 3
    expected_nll = [math.log(math.pi) + math.log(5), math.log(math.pi) + math.log(10), math.log(2 * math.pi),
                    math.log(math.pi) + math.log(1.64)]
    assert metrics["num_nll"] == pytest.approx(sum(expected_nll) / 4)
    # central 50% interval = loc ± scale: errors 2 > 1, 3 > 1, 0 <= 2, 0.8 <= 1
    assert metrics["coverage_50"] == pytest.approx(0.5)
    # central 90% interval = loc ± 6.31·scale: all inside
    assert metrics["coverage_90"] == pytest.approx(1.0)
    # 2 of 4 inside a 50% interval is the likeliest count: p = 1; 4 of 4 inside a 90% one: P(K ≤ 4) = 1 as well
    assert metrics["coverage_50_p_value"] == pytest.approx(1.0)
    assert metrics["coverage_90_p_value"] == pytest.approx(1.0)
    table = {row["nominal"]: row["empirical"] for row in metrics["calibration"]}
    assert list(table) == list(forecast_metrics.CALIBRATION_LEVELS) and len(table) == 10
    # |z| = 2, 3, 0, 0.8 → central ranks (2/π)·atan|z| = 0.705, 0.795, 0, 0.436
    assert table[0.1] == pytest.approx(0.25) and table[0.5] == pytest.approx(0.5)
    assert table[0.7] == pytest.approx(0.5) and table[0.8] == pytest.approx(1.0)
    # z = 2, 3, 0, 0.8: q50 = 1.4, q90 = 2.7 (linear interpolation) → 2.7 / 1.4
    assert metrics["num_tail_ratio"] == pytest.approx(2.7 / 1.4)


def test_standardized_coverage_equals_interval_coverage():
    predictions = hand_predictions()
    for level in forecast_metrics.CALIBRATION_LEVELS:
        assert forecast_metrics.standardized_coverage(predictions.standardized_error(), level) == predictions.coverage(level)


def test_forecast_figures_and_number_metrics_share_the_formulas():
    from causal_qwen.evaluation import baselines

    predictions = hand_predictions()
    forecast = baselines.Forecast("cauchy", predictions.loc, predictions.scale, {}, 0.0, "the hand predictions")
    figures = baselines.forecast_figures(forecast, predictions.value)
    numbers = number_metrics(predictions)
    for figure, number in (("mdae", "num_mdae"), ("log_score", "num_log_score"), ("coverage_50", "coverage_50"),
                           ("coverage_90", "coverage_90"), ("scale_error_spearman", "num_scale_error_spearman")):
        assert figures[figure] == pytest.approx(numbers[number])
    assert [row["empirical"] for row in figures["calibration"]] == [row["empirical"] for row in numbers["calibration"]]


def test_tail_ratio_of_cauchy_and_gaussian_errors():
    generator = torch.Generator().manual_seed(0)
    gaussian = torch.randn(200_000, generator=generator, dtype=torch.float64).abs()
    cauchy_errors = torch.distributions.Cauchy(0.0, 1.0).sample((200_000,)).double().abs()
    assert forecast_metrics.tail_ratio(gaussian) == pytest.approx(1.6449 / 0.6745, rel=0.02)
    assert forecast_metrics.tail_ratio(cauchy_errors) == pytest.approx(forecast_metrics.CAUCHY_TAIL_RATIO, rel=0.03)
    assert forecast_metrics.CAUCHY_TAIL_RATIO == pytest.approx(6.3138, rel=1e-4)


def test_rescaling_range_by_hand():
    # z = 0.5, 1, 2, 4 (50%: z <= c; 90%: z <= 6.3138·c)
    z = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    # coverage_50 exactly 0.5 needs 1 <= c < 2; coverage_90 <= 0.75 needs 6.3138·c < 4, i.e. c < 0.634
    assert forecast_metrics.rescaling_range(z, {0.5: (0.5, 0.5), 0.9: (0.0, 0.75)}) is None
    low, high = forecast_metrics.rescaling_range(z, {0.5: (0.5, 0.5)})
    assert low == pytest.approx(1.0) and high == pytest.approx(1.0)  # step points inside: c = 1 (coverage 0.5 on [1, 2))
    low, high = forecast_metrics.rescaling_range(z, {0.5: (0.25, 0.5), 0.9: (0.75, 1.0)})
    # 50% in [0.25, 0.5] needs 0.5 <= c < 2; 90% >= 0.75 needs c >= 2/6.3138: together [0.5, 2), whose
    # step points are 0.5, 4/6.3138 and 1
    assert low == pytest.approx(0.5) and high == pytest.approx(1.0)
    # every step point found satisfies the bands when checked directly
    for c in (low, high):
        scaled = NumberPredictions(value=z, loc=torch.zeros(4, dtype=torch.float64), scale=torch.full((4,), c, dtype=torch.float64),
                                   document=torch.zeros(4, dtype=torch.long), position=torch.zeros(4, dtype=torch.long),
                                   ordinal=torch.zeros(4, dtype=torch.long), from_end=torch.zeros(4, dtype=torch.long))
        assert 0.25 <= scaled.coverage(0.5) <= 0.5 and 0.75 <= scaled.coverage(0.9) <= 1.0
    with pytest.raises(ValueError, match="band"):
        forecast_metrics.rescaling_range(z, {0.5: (0.6, 0.4)})
    with pytest.raises(ValueError, match="at least one"):
        forecast_metrics.rescaling_range(z[:0], {0.5: (0.4, 0.6)})


def test_rescaling_reaches_both_bands_for_cauchy_errors_only():
    generator = torch.Generator().manual_seed(1)
    bands = {0.5: (0.40, 0.60), 0.9: (0.80, 0.97)}
    cauchy_errors = torch.distributions.Cauchy(0.0, 3.0).sample((5_000,)).double().abs()
    gaussian_errors = 3.0 * torch.randn(5_000, generator=generator, dtype=torch.float64).abs()
    low, high = forecast_metrics.rescaling_range(cauchy_errors, bands)
    assert low <= 3.0 <= high  # the true scale is inside the range
    assert forecast_metrics.rescaling_range(gaussian_errors, bands) is None


def test_coverage_chance_by_hand_and_by_simulation():
    # n = 4, p = 1/2: K/4 in [0.25, 0.75] for K = 1, 2, 3, i.e. (4 + 6 + 4) / 16.
    assert forecast_metrics.coverage_chance(4, 0.5, 0.25, 0.75) == pytest.approx(14 / 16)
    assert forecast_metrics.coverage_chance(20, 0.5, 0.35, 0.65) > forecast_metrics.coverage_chance(19, 0.5, 0.35, 0.65)
    generator = torch.Generator().manual_seed(0)
    covered = (torch.rand(200_000, 15, generator=generator) < 0.5).sum(dim=1) / 15  # calibrated 50% intervals
    simulated = float(((covered >= 0.35) & (covered <= 0.65)).double().mean())
    assert forecast_metrics.coverage_chance(15, 0.5, 0.35, 0.65) == pytest.approx(simulated, abs=0.005)
    assert forecast_metrics.coverage_chance(5000, 0.9, 0.75) == pytest.approx(1.0)  # no overflow for large counts
    with pytest.raises(ValueError, match="at least one number"):
        forecast_metrics.coverage_chance(0, 0.5, 0.35, 0.65)


def test_coverage_p_value_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for covered, count, level in [(1, 15, 0.5), (7, 15, 0.5), (20, 22, 0.5), (3, 22, 0.9), (9, 11, 0.9), (0, 843, 0.5)]:
        expected = scipy_stats.binomtest(covered, count, level).pvalue
        assert forecast_metrics.coverage_p_value(covered, count, level) == pytest.approx(expected, rel=1e-6, abs=1e-300)
    with pytest.raises(ValueError, match="covered must lie"):
        forecast_metrics.coverage_p_value(16, 15, 0.5)


def test_select_by_number_index():
    predictions = hand_predictions()
    assert predictions.select(-1).value.tolist() == [20.0, 0.0]
    assert predictions.select(0).value.tolist() == [10.0, 30.0]
    assert len(predictions.select(None)) == 4
    with pytest.raises(TypeError, match="number_index"):
        predictions.select("last")


def test_central_rank_matches_coverage():
    predictions = hand_predictions()
    ranks = predictions.central_rank()
    for level in (0.3, 0.5, 0.9):
        assert predictions.coverage(level) == pytest.approx(float((ranks <= level).double().mean()))


def small_causal(seed: int = 0) -> CausalQwenForCausalLM:
    model = from_qwen(small_qwen(seed=seed), num_token_id=SMALL_NUM_ID)
    with torch.no_grad():  # move away from the exact initialisation so OvR and softmax decisions differ
        generator = torch.Generator().manual_seed(1)
        model.abduction.scale_net.weight.copy_(torch.randn(model.abduction.scale_net.weight.shape, generator=generator))
        model.action.classification_head.bias.copy_(torch.randn(model.config.vocab_size, generator=generator) * 3)
    return model.eval()


def number_batch() -> dict[str, torch.Tensor]:
    """Two right-padded rows with <NUM> tokens (values 3.5, -2, 40)."""
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, SMALL_NUM_ID, (2, 9), generator=generator)
    numeric_values = torch.zeros(2, 9)
    for row, col, value in ((0, 2, 3.5), (0, 6, -2.0), (1, 4, 40.0)):
        input_ids[row, col] = SMALL_NUM_ID
        numeric_values[row, col] = value
    attention_mask = torch.ones(2, 9, dtype=torch.long)
    attention_mask[1, 7:] = 0
    return {"input_ids": input_ids, "numeric_values": numeric_values, "attention_mask": attention_mask}


@torch.no_grad()
def test_language_and_number_metrics_match_brute_force():
    model = small_causal()
    batch = number_batch()
    result = evaluate_batches(model, [batch], chunk_positions=3)  # chunks smaller than N: chunking is exercised
    metrics = result.metrics()

    out = model(**batch)  # the full (B,S,V) scores, for a position-by-position reference
    probs = model.ovr_probabilities(out.loc_S, out.scale_S)
    nll, soft, ovr, target_p, sums, numbers = [], [], [], [], [], []
    for row in range(2):
        length = int(batch["attention_mask"][row].sum())
        for i in range(length - 1):
            target = int(batch["input_ids"][row, i + 1])
            nll.append(-float(torch.log_softmax(out.loc_S[row, i], -1)[target]))
            soft.append(int(out.loc_S[row, i].argmax()) == target)
            ovr.append(int(probs[row, i].argmax()) == target)
            target_p.append(float(probs[row, i, target]))
            sums.append(float(probs[row, i].sum()))
            if target == SMALL_NUM_ID:
                numbers.append((float(batch["numeric_values"][row, i + 1]), float(out.loc_Y[row, i])))
    assert metrics["token_count"] == len(nll) == 8 + 6
    assert metrics["perplexity"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
    assert metrics["token_accuracy_softmax"] == pytest.approx(sum(soft) / len(soft))
    assert metrics["token_accuracy_ovr"] == pytest.approx(sum(ovr) / len(ovr))
    assert metrics["ovr_target_prob"] == pytest.approx(sum(target_p) / len(target_p), rel=1e-5)
    assert metrics["ovr_prob_sum"] == pytest.approx(sum(sums) / len(sums), rel=1e-5)
    assert metrics["num_count"] == 3
    errors = sorted(abs(v - loc) for v, loc in numbers)
    assert metrics["num_mdae"] == pytest.approx(errors[1], rel=1e-5)
    assert result.numbers.value.tolist() == [3.5, -2.0, 40.0]
    assert result.numbers.from_end.tolist() == [1, 0, 0]
    assert result.metrics(number_index=-1)["num_count"] == 2


@torch.no_grad()
def test_perplexity_equals_qwen_loss_at_initialisation():
    """Converted, untrained: eval's perplexity is exp of Qwen's own loss on the same (number-free) tokens."""
    qwen = small_qwen(seed=5)
    model = from_qwen(small_qwen(seed=5), num_token_id=SMALL_NUM_ID)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, SMALL_NUM_ID, (3, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 8:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    qwen_loss = qwen(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    result = evaluate_batches(model, [{"input_ids": input_ids, "attention_mask": attention_mask}])
    assert result.metrics()["perplexity"] == pytest.approx(math.exp(float(qwen_loss)), rel=1e-5)
    assert "num_count" not in result.metrics()  # "auto": no numbers, no number metrics


def test_number_metrics_without_numbers_raise():
    model = small_causal()
    ids = torch.arange(10).unsqueeze(0)
    result = evaluate_batches(model, [{"input_ids": ids}])
    with pytest.raises(ValueError, match="no numbers"):
        result.metrics(metric_set="numbers")
    with pytest.raises(ValueError, match="metric set"):
        result.metrics(metric_set="everything")


# ---- through the data files and the CLI (real tokenizer, random:tiny) -----------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from causal_qwen.cli import main

    out = tmp_path_factory.mktemp("models") / "tiny"
    assert main(["convert", "--base", "random:tiny", "--out", str(out)]) == 0
    return out


@torch.no_grad()
def test_cli_eval_perplexity_matches_qwen_on_text(tiny_dir, tmp_path):
    from causal_qwen.cli import main
    from causal_qwen.conversion.presets import build_preset

    lines = ["The quick brown fox jumps over the lazy dog.", "A simple text without any digits at all, again."]
    text_file = tmp_path / "plain.txt"
    text_file.write_text("\n".join(lines) + "\n")
    report = tmp_path / "eval.json"
    assert main(["eval", "--model", str(tiny_dir), "--data", str(text_file), "--json", str(report),
                 "--batch-size", "1"]) == 0
    metrics = json.loads(report.read_text())

    from causal_qwen.core.tokenizer import NumericTokenizer

    tokenizer = NumericTokenizer.default()
    qwen = build_preset("random:tiny")
    nll_sum, count = 0.0, 0
    for line in lines:
        ids = tokenizer([line], return_tensors="pt")["input_ids"]
        ids = torch.cat([ids, torch.tensor([[tokenizer.eos_token_id]])], dim=1)  # eval appends end-of-text
        loss = qwen(input_ids=ids, labels=ids).loss
        nll_sum += float(loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    assert metrics["token_count"] == count
    assert metrics["perplexity"] == pytest.approx(math.exp(nll_sum / count), rel=1e-4)
    assert "num_count" not in metrics


def test_cli_eval_errors(tiny_dir, tmp_path, capsys):
    from causal_qwen.cli import main

    text_file = tmp_path / "plain.txt"
    text_file.write_text("No digits in here.\n")
    assert main(["eval", "--model", str(tiny_dir), "--data", str(text_file), "--metrics", "numbers"]) == 2
    assert "no numbers" in capsys.readouterr().err

    table = tmp_path / "table.csv"
    table.write_text("day,high\n1,10.5\n2,11.0\n")
    assert main(["eval", "--model", str(tiny_dir), "--data", str(table), "--template", "Day {day}: {hgh} C"]) == 2
    assert "'hgh' is not a column" in capsys.readouterr().err

    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["eval", "--model", str(tiny_dir), "--data", str(table), "--template", "Day {day}: {high} C",
                 "--json", str(blocked / "eval.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_cli_eval_json_never_overwrites_its_inputs(tiny_dir, tmp_path, capsys):
    """--json naming the data file or a file of the model folder stops before anything is written; a metrics
    file an earlier eval wrote into the folder is written again."""
    import shutil

    from causal_qwen.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    table = tmp_path / "table.json"
    table.write_text('[{"day": 1, "high": 10.5}, {"day": 2, "high": 11.0}]')
    command = ["eval", "--model", str(model), "--data", str(table), "--template", "Day {day}: high {high} C.",
               "--metrics", "numbers", "--json"]
    for kept in (table, model / "config.json"):
        before = kept.read_bytes()
        assert main([*command, str(kept)]) == 2
        assert "--json" in capsys.readouterr().err
        assert kept.read_bytes() == before
    report = model / "eval.json"
    assert main([*command, str(report)]) == 0
    assert main([*command, str(report)]) == 0
    assert json.loads(report.read_text())["documents"] == 2


def test_cli_eval_notes_rows_the_run_trained_on(tiny_dir, tmp_path, capsys):
    """A --split-at before the run's own cut scores rows the run trained on, and eval says how many; a cut after
    it scores held-out rows only, with no note."""
    from causal_qwen.cli import main

    table = tmp_path / "table.csv"
    table.write_text("day,high\n" + "".join(f"{day},{10 + day / 2}\n" for day in range(1, 21)))
    config = tmp_path / "train.yaml"
    config.write_text(f"data: {table}\ntemplate: 'Day {{day}}: high {{high}} C.'\ntarget: high\n"
                      "split_by: day\nsplit_at: 15\n")
    command = ["eval", "--model", str(tiny_dir), "--config", str(config), "--metrics", "numbers", "--split-at"]
    assert main([*command, "10"]) == 0
    assert "note: 5 of the 11 rows scored are rows the run trained on" in capsys.readouterr().out
    assert main([*command, "16"]) == 0
    assert "rows the run trained on" not in capsys.readouterr().out


def test_cli_eval_numbers_on_a_table(tiny_dir, tmp_path, capsys):
    from causal_qwen.cli import main

    table = tmp_path / "table.csv"
    table.write_text("day,high\n1,10.5\n2,11.0\n3,12.5\n")
    report = tmp_path / "eval.json"
    assert main(["eval", "--model", str(tiny_dir), "--data", str(table), "--template", "Day {day}: high {high} C.",
                 "--metrics", "all", "--number-index", "-1", "--json", str(report)]) == 0
    metrics = json.loads(report.read_text())
    assert metrics["num_count"] == 3
    for key in ("perplexity", "token_accuracy_ovr", "token_accuracy_softmax", "num_mdae", "num_mape", "num_nll",
                "num_log_score", "coverage_50", "coverage_90", "coverage_50_p_value", "coverage_90_p_value",
                "num_tail_ratio", "bits_per_byte", "number_bits_per_byte"):
        assert isinstance(metrics[key], float)
    # strict JSON: the Spearman of three equal scales is undefined and written as null, never NaN
    assert metrics["num_scale_error_spearman"] is None or isinstance(metrics["num_scale_error_spearman"], float)
    assert len(metrics["calibration"]) == 10
    texts = ["Day 1: high 10.5 C.", "Day 2: high 11.0 C.", "Day 3: high 12.5 C."]
    assert metrics["text_bytes"] == sum(len(t.encode()) for t in texts)
    assert metrics["bits_numbers"] == 6 and metrics["bits_per_byte"] > 0
    day, high = metrics["bits_per_number_by_order"]  # each sentence's two numbers, in order
    assert (day + high) * 3 == pytest.approx(metrics["number_bits"], rel=1e-9)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("bits per number, 1st")]
    assert len(printed) == 1 and printed[0].endswith(f"  {day:.4g} / {high:.4g}"), printed


# ---- log score, scale-error correlation, PIT ---------------------------------------------------------------
def test_log_score_and_scale_error_spearman_by_hand():
    metrics = number_metrics(hand_predictions())
    assert metrics["num_log_score"] == metrics["num_nll"]
    # scales 1, 1, 2, 1 (ranks 2, 2, 4, 2) against |errors| 2, 3, 0, 0.8 (ranks 3, 4, 1, 2)
    ranks_scale = torch.tensor([2.0, 2.0, 4.0, 2.0]) - 2.5
    ranks_error = torch.tensor([3.0, 4.0, 1.0, 2.0]) - 2.5
    expected = float((ranks_scale * ranks_error).sum() / (ranks_scale.norm() * ranks_error.norm()))
    assert metrics["num_scale_error_spearman"] == pytest.approx(expected)
    assert expected < 0  # the one wide interval holds the one exact prediction


def test_spearman_matches_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(0, 6, (50,), generator=generator).double()  # many ties
    b = a + torch.randn(50, generator=generator, dtype=torch.float64)
    assert forecast_metrics.spearman(a, b) == pytest.approx(scipy_stats.spearmanr(a.numpy(), b.numpy()).statistic)
    assert forecast_metrics.spearman(a, -b) == pytest.approx(-forecast_metrics.spearman(a, b))
    assert math.isnan(forecast_metrics.spearman(torch.ones(5), torch.arange(5.0)))  # constant scale: no ranking
    with pytest.raises(ValueError, match="equal lengths"):
        forecast_metrics.spearman(torch.ones(3), torch.ones(4))


def test_pit_is_the_cauchy_cdf_and_folds_to_the_central_rank():
    predictions = hand_predictions()
    pit = predictions.pit()
    cdf = torch.distributions.Cauchy(predictions.loc, predictions.scale).cdf(predictions.value)
    assert torch.allclose(pit, cdf.double(), atol=1e-12)
    assert torch.allclose((2 * pit - 1).abs(), predictions.central_rank(), atol=1e-12)


# ---- bits per byte ------------------------------------------------------------------------------------------
def test_number_half_unit():
    cases = {"12.8": 0.05, "-3": 0.5, "1,200": 0.5, "0.000": 0.0005, "2.5e3": 50.0, "7E-2": 0.005, ".5": 0.05}
    for spelled, expected in cases.items():
        assert evaluation.number_half_unit(spelled) == pytest.approx(expected)
    with pytest.raises(ValueError, match="not a number"):
        evaluation.number_half_unit("abc")


def test_cauchy_interval_log_mass_against_the_cdf_and_in_the_far_tail():
    loc, scale = torch.tensor(1.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    cauchy = torch.distributions.Cauchy(loc, scale)
    for low, high in ((-1.0, 0.5), (0.0, 3.0), (-30.0, 40.0), (5.0, 5.1)):
        low_t, high_t = torch.tensor(low, dtype=torch.float64), torch.tensor(high, dtype=torch.float64)
        expected = math.log(float(cauchy.cdf(high_t) - cauchy.cdf(low_t)))
        assert float(evaluation.cauchy_interval_log_mass(low_t, high_t, loc, scale)) == pytest.approx(expected, rel=1e-9)
    # far in a tail the CDF difference cancels to nothing; density × width is then exact to first order
    value = torch.tensor(1e7, dtype=torch.float64)
    naive = float(cauchy.cdf(value + 0.05) - cauchy.cdf(value - 0.05))
    log_mass = float(evaluation.cauchy_interval_log_mass(value - 0.05, value + 0.05, loc, scale))
    assert log_mass == pytest.approx(float(cauchy.log_prob(value)) + math.log(0.1), abs=1e-6)
    assert abs(math.log(max(naive, 1e-300)) - log_mass) > 1e-3  # the naive difference has lost it


def test_cauchy_interval_log_mass_of_a_narrow_interval_far_from_the_median():
    """The number 1e-37 (half a unit 5e-38) with the median at 10: ``high − loc`` and ``low − loc`` both round to
    −10, but the mass is the density times the width, not 0 (eval's bits per byte were inf on such a text)."""
    loc, scale = torch.tensor(10.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    value, half = torch.tensor(1e-37, dtype=torch.float64), torch.tensor(5e-38, dtype=torch.float64)
    log_mass = float(evaluation.cauchy_interval_log_mass(value - half, value + half, loc, scale))
    density = float(torch.distributions.Cauchy(loc, scale).log_prob(value))
    assert log_mass == pytest.approx(density + math.log(1e-37), rel=1e-12)
    # pi to 20 decimals: both ends round to the value, so the width is given (as text_bits gives 2·half)
    pi, half = torch.tensor(math.pi, dtype=torch.float64), torch.tensor(5e-21, dtype=torch.float64)
    log_mass = float(evaluation.cauchy_interval_log_mass(pi - half, pi + half, loc, scale, 2 * half))
    density = float(torch.distributions.Cauchy(loc, scale).log_prob(pi))
    assert log_mass == pytest.approx(density + math.log(1e-20), rel=1e-12)


@pytest.fixture(scope="module")
def tiny_model_and_tokenizer(tiny_dir):
    from causal_qwen.conversion.loading import load_model_and_tokenizer

    return load_model_and_tokenizer(model_dir=str(tiny_dir))


@torch.no_grad()
def test_text_bits_equal_qwen_bits_on_text_without_numbers(tiny_model_and_tokenizer):
    """Two independent routes: the converted model's softmax over loc_S is Qwen's softmax, so without numbers
    CausalQwen's bits (its own tokenizer) equal Qwen's (the plain Qwen tokenizer)."""
    from causal_qwen.conversion.presets import build_preset
    from causal_qwen.core.tokenizer import build_qwen25_base_tokenizer

    model, tokenizer = tiny_model_and_tokenizer
    texts = ["The quick brown fox jumps over the lazy dog.", "Ünïcode bytes count as bytes: naïve café."]
    causal = evaluation.text_bits(model, tokenizer, texts, batch_size=1)
    qwen = evaluation.qwen_text_bits(build_preset("random:tiny"), build_qwen25_base_tokenizer(), texts)
    assert causal.bytes == qwen.bytes == sum(len(t.encode("utf-8")) for t in texts)
    assert causal.tokens == qwen.tokens
    assert causal.bits == pytest.approx(qwen.bits, rel=1e-5)
    assert causal.metrics()["bits_per_byte"] == pytest.approx(causal.bits / causal.bytes)
    assert causal.numbers == 0 and causal.number_bits == 0
    # padding in a batch changes nothing
    assert evaluation.text_bits(model, tokenizer, texts, batch_size=2).bits == pytest.approx(causal.bits, rel=1e-5)


@torch.no_grad()
def test_text_bits_refuse_a_text_longer_than_the_model_s_positions(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    limit = model.config.max_position_embeddings
    model.config.max_position_embeddings = 8
    try:
        assert evaluation.text_bits(model, tokenizer, ["Short."]).tokens > 0  # within the positions: read
        with pytest.raises(ValueError, match=r"text 1 is \d+ tokens long, more than the model's 8 positions"):
            evaluation.text_bits(model, tokenizer, ["Short.", "A text of many more words than eight tokens hold."],
                                 batch_size=2)
    finally:
        model.config.max_position_embeddings = limit


@torch.no_grad()
def test_eval_leaves_a_text_longer_than_the_positions_out_of_bits_per_byte_only(tiny_model_and_tokenizer, caplog):
    from causal_qwen.training.data import Document

    model, tokenizer = tiny_model_and_tokenizer
    limit = model.config.max_position_embeddings
    model.config.max_position_embeddings = 8
    long_text = "A text of many more words than eight tokens hold."
    docs = [Document(text=text, source="x", row=i + 1) for i, text in enumerate(["Short.", long_text])]
    try:
        with caplog.at_level("WARNING"):
            result = evaluation.evaluate_documents(model, tokenizer, docs, max_length=8, bits=True)
        assert result.bits.texts == 1 and result.bits.bytes == len("Short.")  # the short text alone
        assert result.metrics()["documents"] == 2  # perplexity and accuracy read both, the long one cut
        assert "bits per byte leave out 1 of 2 texts longer than the model's 8 positions" in caplog.text
        alone = evaluation.evaluate_documents(model, tokenizer, docs[1:], max_length=8, bits=True)
        assert alone.bits is None and "bits_per_byte" not in alone.metrics()
    finally:
        model.config.max_position_embeddings = limit


@torch.no_grad()
def test_qwen_text_bits_refuse_a_text_longer_than_the_model_s_positions():
    from causal_qwen.conversion.presets import build_preset
    from causal_qwen.core.tokenizer import build_qwen25_base_tokenizer

    qwen = build_preset("random:tiny")
    qwen.config.max_position_embeddings = 8
    tokenizer = build_qwen25_base_tokenizer()
    assert evaluation.qwen_text_bits(qwen, tokenizer, ["Short."]).tokens > 0
    with pytest.raises(ValueError, match=r"text 1 is \d+ tokens long, more than the model's 8 positions"):
        evaluation.qwen_text_bits(qwen, tokenizer, ["Short.", "A text of many more words than eight tokens hold."])


@torch.no_grad()
def test_text_bits_of_a_number_are_p_num_times_the_interval_mass(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    coarse = evaluation.text_bits(model, tokenizer, ["The high was 12.8 C."])
    fine = evaluation.text_bits(model, tokenizer, ["The high was 12.80 C."])
    assert coarse.numbers == fine.numbers == 1
    assert fine.bytes == coarse.bytes + 1
    # same tokens, same value; only the interval shrinks from ±0.05 to ±0.005. The text is scored as it is
    # trained: the number from the text's own pass, no context token before it.
    encoded = tokenizer(["The high was 12.8 C."])
    ids, values = encoded["input_ids"], encoded["numeric_values"]  # (1,S)
    out = model(input_ids=ids, numeric_values=values)
    position = int((ids[0] == model.config.num_token_id).nonzero()[0]) - 1  # predicts the <NUM>
    p_num = float(torch.softmax(out.loc_S[0, position].double(), -1)[model.config.num_token_id])
    loc, scale = out.loc_Y[0, position].double(), out.scale_Y[0, position].double()
    y = torch.distributions.Cauchy(loc, scale)
    v = torch.tensor(float(values[0, position + 1]), dtype=torch.float64)
    for totals, half in ((coarse, 0.05), (fine, 0.005)):
        mass = float(y.cdf(v + half) - y.cdf(v - half))
        assert totals.number_bits == pytest.approx(-math.log2(p_num * mass), rel=1e-6)
        assert totals.num_token_bits == pytest.approx(-math.log2(p_num), rel=1e-6)
        figures = totals.metrics()
        assert figures["number_value_bits"] == pytest.approx(-math.log2(mass), rel=1e-6)
        assert figures["bits_per_number"] == pytest.approx(totals.number_bits)
        # the best scale for this location, found by search, and never more bits than the model's own scale
        gammas = torch.logspace(-4, 4, 20001, dtype=torch.float64)
        best = y.__class__(loc, gammas)
        best_mass = float((best.cdf(v + half) - best.cdf(v - half)).max())
        assert figures["number_value_bits_best_scale"] == pytest.approx(-math.log2(best_mass), rel=1e-4)
        assert figures["number_value_bits_best_scale"] <= figures["number_value_bits"] + 1e-9
        assert totals.numbers_by_order == [1] and figures["bits_per_number_by_order"] == [totals.number_bits]
    assert fine.bits - coarse.bits == pytest.approx(fine.number_bits - coarse.number_bits, rel=1e-6)
    with pytest.raises(ValueError, match="token_probability"):
        evaluation.text_bits(model, tokenizer, ["x"], token_probability="logits")
    with pytest.raises(ValueError, match="non-empty"):
        evaluation.text_bits(model, tokenizer, [])
    ovr = evaluation.text_bits(model, tokenizer, ["The high was 12.8 C."], token_probability="ovr")
    assert math.isfinite(ovr.bits) and ovr.bits != coarse.bits


@torch.no_grad()
def test_text_bits_score_the_first_token_after_a_lone_end_of_text(tiny_model_and_tokenizer):
    """No position of a text predicts its first token: the model's prediction after a lone <|endoftext|> does,
    a number included; every later token comes from the text's own pass."""
    model, tokenizer = tiny_model_and_tokenizer
    text = "12.8 C was the high."
    totals = evaluation.text_bits(model, tokenizer, [text])
    encoded = tokenizer([text])
    ids, values = encoded["input_ids"], encoded["numeric_values"]  # (1,S)
    assert int(ids[0, 0]) == model.config.num_token_id
    alone = model(input_ids=torch.tensor([[tokenizer.eos_token_id]]), numeric_values=torch.zeros(1, 1))
    own = model(input_ids=ids, numeric_values=values)
    log_p_first = torch.log_softmax(alone.loc_S[0, 0].double(), -1)[model.config.num_token_id]
    first = torch.distributions.Cauchy(alone.loc_Y[0, 0].double(), alone.scale_Y[0, 0].double())
    v = float(values[0, 0])
    mass = first.cdf(torch.tensor(v + 0.05, dtype=torch.float64)) - first.cdf(torch.tensor(v - 0.05, dtype=torch.float64))
    rest = torch.log_softmax(own.loc_S[0, :-1].double(), -1).gather(1, ids[0, 1:].unsqueeze(1)).sum()
    expected_bits = -(float(log_p_first) + math.log(float(mass)) + float(rest)) / math.log(2)
    assert totals.tokens == ids.shape[1] and totals.numbers == 1
    assert totals.bits == pytest.approx(expected_bits, rel=1e-6)
    assert totals.number_bits == pytest.approx(-(float(log_p_first) + math.log(float(mass))) / math.log(2), rel=1e-6)


@torch.no_grad()
def test_qwen_text_bits_count_each_number_s_tokens_in_its_order():
    from causal_qwen.conversion.presets import build_preset
    from causal_qwen.core.numbers import find_numbers
    from causal_qwen.core.tokenizer import build_qwen25_base_tokenizer

    qwen, tokenizer = build_preset("random:tiny"), build_qwen25_base_tokenizer()
    texts = ["Rain 0.0 mm, high 12.8 C.", "Rain 5 mm, high 9.4 C."]
    totals = evaluation.qwen_text_bits(qwen, tokenizer, texts)
    by_hand = [0.0, 0.0]
    for text in texts:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor([[tokenizer.eos_token_id] + list(encoded["input_ids"])])  # the lone start, then the text
        start_logits = qwen(input_ids=ids[:, :1]).logits[0, 0]
        own_logits = qwen(input_ids=ids[:, 1:]).logits[0, :-1]  # the text's own pass: no context token
        log_p = torch.log_softmax(torch.cat([start_logits[None], own_logits]).double(), -1).gather(
            1, ids[0, 1:, None])[:, 0]  # (S,)
        for order, span in enumerate(find_numbers(text)):
            inside = [span.start < end and start < span.end for start, end in encoded["offset_mapping"]]
            by_hand[order] += -float(log_p[torch.tensor(inside)].sum()) / math.log(2)
    assert totals.numbers_by_order == [2, 2]
    assert totals.number_bits_by_order == pytest.approx(by_hand, rel=1e-6)
    assert sum(totals.number_bits_by_order) == pytest.approx(totals.number_bits, rel=1e-9)
    assert totals.metrics()["bits_per_number_by_order"] == pytest.approx([b / 2 for b in by_hand], rel=1e-6)


def test_best_scale_interval_log_mass():
    error = torch.tensor([0.0, 0.03, 0.05, 0.2, 3.0, -3.0], dtype=torch.float64)
    half = torch.full_like(error, 0.05)
    log_mass = evaluation.best_scale_interval_log_mass(error, half)
    assert log_mass[:3].tolist() == [0.0, 0.0, 0.0]  # the interval holds the centre: a scale → 0 takes it all
    gammas = torch.logspace(-4, 3, 70001, dtype=torch.float64).unsqueeze(1)  # (G,1)
    for e, got in zip(error[3:], log_mass[3:]):
        y = torch.distributions.Cauchy(e, gammas)
        searched = (y.cdf(torch.tensor(0.05, dtype=torch.float64)) - y.cdf(torch.tensor(-0.05, dtype=torch.float64))).max()
        assert float(got) == pytest.approx(math.log(float(searched)), rel=1e-6)


def test_training_median_baseline_by_hand():
    from causal_qwen.training.data import Document

    def docs(values):
        return [Document(text="t", source="s", row=i, target_value=v) for i, v in enumerate(values)]

    # training median 3; errors |10-3|, |2-3|, |4-3| = 7, 1, 1: median 1
    assert evaluation.training_median_mdae(docs([1.0, 3.0, 5.0]), docs([10.0, 2.0, 4.0])) == 1.0
    assert evaluation.training_median_mdae([], docs([1.0])) is None
    assert evaluation.training_median_mdae(docs([None]), docs([1.0])) is None


# ---- eval's data settings from a run's train_config.yaml ---------------------------------------------------
def eval_spec(tmp_path, settings: dict, *argv: str):
    """`data_spec` of ``causal-qwen eval --model RUN/final ARGV`` for a run whose train_config.yaml holds
    ``settings`` (no model is loaded)."""
    import yaml

    from causal_qwen.cli import build_parser
    from causal_qwen.commands.eval import data_spec

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True, exist_ok=True)
    (run / "train_config.yaml").write_text(yaml.safe_dump({"model": "random:tiny", **settings}), encoding="utf-8")
    return data_spec(build_parser().parse_args(["eval", "--model", str(run / "final"), *argv]))


def test_eval_reads_the_run_s_table_in_its_data_format(tmp_path):
    table = tmp_path / "weather.dat"  # a CSV by another name: training read it with data_format: csv
    table.write_text("day,high\n1,10.5\n2,11.0\n3,12.5\n4,13.0\n", encoding="utf-8")
    spec = eval_spec(tmp_path, {"data": str(table), "data_format": "csv", "template": "Day {day}: high {high} C.",
                                "target": "high", "split_by": "day", "split_at": 3})
    assert spec.format == "csv"
    held_out = evaluation.load_documents(spec)
    assert [doc.text for doc in held_out] == ["Day 3: high 12.5 C.", "Day 4: high 13.0 C."]
    assert [doc.target_value for doc in held_out] == [12.5, 13.0]


def test_eval_of_a_run_whose_data_file_moved_says_how_to_name_it(tmp_path):
    settings = {"data": str(tmp_path / "moved.csv"), "template": "Day {day}: high {high} C.", "target": "high"}
    with pytest.raises(ValueError, match=r"the run's data file .*moved\.csv' \(from .*train_config\.yaml\) does not "
                                         r"exist: give its new place with --data PATH"):
        eval_spec(tmp_path, settings)


def test_eval_data_format_reads_another_table_by_another_name(tmp_path):
    table = tmp_path / "weather.csv"
    table.write_text("day,high\n1,10.5\n2,11.0\n", encoding="utf-8")
    other = tmp_path / "later.txt"  # a CSV named .txt: by its suffix it would be plain text
    other.write_text("day,high\n5,9.0\n", encoding="utf-8")
    settings = {"data": str(table), "template": "Day {day}: high {high} C.", "target": "high"}
    assert eval_spec(tmp_path, settings, "--data", str(other)).template is None  # read as text: no template
    spec = eval_spec(tmp_path, settings, "--data", str(other), "--data-format", "csv")
    assert [doc.text for doc in evaluation.load_documents(spec)] == ["Day 5: high 9.0 C."]


def test_eval_of_a_run_on_plain_text_leaves_the_run_s_template_and_target(tmp_path):
    table = tmp_path / "table.csv"
    table.write_text("day,high\n1,10.5\n2,11.0\n", encoding="utf-8")
    notes = tmp_path / "notes.txt"
    notes.write_text("It was 12.5 C on day 3.\n", encoding="utf-8")
    spec = eval_spec(tmp_path, {"data": str(table), "template": "Day {day}: high {high} C.", "target": "high"},
                     "--data", str(notes))
    assert (spec.template, spec.target) == (None, None)
    assert [doc.text for doc in evaluation.load_documents(spec)] == ["It was 12.5 C on day 3."]
    other = tmp_path / "other.csv"  # another table with the run's columns still gets its template
    other.write_text("day,high\n5,9.0\n", encoding="utf-8")
    spec = eval_spec(tmp_path, {"data": str(table), "template": "Day {day}: high {high} C.", "target": "high"},
                     "--data", str(other))
    assert (spec.template, spec.target) == ("Day {day}: high {high} C.", "high")


def test_cli_eval_and_generate_refuse_a_folder_as_their_output_file(tmp_path, capsys):
    from causal_qwen.cli import main

    folder = tmp_path / "reports"
    folder.mkdir()
    missing = str(tmp_path / "no_model")
    assert main(["eval", "--model", missing, "--data", str(tmp_path / "no.txt"), "--json", str(folder)]) == 2
    assert f"cannot write {str(folder)!r}: it is a folder" in capsys.readouterr().err
    assert main(["generate", "--model", missing, "--mode", "causal", "--individual-scope", "sequence",
                 "--save-individual", str(folder), "hi"]) == 2
    assert f"cannot write {str(folder)!r}: it is a folder" in capsys.readouterr().err


def test_the_metrics_table_shows_the_first_figures_of_a_long_list():
    from causal_qwen.commands.eval import format_metrics

    table = format_metrics({"documents": 1, "bits_per_number_by_order": [float(k) for k in range(3000)]})
    line = next(line for line in table.splitlines() if line.startswith("bits per number"))
    assert line.endswith("  0 / 1 / 2 / 3 / 4 / 5 / 6 / 7 / 8 / 9 / … (3,000 in all; --json lists every one)")
    assert format_metrics({"bits_per_number_by_order": [1.5, 2.0]}).endswith("  1.5 / 2")
    assert format_metrics({"bits_per_number_by_order": []}).endswith("  n/a"), "text without numbers"


def test_the_metrics_table_says_why_a_correlation_is_missing():
    from causal_qwen.commands.eval import format_metrics

    assert format_metrics({"num_count": 14, "num_scale_error_spearman": None}).endswith(
        "  n/a (scale_Y, or the error, is the same at every number: nothing to rank)")
    assert format_metrics({"num_count": 1, "num_scale_error_spearman": None}).endswith("  n/a (fewer than two numbers)")
    assert format_metrics({"num_count": 14, "num_scale_error_spearman": 0.25}).endswith("  0.25")


def test_cli_number_index_with_all_numbers_is_an_error(tmp_path, capsys):
    from causal_qwen.cli import main

    both = ["--model", str(tmp_path / "no_model"), "--data", str(tmp_path / "no.txt"), "--number-index", "0",
            "--all-numbers"]
    assert main(["eval", *both]) == 2
    assert "--number-index 0 and --all-numbers each choose the numbers to score" in capsys.readouterr().err
    assert main(["plot", "numbers", *both, "--out", str(tmp_path / "n.png")]) == 2
    assert "--number-index 0 and --all-numbers each choose the numbers to score" in capsys.readouterr().err


def test_cli_gguf_file_with_a_model_folder_is_an_error(tmp_path, capsys):
    from causal_qwen.cli import main

    assert main(["predict", "--model", str(tmp_path / "no_model"), "--gguf-file", "model.gguf", "x"]) == 2
    assert "--gguf-file names the GGUF file inside --base" in capsys.readouterr().err
