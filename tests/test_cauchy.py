"""Cauchy math against torch.distributions.Cauchy and scipy.stats.cauchy, plus properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from causal_qwen import cauchy

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
