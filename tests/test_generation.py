"""Generation: greedy parity with Qwen, numbers fed back, causal individuals (both scopes), the standard decision,
streaming, the KV cache, bad input, and the generate / predict commands."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
import torch
from transformers import GenerationConfig

from causal_qwen import CausalQwenForCausalLM, from_qwen
from causal_qwen.conversion.conversion import load_qwen_base
from causal_qwen.core import cauchy
from causal_qwen.core.cauchy import decision_score
from causal_qwen.core.generation import MODES, generate_ids
from causal_qwen.core.text_generation import generate, greedy_parity, stream
from causal_qwen.core.numbers import format_prediction
from causal_qwen.evaluation.predict import next_step_view, predict_next

from .conftest import SMALL_NUM_ID, small_qwen

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (tests/conftest.py)

PROMPTS = ("The capital of France is", "Once upon a time, in a small village by the sea, there lived", "Hello")


def convert(base, **overrides) -> CausalQwenForCausalLM:
    overrides.setdefault("num_token_id", SMALL_NUM_ID)
    return from_qwen(base, **overrides)


def ovr_argmax_reference(loc_S, scale_S, threshold) -> torch.Tensor:
    """The naive standard decision ``argmax_k (loc_S_k − t_k) / scale_S_k``: (B,V) → (B,)."""
    return decision_score(loc_S, scale_S, threshold).argmax(dim=-1)


SEQUENCE = dict(mode="causal", individual_scope="sequence")


def left_padded_ids(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(3,7) ids with rows of 7, 4 and 2 real tokens, left padded with 0."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 400, (3, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    return ids.masked_fill(mask == 0, 0), mask


def perturb(model: CausalQwenForCausalLM, seed: int = 0) -> CausalQwenForCausalLM:
    """Non-constant scale_U, noisy b_noise, a classification bias: the shortcut's bounds are no longer tight."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        scale_weight = model.abduction.scale_net.weight
        scale_weight.copy_(torch.randn(scale_weight.shape, generator=generator) * 0.3)
        model.action.b_noise.copy_(torch.rand(model.action.b_noise.shape, generator=generator) * 0.5)
        model.action.classification_head.bias.copy_(torch.randn(model.config.vocab_size, generator=generator))
    return model


def teacher_forced_standard(model, ids, mask, generated) -> torch.Tensor:
    """The naive standard decision at every generated position, recomputed without a cache: (B,T)."""
    full_ids = torch.cat([ids, generated.token_ids], dim=1)
    full_values = torch.cat([torch.zeros_like(ids, dtype=torch.float32), generated.numeric_values], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(generated.token_ids)], dim=1)
    positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
    with torch.no_grad():
        out = model(full_ids, full_values, attention_mask=full_mask, position_ids=positions)
    steps = generated.token_ids.shape[1]
    start = ids.shape[1] - 1
    loc_S, scale_S = out.loc_S[:, start : start + steps], out.scale_S[:, start : start + steps]
    return ovr_argmax_reference(loc_S, scale_S, model.ovr_thresholds())


# ---- fixtures -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model():
    return convert(small_qwen())


# ---- parity with Qwen's generate ---------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_traditional_greedy_equals_qwen_generate_left_padded(tied):
    reference = small_qwen(tied=tied)
    model = convert(small_qwen(tied=tied))
    ids, mask = left_padded_ids()
    config = GenerationConfig(max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        expected = reference.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1] :]
    got = generate_ids(model, ids, mask, mode="traditional", temperature=0, max_new_tokens=32, eos_token_id=[])
    assert torch.equal(got.token_ids, expected)
    assert got.lengths.tolist() == [32, 32, 32] and got.finish_reasons == ["length"] * 3


@pytest.mark.parametrize("preset", ["random:tiny", "random:tiny-untied"])
def test_greedy_parity_on_presets(preset, tokenizer, tiny_model):
    """The untied preset is converted without the OvR calibration, which never touches ``loc_S`` (traditional
    decoding reads only that): calibrating its head takes many seconds. The calibrated untied conversion's
    parity is checked by the compare command's run (test_compare), the calibrated tied one's here."""
    model = tiny_model if preset == "random:tiny" else from_qwen(preset, ovr_calibration="none")
    parity = greedy_parity(load_qwen_base(preset), model, tokenizer, PROMPTS, max_new_tokens=32)
    assert parity["greedy_total_tokens"] == 2 * 3 * 32  # each prompt alone, then all three left padded
    assert parity["greedy_match_tokens"] == parity["greedy_total_tokens"]


# ---- numbers ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["standard", "traditional", "causal"])
def test_generated_number_is_fed_back_as_input_embedding(mode):
    model = convert(small_qwen())
    with torch.no_grad():
        model.action.classification_head.bias[SMALL_NUM_ID] = 1e4  # <NUM> wins every decision
    seen: list[torch.Tensor] = []
    handle = model.numeric_embedding.register_forward_hook(lambda module, args, out: seen.append(args[0].clone()))
    ids, mask = left_padded_ids()
    options = {"temperature": 0} if mode == "traditional" else {"seed": 3} if mode == "causal" else {}
    try:
        out = generate_ids(model, ids, mask, mode=mode, max_new_tokens=4, eos_token_id=[], **options)
    finally:
        handle.remove()
    assert (out.token_ids == SMALL_NUM_ID).all()
    values = out.numeric_values  # (B,4)
    assert torch.isfinite(values).all() and (values != 0).all()
    # after the prompt, steps 2..4 were fed the values chosen at steps 1..3: embed(<NUM>) + phi(value)
    assert len(seen) == 4 and seen[0].shape == ids.shape
    for step, fed in enumerate(seen[1:]):
        assert fed.shape == (3, 1)
        assert torch.equal(fed[:, 0], values[:, step])
    assert torch.isfinite(out.scales).all() and (out.scales > 0).all()  # the precision each value is written with
    if mode != "causal":  # the value is loc_Y at the deciding position
        full_ids = torch.cat([ids, out.token_ids], 1)
        full_values = torch.cat([torch.zeros(3, 7), values], 1)
        full_mask = torch.cat([mask, torch.ones(3, 4, dtype=torch.long)], 1)
        positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
        with torch.no_grad():
            forward = model(full_ids, full_values, attention_mask=full_mask, position_ids=positions)
        torch.testing.assert_close(forward.loc_Y[:, 6:10], values, rtol=1e-4, atol=1e-4)


def test_numbers_in_results_carry_median_and_intervals(tiny_model, tokenizer):
    num_id = tiny_model.config.num_token_id
    head = tiny_model.action.classification_head
    original = head.bias[num_id].item()
    with torch.no_grad():
        head.bias[num_id] = 1e4
    try:
        result = generate(tiny_model, tokenizer, "The price is", mode="standard", max_new_tokens=2)[0]
        causal = generate(tiny_model, tokenizer, "The price is", mode="causal", max_new_tokens=2, seed=0)[0]
        widened = generate(tiny_model, tokenizer, "The price is", mode="causal", max_new_tokens=2, seed=0,
                           causal_temperature=1e8)[0]
    finally:
        with torch.no_grad():
            head.bias[num_id] = original
    assert result.token_ids == [num_id, num_id] and len(result.numbers) == 2
    first = result.numbers[0]
    assert first.median == first.value and first.scale > 0
    low50, high50 = first.interval_50
    low90, high90 = first.interval_90
    assert low90 < low50 < first.median < high50 < high90
    assert high50 - first.median == pytest.approx(first.scale, rel=1e-5)  # tan(π/4) = 1
    assert high90 - first.median == pytest.approx(first.scale * math.tan(0.45 * math.pi), rel=1e-5)
    # each number is printed to the precision its scale carries (format_prediction), two in a row apart
    assert [n.text for n in result.numbers] == [format_prediction(n.value, n.scale) for n in result.numbers]
    # the first number is set apart from the prompt's last word ("is-0.29" would read back as text)
    assert " " + tokenizer.decode(result.token_ids, numeric_values=[n.value for n in result.numbers],
                                  numeric_strings=[n.text for n in result.numbers], separate_numbers=True) == result.text
    encoded = tokenizer(result.text)
    read_back = encoded["numeric_values"][encoded["input_ids"] == num_id]
    assert read_back.tolist() == [float(n.text) for n in result.numbers]
    assert causal.numbers[0].median is None and causal.numbers[0].interval_90 is None
    # the individual's value, written to the precision of the population's prediction (not every float digit)
    for number in widened.numbers:
        scale = result.numbers[0].scale
        assert number.text == format_prediction(number.value, scale) and number.value != result.numbers[0].value
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["numbers"][0]["interval_90"] == list(first.interval_90)


def test_stop_string_inside_a_number_does_not_stop(tiny_model, tokenizer):
    num_id = tiny_model.config.num_token_id
    head = tiny_model.action.classification_head
    original = head.bias[num_id].item()
    with torch.no_grad():
        head.bias[num_id] = 1e4  # every step writes a number
    try:
        result = generate(tiny_model, tokenizer, "The price is", mode="standard", max_new_tokens=3, stop_strings=["."])[0]
    finally:
        with torch.no_grad():
            head.bias[num_id] = original
    assert any("." in n.text for n in result.numbers)  # the stop string is inside the numbers
    assert result.finish_reason != "stop_string" and len(result.numbers) == 3


# ---- causal mode -----------------------------------------------------------------------------------------
def test_causal_mode_is_reproducible_and_replays_an_individual(small_model):
    ids, mask = left_padded_ids()
    first = generate_ids(small_model, ids, mask, **SEQUENCE, seed=7, max_new_tokens=12, eos_token_id=[])
    again = generate_ids(small_model, ids, mask, **SEQUENCE, seed=7, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(first.token_ids, again.token_ids) and torch.equal(first.individual, again.individual)
    assert first.individual.shape == (3, small_model.config.causal_size)
    replay_options = dict(**SEQUENCE, max_new_tokens=12, eos_token_id=[])
    replay = generate_ids(small_model, ids, mask, individual=first.individual, **replay_options)
    assert torch.equal(replay.token_ids, first.token_ids)
    # the individual of row 0 on another prompt (alone), then inside a batch: the same continuation
    other = torch.randint(1, 400, (1, 5), generator=torch.Generator().manual_seed(9))
    alone = generate_ids(small_model, other, individual=first.individual[0], **replay_options)
    assert torch.equal(alone.individual[0], first.individual[0])
    batch_ids = torch.cat([torch.zeros(1, 2, dtype=torch.long), other], 1)
    batch_ids = torch.cat([batch_ids, ids[:1]], 0)
    batch_mask = torch.cat([torch.tensor([[0, 0, 1, 1, 1, 1, 1]]), torch.ones(1, 7, dtype=torch.long)], 0)
    paired = generate_ids(small_model, batch_ids, batch_mask, individual=first.individual[0], **replay_options)
    assert torch.equal(paired.token_ids[0], alone.token_ids[0])
    assert torch.equal(paired.token_ids[1], first.token_ids[0])


def test_causal_first_decision_matches_the_formula():
    model = perturb(convert(small_qwen()))
    ids = torch.randint(1, 400, (2, 6), generator=torch.Generator().manual_seed(2))
    tau = 3.0
    out = generate_ids(model, ids, **SEQUENCE, causal_temperature=tau, seed=11, max_new_tokens=1, eos_token_id=[])
    with torch.no_grad():
        forward = model(ids)
        epsilon = out.individual
        u = forward.loc_U[:, -1] + forward.scale_U[:, -1] * tau * torch.tan(math.pi * (epsilon - 0.5)).float()
        head = model.action.classification_head
        loc_S = head(u)
        scale_S = model.action.b_noise.abs() @ head.weight.abs().T + model.action.token_noise_scale()  # (V,)
        expected = ovr_argmax_reference(loc_S, scale_S.expand_as(loc_S), model.ovr_thresholds())
    assert torch.equal(out.token_ids[:, 0], expected)


def test_different_seeds_give_different_individuals():
    # The seeds' literal scales (γ0 = 10): individuals far enough apart to write differently. (The calibrated default
    # keeps the individual's share of the decision scale at ρ = 1e-3, where every individual writes alike:
    # docs/design.md, "Calibration at conversion".)
    model = convert(small_qwen(), ovr_calibration="none")
    ids, mask = left_padded_ids()
    options = dict(**SEQUENCE, max_new_tokens=8, eos_token_id=[])
    runs = [generate_ids(model, ids, mask, seed=seed, **options) for seed in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(runs[a].individual, runs[b].individual)
    assert len({tuple(run.token_ids.flatten().tolist()) for run in runs}) > 1
    # inside one batch, each prompt gets its own individual
    assert not torch.equal(runs[0].individual[0], runs[0].individual[1])


@pytest.mark.parametrize("scope", ["token", "sequence"])
def test_a_prompt_writes_the_same_text_for_a_seed_whatever_else_is_in_the_batch(scope):
    model = perturb(convert(small_qwen(), ovr_calibration="none"))  # the prompts matter, and so does the individual
    options = dict(mode="causal", individual_scope=scope, causal_temperature=0.3, max_new_tokens=8, eos_token_id=[])
    ids, mask = left_padded_ids()  # (3,7), rows 1 and 2 padded
    batch = generate_ids(model, ids, mask, seed=4, **options)
    for row in range(3):  # row i draws from seed + i: alone with that seed, or first in another batch
        alone_ids = ids[row : row + 1, mask[row].bool()]
        alone = generate_ids(model, alone_ids, seed=4 + row, **options)
        assert torch.equal(alone.token_ids[0], batch.token_ids[row]), row
    others = torch.randint(1, 400, (2, 7), generator=torch.Generator().manual_seed(5))
    mixed = generate_ids(model, torch.cat([ids[2:], others]), torch.cat([mask[2:], torch.ones_like(others)]), seed=6,
                         **options)
    assert torch.equal(mixed.token_ids[0], batch.token_ids[2])
    copies = generate_ids(model, ids[:1].expand(4, -1), seed=4, **options)  # one prompt four times: four draws
    assert len({tuple(row.tolist()) for row in copies.token_ids}) > 1
    last = 2**64 - 1  # the largest seed torch takes: the next row wraps to 0
    wrapped = generate_ids(model, torch.cat([ids[:1], ids[:1]]), seed=last, **options)
    assert torch.equal(wrapped.token_ids[1], generate_ids(model, ids[:1], seed=0, **options).token_ids[0])


def recorded_individuals(model):
    """The standard-Cauchy coordinates c (B,C) handed to every forward pass of a generation (a pre-hook)."""
    seen: list[torch.Tensor] = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["individual"].clone()), with_kwargs=True
    )
    return seen, handle


def teacher_forced_causal(model, ids, mask, out, coordinates, tau) -> torch.Tensor:
    """The causal decision at every generated position, recomputed without a cache with the step's individual c."""
    full_ids = torch.cat([ids, out.token_ids], 1)
    full_values = torch.cat([torch.zeros_like(ids, dtype=torch.float32), out.numeric_values], 1)
    full_mask = torch.cat([mask, torch.ones_like(out.token_ids)], 1)
    positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
    steps, start = out.token_ids.shape[1], ids.shape[1] - 1
    individual = torch.stack(coordinates, dim=1)  # (B,T,C): one individual per decided position
    padded = torch.zeros(ids.shape[0], full_ids.shape[1], individual.shape[-1], dtype=torch.float64)
    padded[:, start : start + steps] = individual
    with torch.no_grad():
        forward = model(full_ids, full_values, attention_mask=full_mask, position_ids=positions, decision="causal",
                        individual=padded, causal_temperature=tau)
    return forward.logits[:, start : start + steps].argmax(-1)  # (B,T)


def test_token_scope_draws_a_new_individual_for_every_position():
    """The design's causal sampling: a fresh ε per generated position, each step deciding with its own (this fails
    if one ε were reused), the whole sequence of draws replayed from the seed; other seeds write otherwise."""
    model = convert(small_qwen(), ovr_calibration="none")  # the literal scales: individuals that write differently
    ids, mask = left_padded_ids()
    tau = 1.0
    seen, handle = recorded_individuals(model)
    try:
        out = generate_ids(model, ids, mask, mode="causal", causal_temperature=tau, seed=4, max_new_tokens=8,
                           eos_token_id=[])
    finally:
        handle.remove()
    assert out.individual is None and out.seed == 4 and len(seen) == 8
    for a in range(8):
        for b in range(a + 1, 8):
            assert not torch.equal(seen[a], seen[b]), (a, b)
    assert torch.equal(out.token_ids, teacher_forced_causal(model, ids, mask, out, seen, tau))
    reused = teacher_forced_causal(model, ids, mask, out, [seen[0]] * 8, tau)
    assert not torch.equal(out.token_ids, reused), "deciding every step with the first ε writes otherwise"
    again = generate_ids(model, ids, mask, mode="causal", causal_temperature=tau, seed=4, max_new_tokens=8,
                         eos_token_id=[])
    assert torch.equal(again.token_ids, out.token_ids)
    others = [generate_ids(model, ids, mask, mode="causal", causal_temperature=tau, seed=seed, max_new_tokens=8,
                           eos_token_id=[]).token_ids for seed in (5, 6)]
    assert not all(torch.equal(other, out.token_ids) for other in others)


def test_sequence_scope_keeps_one_individual_for_the_whole_text():
    model = convert(small_qwen(), ovr_calibration="none")
    ids, mask = left_padded_ids()
    seen, handle = recorded_individuals(model)
    try:
        out = generate_ids(model, ids, mask, **SEQUENCE, causal_temperature=2.0, seed=4, max_new_tokens=6,
                           eos_token_id=[])
    finally:
        handle.remove()
    assert all(torch.equal(c, seen[0]) for c in seen)
    torch.testing.assert_close(seen[0], torch.tan(math.pi * (out.individual - 0.5)), rtol=0, atol=0)
    assert torch.equal(out.token_ids, teacher_forced_causal(model, ids, mask, out, seen, 2.0))


@pytest.mark.parametrize("scope", ["token", "sequence"])
def test_zero_causal_temperature_is_standard_mode(scope):
    """τ = 0 draws nothing: the causal decision is standard mode's, on a model whose scale varies by position."""
    model = perturb(convert(small_qwen()))
    ids, mask = left_padded_ids()
    standard = generate_ids(model, ids, mask, mode="standard", max_new_tokens=10, eos_token_id=[])
    causal = generate_ids(model, ids, mask, mode="causal", individual_scope=scope, causal_temperature=0.0, seed=1,
                          max_new_tokens=10, eos_token_id=[])
    assert torch.equal(causal.token_ids, standard.token_ids)
    tiny = from_qwen("random:tiny")  # calibrated: position-free scale, τ from the conversion
    prompt = torch.randint(10, 150000, (2, 5), generator=torch.Generator().manual_seed(3))
    expected = generate_ids(tiny, prompt, mode="standard", max_new_tokens=6, eos_token_id=[])
    got = generate_ids(tiny, prompt, mode="causal", individual_scope=scope, causal_temperature=0, max_new_tokens=6,
                       eos_token_id=[])
    assert torch.equal(got.token_ids, expected.token_ids)
    widened = generate_ids(tiny, prompt, mode="causal", individual_scope=scope, seed=1, max_new_tokens=6,
                           eos_token_id=[])
    assert tiny.config.causal_temperature > 0
    assert not torch.equal(widened.token_ids, expected.token_ids), "the calibrated τ moves decisions"


def test_intermediate_causal_temperature_keeps_the_undrawn_spread_in_the_scale():
    """0 < τ < 1: u = loc_U + τ·scale_U ⊙ c and scale_S = |W|((1 − τ)·scale_U + |b_noise|) + γ_S."""
    model = perturb(convert(small_qwen()))
    ids = torch.randint(1, 400, (2, 6), generator=torch.Generator().manual_seed(2))
    tau = 0.4
    out = generate_ids(model, ids, **SEQUENCE, causal_temperature=tau, seed=3, max_new_tokens=1, eos_token_id=[])
    with torch.no_grad():
        forward = model(ids)
        c = torch.tan(math.pi * (out.individual - 0.5)).float()
        u = forward.loc_U[:, -1] + tau * forward.scale_U[:, -1] * c
        loc_S, scale_S = model.action.classify(u, (1 - tau) * forward.scale_U[:, -1])
    assert torch.equal(out.token_ids[:, 0], ovr_argmax_reference(loc_S, scale_S, model.ovr_thresholds()))


# ---- standard mode ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold_kind", ["scalar", "per_token"])
def test_standard_generation_equals_naive_decision_on_perturbed_model(threshold_kind):
    model = perturb(convert(small_qwen(), ovr_threshold_kind=threshold_kind, ovr_threshold=1.0))
    if threshold_kind == "per_token":
        with torch.no_grad():
            generator = torch.Generator().manual_seed(5)
            model.ovr_thresholds.values.copy_(torch.randn(model.config.vocab_size, generator=generator))
    ids, mask = left_padded_ids()
    out = generate_ids(model, ids, mask, mode="standard", max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.token_ids, teacher_forced_standard(model, ids, mask, out))
    again = generate_ids(model, ids, mask, mode="standard", max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.token_ids, again.token_ids)  # deterministic


def test_standard_decision_follows_weight_updates():
    model = convert(small_qwen())
    ids, mask = left_padded_ids()
    generate_ids(model, ids, mask, mode="standard", max_new_tokens=2, eos_token_id=[])
    with torch.no_grad():  # in place, as an optimizer step would: the cached scale must be recomputed
        model.action.classification_head.weight[::2] *= 3.0
    perturb(model)
    out = generate_ids(model, ids, mask, mode="standard", max_new_tokens=6, eos_token_id=[])
    assert torch.equal(out.token_ids, teacher_forced_standard(model, ids, mask, out))


# ---- KV cache --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_kv_cache_is_reused_and_prefix_never_rerun(small_model, mode):
    fed: list[int] = []

    def record(module, args, kwargs):
        fed.append(kwargs["inputs_embeds"].shape[1])
        cache = kwargs["cache"]
        assert cache.get_seq_length() == (0 if len(fed) == 1 else 7 + len(fed) - 2)

    handle = small_model.model.register_forward_pre_hook(record, with_kwargs=True)
    ids, mask = left_padded_ids()
    try:
        generate_ids(small_model, ids, mask, mode=mode, max_new_tokens=10, eos_token_id=[], seed=0)
    finally:
        handle.remove()
    assert fed == [7] + [1] * 9  # the prompt once, then one token per step; no forward after the last


def test_stops_at_eos_and_pads_finished_rows(small_model):
    ids, mask = left_padded_ids()
    free = generate_ids(small_model, ids, mask, mode="traditional", temperature=0, max_new_tokens=6, eos_token_id=[])
    eos = int(free.token_ids[1, 2])
    first = free.token_ids[1].tolist().index(eos)  # the first time row 1 meets it
    greedy = dict(mode="traditional", temperature=0, max_new_tokens=6)
    out = generate_ids(small_model, ids, mask, eos_token_id=eos, pad_token_id=0, **greedy)
    assert out.finish_reasons[1] == "eos" and out.lengths[1] == first + 1
    assert out.token_ids[1, first + 1 :].eq(0).all()
    # min_new_tokens forbids the EOS before
    late = generate_ids(
        small_model, ids, mask, mode="traditional", temperature=0, max_new_tokens=6, min_new_tokens=6, eos_token_id=eos
    )
    assert late.lengths.tolist() == [6, 6, 6] and not (late.token_ids[:, :6] == eos).any()


# ---- text, streaming, stop strings -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_streaming_yields_the_final_text(tiny_model, tokenizer, mode):
    options = {"seed": 5} if mode != "standard" else {}
    generation = stream(tiny_model, tokenizer, list(PROMPTS), mode=mode, max_new_tokens=12, **options)
    pieces: dict[int, str] = {}
    finished = []
    for piece in generation:
        pieces[piece.index] = pieces.get(piece.index, "") + piece.text
        if piece.finished:
            finished.append(piece.index)
    results = generation.results
    assert sorted(finished) == [0, 1, 2]
    plain = generate(tiny_model, tokenizer, list(PROMPTS), mode=mode, max_new_tokens=12, **options)
    for index, result in enumerate(results):
        assert pieces[index] == result.text == plain[index].text
        assert result.token_ids == plain[index].token_ids and len(result.token_ids) == 12
        assert result.prompt == PROMPTS[index]
    callback_pieces: list = []
    options["callback"] = callback_pieces.append
    generate(tiny_model, tokenizer, list(PROMPTS), mode=mode, max_new_tokens=12, **options)
    for index in range(3):
        assert "".join(p.text for p in callback_pieces if p.index == index) == plain[index].text


def test_stop_string_ends_the_text(tiny_model, tokenizer):
    free = generate(tiny_model, tokenizer, PROMPTS[0], mode="traditional", max_new_tokens=16, seed=1)[0]
    assert len(free.text) > 6
    stop = free.text[3:6]
    options = dict(mode="traditional", max_new_tokens=16, seed=1)
    stopped = generate(tiny_model, tokenizer, PROMPTS[0], stop_strings=[stop], **options)[0]
    assert stopped.finish_reason == "stop_string"
    assert stopped.text.endswith(stop) and free.text.startswith(stopped.text)
    assert stop not in stopped.text[:-1]
    assert len(stopped.token_ids) < len(free.token_ids)


def test_traditional_sampling_is_seeded(small_model):
    ids, mask = left_padded_ids()
    options = dict(mode="traditional", temperature=0.8, top_k=50, top_p=0.9, max_new_tokens=10, eos_token_id=[])
    a = generate_ids(small_model, ids, mask, seed=1, **options)
    b = generate_ids(small_model, ids, mask, seed=1, **options)
    c = generate_ids(small_model, ids, mask, seed=2, **options)
    assert torch.equal(a.token_ids, b.token_ids) and not torch.equal(a.token_ids, c.token_ids)


# ---- predict ---------------------------------------------------------------------------------------------
def test_next_step_view_lines_up_with_standard_and_greedy(small_model):
    model = perturb(convert(small_qwen()))
    ids = torch.randint(1, 400, (7,), generator=torch.Generator().manual_seed(4))
    view = next_step_view(model, ids, top_k=5)
    assert len(view.candidates) == 5
    probabilities = [c.ovr_probability for c in view.candidates]
    assert probabilities == sorted(probabilities, reverse=True)
    standard = generate_ids(model, ids[None], mode="standard", max_new_tokens=1, eos_token_id=[])
    greedy = generate_ids(model, ids[None], mode="traditional", temperature=0, max_new_tokens=1, eos_token_id=[])
    assert view.standard_choice == view.candidates[0].token_id == int(standard.token_ids[0, 0])
    assert view.traditional_choice == int(greedy.token_ids[0, 0])
    top = view.candidates[0]
    assert top.ovr_probability == pytest.approx(math.atan2(top.scale_S, top.threshold - top.loc_S) / math.pi, rel=1e-5)
    n = view.number
    assert n.interval_90[0] < n.interval_50[0] < n.median < n.interval_50[1] < n.interval_90[1]
    assert json.loads(json.dumps(view.to_dict()))["number"]["token_id"] == SMALL_NUM_ID
    # Σ_k P_k over the whole vocabulary, from the model's own scores
    with torch.no_grad():
        out = model(input_ids=ids[None], logits_to_keep=1, return_scores=True)
        every = cauchy.ovr_probability(out.loc_S[0, -1], out.scale_S[0, -1], model.ovr_thresholds())
    assert view.probability_sum == pytest.approx(float(every.double().sum()), rel=1e-5)
    assert view.probability_sum >= sum(probabilities)


def test_predict_reads_the_number_forecast_after_the_space_a_number_would_follow(tiny_model, tokenizer):
    """``"... it sold 24.3"`` reads ``' sold'``, ``' '``, ``<NUM>``: after a text ending in a word the number comes one
    token on, so its forecast is read after ``text + " "`` (as eval reads it) and says so; the candidates stay
    those right after the text. A text ending in a space or a sign such as ``$`` is read where it ends."""
    word = predict_next(tiny_model, tokenizer, "On Monday it sold", top_k=2)
    spaced = predict_next(tiny_model, tokenizer, "On Monday it sold ", top_k=2)
    assert word.number.after == " " and spaced.number.after == ""
    assert {k: v for k, v in asdict(word.number).items() if k != "after"} == \
        {k: v for k, v in asdict(spaced.number).items() if k != "after"}
    assert [c.token_id for c in word.candidates] != [c.token_id for c in spaced.candidates]
    assert predict_next(tiny_model, tokenizer, "It costs $", top_k=1).number.after == ""
    assert predict_next(tiny_model, tokenizer, "The total is:", top_k=1).number.after == " "
    assert predict_next(tiny_model, tokenizer, "今天的温度是", top_k=1).number.after == ""


@pytest.mark.parametrize("text, written", [
    ("The total is:", "The total is: 25"), ("x =", "x = 25"), ("sold", "sold 25"), ("Scores: 7,", "Scores: 7, 25"),
    ("It costs $", "It costs $25"), ("(", "(25"), ("今天的温度是", "今天的温度是25"), ("温度：", "温度：25"),
    ("온도는", "온도는 25"), ("Total: ", "Total: 25"), ("from 10-", "from 10-20"), ("about ~", "about ~25"),
    ("溫度為-", "溫度為-5"),
])
def test_a_number_follows_a_space_where_such_text_writes_one(tokenizer, text, written):
    """`space_before_number` against the tokenizer: where the number is written after a space, the text's own
    tokens are followed by a ' ' token and then <NUM>; elsewhere <NUM> follows the text's tokens directly."""
    from causal_qwen.evaluation.predict import space_before_number

    encoded = tokenizer([written])
    ids, values = encoded["input_ids"][0].tolist(), encoded["numeric_values"][0].tolist()
    last = len(ids) - 1 - ids[::-1].index(tokenizer.num_token_id)  # the number written after the text
    assert tokenizer.decode(ids[:last], numeric_values=values[:last]) == text + (" " if space_before_number(text) else "")
    assert space_before_number(text) == (written[len(text)] == " ")


def test_predict_cuts_the_intervals_at_the_fields_least_value(tiny_model, tokenizer):
    """``number_lower_bound`` (train sets 0 for a target never negative): no interval end lies below it."""
    import copy

    free = predict_next(tiny_model, tokenizer, "It sold", top_k=1).number
    bounded_tokenizer = copy.deepcopy(tokenizer)
    bound = free.interval_90[0] + 0.25 * (free.interval_90[1] - free.interval_90[0])  # inside the 90% interval
    bounded_tokenizer.number_lower_bound = bound
    bounded = predict_next(tiny_model, bounded_tokenizer, "It sold", top_k=1).number
    assert bounded.interval_90 == (bound, free.interval_90[1])
    assert bounded.interval_50 == tuple(max(end, bound) for end in free.interval_50)
    assert (bounded.median, bounded.scale, bounded.text) == (free.median, free.scale, free.text)
    above = copy.deepcopy(tokenizer)  # a bound above the median: the median of the forecast cut there is the bound
    above.number_lower_bound = free.interval_90[1]
    cut = predict_next(tiny_model, above, "It sold", top_k=1).number
    assert cut.median == free.interval_90[1] and cut.interval_50 == cut.interval_90 == (cut.median, cut.median)
    assert float(cut.text) == pytest.approx(cut.median, abs=free.scale)
    with pytest.raises(ValueError, match="number_lower_bound must be a finite number or None"):
        type(tokenizer)(number_lower_bound=float("nan"))


def test_predict_next_reads_numbers(tiny_model, tokenizer):
    view = predict_next(tiny_model, tokenizer, "It costs 99.99 dollars and", top_k=3)
    assert len(view.candidates) == 3 and view.number.token_id == tiny_model.config.num_token_id
    assert all(isinstance(c.token, str) for c in view.candidates)


# ---- bad input -------------------------------------------------------------------------------------------
def test_bad_input_is_rejected_with_a_clear_message(small_model, tiny_model, tokenizer):
    ids, mask = left_padded_ids()
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(tiny_model, tokenizer, ["Hello", ""])
    with pytest.raises(ValueError, match="prompts is empty"):
        generate(tiny_model, tokenizer, [])
    with pytest.raises(ValueError, match="empty"):
        generate_ids(small_model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="standard, causal, traditional"):
        generate_ids(small_model, ids, mask, mode="beam")
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_new_tokens"):
            generate_ids(small_model, ids, mask, max_new_tokens=bad)
    causal_size = small_model.config.causal_size
    with pytest.raises(ValueError, match=r"individual has shape \(5,\).*\(32,\)"):
        generate_ids(small_model, ids, mask, **SEQUENCE, individual=torch.full((5,), 0.5))
    with pytest.raises(ValueError, match="individual has shape"):
        generate_ids(small_model, ids, mask, **SEQUENCE, individual=torch.full((2, causal_size), 0.5))
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        generate_ids(small_model, ids, mask, **SEQUENCE, individual=torch.ones(causal_size))
    with pytest.raises(ValueError, match="individual_scope='sequence'"):
        generate_ids(small_model, ids, mask, mode="causal", individual=torch.full((causal_size,), 0.5))
    with pytest.raises(ValueError, match="individual_scope must be one of token, sequence"):
        generate_ids(small_model, ids, mask, mode="causal", individual_scope="text")
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="causal_temperature must be a finite number >= 0"):
            generate_ids(small_model, ids, mask, mode="causal", causal_temperature=bad)
    with pytest.raises(ValueError, match="only apply to mode 'causal'"):
        generate_ids(small_model, ids, mask, mode="standard", causal_temperature=2.0)
    with pytest.raises(ValueError, match="only applies to mode 'traditional'"):
        generate_ids(small_model, ids, mask, mode="standard", temperature=0.7)
    with pytest.raises(ValueError, match="only apply to mode 'causal'"):
        generate_ids(small_model, ids, mask, mode="standard", individual=torch.full((causal_size,), 0.5))
    with pytest.raises(ValueError, match="LEFT padding"):
        generate_ids(small_model, ids, mask.flip(-1))
    with pytest.raises(ValueError, match="top_p"):
        generate_ids(small_model, ids, mask, mode="traditional", top_p=1.5)


# ---- command line ----------------------------------------------------------------------------------------
@pytest.fixture
def loaded_once(monkeypatch, tiny_model, tokenizer):
    """After the first real load of random:tiny, hand the commands the (identical) module fixture (the commands
    import `causal_qwen.conversion.loading.load_model_and_tokenizer` when they run)."""
    from causal_qwen.conversion import loading

    def reuse() -> None:
        monkeypatch.setattr(loading, "load_model_and_tokenizer", lambda **kwargs: (tiny_model, tokenizer))

    return reuse


def test_cli_generate_json_and_individual_replay(tmp_path, capsys, loaded_once):
    from causal_qwen.cli import main

    saved = tmp_path / "individual.json"
    argv = ["generate", "--base", "random:tiny", "--mode", "causal", "--individual-scope", "sequence", "--seed", "3",
            "--max-new-tokens", "5"]
    assert main(argv + ["--json", "--save-individual", str(saved), "Hello there", "The sky is"]) == 0
    first = json.loads(capsys.readouterr().out)
    loaded_once()
    assert len(first) == 2 and len(first[0]["token_ids"]) == 5 and len(first[0]["individual"]) == 64
    assert json.loads(saved.read_text())["individuals"][1] == first[1]["individual"]
    replay = ["generate", "--base", "random:tiny", "--mode", "causal", "--individual-scope", "sequence",
              "--max-new-tokens", "5", "--json"]
    assert main(replay + ["--individual", str(saved), "Hello there", "The sky is"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert [r["token_ids"] for r in second] == [r["token_ids"] for r in first]
    # streaming (text) output for one prompt
    assert main(["generate", "--base", "random:tiny", "--max-new-tokens", "4", "Hello"]) == 0
    assert capsys.readouterr().out.startswith("Hello")
    # bad input: exit status 2 with the message
    assert main(["generate", "--base", "random:tiny", "--mode", "beam", "Hello"]) == 2
    assert "standard, causal, traditional" in capsys.readouterr().err


def test_cli_predict(capsys, loaded_once):
    from causal_qwen.cli import main

    loaded_once()
    assert main(["predict", "--base", "random:tiny", "--top-k", "3", "--json", "The answer is"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert len(view["candidates"]) == 3 and {"median", "interval_50", "interval_90"} <= set(view["number"])
    assert view["probability_sum"] > 0
    assert main(["predict", "--base", "random:tiny", "--top-k", "2", "The answer is"]) == 0
    printed = capsys.readouterr().out
    assert "P_ovr" in printed and "sum of P_ovr over the vocabulary" in printed


def test_predict_table_lines_up_wide_tokens_and_json_keeps_them_readable(capsys, loaded_once):
    """A Chinese token takes two terminal columns: the table pads by display width, so the columns stay in line;
    ``--json`` writes non-ASCII text as itself, not as ``\\u`` escapes."""
    from causal_qwen.cli import main
    from causal_qwen.commands.predict import display_width, format_view
    from causal_qwen.evaluation.predict import NextStepView, NumberForecast, TokenCandidate

    candidates = [TokenCandidate(token_id=i, token=token, ovr_probability=0.5, loc_S=1.0, scale_S=1.0, threshold=0.0,
                                 softmax_probability=0.5, softmax_rank=i + 1)
                  for i, token in enumerate([" Paris", "巴黎", "é"])]
    number = NumberForecast(token_id=9, ovr_probability=0.1, softmax_probability=0.1, ovr_rank=3, median=1.0,
                            scale=1.0, interval_50=(0.0, 2.0), interval_90=(-5.0, 7.0))
    view = NextStepView(text="x", threshold=None, candidates=candidates, number=number, standard_choice=0,
                        traditional_choice=0, probability_sum=1.5)
    rows = format_view(view).splitlines()[2:5]
    columns = {display_width(row[: row.index("0.5")]) for row in rows}
    assert len(columns) == 1, rows

    loaded_once()
    assert main(["predict", "--base", "random:tiny", "--top-k", "1", "--json", "答案是"]) == 0
    printed = capsys.readouterr().out
    assert '"text": "答案是"' in printed and json.loads(printed)["text"] == "答案是"


# ---- low-precision models and zero exogenous noise (issue 12, bugs 1 and 2) -------------------------------
def recorded_abduction(model):
    """Collect (loc_U, scale_U) of every decoding step through a forward hook on the abduction network."""
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = model.abduction.register_forward_hook(lambda module, args, out: steps.append((out[0].clone(), out[1].clone())))
    return steps, handle


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_standard_decision_is_exact_and_agrees_with_predict(dtype):
    """loc_S − t is taken in float32: at t = 100 a bf16 difference steps by 0.5 (fp16: 0.0625) and ties the
    candidates. Every row of W_cls is ±2⁻⁵ (exact in both dtypes), so every scale_S_k is the same number and the
    decision is the order of loc_S − t alone."""
    model = convert(small_qwen(tied=False), ovr_calibration="none", ovr_threshold=100.0)
    with torch.no_grad():
        head = model.action.classification_head
        signs = torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(8)).sign()
        head.weight.copy_(signs * 2.0**-5)
    model = model.to(dtype)
    thresholds = model.ovr_thresholds()
    ids, mask = left_padded_ids(seed=3)
    steps, handle = recorded_abduction(model)
    try:
        out = generate_ids(model, ids, mask, mode="standard", max_new_tokens=10, eos_token_id=[])
    finally:
        handle.remove()
    assert len(steps) == 10
    with torch.no_grad():
        for step, (loc_U, scale_U) in enumerate(steps):
            if loc_U.dim() == 3:
                loc_U, scale_U = loc_U[:, -1], scale_U[:, -1]
            loc_S, scale_S = model.action.classify(loc_U, scale_U)  # (B,V) each, as the forward computes them
            assert torch.equal(out.token_ids[:, step], ovr_argmax_reference(loc_S, scale_S, thresholds)), step
    agree = 0
    for seed in range(12):
        prompt = torch.randint(1, 400, (1, 5), generator=torch.Generator().manual_seed(seed))
        first = generate_ids(model, prompt, mode="standard", max_new_tokens=1, eos_token_id=[])
        agree += int(first.token_ids[0, 0]) == next_step_view(model, prompt, top_k=1).standard_choice
    assert agree == 12


def test_causal_mode_with_zero_noise_decides_by_loc_minus_threshold():
    """noise_mode="zero": scale_S = |W_cls|·|b_noise| = 0, so S = loc_S(u) is certain and the decision is
    argmax_k (loc_S_k(u) − t_k) over the candidates; no overflow, no token 0 forever. The reference written out:
    ``u = loc_U + τ·ρ(g)·scale_U ⊙ c`` with ``g`` the top-two logit margin, ``ρ(g) = (π/4)·g/tan((π/2)·tanh(g/2))``,
    the candidates the ``K`` best standard scores ``(loc_S − t)/(|W_cls| scale_U)``."""
    model = convert(small_qwen(), ovr_calibration="none", noise_mode="zero", ovr_threshold=0.5)
    assert torch.all(model.action.b_noise == 0)
    tau = 1e3
    candidates = model.config.causal_candidates
    assert 0 < candidates < model.config.vocab_size
    ids, mask = left_padded_ids()
    steps, handle = recorded_abduction(model)
    try:
        out = generate_ids(model, ids, mask, **SEQUENCE, seed=5, max_new_tokens=8, eos_token_id=[],
                           causal_temperature=tau)
    finally:
        handle.remove()
    offsets = tau * torch.tan(math.pi * (out.individual - 0.5))  # (B,C) float64
    head = model.action.classification_head
    with torch.no_grad():
        for step, (loc_U, scale_U) in enumerate(steps):
            if loc_U.dim() == 3:
                loc_U, scale_U = loc_U[:, -1], scale_U[:, -1]
            loc_S = head(loc_U)  # (B,V)
            best = loc_S.topk(2, dim=-1).values.double()  # (B,2)
            g = best[:, 0] - best[:, 1]
            spread = (math.pi / 4) * g / torch.tan((math.pi / 2) * torch.tanh(g / 2))  # (B,)
            assert bool((tau * spread >= 1).all())  # all of U drawn: nothing left in the (zero) scale
            moves = torch.nn.functional.linear((scale_U.double() * offsets).float(), head.weight)  # (B,V)
            scores = loc_S + (spread[:, None] * moves.double()).float() - model.ovr_thresholds()  # W u + b − t
            standard = (loc_S - model.ovr_thresholds()) / (scale_U @ head.weight.abs().T)  # (B,V)
            kept = standard.topk(candidates, dim=-1).indices  # (B,K)
            expected = kept.gather(1, scores.gather(1, kept).argmax(-1, keepdim=True))[:, 0]
            assert torch.equal(out.token_ids[:, step], expected), step
    assert len(set(out.token_ids.flatten().tolist())) > 1, "sensible tokens, not one id forever"


def test_causal_mode_with_some_certain_rows():
    """Rows with zero scale are certain: P = 1 where loc_S > t (they win, larger loc_S − t first) and P = 0
    where loc_S ≤ t (they lose to every row with a positive scale)."""
    model = perturb(convert(small_qwen(), ovr_calibration="none", ovr_threshold=0.0))
    ids = torch.randint(1, 400, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model.action.classification_head.weight[10].zero_()  # scale 0 and loc_S = b: certain
        model.action.classification_head.weight[11].zero_()
        model.action.classification_head.bias[10] = -1.0  # P = 0: never chosen
        model.action.classification_head.bias[11] = 2.0  # P = 1: always chosen
    out = generate_ids(model, ids, mode="causal", seed=3, max_new_tokens=3, eos_token_id=[])
    assert out.token_ids.eq(11).all()
    with torch.no_grad():
        model.action.classification_head.bias[11] = -2.0  # now P = 0 as well: the uncertain rows decide
    out = generate_ids(model, ids, mode="causal", seed=3, max_new_tokens=3, eos_token_id=[])
    assert not out.token_ids.eq(10).any() and not out.token_ids.eq(11).any()


def test_an_individuals_number_is_a_draw_of_the_predictive_cauchy():
    """Over many individuals the numbers written at one position follow ``Cauchy(loc_Y, scale_Y)`` (half inside
    ``loc_Y ± scale_Y``, 90% inside ``± tan(0.45π)·scale_Y``), whatever the causal temperature."""
    model = perturb(convert(small_qwen()))
    ids = torch.randint(1, 400, (1, 6), generator=torch.Generator().manual_seed(7))
    draws = 4000
    epsilon = torch.rand(draws, model.config.causal_size, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    coordinates = torch.tan(math.pi * (epsilon - 0.5))  # (D,C)
    with torch.no_grad():
        population = model(ids)
        numbers = [
            model(ids.expand(draws, -1), decision="causal", individual=coordinates, causal_temperature=tau,
                  logits_to_keep=0).individual_Y  # (D,S)
            for tau in (1.0, 1e6)
        ]
    assert torch.equal(numbers[0], numbers[1]), "the causal temperature widens token choices only"
    z = (numbers[0] - population.loc_Y) / population.scale_Y  # (D,S) standardised
    inside_50 = (z.abs() <= 1).double().mean(0)  # (S,)
    inside_90 = (z.abs() <= math.tan(0.45 * math.pi)).double().mean(0)
    assert ((inside_50 - 0.5).abs() < 0.03).all() and ((inside_90 - 0.9).abs() < 0.02).all()


def test_a_forward_with_gradients_after_generation_reads_the_cached_scales():
    """The constant scales are cached during generation (inference mode); a later forward pass that builds a graph
    reads them without 'inference tensors cannot be saved for backward'."""
    model = convert(small_qwen())
    ids, mask = left_padded_ids()
    generate_ids(model, ids, mask, mode="causal", seed=1, max_new_tokens=2, eos_token_id=[])
    with torch.inference_mode():
        generate_ids(model, ids, mask, mode="standard", max_new_tokens=2, eos_token_id=[])
    coordinates = torch.tan(math.pi * (torch.rand(3, model.config.causal_size, dtype=torch.float64) - 0.5))
    for decision, options in (("causal", dict(individual=coordinates)), ("standard", {})):
        out = model(ids, attention_mask=mask, decision=decision, **options)
        out.logits.float().sum().backward()
        assert model.abduction.loc_net.weight.grad is not None
        model.zero_grad()


# ---------------------------------------------------------------------------------------------------------------
# The individual's reach: the spread factor ρ and the candidates
# ---------------------------------------------------------------------------------------------------------------
def test_spread_factor_makes_two_token_choices_follow_the_softmax_at_every_margin():
    """ρ(0) = 1, ρ falls with the margin, and with ρ the two-token Cauchy choice ½ − atan(g/(τρw))/π equals the
    softmax's 1/(1 + e^g) at τ = 4/(πw) for every margin g (the derivation in core/decisions.py)."""
    from causal_qwen.core.decisions import spread_factor

    margins = torch.tensor([0.0, 1e-9, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 1e4, math.inf, math.nan, -1.0])
    rho = spread_factor(margins).double()
    assert rho[0] == 1 and rho[1] == 1 and rho[-1] == 1 and rho[-2] == 1  # 0, ~0, negative and NaN count as 0
    assert bool((rho[2:10] > 0).all()) and bool((rho <= 1).all())
    assert bool((rho[1:12].diff() <= 0).all())  # less reach the surer the base
    assert float(rho[9]) < 1e-20 and float(rho[10]) == 0.0 and float(rho[11]) == 0.0
    w = 0.37
    for g in (0.1, 0.5, 1.0, 2.0, 5.0, 10.0):
        second = 0.5 - math.atan(g / ((4 / (math.pi * w)) * float(spread_factor(torch.tensor(g))) * w)) / math.pi
        assert second == pytest.approx(1 / (1 + math.exp(g)), rel=1e-5), g


def test_causal_choices_stay_among_the_candidates_at_any_temperature(small_model):
    """Even at a temperature that lets the individual's noise swamp every logit, token scope chooses among the K best
    standard-mode scores of each step (teacher forced); with K = 0 (every token) it leaves them."""
    ids, mask = left_padded_ids()
    tau = 1e9
    inside, before = [], small_model.config.causal_candidates
    for candidates in (8, 0):
        small_model.config.causal_candidates = candidates
        try:
            out = generate_ids(small_model, ids, mask, mode="causal", individual_scope="token", seed=3,
                               max_new_tokens=6, eos_token_id=[], causal_temperature=tau)
        finally:
            small_model.config.causal_candidates = before
        kept = teacher_forced_standard_top(small_model, ids, mask, out.token_ids, 8)  # (B,T,8)
        inside.append(bool((kept == out.token_ids[..., None]).any(-1).all()))
    assert inside == [True, False]


def teacher_forced_standard_top(model, ids, mask, generated, k: int) -> torch.Tensor:
    """The ``k`` best standard-mode tokens (B,T,k) before each generated token, teacher forced."""
    full = torch.cat([ids, generated], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(generated)], dim=1)
    with torch.no_grad():
        scores = model(input_ids=full, attention_mask=full_mask, decision="standard").logits  # (B,L,V)
    steps = scores[:, ids.shape[1] - 1 : -1]  # (B,T,V) the decision before each generated token
    return steps.topk(k, dim=-1).indices


def test_sampling_options_outside_traditional_mode_name_how_the_mode_decides():
    from causal_qwen.core.generation import GenerationOptions

    with pytest.raises(ValueError, match=r"temperature only applies to mode 'traditional' \(mode 'standard' decides "
                                         r"by OvR argmax\)"):
        GenerationOptions(mode="standard", temperature=0.5).check()
    with pytest.raises(ValueError, match=r"top_p only applies to mode 'traditional' \(mode 'causal' decides by its "
                                         r"individuals; causal_temperature sets their spread\)"):
        GenerationOptions(mode="causal", top_p=0.9).check()


def test_an_individual_file_that_cannot_be_read_is_named_with_what_is_wrong(tmp_path):
    from causal_qwen.commands.generate import read_individual

    with pytest.raises(ValueError, match="is a folder"):
        read_individual(str(tmp_path))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe[0.5]")
    with pytest.raises(ValueError, match="binary.json' is not valid JSON"):
        read_individual(str(binary))
    words = tmp_path / "words.json"
    words.write_text('[[0.5, "a"]]')
    with pytest.raises(ValueError, match="individual 0 holds a value that is not a number"):
        read_individual(str(words))
