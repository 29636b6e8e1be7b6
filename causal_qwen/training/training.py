"""Fine-tuning CausalQwen with `transformers.Trainer` (losses: docs/design.md, "Losses").

`run_training(config)` builds the model, tokenizer and datasets of a `TrainConfig`, trains with
`CausalQwenTrainer` and writes into ``output_dir``:

    checkpoint-N/      every ``save_steps`` steps, the last ``save_total_limit`` kept (``resume=True`` continues
                       from the newest complete one); written atomically (`causal_qwen.training.run_folder`)
    metrics.jsonl      one JSON object per logged step (see `causal_qwen.training.monitoring`)
    runs/              TensorBoard event files
    final/             the trained model + tokenizer (`CausalQwenForCausalLM.from_pretrained`)
    adapter/           with LoRA: the peft adapter, heads included (`PeftModel.from_pretrained(base, adapter/)`)
    train_config.yaml  the resolved settings
    warm_start.json    the regression warm start's report (its out-of-fold error floors the intervals of a table
                       too small for a check slice, `interval_check.floor_intervals`; a resumed run reads it here)
    .lock              held while the run lasts: a second run into the folder fails at once

Config, data and folder are checked before anything in ``output_dir`` is deleted or overwritten. The same
entry point runs under ``torchrun --nproc_per_node N`` and ``accelerate launch`` (DDP; gloo on CPUs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from torch import Tensor, nn
from torch.utils.data import Dataset
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainerState, TrainingArguments, set_seed
from transformers.training_args import ParallelMode

from ..core.files import write_text_atomic
from ..core.modeling import CausalQwenForCausalLM
from ..core.numbers import decimals_written, find_numbers
from . import data as data_module
from .collator import NumericCollator, TokenizedDataset, tokenize_documents
from .monitoring import MetricAccumulator, MetricsJsonlCallback, decision_stats, number_stats, representation_stats
from .parameter_groups import (
    GROUPS,
    drop_gradients,
    freeze_decision_scale,
    freeze_groups,
    head_gradient_norms,
    optimizer_groups,
)
from .run_folder import (
    LOCK_FILE,
    OutputLock,
    RunPlan,
    check_output_dir,
    clear_for_run,
    fault_point,
    list_checkpoints,
    plan_run,
    publish,
    rotate_checkpoints,
    staging_path,
)
from .feature_cache import MAX_CACHE_BYTES, cache_features, cache_size_bytes
from .interval_check import EarlierWidthReport, IntervalCheckReport, IntervalFloorReport
from .location_check import LocationCheckReport
from .readout_steps import (
    Report,
    common_target_ordinal,
    in_split_order,
    keep_check_slice,
    load_warm_start,
    offer_earlier_numbers,
    out_of_fold_order,
    run_earlier_width,
    run_interval_check,
    run_interval_floor,
    run_location_check,
    run_regression_refit,
    row_break_ids,
    save_warm_start,
    target_ordinals,
    tell,
)
from .train_config import TrainConfig
from .warm_start import WarmStartReport, warm_start
from ..conversion.conversion import from_qwen

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
FINAL_DIR = "final"
ADAPTER_DIR = "adapter"
CONFIG_FILE = "train_config.yaml"


# ---- the trainer -----------------------------------------------------------------------------------------
class CausalQwenTrainer(Trainer):
    """`Trainer` with per-group learning rates, the loss breakdown and §7 monitoring, and optional
    backbone freezing for the first ``freeze_backbone_steps`` steps."""

    def __init__(self, *args, train_config: TrainConfig, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.args.disable_tqdm:  # no bar: no raw log dictionaries on stdout either (metrics.jsonl has them)
            self.remove_callback(PrinterCallback)
        self.train_config = train_config
        # Our forward's **kwargs go to the backbone, not to a token-count-normalised loss.
        self.model_accepts_loss_kwargs = False
        self.train_figures = MetricAccumulator()
        self.eval_figures = MetricAccumulator()
        self._step_learning_rates: dict[str, float] = {}
        self.regression_rate_cap: float | None = None  # `regression_rate_cap`, set before the optimizer is made
        self._staging_root: Path | None = None

    # -- parts of the model --
    def causal_model(self) -> CausalQwenForCausalLM:
        """The `CausalQwenForCausalLM` inside DDP/peft wrappers (its heads may be peft copies)."""
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def group_learning_rates(self) -> dict[str, float]:
        config = self.train_config
        return {
            "heads": config.learning_rate,
            "regression": min(_default(getattr(config, "regression_learning_rate", None), config.learning_rate),
                              math.inf if self.regression_rate_cap is None else self.regression_rate_cap),
            "numeric_embedding": _default(config.numeric_embedding_learning_rate, config.learning_rate),
            "backbone": config.backbone_learning_rate,
            "lora": _default(config.lora_learning_rate, config.learning_rate),
        }

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            opt_model = self.model if model is None else model
            decay_names = self.get_decay_parameter_names(opt_model)
            groups = optimizer_groups(opt_model, self.group_learning_rates(), self.args.weight_decay, decay_names)
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
            for group in groups:
                logger.info("optimizer group %s: %d tensors, lr %g", group["name"], len(group["params"]), group["lr"])
        return self.optimizer

    # -- checkpoints: written under .staging/, published by one rename --
    def _get_output_dir(self, trial) -> str:
        if self._staging_root is not None:  # inside _save_checkpoint: the parent writes into the staging folder
            return str(self._staging_root)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """`Trainer._save_checkpoint` into ``OUTPUT_DIR/.staging/checkpoint-N``, then published whole as
        ``OUTPUT_DIR/checkpoint-N`` (fsync + rename) and old checkpoints rotated out the same way."""
        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staged = staging_path(run_dir, name)
        if self.args.should_save:
            _remove_tree(staged)
            staged.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        self._staging_root = staged.parent
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()  # every process has written its part (RNG states, shards)
        if self.args.should_save:
            publish(staged, run_dir / name)
            for path in rotate_checkpoints(run_dir, self.args.save_total_limit):
                logger.info("deleted %s (save_total_limit=%s)", path.name, self.args.save_total_limit)
        self.accelerator.wait_for_everyone()

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        fault_point("checkpoint.model_written")  # tests: a kill half-way through a checkpoint
        super()._save_optimizer_and_scheduler(output_dir)

    # -- forward, backward --
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, return_scores=False, use_cache=False)
        if outputs.loss is None:
            raise ValueError(f"the model returned no loss; the batch holds {sorted(inputs)} (labels are needed)")
        if not math.isfinite(float(outputs.loss.detach())):
            raise ValueError(
                f"the loss is {float(outputs.loss.detach())} at step {self.state.global_step + 1} (cls_loss "
                f"{float(outputs.cls_loss.detach())}, reg_loss {float(outputs.reg_loss.detach())}); lower the learning "
                "rates or max_grad_norm, and check the model's weights are finite"
            )
        training = model.training
        figures = self.train_figures if training else self.eval_figures
        weight = 1.0 if training else float(inputs["input_ids"].shape[0])
        figures.add("cls_loss", outputs.cls_loss.detach(), weight)
        figures.add("reg_loss", outputs.reg_loss.detach(), weight)
        if not training or self._measuring_this_step():
            self._add_representation_figures(figures, outputs, inputs, weight)
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def _measuring_this_step(self) -> bool:
        step = self.state.global_step + 1
        return step % self.args.logging_steps == 0 or step == self.state.max_steps

    def _add_representation_figures(self, figures: MetricAccumulator, outputs, inputs, weight: float) -> None:
        mask = inputs.get("attention_mask")
        for key, value in representation_stats(outputs.loc_U.detach(), outputs.scale_U.detach(), mask).items():
            figures.add(key, value, weight)
        numbers = number_stats(
            outputs.loc_Y.detach(),
            outputs.scale_Y.detach(),
            inputs["labels"],
            inputs["numeric_values"],
            mask,
            self.causal_model().config.num_token_id,
        )
        for key, value in (numbers or {}).items():
            figures.add(key, value, weight)
        if self.train_config.monitor_positions > 0 and not self.is_fsdp_enabled:
            decided = decision_stats(
                self.causal_model(),
                outputs.loc_U.detach(),
                outputs.scale_U.detach(),
                inputs["labels"],
                inputs["numeric_values"],
                mask,
                self.train_config.monitor_positions,
            )
            for key, value in (decided or {}).items():
                figures.add(key, value, weight)

    def training_step(self, model, inputs, num_items_in_batch=None) -> Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # gradients are complete (and all-reduced) now
            if self.state.global_step < self.train_config.freeze_backbone_steps:
                drop_gradients(self.model, ("backbone", "lora"))
                if self.state.global_step + 1 == self.train_config.freeze_backbone_steps:
                    logger.info("the backbone trains from step %d on", self.state.global_step + 2)
            if self._measuring_this_step():
                for part, norm in head_gradient_norms(self.model).items():
                    self.train_figures.add(f"grad_norm_{part}", norm)
                self._step_learning_rates = self._learning_rates_by_group()  # the rates this step will use
        return loss

    # -- logging, evaluation --
    def _sum_over_processes(self, totals: Tensor) -> Tensor:
        if self.accelerator.num_processes <= 1:
            return totals
        return self.accelerator.reduce(totals.to(self.args.device), reduction="sum").cpu()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and not any(key.startswith("eval_") for key in logs):
            logs.update(self.train_figures.drain(self._sum_over_processes))
            logs.update(self._step_learning_rates or self._learning_rates_by_group())
        super().log(logs, start_time)

    def _learning_rates_by_group(self) -> dict[str, float]:
        rates = {}
        if self.optimizer is None:
            return rates
        for group in self.optimizer.param_groups:
            name = str(group.get("name", "")).removesuffix("_no_decay")
            if name in GROUPS and name != "heads":
                rates[f"lr_{name}"] = float(group["lr"])
        return rates

    def evaluation_loop(self, *args, **kwargs):
        self.eval_figures.reset()
        output = super().evaluation_loop(*args, **kwargs)
        prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
        for key, value in self.eval_figures.drain(self._sum_over_processes).items():
            output.metrics[f"{prefix}_{key}"] = value
        return output


REGRESSION_STEP_SHARE = 0.01
"""The regression head's learning rate is at most this share of the numbers' error scale (`regression_rate_cap`)."""


def regression_rate_cap(warm: WarmStartReport | None) -> float | None:
    """``REGRESSION_STEP_SHARE · γ`` with ``γ`` the warm start's median absolute out-of-fold residual (target units),
    or None without a warm start (or where ``γ`` is 0). Adam moves every weight by about its learning rate per
    step, whatever the numbers' size, and ``b_reg`` is in the numbers' units: a rate chosen for numbers whose
    errors are about 1 to 10 (the random recipe's 1e-3) moves a read-out of rates near 1e-6 by a thousand times
    their size in a few steps. Capped, a step moves ``b_reg`` by at most a hundredth of the numbers' typical error;
    numbers of the usual sizes are left at the recipe's rate."""
    if warm is None or not warm.out_of_fold_mdae > 0:
        return None
    return REGRESSION_STEP_SHARE * warm.out_of_fold_mdae


def _default(value: float | None, fallback: float) -> float:
    return fallback if value is None else value


# ---- building the pieces ---------------------------------------------------------------------------------
def is_causal_qwen_folder(path: str) -> bool:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return False
    try:
        return json.loads(config_file.read_text()).get("model_type") == "causal_qwen"
    except json.JSONDecodeError:
        return False


def check_model_named(config: TrainConfig) -> None:
    """``ValueError`` at once when ``config.model`` names a file or folder that does not exist or holds no model
    (checked again, fully, when the model is built: this only spares reading the data first)."""
    from ..conversion import presets
    from ..conversion.conversion import folder_model_type
    from ..conversion.loading import check_missing_base

    name = str(config.model)
    path = Path(name).expanduser()
    if presets.is_preset(name):
        return
    if not path.exists():
        check_missing_base(name)  # a hub id passes; anything else is named
    elif path.is_dir():
        folder_model_type(path, folder="model folder")


def build_model_and_tokenizer(config: TrainConfig) -> tuple[CausalQwenForCausalLM, Any]:
    """The model named by ``config.model`` (a converted folder, or a Qwen2 base converted now) and its tokenizer."""
    from ..conversion.loading import convert_base, load_causal_model
    from ..core.tokenizer import NumericTokenizer

    tokenizer = NumericTokenizer.from_pretrained(config.tokenizer) if config.tokenizer else None
    if is_causal_qwen_folder(config.model):
        model = load_causal_model(config.model, **config.model_config)
        tokenizer = tokenizer or NumericTokenizer.from_pretrained(config.model)
    elif tokenizer is not None:
        overrides = {"num_token_id": tokenizer.num_token_id, **config.model_config}
        model = from_qwen(config.model, **overrides)
    else:
        model, tokenizer = convert_base(config.model, **config.model_config)
    if tokenizer.num_token_id != model.config.num_token_id:
        raise ValueError(
            f"the tokenizer's <NUM> id {tokenizer.num_token_id} differs from the model's {model.config.num_token_id}"
        )
    return model, tokenizer


def read_split_documents(config: TrainConfig, report: Report | None = None) -> tuple[list, list]:
    """The training and validation `Document`s of ``config`` (read and split; no tokenizer needed), so that a
    data error shows before a model is loaded or anything in ``output_dir`` changes. ``report`` gets the
    split sizes in one line."""
    source = data_module.DataSource(
        path=config.data,
        format=config.data_format,
        text_field=config.text_field,
        template=config.template,
        numeric_fields=config.numeric_fields,
        skip_bad_rows=config.skip_bad_rows,
        text_unit=config.text_unit,
        split_by=config.split_by,
        target=config.target,
    )
    documents = data_module.read_documents(source)
    if config.validation_data is not None:
        if config.split_by is not None or config.validation_split > 0:
            raise ValueError("give either validation_data or a split (split_by / validation_split), not both")
        train_docs = documents
        valid_docs = data_module.read_documents(
            data_module.DataSource(**{**source.__dict__, "path": config.validation_data, "split_by": None})
        )
        how = f"validation from {config.validation_data}"
    else:
        spec = data_module.SplitSpec(
            fraction=config.validation_split, split_by=config.split_by, split_at=config.split_at, seed=config.seed
        )
        train_docs, valid_docs = data_module.split_documents(documents, spec)
        how = data_module.describe_split(spec)
    if config.max_eval_samples is not None and len(valid_docs) > config.max_eval_samples:
        how += f"; evaluating the first {config.max_eval_samples}"
    message = f"data: {len(train_docs)} training and {len(valid_docs)} validation documents ({how})"
    tell(message, report)
    if config.max_eval_samples is not None:
        valid_docs = valid_docs[: config.max_eval_samples]
    return train_docs, valid_docs


def saved_settings(config: TrainConfig) -> dict:
    """The settings ``train_config.yaml`` holds: ``config.to_dict()`` with the data files' paths made absolute, so
    that ``eval --model RUN/final`` finds them from any working folder."""
    settings = config.to_dict()
    for key in ("data", "validation_data"):
        if settings.get(key) and Path(settings[key]).is_file():
            settings[key] = str(Path(settings[key]).resolve())
    return settings


RUN_DEFINING_KEYS = (
    "model", "tokenizer", "model_config", "data", "data_format", "text_field", "template", "numeric_fields",
    "text_unit", "validation_data", "validation_split", "split_by", "split_at", "max_length", "add_eos", "target",
    "lora", "lora_r", "lora_alpha", "lora_target_modules",
)
"""The settings a resumed run must share with the run it continues: what the model is and what it learns from
(step counts, learning rates and logging may change on ``--resume``)."""


def check_resumed_settings(output_dir: Path, config: TrainConfig) -> None:
    """``ValueError`` naming each `RUN_DEFINING_KEYS` setting in which ``config`` differs from the run folder's
    ``train_config.yaml`` (nothing to compare when the folder holds none, or for a key an older file lacks)."""
    saved_file = output_dir / CONFIG_FILE
    if not saved_file.is_file():
        return
    saved = yaml.safe_load(saved_file.read_text(encoding="utf-8")) or {}
    current = yaml.safe_load(yaml.safe_dump(saved_settings(config), sort_keys=False))  # as the file would hold it
    differing = [key for key in RUN_DEFINING_KEYS if key in saved and _differs(saved[key], current.get(key))]
    if differing:
        changes = "; ".join(f"{key}: {saved.get(key)!r} there, {current.get(key)!r} now" for key in differing)
        raise ValueError(
            f"--resume: {output_dir} holds a run trained with other settings ({changes}); resume it with its own "
            f"config ({saved_file}), or train into another output_dir (--set output_dir=...)"
        )


def _differs(saved: Any, current: Any) -> bool:
    """Whether a saved setting differs from the current one; a mapping (``model_config``) only in the entries the
    saved file holds (a newer version may add entries)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return any(_differs(value, current.get(key)) for key, value in saved.items())
    return saved != current


def cached_datasets(model, config: TrainConfig, train: TokenizedDataset, valid: TokenizedDataset | None, pad_id: int,
                    report: Report | None = None) -> tuple[Dataset, Dataset | None]:
    """The datasets with their backbone features cached (`feature_cache`); as they were when the cache would pass
    `MAX_CACHE_BYTES`."""
    dtype = model.get_input_embeddings().weight.dtype
    size = sum(cache_size_bytes(d, model.config.hidden_size, dtype) for d in (train, valid) if d is not None)
    if size > MAX_CACHE_BYTES:
        message = f"feature cache: {size / 2**30:.1f} GiB would pass {MAX_CACHE_BYTES / 2**30:.0f} GiB; the backbone runs every step"
        tell(message, report)
        return train, valid
    collator = NumericCollator(pad_token_id=pad_id)
    batch_size = config.eval_batch_size or config.batch_size
    started = time.perf_counter()
    train = cache_features(model, train, collator, batch_size, report)
    valid = cache_features(model, valid, collator, batch_size) if valid is not None else None
    message = (f"feature cache: the frozen backbone read {len(train)} training examples once "
               f"({size / 2**20:.0f} MiB, {time.perf_counter() - started:.0f} s); each step runs the heads alone")
    tell(message, report)
    return train, valid


def tokenize_datasets(
    config: TrainConfig, tokenizer: Any, train_docs: list, valid_docs: list
) -> tuple[TokenizedDataset, TokenizedDataset | None]:
    """Tokenize the documents of `read_split_documents`."""
    train = tokenize_documents(train_docs, tokenizer, config.max_length, config.add_eos)
    valid = tokenize_documents(valid_docs, tokenizer, config.max_length, config.add_eos) if valid_docs else None
    logger.info(
        "training on %d examples (%d tokens), validating on %d",
        len(train),
        train.num_tokens(),
        0 if valid is None else len(valid),
    )
    return train, valid


def build_datasets(config: TrainConfig, tokenizer: Any) -> tuple[TokenizedDataset, TokenizedDataset | None]:
    """Read, split and tokenize the training (and validation) data of ``config``."""
    return tokenize_datasets(config, tokenizer, *read_split_documents(config))


def apply_lora(model: CausalQwenForCausalLM, config: TrainConfig) -> nn.Module:
    """LoRA adapters on the backbone's ``lora_target_modules``; the numeric embedding and the causal heads
    train fully and are saved with the adapter (peft ``modules_to_save``)."""
    from peft import LoraConfig, get_peft_model

    modules_to_save = ["numeric_embedding", "abduction", "action"]
    if model.config.learnable_threshold:
        modules_to_save.append("ovr_thresholds")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.model.named_modules()}
    missing = [name for name in config.lora_target_modules if name not in present]
    if missing:
        raise ValueError(f"lora_target_modules {missing} are not modules of the backbone (it has e.g. q_proj, up_proj)")
    lora_config = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        modules_to_save=modules_to_save,
        bias="none",
    )
    return get_peft_model(model, lora_config)


def training_arguments(config: TrainConfig, has_validation: bool) -> TrainingArguments:
    """`TrainingArguments` for ``config`` (the model-specific parts live in `CausalQwenTrainer`)."""
    evaluate = has_validation and config.eval_steps > 0
    bf16 = config.bf16
    if bf16 == "auto":  # the commands' automatic choice (`resolve_device_and_dtype`), as autocast on a CUDA GPU
        from ..conversion.devices import resolve_device_and_dtype

        device, dtype = resolve_device_and_dtype("cpu" if config.use_cpu else None, None)
        bf16 = device.type == "cuda" and dtype == torch.bfloat16
    several_processes = int(os.environ.get("WORLD_SIZE", "1")) > 1
    # Without a GPU, Accelerate forms a DDP group (and allows bf16 autocast) only when told to use the CPU.
    use_cpu = config.use_cpu or ((several_processes or bf16) and not torch.cuda.is_available())
    ddp_backend = config.ddp_backend
    if ddp_backend is None and several_processes:
        ddp_backend = "gloo" if use_cpu else "nccl"
    warmup = config.warmup_steps if config.warmup_steps < 1 else int(config.warmup_steps)
    report_to = [] if config.report_to in ([], ["none"]) else list(config.report_to)
    return TrainingArguments(
        output_dir=config.output_dir,
        seed=config.seed,
        max_steps=config.max_steps,
        num_train_epochs=config.num_train_epochs,
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.eval_batch_size or config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        optim=config.optim,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=warmup,
        max_grad_norm=config.max_grad_norm,
        logging_strategy="steps",
        logging_steps=config.logging_steps,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=config.eval_steps if evaluate else None,
        save_strategy="steps" if config.save_steps > 0 else "no",
        save_steps=config.save_steps if config.save_steps > 0 else 500,
        save_total_limit=config.save_total_limit,
        report_to=report_to,
        disable_tqdm=not config.progress_bar,
        remove_unused_columns=False,  # numeric_values must reach the model
        label_names=["labels"],
        prediction_loss_only=True,  # never gather (B,S,V) scores in evaluation
        bf16=bf16,
        activation_checkpointing=config.activation_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if config.activation_checkpointing else None,
        ddp_backend=ddp_backend,
        ddp_find_unused_parameters=False,
        dataloader_num_workers=config.dataloader_num_workers,
        dataloader_pin_memory=torch.cuda.is_available() and not use_cpu,
        use_cpu=use_cpu,
    )


# ---- the run ---------------------------------------------------------------------------------------------
@dataclass
class TrainingResult:
    """Where a run wrote its outputs, and how far it got. ``trained``: False when the run had already finished
    (``message`` says so; ``train_loss`` is then None). ``regression_refit_before``: the refit to the rows trained
    on that the checks measured; ``regression_refit``: the saved one, to every training row; ``interval_floor``:
    the widths floored at the warm start's error (`interval_floor`: a table too small for ``interval_check``, or
    a split by a column with the backbone frozen); ``earlier_width``: the widths where the earlier numbers are
    read, set to the warm start's error with them (`run_earlier_width`); ``warm_start``: the regression warm
    start's report (this run's, or the one a resumed run continues), with whether it kept the earlier numbers."""

    output_dir: Path
    final_dir: Path
    metrics_file: Path
    adapter_dir: Path | None
    global_step: int
    train_loss: float | None
    trained: bool = True
    resumed_from: str | None = None
    message: str | None = None
    interval_check: IntervalCheckReport | None = None
    interval_floor: IntervalFloorReport | None = None
    earlier_width: EarlierWidthReport | None = None
    location_check: LocationCheckReport | None = None
    regression_refit: WarmStartReport | None = None
    regression_refit_before: WarmStartReport | None = None
    warm_start: WarmStartReport | None = None


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def run_training(
    config: TrainConfig,
    resume: bool | str = False,
    callbacks: Sequence[TrainerCallback] = (),
    report: Report | None = None,
) -> TrainingResult:
    """Train as ``config`` says; ``resume``: True for the newest complete checkpoint of ``output_dir``, or a
    checkpoint path. ``report`` receives one-line messages for the user (which checkpoint is resumed, the split
    sizes). Nothing in ``output_dir`` is deleted or overwritten before config and data have been checked, and
    the folder is locked while the run lasts."""
    config.validate()  # fills what the config left to the recipe (idempotent)
    output_dir = check_output_dir(config.output_dir)
    created = [folder for folder in (output_dir, *output_dir.parents) if not folder.exists()]  # deepest first
    lock = OutputLock(output_dir) if _is_main_process() else None
    try:
        with lock if lock is not None else contextlib.nullcontext():
            if resume is True:
                check_resumed_settings(output_dir, config)
            plan = plan_run(output_dir, config.max_steps, resume, config.overwrite_output_dir,
                            final_name=FINAL_DIR, outputs=(FINAL_DIR, ADAPTER_DIR), started_marker=CONFIG_FILE)
            if plan.message:
                tell(plan.message, report)
            if plan.finished and plan.final_from is None:
                clear_for_run(plan, output_dir)  # a run killed after publishing final/ may leave an empty .staging/
                return _finished_result(config, plan)
            return _train(config, plan, callbacks, report)
    except BaseException as stop:
        if created and lock is not None:
            _remove_if_only_lock(output_dir, created[1:])
        if not isinstance(stop, Exception):  # Ctrl-C or SIGTERM: whether `--resume` has a checkpoint to go on from
            stop.resumable = Path(output_dir).is_dir() and bool(list_checkpoints(output_dir))
        raise


def _remove_if_only_lock(folder: Path, parents: list[Path]) -> None:
    """Remove ``folder`` when this run created it and stopped before writing anything but its lock file (bad data
    or settings), and the ``parents`` it created for it (deepest first) that are left empty: a failed first run
    leaves no empty run folder behind."""
    try:
        if {entry.name for entry in folder.iterdir()} <= {LOCK_FILE}:
            (folder / LOCK_FILE).unlink(missing_ok=True)
            folder.rmdir()
            for parent in parents:
                parent.rmdir()  # OSError once one is not empty
    except OSError:  # gone already, or another run started writing: leave it
        pass


def _finished_result(config: TrainConfig, plan: RunPlan) -> TrainingResult:
    output_dir = Path(config.output_dir)
    return TrainingResult(
        output_dir=output_dir,
        final_dir=output_dir / FINAL_DIR,
        metrics_file=output_dir / METRICS_FILE,
        adapter_dir=output_dir / ADAPTER_DIR if config.lora else None,
        global_step=int(plan.finished_step or 0),
        train_loss=None,
        trained=False,
        message=plan.message,
    )


def adopt_tokenizer_padding(model: CausalQwenForCausalLM, tokenizer: Any) -> None:
    """The tokenizer's pad id into the model's config and generation config where they have none: what `Trainer`
    does on its own for a converted Qwen (whose config names no pad token), with a warning on every run."""
    pad_id = getattr(tokenizer, "pad_token_id", None)
    for holder in (model.config, getattr(model, "generation_config", None)):
        if pad_id is not None and holder is not None and getattr(holder, "pad_token_id", None) is None:
            holder.pad_token_id = pad_id


def target_decimals(docs: Sequence[data_module.Document]) -> int | None:
    """The decimals the documents' targets are most often written with (`decimals_written`; ``"$1,757.12"`` →
    2): the fewest a forecast of the target is written with (`format_prediction`'s ``min_decimals``), so that
    ``predict`` and ``generate`` write the field as the table does. None without targets."""
    written = [find_numbers(doc.text)[doc.target_ordinal].text for doc in docs if doc.target_ordinal is not None]
    return decimals_written(written)


def target_lower_bound(docs: Sequence[data_module.Document]) -> float | None:
    """0 when every document's target is at least 0 (``predict`` cuts its intervals there), else None (also
    without targets)."""
    values = [doc.target_value for doc in docs if doc.target_value is not None]
    return 0.0 if values and min(values) >= 0 else None


def check_target_varies(config: TrainConfig, train_docs: Sequence[data_module.Document]) -> None:
    """``ValueError`` when the config's ``target`` takes one value in every training row: there is no spread to
    learn, and a Cauchy of scale 0 has no density (the first step's loss would be nan)."""
    values = {doc.target_value for doc in train_docs if doc.target_value is not None}
    if config.target is not None and len(values) == 1:
        raise ValueError(f"target '{config.target}' is {next(iter(values)):g} in every one of the "
                         f"{len(train_docs)} training rows: there is nothing to forecast (a constant has no spread "
                         "to learn); choose another target or add rows where it varies")


def _train(config: TrainConfig, plan: RunPlan, callbacks: Sequence[TrainerCallback], report: Report | None):
    """Check the data, build model and trainer, clear what a fresh start replaces, then train (or only write
    ``final/`` from a finished run's last checkpoint)."""
    tell(config.recipe_line(), report)
    check_model_named(config)
    train_docs, valid_docs = read_split_documents(config, report)
    check_target_varies(config, train_docs)
    train_docs, check_docs = keep_check_slice(config, train_docs, report)
    train_docs = out_of_fold_order(config, train_docs)
    set_seed(config.seed)
    model, tokenizer = build_model_and_tokenizer(config)
    # the saved tokenizer writes a forecast of the target with its decimals, and predict cuts its intervals at 0
    # for a target never negative (an earlier run's target is forgotten)
    targets = [*train_docs, *check_docs] if config.target is not None else []
    tokenizer.number_min_decimals = target_decimals(targets)
    tokenizer.number_lower_bound = target_lower_bound(targets)
    train_dataset, eval_dataset = tokenize_datasets(config, tokenizer, train_docs, valid_docs)
    if config.freeze_backbone:
        logger.info("froze %d backbone tensors", freeze_groups(model, ["backbone"]))
    if config.numeric_embedding_learning_rate == 0:  # frozen, not merely still: its gradients leave the clipping
        freeze_groups(model, ["numeric_embedding"])
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    if config.uses_feature_cache(int(os.environ.get("WORLD_SIZE", "1"))):
        train_dataset, eval_dataset = cached_datasets(model, config, train_dataset, eval_dataset, pad_id, report)
    fresh_start = plan.checkpoint is None and plan.final_from is None  # a resumed run has its heads
    ordinals = target_ordinals(train_dataset, train_docs)
    offered = config.earlier_numbers and common_target_ordinal(ordinals) is not None  # a table's target, k ≥ 1
    row_breaks = row_break_ids(tokenizer, train_dataset) if offered else []
    if fresh_start:
        if config.regression_warm_start:
            offer_earlier_numbers(model, config.earlier_numbers, ordinals, row_breaks)
        warm = warm_start(model, train_dataset, NumericCollator(pad_token_id=pad_id),
                          config.eval_batch_size or config.batch_size,
                          regression_ridge=config.regression_warm_start or None,  # false: off
                          num_token_ridge=config.num_token_warm_start or None,
                          progress=report, target_ordinals=ordinals,
                          in_time_order=in_split_order(config, train_docs))["regression"]
    else:  # the heads come from the checkpoint; the read-out reads the earlier numbers the start kept
        warm = load_warm_start(Path(config.output_dir))
        if warm is not None and warm.earlier_numbers:
            model.set_earlier_numbers(warm.earlier_numbers, common_target_ordinal(ordinals), row_breaks)
    trained: nn.Module = apply_lora(model, config) if config.lora else model
    if config.freeze_decision_scale:  # after LoRA: peft's trainable copies of the heads must be frozen too
        logger.info("froze the decision scale (%d tensors: W_scale, b_scale, b_noise, token noise)", freeze_decision_scale(trained))
    args = training_arguments(config, has_validation=eval_dataset is not None)
    output_dir = Path(config.output_dir)
    metrics_file = output_dir / METRICS_FILE
    adopt_tokenizer_padding(model, tokenizer)
    trainer = CausalQwenTrainer(
        model=trained,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=NumericCollator(pad_token_id=pad_id),
        processing_class=tokenizer,  # saved with every checkpoint-N, so each loads as a model folder
        callbacks=[MetricsJsonlCallback(metrics_file), *callbacks],
        train_config=config,
    )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and trainer.args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise RuntimeError(
            f"{os.environ['WORLD_SIZE']} processes were started but they form no DDP group (parallel mode "
            f"{trainer.args.parallel_mode.value}); on CPUs launch with torchrun, or accelerate launch --multi_gpu"
        )
    if trainer.is_world_process_zero():
        output_dir.mkdir(parents=True, exist_ok=True)
        clear_for_run(plan, output_dir)
        write_text_atomic(output_dir / CONFIG_FILE, yaml.safe_dump(saved_settings(config), sort_keys=False))
        if fresh_start:
            save_warm_start(output_dir, warm)
    trainer.regression_rate_cap = regression_rate_cap(warm)  # a resumed run's optimizer state keeps its own rates
    wanted = _default(config.regression_learning_rate, config.learning_rate)
    capped = trainer.regression_rate_cap is not None and trainer.regression_rate_cap < wanted
    if fresh_start and capped and _is_main_process():
        tell(f"regression head's learning rate {trainer.regression_rate_cap:.3g} instead of {wanted:g}: "
             f"{REGRESSION_STEP_SHARE:g} of the numbers' out-of-fold error {warm.out_of_fold_mdae:.3g}, so that a "
             "step moves the read-out's bias by at most that share of the numbers' typical error", report)
    trainer.accelerator.wait_for_everyone()
    if plan.final_from is not None:  # the last step was reached and saved, final/ was not written
        if trainer.is_world_process_zero():  # a kill between publishing it and rotating may have left one more
            rotate_checkpoints(output_dir, config.save_total_limit)
        trainer._load_from_checkpoint(plan.final_from)
        trainer.state = TrainerState.load_from_json(str(Path(plan.final_from) / "trainer_state.json"))
        train_loss, trained_now = None, False
    else:
        result = trainer.train(resume_from_checkpoint=plan.checkpoint)
        train_loss, trained_now = float(result.training_loss), True
    tells = report if _is_main_process() else None
    refit_before = run_regression_refit(model, config, tokenizer, train_dataset, train_docs, check_docs, pad_id,
                                        report=tells, with_slice=False)  # the checks measure the saved read-out
    located = run_location_check(model, config, tokenizer, train_docs, check_docs, pad_id, tells)  # before the widths
    earlier_width = run_earlier_width(model, config, train_dataset, train_docs, warm, pad_id, tells)  # before checks
    checked = run_interval_check(model, config, tokenizer, train_docs, check_docs, pad_id, tells)
    floored = run_interval_floor(model, config, train_dataset, train_docs, check_docs, warm, pad_id, tells)
    refit = run_regression_refit(model, config, tokenizer, train_dataset, train_docs, check_docs, pad_id, located,
                                 tells, before=refit_before)
    final_dir, adapter_dir = save_final(trainer, tokenizer, config)
    return TrainingResult(
        output_dir=output_dir,
        final_dir=final_dir,
        metrics_file=metrics_file,
        adapter_dir=adapter_dir,
        global_step=trainer.state.global_step,
        train_loss=train_loss,
        trained=trained_now,
        resumed_from=plan.checkpoint,
        message=plan.message,
        interval_check=checked,
        interval_floor=floored,
        earlier_width=earlier_width,
        location_check=located,
        regression_refit=refit,
        regression_refit_before=refit_before,
        warm_start=warm,
    )


def save_final(trainer: CausalQwenTrainer, tokenizer: Any, config: TrainConfig) -> tuple[Path, Path | None]:
    """``final/`` (full model + tokenizer + the trainer state saying which step it is) and, with LoRA,
    ``adapter/`` (adapter + heads); each written under ``.staging/`` and published by one rename."""
    output_dir = Path(config.output_dir)
    final_dir, adapter_dir = output_dir / FINAL_DIR, None
    staged_final = staging_path(output_dir, FINAL_DIR)
    staged_adapter = staging_path(output_dir, ADAPTER_DIR)
    if config.lora:
        adapter_dir = output_dir / ADAPTER_DIR
    if trainer.is_world_process_zero():
        for staged in (staged_final, staged_adapter):
            _remove_tree(staged)
    trainer.accelerator.wait_for_everyone()
    if trainer.is_fsdp_enabled:  # gathering sharded weights is collective: every process takes part
        trainer.save_model(str(staged_adapter if config.lora else staged_final))
    elif trainer.is_world_process_zero():
        model = trainer.accelerator.unwrap_model(trainer.model)
        if config.lora:
            model.save_pretrained(str(staged_adapter))
            model = model.merge_and_unload()
        model.save_pretrained(str(staged_final))
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        staged_final.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(staged_final))
        trainer.state.save_to_json(str(staged_final / "trainer_state.json"))
        if config.lora:
            publish(staged_adapter, adapter_dir)
        publish(staged_final, final_dir)
        logger.info("saved the trained model to %s", final_dir)
    trainer.accelerator.wait_for_everyone()
    return final_dir, adapter_dir


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
