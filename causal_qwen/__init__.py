"""CausalQwen: Qwen2/Qwen2.5 as a causal language model that reads numbers as values, infers a Cauchy
individual representation per position (abduction) and decides tokens One-vs-Rest and numbers by Cauchy
regression (action)."""

from transformers import AutoConfig, AutoModelForCausalLM

from .configuration import CausalQwenConfig
from .modeling import CausalQwenForCausalLM, CausalQwenOutput

AutoConfig.register(CausalQwenConfig.model_type, CausalQwenConfig, exist_ok=True)
AutoModelForCausalLM.register(CausalQwenConfig, CausalQwenForCausalLM, exist_ok=True)

__all__ = ["CausalQwenConfig", "CausalQwenForCausalLM", "CausalQwenOutput", "NumericTokenizer"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "NumericTokenizer":
        from .tokenizer import NumericTokenizer

        return NumericTokenizer
    raise AttributeError(f"module 'causal_qwen' has no attribute {name!r}")
