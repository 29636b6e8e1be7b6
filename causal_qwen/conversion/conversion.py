"""Loading Qwen2 bases and converting them to CausalQwen with the initialisation of docs/design.md
("Initialisation"); the random draws (w_num, W_reg, a uniform b_noise) come from ``config.seed``.

| part                                   | initial value                                   |
|----------------------------------------|-------------------------------------------------|
| embed_tokens, transformer, final norm  | Qwen's (the backbone module is taken over)      |
| <NUM>                                  | first reserved slot (151665), else one new row  |
| w_num                                  | a normal draw divided by its norm (unit length) |
| W_loc, b_loc / W_scale, b_scale        | identity, 0 / 0, softplus⁻¹(γ0)                 |
| W_cls, b_cls                           | a clone of Qwen's lm_head, 0                    |
| W_reg, b_reg / b_noise / thresholds t  | N(0, 1/C), 0 / noise_init / ovr_threshold       |

With ``ovr_calibration="base_agreement"`` (the default) `causal_qwen.conversion.calibration` then replaces the scale,
``b_noise`` and the thresholds (none of which moves ``loc_S``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import Qwen2ForCausalLM

from .. import progress
from ..core.configuration import CausalQwenConfig
from . import presets

if TYPE_CHECKING:
    from ..core.modeling import CausalQwenForCausalLM

logger = logging.getLogger(__name__)

QWEN25_NUM_SLOT = 151665
QWEN_MODEL_TYPES = ("qwen2",)
# Keys of a Qwen2 config dict that describe the checkpoint, not the architecture.
# quantization_config: a GGUF base is dequantised on load, so the converted model holds plain float weights (a
# folder saved with the key would reload as "quantized" and `Trainer` would refuse to fine-tune it).
_NON_ARCHITECTURE_KEYS = (
    "model_type", "architectures", "transformers_version", "auto_map", "_name_or_path", "quantization_config"
)


def load_qwen_base(base: str | os.PathLike | Qwen2ForCausalLM, gguf_file: str | None = None, dtype=None) -> Qwen2ForCausalLM:
    """A ``Qwen2ForCausalLM`` from a model object, a ``random:*`` preset, a local folder, a ``.gguf`` file or a hub id,
    in ``dtype`` (`base_dtype`; a model object is cast to it, in place)."""
    dtype = base_dtype(dtype)
    if isinstance(base, Qwen2ForCausalLM):
        return base if dtype in (None, "auto") else base.to(dtype)
    if not isinstance(base, (str, os.PathLike)):
        raise TypeError(f"base must be a Qwen2ForCausalLM, a preset name or a path, got {type(base).__name__}")
    name = os.fspath(base)
    path = Path(name)
    if gguf_file is not None and (presets.is_preset(name) or path.is_file()):
        raise ValueError(f"--gguf-file names a GGUF file inside a folder or hub repository; base {name!r} is "
                         f"{'a preset' if presets.is_preset(name) else 'a file'}: leave --gguf-file out")
    if presets.is_preset(name):
        return presets.build_preset(name, dtype=None if dtype == "auto" else dtype)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if path.is_file() and path.suffix == ".gguf":
        with _gguf_progress():
            return Qwen2ForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    if gguf_file is not None:
        if not path.exists():
            from .hub import check_hub_id

            check_hub_id(name)
        elif path.is_dir():
            check_gguf_in_folder(path, gguf_file)
        with _gguf_progress():
            return Qwen2ForCausalLM.from_pretrained(name, gguf_file=gguf_file, **kwargs)
    if path.is_dir():
        check_qwen_folder(path)
        return Qwen2ForCausalLM.from_pretrained(str(path), **kwargs)
    if path.exists():
        raise ValueError(f"base {name!r} is a file but not a .gguf model")
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ValueError(
            f"unknown base {name!r}: not a preset ({', '.join(presets.preset_names())}), not an existing folder "
            "or .gguf file, and not a hub id of the form 'owner/name'"
        )
    from .hub import check_hub_id

    check_hub_id(name)
    try:
        return Qwen2ForCausalLM.from_pretrained(name, **kwargs)
    except OSError as error:
        raise ValueError(f"cannot load base {name!r} from the model hub: {error}") from error


def base_dtype(dtype) -> "torch.dtype | str | None":
    """The dtype to load a base in: None (the loader's default: float32 for presets and model objects as they are),
    ``"auto"`` (as ``from_pretrained`` takes it: the dtype the files store; presets and model objects as they are),
    or the ``torch.dtype`` named by a name such as ``"bfloat16"``/``"bf16"`` or given as one
    (`devices.dtype_from_name`, ``ValueError`` for anything else)."""
    if dtype is None or dtype == "auto":
        return dtype
    from .devices import dtype_from_name

    return dtype_from_name(dtype)


@contextlib.contextmanager
def _gguf_progress():
    """Within it, transformers' bar over the GGUF tensors it de-quantises is one of `causal_qwen.progress` (off with
    ``--quiet``, plain lines in a log)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def bar(iterable=None, *args, **kwargs):
        total = len(iterable) if hasattr(iterable, "__len__") else None
        return progress.bar(iterable, desc="GGUF: de-quantising", total=total, unit="tensor")

    gguf_utils.tqdm = bar
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def check_gguf_in_folder(path: Path, gguf_file: str) -> None:
    """``ValueError`` naming the folder's ``.gguf`` files unless ``gguf_file`` is one of them."""
    if not (path / gguf_file).is_file():
        held = sorted(child.name for child in path.glob("*.gguf"))
        raise ValueError(f"--gguf-file {gguf_file!r} is not a file in {str(path)!r} (its .gguf files: "
                         f"{', '.join(held) or 'none'})")


def folder_model_type(path: Path, folder: str = "folder", missing: str = "holds no config.json",
                      expected: str = "Qwen2 or CausalQwen") -> str:
    """The ``model_type`` written in ``path/config.json``; ``ValueError`` when the file is missing (the message
    ``"{folder} 'PATH' {missing}"``), not JSON, or names no model type (no ``expected`` model, then)."""
    config_file = path / "config.json"
    if not path.exists():
        raise ValueError(f"{folder} {str(path)!r} does not exist")
    if not path.is_dir():
        raise ValueError(f"{folder} {str(path)!r} is a file, not a folder: give the folder that holds config.json "
                         "and the weights")
    if not config_file.is_file():
        raise ValueError(f"{folder} {str(path)!r} {missing}{run_folder_hint(path)}")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{folder} {str(path)!r}: config.json is not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{folder} {str(path)!r}: config.json holds a JSON {type(config).__name__}, not an object "
                         "of settings")
    if config.get("model_type") is None:
        raise ValueError(f"{folder} {str(path)!r}: its config.json names no model_type, so it is no {expected} model")
    return config["model_type"]


def run_folder_hint(path: Path) -> str:
    """For a folder without config.json: where its model is, when it is (part of) a training run's folder."""
    if (path / "final" / "config.json").is_file():
        return f": it is a training run's folder, and its model is {str(path / 'final')!r}"
    if (path / "adapter_config.json").is_file():
        return (": it is a LoRA checkpoint of a training run (adapter weights only); the run's model is written, "
                "merged, to the run's final/ folder at its end (train --resume continues an unfinished run)")
    if path.is_dir() and any(child.name.startswith("checkpoint-") and child.is_dir() for child in path.iterdir()):
        return (": it is an unfinished training run's folder (checkpoint-N, no final/); train --resume continues it, "
                "and a checkpoint-N folder of a run without LoRA loads as a model")
    return ""


def check_qwen_folder(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` holds a Qwen2 ``config.json``."""
    model_type = folder_model_type(path, missing="holds no Qwen2 model: config.json is missing", expected="Qwen2")
    if model_type not in QWEN_MODEL_TYPES:
        hint = ""
        if model_type == CausalQwenConfig.model_type:
            hint = (": it is converted already: give it as --model (or load it with "
                    "CausalQwenForCausalLM.from_pretrained or AutoModelForCausalLM)")
        raise ValueError(f"folder {str(path)!r} holds a {model_type!r} model, not a Qwen2 model{hint}")


def default_num_token_id(vocab_rows: int) -> int:
    """The first reserved slot of Qwen2.5 (151665) when the embedding has it; else a new row at the end."""
    return QWEN25_NUM_SLOT if vocab_rows > QWEN25_NUM_SLOT else vocab_rows


def causal_config_from(base_config, **overrides) -> CausalQwenConfig:
    """A `CausalQwenConfig` carrying the base's architecture plus ``overrides``; never tied."""
    fields = {k: v for k, v in base_config.to_dict().items() if k not in _NON_ARCHITECTURE_KEYS}
    fields["tie_word_embeddings"] = False
    fields.update(overrides)
    return CausalQwenConfig(**fields)


def from_qwen(base, **overrides) -> "CausalQwenForCausalLM":
    """A `CausalQwenForCausalLM` converted from a Qwen2 base (a ``Qwen2ForCausalLM``, hub id, local folder, ``.gguf``
    file or ``random:*`` preset) with the initialisation of docs/design.md ("Initialisation") and the calibration at
    conversion. ``overrides`` set `CausalQwenConfig` fields (``seed`` among them; another name is a ``TypeError``);
    ``gguf_file=``, ``dtype=`` (a ``torch.dtype``, a name such as ``"bfloat16"``, or ``"auto"``: `base_dtype`),
    ``device_map=`` and ``attn_implementation=`` (``"eager"``, ``"sdpa"``, ...) go to the loader; ``tokenizer=`` is
    the numeric tokenizer the calibration reads its text with."""
    from ..core.modeling import CausalQwenForCausalLM

    return convert_qwen(CausalQwenForCausalLM, base, **overrides)


def convert_qwen(model_class: type["CausalQwenForCausalLM"], base, **overrides) -> "CausalQwenForCausalLM":
    """Build ``model_class`` from a Qwen2 base (see `load_qwen_base`) following docs/design.md ("Initialisation").

    The base's backbone module is reused, not copied, and reads the new model's config (one config object, as
    after ``from_pretrained``); the classification head is a clone of ``lm_head``.
    ``overrides``: `CausalQwenConfig` fields (``seed=`` seeds the random draws), plus, as ``from_pretrained`` takes
    them, ``gguf_file``, ``dtype`` (the base is loaded in it; the calibrated scales and thresholds stay float32),
    ``device_map`` (one device, such as ``"cuda"``: the base is moved there and converted and calibrated on it) and
    ``attn_implementation`` (the backbone's attention).
    """
    gguf_file = overrides.pop("gguf_file", None)
    dtype = base_dtype(overrides.pop("dtype", None))
    device = _single_device(overrides.pop("device_map", None))
    tokenizer = overrides.pop("tokenizer", None)
    attn_implementation = overrides.pop("attn_implementation", None)
    _check_config_fields(overrides)
    calibrated = overrides.get("ovr_calibration", "base_agreement") != "none"
    if calibrated:
        overrides.setdefault("ovr_threshold_kind", "per_token")
    qwen = load_qwen_base(base, gguf_file=gguf_file, dtype=dtype)
    if attn_implementation is not None:
        qwen.set_attn_implementation(attn_implementation)  # the backbone's attention, kept by the conversion
    if device is not None:
        qwen.to(device)
    memo_key = _memo_key(base, gguf_file, dtype, qwen) if calibrated else None  # the base as given, before any change
    vocab_rows = qwen.model.embed_tokens.num_embeddings
    num_token_id = overrides.pop("num_token_id", None)
    if num_token_id is None:
        num_token_id = default_num_token_id(vocab_rows)
    grows = num_token_id >= vocab_rows
    if grows:
        if num_token_id != vocab_rows:
            raise ValueError(f"num_token_id={num_token_id} is beyond the next free row {vocab_rows}")
        logger.warning("base has no reserved slot for <NUM>: the vocabulary grows by one row to %d", vocab_rows + 1)

    named = base if isinstance(base, (str, os.PathLike)) else getattr(qwen.config, "_name_or_path", None)
    overrides.setdefault("converted_from", str(named) if named else None)  # what `recipe: auto` reads
    config = causal_config_from(qwen.config, num_token_id=num_token_id, vocab_size=vocab_rows + int(grows), **overrides)
    generator = torch.Generator().manual_seed(config.seed)
    parameter_dtype = qwen.model.embed_tokens.weight.dtype
    device = qwen.model.embed_tokens.weight.device

    with torch.device("meta"):
        model = model_class(config)
    model.model = qwen.model  # the backbone itself: identical features by construction
    _share_config(model.model, qwen.config, model.config)
    model.numeric_embedding.to_empty(device=device)
    model.abduction.to_empty(device=device)
    model.action.to_empty(device=device)
    model.ovr_thresholds.to_empty(device=device)
    model.numeric_embedding.reset_parameters(generator=generator)
    model.abduction.reset_parameters(config.initial_scale)
    model.action.reset_parameters(
        config.noise_init, config.noise_mode, generator=generator, token_noise_init=config.token_noise_init
    )
    if model.action.number_noise is not None:
        model.action.number_noise.reset_parameters(config.number_noise_init)
    model.ovr_thresholds.reset_parameters(config.ovr_threshold)
    with torch.no_grad():
        head = model.action.classification_head
        head.weight[:vocab_rows].copy_(qwen.lm_head.weight)  # a clone, never a tie
        head.bias.zero_()
        if grows:
            _grow_embedding_by_one(model, qwen)
            head.weight[vocab_rows].copy_(qwen.lm_head.weight.mean(dim=0))
    model.to(dtype=parameter_dtype)
    model.config.dtype = parameter_dtype
    model.generation_config = qwen.generation_config
    model.config._name_or_path = getattr(qwen.config, "_name_or_path", "")
    model.eval()
    if config.ovr_calibration != "none":
        from .calibration import calibrate

        calibrate(
            model,
            tokenizer,
            positions=config.calibration_positions,
            seed=int(getattr(config, "seed", 0) or 0),
            memo_key=memo_key,
        )
    return model


LOADER_ARGUMENTS = ("gguf_file", "dtype", "device_map", "attn_implementation", "tokenizer")


def _check_config_fields(overrides: dict) -> None:
    """``TypeError`` naming the first key of ``overrides`` that is no `CausalQwenConfig` field (a misspelt setting
    would otherwise be stored in the config and do nothing)."""
    import difflib
    import inspect

    fields = list(inspect.signature(CausalQwenConfig).parameters)
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields + list(LOADER_ARGUMENTS), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"from_qwen got an unknown keyword {key!r}: neither a CausalQwenConfig field nor one of "
                            f"{', '.join(LOADER_ARGUMENTS)}{hint}")


def _single_device(device_map) -> torch.device | None:
    """The one device of a ``device_map`` given to the conversion (a name or ``torch.device``; a dict placing the
    whole model, ``{"": device}``); None for none. The conversion does not split a model over devices."""
    if isinstance(device_map, dict) and set(device_map) == {""}:
        device_map = device_map[""]
    if device_map is None:
        return None
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return torch.device("cuda", device_map)
    one_device = "the conversion runs on one device: give device_map='cpu', 'cuda', 'cuda:N' or 'mps'"
    if isinstance(device_map, (str, torch.device)) and str(device_map) not in ("auto", "balanced", "sequential"):
        from .devices import resolve_device_and_dtype

        try:
            return resolve_device_and_dtype(device_map, "float32")[0]
        except ValueError as error:  # its hint names the commands' --device choices, "auto" among them
            if str(error).startswith("unknown device"):
                raise ValueError(f"{one_device}, not {device_map!r}") from None
            raise
    raise ValueError(f"{one_device}, not {device_map!r}")


# A base given as a model object is recognised by a hash of its weights up to this many elements (hashing
# runs at about 200 M elements/s; larger bases come from files or presets, recognised by name).
HASHED_BASE_ELEMENTS = 20_000_000


def _memo_key(base, gguf_file, dtype, qwen: Qwen2ForCausalLM) -> tuple | None:
    """Identifies a base across conversions in one process: presets by name, files by path, size and time,
    small model objects by their weights (`weights_fingerprint`); ``None`` for anything else."""
    if not isinstance(base, (str, os.PathLike)):
        fingerprint = weights_fingerprint(qwen, HASHED_BASE_ELEMENTS)
        return None if fingerprint is None else ("weights", fingerprint)
    name = os.fspath(base)
    if presets.is_preset(name):
        built = dtype if isinstance(dtype, torch.dtype) else torch.float32  # a preset is built in float32 unless told
        return ("preset", name, str(built))
    path = Path(name) if gguf_file is None else Path(name) / gguf_file
    if path.exists():
        stat = path.stat()
        return ("file", str(path.resolve()), stat.st_size, stat.st_mtime_ns, str(dtype))
    return None


def weights_fingerprint(module: torch.nn.Module, max_elements: int) -> str | None:
    """A hash of every parameter and buffer of ``module`` (names, dtypes, shapes and values), or ``None`` when
    they hold more than ``max_elements`` elements."""
    tensors = list(module.state_dict().items())
    if sum(t.numel() for _, t in tensors) > max_elements:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in tensors:
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _share_config(backbone: torch.nn.Module, base_config, config: CausalQwenConfig) -> None:
    """Point every backbone module that holds the base's config at ``config``, so that ``model.model.config is
    model.config`` (the architecture fields are the base's; a later change to the model's config reaches the
    attention layers as it does after ``from_pretrained``)."""
    if getattr(base_config, "_attn_implementation", None) != getattr(config, "_attn_implementation", None):
        config._attn_implementation = base_config._attn_implementation
    for module in backbone.modules():
        if getattr(module, "config", None) is base_config:
            module.config = config


def _grow_embedding_by_one(model, qwen: Qwen2ForCausalLM) -> None:
    """Append one embedding row for ``<NUM>``, initialised to the mean embedding."""
    old = qwen.model.embed_tokens.weight  # (V,H)
    grown = torch.nn.Embedding(old.shape[0] + 1, old.shape[1], dtype=old.dtype, device=old.device)
    with torch.no_grad():
        grown.weight[:-1].copy_(old)
        grown.weight[-1].copy_(old.mean(dim=0))
    model.model.embed_tokens = grown
    model.model.vocab_size = old.shape[0] + 1
