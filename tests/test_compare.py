"""The conversion verification report and the convert/compare commands."""

from __future__ import annotations

import json

import pytest

from causal_qwen.cli import main
from causal_qwen.conversion.compare import compare_models
from causal_qwen.conversion.conversion import load_qwen_base
from causal_qwen.core.modeling import CausalQwenForCausalLM
from causal_qwen.core.tokenizer import NumericTokenizer


@pytest.mark.parametrize("preset", ["random:tiny", "random:tiny-untied"])
def test_compare_report_passes_on_presets(preset):
    qwen = load_qwen_base(preset)
    causal = CausalQwenForCausalLM.from_qwen(preset)
    report = compare_models(qwen, causal, NumericTokenizer.default(), base_name=preset)
    assert report.feature_max_abs_diff == 0.0
    assert report.logits_max_abs_diff <= 1e-5
    assert abs(report.scale_U_mean - report.expected_scale_U) <= 1e-4 and report.scale_U_std <= 1e-5
    assert report.num_token_id == 151665
    assert report.weights_identical and report.passed
    assert report.positions_after_numbers > 0 and report.feature_max_abs_diff_after_numbers > 0


def test_compare_detects_a_broken_conversion():
    qwen = load_qwen_base("random:tiny")
    causal = CausalQwenForCausalLM.from_qwen("random:tiny")
    causal.action.classification_head.weight.data[5] += 0.5
    report = compare_models(qwen, causal, NumericTokenizer.default())
    assert not report.weights_identical and not report.passed
    assert report.logits_max_abs_diff > 1e-3


def test_compare_cli_json(capsys, tmp_path):
    path = tmp_path / "report.json"
    status = main(["compare", "--base", "random:tiny-untied", "--json", str(path)])
    assert status == 0
    data = json.loads(path.read_text())
    for key in (
        "feature_max_abs_diff", "logits_max_abs_diff", "logits_max_rel_diff", "softmax_kl", "scale_U_mean",
        "scale_U_std", "num_token_id", "num_softmax_prob_max", "weights_identical", "passed",
    ):
        assert key in data, key
    assert data["passed"] is True
    assert "overall" in capsys.readouterr().out


def test_convert_cli_writes_loadable_folder(tmp_path):
    out = tmp_path / "converted"
    assert main(["convert", "--base", "random:tiny", "--out", str(out)]) == 0
    model = CausalQwenForCausalLM.from_pretrained(out)
    assert model.config.num_token_id == 151665
    assert NumericTokenizer.from_pretrained(str(out)).num_token_id == 151665
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_cli_errors_name_the_problem(capsys, tmp_path):
    assert main(["compare", "--base", "random:nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["convert", "--base", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "holds no Qwen2 model" in capsys.readouterr().err
