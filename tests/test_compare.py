"""The conversion verification report and the convert/compare commands."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import pytest
import torch
from transformers import Qwen2ForCausalLM

from causal_qwen.cli import main
from causal_qwen.evaluation.compare import compare_models
from causal_qwen.conversion.conversion import load_qwen_base
from causal_qwen.core.modeling import CausalQwenForCausalLM
from causal_qwen.core.tokenizer import NumericTokenizer
from causal_qwen import from_qwen

from .conftest import byte_level_tokenizer, small_qwen_config


def assert_conversion_passes(report: dict) -> None:
    """The figures of a faithful conversion of a tiny preset (a `ComparisonReport.to_dict`)."""
    assert report["feature_max_abs_diff"] == 0.0
    assert report["logits_max_abs_diff"] <= 1e-5
    assert abs(report["scale_U_mean"] - report["expected_scale_U"]) <= 1e-4 and report["scale_U_std"] <= 1e-5
    assert report["num_token_id"] == 151665
    assert report["weights_identical"] and report["passed"]
    assert report["positions_after_numbers"] > 0 and report["feature_max_abs_diff_after_numbers"] > 0


@pytest.fixture(scope="module")
def tiny_pair():
    """random:tiny and its default (calibrated) conversion, built once: a conversion calibrates for many seconds.
    The tests only read them."""
    return load_qwen_base("random:tiny"), from_qwen("random:tiny")


@pytest.fixture(scope="module")
def untied_cli_run(tmp_path_factory) -> tuple[int, str, dict]:
    """``causal-qwen compare --base random:tiny-untied --json PATH``, run once: (exit status, printed text, JSON
    report). It is the untied preset's report and the command's own test (a comparison takes many seconds)."""
    path = tmp_path_factory.mktemp("compare") / "new_folder" / "report.json"  # the folder is created
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["compare", "--base", "random:tiny-untied", "--json", str(path)])
    return status, printed.getvalue(), json.loads(path.read_text())


def test_compare_report_passes_on_the_tied_preset(tiny_pair):
    qwen, causal = tiny_pair
    report = compare_models(qwen, causal, NumericTokenizer.default(), base_name="random:tiny")
    assert_conversion_passes(report.to_dict())


def test_compare_report_passes_on_the_untied_preset(untied_cli_run):
    """Converted and compared through the command (the same `convert_base` and `compare_models`)."""
    status, _, report = untied_cli_run
    assert status == 0
    assert report["base"] == "random:tiny-untied"
    assert_conversion_passes(report)


def test_compare_prints_a_small_scale_in_significant_digits(untied_cli_run):
    """The calibrated scale is far below 10⁻⁶ on a tiny preset: the printed line shows its digits, not 0.000000."""
    _, printed, report = untied_cli_run
    line = next(line for line in printed.splitlines() if line.startswith("scale_U mean"))
    assert f"(expected {report['expected_scale_U']:.6g})" in line
    assert line.split()[-1] == f"{report['scale_U_mean']:.6g}" and float(line.split()[-1]) > 0


def test_compare_detects_a_broken_conversion():
    """A small base over a byte-level vocabulary: the checks read any base alike, and a comparison over the
    151,936-row vocabulary takes many seconds. The intact conversion passes them, the broken one does not."""
    tokenizer = byte_level_tokenizer()
    config = small_qwen_config(vocab_size=len(tokenizer), hidden_size=16)
    config.max_position_embeddings = 4096  # the held-out prompts run to about 1,200 bytes
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(config).eval()
    intact = from_qwen(
        copy.deepcopy(qwen), num_token_id=tokenizer.num_token_id, ovr_calibration="none"
    )
    report = compare_models(qwen, intact, tokenizer)
    assert report.weights_identical and report.feature_max_abs_diff == 0.0 and report.logits_max_abs_diff <= 1e-5
    causal = copy.deepcopy(intact)
    causal.action.classification_head.weight.data[5] += 0.5
    report = compare_models(qwen, causal, tokenizer)
    assert not report.weights_identical and not report.passed
    assert report.logits_max_abs_diff > 1e-3
    # the held-out documentation's prompts are the most positions; without them only the given prompts
    prompts_only = compare_models(qwen, intact, tokenizer, held_out_topics=0)
    assert prompts_only.passed and 0 < prompts_only.positions_compared < report.positions_compared / 10
    with pytest.raises(ValueError, match="held_out_topics must be 0 or more"):
        compare_models(qwen, intact, tokenizer, held_out_topics=-1)


def test_compare_cli_json(untied_cli_run):
    status, printed, data = untied_cli_run
    assert status == 0
    for key in (
        "feature_max_abs_diff", "logits_max_abs_diff", "logits_max_rel_diff", "softmax_kl", "scale_U_mean",
        "scale_U_std", "num_token_id", "num_softmax_prob_max", "weights_identical", "passed",
    ):
        assert key in data, key
    assert data["passed"] is True
    assert "overall" in printed
    # greedy traditional generation of the calibrated conversion equals Qwen's, token for token
    assert data["greedy_total_tokens"] > 0 and data["greedy_match_tokens"] == data["greedy_total_tokens"]


def test_convert_cli_writes_loadable_folder(tmp_path):
    out = tmp_path / "converted"
    assert main(["convert", "--base", "random:tiny", "--out", str(out), "--decimal-comma"]) == 0
    model = CausalQwenForCausalLM.from_pretrained(out)
    assert model.config.num_token_id == 151665
    tokenizer = NumericTokenizer.from_pretrained(str(out))
    assert tokenizer.num_token_id == 151665 and tokenizer.decimal_comma  # German text: 3,5 and 1.234,5
    assert [span.value for span in tokenizer.find_numbers("3,5 Grad, 1.234,5 Euro")] == [3.5, 1234.5]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"
    plain = tmp_path / "made_by_mkdir"
    plain.mkdir()
    assert out.stat().st_mode == plain.stat().st_mode, "the model folder has a plain folder's permissions, not 0700"


def test_convert_into_the_empty_working_directory(tmp_path, monkeypatch):
    """``--out .``: the folder stays (it is the working directory) and is filled."""
    out = tmp_path / "here"
    out.mkdir()
    monkeypatch.chdir(out)
    assert main(["convert", "--base", "random:tiny", "--out", "."]) == 0
    assert (out / "config.json").is_file() and [p.name for p in tmp_path.iterdir()] == ["here"]


def test_cli_errors_name_the_problem(capsys, tmp_path):
    assert main(["compare", "--base", "random:nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["convert", "--base", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "holds no Qwen2 model" in capsys.readouterr().err
    # a name that is no file, folder, preset or hub id, and a .gguf path that does not exist: one line each, no
    # attempt to reach the hub
    assert main(["convert", "--base", "nosuchbase", "--out", str(tmp_path / "y")]) == 2
    assert "is not a preset (random:tiny" in capsys.readouterr().err
    assert main(["convert", "--base", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "z")]) == 2
    assert "GGUF file" in capsys.readouterr().err and not (tmp_path / "z").exists()
    # --gguf-file: a name missing from the folder, or given beside a preset
    assert main(["convert", "--base", str(tmp_path), "--gguf-file", "x.gguf", "--out", str(tmp_path / "z")]) == 2
    assert "--gguf-file 'x.gguf' is not a file in" in capsys.readouterr().err
    assert main(["convert", "--base", "random:tiny", "--gguf-file", "x.gguf", "--out", str(tmp_path / "z")]) == 2
    assert "is a preset: leave --gguf-file out" in capsys.readouterr().err
    # --model naming a file of the model folder, not the folder
    (tmp_path / "config.json").write_text("{}")
    assert main(["generate", "--model", str(tmp_path / "config.json"), "hi"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_compare_refuses_a_json_path_it_cannot_write_before_any_work(tmp_path, capsys):
    folder = tmp_path / "reports"
    folder.mkdir()
    assert main(["compare", "--base", str(tmp_path / "no_base"), "--json", str(folder)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"causal-qwen compare: error: cannot write {str(folder)!r}: it is a folder; name a file"


def test_compare_refuses_an_empty_prompt_before_any_work(tmp_path, capsys):
    assert main(["compare", "--base", str(tmp_path / "no_base"), "--prompt", "a", "--prompt", ""]) == 2
    assert capsys.readouterr().err.strip() == "causal-qwen compare: error: --prompt 1 is empty"
