"""A prompt of several rows, one a line: the forecast of its last row's target, with and without the row breaks.

    python benchmarks/rows_in_a_prompt.py --model RUN/final [--rows-before N] [--json]

A model trained by ``causal-qwen train`` whose read-out kept the earlier numbers (`heads.EarlierNumbers`: where a
row's target comes next, ``loc_Y`` adds ``w_e · e``, the values of the row's last numbers) reads them within a
row; training marks the tokens holding a line break as row ends (`EarlierNumbers.row_break`). For each held-out
row of the run's own config (its ``train_config.yaml``: data, template, target, split) this script forecasts the
target (``loc_Y`` right before it) from

- ``alone``: the row's text up to its target, as ``eval`` and ``predict`` read it;
- ``after_rows``: the ``N`` rows before it in the file, whole, each on its own line, then that text: the way one
  writes a few rows of a table as a prompt;
- ``after_rows_unmarked``: the same prompt with the row breaks cleared, so the text reads as one row (a model
  trained before the breaks were marked, or one whose training rows span lines): the term then finds another
  count of numbers before the target and does not apply.

It prints the median absolute error of each over the held-out rows. A model without earlier numbers has no row
breaks to clear; the script says so and stops with status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def held_out_prompts(folder: Path, tokenizer, rows_before: int) -> list[tuple[str, str, float]]:
    """``(row alone, rows before + row, target)`` for each held-out document of the run's config: the texts cut
    right before the target number."""
    from causal_qwen.evaluation.evaluation import EvalData, load_split_documents
    from causal_qwen.training.train_config import load_train_config

    config_file = next((place / "train_config.yaml" for place in (folder, folder.parent)
                        if (place / "train_config.yaml").is_file()), None)
    if config_file is None:
        raise ValueError(f"{folder}: no train_config.yaml here or in its parent (give a `causal-qwen train` run's "
                         "final folder)")
    config = load_train_config(config_file)
    if not (config.template and config.target):
        raise ValueError(f"{config_file}: the run names no template and target, so its rows have no target to forecast")
    split = {} if config.validation_data else {  # a validation file is held out whole
        "split_by": config.split_by, "split_at": config.split_at, "validation_split": config.validation_split,
        "seed": config.seed}
    spec = EvalData(path=config.validation_data or config.data, format=config.data_format, template=config.template,
                    target=config.target, numeric_fields=tuple(config.numeric_fields) if config.numeric_fields else None,
                    **split)
    training, held_out = load_split_documents(spec)
    if not held_out:
        raise ValueError(f"{config_file}: the run holds no rows out (no split), so there is nothing to forecast")
    in_file_order = sorted([*training, *held_out], key=lambda doc: doc.row)
    place = {doc.row: index for index, doc in enumerate(in_file_order)}
    prompts = []
    for doc in held_out:
        if doc.target_ordinal is None or place[doc.row] < rows_before:
            continue
        text = tokenizer.normalize(doc.text)
        target = tokenizer.find_numbers(text)[doc.target_ordinal]
        before = [tokenizer.normalize(other.text) for other in in_file_order[place[doc.row] - rows_before:place[doc.row]]]
        row = text[:target.start]
        prompts.append((row, "\n".join([*before, row]), target.value))
    return prompts


def forecasts(model, tokenizer, texts: list[str]) -> list[float]:
    """``loc_Y`` at the last position of each text (one at a time: no padding to reason about)."""
    out = []
    with torch.inference_mode():
        for text in texts:
            batch = tokenizer([text], return_tensors="pt")
            output = model(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"], logits_to_keep=1)
            out.append(float(output.loc_Y[0, -1]))
    return out


def measure(folder: Path, rows_before: int) -> dict:
    from causal_qwen.core.modeling import CausalQwenForCausalLM
    from causal_qwen.core.tokenizer import NumericTokenizer

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no saved model here (give a `causal-qwen train` run's final folder)")
    model = CausalQwenForCausalLM.from_pretrained(folder).eval()
    tokenizer = NumericTokenizer.from_pretrained(folder)
    earlier = model.action.earlier_numbers
    if earlier is None:
        raise ValueError(f"{folder}: this model's read-out reads no earlier numbers (config.earlier_numbers 0), so "
                         "its rows have no breaks to compare")
    prompts = held_out_prompts(folder, tokenizer, rows_before)
    if not prompts:
        raise ValueError(f"{folder}: no held-out row has {rows_before} rows before it in the file")
    targets = [target for _, _, target in prompts]

    def mdae(texts: list[str]) -> float:
        return statistics.median(abs(forecast - target) for forecast, target in zip(forecasts(model, tokenizer, texts), targets))

    marked = int((earlier.row_break > 0).sum())
    figures = {"rows": len(prompts), "rows_before": rows_before, "marked_row_breaks": marked,
               "alone": mdae([alone for alone, _, _ in prompts]),
               "after_rows": mdae([after for _, after, _ in prompts])}
    saved = earlier.row_break.clone()
    earlier.row_break.zero_()
    figures["after_rows_unmarked"] = mdae([after for _, after, _ in prompts])
    earlier.row_break.copy_(saved)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a `causal-qwen train` run's final folder")
    parser.add_argument("--rows-before", type=int, default=1, help="whole rows written before each row (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.rows_before < 1:
        parser.error(f"--rows-before must be at least 1, got {args.rows_before}")
    start = time.perf_counter()
    try:
        figures = measure(Path(args.model), args.rows_before)
    except (ValueError, FileNotFoundError) as error:
        print(f"rows_in_a_prompt: error: {error}", file=sys.stderr)
        return 2
    figures["seconds"] = round(time.perf_counter() - start, 1)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{figures['rows']} held-out rows, {figures['marked_row_breaks']:,} tokens marked as row breaks; "
          f"median absolute error of the target's forecast:")
    for label, key in (("the row alone", "alone"),
                       (f"after {args.rows_before} whole row(s), one a line", "after_rows"),
                       ("the same, the row breaks cleared (one row)", "after_rows_unmarked")):
        print(f"  {label:<46} {figures[key]:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
