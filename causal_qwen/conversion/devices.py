"""Where a model runs and in which precision: the one place the defaults are chosen (`resolve_device_and_dtype`)."""

from __future__ import annotations

DTYPE_NAMES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device_and_dtype(device=None, dtype=None):
    """``(torch.device, torch.dtype)`` to run a model in.

    device: ``None``/``"auto"`` (``cuda`` when available, else ``mps``, else ``cpu``), ``"cpu"``, ``"cuda"``,
    ``"cuda:N"``, ``"mps"`` or a ``torch.device``; dtype: ``None``/``"auto"`` (``bfloat16`` on a GPU that supports
    it, else ``float32``), one of `DTYPE_NAMES` (or ``fp32``/``bf16``/``fp16``/``half``) or a ``torch.dtype``.
    ``ValueError`` names what is wrong: an unknown device or dtype, a device this machine does not have, bfloat16 on
    a GPU without it.
    """
    import torch

    device = _resolve_device(device)
    if dtype is None or dtype == "auto":
        return device, (torch.bfloat16 if _supports_bfloat16(device) else torch.float32)
    chosen = dtype_from_name(dtype)
    if chosen == torch.bfloat16 and device.type != "cpu" and not _supports_bfloat16(device):
        raise ValueError(f"device {str(device)!r} does not support bfloat16: use --dtype float16 or float32")
    return device, chosen


def dtype_from_name(dtype):
    """The ``torch.dtype`` named by ``dtype``: one of `DTYPE_NAMES` (or ``fp32``/``bf16``/``fp16``/``half``, any
    case) or such a ``torch.dtype``; ``ValueError`` naming anything else."""
    import torch

    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    else:
        raise ValueError(f"dtype must be a name or a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {str(dtype)!r}: use one of {', '.join(DTYPE_NAMES)} (or auto)")
    return getattr(torch, name)


def _resolve_device(device):
    import torch

    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        chosen = device if isinstance(device, torch.device) else torch.device(str(device).strip().lower())
    except (RuntimeError, ValueError, TypeError):
        chosen = None
    if chosen is None or chosen.type not in DEVICE_TYPES:
        raise ValueError(f"unknown device {str(device)!r}: use auto, cpu, cuda, cuda:N or mps")
    if chosen.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"device {str(device)!r} is not available ({why}); use --device cpu")
        if chosen.index is not None and chosen.index >= count:
            raise ValueError(f"device {str(device)!r} is not available: {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(device)!r} is not available (no Apple GPU, or a torch built without MPS); "
                         "use --device cpu")
    return chosen


def _supports_bfloat16(device) -> bool:
    """Whether ``device`` (a GPU) runs bfloat16 well: CUDA with native support (compute capability 8 and up), MPS
    where bfloat16 tensors can be made (macOS 14 and up). The CPU is never chosen for it by default."""
    import torch

    if device.type == "cuda":
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError):
            return False
        return True
    return False
