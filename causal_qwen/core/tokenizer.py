"""NumericTokenizer: text with numbers → token ids, the numbers' values and their surface strings.

Every quantity in a text (as found by :func:`causal_qwen.core.numbers.find_numbers`) becomes exactly one
``<NUM>`` token; its value (float64) is carried in a parallel ``numeric_values`` row and the number as it
was written (``"1,234.50"``) in a parallel ``numeric_strings`` row (``""`` at other positions). The text
between numbers is tokenized by the base (Qwen2) vocabulary, piece by piece. So for
``"The item costs 99.99 dollars."`` the ids are ``tok("The item costs ") + [<NUM>] + tok(" dollars.")``,
the value at the ``<NUM>`` position is 99.99 and its string ``"99.99"``; ``decode`` with the strings gives
the (NFC-normalised) text back exactly, and without them writes the values (:func:`format_number`).

`NumericTokenizer` is a ``PreTrainedTokenizerFast`` (transformers' tokenizers backend): ``save_pretrained``
writes ``tokenizer.json`` and a ``tokenizer_config.json`` that names the class (``tokenizer_class`` and
``auto_map``) and lists the added tokens (``added_tokens_decoder``), and carries this module's source with it
(`register_for_auto_class`, transformers' mechanism for custom tokenizers), so
``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` gives a
`NumericTokenizer` even in a Python that never imported ``causal_qwen``; with ``causal_qwen`` imported the
class is also registered locally and ``trust_remote_code`` is not needed. ``pad`` pads ``numeric_values``
(0.0) and ``numeric_strings`` (``""``) with the ids, so ``DataCollatorWithPadding`` works with it.

Where ``<NUM>`` lives (docs/design.md, "Tokenizer lengths"):

1. the vocabulary already has ``<NUM>`` (e.g. a tokenizer saved by :meth:`NumericTokenizer.save_pretrained`):
   use it;
2. else, the lowest-id placeholder of the base vocabulary (``[PAD151665]`` in a tokenizer read from a
   GGUF file, ``<|extra_0|>``, ``<|reserved_special_token_0|>``, ``<unused0>``...) is renamed ``<NUM>``;
   the id stays, so a Qwen2.5 GGUF tokenizer (151936 entries) gives ``<NUM>`` = 151665;
3. else ``<NUM>`` is appended as a new special token with id ``len(tokenizer)``: the hub tokenizer of
   Qwen2.5 (151665 entries) gives 151665 as well, which is inside the model's 151936 embedding rows
   (a reserved slot). When the model has no such row (or its size is unknown) the vocabulary grows by
   one row, and a warning says so.

Only numbers produce the ``<NUM>`` id: a literal ``"<NUM>"`` in the input text is spelled out in ordinary
tokens. Text is first normalized with the base tokenizer's own normalizer (NFC for Qwen2; it must be
idempotent), then numbers are found in the normalized text.

The offline Qwen2.5 vocabulary lives in `causal_qwen.core.qwen_vocab` (:func:`build_qwen25_base_tokenizer`);
:meth:`NumericTokenizer.default` builds on it.

Shapes: B batch size, S sequence length (after padding/truncation).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from tokenizers import AddedToken, Tokenizer
from transformers import AutoConfig, AutoTokenizer, BatchEncoding, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.utils import to_py_obj

from .files import save_through_staging, write_text_atomic
from .numbers import NumberSpan, find_numbers, format_prediction, join_numbers
from .qwen_vocab import (
    QWEN25_MODEL_VOCAB_SIZE,
    QWEN25_SPECIAL_TOKENS,
    build_qwen25_base_tokenizer,
    qwen25_tiktoken_path,
)

__all__ = [
    "NUM_TOKEN",
    "QWEN25_SPECIAL_TOKENS",
    "QWEN25_MODEL_VOCAB_SIZE",
    "NumericTokenizer",
    "build_qwen25_base_tokenizer",
    "qwen25_tiktoken_path",
]

logger = logging.getLogger(__name__)

NUM_TOKEN = "<NUM>"
_MODEL_TYPE = "causal_qwen"  # CausalQwenConfig.model_type (a saved tokenizer carries no configuration.py)

_PLACEHOLDER_RE = re.compile(
    r"\[PAD\d+\]|<\|extra_\d+\|>|<\|reserved_special_token_\d+\|>|<unused\d+>|\[unused\d+\]"
)
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
# Hugging Face keyword arguments __call__ accepts and has nothing to do with.
_IGNORED_CALL_KWARGS = ("verbose", "return_token_type_ids", "split_special_tokens", "stride")

# `NumericTokenizer.default`'s tokenizers of this process, by class and options (a deep copy is returned).
_DEFAULTS_BUILT: dict[tuple, "NumericTokenizer"] = {}

Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Side = Literal["left", "right"]


class _Row(NamedTuple):
    """One encoded text, before tensors: ids, values, strings and mask of equal length (S,)."""

    ids: list[int]
    values: list[float]
    strings: list[str]
    mask: list[int]


# ---------------------------------------------------------------------------------------------
# Placing <NUM> in a vocabulary
# ---------------------------------------------------------------------------------------------


_LINE_ENDS = ("\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
"""The characters ``str.splitlines`` breaks a text at."""


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
    if backend.token_to_id(NUM_TOKEN) is not None:  # in the model vocabulary or an added token
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


class NumericTokenizer(PreTrainedTokenizerFast):
    """A fast Hugging Face tokenizer in which every number becomes ``<NUM>`` + its value + its string.

    Args:
        tokenizer: a base fast tokenizer to build from (its vocabulary, normalizer, pre-tokenizer, decoder
            and special tokens are copied; the base itself is left unchanged). ``None`` when loading
            (``from_pretrained`` passes ``tokenizer_file``).
        model_vocab_size: rows of the model's embedding (``config.vocab_size``), if known. It decides
            whether an appended ``<NUM>`` falls in a reserved row or grows the vocabulary.
        padding_side: default side for padding, ``"right"`` (training) or ``"left"`` (generation).
        decimal_comma: read ``,`` as the decimal point and ``.`` as the thousands separator (German,
            French, ... text); default ``False``: English conventions (docs/number_grammar.md).
        number_min_decimals: the fewest decimals a generated number is printed with (the decimals the
            training data wrote, when known; :func:`causal_qwen.core.numbers.format_prediction`).
        number_lower_bound: the least value the trained field takes, when known (``train`` sets 0 for a target
            never negative in its training rows): ``predict`` cuts its intervals there, which changes no
            interval's coverage of such numbers.

    Attributes:
        num_token_id: id of ``<NUM>``.
        num_token_origin: ``"existing"``, ``"placeholder"`` (a reserved slot was renamed) or
            ``"appended"`` (added at ``len(tokenizer)``).
        reserved_slot_used: ``True`` when the model already has a row for ``<NUM>``, i.e. no embedding
            resize is needed (``num_token_id < model_vocab_size``; with the size unknown: unless appended).
        tokenizer: the plain tokenizer on the same vocabulary (numbers spelled as digits).

    Calling the tokenizer (``tokenizer(texts)``) reads numbers; the inherited ``encode``, ``tokenize`` and
    ``convert_*`` methods work on the plain spelling (digit tokens), as the base model reads text.
    """

    model_input_names = ["input_ids", "numeric_values", "attention_mask"]

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None = None,
        model_vocab_size: int | None = None,
        padding_side: Side = "right",
        *,
        decimal_comma: bool = False,
        number_min_decimals: int | None = None,
        number_lower_bound: float | None = None,
        **kwargs: Any,
    ) -> None:
        if model_vocab_size is not None and (
            isinstance(model_vocab_size, bool) or not isinstance(model_vocab_size, int) or model_vocab_size < 1
        ):
            raise ValueError(f"model_vocab_size must be a positive int or None, got {model_vocab_size!r}")
        if not isinstance(decimal_comma, bool):
            raise TypeError(f"decimal_comma must be True or False, got {decimal_comma!r}")
        if number_min_decimals is not None and (
            isinstance(number_min_decimals, bool) or not isinstance(number_min_decimals, int) or number_min_decimals < 0
        ):
            raise ValueError(f"number_min_decimals must be a non-negative int or None, got {number_min_decimals!r}")
        if number_lower_bound is not None and (
            isinstance(number_lower_bound, bool) or not isinstance(number_lower_bound, (int, float))
            or not math.isfinite(number_lower_bound)
        ):
            raise ValueError(f"number_lower_bound must be a finite number or None, got {number_lower_bound!r}")
        _check_side(padding_side)
        if tokenizer is not None:
            if not isinstance(tokenizer, PreTrainedTokenizerBase):
                raise TypeError(f"tokenizer must be a PreTrainedTokenizerBase, got {type(tokenizer).__name__}")
            kwargs = {**_base_kwargs(tokenizer), **kwargs}
        super().__init__(
            padding_side=padding_side,
            model_vocab_size=model_vocab_size,
            decimal_comma=decimal_comma,
            number_min_decimals=number_min_decimals,
            number_lower_bound=number_lower_bound,
            **kwargs,
        )
        self.model_vocab_size = model_vocab_size
        self.decimal_comma = decimal_comma
        self.number_min_decimals = number_min_decimals
        self.number_lower_bound = number_lower_bound
        if self.pad_token is None and self.pad_token_id is not None:  # Hugging Face's padding reads pad_token
            self.pad_token = self.convert_ids_to_tokens(self.pad_token_id)
        self.num_token_id, self.num_token_origin = _place_num_token(self)
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
        self._plain: PreTrainedTokenizerFast | None = None

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def convert_to_native_format(cls, trust_remote_code: bool = False, **kwargs: Any) -> dict[str, Any]:
        """``tokenizer.json`` is loaded whole by ``__init__`` (normalizer, pre-tokenizer and decoder included)."""
        return kwargs

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *inputs: Any,
        gguf_file: str | None = None,
        model_vocab_size: int | None = None,
        padding_side: Side | None = None,
        **kwargs: Any,
    ) -> NumericTokenizer:
        """A folder saved by :meth:`save_pretrained` (its ``tokenizer_config.json`` names this class) loads
        as it was saved; any other tokenizer (hub id, local folder, or a ``.gguf`` file in it via
        ``gguf_file``) is loaded with ``AutoTokenizer.from_pretrained`` and built upon.

        ``model_vocab_size`` defaults to the saved value, else to the tokenizer's length for a GGUF file (it
        lists every row of the model), else to ``config.vocab_size`` when a config can be read from the same
        place; ``kwargs`` go to ``from_pretrained``.
        """
        if gguf_file is None and _names_this_class(name_or_path, kwargs):
            options = dict(kwargs)
            if padding_side is not None:
                options["padding_side"] = padding_side
            if model_vocab_size is not None:
                options["model_vocab_size"] = model_vocab_size
            tokenizer = super().from_pretrained(name_or_path, *inputs, **options)
            if tokenizer.model_vocab_size is None:
                size = _vocab_size(_read_model_config(name_or_path, kwargs))
                if size is not None:
                    tokenizer.model_vocab_size = size
                    tokenizer.reserved_slot_used = tokenizer.num_token_id < size
            return tokenizer
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        own = {key: kwargs.pop(key) for key in ("decimal_comma", "number_min_decimals", "number_lower_bound")
               if key in kwargs}
        config = None if gguf_file is not None else _read_model_config(name_or_path, kwargs)
        # Beside a CausalQwen config, AutoTokenizer picks this class again (and so this loader, without end): a saved
        # folder that lost its tokenizer_config.json. Its tokenizer.json already holds <NUM>.
        loader = PreTrainedTokenizerFast if getattr(config, "model_type", None) == _MODEL_TYPE else AutoTokenizer
        base = loader.from_pretrained(name_or_path, *inputs, **kwargs)
        if model_vocab_size is None and gguf_file is not None:
            model_vocab_size = len(base)  # a GGUF tokenizer lists every row of the model
        elif model_vocab_size is None:
            model_vocab_size = _vocab_size(config)
        return cls(base, model_vocab_size=model_vocab_size, padding_side=padding_side or "right", **own)

    @classmethod
    def default(cls, padding_side: Side = "right", **kwargs: Any) -> NumericTokenizer:
        """The real Qwen2.5 tokenizer, built offline, with ``<NUM>`` = 151665 (a reserved row of every
        Qwen2.5 model). A few seconds the very first time (merges derived and cached on disk), 1-2 s in
        a new process; after that a copy of the one built before with the same options (about half a
        second: every call returns a tokenizer of its own). ``kwargs``: ``decimal_comma``,
        ``number_min_decimals``, ``number_lower_bound``."""
        key = (cls, padding_side, repr(sorted(kwargs.items())))
        if key not in _DEFAULTS_BUILT:
            _DEFAULTS_BUILT[key] = cls(
                build_qwen25_base_tokenizer(), model_vocab_size=QWEN25_MODEL_VOCAB_SIZE, padding_side=padding_side,
                **kwargs,
            )
        return copy.deepcopy(_DEFAULTS_BUILT[key])

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> tuple[str, ...]:
        """transformers' ``save_pretrained``, whose ``tokenizer_config.json`` also lists the added tokens
        (``added_tokens_decoder``, as transformers 4 wrote it): without them ``from_pretrained`` parses the whole
        ``tokenizer.json`` (11 MB for Qwen2.5) once more in Python to find them, about half a second a load.
        Written into a staging folder beside ``save_directory`` and moved in file by file
        (`files.save_through_staging`), so a save killed half-way leaves every file whole (``push_to_hub=True``
        writes in place: the upload reads the folder itself); returns the paths in ``save_directory``."""
        directory = Path(save_directory)

        def write(folder: Path) -> tuple[str, ...]:
            files = super(NumericTokenizer, self).save_pretrained(folder, *args, **kwargs)
            for name in files:
                if Path(name).name.endswith("tokenizer_config.json"):
                    path = Path(name)
                    config = json.loads(path.read_text(encoding="utf-8"))
                    config["added_tokens_decoder"] = {
                        str(index): token.__getstate__() for index, token in sorted(self.added_tokens_decoder.items())
                    }
                    write_text_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
            return files

        if kwargs.get("push_to_hub"):  # the upload reads the folder itself
            return write(directory)
        return save_through_staging(directory, lambda staging: tuple(
            str(directory / Path(name).relative_to(staging)) for name in write(staging)))

    # -- properties -----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(len={len(self)}, num_token_id={self.num_token_id}, "
            f"origin={self.num_token_origin!r}, decimal_comma={self.decimal_comma})"
        )

    @property
    def tokenizer(self) -> PreTrainedTokenizerFast:
        """The plain tokenizer on the same vocabulary (``<NUM>`` included as a special token): numbers are
        spelled as digit tokens, as the base model reads them. Built on first use."""
        if self._plain is None:
            self._plain = PreTrainedTokenizerFast(
                tokenizer_object=self._tokenizer,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                pad_token=self.pad_token,
                unk_token=self.unk_token,
                extra_special_tokens=list(self.extra_special_tokens),
                model_max_length=self.model_max_length,
                padding_side=self.padding_side,
                truncation_side=self.truncation_side,
                clean_up_tokenization_spaces=False,
            )
        return self._plain

    @property
    def pad_token_id(self) -> int | None:
        """Padding id: the pad token, else the eos token, else ``<|endoftext|>`` if present."""
        for token in (self.pad_token, self.eos_token):
            if token is not None:
                return self.convert_tokens_to_ids(str(token))
        return self.get_vocab().get("<|endoftext|>")

    @pad_token_id.setter
    def pad_token_id(self, value: int | None) -> None:
        self.pad_token = None if value is None else self.convert_ids_to_tokens(value)

    # -- encoding -------------------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        """``text`` as the base tokenizer's normalizer leaves it (NFC for Qwen2); numbers are found in this."""
        _check_text(text)
        normalizer = self._tokenizer.normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def line_break_ids(self) -> list[int]:
        """The ids of the tokens whose text holds a line break (``\\n``, ``\\r``, or another that
        ``str.splitlines`` breaks at): ``"\\n"``, ``".\\n"``, ``"\\n\\n"``, ... (2,184 of Qwen2.5's)."""
        texts = self._tokenizer.decode_batch([[token] for token in range(len(self))], skip_special_tokens=False)
        return [token for token, text in enumerate(texts) if any(character in _LINE_ENDS for character in text)]

    def find_numbers(self, text: str) -> list[NumberSpan]:
        """The numbers this tokenizer reads in ``text`` (positions in the normalized text)."""
        return find_numbers(self.normalize(text), decimal_comma=self.decimal_comma)

    def __call__(
        self,
        text: str | Sequence[str] | None = None,
        text_pair: Any = None,
        padding: Padding = True,
        max_length: int | None = None,
        truncation: bool = False,
        return_tensors: Literal["pt"] | None = "pt",
        add_special_tokens: bool = False,
        padding_side: Side | None = None,
        *,
        return_attention_mask: bool | None = None,
        pad_to_multiple_of: int | None = None,
        **kwargs: Any,
    ) -> BatchEncoding:
        """Tokenize ``text`` (one string or a batch).

        Returns a ``BatchEncoding`` with ``input_ids`` (B,S) long, ``numeric_values`` (B,S) float64 (the
        value at ``<NUM>`` positions, 0.0 elsewhere), ``numeric_strings`` (B lists of S str: the number as
        written at ``<NUM>`` positions, ``""`` elsewhere; always lists) and ``attention_mask`` (B,S) long; a
        single string gives B = 1. With ``return_tensors=None`` all are lists of lists.

        padding: ``True``/``"longest"`` pads to the longest row, ``"max_length"`` to ``max_length``,
            ``False``/``"do_not_pad"`` not at all (then rows must have equal length for tensors).
            Padding uses :attr:`pad_token_id`, value 0.0, string ``""`` and mask 0, on ``padding_side``.
        truncation: cut rows to ``max_length`` tokens (on ``truncation_side``).
        add_special_tokens: add the base tokenizer's own specials (none for Qwen2).
        ``apply_chat_template(messages)`` (with the chat template of an Instruct base) tokenizes through this call.
        """
        if kwargs.pop("sanitize_control_tokens", False):  # apply_chat_template passes it, False by default
            raise ValueError("NumericTokenizer does not sanitize control tokens: call apply_chat_template with "
                             "sanitize_control_tokens=False (the default)")
        unknown = sorted(set(kwargs) - set(_IGNORED_CALL_KWARGS))
        if unknown:
            raise TypeError(f"NumericTokenizer got unexpected keyword argument(s): {', '.join(unknown)}")
        if text_pair is not None:
            raise ValueError("NumericTokenizer encodes single texts; text_pair is not supported")
        batch = _as_batch(text)
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        if max_length is None and (truncation or padding == "max_length"):
            raise ValueError(f"max_length is required with truncation={truncation!r} and padding={padding!r}")
        if not isinstance(truncation, bool):
            raise ValueError(f"truncation must be True or False, got {truncation!r}")
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        side = _check_side(padding_side or self.padding_side)

        with _paused_gc():
            rows = self._encode_rows(batch, add_special_tokens)
        if truncation:
            rows = [_truncate(row, max_length, self.truncation_side) for row in rows]
        elif padding == "max_length" and any(len(row.ids) > max_length for row in rows):
            longest = max(len(row.ids) for row in rows)
            raise ValueError(f"a row has {longest} tokens, more than max_length={max_length}; pass truncation=True")
        columns: dict[str, Any] = {
            "input_ids": [row.ids for row in rows],
            "numeric_values": [row.values for row in rows],
            "numeric_strings": [row.strings for row in rows],
            "attention_mask": [row.mask for row in rows],
        }
        return self.pad(  # Hugging Face's padding (`_pad` adds the values and strings beside the ids)
            columns,
            padding=padding,
            max_length=max_length if padding == "max_length" else None,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=side,
            return_attention_mask=return_attention_mask,
            return_tensors=return_tensors,
        )

    def _encode_rows(self, texts: list[str], add_special_tokens: bool) -> list[_Row]:
        """Every text, unpadded and untruncated: the text between its numbers encoded piece by piece (each piece
        normalized and pre-tokenized on its own, exactly as if encoded alone), a ``<NUM>`` id for each number. A
        literal ``"<NUM>"`` in a text is spelled out as ordinary characters, never the ``<NUM>`` id."""
        normalized = [self.normalize(text) for text in texts]
        found = [find_numbers(text, decimal_comma=self.decimal_comma) for text in normalized]
        pieces = [piece for text, numbers in zip(normalized, found) for piece in _split_around(text, numbers)]
        encoded = iter(self._encode_text_pieces(pieces))
        num_id = self.num_token_id
        prefix = list(self._special_prefix) if add_special_tokens else []
        suffix = list(self._special_suffix) if add_special_tokens else []
        rows = []
        for numbers in found:
            ids: list[int] = list(prefix)
            for _ in numbers:
                ids += next(encoded)
                ids.append(num_id)
            ids += next(encoded)
            rows.append(self._row(ids + suffix, numbers, num_id))
        return rows

    @staticmethod
    def _row(ids: list[int], numbers: list[NumberSpan], num_id: int) -> _Row:
        """A row from its ids: the values and strings of ``numbers`` at the ``<NUM>`` positions, in order."""
        values = [0.0] * len(ids)
        strings = [""] * len(ids)
        if numbers:
            positions = [index for index, token in enumerate(ids) if token == num_id]
            if len(positions) != len(numbers):
                raise RuntimeError(f"{len(numbers)} numbers but {len(positions)} {NUM_TOKEN} ids")
            for position, number in zip(positions, numbers):
                values[position] = number.value
                strings[position] = number.text
        return _Row(ids, values, strings, [1] * len(ids))

    def _prepared_backend(self) -> Tokenizer:
        """The backend without padding or truncation left over from an earlier call of the base machinery."""
        backend = self._tokenizer
        if backend.padding is not None:
            backend.no_padding()
        if backend.truncation is not None:
            backend.no_truncation()
        if backend.encode_special_tokens:
            backend.encode_special_tokens = False
        return backend

    def _encode_text_pieces(self, pieces: list[str]) -> list[list[int]]:
        """Plain-text ids of each piece; a literal ``"<NUM>"`` is spelled out, never the ``<NUM>`` id."""
        backend = self._prepared_backend()
        if not any(NUM_TOKEN in piece for piece in pieces):
            nonempty = [piece for piece in pieces if piece]
            encodings = iter(backend.encode_batch_fast(nonempty, add_special_tokens=False) if nonempty else [])
            return [next(encodings).ids if piece else [] for piece in pieces]
        parts = [piece.split(NUM_TOKEN) for piece in pieces]
        flat = [part for split in parts for part in split if part]
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
        backend = self._tokenizer
        previous = backend.encode_special_tokens
        backend.encode_special_tokens = True
        try:
            return backend.encode(NUM_TOKEN, add_special_tokens=False).ids
        finally:
            backend.encode_special_tokens = previous

    def _special_affixes(self) -> tuple[list[int], list[int]]:
        """Ids the base tokenizer puts before and after a text when ``add_special_tokens=True``."""
        probe = self._tokenizer.encode("0", add_special_tokens=True)
        core = [index for index, special in enumerate(probe.special_tokens_mask) if not special]
        if not core:
            return list(probe.ids), []
        return list(probe.ids[: core[0]]), list(probe.ids[core[-1] + 1 :])

    # -- padding features (DataCollatorWithPadding) ---------------------------------------------

    def pad(
        self,
        encoded_inputs: Any,
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """Pad encoded rows (a list of feature dicts or a dict of lists) as Hugging Face does, with
        ``numeric_values`` padded by 0.0 and ``numeric_strings`` by ``""`` beside the ids. Tensors come back
        as ``input_ids``/``attention_mask`` long and ``numeric_values`` float64; ``numeric_strings`` stay
        lists. With tensor inputs and ``return_tensors=None`` the result is tensors, as in transformers."""
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        if isinstance(encoded_inputs, (list, tuple)) and encoded_inputs and isinstance(encoded_inputs[0], Mapping):
            encoded_inputs = [_feature_row(feature, index) for index, feature in enumerate(encoded_inputs)]
            encoded_inputs = {key: [feature[key] for feature in encoded_inputs] for key in encoded_inputs[0].keys()}
        elif isinstance(encoded_inputs, Mapping):
            encoded_inputs = dict(encoded_inputs)
        else:
            raise ValueError(f"pad expects feature dicts or a dict of lists, got {type(encoded_inputs).__name__}")
        if _holds_tensors(encoded_inputs.get("input_ids")) and return_tensors is None:
            return_tensors = "pt"
        encoded_inputs = {key: to_py_obj(value) if _holds_tensors(value) else value
                          for key, value in encoded_inputs.items()}
        padded = super().pad(
            encoded_inputs,
            padding=padding,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_attention_mask=return_attention_mask,
            return_tensors=None,
            verbose=verbose,
        )
        if return_tensors is None:
            return padded
        lengths = {len(row) for row in padded["input_ids"]} if _is_batched(padded["input_ids"]) else {0}
        if len(lengths) > 1:
            raise ValueError("rows have different lengths; pass padding=True to return tensors")
        return _as_tensors(dict(padded))

    def _pad(
        self,
        encoded_inputs: dict[str, Any],
        max_length: int | None = None,
        padding_strategy: Any = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
    ) -> dict:
        """One row: the base padding of ids and mask, then ``numeric_values`` (0.0) and ``numeric_strings``
        (``""``) by as many positions on the same side."""
        before = len(encoded_inputs["input_ids"])
        padded = super()._pad(
            encoded_inputs,
            max_length=max_length,
            padding_strategy=padding_strategy,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_attention_mask=return_attention_mask,
        )
        missing = len(padded["input_ids"]) - before
        if missing:
            left = (padding_side if padding_side is not None else self.padding_side) == "left"
            for key, fill in (("numeric_values", 0.0), ("numeric_strings", "")):
                if key in padded:
                    row = list(padded[key])
                    padded[key] = [fill] * missing + row if left else row + [fill] * missing
        return padded

    # -- decoding -------------------------------------------------------------------------------

    def decode(
        self,
        ids: Any,
        numeric_values: Sequence[float] | torch.Tensor | None = None,
        attention_mask: Sequence[int] | torch.Tensor | None = None,
        skip_special_tokens: bool = False,
        numeric_strings: Sequence[str] | None = None,
        separate_numbers: bool = False,
        numeric_scales: Sequence[float] | torch.Tensor | None = None,
        **kwargs: Any,
    ) -> str | list[str]:
        """Text of one row (S,) (a batch (B,S) gives a list, as :meth:`batch_decode`).

        Each ``<NUM>`` is written as its string in ``numeric_strings`` (the number as it was read: the text
        comes back exactly; a row shorter than ``ids`` covers its first positions, e.g. a prompt's strings for
        ``model.generate``'s prompt and continuation), else, where ``numeric_scales`` gives it a finite scale (a
        number the model wrote: ``generate``'s ``numeric_scales``), as :func:`format_prediction` of its value to the
        digits that scale supports, else as :func:`format_number` of its value; a space is added where a number
        would otherwise not read back as itself (:func:`join_numbers`). ``separate_numbers``: check the given
        strings that way too (numbers a model wrote). Positions with ``attention_mask == 0`` (padding) are
        left out. ``kwargs`` (``clean_up_tokenization_spaces``) are accepted and ignored: nothing is cleaned.
        ``ValueError`` when a ``<NUM>`` has neither a value nor a string (``skip_special_tokens`` does not drop it: a
        number is text); Hugging Face's ``TextStreamer`` decodes so, and raises it at the first number.
        """
        _check_decode_kwargs(kwargs)
        if _is_batched(ids):
            return self.batch_decode(ids, numeric_values, attention_mask, skip_special_tokens, numeric_strings,
                                     separate_numbers, numeric_scales=numeric_scales)
        return self._decode_rows([(ids, numeric_values, attention_mask, numeric_strings, numeric_scales)],
                                 skip_special_tokens, separate_numbers)[0]

    def batch_decode(
        self,
        ids: Any,
        numeric_values: Sequence[Sequence[float]] | torch.Tensor | None = None,
        attention_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
        skip_special_tokens: bool = False,
        numeric_strings: Sequence[Sequence[str]] | None = None,
        separate_numbers: bool = False,
        numeric_scales: Sequence[Sequence[float]] | torch.Tensor | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """:meth:`decode` for each row of (B,S) ``ids``, ``numeric_values``, ``numeric_strings``,
        ``numeric_scales`` and ``attention_mask`` (the text between numbers of all rows is decoded by the backend
        in one call)."""
        _check_decode_kwargs(kwargs)
        rows = len(ids)
        for name, other in (("numeric_values", numeric_values), ("attention_mask", attention_mask),
                            ("numeric_strings", numeric_strings), ("numeric_scales", numeric_scales)):
            if other is not None and len(other) != rows:
                raise ValueError(f"{name} has {len(other)} rows for {rows} rows of ids")
        batch = [
            (
                ids[row],
                None if numeric_values is None else numeric_values[row],
                None if attention_mask is None else attention_mask[row],
                None if numeric_strings is None else numeric_strings[row],
                None if numeric_scales is None else numeric_scales[row],
            )
            for row in range(rows)
        ]
        with _paused_gc():
            return self._decode_rows(batch, skip_special_tokens, separate_numbers)

    def _decode_rows(self, rows: list[tuple[Any, Any, Any, Any, Any]], skip_special_tokens: bool,
                     separate_numbers: bool) -> list[str]:
        """Rows of ``(ids, values, mask, strings, scales)`` → texts: split at the ``<NUM>`` ids, text pieces
        decoded by the backend in one batch, numbers joined in (:func:`join_numbers`)."""
        num_id = self.num_token_id
        split_rows = []
        all_pieces: list[list[int]] = []
        for ids, numeric_values, attention_mask, numeric_strings, numeric_scales in rows:
            ids_list = _as_int_list(ids, "ids")
            values_list = _as_float_list(numeric_values, len(ids_list), "numeric_values")
            strings_list = _as_str_list(numeric_strings, len(ids_list))
            scales_list = _as_float_list(numeric_scales, len(ids_list), "numeric_scales")
            if scales_list is not None and values_list is None:
                raise ValueError("numeric_scales need the numeric_values they are the scales of")
            if attention_mask is not None:
                mask_list = _as_int_list(attention_mask, "attention_mask")
                if len(mask_list) != len(ids_list):
                    raise ValueError(f"attention_mask has {len(mask_list)} entries for {len(ids_list)} ids")
                kept = [index for index, keep in enumerate(mask_list) if keep]
                if len(kept) != len(ids_list):
                    ids_list = [ids_list[index] for index in kept]
                    values_list = None if values_list is None else [values_list[index] for index in kept]
                    strings_list = None if strings_list is None else [strings_list[index] for index in kept]
                    scales_list = None if scales_list is None else [scales_list[index] for index in kept]
            positions = [index for index, token in enumerate(ids_list) if token == num_id]
            if positions and values_list is None and strings_list is None:
                raise ValueError(
                    f"ids contain {NUM_TOKEN} but no numeric_values were given: pass the numbers' values (the "
                    "tokenizer's numeric_values; model.generate(..., return_dict_in_generate=True) returns them as "
                    "numeric_values). A plain streamer (TextStreamer) sees token ids only: stream with "
                    "causal_qwen.core.text_generation.NumericTextStreamer instead"
                )
            numbers: list[float] = []
            strings: list[str | None] = []
            model_written = False  # a string formatted here is checked like separate_numbers' strings
            start = 0
            for position in positions:
                all_pieces.append(ids_list[start:position])
                string = strings_list[position] if strings_list is not None else None
                scale = scales_list[position] if scales_list is not None else math.nan
                if not string and math.isfinite(scale) and scale > 0 and math.isfinite(values_list[position]):
                    # a number the model wrote ("6.5" is text to a decimal-comma tokenizer: "6,5")
                    string = format_prediction(values_list[position], scale, decimal_comma=self.decimal_comma)
                    model_written = True
                if values_list is None and not string:
                    raise ValueError(f"{NUM_TOKEN} at position {position} has neither a value nor a string")
                numbers.append(values_list[position] if values_list is not None else float("nan"))
                strings.append(string)
                start = position + 1
            all_pieces.append(ids_list[start:])
            split_rows.append((numbers, strings, model_written))
        texts = iter(self._tokenizer.decode_batch(all_pieces, skip_special_tokens=skip_special_tokens))
        decoded = []
        for numbers, strings, model_written in split_rows:
            pieces = [next(texts) for _ in range(len(numbers) + 1)]
            decoded.append(join_numbers(pieces, numbers, strings, decimal_comma=self.decimal_comma,
                                        separate_strings=separate_numbers or model_written))
        return decoded


# Saved folders name this class in ``auto_map`` and carry this module's source (with numbers.py and
# qwen_vocab.py), so that AutoTokenizer loads them with trust_remote_code=True without causal_qwen installed.
NumericTokenizer.register_for_auto_class("AutoTokenizer")
if __name__ == "causal_qwen.core.tokenizer":  # the package itself, not the copy saved beside a model
    import importlib

    AutoTokenizer.register(importlib.import_module("causal_qwen.core.configuration").CausalQwenConfig,
                           tokenizer_class=NumericTokenizer, exist_ok=True)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _base_kwargs(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """What a `NumericTokenizer` copies from a base tokenizer: its backend, special tokens and chat template (an
    Instruct base's, for ``apply_chat_template``)."""
    backend = _backend(tokenizer)
    extra = [str(token) for token in getattr(tokenizer, "extra_special_tokens", None) or []]
    chat_template = getattr(tokenizer, "chat_template", None)
    return {
        **({"chat_template": chat_template} if chat_template is not None else {}),
        "tokenizer_object": backend,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "extra_special_tokens": extra,
        "model_max_length": tokenizer.model_max_length,
        "truncation_side": tokenizer.truncation_side,
        "clean_up_tokenization_spaces": False,
    }


def _names_this_class(name_or_path: str | Path, kwargs: dict) -> bool:
    """Whether the tokenizer config at ``name_or_path`` names `NumericTokenizer`."""
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    options = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
    try:
        config = get_tokenizer_config(str(name_or_path), **options)
    except (OSError, ValueError) as error:
        logger.debug("no tokenizer config at %s: %s", name_or_path, error)
        return False
    return config.get("tokenizer_class") == NumericTokenizer.__name__


def _read_model_config(name_or_path: str | Path, kwargs: dict):
    """The model config stored next to the tokenizer, or ``None`` when there is no readable one."""
    config_kwargs = {key: kwargs[key] for key in (*_HUB_KWARGS, "gguf_file", "trust_remote_code") if key in kwargs}
    try:
        return AutoConfig.from_pretrained(name_or_path, **config_kwargs)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        logger.debug("no model config next to tokenizer %s: %s", name_or_path, error)
        return None


def _vocab_size(config) -> int | None:
    """``vocab_size`` of a model config (its text config's), or ``None``."""
    if config is None:
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab_size = getattr(text_config, "vocab_size", None)
    return vocab_size if isinstance(vocab_size, int) else None


def _as_tensors(columns: dict[str, Any]) -> BatchEncoding:
    """Tensors for ids, mask and values (float64); strings stay lists."""
    out: dict[str, Any] = {}
    for key, value in columns.items():
        if key == "numeric_strings":
            out[key] = value
        elif key == "numeric_values":
            out[key] = torch.tensor(value, dtype=torch.float64)  # (B,S)
        else:
            out[key] = torch.tensor(value, dtype=torch.long)  # (B,S)
    ids = out.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] == 0:
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                out[key] = value.reshape(len(columns["input_ids"]), 0)
    return BatchEncoding(out)


def _feature_row(feature: Mapping, index: int) -> Mapping:
    """One feature of a collator's list as one row: ``tokenizer(text)`` gives a batch of one row ((1,S) tensors or
    ``[[...]]`` lists), which is taken as its row; a feature of several rows is a ``ValueError``."""
    ids = feature.get("input_ids")
    batched = ids.dim() == 2 if isinstance(ids, torch.Tensor) else _is_batched(ids)
    if not batched:
        return feature
    if len(ids) != 1:
        raise ValueError(f"feature {index} holds {len(ids)} rows of input_ids; a collator pads features of one row "
                         "each: split the batch (one dict per text)")
    return {key: _only_row(value) for key, value in feature.items()}


def _only_row(value: Any) -> Any:
    """``value[0]`` for a one-row batch field ((1,S) tensor, ``[[...]]`` list); any other field as it is."""
    if isinstance(value, torch.Tensor):
        return value[0] if value.dim() == 2 else value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (list, tuple, torch.Tensor)):
        return value[0]
    return value


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], torch.Tensor)


def _is_batched(ids: Any) -> bool:
    if isinstance(ids, torch.Tensor):
        return ids.dim() == 2
    return isinstance(ids, (list, tuple)) and bool(ids) and isinstance(ids[0], (list, tuple, torch.Tensor))


@contextlib.contextmanager
def _paused_gc():
    """Pause Python's cyclic garbage collector while many small lists are built (it would rescan them again and
    again: half of the time of a large encode or decode); the lists hold no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check_decode_kwargs(kwargs: dict) -> None:
    unknown = sorted(set(kwargs) - {"clean_up_tokenization_spaces"})
    if unknown:
        raise TypeError(f"decode got unexpected keyword argument(s): {', '.join(unknown)}")


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise ValueError(f"texts must be str or a sequence of str, got an item of type {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"text is not valid Unicode: lone surrogate at position {error.start}") from None


def _as_batch(texts: str | Sequence[str] | None) -> list[str]:
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


def _check_side(side: str) -> Side:
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    return side


def _truncate(row: _Row, max_length: int, side: str) -> _Row:
    """``row`` cut to ``max_length`` tokens, dropping from the left or the right."""
    if len(row.ids) <= max_length:
        return row
    keep = slice(-max_length, None) if side == "left" else slice(0, max_length)
    return _Row(*(column[keep] for column in row))


def _split_around(text: str, numbers: list[NumberSpan]) -> list[str]:
    """The len(numbers) + 1 text pieces before, between and after the numbers."""
    starts = [0] + [number.end for number in numbers]
    ends = [number.start for number in numbers] + [len(text)]
    return [text[start:end] for start, end in zip(starts, ends)]


def _as_int_list(values: Sequence[int] | torch.Tensor, name: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be one row (S,), got shape {tuple(values.shape)}; use batch_decode")
        return values.tolist()
    if isinstance(values, int):
        return [values]
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


def _as_str_list(strings: Sequence[str] | None, length: int) -> list[str] | None:
    if strings is None:
        return None
    if isinstance(strings, str) or not isinstance(strings, Sequence):
        raise ValueError(f"numeric_strings must be one row of strings, got {type(strings).__name__}")
    result = ["" if string is None else string for string in strings]
    if len(result) > length:
        raise ValueError(f"numeric_strings has {len(result)} entries for {length} ids")
    result += [""] * (length - len(result))  # a prompt's strings: the positions after it have none
    for string in result:
        if not isinstance(string, str):
            raise ValueError(f"numeric_strings must hold str, got {type(string).__name__}")
    return result
