"""The earlier numbers (`heads.EarlierNumbers`): the number read-out reads the values of a row's last K numbers
where its number k comes next, the warm start keeps them only where they help, and generation with a KV cache
reads them as a whole-row forward does."""

from __future__ import annotations

import math

import pytest
import torch

from causal_qwen import from_qwen

from .conftest import SMALL_NUM_ID, byte_level_tokenizer, load_benchmark, small_qwen

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A width-16 CausalQwen over the byte-level vocabulary (no calibration) and its tokenizer."""
    from causal_qwen.conversion.loading import convert_base

    root = tmp_path_factory.mktemp("earlier_numbers")
    tokenizer = byte_level_tokenizer()
    small_qwen(tied=True, vocab_size=len(tokenizer), hidden_size=16).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    model, tokenizer = convert_base(str(root / "base"), ovr_calibration="none")
    return model.eval(), tokenizer


def with_earlier_numbers(model, weights: list[float], target: int):
    """A copy of ``model`` reading ``len(weights)`` earlier numbers with ``w_e = weights`` where number ``target``
    comes next."""
    import copy

    reading = copy.deepcopy(model)
    reading.set_earlier_numbers(len(weights), target)
    reading.action.earlier_numbers.weight.copy_(torch.tensor(weights))
    return reading


def test_the_values_are_the_rows_last_numbers_latest_first_and_the_term_applies_where_the_target_comes_next():
    from causal_qwen.core.heads import EarlierNumbers

    num = 1
    ids = torch.tensor([[0, 1, 0, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0, 0]])  # row 0 reads 5, 7, 9; row 1 one number
    values = torch.tensor([[0, 5, 0, 7, 0, 9, 0], [4, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    earlier = EarlierNumbers(3, target=2, vocab_size=2)
    before, read = earlier.values(ids, values, num)
    assert before.shape == (2, 7, 3) and read[0].tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert before[0, 0].tolist() == [0, 0, 0] and before[0, 2].tolist() == [5, 0, 0]
    assert before[0, 4].tolist() == [7, 5, 0] and before[0, 6].tolist() == [9, 7, 5]
    assert before[1, 6].tolist() == [4, 0, 0]  # no value crosses rows
    earlier.weight.copy_(torch.tensor([1.0, 10.0, 100.0]))
    earlier.width.fill_(0.25)
    term = earlier(ids, values, num)  # (B,S,2): the shift of loc_Y, the factor of scale_Y
    # where exactly 2 numbers were read (positions 3 and 4 of row 0): 7·1 + 5·10, widths ×0.25; elsewhere nothing
    assert term.shape == (2, 7, 2)
    assert term[0, :, 0].tolist() == [0, 0, 0, 57, 57, 0, 0] and term[1, :, 0].tolist() == [0] * 7
    assert term[0, :, 1].tolist() == [1, 1, 1, 0.25, 0.25, 1, 1] and term[1, :, 1].tolist() == [1] * 7


def test_a_marked_row_break_starts_a_row_whose_target_reads_its_own_numbers():
    """Token 2 ends a row: after it the count starts again, the values of the row before are not read, and the
    term applies where the new row's number k comes next, as in a text of that row alone."""
    from causal_qwen.core.heads import EarlierNumbers

    num, line_break = 1, 2
    ids = torch.tensor([[0, 1, 0, 1, 0, 1, line_break, 0, 1, 0, 1, 0]])  # reads 5, 7, 9 ⏎ 3, 4
    values = torch.tensor([[0, 5, 0, 7, 0, 9, 0, 0, 3, 0, 4, 0]], dtype=torch.float64)
    earlier = EarlierNumbers(3, target=2, vocab_size=3)
    earlier.weight.copy_(torch.tensor([1.0, 10.0, 100.0]))
    as_one_row = earlier(ids, values, num)[0, :, 0].tolist()
    assert as_one_row == [0, 0, 0, 57, 57, 0, 0, 0, 0, 0, 0, 0]  # no mark: one row, read 4 and 5 numbers at the end
    earlier.mark_row_breaks([line_break])
    before, read = earlier.values(ids, values, num)
    assert read[0].tolist() == [0, 1, 1, 2, 2, 3, 0, 0, 1, 1, 2, 2]
    assert before[0, 11].tolist() == [4, 3, 0]  # the row's own numbers; 9 and 7 belong to the row before
    term = earlier(ids, values, num)[0, :, 0].tolist()
    assert term == [0, 0, 0, 57, 57, 0, 0, 0, 0, 0, 34, 34]
    alone = earlier(ids[:, 7:], values[:, 7:], num)[0, :, 0].tolist()
    assert term[7:] == alone


def test_rows_end_at_line_breaks_unless_a_training_row_holds_one(tokenizer):
    """Training marks the tokenizer's line-break tokens as row ends when its rows are one line each (a line break
    after a row's last number aside); a row whose numbers go on after a line break leaves a text one row."""
    from causal_qwen.training.collator import TokenizedDataset
    from causal_qwen.training.readout_steps import row_break_ids

    def rows(*texts: str) -> TokenizedDataset:
        encoded = tokenizer(list(texts))
        return TokenizedDataset([{"input_ids": ids.tolist() + [tokenizer.eos_token_id], "numeric_values": values}
                                 for ids, values in zip(encoded["input_ids"], encoded["numeric_values"])])

    breaks = tokenizer.line_break_ids()
    newline, = tokenizer.encode("\n", add_special_tokens=False)
    assert newline in breaks and tokenizer.num_token_id not in breaks
    assert all(token not in breaks for token in tokenizer.encode("a 1, b 2: total 3.", add_special_tokens=False))
    assert row_break_ids(tokenizer, rows("a 1, b 2, total 3.", "a 2, b 2, total 4.\n")) == breaks
    assert row_break_ids(tokenizer, rows("a 1, b 2, total 3.", "a 2,\nb 2, total 4.")) == []


def test_forward_adds_the_term_to_loc_Y_scales_the_width_there_and_the_loss_reads_both(converted):
    model, tokenizer = converted
    batch = tokenizer(["open 100, high 105, low 99, close 102.5."], return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "numeric_values": batch["numeric_values"]}
    reading = with_earlier_numbers(model, [0.5, 0.25, 2.0], target=3)
    with torch.no_grad():
        plain, read = model(**inputs), reading(**inputs)
    num_positions = (batch["input_ids"][0] == tokenizer.num_token_id).nonzero().flatten().tolist()
    term = torch.zeros_like(plain.loc_Y)
    term[0, num_positions[2]: num_positions[3]] = 0.5 * 99 + 0.25 * 105 + 2.0 * 100  # after low, before close
    torch.testing.assert_close(read.loc_Y, plain.loc_Y + term)
    torch.testing.assert_close(read.scale_Y, plain.scale_Y)  # c_e = 1: the widths as they were
    torch.testing.assert_close(read.loc_S, plain.loc_S)

    reading.action.earlier_numbers.width.fill_(0.5)  # c_e: the widths where the values are read, halved
    with torch.no_grad():
        read = reading(**inputs)
    width = torch.ones_like(plain.scale_Y)
    width[0, num_positions[2]: num_positions[3]] = 0.5
    torch.testing.assert_close(read.loc_Y, plain.loc_Y + term)
    torch.testing.assert_close(read.scale_Y, plain.scale_Y * width)

    reading.config.regression_gate_alpha = 1.0  # gate 1: the regression loss is the mean Cauchy NLL at the numbers
    with torch.no_grad():
        loss = reading(**inputs, labels=batch["input_ids"]).reg_loss
    before = [position - 1 for position in num_positions]  # the positions that predict the four numbers
    targets = batch["numeric_values"][0, num_positions].double()
    loc, scale = read.loc_Y[0, before].double(), read.scale_Y[0, before].double()
    expected = (torch.log(math.pi * scale) + torch.log1p(((targets - loc) / scale) ** 2)).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-5)


def test_predict_names_the_earlier_numbers_its_forecast_reads(converted):
    """`predict_next`'s number forecast lists the row's values the read-out added (latest first) where the row's
    target comes next, after a row on the line above too, and nothing elsewhere; ``causal-qwen predict`` prints
    them."""
    from causal_qwen.commands.predict import format_view
    from causal_qwen.evaluation.predict import predict_next

    model, tokenizer = converted
    reading = with_earlier_numbers(model, [0.5, 0.25, 2.0], target=3)
    reading.action.earlier_numbers.mark_row_breaks(tokenizer.line_break_ids())
    row = "open 100, high 105, low 99, close"
    view = predict_next(reading, tokenizer, row)
    assert view.number.earlier_numbers == [99.0, 105.0, 100.0]
    assert "the forecast reads the row's earlier numbers, latest first: 99, 105, 100" in format_view(view)
    after_a_row = predict_next(reading, tokenizer, "open 1, high 2, low 0.5, close 1.5.\n" + row)
    assert after_a_row.number.earlier_numbers == [99.0, 105.0, 100.0]
    assert predict_next(reading, tokenizer, "open 100, high 105, close").number.earlier_numbers == []
    one_line = predict_next(reading, tokenizer, "open 1, high 2, low 0.5, close 1.5. " + row)  # no line break
    assert one_line.number.earlier_numbers == [] and one_line.number.row_numbers_before == 7
    assert ("the model reads a row's earlier numbers where 3 come before its target; this row holds 7 since its "
            "latest line break, so the forecast reads none") in format_view(one_line)
    plain = predict_next(model, tokenizer, row)
    assert plain.number.earlier_numbers == [] and "earlier numbers" not in format_view(plain)


def test_generation_with_a_cache_reads_the_earlier_numbers_as_a_whole_row_forward(converted):
    """Standard mode made to write ``<NUM>`` at every step: each new number's value is ``loc_Y`` with the term of
    the numbers before it, the generated ones included; the numbers written equal a whole-row forward's ``loc_Y``."""
    model, tokenizer = converted
    reading = with_earlier_numbers(model, [1.0, 0.5], target=3)
    with torch.no_grad():
        reading.action.classification_head.bias[tokenizer.num_token_id] += 1e6  # <NUM> wins every decision
    tokenizer.padding_side = "left"
    batch = tokenizer(["a 3, b 4,", "x 1.5 and"], return_tensors="pt", padding=True)
    out = reading.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           numeric_values=batch["numeric_values"], mode="standard", max_new_tokens=4,
                           return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
    prompt = batch["input_ids"].shape[1]
    assert bool((out.sequences[:, prompt:] == tokenizer.num_token_id).all())
    mask = torch.cat([batch["attention_mask"], torch.ones_like(out.sequences[:, prompt:])], dim=1)
    with torch.no_grad():
        whole = reading(input_ids=out.sequences, numeric_values=out.numeric_values.float(), attention_mask=mask)
    written = out.numeric_values[:, prompt:]  # (B,4): the value each step wrote
    torch.testing.assert_close(written.float(), whole.loc_Y[:, prompt - 1:-1].float(), rtol=1e-5, atol=1e-4)
    # row 0 read 3 and 4 in its prompt: its first number (its 3rd, k = 2 read) gets no term, its second (k = 3) does
    term = reading.earlier_numbers_term(out.sequences, out.numeric_values)[..., 0]  # (B,L) the shift of loc_Y
    assert float(term[0, prompt - 1]) == 0.0 and float(term[0, prompt]) == pytest.approx(
        float(written[0, 0]) * 1.0 + 4 * 0.5, rel=1e-5)


def test_a_cache_or_embeddings_without_the_term_are_refused(converted):
    from transformers import DynamicCache

    model, tokenizer = converted
    reading = with_earlier_numbers(model, [1.0], target=1)
    batch = tokenizer(["a 3, b"], return_tensors="pt")
    ids, values = batch["input_ids"], batch["numeric_values"]
    cache = DynamicCache(config=reading.config)
    with torch.no_grad():
        reading(input_ids=ids[:, :-1], numeric_values=values[:, :-1], cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="KV cache hides"):
            reading(input_ids=ids[:, -1:], numeric_values=values[:, -1:], cache=cache, use_cache=True)
        whole = reading.earlier_numbers_term(ids, values)
        stepped = reading(input_ids=ids[:, -1:], numeric_values=values[:, -1:], cache=cache, use_cache=True,
                          earlier_term=whole[:, -1:])
        full = reading(input_ids=ids, numeric_values=values)
        torch.testing.assert_close(stepped.loc_Y[:, -1], full.loc_Y[:, -1], rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="earlier numbers of each row"):
            reading(inputs_embeds=reading.embed(ids, values))
        with pytest.raises(ValueError, match=r"earlier_term has shape \(1, 2, 2\), expected \(1, "):
            reading(input_ids=ids, numeric_values=values, earlier_term=whole[:, :2])
        with pytest.raises(ValueError, match=r"earlier_term has shape \(1, \d+\), expected \(1, \d+, 2\)"):
            reading(input_ids=ids, numeric_values=values, earlier_term=whole[..., 0])
        with pytest.raises(ValueError, match="reads no earlier numbers"):
            model(input_ids=ids, numeric_values=values, earlier_term=whole)
    assert model.earlier_numbers_term(ids, values) is None  # a model without them


def test_a_saved_model_keeps_its_earlier_numbers_in_float32(converted, tmp_path):
    from causal_qwen.core.modeling import CausalQwenForCausalLM

    model, tokenizer = converted
    reading = with_earlier_numbers(model, [0.125, -3.0], target=2)
    reading.action.earlier_numbers.width.fill_(0.375)
    reading.action.earlier_numbers.mark_row_breaks([3, 7])
    reading.save_pretrained(tmp_path / "saved")
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    assert loaded.config.earlier_numbers == 2 and loaded.config.earlier_numbers_target == 2
    assert loaded.action.earlier_numbers.weight.dtype == torch.float32
    assert loaded.action.earlier_numbers.weight.tolist() == [0.125, -3.0]
    assert loaded.action.earlier_numbers.width.dtype == torch.float32
    assert float(loaded.action.earlier_numbers.width) == 0.375
    assert loaded.action.earlier_numbers.row_break.dtype == torch.float32
    assert loaded.action.earlier_numbers.row_break.nonzero().flatten().tolist() == [3, 7]

    # a folder saved before the width and the row breaks existed loads with c_e = 1, the widths it was saved with,
    # and reads a text as one row
    from safetensors.torch import load_file, save_file

    weights_file = tmp_path / "saved" / "model.safetensors"
    tensors = load_file(weights_file)
    del tensors["action.earlier_numbers.width"], tensors["action.earlier_numbers.row_break"]
    save_file(tensors, weights_file, metadata={"format": "pt"})
    older = CausalQwenForCausalLM.from_pretrained(tmp_path / "saved")
    assert float(older.action.earlier_numbers.width) == 1.0
    assert not bool(older.action.earlier_numbers.row_break.any())
    assert older.action.earlier_numbers.weight.tolist() == [0.125, -3.0]
    with pytest.raises(ValueError, match="earlier_numbers_target must be >= 1"):
        reading.set_earlier_numbers(2, 0)


def test_the_width_where_the_values_are_read_is_set_to_the_read_outs_error_there_alone():
    """``c_e = r̃_e / s̃``: after it the median ``scale_Y`` at the training targets is ``r̃_e`` (narrowing or
    widening), the other numbers keep their widths, and setting it again from the same error gives the same
    ``c_e`` (it measures ``s̃`` at ``c_e = 1``). Nothing is set without earlier numbers or with too few targets."""
    from causal_qwen.training.collator import NumericCollator, TokenizedDataset
    from causal_qwen.training.interval_check import MIN_NUMBERS, set_earlier_width, slice_predictions

    num = SMALL_NUM_ID
    rows = TokenizedDataset([{"input_ids": [5, num, 6, num, 7, num, 8],
                              "numeric_values": [0.0, float(a), 0.0, float(b), 0.0, float(a + b), 0.0]}
                             for a, b in zip(range(12), range(3, 15))])
    collator, targets = NumericCollator(pad_token_id=0), [2] * 12
    model = from_qwen(small_qwen(), num_token_id=num, ovr_calibration="none", number_noise_init=1.0)
    assert set_earlier_width(model, rows, collator, 8, 2.0, targets, forward=True) is None  # no earlier numbers
    _, _, first_before = slice_predictions(model, rows, collator, 8, [0] * 12)
    model.set_earlier_numbers(2, 2)
    _, _, scale = slice_predictions(model, rows, collator, 8, targets)
    for error in (0.1 * float(scale.median()), 30.0 * float(scale.median())):
        report = set_earlier_width(model, rows, collator, 8, error, targets, forward=True)
        assert report is not None and report.numbers == 12 and report.forward
        assert report.median_scale == pytest.approx(float(scale.median()))
        assert report.width == pytest.approx(error / report.median_scale)
        assert float(model.action.earlier_numbers.width) == pytest.approx(report.width)
        _, _, now = slice_predictions(model, rows, collator, 8, targets)
        assert float(now.median()) == pytest.approx(error, rel=1e-5)
        _, _, first = slice_predictions(model, rows, collator, 8, [0] * 12)  # no earlier number read there
        torch.testing.assert_close(first, first_before)
        assert "multiplied by" in report.line()
    again = set_earlier_width(model, rows, collator, 8, report.error, targets, forward=False)
    assert again.width == pytest.approx(report.width) and "out-of-fold" in again.line()
    few = TokenizedDataset(list(rows)[: MIN_NUMBERS - 1])
    assert set_earlier_width(model, few, collator, 8, 1.0, targets[: MIN_NUMBERS - 1], forward=True) is None
    assert set_earlier_width(model, rows, collator, 8, float("nan"), targets, forward=True) is None


def test_the_fit_keeps_the_earlier_numbers_where_they_carry_the_target_and_not_where_they_drift():
    """Features that carry nothing. y = 2·e₀ − e₁ + 1: the fit keeps the earlier numbers and reads them exactly.
    y = e₀ for the first 60% of the rows and −e₀ after, in time order: forecast forward, the earlier numbers make
    the later blocks worse, and the fit leaves them out."""
    from causal_qwen.training.warm_start import _fit_regression

    generator = torch.Generator().manual_seed(5)
    count = 80
    features = torch.randn(count, 6, generator=generator, dtype=torch.float64)
    earlier = torch.randn(count, 3, generator=generator, dtype=torch.float64) * 10
    is_target = torch.ones(count, dtype=torch.bool)
    every = torch.cat([torch.zeros(count, dtype=torch.bool), is_target])  # half the numbers are targets
    doubled = lambda tensor: torch.cat([tensor, tensor])  # noqa: E731 (non-targets beside them, as a sentence has)

    linear = 2 * earlier[:, 0] - earlier[:, 1] + 1
    weight, bias, earlier_weight, report = _fit_regression(
        doubled(features), doubled(linear), every, "auto", 0.0, earlier=doubled(earlier), weigh_earlier=True)
    assert earlier_weight is not None and report.earlier_numbers == 3
    forecast = features @ weight + bias + earlier @ earlier_weight
    assert float((forecast - linear).abs().max()) < 0.05
    assert len(report.earlier_block_errors["with"]) == 5

    sign = torch.where(torch.arange(count) < 0.6 * count, 1.0, -1.0).double()
    drifting = sign * earlier[:, 0]
    _, _, earlier_weight, report = _fit_regression(
        doubled(features), doubled(drifting), every, "auto", 0.0, earlier=doubled(earlier), weigh_earlier=True,
        in_time_order=True)
    assert earlier_weight is None and report.earlier_numbers == 0
    without, within = report.earlier_block_errors["without"], report.earlier_block_errors["with"]
    assert len(without) == 4 and within[-1] > without[-1]  # the last forward block: worse with them


def test_the_values_are_kept_only_past_two_standard_errors_of_the_blocks_gain():
    """Paired block gains g = without − within: mean(g) must pass 2·sd(g)/√n. The real base's Seattle highs gained
    0.30, 0.06, 0.02, −0.02 (1.25 standard errors) and are not kept; the tiny default's ohlc (2.3) is."""
    from causal_qwen.training.warm_start import keeps_earlier

    def kept(gains: list[float]) -> bool:
        without = torch.full((len(gains),), 5.0, dtype=torch.float64)
        return keeps_earlier(without, without - torch.tensor(gains, dtype=torch.float64))

    assert not kept([0.303, 0.057, 0.024, -0.022])
    assert kept([0.879, 1.246, 0.226, 2.971])
    assert not kept([-1.0, -2.0, -0.5, -0.1])  # worse with the values
    assert kept([1.0, 1.1, 0.9, 1.0, 1.05])
    assert not keeps_earlier(None, torch.ones(4, dtype=torch.float64))  # too few numbers for blocks


def sum_config(tmp_path, name: str, rows: list[str]):
    """A four-key config over ``day,a,b,total``: the total follows ``a`` and ``b``, a split in time."""
    (tmp_path / f"{name}.csv").write_text("\n".join(["day,a,b,total", *rows]) + "\n", encoding="utf-8")
    config_file = tmp_path / f"{name}.yaml"
    config_file.write_text(
        f"data: {tmp_path / f'{name}.csv'}\ntemplate: 'On {{day}}: a {{a}}, b {{b}}, total {{total}}.'\n"
        "target: total\nsplit_by: day\nsplit_at: '2020-04-01'\n", encoding="utf-8")
    return config_file


def test_a_four_key_config_reads_the_earlier_numbers_that_make_its_target_and_a_resumed_run_keeps_them(tmp_path):
    """On the tiny preset, a total that is ``3·a − b`` of the numbers before it: the recipe's warm start keeps the
    earlier numbers (and says so), the saved model reads them, and its held-out forecast is close; a run resumed
    from a checkpoint builds the read-out the start kept. A total of noise keeps none."""
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.training.train_config import load_train_config
    from causal_qwen.training.training import run_training

    generator = torch.Generator().manual_seed(0)
    a = (torch.rand(120, generator=generator) * 50 + 10).tolist()
    b = (torch.rand(120, generator=generator) * 20).tolist()
    days = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d}" for i in range(120)]
    rows = [f"{day},{x:.1f},{y:.1f},{3 * round(x, 1) - round(y, 1):.1f}" for day, x, y in zip(days, a, b)]
    settings = ["max_steps=2", "report_to=none", "progress_bar=false", "eval_steps=0", "save_steps=1"]
    config = load_train_config(sum_config(tmp_path, "sums", rows), [f"output_dir={tmp_path / 'run'}", *settings])
    assert config.earlier_numbers == 3
    lines: list[str] = []
    result = run_training(config, report=lines.append)
    assert any(line.startswith("earlier numbers: read beside the features") for line in lines), lines
    assert result.warm_start.earlier_numbers == 3 and len(result.warm_start.earlier_block_errors["with"]) == 4
    width = result.earlier_width  # the widths at the totals, set to the forward error of the read-out with a, b
    assert width is not None and width.forward and width.error == result.warm_start.forward_mdae
    assert width.width == pytest.approx(width.error / width.median_scale)
    assert any(line.startswith("earlier numbers' width:") for line in lines), lines
    saved = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    assert saved.config.earlier_numbers == 3 and saved.config.earlier_numbers_target == 2
    assert float(saved.action.earlier_numbers.width) == pytest.approx(width.width)
    from causal_qwen.core.tokenizer import NumericTokenizer

    tokenizer = NumericTokenizer.from_pretrained(result.final_dir)
    batch = tokenizer(["On 2020-05-02: a 40.0, b 5.0, total"], return_tensors="pt")
    with torch.no_grad():
        forecast = float(saved(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"]).loc_Y[0, -1])
    assert forecast == pytest.approx(115.0, abs=3.0)
    # a line break ends a row: after a whole row, the next line's total reads that line's a and b
    assert saved.action.earlier_numbers.row_break.nonzero().flatten().tolist() == tokenizer.line_break_ids()
    two_rows = tokenizer(["On 2020-05-01: a 20.0, b 1.0, total 59.0.\nOn 2020-05-02: a 40.0, b 5.0, total",
                          "On 2020-05-02: a 40.0, b 5.0, total"], return_tensors="pt", padding=True)
    term = saved.earlier_numbers_term(two_rows["input_ids"], two_rows["numeric_values"])
    ends = two_rows["attention_mask"].sum(dim=1) - 1
    assert term[0, ends[0]].tolist() == term[1, ends[1]].tolist()
    assert float(term[0, ends[0], 0]) != 0.0
    # benchmarks/rows_in_a_prompt.py on the run: the held-out rows after the row before them, marked and cleared
    rows_in_a_prompt = load_benchmark("rows_in_a_prompt.py", "rows_in_a_prompt_benchmark")
    figures = rows_in_a_prompt.measure(result.final_dir, rows_before=2)
    assert figures["rows"] == 120 - 84 and figures["marked_row_breaks"] == len(tokenizer.line_break_ids())
    assert figures["after_rows"] < 3.0 < figures["after_rows_unmarked"]  # reads a and b only where rows are marked
    assert rows_in_a_prompt.main(["--model", str(tmp_path / "noise_run_missing")]) == 2

    resumed = load_train_config(sum_config(tmp_path, "sums", rows),
                                [f"output_dir={tmp_path / 'run'}", *settings, "max_steps=3"])
    again = run_training(resumed, resume=True)
    assert again.global_step == 3 and again.warm_start.earlier_numbers == 3  # the start's report, read back
    reloaded = CausalQwenForCausalLM.from_pretrained(again.final_dir)
    assert reloaded.config.earlier_numbers == 3 and bool(reloaded.action.earlier_numbers.row_break.any())

    noise = (torch.randn(120, generator=generator) * 5 + 50).tolist()
    rows = [f"{day},{x:.1f},{y:.1f},{z:.1f}" for day, x, y, z in zip(days, a, b, noise)]
    config = load_train_config(sum_config(tmp_path, "noise", rows), [f"output_dir={tmp_path / 'noise_run'}", *settings])
    lines = []
    result = run_training(config, report=lines.append)
    assert any(line.startswith("earlier numbers: not read: they do not help") for line in lines), lines
    assert CausalQwenForCausalLM.from_pretrained(result.final_dir).config.earlier_numbers == 0
    assert result.earlier_width is None

    # Numbers the template's text writes alike in every row ("S&P 500") have nothing to tell: train says so.
    rows = [f"{day},500,2,{z:.1f}" for day, z in zip(days, noise)]
    config = load_train_config(sum_config(tmp_path, "fixed", rows), [f"output_dir={tmp_path / 'fixed_run'}", *settings])
    lines = []
    run_training(config, report=lines.append)
    assert any(line.startswith("earlier numbers: not read: the numbers before the target are the same in every row "
                               "(2, 500)") for line in lines), lines


def test_a_bad_earlier_numbers_setting_is_named(tmp_path):
    from causal_qwen.training.train_config import load_train_config

    config_file = sum_config(tmp_path, "bad", ["2020-01-01,1,2,3"])
    for value in ("-1", "17", "2.5", "true"):
        with pytest.raises(ValueError, match="earlier_numbers"):
            load_train_config(config_file, [f"earlier_numbers={value}"])
    assert load_train_config(config_file, ["earlier_numbers=0"]).earlier_numbers == 0
