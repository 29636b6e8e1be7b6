"""Prompts in, text out: `generate` and `stream` over ``model.generate``, the streamer that writes every row's text
with its numbers, and the results.

    results = generate(model, tokenizer, prompts, mode="causal", seed=3, stop_strings=["."], callback=show)

is, step for step,

    arguments = generate_arguments(model, tokenizer, prompts, mode="causal", seed=3, stop_strings=["."])
    streamer = NumericTextStreamer(tokenizer, callback=show)     # show(piece): a `TextPiece` as it is produced
    model.generate(**arguments, streamer=streamer, tokenizer=tokenizer)
    results = streamer.results(prompts)                          # one `GenerationResult` per prompt

The options are `generation.GenerationOptions`. Shape legend: B batch, P prompt length, L positions so far.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationConfig, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from . import cauchy
from .generation import (
    GenerationOptions,
    as_stop_strings,
    check_individual,
    check_prompt_ids,
    draw_seed,
    row_seed,
    token_id_tuple,
    within_positions,
)
from .numbers import find_numbers, format_prediction

logger = logging.getLogger(__name__)

INTERVAL_COVERAGES = (0.5, 0.9)

__all__ = [
    "NumberPrediction",
    "GenerationResult",
    "TextPiece",
    "NumericTextStreamer",
    "generate_arguments",
    "generate",
    "stream",
    "encode_prompts",
    "greedy_parity",
]


# ============================================================================================================
# Results
# ============================================================================================================
@dataclass
class NumberPrediction:
    """One generated ``<NUM>``: its value and (outside causal mode) its Cauchy ``Y ~ Cauchy(median, scale)``.

    token_index: position in the generated ``token_ids``; value: the number fed back. median, scale: ``loc_Y``,
    ``scale_Y``; interval_50, interval_90: central intervals ``median ± scale·tan(π·q/2)``. text: the number as
    written, to the precision the prediction carries (`numbers.format_prediction`; in causal mode the individual's
    value, written to the precision of the population's prediction).
    """

    token_index: int
    value: float
    median: float | None = None
    scale: float | None = None
    interval_50: tuple[float, float] | None = None
    interval_90: tuple[float, float] | None = None
    text: str | None = None

    @classmethod
    def of(cls, token_index: int, value: float, scale: float, text: str | None, with_interval: bool):
        if not with_interval or math.isnan(scale):
            return cls(token_index=token_index, value=value, text=text)
        loc, width = torch.tensor(value, dtype=torch.float64), torch.tensor(scale, dtype=torch.float64)
        intervals = [tuple(float(end) for end in cauchy.central_interval(loc, width, q)) for q in INTERVAL_COVERAGES]
        return cls(token_index, value, value, scale, intervals[0], intervals[1], text)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"token_index": self.token_index, "value": self.value, "text": self.text}
        if self.median is not None:
            out.update(median=self.median, scale=self.scale, interval_50=list(self.interval_50),
                       interval_90=list(self.interval_90))
        return out


@dataclass
class GenerationResult:
    """The continuation of one prompt.

    text: the generated text (numbers written with their values; ends at the end of a stop string when one was met;
    end-of-sequence tokens are not written). token_ids: generated ids, EOS included when met. numbers: one
    `NumberPrediction` per generated ``<NUM>``. individual: ε (C,) of a sequence-scope individual, else None; seed:
    the seed of this row's causal draws (the call's seed + the row's index), which replays it as a prompt alone.
    finish_reason: "eos", "stop_string" or "length".
    """

    prompt: str
    text: str
    token_ids: list[int]
    numbers: list[NumberPrediction]
    finish_reason: str
    mode: str
    individual: Tensor | None = None
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "numbers": [number.to_dict() for number in self.numbers],
            "finish_reason": self.finish_reason,
            "mode": self.mode,
            "individual": self.individual.tolist() if self.individual is not None else None,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class TextPiece:
    """A piece of streamed text for prompt ``index``; ``finished`` marks its last piece (possibly empty)."""

    index: int
    text: str
    finished: bool = False


# ============================================================================================================
# Prompts in
# ============================================================================================================
def as_prompt_list(prompts: str | Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, (bytes, bytearray)):
        raise TypeError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompt {index} must be a string, got {type(prompt).__name__}")
        if prompt == "":
            raise ValueError(f"prompt {index} is empty")
    return prompts


def encode_prompts(tokenizer, prompts: Sequence[str], device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Tokenize with LEFT padding: ``input_ids``, ``numeric_values``, ``attention_mask`` (B,P) on ``device``; the
    values at the tokenizer's precision, at least float32 (its float64 keeps 16777217, which float32 cannot)."""
    encoded = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
    batch = {key: encoded[key].to(device) for key in ("input_ids", "attention_mask")}
    values = encoded["numeric_values"] if "numeric_values" in encoded else None
    if values is None:
        values = torch.zeros_like(batch["input_ids"], dtype=torch.float32)
    batch["numeric_values"] = values.to(device=device, dtype=torch.promote_types(values.dtype, torch.float32))
    return batch


def tokenizer_pad_id(tokenizer) -> int | None:
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else getattr(getattr(tokenizer, "base", None), "pad_token_id", None)


def _check_model(model) -> None:
    for attribute in ("abduction", "action", "ovr_thresholds", "embed", "model"):
        if not hasattr(model, attribute):
            raise TypeError(f"model must be a CausalQwenForCausalLM, got {type(model).__name__}")


def generate_arguments(model, tokenizer, prompts: str | Sequence[str], **options) -> dict[str, Any]:
    """The keyword arguments of ``model.generate`` that continue ``prompts`` with `GenerationOptions` ``options``:
    the prompts as one left-padded batch (``input_ids``, ``attention_mask``, ``numeric_values`` (B,P)), a complete
    ``generation_config`` (`GenerationOptions.generation_config`) and CausalQwen's own keywords. Without a seed one is
    drawn from torch's global generator, so the same global state gives the same individual and samples."""
    settings = GenerationOptions(**options).check()
    prompts = as_prompt_list(prompts)
    _check_model(model)
    batch = encode_prompts(tokenizer, prompts, model.model.embed_tokens.weight.device)
    check_prompt_ids(batch["input_ids"], batch["attention_mask"])
    settings.max_new_tokens = within_positions(model, batch["attention_mask"], settings.max_new_tokens)
    if settings.individual is not None:  # its shape against the batch, before any work
        settings.individual = check_individual(settings.individual, len(prompts), model.config.causal_size,
                                               batch["input_ids"].device)
    settings.seed = draw_seed(settings.seed)
    config = settings.generation_config(model, tokenizer_pad_id(tokenizer))
    return dict(batch, generation_config=config, **settings.model_arguments())


def generate(
    model, tokenizer, prompts: str | Sequence[str], *, callback: Callable[[TextPiece], None] | None = None, **options
) -> list[GenerationResult]:
    """Continue each prompt (one left-padded batch, KV cache) with `GenerationOptions` ``options`` (mode, causal
    individual and temperature, sampling, stop strings, …); ``callback(piece)`` receives every `TextPiece` as it is
    produced. One `GenerationResult` per prompt."""
    prompts = as_prompt_list(prompts)
    arguments = generate_arguments(model, tokenizer, prompts, **options)
    streamer = NumericTextStreamer(tokenizer, callback=callback or (lambda piece: None),
                                   track_text=callback is not None)
    with torch.inference_mode():
        model.generate(**arguments, streamer=streamer, tokenizer=tokenizer)
    return streamer.results(prompts)


class GenerationStream:
    """Generation as an iterator of `TextPiece` (``model.generate`` runs in a worker thread); after the last piece,
    ``results`` holds one `GenerationResult` per prompt. Built by `stream`."""

    def __init__(self, model, tokenizer, prompts: str | Sequence[str], **options) -> None:
        self.prompts = as_prompt_list(prompts)
        self._arguments = generate_arguments(model, tokenizer, self.prompts, **options)  # checked now
        self._model, self._streamer = model, NumericTextStreamer(tokenizer)
        self._results: list[GenerationResult] | None = None

    @property
    def results(self) -> list[GenerationResult]:
        if self._results is None:
            raise RuntimeError("GenerationStream.results is available once the stream has been iterated to the end")
        return self._results

    def __iter__(self) -> Iterator[TextPiece]:
        if self._results is not None:
            return
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with torch.inference_mode():
                    self._model.generate(**self._arguments, streamer=self._streamer)
            except BaseException as error:  # noqa: BLE001 - handed to the iterating thread
                errors.append(error)
                self._streamer.close()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        yield from self._streamer
        worker.join()
        if errors:
            raise errors[0]
        self._results = self._streamer.results(self.prompts)


def stream(model, tokenizer, prompts: str | Sequence[str], **options) -> GenerationStream:
    """Like `generate`, but returns a `GenerationStream`: iterate it for `TextPiece` s, then read ``.results``."""
    return GenerationStream(model, tokenizer, prompts, **options)


# ============================================================================================================
# Text out
# ============================================================================================================
class _RowText:
    """The text of one row as it grows: decoded from its ids and values, cut at the first stop string.

    ``emitted`` is what has been streamed; trailing U+FFFD (an incomplete UTF-8 byte sequence) is held back.
    """

    def __init__(self, tokenizer, stop_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.ids: list[int] = []
        self.values: list[float] = []
        self.strings: list[str] = []  # each number as written (format_prediction), "" at other tokens
        self.emitted = ""
        self.checked = 0  # length of the text already searched for stop strings
        self.stopped_text: str | None = None
        self.after_number = False  # the prompt ends in a number: a number written first is set apart by a space
        self.prompt_end = ""  # the text of the prompt's last token, when it is no number

    def decode(self) -> str:
        text = self.tokenizer.decode(self.ids, numeric_values=self.values, numeric_strings=self.strings,
                                     skip_special_tokens=False, separate_numbers=True)
        if self.ids and self.ids[0] == self.tokenizer.num_token_id and (self.after_number or self._glued(text)):
            return " " + text  # else "1e-3" and a new 2.5 would read back as the one number "1e-32.5"
        return text

    def _glued(self, text: str) -> bool:
        """Whether the number ``text`` starts with would not read back as itself right after the prompt's last
        token: ``high`` and a new 10.6 would join into ``high10.6``, which reads back as text."""
        if not self.prompt_end or not self.strings[0]:
            return False
        start, end = len(self.prompt_end), len(self.prompt_end) + len(self.strings[0])
        word_end = next((k for k in range(len(self.strings[0]), len(text)) if text[k].isspace()), len(text))
        head = self.prompt_end + text[:word_end]  # a left glue reaches no further than the word
        spans = find_numbers(head, decimal_comma=getattr(self.tokenizer, "decimal_comma", False))
        return not any(span.start == start and span.end == end for span in spans)

    def push(self, token: int, value: float, track: bool, string: str = "") -> str:
        """Append one token; when tracking, return the newly visible text."""
        self.ids.append(token)
        self.values.append(value)
        self.strings.append(string)
        if not track:
            return ""
        full = self.decode()
        if self.stop_strings:
            self._find_stop(full)
        visible = self.stopped_text if self.stopped_text is not None else full.rstrip("\ufffd")
        return self._emit(visible)

    def _find_stop(self, full: str) -> None:
        """The earliest stop string in the text not yet searched; a match that overlaps a number (the "." of
        ``6.5``) does not count: a number is one value, written whole."""
        numbers: list[tuple[int, int]] | None = None  # number spans, read only once some stop string matches
        best_start, best_end = None, None
        for stop in self.stop_strings:
            start = full.find(stop, max(0, self.checked - len(stop) + 1))
            if start >= 0 and numbers is None:
                numbers = [(span.start, span.end) for span in
                           find_numbers(full, decimal_comma=getattr(self.tokenizer, "decimal_comma", False))]
            while start >= 0 and any(start < end and start + len(stop) > begin for begin, end in numbers):
                start = full.find(stop, start + 1)
            if start >= 0 and (best_start is None or start < best_start):
                best_start, best_end = start, start + len(stop)
        self.checked = len(full)
        if best_end is not None:
            self.stopped_text = full[:best_end]

    def _emit(self, visible: str) -> str:
        if not visible.startswith(self.emitted):
            logger.debug("decoded text is not prefix-stable; holding the stream until the end")
            return ""
        piece = visible[len(self.emitted) :]
        self.emitted = visible
        return piece

    @property
    def stopped(self) -> bool:
        return self.stopped_text is not None

    def final_text(self) -> str:
        return self.stopped_text if self.stopped_text is not None else self.decode()

    def finish(self) -> str:
        """The last piece: what the final text adds to what was streamed."""
        final = self.final_text()
        if not final.startswith(self.emitted):
            logger.warning("streamed text %r is not a prefix of the final text %r", self.emitted, final)
            self.emitted = final
            return ""
        return self._emit(final)


_END = object()  # closes the queue of an iterated streamer


class NumericTextStreamer(BaseStreamer):
    """A streamer for `CausalQwenForCausalLM.generate` that writes each row's text with its numbers.

    ``generate`` calls `follow` with its state (the number of every position) before decoding; from then on, each
    generated token is added to its row's text (`generation._RowText`): a ``<NUM>`` written to the precision of its
    scale (`numbers.format_prediction`), end-of-sequence tokens not written, the text cut after the first stop string
    met (a match inside a number does not count; the row stops at that token). Pieces of text (`TextPiece`, with
    ``finished`` on each row's last one) go to ``callback(piece)`` as they are produced or, without a callback, to a
    queue that iterating the streamer reads (as with `transformers.TextIteratorStreamer`: run generate in another
    thread). ``track_text=False`` decodes each row once at the end (only the finished pieces are sent); stop strings
    turn it on. After generate, `results` gives one `GenerationResult` per row.

    Rows end at an end-of-sequence id, at a stop string or after ``max_new_tokens``; a row stopped by another
    stopping criterion is not seen as finished.
    """

    def __init__(
        self,
        tokenizer,
        callback: Callable[[TextPiece], None] | None = None,
        track_text: bool = True,
        timeout: float | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.callback = callback
        self.track_text = track_text
        self.timeout = timeout
        self._queue: queue.Queue | None = queue.Queue() if callback is None else None
        self._state = None

    # ---- set up by generate ----------------------------------------------------------------------------------
    def follow(
        self, state, eos_token_id: int | Sequence[int] | None, max_new_tokens: int | None, stop_strings=None
    ) -> StoppingCriteria:
        """Start a generation: ``state`` holds ``values``, ``scales`` (B,L) of every position (the newest included
        when a step's criteria run), ``num_token_id``, ``mode`` and ``individual``. Returns the stopping criterion
        that reads each step (it must run after the one that extends the state)."""
        self._state = state
        self._eos = set(token_id_tuple(eos_token_id))
        self._max_new_tokens = max_new_tokens
        stops = as_stop_strings(stop_strings)
        self._track = self.track_text or bool(stops)
        batch, self._prompt_length = state.values.shape
        self._rows = [_RowText(self.tokenizer, stops) for _ in range(batch)]
        self._ids: list[list[int]] = [[] for _ in range(batch)]  # generated ids per row, end-of-sequence included
        self._finished = [False] * batch
        self._reasons: list[str | None] = [None] * batch
        self._reported = [False] * batch
        self._pieces: list[TextPiece] = []  # produced by the step being read, sent by `put`
        self._steps = 0
        return _StopAtStopStrings(self)

    # ---- one step, read by the stopping criterion ------------------------------------------------------------
    def _read_step(self, input_ids: torch.LongTensor) -> torch.BoolTensor:
        """Add the newest token of every unfinished row (``input_ids`` (B,L)) to its text; finish rows as
        the loop does (end of sequence, then length, then stop string). Returns (B,) the rows whose
        text has met a stop string."""
        state = self._state
        position = input_ids.shape[1] - 1
        tokens = input_ids[:, -1].tolist()
        values = state.values[:, position].tolist()  # the numbers of the tokens just chosen (0 elsewhere)
        scales = state.scales[:, position].tolist()
        active = [not done for done in self._finished]
        if self._steps == 0 and position >= 1:  # the prompt's last token, for a number written right after it
            for row, previous in enumerate(input_ids[:, position - 1].tolist()):
                self._rows[row].after_number = previous == state.num_token_id
                if not self._rows[row].after_number:
                    self._rows[row].prompt_end = self.tokenizer.decode([previous], skip_special_tokens=False)
        self._steps += 1
        for row in range(len(tokens)):
            if active[row]:
                self._ids[row].append(tokens[row])
                if tokens[row] in self._eos:
                    self._finish(row, "eos")
        if self._max_new_tokens is not None and self._steps >= self._max_new_tokens:
            for row in range(len(tokens)):
                self._finish(row, "length")
        for row, text in enumerate(self._rows):
            if not active[row]:
                continue
            if tokens[row] not in self._eos:
                string = self._number_text(tokens[row], values[row], scales[row])
                piece = text.push(tokens[row], values[row], self._track, string)
                if piece:
                    self._pieces.append(TextPiece(row, piece))
            if text.stopped:
                self._finish(row, "stop_string")
        self._report_finished()
        return torch.tensor([text.stopped for text in self._rows], dtype=torch.bool, device=input_ids.device)

    def _number_text(self, token: int, value: float, scale: float) -> str:
        """A generated number written to the precision of the prediction's scale."""
        if token != self._state.num_token_id:
            return ""
        min_decimals = getattr(self.tokenizer, "number_min_decimals", None)
        # as tokenizer.decode writes it: "6.5" is text to a decimal-comma tokenizer, "6,5" its number
        return format_prediction(value, scale, min_decimals=min_decimals,
                                 decimal_comma=getattr(self.tokenizer, "decimal_comma", False))

    def _finish(self, row: int, reason: str) -> None:
        if not self._finished[row]:
            self._finished[row] = True
            self._reasons[row] = reason

    def _report_finished(self) -> None:
        for row, text in enumerate(self._rows):
            if self._finished[row] and not self._reported[row]:
                self._reported[row] = True
                self._pieces.append(TextPiece(row, text.finish() if self._track else "", finished=True))

    # ---- BaseStreamer ----------------------------------------------------------------------------------------
    def put(self, value: torch.Tensor) -> None:
        """Send the pieces of the step just read (the first call, with the prompt, has none)."""
        if self._state is None:
            raise RuntimeError("NumericTextStreamer streams CausalQwenForCausalLM.generate (it reads its numbers)")
        self._send()

    def end(self) -> None:
        """Finish the rows still open (after ``max_new_tokens``), send the last pieces, close the queue."""
        for row in range(len(self._rows)):
            self._finish(row, "length")
        self._report_finished()
        self._send()
        if self._queue is not None:
            self._queue.put(_END)

    def close(self) -> None:
        """End the iteration now (``generate`` failed): an iterating thread stops waiting."""
        if self._queue is not None:
            self._queue.put(_END)

    def _send(self) -> None:
        pieces, self._pieces = self._pieces, []
        for piece in pieces:
            if self.callback is not None:
                self.callback(piece)
            else:
                self._queue.put(piece)

    def __iter__(self) -> "NumericTextStreamer":
        if self._queue is None:
            raise TypeError("a NumericTextStreamer with a callback sends its pieces there; it cannot be iterated")
        return self

    def __next__(self) -> TextPiece:
        piece = self._queue.get(timeout=self.timeout)
        if piece is _END:
            raise StopIteration
        return piece

    # ---- after generate ------------------------------------------------------------------------------------
    def results(self, prompts: str | Sequence[str]) -> list[GenerationResult]:
        """One `GenerationResult` per row of the generation followed (``prompts``: the texts of its rows)."""
        if self._state is None:
            raise RuntimeError("results are available after a CausalQwenForCausalLM.generate that used this streamer")
        prompts = as_prompt_list(prompts)
        state = self._state
        if len(prompts) != len(self._rows):
            raise ValueError(f"{len(prompts)} prompt(s) for a generation of {len(self._rows)} rows")
        results = []
        for row, text in enumerate(self._rows):
            ids = self._ids[row]
            values = state.values[row, self._prompt_length :].tolist()  # (T,) the generated numbers, 0 elsewhere
            scales = state.scales[row, self._prompt_length :].tolist()  # (T,) their scales, NaN elsewhere
            strings = text.strings + [None] * (len(ids) - len(text.strings))  # (T,) an end of sequence has none
            numbers = [
                NumberPrediction.of(t, values[t], scales[t], strings[t], with_interval=state.mode != "causal")
                for t in range(len(ids))
                if ids[t] == state.num_token_id
            ]
            results.append(
                GenerationResult(
                    prompt=prompts[row],
                    text=text.emitted if self._track else text.final_text(),
                    token_ids=list(ids),
                    numbers=numbers,
                    finish_reason=self._reasons[row] or "length",
                    mode=state.mode,
                    individual=None if state.individual is None else state.individual[row].clone(),
                    seed=row_seed(state.seed, row) if state.mode == "causal" and state.seed is not None else None,
                )
            )
        return results


class _StopAtStopStrings(StoppingCriteria):
    """The stopping criterion of a `NumericTextStreamer`: reads each step into the rows' texts; stops the rows whose
    text met a stop string."""

    def __init__(self, streamer: NumericTextStreamer) -> None:
        self.streamer = streamer

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor | None, **kwargs) -> torch.BoolTensor:
        return self.streamer._read_step(input_ids)  # (B,)


# ============================================================================================================
# Parity with Qwen's own generate (used by `causal-qwen compare`)
# ============================================================================================================
PARITY_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hello",
)


def greedy_parity(
    base_qwen_model, causal_model, tokenizer, prompts: Sequence[str] = PARITY_PROMPTS, max_new_tokens: int = 32
) -> dict[str, int]:
    """Greedy ``Qwen2ForCausalLM.generate`` vs greedy traditional CausalQwen, token for token.

    Runs every prompt alone and all prompts as one left-padded batch. Counts, over Qwen's generated tokens (up to
    and including its first EOS), how many CausalQwen reproduces at the same place:
    ``{"greedy_match_tokens": …, "greedy_total_tokens": …}``. Prompts should hold no numbers (Qwen would read
    ``<NUM>`` without its value).
    """
    prompts = as_prompt_list(list(prompts))
    eos = token_id_tuple(getattr(base_qwen_model.generation_config, "eos_token_id", None))
    eos = eos or token_id_tuple(base_qwen_model.config.eos_token_id)
    options = GenerationOptions(mode="traditional", temperature=0, max_new_tokens=max_new_tokens,
                                eos_token_id=list(eos)).check()
    config: GenerationConfig = options.generation_config(base_qwen_model, tokenizer_pad_id(tokenizer))
    device = causal_model.model.embed_tokens.weight.device
    match = total = 0
    for group in [[prompt] for prompt in prompts] + ([prompts] if len(prompts) > 1 else []):
        batch = encode_prompts(tokenizer, group, device)
        if bool((batch["numeric_values"] != 0).any()):
            logger.warning("parity prompt(s) %r hold numbers: Qwen reads <NUM> without its value", group)
        length = batch["input_ids"].shape[1]
        with torch.inference_mode():
            reference = base_qwen_model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                                 generation_config=config).sequences[:, length:]  # (B,T')
            ours = causal_model.generate(**batch, generation_config=config, mode="traditional").sequences[:, length:]
        for expected, got in zip(reference.tolist(), ours.tolist()):
            ends = [t + 1 for t, token in enumerate(expected) if token in eos]
            count = ends[0] if ends else len(expected)
            total += count
            match += sum(1 for t in range(count) if t < len(got) and got[t] == expected[t])
    logger.info("greedy parity: %d of %d tokens match", match, total)
    return {"greedy_match_tokens": match, "greedy_total_tokens": total}
