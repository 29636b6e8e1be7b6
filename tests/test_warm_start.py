"""The regression head's warm start (`causal_qwen.training.warm_start`) on constructed inputs; the run through
`run_training` is in test_training.py."""

from __future__ import annotations

import pytest
import torch

from causal_qwen.training.warm_start import ridge_fit, warm_start_regression


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


def test_bad_ridge_and_data_without_numbers():
    from causal_qwen import CausalQwenForCausalLM
    from causal_qwen.training.collator import NumericCollator, TokenizedDataset

    from .conftest import SMALL_NUM_ID, small_qwen

    with pytest.raises(ValueError, match="ridge"):
        warm_start_regression(None, [], None, batch_size=1, ridge=0.0)
    model = CausalQwenForCausalLM.from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_calibration="none")
    before = model.action.regression_head.weight.clone()
    words = TokenizedDataset([{"input_ids": [5, 6, 7, 8], "numeric_values": [0.0] * 4}] * 3)
    assert warm_start_regression(model, words, NumericCollator(pad_token_id=0), batch_size=2) is None
    assert torch.equal(model.action.regression_head.weight, before)
    numbers = TokenizedDataset([{"input_ids": [5, SMALL_NUM_ID, 7, SMALL_NUM_ID], "numeric_values": [0.0, v, 0.0, 2 * v]}
                                for v in (1.0, 3.0, 4.0, 10.0)])
    report = warm_start_regression(model, numbers, NumericCollator(pad_token_id=0), batch_size=3)
    assert report is not None and report.numbers == 8
    assert not torch.equal(model.action.regression_head.weight, before)
