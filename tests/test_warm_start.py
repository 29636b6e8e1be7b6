"""The regression head's warm start (`causal_qwen.training.warm_start`) on constructed inputs; the run through
`run_training` is in test_training.py."""

from __future__ import annotations

import pytest
import torch

from causal_qwen.training.warm_start import forward_residuals, out_of_fold_residuals, ridge_fit, warm_start_regression
from causal_qwen import from_qwen


def test_ridge_fit_recovers_a_linear_rule_and_shrinks_with_the_ridge():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(200, 6, generator=generator, dtype=torch.float64) * 40 + 5  # large, off-centre features
    weight = torch.tensor([0.5, -1.0, 0.0, 2.0, 0.1, -0.3], dtype=torch.float64)
    values = features @ weight + 7.0
    fitted, bias = ridge_fit(features, values, 1e-10)
    torch.testing.assert_close(fitted, weight, rtol=1e-6, atol=1e-6)
    assert float(bias) == pytest.approx(7.0, abs=1e-5)
    shrunk, _ = ridge_fit(features, values, 10.0)
    assert float(shrunk.norm()) < 0.5 * float(weight.norm())


def test_out_of_fold_scale_is_wider_than_in_sample_on_a_drifting_series():
    """A series whose level drifts with time, read through features that hold the time only coarsely: the ridge
    fit absorbs part of the drift in sample, so its residuals are optimistic; each contiguous block predicted from
    the other periods misses the drift the way a later period will, and the out-of-fold spread is wider."""
    generator = torch.Generator().manual_seed(1)
    count = 400
    time = torch.linspace(0, 1, count, dtype=torch.float64)  # (M,)
    features = torch.stack([torch.sin(7 * time), torch.cos(5 * time), torch.randn(count, generator=generator,
                                                                                  dtype=torch.float64)], dim=1)
    values = 20 * time**2 + features[:, 2] + 0.5 * torch.randn(count, generator=generator, dtype=torch.float64)
    weight, bias = ridge_fit(features, values, 1e-6)
    in_sample = float((features @ weight + bias - values).abs().median())
    out_of_fold = float(out_of_fold_residuals(features, values, 1e-6).abs().median())
    assert out_of_fold > 1.5 * in_sample
    # without drift the two agree (the out-of-fold residuals are honest, not inflated)
    steady = features[:, 2] * 2 + 0.5 * torch.randn(count, generator=generator, dtype=torch.float64)
    weight, bias = ridge_fit(features, steady, 1e-6)
    steady_in = float((features @ weight + bias - steady).abs().median())
    assert float(out_of_fold_residuals(features, steady, 1e-6).abs().median()) == pytest.approx(steady_in, rel=0.15)


def test_forward_residuals_predict_each_block_from_the_blocks_before_it():
    """Blocks 2..5 of the data's order, each from the fit to the blocks before it only. On a rising series whose
    features do not hold the time that forecaster falls short of every later block, as a forecast of a later
    period does (the symmetric residuals, whose blocks are predicted from later periods too, miss on both sides);
    without drift the two agree."""
    generator = torch.Generator().manual_seed(2)
    count = 400
    time = torch.linspace(0, 1, count, dtype=torch.float64)  # (M,)
    features = torch.randn(count, 3, generator=generator, dtype=torch.float64)  # (M,3) no trace of the time
    noise = 0.5 * torch.randn(count, generator=generator, dtype=torch.float64)
    drifting = 20 * time + features[:, 0] + noise
    forward = forward_residuals(features, drifting, 1e-6)
    assert forward is not None and forward.shape == (count - 80,)  # block 1 has no past
    weight, bias = ridge_fit(features[:160], drifting[:160], 1e-6)  # block 3 from blocks 1 and 2
    torch.testing.assert_close(forward[80:160], features[160:240] @ weight + bias - drifting[160:240])
    assert float((forward < 0).double().mean()) > 0.9  # ŷ − y: below the rising level
    symmetric = out_of_fold_residuals(features, drifting, 1e-6)  # (M,)
    assert 0.3 < float((symmetric < 0).double().mean()) < 0.7
    steady = features[:, 0] + noise
    steady_forward = float(forward_residuals(features, steady, 1e-6).abs().median())
    assert steady_forward == pytest.approx(float(out_of_fold_residuals(features, steady, 1e-6).abs().median()), rel=0.15)
    assert forward_residuals(features[:9], steady[:9], 1e-6) is None  # fewer than 2·FOLDS numbers


def test_bad_ridge_and_data_without_numbers():
    from causal_qwen.training.collator import NumericCollator, TokenizedDataset

    from .conftest import SMALL_NUM_ID, small_qwen

    with pytest.raises(ValueError, match="ridge"):
        warm_start_regression(None, [], None, batch_size=1, ridge=0.0)
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none")
    before = model.action.regression_head.weight.clone()
    words = TokenizedDataset([{"input_ids": [5, 6, 7, 8], "numeric_values": [0.0] * 4}] * 3)
    assert warm_start_regression(model, words, NumericCollator(pad_token_id=0), batch_size=2) is None
    assert torch.equal(model.action.regression_head.weight, before)
    numbers = TokenizedDataset([{"input_ids": [5, SMALL_NUM_ID, 7, SMALL_NUM_ID], "numeric_values": [0.0, v, 0.0, 2 * v]}
                                for v in (1.0, 3.0, 4.0, 10.0)])
    report = warm_start_regression(model, numbers, NumericCollator(pad_token_id=0), batch_size=3)
    assert report is not None and report.numbers == 8
    assert not torch.equal(model.action.regression_head.weight, before)


def _logistic_objective(features, offsets, labels, weight, bias, ridge):
    """The penalised objective of `offset_logistic_fit`, written out again."""
    logits = features @ weight + bias - offsets
    penalty = ridge * (weight * features.std(dim=0, unbiased=False)).square().sum()
    return (torch.nn.functional.softplus(logits) - labels.double() * logits).mean() + penalty


def test_offset_logistic_fit_is_the_penalised_optimum_and_recovers_a_rule():
    from causal_qwen.training.warm_start import offset_logistic_fit, offset_logistic_nats

    generator = torch.Generator().manual_seed(1)
    features = torch.randn(4000, 5, generator=generator, dtype=torch.float64) * torch.tensor([30.0, 1, 5, 0.1, 2]) + 3
    offsets = torch.randn(4000, generator=generator, dtype=torch.float64) * 4 + 10  # the other rows' log partition
    true_weight = torch.tensor([0.05, -1.0, 0.3, 4.0, 0.0], dtype=torch.float64)
    logits = features @ true_weight + 9.0 - offsets
    labels = torch.rand(4000, generator=generator, dtype=torch.float64) < torch.sigmoid(logits)
    weight, bias = offset_logistic_fit(features, offsets, labels, 1e-8)
    torch.testing.assert_close(weight, true_weight, rtol=0.15, atol=0.15)
    fitted_logits = features @ weight + bias - offsets
    assert float((fitted_logits - logits).abs().median()) < 0.5
    # the optimum of the penalised objective: no small step in any direction lowers it
    ridge = 1e-2
    weight, bias = offset_logistic_fit(features, offsets, labels, ridge)
    best = float(_logistic_objective(features, offsets, labels, weight, bias, ridge))
    unit = torch.cat([features.std(dim=0, unbiased=False), torch.ones(1, dtype=torch.float64)])  # (6,) w then b
    for direction in torch.eye(6, dtype=torch.float64):
        for sign in (1.0, -1.0):
            step = sign * 1e-3 * direction / unit
            moved = float(_logistic_objective(features, offsets, labels, weight + step[:5], bias + step[5], ridge))
            assert moved >= best - 1e-12
    assert offset_logistic_nats(features, offsets, labels, weight, bias) < offset_logistic_nats(
        features, offsets, labels, torch.zeros(5, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))


def test_rest_log_partition_leaves_out_the_num_row():
    from causal_qwen.training.warm_start import rest_log_partition

    head = torch.nn.Linear(6, 40)
    loc_U = torch.randn(7, 6)
    logits = head(loc_U).double()  # (7,40)
    expected = torch.logsumexp(torch.cat([logits[:, :13], logits[:, 14:]], dim=1), dim=1)
    torch.testing.assert_close(rest_log_partition(head, loc_U, 13), expected, rtol=1e-6, atol=1e-6)


def test_num_token_warm_start_fits_the_num_row_alone_and_the_softmax_follows_it():
    """After the start the model's own softmax over ``loc_S`` gives ``P(<NUM>) = σ(w·x + b − L)``: higher where a
    number follows than the converted row's, and every other row of the head (so every other token's ``loc_S``)
    unchanged."""
    from causal_qwen.training.collator import NumericCollator, TokenizedDataset
    from causal_qwen.training.warm_start import warm_start

    from .conftest import SMALL_NUM_ID, small_qwen

    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none").eval()
    dataset = TokenizedDataset([{"input_ids": [5, 9, SMALL_NUM_ID, 7, 11, 9, SMALL_NUM_ID, 8],
                                 "numeric_values": [0.0, 0.0, v, 0.0, 0.0, 0.0, 2 * v, 0.0]}
                                for v in (1.0, 3.0, 4.0, 10.0, -2.5, 0.5)])
    batch = NumericCollator(pad_token_id=0)([dataset[i] for i in range(len(dataset))])

    def num_log_probs() -> torch.Tensor:
        with torch.no_grad():
            loc_S = model(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"]).loc_S  # (B,S,V)
        return torch.log_softmax(loc_S[:, :-1].double(), dim=-1)[..., SMALL_NUM_ID]  # (B,S-1)

    head = model.action.classification_head
    before_weight, before_bias = head.weight.detach().clone(), head.bias.detach().clone()
    before = num_log_probs()
    reports = warm_start(model, dataset, NumericCollator(pad_token_id=0), batch_size=4, num_token_ridge=1e-3)
    assert reports["regression"] is None
    report = reports["num_token"]
    assert report.positions == 6 * 7 and report.numbers == 12
    assert report.nats_after < report.nats_before
    after = num_log_probs()
    follows_number = batch["input_ids"][:, 1:] == SMALL_NUM_ID  # (B,S-1)
    assert float(after[follows_number].mean()) > float(before[follows_number].mean()) + 1.0
    assert float(after[follows_number].exp().min()) > 0.5  # "token 9 before <NUM>" is learnable from the features
    others = torch.arange(head.weight.shape[0]) != SMALL_NUM_ID
    assert torch.equal(head.weight[others], before_weight[others])
    assert torch.equal(head.bias[others], before_bias[others])
    assert not torch.equal(head.weight[SMALL_NUM_ID], before_weight[SMALL_NUM_ID])
    # numbers only after the positions the token fit reads: the row is left alone, and the user is told
    said: list[str] = []
    kept = head.weight[SMALL_NUM_ID].detach().clone()
    reports = warm_start(model, dataset, NumericCollator(pad_token_id=0), batch_size=4, num_token_ridge=1e-3,
                         max_positions=1, progress=said.append)  # "5 -> 9" only
    assert reports["num_token"] is None and torch.equal(head.weight[SMALL_NUM_ID], kept)
    assert any("no number follows any of the 1 positions read" in line for line in said), said
    with pytest.raises(ValueError, match="<NUM> token warm start"):
        warm_start(model, dataset, NumericCollator(pad_token_id=0), batch_size=4, num_token_ridge=float("nan"))


def test_auto_ridge_is_weak_for_features_that_predict_and_strong_for_noise():
    """``regression_warm_start: auto`` picks the relative ridge by the out-of-fold error (one-standard-error rule):
    a linear rule in the features is read out with a weak ridge; features unrelated to the numbers give way to a
    strong ridge (toward the training mean), whose out-of-fold error is then no worse than the mean's."""
    from causal_qwen.training.warm_start import RIDGE_GRID, choose_ridge

    generator = torch.Generator().manual_seed(3)
    features = torch.randn(300, 20, generator=generator, dtype=torch.float64)
    rule = features @ torch.linspace(-1, 1, 20, dtype=torch.float64) + 0.05 * torch.randn(300, generator=generator,
                                                                                          dtype=torch.float64)
    ridge, table = choose_ridge(features, rule)
    assert ridge <= 1e-2 and set(table) == {f"{value:g}" for value in RIDGE_GRID}
    assert table[f"{ridge:g}"] <= 1.1 * min(table.values())  # within a standard error of the best
    noise = torch.randn(300, generator=generator, dtype=torch.float64) * 5 + 40
    ridge, table = choose_ridge(features[:, :20], noise)
    assert ridge >= 10
    mean_error = float((noise - noise.mean()).abs().median())
    assert table[f"{ridge:g}"] <= 1.1 * mean_error
    assert choose_ridge(features[:5], noise[:5]) == (1.0, {})  # too few numbers to choose by: the fallback


def test_auto_ridge_is_chosen_on_the_scored_numbers():
    """With ``scored`` (the documents' targets), ``e(λ)`` is each block's median absolute out-of-fold residual over
    the scored numbers alone, averaged over the blocks, while every fit still reads every number: numbers the
    features give exactly (a date's day in the same sentence) no longer make the error the ridge is chosen by."""
    from causal_qwen.training.warm_start import FOLDS, RIDGE_GRID, choose_ridge, out_of_fold_residuals

    generator = torch.Generator().manual_seed(5)
    features = torch.randn(400, 20, generator=generator, dtype=torch.float64)
    values = features @ torch.linspace(-1, 1, 20, dtype=torch.float64)  # (M,) a rule the features give exactly
    scored = torch.arange(400) % 4 == 0  # every fourth number is a target …
    values[scored] += 3 * torch.randn(int(scored.sum()), generator=generator, dtype=torch.float64)  # … with noise
    _, every = choose_ridge(features, values)
    _, table = choose_ridge(features, values, scored=scored)
    for ridge in RIDGE_GRID:
        residuals = out_of_fold_residuals(features, values, ridge).abs()  # (M,) fits to every number
        blocks = residuals.reshape(FOLDS, -1)
        expected = torch.stack([block[mask].median() for block, mask in zip(blocks, scored.reshape(FOLDS, -1))])
        assert table[f"{ridge:g}"] == pytest.approx(float(expected.mean()), rel=1e-12)
        assert every[f"{ridge:g}"] == pytest.approx(float(blocks.median(dim=1).values.mean()), rel=1e-12)
    assert table["0.01"] > 2 * every["0.01"]  # the targets' error, not the exact numbers'
    assert choose_ridge(features, values, scored=torch.arange(400) < 9) == (1.0, {})  # 9 targets: the fallback


def test_auto_is_a_valid_regression_warm_start_only():
    from causal_qwen.training.train_config import TrainConfig

    TrainConfig(model="random:tiny", data="x.jsonl", regression_warm_start="auto").validate("test")
    with pytest.raises(ValueError, match="regression_warm_start"):
        TrainConfig(model="random:tiny", data="x.jsonl", regression_warm_start="strong").validate("test")
    with pytest.raises(ValueError, match="num_token_warm_start"):
        TrainConfig(model="random:tiny", data="x.jsonl", num_token_warm_start="auto").validate("test")


def test_out_of_fold_blocks_are_periods_for_a_time_split_and_random_fifths_otherwise():
    """Rows grouped in the file (one symbol after another) are put in date order for a split by date, so each
    out-of-fold block is a period; with a split column every training row shares (a fold), a seeded shuffle."""
    from causal_qwen.training.data import Document
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.readout_steps import out_of_fold_order

    dates = ["Mar 1 2001", "Jan 1 2000", "Feb 1 2000", "Jan 1 2001", "Dec 1 2000"]  # a date format, not text order
    docs = [Document(text=f"{symbol} {date}", source="f", row=i, split_value=date)
            for i, (symbol, date) in enumerate((s, d) for s in ("A", "B") for d in dates)]
    config = TrainConfig(model="random:tiny", data="x.jsonl", split_by="date", split_at="Jan 1 2002")
    ordered = out_of_fold_order(config, docs)
    assert [doc.split_value for doc in ordered][::2] == ["Jan 1 2000", "Feb 1 2000", "Dec 1 2000", "Jan 1 2001",
                                                         "Mar 1 2001"]
    assert [doc.text for doc in ordered][:2] == ["A Jan 1 2000", "B Jan 1 2000"]  # stable within a date
    folds = [Document(text=str(i), source="f", row=i, split_value=0) for i in range(40)]
    fold_config = TrainConfig(model="random:tiny", data="x.jsonl", split_by="fold", split_at=1, seed=3)
    shuffled = out_of_fold_order(fold_config, folds)
    assert sorted(doc.row for doc in shuffled) == list(range(40)) and [d.row for d in shuffled] != list(range(40))
    assert [d.row for d in out_of_fold_order(fold_config, folds)] == [d.row for d in shuffled]  # seeded


def test_the_fit_reads_the_targets_when_every_document_names_one():
    """Documents ``w <NUM>=miles w <NUM>=gas``: miles in the thousands, gas a few units, the gas the target. A
    squared error over every number is ruled by the miles, so a fit to both misses the gas by far more than its
    spread; fitted to the targets, the read-out predicts the gas within its spread, and the report says so."""
    from causal_qwen.training.collator import NumericCollator, TokenizedDataset

    from .conftest import SMALL_NUM_ID, small_qwen

    generator = torch.Generator().manual_seed(3)
    miles = (6000 + 1500 * torch.randn(40, generator=generator, dtype=torch.float64)).tolist()
    gas = (2 + 0.3 * torch.randn(40, generator=generator, dtype=torch.float64)).tolist()
    documents = TokenizedDataset([{"input_ids": [5, SMALL_NUM_ID, 7, SMALL_NUM_ID], "numeric_values": [0.0, m, 0.0, g]}
                                  for m, g in zip(miles, gas)])
    collator = NumericCollator(pad_token_id=0)

    def gas_error(target_ordinals):
        model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none")
        report = warm_start_regression(model, documents, collator, batch_size=8, ridge=1.0,
                                       target_ordinals=target_ordinals)
        batch = collator([documents[i] for i in range(len(documents))])
        with torch.no_grad():
            loc = model(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"],
                        attention_mask=batch["attention_mask"]).loc_Y[:, 2].double()  # (D,) predicts the gas
        return report, float((loc - torch.tensor(gas, dtype=torch.float64)).abs().median())

    every, every_error = gas_error(None)
    targets, target_error = gas_error([1] * len(documents))
    assert every.numbers == every.scored == 80 and targets.numbers == 80 and targets.scored == 40
    assert every_error > 100 * 0.3  # the miles' scale
    assert target_error < 0.3  # within the gas's own spread (its median absolute deviation is 0.2)
