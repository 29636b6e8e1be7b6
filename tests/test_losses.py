"""The model's loss against a direct transcription of docs/design.md, "Losses"; gradcheck; extreme values."""

from __future__ import annotations

import math

import pytest
import torch

from causal_qwen.core import losses
from causal_qwen import from_qwen

from .conftest import SMALL_NUM_ID, small_qwen


def transcribed_loss(out, model, labels, values, mask, alpha=0.0):
    """Loops and scalar formulas, as written in docs/design.md, "Losses" (no shared code with the model's loss)."""
    threshold = model.ovr_thresholds().double()
    cls_terms, reg_terms, n_valid, n_num = 0.0, 0.0, 0, 0
    batch, length = labels.shape
    for b in range(batch):
        for i in range(length - 1):
            target = labels[b, i + 1].item()
            if target == -100 or mask[b, i + 1] == 0 or mask[b, i] == 0:
                continue
            n_valid += 1
            loc, scale = out.loc_S[b, i].double(), out.scale_S[b, i].double()
            p = 0.5 + torch.atan((loc - threshold) / scale) / math.pi
            y = torch.zeros_like(p)
            y[target] = 1.0
            cls_terms += -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).sum()
            if target == model.config.num_token_id:
                n_num += 1
                gate = alpha + (1 - alpha) * p[target].detach()
                z = (values[b, i + 1].double() - out.loc_Y[b, i].double()) / out.scale_Y[b, i].double()
                reg_terms += gate * (torch.log(math.pi * out.scale_Y[b, i].double()) + torch.log1p(z * z))
    cls = cls_terms / n_valid
    reg = reg_terms / n_num if n_num else torch.tensor(0.0)
    return cls, reg


def batch_with_numbers(seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, SMALL_NUM_ID, (2, 9), generator=generator)
    values = torch.zeros(2, 9)
    for b, i, v in ((0, 3, 12.5), (0, 6, -0.25), (1, 2, 1e4)):
        ids[b, i] = SMALL_NUM_ID
        values[b, i] = v
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, -2:] = 0
    labels = ids.clone()
    labels[1, -2:] = -100
    labels[0, 5] = -100
    return ids, values, mask, labels


@pytest.mark.parametrize("implementation", ["reference", "fused"])
def test_loss_equals_transcription(implementation):
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_loss_implementation=implementation)
    with torch.no_grad():
        model.abduction.scale_net.weight.normal_(0, 0.05)
        model.action.regression_head.bias.fill_(3.0)
    ids, values, mask, labels = batch_with_numbers()
    out = model(ids, numeric_values=values, attention_mask=mask, labels=labels, return_scores=True)
    cls, reg = transcribed_loss(out, model, labels, values, mask)
    assert out.cls_loss.item() == pytest.approx(cls.item(), rel=1e-5)
    assert out.reg_loss.item() == pytest.approx(reg.item(), rel=1e-5)
    assert out.loss.item() == pytest.approx(cls.item() + reg.item(), rel=1e-5)
    assert out.num_targets.item() == 3


def test_mean_reduction_divides_by_vocabulary():
    kwargs = dict(num_token_id=SMALL_NUM_ID, ovr_loss_implementation="reference")
    summed = from_qwen(small_qwen(), **kwargs)
    meaned = from_qwen(small_qwen(), ovr_reduction="mean", **kwargs)
    ids, values, mask, labels = batch_with_numbers()
    a = summed(ids, numeric_values=values, attention_mask=mask, labels=labels).cls_loss
    b = meaned(ids, numeric_values=values, attention_mask=mask, labels=labels).cls_loss
    assert b.item() == pytest.approx(a.item() / summed.config.vocab_size, rel=1e-6)


def test_regression_gate_detached_by_default():
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID, ovr_loss_implementation="reference")
    ids, values, mask, labels = batch_with_numbers()
    out = model(ids, numeric_values=values, attention_mask=mask, labels=labels)
    grad = torch.autograd.grad(out.reg_loss, model.action.classification_head.bias, allow_unused=True)[0]
    assert grad is None or torch.all(grad == 0)
    model.config.detach_regression_gate = False
    out = model(ids, numeric_values=values, attention_mask=mask, labels=labels)
    grad = torch.autograd.grad(out.reg_loss, model.action.classification_head.bias)[0]
    assert grad[SMALL_NUM_ID] != 0


def test_gradcheck_through_head_and_loss_float64():
    model = from_qwen(
        small_qwen(vocab_size=40, hidden_size=8), num_token_id=30, ovr_loss_implementation="reference",
        ovr_threshold=2.0, initial_scale=1.0,
    ).double()
    features = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 30, 4, 30, 7]])
    values = torch.tensor([[0.0, 2.5, 0.0, -1.0, 0.0]], dtype=torch.float64)
    targets = losses.shift_targets(labels, values, None)

    def head_and_loss(z, w_cls, b_noise):
        loc_U, scale_U = model.abduction(z)
        loc_U = loc_U[:, :-1].reshape(-1, 8)[targets.positions]
        scale_U = scale_U[:, :-1].reshape(-1, 8)[targets.positions]
        s = scale_U + b_noise.abs()
        loc_S, scale_S = loc_U @ w_cls.T, s @ w_cls.abs().T
        cls = losses.ovr_bce_per_position(loc_S, scale_S, model.ovr_thresholds(), targets.token_ids).mean()
        loc_Y, scale_Y = model.action.regress(loc_U, scale_U)
        is_num = targets.token_ids == 30
        p_num = 0.5 + torch.atan((loc_S[:, 30] - 2.0) / scale_S[:, 30]) / math.pi
        # gradcheck differentiates numerically, so the gate must not be detached here
        return cls + losses.gated_regression_loss(loc_Y, scale_Y, targets.values, is_num, p_num, 0.0, False)

    w_cls = model.action.classification_head.weight.detach().clone().requires_grad_(True)
    b_noise = (torch.rand(8, dtype=torch.float64) + 0.1).requires_grad_(True)
    assert torch.autograd.gradcheck(head_and_loss, (features, w_cls, b_noise))


def test_no_inf_or_nan_with_extreme_ratios():
    loc = torch.tensor([[-1e8, 1e8, 0.0, 5e5, -1e6]], requires_grad=True)
    scale = torch.ones(1, 5, requires_grad=True)
    loss = losses.ovr_bce_per_position(loc, scale, torch.tensor(0.0), torch.tensor([1])).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(loc.grad).all() and torch.isfinite(scale.grad).all()
