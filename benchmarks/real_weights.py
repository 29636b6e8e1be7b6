"""CausalQwen's own decisions on real Qwen weights: the calibrated default against the seeds' literal setting.

    python benchmarks/real_weights.py --base PATH.gguf [--json] [--quick] [--skip-finetune]

``PATH`` is a real Qwen2.5 checkpoint (``scripts/fetch_real_qwen.py`` fetches Qwen2.5-Coder-0.5B-Instruct).
Every figure is measured in this one run, for the default conversion (``ovr_calibration="base_agreement"``) and
for the seeds' literal setting (``ovr_calibration="none"``: ``γ0 = 10``, ``b_noise = 0.1``, ``C = 100``):

  logits_max_abs_diff          max |loc_S − Qwen logits| on held-out text before any number (0: traditional is Qwen)
  standard_agreement           share of held-out positions where argmax_k P_k = Qwen's greedy token
  causal_agreement             the same for the causal decision with the individual at its median (u = loc_U)
  ovr_ppl_ratio                OvR-normalised perplexity exp(mean −log(P_t / Σ_k P_k)) over the softmax perplexity
  ovr_prob_sum_mean            mean Σ_k P_k
  standard_generation_match    mean common prefix of standard-mode and Qwen greedy generation, share of 32 tokens
  causal_fluency_ratio         Qwen's perplexity of causal sampling's continuations (a fresh individual per token at
                               the calibrated τ; 10 prompts × 8 continuations, 32 tokens) over its perplexity of its own
                               ancestral samples at temperature 1 on the same prompts
  causal_distinct2_ratio       distinct-2 (unique bigrams / bigrams, pooled over a prompt's 8 continuations, averaged
                               over prompts) of causal mode over that of Qwen's samples
  standard_speed_ratio         standard-mode tokens/s over Qwen's greedy ``generate`` (batch 1, 32 new tokens,
                               best of interleaved repeats)
  finetune_*                   from `real_weights_finetune.finetune_figures` (seattle-weather, >= 60 steps of 8)

Held-out text: the odd-numbered topics of Python's reference documentation (`calibration.held_out_texts`); the
calibration reads the even-numbered ones. `benchmarks/individual.py` measures the individual itself (both scopes,
consistency, replay, the diversity/fluency frontier).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from causal_qwen.conversion import calibration  # noqa: E402
from causal_qwen.conversion.conversion import load_qwen_base  # noqa: E402
from causal_qwen.core.generation import generate_ids  # noqa: E402
from causal_qwen.evaluation.evaluation import token_totals  # noqa: E402
from causal_qwen import from_qwen  # noqa: E402

GENERATION_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Question: what is 17 + 25? Answer:",
    "The item costs 99.99 dollars and the tax is",
    "Water boils at a temperature of",
    "import numpy as np\n\n# compute the mean of an array\n",
    "The first president of the United States was",
    "In 2020 the population of the city was about",
)
CAUSAL_PROMPTS = GENERATION_PROMPTS + ("Once upon a time, there was a", "The best way to learn a language is")
NEW_TOKENS = 32
INDIVIDUALS = 8
HELD_OUT_POSITIONS = 1024


# ---------------------------------------------------------------------------------------------------------------
# Conversion figures on held-out text
# ---------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def held_out_windows(tokenizer, positions: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, values) windows of 96 tokens from the held-out documentation topics, ``positions`` in all."""
    windows, count = [], 0
    for text in calibration.held_out_texts():
        encoded = tokenizer([text[: calibration.TEXT_CHARS]], return_tensors="pt")
        ids, values = encoded["input_ids"][0][: calibration.WINDOW + 1], encoded["numeric_values"][0][: calibration.WINDOW + 1]
        if len(ids) < 8:
            continue
        windows.append((ids, values))
        count += len(ids) - 1
        if count >= positions:
            break
    return windows


@torch.no_grad()
def conversion_figures(qwen, model, windows) -> dict:
    totals = None
    max_diff = 0.0
    for ids, values in windows:
        out = model(input_ids=ids[None, :-1], numeric_values=values[None, :-1].float())
        clean = (torch.cumsum((ids[:-1] == model.config.num_token_id).long(), 0) == 0)  # (S,) before any number
        logits = qwen(input_ids=ids[None, :-1]).logits[0].float()  # (S,V)
        if bool(clean.any()):
            max_diff = max(max_diff, float((out.loc_S[0].float() - logits)[clean].abs().max()))
        part = token_totals(model, out.loc_U[0], out.scale_U[0], ids[1:], chunk_positions=None)
        if totals is None:
            totals = part
        else:
            totals.add(part)
    figures = totals.metrics()
    return {
        "logits_max_abs_diff": max_diff,
        "standard_agreement": figures["standard_agreement"],
        "causal_agreement": figures["causal_agreement"],
        "ovr_ppl_ratio": figures["ovr_ppl_ratio"],
        "ovr_prob_sum_mean": figures["ovr_prob_sum"],
        "softmax_perplexity": figures["perplexity"],
        "ovr_perplexity": figures["ovr_perplexity"],
        "held_out_positions": figures["token_count"],
    }


# ---------------------------------------------------------------------------------------------------------------
# Generation figures
# ---------------------------------------------------------------------------------------------------------------
def _prompt_ids(tokenizer, prompt: str) -> torch.Tensor:
    return tokenizer([prompt], return_tensors="pt")["input_ids"]  # (1,P)


@torch.no_grad()
def end_ids(qwen) -> list[int]:
    """The base's end-of-text ids: both sides ban them until ``NEW_TOKENS`` are written (``min_new_tokens``),
    so the comparison never stops one side early."""
    eos = qwen.generation_config.eos_token_id
    return [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def qwen_greedy(qwen, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    out = qwen.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, pad_token_id=0, eos_token_id=end_ids(qwen),
    )
    return out[0, ids.shape[1]:]


def standard_generation_match(qwen, model, tokenizer, prompts=GENERATION_PROMPTS) -> dict:
    shares = []
    for prompt in prompts:
        ids = _prompt_ids(tokenizer, prompt)
        reference = qwen_greedy(qwen, ids, NEW_TOKENS)
        ours = generate_ids(model, ids, mode="standard", max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                            eos_token_id=end_ids(qwen)).token_ids[0]
        same = (reference[:NEW_TOKENS] == ours[:NEW_TOKENS]).long()
        shares.append(int(same.cumprod(0).sum()) / NEW_TOKENS)
    return {"standard_generation_match": sum(shares) / len(shares), "standard_generation_prefixes": shares}


@torch.no_grad()
def base_perplexity(qwen, prompt_ids: torch.Tensor, continuations: list[torch.Tensor], batch_size: int = 8) -> float:
    """Qwen's perplexity of continuation tokens given the prompt (teacher forced), pooled over continuations.

    Continuations of equal length are scored together, ``batch_size`` at a time, and the vocabulary head is applied
    only at the positions that predict a continuation token (the figure is the one-at-a-time figure)."""
    nll, count = 0.0, 0
    start = prompt_ids.shape[1] - 1  # the position that predicts the first continuation token
    by_length: dict[int, list[torch.Tensor]] = {}
    for continuation in continuations:
        by_length.setdefault(len(continuation), []).append(continuation)
    for length, group in by_length.items():
        if length == 0:
            continue
        for first in range(0, len(group), batch_size):
            part = torch.stack(group[first : first + batch_size])  # (b,T)
            full = torch.cat([prompt_ids[:1].expand(len(part), -1), part], dim=1)  # (b,P+T)
            hidden = qwen.model(input_ids=full).last_hidden_state[:, start:-1]  # (b,T,H)
            log_probs = torch.log_softmax(qwen.lm_head(hidden).float(), dim=-1)  # (b,T,V)
            nll -= float(log_probs.gather(2, part[..., None]).sum())
            count += part.numel()
    return math.exp(nll / max(count, 1))


def distinct2(continuations: list[torch.Tensor]) -> float:
    bigrams = [tuple(pair) for c in continuations for pair in zip(c.tolist(), c.tolist()[1:])]
    return len(set(bigrams)) / max(len(bigrams), 1)


PLAIN = {}


def plain_tokenizer(base: str):
    """The base's own tokenizer (numbers as digits), for scoring text with Qwen."""
    from transformers import AutoTokenizer

    path = Path(base)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(base)


def _plain_ids(tokenizer, model_ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Generated ids with any ``<NUM>`` written out as digits and re-tokenized, so Qwen can score them."""
    if not bool((model_ids == tokenizer.num_token_id).any()):
        return model_ids
    text = tokenizer.decode(model_ids.tolist(), numeric_values=values.tolist())
    return PLAIN["tokenizer"](text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]


@torch.no_grad()
def causal_figures(qwen, model, tokenizer, prompts=CAUSAL_PROMPTS, individuals: int = INDIVIDUALS, seed: int = 0) -> dict:
    """Causal sampling (a fresh individual per token, the calibrated τ) against Qwen's samples at temperature 1:
    the base's perplexity of the continuations and distinct-2. `benchmarks/individual.py` measures both scopes of
    the individual, its consistency, replay and frontier."""
    ours_ppl, qwen_ppl, ours_d2, qwen_d2 = [], [], [], []
    for index, prompt in enumerate(prompts):
        ids = _prompt_ids(tokenizer, prompt)
        batch = ids.expand(individuals, -1)
        out = generate_ids(model, batch, mode="causal", seed=seed * 1000 + index, max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, eos_token_id=end_ids(qwen))
        ours = [_plain_ids(tokenizer, out.token_ids[i], out.numeric_values[i]) for i in range(individuals)]
        torch.manual_seed(seed * 1000 + index)
        sampled = qwen.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=NEW_TOKENS,
                                min_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                pad_token_id=0, eos_token_id=end_ids(qwen))[:, ids.shape[1]:]
        theirs = [sampled[i] for i in range(individuals)]
        ours_ppl.append(base_perplexity(qwen, ids, ours))
        qwen_ppl.append(base_perplexity(qwen, ids, theirs))
        ours_d2.append(distinct2(ours))
        qwen_d2.append(distinct2(theirs))
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    return {
        "causal_temperature": model.config.causal_temperature,
        "causal_fluency_ratio": geo(ours_ppl) / geo(qwen_ppl),
        "causal_distinct2_ratio": (sum(ours_d2) / len(ours_d2)) / (sum(qwen_d2) / len(qwen_d2)),
        "causal_perplexity": geo(ours_ppl),
        "qwen_sample_perplexity": geo(qwen_ppl),
        "causal_distinct2": sum(ours_d2) / len(ours_d2),
        "qwen_sample_distinct2": sum(qwen_d2) / len(qwen_d2),
    }


def standard_speed_ratio(qwen, model, tokenizer, repeats: int = 3) -> dict:
    ids = _prompt_ids(tokenizer, GENERATION_PROMPTS[0])
    best = {"qwen": math.inf, "standard": math.inf}
    for _ in range(repeats):
        for method in best:
            start = time.perf_counter()
            if method == "qwen":
                qwen_greedy(qwen, ids, NEW_TOKENS)
            else:
                generate_ids(model, ids, mode="standard", max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             eos_token_id=end_ids(qwen))
            best[method] = min(best[method], time.perf_counter() - start)
    return {"standard_speed_ratio": best["qwen"] / best["standard"],
            "qwen_tokens_per_s": NEW_TOKENS / best["qwen"], "standard_tokens_per_s": NEW_TOKENS / best["standard"]}


# ---------------------------------------------------------------------------------------------------------------
def setting_figures(qwen, model, tokenizer, windows, quick: bool) -> dict:
    figures = {}
    started = time.perf_counter()
    figures.update(conversion_figures(qwen, model, windows))
    figures.update(standard_generation_match(qwen, model, tokenizer, GENERATION_PROMPTS[:2] if quick else GENERATION_PROMPTS))
    figures.update(causal_figures(qwen, model, tokenizer, CAUSAL_PROMPTS[:2] if quick else CAUSAL_PROMPTS,
                                  individuals=2 if quick else INDIVIDUALS))
    figures.update(standard_speed_ratio(qwen, model, tokenizer, repeats=1 if quick else 3))
    figures["seconds"] = time.perf_counter() - started
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a real Qwen2.5 checkpoint: .gguf file or folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few positions, prompts and steps")
    parser.add_argument("--skip-finetune", action="store_true", help="leave out the fine-tuning figures")
    parser.add_argument("--finetune-steps", type=int, default=60, help="fine-tuning steps of 8 sentences (default 60)")
    parser.add_argument("--seed-finetune-steps", type=int, default=10,
                        help="steps for the seeds' literal setting, which trains the whole backbone (default 10: it "
                             "has diverged by then, and 60 of its steps alone would take most of an hour)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True))
    from causal_qwen.conversion.loading import load_tokenizer_for_base

    tokenizer = load_tokenizer_for_base(args.base)
    PLAIN["tokenizer"] = plain_tokenizer(args.base)
    qwen = load_qwen_base(args.base)
    windows = held_out_windows(tokenizer, 128 if args.quick else HELD_OUT_POSITIONS)
    started = time.perf_counter()
    model = from_qwen(qwen, tokenizer=tokenizer, num_token_id=tokenizer.num_token_id)
    calibration_seconds = time.perf_counter() - started
    log(f"[real_weights] calibrated conversion in {calibration_seconds:.0f} s")
    result = setting_figures(qwen, model, tokenizer, windows, args.quick)
    result["calibration_seconds"] = calibration_seconds
    log("[real_weights] default:", json.dumps(result))
    seed_model = from_qwen(qwen, ovr_calibration="none", num_token_id=tokenizer.num_token_id)
    result["seed_setting"] = setting_figures(qwen, seed_model, tokenizer, windows, args.quick)
    log("[real_weights] seed setting:", json.dumps(result["seed_setting"]))
    if not args.skip_finetune:
        spec = importlib.util.spec_from_file_location("real_weights_finetune", Path(__file__).with_name("real_weights_finetune.py"))
        finetune = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(finetune)
        ce_control_figures, finetune_figures = finetune.ce_control_figures, finetune.finetune_figures
        steps = 2 if args.quick else args.finetune_steps
        result.update(finetune_figures(args.base, steps=steps))
        seed_steps = 2 if args.quick else args.seed_finetune_steps
        result["seed_setting"].update(finetune_figures(args.base, steps=seed_steps, setting="seed"))
        result["seed_setting"]["finetune_steps"] = seed_steps
        result["finetune_steps"] = steps
        result["ce_control"] = ce_control_figures(args.base, steps=steps)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:32s} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
