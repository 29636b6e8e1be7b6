"""Generation with CausalQwen: one engine, Hugging Face's ``generate`` loop, with the decisions of
docs/design.md ("Decision rules") supplied as the step's logits.

Shape legend: B batch, P prompt length (left padded), L positions so far, C causal size.

    model.generate(input_ids, attention_mask=…, numeric_values=…, mode="standard" | "causal" | "traditional",
                   individual_scope="token" | "sequence", causal_temperature=τ, individual=ε, seed=…)

`CausalQwenForCausalLM.generate` starts a `DecodingState` and hands it to the loop as a model keyword: each step,
``prepare_inputs_for_generation`` asks it for the step's inputs (the numbers of the new tokens, and in causal mode
the individual's coordinates ``c = tan(π(ε − ½))`` and τ: a fresh ε for every position with ``individual_scope="token"``, one ε for the
whole text with ``"sequence"``), the forward pass returns the mode's decision scores as logits (a pure function of
those inputs, `decisions.decision_scores`), greedy search takes their argmax, and
``_update_model_kwargs_for_generation`` tells the state the number a ``<NUM>`` chosen there carries.

`GenerationOptions` declares every option once and checks it once; `generate_ids` is the tensor-level convenience
over ``model.generate``; `causal_qwen.core.text_generation` adds prompts in and text out.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from .decisions import cauchy_coordinates, sample_individual

logger = logging.getLogger(__name__)

MODES = ("standard", "causal", "traditional")
SCOPES = ("token", "sequence")
FINISH_REASONS = ("eos", "stop_string", "length")

__all__ = ["MODES", "SCOPES", "GenerationOptions", "DecodingState", "GeneratedBatch", "generate_ids"]


# ============================================================================================================
# The options, declared once
# ============================================================================================================
@dataclass
class GenerationOptions:
    """Every option of a generation, with its default and its check (`check`).

    mode: "standard" (argmax of the OvR probabilities), "causal" (an individual decides) or "traditional" (softmax
    over ``loc_S``). individual_scope (causal): "token" draws a fresh ε for every generated position (causal
    sampling, the default), "sequence" one ε for the whole text (a consistent individual, returned and replayable
    with ``individual``). causal_temperature: τ, the individual's spread at decision time (None: the model's
    calibrated ``config.causal_temperature``). seed: draws ε (causal) or the samples (traditional); None draws a
    seed from torch's global generator. do_sample, temperature, top_k, top_p: traditional mode only (sampling by
    default, greedy with ``temperature=0``). stop_strings: text that ends a row (kept in the text). eos_token_id,
    pad_token_id: None takes the model's.
    """

    mode: str = "standard"
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    seed: int | None = None
    individual_scope: str = "token"
    causal_temperature: float | None = None
    individual: Any = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    stop_strings: Sequence[str] | str | None = ()
    eos_token_id: int | Sequence[int] | None = None
    pad_token_id: int | None = None

    def check(self) -> "GenerationOptions":
        """Raise ``ValueError`` / ``TypeError`` naming the first bad option; fill ``do_sample``; return self."""
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; the modes are {', '.join(MODES)}")
        _check_int("max_new_tokens", self.max_new_tokens, 1)
        _check_int("min_new_tokens", self.min_new_tokens, 0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens={self.min_new_tokens} exceeds max_new_tokens={self.max_new_tokens}")
        check_seed(self.seed)
        check_causal_options(self.mode, self.individual_scope, self.causal_temperature, self.individual)
        sampling = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        given = [name for name, value in sampling.items() if value is not None]
        if self.mode != "traditional" and (given or self.do_sample):
            names = ", ".join(given or ["do_sample"])
            verb = "applies" if len(given) <= 1 else "apply"
            how = "decides by OvR argmax" if self.mode == "standard" else \
                "decides by its individuals; causal_temperature sets their spread"
            raise ValueError(f"{names} only {verb} to mode 'traditional' (mode {self.mode!r} {how})")
        if self.temperature is not None and not (
            isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None:
            _check_int("top_k", self.top_k, 1)
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        temperature = 1.0 if self.temperature is None else float(self.temperature)
        if self.do_sample is None:
            self.do_sample = self.mode == "traditional" and temperature > 0
        if self.do_sample and temperature == 0:
            raise ValueError("temperature=0 means greedy decoding; do not combine it with do_sample=True")
        self.stop_strings = as_stop_strings(self.stop_strings)
        return self

    def generation_config(self, model, tokenizer_pad_id: int | None = None) -> GenerationConfig:
        """A complete Hugging Face config for these options: the base's own sampling defaults (top-k 50, Qwen's
        repetition penalty) never apply; sampling options only when sampling."""
        eos = token_id_tuple(self.eos_token_id)
        if self.eos_token_id is None:
            eos = token_id_tuple(getattr(model.generation_config, "eos_token_id", None))
            eos = eos or token_id_tuple(model.config.eos_token_id)
        vocab = model.config.vocab_size
        for token in eos:
            if not 0 <= token < vocab:
                raise ValueError(f"eos_token_id {token} lies outside the vocabulary of {vocab} rows")
        pad = self.pad_token_id
        for fallback in (tokenizer_pad_id, getattr(model.generation_config, "pad_token_id", None)):
            pad = fallback if pad is None else pad
        pad = pad if pad is not None else (eos[0] if eos else 0)
        sampling = {}
        if self.do_sample:  # 0 and 1.0 switch Hugging Face's top-k and top-p off
            temperature = 1.0 if self.temperature is None else float(self.temperature)
            sampling = dict(temperature=temperature, top_k=self.top_k or 0, top_p=self.top_p or 1.0)
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens,
            do_sample=bool(self.do_sample),
            num_beams=1,
            repetition_penalty=1.0,
            eos_token_id=list(eos) or None,
            pad_token_id=int(pad),
            stop_strings=list(self.stop_strings) or None,
            return_dict_in_generate=True,
            **sampling,
        )

    def model_arguments(self) -> dict[str, Any]:
        """The keywords that `CausalQwenForCausalLM.generate` takes beyond Hugging Face's."""
        return dict(
            mode=self.mode,
            seed=self.seed,
            individual=self.individual,
            individual_scope=self.individual_scope,
            causal_temperature=self.causal_temperature,
        )


def check_causal_options(mode: str, scope: Any, temperature: Any, individual: Any) -> None:
    """The checks of the individual's options (shared by `GenerationOptions` and ``model.generate``)."""
    if scope not in SCOPES:
        raise ValueError(f"individual_scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(f"causal_temperature must be a finite number >= 0, got {temperature!r}")
    if temperature is not None and temperature > torch.finfo(torch.float32).max:  # τ·ρ(g) is formed in float32
        raise ValueError(f"causal_temperature={temperature!r} is beyond float32's largest number "
                         f"({torch.finfo(torch.float32).max:.3g}), in which the individual's spread is formed")
    if mode != "causal" and (individual is not None or temperature is not None):
        raise ValueError(f"individual and causal_temperature only apply to mode 'causal', not {mode!r}")
    if individual is not None and scope != "sequence":
        raise ValueError("an individual ε is one for the whole text: replay it with individual_scope='sequence'")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def token_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def as_stop_strings(stop_strings: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop_strings is None:
        return ()
    stops = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
    for stop in stops:
        if not isinstance(stop, str) or stop == "":
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
    return stops


def check_seed(seed: Any) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")


def row_seed(seed: int, row: int) -> int:
    """The seed of row ``row``'s causal draws: ``seed + row``, wrapped into torch's seed range [0, 2⁶⁴)."""
    return (seed + row) % 2**64


def draw_seed(seed: int | None) -> int:
    """``seed``, or one drawn from torch's global generator (so ``torch.manual_seed`` makes runs reproducible)."""
    check_seed(seed)
    return seed if seed is not None else int(torch.randint(0, 2**62, ()).item())


def check_individual(individual: Any, batch_size: int, causal_size: int, device) -> Tensor:
    """ε given by the caller: (C,) for every prompt or (B,C), strictly inside (0,1) → (B,C) float64."""
    individual = getattr(individual, "individual", individual)  # a GenerationResult
    try:
        epsilon = torch.as_tensor(individual, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        kind = type(individual).__name__
        raise TypeError(f"individual must be a tensor or nested list of floats, got {kind}") from error
    given_shape = tuple(epsilon.shape)
    if epsilon.dim() == 1:
        epsilon = epsilon.unsqueeze(0)
    if epsilon.dim() != 2 or epsilon.shape[-1] != causal_size or epsilon.shape[0] not in (1, batch_size):
        raise ValueError(
            f"individual has shape {given_shape}; expected ({causal_size},) or ({batch_size}, {causal_size}) "
            f"(causal size {causal_size}, {batch_size} prompt(s))"
        )
    if not bool(((epsilon > 0) & (epsilon < 1)).all()):
        raise ValueError("individual ε must lie strictly between 0 and 1 in every component")
    return epsilon.expand(batch_size, -1).contiguous().to(device)


# ============================================================================================================
# What one generation keeps between steps
# ============================================================================================================
@dataclass
class DecodingState:
    """The per-call state of ``model.generate``, handed to the loop as the model keyword ``decoding``.

    mode; num_token_id; values, scales: (B,L) the numeric value of every position so far and ``scale_Y`` of every
    generated ``<NUM>`` (the population's, which sets the precision it is written with; NaN elsewhere); pending,
    pending_scale: (B,) what a ``<NUM>`` chosen at the last step carries; scope, temperature τ, seed of causal mode;
    individual: ε (B,C) of the sequence scope (None for the token scope: its draws replay from ``seed``);
    generators: the source of ε of each row, row ``i`` seeded with ``seed + i`` (`row_seed`): a prompt writes the
    same text for its row's seed whatever else is in the batch (alone, with ``--seed`` that seed), and copies of one
    prompt in a batch draw differently.
    """

    mode: str
    num_token_id: int
    values: Tensor
    scales: Tensor
    scope: str = "token"
    temperature: float = 1.0
    seed: int | None = None
    individual: Tensor | None = None
    generators: list[torch.Generator] = field(default_factory=list)
    pending: Tensor | None = None
    pending_scale: Tensor | None = None
    _coordinates: Tensor | None = field(default=None, repr=False)

    @classmethod
    def start(cls, model, input_ids: Tensor, numeric_values: Tensor | None, mode: str, scope: str,
              temperature: float | None, individual: Any, seed: int | None) -> "DecodingState":
        """Check the individual's options and draw or check ε. input_ids, numeric_values: (B,P)."""
        check_causal_options(mode, scope, temperature, individual)
        values = model._checked_numeric_values(input_ids, numeric_values)  # warns at a <NUM> without its value
        if values is None:
            values = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)  # (B,P)
        # The prompt's numbers at the precision they came in (the tokenizer's float64: 16777217 and 1,234,567.89
        # are not float32 numbers), at least float32; the output's numeric_values give them back as they were.
        values = values.to(torch.promote_types(values.dtype, torch.float32))
        state = cls(mode=mode, num_token_id=int(model.config.num_token_id), values=values,
                    scales=torch.full_like(values, math.nan))
        if mode != "causal":
            return state
        state.temperature = float(getattr(model.config, "causal_temperature", 1.0) if temperature is None else temperature)
        state.scope, state.seed = scope, draw_seed(seed)
        batch, causal_size, device = input_ids.shape[0], model.config.causal_size, input_ids.device
        state.generators = [torch.Generator(device=device).manual_seed(row_seed(state.seed, row))
                            for row in range(batch)]
        if scope == "sequence":
            if individual is None:
                individual = state.draw(causal_size, device)  # (B,C)
            else:
                state.seed = None  # nothing is drawn: the individual given is the whole story
            state.individual = check_individual(individual, batch, causal_size, device)  # (B,C)
            state._coordinates = cauchy_coordinates(state.individual)  # (B,C)
        return state

    def next_coordinates(self, batch: int, causal_size: int, device) -> Tensor:
        """c (B,C) of the next step: the sequence's own, or a fresh draw for every position (token scope)."""
        if self.scope == "sequence":
            return self._coordinates
        return cauchy_coordinates(self.draw(causal_size, device))

    def draw(self, causal_size: int, device) -> Tensor:
        """ε (B,C): one draw from each row's generator."""
        return torch.cat([sample_individual(1, causal_size, generator, device) for generator in self.generators])

    def step_inputs(self, model, input_ids: Tensor, step_length: int) -> dict[str, Any]:
        """The forward keywords of the step that reads the last ``step_length`` of ``input_ids`` (B,L)."""
        self.extend_to(input_ids)
        inputs: dict[str, Any] = {"numeric_values": self.values[:, -step_length:], "decision": self.mode}
        whole = model.earlier_numbers_term(input_ids, self.values)  # (B,L,2) or None: the cache hides earlier numbers
        if whole is not None:
            inputs["earlier_term"] = whole[:, -step_length:]
        if self.mode == "causal":
            inputs["individual"] = self.next_coordinates(input_ids.shape[0], model.config.causal_size, input_ids.device)
            inputs["causal_temperature"] = self.temperature
        return inputs

    def remember(self, outputs) -> None:
        """The number a ``<NUM>`` chosen at the last position carries: the individual's (`decisions.individual_number`) in causal
        mode, else ``loc_Y``; its precision from the population's ``scale_Y``."""
        chosen = outputs.individual_Y if self.mode == "causal" else outputs.loc_Y  # (B,S')
        self.pending = chosen[:, -1].float()  # (B,)
        self.pending_scale = outputs.scale_Y[:, -1].float()  # (B,)

    def extend_to(self, input_ids: Tensor) -> None:
        """Give the positions ``input_ids`` has beyond ``values`` their numbers (the pending one at ``<NUM>``)."""
        new = input_ids.shape[1] - self.values.shape[1]
        if new <= 0:
            return
        is_number = input_ids[:, -new:] == self.num_token_id  # (B,new)
        pending = self.values.new_zeros(is_number.shape[0]) if self.pending is None else self.pending  # (B,)
        scale = self.scales.new_full(pending.shape, math.nan) if self.pending_scale is None else self.pending_scale
        added = torch.where(is_number, pending.unsqueeze(-1).to(self.values.dtype), 0.0)  # (B,new)
        added_scales = torch.where(is_number, scale.unsqueeze(-1).to(self.scales.dtype), math.nan)  # (B,new)
        self.values = torch.cat([self.values, added], dim=-1)
        self.scales = torch.cat([self.scales, added_scales], dim=-1)

    def add_criteria(self, generation_config, model_config, kwargs: dict):
        """Put the stopping criteria that read numbers in ``kwargs``: first `_NumbersOfNewTokens` (so that later
        criteria and the streamer see the newest token's number), then the caller's, then the one of a streamer with
        a ``follow`` method, which takes over the stop strings (found in the text, numbers written). Returns the
        generation config to use."""
        criteria = StoppingCriteriaList([_NumbersOfNewTokens(self)])
        criteria.extend(kwargs.get("stopping_criteria") or ())
        streamer = kwargs.get("streamer")
        if hasattr(streamer, "follow"):
            def option(name: str):
                if name in kwargs:
                    return kwargs[name]
                values = (getattr(config, name, None) for config in (generation_config, model_config))
                return next((value for value in values if value is not None), None)

            max_new_tokens = option("max_new_tokens")
            if max_new_tokens is None:  # a max_length given counts the prompt; none set: Hugging Face adds 20 tokens
                max_length = option("max_length")
                max_new_tokens = 20 if max_length is None else max_length - self.values.shape[1]
            stop_strings = option("stop_strings")
            criteria.append(streamer.follow(self, option("eos_token_id"), max_new_tokens, stop_strings))
            if stop_strings:  # found in the text by the streamer, not in the tokens by Hugging Face
                kwargs.pop("stop_strings", None)
                if generation_config is not None:
                    generation_config = copy.deepcopy(generation_config)
                    generation_config.stop_strings = None
                else:
                    kwargs["stop_strings"] = None  # also over the model's generation_config
        kwargs["stopping_criteria"] = criteria
        return generation_config


class _NumbersOfNewTokens(StoppingCriteria):
    """Never stops a row: gives each step's token its number (`DecodingState.extend_to`)."""

    def __init__(self, state: DecodingState) -> None:
        self.state = state

    def __call__(self, input_ids: torch.LongTensor, scores: Tensor | None, **kwargs) -> torch.BoolTensor:
        self.state.extend_to(input_ids)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # (B,)


# ============================================================================================================
# Tensors in, tensors out
# ============================================================================================================
@dataclass
class GeneratedBatch:
    """What `generate_ids` returns.

    token_ids: (B,T) generated ids, ``pad_token_id`` after a row finished; numeric_values: (B,T) the value of each
    generated ``<NUM>`` (0 elsewhere); scales: (B,T) the population's ``scale_Y`` there (NaN elsewhere); lengths:
    (B,) generated tokens per row (end of sequence included); finish_reasons: "eos" or "length" per row;
    individual: ε (B,C) of the sequence scope, else None; seed: the seed of causal mode's draws (None otherwise).
    """

    token_ids: Tensor
    numeric_values: Tensor
    scales: Tensor
    lengths: Tensor
    finish_reasons: list[str]
    individual: Tensor | None = None
    seed: int | None = None

    @property
    def steps(self) -> int:
        return int(self.token_ids.shape[1])


def generate_ids(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, numeric_values: Tensor | None = None, **options
) -> GeneratedBatch:
    """``model.generate`` from token ids (no tokenizer needed): input_ids, attention_mask, numeric_values (B,P),
    LEFT padded; ``options`` are `GenerationOptions` (stop strings need text: `text_generation.generate`)."""
    settings = GenerationOptions(**options).check()
    if settings.stop_strings:
        raise ValueError("stop strings are found in text: use text_generation.generate with a tokenizer")
    input_ids, attention_mask = check_prompt_ids(input_ids, attention_mask)
    settings.max_new_tokens = within_positions(model, attention_mask, settings.max_new_tokens)
    config = settings.generation_config(model)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, numeric_values=numeric_values,
                         generation_config=config, **settings.model_arguments())
    prompt_length = input_ids.shape[1]
    tokens = out.sequences[:, prompt_length:]  # (B,T)
    eos = torch.tensor(config.eos_token_id or [], dtype=torch.long, device=tokens.device)  # (E,)
    is_eos = torch.isin(tokens, eos)  # (B,T)
    ended = is_eos.any(dim=1)  # (B,)
    lengths = torch.where(ended, is_eos.float().argmax(dim=1) + 1, torch.full_like(ended, tokens.shape[1], dtype=torch.long))
    return GeneratedBatch(
        token_ids=tokens,
        numeric_values=out.numeric_values[:, prompt_length:],
        scales=out.numeric_scales[:, prompt_length:],
        lengths=lengths,
        finish_reasons=["eos" if done else "length" for done in ended.tolist()],
        individual=out.get("individual"),
        seed=out.get("seed"),
    )


def check_prompt_ids(input_ids: Any, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """A non-empty (B,P) batch, LEFT padded, every row with a token → (input_ids, attention_mask)."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (batch, length) tensor, got {getattr(input_ids, 'shape', input_ids)!r}")
    if input_ids.numel() == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one non-empty prompt")
    if attention_mask is None:
        return input_ids, torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, expected {tuple(input_ids.shape)}")
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError("generation needs LEFT padding: the last position of every row must be a real token")
    empty = (attention_mask.sum(-1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty (no unmasked token)")
    return input_ids, attention_mask


def within_positions(model, attention_mask: Tensor, max_new_tokens: int) -> int:
    """``max_new_tokens``, capped (with a warning) so that no row passes ``config.max_position_embeddings``;
    ``ValueError`` when a prompt alone reaches it. attention_mask: (B,P)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return max_new_tokens
    lengths = attention_mask.sum(-1)  # (B,)
    longest, row = int(lengths.max()), int(lengths.argmax())
    if longest >= limit:
        raise ValueError(f"prompt {row} is {longest:,} tokens long; the model reads at most {limit:,} positions "
                         "(config.max_position_embeddings) and needs room for new tokens: shorten the prompt")
    if longest + max_new_tokens > limit:
        logger.warning("max_new_tokens=%s would pass the model's %s positions after a %s-token prompt: "
                       "generating at most %s tokens", f"{max_new_tokens:,}", f"{limit:,}", f"{longest:,}",
                       f"{limit - longest:,}")
        return limit - longest
    return max_new_tokens
