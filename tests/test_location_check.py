"""The location check (`causal_qwen.training.location_check`) and the slice it reads (`keep_check_slice`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from causal_qwen import from_qwen
from causal_qwen.training.collator import NumericCollator, TokenizedDataset
from causal_qwen.training.data import Document
from causal_qwen.training.interval_check import slice_predictions
from causal_qwen.training.location_check import check_location, choose_alpha, training_median
from causal_qwen.training.readout_steps import checks_locations, keep_check_slice

from .conftest import SMALL_NUM_ID, small_qwen

pytestmark = pytest.mark.usefixtures("one_thread")


def context_dataset(tokens: list[int], values: list[float]) -> TokenizedDataset:
    """One document per value, ``t <NUM>=v w``: the number's location reads the token ``t`` before it."""
    return TokenizedDataset([{"input_ids": [t, SMALL_NUM_ID, 7], "numeric_values": [0.0, v, 0.0]}
                             for t, v in zip(tokens, values)])


def model_and_tokens(count: int, number_noise: bool = True):
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none",
                      number_noise_init=1.0 if number_noise else None)
    with torch.no_grad():
        model.action.regression_head.weight.mul_(100.0)  # locations spread over about ±100 with the context token
    tokens = torch.randint(10, 400, (count,), generator=torch.Generator().manual_seed(1)).tolist()
    return model, tokens


def read(model, data, collator) -> tuple[torch.Tensor, torch.Tensor]:
    value, loc, scale = slice_predictions(model, data, collator, batch_size=16, target_ordinals=None)
    return loc, scale


def test_noise_locations_shrink_to_the_median_and_the_head_gives_the_blend_exactly():
    model, tokens = model_and_tokens(60)
    median = 37.0
    values = (median + torch.randn(60, generator=torch.Generator().manual_seed(2))).tolist()  # the median is right
    data, collator = context_dataset(tokens, values), NumericCollator(pad_token_id=0)
    loc_before, scale_before = read(model, data, collator)
    assert (loc_before - median).abs().median() > 10  # the model's locations are noise around it

    report = check_location(model, data, collator, batch_size=16, median=median)
    assert report is not None and report.shrunk and report.alpha <= 0.05 and report.support >= 0.9
    assert report.numbers == 60 and report.median == median and report.mdae_after < report.mdae_before / 10
    truth = torch.tensor(values, dtype=torch.float64)
    assert report.mdae_median == pytest.approx(float((truth - median).abs().quantile(0.5)))
    loc_after, scale_after = read(model, data, collator)
    blend = report.alpha * loc_before + (1 - report.alpha) * median
    torch.testing.assert_close(loc_after, blend, rtol=1e-6, atol=1e-4)  # float32 weights
    assert float((truth - loc_after).abs().quantile(0.5)) == pytest.approx(report.mdae_after, rel=1e-5)
    assert (scale_after <= scale_before + 1e-6).all()  # |W_reg| shrank; the numbers' own noise stays


def test_without_number_noise_the_grid_keeps_a_width():
    model, tokens = model_and_tokens(60, number_noise=False)
    values = (5.0 + torch.randn(60, generator=torch.Generator().manual_seed(2))).tolist()
    data, collator = context_dataset(tokens, values), NumericCollator(pad_token_id=0)
    loc_before, scale_before = read(model, data, collator)
    report = check_location(model, data, collator, batch_size=16, median=5.0)
    assert report is not None and report.shrunk and report.alpha == pytest.approx(0.05)  # α = 0 is off the grid
    loc_after, scale_after = read(model, data, collator)
    torch.testing.assert_close(loc_after, 0.05 * loc_before + 0.95 * 5.0, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(scale_after, 0.05 * scale_before, rtol=1e-5, atol=0.0)  # the width is on |W_reg| alone
    assert (scale_after > 0).all()


def test_a_good_model_keeps_its_locations_and_weights():
    model, tokens = model_and_tokens(60)
    collator = NumericCollator(pad_token_id=0)
    loc, _ = read(model, context_dataset(tokens, [0.0] * 60), collator)
    values = (loc + 0.01 * torch.randn(60, generator=torch.Generator().manual_seed(3), dtype=torch.float64)).tolist()
    head = model.action.regression_head
    weight, bias = head.weight.detach().clone(), head.bias.detach().clone()
    report = check_location(model, context_dataset(tokens, values), collator, batch_size=16,
                            median=float(loc.median()))
    assert report is not None and report.alpha == 1.0 and not report.shrunk
    assert report.mdae_after == report.mdae_before < 0.05
    assert torch.equal(head.weight, weight) and torch.equal(head.bias, bias)


def test_a_forecast_that_beats_the_median_is_not_tuned_toward_it():
    """A blend would fit the slice better (the model's locations carry half the truth's spread and noise), but the
    model beats the training median there, so its head is left as it is."""
    model, tokens = model_and_tokens(60)
    collator = NumericCollator(pad_token_id=0)
    loc, _ = read(model, context_dataset(tokens, [0.0] * 60), collator)
    median = float(loc.median())
    noise = torch.randn(60, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    values = (median + 0.6 * (loc - median) + 0.3 * (loc - median).abs().median() * noise).tolist()
    head = model.action.regression_head
    weight, bias = head.weight.detach().clone(), head.bias.detach().clone()
    value = torch.tensor(values, dtype=torch.float64)
    alpha, mdae = choose_alpha(value, loc, median)
    assert alpha < 1 and mdae[-1] > mdae.min()  # the slice alone would ask for a blend
    report = check_location(model, context_dataset(tokens, values), collator, batch_size=16, median=median)
    assert report is not None and report.mdae_median > report.mdae_before  # the model beats the constant
    assert not report.shrunk and report.support == 0.0 and report.mdae_after == report.mdae_before
    assert "only a forecast the median beats is shrunk" in report.line()
    assert torch.equal(head.weight, weight) and torch.equal(head.bias, bias)


def test_a_slice_under_eight_numbers_is_skipped():
    model, tokens = model_and_tokens(5)
    head = model.action.regression_head
    weight = head.weight.detach().clone()
    data = context_dataset(tokens, [37.0] * 5)
    assert check_location(model, data, NumericCollator(pad_token_id=0), batch_size=8, median=37.0) is None
    assert torch.equal(head.weight, weight)


def test_ties_keep_the_largest_alpha_and_the_median_reads_targets():
    value = torch.arange(1.0, 10.0, dtype=torch.float64)
    assert choose_alpha(value, value.clone(), 5.0)[0] == 1.0  # the model is exact
    assert choose_alpha(value, torch.full((9,), 5.0, dtype=torch.float64), 5.0)[0] == 1.0  # every blend the same
    docs = [Document(text=f"a {i} b {10 * i}", source="s", row=i, target_ordinal=1, target_value=10.0 * i)
            for i in range(1, 5)]
    assert training_median(docs, every_number=False) == 25.0
    assert training_median(docs, every_number=True) == pytest.approx(float(torch.tensor(
        [1.0, 2, 3, 4, 10, 20, 30, 40], dtype=torch.float64).quantile(0.5)))


def test_a_small_table_keeps_eight_rows_out_when_a_quarter_allows_it():
    def documents(count: int) -> list[Document]:
        return [Document(text=f"day {i}: {i}.", source="s", row=i, split_value=i, target_ordinal=1,
                         target_value=float(i)) for i in range(count)]

    config = SimpleNamespace(interval_check=0.1, split_by="day", seed=0, location_check=True)
    kept, check = keep_check_slice(config, documents(43))
    assert len(check) == 8 and len(kept) == 35
    assert min(doc.row for doc in check) > max(doc.row for doc in kept)  # the latest rows, by the split column
    assert len(keep_check_slice(config, documents(100))[1]) == 10  # the fraction alone when it is enough
    lines: list[str] = []
    assert keep_check_slice(config, documents(30), lines.append) == (documents(30), [])  # 8 of 30 pass a quarter
    assert lines == ["interval check: no slice kept out: 30 training documents are too few for 8 numbers in a "
                     "quarter of them; every row trains, and neither the locations nor the intervals are checked on "
                     "rows kept out (the interval floor stands in when the warm start scores 10 numbers or more)"]
    seeded = SimpleNamespace(interval_check=0.1, split_by=None, seed=0, location_check=True)
    assert len(keep_check_slice(seeded, documents(43))[1]) == 8


def test_seeded_checks_locations_only_on_a_slice_that_is_no_later_stretch():
    """``location_check: seeded`` runs on a seeded pick of the training rows and not on the latest rows of a split
    in time; true runs on both, false on neither."""
    documents = [Document(text=f"day {i}: {i}.", source="s", row=i, split_value=i, target_ordinal=1,
                          target_value=float(i)) for i in range(100)]
    for setting, on_seeded, on_later in (("seeded", True, False), (True, True, True), (False, False, False)):
        in_time = SimpleNamespace(interval_check=0.1, split_by="day", seed=0, location_check=setting)
        assert checks_locations(in_time, *keep_check_slice(in_time, documents)) is on_later
        seeded = SimpleNamespace(interval_check=0.1, split_by=None, seed=0, location_check=setting)
        assert checks_locations(seeded, *keep_check_slice(seeded, documents)) is on_seeded
