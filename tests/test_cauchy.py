"""Cauchy math against torch.distributions.Cauchy and scipy.stats.cauchy, plus properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from causal_qwen.core import cauchy

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


def test_log_prob_matches_torch_and_scipy():
    loc = torch.tensor([0.0, -3.0, 2.5, 100.0], dtype=torch.float64)
    scale = torch.tensor([1.0, 0.5, 7.0, 0.01], dtype=torch.float64)
    value = torch.tensor([0.3, 4.0, -2.0, 100.02], dtype=torch.float64)
    ours = cauchy.log_prob(value, loc, scale)
    torch.testing.assert_close(ours, torch.distributions.Cauchy(loc, scale).log_prob(value))
    np.testing.assert_allclose(ours.numpy(), stats.cauchy.logpdf(value.numpy(), loc.numpy(), scale.numpy()))
    torch.testing.assert_close(cauchy.nll(value, loc, scale), -ours)


def test_log_prob_stays_finite_far_in_the_tails_fp32():
    """A number far from a median whose scale is tiny (a row's 8-digit day number against a regression warm start
    that fitted the target alone: scale 2.7e-14) has a finite log-density and gradient in float32, equal to the
    float64 one, where ``z²`` would overflow."""
    value = torch.tensor([20200101.0, 50.3, 1e3])
    loc = torch.tensor([50.4, 50.4, 0.0], requires_grad=True)
    scale = torch.tensor([2.7e-14, 2.7e-14, 1e-3], requires_grad=True)
    ours = cauchy.log_prob(value, loc, scale)
    exact = cauchy.log_prob(value.double(), loc.detach().double(), scale.detach().double())
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours.double(), exact, rtol=1e-6, atol=0.0)
    ours.sum().backward()
    assert torch.isfinite(loc.grad).all() and torch.isfinite(scale.grad).all()


def test_ovr_probability_matches_survival_function():
    loc = torch.linspace(-50, 50, 41, dtype=torch.float64)
    scale = torch.full_like(loc, 3.0)
    threshold = 7.0
    expected = stats.cauchy.sf(threshold, loc.numpy(), scale.numpy())
    np.testing.assert_allclose(cauchy.ovr_probability(loc, scale, threshold).numpy(), expected, rtol=1e-12)
    torch_cdf = torch.distributions.Cauchy(loc, scale).cdf(torch.tensor(threshold, dtype=torch.float64))
    torch.testing.assert_close(cauchy.ovr_probability(loc, scale, threshold), 1 - torch_cdf)


def test_ovr_log_probs_are_stable_in_far_tails_fp32():
    z = torch.tensor([-1e6, -1e5, -1e3, 0.0, 1e3, 1e5, 1e6], dtype=torch.float32)
    log_p, log_not_p = cauchy.ovr_log_probs(z, torch.ones_like(z), 0.0)
    assert torch.isfinite(log_p).all() and torch.isfinite(log_not_p).all()
    exact_log_p = np.log(stats.cauchy.sf(0.0, z.double().numpy(), 1.0))
    exact_log_not_p = np.log(stats.cauchy.cdf(0.0, z.double().numpy(), 1.0))
    np.testing.assert_allclose(log_p.numpy(), exact_log_p, rtol=1e-5)
    np.testing.assert_allclose(log_not_p.numpy(), exact_log_not_p, rtol=1e-5)
    naive_p = (0.5 + torch.atan(z) / math.pi).double().numpy()
    ours_p = cauchy.ovr_probability(z, torch.ones_like(z), 0.0).double().numpy()
    exact_p = np.exp(exact_log_p)
    assert abs(naive_p[1] / exact_p[1] - 1) > 1e-4, "the naive form loses digits at z = -1e5"
    assert abs(ours_p[1] / exact_p[1] - 1) < 1e-6


def test_quantile_and_interval_match_scipy():
    loc, scale = torch.tensor([1.5], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    for q in (0.05, 0.25, 0.5, 0.9):
        assert cauchy.quantile(loc, scale, q).item() == pytest.approx(stats.cauchy.ppf(q, 1.5, 2.0))
    low, high = cauchy.central_interval(loc, scale, 0.9)
    assert (low.item(), high.item()) == pytest.approx(stats.cauchy.interval(0.9, 1.5, 2.0))
    with pytest.raises(ValueError, match="strictly between"):
        cauchy.quantile(loc, scale, 1.0)
    with pytest.raises(ValueError, match="coverage"):
        cauchy.central_interval(loc, scale, 0.0)


def test_sample_replays_with_fixed_epsilon_and_matches_quantile():
    loc, scale = torch.zeros(5), torch.ones(5)
    epsilon = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9])
    torch.testing.assert_close(cauchy.sample(loc, scale, epsilon), cauchy.quantile(loc, scale, epsilon))
    generator = torch.Generator().manual_seed(3)
    draws = cauchy.sample(torch.zeros(20000), torch.ones(20000), generator=generator)
    assert abs(draws.median().item()) < 0.05
    assert stats.kstest(draws.numpy(), "cauchy").pvalue > 1e-3


def test_inverse_softplus_is_exact_and_rejects_bad_values():
    for gamma in (1e-4, 0.5, 10.0, 40.0, 100.0):
        assert torch.nn.functional.softplus(torch.tensor(cauchy.inverse_softplus(gamma), dtype=torch.float64)).item() == pytest.approx(gamma, rel=1e-12)
    with pytest.raises(ValueError):
        cauchy.inverse_softplus(0.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), loc=finite, scale=positive)
def test_linear_closure_by_monte_carlo(seed, loc, scale):
    """W X + b for independent Cauchy components: quantiles of samples match the closed form."""
    generator = torch.Generator().manual_seed(seed)
    locs = torch.tensor([loc, -0.5 * loc, 1.0], dtype=torch.float64)
    scales = torch.tensor([scale, 1.0, 0.2 * scale + 0.1], dtype=torch.float64)
    weight = torch.randn(2, 3, generator=generator, dtype=torch.float64)
    bias = torch.randn(2, generator=generator, dtype=torch.float64)
    out_loc, out_scale = cauchy.linear_transform(locs, scales, weight, bias)
    samples = cauchy.sample(locs.expand(40000, 3), scales.expand(40000, 3), generator=generator)  # (M,3)
    mapped = samples @ weight.T + bias  # (M,2)
    for row in range(2):
        standardised = ((mapped[:, row] - out_loc[row]) / out_scale[row]).numpy()
        assert stats.kstest(standardised, "cauchy").pvalue > 1e-4


@settings(max_examples=40, deadline=None)
@given(a=finite, s=positive, b=finite, t=positive)
def test_sum_of_independent_cauchys(a, s, b, t):
    loc, scale = cauchy.add_independent(torch.tensor(a), torch.tensor(s), torch.tensor(b), torch.tensor(t))
    assert loc.item() == pytest.approx(a + b, abs=1e-3) and scale.item() == pytest.approx(s + t, rel=1e-5)
    generator = torch.Generator().manual_seed(int(abs(a * 1000)) % 2**31)
    draws = cauchy.sample(torch.full((20000,), a, dtype=torch.float64), torch.full((20000,), s, dtype=torch.float64), generator=generator)
    draws = draws + cauchy.sample(torch.full((20000,), b, dtype=torch.float64), torch.full((20000,), t, dtype=torch.float64), generator=generator)
    assert stats.kstest(((draws - (a + b)) / (s + t)).numpy(), "cauchy").pvalue > 1e-4


def test_decision_score_orders_like_probability_and_is_float32_for_bf16():
    loc = torch.tensor([3.0, -2.0, 0.5, 10.0], dtype=torch.float64)
    scale = torch.tensor([1.0, 0.5, 4.0, 20.0], dtype=torch.float64)
    threshold = torch.tensor([1.0, -3.0, 0.0, 2.0], dtype=torch.float64)
    z = cauchy.decision_score(loc, scale, threshold)
    torch.testing.assert_close(z, (loc - threshold) / scale)
    assert torch.equal(z.argsort(), cauchy.ovr_probability(loc, scale, threshold).argsort())
    # bf16 scores near a threshold of 100: the difference is taken in float32, never rounded to bf16's 0.5 steps.
    loc_bf16 = torch.tensor([0.0625, 0.125], dtype=torch.bfloat16)
    z_bf16 = cauchy.decision_score(loc_bf16, torch.ones(2, dtype=torch.bfloat16), 100.0)
    assert z_bf16.dtype == torch.float32
    assert z_bf16.tolist() == [0.0625 - 100.0, 0.125 - 100.0]
    assert (loc_bf16 - 100.0)[0] == (loc_bf16 - 100.0)[1], "bf16 itself cannot tell them apart"
    assert torch.isfinite(cauchy.decision_score(torch.ones(1), torch.zeros(1), 0.0)).all()


def test_interval_half_width_is_the_standard_cauchy_quantile():
    for p in (0.5, 0.8, 0.9, 0.99):
        assert cauchy.interval_half_width(p) == pytest.approx(stats.cauchy.ppf(0.5 + p / 2))
    assert cauchy.interval_half_width(0.5) == pytest.approx(1.0)
    for bad in (0.0, 1.0, -0.2, float("nan")):
        with pytest.raises(ValueError, match="coverage"):
            cauchy.interval_half_width(bad)
    with pytest.raises(TypeError, match="coverage"):
        cauchy.interval_half_width("0.9")


def test_abs_weight_is_reused_inside_a_scope_until_the_weight_changes():
    weight = torch.nn.Parameter(torch.randn(6, 3))
    with torch.no_grad():
        assert cauchy.abs_weight(weight) is not cauchy.abs_weight(weight), "no reuse outside a scope"
        with cauchy.reuse_abs_weights():
            first = cauchy.abs_weight(weight)
            with cauchy.reuse_abs_weights():
                assert cauchy.abs_weight(weight) is first, "reused while the weight is unchanged"
            assert cauchy.abs_weight(weight) is first, "an inner scope's end keeps the outer scope's copies"
            torch.testing.assert_close(first, weight.abs())
            weight.mul_(-2.0)  # in place: the version counter moves
            second = cauchy.abs_weight(weight)
            assert second is not first
            torch.testing.assert_close(second, weight.abs())
            with torch.inference_mode():
                third = cauchy.abs_weight(weight)
            assert third is second and not third.is_inference()
        assert cauchy.abs_weight(weight) is not second, "dropped when the scope ends"
    # With a gradient flowing into W, |W| is part of the graph (never a kept, detached copy).
    with cauchy.reuse_abs_weights():
        loc, scale = torch.zeros(2, 3), torch.ones(2, 3)
        _, out_scale = cauchy.linear_transform(loc, scale, weight)
        out_scale.sum().backward()
    torch.testing.assert_close(weight.grad, torch.sign(weight.detach()).expand(6, 3) * 2)


def test_scale_mle_recovers_the_scale_and_maximises_the_likelihood():
    generator = torch.Generator().manual_seed(0)
    draws = 2.5 * torch.tan(math.pi * (torch.rand(20000, generator=generator, dtype=torch.float64) - 0.5))
    assert cauchy.scale_mle(draws) == pytest.approx(2.5, rel=0.05)
    few = draws[:9]
    gamma = cauchy.scale_mle(few)
    likelihood = lambda g: float(cauchy.log_prob(few, torch.zeros(()), torch.tensor(g, dtype=torch.float64)).sum())  # noqa: E731
    assert likelihood(gamma) >= max(likelihood(gamma * 1.01), likelihood(gamma / 1.01))
    assert cauchy.scale_mle(torch.tensor([0.0, 0.0, 3.0])) == pytest.approx(1e-6)  # the root lies below the floor
    assert cauchy.scale_mle(torch.tensor([0.0, 0.0, 3.0]), minimum=1e-3) == pytest.approx(1e-3)
