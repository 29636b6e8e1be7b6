"""Finding the tokenizer and model that go with a name given on the command line or in a config, and the device and
dtype they run in.

`resolve_device_and_dtype` is the one place that chooses them: the device ``cuda`` when available, else ``mps``, else
``cpu``; the dtype ``bfloat16`` on a GPU that supports it, else ``float32``. Every command that loads a model passes
its ``--device``/``--dtype`` through it (``ValueError`` for an unknown or unavailable one). Whatever the dtype, the
model keeps its calibrated scales and thresholds in float32 (`CausalQwenForCausalLM`, "Precision").

Weights are checked on load: a damaged ``.safetensors`` file (truncated, bad header) or a tensor holding NaN or
infinite values raises ``ValueError`` naming the file, rather than a traceback or a model that scores NaN.
A hub id that is neither cached nor reachable fails at once (`causal_qwen.conversion.hub`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from . import presets
from .conversion import check_gguf_in_folder, check_qwen_folder, folder_model_type, from_qwen
from .devices import resolve_device_and_dtype
from .hub import check_hub_id, looks_like_hub_id

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "vocab.json")  # a fast tokenizer's file, or a slow one's vocabulary


def holds_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a saved tokenizer (one of `TOKENIZER_FILES`)."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer_for_base(base, gguf_file: str | None = None):
    """The `NumericTokenizer` of a base: the offline Qwen2.5 tokenizer for presets and model objects,
    else the tokenizer stored with the base."""
    from ..core.tokenizer import NumericTokenizer

    if not isinstance(base, (str, os.PathLike)) or presets.is_preset(os.fspath(base)):
        return NumericTokenizer.default()
    path = Path(os.fspath(base))
    if path.is_file() and path.suffix == ".gguf":
        if path.stat().st_size == 0:
            raise ValueError(f"GGUF file {str(path)!r} is empty: download it again "
                             "(python scripts/fetch_real_qwen.py fetches Qwen2.5-Coder-0.5B-Instruct)")
        return NumericTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if path.is_file() and gguf_file is None:
        raise ValueError(f"base {str(path)!r} is a file but not a .gguf one: give a Qwen2 GGUF file, a Qwen2 folder, "
                         f"a preset ({', '.join(presets.preset_names())}) or a hub id")
    if path.is_dir() and gguf_file is not None:
        check_gguf_in_folder(path, gguf_file)
    if path.is_dir() and gguf_file is None:
        check_qwen_folder(path)
        if not holds_tokenizer(path):
            raise ValueError(f"Qwen folder {str(path)!r} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): save the "
                             "base's tokenizer there (tokenizer.save_pretrained) before converting it")
    if not path.exists():
        check_missing_base(os.fspath(base))
    return NumericTokenizer.from_pretrained(os.fspath(base), gguf_file=gguf_file)


def check_missing_base(name: str) -> None:
    """For a base that is no existing file or folder: return when it is a reachable hub id, else ``ValueError`` in
    one line saying what was expected (a ``.gguf`` name that does not exist is a path, never a hub id)."""
    if name.endswith(".gguf"):
        raise ValueError(f"GGUF file {name!r} does not exist: point model / --base at your .gguf file "
                         "(python scripts/fetch_real_qwen.py fetches Qwen2.5-Coder-0.5B-Instruct and prints its path)")
    if not looks_like_hub_id(name):
        raise ValueError(f"base {name!r} is not a preset ({', '.join(presets.preset_names())}), an existing file or "
                         "folder, or a hub id (owner/name)")
    check_hub_id(name)


def check_causal_qwen_folder(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` holds a converted CausalQwen model (not a plain Qwen2 one)."""
    from ..core.configuration import CausalQwenConfig, not_causal_qwen

    model_type = folder_model_type(path, folder="model folder", expected="CausalQwen")
    if model_type != CausalQwenConfig.model_type:
        raise ValueError(not_causal_qwen(f"model folder {str(path)!r}", model_type))


def load_model_and_tokenizer(
    model_dir: str | None = None, base: str | None = None, gguf_file: str | None = None, device=None, dtype=None
):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` from a converted folder, or converted on the fly from a base, in
    eval mode on ``device`` in ``dtype``.

    device, dtype: as `resolve_device_and_dtype` takes them; both ``None`` (the default): where and as
    ``from_pretrained`` / the conversion put the model (the CPU; the stored dtype).
    """

    if (model_dir is None) == (base is None):
        raise ValueError("give exactly one of a model folder (--model) or a base (--base)")
    placement = {}
    if device is not None or dtype is not None:
        device, dtype = resolve_device_and_dtype(device, dtype)
        placement = {"device": device, "dtype": dtype}
    if model_dir is not None:
        model = load_causal_model(model_dir, **placement)
        if not holds_tokenizer(Path(model_dir)):
            raise ValueError(f"model folder {str(model_dir)!r} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): "
                             "use a folder written by convert or train (final/), or save the tokenizer there")
        return model.eval(), load_saved_tokenizer(Path(model_dir))
    return convert_base(base, gguf_file=gguf_file, **placement)


def load_saved_tokenizer(folder: Path):
    """`NumericTokenizer.from_pretrained` of a model folder; ``ValueError`` naming the file when one of its
    tokenizer files is not valid JSON (a truncated copy: the Rust parser's error names neither file nor folder)."""
    from ..core.tokenizer import NumericTokenizer

    try:
        return NumericTokenizer.from_pretrained(str(folder))
    except Exception as error:  # tokenizers raises a plain Exception for a damaged tokenizer.json
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            file = folder / name
            try:
                if file.is_file():
                    json.loads(file.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as damage:
                raise ValueError(f"tokenizer file {str(file)!r} is damaged ({_first_line(damage)}); write the model "
                                 "again (convert, or train's final/)") from error
        raise


def load_causal_model(model_dir: str | os.PathLike, device=None, dtype=None, **overrides):
    """`CausalQwenForCausalLM.from_pretrained` of a converted folder, its weight files checked before and its
    tensors after (``ValueError`` naming the file when one is damaged or holds NaN/inf). ``device``: where to put it
    (a ``torch.device`` or name; None: the CPU); ``dtype``: its dtype (None: the stored one)."""
    from ..core.modeling import CausalQwenForCausalLM

    path = Path(model_dir)
    check_causal_qwen_folder(path)
    check_weight_files(path)
    check_weights_fit_config(path)
    if dtype is not None:
        overrides["dtype"] = dtype
    added = added_modules(path, overrides)
    try:
        # transformers' load report would list the added modules' weights as MISSING; they start as the config says.
        with _quiet_load_report() if added else contextlib.nullcontext():
            model, loading = CausalQwenForCausalLM.from_pretrained(str(path), output_loading_info=True, **overrides)
    except Exception as error:  # safetensors' errors are not OSError/ValueError
        if type(error).__name__ != "SafetensorError":
            raise
        raise ValueError(f"model folder {str(path)!r}: damaged weights ({_first_line(error)})") from error
    if added:
        missing = [key for key in loading["missing_keys"] if not key.startswith(tuple(added.values()))]
        if missing or loading["unexpected_keys"]:
            logger.warning("model folder %r: weights missing from its files %s, stored weights not used %s",
                           str(path), sorted(missing), sorted(loading["unexpected_keys"]))
    check_finite_weights(model, path)
    return model if device is None else model.to(device)


# A module the saved config can lack and an override can add: the override and the module's weight prefix.
_ADDABLE_MODULES = {"number_noise_init": "action.number_noise."}


def added_modules(folder: Path, overrides: dict) -> dict[str, str]:
    """The modules ``overrides`` add to the model saved in ``folder`` (``number_noise_init`` set where its
    config.json has none: the pretrained recipe's numbers' own noise on a converted folder), as ``{override:
    weight prefix}``; their weights start as the config says (``_init_weights``), not from the files."""
    if not any(overrides.get(name) is not None for name in _ADDABLE_MODULES):
        return {}
    saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return {name: prefix for name, prefix in _ADDABLE_MODULES.items()
            if overrides.get(name) is not None and saved.get(name) is None}


@contextlib.contextmanager
def _quiet_load_report():
    """transformers' load report (which names every weight not in the files) left out while a model loads; its
    other messages pass (the logger's level stays: transformers reads it to decide what else to check)."""
    def not_the_report(record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)

    quieted = logging.getLogger("transformers.modeling_utils")
    quieted.addFilter(not_the_report)
    try:
        yield
    finally:
        quieted.removeFilter(not_the_report)


def weight_files(folder: Path) -> list[Path]:
    """The ``.safetensors`` files of a model folder."""
    return sorted(folder.glob("*.safetensors"))


def check_weight_files(folder: Path) -> None:
    """``ValueError`` naming the file when a ``.safetensors`` file of ``folder`` cannot be read (a truncated
    file, a damaged header)."""
    from safetensors import safe_open

    if not weight_files(folder) and not (folder / "pytorch_model.bin").is_file():
        raise ValueError(f"model folder {str(folder)!r} holds no weights (model.safetensors): write the model again "
                         "(convert, or train's final/)")
    for file in weight_files(folder):
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except Exception as error:  # SafetensorError
            raise ValueError(
                f"weights file {str(file)!r} is damaged ({_first_line(error)}); write the model again "
                "(convert, or train's final/)"
            ) from error


def check_weights_fit_config(folder: Path) -> None:
    """``ValueError`` in one line when a stored tensor's shape differs from the one ``config.json`` asks for (a
    config edited, or copied from another model), before transformers' load report of every mismatch."""
    import torch
    from safetensors import safe_open

    from ..core.configuration import CausalQwenConfig
    from ..core.modeling import CausalQwenForCausalLM

    config = CausalQwenConfig.from_pretrained(str(folder))
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        expected = {name: tuple(tensor.shape) for name, tensor in CausalQwenForCausalLM(config).state_dict().items()}
    differing = []
    for file in weight_files(folder):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                stored = tuple(handle.get_slice(name).get_shape())
                if name in expected and expected[name] != stored:
                    differing.append(f"{name}: stored {list(stored)}, config.json asks {list(expected[name])}")
    if differing:
        raise ValueError(f"model folder {str(folder)!r}: config.json does not match the weights ({len(differing)} "
                         f"tensors differ in shape, e.g. {differing[0]}); restore the config.json written with them")


def check_finite_weights(model, folder: Path) -> None:
    """``ValueError`` naming the file and tensor when a weight of ``model`` (loaded from ``folder``) holds NaN
    or infinite values."""
    import torch

    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"weights file {str(_file_holding(folder, name))!r}: tensor {name!r} holds {bad:,} NaN/infinite "
                f"values of {tensor.numel():,} (a damaged file, or a training run that diverged)"
            )


def _file_holding(folder: Path, tensor_name: str) -> Path:
    """The weight file of ``folder`` that stores ``tensor_name`` (by the shard index when there is one)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shard = json.loads(index.read_text()).get("weight_map", {}).get(tensor_name)
        except json.JSONDecodeError:
            shard = None
        if shard:
            return folder / shard
    files = weight_files(folder)
    return files[0] if len(files) == 1 else folder


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def convert_base(base, gguf_file: str | None = None, device=None, dtype=None, **overrides):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` converted from a Qwen2 base, with ``<NUM>`` at the id the
    tokenizer chose (its first reserved slot, or one new row), so model and tokenizer always agree. ``device``,
    ``dtype``: where and in what dtype the base is loaded, converted and calibrated (None: the CPU; the base's own
    dtype)."""

    tokenizer = load_tokenizer_for_base(base, gguf_file)
    overrides.setdefault("num_token_id", tokenizer.num_token_id)
    if device is not None:
        overrides["device_map"] = device
    if dtype is not None:
        overrides["dtype"] = dtype
    model = from_qwen(base, gguf_file=gguf_file, tokenizer=tokenizer, **overrides)
    return model, tokenizer
