"""Tokenized training examples and the collator that pads them into batches.

Shape legend: B batch, S the longest example of the batch (times pad_to_multiple_of).

Every example holds ``input_ids`` and ``numeric_values`` (a float per token: the value of a ``<NUM>``, 0
elsewhere) of equal length. The collator pads them together into

    input_ids (B,S) long    numeric_values (B,S) float64    attention_mask (B,S) long    labels (B,S) long

with ``labels = input_ids`` and ``-100`` at padding (unshifted: the model shifts). Values stay float64 from
the text to the model's input (a 9-digit id or a price with cents is not rounded on the way; the model
casts where it computes).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..core.losses import IGNORE_INDEX
from .data import Document

logger = logging.getLogger(__name__)

MODEL_INPUT_KEYS = ("input_ids", "numeric_values", "attention_mask", "labels")


class TokenizedDataset(Dataset):
    """A list of ``{"input_ids": [...], "numeric_values": [...]}`` examples; yields model inputs only."""

    def __init__(self, examples: list[dict[str, list]]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list]:
        return self.examples[index]

    def num_tokens(self) -> int:
        return sum(len(example["input_ids"]) for example in self.examples)


def tokenize_documents(
    documents: Sequence[Document],
    tokenizer: Any,
    max_length: int,
    add_eos: bool = True,
    batch_size: int = 256,
) -> TokenizedDataset:
    """Tokenize with a `NumericTokenizer`, cut each document to ``max_length`` tokens (the end-of-text token
    included when ``add_eos``) and drop documents with no token left. Values are kept as Python floats
    (float64), exactly as the tokenizer read them from the text."""
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    eos_id = getattr(tokenizer, "eos_token_id", None) if add_eos else None
    if add_eos and eos_id is None:
        raise ValueError("add_eos is set but the tokenizer has no eos_token_id")
    budget = max_length - (1 if eos_id is not None else 0)
    num_id = getattr(tokenizer, "num_token_id", None)
    examples, truncated, longest = [], 0, 0
    targets_cut = targets = 0  # documents whose target number the cut removed, of those that name one
    for start in range(0, len(documents), batch_size):
        chunk = documents[start : start + batch_size]
        encoded = tokenizer([doc.text for doc in chunk], padding=False, return_tensors=None)
        for doc, ids, values in zip(chunk, encoded["input_ids"], encoded["numeric_values"]):
            ids, values = _as_list(ids), [float(v) for v in _as_list(values)]
            if len(ids) != len(values):
                raise ValueError(
                    f"{doc.source}: row {doc.row}: the tokenizer gave {len(ids)} ids but {len(values)} values"
                )
            longest = max(longest, len(ids))
            ordinal = getattr(doc, "target_ordinal", None)
            if ordinal is not None and num_id is not None:
                _check_target_read(doc, ids, values, num_id, tokenizer)
            if len(ids) > budget:
                if ordinal is not None and num_id is not None:
                    targets_cut += ids[:budget].count(num_id) <= ordinal
                ids, values = ids[:budget], values[:budget]
                truncated += 1
            targets += ordinal is not None
            if eos_id is not None:
                ids, values = ids + [int(eos_id)], values + [0.0]
            if len(ids) >= 2:
                examples.append({"input_ids": [int(i) for i in ids], "numeric_values": values})
    if truncated:
        logger.warning("%d of %d documents were cut to max_length=%d tokens", truncated, len(documents), max_length)
    if targets_cut:
        where = f"{documents[0].source}: " if documents else ""
        message = (f"{where}the target number lies past max_length={max_length} tokens in {targets_cut} of {targets} "
                   f"documents (the longest has {longest:,} tokens): raise max_length, or put the target earlier in "
                   "the template")
        if targets_cut == targets:
            raise ValueError(message)
        logger.warning("%s; those documents train on their text and numbers before the cut only", message)
    if not examples:
        raise ValueError("the dataset is empty after tokenization (every document has fewer than 2 tokens)")
    return TokenizedDataset(examples)


def _check_target_read(doc: Document, ids: list[int], values: list[float], num_id: int, tokenizer: Any) -> None:
    """``ValueError`` unless the tokenizer reads the document's target as the data did: its number
    ``target_ordinal`` (from 0) with the value ``target_value``. The data reads the text by the number grammar's
    default mode; a tokenizer that reads decimal commas (``causal-qwen convert --decimal-comma``) reads ``14.23``
    as text."""
    read = [value for token, value in zip(ids, values) if token == num_id]
    ordinal, expected = doc.target_ordinal, getattr(doc, "target_value", None)
    if ordinal < len(read) and (expected is None or read[ordinal] == expected):
        return
    found = f"its number {ordinal} is {read[ordinal]!r}" if ordinal < len(read) else f"it reads {len(read)} numbers"
    why = (" (this tokenizer reads ',' as the decimal point and '.' as the thousands separator, and table cells are "
           "read with decimal points: train on a model converted without --decimal-comma)"
           if getattr(tokenizer, "decimal_comma", False) else "")
    raise ValueError(f"{doc.source}: row {doc.row}: the tokenizer does not read the target as the data does: "
                     f"{found}, not {expected!r}, in {doc.text!r}{why}")


def _as_list(values: Any) -> list:
    return values.tolist() if isinstance(values, Tensor) else list(values)


class NumericCollator:
    """Pads ``input_ids``, ``numeric_values``, ``attention_mask`` and ``labels`` together (and
    ``backbone_features`` (S_i,H) when the examples carry them: a feature cache).

    pad_token_id: id written at padding (it never reaches the loss: labels are ``-100`` there).
    padding_side: ``"right"`` for training; ``"left"`` for batched generation.
    pad_to_multiple_of: round S up (tensor-core friendly lengths on GPUs).
    """

    def __init__(self, pad_token_id: int, padding_side: str = "right", pad_to_multiple_of: int | None = None) -> None:
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise ValueError(f"pad_to_multiple_of must be a positive int or None, got {pad_to_multiple_of!r}")
        self.pad_token_id = int(pad_token_id)
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        if not features:
            raise ValueError("cannot collate an empty batch")
        lengths = [self._check(i, feature) for i, feature in enumerate(features)]
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {
            "input_ids": torch.full((len(features), width), self.pad_token_id, dtype=torch.long),  # (B,S)
            "numeric_values": torch.zeros(len(features), width, dtype=torch.float64),  # (B,S)
            "attention_mask": torch.zeros(len(features), width, dtype=torch.long),  # (B,S)
            "labels": torch.full((len(features), width), IGNORE_INDEX, dtype=torch.long),  # (B,S)
        }
        for row, (feature, length) in enumerate(zip(features, lengths)):
            span = slice(0, length) if self.padding_side == "right" else slice(width - length, width)
            ids = torch.as_tensor(feature["input_ids"], dtype=torch.long)
            batch["input_ids"][row, span] = ids
            batch["numeric_values"][row, span] = torch.as_tensor(feature["numeric_values"], dtype=torch.float64)
            mask = feature.get("attention_mask")
            batch["attention_mask"][row, span] = 1 if mask is None else torch.as_tensor(mask, dtype=torch.long)
            labels = feature.get("labels")
            labels = ids if labels is None else torch.as_tensor(labels, dtype=torch.long)
            batch["labels"][row, span] = labels
        batch["labels"][batch["attention_mask"] == 0] = IGNORE_INDEX
        if "backbone_features" in features[0]:  # a feature cache (`feature_cache`): zeros at padding
            blocks = [feature["backbone_features"] for feature in features]
            batch["backbone_features"] = blocks[0].new_zeros(len(blocks), width, blocks[0].shape[-1])  # (B,S,H)
            for row, (block, length) in enumerate(zip(blocks, lengths)):
                span = slice(0, length) if self.padding_side == "right" else slice(width - length, width)
                batch["backbone_features"][row, span] = block
        return batch

    @staticmethod
    def _check(index: int, feature: dict[str, Any]) -> int:
        if not isinstance(feature, dict) or "input_ids" not in feature or "numeric_values" not in feature:
            keys = sorted(feature) if isinstance(feature, dict) else type(feature).__name__
            raise ValueError(f"batch example {index} needs 'input_ids' and 'numeric_values', got {keys}")
        length = len(feature["input_ids"])
        for key in ("numeric_values", "attention_mask", "labels"):
            if feature.get(key) is not None and len(feature[key]) != length:
                raise ValueError(
                    f"batch example {index}: '{key}' has {len(feature[key])} entries but input_ids has {length}"
                )
        if length == 0:
            raise ValueError(f"batch example {index} has no tokens")
        return length
