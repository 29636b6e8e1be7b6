"""Generation speed: Qwen's own ``generate`` (greedy) vs CausalQwen's ``model.generate`` in each mode, side by side.

    python benchmarks/generation.py [--base random:qwen2.5-0.5b] [--json] [--quick] [--repeats N] [--skip-long]

CausalQwen generates through Hugging Face's loop (``model.generate(mode=...)``, which the command line, the demo and
`generate_ids` call; methods ``generate_<mode>``, and ``generate_causal_sequence`` for causal mode with one individual
per text; ``generate_causal`` draws a fresh individual every token). For batch 1 and 4, a 64-token prompt and 64 new
tokens (``min_new_tokens`` forces the full length), every method runs once per repetition, in alternating order
(interleaved), so the noise of a shared machine spreads evenly; as with ``timeit``, the best repetition is the
estimate of the undisturbed speed (other processes only ever add time). Two figures per method and batch size:

    tokens_per_s         B·T / best time of the whole call (prefill included)
    decode_tokens_per_s  B / median decode-step time of that best call

and the ratios (CausalQwen / Qwen, the smaller over the two batch sizes):

    ratio_generate_<mode>         from tokens_per_s (the headline figure)
    decode_ratio_generate_<mode>  from decode_tokens_per_s

Qwen's ``generate`` also runs a second time as the method ``qwen_control``: ``ratio_qwen_control`` (Qwen against
itself, ideally 1) shows how far this run's ratios move by noise alone.

The per-token time at 64 vs 256 new tokens (batch 1) shows whether a step grows with the position: the
median and the minimum step time over steps 2–64 and over steps 193–256 of one 256-token run, per method.

CausalQwen shares Qwen's backbone module (`from_qwen` takes it over), so both read the same weights; the
classification head is CausalQwen's own copy of ``lm_head``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository root, for causal_qwen without an installed package
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from transformers import StoppingCriteria, StoppingCriteriaList  # noqa: E402

from causal_qwen.conversion.conversion import load_qwen_base  # noqa: E402
from causal_qwen import from_qwen  # noqa: E402

PROMPT_TOKENS = 64
NEW_TOKENS = 64
LONG_NEW_TOKENS = 256
BATCH_SIZES = (1, 4)
# "qwen_control" is Qwen's generate again, timed like every other method: its ratio to "qwen" is the run's noise.
METHODS = ("qwen", "qwen_control", "generate_standard", "generate_causal", "generate_causal_sequence",
           "generate_traditional")


class _StepClock(StoppingCriteria):
    """Records the time each token is chosen (never stops generation)."""

    def __init__(self, stamps: list[float]) -> None:
        self.stamps = stamps

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def make_prompts(batch: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 151643), (batch, length), generator=generator)  # (B,P)


def _mode_options(method: str) -> dict:
    """Greedy traditional decoding; causal mode seeded, a fresh individual per token or one per text."""
    return {
        "generate_standard": dict(mode="standard"),
        "generate_causal": dict(mode="causal", seed=0),
        "generate_causal_sequence": dict(mode="causal", seed=0, individual_scope="sequence"),
        "generate_traditional": dict(mode="traditional", do_sample=False),
    }[method]


def run_method(method: str, qwen, model, input_ids: torch.Tensor, new_tokens: int) -> tuple[float, list[float]]:
    """One call: (total seconds, step durations; the first one includes the prefill)."""
    mask = torch.ones_like(input_ids)
    start = time.perf_counter()
    stamps = [start]
    if method in ("qwen", "qwen_control"):
        generator, options = qwen, dict(do_sample=False, num_beams=1)
    else:
        generator, options = model, _mode_options(method)
    with torch.inference_mode():
        out = generator.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
            stopping_criteria=StoppingCriteriaList([_StepClock(stamps)]),
            **options,
        )
    generated = out.shape[1] - input_ids.shape[1]
    total = time.perf_counter() - start
    assert generated == new_tokens, (method, generated)
    return total, [b - a for a, b in zip(stamps, stamps[1:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="random:qwen2.5-0.5b", help="Qwen2 base (default random:qwen2.5-0.5b)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quick", action="store_true", help="1 repetition, 16 new tokens, no 256-token run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--skip-long", action="store_true", help="leave out the 256-token per-token run")
    args = parser.parse_args(argv)

    repeats = 1 if args.quick else args.repeats
    new_tokens = 16 if args.quick else NEW_TOKENS
    qwen = load_qwen_base(args.base).eval()
    model = from_qwen(qwen).eval()  # shares qwen.model
    vocab = qwen.config.vocab_size
    prompts = {batch: make_prompts(batch, PROMPT_TOKENS, vocab) for batch in BATCH_SIZES}

    # Warm-up: a short run of each method (allocations; the cached row norms / constant scales).
    for method in METHODS:
        run_method(method, qwen, model, prompts[1], 4)

    best: dict[tuple[str, int], tuple[float, list[float]]] = {}  # (total, step durations) of the best call
    for repeat in range(repeats):
        for batch in BATCH_SIZES:
            order = METHODS if repeat % 2 == 0 else tuple(reversed(METHODS))
            for method in order:
                total, durations = run_method(method, qwen, model, prompts[batch], new_tokens)
                if (method, batch) not in best or total < best[(method, batch)][0]:
                    best[(method, batch)] = (total, durations)

    tokens_per_s = {f"{m}_b{b}": b * new_tokens / best[(m, b)][0] for m in METHODS for b in BATCH_SIZES}
    decode_tokens_per_s = {
        f"{m}_b{b}": b / statistics.median(best[(m, b)][1][1:]) for m in METHODS for b in BATCH_SIZES
    }  # decode steps only: the first duration includes the prefill
    report: dict[str, object] = {
        "base": args.base,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
    }
    causal_methods = METHODS[1:]
    for method in causal_methods:
        report[f"ratio_{method}"] = min(
            tokens_per_s[f"{method}_b{b}"] / tokens_per_s[f"qwen_b{b}"] for b in BATCH_SIZES
        )
    for method in causal_methods:
        report[f"decode_ratio_{method}"] = min(
            decode_tokens_per_s[f"{method}_b{b}"] / decode_tokens_per_s[f"qwen_b{b}"] for b in BATCH_SIZES
        )
    report["tokens_per_s"] = tokens_per_s
    report["decode_tokens_per_s"] = decode_tokens_per_s

    if not (args.quick or args.skip_long):
        per_token: dict[str, dict[str, float]] = {}
        for method in METHODS:
            total, durations = run_method(method, qwen, model, prompts[1], LONG_NEW_TOKENS)
            early, late = durations[1:64], durations[192:256]
            per_token[method] = {
                "step_s_2_64": statistics.median(early),
                "step_s_193_256": statistics.median(late),
                "min_step_s_2_64": min(early),
                "min_step_s_193_256": min(late),
                "per_token_s_256_total": total / LONG_NEW_TOKENS,
                "per_token_s_64_total": best[(method, 1)][0] / NEW_TOKENS,
            }
        report["per_token_time_b1"] = per_token

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"base {args.base}: prompt {PROMPT_TOKENS} tokens, {new_tokens} new tokens, {repeats} interleaved repeat(s)")
    for batch in BATCH_SIZES:
        row = "  ".join(f"{m} {tokens_per_s[f'{m}_b{batch}']:7.2f}" for m in METHODS)
        decode_row = "  ".join(f"{m} {decode_tokens_per_s[f'{m}_b{batch}']:7.2f}" for m in METHODS)
        print(f"batch {batch}: tokens/s  {row}")
        print(f"batch {batch}: decode tokens/s  {decode_row}")
    for method in causal_methods:
        ratio, decode_ratio = report[f"ratio_{method}"], report[f"decode_ratio_{method}"]
        print(f"ratio_{method} = {ratio:.3f}   decode_ratio_{method} = {decode_ratio:.3f}")
    for method, entry in report.get("per_token_time_b1", {}).items():
        print(
            f"{method}: step median/min {entry['step_s_2_64'] * 1e3:.1f}/{entry['min_step_s_2_64'] * 1e3:.1f} ms "
            f"(steps 2-64), {entry['step_s_193_256'] * 1e3:.1f}/{entry['min_step_s_193_256'] * 1e3:.1f} ms "
            f"(steps 193-256); per token overall "
            f"{entry['per_token_s_64_total'] * 1e3:.1f} ms at 64 new, "
            f"{entry['per_token_s_256_total'] * 1e3:.1f} ms at 256 new"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
