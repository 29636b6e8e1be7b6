"""Finding the tokenizer and model that go with a name given on the command line or in a config."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import presets
from .conversion import check_qwen_folder


def load_tokenizer_for_base(base, gguf_file: str | None = None):
    """The `NumericTokenizer` of a base: the offline Qwen2.5 tokenizer for presets and model objects,
    else the tokenizer stored with the base."""
    from .tokenizer import NumericTokenizer

    if not isinstance(base, (str, os.PathLike)) or presets.is_preset(os.fspath(base)):
        return NumericTokenizer.default()
    path = Path(os.fspath(base))
    if path.is_file() and path.suffix == ".gguf":
        return NumericTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if path.is_dir() and gguf_file is None:
        check_qwen_folder(path)
    return NumericTokenizer.from_pretrained(os.fspath(base), gguf_file=gguf_file)


def check_causal_qwen_folder(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` holds a converted CausalQwen model (not a plain Qwen2 one)."""
    from .configuration import CausalQwenConfig

    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model folder {str(path)!r} holds no config.json")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as error:
        raise ValueError(f"model folder {str(path)!r}: config.json is not valid JSON ({error})") from error
    if model_type != CausalQwenConfig.model_type:
        hint = " (convert it first: causal-qwen convert --base DIR --out NEW_DIR)" if model_type == "qwen2" else ""
        raise ValueError(f"model folder {str(path)!r} holds a {model_type!r} model, not a CausalQwen one{hint}")


def load_model_and_tokenizer(model_dir: str | None = None, base: str | None = None, gguf_file: str | None = None):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` from a converted folder, or converted on the fly from a base."""
    from .modeling import CausalQwenForCausalLM
    from .tokenizer import NumericTokenizer

    if (model_dir is None) == (base is None):
        raise ValueError("give exactly one of a model folder (--model) or a base (--base)")
    if model_dir is not None:
        path = Path(model_dir)
        check_causal_qwen_folder(path)
        model = CausalQwenForCausalLM.from_pretrained(model_dir)
        return model.eval(), NumericTokenizer.from_pretrained(model_dir)
    return convert_base(base, gguf_file=gguf_file)


def convert_base(base, gguf_file: str | None = None, **overrides):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` converted from a Qwen2 base, with ``<NUM>`` at the id the
    tokenizer chose (its first reserved slot, or one new row), so model and tokenizer always agree."""
    from .modeling import CausalQwenForCausalLM

    tokenizer = load_tokenizer_for_base(base, gguf_file)
    overrides.setdefault("num_token_id", tokenizer.num_token_id)
    model = CausalQwenForCausalLM.from_qwen(base, gguf_file=gguf_file, tokenizer=tokenizer, **overrides)
    return model, tokenizer
