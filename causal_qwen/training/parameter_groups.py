"""Which part of CausalQwen a parameter belongs to: learning-rate groups, freezing, per-part gradient norms.

Groups (by parameter name, so they survive DDP/FSDP/peft wrappers):

| group               | parameters                                                      |
|---------------------|-----------------------------------------------------------------|
| ``heads``           | ``abduction.*``, ``action.*``, ``ovr_thresholds.*`` (learnable), |
|                     | except the regression head                                      |
| ``regression``      | ``action.regression_head.*`` (``W_reg``, ``b_reg``)             |
| ``numeric_embedding`` | ``numeric_embedding.*``                                       |
| ``backbone``        | ``model.*`` (Qwen2: embeddings, transformer, final norm)        |
| ``lora``            | peft LoRA adapters (``*lora_*``) on the backbone                |
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

logger = logging.getLogger(__name__)

GROUPS = ("heads", "regression", "numeric_embedding", "backbone", "lora")
HEAD_PARTS = ("abduction", "action")
_WRAPPER_PREFIXES = (
    "module.",
    "_orig_mod.",
    "base_model.model.",
    "_fsdp_wrapped_module.",
    "_checkpoint_wrapped_module.",
)
_HEAD_MODULES = ("abduction", "action", "ovr_thresholds")


def canonical_name(name: str) -> str:
    """The parameter's name inside `CausalQwenForCausalLM`, without DDP/FSDP/compile/peft wrapper prefixes."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    return name.replace("._fsdp_wrapped_module", "").replace("._checkpoint_wrapped_module", "")


def parameter_group(name: str) -> str:
    """One of `GROUPS` for a (possibly wrapped) parameter name; ``ValueError`` for a foreign parameter."""
    clean = canonical_name(name)
    if "lora_" in clean:
        return "lora"
    top = clean.split(".", 1)[0]
    if top == "model":
        return "backbone"
    if top == "numeric_embedding":
        return "numeric_embedding"
    if top in _HEAD_MODULES:
        return "regression" if ".regression_head." in f".{clean}." else "heads"
    raise ValueError(f"parameter {name!r} belongs to no CausalQwen part ({', '.join(GROUPS)})")


def head_part(name: str) -> str | None:
    """``"abduction"`` or ``"action"`` for parameters of those networks, else None."""
    top = canonical_name(name).split(".", 1)[0]
    return top if top in HEAD_PARTS else None


def optimizer_groups(
    model: nn.Module,
    learning_rates: dict[str, float],
    weight_decay: float,
    decay_names: Iterable[str] = (),
) -> list[dict]:
    """Trainable parameters as optimizer groups named ``group`` / ``group_no_decay`` with their own ``lr``.

    ``learning_rates`` maps each group of `GROUPS` that has trainable parameters to its rate; ``decay_names``
    are the parameters that get ``weight_decay`` (the rest get none: biases, norms). The ``heads`` groups
    come first, so a scheduler's first learning rate is the heads' one.
    """
    decay = set(decay_names)
    buckets: dict[tuple[str, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group = parameter_group(name)
        buckets.setdefault((group, name in decay), []).append(param)
    groups = []
    for group in GROUPS:
        for decayed in (True, False):
            params = buckets.get((group, decayed))
            if not params:
                continue
            if group not in learning_rates:
                raise ValueError(f"no learning rate given for the trainable group {group!r}")
            groups.append(
                {
                    "params": params,
                    "lr": learning_rates[group],
                    "weight_decay": weight_decay if decayed else 0.0,
                    "name": group if decayed else f"{group}_no_decay",
                }
            )
    if not groups:
        raise ValueError("the model has no trainable parameter")
    return groups


# The decision scale fitted at conversion (docs/design.md "Calibration at conversion"): the scale network and the
# exogenous noise. Their calibrated values are ~1e-9, so a single Adam step of any usual learning rate (which moves
# every entry by about the rate itself) changes them by orders of magnitude.
DECISION_SCALE_PARAMETERS = (
    "abduction.scale_net.weight", "abduction.scale_net.bias", "action.b_noise", "action.token_noise"
)


def is_decision_scale(name: str) -> bool:
    """True for ``W_scale``, ``b_scale``, ``b_noise`` and the token noise (under any wrapper prefix)."""
    clean = canonical_name(name).replace(".modules_to_save.default.", ".")  # peft's trained copy of a head
    return any(clean == target or clean.endswith("." + target) for target in DECISION_SCALE_PARAMETERS)


def freeze_decision_scale(model: nn.Module) -> int:
    """``requires_grad=False`` on ``W_scale``, ``b_scale``, ``b_noise`` and the token noise; returns how many tensors
    were frozen."""
    count = 0
    for name, param in model.named_parameters():
        if is_decision_scale(name):
            param.requires_grad_(False)
            count += 1
    return count


def freeze_groups(model: nn.Module, groups: Iterable[str]) -> int:
    """``requires_grad=False`` on every parameter of ``groups``; returns how many tensors were frozen."""
    wanted = set(groups)
    count = 0
    for name, param in model.named_parameters():
        if parameter_group(name) in wanted:
            param.requires_grad_(False)
            count += 1
    return count


def drop_gradients(model: nn.Module, groups: Iterable[str]) -> None:
    """Set ``.grad = None`` on the parameters of ``groups``: the optimizer then leaves them (and their
    moments) untouched this step."""
    wanted = set(groups)
    for name, param in model.named_parameters():
        if param.grad is not None and parameter_group(name) in wanted:
            param.grad = None


@torch.no_grad()
def head_gradient_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the current gradients of the abduction and of the action network (0 when none)."""
    squares = {part: 0.0 for part in HEAD_PARTS}
    for name, param in model.named_parameters():
        part = head_part(name)
        if part is not None and param.grad is not None:
            squares[part] += float(param.grad.detach().float().pow(2).sum())
    return {part: value**0.5 for part, value in squares.items()}
