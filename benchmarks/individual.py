"""The causal individual on real weights (issue 29, item 4): its two scopes, the causal temperature, and Qwen.

    python benchmarks/individual.py --base PATH.gguf --json [--quick] [--out FIG.png]

``PATH`` is a real Qwen2.5 checkpoint (``scripts/fetch_real_qwen.py``); ``--base random:tiny`` runs the whole script
on the tiny preset (figures meaningless; with ``--quick``, a smoke test). The base is converted once with the default
calibration, which sets ``config.causal_temperature`` (``τ``); the Qwen reference is that same base. Causal mode
draws the individual ``u = loc_U + τ·scale_U ⊙ tan(π(ε − ½))`` with ``ε`` fresh at every token (``token`` scope)
or one ``ε`` per text (``sequence`` scope). Continuations are ``NEW_TOKENS`` (32; 16 with ``--quick``) new tokens with
the end of text banned until then on both sides, ``CONTINUATIONS`` (8) per prompt, on the ``PROMPTS`` below
(everyday text, none of it the calibration's Python documentation). Qwen samples ancestrally
(``do_sample=True, top_k=0, top_p=1``). The figures, all from this one run:

  causal_temperature     the model's calibrated ``τ``
  token_scope            fluency_ratio: Qwen's perplexity of the token-scope continuations (teacher forced, pooled
                         over a prompt's continuations, geometric mean over prompts) over its perplexity of its own
                         samples at temperature 1 on the same prompts; distinct2_ratio: distinct-2 (unique bigrams /
                         bigrams, pooled over a prompt's continuations, averaged over prompts) over Qwen's;
                         choice_cross_entropy: ``−Σ_k p_k log f_k(τ)`` (nats/position), ``p`` Qwen's softmax and
                         ``f`` the token-scope choice frequencies at the calibrated ``τ``
                         (`causal_temperature.choice_cross_entropy`) at ``HELD_OUT_POSITIONS`` positions of the
                         held-out documentation topics (`calibration.held_out_texts`, never the calibration text);
                         softmax_entropy: ``H(p)`` over the same candidates (the cross-entropy's lower bound),
                         softmax_entropy_full: over the whole vocabulary; consistency: the control below
  sequence_scope         fluency_ratio, distinct2_ratio as above with one individual per continuation; consistency
  replay_equal           an ``ε`` returned by a sequence-scope run on prompt A, saved as JSON and replayed on prompt
                         B, writes what a fresh sequence-scope run on B given that ``ε`` writes, A replayed writes
                         A's text again, and B with at least one of 4 other individuals writes something else (so the
                         check fails when the individual is ignored)
  individuals_differ     share of prompts on which the 8 sequence-scope individuals write at least 2 different
                         continuations
  causal_speed_ratio     token-scope tokens/s over Qwen's ``generate(do_sample=True)``, at batch 1 and at batch 4
                         (``NEW_TOKENS`` tokens, the first prompt), the smaller; interleaved repeats, best of each
  frontier               ``{family, tau | temperature, distinct2, fluency}`` (fluency: the perplexity): causal mode
                         (token scope) at ``τ × FRONTIER_MULTIPLES`` and Qwen at ``QWEN_TEMPERATURES``; then, for
                         each of ``AIMED_TEMPERATURES``, causal points aimed at ``AIMED_PERPLEXITY`` (1.05) times
                         Qwen's perplexity at that temperature, the middle of the check's allowance: the τ that the
                         two measured points bracketing it say (``log τ`` linear in perplexity), measured like the
                         others, up to ``AIM_STEPS`` (3) times until one lands within 2% (the check reads measured
                         points only)
  acceptance             the issue's checks on those figures, each ``{value, threshold, pass}``

Consistency (defined before any result was seen). ``CHOICE_PAIRS`` holds 16 pairs of prompts that ask the same open
choice in different words. For each pair, ``N`` (16) sequence-scope individuals ``ε_1..ε_N`` are drawn by the run
on prompt A (seeded) and replayed on prompt B; each run writes ``CHOICE_TOKENS`` (8) tokens. The *choice* of a run
is the first content word of its text: lowercased, apostrophes dropped, split into ``[a-z0-9]+`` words; skipping
`STOPWORDS` (function words and verbs of choosing) and every word of either prompt of the pair (the question
restated); a word longer than 3 letters ending in a single ``s`` loses it (``apples`` → ``apple``). A run without
a content word has no choice, which matches nothing.
  same_individual        share of (pair, k) where A with ``ε_k`` and B with ``ε_k`` make the same choice
  different_individuals  share of (pair, k, j ≠ k) where A with ``ε_k`` and B with ``ε_j`` do: every derangement of
                         the N individuals, averaged (B's run with ``ε_j`` is its run in the same batch)
  ci95                   95% percentile bootstrap interval (2,000 resamples of the pairs, with replacement) of
                         same_individual − different_individuals; the check: its lower end above 0
The token-scope control runs the same pairs in token scope with an independent seed for each prompt (a token-scope
draw is no individual that could be carried over): both shares estimate the chance agreement, equal up to noise.

``--quick``: 3 prompts × 4 continuations of 16 tokens, 3 choice pairs × 4 individuals, 128 held-out positions,
one speed repeat. ``--prompts``, ``--continuations``, ``--new-tokens``, ``--pairs``, ``--individuals`` change the
sizes. Each setting draws its continuations 8 prompts to a batch (left padded). On CPU cores that other processes
keep busy, ``--threads 1`` runs several times faster than torch's default of one thread per core (its threads wait
on each other), and ``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824`` in the
environment spares the page faults of the large vocabulary-wide buffers (as tests/conftest.py explains).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from causal_qwen.conversion import calibration, presets  # noqa: E402
from causal_qwen.conversion.causal_temperature import choice_cross_entropy  # noqa: E402
from causal_qwen.conversion.conversion import load_qwen_base  # noqa: E402
from causal_qwen.conversion.loading import load_tokenizer_for_base  # noqa: E402
from causal_qwen.core.generation import generate_ids  # noqa: E402
from causal_qwen import from_qwen  # noqa: E402


def _real_weights():
    """benchmarks/real_weights.py, for its scoring helpers (imported by path: benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("real_weights_benchmark", Path(__file__).with_name("real_weights.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


real_weights = _real_weights()
base_perplexity, distinct2, end_ids = real_weights.base_perplexity, real_weights.distinct2, real_weights.end_ids

# Everyday prompts, none of them from the calibration text (Python's reference documentation).
PROMPTS = (
    "Once upon a time, in a small village by the sea, there lived",
    "Recipe for banana pancakes.\nIngredients:",
    "def is_palindrome(word):\n    ",
    "-- the ten customers who spent the most last year\nSELECT",
    "Photosynthesis is the process by which plants",
    "Weekend train timetable:\nSaturday: first train at 6:40, then every",
    "Customer: Hi, I would like to return these shoes.\nShop assistant:",
    "Dear Professor Smith,\nI am writing to ask whether",
    "The best things to do on a rainy afternoon in London are",
    "The Roman Empire began to decline when",
    "A good morning routine for staying healthy includes",
    "<!-- a login form with a username and a password -->\n<form",
    "# count the lines of every .txt file in this folder\n$",
    "Local news: on Tuesday the city council voted to",
    "In the final minutes of the match, the striker",
    "Shopping list for the week:\n-",
)
CHOICE_PAIRS = (
    ("My favourite colour is", "If I had to pick one colour, I would pick"),
    ("My favourite fruit is", "If I could eat only one kind of fruit, it would be"),
    ("My favourite animal is", "The animal I like more than any other is"),
    ("My favourite programming language is", "If I could write code in only one language, I would choose"),
    ("My favourite season is", "The time of year I enjoy the most is"),
    ("My favourite sport is", "The sport I most enjoy watching is"),
    ("My favourite city is", "If I could live in any city in the world, I would live in"),
    ("My favourite drink is", "When I am thirsty, the drink I reach for is"),
    ("My favourite musical instrument is the", "If I learned to play one instrument, it would be the"),
    ("My favourite day of the week is", "The day of the week I look forward to most is"),
    ("My favourite vegetable is", "The vegetable I like to eat the most is"),
    ("My favourite flower is the", "If someone brought me flowers, I would want"),
    ("My favourite country to visit is", "The country I would most like to travel to is"),
    ("My favourite dessert is", "After dinner, the sweet I like best is"),
    ("My favourite board game is", "On a game night, the board game I always suggest is"),
    ("My favourite breakfast is", "In the morning, what I like to eat most is"),
)
STOPWORDS = frozenset(
    """a an the my your our their his her its i id im ive ill me we you he she it they is are was were be been being
    am would will could should can may might must do does did have has had to of in on at for with by from as and or
    but if so that this these those then than there here which who what when where why how very really probably
    definitely maybe perhaps just also too quite most more one pick choose chose say said think like love prefer
    want go not no yes oh well""".split()
)
NEW_TOKENS = 32
CONTINUATIONS = 8
CHOICE_INDIVIDUALS = 16
CHOICE_TOKENS = 8
HELD_OUT_POSITIONS = 1024
FRONTIER_MULTIPLES = (0.125, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0)
AIMED_TEMPERATURES = (0.7, 1.0)  # Qwen's temperatures the frontier aims a τ at (`aimed_multiple`)
PERPLEXITY_BOUND = 1.1  # the frontier check: Qwen's distinct-2 within this multiple of its perplexity
AIMED_PERPLEXITY = 1.05  # the aimed point's perplexity, a multiple of Qwen's: the middle of the check's allowance
AIM_STEPS, AIM_TOLERANCE = 3, 0.02  # at most 3 aimed points per temperature; stop within 2% of the aimed perplexity
QWEN_TEMPERATURES = (0.5, 0.7, 1.0, 1.2)
BOOTSTRAP = 2000
SEED = 0


def log(*parts) -> None:
    print("[individual]", *parts, file=sys.stderr, flush=True)


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# ---------------------------------------------------------------------------------------------------------------
# Prompts and continuations
# ---------------------------------------------------------------------------------------------------------------
class Prompt:
    """A prompt as CausalQwen reads it (ids and number values, (P,) each) and as Qwen reads it (digits, (P',))."""

    def __init__(self, text: str, tokenizer, plain) -> None:
        encoded = tokenizer([text], return_tensors="pt")
        self.text = text
        self.ids, self.values = encoded["input_ids"][0], encoded["numeric_values"][0]  # (P,) each
        self.plain_ids = plain(text, add_special_tokens=False, return_tensors="pt")["input_ids"]  # (1,P')


def left_padded(rows: list[torch.Tensor], pad: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of unequal lengths, LEFT padded with ``pad``: (B,L) values and (B,L) attention mask."""
    length = max(len(row) for row in rows)
    out = torch.full((len(rows), length), pad, dtype=rows[0].dtype)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for index, row in enumerate(rows):
        out[index, length - len(row):] = row
        mask[index, length - len(row):] = 1
    return out, mask


def in_chunks(items: list, size: int):
    for first in range(0, len(items), size):
        yield items[first : first + size]


def causal_batch(model, prompts: list[Prompt], rows: int, new_tokens: int, eos: list[int], *, fixed_length: bool = True,
                 **options):
    """``generate_ids`` in causal mode on ``rows`` copies of each prompt, one LEFT-padded batch (prompt i has rows
    ``i·rows … (i+1)·rows − 1``); ``options``: individual_scope, causal_temperature, seed, individual."""
    ids, mask = left_padded([p.ids for p in prompts for _ in range(rows)], 0)  # (B,L)
    values, _ = left_padded([p.values for p in prompts for _ in range(rows)], 0.0)  # (B,L)
    return generate_ids(model, ids, mask, values, mode="causal", max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens if fixed_length else 0, eos_token_id=eos, **options)


def causal_continuations(model, tokenizer, prompts: list[Prompt], rows: int, new_tokens: int, eos: list[int], seed: int,
                         chunk: int, **options) -> list[list[torch.Tensor]]:
    """Each prompt's ``rows`` continuations as Qwen reads them (numbers written as digits and re-tokenized), drawn
    ``chunk`` prompts per batch (seed ``seed + chunk index``)."""
    continuations = []
    for index, part in enumerate(in_chunks(prompts, chunk)):
        out = causal_batch(model, part, rows, new_tokens, eos, seed=seed + index, **options)
        lengths = out.lengths.tolist()
        texts = [real_weights._plain_ids(tokenizer, out.token_ids[i, :n], out.numeric_values[i, :n])
                 for i, n in enumerate(lengths)]
        continuations.extend(texts[i * rows : (i + 1) * rows] for i in range(len(part)))
    return continuations


def qwen_samples(qwen, prompts: list[Prompt], rows: int, new_tokens: int, temperature: float, seed: int,
                 chunk: int) -> list[list[torch.Tensor]]:
    """Each prompt's ``rows`` ancestral samples from Qwen at ``temperature``, ``chunk`` prompts per LEFT-padded
    batch."""
    samples = []
    for index, part in enumerate(in_chunks(prompts, chunk)):
        ids, mask = left_padded([p.plain_ids[0] for p in part for _ in range(rows)], 0)  # (B,L)
        torch.manual_seed(seed + index)
        out = qwen.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                            do_sample=True, temperature=temperature, top_k=0, top_p=1.0, pad_token_id=0,
                            eos_token_id=end_ids(qwen))[:, ids.shape[1]:]  # (B,T)
        samples.extend([out[i * rows + r] for r in range(rows)] for i in range(len(part)))
    return samples


def text_figures(qwen, prompts: list[Prompt], continuations: list[list[torch.Tensor]]) -> dict:
    """Qwen's perplexity (geometric mean over prompts of the pooled per-prompt perplexity) and mean distinct-2."""
    perplexities = [base_perplexity(qwen, p.plain_ids, c) for p, c in zip(prompts, continuations)]
    diversity = [distinct2(c) for c in continuations]
    return {"perplexity": geometric_mean(perplexities), "distinct2": sum(diversity) / len(diversity)}


# ---------------------------------------------------------------------------------------------------------------
# Consistency of a choice
# ---------------------------------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("'", "").replace("\u2019", ""))


def first_content_word(text: str, prompt_words: set[str]) -> str | None:
    """The choice a text makes (see the module docstring), None when it has no content word."""
    for word in words(text):
        if word in STOPWORDS or word in prompt_words:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        return word
    return None


def _texts(tokenizer, out) -> list[str]:
    return [tokenizer.decode(out.token_ids[i, :n], numeric_values=out.numeric_values[i, :n], skip_special_tokens=True)
            for i, n in enumerate(out.lengths.tolist())]


def _agreement(choices_a: list[str | None], choices_b: list[str | None]) -> tuple[float, float]:
    """(share of k with A_k = B_k, share of k ≠ j with A_k = B_j); no choice matches nothing."""
    K = len(choices_a)
    match = [[a is not None and a == b for b in choices_b] for a in choices_a]
    same = sum(match[k][k] for k in range(K)) / K
    different = sum(match[k][j] for k in range(K) for j in range(K) if j != k) / (K * (K - 1))
    return same, different


def bootstrap_difference(same: list[float], different: list[float], resamples: int = BOOTSTRAP,
                         seed: int = SEED) -> list[float]:
    """95% percentile interval of mean(same − different) over pairs resampled with replacement."""
    differences = torch.tensor(same, dtype=torch.float64) - torch.tensor(different, dtype=torch.float64)  # (pairs,)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(differences), (resamples, len(differences)), generator=generator)
    means = differences[picks].mean(dim=1)  # (resamples,)
    return [float(means.quantile(0.025)), float(means.quantile(0.975))]


@torch.no_grad()
def consistency(model, tokenizer, pairs, individuals: int, new_tokens: int, eos: list[int], scope: str,
                chunk: int) -> dict:
    """The consistency of a choice (module docstring), ``chunk`` pairs per batch."""
    plain = tokenizer.tokenizer
    same, different, examples, no_choice = [], [], [], 0
    for index, part in enumerate(in_chunks(list(pairs), chunk)):
        side_a = [Prompt(a, tokenizer, plain) for a, _ in part]
        side_b = [Prompt(b, tokenizer, plain) for _, b in part]
        if scope == "sequence":  # the individuals drawn on A, replayed on B
            out_a = causal_batch(model, side_a, individuals, new_tokens, eos, fixed_length=False,
                                 individual_scope="sequence", seed=SEED + 100 + index)
            out_b = causal_batch(model, side_b, individuals, new_tokens, eos, fixed_length=False,
                                 individual_scope="sequence", individual=out_a.individual)
        else:  # independent token-level draws on each side
            out_a = causal_batch(model, side_a, individuals, new_tokens, eos, fixed_length=False,
                                 individual_scope="token", seed=SEED + 200 + 2 * index)
            out_b = causal_batch(model, side_b, individuals, new_tokens, eos, fixed_length=False,
                                 individual_scope="token", seed=SEED + 201 + 2 * index)
        texts_a, texts_b = _texts(tokenizer, out_a), _texts(tokenizer, out_b)
        for number, (text_a, text_b) in enumerate(part):
            prompt_words = set(words(text_a)) | set(words(text_b))
            rows = slice(number * individuals, (number + 1) * individuals)
            choices_a = [first_content_word(text, prompt_words) for text in texts_a[rows]]
            choices_b = [first_content_word(text, prompt_words) for text in texts_b[rows]]
            pair_same, pair_different = _agreement(choices_a, choices_b)
            same.append(pair_same)
            different.append(pair_different)
            no_choice += sum(c is None for c in choices_a + choices_b)
            examples.append({"prompts": [text_a, text_b], "choices": [choices_a, choices_b],
                             "texts": [texts_a[rows][:2], texts_b[rows][:2]]})
    return {
        "same_individual": sum(same) / len(same),
        "different_individuals": sum(different) / len(different),
        "ci95": bootstrap_difference(same, different),
        "pairs": len(same),
        "individuals": individuals,
        "no_choice_share": no_choice / (2 * len(same) * individuals),
        "per_pair_same": same,
        "per_pair_different": different,
        "examples": examples[:4],
    }


# ---------------------------------------------------------------------------------------------------------------
# Replay, speed, held-out choice entropy
# ---------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def replay_check(model, tokenizer, prompts: list[Prompt], new_tokens: int, eos: list[int]) -> dict:
    a, b = prompts[0], prompts[1]
    first = causal_batch(model, [a], 1, new_tokens, eos, individual_scope="sequence", seed=SEED + 300)
    saved = json.loads(json.dumps(first.individual.tolist()))  # what --save-individual keeps
    replayed = causal_batch(model, [b], 1, new_tokens, eos, individual_scope="sequence", individual=saved)
    fresh = causal_batch(model, [b], 1, new_tokens, eos, individual_scope="sequence",
                         individual=first.individual.clone())
    again = causal_batch(model, [a], 1, new_tokens, eos, individual_scope="sequence", individual=saved)
    others = causal_batch(model, [b], 4, new_tokens, eos, individual_scope="sequence", seed=SEED + 301)
    differs = [not torch.equal(others.token_ids[i], fresh.token_ids[0]) for i in range(4)]
    return {
        "replay_equal": bool(torch.equal(replayed.token_ids, fresh.token_ids)
                             and torch.equal(again.token_ids, first.token_ids) and any(differs)),
        "replayed_equals_fresh": bool(torch.equal(replayed.token_ids, fresh.token_ids)),
        "prompt_a_replayed": bool(torch.equal(again.token_ids, first.token_ids)),
        "other_individuals_differ": sum(differs),
    }


@torch.no_grad()
def speed(qwen, model, prompt: Prompt, new_tokens: int, eos: list[int], repeats: int) -> dict:
    result, ratios = {}, []
    for batch in (1, 4):
        ids = prompt.plain_ids.expand(batch, -1)
        runs = {
            "qwen": lambda: qwen.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                          min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0,
                                          top_p=1.0, pad_token_id=0, eos_token_id=eos),
            "causal": lambda: causal_batch(model, [prompt], batch, new_tokens, eos, individual_scope="token",
                                           seed=SEED),
        }
        for run in runs.values():  # warm-up
            run()
        best = {name: math.inf for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
        result[f"batch{batch}"] = {
            "qwen_tokens_per_s": batch * new_tokens / best["qwen"],
            "causal_tokens_per_s": batch * new_tokens / best["causal"],
            "ratio": best["qwen"] / best["causal"],
        }
        ratios.append(best["qwen"] / best["causal"])
    return {"causal_speed_ratio": min(ratios), "speed": result}


@torch.no_grad()
def held_out_choice_entropy(model, tokenizer, positions: int) -> dict:
    features, _ = calibration.collect_features(model, tokenizer, calibration.held_out_texts(), positions)  # (N,H)
    generator = torch.Generator().manual_seed(SEED)
    fit = choice_cross_entropy(model, features, model.config.causal_temperature, generator=generator)
    return {
        "choice_cross_entropy": float(fit["cross_entropy"][0]),
        "softmax_entropy": fit["softmax_entropy"],
        "softmax_entropy_full": fit["softmax_entropy_full"],
        "held_out_positions": int(fit["positions"]),
    }


# ---------------------------------------------------------------------------------------------------------------
def aimed_multiple(points: dict[float, dict], figure: str, target: float) -> float | None:
    """The multiple of τ at which the token-scope frontier should reach ``target`` in ``figure`` (``"distinct2"`` or
    ``"perplexity"``): ``log τ`` interpolated linearly in the figure between the two grid points that
    bracket it (``points``: multiple → figures); None when no two adjacent points bracket it. The benchmark then
    *measures* that τ."""
    ordered = sorted(points.items())
    for (low, below), (high, above) in zip(ordered, ordered[1:]):
        if below[figure] <= target <= above[figure] and above[figure] > below[figure]:
            share = (target - below[figure]) / (above[figure] - below[figure])
            return round(math.exp(math.log(low) + share * (math.log(high) - math.log(low))), 4)
    return None


def acceptance(figures: dict) -> dict:
    def check(value, threshold, passed, **extra) -> dict:
        return {"value": value, "threshold": threshold, "pass": bool(passed), **extra}

    token, sequence = figures["token_scope"], figures["sequence_scope"]
    checks = {
        "token_distinct2_ratio": check(token["distinct2_ratio"], 0.9, token["distinct2_ratio"] >= 0.9),
        "token_fluency_ratio": check(token["fluency_ratio"], 1.2, token["fluency_ratio"] <= 1.2),
    }
    causal = [p for p in figures["frontier"] if p["family"] == "causal"]
    for point in figures["frontier"]:
        if point["family"] != "qwen" or point["temperature"] not in (0.7, 1.0):
            continue
        bound = PERPLEXITY_BOUND * point["fluency"]
        within = [p["distinct2"] for p in causal if p["fluency"] <= bound]
        best = max(within) if within else None
        checks[f"frontier_qwen_T{point['temperature']}"] = check(
            best, point["distinct2"], best is not None and best >= point["distinct2"], perplexity_bound=bound)
    checks["sequence_distinct2_ratio"] = check(sequence["distinct2_ratio"], 0.8, sequence["distinct2_ratio"] >= 0.8)
    checks["sequence_fluency_ratio"] = check(sequence["fluency_ratio"], 1.5, sequence["fluency_ratio"] <= 1.5)
    low = sequence["consistency"]["ci95"][0]
    checks["consistency_ci_apart"] = check(low, 0.0, low > 0.0)
    checks["individuals_differ"] = check(figures["individuals_differ"], 0.9, figures["individuals_differ"] >= 0.9)
    checks["replay_equal"] = check(figures["replay_equal"], True, figures["replay_equal"])
    checks["causal_speed_ratio"] = check(figures["causal_speed_ratio"], 0.9, figures["causal_speed_ratio"] >= 0.9)
    checks["all_pass"] = all(c["pass"] for c in checks.values())
    return checks


@torch.no_grad()
def run(base: str, sizes: dict, candidates: int | None = None) -> dict:
    """Every figure of the module docstring; ``sizes``: prompts, continuations, new_tokens, pairs, individuals,
    held_out_positions, speed_repeats, chunk (prompts per batch); ``candidates``: ``config.causal_candidates`` of
    the conversion (None: the default)."""
    started = time.perf_counter()
    new_tokens, rows, chunk = sizes["new_tokens"], sizes["continuations"], sizes["chunk"]
    tokenizer = load_tokenizer_for_base(base)
    plain = tokenizer.tokenizer if presets.is_preset(base) else real_weights.plain_tokenizer(base)
    real_weights.PLAIN["tokenizer"] = plain  # real_weights._plain_ids writes numbers with it
    qwen = load_qwen_base(base).eval()
    overrides = {} if candidates is None else {"causal_candidates": candidates}
    model = from_qwen(qwen, tokenizer=tokenizer, num_token_id=tokenizer.num_token_id, **overrides).eval()
    tau = float(model.config.causal_temperature)
    if not tau > 0:
        raise ValueError(f"the calibrated causal temperature is {tau}: no range of τ around it for the frontier")
    log(f"converted in {time.perf_counter() - started:.0f} s, causal temperature {tau:.4g}")
    eos = end_ids(qwen)
    prompts = [Prompt(text, tokenizer, plain) for text in PROMPTS[: sizes["prompts"]]]
    pairs = CHOICE_PAIRS[: sizes["pairs"]]
    figures: dict = {"causal_temperature": tau, "causal_candidates": int(model.config.causal_candidates)}
    seconds: dict = {"conversion": time.perf_counter() - started}

    def timed(name: str, compute):
        began = time.perf_counter()
        value = compute()
        seconds[name] = time.perf_counter() - began
        log(f"{name}: {seconds[name]:.0f} s")
        return value

    def qwen_point(temperature: float) -> dict:
        samples = qwen_samples(qwen, prompts, rows, new_tokens, temperature, SEED + 1000, chunk)
        return text_figures(qwen, prompts, samples)

    def causal_point(multiple: float) -> dict:
        continuations = causal_continuations(model, tokenizer, prompts, rows, new_tokens, eos, SEED + 2000, chunk,
                                             individual_scope="token",
                                             causal_temperature=None if multiple == 1.0 else tau * multiple)
        return text_figures(qwen, prompts, continuations)

    def sequence_point() -> tuple[dict, list[int]]:
        continuations = causal_continuations(model, tokenizer, prompts, rows, new_tokens, eos, SEED + 3000, chunk,
                                             individual_scope="sequence")
        distinct = [len({tuple(c.tolist()) for c in group}) for group in continuations]
        return text_figures(qwen, prompts, continuations), distinct

    qwen_points = {t: timed(f"qwen_T{t}", lambda t=t: qwen_point(t)) for t in QWEN_TEMPERATURES}
    causal_points = {m: timed(f"causal_x{m}", lambda m=m: causal_point(m)) for m in FRONTIER_MULTIPLES}
    for temperature in AIMED_TEMPERATURES:  # a τ aimed inside the check's perplexity allowance, then measured there
        aim = AIMED_PERPLEXITY * qwen_points[temperature]["perplexity"]
        for _ in range(AIM_STEPS):  # each measured point narrows the bracket (regula falsi in log τ)
            multiple = aimed_multiple(causal_points, "perplexity", aim)
            if multiple is None or multiple in causal_points:
                break
            causal_points[multiple] = timed(f"causal_x{multiple:.3g}", lambda m=multiple: causal_point(m))
            if abs(causal_points[multiple]["perplexity"] / aim - 1) <= AIM_TOLERANCE:
                break
    sequence, distinct_counts = timed("sequence_scope", sequence_point)
    reference = qwen_points[1.0]

    def ratios(point: dict) -> dict:
        return {"fluency_ratio": point["perplexity"] / reference["perplexity"],
                "distinct2_ratio": point["distinct2"] / reference["distinct2"],
                "perplexity": point["perplexity"], "distinct2": point["distinct2"]}

    figures["token_scope"] = ratios(causal_points[1.0])
    figures["token_scope"].update(timed("held_out_entropy", lambda: held_out_choice_entropy(
        model, tokenizer, sizes["held_out_positions"])))
    figures["token_scope"]["consistency"] = timed("token_consistency", lambda: consistency(
        model, tokenizer, pairs, sizes["individuals"], CHOICE_TOKENS, eos, "token", chunk))
    figures["sequence_scope"] = ratios(sequence)
    figures["sequence_scope"]["consistency"] = timed("sequence_consistency", lambda: consistency(
        model, tokenizer, pairs, sizes["individuals"], CHOICE_TOKENS, eos, "sequence", chunk))
    figures["qwen_reference"] = {"temperature": 1.0, **reference}
    figures.update(timed("replay", lambda: replay_check(model, tokenizer, prompts, new_tokens, eos)))
    figures["individuals_differ"] = sum(count >= 2 for count in distinct_counts) / len(distinct_counts)
    figures["distinct_continuations_per_prompt"] = distinct_counts
    figures.update(timed("speed", lambda: speed(qwen, model, prompts[0], new_tokens, eos, sizes["speed_repeats"])))
    figures["frontier"] = (
        [{"family": "causal", "tau": tau * m, "distinct2": p["distinct2"], "fluency": p["perplexity"]}
         for m, p in sorted(causal_points.items())]
        + [{"family": "qwen", "temperature": t, "distinct2": p["distinct2"], "fluency": p["perplexity"]}
           for t, p in qwen_points.items()]
    )
    figures["acceptance"] = acceptance(figures)
    figures["settings"] = {"base": base, **sizes, "choice_tokens": CHOICE_TOKENS, "seed": SEED,
                           "torch_threads": torch.get_num_threads()}
    seconds["total"] = time.perf_counter() - started
    figures["seconds"] = seconds
    return figures


FULL = {"prompts": len(PROMPTS), "continuations": CONTINUATIONS, "new_tokens": NEW_TOKENS, "pairs": len(CHOICE_PAIRS),
        "individuals": CHOICE_INDIVIDUALS, "held_out_positions": HELD_OUT_POSITIONS, "speed_repeats": 3, "chunk": 8}
QUICK = {"prompts": 3, "continuations": 4, "new_tokens": 16, "pairs": 3, "individuals": 4, "held_out_positions": 128,
         "speed_repeats": 1, "chunk": 8}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True,
                        help="a real Qwen2.5 checkpoint (.gguf file or folder) or a random:* preset")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 prompts × 4 continuations of 16 tokens, "
                        "3 choice pairs × 4 individuals")
    parser.add_argument("--out", default=None, help="also draw the frontier to this .png file")
    for name, help_text in (("prompts", "the first N of the 16 prompts"), ("continuations", "continuations per prompt"),
                            ("new-tokens", "tokens per continuation"), ("pairs", "the first N of the 16 choice pairs"),
                            ("individuals", "individuals per choice pair")):
        parser.add_argument(f"--{name}", type=int, default=None,
                            help=f"{help_text} (default: the full or --quick size)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default torch's; 1 is far faster on cores other processes keep busy)")
    parser.add_argument("--candidates", type=int, default=None,
                        help="convert with this config.causal_candidates K (the tokens an individual chooses among; "
                             "0: every token; default: the config's default); τ is calibrated for it")
    args = parser.parse_args(argv)
    if args.out is not None and Path(args.out).suffix.lower() != ".png":
        parser.error(f"--out must be a .png file, got {args.out!r}")
    sizes = dict(QUICK if args.quick else FULL)
    for name, limit in (("prompts", len(PROMPTS)), ("continuations", None), ("new_tokens", None),
                        ("pairs", len(CHOICE_PAIRS)), ("individuals", None)):
        value = getattr(args, name)
        if value is None:
            continue
        smallest = 2 if name in ("prompts", "continuations", "pairs", "individuals") else 1
        if value < smallest or (limit is not None and value > limit):
            parser.error(f"--{name.replace('_', '-')} must lie in [{smallest}, {limit or 'any'}], got {value}")
        sizes[name] = value
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.candidates is not None and args.candidates < 0:
        parser.error(f"--candidates must be >= 0, got {args.candidates}")
    torch.manual_seed(SEED)
    figures = run(args.base, sizes, candidates=args.candidates)
    if args.out is not None:
        from causal_qwen.evaluation.plots import plot_frontier

        path = plot_frontier(figures["frontier"], args.out, calibrated_tau=figures["causal_temperature"])
        figures["figure"] = str(path)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:24s} {json.dumps(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
