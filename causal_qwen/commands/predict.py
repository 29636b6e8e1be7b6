"""``causal-qwen predict``: the next-step view after a text (OvR, Cauchy scores and softmax side by side)."""

from __future__ import annotations

import argparse
import json
import unicodedata

from ..core.numbers import format_interval
from .arguments import positive_int
from .eval import add_model_arguments, load_model


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="show the next-step decision after TEXT",
        description="Show, for the position after TEXT, the top-k tokens by One-vs-Rest probability with loc_S, "
        "scale_S and the softmax probability side by side, and the number forecast: P(<NUM>) and the Cauchy "
        "median with 50% and 90% intervals of the value.",
    )
    add_model_arguments(parser)
    parser.add_argument("--top-k", type=positive_int, default=10, help="candidates to show (default 10)")
    parser.add_argument("--json", action="store_true", help="print the view as JSON")
    parser.add_argument("text", metavar="TEXT", help="the text whose next step to show (one that starts with '-' goes "
                        "after '--')")
    parser.set_defaults(func=run)


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: two for a wide (East Asian) character, none for a combining mark."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def pad(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` terminal columns (as ``f"{text:<width}"`` does for narrow text)."""
    return text + " " * max(0, width - display_width(text))


def format_view(view) -> str:
    """The `causal_qwen.evaluation.predict.NextStepView` as a text table."""
    threshold = f" (OvR threshold C = {view.threshold:g})" if view.threshold is not None else " (per-token thresholds)"
    shown = view.text if len(view.text) <= 200 else f"…{view.text[-200:]}"  # a long text: its end
    lines = [f"next step after {shown!r}{threshold}"]
    header = (
        f"{'rank':>4}  {'id':>7}  {'token':<16} {'P_ovr':>10} {'loc_S':>10} {'C':>8} {'scale_S':>10} {'softmax':>10} "
        f"{'sm_rank':>7}"
    )
    lines.append(header)
    for rank, c in enumerate(view.candidates, start=1):
        lines.append(
            f"{rank:>4}  {c.token_id:>7}  {pad(repr(c.token), 16)} {c.ovr_probability:>10.4g} {c.loc_S:>10.4g} {c.threshold:>8.4g} "
            f"{c.scale_S:>10.4g} {c.softmax_probability:>10.4g} {c.softmax_rank:>7}"
        )
    n = view.number
    if n.after:
        lines.append(f"(a number after this text follows its own {n.after!r} token: the <NUM> line is "
                     f"read after the text + {n.after!r})")
    lines.append(
        f"<NUM> (id {n.token_id}): P_ovr {n.ovr_probability:.4g} (rank {n.ovr_rank}), "
        f"softmax {n.softmax_probability:.4g}; "
        f"written as {n.text} (median {n.median:.6g}, scale {n.scale:.4g}), "
        f"50% {format_interval(n.interval_50, n.text)}, 90% {format_interval(n.interval_90, n.text)}"
    )
    if n.earlier_numbers:
        lines.append("(the forecast reads the row's earlier numbers, latest first: "
                     f"{', '.join(f'{value:g}' for value in n.earlier_numbers)})")
    elif n.earlier_numbers_wanted is not None:
        lines.append(f"(the model reads a row's earlier numbers where {n.earlier_numbers_wanted} come before its "
                     f"target; this row holds {n.row_numbers_before} since its latest line break, so the forecast "
                     "reads none: a line break ends a row)")
    lines.append(f"standard mode picks id {view.standard_choice}; greedy softmax picks id {view.traditional_choice}; "
                 f"sum of P_ovr over the vocabulary {view.probability_sum:.4g}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..evaluation.predict import predict_next

    model, tokenizer = load_model(args)
    view = predict_next(model, tokenizer, args.text, top_k=args.top_k)
    if args.json:
        print(json.dumps(view.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(format_view(view))
    return 0
