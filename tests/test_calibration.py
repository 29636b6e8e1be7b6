"""The OvR calibration at conversion (`causal_qwen.conversion.calibration`): each step on constructed inputs,
then the whole conversion on a tiny random base. The figures on real Qwen2.5 weights are in test_real_weights.py."""

from __future__ import annotations

import math

import pytest
import torch

from causal_qwen.conversion import calibration
from causal_qwen.core import cauchy
from causal_qwen import from_qwen

from .conftest import SMALL_NUM_ID, byte_level_tokenizer, small_qwen


def test_row_dependent_scales_can_overturn_the_greedy_token_and_the_shared_token_noise_cannot():
    top_values = torch.tensor([[10.0, 9.0, 8.0], [20.0, 19.5, 3.0]])  # (N,K) descending
    top_ids = torch.tensor([[0, 1, 2], [3, 4, 5]])
    row_scales = torch.tensor([1.0, 5.0, 5.0, 3.0, 0.5, 3.0])  # ŝ_k: rows of very different size
    # with the whole scale row-dependent (ρ = 1), at a threshold above every logit the larger rows win (the runner-up
    # at the first position); at 9.5 the second position's runner-up, with a 6x smaller row, beats its top
    for threshold in (25.0, 9.5):
        assert calibration.standard_agreement(top_values, top_ids, calibration.decision_scales(row_scales, 1.0), threshold) == 0.5
    # with the calibration's share, the decision is the top logit at every threshold
    shared = calibration.decision_scales(row_scales, calibration.INDIVIDUAL_SHARE)
    for threshold in (25.0, 9.5, 0.0):
        assert calibration.standard_agreement(top_values, top_ids, shared, threshold) == 1.0


def test_relative_row_scales_average_one_over_the_tokens_near_the_top():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(400, 24, generator=generator)
    top_ids = torch.randint(0, 400, (256, 8), generator=generator)
    scales, kappa = calibration.relative_row_scales(weight, top_ids, block=64)
    assert torch.allclose(scales * kappa, weight.abs().sum(dim=1))
    assert math.isclose(float(scales[top_ids.reshape(-1)].mean()), 1.0, rel_tol=1e-5)


def test_level_candidates_keep_the_levels_few_logits_exceed():
    generator = torch.Generator().manual_seed(3)
    top_values = torch.randn(200, 16, generator=generator).sort(dim=1, descending=True).values  # (N,K)
    levels = calibration.level_candidates(top_values, max_mean_count=1.0)
    assert levels == sorted(levels) and len(levels) >= 1
    for level in levels:
        assert float((top_values > level).sum(dim=1).float().mean()) <= 1.0
    highest = float(torch.quantile(top_values[:, 0], 0.98))
    fallback = calibration.level_candidates(top_values, max_mean_count=-1.0)  # none qualifies: the highest quantile
    assert len(fallback) == 1 and math.isclose(fallback[0], highest, rel_tol=1e-6)


def test_ovr_figures_equal_the_definition():
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(6, 5, generator=generator)
    weight = torch.randn(9, 5, generator=generator)
    targets = torch.randint(0, 9, (6,), generator=generator)
    scales = torch.rand(9, generator=generator) + 0.5
    level, sigma, margin = 0.3, 0.7, 1.0
    logits = features @ weight.T
    got = calibration.ovr_figures(logits, targets, scales, [(level, sigma, margin), (0.0, 0.1, 0.0)])
    p = cauchy.ovr_probability(logits.double(), (sigma * scales).double(), torch.tensor(level - margin * sigma).double())
    expected_nll = (p.sum(-1).log() - p.gather(1, targets[:, None])[:, 0].log()).mean()
    assert math.isclose(float(got["prob_sum"][0]), float(p.sum(-1).mean()), rel_tol=1e-5)
    assert math.isclose(float(got["ovr_nll"][0]), float(expected_nll), rel_tol=1e-5)
    assert math.isclose(float(got["softmax_nll"]), float(torch.nn.functional.cross_entropy(logits, targets)), rel_tol=1e-5)


@pytest.mark.parametrize("kind", ["per_token", "scalar"])
def test_calibrated_conversion_is_exact_deterministic_and_sparse(kind, monkeypatch):
    def convert():
        monkeypatch.setattr(calibration, "_MEMO", {})  # each conversion calibrates anew
        return from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_threshold_kind=kind,
                                               calibration_positions=256)

    model, again = convert(), convert()
    ids = torch.randint(0, 400, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=ids)
        logits = small_qwen()(input_ids=ids).logits
    assert torch.equal(out.loc_S, logits)  # the calibration never moves loc_S
    assert torch.equal(model.ovr_thresholds.values, again.ovr_thresholds.values)
    assert torch.equal(model.abduction.scale_net.bias, again.abduction.scale_net.bias)
    assert torch.equal(model.action.b_noise, again.action.b_noise)
    assert torch.equal(model.action.token_noise, again.action.token_noise)
    assert bool((model.abduction.scale_net.weight == 0).all())
    # the shared token noise holds all but ρ of every token's decision scale: the standard decision is the greedy token
    with torch.no_grad():
        scale_S = out.scale_S  # (B,S,V)
        row_part = scale_S - model.action.token_noise_scale()
        assert float(model.action.token_noise_scale().detach()) > 0
        assert float((row_part / scale_S).max()) < 10 * calibration.INDIVIDUAL_SHARE
        standard = ((out.loc_S - model.ovr_thresholds()) / scale_S).argmax(-1)
    assert torch.equal(standard, logits.argmax(-1))
    assert model.ovr_thresholds.values.numel() == (model.config.vocab_size if kind == "per_token" else 1)
    with torch.no_grad():
        prob_sum = model.ovr_probabilities(out.loc_S, out.scale_S).sum(-1)  # (B,S)
    assert float(prob_sum.mean()) < 5 * calibration.MAX_PROB_SUM  # sparse, not ~0.3 for every token


def test_ovr_figures_skip_only_settings_that_must_exceed_the_limit():
    """At one threshold the sum over the tokens below it grows with σ and those above add at most one each: the
    settings after the first whose sum exceeds the limit by more than that count are not computed (inf); the
    computed ones equal a run without a limit, and the choice is the same."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(7, 40, generator=generator) * 3
    targets = torch.randint(0, 40, (7,), generator=generator)
    scales = torch.rand(40, generator=generator) + 0.5
    exponents = (0, -3, -1, -2, -4, 1)
    grid = [(6.0, 10.0**e, 0.0) for e in exponents]  # one threshold, σ out of order
    full = calibration.ovr_figures(logits, targets, scales, grid)
    assert torch.isfinite(full["prob_sum"]).all() and torch.isfinite(full["ovr_nll"]).all()
    limit = 1.0  # sums 0.71 to 0.98 for σ ≤ 0.1, 3.2 at σ = 1 (0.71 logits above t on average), 12.9 at 10
    limited = calibration.ovr_figures(logits, targets, scales, grid, max_prob_sum=limit)
    computed = torch.isfinite(limited["prob_sum"])
    assert 0 < int(computed.sum()) < len(grid)  # some skipped, and only the largest σ
    largest_computed = max(exponents[g] for g in range(len(grid)) if computed[g])
    assert all(bool(computed[g]) == (exponents[g] <= largest_computed) for g in range(len(grid)))
    assert bool((full["prob_sum"][~computed] > limit).all())  # what was skipped was above the limit indeed
    assert torch.equal(limited["prob_sum"][computed], full["prob_sum"][computed])
    assert torch.equal(limited["ovr_nll"][computed], full["ovr_nll"][computed])
    assert calibration.choose_scale(limited["prob_sum"], limited["ovr_nll"], limit) == calibration.choose_scale(
        full["prob_sum"], full["ovr_nll"], limit
    )


def test_count_above_reads_the_top_logits_and_the_whole_row_when_they_all_exceed(monkeypatch):
    """The mean count of logits at or above ``t`` equals a count over every logit, for thresholds that the
    kept top logits answer and for ones that some row exceeds with more logits than are kept."""
    monkeypatch.setattr(calibration, "ABOVE_TOP", 4)
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(5, 30, generator=generator)
    logits[2] += 3.0  # one row whose logits all sit high: at t = 1 more than 4 of them exceed
    count_above = calibration._AboveCounter(logits)
    for threshold in (-1.0, 0.0, 1.0, 2.5, 10.0):
        expected = float((logits >= threshold).sum(dim=-1).double().mean())
        assert count_above(threshold) == expected, threshold
    assert int((logits[2] >= 1.0).sum()) > 4


def test_a_base_object_is_calibrated_once_per_weights_and_tokenizer(monkeypatch):
    """Converting the same small base object again reuses its calibration; other weights, another tokenizer or
    another seed calibrate anew."""
    from causal_qwen.conversion import conversion

    fits = []
    fit = calibration._fit
    monkeypatch.setattr(calibration, "_MEMO", {})
    monkeypatch.setattr(calibration, "_fit", lambda *args: fits.append(1) or fit(*args))

    def convert(base, **overrides):
        return from_qwen(base, num_token_id=SMALL_NUM_ID, calibration_positions=256, **overrides)

    first = convert(small_qwen())
    again = convert(small_qwen())
    assert len(fits) == 1
    assert torch.equal(first.ovr_thresholds.values, again.ovr_thresholds.values)
    assert torch.equal(first.action.token_noise, again.action.token_noise)
    convert(small_qwen(seed=1))
    assert len(fits) == 2
    convert(small_qwen(), seed=3)
    assert len(fits) == 3
    tokenizer = byte_level_tokenizer()
    assert calibration.tokenizer_fingerprint(tokenizer) != calibration.tokenizer_fingerprint(None)
    base = small_qwen()
    assert conversion.weights_fingerprint(base, 10**9) == conversion.weights_fingerprint(small_qwen(), 10**9)
    with torch.no_grad():
        base.lm_head.weight[0, 0] += 1e-3
    assert conversion.weights_fingerprint(base, 10**9) != conversion.weights_fingerprint(small_qwen(), 10**9)
    assert conversion.weights_fingerprint(base, 10) is None  # too large to hash: not memoised


@pytest.mark.parametrize("margin", [0.0, -2.0, 2.0])
def test_angle_sums_by_tail_series_equal_the_definition(margin, monkeypatch):
    """``Σ_k atan2(σ r_k, t − l_k)`` with each position's top logits exact and the rest by the power series
    equals the sum of every angle to 1e-6, for small σ (every position by the series), for large σ (every
    position exactly) and for a σ where only some positions are near enough to their tail."""
    from causal_qwen.conversion import angle_sums

    monkeypatch.setattr(angle_sums, "EXACT_TOP", 8)
    generator = torch.Generator().manual_seed(6)
    logits = torch.randn(12, 3000, generator=generator) * 2.0  # (N,V)
    logits[:6, :3] += 6.0  # half the positions have three logits far above the rest
    scales = 1.0 + 1e-3 * torch.rand(3000, generator=generator)  # (V,) near 1, as the calibration's
    level = float(logits.max(dim=-1).values.median())
    sums = angle_sums.AngleSums(logits, scales)
    tail_gap = level - sums.tail_max  # (N,) each position's narrowest gap below the level
    mixed = float(tail_gap.median()) / (angle_sums.TAIL_GAP * (float(scales.max()) + abs(margin)))
    used_series = []
    for sigma in (1e-6, 1e-3, mixed, 1.0):
        used_series.append(int((tail_gap >= angle_sums.TAIL_GAP * sigma * (float(scales.max()) + abs(margin))).sum()))
        threshold = level - margin * sigma
        # every angle by definition in float32, as the whole-row passes compute them (t − l_k rounds alike)
        expected = torch.atan2(sigma * scales, threshold - logits).double().sum(dim=-1)  # (N,)
        got = sums(level, sigma, margin)
        assert torch.allclose(got, expected, rtol=1e-6, atol=0), (sigma, (got / expected - 1).abs().max())
    assert used_series[0] == 12 and used_series[-1] == 0 and 0 < used_series[2] < 12, used_series
