"""Shared fixtures: tiny random Qwen2 bases (tied and untied) and their conversions."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def torch_threads() -> int:
    """At most 2 threads, and no more than this process's share of the cores: under pytest-xdist every worker
    is a process of its own, and two workers with two threads each on two cores spend most of the tiny models'
    many small operations spinning (the model and loss tests ran 5x slower so)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, torch.get_num_threads(), cores // workers))


torch.set_num_threads(torch_threads())

SMALL_VOCAB = 512
SMALL_NUM_ID = 500


def small_qwen_config(tied: bool = True, vocab_size: int = SMALL_VOCAB, hidden_size: int = 32) -> Qwen2Config:
    """A 2-layer width-32 Qwen2 (as litgpt/transformers' own parity tests use)."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def small_qwen(tied: bool = True, seed: int = 0, **config_kwargs) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(small_qwen_config(tied=tied, **config_kwargs)).eval()


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def small_base(request) -> Qwen2ForCausalLM:
    return small_qwen(tied=request.param)


def byte_level_tokenizer():
    """A `NumericTokenizer` over 256 byte tokens + <|endoftext|> (<NUM> appended as id 257): it loads in
    milliseconds, where the real 151,936-row vocabulary makes every model that reads it slow to convert and run."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from causal_qwen.core.tokenizer import NumericTokenizer

    vocab = {char: index for index, char in enumerate(sorted(set(bytes_to_unicode().values())))}
    vocab["<|endoftext|>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return NumericTokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>"))
