"""Offline, deterministic random Qwen2 bases usable wherever a base is named (``random:NAME``).

No weights can be downloaded on the machines this project is built on; these presets give real Qwen2
architectures with the real Qwen2.5 vocabulary size (151,936 rows) and seeded random weights.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

PRESET_PREFIX = "random:"
QWEN25_VOCAB_ROWS = 151936
PRESET_SEED = 0

_COMMON = dict(
    vocab_size=QWEN25_VOCAB_ROWS,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    bos_token_id=151643,
    eos_token_id=151643,
    pad_token_id=None,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    use_sliding_window=False,
    attention_dropout=0.0,
)

# A few layers, small hidden size, the real vocabulary.
_TINY = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)

PRESET_CONFIGS: dict[str, dict] = {
    # Tied like Qwen2.5-0.5B.
    "tiny": dict(_TINY, tie_word_embeddings=True),
    # The same, untied like the Coder/Instruct variants.
    "tiny-untied": dict(_TINY, tie_word_embeddings=False),
    # Exactly Qwen2.5-0.5B's architecture, random weights (for benchmarks).
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
}


def is_preset(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PRESET_PREFIX)


def preset_names() -> list[str]:
    return [PRESET_PREFIX + key for key in PRESET_CONFIGS]


def preset_config(name: str) -> Qwen2Config:
    key = name[len(PRESET_PREFIX) :] if is_preset(name) else name
    if key not in PRESET_CONFIGS:
        raise ValueError(f"unknown preset {name!r}; the presets are {', '.join(preset_names())}")
    return Qwen2Config(**_COMMON, **PRESET_CONFIGS[key])


def build_preset(name: str, dtype: torch.dtype | None = None) -> Qwen2ForCausalLM:
    """The preset's ``Qwen2ForCausalLM`` with weights drawn from a fixed seed (same weights every call)."""
    config = preset_config(name)
    config._name_or_path = name
    devices_rng_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(PRESET_SEED)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(devices_rng_state)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
