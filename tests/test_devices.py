"""Issue 30: devices and dtypes in every command, progress on every long step.

The device and dtype come from one place (`devices.resolve_device_and_dtype`); the calibrated scales and thresholds
stay float32 in a bfloat16 or float16 model (``model.to``, ``from_pretrained(dtype=)``), so its standard decisions are
greedy decoding's in the same dtype and its causal individual still writes its own text; the commands take
``--device``/``--dtype`` (one-line errors) and show progress bars on stderr (``--progress``, ``--quiet``).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from causal_qwen import CausalQwenForCausalLM
from causal_qwen.conversion.devices import resolve_device_and_dtype
from causal_qwen.core.decisions import cauchy_coordinates, decision_scores, sample_individual
from causal_qwen.core.text_generation import generate
from causal_qwen import from_qwen

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (tests/conftest.py)

PROMPTS = ["The capital of France is", "Once upon a time"]
HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPES = {"float32": torch.float32, **HALF_DTYPES}


@pytest.fixture(scope="module")
def models(tiny_model):
    """The calibrated random:tiny in each dtype (``model.to(dtype)``)."""
    return {name: tiny_model if dtype == torch.float32 else copy.deepcopy(tiny_model).to(dtype)
            for name, dtype in DTYPES.items()}


@pytest.fixture(scope="module")
def saved(tiny_model, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("devices") / "tiny"
    tiny_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def kept_dtypes(model) -> set:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return {t.dtype for name, t in tensors if any(name.startswith(part) for part in model.FLOAT32_PARTS)}


# ---- one place that chooses ------------------------------------------------------------------------------------
def test_device_and_dtype_are_resolved_in_one_place():
    cuda = torch.cuda.is_available()
    device, dtype = resolve_device_and_dtype()
    if not cuda and not torch.backends.mps.is_available():
        assert (device, dtype) == (torch.device("cpu"), torch.float32)
    assert resolve_device_and_dtype("cpu", "auto") == (torch.device("cpu"), torch.float32)
    for name, expected in [("bf16", torch.bfloat16), ("fp16", torch.float16), ("half", torch.float16),
                           ("FLOAT32", torch.float32), (torch.bfloat16, torch.bfloat16)]:
        assert resolve_device_and_dtype("cpu", name) == (torch.device("cpu"), expected)
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        resolve_device_and_dtype("gpu")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        resolve_device_and_dtype("cpu", "int8")
    if not cuda:
        with pytest.raises(ValueError, match="device 'cuda' is not available"):
            resolve_device_and_dtype("cuda")


# ---- the calibrated constants in every dtype -------------------------------------------------------------------
def test_small_scales_and_thresholds_stay_float32(tiny_model, models, saved):
    for name, dtype in HALF_DTYPES.items():
        model = models[name]
        assert model.dtype == dtype and kept_dtypes(model) == {torch.float32}
        assert model.model.embed_tokens.weight.dtype == dtype
        loaded = CausalQwenForCausalLM.from_pretrained(saved, dtype=dtype, device_map="cpu")
        assert loaded.dtype == dtype and kept_dtypes(loaded) == {torch.float32}
        assert torch.equal(loaded.action.b_noise, tiny_model.action.b_noise)
    assert kept_dtypes(copy.deepcopy(tiny_model).half()) == {torch.float32}
    assert kept_dtypes(copy.deepcopy(tiny_model).double()) == {torch.float64}  # wider is allowed
    with pytest.raises(ValueError, match="runs on one device"):
        from_qwen("random:tiny", device_map="auto")
    with pytest.raises(ValueError, match="runs on one device: give device_map='cpu'.*not 'gpu'"):
        from_qwen("random:tiny", device_map="gpu")  # not the commands' hint, which offers auto
    scale_U = float(torch.nn.functional.softplus(tiny_model.abduction.scale_net.bias.detach()).mean())
    assert scale_U < 6e-8  # below float16's smallest subnormal: 0 if it were computed in float16


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_decides_and_keeps_its_individual(models, tokenizer, name):
    model = models[name]
    ids = tokenizer(PROMPTS[:1], return_tensors="pt")["input_ids"]
    out = model(input_ids=ids)
    assert out.scale_U.dtype == torch.float32 and bool((out.scale_U > 0).all())
    assert torch.equal(out.scale_U, models["float32"](input_ids=ids).scale_U)  # W_scale = 0: softplus(b_scale)
    assert bool((out.scale_S > 0).all()) and out.loc_S.dtype == DTYPES[name]
    coordinates = cauchy_coordinates(sample_individual(1, model.config.causal_size, torch.Generator().manual_seed(0)))
    _, u = decision_scores(model, out.loc_U, out.scale_U, coordinates, model.config.causal_temperature)
    assert float((u != out.loc_U).float().mean()) > 0.5  # τ·scale_U·c moves u in this dtype too

    standard = generate(model, tokenizer, PROMPTS, mode="standard", max_new_tokens=5)
    greedy = generate(model, tokenizer, PROMPTS, mode="traditional", temperature=0, max_new_tokens=5)
    assert [r.token_ids for r in standard] == [r.token_ids for r in greedy]
    first, second = (generate(model, tokenizer, PROMPTS, mode="causal", seed=seed, max_new_tokens=5) for seed in (1, 2))
    assert all(a.text != b.text for a, b in zip(first, second))
    assert all(a.text != b.text for a, b in zip(first, standard))


# ---- the commands ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", DTYPES)
def test_generate_runs_in_every_dtype(models, tokenizer, saved, capsys, name):
    from causal_qwen.cli import main

    argv = ["generate", "--model", str(saved), "--device", "cpu", "--dtype", name, "--json", "--max-new-tokens", "4",
            "--mode", "causal", "--seed", "5", PROMPTS[0]]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = generate(models[name], tokenizer, PROMPTS[:1], mode="causal", seed=5, max_new_tokens=4)
    assert printed == json.loads(json.dumps([result.to_dict() for result in expected]))


def test_generate_converts_a_base_on_the_device(tiny_model, tokenizer, capsys):
    from causal_qwen.cli import main

    argv = ["generate", "--base", "random:tiny", "--device", "cpu", "--dtype", "float32", "--json",
            "--max-new-tokens", "3", PROMPTS[1]]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed[0]["text"] == generate(tiny_model, tokenizer, PROMPTS[1], max_new_tokens=3)[0].text


@pytest.mark.parametrize("flags, needle", [
    (["--device", "gpu"], "unknown device 'gpu'"),
    (["--dtype", "int4"], "unknown dtype 'int4'"),
    (["--device", "cpu", "--dtype", "double"], "unknown dtype 'double'"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda:0"], "device 'cuda:0' is not available")]))
@pytest.mark.parametrize("command", ["generate", "predict", "eval", "convert", "compare"])
def test_bad_device_or_dtype_is_a_one_line_error(tmp_path, capsys, flags, needle, command):
    from causal_qwen.cli import main

    argv = {
        "generate": ["generate", "--base", "random:tiny", "Hello"],
        "predict": ["predict", "--base", "random:tiny", "Hello"],
        "eval": ["eval", "--base", "random:tiny", "--data", str(tmp_path / "absent.jsonl")],
        "convert": ["convert", "--base", "random:tiny", "--out", str(tmp_path / "out")],
        "compare": ["compare", "--base", "random:tiny"],
    }[command]
    assert main(argv + flags) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith(f"causal-qwen {command}: error:"), lines


def test_every_model_command_takes_the_device_options():
    from causal_qwen.cli import build_parser

    parser = build_parser()
    for argv in (["generate", "--base", "b", "p"], ["predict", "--base", "b", "t"], ["eval", "--base", "b"],
                 ["convert", "--base", "b", "--out", "o"], ["compare", "--base", "b"], ["demo"],
                 ["plot", "numbers", "--base", "b", "--out", "o.png"], ["plot", "next-token", "--base", "b",
                                                                          "--text", "t", "--out", "o.png"]):
        args = parser.parse_args(argv + ["--device", "cpu", "--dtype", "bfloat16", "--quiet"])
        assert (args.device, args.dtype, args.quiet) == ("cpu", "bfloat16", True), argv


# ---- progress --------------------------------------------------------------------------------------------------
def test_convert_and_eval_show_progress(tmp_path, capsys):
    """A byte-level base (its calibration takes seconds): convert and eval with --progress write progress lines on
    stderr, with --quiet none; stdout holds only the results."""
    from causal_qwen.cli import main

    from .conftest import byte_level_tokenizer, small_qwen

    tokenizer = byte_level_tokenizer()
    small_qwen(tied=True, vocab_size=len(tokenizer), hidden_size=16).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    rows = ["day,value"] + [f"{day},{day * 0.25}" for day in range(1, 13)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    capsys.readouterr()

    assert main(["convert", "--base", str(tmp_path / "base"), "--out", str(tmp_path / "model"), "--progress"]) == 0
    err = capsys.readouterr().err
    for stage in ("reading text", "top logits", "level and scale", "causal temperature"):
        lines = [line for line in err.splitlines() if line.startswith(f"calibration: {stage}:")]
        assert len(lines) >= 2 and "100%" in lines[-1], (stage, err[-2000:])
    assert "\r" not in err  # not a terminal: whole lines

    evaluate = ["eval", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "data.csv"), "--template",
                "Day {day}: the value was {value}.", "--batch-size", "4"]
    assert main(evaluate + ["--progress"]) == 0
    captured = capsys.readouterr()
    assert "eval: documents: 100%" in captured.err and "12/12" in captured.err, captured.err
    assert "eval: bits per byte: 100%" in captured.err
    assert "eval:" not in captured.out
    assert main(evaluate + ["--quiet"]) == 0
    assert "eval:" not in capsys.readouterr().err
