"""The OvR calibration at conversion (`causal_qwen.conversion.calibration`): each step on constructed inputs,
then the whole conversion on a tiny random base. The figures on real Qwen2.5 weights are in test_real_weights.py."""

from __future__ import annotations

import math

import pytest
import torch

from causal_qwen.conversion import calibration
from causal_qwen.core import cauchy
from causal_qwen.core.modeling import CausalQwenForCausalLM

from .conftest import SMALL_NUM_ID, small_qwen


def test_flat_profile_evens_out_the_row_scales_of_the_tokens_near_the_top():
    generator = torch.Generator().manual_seed(0)
    vocab, causal = 400, 24
    # rows whose magnitude sits in different components: plain row norms differ by up to ~3x
    weight = torch.randn(vocab, causal, generator=generator)
    weight[: vocab // 2, : causal // 2] *= 6  # half the rows are large in the first half of the components
    top_ids = torch.randint(0, vocab, (256, 8), generator=generator)
    seen = top_ids.unique()
    plain = weight.abs().sum(dim=1)[seen].log().std()
    profile = calibration.flat_profile(weight, top_ids)
    assert profile.shape == (causal,) and bool((profile > 0).all())
    scales, kappa = calibration.relative_row_scales(weight, profile, top_ids)
    assert scales.shape == (vocab,) and kappa > 0
    assert float(scales[seen].log().std()) < 0.5 * float(plain)
    assert torch.allclose(calibration.flat_profile(weight, top_ids), profile)  # deterministic


def test_level_above_the_runner_up_gives_the_top_token_whatever_the_row_scales():
    top_values = torch.tensor([[10.0, 9.0, 8.0], [20.0, 19.5, 3.0]])  # (N,K) descending
    top_ids = torch.tensor([[0, 1, 2], [3, 4, 5]])
    row_scales = torch.tensor([1.0, 5.0, 5.0, 3.0, 0.5, 3.0])
    # above every logit the larger rows win (the runner-up at the first position, the top at the second); at 9.5 the first position's top is the only token above it (it
    # wins), the second position's runner-up has a 6x smaller row and is above it too (it wins)
    assert calibration.standard_agreement(top_values, top_ids, row_scales, 25.0) == 0.5
    assert calibration.standard_agreement(top_values, top_ids, row_scales, 9.5) == 0.5
    level, agreement = calibration.choose_level(top_values, top_ids, row_scales)
    quantiles = torch.quantile(top_values[:, 0], torch.linspace(0.02, 0.98, calibration.LEVEL_CANDIDATES))
    best = max(calibration.standard_agreement(top_values, top_ids, row_scales, float(x)) for x in quantiles)
    assert agreement == calibration.standard_agreement(top_values, top_ids, row_scales, level) == best


def test_ovr_figures_equal_the_definition():
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(6, 5, generator=generator)
    weight = torch.randn(9, 5, generator=generator)
    targets = torch.randint(0, 9, (6,), generator=generator)
    row_scales = torch.rand(9, generator=generator) + 0.5
    level, sigma, margin = 0.3, 0.7, 1.0
    got = calibration.ovr_figures(features, targets, weight, None, row_scales, level, [(sigma, margin)])
    logits = features @ weight.T
    p = cauchy.ovr_probability(logits.double(), (sigma * row_scales).double(), (level - margin * sigma * row_scales).double())
    expected_nll = (p.sum(-1).log() - p.gather(1, targets[:, None])[:, 0].log()).mean()
    assert math.isclose(float(got["prob_sum"][0]), float(p.sum(-1).mean()), rel_tol=1e-5)
    assert math.isclose(float(got["ovr_nll"][0]), float(expected_nll), rel_tol=1e-5)
    assert math.isclose(float(got["softmax_nll"]), float(torch.nn.functional.cross_entropy(logits, targets)), rel_tol=1e-5)


@pytest.mark.parametrize("kind", ["per_token", "scalar"])
def test_calibrated_conversion_is_exact_deterministic_and_sparse(kind):
    def convert():
        return CausalQwenForCausalLM.from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_threshold_kind=kind,
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
    assert bool((model.abduction.scale_net.weight == 0).all())
    assert model.ovr_thresholds.values.numel() == (model.config.vocab_size if kind == "per_token" else 1)
    with torch.no_grad():
        prob_sum = model.ovr_probabilities(out.loc_S, out.scale_S).sum(-1)  # (B,S)
    assert float(prob_sum.mean()) < 5 * calibration.MAX_PROB_SUM  # sparse, not ~0.3 for every token
