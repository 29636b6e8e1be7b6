"""CausalQwen: Qwen2/Qwen2.5 as a causal language model that reads numbers as values, infers a Cauchy
individual representation per position (abduction) and decides tokens One-vs-Rest and numbers by Cauchy
regression (action).

The package imports lazily, so that ``causal-qwen --help`` starts without torch and transformers:
``from causal_qwen import CausalQwenForCausalLM`` (or importing any of `causal_qwen.core.configuration`,
`causal_qwen.core.modeling`, `causal_qwen.core.tokenizer`) loads them and registers the classes with ``AutoConfig``,
``AutoModelForCausalLM`` and ``AutoTokenizer``. A bare ``import causal_qwen`` registers them at once when
transformers is already imported; otherwise call `register_auto_classes` before using the Auto classes
without ``trust_remote_code``.

Layout (each folder's ``__init__`` says more; docs/design.md describes the data flow):

    core/          the model, its tokenizer, numbers and generation: what a saved model folder carries (flat)
    conversion/    Qwen2 bases to CausalQwen, calibration at conversion, finding models
    training/      fine-tuning: documents, batches, settings, the run and its output folder
    evaluation/    metrics, baselines, figures, the next-step view, the end-to-end demo
    cli.py, commands/   the ``causal-qwen`` command, one module per sub-command
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"

# Public name -> the submodule defining it (imported on first access).
_EXPORTS = {
    "CausalQwenConfig": "core.configuration",
    "CausalQwenForCausalLM": "core.modeling",
    "CausalQwenOutput": "core.modeling",
    "NumericTokenizer": "core.tokenizer",
    "NumericTextStreamer": "core.text_generation",
    "CausalTextGenerationPipeline": "core.text_pipeline",
    "from_qwen": "conversion.conversion",
}

__all__ = [*_EXPORTS, "register_auto_classes", "__version__"]


def register_auto_classes() -> None:
    """Register CausalQwen with ``AutoConfig``, ``AutoModelForCausalLM`` and ``AutoTokenizer`` (each module
    registers its class when imported; this imports the three)."""
    for module in sorted(set(_EXPORTS.values())):
        importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str) -> Any:
    """Load the public classes on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    register_auto_classes()
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (not the modules this file imports for itself)."""
    return sorted(__all__)


if "transformers" in sys.modules:  # the caller uses transformers already: register as an eager import would
    register_auto_classes()
