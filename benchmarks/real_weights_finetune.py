"""Fine-tuning on real Qwen weights: does CausalQwen keep the language, and how does it compare with plain Qwen?

    python benchmarks/real_weights_finetune.py --base PATH.gguf [--steps 60] [--seed 0]
        [--setting default|seed] [--skip-control] [--only-control] [--set KEY=VALUE ...]

Two runs on the seattle-weather example (``examples/seattle_weather.yaml``: each training row of 2012-2014 is one
sentence, batches of 8, ``steps`` optimizer steps), each in its own subprocess so that its peak memory is its own:

* **CausalQwen** (`finetune_figures`): the base converted with the default calibration (``setting="default"``)
  or with the seeds' literal setting (``setting="seed"``: ``ovr_calibration="none"``, ``γ0 = 10``, ``C = 100``,
  and the example's values before this benchmark existed, `SEED_SETTING`), trained by ``causal-qwen train``'s
  own code path (`causal_qwen.training.training.run_training`) with the example's settings.
* **CE control** (`ce_control_figures`): the plain Qwen (`conversion.load_qwen_base`) fine-tuned with its own
  cross-entropy on the same sentences (numbers written as digits) for the same steps, as a careful user would:
  AdamW (fused), learning rate 2e-5, cosine decay after a linear warm-up over the first 10% of the steps,
  gradient clipping at 1.0, no weight decay, same batch size and data order seed (`CE_CONTROL`).

Figures (general text = `causal_qwen.conversion.calibration.held_out_texts`, the odd-numbered topics of Python's
reference documentation, windows of 96 tokens, ``HELD_OUT_POSITIONS`` next-token positions; no run trains on it):

  finetune_softmax_ppl_ratio     perplexity exp(mean −log softmax(loc_S)[t]) after / before fine-tuning
                                 (control: Qwen's own logits, its own tokenisation of the same text)
  finetune_ovr_ppl_ratio         OvR-normalised perplexity exp(mean −log(P_t / Σ_k P_k)) after / before
  finetune_standard_agreement    after fine-tuning: share of positions where argmax_k P_k = argmax_k loc_S
                                 (the standard decision against the fine-tuned model's own greedy token)
  finetune_mdae                  median |y − ŷ| of the daily high (temp_max) over every ``MDAE_STRIDE``-th held-out
                                 day of 2015. CausalQwen: ŷ = loc_Y at the position that predicts temp_max (teacher-
                                 forced sentence). Control: greedy continuation of the sentence up to "the high
                                 was", first number parsed (an unparsable answer counts as an infinite error)
  finetune_baseline_linear_mdae  least squares on date (day-of-year sin/cos), precipitation and temp_min of the
                                 training days (`causal_qwen.evaluation.demo.baseline_metrics`), on the same
                                 held-out days
  finetune_seconds_per_step      median wall time of one optimizer step (forward, backward, update)
  finetune_peak_rss_gb           ru_maxrss of the run's subprocess (load, evaluation and training), GiB

Converted models and the before-figures are cached under ``$CAUSAL_QWEN_BENCH_CACHE`` (default
``~/.cache/causal_qwen/finetune_bench``); a conversion takes ~90 s, each 60-step run minutes to tens of minutes on
2 CPU cores.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("real_weights_finetune")

EXAMPLE = ROOT / "examples" / "seattle_weather.yaml"
TARGET = "temp_max"
HELD_OUT_POSITIONS = 1024
MDAE_STRIDE = 4  # every 4th held-out day of 2015: 92 days
SETTINGS = ("default", "seed")
# The example's values before fine-tuning on real weights was tuned (the seeds' literal setting).
SEED_SETTING: dict[str, Any] = {
    "model_config": {"ovr_negatives": 2048, "regression_gate_alpha": 1.0, "ovr_reduction": "sum"},
    "learning_rate": 3.0e-3,
    "numeric_embedding_learning_rate": 3.0e-3,
    "regression_learning_rate": 1.0e-3,
    "regression_warm_start": False,
    "num_token_warm_start": False,
    "backbone_learning_rate": 3.0e-4,
    "warmup_steps": 5,
    "lr_scheduler_type": "cosine",
    "max_grad_norm": 1.0,
    "freeze_backbone": False,
    "freeze_backbone_steps": 0,
    "freeze_decision_scale": False,  # the seeds train every head parameter
}
# What a careful user fine-tuning Qwen2.5-0.5B with cross-entropy would choose.
CE_CONTROL: dict[str, Any] = {
    "learning_rate": 2e-5,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.1,  # a fraction of the run (transformers v5 reads a float < 1 as one)
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "optim": "adamw_torch_fused",
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def cache_dir() -> Path:
    path = Path(os.environ.get("CAUSAL_QWEN_BENCH_CACHE", "~/.cache/causal_qwen/finetune_bench")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


# The sources that decide what a conversion writes: a cached conversion made by other code is not reused.
CONVERSION_SOURCES = ("conversion/conversion.py", "conversion/calibration.py", "core/heads.py", "core/configuration.py")


def _base_tag(base: str) -> str:
    """The base's file name, a digest of its resolved path and a digest of the conversion code."""
    import causal_qwen

    resolved = str(Path(base).resolve()) if Path(base).exists() else base
    package = Path(causal_qwen.__file__).parent
    code = hashlib.sha1(b"".join((package / name).read_bytes() for name in CONVERSION_SOURCES)).hexdigest()[:8]
    return Path(base).stem + "-" + hashlib.sha1(resolved.encode()).hexdigest()[:8] + "-" + code


def _check_setting(setting: str) -> None:
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")


# ---------------------------------------------------------------------------------------------------------------
# Public entry points: each run in its own subprocess
# ---------------------------------------------------------------------------------------------------------------
def finetune_figures(base: str, steps: int = 60, seed: int = 0, setting: str = "default",
                     overrides: tuple[str, ...] = ()) -> dict:
    """CausalQwen fine-tuned on the seattle-weather example; see the module docstring for the keys.

    ``overrides``: extra ``key=value`` settings of ``causal-qwen train`` (``--set``), for experiments."""
    _check_setting(setting)
    _check_steps(steps)
    args = ["causal", "--base", base, "--steps", str(steps), "--seed", str(seed), "--setting", setting]
    for item in overrides:
        args += ["--set", item]
    return _run_child(args)


def ce_control_figures(base: str, steps: int = 60, seed: int = 0) -> dict:
    """Plain Qwen fine-tuned with cross-entropy on the same sentences (`CE_CONTROL`); see the module docstring."""
    _check_steps(steps)
    return _run_child(["ce", "--base", base, "--steps", str(steps), "--seed", str(seed)])


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")


def _run_child(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="ft_bench_") as folder:
        result_file = Path(folder) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", *args, "--result", str(result_file)]
        completed = subprocess.run(command, cwd=str(ROOT), stdout=sys.stderr)  # the JSON comes by file
        if completed.returncode != 0 or not result_file.is_file():
            raise RuntimeError(f"the fine-tuning run {' '.join(args)} failed (exit status {completed.returncode})")
        return json.loads(result_file.read_text())


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------------------------
class StepTimer:
    """Trainer callback: wall time of every optimizer step."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self):
                self.seconds: list[float] = []
                self._start = None

            def on_step_begin(self, args, state, control, **kwargs):
                self._start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                if self._start is not None:
                    self.seconds.append(time.perf_counter() - self._start)
                    logger.info("step %d: %.2f s", state.global_step, self.seconds[-1])

        return _Timer()


def peak_rss_gb() -> float:
    """ru_maxrss of this process in GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def example_config(model: str, steps: int, seed: int, output_dir: str, setting: str, overrides: list[str]):
    """The example YAML's settings (``setting="seed"``: with `SEED_SETTING` over them) for one benchmark run."""
    from causal_qwen.training.train_config import load_train_config

    config = load_train_config(EXAMPLE, overrides)
    if setting == "seed":
        for key, value in SEED_SETTING.items():
            setattr(config, key, dict(value) if isinstance(value, dict) else value)
    config.model = model
    config.max_steps = steps
    config.seed = seed
    config.output_dir = output_dir
    config.overwrite_output_dir = True
    config.eval_steps = 0
    config.save_steps = 0
    config.report_to = []
    config.progress_bar = False
    config.logging_steps = max(steps, 1)
    return config.validate("benchmark")


def table_rows(data: str) -> list[dict[str, str]]:
    from causal_qwen.training.data import resolve_data_path

    with resolve_data_path(data).open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def weather_split(config) -> tuple[list[dict], list[dict], list, list]:
    """Training rows, the evaluated held-out rows (every `MDAE_STRIDE`-th), and their documents (same order)."""
    from causal_qwen.training import data as data_module

    source = data_module.DataSource(path=config.data, template=config.template, numeric_fields=config.numeric_fields,
                                    split_by=config.split_by)
    documents = data_module.read_documents(source)
    train_docs, held_docs = data_module.split_documents(
        documents, data_module.SplitSpec(split_by=config.split_by, split_at=config.split_at))
    rows = table_rows(config.data)
    split_at = str(config.split_at)
    train_rows = [row for row in rows if str(row[config.split_by]) < split_at]
    held_rows = [row for row in rows if str(row[config.split_by]) >= split_at]
    if len(train_rows) != len(train_docs) or len(held_rows) != len(held_docs):
        raise RuntimeError("the rows and the documents of the split disagree")
    return train_rows, held_rows[::MDAE_STRIDE], train_docs, held_docs[::MDAE_STRIDE]


def linear_baseline_mdae(config, train_rows: list[dict], held_rows: list[dict]) -> float:
    from causal_qwen.evaluation.demo import baseline_metrics
    from causal_qwen.training.data import template_fields

    fields = [name for name in template_fields(config.template) if name != TARGET]
    return float(baseline_metrics(train_rows, held_rows, fields, TARGET)["baseline_linear_mdae"])


def held_out_windows(tokenize, positions: int = HELD_OUT_POSITIONS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, values) windows of up to 97 tokens from the first characters of each held-out documentation topic,
    ``positions`` next-token positions in all. ``tokenize(text) -> (ids (T,), values (T,))``."""
    from causal_qwen.conversion import calibration

    windows, count = [], 0
    for text in calibration.held_out_texts():
        ids, values = tokenize(text[: calibration.TEXT_CHARS])
        ids, values = ids[: calibration.WINDOW + 1], values[: calibration.WINDOW + 1]
        if len(ids) < 8:
            continue
        take = min(len(ids), positions - count + 1)
        windows.append((ids[:take], values[:take]))
        count += take - 1
        if count >= positions:
            break
    return windows


@torch.no_grad()
def causal_general_text(model, tokenizer, positions: int = HELD_OUT_POSITIONS) -> dict:
    """Softmax and OvR-normalised perplexity and standard agreement of ``model`` on the held-out windows."""
    from causal_qwen.evaluation.evaluation import token_totals

    def tokenize(text):
        encoded = tokenizer([text], return_tensors="pt")
        return encoded["input_ids"][0], encoded["numeric_values"][0]

    model.eval()
    totals = None
    for ids, values in held_out_windows(tokenize, positions):
        out = model(input_ids=ids[None, :-1], numeric_values=values[None, :-1].float())
        part = token_totals(model, out.loc_U[0], out.scale_U[0], ids[1:], chunk_positions=None)
        if totals is None:
            totals = part
        else:
            totals.add(part)
    figures = totals.metrics()
    return {key: figures[key] for key in ("perplexity", "ovr_perplexity", "standard_agreement", "causal_agreement",
                                          "ovr_prob_sum", "token_count")}


@torch.no_grad()
def causal_mdae(model, tokenizer, held_docs, held_rows) -> tuple[float, float]:
    """MdAE of ``loc_Y`` for the daily high, and the median signed error (bias) ``median(ŷ − y)``."""
    from causal_qwen.evaluation.evaluation import evaluate_documents

    model.eval()
    evaluated = evaluate_documents(model, tokenizer, held_docs, batch_size=32, max_length=64, language=False)
    target = evaluated.numbers.select(-1)  # temp_max is the template's last number
    truth = torch.tensor([float(row[TARGET]) for row in held_rows], dtype=torch.float64)
    if len(target) != len(truth) or not torch.allclose(target.value, truth, atol=1e-3):
        raise RuntimeError("the last number of the held-out sentences is not the temp_max column")
    return float((target.value - target.loc).abs().median()), float((target.loc - target.value).median())


# ---------------------------------------------------------------------------------------------------------------
# CausalQwen run (child process)
# ---------------------------------------------------------------------------------------------------------------
def converted_folder(base: str, setting: str) -> Path:
    """The base converted (default calibration, or ``ovr_calibration="none"`` for the seed setting), cached."""
    from causal_qwen.conversion.loading import convert_base

    folder = cache_dir() / f"{_base_tag(base)}-{setting}"
    if (folder / "config.json").is_file():
        return folder
    started = time.perf_counter()
    overrides = {"ovr_calibration": "none"} if setting == "seed" else {}
    model, tokenizer = convert_base(base, **overrides)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(folder)
    logger.info("converted %s (%s) in %.0f s to %s", base, setting, time.perf_counter() - started, folder)
    del model
    return folder


def _before_figures(folder: Path) -> dict:
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.core.tokenizer import NumericTokenizer

    memo = folder.with_name(folder.name + f".general_text_{HELD_OUT_POSITIONS}.json")
    if memo.is_file():
        return json.loads(memo.read_text())
    model = CausalQwenForCausalLM.from_pretrained(str(folder))
    figures = causal_general_text(model, NumericTokenizer.from_pretrained(str(folder)))
    memo.write_text(json.dumps(figures))
    return figures


def run_causal(base: str, steps: int, seed: int, setting: str, overrides: list[str]) -> dict:
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.core.tokenizer import NumericTokenizer
    from causal_qwen.training.training import run_training

    folder = converted_folder(base, setting)
    before = _before_figures(folder)
    with tempfile.TemporaryDirectory(prefix="causal_ft_", dir=os.environ.get("CAUSAL_QWEN_BENCH_TMP")) as out:
        config = example_config(str(folder), steps, seed, out, setting, overrides)
        train_rows, held_rows, _, held_docs = weather_split(config)
        timer = StepTimer()
        started = time.perf_counter()
        result = run_training(config, callbacks=[timer])
        train_seconds = time.perf_counter() - started
        model = CausalQwenForCausalLM.from_pretrained(str(result.final_dir))
        tokenizer = NumericTokenizer.from_pretrained(str(result.final_dir))
        after = causal_general_text(model, tokenizer)
        mdae, bias = causal_mdae(model, tokenizer, held_docs, held_rows)
    return {
        "finetune_softmax_ppl_ratio": after["perplexity"] / before["perplexity"],
        "finetune_ovr_ppl_ratio": after["ovr_perplexity"] / before["ovr_perplexity"],
        "finetune_standard_agreement": after["standard_agreement"],
        "finetune_mdae": mdae,
        "finetune_baseline_linear_mdae": linear_baseline_mdae(config, train_rows, held_rows),
        "finetune_seconds_per_step": statistics.median(timer.seconds),
        "finetune_peak_rss_gb": peak_rss_gb(),
        "finetune_steps": steps,
        "finetune_batch_size": config.batch_size,
        "finetune_train_loss": result.train_loss,
        "finetune_train_seconds": train_seconds,
        "finetune_mdae_days": len(held_rows),
        "finetune_median_signed_error": bias,
        "general_text_before": before,
        "general_text_after": after,
        "setting": setting,
        "settings_used": _settings_summary(config),
    }


def _settings_summary(config) -> dict:
    keys = ("model_config", "learning_rate", "numeric_embedding_learning_rate", "backbone_learning_rate",
            "regression_learning_rate", "regression_warm_start", "num_token_warm_start", "lora", "lora_r", "lora_learning_rate",
            "freeze_backbone", "freeze_backbone_steps", "warmup_steps", "lr_scheduler_type", "max_grad_norm", "batch_size", "optim")
    return {key: getattr(config, key) for key in keys if hasattr(config, key)}


# ---------------------------------------------------------------------------------------------------------------
# Cross-entropy control (child process)
# ---------------------------------------------------------------------------------------------------------------
def plain_tokenizer(base: str):
    """The base's own tokenizer (numbers stay digits), left padding for generation."""
    from causal_qwen.conversion.loading import load_tokenizer_for_base

    tokenizer = load_tokenizer_for_base(base).tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@torch.no_grad()
def plain_perplexity(model, tokenizer) -> float:
    def tokenize(text):
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids, torch.zeros(len(ids))

    model.eval()
    nll, count = 0.0, 0
    for ids, _ in held_out_windows(tokenize):
        logits = model(input_ids=ids[None, :-1]).logits[0].float()  # (S,V)
        nll += float(torch.nn.functional.cross_entropy(logits, ids[1:], reduction="sum"))
        count += len(ids) - 1
    return math.exp(nll / count)


@torch.no_grad()
def generated_mdae(model, tokenizer, held_docs, held_rows, batch_size: int = 16) -> tuple[float, int]:
    """MdAE of the first number greedily generated after "... the high was"; unparsable answers count as inf."""
    model.eval()
    prompts, truth = [], []
    for document, row in zip(held_docs, held_rows):
        match = re.search(r"(-?\d+(?:\.\d+)?) C\.\s*$", document.text)
        if match is None or abs(float(match.group(1)) - float(row[TARGET])) > 1e-6:
            raise RuntimeError(f"cannot find the daily high at the end of {document.text!r}")
        prompts.append(document.text[: match.start()].rstrip())
        truth.append(float(row[TARGET]))
    tokenizer.padding_side = "left"
    errors, unparsable = [], 0
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
        generated = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        for text, value in zip(texts, truth[start : start + batch_size]):
            match = _NUMBER.search(text)
            if match is None:
                unparsable += 1
                errors.append(math.inf)
            else:
                errors.append(abs(float(match.group(0)) - value))
    return float(statistics.median(errors)), unparsable


class _TextDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list[list[int]]):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return {"input_ids": self.rows[index]}


def _pad_collate(pad_id: int):
    def collate(examples):
        length = max(len(example["input_ids"]) for example in examples)
        ids = torch.full((len(examples), length), pad_id, dtype=torch.long)  # (B,S) right padding
        mask = torch.zeros((len(examples), length), dtype=torch.long)
        for row, example in enumerate(examples):
            ids[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
            mask[row, : len(example["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    return collate


def run_ce_control(base: str, steps: int, seed: int) -> dict:
    from transformers import Trainer, TrainingArguments, set_seed

    from causal_qwen.conversion.conversion import load_qwen_base

    with tempfile.TemporaryDirectory(prefix="ce_ft_", dir=os.environ.get("CAUSAL_QWEN_BENCH_TMP")) as out:
        config = example_config("unused", steps, seed, out, "default", [])
        train_rows, held_rows, train_docs, held_docs = weather_split(config)
        set_seed(seed)
        tokenizer = plain_tokenizer(base)
        model = load_qwen_base(base)
        # A GGUF base is dequantised on load (float weights) but keeps its quantizer marker, which Trainer refuses.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        # Qwen2.5-0.5B ties lm_head to the embedding; GGUF loading gives an equal, separate copy. Tie them again,
        # as in the Hugging Face checkpoint a user would fine-tune (and 136M fewer trainable parameters to hold).
        if model.lm_head.weight.shape == model.model.embed_tokens.weight.shape and torch.equal(
                model.lm_head.weight, model.model.embed_tokens.weight):
            model.lm_head.weight = model.model.embed_tokens.weight
            model.config.tie_word_embeddings = True
        model.config.use_cache = False
        before = plain_perplexity(model, tokenizer)
        eos = [tokenizer.eos_token_id] if config.add_eos and tokenizer.eos_token_id is not None else []
        rows = [tokenizer(doc.text, add_special_tokens=False)["input_ids"][: config.max_length - len(eos)] + eos
                for doc in train_docs]
        args = TrainingArguments(
            output_dir=out, seed=seed, max_steps=steps, per_device_train_batch_size=config.batch_size,
            logging_strategy="steps", logging_steps=max(steps, 1), save_strategy="no", report_to=[],
            disable_tqdm=True, remove_unused_columns=False, **CE_CONTROL,
        )
        timer = StepTimer()
        trainer = Trainer(model=model, args=args, train_dataset=_TextDataset(rows),
                          data_collator=_pad_collate(tokenizer.pad_token_id), callbacks=[timer])
        started = time.perf_counter()
        result = trainer.train()
        train_seconds = time.perf_counter() - started
        model.config.use_cache = True
        after = plain_perplexity(model, tokenizer)
        mdae, unparsable = generated_mdae(model, tokenizer, held_docs, held_rows)
    return {
        "finetune_softmax_ppl_ratio": after / before,
        "finetune_mdae": mdae,
        "finetune_seconds_per_step": statistics.median(timer.seconds),
        "finetune_peak_rss_gb": peak_rss_gb(),
        "finetune_baseline_linear_mdae": linear_baseline_mdae(config, train_rows, held_rows),
        "finetune_unparsable_answers": unparsable,
        "finetune_mdae_days": len(held_rows),
        "finetune_train_loss": float(result.training_loss),
        "finetune_train_seconds": train_seconds,
        "perplexity_before": before,
        "perplexity_after": after,
        "settings_used": {**CE_CONTROL, "batch_size": config.batch_size, "steps": steps},
    }


# ---------------------------------------------------------------------------------------------------------------
def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("causal", "ce"))
    parser.add_argument("--base", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", default="default", choices=SETTINGS)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.kind == "causal":
        figures = run_causal(args.base, args.steps, args.seed, args.setting, args.set)
    else:
        figures = run_ce_control(args.base, args.steps, args.seed)
    Path(args.result).write_text(json.dumps(figures, default=str))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        _child(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="real Qwen2.5 checkpoint (.gguf file, folder or hub id)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of 8 sentences (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", default="default", choices=SETTINGS)
    parser.add_argument("--set", action="append", default=[], help="extra train setting KEY=VALUE (experiments)")
    parser.add_argument("--skip-control", action="store_true", help="leave out the cross-entropy control")
    parser.add_argument("--only-control", action="store_true", help="run the cross-entropy control only")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    if not args.only_control:
        result.update(finetune_figures(args.base, args.steps, args.seed, args.setting, tuple(args.set)))
    if not args.skip_control:
        result["ce_control"] = ce_control_figures(args.base, args.steps, args.seed)
        if "finetune_seconds_per_step" in result:
            result["seconds_per_step_ratio_to_control"] = (
                result["finetune_seconds_per_step"] / result["ce_control"]["finetune_seconds_per_step"])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
