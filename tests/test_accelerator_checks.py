"""benchmarks/accelerator.py's checks (run on a GPU by hand), driven here on CPU with a small model in bf16: they pass
on the library as it is and report a broken standard decision."""

from __future__ import annotations

import copy

import pytest
import torch

from causal_qwen.core import decisions, generation, modeling
from causal_qwen import from_qwen

from .conftest import SMALL_NUM_ID, load_benchmark, small_qwen


@pytest.fixture(scope="module")
def checks():
    return load_benchmark("accelerator.py", "accelerator_checks")


@pytest.fixture(scope="module")
def bf16_model():
    model = from_qwen(small_qwen(tied=False), num_token_id=SMALL_NUM_ID, ovr_threshold=1.0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a non-constant scale, noise and per-token bias: the decisions depend on every term
        scale_weight = model.abduction.scale_net.weight
        scale_weight.copy_(torch.randn(scale_weight.shape, generator=generator) * 0.3)
        model.action.b_noise.copy_(torch.rand(model.action.b_noise.shape, generator=generator) * 0.5)
        model.action.classification_head.bias.copy_(torch.randn(model.config.vocab_size, generator=generator))
    return model.to(torch.bfloat16).eval()


def test_checks_pass_on_the_library(checks, bf16_model):
    ids, mask, values = checks.left_padded_prompts(bf16_model, "cpu")
    assert (ids == SMALL_NUM_ID).sum() == 1 and values.abs().sum() == 37.5
    exact = checks.standard_decisions_are_exact(bf16_model, ids, mask, values)
    assert exact["ok"] and exact["decisions"] == 3 * checks.NEW_TOKENS and exact["mismatches"] == 0
    assert 0.5 <= exact["float64_agreement"] <= 1.0
    causal = checks.causal_decisions_are_exact(bf16_model, ids, mask, values)
    assert set(causal) == set(generation.SCOPES) and all(scope["ok"] for scope in causal.values())
    fused = checks.fused_loss_matches(copy.deepcopy(bf16_model).float(), "cpu")
    assert fused["ok"] and fused["max_relative_difference"] < checks.FUSED_LOSS_TOLERANCE


def test_a_wrong_standard_decision_is_reported(checks, bf16_model, monkeypatch):
    """A generator whose standard decision is the runner-up of the exact rule is caught."""
    decide = decisions.decision_scores

    def runner_up(model, loc_U, scale_U, coordinates=None, temperature=1.0):
        scores, u = decide(model, loc_U, scale_U, coordinates, temperature)  # (B,S,V)
        return scores.scatter(-1, scores.argmax(-1, keepdim=True), -torch.inf), u

    monkeypatch.setattr(modeling, "decision_scores", runner_up)
    ids, mask, values = checks.left_padded_prompts(bf16_model, "cpu")
    exact = checks.standard_decisions_are_exact(bf16_model, ids, mask, values)
    assert not exact["ok"] and exact["mismatches"] == exact["decisions"]
