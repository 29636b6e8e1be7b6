"""The fused, vocabulary-chunked OvR head + loss against the (N, V) reference; gradcheck; sampled negatives.

Shape legend: N positions, C causal size, V vocabulary rows.
"""

from __future__ import annotations

import math

import pytest
import torch

from causal_qwen.core import fused_ovr, losses
from causal_qwen.core.fused_ovr import (
    fused_ovr_loss,
    model_classification_loss,
    reference_ovr_loss,
    sample_negative_rows,
)
from causal_qwen.core.heads import AbductionNetwork, ActionNetwork

V, C, N = 1000, 16, 24
RTOL = 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    """These sizes are far too small to gain from threads; one thread also avoids barrier waits on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_inputs(
    per_token: bool,
    with_bias: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    num_positions: int = N,
    vocab: int = V,
    causal: int = C,
) -> list:
    """loc_U (N,C), decision_scale (N,C), weight (V,C), bias (V,) or None, threshold () or (V,), targets (N,)."""
    g = torch.Generator().manual_seed(seed)
    loc_U = (torch.randn(num_positions, causal, generator=g) * 3).to(dtype).requires_grad_()
    scale = (torch.rand(num_positions, causal, generator=g) + 0.05).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, causal, generator=g) * 0.5).to(dtype).requires_grad_()
    bias = (torch.randn(vocab, generator=g)).to(dtype).requires_grad_() if with_bias else None
    threshold = (torch.randn(vocab if per_token else (), generator=g) * 2 + 1).requires_grad_()
    targets = torch.randint(0, vocab, (num_positions,), generator=g)
    return [loc_U, scale, weight, bias, threshold, targets]


def run(loss_fn, inputs: list, **kwargs) -> dict:
    """Loss, per-position outputs and the gradient of every differentiable input."""
    for tensor in inputs[:5]:
        if tensor is not None:
            tensor.grad = None
    out = loss_fn(*inputs, **kwargs)
    out.loss.backward()
    result = {"loss": out.loss.detach(), "per_position": out.loss_per_position, "target_prob": out.target_prob}
    if out.p_num is not None:
        result["p_num"] = out.p_num.detach()
    names = ["loc_U", "decision_scale", "weight", "bias", "threshold"]
    for name, tensor in zip(names, inputs[:5]):
        if tensor is not None and tensor.requires_grad:
            result["grad_" + name] = tensor.grad.clone()
    return result


def assert_all_close(fused: dict, reference: dict, rtol: float = RTOL) -> None:
    """Every entry within ``rtol`` relative to that entry's largest magnitude."""
    assert fused.keys() == reference.keys()
    for key, expected in reference.items():
        got = fused[key]
        scale = expected.abs().max().clamp_min(1e-30)
        torch.testing.assert_close(got.double(), expected.double(), rtol=rtol, atol=rtol * float(scale), msg=key)


@pytest.mark.parametrize("per_token", [False, True], ids=["scalar_C", "per_token_C"])
@pytest.mark.parametrize("chunk_size", [V, 250, 256, 7, 4096], ids=lambda c: f"chunk{c}")
def test_loss_and_every_gradient_match_reference(per_token: bool, chunk_size: int) -> None:
    inputs = make_inputs(per_token)
    kwargs = dict(chunk_size=chunk_size, num_token_id=17)
    assert_all_close(run(fused_ovr_loss, inputs, **kwargs), run(reference_ovr_loss, inputs, **kwargs))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_without_bias_with_position_weights_and_reductions(reduction: str) -> None:
    inputs = make_inputs(per_token=True, with_bias=False, seed=3)
    weights = torch.rand(N, generator=torch.Generator().manual_seed(9))
    kwargs = dict(chunk_size=333, reduction=reduction, position_weights=weights)
    assert_all_close(run(fused_ovr_loss, inputs, **kwargs), run(reference_ovr_loss, inputs, **kwargs))


def test_per_position_loss_is_the_reference_bce() -> None:
    loc_U, scale, weight, bias, threshold, targets = make_inputs(per_token=False, seed=5)
    out = fused_ovr_loss(loc_U, scale, weight, bias, threshold, targets, chunk_size=300)
    loc_S = loc_U @ weight.T + bias  # (N,V)
    scale_S = scale @ weight.abs().T  # (N,V)
    expected = losses.ovr_bce_per_position(loc_S, scale_S, threshold, targets).detach()  # (N,)
    torch.testing.assert_close(out.loss_per_position, expected, rtol=RTOL, atol=0)
    torch.testing.assert_close(out.loss, expected.mean(), rtol=RTOL, atol=0)
    assert not out.loss_per_position.requires_grad


def test_through_the_caller_abduction_and_b_noise_gradients_with_ignored_positions() -> None:
    """Gradients reach ``b_noise``, the abduction network and the features exactly as with the reference."""
    torch.manual_seed(0)
    hidden, batch, length = 12, 2, 9
    abduction, action = AbductionNetwork(hidden, C), ActionNetwork(C, V)
    abduction.reset_parameters(initial_scale=2.0)
    with torch.no_grad():
        abduction.scale_net.weight.normal_(0, 0.1)
        action.classification_head.weight.normal_(0, 0.3)
        action.b_noise.uniform_(-0.2, 0.2)
    features = torch.randn(batch, length, hidden, requires_grad=True)
    labels = torch.randint(0, V, (batch, length))
    labels[0, 3], labels[1, 7] = losses.IGNORE_INDEX, losses.IGNORE_INDEX
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, -2:] = 0
    threshold = torch.tensor(3.0)

    def grads(loss_fn) -> dict:
        for p in [*abduction.parameters(), *action.parameters(), features]:
            p.grad = None
        targets = losses.shift_targets(labels, torch.zeros(batch, length), mask)
        loc_U, scale_U = abduction(features)  # (B,S,C) each
        loc_U = loc_U[:, :-1].reshape(-1, C)[targets.positions]  # (N,C)
        scale_U = scale_U[:, :-1].reshape(-1, C)[targets.positions]  # (N,C)
        head = action.classification_head
        decision_scale = action.decision_scale(scale_U)  # (N,C)
        out = loss_fn(loc_U, decision_scale, head.weight, head.bias, threshold, targets.token_ids, chunk_size=128)
        out.loss.backward()
        named = {"loss": out.loss.detach(), "features": features.grad.clone()}
        for name, p in [*abduction.named_parameters(), *action.named_parameters()]:
            if p.grad is not None:
                named[name] = p.grad.clone()
        return named

    fused, reference = grads(fused_ovr_loss), grads(reference_ovr_loss)
    assert {"b_noise", "loc_net.weight", "scale_net.bias", "classification_head.weight"} <= fused.keys()
    assert_all_close(fused, reference)


def test_model_adapter_matches_reference() -> None:
    loc_U, scale, weight, bias, threshold, targets = make_inputs(per_token=True, seed=11)
    loss, p_num = model_classification_loss(
        loc_U, scale, weight, bias, threshold, targets, position_weight=0.25, num_token_id=3, chunk_size=200
    )
    expected = reference_ovr_loss(
        loc_U, scale, weight, bias, threshold, targets, position_weights=torch.full((N,), 0.25), num_token_id=3
    )
    torch.testing.assert_close(loss, expected.loss, rtol=RTOL, atol=0)
    torch.testing.assert_close(p_num, expected.p_num, rtol=RTOL, atol=1e-7)


def test_p_num_is_differentiable() -> None:
    inputs = make_inputs(per_token=False, seed=2)
    fused = fused_ovr_loss(*inputs, num_token_id=42)
    reference = reference_ovr_loss(*inputs, num_token_id=42)
    (g_fused,) = torch.autograd.grad(fused.p_num.sum(), inputs[0])
    (g_reference,) = torch.autograd.grad(reference.p_num.sum(), inputs[0])
    torch.testing.assert_close(g_fused, g_reference, rtol=RTOL, atol=1e-7)


@pytest.mark.parametrize("per_token", [False, True], ids=["scalar_C", "per_token_C"])
@pytest.mark.parametrize("negatives", [None, 5], ids=["exact", "sampled"])
def test_gradcheck_float64(per_token: bool, negatives: int | None) -> None:
    loc_U, scale, weight, bias, threshold, targets = make_inputs(
        per_token, dtype=torch.float64, num_positions=4, vocab=11, causal=3
    )
    threshold = threshold.detach().double().requires_grad_()

    def loss(*tensors):
        generator = torch.Generator().manual_seed(4)
        return fused_ovr_loss(*tensors, targets, chunk_size=4, negatives=negatives, generator=generator).loss

    assert torch.autograd.gradcheck(loss, (loc_U, scale, weight, bias, threshold), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("negatives", [None, 5], ids=["exact", "sampled"])
def test_token_noise_matches_reference_and_passes_gradcheck(negatives: int | None) -> None:
    """``scale_ik = s_i·|W_k| + γ``: loss, P_<NUM> and every gradient (∂γ included) as the reference; gradcheck."""
    inputs = make_inputs(per_token=True)
    noise = torch.tensor(0.7, requires_grad=True)
    results = []
    for loss_fn in (fused_ovr_loss, reference_ovr_loss):
        noise.grad = None
        generator = torch.Generator().manual_seed(2)
        result = run(loss_fn, inputs, chunk_size=256, num_token_id=17, token_noise=noise, negatives=negatives,
                     generator=generator)
        result["grad_token_noise"] = noise.grad.clone()
        results.append(result)
    assert_all_close(*results)
    assert float(results[0]["grad_token_noise"]) != 0.0
    without = run(fused_ovr_loss, inputs, chunk_size=256, num_token_id=17)
    assert not torch.allclose(without["loss"], results[0]["loss"])  # γ changes the loss

    loc_U, scale, weight, bias, threshold, targets = make_inputs(False, dtype=torch.float64, num_positions=4, vocab=11, causal=3)
    gamma = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)

    def loss(*tensors):
        generator = torch.Generator().manual_seed(4)
        return fused_ovr_loss(
            *tensors[:5], targets, chunk_size=4, negatives=negatives, generator=generator, token_noise=tensors[5]
        ).loss

    threshold = threshold.detach().double().requires_grad_()
    assert torch.autograd.gradcheck(loss, (loc_U, scale, weight, bias, threshold, gamma), eps=1e-6, atol=1e-7, rtol=1e-5)
    with pytest.raises(ValueError, match="token_noise must be a scalar"):
        fused_ovr_loss(loc_U, scale, weight, bias, threshold, targets, token_noise=torch.ones(2, dtype=torch.float64))


def test_extreme_distance_over_scale_is_finite_and_matches_float64_reference() -> None:
    """|loc − C|/scale up to ~1e7 on both sides of the threshold, targets with P ≈ 0 and P ≈ 1."""
    g = torch.Generator().manual_seed(1)
    vocab = 300
    loc_U = torch.randn(N, C, generator=g, requires_grad=True)
    scale = torch.full((N, C), 1e-7).requires_grad_()
    weight = torch.randn(vocab, C, generator=g).requires_grad_()
    bias = (torch.randn(vocab, generator=g) * 10).requires_grad_()
    threshold = torch.tensor(0.0, requires_grad=True)
    targets = torch.randint(0, vocab, (N,), generator=g)
    inputs = [loc_U, scale, weight, bias, threshold, targets]
    with torch.no_grad():
        loc_S = loc_U @ weight.T + bias
        ratio = (loc_S / (scale @ weight.abs().T)).abs()
    assert ratio.max() > 1e6 and ratio.median() > 1e5
    fused = run(fused_ovr_loss, inputs, chunk_size=64)
    for key, value in fused.items():
        assert torch.isfinite(value).all(), key
    inputs64 = [t.detach().double().requires_grad_() for t in inputs[:5]] + [targets]
    assert_all_close(fused, run(reference_ovr_loss, inputs64), rtol=1e-4)


@pytest.mark.parametrize("scale_size", [1e-1, 1e-3, 1e-5])
def test_small_probabilities_keep_their_digits_over_a_large_vocabulary(scale_size: float) -> None:
    """Tens of thousands of terms −log(1 − P) with P down to 1e-7 sum to the float64 value within 1e-5
    (taking ``log`` of ``1 − P`` rounded to fp32 would be off by ~1e-4 here)."""
    g = torch.Generator().manual_seed(0)
    num_positions, causal, vocab = 4, 8, 40000
    loc_U = torch.randn(num_positions, causal, generator=g)
    scale = torch.rand(num_positions, causal, generator=g) * scale_size + scale_size
    weight = torch.randn(vocab, causal, generator=g) * 0.3
    targets = torch.randint(0, vocab, (num_positions,), generator=g)
    inputs = [loc_U, scale, weight, None, torch.tensor(10.0), targets]
    with torch.no_grad():
        fused = fused_ovr_loss(*inputs, chunk_size=8192).loss_per_position
        exact = reference_ovr_loss(*[t.double() if t is not None else None for t in inputs[:5]], targets)
    torch.testing.assert_close(fused.double(), exact.loss_per_position, rtol=1e-5, atol=0)


def test_bfloat16_inputs_compute_in_float32() -> None:
    inputs = make_inputs(per_token=False, dtype=torch.bfloat16, seed=7)
    fused = run(fused_ovr_loss, inputs, chunk_size=300, num_token_id=1)
    reference = run(reference_ovr_loss, inputs, chunk_size=300, num_token_id=1)
    assert fused["grad_weight"].dtype == torch.bfloat16 and fused["grad_loc_U"].dtype == torch.bfloat16
    assert fused["loss"].dtype == torch.float32
    for key in ("loss", "per_position", "target_prob", "p_num", "grad_threshold"):
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)
    for key in ("grad_loc_U", "grad_decision_scale", "grad_weight", "grad_bias"):
        expected = reference[key].float()
        torch.testing.assert_close(fused[key].float(), expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max()))


def test_grad_output_scales_gradients_and_no_grad_evaluation() -> None:
    inputs = make_inputs(per_token=True, seed=4)
    base = run(fused_ovr_loss, inputs, chunk_size=128)
    for tensor in inputs[:5]:
        tensor.grad = None
    (3.0 * fused_ovr_loss(*inputs, chunk_size=128).loss).backward()
    torch.testing.assert_close(inputs[2].grad, 3.0 * base["grad_weight"])
    torch.testing.assert_close(inputs[4].grad, 3.0 * base["grad_threshold"])
    with torch.no_grad():
        evaluated = fused_ovr_loss(*inputs, chunk_size=128)
    torch.testing.assert_close(evaluated.loss, base["loss"])


def test_no_gradient_work_without_grad_mode(monkeypatch) -> None:
    """Under torch.no_grad / inference_mode (evaluation) no gradient buffer is allocated and no per-slice
    gradient product runs, although the inputs require gradients; with grad mode on, both happen."""
    from causal_qwen.core import fused_ovr

    calls = {"slice_grads": 0, "allocations": 0}
    real_accumulate, real_allocate = fused_ovr._accumulate_slice_grads, fused_ovr._allocate_grads

    def counting_accumulate(*args, **kwargs):
        calls["slice_grads"] += 1
        return real_accumulate(*args, **kwargs)

    def counting_allocate(*args, **kwargs):
        grads = real_allocate(*args, **kwargs)
        calls["allocations"] += grads is not None
        return grads

    monkeypatch.setattr(fused_ovr, "_accumulate_slice_grads", counting_accumulate)
    monkeypatch.setattr(fused_ovr, "_allocate_grads", counting_allocate)
    inputs = make_inputs(per_token=True, seed=12)
    assert all(t.requires_grad for t in inputs[:5])
    with torch.no_grad():
        evaluated = fused_ovr_loss(*inputs, chunk_size=256, num_token_id=3)
    with torch.inference_mode():
        inferred = fused_ovr_loss(*inputs, chunk_size=256)
    assert calls == {"slice_grads": 0, "allocations": 0}
    assert not evaluated.loss.requires_grad
    trained = fused_ovr_loss(*inputs, chunk_size=256)
    assert calls == {"slice_grads": 4, "allocations": 1}, "1000 rows in slices of 256: four gradient slices"
    torch.testing.assert_close(evaluated.loss, trained.loss.detach())
    torch.testing.assert_close(inferred.loss, trained.loss.detach())
    torch.testing.assert_close(evaluated.loss_per_position, trained.loss_per_position)
    torch.testing.assert_close(evaluated.target_prob, trained.target_prob)
    frozen = [t.detach() if t is not None else None for t in inputs[:5]] + inputs[5:]
    fused_ovr_loss(*frozen, chunk_size=256)
    assert calls["slice_grads"] == 4, "nothing requires a gradient: no gradient work either"


def test_backward_twice_through_a_retained_graph_recomputes() -> None:
    inputs = make_inputs(per_token=True)
    loss = fused_ovr_loss(*inputs, chunk_size=300).loss
    loss.backward(retain_graph=True)
    first = [t.grad.clone() for t in inputs[:5]]
    loss.backward()
    for once, twice in zip(first, inputs[:5]):
        torch.testing.assert_close(twice.grad, 2 * once)


def test_no_positions_gives_zero_loss_and_zero_gradients() -> None:
    loc_U, scale, weight, bias, threshold, _ = make_inputs(per_token=False)
    out = fused_ovr_loss(loc_U[:0], scale[:0], weight, bias, threshold, torch.zeros(0, dtype=torch.long))
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.loss_per_position.shape == (0,)
    assert weight.grad.abs().sum() == 0 and threshold.grad == 0


def test_bad_inputs_raise_value_error() -> None:
    loc_U, scale, weight, bias, threshold, targets = make_inputs(per_token=False)
    with pytest.raises(ValueError, match="target_ids"):
        fused_ovr_loss(loc_U, scale, weight, bias, threshold, torch.full((N,), -100))
    with pytest.raises(ValueError, match="weight"):
        fused_ovr_loss(loc_U, scale, weight[:, :3], bias, threshold, targets)
    with pytest.raises(ValueError, match="threshold"):
        fused_ovr_loss(loc_U, scale, weight, bias, torch.zeros(5), targets)
    with pytest.raises(ValueError, match="negatives"):
        fused_ovr_loss(loc_U, scale, weight, bias, threshold, targets, negatives=0)


# ----------------------------------------------------------------------------------------------------------
# Sampled negatives
# ----------------------------------------------------------------------------------------------------------


def test_sampled_rows_exclude_targets_and_weights_are_inverse_inclusion_probabilities() -> None:
    targets = torch.tensor([5, 9, 5, 700])
    sampled = sample_negative_rows(targets, vocab=V, negatives=50, generator=torch.Generator().manual_seed(0))
    union, picked = sampled.rows[:3], sampled.rows[3:]
    assert union.tolist() == [5, 9, 700] and picked.numel() == 50 and picked.unique().numel() == 50
    assert not torch.isin(picked, targets).any()
    assert sampled.column_weights[:3].tolist() == [1.0, 1.0, 1.0]
    torch.testing.assert_close(sampled.column_weights[3:], torch.full((50,), (V - 3) / 50))
    assert torch.equal(sampled.rows[sampled.target_columns], targets)


def test_sampled_fused_equals_sampled_reference_for_the_same_draw() -> None:
    inputs = make_inputs(per_token=True, seed=8)
    kwargs = dict(chunk_size=50, negatives=64, num_token_id=2)
    fused = run(fused_ovr_loss, inputs, generator=torch.Generator().manual_seed(3), **kwargs)
    reference = run(reference_ovr_loss, inputs, generator=torch.Generator().manual_seed(3), **kwargs)
    assert_all_close(fused, reference)


def test_negatives_covering_the_vocabulary_give_the_exact_loss() -> None:
    inputs = make_inputs(per_token=False, seed=6)
    assert_all_close(run(fused_ovr_loss, inputs, negatives=V), run(fused_ovr_loss, inputs))


def _sampled_statistics(inputs: list, negatives: int, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error over ``draws`` of [loss, gradient projections] (each projection a fixed direction)."""
    g = torch.Generator().manual_seed(123)
    directions = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in inputs[:5]]
    samples = []
    for draw in range(draws):
        for tensor in inputs[:5]:
            tensor.grad = None
        out = fused_ovr_loss(*inputs, negatives=negatives, generator=torch.Generator().manual_seed(draw))
        out.loss.backward()
        row = [out.loss.detach().double()]
        row += [(t.grad.double() * d).sum() for t, d in zip(inputs[:5], directions)]
        row += [t.grad.double().flatten()[:5] for t in inputs[:3]]  # a few raw components too
        samples.append(torch.cat([r.reshape(-1) for r in row]))
    stacked = torch.stack(samples)  # (draws, statistics)
    return stacked.mean(0), stacked.std(0) / math.sqrt(draws)


def _exact_statistics(inputs: list) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    directions = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in inputs[:5]]
    exact = run(fused_ovr_loss, inputs)
    grads = [exact["grad_" + k] for k in ("loc_U", "decision_scale", "weight", "bias", "threshold")]
    row = [exact["loss"].double()] + [(gr.double() * d).sum() for gr, d in zip(grads, directions)]
    row += [gr.double().flatten()[:5] for gr in grads[:3]]
    return torch.cat([r.reshape(-1) for r in row])


def test_sampled_loss_and_gradient_are_unbiased(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mean over 300 draws within 4 standard errors of the exact loss and gradient projections; weights of
    the sampled rows 5% too large are detected by the same criterion (the test has power)."""
    inputs = make_inputs(per_token=True, seed=10, num_positions=12, vocab=600, causal=8)
    exact = _exact_statistics(inputs)
    mean, stderr = _sampled_statistics(inputs, negatives=40, draws=300)
    assert (stderr > 0).all()
    z = (mean - exact).abs() / stderr
    assert z.max() < 4.0, f"largest z-score {z.max():.2f}: {z}"
    unbiased_rows = fused_ovr.sample_negative_rows

    def biased(target_ids, vocab, negatives, generator=None):
        sampled = unbiased_rows(target_ids, vocab, negatives, generator)
        sampled.column_weights = torch.where(sampled.column_weights > 1, sampled.column_weights * 1.05, 1.0)
        return sampled

    monkeypatch.setattr(fused_ovr, "sample_negative_rows", biased)
    biased_mean, biased_stderr = _sampled_statistics(inputs, negatives=40, draws=300)
    assert ((biased_mean - exact).abs() / biased_stderr).max() > 4.0
