"""The model and everything a saved model folder carries: the Cauchy math (`cauchy`), `CausalQwenConfig`
(`configuration`), the causal heads (`heads`), the reference and the vocabulary-chunked fused losses (`losses`,
`fused_ovr`), `CausalQwenForCausalLM` (`modeling`), generation in its three modes (`generation`; text through
``model.generate``: `text_generation`; transformers' text-generation pipeline over it: `text_pipeline`), the
number grammar (`numbers`) and the numeric tokenizer with its offline Qwen2.5 vocabulary (`tokenizer`,
`qwen_vocab`; `files`: atomic writes; `row_blocks`: how many positions a pass over the whole vocabulary takes at a
time).

This folder is flat on purpose, and nothing else may join it in a sub-folder. ``save_pretrained`` copies the
module defining the model, its config or its tokenizer into the saved folder, flat beside the weights, together
with every module it reaches through single-dot relative imports (``from .cauchy import ...``; transformers'
`custom_object_save` and `get_relative_imports`); ``AutoModelForCausalLM`` / ``AutoTokenizer`` with
``trust_remote_code=True`` then run that copy in a Python that never imported ``causal_qwen``. So every module
the model or the tokenizer needs lives here and imports its siblings only as ``from .x import y`` (transformers
does not follow ``from . import x``). Nothing here imports from the folders above it (conversion, training,
evaluation, commands: tests/test_layers.py); converting a Qwen base is `causal_qwen.from_qwen`, in the installed
package. This file imports nothing: a folder saved with the model never has it.
"""
