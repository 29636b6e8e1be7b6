"""`CausalTextGenerationPipeline`: transformers' ``pipeline("text-generation")`` for CausalQwen, numbers included.

    from transformers import pipeline
    from causal_qwen import CausalTextGenerationPipeline

    generator = pipeline("text-generation", model=model, tokenizer=tokenizer,
                         pipeline_class=CausalTextGenerationPipeline)
    generator("The price is 12.5 dollars and", mode="standard", max_new_tokens=16)
    # [{'generated_text': 'The price is 12.5 dollars and ...'}]

transformers' own `TextGenerationPipeline` hands ``model.generate`` the ids alone and decodes the ids alone: a prompt's
number is read as 0 and the first ``<NUM>`` written cannot be decoded. This subclass keeps the tokenizer's
``numeric_values`` and ``numeric_strings`` beside the ids (preprocess), passes the values to ``model.generate`` with a
`text_generation.NumericTextStreamer` (forward), and writes each continuation as that streamer does, which is what
`text_generation.generate` and ``causal-qwen generate`` write (postprocess). Everything else is the base pipeline's:
``max_new_tokens``, ``return_full_text``, ``return_tensors``, ``stop_sequence``, ``prefix``, batches
(``batch_size``), chats through the tokenizer's chat template; CausalQwen's own ``generate`` keywords (``mode``,
``seed``, ``individual_scope``, ``causal_temperature``, ``individual``) pass through to ``model.generate``.

A model's ``save_pretrained(folder)`` (and so ``causal-qwen convert`` and ``train``), like
``pipe.save_pretrained(folder)``, writes the pipeline's code beside the model's and names it in the config's
``custom_pipelines``, so ``pipeline("text-generation", model=folder, trust_remote_code=True)`` picks this class.

Shape legend: B prompts in the batch, N sequences per prompt, P prompt length (padded on the tokenizer's side),
L = P + new tokens.
"""

from __future__ import annotations

import copy

from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.pipelines.text_generation import Chat, ReturnType, TextGenerationPipeline

from .generation import MODES, check_seed, row_seed
from .text_generation import NumericTextStreamer

__all__ = ["CausalTextGenerationPipeline"]


class CausalTextGenerationPipeline(TextGenerationPipeline):
    """``TextGenerationPipeline`` for a `CausalQwenForCausalLM` and its `NumericTokenizer`: the prompt's numbers go
    to ``model.generate`` as values, and ``generated_text`` holds the prompt as given and the continuation as
    ``causal-qwen generate`` writes it (each new number to the digits its scale supports; end-of-sequence tokens not
    written).

    Defaults differ from the base pipeline's in one way: no sampling is added (the base adds ``do_sample=True,
    temperature=0.7``), so ``mode`` (default ``"traditional"``, as ``model.generate``'s) decides as it does in a
    direct ``model.generate`` call; ``max_new_tokens`` defaults to 256, as in the base pipeline.
    ``num_return_sequences=n`` repeats each prompt ``n`` times in the batch (CausalQwen's ``generate`` writes one
    sequence per row): the copies differ in causal mode (row ``i`` draws from ``seed + i``) and when sampling in
    traditional mode, and are equal in standard mode. ``return_tensors=True`` gives ``generated_token_ids`` with the
    ``numeric_values`` and ``numeric_scales`` that ``tokenizer.decode`` needs to write them. In causal mode seeds
    follow the sequences of the call, not its batches: sequence ``r`` of a call (prompt ``i``'s copy ``j`` is
    ``r = i·N + j``) draws its individuals from ``seed + r``, as ``causal-qwen generate`` and
    `text_generation.generate` draw prompt ``i`` of their list, so a list of prompts writes the same texts at every
    ``batch_size``. (Traditional sampling draws a batch from torch's global generator seeded with ``seed``, as
    ``model.generate`` does, so there a batch's texts depend on what else is in it.)
    """

    _default_generation_config = GenerationConfig(max_new_tokens=256)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self.tokenizer, "num_token_id", None) != getattr(self.model.config, "num_token_id", None):
            raise TypeError(
                f"CausalTextGenerationPipeline needs the model's NumericTokenizer (the one that reads numbers as "
                f"<NUM> and a value), got {type(self.tokenizer).__name__}: load it with "
                "NumericTokenizer.from_pretrained(folder) or AutoTokenizer (with causal_qwen imported)"
            )

    def __call__(self, text_inputs, **kwargs):
        """The base pipeline's call; the sequences it writes are counted from 0 for their seeds (`_forward`)."""
        self._sequences_written = 0
        return super().__call__(text_inputs, **kwargs)

    def check_model_type(self, supported_models) -> None:
        """A CausalQwen model only (the base class checks transformers' own list, which holds no custom model)."""
        if not hasattr(self.model.config, "num_token_id") or not hasattr(self.model, "abduction"):
            raise TypeError(f"CausalTextGenerationPipeline runs a CausalQwenForCausalLM, got "
                            f"{type(self.model).__name__}: use transformers' own text-generation pipeline for it")

    def _sanitize_parameters(self, **kwargs):
        """The base's split of the options, and an unknown ``mode`` refused before any work."""
        mode = kwargs.get("mode")
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
        return super()._sanitize_parameters(**kwargs)

    def preprocess(self, prompt_text, **kwargs):
        """The base's tokenization (through the chat template for a chat), which with a `NumericTokenizer` gives
        ``numeric_values`` (1,P) and ``numeric_strings`` (1 list of P) beside the ids; cut like the ids where
        ``handle_long_generation="hole"`` cut the prompt."""
        inputs = super().preprocess(prompt_text, **kwargs)
        if "numeric_values" not in inputs:
            raise ValueError("the tokenizer gave no numeric_values: CausalTextGenerationPipeline needs CausalQwen's "
                             "NumericTokenizer")
        length = inputs["input_ids"].shape[-1]
        if length == 0:
            raise ValueError("the prompt is empty: CausalQwen continues a text of at least one token")
        if inputs["numeric_values"].shape[-1] != length:  # the prompt's head was cut off ("hole")
            inputs["numeric_values"] = inputs["numeric_values"][:, -length:]
            inputs["numeric_strings"] = [row[-length:] for row in inputs["numeric_strings"]]
        return inputs

    def _forward(self, model_inputs, **generate_kwargs):
        """``model.generate`` with the prompts' numbers and a `NumericTextStreamer`, which writes each row's text.

        Returns ``generated_sequence``, ``numeric_values``, ``numeric_scales`` (B,N,L), ``input_ids`` (B,P),
        ``prompt_text`` and ``results``: the N `text_generation.GenerationResult` of each prompt (B lists; one list
        when the pipeline runs one prompt at a time)."""
        input_ids = model_inputs["input_ids"]  # (B,P)
        attention_mask = model_inputs.get("attention_mask")  # (B,P)
        numeric_values = model_inputs["numeric_values"]  # (B,P)
        prompt_text = model_inputs["prompt_text"]
        batched = isinstance(prompt_text, list)  # several prompts collated into one batch (batch_size > 1)
        strings = model_inputs["numeric_strings"]  # one row per prompt; collated: a list of one row per prompt
        if batched:  # padded as the pipeline padded the ids, on the tokenizer's side
            strings = [_padded(item[0], input_ids.shape[1], self.tokenizer.padding_side) for item in strings]

        prefix_length = generate_kwargs.pop("prefix_length", 0)
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        if prefix_length:  # as in the base pipeline: a total length includes the prefix
            set_params = self._get_set_generation_params(generate_kwargs)
            for length, new_tokens in (("max_length", "max_new_tokens"), ("min_length", "min_new_tokens")):
                if length in set_params and new_tokens not in set_params:
                    generate_kwargs[length] = set_params[length] + prefix_length
        copies = self._take_copies(generate_kwargs)
        streamer = generate_kwargs.pop("streamer", None)
        if streamer is None:
            streamer = NumericTextStreamer(self.tokenizer, callback=_ignore, track_text=False)
        elif not (hasattr(streamer, "follow") and hasattr(streamer, "results")):
            raise ValueError(f"streamer must be a causal_qwen NumericTextStreamer (it writes the numbers), got "
                             f"{type(streamer).__name__}")

        rows = input_ids.shape[0]
        ids, mask, values = (None if t is None else t.repeat_interleave(copies, dim=0)
                             for t in (input_ids, attention_mask, numeric_values))  # (B·N,P)
        strings = [row for row in strings for _ in range(copies)]
        generate_kwargs = self._seeded_from_the_call(generate_kwargs, rows * copies)
        output = self.model.generate(input_ids=ids, attention_mask=mask, numeric_values=values, streamer=streamer,
                                     return_dict_in_generate=True, **generate_kwargs)
        prompts = self.tokenizer.batch_decode(ids, values, mask, numeric_strings=strings)  # what the model read
        results = streamer.results(prompts)
        grouped = [results[row * copies:(row + 1) * copies] for row in range(rows)]
        return {
            "generated_sequence": output.sequences.reshape(rows, copies, -1),  # (B,N,L)
            "numeric_values": output.numeric_values.reshape(rows, copies, -1),  # (B,N,L) 0 at other tokens
            "numeric_scales": output.numeric_scales.reshape(rows, copies, -1),  # (B,N,L) NaN at other tokens
            "input_ids": input_ids,
            "prompt_text": prompt_text,
            "results": grouped if batched else grouped[0],
        }

    def _seeded_from_the_call(self, generate_kwargs: dict, sequences: int) -> dict:
        """``generate_kwargs`` with causal mode's ``seed`` moved on by the sequences this call wrote in earlier
        batches, so that this batch's row ``i`` draws from ``seed + written + i`` (`generation.row_seed`); and
        those counted."""
        written = getattr(self, "_sequences_written", 0)
        self._sequences_written = written + sequences
        seed = generate_kwargs.get("seed")
        if seed is None or not written or generate_kwargs.get("mode") != "causal":
            return generate_kwargs
        check_seed(seed)
        return {**generate_kwargs, "seed": row_seed(seed, written)}

    def _take_copies(self, generate_kwargs: dict) -> int:
        """``num_return_sequences`` taken out of ``generate_kwargs`` (the rows are repeated instead)."""
        copies = self._get_set_generation_params(generate_kwargs).get("num_return_sequences") or 1
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"num_return_sequences must be a positive int, got {copies!r}")
        generate_kwargs.pop("num_return_sequences", None)
        config = generate_kwargs.get("generation_config")
        if getattr(config, "num_return_sequences", 1) != 1:
            generate_kwargs["generation_config"] = config = copy.deepcopy(config)
            config.num_return_sequences = 1
        return copies

    def postprocess(self, model_outputs, return_type=ReturnType.FULL_TEXT, clean_up_tokenization_spaces=None,
                    continue_final_message=None, skip_special_tokens=None, tools=None):
        """One record per sequence: ``generated_text`` (the prompt as given and the continuation as the streamer
        wrote it; for a chat, the messages and the reply), or with ``return_tensors`` ``generated_token_ids``,
        ``numeric_values`` and ``numeric_scales`` (L each). The base's decoding options
        (``clean_up_tokenization_spaces``, ``skip_special_tokens``) do not apply: the text is written as
        ``causal-qwen generate`` writes it."""
        prompt_text = model_outputs["prompt_text"]
        records = []
        for index, result in enumerate(model_outputs["results"]):
            if return_type == ReturnType.TENSORS:
                records.append({key: model_outputs[name][0, index].tolist() for key, name in (
                    ("generated_token_ids", "generated_sequence"), ("numeric_values", "numeric_values"),
                    ("numeric_scales", "numeric_scales"))})
                continue
            text = result.text
            if return_type == ReturnType.FULL_TEXT:
                text = _with_prompt(prompt_text, text, continue_final_message)
            records.append({"generated_text": text})
        return records


def _with_prompt(prompt_text: str | Chat, text: str, continue_final_message: bool | None):
    """The full text: the prompt and its continuation, or a chat's messages with the reply (the last message
    continued when it is the assistant's, as in the base pipeline)."""
    if isinstance(prompt_text, str):
        return prompt_text + text
    messages = list(prompt_text.messages)
    if continue_final_message is None:
        continue_final_message = messages[-1]["role"] == "assistant"
    if continue_final_message:
        return messages[:-1] + [{**messages[-1], "content": messages[-1]["content"] + text}]
    return messages + [{"role": "assistant", "content": text}]


def _padded(row: list[str], width: int, side: str) -> list[str]:
    """A prompt's ``numeric_strings`` row padded with ``""`` to the batch's ``width`` on ``side``."""
    padding = [""] * (width - len(row))
    return padding + list(row) if side == "left" else list(row) + padding


def _ignore(piece) -> None:
    """The streamer's callback when nobody reads the pieces (the texts are read at the end)."""


# `pipe.save_pretrained(folder)` names this class in the config's ``custom_pipelines`` and copies this module (and
# the modules it imports) into the folder, as `transformers.pipelines.PIPELINE_REGISTRY.register_pipeline` would
# arrange, without replacing transformers' "text-generation" task for every other model.
CausalTextGenerationPipeline._registered_impl = {
    "text-generation": {"impl": CausalTextGenerationPipeline, "pt": (AutoModelForCausalLM,), "type": "text"}
}

CUSTOM_PIPELINES = {
    "text-generation": {"impl": "text_pipeline.CausalTextGenerationPipeline", "pt": ("AutoModelForCausalLM",),
                        "type": "text"}
}
"""The ``custom_pipelines`` entry of a saved model's ``config.json`` (what the pipeline's own save writes)."""
