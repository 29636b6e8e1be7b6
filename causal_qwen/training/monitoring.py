"""Training figures, the callback writing ``metrics.jsonl`` and the one printing a line per logged step.

Shape legend: B batch, S sequence, C causal size, V vocabulary rows, N target positions, K sampled positions.

Per logged step, averaged over the micro-batches since the previous log and over processes:

| key                   | meaning                                                                    |
|-----------------------|----------------------------------------------------------------------------|
| ``cls_loss``, ``reg_loss`` | the two parts of the model's loss                                     |
| ``scale_U_mean``      | mean of ``scale_U`` over real (unpadded) positions and components          |
| ``loc_U_norm``        | mean L2 norm of ``loc_U`` over real positions                              |
| ``token_accuracy``    | standard mode (argmax of the OvR scores) equals the next token, on K positions |
| ``p_target``          | mean OvR probability ``P(S_target > t)`` of the next token, on K positions  |
| ``number_nll``        | ungated Cauchy NLL of the values at ``<NUM>`` targets (``reg_loss`` is gated by ``P_<NUM>``) |
| ``grad_norm_abduction``, ``grad_norm_action`` | gradient norms of the two networks (before clipping) |

Token accuracy and ``p_target`` need full (K, V) scores, so they use K evenly spaced target positions of
the batch (``monitor_positions``), never (B·S, V). Position selection is deterministic: monitoring draws
no random numbers, so it cannot change a run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import TrainerCallback

from ..core import cauchy, losses

logger = logging.getLogger(__name__)

LOSS_KEYS = ("cls_loss", "reg_loss")
REPRESENTATION_KEYS = ("scale_U_mean", "loc_U_norm", "number_nll")
DECISION_KEYS = ("token_accuracy", "p_target")
GRADIENT_KEYS = ("grad_norm_abduction", "grad_norm_action")
ALL_KEYS = LOSS_KEYS + REPRESENTATION_KEYS + DECISION_KEYS + GRADIENT_KEYS


class MetricAccumulator:
    """Weighted running means of named figures, reducible across processes in one collective call."""

    def __init__(self, keys: tuple[str, ...] = ALL_KEYS) -> None:
        self.keys = keys
        self.reset()

    def reset(self) -> None:
        self.sums = {key: 0.0 for key in self.keys}
        self.weights = {key: 0.0 for key in self.keys}

    def add(self, key: str, value: float | Tensor, weight: float = 1.0) -> None:
        self.sums[key] += float(value) * weight
        self.weights[key] += weight

    def drain(self, reduce_sum: Callable[[Tensor], Tensor] | None = None) -> dict[str, float]:
        """Means since the last drain (summed over processes by ``reduce_sum``); figures never added are left out."""
        values = [self.sums[k] for k in self.keys] + [self.weights[k] for k in self.keys]
        totals = torch.tensor(values, dtype=torch.float64)  # (2·keys,)
        if reduce_sum is not None:
            totals = reduce_sum(totals)
        self.reset()
        count = len(self.keys)
        return {
            key: float(totals[i] / totals[count + i]) for i, key in enumerate(self.keys) if float(totals[count + i]) > 0
        }


@torch.no_grad()
def representation_stats(loc_U: Tensor, scale_U: Tensor, attention_mask: Tensor | None) -> dict[str, float]:
    """Mean ``scale_U`` and mean ``‖loc_U‖`` over real positions. loc_U, scale_U: (B,S,C); mask: (B,S)."""
    if attention_mask is None:
        mask = torch.ones(loc_U.shape[:2], dtype=torch.bool, device=loc_U.device)  # (B,S)
    else:
        mask = attention_mask.bool()
    count = mask.sum().clamp(min=1)
    scale_mean = (scale_U.float().mean(-1) * mask).sum() / count  # (B,S) -> ()
    loc_norm = (loc_U.float().norm(dim=-1) * mask).sum() / count  # (B,S) -> ()
    return {"scale_U_mean": float(scale_mean), "loc_U_norm": float(loc_norm)}


@torch.no_grad()
def number_stats(
    loc_Y: Tensor,
    scale_Y: Tensor,
    labels: Tensor,
    numeric_values: Tensor,
    attention_mask: Tensor | None,
    num_token_id: int,
) -> dict[str, float] | None:
    """Mean ungated Cauchy NLL of the next value where the next token is ``<NUM>``; None when there is none.

    loc_Y, scale_Y: (B,S) regression outputs; labels, numeric_values: (B,S) unshifted.
    """
    targets = losses.shift_targets(labels, numeric_values, attention_mask)
    is_number = targets.token_ids == num_token_id  # (N,)
    if not bool(is_number.any()):
        return None
    rows = targets.positions[is_number]  # (M,)
    loc = loc_Y[:, :-1].reshape(-1)[rows].float()  # (M,)
    scale = scale_Y[:, :-1].reshape(-1)[rows].float()  # (M,)
    return {"number_nll": float(cauchy.nll(targets.values[is_number], loc, scale).mean())}


@torch.no_grad()
def decision_stats(
    causal_model: Any,
    loc_U: Tensor,
    scale_U: Tensor,
    labels: Tensor,
    numeric_values: Tensor,
    attention_mask: Tensor | None,
    max_positions: int,
) -> dict[str, float] | None:
    """Standard-mode token accuracy and mean OvR probability of the target on ≤ ``max_positions`` positions.

    causal_model: a `CausalQwenForCausalLM` (unwrapped); loc_U, scale_U: (B,S,C); labels: (B,S) unshifted.
    Returns None when the batch has no target.
    """
    targets = losses.shift_targets(labels, numeric_values, attention_mask)
    total = targets.positions.numel()
    if total == 0 or max_positions <= 0:
        return None
    count = min(max_positions, total)
    picked = torch.linspace(0, total - 1, count, device=loc_U.device).round().long().unique()  # (K,) evenly spaced
    causal_size = loc_U.shape[-1]
    rows = targets.positions[picked]  # (K,)
    loc = loc_U[:, :-1].reshape(-1, causal_size)[rows].float()  # (K,C)
    scale = scale_U[:, :-1].reshape(-1, causal_size)[rows].float()  # (K,C)
    target_ids = targets.token_ids[picked]  # (K,)
    action = causal_model.action
    head = action.classification_head
    loc_S, scale_S = action.classify(loc.to(head.weight.dtype), scale)  # (K,V) each; the scales stay float32
    threshold = causal_model.ovr_thresholds().float()
    z = cauchy.decision_score(loc_S, scale_S, threshold)  # (K,V); argmax z == argmax P_k (standard decision)
    accuracy = (z.argmax(-1) == target_ids).float().mean()
    p_all = causal_model.ovr_probabilities(loc_S.float(), scale_S.float())  # (K,V)
    p_target = p_all.gather(1, target_ids.unsqueeze(1)).mean()
    return {"token_accuracy": float(accuracy), "p_target": float(p_target)}


class MetricsJsonlCallback(TrainerCallback):
    """Appends one JSON object per log event to ``path`` (main process only).

    Training records hold ``step``, ``loss``, ``lr`` (the heads' learning rate) and the figures above;
    evaluation records hold ``step`` and ``eval_*`` keys. A fresh run starts the file anew; a resumed run
    drops the records after the step it resumes from (and a line a killed run left half-written), rewriting
    the file through a temporary one. The file is strict JSON: a figure that is not finite is written as null
    (and logged).
    """

    RENAMES = {"learning_rate": "lr"}
    SKIP = ("train_runtime", "total_flos")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if state.global_step > 0 and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and record.get("step", 0) <= state.global_step:
                    kept.append(line)
        from ..core.files import write_text_atomic

        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or any(key in logs for key in self.SKIP):
            return
        record: dict[str, Any] = {"step": state.global_step}
        for key, value in logs.items():
            record[self.RENAMES.get(key, key)] = _jsonable(value)
        not_finite = [key for key, value in record.items() if value is None and logs.get(key) is not None]
        if not_finite:
            logger.warning("step %d: %s not finite, written as null", state.global_step, ", ".join(not_finite))
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, allow_nan=False) + "\n")


class ProgressLines(TrainerCallback):
    """Hands ``progress`` one line per log event of the main process, for a person watching a long run:

        {prefix}step S/N, loss L[, cls C][, reg R], T s       a training log (cls/reg when the loss has them)
        {prefix}step S/N, held-out loss L                      an evaluation

    T is the seconds since training began."""

    def __init__(self, progress: Callable[[str], None], prefix: str = "") -> None:
        self.progress = progress
        self.prefix = prefix
        self.start = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        head = f"{self.prefix}step {state.global_step}/{state.max_steps}"
        if "loss" in logs:
            parts = [f"loss {logs['loss']:.4g}"]
            parts += [f"{name} {logs[key]:.4g}" for name, key in (("cls", "cls_loss"), ("reg", "reg_loss"))
                      if key in logs]
            self.progress(f"{head}, {', '.join(parts)}, {time.perf_counter() - self.start:.0f} s")
        elif "eval_loss" in logs:
            self.progress(f"{head}, held-out loss {logs['eval_loss']:.4g}")


def _jsonable(value: Any) -> Any:
    """A JSON value: tensors as numbers or lists, NaN and ±inf as None."""
    if isinstance(value, Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order (a half-written last line, as a killed run may leave,
    is skipped with a warning; a leading byte-order mark, as an editor may save, is dropped). ``ValueError`` naming
    the line that is no JSON object."""
    records = []
    text = Path(path).read_text(encoding="utf-8-sig")
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                if number == len(lines) and not text.endswith("\n"):
                    logger.warning("%s: skipping the half-written last line %d", path, number)
                    continue
                raise ValueError(f"{path}: line {number} is not valid JSON ({error})") from error
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {number} is a JSON {type(record).__name__}, not an object")
            records.append(record)
    return records
