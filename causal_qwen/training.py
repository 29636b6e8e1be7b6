"""Fine-tuning CausalQwen with `transformers.Trainer` (losses: docs/design.md, "Losses").

`run_training(config)` builds the model, tokenizer and datasets of a `TrainConfig`, trains with
`CausalQwenTrainer` and writes into ``output_dir``:

    checkpoint-N/      every ``save_steps`` steps, the last ``save_total_limit`` kept (``resume=True`` continues)
    metrics.jsonl      one JSON object per logged step (see `causal_qwen.monitoring`)
    runs/              TensorBoard event files
    final/             the trained model + tokenizer (`CausalQwenForCausalLM.from_pretrained`)
    adapter/           with LoRA: the peft adapter, heads included (`PeftModel.from_pretrained(base, adapter/)`)
    train_config.yaml  the resolved settings

The same entry point runs under ``torchrun --nproc_per_node N`` and ``accelerate launch`` (DDP; gloo on CPUs).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from torch import Tensor, nn
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint
from transformers.training_args import ParallelMode

from . import data as data_module
from .collator import NumericCollator, TokenizedDataset, tokenize_documents
from .modeling import CausalQwenForCausalLM
from .monitoring import MetricAccumulator, MetricsJsonlCallback, decision_stats, number_stats, representation_stats
from .parameter_groups import GROUPS, drop_gradients, freeze_groups, head_gradient_norms, optimizer_groups
from .train_config import TrainConfig

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
        self.train_config = train_config
        # Our forward's **kwargs go to the backbone, not to a token-count-normalised loss.
        self.model_accepts_loss_kwargs = False
        self.train_figures = MetricAccumulator()
        self.eval_figures = MetricAccumulator()
        self._step_learning_rates: dict[str, float] = {}

    # -- parts of the model --
    def causal_model(self) -> CausalQwenForCausalLM:
        """The `CausalQwenForCausalLM` inside DDP/peft wrappers (its heads may be peft copies)."""
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def group_learning_rates(self) -> dict[str, float]:
        config = self.train_config
        return {
            "heads": config.learning_rate,
            "regression": _default(getattr(config, "regression_learning_rate", None), config.learning_rate),
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

    # -- forward, backward --
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, return_scores=False, use_cache=False)
        if outputs.loss is None:
            raise ValueError(f"the model returned no loss; the batch holds {sorted(inputs)} (labels are needed)")
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


def build_model_and_tokenizer(config: TrainConfig) -> tuple[CausalQwenForCausalLM, Any]:
    """The model named by ``config.model`` (a converted folder, or a Qwen2 base converted now) and its tokenizer."""
    from .loading import convert_base
    from .tokenizer import NumericTokenizer

    tokenizer = NumericTokenizer.from_pretrained(config.tokenizer) if config.tokenizer else None
    if is_causal_qwen_folder(config.model):
        model = CausalQwenForCausalLM.from_pretrained(config.model, **config.model_config)
        tokenizer = tokenizer or NumericTokenizer.from_pretrained(config.model)
    elif tokenizer is not None:
        overrides = {"num_token_id": tokenizer.num_token_id, **config.model_config}
        model = CausalQwenForCausalLM.from_qwen(config.model, **overrides)
    else:
        model, tokenizer = convert_base(config.model, **config.model_config)
    if tokenizer.num_token_id != model.config.num_token_id:
        raise ValueError(
            f"the tokenizer's <NUM> id {tokenizer.num_token_id} differs from the model's {model.config.num_token_id}"
        )
    return model, tokenizer


def build_datasets(config: TrainConfig, tokenizer: Any) -> tuple[TokenizedDataset, TokenizedDataset | None]:
    """Read, split and tokenize the training (and validation) data of ``config``."""
    source = data_module.DataSource(
        path=config.data,
        format=config.data_format,
        text_field=config.text_field,
        template=config.template,
        numeric_fields=config.numeric_fields,
        skip_bad_rows=config.skip_bad_rows,
        text_unit=config.text_unit,
        split_by=config.split_by,
    )
    documents = data_module.read_documents(source)
    if config.validation_data is not None:
        if config.split_by is not None or config.validation_split > 0:
            raise ValueError("give either validation_data or a split (split_by / validation_split), not both")
        train_docs = documents
        valid_docs = data_module.read_documents(
            data_module.DataSource(**{**source.__dict__, "path": config.validation_data, "split_by": None})
        )
    else:
        spec = data_module.SplitSpec(
            fraction=config.validation_split, split_by=config.split_by, split_at=config.split_at, seed=config.seed
        )
        train_docs, valid_docs = data_module.split_documents(documents, spec)
    if config.max_eval_samples is not None:
        valid_docs = valid_docs[: config.max_eval_samples]
    train = tokenize_documents(train_docs, tokenizer, config.max_length, config.add_eos)
    valid = tokenize_documents(valid_docs, tokenizer, config.max_length, config.add_eos) if valid_docs else None
    logger.info(
        "training on %d examples (%d tokens), validating on %d",
        len(train),
        train.num_tokens(),
        0 if valid is None else len(valid),
    )
    return train, valid


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
    if bf16 == "auto":
        bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported() and not config.use_cpu)
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
    """Where a run wrote its outputs, and how far it got."""

    output_dir: Path
    final_dir: Path
    metrics_file: Path
    adapter_dir: Path | None
    global_step: int
    train_loss: float


def prepare_output_dir(config: TrainConfig, resume: bool | str) -> str | None:
    """The checkpoint to resume from (None for a fresh start); a fresh start in a folder with checkpoints
    needs ``overwrite_output_dir`` and clears them."""
    output_dir = Path(config.output_dir)
    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if isinstance(resume, str):
        if not Path(resume).is_dir():
            raise ValueError(f"--resume: checkpoint folder {resume!r} does not exist")
        return resume
    if resume:
        if last is None:
            raise ValueError(f"--resume: {output_dir} holds no checkpoint-N folder to resume from")
        return last
    if last is not None:
        if not config.overwrite_output_dir:
            raise ValueError(
                f"{output_dir} already holds checkpoints (latest {Path(last).name}); pass --resume to continue, "
                "or --set overwrite_output_dir=true to start afresh"
            )
        if int(os.environ.get("RANK", "0")) == 0:
            for child in output_dir.glob("checkpoint-*"):
                shutil.rmtree(child, ignore_errors=True)
    return None


def run_training(
    config: TrainConfig, resume: bool | str = False, callbacks: Sequence[TrainerCallback] = ()
) -> TrainingResult:
    """Train as ``config`` says; ``resume``: True for the last checkpoint of ``output_dir``, or a checkpoint path."""
    checkpoint = prepare_output_dir(config, resume)
    set_seed(config.seed)
    model, tokenizer = build_model_and_tokenizer(config)
    train_dataset, eval_dataset = build_datasets(config, tokenizer)
    if config.freeze_backbone:
        logger.info("froze %d backbone tensors", freeze_groups(model, ["backbone"]))
    trained: nn.Module = apply_lora(model, config) if config.lora else model
    args = training_arguments(config, has_validation=eval_dataset is not None)
    output_dir = Path(config.output_dir)
    metrics_file = output_dir / METRICS_FILE
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    trainer = CausalQwenTrainer(
        model=trained,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=NumericCollator(pad_token_id=pad_id),
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
        (output_dir / CONFIG_FILE).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    result = trainer.train(resume_from_checkpoint=checkpoint)
    final_dir, adapter_dir = save_final(trainer, tokenizer, config)
    return TrainingResult(
        output_dir=output_dir,
        final_dir=final_dir,
        metrics_file=metrics_file,
        adapter_dir=adapter_dir,
        global_step=trainer.state.global_step,
        train_loss=float(result.training_loss),
    )


def save_final(trainer: CausalQwenTrainer, tokenizer: Any, config: TrainConfig) -> tuple[Path, Path | None]:
    """``final/`` (full model + tokenizer) and, with LoRA, ``adapter/`` (adapter + heads)."""
    output_dir = Path(config.output_dir)
    final_dir, adapter_dir = output_dir / FINAL_DIR, None
    if config.lora:
        adapter_dir = output_dir / ADAPTER_DIR
    if trainer.is_fsdp_enabled:  # gathering sharded weights is collective: every process takes part
        trainer.save_model(str(adapter_dir if config.lora else final_dir))
    elif trainer.is_world_process_zero():
        model = trainer.accelerator.unwrap_model(trainer.model)
        if config.lora:
            model.save_pretrained(str(adapter_dir))
            model = model.merge_and_unload()
        model.save_pretrained(str(final_dir))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(final_dir))
        logger.info("saved the trained model to %s", final_dir)
    trainer.accelerator.wait_for_everyone()
    return final_dir, adapter_dir
