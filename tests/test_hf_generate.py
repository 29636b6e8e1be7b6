"""`model.generate` (GenerationMixin) in the three modes: each step's token is the mode's decision recomputed without a
cache, numbers included."""

from __future__ import annotations

import math

import pytest
import torch

from causal_qwen import CausalQwenForCausalLM, from_qwen

from .conftest import SMALL_NUM_ID, small_qwen

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (tests/conftest.py)

MODES = ("standard", "causal", "traditional")


def perturbed_model(number_bias: float = 0.0, **overrides) -> CausalQwenForCausalLM:
    """A converted small model with a non-constant scale, noisy b_noise and a classification bias."""
    overrides.setdefault("num_token_id", SMALL_NUM_ID)
    model = from_qwen(small_qwen(), **overrides)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weight = model.abduction.scale_net.weight
        weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
        model.action.b_noise.copy_(torch.rand(model.action.b_noise.shape, generator=generator) * 0.5)
        model.action.classification_head.bias.copy_(torch.randn(model.config.vocab_size, generator=generator))
        model.action.classification_head.bias[SMALL_NUM_ID] += number_bias
    return model


def left_padded(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(3,7) ids (rows of 7, 4 and 2 real tokens, left padded with 0), the mask, and prompt numbers."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 400, (3, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    ids = ids.masked_fill(mask == 0, 0)
    ids[0, 4] = SMALL_NUM_ID
    values = torch.zeros(ids.shape)
    values[0, 4] = 37.5
    return ids, mask, values


def teacher_forced(model, mode: str, ids, mask, values, sequences, numbers, individual=None, tau=None):
    """Every generated position's decision and number, recomputed by one forward pass over the whole sequence."""
    full_mask = torch.cat([mask, torch.ones_like(sequences[:, ids.shape[1] :])], 1)
    positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
    options = {}
    if mode == "causal":
        coordinates = torch.tan(math.pi * (individual - 0.5))  # (B,C)
        options = dict(individual=coordinates, causal_temperature=model.config.causal_temperature if tau is None else tau)
    with torch.no_grad():
        out = model(sequences, numbers, attention_mask=full_mask, position_ids=positions, decision=mode, **options)
    deciding = slice(ids.shape[1] - 1, sequences.shape[1] - 1)
    number = out.individual_Y if mode == "causal" else out.loc_Y
    return out.logits[:, deciding].argmax(-1), number[:, deciding]


@pytest.mark.parametrize("number_bias", [0.0, 5.0], ids=["text", "numbers"])
@pytest.mark.parametrize("mode", MODES)
def test_model_generate_takes_the_decision_of_every_step(mode, number_bias):
    model = perturbed_model(number_bias)
    ids, mask, values = left_padded()
    options = dict(individual_scope="sequence", seed=5, causal_temperature=1.0) if mode == "causal" else {}
    hf = model.generate(
        input_ids=ids, attention_mask=mask, numeric_values=values, mode=mode, max_new_tokens=10, min_new_tokens=10,
        do_sample=False if mode == "traditional" else None, pad_token_id=0, return_dict_in_generate=True, **options,
    )
    generated = hf.sequences[:, ids.shape[1] :]
    assert torch.equal(hf.sequences[:, : ids.shape[1]], ids)
    assert hf.numeric_values.shape == hf.sequences.shape
    assert torch.equal(hf.numeric_values[:, : ids.shape[1]], values)
    decisions, numbers = teacher_forced(model, mode, ids, mask, values, hf.sequences, hf.numeric_values,
                                        hf.get("individual"), tau=1.0)
    assert torch.equal(generated, decisions), mode
    is_number = generated == SMALL_NUM_ID
    generated_values = hf.numeric_values[:, ids.shape[1] :]
    torch.testing.assert_close(generated_values[is_number], numbers[is_number].float(), rtol=1e-4, atol=1e-4)
    if number_bias:  # <NUM> every step: each value decided at a step is fed back into the next
        assert is_number.all() and (generated_values != 0).all()
        assert len(set(generated_values.flatten().tolist())) > 10, "values that depend on the context"
    else:
        assert not is_number.any() and (generated_values == 0).all()
    if mode == "causal":
        assert hf.individual.shape == (3, model.config.causal_size) and hf.seed == 5


@pytest.mark.filterwarnings("ignore:input_ids hold <NUM> tokens")  # numbers read as 0 on purpose here
def test_standard_scores_are_the_decision_scores():
    model = perturbed_model()
    ids, mask, values = left_padded()
    hf = model.generate(
        input_ids=ids, attention_mask=mask, mode="standard", max_new_tokens=1, pad_token_id=0,
        eos_token_id=None, return_dict_in_generate=True, output_logits=True,
    )
    with torch.no_grad():
        out = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
    expected = (out.loc_S[:, -1] - model.ovr_thresholds()) / out.scale_S[:, -1]
    torch.testing.assert_close(hf.logits[0], expected)


@pytest.mark.filterwarnings("ignore:input_ids hold <NUM> tokens")  # numbers read as 0 on purpose here
def test_traditional_generate_feeds_numbers_back_and_defaults_to_traditional():
    """Before, a generated <NUM> went back with value 0; now it carries loc_Y."""
    model = perturbed_model(number_bias=1e4)
    ids, mask, _ = left_padded()
    seen: list[torch.Tensor] = []
    handle = model.numeric_embedding.register_forward_hook(lambda module, args, out: seen.append(args[0].clone()))
    try:
        hf = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0,
                            eos_token_id=None, return_dict_in_generate=True)
    finally:
        handle.remove()
    generated = hf.sequences[:, ids.shape[1] :]
    assert (generated == SMALL_NUM_ID).all()
    fed = torch.cat([step[:, -1:] for step in seen[1:]], dim=1)  # (B,2): values fed at steps 2 and 3
    assert torch.equal(fed, hf.numeric_values[:, ids.shape[1] : ids.shape[1] + 2])
    assert (fed != 0).all()


def test_generate_refuses_what_it_cannot_do():
    model = perturbed_model()
    ids, mask, _ = left_padded()
    with pytest.raises(ValueError, match="mode must be one of"):
        model.generate(input_ids=ids, mode="greedy")
    with pytest.raises(ValueError, match="do_sample applies to mode 'traditional' only"):
        model.generate(input_ids=ids, mode="standard", do_sample=True)
    with pytest.raises(ValueError, match=r"do_sample applies to mode 'traditional' only \(mode 'causal' decides by "
                                         r"its individuals: seed and causal_temperature set them\)"):
        model.generate(input_ids=ids, mode="causal", do_sample=True)
    with pytest.raises(ValueError, match=r"temperature, top_p only apply to mode 'traditional', the softmax's sampling "
                                         r"\(mode 'causal' decides by its individuals"):
        model.generate(input_ids=ids, mode="causal", seed=1, temperature=1e-6, top_p=0.5)
    with pytest.raises(ValueError, match=r"top_k only applies to mode 'traditional'.*\(mode 'standard' decides by OvR"):
        model.generate(input_ids=ids, mode="standard", top_k=1)
    with pytest.raises(ValueError, match="only apply to mode 'causal'"):
        model.generate(input_ids=ids, mode="standard", individual=torch.full((3, 32), 0.5))
    with pytest.raises(ValueError, match="num_beams=2: .* decode greedily"):
        model.generate(input_ids=ids, num_beams=2)
    with pytest.raises(ValueError, match=r"num_return_sequences=3: .*input_ids.repeat_interleave\(n, dim=0\)"):
        model.generate(input_ids=ids, do_sample=True, num_return_sequences=3)
    # assisted generation feeds several candidate tokens and takes rejected ones back, which the decoding state
    # (a number and an individual per position, one step at a time) cannot: refused, never misaligned numbers
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens: assisted generation"):
        model.generate(input_ids=ids, mode="standard", prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="assistant_model: assisted generation"):
        model.generate(input_ids=ids, mode="standard", assistant_model=perturbed_model())
    model.generation_config.num_beams = 2  # the model's own config is read as Hugging Face's loop reads it
    with pytest.raises(ValueError, match="num_beams=2: .* decode greedily"):
        model.generate(input_ids=ids)


def test_generate_gives_the_prompts_numbers_back_as_they_came():
    """The tokenizer's values are float64: 16777217 and 1,234,567.89 came back from float32 as 16777216 and
    1234567.875, and a decode without the prompt's strings wrote those."""
    model = perturbed_model()
    ids = torch.tensor([[5, SMALL_NUM_ID, 7, SMALL_NUM_ID]])
    values = torch.tensor([[0.0, 16777217.0, 0.0, 1234567.89]], dtype=torch.float64)
    for mode in MODES:
        out = model.generate(ids, numeric_values=values, mode=mode, max_new_tokens=2, do_sample=False, seed=1,
                             pad_token_id=0, return_dict_in_generate=True)
        assert out.numeric_values[:, :4].tolist() == values.tolist(), mode


def test_model_generate_on_the_tiny_preset():
    """The real vocabulary size (151,936 rows), the default (calibrated) conversion, a left-padded batch."""
    model = from_qwen("random:tiny")
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(10, 150000, (2, 6), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    values = torch.zeros(ids.shape)
    for mode in MODES:
        options = dict(individual_scope="sequence", seed=1) if mode == "causal" else {}
        hf = model.generate(
            input_ids=ids, attention_mask=mask, mode=mode, max_new_tokens=6, min_new_tokens=6, do_sample=False,
            pad_token_id=0, return_dict_in_generate=True, **options,
        )
        decisions, _ = teacher_forced(model, mode, ids, mask, values, hf.sequences, hf.numeric_values,
                                      hf.get("individual"))
        assert torch.equal(hf.sequences[:, ids.shape[1] :], decisions), mode


@pytest.mark.filterwarnings("ignore:input_ids hold <NUM> tokens")  # numbers read as 0 on purpose here
def test_mode_from_a_generation_config():
    from transformers import GenerationConfig

    model = perturbed_model()
    ids, mask, _ = left_padded()
    config = GenerationConfig(mode="causal", max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    individual = torch.full((3, 32), 0.3, dtype=torch.float64)
    from_config = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, individual=individual,
                                 individual_scope="sequence")
    direct = model.generate(input_ids=ids, attention_mask=mask, mode="causal", individual=individual, max_new_tokens=4,
                            min_new_tokens=4, pad_token_id=0, individual_scope="sequence")
    assert torch.equal(from_config, direct)


def test_mode_from_the_models_own_generation_config():
    model = perturbed_model()
    ids, mask, _ = left_padded()
    options = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0, seed=3)
    direct = model.generate(**options, mode="causal")
    assert not torch.equal(model.generate(**options), direct)  # traditional, the default: another text
    model.generation_config.mode = "causal"  # as a saved generation_config.json may carry it
    assert torch.equal(model.generate(**options), direct)


@pytest.mark.parametrize("mode", ["standard", "causal", "traditional"])
def test_a_static_cache_generates_as_the_dynamic_one(mode):
    model = perturbed_model(number_bias=2.0)
    ids, mask, values = left_padded()
    options = dict(input_ids=ids, attention_mask=mask, numeric_values=values, mode=mode, max_new_tokens=5,
                   pad_token_id=0, seed=3, return_dict_in_generate=True)
    if mode == "traditional":
        options["do_sample"] = False
    dynamic = model.generate(**options)
    static = model.generate(**options, cache_implementation="static")
    assert torch.equal(static.sequences, dynamic.sequences)
    assert torch.equal(static.numeric_values, dynamic.numeric_values)


@pytest.mark.parametrize("mode", ["standard", "causal"])
def test_a_bases_repetition_penalty_does_not_move_the_modes_decisions(mode):
    """Before, the repetition penalty of the model's generation_config (a Qwen Instruct base's 1.1, kept by the
    conversion) rescaled the decision scores of the tokens seen so far, so ``model.generate(mode=...)`` wrote
    other tokens than the mode decides. A penalty given to the call still applies."""
    from transformers import GenerationConfig

    model = perturbed_model()
    ids, mask, values = left_padded()
    options = dict(individual_scope="sequence", seed=5, causal_temperature=1.0) if mode == "causal" else {}
    arguments = dict(input_ids=ids, attention_mask=mask, numeric_values=values, mode=mode, max_new_tokens=10,
                     min_new_tokens=10, pad_token_id=0, return_dict_in_generate=True, **options)
    plain = model.generate(**arguments)
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8,
                                               repetition_penalty=50.0, eos_token_id=2, pad_token_id=0)
    with_defaults = model.generate(**arguments)
    decisions, _ = teacher_forced(model, mode, ids, mask, values, with_defaults.sequences,
                                  with_defaults.numeric_values, with_defaults.get("individual"), tau=1.0)
    assert torch.equal(with_defaults.sequences[:, ids.shape[1]:], decisions)
    assert torch.equal(with_defaults.sequences, plain.sequences)
    config = GenerationConfig(max_new_tokens=10, min_new_tokens=10, pad_token_id=0)
    from_config = model.generate(input_ids=ids, attention_mask=mask, numeric_values=values, mode=mode,
                                 generation_config=config, **options)
    assert torch.equal(from_config, plain.sequences)
    penalised = model.generate(**dict(arguments, repetition_penalty=50.0))
    assert not torch.equal(penalised.sequences, plain.sequences)


@pytest.mark.filterwarnings("ignore:input_ids hold <NUM> tokens")  # numbers read as 0 on purpose here
def test_generate_returns_the_hidden_states_and_attentions_asked_for():
    """Before, ``output_hidden_states=True`` / ``output_attentions=True`` with ``return_dict_in_generate=True``
    failed inside Hugging Face's loop ('CausalQwenOutput' object has no attribute 'hidden_states')."""
    model = perturbed_model(attn_implementation="eager")
    ids, mask, _ = left_padded()
    out = model.generate(input_ids=ids, attention_mask=mask, mode="standard", max_new_tokens=3, min_new_tokens=3,
                         pad_token_id=0, return_dict_in_generate=True, output_hidden_states=True,
                         output_attentions=True)
    layers = model.config.num_hidden_layers
    assert len(out.hidden_states) == len(out.attentions) == 3  # one entry per step
    assert len(out.hidden_states[0]) == layers + 1 and out.hidden_states[0][0].shape == (3, 7, model.config.hidden_size)
    assert len(out.attentions[1]) == layers and out.attentions[1][0].shape[-2:] == (1, 8)
