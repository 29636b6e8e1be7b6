"""Encoding and decoding speed of the numeric tokenizer against the plain Qwen2.5 tokenizer (issue 13).

Builds about 1 MB of number-dense CSV-like text (seeded: dates, prices with thousands separators, signed
decimals, exponents, ids with leading zeros, times, units, words), one document per line, then times

* encode: ``NumericTokenizer(lines, padding=False, return_tensors=None)`` vs the plain Qwen2.5 tokenizer
  (``tokenizer(lines, add_special_tokens=False)``, numbers spelled as digits) on the same lines;
* decode: ``NumericTokenizer.batch_decode(ids, values, numeric_strings=...)`` (the exact text back) vs the
  plain ``batch_decode(ids)``;

each the best of ``--repeats`` runs, and prints both times and their ratios (target: each ratio <= 2). It
also checks that the numeric decode gives every line back exactly.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokenizer.py [--megabytes 1] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for causal_qwen

from causal_qwen.core.qwen_vocab import build_qwen25_base_tokenizer  # noqa: E402
from causal_qwen.core.tokenizer import NumericTokenizer  # noqa: E402

WORDS = ("drizzle", "rain", "sun", "snow", "fog", "Seattle", "item", "total", "user", "price", "wind", "low", "high")
UNITS = ("km", "kg", "mm", "%", " EUR", " USD", "\u00b0C", "rd", "k", "")


def _cell(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.30:
        return f"{rng.uniform(-50, 50):.1f}"
    if kind < 0.45:
        return f"\"{rng.randint(0, 10**7):,}.{rng.randint(0, 99):02d}\""
    if kind < 0.55:
        return str(rng.randint(0, 10**6))
    if kind < 0.62:
        return f"{rng.uniform(0.001, 9.9):.3g}e{rng.randint(-9, 9)}"
    if kind < 0.68:
        return f"{rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind < 0.72:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    if kind < 0.76:
        return f"{rng.randint(0, 999):06d}"
    if kind < 0.88:
        return f"{rng.randint(1, 999)}{rng.choice(UNITS)}"
    return rng.choice(WORDS)


def make_lines(megabytes: float, seed: int = 0) -> list[str]:
    """CSV-like lines of 4-10 cells, about ``megabytes`` MB of UTF-8 in all."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < megabytes * 1_000_000:
        line = ",".join(_cell(rng) for _ in range(rng.randint(4, 10)))
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return lines


def best_time(function, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()

    lines = make_lines(args.megabytes)
    plain = build_qwen25_base_tokenizer()
    numeric = NumericTokenizer.default()

    plain_encode, plain_ids = best_time(lambda: plain(lines, add_special_tokens=False)["input_ids"], args.repeats)
    numeric_encode, encoded = best_time(lambda: numeric(lines, padding=False, return_tensors=None), args.repeats)
    plain_decode, _ = best_time(lambda: plain.batch_decode(plain_ids), args.repeats)
    numeric_decode, decoded = best_time(
        lambda: numeric.batch_decode(encoded["input_ids"], encoded["numeric_values"],
                                     numeric_strings=encoded["numeric_strings"]),
        args.repeats,
    )
    if decoded != lines:
        bad = next(index for index, (a, b) in enumerate(zip(decoded, lines)) if a != b)
        raise SystemExit(f"decode(encode(x)) != x at line {bad}: {lines[bad]!r} -> {decoded[bad]!r}")

    numbers = sum(row.count(numeric.num_token_id) for row in encoded["input_ids"])
    figures = {
        "megabytes": round(sum(len(line.encode("utf-8")) + 1 for line in lines) / 1e6, 3),
        "lines": len(lines),
        "numbers": numbers,
        "plain_tokens": sum(len(row) for row in plain_ids),
        "numeric_tokens": sum(len(row) for row in encoded["input_ids"]),
        "plain_encode_s": round(plain_encode, 3),
        "numeric_encode_s": round(numeric_encode, 3),
        "encode_ratio": round(numeric_encode / plain_encode, 2),
        "plain_decode_s": round(plain_decode, 3),
        "numeric_decode_s": round(numeric_decode, 3),
        "decode_ratio": round(numeric_decode / plain_decode, 2),
        "round_trip_exact": True,
    }
    print(f"{figures['megabytes']} MB, {len(lines)} lines, {numbers} numbers; tokens: plain "
          f"{figures['plain_tokens']}, numeric {figures['numeric_tokens']}")
    print(f"encode: numeric {numeric_encode:.3f} s, plain {plain_encode:.3f} s, ratio {figures['encode_ratio']:.2f}")
    print(f"decode: numeric {numeric_decode:.3f} s, plain {plain_decode:.3f} s, ratio {figures['decode_ratio']:.2f}")
    print("decode(encode(x)) == x for every line")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)


if __name__ == "__main__":
    main()
