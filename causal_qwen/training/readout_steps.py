"""The number read-out's steps around training: the slice of training rows kept out to check it, the order the
warm start reads the rows in, the earlier numbers it is offered, its report on disk, and what runs between the last
training step and the save (the refit before the checks, the location check, the earlier numbers' width, the
interval check, the floors, the refit to every training row). Each ``run_*`` reads the run's `TrainConfig` and
documents, changes the model in place and gives one line to ``report``; `training._train` calls them in this order:

    keep_check_slice → out_of_fold_order → offer_earlier_numbers → warm_start → (training) →
    run_regression_refit(with_slice=False) → run_location_check → run_earlier_width → run_interval_check →
    run_interval_floor → run_regression_refit

The checks themselves live in `interval_check` and `location_check`, the fits in `warm_start`.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from ..core.files import write_text_atomic
from ..core.numbers import find_numbers
from . import data as data_module
from .collator import NumericCollator, TokenizedDataset, tokenize_documents
from .feature_cache import CachedFeatureDataset, cache_features
from .interval_check import (
    FLOOR_FORWARD,
    FLOOR_NO_SLICE,
    MIN_NUMBERS,
    EarlierWidthReport,
    IntervalCheckReport,
    IntervalFloorReport,
    check_intervals,
    floor_intervals,
    set_earlier_width,
)
from .location_check import LocationCheckReport, check_location, shrink_regression_head, training_median
from .train_config import TrainConfig
from .warm_start import FOLDS, WarmStartReport, refit_regression

logger = logging.getLogger(__name__)

WARM_START_FILE = "warm_start.json"

Report = Callable[[str], None]


def tell(message: str, report: Report | None) -> None:
    """Log ``message`` and give it to ``report`` (the user's console in ``causal-qwen train``) when there is one."""
    logger.info("%s", message)
    if report is not None:
        report(message)


# ---- the check slice and the order the warm start reads ---------------------------------------------------
MAX_CHECK_SHARE = 0.25
"""The largest share of the training rows `keep_check_slice` takes to reach `interval_check.MIN_NUMBERS` numbers."""


def keep_check_slice(config: TrainConfig, train_docs: list, report: Report | None = None) -> tuple[list, list]:
    """``(train, check)``: the ``interval_check`` fraction of the training documents kept out of training (the
    latest ones when ``split_by`` is set and its values differ, else a seeded pick), or all of them and ``[]`` when
    the check is off. A slice that would hold fewer than `interval_check.MIN_NUMBERS` numbers is widened to the
    fewest documents that hold them when those are at most `MAX_CHECK_SHARE` of the training documents (a table of
    43 rows keeps 8 out, not 4); else there is no slice (`causal_qwen.training.interval_check`,
    `causal_qwen.training.location_check`). Where rows share the values of ``split_by`` (a yearly table's rows
    their year) and the latest values hold more than that share between them (or than ``interval_check``, if
    larger), the slice is a seeded pick too: the last year of two would take half of the rows out of training."""
    if not config.interval_check or len(train_docs) < 2:
        return train_docs, []
    largest = math.ceil(max(MAX_CHECK_SHARE, config.interval_check) * len(train_docs))

    def count(docs: list) -> int:
        return sum(1 if doc.target_ordinal is not None else len(find_numbers(doc.text)) for doc in docs)

    def cut(fraction: float, split_by: str | None = config.split_by) -> tuple[list, list, data_module.SplitSpec, str]:
        """The slice of ``fraction``, and why it is a seeded pick although ``split_by`` is set ("" otherwise)."""
        spec = data_module.SplitSpec(fraction=fraction, split_by=split_by, seed=config.seed)
        try:
            kept, check = data_module.split_documents(train_docs, spec)
        except ValueError:  # every training row shares one split value (a fold column): a seeded pick instead
            if split_by is None:
                raise
            return cut(fraction, None)
        if split_by is not None and len(check) > largest:  # whole groups of the latest values
            return (*cut(fraction, None)[:3], f"the latest values of '{split_by}' hold {len(check)} of the "
                    f"{len(train_docs)} training documents (rows share a value), more than the {largest} a check "
                    "may take")
        return kept, check, spec, ""

    kept, check, spec, why = cut(config.interval_check)
    numbers = count(check)
    if numbers < MIN_NUMBERS:
        per_document = count(train_docs) / len(train_docs)
        wanted = math.ceil(MIN_NUMBERS / max(per_document, 1e-9)) / len(train_docs)  # the fewest documents, as a share
        if config.interval_check < wanted <= MAX_CHECK_SHARE:
            kept, check, spec, why = cut(wanted)
            numbers = count(check)
    if numbers < MIN_NUMBERS:
        tell(f"interval check: no slice kept out: {len(train_docs)} training documents are too few for "
             f"{MIN_NUMBERS} numbers in a quarter of them; every row trains, and neither the locations nor the "
             "intervals are checked on rows kept out (the interval floor stands in when the warm start scores "
             f"{2 * FOLDS} numbers or more)", report)
        return train_docs, []
    checks = ("the number locations and intervals" if checks_locations(config, kept, check)
              else "the number intervals")
    message = (f"interval check: {len(check)} of the {len(train_docs)} training documents kept out of training "
               f"({data_module.describe_split(spec)}{'; ' + why if why else ''}) to check {checks}")
    tell(message, report)
    return kept, check


def in_split_order(config: TrainConfig, train_docs: list) -> bool:
    """Whether the warm start reads ``train_docs`` in the order of the ``split_by`` column (`out_of_fold_order`):
    a split by a column whose values differ among them, so that the held-out rows lie beyond them in it."""
    return config.split_by is not None and len({repr(doc.split_value) for doc in train_docs}) > 1


def out_of_fold_order(config: TrainConfig, train_docs: list) -> list:
    """The training documents in the order the warm start's out-of-fold blocks are cut in (`warm_start`): by the
    ``split_by`` column (stable) when its values differ, so that each block is a period of time as a later held-out
    period will be; else a seeded shuffle (a random split: each block a random fifth, as the held-out rows are),
    so that rows grouped in the file (one symbol, one source after another) do not make a block a group the
    other blocks never saw. Training draws its batches at random, so only the warm start reads this order."""
    if in_split_order(config, train_docs):
        values = [doc.split_value for doc in train_docs]
        key = data_module.split_key(values, None, config.split_by,
                                    where=[f"{doc.source}: row {doc.row}" for doc in train_docs])
        return sorted(train_docs, key=lambda doc: key(doc.split_value))
    shuffled = list(train_docs)
    random.Random(config.seed).shuffle(shuffled)
    return shuffled


# ---- the warm start: what it reads and its report ---------------------------------------------------------
def target_ordinals(dataset: Dataset, docs: list) -> list[int] | None:
    """The index of each document's target among its numbers, one per row of ``dataset`` (tokenized from
    ``docs``); None (read every number) when a document has no target or the tokenizer made other rows than
    documents."""
    ordinals = [doc.target_ordinal for doc in docs]
    if len(dataset) != len(docs) or any(ordinal is None for ordinal in ordinals):
        return None
    return ordinals


def common_target_ordinal(ordinals: list[int] | None) -> int | None:
    """``k`` when every document's target is its number ``k ≥ 1`` (numbers before it to read), else None."""
    if not ordinals or len(set(ordinals)) != 1 or ordinals[0] < 1:
        return None
    return ordinals[0]


def row_break_ids(tokenizer, dataset: Dataset) -> list[int]:
    """The tokens that end a row of the earlier numbers: those holding a line break
    (`NumericTokenizer.line_break_ids`), so that a text of several rows, one a line, reads each row's own numbers;
    none when a training document holds one before its last number (a document of several lines is then one row,
    and so is any text)."""
    breaks = getattr(tokenizer, "line_break_ids", None)
    num_id = getattr(tokenizer, "num_token_id", None)
    if breaks is None or num_id is None:
        return []
    breaks = breaks()
    marked = set(breaks)
    for index in range(len(dataset)):
        ids = dataset[index]["input_ids"]  # (S,) a list or a tensor
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        last_number = max((position for position, token in enumerate(ids) if token == num_id), default=0)
        if marked.intersection(ids[:last_number]):
            logger.info("earlier numbers: training row %d holds a line break, so a text is read as one row", index)
            return []
    return breaks


def offer_earlier_numbers(model, count: int, ordinals: list[int] | None, row_breaks: Sequence[int] = ()) -> None:
    """Give the model `heads.EarlierNumbers` (``w_e = 0``, a row ending after each of ``row_breaks``,
    `row_break_ids`) for the warm start to weigh (`warm_start.keeps_earlier`) when ``count`` > 0 and every
    document's target is the same number ``k ≥ 1`` (`common_target_ordinal`); otherwise the read-out reads none."""
    target = common_target_ordinal(ordinals)
    if count and target is not None:
        model.set_earlier_numbers(count, target, row_breaks)
    else:
        logger.info("earlier numbers: not offered (earlier_numbers %s, the targets' ordinals %s)", count,
                    sorted(set(ordinals)) if ordinals else None)


def save_warm_start(output_dir: Path, warm: WarmStartReport | None) -> None:
    """Write the regression warm start's report to ``output_dir/warm_start.json`` (atomically), or remove an
    earlier run's when this one had none."""
    path = output_dir / WARM_START_FILE
    if warm is None:
        path.unlink(missing_ok=True)
    else:
        write_text_atomic(path, json.dumps(warm.to_dict(), indent=1))


def load_warm_start(output_dir: Path) -> WarmStartReport | None:
    """The report `save_warm_start` wrote, for a resumed run; None when the folder holds none."""
    path = output_dir / WARM_START_FILE
    if not path.is_file():
        return None
    try:
        return WarmStartReport(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path} is not a warm start report written by causal-qwen train: {error}") from error


# ---- between the last step and the save ---------------------------------------------------------------
def check_slice_dataset(config: TrainConfig, tokenizer: Any, check_docs: list) -> tuple[TokenizedDataset, list | None]:
    """The slice's documents tokenized, and `target_ordinals` (None: every number of the slice is read)."""
    dataset = tokenize_documents(check_docs, tokenizer, config.max_length, config.add_eos)
    return dataset, target_ordinals(dataset, check_docs)


def run_location_check(model, config: TrainConfig, tokenizer: Any, train_docs: list, check_docs: list, pad_id: int,
                       report: Report | None = None) -> LocationCheckReport | None:
    """`check_location` on the documents `keep_check_slice` kept out, against the median target of ``train_docs``
    (the rows trained on); None when there is no slice or the check is not to run on it (`checks_locations`)."""
    if not check_docs or not checks_locations(config, train_docs, check_docs):
        return None
    dataset, ordinals = check_slice_dataset(config, tokenizer, check_docs)
    median = training_median(train_docs, every_number=ordinals is None)
    if median is None:
        return None
    checked = check_location(model, dataset, NumericCollator(pad_token_id=pad_id),
                             config.eval_batch_size or config.batch_size, median, ordinals)
    if checked is not None and report is not None:
        report(checked.line())
    return checked


def checks_locations(config: TrainConfig, train_docs: list, check_docs: list) -> bool:
    """Whether the location check runs on this slice: ``location_check`` true, or ``seeded`` and the slice is no
    later stretch of a split in time (`slice_is_later`)."""
    if config.location_check == "seeded":
        return not slice_is_later(config, train_docs, check_docs)
    return config.location_check is True


def slice_is_later(config: TrainConfig, train_docs: list, check_docs: list) -> bool:
    """Whether every document of the slice comes after every document trained on in the ``split_by`` column (a
    split in time; not the seeded pick `keep_check_slice` falls back to when the column holds one value)."""
    if config.split_by is None or not train_docs or not check_docs:
        return False
    documents = train_docs + check_docs
    key = data_module.split_key([doc.split_value for doc in documents], None, config.split_by,
                                where=[f"{doc.source}: row {doc.row}" for doc in documents])
    return min(key(doc.split_value) for doc in check_docs) > max(key(doc.split_value) for doc in train_docs)


def run_interval_check(model, config: TrainConfig, tokenizer: Any, train_docs: list, check_docs: list, pad_id: int,
                       report: Report | None = None) -> IntervalCheckReport | None:
    """`check_intervals` on the documents `keep_check_slice` kept out (None when there are none); it only widens
    when they come after ``train_docs`` in time (`slice_is_later`)."""
    if not check_docs:
        return None
    dataset, ordinals = check_slice_dataset(config, tokenizer, check_docs)
    checked = check_intervals(model, dataset, NumericCollator(pad_token_id=pad_id),
                              config.eval_batch_size or config.batch_size, ordinals,
                              widen_only=slice_is_later(config, train_docs, check_docs))
    if checked is not None and report is not None:
        report(checked.line())
    return checked


def interval_floor(config: TrainConfig, train_docs: list, check_docs: list,
                   warm: WarmStartReport | None) -> tuple[float, str] | None:
    """The error the widths are floored at, and which floor it is (`interval_check`'s module docstring), or None:
    the warm start's out-of-fold error when the interval check is on but the table was too small for a slice
    (`FLOOR_NO_SLICE`); its forward error after a split by a column with the backbone frozen (`FLOOR_FORWARD`);
    the larger when both apply. None also without a regression warm start or with fewer than ``2·FOLDS`` numbers
    scored (its residuals were then in-sample)."""
    if warm is None or warm.scored < 2 * FOLDS:
        return None
    floors = []
    if config.interval_check and not check_docs:
        floors.append((warm.out_of_fold_mdae, FLOOR_NO_SLICE))
    if config.freeze_backbone and warm.forward_mdae is not None and in_split_order(config, train_docs):
        floors.append((warm.forward_mdae, FLOOR_FORWARD))
    return max(floors) if floors else None


def run_interval_floor(model, config: TrainConfig, train_dataset: Dataset, train_docs: list, check_docs: list,
                       warm: WarmStartReport | None, pad_id: int,
                       report: Report | None = None) -> IntervalFloorReport | None:
    """`floor_intervals` at the training numbers the warm start scored (its targets, or every number), read from
    ``train_dataset`` (its feature cache, when the backbone is frozen), at the error `interval_floor` chooses; None
    when it chooses none."""
    chosen = interval_floor(config, train_docs, check_docs, warm)
    if chosen is None:
        if config.interval_check and not check_docs and warm is not None and report is not None:
            report(f"interval floor: none: the warm start scored {warm.scored} numbers, fewer than {2 * FOLDS} "
                   "(its errors are in-sample), so nothing checks the widths; they are as training left them")
        return None
    error, floor = chosen
    ordinals = target_ordinals(train_dataset, train_docs)
    if warm.scored == warm.numbers:  # the warm start scored every number
        ordinals = None
    floored = floor_intervals(model, train_dataset, NumericCollator(pad_token_id=pad_id),
                              config.eval_batch_size or config.batch_size, error, ordinals, floor=floor)
    if floored is not None and report is not None:
        report(floored.line())
    return floored


def run_earlier_width(model, config: TrainConfig, train_dataset: Dataset, train_docs: list,
                      warm: WarmStartReport | None, pad_id: int,
                      report: Report | None = None) -> EarlierWidthReport | None:
    """`set_earlier_width` at the training targets, from ``train_dataset`` (its feature cache, when the backbone is
    frozen), at the warm start's error of the read-out with the earlier numbers: forward when it read the rows in
    time order (`in_split_order`), out of fold otherwise; None when the start kept no earlier numbers or scored
    fewer than ``2·FOLDS`` targets (its residuals were then in-sample)."""
    if warm is None or not warm.earlier_numbers or warm.scored < 2 * FOLDS:
        return None
    ordinals = target_ordinals(train_dataset, train_docs)
    if ordinals is None:
        return None
    forward = in_split_order(config, train_docs) and warm.forward_mdae is not None
    error = warm.forward_mdae if forward else warm.out_of_fold_mdae
    widened = set_earlier_width(model, train_dataset, NumericCollator(pad_token_id=pad_id),
                                config.eval_batch_size or config.batch_size, error, ordinals, forward)
    if widened is not None and report is not None:
        report(widened.line())
    return widened


def run_regression_refit(model, config: TrainConfig, tokenizer: Any, train_dataset: Dataset, train_docs: list,
                         check_docs: list, pad_id: int, located: LocationCheckReport | None = None,
                         report: Report | None = None, before: WarmStartReport | None = None,
                         with_slice: bool = True) -> WarmStartReport | None:
    """Refit the regression read-out by the warm start's ridge (`warm_start.refit_regression`): ``with_slice``
    False, before the checks, to the rows trained on, so that the checks measure the read-out that is saved (on
    frozen features training reads every number of a sentence and moves a read-out fitted to the targets away
    from them); then, after the checks, to every training row, the check slice included, at the ridge chosen
    ``before`` (``auto`` chooses it on the rows trained on, as the warm start did). A location check's shrink is
    applied again to the final refit. None when ``refit_after_check`` is off, there is no slice or no regression
    warm start."""
    if not (config.refit_after_check and check_docs and config.regression_warm_start):
        return None
    collator = NumericCollator(pad_token_id=pad_id)
    batch_size = config.eval_batch_size or config.batch_size
    slice_dataset = slice_ordinals = None
    if with_slice:
        slice_dataset, slice_ordinals = check_slice_dataset(config, tokenizer, check_docs)
        if isinstance(train_dataset, CachedFeatureDataset):  # the frozen backbone reads only the slice
            slice_dataset = cache_features(model, slice_dataset, collator, batch_size)
    ridge, by_ridge = config.regression_warm_start, None
    if before is not None:
        ridge, by_ridge = before.ridge, before.out_of_fold_by_ridge
    refit = refit_regression(model, train_dataset, slice_dataset, collator, batch_size, ridge, report,
                             target_ordinals(train_dataset, train_docs), slice_ordinals, by_ridge=by_ridge)
    if refit is not None and located is not None and located.shrunk:
        shrink_regression_head(model, located.alpha, located.median)
    return refit
