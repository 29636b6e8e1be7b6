"""Text in and out of `CausalQwenForCausalLM.generate`: the options of `generation.generate` turned into its
arguments, a streamer that writes every row's text with its numbers, and the results as `GenerationResult`.

    arguments = generate_arguments(model, tokenizer, prompts, mode="causal", seed=3, stop_strings=["."])
    streamer = NumericTextStreamer(tokenizer, callback=show)     # show(piece): a `TextPiece` as it is produced
    model.generate(**arguments, streamer=streamer, tokenizer=tokenizer)
    results = streamer.results(prompts)                          # one `GenerationResult` per prompt

gives what ``generation.generate(model, tokenizer, prompts, mode="causal", seed=3, stop_strings=["."],
callback=show)`` gives: the same checks and error messages, the same defaults (the base model's own sampling
defaults, such as Qwen's ``repetition_penalty``, do not apply), the same individual and samples for a seed, and
the same pieces, texts, numbers and finish reasons. Shape legend: B batch, P prompt length, L positions so far.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from .generation import (
    GenerationResult,
    TextPiece,
    _as_prompt_list,
    _as_stop_strings,
    _build_settings,
    _check_individual,
    _check_model,
    _decoder_for,
    _model_device,
    _number_prediction,
    _prepare_generator,
    _RowText,
    _token_id_tuple,
    _tokenizer_pad_id,
    _within_positions,
    encode_prompts,
)
from .numbers import format_prediction

__all__ = ["NumericTextStreamer", "generate_arguments"]


def generate_arguments(
    model,
    tokenizer,
    prompts: str | Sequence[str],
    *,
    mode: str = "standard",
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    seed: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_strings: str | Sequence[str] | None = (),
    individual: Any = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``model.generate`` that continue ``prompts`` as `generation.generate` does.

    The prompts are encoded as one left-padded batch (``input_ids``, ``attention_mask``, ``numeric_values`` (B,P));
    the options are checked as `generation.generate` checks them (same errors) and written into a complete
    ``generation_config`` (``return_dict_in_generate=True``, the stop strings, end-of-sequence and padding ids,
    sampling only in traditional mode with ``temperature > 0``, no top-k/top-p/repetition penalty unless given);
    ``mode``, ``seed`` and ``individual`` (ε (B,C) float64, or None) are `CausalQwenForCausalLM.generate`'s own.
    Without a seed, one is drawn from torch's global generator, as `generation.generate` draws it, so that the
    same global state gives the same individual and samples both ways.
    """
    prompts = _as_prompt_list(prompts)
    stops = _as_stop_strings(stop_strings)
    _check_model(model)
    batch = encode_prompts(tokenizer, prompts, _model_device(model))
    input_ids = batch["input_ids"]  # (B,P)
    max_new_tokens = _within_positions(model, input_ids, batch["attention_mask"], max_new_tokens)
    settings = _build_settings(
        model, mode, max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id,
        _tokenizer_pad_id(tokenizer),
    )
    if individual is not None:
        if settings.mode != "causal":
            raise ValueError(f"an individual only applies to mode 'causal', not {settings.mode!r}")
        individual = _check_individual(individual, input_ids.shape[0], model.config.causal_size, input_ids.device)
    seed = _prepare_generator(seed, input_ids.device).initial_seed()  # or one drawn from torch's generator
    sampling = {}
    if settings.do_sample:  # 0 and 1.0 switch Hugging Face's top-k (default 50) and top-p off
        sampling = dict(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=settings.min_new_tokens,
        do_sample=settings.do_sample,
        num_beams=1,
        repetition_penalty=1.0,
        eos_token_id=list(settings.eos_token_ids) or None,
        pad_token_id=settings.pad_token_id,
        stop_strings=list(stops) or None,
        return_dict_in_generate=True,
        **sampling,
    )
    return dict(batch, generation_config=config, mode=settings.mode, seed=seed, individual=individual)


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
        self._eos = set(_token_id_tuple(eos_token_id))
        self._max_new_tokens = max_new_tokens
        stops = _as_stop_strings(stop_strings)
        self._track = self.track_text or bool(stops)
        batch, self._prompt_length = state.values.shape
        decode = _decoder_for(self.tokenizer)
        self._rows = [_RowText(decode, stops) for _ in range(batch)]
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
        `generation.generate` does (end of sequence, then length, then stop string). Returns (B,) the rows whose
        text has met a stop string."""
        state = self._state
        position = input_ids.shape[1] - 1
        tokens = input_ids[:, -1].tolist()
        values = state.values[:, position].tolist()  # the numbers of the tokens just chosen (0 elsewhere)
        scales = state.scales[:, position].tolist()
        active = [not done for done in self._finished]
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
        """A generated number written to the precision of its scale (NaN in causal mode: all digits)."""
        if token != self._state.num_token_id:
            return ""
        min_decimals = getattr(self.tokenizer, "number_min_decimals", None)
        return format_prediction(value, scale, min_decimals=min_decimals)

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
        prompts = _as_prompt_list(prompts)
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
                _number_prediction(t, values[t], values[t], scales[t], strings[t])
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
