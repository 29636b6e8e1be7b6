"""CausalQwen: Qwen2/Qwen2.5 as a causal language model that reads numbers as values, infers a Cauchy
individual representation per position (abduction) and decides tokens One-vs-Rest and numbers by Cauchy
regression (action)."""

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .configuration import CausalQwenConfig
from .modeling import CausalQwenForCausalLM, CausalQwenOutput
from .tokenizer import NumericTokenizer

AutoConfig.register(CausalQwenConfig.model_type, CausalQwenConfig, exist_ok=True)
AutoModelForCausalLM.register(CausalQwenConfig, CausalQwenForCausalLM, exist_ok=True)
AutoTokenizer.register(CausalQwenConfig, tokenizer_class=NumericTokenizer, exist_ok=True)

__all__ = ["CausalQwenConfig", "CausalQwenForCausalLM", "CausalQwenOutput", "NumericTokenizer"]
__version__ = "0.1.0"
