"""CausalQwenForCausalLM: exact conversion, forward outputs, save/load, bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from causal_qwen import CausalQwenConfig, CausalQwenForCausalLM, from_qwen
from causal_qwen.conversion.conversion import load_qwen_base
from causal_qwen.core import cauchy

from .conftest import SMALL_NUM_ID, SMALL_VOCAB, small_qwen


def convert(base, **overrides) -> CausalQwenForCausalLM:
    overrides.setdefault("num_token_id", SMALL_NUM_ID)
    return from_qwen(base, **overrides)


def random_ids(batch=2, length=10, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL_NUM_ID, (batch, length), generator=generator)


@torch.no_grad()
def test_conversion_reproduces_qwen_exactly(small_base):
    reference = small_qwen(tied=small_base.config.tie_word_embeddings)
    model = convert(small_base)
    ids = random_ids()
    qwen_out = reference(ids, output_hidden_states=True)
    out = model(ids)
    assert torch.equal(out.features, qwen_out.hidden_states[-1])
    assert torch.equal(out.loc_U, out.features)
    assert (out.loc_S - qwen_out.logits).abs().max() <= 1e-5
    assert torch.equal(out.logits, out.loc_S)
    profile = torch.nn.functional.softplus(model.abduction.scale_net.bias)  # (C,) the calibrated per-component scale
    assert torch.allclose(out.scale_U, profile.expand_as(out.scale_U), rtol=1e-5)  # the same at every position
    assert out.loc_S.shape == (2, 10, SMALL_VOCAB) and out.loc_Y.shape == (2, 10)


@torch.no_grad()
def test_initialisation_table(small_base):
    """The literal table (``ovr_calibration="none"``); the calibrated default is tested in test_calibration.py."""
    model = convert(small_base, ovr_calibration="none")
    lm_head = small_qwen(tied=small_base.config.tie_word_embeddings).lm_head.weight
    head = model.action.classification_head
    assert torch.equal(head.weight, lm_head) and torch.all(head.bias == 0)
    assert head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "a clone, not a tie"
    assert model.numeric_embedding.direction.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(model.action.b_noise == 0.1)
    assert model.ovr_thresholds().item() == 100.0
    assert torch.equal(model.abduction.loc_net.weight, torch.eye(32))
    reg_std = model.action.regression_head.weight.std().item()
    assert 0.5 / 32**0.5 < reg_std < 2.0 / 32**0.5
    assert model.config.tie_word_embeddings is False


def test_scale_and_decision_formulas():
    model = convert(small_qwen())
    with torch.no_grad():
        model.abduction.scale_net.weight.normal_(0, 0.1)
        model.action.b_noise.uniform_(-0.3, 0.3)
        out = model(random_ids())
    s = out.scale_U + model.action.b_noise.abs()
    w = model.action.classification_head.weight
    gamma = model.action.token_noise_scale().detach()  # () γ_S, set by the calibration
    assert float(gamma) > 0
    torch.testing.assert_close(out.scale_S, s @ w.abs().T + gamma)
    torch.testing.assert_close(out.loc_S, out.loc_U @ w.T + model.action.classification_head.bias)
    w_reg = model.action.regression_head.weight
    torch.testing.assert_close(out.scale_Y, (s @ w_reg.abs().T).squeeze(-1))


def test_numbers_own_noise_adds_to_the_regression_scale_only(tmp_path):
    """``number_noise_init``: ``scale_Y = s @ |W_reg|ᵀ + softplus(w_η · loc_U + b_η)``, starting at the given
    value; token decisions, ``loc_Y`` and a save/load round trip are unaffected; the NLL trains ``w_η``."""
    base = small_qwen()
    plain, noisy = convert(base), convert(base, number_noise_init=2.5)
    assert plain.action.number_noise is None
    ids = random_ids()
    values = torch.zeros(ids.shape)
    with torch.no_grad():
        a, b = plain(ids), noisy(ids)
    torch.testing.assert_close(b.scale_Y, a.scale_Y + 2.5)
    assert torch.equal(a.loc_Y, b.loc_Y) and torch.equal(a.loc_S, b.loc_S) and torch.equal(a.scale_S, b.scale_S)

    with torch.no_grad():
        noisy.action.number_noise.weight.normal_(0, 0.05)
        expected = torch.nn.functional.softplus(b.loc_U @ noisy.action.number_noise.weight
                                                + noisy.action.number_noise.bias)
        torch.testing.assert_close(noisy(ids).scale_Y, a.scale_Y + expected)  # a different width per position

    noisy.save_pretrained(tmp_path)
    reloaded = CausalQwenForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config.number_noise_init == 2.5
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).scale_Y, noisy(ids).scale_Y)

    labels = ids.clone()
    labels[:, 5] = SMALL_NUM_ID
    values[:, 5] = 7.0
    ids[:, 5] = SMALL_NUM_ID
    noisy(input_ids=ids, numeric_values=values, labels=labels).loss.backward()
    assert noisy.action.number_noise.weight.grad.abs().sum() > 0

    plain.save_pretrained(tmp_path / "plain")  # a checkpoint without the noise, loaded with it: starts at the value
    added = CausalQwenForCausalLM.from_pretrained(tmp_path / "plain", number_noise_init=1.5)
    assert torch.all(added.action.number_noise.weight == 0)
    assert torch.nn.functional.softplus(added.action.number_noise.bias).item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match="number_noise_init"):
        CausalQwenConfig(number_noise_init=-1.0)


def test_token_noise_round_trips_and_a_checkpoint_without_it_loads_with_none(tmp_path):
    """The calibrated ``γ_S`` survives save/load; a checkpoint written before the token noise existed (no tensor, no
    config field) loads with ``γ_S = 0`` and every other weight as saved."""
    import json

    from safetensors.torch import load_file, save_file

    model = convert(small_qwen())
    assert float(model.action.token_noise_scale().detach()) > 0
    model.save_pretrained(tmp_path / "calibrated")
    reloaded = CausalQwenForCausalLM.from_pretrained(tmp_path / "calibrated")
    assert torch.equal(reloaded.action.token_noise, model.action.token_noise)
    assert reloaded.config.token_noise_init == pytest.approx(float(model.action.token_noise_scale().detach()))

    old = tmp_path / "old"
    model.save_pretrained(old)
    weights_file = old / "model.safetensors"
    tensors = load_file(weights_file)
    del tensors["action.token_noise"]
    save_file(tensors, weights_file, metadata={"format": "pt"})
    config = json.loads((old / "config.json").read_text())
    del config["token_noise_init"]
    (old / "config.json").write_text(json.dumps(config))
    loaded = CausalQwenForCausalLM.from_pretrained(old)
    assert float(loaded.action.token_noise.detach()) == 0.0
    assert torch.equal(loaded.action.regression_head.weight, model.action.regression_head.weight)
    assert torch.equal(loaded.action.b_noise, model.action.b_noise)
    assert torch.equal(loaded.ovr_thresholds.values, model.ovr_thresholds.values)
    with pytest.raises(ValueError, match="token_noise_init"):
        CausalQwenConfig(token_noise_init=-1.0)


def test_numeric_value_enters_embedding_only_at_num_positions():
    model = convert(small_qwen())
    ids = random_ids(1, 6)
    ids[0, 3] = SMALL_NUM_ID
    values = torch.zeros(1, 6)
    values[0, 3] = 42.0
    plain = model.embed(ids, None)
    with_number = model.embed(ids, values)
    assert torch.equal(plain[0, :3], with_number[0, :3])
    expected = plain[0, 3] + torch.log1p(torch.tensor(42.0)) * model.numeric_embedding.direction
    torch.testing.assert_close(with_number[0, 3], expected)


def test_save_and_load_round_trip_with_auto_classes(tmp_path):
    model = convert(small_qwen(tied=False), ovr_threshold_kind="per_token", learnable_threshold=True)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, CausalQwenConfig) and config.ovr_threshold_kind == "per_token"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, CausalQwenForCausalLM)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    ids = random_ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).loc_S, loaded(ids).loc_S, rtol=0, atol=0)


def test_logits_to_keep_evaluates_heads_on_last_positions_only():
    model = convert(small_qwen())
    ids = random_ids()
    with torch.no_grad():
        full = model(ids)
        last = model(ids, logits_to_keep=1)
    assert last.loc_S.shape == (2, 1, SMALL_VOCAB)
    torch.testing.assert_close(last.loc_S[:, 0], full.loc_S[:, -1])


def test_vocabulary_grows_by_one_row_without_reserved_slot(caplog):
    base = small_qwen()
    with caplog.at_level("WARNING"):
        model = from_qwen(base)
    assert "grows by one row" in caplog.text
    assert model.config.num_token_id == SMALL_VOCAB and model.config.vocab_size == SMALL_VOCAB + 1
    assert model.model.embed_tokens.weight.shape[0] == SMALL_VOCAB + 1
    ids = random_ids()
    with torch.no_grad():
        out = model(ids)
        torch.testing.assert_close(out.loc_S[..., :SMALL_VOCAB], small_qwen()(ids).logits, rtol=0, atol=1e-5)


class TestBadInput:
    def setup_method(self):
        self.model = convert(small_qwen())
        self.ids = random_ids(1, 5)
        self.ids[0, 2] = SMALL_NUM_ID

    def test_non_finite_numeric_value(self):
        values = torch.zeros(1, 5)
        values[0, 2] = float("nan")
        with pytest.raises(ValueError, match="non-finite"):
            self.model(self.ids, numeric_values=values)

    def test_value_at_non_num_position(self):
        values = torch.zeros(1, 5)
        values[0, 1] = 3.0
        with pytest.raises(ValueError, match=r"not a <NUM> token"):
            self.model(self.ids, numeric_values=values)

    def test_mismatched_shapes(self):
        with pytest.raises(ValueError, match="numeric_values has shape"):
            self.model(self.ids, numeric_values=torch.zeros(1, 4))
        with pytest.raises(ValueError, match="attention_mask has shape"):
            self.model(self.ids, attention_mask=torch.ones(2, 5), numeric_values=torch.zeros(1, 5))
        with pytest.raises(ValueError, match="labels has shape"):
            self.model(self.ids, labels=torch.zeros(1, 3, dtype=torch.long), numeric_values=torch.zeros(1, 5))

    def test_num_tokens_without_numeric_values_warn(self):
        with pytest.warns(UserWarning, match="<NUM> tokens but no numeric_values"):
            self.model(self.ids)
        with pytest.warns(UserWarning, match="<NUM> tokens but no numeric_values"):  # generate fills in zeros itself
            self.model.generate(self.ids, mode="standard", max_new_tokens=1)

    def test_generate_names_an_empty_prompt(self):
        with pytest.raises(ValueError, match="the prompt is empty"):
            self.model.generate(torch.zeros(1, 0, dtype=torch.long), mode="standard", max_new_tokens=1)
        ids = torch.cat([self.ids, self.ids])  # (2,5)
        mask = torch.ones_like(ids)
        mask[1] = 0  # row 1 is padding only: an empty prompt in a batch
        with pytest.raises(ValueError, match=r"prompt row 1 is empty \(its attention_mask is all 0\)"):
            self.model.generate(ids, attention_mask=mask, numeric_values=torch.zeros(2, 5), mode="standard",
                                max_new_tokens=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.model(self.ids, numeric_values=torch.zeros(1, 5))
            self.model(torch.where(self.ids == SMALL_NUM_ID, 0, self.ids))  # no <NUM>: nothing to say

    def test_inputs_embeds_carry_the_numbers(self):
        """``numeric_values`` beside ``inputs_embeds`` were dropped without a word (and ``input_ids`` beside them)."""
        values = torch.zeros(1, 5)
        values[0, 2] = 12.5
        embeds = self.model.embed(self.ids, values)
        with torch.no_grad():
            torch.testing.assert_close(self.model(inputs_embeds=embeds).loc_S, self.model(self.ids, values).loc_S,
                                       rtol=0, atol=0)
        with pytest.raises(ValueError, match="numeric_values enter through the embedding, which inputs_embeds replace"):
            self.model(inputs_embeds=self.model.embed(self.ids, None), numeric_values=values)
        with pytest.raises(ValueError, match="input_ids or inputs_embeds, not both"):
            self.model(self.ids, inputs_embeds=embeds)
        assert int(self.model(inputs_embeds=embeds, numeric_values=values, labels=self.ids).num_targets) == 1
        with pytest.raises(ValueError, match="not as inputs_embeds"):
            self.model.generate(inputs_embeds=embeds, mode="standard", max_new_tokens=1)

    def test_generate_names_an_empty_batch(self):
        with pytest.raises(ValueError, match=r"at least one prompt, got input_ids of shape \(0, 5\)"):
            self.model.generate(torch.zeros(0, 5, dtype=torch.long), mode="standard", max_new_tokens=1)

    def test_numeric_values_wrong_type(self):
        with pytest.raises(TypeError, match="numeric_values must be a torch.Tensor"):
            self.model(self.ids, numeric_values=[0.0] * 5)

    def test_bad_config_values(self):
        with pytest.raises(ValueError, match="noise_mode"):
            CausalQwenConfig(vocab_size=600, num_token_id=5, noise_mode="gaussian")
        with pytest.raises(ValueError, match="initial_scale"):
            CausalQwenConfig(vocab_size=600, num_token_id=5, initial_scale=-1.0)
        with pytest.raises(ValueError, match="num_token_id"):
            CausalQwenConfig(vocab_size=600, num_token_id=600)


class TestBaseLoading:
    def test_unknown_preset_lists_presets(self):
        with pytest.raises(ValueError, match="random:tiny"):
            load_qwen_base("random:huge")

    def test_unknown_base(self):
        with pytest.raises(ValueError, match="unknown base"):
            load_qwen_base("no-such-thing")

    def test_folder_without_model(self, tmp_path):
        with pytest.raises(ValueError, match="holds no Qwen2 model"):
            load_qwen_base(tmp_path)

    def test_folder_with_other_model_type(self, tmp_path):
        (tmp_path / "config.json").write_text('{"model_type": "bert"}')
        with pytest.raises(ValueError, match="not a Qwen2 model"):
            load_qwen_base(tmp_path)
        (tmp_path / "config.json").write_text('{"hidden_size": 8}')
        with pytest.raises(ValueError, match="names no model_type, so it is no Qwen2 model"):
            load_qwen_base(tmp_path)

    def test_converted_folder_says_how_to_load_it(self, tmp_path):
        (tmp_path / "config.json").write_text('{"model_type": "causal_qwen"}')
        with pytest.raises(ValueError, match="not a Qwen2 model: it is converted already: give it as --model "
                                             r"\(or load it with CausalQwenForCausalLM.from_pretrained"):
            load_qwen_base(tmp_path)

    def test_wrong_type(self):
        with pytest.raises(TypeError, match="base must be"):
            load_qwen_base(3)

    def test_local_folder_round_trip(self, tmp_path):
        base = small_qwen(tied=False)
        base.save_pretrained(tmp_path)
        model = from_qwen(str(tmp_path), num_token_id=SMALL_NUM_ID)
        ids = random_ids()
        with torch.no_grad():
            torch.testing.assert_close(model(ids).loc_S, base(ids).logits, rtol=0, atol=1e-5)
