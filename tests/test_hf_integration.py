"""The model as a Hugging Face citizen: labels without numbers, resize_token_embeddings, Auto classes in a
fresh interpreter (auto_map + trust_remote_code), one config object, the conversion seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from causal_qwen import CausalQwenConfig, CausalQwenForCausalLM, from_qwen

from .conftest import SMALL_NUM_ID, SMALL_VOCAB, small_qwen


def convert(base=None, **overrides) -> CausalQwenForCausalLM:
    overrides.setdefault("num_token_id", SMALL_NUM_ID)
    return from_qwen(base if base is not None else small_qwen(tied=False), **overrides)


def random_ids(batch=2, length=9, seed=0, high=SMALL_NUM_ID):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (batch, length), generator=generator)


# ---- labels without numeric_values (bug 4) ---------------------------------------------------------------
def test_labels_without_numeric_values_mean_no_numbers():
    model = convert()
    ids = random_ids()
    out = model(input_ids=ids, labels=ids)
    reference = model(input_ids=ids, labels=ids, numeric_values=torch.zeros(ids.shape))
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, reference.loss, rtol=0, atol=0)
    assert int(out.num_targets) == 0 and out.reg_loss.item() == 0.0
    out.loss.backward()
    assert model.action.classification_head.weight.grad is not None
    embeds = model.embed(ids, None)
    from_embeds = model(inputs_embeds=embeds, labels=ids)
    torch.testing.assert_close(from_embeds.loss, reference.loss)


@pytest.mark.filterwarnings("ignore:input_ids hold <NUM> tokens")  # numbers read as 0 on purpose here
def test_labels_with_a_number_target_but_no_values_is_refused():
    model = convert()
    ids = random_ids()
    ids[1, 4] = SMALL_NUM_ID
    with pytest.raises(ValueError, match=r"<NUM> target .* at position \(1, 4\).*numeric_values is None"):
        model(input_ids=ids, labels=ids)
    with pytest.raises(ValueError, match="numeric_values is None"):
        model(inputs_embeds=model.embed(ids, None), labels=ids)
    values = torch.zeros(ids.shape)
    values[1, 4] = 12.5
    assert int(model(input_ids=ids, labels=ids, numeric_values=values).num_targets) == 1
    first_only = ids.clone()
    first_only[1, 4] = 7
    first_only[0, 0] = SMALL_NUM_ID  # labels[:, 0] is never a target
    assert torch.isfinite(model(input_ids=first_only, labels=first_only).loss)


def test_bad_labels_are_named():
    model = convert()
    ids = random_ids()
    with pytest.raises(TypeError, match="labels must be an integer"):
        model(input_ids=ids, labels=ids.float())
    with pytest.raises(ValueError, match="labels has shape"):
        model(input_ids=ids, labels=ids[:, :-1])
    with pytest.raises(ValueError, match="numeric_values has shape"):
        model(inputs_embeds=model.embed(ids, None), labels=ids, numeric_values=torch.zeros(2, 3))


# ---- resize_token_embeddings (item 7) -----------------------------------------------------------------
@pytest.mark.parametrize("learnable", [False, True], ids=["buffer", "parameter"])
def test_resize_token_embeddings_then_forward_and_save_load(tmp_path, learnable):
    model = convert(ovr_threshold_kind="per_token", learnable_threshold=learnable)
    with torch.no_grad():
        thresholds = model.ovr_thresholds.values
        thresholds.copy_(torch.linspace(1.0, 3.0, SMALL_VOCAB))
    old_head = model.action.classification_head.weight.detach().clone()
    old_embed = model.model.embed_tokens.weight.detach().clone()
    old_thresholds = model.ovr_thresholds.values.detach().clone()

    model.resize_token_embeddings(SMALL_VOCAB + 8)

    new_vocab = SMALL_VOCAB + 8
    assert model.config.vocab_size == new_vocab
    assert model.model.embed_tokens.weight.shape == (new_vocab, 32)
    assert model.action.classification_head.weight.shape == (new_vocab, 32)
    assert model.action.classification_head.bias.shape == (new_vocab,)
    thresholds = model.ovr_thresholds.values
    assert thresholds.shape == (new_vocab,)
    assert isinstance(thresholds, torch.nn.Parameter) == learnable
    assert torch.equal(thresholds[:SMALL_VOCAB], old_thresholds)
    torch.testing.assert_close(thresholds[SMALL_VOCAB:], old_thresholds.mean().expand(8))
    assert torch.equal(model.action.classification_head.weight[:SMALL_VOCAB], old_head)
    assert torch.equal(model.model.embed_tokens.weight[:SMALL_VOCAB], old_embed)
    assert model.config.num_token_id == SMALL_NUM_ID

    ids = random_ids(high=new_vocab)
    ids[0, -1] = new_vocab - 1  # a new token
    with torch.no_grad():
        out = model(ids)
    assert out.loc_S.shape == (2, 9, new_vocab) and torch.isfinite(out.scale_S).all()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)

    model.save_pretrained(tmp_path)
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.vocab_size == new_vocab and loaded.ovr_thresholds.values.shape == (new_vocab,)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).loc_S, out.loc_S, rtol=0, atol=0)


def test_resize_keeps_num_and_scalar_thresholds():
    model = convert(ovr_calibration="none")
    model.resize_token_embeddings(SMALL_VOCAB - 4)  # <NUM> (500) stays inside
    assert model.action.classification_head.weight.shape[0] == SMALL_VOCAB - 4
    assert model.ovr_thresholds.values.dim() == 0
    with pytest.raises(ValueError, match="would drop <NUM>"):
        model.resize_token_embeddings(SMALL_NUM_ID)
    with pytest.raises(TypeError, match="torch.nn.Linear"):
        model.set_output_embeddings(torch.nn.Embedding(3, 32))
    with pytest.raises(ValueError, match="causal size"):
        model.set_output_embeddings(torch.nn.Linear(16, SMALL_VOCAB))


# ---- Auto classes in a fresh interpreter (item 7) ------------------------------------------------------
def test_auto_classes_load_a_saved_folder_in_a_fresh_interpreter(tmp_path):
    """Mechanism: `register_for_auto_class` (transformers' custom-model mechanism): the saved config.json
    carries ``auto_map`` and the folder a copy of the modules; AutoConfig / AutoModelForCausalLM load it with
    ``trust_remote_code=True`` without ``causal_qwen`` ever being imported."""
    model = convert()
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    saved_config = json.loads((folder / "config.json").read_text())
    assert saved_config["auto_map"] == {
        "AutoConfig": "configuration.CausalQwenConfig",
        "AutoModelForCausalLM": "modeling.CausalQwenForCausalLM",
    }
    assert (folder / "modeling.py").is_file() and (folder / "configuration.py").is_file()
    ids = random_ids()
    with torch.no_grad():
        expected = model(ids)
    expected_generation = model.generate(input_ids=ids, mode="standard", max_new_tokens=3, min_new_tokens=3, pad_token_id=0)

    script = f"""
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
folder = {str(folder)!r}
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
ids = torch.tensor({ids.tolist()!r})
with torch.no_grad():
    out = model(ids)
generated = model.generate(input_ids=ids, mode="standard", max_new_tokens=3, min_new_tokens=3, pad_token_id=0)
print(json.dumps({{
    "generated": generated.tolist(),
    "imported": sorted(name for name in sys.modules if name.split(".")[0] == "causal_qwen"),
    "config_class": type(config).__name__, "model_class": type(model).__name__,
    "model_type": config.model_type, "one_config": model.model.config is model.config,
    "loc_S": out.loc_S.tolist(), "scale_S": out.scale_S.tolist(), "loc_Y": out.loc_Y.tolist(),
}}))
"""
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["imported"] == [], "loaded without importing causal_qwen"
    assert report["config_class"] == "CausalQwenConfig" and report["model_class"] == "CausalQwenForCausalLM"
    assert report["model_type"] == "causal_qwen" and report["one_config"]
    assert report["generated"] == expected_generation.tolist(), "the folder's own code generates the same tokens"
    # The child runs on one thread: a matrix product may round one last bit differently.
    torch.testing.assert_close(torch.tensor(report["loc_S"]), expected.loc_S, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.tensor(report["scale_S"]), expected.scale_S, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.tensor(report["loc_Y"]), expected.loc_Y, rtol=1e-6, atol=1e-6)


def test_from_pretrained_of_a_plain_qwen2_folder_says_to_convert_it(tmp_path):
    """Before, the folder loaded with a warning and random heads and thresholds (a model that writes noise)."""
    small_qwen(tied=False).save_pretrained(tmp_path)
    for load in (CausalQwenForCausalLM.from_pretrained, CausalQwenConfig.from_pretrained):
        with pytest.raises(ValueError, match=r"holds a 'qwen2' model, not a CausalQwen one \(convert it first: "
                                             r"causal_qwen.from_qwen\(path\)"):
            load(tmp_path)


# ---- one config object, the seed (item 7) --------------------------------------------------------------
def test_a_converted_model_has_one_config_object():
    model = convert(ovr_calibration="none")
    assert model.model.config is model.config
    holders = [name for name, module in model.named_modules() if hasattr(module, "config")]
    assert holders and all(model.get_submodule(name).config is model.config for name in holders)


def test_conversion_seed_is_honoured():
    a = convert(ovr_calibration="none", noise_mode="uniform", seed=1)
    b = convert(ovr_calibration="none", noise_mode="uniform", seed=1)
    c = convert(ovr_calibration="none", noise_mode="uniform", seed=2)
    assert a.config.seed == 1 and c.config.seed == 2
    for name in ("numeric_embedding.direction", "action.regression_head.weight", "action.b_noise"):
        assert torch.equal(a.get_parameter(name), b.get_parameter(name)), name
        assert not torch.equal(a.get_parameter(name), c.get_parameter(name)), name
    assert convert(ovr_calibration="none").config.seed == 0
    with pytest.raises(ValueError, match="seed"):
        CausalQwenConfig(vocab_size=600, num_token_id=5, seed=-1)


def test_numeric_embedding_init_std_is_gone():
    """The draw is normalised to unit length, so a std could not change anything: the option is removed."""
    config = CausalQwenConfig(vocab_size=600, num_token_id=5)
    assert "numeric_embedding_init_std" not in config.to_dict()
    direction = convert(ovr_calibration="none").numeric_embedding.direction
    assert direction.norm().item() == pytest.approx(1.0, abs=1e-6)


def test_convert_command_passes_the_seed(tmp_path, monkeypatch):
    """``causal-qwen convert --seed 3`` converts with seed 3 (a small base stands in for the preset: the real
    conversion of random:tiny calibrates for ~14 s per new seed)."""
    from causal_qwen.cli import main
    from causal_qwen.conversion import loading

    seen = {}

    class NoTokenizer:
        def save_pretrained(self, folder):
            seen["tokenizer_saved"] = True

    def small_conversion(base, gguf_file=None, device=None, dtype=None, **overrides):
        seen.update(base=base, device=device, dtype=dtype, **overrides)
        return convert(ovr_calibration="none", **overrides).to(device=device, dtype=dtype), NoTokenizer()

    monkeypatch.setattr(loading, "convert_base", small_conversion)  # the command imports it when it runs
    out = tmp_path / "converted"
    assert main(["convert", "--base", "random:tiny", "--out", str(out), "--seed", "3", "--device", "cpu"]) == 0
    assert seen["seed"] == 3 and seen["tokenizer_saved"]
    assert (seen["device"], seen["dtype"]) == (torch.device("cpu"), torch.float32)
    model = CausalQwenForCausalLM.from_pretrained(out)
    assert model.config.seed == 3
    draw = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(3))  # w_num is drawn first
    torch.testing.assert_close(model.numeric_embedding.direction, draw / draw.norm())


# ---- from_qwen's loader arguments and settings -----------------------------------------------------------
def test_from_qwen_takes_dtype_names_and_names_a_bad_dtype_or_setting(tmp_path):
    """Before, ``dtype="bfloat16"`` (a name, as ``from_pretrained`` takes it) crashed a preset's conversion with
    "Invalid device string", a model object was converted in float32 whatever the dtype (a bad name included),
    and a misspelt setting (``ovr_calibraton=``) was stored in the config and did nothing."""
    assert convert(ovr_calibration="none", dtype="bfloat16").dtype == torch.bfloat16
    preset = from_qwen("random:tiny", dtype="bf16", ovr_calibration="none")
    assert preset.dtype == torch.bfloat16 and preset.ovr_thresholds().dtype == torch.float32
    folder = tmp_path / "qwen"
    small_qwen().save_pretrained(folder)
    assert convert(str(folder), ovr_calibration="none", dtype=torch.float16).dtype == torch.float16
    assert convert(str(folder), ovr_calibration="none", dtype="auto").dtype == torch.float32
    for base in (small_qwen(), "random:tiny", str(folder)):
        with pytest.raises(ValueError, match="unknown dtype 'banana': use one of float32, bfloat16, float16"):
            convert(base, dtype="banana")
    with pytest.raises(TypeError, match="unknown keyword 'ovr_calibraton'.*did you mean 'ovr_calibration'"):
        convert(ovr_calibraton="none")


# ---- forward as Hugging Face calls it ------------------------------------------------------------------
def test_forward_returns_a_tuple_and_the_backbones_hidden_states_and_attentions():
    """Before, ``return_dict=False`` failed inside the backbone call ('tuple' object has no attribute
    'last_hidden_state') and ``output_hidden_states`` / ``output_attentions`` were dropped from the output."""
    model = convert(ovr_calibration="none", attn_implementation="eager")  # attention weights need eager attention
    assert model.config._attn_implementation == "eager"
    ids = random_ids()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_attentions=True)
        as_tuple = model(ids, return_dict=False)
        with_loss = model(ids, labels=ids, return_dict=False)
    layers = model.config.num_hidden_layers
    assert len(out.hidden_states) == layers + 1 and len(out.attentions) == layers
    assert out.hidden_states[0].shape == out.features.shape == (2, 9, model.config.hidden_size)
    assert out.attentions[0].shape == (2, model.config.num_attention_heads, 9, 9)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], out.logits)
    assert torch.equal(with_loss[0], model(ids, labels=ids).loss)
    assert torch.equal(model(ids, labels=ids)[0], with_loss[0]), "out[0] is the loss, as for Qwen"


def test_a_decoding_loop_may_pass_the_cache_as_past_key_values():
    """Hugging Face's name for the KV cache reaches the backbone: one cached step equals the full pass."""
    model = convert(ovr_calibration="none").eval()
    ids = random_ids(batch=1, length=9)
    with torch.no_grad():
        full = model(input_ids=ids).loc_S[0, -1]  # (V,)
        prefix = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(input_ids=ids[:, -1:], past_key_values=prefix.cache).loc_S[0, -1]
        torch.testing.assert_close(step, full, rtol=0, atol=1e-4)
        other = model(input_ids=ids[:, :-1], use_cache=True).cache
        with pytest.raises(ValueError, match="give the KV cache once"):
            model(input_ids=ids[:, -1:], past_key_values=prefix.cache, cache=other)


def test_the_package_lists_its_public_names_only():
    import causal_qwen
    from causal_qwen.core.text_generation import NumericTextStreamer

    assert dir(causal_qwen) == sorted(causal_qwen.__all__)
    assert not {"importlib", "sys", "Any", "annotations"} & set(dir(causal_qwen))
    assert causal_qwen.NumericTextStreamer is NumericTextStreamer
