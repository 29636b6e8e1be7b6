"""Reference losses (docs/design.md, "Losses"), written as directly as the formulas; the fused head must equal
these.

Shape legend: N flattened positions, V vocabulary rows, C causal size.

Targets for position i are ``labels[i+1]`` and ``numeric_values[i+1]`` (Hugging Face convention:
``labels`` come unshifted and the model shifts them).

    L_cls(i) = Σ_k −[y_ik·log P_ik + (1 − y_ik)·log(1 − P_ik)]     P_ik = P(S_ik > t_k), y one-hot
    L_reg    = Σ_{i: target is <NUM>} gate_i·NLL_Cauchy(v_{i+1}; loc_Y_i, scale_Y_i) / #<NUM> targets
    gate_i   = α + (1 − α)·P_i,<NUM>  (detached by default)
    L        = mean_i L_cls(i) + λ·L_reg
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .cauchy import nll, ovr_log_probs

IGNORE_INDEX = -100


@dataclass
class ShiftedTargets:
    """Next-position targets, flattened over the valid positions only.

    positions: (N,) indices into the flattened (B·(S-1)) grid of positions that have a target.
    token_ids: (N,) long; values: (N,) float.
    """

    positions: Tensor
    token_ids: Tensor
    values: Tensor


def shift_targets(labels: Tensor, numeric_values: Tensor, attention_mask: Tensor | None) -> ShiftedTargets:
    """Pair position i with ``labels[i+1]``; drop ``-100`` targets and padded target positions."""
    target_ids = labels[:, 1:]  # (B,S-1)
    target_values = numeric_values[:, 1:]  # (B,S-1)
    valid = target_ids != IGNORE_INDEX  # (B,S-1)
    if attention_mask is not None:
        valid = valid & attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    positions = valid.reshape(-1).nonzero().squeeze(-1)  # (N,)
    return ShiftedTargets(
        positions=positions,
        token_ids=target_ids.reshape(-1)[positions],
        values=target_values.reshape(-1)[positions].float(),
    )


def next_number_ordinals(labels: Tensor, num_id: int) -> tuple[Tensor, Tensor]:
    """``(predicts_number, ordinal)``, (B,S-1) each: whether position i predicts a ``<NUM>`` (``labels[i+1]``), and
    that number's index among its row's numbers. The count starts at the row's first token, so a row that opens
    with a number (which no position predicts) numbers the next one 1, as the document's own numbering
    (`causal_qwen.training.data.Document.target_ordinal`) does."""
    is_number = labels == num_id  # (B,S)
    ordinal = is_number.long().cumsum(dim=1)[:, 1:] - 1  # (B,S-1)
    return is_number[:, 1:], ordinal


def ovr_bce_per_position(loc_S: Tensor, scale_S: Tensor, threshold: Tensor, target_ids: Tensor) -> Tensor:
    """``Σ_k −[y_k log P_k + (1−y_k) log(1−P_k)]`` per position, from the stable log forms.

    loc_S, scale_S: (N,V); threshold: () or (V,); target_ids: (N,)  →  (N,)
    """
    log_p, log_not_p = ovr_log_probs(loc_S, scale_S, threshold)  # (N,V) each
    one_hot = torch.zeros_like(loc_S, dtype=torch.bool)
    one_hot.scatter_(1, target_ids.unsqueeze(1), True)  # (N,V)
    return -torch.where(one_hot, log_p, log_not_p).sum(dim=1)


def gated_regression_loss(
    loc_Y: Tensor,
    scale_Y: Tensor,
    target_values: Tensor,
    is_number_target: Tensor,
    p_num: Tensor,
    alpha: float,
    detach_gate: bool,
) -> Tensor:
    """``Σ gate·NLL / #<NUM> targets`` over positions whose target is ``<NUM>``; 0 when there are none.

    loc_Y, scale_Y, target_values, p_num: (N,); is_number_target: (N,) bool  →  ()
    """
    count = is_number_target.sum()
    if count == 0:
        return loc_Y.sum() * 0.0
    gate = alpha + (1.0 - alpha) * (p_num.detach() if detach_gate else p_num)
    number_nll = nll(target_values[is_number_target], loc_Y[is_number_target], scale_Y[is_number_target])
    return (gate[is_number_target] * number_nll).sum() / count
