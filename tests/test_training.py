"""Training with `transformers.Trainer`: metrics.jsonl, final model, resume, freezing, LoRA, DDP (gloo), errors.

A 2-layer width-32 Qwen2 with the real Qwen2.5 vocabulary rows (the real tokenizer's ids reach 151665)
and a 48-row CSV whose rows all tokenize to the same length, so one process with batch 4 and two
processes with batch 2 see the same global batches and the same per-process token counts.
"""

from __future__ import annotations

import copy
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback

from causal_qwen import CausalQwenForCausalLM, from_qwen
from causal_qwen.cli import main as cli_main
from causal_qwen.training.monitoring import read_metrics
from causal_qwen.training.parameter_groups import parameter_group
from causal_qwen.training.train_config import TrainConfig
from causal_qwen.training.training import run_training

from .conftest import small_qwen

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = "Day {day}: the value was {value} units."
QWEN25_ROWS = 151936


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    from causal_qwen.core.tokenizer import NumericTokenizer

    root = tmp_path_factory.mktemp("train_assets")
    NumericTokenizer.default().save_pretrained(root / "tokenizer")
    small_qwen(tied=True, vocab_size=QWEN25_ROWS).save_pretrained(root / "base")
    rows = ["day,value"] + [f"{day},{(day * 37) % 50 / 4}" for day in range(1, 49)]
    (root / "data.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def initial(assets) -> CausalQwenForCausalLM:
    """The default (calibrated) conversion of the base, which every run here starts from. Built once and only
    read: calibrating a 151,936-row head takes many seconds, and runs converting the same base file in this
    process reuse its calibration."""
    return from_qwen(str(assets / "base"))


@pytest.fixture(scope="module")
def converted(assets, initial) -> Path:
    """`initial` saved as a CausalQwen folder, for runs in other processes (each would calibrate again)."""
    folder = assets / "converted"
    initial.save_pretrained(folder)
    return folder


def settings(assets: Path, out: Path, **overrides) -> dict:
    values = dict(
        model=str(assets / "base"),
        tokenizer=str(assets / "tokenizer"),
        data=str(assets / "data.csv"),
        template=TEMPLATE,
        output_dir=str(out),
        seed=0,
        max_steps=3,
        batch_size=4,
        max_length=32,
        learning_rate=1e-2,
        backbone_learning_rate=1e-3,
        lr_scheduler_type="linear",
        logging_steps=1,
        eval_steps=0,
        save_steps=0,
        report_to=["none"],
        progress_bar=False,
        monitor_positions=8,
        model_config={"ovr_negatives": 256},  # sampled negatives: fast steps (the Trainer restores the RNG on resume)
        # every recipe setting given, so these tests see one fixed set-up whatever the recipes become
        regression_learning_rate=1e-3, numeric_embedding_learning_rate=1e-3, warmup_steps=0.1, freeze_backbone=False,
        freeze_decision_scale=True, regression_warm_start=False, num_token_warm_start=False, interval_check=False,
    )
    values.update(overrides)
    return values


def config(assets: Path, out: Path, **overrides) -> TrainConfig:
    return TrainConfig(**settings(assets, out, **overrides)).validate("test")


def train_records(path: Path) -> list[dict]:
    return [record for record in read_metrics(path) if "loss" in record]


def backbone_state(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if parameter_group(name) == "backbone"}


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


# ---- a run, and resuming it ------------------------------------------------------------------------------
def test_resume_matches_uninterrupted_run(assets, tmp_path):
    common = dict(max_steps=4, save_steps=2, save_total_limit=1, validation_split=0.1, eval_steps=4,
                  max_eval_samples=2, report_to=["tensorboard"])
    straight = run_training(config(assets, tmp_path / "straight", **common))

    records = read_metrics(straight.metrics_file)
    steps = train_records(straight.metrics_file)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for key in ("loss", "cls_loss", "reg_loss", "lr", "lr_backbone", "lr_numeric_embedding", "token_accuracy",
                "p_target", "scale_U_mean", "loc_U_norm", "number_nll", "grad_norm_abduction", "grad_norm_action"):
        assert all(key in r for r in steps), key
    assert steps[0]["loss"] == pytest.approx(steps[0]["cls_loss"] + steps[0]["reg_loss"], rel=1e-5)
    assert [r["step"] for r in records if "eval_loss" in r] == [4]
    assert "eval_cls_loss" in records[-1] and "eval_reg_loss" in records[-1]
    assert list((straight.output_dir / "runs").rglob("events.out.tfevents*")), "TensorBoard events"
    assert sorted(p.name for p in straight.output_dir.glob("checkpoint-*")) == ["checkpoint-4"], "keeps the last 1"

    interrupted = tmp_path / "interrupted"
    run_training(config(assets, interrupted, **common), callbacks=[StopAt(3)])
    assert (interrupted / "checkpoint-2").is_dir() and not (interrupted / "checkpoint-4").exists()
    with pytest.raises(ValueError, match="already holds checkpoints.*--resume"):
        run_training(config(assets, interrupted, **common))
    with pytest.raises(ValueError, match=r"--resume: .* other settings \(template: .* there, 'Seen {x} now' now; "
                                         r"max_length: 32 there, 16 now\).*train_config.yaml"):
        run_training(config(assets, interrupted, **common, template="Seen {x} now", max_length=16), resume=True)
    saved_file = interrupted / "train_config.yaml"
    saved = yaml.safe_load(saved_file.read_text())
    del saved["model_config"]["number_noise_init"]  # an older version's file: an entry it lacks is not compared
    saved_file.write_text(yaml.safe_dump(saved))
    with pytest.raises(ValueError, match=r"model_config: \{.*'ovr_negatives': 256.*\} there"):
        run_training(config(assets, interrupted, **common, model_config={"ovr_negatives": 128}), resume=True)
    resumed = run_training(config(assets, interrupted, **common), resume=True)

    assert resumed.global_step == 4
    again = train_records(resumed.metrics_file)
    assert [r["step"] for r in again] == [1, 2, 3, 4], "records after the checkpoint are replaced"
    for a, b in zip(steps[2:], again[2:]):
        for key in ("loss", "cls_loss", "reg_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-6), (a["step"], key)
    first = CausalQwenForCausalLM.from_pretrained(straight.final_dir)
    second = CausalQwenForCausalLM.from_pretrained(resumed.final_dir)
    for (name, p), q in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), name
    assert (straight.final_dir / "tokenizer.json").is_file()


# ---- freezing --------------------------------------------------------------------------------------------
def test_frozen_backbone_is_bit_identical_and_heads_change(assets, tmp_path):
    result = run_training(config(assets, tmp_path, freeze_backbone=True, max_steps=2))
    base = small_qwen(tied=True, vocab_size=QWEN25_ROWS)
    trained = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    for name, param in base.model.named_parameters():
        assert torch.equal(trained.model.get_parameter(name), param), name
    assert not torch.equal(trained.action.classification_head.weight, base.lm_head.weight)
    assert not torch.equal(trained.abduction.loc_net.weight, torch.eye(32))


def test_feature_cache_trains_the_heads_as_the_backbone_would(assets, converted, tmp_path):
    """A frozen backbone and numeric embedding: the run that caches the backbone's features once trains the same
    heads, step for step, as the run that runs the backbone every step (and says it cached them)."""
    frozen = dict(freeze_backbone=True, numeric_embedding_learning_rate=0.0, max_steps=3, model=str(converted),
                  regression_warm_start=1e-3, num_token_warm_start=1e-2)
    lines: list[str] = []
    cached = run_training(config(assets, tmp_path / "cached", cache_backbone_features=None, **frozen),
                          report=lines.append)
    assert any(line.startswith("feature cache: the frozen backbone read 48 training examples once") for line in lines), lines
    plain = run_training(config(assets, tmp_path / "plain", cache_backbone_features=False, **frozen))
    assert cached.train_loss == pytest.approx(plain.train_loss, rel=1e-5)
    with_cache = CausalQwenForCausalLM.from_pretrained(cached.final_dir).state_dict()
    without = CausalQwenForCausalLM.from_pretrained(plain.final_dir).state_dict()
    for name, value in without.items():
        torch.testing.assert_close(with_cache[name], value, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="cache_backbone_features needs a backbone and numeric embedding frozen"):
        config(assets, tmp_path / "bad", cache_backbone_features=True, freeze_backbone=False)


def decision_scale(model) -> dict[str, torch.Tensor]:
    return {"W_scale": model.abduction.scale_net.weight, "b_scale": model.abduction.scale_net.bias,
            "b_noise": model.action.b_noise, "token_noise": model.action.token_noise}


@pytest.mark.parametrize("lora", [False, True])
def test_decision_scale_stays_as_converted_by_default(assets, initial, tmp_path, lora):
    """``freeze_decision_scale`` (default true): W_scale, b_scale and b_noise keep their converted values, also
    through peft's trainable copies of the heads, while the rest of the heads learn."""
    result = run_training(config(assets, tmp_path, max_steps=2, lora=lora, lora_r=4))
    converted = decision_scale(initial)
    trained_model = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    for name, value in decision_scale(trained_model).items():
        assert torch.equal(value, converted[name]), name
    assert not torch.equal(trained_model.abduction.loc_net.weight, torch.eye(32)), "the rest of the heads train"


def test_decision_scale_trains_when_asked(assets, initial, tmp_path):
    result = run_training(config(assets, tmp_path, max_steps=2, freeze_decision_scale=False))
    converted = decision_scale(initial)
    trained = decision_scale(CausalQwenForCausalLM.from_pretrained(result.final_dir))
    assert not torch.equal(trained["b_scale"], converted["b_scale"])
    assert not torch.equal(trained["b_noise"], converted["b_noise"])
    assert not torch.equal(trained["token_noise"], converted["token_noise"])


def test_warm_starts_set_the_heads_to_their_fits(assets, initial, tmp_path):
    """``regression_warm_start: λ``: before the first step the regression head is the ridge fit of the training
    numbers on the converted model's features, and the numbers' own noise its median absolute out-of-fold residual;
    ``num_token_warm_start: λ``: the classification head's ``<NUM>`` row is the offset-logistic fit on the same
    pass. With their learning rates at 0 the final model keeps both."""
    from causal_qwen.core.tokenizer import NumericTokenizer
    from causal_qwen.training.collator import NumericCollator
    from causal_qwen.training.readout_steps import keep_check_slice, out_of_fold_order
    from causal_qwen.training.training import read_split_documents, tokenize_datasets
    from causal_qwen.training.warm_start import offset_logistic_fit, out_of_fold_residuals, read_positions, ridge_fit
    from causal_qwen.core.numbers import decimals_written

    model_config = {"ovr_negatives": 256, "number_noise_init": 1.0}
    run = config(assets, tmp_path, max_steps=1, regression_warm_start=1e-3, regression_learning_rate=0.0,
                 num_token_warm_start=1e-2, learning_rate=0.0, freeze_backbone=True, model_config=model_config)
    lines: list[str] = []
    result = run_training(run, report=lines.append)
    trained = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    assert any(line.startswith("warm start: reading batch 1 of") for line in lines), lines
    assert any(line.startswith("regression warm start:") for line in lines), lines
    assert any(line.startswith("<NUM> warm start:") for line in lines), lines

    tokenizer = NumericTokenizer.from_pretrained(str(assets / "tokenizer"))
    train_docs, valid_docs = read_split_documents(run)
    train_docs, _ = keep_check_slice(run, train_docs)
    dataset, _ = tokenize_datasets(run, tokenizer, out_of_fold_order(run, train_docs), valid_docs)  # training's order
    batches = [NumericCollator(pad_token_id=tokenizer.pad_token_id)([dataset[i] for i in range(start, min(start + 4, len(dataset)))])
               for start in range(0, len(dataset), 4)]
    reference = from_qwen(str(assets / "base"), **model_config)  # the run's starting point
    positions = read_positions(reference.eval(), batches, token_positions=10**6)
    features, values = positions.number_features, positions.number_values
    assert len(values) == 2 * len(dataset)  # "day" and "value": two numbers per sentence
    weight, bias = ridge_fit(features, values, 1e-3)
    head = trained.action.regression_head
    torch.testing.assert_close(head.weight[0].double(), weight, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(head.bias[0].double(), bias, rtol=1e-4, atol=1e-6)
    spread = float(out_of_fold_residuals(features, values, 1e-3).abs().median())  # γ_Y: out-of-fold residuals
    noise = torch.nn.functional.softplus(trained.action.number_noise.bias).item()
    assert noise == pytest.approx(spread, rel=1e-4)
    with torch.no_grad():
        converted = reference.action.regression_head(features.float())[:, 0].double()
    converted_error = float((converted - values).abs().median())
    assert spread < converted_error  # the fit reads the numbers better than the random head

    scored = torch.arange(len(values)) % 2 == 1  # "value", the second number of each sentence
    targeted = run_training(config(assets, tmp_path / "target", max_steps=1, regression_warm_start=1e-3,
                                   regression_learning_rate=0.0, learning_rate=0.0, freeze_backbone=True,
                                   model_config=model_config, target="value"), report=lines.append)
    assert any(f"(fitted to its {len(dataset)} targets)" in line for line in lines), lines
    kept = CausalQwenForCausalLM.from_pretrained(targeted.final_dir)
    written = [f"{(day * 37) % 50 / 4}" for day in range(1, 49)]  # the value column as data.csv writes it
    assert decimals_written(written) == 1  # 24 values such as 9.5 or 3.0, 24 such as 9.25: a tie goes to fewer
    saved = NumericTokenizer.from_pretrained(str(targeted.final_dir))
    assert saved.number_min_decimals == 1  # a forecast of the target is written as the table writes it
    assert saved.number_lower_bound == 0.0  # every value is >= 0: predict's intervals stop at 0
    untargeted = NumericTokenizer.from_pretrained(str(result.final_dir))
    assert untargeted.number_min_decimals is None and untargeted.number_lower_bound is None  # no target named
    target_weight, target_bias = ridge_fit(features[scored], values[scored], 1e-3)  # the fit reads the targets alone
    torch.testing.assert_close(kept.action.regression_head.weight[0].double(), target_weight, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(kept.action.regression_head.bias[0].double(), target_bias, rtol=1e-4, atol=1e-6)
    target_noise = torch.nn.functional.softplus(kept.action.number_noise.bias).item()
    assert target_noise == pytest.approx(
        float(out_of_fold_residuals(features[scored], values[scored], 1e-3).abs().median()), rel=1e-4)  # γ_Y

    num_id = trained.config.num_token_id
    row, row_bias = offset_logistic_fit(positions.token_features, positions.rest_log_partition,
                                        positions.next_is_number, 1e-2)
    classification = trained.action.classification_head
    torch.testing.assert_close(classification.weight[num_id].double(), row, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(classification.bias[num_id].double(), row_bias, rtol=1e-3, atol=1e-5)
    others = torch.arange(classification.weight.shape[0]) != num_id
    torch.testing.assert_close(classification.weight[others], reference.action.classification_head.weight[others])


def test_the_read_out_of_tiny_numbers_moves_by_their_size_not_by_the_learning_rate(assets, tmp_path):
    """Adam moves each weight by about its learning rate: a rate of 1e-3 would put ``b_reg`` a thousand times past
    numbers near 1e-6 in a step. The regression head's rate is capped at a share of the numbers' error scale."""
    from causal_qwen.training.training import REGRESSION_STEP_SHARE

    data = tmp_path / "rates.csv"
    data.write_text("day,value\n" + "".join(f"{day},{(day * 37) % 50 / 4 + 1:.2f}e-06\n" for day in range(1, 49)))
    lines: list[str] = []
    result = run_training(config(assets, tmp_path / "run", data=str(data), target="value", max_steps=3,
                                 regression_warm_start=1.0, regression_learning_rate=1e-3, warmup_steps=0,
                                 lr_scheduler_type="constant"), report=lines.append)
    capped = [line for line in lines if line.startswith("regression head's learning rate")]
    assert len(capped) == 1 and "instead of 0.001" in capped[0], lines
    spread = float(capped[0].split("out-of-fold error ")[1].split(",")[0])
    assert 1e-7 < spread < 1e-5  # the numbers' error scale, in their units
    bias = CausalQwenForCausalLM.from_pretrained(result.final_dir).action.regression_head.bias[0].item()
    assert abs(bias) < 1e-4, bias  # within a few numbers' sizes of 0, not 1e-3 per step away
    assert REGRESSION_STEP_SHARE * spread < 1e-3


def test_backbone_frozen_for_the_first_steps_only(assets, initial, tmp_path):
    snapshots: list[dict[str, torch.Tensor]] = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            snapshots.append(backbone_state(model))

    before = backbone_state(initial)
    run_training(config(assets, tmp_path, freeze_backbone_steps=2, max_steps=3), callbacks=[Snapshot()])
    assert len(snapshots) == 3
    for step in (0, 1):
        assert all(torch.equal(snapshots[step][name], before[name]) for name in before), f"step {step + 1}"
    assert any(not torch.equal(snapshots[2][name], before[name]) for name in before), "step 3 trains it"


# ---- LoRA ------------------------------------------------------------------------------------------------
def test_lora_trains_adapters_and_heads_only_and_the_adapter_reloads(assets, initial, tmp_path):
    from peft import PeftModel

    result = run_training(
        config(assets, tmp_path, lora=True, lora_r=4, max_steps=2, activation_checkpointing=True,
               gradient_accumulation_steps=2, batch_size=2)
    )
    base = small_qwen(tied=True, vocab_size=QWEN25_ROWS)
    merged = CausalQwenForCausalLM.from_pretrained(result.final_dir)
    assert any(not torch.equal(merged.model.get_parameter(n), p) for n, p in base.model.named_parameters()), \
        "merged adapters change the backbone weights they target"
    assert not torch.equal(merged.action.classification_head.weight, base.lm_head.weight)

    fresh = copy.deepcopy(initial)  # peft adds its layers to the model it is given
    reloaded = PeftModel.from_pretrained(fresh, str(result.adapter_dir)).eval()
    trainable_names = set()
    for name, param in reloaded.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            trainable_names.add(name)
        elif "original_module" not in name:
            # every base weight of the backbone is untouched in the adapter model
            key = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if parameter_group(key) == "backbone":
                assert torch.equal(param, base.get_parameter(key)), key
    assert any("lora_B" in n for n in trainable_names) and any("action.modules_to_save" in n for n in trainable_names)
    lora_b = [p for n, p in reloaded.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b), "LoRA B starts at 0 and was trained"

    ids = torch.tensor([[1925, 220, 151665, 14, 220, 151665, 13]])
    values = torch.tensor([[0.0, 0.0, 3.5, 0.0, 0.0, 12.0, 0.0]])
    with torch.no_grad():
        a = reloaded(input_ids=ids, numeric_values=values)
        b = merged.eval()(input_ids=ids, numeric_values=values)
    assert torch.allclose(a.loc_S, b.loc_S, atol=1e-4) and torch.allclose(a.loc_Y, b.loc_Y, atol=1e-4)


# ---- several processes -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_processes_match_one_process(assets, converted, tmp_path):
    """Both sides start from the converted folder (a conversion in each process would calibrate again)."""
    exact = dict(max_steps=3, model_config={}, model=str(converted))  # sampled negatives would differ between processes
    single = run_training(config(assets, tmp_path / "one", batch_size=4, **exact))

    cfg = tmp_path / "ddp.yaml"
    cfg.write_text(yaml.safe_dump(settings(assets, tmp_path / "two", batch_size=2, **exact)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "-m", "causal_qwen.cli", "train", str(cfg)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    one = train_records(single.metrics_file)
    two = train_records(tmp_path / "two" / "metrics.jsonl")
    assert [r["step"] for r in two] == [1, 2, 3]
    for a, b in zip(one, two):
        for key in ("loss", "cls_loss", "reg_loss"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
    assert CausalQwenForCausalLM.from_pretrained(tmp_path / "two" / "final") is not None


# ---- errors ----------------------------------------------------------------------------------------------
def test_cli_reports_bad_config_and_bad_data(assets, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(settings(assets, tmp_path / "out")))
    assert cli_main(["train", str(cfg), "--set", "max_step=5"]) == 2
    assert "did you mean 'max_steps'?" in capsys.readouterr().err

    bad = tmp_path / "bad.csv"
    bad.write_text("day,value\n1,2.5\n2,lots\n3,4.0\n")
    assert cli_main(["train", str(cfg), "--set", f"data={bad}"]) == 2
    assert f"{bad}: row 2 (line 3): template field 'value' holds 'lots'" in capsys.readouterr().err

    assert cli_main(["train", str(cfg), "--resume"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err

    broken = tmp_path / "broken.yaml"
    broken.write_text('data: d.csv\ntemplate: "a {x} b {y}"\n target: y\n')
    assert cli_main(["train", str(broken)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"causal-qwen train: error: {broken}: line 3, column 2: not valid YAML (expected <block end>, but found "
        "'<block mapping start>')"]


@pytest.mark.parametrize("setting, message", [
    ("weight_decay=.nan", "weight_decay must be a finite number, got nan"),
    ("num_train_epochs=.inf", "num_train_epochs must be a finite number, got inf"),
    ("weight_decay=-5", "weight_decay must be >= 0, got -5.0"),
    ("warmup_steps=1.5", "warmup_steps must be a whole number of steps or a fraction of the run in [0, 1), got 1.5"),
    ("lora_dropout=2", "lora_dropout must lie in [0, 1), got 2.0"),
    ("lora_alpha=0", "lora_alpha must be > 0, got 0.0"),
    ("optim=foo", "optim must name one of transformers' optimizers (adamw_torch, "),
    ("lr_scheduler_type=bar", "lr_scheduler_type must be one of linear, cosine, "),
])
def test_settings_that_cannot_train_are_named_before_anything_runs(setting, message):
    config = TrainConfig(model="random:tiny", data="x.csv")
    key, value = setting.split("=")
    setattr(config, key, yaml.safe_load(value))
    with pytest.raises(ValueError, match=re.escape(f"--set {setting}: {message}")):
        config.validate("c.yaml", {key: f"--set {setting}"})


def test_train_warns_when_the_target_is_not_the_templates_last_field(tmp_path, capsys, monkeypatch):
    import causal_qwen.training.training as training_module

    def stop(*args, **kwargs):  # the rows read, then stopped
        kwargs["report"]("data: 3 training and 1 validation documents (a random 25% of the rows)")
        raise KeyboardInterrupt

    monkeypatch.setattr(training_module, "run_training", stop)
    cfg = tmp_path / "first.yaml"
    cfg.write_text(yaml.safe_dump({"model": "random:tiny", "data": "houses.csv", "target": "price",
                                   "template": "Sold for {price} dollars: {address}, {area} m2.",
                                   "output_dir": str(tmp_path / "run")}))
    assert cli_main(["train", str(cfg)]) == 130
    assert ("warning: target 'price' is not the template's last field: the model forecasts it from the text before "
            "it, so 'address', 'area' cannot inform it; put the target last") in capsys.readouterr().out
    cfg.write_text(yaml.safe_dump({"model": "random:tiny", "data": "houses.csv", "target": "price",
                                   "template": "{address}, {area} m2: sold for {price} dollars.",
                                   "output_dir": str(tmp_path / "run")}))
    assert cli_main(["train", str(cfg)]) == 130
    assert "warning" not in capsys.readouterr().out

    def bad_target(*args, **kwargs):  # the rows cannot be read: their error alone, no advice before it
        raise ValueError("row 3 (line 4): template field 'price' holds 'high', which is not a number")

    monkeypatch.setattr(training_module, "run_training", bad_target)
    cfg.write_text(yaml.safe_dump({"model": "random:tiny", "data": "houses.csv", "target": "price",
                                   "template": "Sold for {price} dollars: {address}, {area} m2.",
                                   "output_dir": str(tmp_path / "run")}))
    assert cli_main(["train", str(cfg)]) == 2
    printed = capsys.readouterr()
    assert "warning" not in printed.out and "which is not a number" in printed.err


# ---- the fused loss is what training uses -----------------------------------------------------------------
def test_training_uses_fused_loss_matching_the_reference(assets, tmp_path, monkeypatch):
    import causal_qwen.core.fused_ovr as fused_ovr

    calls = []
    original = fused_ovr.fused_ovr_loss

    def recording(*args, **kwargs):
        calls.append(kwargs.get("implementation", "fused"))
        return original(*args, **kwargs)

    monkeypatch.setattr(fused_ovr, "fused_ovr_loss", recording)
    exact = {"ovr_negatives": None}
    fused = run_training(config(assets, tmp_path / "fused", max_steps=3, model_config=exact))
    assert calls and set(calls) == {"fused"}, "the default training path goes through the fused head"
    calls.clear()
    reference = run_training(
        config(assets, tmp_path / "reference", max_steps=3,
               model_config={**exact, "ovr_loss_implementation": "reference"})
    )
    assert calls and set(calls) == {"reference"}
    fused_steps, reference_steps = train_records(fused.metrics_file), train_records(reference.metrics_file)
    assert len(fused_steps) == len(reference_steps) == 3
    for a, b in zip(fused_steps, reference_steps):
        for key in ("loss", "cls_loss", "reg_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-4), (a["step"], key)


def test_a_split_at_with_a_validation_split_is_refused_not_ignored():
    """``split_by`` + ``split_at`` hold out the rows from ``split_at`` on; a ``validation_split`` beside them was
    silently ignored. Alone with ``split_by`` it still holds out the latest values."""
    both = TrainConfig(model="random:tiny", data="x.csv", split_by="day", split_at="2020-03-01", validation_split=0.2)
    with pytest.raises(ValueError, match=re.escape("c.yaml: validation_split cannot be given with split_at: the rows "
                                                   "from split_at on are held out")):
        both.validate("c.yaml")
    TrainConfig(model="random:tiny", data="x.csv", split_by="day", validation_split=0.2).validate("c.yaml")


def test_a_plain_trainer_divides_the_loss_by_the_accumulation_steps(tmp_path):
    """The model's loss is a mean over its batch and takes no ``num_items_in_batch``: transformers' Trainer must
    scale it for gradient accumulation itself, which it does only for a model that says so."""
    from transformers import Trainer, TrainingArguments

    from causal_qwen import from_qwen

    args = TrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=2, report_to=[], use_cpu=True)
    assert Trainer(model=from_qwen("random:tiny"), args=args).model_accepts_loss_kwargs is False
