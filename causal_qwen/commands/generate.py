"""``causal-qwen generate``: continue prompts in standard, causal or traditional mode; stream the text."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..core.files import write_text_atomic
from ..core.numbers import format_interval, format_like, format_number
from .arguments import non_negative_float, non_negative_int, positive_int, probability
from .eval import add_model_arguments, check_writable_file, load_model, placement

# The modes of `causal_qwen.core.generation.MODES` (spelled here so that --help imports no torch).
MODES = ("standard", "causal", "traditional")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text (standard, causal or traditional mode)",
        description="Continue each PROMPT with a CausalQwen model. Modes: standard (the model's own best decision: "
        "deterministic argmax of the One-vs-Rest probabilities), causal (an individual decides: with "
        "--individual-scope token, the default, a fresh individual for every token, i.e. sampling that follows the "
        "model's uncertainty; with --individual-scope sequence one individual for the whole text, saved with "
        "--save-individual and replayed on other prompts with --individual), traditional (the base's softmax over "
        "loc_S with --temperature/--top-k/--top-p; --temperature 0 is greedy). Numbers are generated as values. "
        "Text is printed as it is produced.",
    )
    add_model_arguments(parser)
    parser.add_argument("--mode", default="standard", help=f"one of {', '.join(MODES)} (default: standard)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate at most (default 64)")
    parser.add_argument("--min-new-tokens", type=non_negative_int, default=0, help="no end-of-sequence before this many tokens")
    parser.add_argument("--seed", type=int, default=None, help="seed of the individuals (causal; prompt i draws from SEED + i) or of sampling")
    parser.add_argument("--temperature", type=non_negative_float, default=None,
                        help="traditional mode: softmax temperature (default 1, sampling; 0 is greedy decoding)")
    parser.add_argument("--top-k", type=positive_int, default=None, help="traditional mode: keep the k most likely tokens")
    parser.add_argument("--top-p", type=probability, default=None, help="traditional mode: nucleus probability")
    parser.add_argument("--stop", action="append", default=None, metavar="STR", help="stop string (repeatable)")
    parser.add_argument("--individual-scope", default=None, choices=("token", "sequence"),
                        help="causal mode: a fresh individual per token (token, the default) or one per text "
                        "(sequence)")
    parser.add_argument("--causal-temperature", type=non_negative_float, default=None, metavar="TAU",
                        help="causal mode: the individual's spread τ (default: the model's calibrated value)")
    parser.add_argument("--individual", default=None, metavar="FILE",
                        help="causal mode, sequence scope: replay ε from this JSON file")
    parser.add_argument("--save-individual", default=None, metavar="FILE",
                        help="causal mode, sequence scope: write the individuals ε to FILE (JSON)")
    parser.add_argument("--chat", action="store_true",
                        help="send each PROMPT as a user's message through the model's chat template (an Instruct "
                        "base's, kept at conversion) and print the reply")
    parser.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system message first")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of streaming text")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt(s), generated as one left-padded batch (one that starts "
                        "with '-', such as -3.5e2, goes after '--')")
    parser.set_defaults(func=run)


def read_individual(path: str) -> list[list[float]]:
    """ε rows from a JSON file: ``{"individuals": [[...], ...]}`` (as ``--save-individual`` writes), a list of
    floats, a list of lists, or the output of ``generate --json`` (its ``individual`` fields)."""
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"individual file {path!r} is a folder; name the JSON file --save-individual wrote")
    if not file.is_file():
        raise FileNotFoundError(f"individual file {path!r} does not exist")
    try:
        data: Any = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"individual file {path!r} is not valid JSON ({error})") from error
    if isinstance(data, dict):
        data = data.get("individuals", data.get("individual"))
    if isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        data = [item.get("individual") for item in data]
    if isinstance(data, list) and data and all(isinstance(x, (int, float)) for x in data):
        data = [data]
    if not (isinstance(data, list) and data and all(isinstance(row, list) and row for row in data)):
        raise ValueError(f"individual file {path!r} holds no individual (expected a list of floats per prompt)")
    for index, row in enumerate(data):
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in row):
            raise ValueError(f"individual file {path!r}: individual {index} holds a value that is not a number "
                             "(expected a list of floats strictly between 0 and 1 per prompt)")
    return data


def _individual_argument(path: str | None, num_prompts: int):
    if path is None:
        return None
    rows = read_individual(path)
    if len(rows) == 1:
        return rows[0]
    if len(rows) != num_prompts:
        raise ValueError(f"individual file {path!r} holds {len(rows)} individuals for {num_prompts} prompt(s)")
    return rows


def chat_prompts(tokenizer, prompts: list[str], system: str | None = None) -> list[str]:
    """Each prompt as one user message (after the ``system`` message, if any) rendered by the tokenizer's chat
    template, ready for the assistant's reply (``add_generation_prompt=True``)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat: the model's tokenizer has no chat template (an Instruct base's template is kept "
                         "at conversion; this model's base had none): write the prompt as the model expects it")
    head = [{"role": "system", "content": system}] if system is not None else []
    return [tokenizer.apply_chat_template(head + [{"role": "user", "content": prompt}], tokenize=False,
                                          add_generation_prompt=True) for prompt in prompts]


def _format_numbers(result) -> list[str]:
    """The numbers of a `causal_qwen.core.text_generation.GenerationResult`, one line each."""
    lines = []
    for number in result.numbers:
        written = number.text or format_number(number.value)
        line = f"  number at token {number.token_index}: {written}"
        if number.median is not None:  # the interval's ends at the precision the number is written with
            line += (f"  (median {format_like(number.median, written)}; 50% {format_interval(number.interval_50, written)}; "
                     f"90% {format_interval(number.interval_90, written)})")
        lines.append(line)
    return lines


def run(args: argparse.Namespace) -> int:
    if args.mode not in MODES:
        raise ValueError(f"unknown mode {args.mode!r}; the modes are {', '.join(MODES)}")
    causal_options = (args.individual, args.save_individual, args.causal_temperature, args.individual_scope)
    if any(option is not None for option in causal_options) and args.mode != "causal":
        raise ValueError("--individual, --save-individual, --individual-scope and --causal-temperature apply to "
                         "--mode causal only")
    if (args.individual or args.save_individual) and args.individual_scope != "sequence":
        raise ValueError("--individual and --save-individual need --individual-scope sequence (one ε per text; "
                         "a token-scope run replays from its --seed)")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.system is not None and not args.chat:
        raise ValueError("--system applies to --chat only")
    check_writable_file(args.save_individual)  # before any work: not after the text is generated
    for index, prompt in enumerate(args.prompts):
        if prompt == "" and not args.chat:  # --chat wraps even an empty message in the template's markup
            raise ValueError(f"prompt {index} is empty (with --chat an empty message is sent as one)")
    import torch

    from ..core.generation import GenerationOptions
    from ..core.text_generation import NumericTextStreamer, generate_arguments

    options = dict(
        mode=args.mode,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        stop_strings=tuple(args.stop or ()),
        **({"individual_scope": args.individual_scope or "token", "causal_temperature": args.causal_temperature}
           if args.mode == "causal" else {}),
    )
    GenerationOptions(**options).check()  # --top-k in standard mode, --min-new-tokens past the maximum: before loading
    placement(args)  # a bad --device/--dtype fails before any file is read
    individual = _individual_argument(args.individual, len(args.prompts))
    model, tokenizer = load_model(args)
    # What the model reads, and what the streamed text shows before each continuation: the prompt itself, or with
    # --chat the user's message on its own line (the template's markup is not shown).
    prompts = chat_prompts(tokenizer, args.prompts, args.system) if args.chat else list(args.prompts)
    shown_prompts = [prompt + "\n" for prompt in args.prompts] if args.chat else list(args.prompts)

    single = len(args.prompts) == 1
    finished_texts: dict[int, str] = {}
    started = []

    def show(piece) -> None:
        if single:
            if not started:  # the prompt, once generation is under way
                started.append(True)
                sys.stdout.write(shown_prompts[0])
            sys.stdout.write(piece.text)
            if piece.finished:
                sys.stdout.write("\n")
            sys.stdout.flush()
            return
        finished_texts[piece.index] = finished_texts.get(piece.index, "") + piece.text
        if piece.finished:
            print(f"[{piece.index}] {shown_prompts[piece.index]}{finished_texts[piece.index]}", flush=True)

    arguments = generate_arguments(model, tokenizer, prompts, individual=individual, **options)
    streamer = NumericTextStreamer(tokenizer, callback=None if args.json else show, track_text=not args.json)
    with torch.inference_mode():
        model.generate(**arguments, streamer=streamer, tokenizer=tokenizer)
    results = streamer.results(prompts)
    if args.save_individual:
        rows = [result.individual.tolist() for result in results]
        Path(args.save_individual).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.save_individual), json.dumps({"individuals": rows}))
        print(f"individuals written to {args.save_individual}", file=sys.stderr)
    if args.json:
        print(json.dumps([result.to_dict() for result in results], indent=2, ensure_ascii=False))
        return 0
    for index, result in enumerate(results):
        lines = _format_numbers(result)
        if lines:
            print(f"numbers of prompt {index}:" if not single else "numbers:")
            print("\n".join(lines))
    return 0
