"""`TrainConfig`: every setting of ``causal-qwen train``, read from YAML with ``--set key=value`` overrides.

Keys are flat (``max_steps: 60``); ``model_config`` is a mapping of `CausalQwenConfig` fields used when the
model is built (``--set model_config.ovr_negatives=2048``). A key that does not exist raises ``ValueError``
naming the file and suggesting the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .data import VEGA_PREFIX
from .recipes import RECIPE_NAMES, base_kind, describe_recipe, recipe_settings

# Accepted for the Hugging Face spellings users know; mapped to the key named here.
ALIASES = {
    "gradient_checkpointing": "activation_checkpointing",
    "per_device_train_batch_size": "batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
}
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BF16_CHOICES = ("auto", True, False)
LOCATION_CHECK_CHOICES = (True, "seeded", False)
"""``location_check``: on every check slice, only on a seeded one (not the latest stretch of a split in time), never."""


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML parser's error in one line: where (1-based line and column) and what, without the quoted source."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}not valid YAML ({problem})"


def _trainer_choices() -> tuple[list[str], list[str]]:
    """The names transformers' Trainer takes for ``optim`` and ``lr_scheduler_type`` (imported when checked)."""
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    return [name.value for name in OptimizerNames], [name.value for name in SchedulerType]


@dataclass
class TrainConfig:
    """Settings of one training run (see ``examples/seattle_weather.yaml`` for a commented example)."""

    # ---- model ---------------------------------------------------------------------------------------------
    model: str = "random:tiny"
    """A converted CausalQwen folder, or a Qwen2 base converted on the fly (``random:*`` preset, Qwen folder,
    ``.gguf`` file or hub id)."""
    tokenizer: str | None = None
    """Folder of a saved `NumericTokenizer`; default: the model folder's, or the offline Qwen2.5 one."""
    model_config: dict = field(default_factory=dict)
    """`CausalQwenConfig` fields set when the model is built, e.g. ``{ovr_negatives: 2048}`` (merged over the
    recipe's)."""
    recipe: str = "auto"
    """Where the settings this config leaves out (null below) come from: ``random`` (a random preset: everything
    trains, fast), ``pretrained`` (a real Qwen: frozen backbone, heads at 1e-5, warm starts), or ``auto``: the
    base's kind (`causal_qwen.training.recipes`). ``train`` prints the choice and what it set."""

    # ---- data ----------------------------------------------------------------------------------------------
    data: str | None = None
    """Training file (.jsonl, .txt, .csv/.tsv), or ``vega:NAME`` for a file of the vega-datasets package."""
    data_format: str = "auto"
    """How to read ``data``: ``auto`` (by the suffix: .jsonl/.json/.ndjson JSON Lines or one JSON array of records,
    .csv/.tsv CSV, anything else plain text), ``jsonl``, ``csv`` (a ``.txt`` file holding CSV) or ``text``."""
    text_field: str = "text"
    """JSONL/CSV field holding each document's text, when no ``template`` builds it."""
    template: str | None = None
    """Format string with named fields turning a CSV/JSONL row into text: ``"On {date} it rained {rain} mm"``."""
    numeric_fields: list | None = None
    """Template fields that must hold numbers; default: the fields whose values are mostly numbers."""
    skip_bad_rows: bool = False
    """Skip a row that cannot be read (a number field that holds no number, a target the tokenizer does not read
    as one number) with a warning, instead of stopping at it; the first five are named and all are counted."""
    text_unit: str = "line"
    """Plain text: one document per ``line`` or per blank-line-separated ``block``."""
    validation_data: str | None = None
    """A separate file of held-out rows (read as ``data`` is), instead of a split of ``data``."""
    validation_split: float = 0.0
    """Fraction of rows (or, with ``split_by``, of the latest values) kept for validation."""
    split_by: str | None = None
    """Column to split on: rows with a value >= ``split_at`` validate (e.g. dates: train early, validate late)."""
    split_at: Any = None
    """Where ``split_by`` splits; an unquoted YAML date (``2024-02-20``) is kept as its ISO text."""
    max_length: int = 512
    """Tokens per document; longer ones are cut."""
    add_eos: bool = True
    """End every document with the end-of-text token, so that the model learns where a text stops."""
    max_eval_samples: int | None = None
    """Evaluate on at most this many validation examples (the first ones)."""
    target: str | None = None
    """A template field holding the number that matters (e.g. ``temp_max``): ``causal-qwen eval`` reading this
    config (``--config``, or the run's saved ``train_config.yaml``) scores it by default."""

    # ---- output --------------------------------------------------------------------------------------------
    output_dir: str = "runs/causal-qwen"
    """The run folder; a config file that names none trains into ``runs/<the config file's name>``
    (`load_train_config`), so configs of different names do not share a folder by default."""
    overwrite_output_dir: bool = False
    """Start afresh in an ``output_dir`` that already holds checkpoints (they are deleted)."""

    # ---- optimisation --------------------------------------------------------------------------------------
    seed: int = 42
    """Seeds the run: initialisation of what is new, data order, the random split and the check slice."""
    max_steps: int | None = None
    """Optimizer steps; -1: ``num_train_epochs`` decides; null: the recipe's (random 180, pretrained 300)."""
    num_train_epochs: float = 1.0
    """Passes over the training rows, used when ``max_steps`` is -1."""
    batch_size: int | None = None
    """Examples per process and micro-step; null: the recipe's (random 64, pretrained 8)."""
    eval_batch_size: int | None = None
    """Examples per evaluation batch; null: ``batch_size``."""
    gradient_accumulation_steps: int = 1
    """Micro-steps whose gradients add up to one optimizer step (a larger effective batch in the same memory)."""
    learning_rate: float | None = None
    """Learning rate of the causal heads (abduction, action's classification head, ``b_noise`` and the token noise,
    learnable thresholds); null: the recipe's (random 3e-2; pretrained 1e-5: on real weights larger rates move the
    calibrated OvR decision, benchmarks/real_weights_finetune.py)."""
    regression_learning_rate: float | None = None
    """Learning rate of the regression head (``W_reg``, ``b_reg``); null: the recipe's."""
    backbone_learning_rate: float | None = None
    """Learning rate of the Qwen2 backbone when it trains; null: the recipe's (random 3e-3; pretrained: frozen)."""
    numeric_embedding_learning_rate: float | None = None
    """Learning rate of the numeric embedding (the direction ``w_num`` along which a number's ``symlog`` value is
    added to ``<NUM>``'s embedding);
    null: the recipe's (random 3e-2; pretrained 0: frozen, so the backbone's features can be cached)."""
    lora_learning_rate: float | None = None
    """Default: ``learning_rate``."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    optim: str = "adamw_torch_fused"
    """transformers' optimizer name (``TrainingArguments.optim``)."""
    lr_scheduler_type: str = "cosine"
    """transformers' learning-rate schedule (``linear``, ``cosine``, ``constant``, ...)."""
    warmup_steps: float | None = None
    """Warm-up steps (int), or a fraction of the run (float in [0, 1)); null: the recipe's."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""

    # ---- what trains ---------------------------------------------------------------------------------------
    freeze_backbone: bool | None = None
    """Never update the Qwen2 backbone (embeddings, transformer, final norm); null: the recipe's (pretrained:
    true)."""
    freeze_backbone_steps: int = 0
    """Keep the backbone (and LoRA adapters) fixed for the first N optimizer steps only."""
    freeze_decision_scale: bool | None = None
    """Keep the decision scale set at conversion (``W_scale``, ``b_scale``, ``b_noise``, ``γ_S``): calibrated on a
    real base it is ~1e-9 (``s``) and ~1e-4 (``γ_S``) logits, and one Adam step would move it by orders of magnitude
    (the standard decision and the sparsity of the OvR probabilities with it). ``false`` lets it train (the
    random recipe does); null: the recipe's."""
    regression_warm_start: float | str | bool | None = None
    """Start the regression head at the ridge fit of the training numbers on the model's features, with this
    relative ridge ``λ`` (``auto``: chosen among 1e-2 … 100 by the out-of-fold error, `warm_start.choose_ridge`),
    and the numbers' own noise at the fit's median absolute out-of-fold residual (`causal_qwen.training.warm_start`);
    read once before the first step, not on resume. false: the converted head (``N(0, 1/C)``); null: the recipe's."""
    earlier_numbers: int | None = None
    """How many of a document's numbers before its target the number read-out may read beside the features, as
    values (`heads.EarlierNumbers`): the regression warm start fits the read-out with and without them and keeps
    them only where they lower the error of the training rows' blocks (forecast forward after a split in time;
    `warm_start.keeps_earlier`). Needs a ``target`` that is the same number k ≥ 1 of every document (a day's
    close after its open, high and low). 0: never; null: the recipe's (3)."""
    num_token_warm_start: float | bool | None = None
    """Start the classification head's ``<NUM>`` row at the softmax-likelihood fit of "is the next token a number"
    on the model's features, every other row fixed, with this ridge ``λ`` on standardised features (1e-3 is a
    good value; `causal_qwen.training.warm_start`); read in the same pass as the regression warm start. Needed on a
    real base, whose ``<NUM>`` row is a reserved row Qwen never trained. false: the converted row; null: the
    recipe's (pretrained 1e-3)."""
    interval_check: float | bool | None = None
    """Keep this fraction of the training rows (the latest ones when ``split_by`` is set, else a seeded pick) out
    of training, and after training measure the number intervals on them: when a likelihood-ratio test rejects
    their width at 5%, every ``scale_Y`` is multiplied by the slice's Cauchy maximum-likelihood factor
    (`causal_qwen.training.interval_check`; ``config.number_scale_factor`` of the saved model; ``train`` reports
    it). false: off; null: the recipe's (0.1). A slice under 8 numbers is widened to 8 when that takes at most a
    quarter of the training rows; a table too small for that keeps every row and instead floors its widths at the
    regression warm start's out-of-fold error (`interval_check.floor_intervals`)."""
    refit_after_check: bool | None = None
    """Refit the regression read-out (``W_reg``, ``b_reg``) by the warm start's ridge: before the checks to the
    rows trained on, so that they measure the read-out that is saved, and after them to every training row, the
    check slice included: the slice measured the intervals, and the latest rows are what a forecast after a time
    split most needs (`warm_start.refit_regression`). The numbers' noise and the interval factor stay as trained
    and checked. Needs ``regression_warm_start`` and a check slice. null: the recipe's (pretrained: true; random:
    false)."""
    location_check: bool | str | None = None
    """On the interval check's slice, before it: when the training median ``m0`` alone has a lower median absolute
    error there than the model, and a blend ``α·loc_Y + (1 − α)·m0`` a clearly lower one (in 90% of bootstrap
    resamples), the regression head is shrunk to that blend (`causal_qwen.training.location_check`). ``seeded``:
    only when the slice is a seeded pick of the training rows, which stands for the held-out rows of a random split;
    not when it is the latest stretch of a split in time, which is the nearest evidence for a later period but no
    sample of it (on the tiny default it cost the unseen tables more than it gave: docs/benchmarks.md). true: on
    either slice; false: never. Runs only when the interval check has a slice. null: the recipe's (random: seeded;
    pretrained: true)."""
    lora: bool = False
    """LoRA adapters on the backbone (peft); the causal heads and numeric embedding train fully."""
    lora_r: int = 8
    """Rank of each LoRA adapter."""
    lora_alpha: float = 16.0
    """LoRA's scaling: an adapter's update is multiplied by ``lora_alpha / lora_r``."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapters' inputs."""
    lora_target_modules: list = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    """The backbone's linear layers that get adapters (every attention and MLP projection)."""

    cache_backbone_features: bool | None = None
    """Compute every example's backbone features once and train the heads on them (`feature_cache`): valid, and
    used by default (null), when the backbone and the numeric embedding stay frozen for the whole run
    (``freeze_backbone``, no LoRA, ``numeric_embedding_learning_rate: 0``) on one process; false: never."""

    # ---- hardware ------------------------------------------------------------------------------------------
    activation_checkpointing: bool = False
    """Recompute the backbone's activations in the backward pass instead of keeping them: less memory, more
    time (transformers' gradient checkpointing)."""
    bf16: Any = "auto"
    """bf16 autocast: ``auto`` (on when a GPU supports it), true or false."""
    ddp_backend: str | None = None
    """Default: ``nccl`` on GPUs, ``gloo`` on CPUs."""
    dataloader_num_workers: int = 0
    """Worker processes that prepare batches (0: the training process itself)."""
    use_cpu: bool = False
    """Train on the CPU even when a GPU is there."""

    # ---- logging, evaluation, checkpoints ------------------------------------------------------------------
    logging_steps: int = 10
    """Log the losses (and print a progress line when the output is not a terminal) every N steps."""
    eval_steps: int = 100
    """Evaluate every N steps when there is validation data; 0 disables."""
    save_steps: int = 100
    """Write a checkpoint every N steps; 0 disables."""
    save_total_limit: int | None = 2
    """Keep the last K checkpoints."""
    report_to: list = field(default_factory=lambda: ["tensorboard"])
    """Where transformers reports the logged figures (``tensorboard``, ``none``, ...); ``metrics.jsonl`` in
    the run folder is always written."""
    progress_bar: bool = True
    """Trainer's step bar on a terminal (a log file gets a line per logging step instead)."""
    monitor_positions: int = 32
    """Target positions per logged batch used for token accuracy and the OvR probability of the target
    (each costs a (positions × V) score); 0 disables these two figures."""

    # ---------------------------------------------------------------------------------------------------------
    def validate(self, source: str = "config", origins: dict[str, str] | None = None) -> "TrainConfig":
        """Check every value's type and range; raises ``ValueError`` naming where the value came from (``source``,
        or ``origins[key]`` for a key set elsewhere, e.g. ``"--set max_steps=abc"``) and the key."""
        hints = typing.get_type_hints(TrainConfig)

        def where(key: str) -> str:
            return (origins or {}).get(key, source)

        for item in dataclasses.fields(self):
            setattr(self, item.name, _coerce(where(item.name), item.name, getattr(self, item.name), hints[item.name]))
        if isinstance(self.split_at, datetime.date):  # YAML reads an unquoted 2024-02-20 as a date
            self.split_at = self.split_at.isoformat()

        def need(condition: bool, key: str, message: str) -> None:
            if not condition:
                raise ValueError(f"{where(key)}: {key} {message}, got {getattr(self, key)!r}")

        need(self.recipe in ("auto", *RECIPE_NAMES), "recipe", f"must be auto, {' or '.join(RECIPE_NAMES)}")
        self._apply_recipe()
        for item in dataclasses.fields(self):  # nan and inf pass every comparison below that they should fail
            value = getattr(self, item.name)
            if isinstance(value, float):
                need(math.isfinite(value), item.name, "must be a finite number")

        need(self.data is not None, "data", "is required (a training file or vega:NAME)")
        need(self.max_length >= 2, "max_length", "must be >= 2")
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        need(self.eval_batch_size is None or self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1")
        need(self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be >= 1")
        need(self.max_steps == -1 or self.max_steps >= 1, "max_steps", "must be >= 1 or -1")
        need(self.num_train_epochs > 0, "num_train_epochs", "must be > 0")
        for key in ("learning_rate", "regression_learning_rate", "backbone_learning_rate", "numeric_embedding_learning_rate",
                    "lora_learning_rate"):
            value = getattr(self, key)
            need(value is None or value >= 0, key, "must be >= 0")  # finite: checked above
        need(self.warmup_steps >= 0 and (self.warmup_steps < 1 or float(self.warmup_steps).is_integer()),
             "warmup_steps", "must be a whole number of steps or a fraction of the run in [0, 1)")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        optimizers, schedulers = _trainer_choices()
        need(self.optim in optimizers, "optim", f"must name one of transformers' optimizers ({', '.join(optimizers[:4])}, ...)")
        need(self.lr_scheduler_type in schedulers, "lr_scheduler_type", f"must be one of {', '.join(schedulers)}")
        need(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        need(self.freeze_backbone_steps >= 0, "freeze_backbone_steps", "must be >= 0")
        need(not (self.lora and self.freeze_backbone), "lora", "cannot be combined with freeze_backbone")
        need(not self.cache_backbone_features or self.features_stay_fixed(), "cache_backbone_features",
             "needs a backbone and numeric embedding frozen for the whole run (freeze_backbone: true, "
             "freeze_backbone_steps: 0, no lora, numeric_embedding_learning_rate: 0)")
        need(self.lora_r >= 1, "lora_r", "must be >= 1")
        need(self.lora_alpha > 0, "lora_alpha", "must be > 0")
        need(0 <= self.lora_dropout < 1, "lora_dropout", "must lie in [0, 1)")
        for key in ("regression_warm_start", "num_token_warm_start"):
            value = getattr(self, key)
            if key == "regression_warm_start" and value == "auto":
                continue
            need(value is False or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                    and math.isfinite(value) and value > 0), key,
                 "must be a positive ridge, " + ("auto, " if key == "regression_warm_start" else "") + "false or null")
        need(self.interval_check is False or (not isinstance(self.interval_check, bool)
                                               and 0 < self.interval_check < 0.5),
             "interval_check", "must be a fraction in (0, 0.5), false or null")
        need(isinstance(self.refit_after_check, bool), "refit_after_check", "must be true, false or null")
        need(isinstance(self.earlier_numbers, int) and not isinstance(self.earlier_numbers, bool)
             and 0 <= self.earlier_numbers <= 16, "earlier_numbers", "must be an int from 0 to 16, or null")
        need(self.location_check in LOCATION_CHECK_CHOICES, "location_check", "must be true, seeded, false or null")
        need(0.0 <= self.validation_split < 1.0, "validation_split", "must lie in [0, 1)")
        need(self.split_at is None or self.split_by is not None, "split_at", "needs split_by")
        need(self.split_at is None or self.validation_split == 0.0, "validation_split",
             "cannot be given with split_at: the rows from split_at on are held out (leave validation_split out, "
             "or give split_by with validation_split alone to hold out its latest values)")
        need(self.bf16 in BF16_CHOICES, "bf16", "must be auto, true or false")
        need(self.logging_steps >= 1, "logging_steps", "must be >= 1")
        need(self.eval_steps >= 0, "eval_steps", "must be >= 0")
        need(self.save_steps >= 0, "save_steps", "must be >= 0")
        need(self.save_total_limit is None or self.save_total_limit >= 1, "save_total_limit", "must be >= 1")
        need(self.monitor_positions >= 0, "monitor_positions", "must be >= 0")
        need(self.max_eval_samples is None or self.max_eval_samples >= 1, "max_eval_samples", "must be >= 1")
        need(self.target is None or self.template is not None, "target", "needs a template naming it")
        if self.target is not None:
            from .data import dotted_name_problem, template_fields

            named = any(char in self.target for char in ".[:!") and "{" + self.target in self.template
            try:
                fields = template_fields(self.template)
            except ValueError:  # '{Price!}' is no format string: the target's name is the cause
                if not named:
                    raise
                fields = []
            if self.target not in fields and any(char in self.target for char in ".[:!"):
                raise ValueError(f"{where('target')}: target '{self.target}' cannot be a template field: "
                                 f"{dotted_name_problem(self.target)}")
            need(self.target in fields, "target", f"must be a field of the template ({', '.join(fields)})")
        _check_model_config(where("model_config"), self.model_config)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def features_stay_fixed(self) -> bool:
        """Whether no parameter before the heads trains: the backbone's features are the same at every step."""
        return bool(self.freeze_backbone and not self.lora and self.numeric_embedding_learning_rate == 0)

    def uses_feature_cache(self, processes: int = 1) -> bool:
        """``cache_backbone_features`` resolved: as set, or (null) when the features stay fixed on one process."""
        if self.cache_backbone_features is not None:
            return self.cache_backbone_features
        return self.features_stay_fixed() and processes == 1

    def _apply_recipe(self) -> None:
        """Fill every null recipe setting (and each ``model_config`` entry not given) from the recipe of
        ``recipe`` (``auto``: the base's kind); ``recipe`` then names the one used and ``recipe_filled`` lists
        what it set (`describe_recipe` turns both into the line ``train`` prints)."""
        name = base_kind(self.model) if self.recipe == "auto" else self.recipe
        filled = []
        if self.lora and self.freeze_backbone is None:  # adapters train the backbone: never frozen under LoRA
            self.freeze_backbone = False
        for key, value in recipe_settings(name).items():
            if key == "model_config":
                for entry, entry_value in value.items():
                    if entry not in self.model_config:
                        self.model_config[entry] = entry_value
                        filled.append(f"model_config.{entry}")
            elif getattr(self, key) is None:
                setattr(self, key, value)
                filled.append(key)
        self.recipe = name
        self.recipe_filled = filled + [key for key in getattr(self, "recipe_filled", []) if key not in filled]

    def recipe_line(self) -> str:
        """What ``train`` prints about the recipe (after `validate`)."""
        return describe_recipe(self.recipe, getattr(self, "recipe_filled", []), self.model)


# ---- loading ---------------------------------------------------------------------------------------------
def load_train_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read ``path`` (YAML mapping; None: defaults only), apply ``key=value`` overrides, validate. A file that names
    no ``output_dir`` trains into ``runs/<its name without suffix>``."""
    values: dict[str, Any] = {}
    source = str(path) if path is not None else "config"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: {_yaml_problem(error)}") from error
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config must be a mapping of keys to values, got a {type(loaded).__name__}")
        for key, value in loaded.items():
            _assign(values, str(key), value, source)
        values.setdefault("output_dir", str(Path("runs") / path.stem))
        for key in ("data", "validation_data"):
            _check_beside_config(path, key, values.get(key))
    origins: dict[str, str] = {}
    for item in overrides:
        key, value = parse_override(item)
        _assign(values, key, value, f"--set {item}")
        top = key.partition(".")[0]
        origins[ALIASES.get(top, top)] = f"--set {item}"
    return TrainConfig(**values).validate(source, origins)


def _check_beside_config(config_file: Path, key: str, value: Any) -> None:
    """A relative file path is read from the working directory; when only the config's own folder holds it, say
    so (a config written next to its data and run from elsewhere)."""
    if not isinstance(value, str) or value.startswith(VEGA_PREFIX) or Path(value).expanduser().is_absolute():
        return
    beside = config_file.parent / value
    if not Path(value).exists() and beside.is_file():
        raise FileNotFoundError(
            f"{config_file}: {key} {value!r} is not in the working directory ({Path.cwd()}) but is in the config's "
            f"folder; relative paths are read from the working directory, so run from {config_file.parent} or write "
            f"{key}: {beside.resolve()}"
        )


def parse_override(item: str) -> tuple[str, Any]:
    """``"key=value"`` → ``(key, value)``, the value read as YAML (``60`` → 60, ``true`` → True, ``[a, b]``)."""
    if not isinstance(item, str) or "=" not in item:
        raise ValueError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ValueError(f"--set expects key=value, got {item!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def valid_keys() -> list[str]:
    return [item.name for item in dataclasses.fields(TrainConfig)]


def key_docs() -> dict[str, str]:
    """Each `TrainConfig` key's description: the docstring written under its field, read from this module's
    source (Python keeps no attribute docstrings at run time)."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(TrainConfig)).body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def describe_keys() -> str:
    """Every config key with its default (YAML spelling; null: the recipe's or none) and its description."""
    import textwrap

    docs = key_docs()
    blocks = []
    for item in dataclasses.fields(TrainConfig):
        default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
        shown = yaml.safe_dump(default, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
        text = " ".join(docs.get(item.name, "").split())
        blocks.append(f"{item.name}: {shown}\n" + textwrap.fill(text, width=100, initial_indent="    ",
                                                                subsequent_indent="    "))
    return "\n".join(blocks)


def _assign(values: dict[str, Any], key: str, value: Any, source: str) -> None:
    top, _, rest = key.partition(".")
    top = ALIASES.get(top, top)
    if top not in valid_keys():
        raise ValueError(f"{source}: unknown config key '{top}'{_suggestion(top, valid_keys() + list(ALIASES))}")
    if not rest:
        values[top] = value
        return
    if top != "model_config":
        raise ValueError(f"{source}: '{key}': only model_config takes dotted sub-keys")
    nested = dict(values.get(top) or {})
    nested[rest] = value
    values[top] = nested


def _suggestion(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5)
    if close:
        return f"; did you mean '{ALIASES.get(close[0], close[0])}'?"
    return f" (valid keys: {', '.join(sorted(valid_keys()))})"


def _check_model_config(source: str, overrides: dict) -> None:
    from ..core.configuration import CausalQwenConfig

    known: set[str] = set()
    for cls in CausalQwenConfig.__mro__:
        known.update(getattr(cls, "__annotations__", {}))
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.5)
            hint = f"; did you mean 'model_config.{close[0]}'?" if close else ""
            raise ValueError(f"{source}: unknown model_config key '{key}' (not a CausalQwenConfig field){hint}")
    # The values too, before any data is read: the config's own checks on the overrides over its defaults (the
    # vocabulary as large as a <NUM> id given here needs; the base's own vocabulary is checked when it is built).
    probe = dict(overrides)
    if isinstance(probe.get("num_token_id"), int) and "vocab_size" not in probe:
        probe["vocab_size"] = max(CausalQwenConfig().vocab_size, probe["num_token_id"] + 1)
    try:
        CausalQwenConfig(**probe)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{source}: {error}") from None


# ---- value checking --------------------------------------------------------------------------------------
def _coerce(source: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the annotated type (ints for floats, one string for a list), or ``ValueError``."""
    if hint is Any:
        return value
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ValueError(f"{source}: {key} must not be empty")
    for option in options:
        if option is type(None):
            continue
        converted = _convert(value, option)
        if converted is not _NO:
            return converted
    names = " or ".join(_TYPE_WORDS.get(o, f"a {getattr(o, '__name__', o)}") for o in options if o is not type(None))
    raise ValueError(f"{source}: {key} must be {names}, got {value!r} ({type(value).__name__})")


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
               dict: "a mapping"}
"""How a value error names the type a setting takes."""


_NO = object()


def _convert(value: Any, kind: Any) -> Any:
    if kind is bool:
        return value if isinstance(value, bool) else _NO
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, float) and value.is_integer() else _NO
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _NO
        return _NO
    if kind is str:
        return value if isinstance(value, str) else _NO
    if kind is list:
        if isinstance(value, str):
            return [value]
        return list(value) if isinstance(value, (list, tuple)) else _NO
    if kind is dict:
        return dict(value) if isinstance(value, dict) else _NO
    return value
