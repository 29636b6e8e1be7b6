"""Training the heads on a frozen backbone from cached features.

Shape legend: S_i tokens of example i, H hidden size.

When the backbone and the numeric embedding are frozen (the pretrained recipe), each training example's features
``z = Qwen2Model(embed(x) + φ(v)).last_hidden_state`` never change during training. One forward pass computes
them; every optimizer step then runs the causal heads alone (`CausalQwenForCausalLM.forward(backbone_features=)`),
so a step costs what the heads cost: on 2 CPU cores, milliseconds instead of the seconds a 0.5B backbone takes per
batch. The loss, the gradients and the trained heads are those of the uncached run (tests/test_training.py).
The cache lives in memory, in the backbone's dtype: ``Σ_i S_i · H`` numbers (about 140 MB for 1,000 sentences of
40 tokens on a 0.5B base); past `MAX_CACHE_BYTES` training runs the backbone at every step as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger(__name__)

MAX_CACHE_BYTES = 4 << 30


class CachedFeatureDataset(Dataset):
    """A tokenized dataset whose examples also carry ``backbone_features`` (S_i,H)."""

    def __init__(self, examples: Dataset, features: list[Tensor]) -> None:
        if len(examples) != len(features):
            raise ValueError(f"{len(examples)} examples but {len(features)} cached feature blocks")
        self.examples = examples
        self.features = features

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        return {**self.examples[index], "backbone_features": self.features[index]}

    def num_tokens(self) -> int:
        return sum(block.shape[0] for block in self.features)


def cache_size_bytes(dataset: Dataset, hidden_size: int, dtype: torch.dtype) -> int:
    """Bytes the cache of ``dataset`` would take: ``Σ_i S_i · H`` numbers of ``dtype``."""
    tokens = sum(len(dataset[i]["input_ids"]) for i in range(len(dataset)))
    return tokens * hidden_size * torch.tensor([], dtype=dtype).element_size()


@torch.no_grad()
def cache_features(model, dataset: Dataset, collator, batch_size: int,
                   progress: Callable[[str], None] | None = None) -> CachedFeatureDataset:
    """Run the embedding and the backbone once over ``dataset`` (in order, without gradients) and keep each
    example's ``last_hidden_state`` without its padding."""
    device = model.get_input_embeddings().weight.device
    was_training = model.training
    model.eval()
    blocks: list[Tensor] = []
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collator)
    total = len(loader)
    try:
        for index, batch in enumerate(loader):
            if progress is not None and index % max(1, total // 10) == 0:
                progress(f"feature cache: batch {index + 1} of {total}")
            mask = batch["attention_mask"].to(device)
            features = model(input_ids=batch["input_ids"].to(device), numeric_values=batch["numeric_values"].to(device),
                             attention_mask=mask, use_cache=False, return_scores=False).features  # (B,S,H)
            for row, length in enumerate(mask.sum(dim=1).tolist()):  # right padding: the first `length` are real
                blocks.append(features[row, :length].clone())  # (S_i,H)
    finally:
        model.train(was_training)
    return CachedFeatureDataset(dataset, blocks)
