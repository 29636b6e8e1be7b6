"""A closed-form start for the regression head: least squares of the training numbers on the model's features.

Shape legend: M number targets read, C causal size.

Before the first optimizer step the training examples are read once, without gradients. Every position whose
next token is ``<NUM>`` gives a pair ``(x_m, y_m)``: the individual's location ``loc_U`` there (C,) and the value
that follows. The regression head starts at the ridge solution

    [W_reg, b_reg] = argmin_{W,b}  Σ_m (W·x_m + b − y_m)²  +  M·λ·(‖X‖²_F/(M·C))·‖W‖²

(``λ`` relative to the features' mean square, so one value fits every base), and the numbers' own noise, when the
model has one, at ``γ_Y = median_m |residual_m|``: the median absolute deviation of a Cauchy equals its scale.
Why: the features of a real base have ``‖loc_U‖₁`` in the thousands, so Adam, which moves every weight by about
its learning rate per step, needs many steps to find this read-out (docs/design.md, "Fine-tuning a calibrated
model"); fine-tuning then starts from it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..core.cauchy import inverse_softplus
from ..core.losses import shift_targets

logger = logging.getLogger(__name__)

DEFAULT_RIDGE = 1e-3


@dataclass
class WarmStartReport:
    """numbers: targets read; ridge: ``λ``; train_mdae: median |residual| on those targets (also ``γ_Y``);
    seconds: wall time."""

    numbers: int
    ridge: float
    train_mdae: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def number_features(model, batches) -> tuple[Tensor, Tensor]:
    """``(X (M,C) float64, y (M,) float64)``: ``loc_U`` at every position whose next token is ``<NUM>``, and that
    number's value, over ``batches`` of collated model inputs (``input_ids``, ``numeric_values``, ``attention_mask``)."""
    num_id = model.config.num_token_id
    features, values = [], []
    total = len(batches) if hasattr(batches, "__len__") else None
    for index, batch in enumerate(batches):
        if total and index % max(1, total // 10) == 0:
            logger.info("regression warm start: reading batch %d of %d", index + 1, total)
        ids, numbers, mask = batch["input_ids"], batch["numeric_values"], batch.get("attention_mask")
        out = model(input_ids=ids, numeric_values=numbers, attention_mask=mask, use_cache=False,
                    return_scores=False)  # features only: no cache, no V-wide scores
        targets = shift_targets(ids, numbers.double(), mask)
        is_number = targets.token_ids == num_id  # (N,)
        causal_size = out.loc_U.shape[-1]
        loc_U = out.loc_U[:, :-1].reshape(-1, causal_size)[targets.positions]  # (N,C)
        features.append(loc_U[is_number].double())
        values.append(numbers[:, 1:].reshape(-1)[targets.positions][is_number].double())
    if not features:
        return torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    return torch.cat(features), torch.cat(values)


def ridge_fit(features: Tensor, values: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """The ridge solution of the module docstring: ``(W (C,), b ())`` in float64. features (M,C), values (M,)."""
    count, causal_size = features.shape
    mean_x, mean_y = features.mean(dim=0), values.mean()  # centring leaves the bias out of the penalty
    centred = features - mean_x  # (M,C)
    penalty = ridge * float(features.square().sum()) / causal_size  # M·λ·(‖X‖²_F/(M·C))
    gram = centred.T @ centred + penalty * torch.eye(causal_size, dtype=features.dtype)  # (C,C)
    weight = torch.linalg.solve(gram, centred.T @ (values - mean_y))  # (C,)
    return weight, mean_y - mean_x @ weight


def warm_start_regression(
    model, dataset: Dataset, collator, batch_size: int, ridge: float = DEFAULT_RIDGE
) -> WarmStartReport | None:
    """Set ``W_reg``, ``b_reg`` (and ``γ_Y`` when the model has the numbers' own noise) from ``dataset`` as the
    module docstring says; returns None (and changes nothing) when the data hold no number. Every process of a
    distributed run reads the whole dataset in the same order, so all start from the same head."""
    import time

    if not (math.isfinite(ridge) and ridge > 0):
        raise ValueError(f"the ridge of the regression warm start must be a positive number, got {ridge!r}")
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collator)
    try:
        features, values = number_features(model, loader)
    finally:
        model.train(was_training)
    if len(values) == 0:
        logger.info("regression warm start: the training data hold no number; the head keeps its initial values")
        return None
    weight, bias = ridge_fit(features, values, ridge)
    residual = (features @ weight + bias - values).abs()  # (M,)
    head = model.action.regression_head
    with torch.no_grad():
        head.weight.copy_(weight.reshape(head.weight.shape).to(head.weight.dtype))
        head.bias.copy_(bias.reshape(head.bias.shape).to(head.bias.dtype))
        noise = model.action.number_noise
        spread = float(residual.median())
        if noise is not None and spread > 0:
            noise.weight.zero_()
            noise.bias.fill_(inverse_softplus(spread))
    report = WarmStartReport(
        numbers=len(values), ridge=ridge, train_mdae=spread, seconds=time.perf_counter() - started
    )
    logger.info("regression warm start: %s", report.to_dict())
    return report
