"""Closed-form starts for the number heads, read from the model's features before the first optimizer step.

Shape legend: M number targets read, N positions read for the token fit, C causal size, V vocabulary.

Before the first optimizer step the training examples are read once, without gradients (`read_positions`).

**The regression head** (``regression_warm_start: λ``). Every position whose next token is ``<NUM>`` gives a pair
``(x_m, y_m)``: the individual's location ``loc_U`` there (C,) and the value that follows. The regression head
starts at the ridge solution

    [W_reg, b_reg] = argmin_{W,b}  Σ_m (W·x_m + b − y_m)²  +  M·λ·(‖X‖²_F/(M·C))·‖W‖²

(``λ`` relative to the features' mean square, so one value fits every base; ``regression_warm_start: auto``
chooses it among `RIDGE_GRID` by the out-of-fold residuals below, `choose_ridge`: the strongest ridge within one
standard error of the smallest out-of-fold error, so features that do not predict the numbers out of fold give
way to a strong ridge, the training mean; the grid starts at 1e-2, the ridge that served real bases best, because
blocks of the training period favour weaker ridges than a later period does), and the numbers' own noise, when the
model has one, at ``γ_Y = median_m |r_m|``, the median absolute deviation of a Cauchy being its scale, with ``r_m``
the **out-of-fold** residuals: the targets cut into `FOLDS` contiguous blocks in the data's order, each block's
residuals from the fit to the other blocks (training puts its documents in time order when the split is by a
column such as a date, so that a block is a period of time, and in a seeded random order otherwise:
`readout_steps.out_of_fold_order`). In-sample residuals
are optimistic, the more so when the data drift; a block predicted from the other periods sees what a later
period will. The report also holds the **forward** error, ``median |r|`` over blocks 2..``FOLDS`` each predicted
from the blocks before it only (`forward_residuals`): with the data in time order, the error of a forecaster that
has seen only the past, which the pretrained recipe floors its widths at after a time split
(`causal_qwen.training.interval_check`).
When every document names a target (the config's ``target``, and at least ``2·FOLDS`` of them), the fit,
``e(λ)`` and ``γ_Y`` read only the targets, the numbers the user scores: a squared error over every number is
ruled by the largest ones, so in ``{year}: {miles} miles driven per person, gas at {gas} dollars a gallon.`` a
fit to every number put the gas price 11 dollars off, in sample, on real weights (docs/design.md, "Which numbers
choose"). Training then reads every number, as the language model it is.
**The earlier numbers** (a model with `heads.EarlierNumbers`, which training adds when the targets are each
document's number ``k ≥ 1``). A frozen base reads a number only through ``φ(v)``, so the read-out above all but
loses the exact values of a sentence's other numbers (a day's open, high and low before its close). The fit is
then made twice: as above, and with the values ``e`` of the ``K`` numbers before each target beside the
features (each column scaled to the features' size, `earlier_scales`, and penalised `EARLIER_RIDGE_SHARE` as much,
so that the values enter as least squares would take them: `earlier_ridge`). The values are kept when they
lower the error of every block of the training rows, on average, by more than two standard errors of the blocks'
differences (`keeps_earlier`, `EARLIER_KEEP_STANDARD_ERRORS`): each block forecast from the blocks before it when the documents are in time order
(a relation between the numbers that drifts, as wages and the price of wheat over two centuries, must hold
forward), from the other blocks otherwise. Else ``w_e = 0`` and training removes the term.
Why: the features of a real base have ``‖loc_U‖₁`` in the thousands, so Adam, which moves every weight by about
its learning rate per step, needs many steps to find this read-out (docs/design.md, "Fine-tuning a calibrated
model"); fine-tuning then starts from it.

**The ``<NUM>`` row of the classification head** (``num_token_warm_start: λ``). At conversion ``<NUM>`` is Qwen's
reserved row K, which Qwen never trained: on real weights its logit lies about 20 nats below the digits' at every
position where a number follows, so neither the softmax nor the One-vs-Rest decision ever writes ``<NUM>``, and
at a learning rate that keeps the rest of the head in place fine-tuning does not lift it. The start fits that one
row to the training positions, every other row fixed. With ``L_n = log Σ_{k≠K} exp(loc_S,k)`` at position n (the
other rows' log partition), the softmax gives ``P_n(<NUM>) = σ(w·x_n + b − L_n)``, so maximising the training
text's softmax likelihood over ``(w, b)`` alone is a logistic regression with the offset ``−L_n``:

    (w, b) = argmin  (1/N) Σ_n [softplus(a_n) − y_n·a_n]  +  λ·‖w̃‖²,    a_n = w·x_n + b − L_n,

with ``y_n = 1`` where the next token is ``<NUM>`` and ``w̃ = w ⊙ std(x)`` the weights on standardised features
(the ridge is on those, so ``λ`` means the same for every base). It is convex; L-BFGS solves it in float64. The
other rows, and with them ``loc_S`` of every other token, stay Qwen's. The calibrated decision scale is nearly the
same for every token (docs/design.md, "Calibration at conversion"), so the standard decision then writes ``<NUM>``
where its logit is the largest. The fit reads at most ``max_positions`` positions (the first ones, in the dataset's
order).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..core.cauchy import inverse_softplus
from ..core.losses import next_number_ordinals, shift_targets

logger = logging.getLogger(__name__)

DEFAULT_RIDGE = 1e-3
RIDGE_GRID = (1e-2, 1e-1, 1.0, 10.0, 100.0)  # the relative ridges ``auto`` chooses among: never below 1e-2
AUTO_FALLBACK_RIDGE = 1.0  # ``auto`` with fewer than 2·FOLDS numbers (no out-of-fold residuals to choose by)
FOLDS = 5  # blocks of the out-of-fold residuals (fewer than 2·FOLDS targets: in-sample residuals)
EARLIER_RIDGE_SHARE = 1e-6  # the earlier numbers' ridge, as a share of the features': they enter as least squares
# the earlier numbers are kept when their blocks' mean gain passes this many standard errors: one let a gain of 1.25
# (the real base's Seattle highs) through that cost the held-out intervals (docs/benchmarks.md, "Seattle-weather")
EARLIER_KEEP_STANDARD_ERRORS = 2.0
MAX_TOKEN_POSITIONS = 65_536  # the token fit's positions: N·C float64 (470 MB at C = 896) while it solves
LOGITS_PER_CHUNK = 1 << 23  # the other rows' log partition, a block of positions at a time: (n,V) float32


@dataclass
class WarmStartReport:
    """numbers: the numbers read (every ``<NUM>`` the training text predicts); scored: those the fit, the ridge
    choice and the residuals below read (the documents' named targets when there are at least ``2·FOLDS`` of them,
    else every number); ridge: ``λ``; train_mdae:
    median |in-sample residual| on the scored numbers; out_of_fold_mdae: median |out-of-fold residual| there
    (``γ_Y``); seconds: wall time; out_of_fold_by_ridge: with ``auto``, the out-of-fold error ``e(λ)`` of every
    ``λ`` tried (`choose_ridge`; None otherwise); forward_mdae: median |forward residual| (`forward_residuals`:
    each block from the blocks before it, the error of a forecaster when the data are in time order; None with
    fewer than ``2·FOLDS`` numbers scored, or in a report written before it was measured); earlier_numbers: how
    many earlier numbers the read-out reads (0: none, `EarlierNumbers` removed or never added);
    earlier_block_errors: when the fit weighed them, each block's error without and with them (`keeps_earlier`)."""

    numbers: int
    scored: int
    ridge: float
    train_mdae: float
    out_of_fold_mdae: float
    seconds: float
    out_of_fold_by_ridge: dict[str, float] | None = None
    forward_mdae: float | None = None
    earlier_numbers: int = 0
    earlier_block_errors: dict[str, list[float]] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class NumTokenStartReport:
    """positions, numbers: positions read (those followed by ``<NUM>``); ridge: ``λ``; nats_before/after: the
    fit's mean negative log-likelihood of "``<NUM>`` next or not" on those positions, with the converted row and
    the fitted one; num_probability: the median softmax ``P(<NUM>)`` where a number follows, after the fit;
    seconds: wall time of the fit."""

    positions: int
    numbers: int
    ridge: float
    nats_before: float
    nats_after: float
    num_probability: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainingPositions:
    """What one pass over the training examples reads (`read_positions`).

    number_features (M,C) float64: ``loc_U`` where the next token is ``<NUM>``; number_values (M,): that number;
    number_is_target (M,) bool: that number is its document's target (every number when no targets are named);
    number_earlier (M,K) float64: the values of the numbers before it in its row (`heads.EarlierNumbers.values`;
    K = 0 for a model without them).
    token_features (N,C) float32, rest_log_partition (N,) float64 and next_is_number (N,) bool: every position
    kept for the ``<NUM>`` row's fit (empty when not asked for)."""

    number_features: Tensor
    number_values: Tensor
    number_is_target: Tensor
    number_earlier: Tensor
    token_features: Tensor
    rest_log_partition: Tensor
    next_is_number: Tensor


@torch.no_grad()
def rest_log_partition(head: torch.nn.Linear, loc_U: Tensor, num_token_id: int) -> Tensor:
    """``L_n = log Σ_{k≠K} exp(W_k·loc_U,n + b_k)`` (N,) float64 for loc_U (N,C): the classification head's log
    partition without row ``K = num_token_id``, a block of positions at a time."""
    vocab = head.weight.shape[0]
    chunk = max(1, LOGITS_PER_CHUNK // vocab)
    parts = []
    for start in range(0, loc_U.shape[0], chunk):
        logits = head(loc_U[start : start + chunk].to(head.weight.dtype)).float()  # (n,V)
        logits[:, num_token_id] = -math.inf
        parts.append(torch.logsumexp(logits, dim=-1).double())
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=loc_U.device)


@torch.no_grad()
def read_positions(
    model, batches, token_positions: int = 0, progress: Callable[[str], None] | None = None,
    target_ordinals: list[int] | None = None,
) -> TrainingPositions:
    """One pass over ``batches`` of collated model inputs (``input_ids``, ``numeric_values``, ``attention_mask``):
    the number targets for the regression fit, and up to ``token_positions`` positions for the ``<NUM>`` row's fit
    (the first ones read). ``target_ordinals[d]``, when given, is the index of row d's target among its numbers
    (rows in the batches' order); it marks ``number_is_target``. ``progress`` gets a line at every tenth of the
    batches."""
    num_id = model.config.num_token_id
    head = model.action.classification_head
    device = head.weight.device  # the batches go where the model is
    earlier_numbers = model.action.earlier_numbers  # None, or the values of each row's earlier numbers
    count = 0 if earlier_numbers is None else earlier_numbers.weight.numel()  # K
    features, values, is_target, token_features, partitions, is_next_number = [], [], [], [], [], []
    earlier = []
    kept, row = 0, 0
    total = len(batches) if hasattr(batches, "__len__") else None
    for index, batch in enumerate(batches):
        if total and index % max(1, total // 10) == 0:
            logger.info("warm start: reading batch %d of %d", index + 1, total)
            if progress is not None:
                progress(f"warm start: reading batch {index + 1} of {total}")
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, Tensor)}
        ids, numbers, mask = batch["input_ids"], batch["numeric_values"], batch.get("attention_mask")
        out = model(input_ids=ids, numeric_values=numbers, attention_mask=mask, use_cache=False,
                    return_scores=False,  # features only: no cache, no V-wide scores
                    backbone_features=batch.get("backbone_features"))  # a feature cache, when training has one
        targets = shift_targets(batch.get("labels", ids), numbers.double(), mask)  # the loss's targets
        is_number = targets.token_ids == num_id  # (N,)
        causal_size = out.loc_U.shape[-1]
        loc_U = out.loc_U[:, :-1].reshape(-1, causal_size)[targets.positions]  # (N,C)
        features.append(loc_U[is_number].double())
        values.append(numbers[:, 1:].reshape(-1)[targets.positions][is_number].double())
        is_target.append(_target_marks(batch.get("labels", ids), num_id, target_ordinals, row)
                         .reshape(-1)[targets.positions][is_number])
        if earlier_numbers is not None:
            before, _ = earlier_numbers.values(ids, numbers, num_id)  # (B,S,K)
            earlier.append(before[:, :-1].reshape(-1, count)[targets.positions][is_number])
        row += ids.shape[0]
        take = min(token_positions - kept, loc_U.shape[0])
        if take > 0:
            token_features.append(loc_U[:take].float())
            partitions.append(rest_log_partition(head, loc_U[:take], num_id))
            is_next_number.append(is_number[:take])
            kept += take
    causal_size = model.action.regression_head.weight.shape[-1]

    def joined(parts: list[Tensor], *shape: int, dtype: torch.dtype) -> Tensor:
        return torch.cat(parts) if parts else torch.zeros(*shape, dtype=dtype, device=device)

    number_values = joined(values, 0, dtype=torch.float64)  # (M,)
    if earlier_numbers is None:  # (M,0): no earlier numbers are read
        earlier = [torch.zeros(len(number_values), 0, dtype=torch.float64, device=device)]
    return TrainingPositions(
        number_features=joined(features, 0, causal_size, dtype=torch.float64),
        number_values=number_values,
        number_is_target=joined(is_target, 0, dtype=torch.bool),
        number_earlier=joined(earlier, 0, count, dtype=torch.float64),
        token_features=joined(token_features, 0, causal_size, dtype=torch.float32),
        rest_log_partition=joined(partitions, 0, dtype=torch.float64),
        next_is_number=joined(is_next_number, 0, dtype=torch.bool),
    )


def _target_marks(labels: Tensor, num_id: int, target_ordinals: list[int] | None, first_row: int) -> Tensor:
    """(B,S-1) bool: the next token is the ``<NUM>`` of its row's target (row ``first_row + b`` of
    ``target_ordinals``), or is any ``<NUM>`` when ``target_ordinals`` is None."""
    is_number, ordinal = next_number_ordinals(labels, num_id)  # (B,S-1) each: ordinal counts from the row's start
    if target_ordinals is None:
        return is_number
    wanted = torch.tensor(target_ordinals[first_row : first_row + len(labels)], device=labels.device)  # (B,)
    return is_number & (ordinal == wanted[:, None])


RegressionFit = Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor]]
"""A read-out fit: ``(features (M,C), values (M,), ridge) → (W (C,), b ())``; `ridge_fit` is the warm start's."""


def ridge_fit(features: Tensor, values: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """The ridge solution of the module docstring: ``(W (C,), b ())`` in float64. features (M,C), values (M,)."""
    count, causal_size = features.shape
    mean_x, mean_y = features.mean(dim=0), values.mean()  # centring leaves the bias out of the penalty
    centred = features - mean_x  # (M,C)
    penalty = ridge * float(features.square().sum()) / causal_size  # M·λ·(‖X‖²_F/(M·C))
    eye = torch.eye(causal_size, dtype=features.dtype, device=features.device)
    gram = centred.T @ centred + penalty * eye  # (C,C)
    weight = torch.linalg.solve(gram, centred.T @ (values - mean_y))  # (C,)
    return weight, mean_y - mean_x @ weight


def block_edges(count: int, folds: int) -> list[int]:
    """Where ``folds`` contiguous blocks of ``count`` numbers start and stop: ``folds + 1`` edges, 0 to ``count``."""
    return [round(count * k / folds) for k in range(folds + 1)]


def out_of_fold_residuals(features: Tensor, values: Tensor, ridge: float, folds: int = FOLDS,
                          fit: RegressionFit | None = None) -> Tensor:
    """``r_m = ŷ_m − y_m`` (M,) where ``ŷ_m`` comes from the fit (`ridge_fit` unless ``fit`` is given: any
    ``(features, values, ridge) → (W, b)``) to the other of ``folds`` contiguous blocks (the module docstring);
    the in-sample residuals when there are fewer than ``2·folds`` targets."""
    fit = ridge_fit if fit is None else fit
    count = len(values)
    if count < 2 * folds:
        weight, bias = fit(features, values, ridge)
        return features @ weight + bias - values
    residuals = torch.empty_like(values)  # (M,)
    edges = block_edges(count, folds)
    for start, stop in zip(edges[:-1], edges[1:]):
        rest = torch.ones(count, dtype=torch.bool, device=values.device)
        rest[start:stop] = False
        weight, bias = fit(features[rest], values[rest], ridge)
        residuals[start:stop] = features[start:stop] @ weight + bias - values[start:stop]
    return residuals


def forward_residuals(features: Tensor, values: Tensor, ridge: float, folds: int = FOLDS,
                      fit: RegressionFit | None = None) -> Tensor | None:
    """``r_m = ŷ_m − y_m`` for the numbers of blocks 2..``folds`` (about (M·(folds−1)/folds),) where ``ŷ_m`` comes
    from the fit (`ridge_fit` unless ``fit`` is given) to the blocks *before* its own only: the error of a
    forecaster that, at each point of the training period, has seen only its past. With the data in time order
    (`readout_steps.out_of_fold_order`) a later held-out period sees errors like these, not like the symmetric
    `out_of_fold_residuals`, whose blocks are predicted from later periods too. None below ``2·folds`` numbers."""
    fit = ridge_fit if fit is None else fit
    count = len(values)
    if count < 2 * folds:
        return None
    edges = block_edges(count, folds)
    residuals = []
    for start, stop in zip(edges[1:-1], edges[2:]):
        weight, bias = fit(features[:start], values[:start], ridge)
        residuals.append(features[start:stop] @ weight + bias - values[start:stop])  # (stop − start,)
    return torch.cat(residuals)


def choose_ridge(features: Tensor, values: Tensor, grid: tuple[float, ...] = RIDGE_GRID,
                 scored: Tensor | None = None, fit: RegressionFit | None = None) -> tuple[float, dict[str, float]]:
    """``(λ, {λ: e(λ)})`` with ``e(λ)`` the mean over the `FOLDS` blocks of each block's median absolute
    out-of-fold residual (`out_of_fold_residuals`, by ``fit``: `ridge_fit` when None) on the ``scored`` numbers
    (M,) bool (all when None; the fits read every number given, and the callers give the targets alone,
    `scored_numbers`; blocks without a scored number left out): the largest ``λ`` of ``grid`` whose ``e`` lies
    within one standard error (the blocks' spread of ``e`` at the best ``λ``, over the square root of their count)
    of the smallest ``e`` — the one-standard-error rule: the
    strongest ridge the data cannot tell from the best. `AUTO_FALLBACK_RIDGE` (and an empty table) when fewer
    than ``2·FOLDS`` numbers are scored."""
    count = len(values)
    scored = torch.ones(count, dtype=torch.bool, device=values.device) if scored is None else scored
    if int(scored.sum()) < 2 * FOLDS:  # also fewer than 2·FOLDS numbers
        return AUTO_FALLBACK_RIDGE, {}
    cuts = block_edges(count, FOLDS)
    blocks = [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if bool(scored[a:b].any())]  # those with a scored number
    per_block = {}
    for ridge in grid:
        residuals = out_of_fold_residuals(features, values, ridge, fit=fit).abs()  # (M,)
        per_block[ridge] = torch.stack([residuals[a:b][scored[a:b]].median() for a, b in blocks])  # (blocks,)
    table = {f"{ridge:g}": float(errors.mean()) for ridge, errors in per_block.items()}
    best = min(grid, key=lambda ridge: table[f"{ridge:g}"])
    limit = table[f"{best:g}"] + float(per_block[best].std()) / math.sqrt(len(blocks))
    return max(ridge for ridge in grid if table[f"{ridge:g}"] <= limit), table


def offset_logistic_nats(
    features: Tensor, offsets: Tensor, labels: Tensor, weight: Tensor, bias: Tensor
) -> float:
    """``(1/N) Σ_n [softplus(a_n) − y_n·a_n]``, ``a_n = w·x_n + b − L_n`` (the module docstring, no penalty)."""
    logits = features.double() @ weight.double() + bias.double() - offsets  # (N,)
    return float((torch.nn.functional.softplus(logits) - labels.double() * logits).mean())


def offset_logistic_fit(
    features: Tensor, offsets: Tensor, labels: Tensor, ridge: float, max_iterations: int = 500
) -> tuple[Tensor, Tensor]:
    """The ``<NUM>`` row's fit of the module docstring: ``(w (C,), b ())`` float64 minimising
    ``(1/N) Σ_n [softplus(a_n) − y_n·a_n] + λ·‖w ⊙ std(x)‖²``, ``a_n = w·x_n + b − L_n``.

    features (N,C), offsets ``L`` (N,), labels ``y`` (N,) bool. Solved by L-BFGS on standardised features."""
    x = features.double()
    mean = x.mean(dim=0)  # (C,)
    std = x.std(dim=0, unbiased=False)  # (C,)
    std = torch.where(std > 0, std, torch.ones_like(std))
    standardised = (x - mean) / std  # (N,C)
    y = labels.double()  # (N,)
    prevalence = float(y.mean().clamp(1e-6, 1 - 1e-6))
    weight = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device, requires_grad=True)  # (C,) standardised
    bias = torch.tensor(math.log(prevalence / (1 - prevalence)) + float(offsets.mean()), dtype=torch.float64,
                        device=x.device, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iterations, history_size=20,
                                  tolerance_grad=1e-10, tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def objective() -> Tensor:
        optimizer.zero_grad()
        logits = standardised @ weight + bias - offsets  # (N,)
        loss = (torch.nn.functional.softplus(logits) - y * logits).mean() + ridge * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    fitted = weight.detach() / std  # (C,) on the raw features
    return fitted, bias.detach() - mean @ fitted


def warm_start_regression(
    model, dataset: Dataset, collator, batch_size: int, ridge: float | str = DEFAULT_RIDGE,
    target_ordinals: list[int] | None = None,
) -> WarmStartReport | None:
    """Set ``W_reg``, ``b_reg`` (and ``γ_Y`` when the model has the numbers' own noise) from ``dataset`` as the
    module docstring says; returns None (and changes nothing) when the data hold no number. Every process of a
    distributed run reads the whole dataset in the same order, so all start from the same head."""
    return warm_start(model, dataset, collator, batch_size, regression_ridge=ridge,
                      target_ordinals=target_ordinals)["regression"]


def warm_start(
    model,
    dataset: Dataset,
    collator,
    batch_size: int,
    regression_ridge: float | str | None = None,
    num_token_ridge: float | None = None,
    max_positions: int = MAX_TOKEN_POSITIONS,
    progress: Callable[[str], None] | None = None,
    target_ordinals: list[int] | None = None,
    in_time_order: bool = False,
) -> dict[str, WarmStartReport | NumTokenStartReport | None]:
    """The starts of the module docstring that have a ridge, from one pass over ``dataset``:
    ``{"regression": report, "num_token": report}``, None for a start not asked for or without data (no number in
    the data: both keep the converted values). ``target_ordinals[d]``: the index of row d's target among its
    numbers, when every row names one (the regression fit, the ridge choice and ``γ_Y`` read the targets, the
    numbers the user scores: `scored_numbers`). Every process of a distributed run reads the whole dataset in the
    same order, so all start from the same heads. ``progress`` gets one-line messages (the pass takes a forward
    pass over the training set: minutes for a real base on a CPU). ``in_time_order``: the rows come in time order
    (a split by a column), so the earlier numbers, for a model that has them, must help forecasts forward
    (`keeps_earlier`)."""
    if target_ordinals is not None and len(target_ordinals) != len(dataset):
        raise ValueError(f"target_ordinals has {len(target_ordinals)} entries for a dataset of {len(dataset)} rows")
    for name, ridge in (("regression", regression_ridge), ("<NUM> token", num_token_ridge)):
        if ridge is None or (name == "regression" and ridge == "auto"):
            continue
        if isinstance(ridge, str) or not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"the ridge of the {name} warm start must be a positive number, got {ridge!r}")
    reports: dict[str, WarmStartReport | NumTokenStartReport | None] = {"regression": None, "num_token": None}
    if regression_ridge is None and num_token_ridge is None:
        return reports
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collator)
    try:
        positions = read_positions(model, loader, token_positions=max_positions if num_token_ridge else 0,
                                   progress=progress, target_ordinals=target_ordinals)
    finally:
        model.train(was_training)
    if len(positions.number_values) == 0:
        logger.info("warm start: the training data hold no number; the heads keep their initial values")
        return reports
    read_seconds = time.perf_counter() - started
    if regression_ridge is not None:
        offered = model.action.earlier_numbers  # the fit may remove it: what it offered is read first
        columns = 0 if offered is None else min(offered.weight.numel(), offered.target)  # earlier values that exist
        regression = reports["regression"] = _start_regression(model, positions, regression_ridge, read_seconds,
                                                               in_time_order)
        if progress is not None:
            chosen = " (auto: by the out-of-fold error)" if regression.out_of_fold_by_ridge else ""
            targets = int(positions.number_is_target.sum())
            scored = f" (fitted to its {regression.scored} targets)" if regression.scored < regression.numbers else ""
            if regression.scored == regression.numbers and targets < regression.numbers:
                scored = f" (fitted to every number: {targets} targets are fewer than {2 * FOLDS})"
            progress(f"regression warm start: {regression.numbers} numbers{scored}, ridge {regression.ridge:g}{chosen}, "
                     f"median absolute residual {regression.train_mdae:.4g} in sample, {regression.out_of_fold_mdae:.4g} "
                     f"out of fold (the numbers' noise starts there) ({regression.seconds:.0f} s)")
            if regression.earlier_block_errors is not None:
                without, within = (regression.earlier_block_errors[key] for key in ("without", "with"))
                verdict = _earlier_verdict(positions, columns, bool(regression.earlier_numbers))
                progress(f"earlier numbers: {verdict} (each {'forward ' if in_time_order else ''}block's median "
                         f"absolute error {', '.join(f'{e:.4g}' for e in without)} without them, "
                         f"{', '.join(f'{e:.4g}' for e in within)} with them)")
    if num_token_ridge is not None and not bool(positions.next_is_number.any()):
        message = (f"<NUM> warm start: no number follows any of the {len(positions.next_is_number)} positions read; "
                   "the <NUM> row keeps its converted values")
        logger.info("%s", message)
        if progress is not None:
            progress(message)
    elif num_token_ridge is not None:
        row = reports["num_token"] = _start_num_token(model, positions, num_token_ridge)  # the <NUM> row's report
        if progress is not None:
            progress(f"<NUM> warm start: {row.positions} positions ({row.numbers} before a number), ridge "
                     f"{row.ridge:g}, nats per position {row.nats_before:.4g} -> {row.nats_after:.4g}, median "
                     f"P(<NUM>) before a number {row.num_probability:.4f} ({row.seconds:.0f} s)")
    return reports


def _start_regression(model, positions: TrainingPositions, ridge: float | str, read_seconds: float,
                      in_time_order: bool = False) -> WarmStartReport:
    earlier = positions.number_earlier if model.action.earlier_numbers is not None else None
    weight, bias, earlier_weight, report = _fit_regression(
        positions.number_features, positions.number_values, positions.number_is_target, ridge, read_seconds,
        earlier=earlier, weigh_earlier=True, in_time_order=in_time_order)
    spread = report.out_of_fold_mdae
    noise = model.action.number_noise
    if noise is None and not bool(weight.abs().max() > 0):
        # The features before every number are the same (one number per text, after the same words): the fit is
        # the constant ``bias``. Without the numbers' own noise, W_reg = 0 would give ``scale_Y = 0`` (no density,
        # a nan loss), so W_reg keeps its converted values and b_reg puts the location at that constant.
        head = model.action.regression_head
        kept = head.weight.detach().reshape(-1).to(positions.number_features.dtype)  # (C,)
        bias = bias - positions.number_features.mean(dim=0) @ kept
        weight = kept
        logger.info("regression warm start: the features before the numbers do not vary; W_reg keeps its "
                    "converted values so that the numbers keep a width")
    _set_regression_head(model, weight, bias, earlier_weight)
    if noise is not None and spread > 0:
        with torch.no_grad():
            noise.weight.zero_()
            noise.bias.fill_(inverse_softplus(spread))
    logger.info("regression warm start: %s", report.to_dict())
    return report


def _fit_regression(features: Tensor, values: Tensor, is_target: Tensor, ridge: float | str, read_seconds: float,
                    earlier: Tensor | None = None, weigh_earlier: bool = False,
                    in_time_order: bool = False) -> tuple[Tensor, Tensor, Tensor | None, WarmStartReport]:
    """``(W (C,), b (), w_e (K,) or None, report)``: the ridge fit of the module docstring (``λ`` chosen when
    ``auto``) to features (M,C) and values (M,); ``is_target`` (M,) marks the numbers the fit, the choice and the
    residuals read. ``earlier`` (M,K): the values of the numbers before each (None: a read-out without them); they
    are read only when the targets are scored, and then, with ``weigh_earlier``, only where `keeps_earlier` says so
    (blocks forecast forward when ``in_time_order``); without it they are kept (a refit keeps the start's choice).
    ``w_e`` None: the earlier numbers are not read."""
    started = time.perf_counter()
    scored = scored_numbers(is_target)  # (M,)
    features, values = features[scored], values[scored]  # (K,C), (K,) the numbers the user scores
    plain = _ReadOut.fitted(features, values, ridge, ridge_fit)
    chosen, earlier_weight, block_errors_report = plain, None, None
    if earlier is not None and earlier.shape[1] > 0 and not bool(scored.all()):  # the targets are scored
        scale = earlier_scales(features, earlier[scored])  # (K,)
        widened = torch.cat([features, earlier[scored] * scale], dim=1)  # (K,C+K')
        fit = earlier_ridge(earlier.shape[1])
        with_earlier = _ReadOut.fitted(widened, values, ridge, fit)
        keep = True
        if weigh_earlier:
            without, within = plain.block_errors(in_time_order), with_earlier.block_errors(in_time_order)
            keep = keeps_earlier(without, within)
            if without is not None and within is not None:
                block_errors_report = {"without": without.tolist(), "with": within.tolist()}
        if keep:
            causal_size = features.shape[1]
            chosen, earlier_weight = with_earlier, with_earlier.weight[causal_size:] * scale
            chosen.weight = with_earlier.weight[:causal_size]
    report = WarmStartReport(numbers=len(scored), scored=len(values), ridge=chosen.ridge, train_mdae=chosen.in_sample,
                             out_of_fold_mdae=chosen.out_of_fold, seconds=read_seconds + time.perf_counter() - started,
                             out_of_fold_by_ridge=chosen.by_ridge, forward_mdae=chosen.forward,
                             earlier_numbers=0 if earlier_weight is None else len(earlier_weight),
                             earlier_block_errors=block_errors_report)
    return chosen.weight, chosen.bias, earlier_weight, report


@dataclass
class _ReadOut:
    """One ridge read-out of the scored numbers, its residuals held out (out of fold (M,), forward (about 4M/5,)
    or None) and their medians (`_fit_regression`)."""

    weight: Tensor
    bias: Tensor
    ridge: float
    by_ridge: dict[str, float] | None
    in_sample: float
    out_of_fold_residuals: Tensor
    forward_residuals: Tensor | None

    @classmethod
    def fitted(cls, features: Tensor, values: Tensor, ridge: float | str, fit: RegressionFit) -> "_ReadOut":
        by_ridge = None
        if ridge == "auto":
            ridge, by_ridge = choose_ridge(features, values, fit=fit)
        weight, bias = fit(features, values, ridge)
        return cls(weight=weight, bias=bias, ridge=ridge, by_ridge=by_ridge,
                   in_sample=float((features @ weight + bias - values).abs().median()),
                   out_of_fold_residuals=out_of_fold_residuals(features, values, ridge, fit=fit),
                   forward_residuals=forward_residuals(features, values, ridge, fit=fit))

    @property
    def out_of_fold(self) -> float:
        return float(self.out_of_fold_residuals.abs().median())

    @property
    def forward(self) -> float | None:
        return None if self.forward_residuals is None else float(self.forward_residuals.abs().median())

    def block_errors(self, forward: bool) -> Tensor | None:
        """`block_medians` of these residuals: forward (``forward``) or out of fold."""
        residuals = self.forward_residuals if forward else self.out_of_fold_residuals
        return block_medians(residuals, len(self.out_of_fold_residuals), forward)


def earlier_scales(features: Tensor, earlier: Tensor) -> Tensor:
    """``c_j = rms(X) / rms(e_j)`` (K,) over the features (M,C) and earlier values (M,K) a fit reads: the factor that
    puts each earlier number's column on the features' scale, so that one ridge reads both (0 for a column of
    zeros: a row with fewer numbers)."""
    size = features.square().mean().sqrt()
    spread = earlier.square().mean(dim=0).sqrt()  # (K,)
    return torch.where(spread > 0, size / spread.clamp_min(torch.finfo(spread.dtype).tiny), torch.zeros_like(spread))


def earlier_ridge(count: int) -> RegressionFit:
    """The fit of ``[X, e·c]`` (M, C+K): `ridge_fit` with the last ``count`` (K) columns, the earlier numbers
    (`earlier_scales`), penalised `EARLIER_RIDGE_SHARE` as much as the features, ``(W (C+K,), b ())``."""

    def fit(features: Tensor, values: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
        causal_size = features.shape[1] - count
        mean_x, mean_y = features.mean(dim=0), values.mean()  # centring leaves the bias out of the penalty
        centred = features - mean_x  # (M,C+K)
        penalty = ridge * float(features[:, :causal_size].square().sum()) / causal_size
        diagonal = torch.full((features.shape[1],), penalty, dtype=features.dtype, device=features.device)
        diagonal[causal_size:] *= EARLIER_RIDGE_SHARE
        weight = torch.linalg.solve(centred.T @ centred + torch.diag(diagonal), centred.T @ (values - mean_y))
        return weight, mean_y - mean_x @ weight

    return fit


def block_errors(features: Tensor, values: Tensor, ridge: float, fit: RegressionFit, forward: bool) -> Tensor | None:
    """Each block's median absolute error (blocks,) of ``fit`` at ``ridge``: each of blocks 2..`FOLDS` forecast from
    the blocks before it (``forward``: data in time order, `forward_residuals`), else each of the `FOLDS` blocks
    from the others (`out_of_fold_residuals`). None below ``2·FOLDS`` numbers."""
    if len(values) < 2 * FOLDS:
        return None
    if forward:
        residuals = forward_residuals(features, values, ridge, fit=fit)
    else:
        residuals = out_of_fold_residuals(features, values, ridge, fit=fit)
    return block_medians(residuals, len(values), forward)


def block_medians(residuals: Tensor | None, count: int, forward: bool) -> Tensor | None:
    """Each block's median absolute residual (blocks,) of ``count`` numbers cut into `FOLDS` blocks (`block_edges`):
    ``residuals`` forward (`forward_residuals`: blocks 2..`FOLDS`) when ``forward``, else out of fold (all blocks).
    None below ``2·FOLDS`` numbers."""
    if count < 2 * FOLDS or residuals is None:
        return None
    edges = block_edges(count, FOLDS)
    if forward:
        edges = [edge - edges[1] for edge in edges[1:]]  # the forecast blocks, from the second on
    residuals = residuals.abs()
    return torch.stack([residuals[a:b].median() for a, b in zip(edges[:-1], edges[1:])])


def _earlier_verdict(positions: TrainingPositions, columns: int, kept: bool) -> str:
    """What ``train`` says of the earlier numbers weighed (the first ``columns`` of ``number_earlier``): read, the
    same values in every row (a number the template's own text writes, such as the 500 of "S&P 500"), or no help."""
    if kept:
        return "read beside the features"
    at_targets = positions.number_earlier[positions.number_is_target][:, :columns]  # (T,columns)
    if len(at_targets) and bool((at_targets == at_targets[:1]).all()):
        values = ", ".join(f"{value:g}" for value in at_targets[0].tolist())
        return f"not read: the numbers before the target are the same in every row ({values})"
    return "not read: they do not help"


def keeps_earlier(without: Tensor | None, within: Tensor | None) -> bool:
    """Whether the read-out with the earlier numbers is kept: its block errors (`block_errors`) lie below those
    without them, on average, by more than `EARLIER_KEEP_STANDARD_ERRORS` standard errors of the paired differences
    ``mean(g) > 2·sd(g)/√n``, ``g = without − within`` (the simpler read-out keeps the benefit of the doubt; never
    with too few numbers for blocks)."""
    if without is None or within is None:
        return False
    gain = without - within  # (blocks,)
    standard_error = float(gain.std()) / math.sqrt(len(gain))
    return float(gain.mean()) > EARLIER_KEEP_STANDARD_ERRORS * standard_error


@torch.no_grad()
def _set_regression_head(model, weight: Tensor, bias: Tensor, earlier_weight: Tensor | None = None) -> None:
    """``W_reg ← weight``, ``b_reg ← bias`` in the head's dtype (through LoRA's wrapper, the trained copy), and the
    earlier numbers' ``w_e ← earlier_weight``, or, when it is None, no earlier numbers read
    (`CausalQwenForCausalLM.set_earlier_numbers`)."""
    head = model.action.regression_head
    head.weight.copy_(weight.reshape(head.weight.shape).to(head.weight.dtype))
    head.bias.copy_(bias.reshape(head.bias.shape).to(head.bias.dtype))
    if earlier_weight is None:
        if model.action.earlier_numbers is not None:
            model.set_earlier_numbers(0)
    else:
        model.action.earlier_numbers.weight.copy_(earlier_weight.to(model.action.earlier_numbers.weight.dtype))


def refit_regression(
    model,
    trained_rows: Dataset,
    kept_rows: Dataset | None,
    collator,
    batch_size: int,
    ridge: float | str,
    progress: Callable[[str], None] | None = None,
    trained_ordinals: list[int] | None = None,
    kept_ordinals: list[int] | None = None,
    by_ridge: dict[str, float] | None = None,
) -> WarmStartReport | None:
    """Refit the regression read-out ``[W_reg, b_reg]`` after training to ``trained_rows`` and ``kept_rows`` (the
    check slice) together, or to ``trained_rows`` alone when ``kept_rows`` is None (the read-out the checks then
    measure), on the trained model's ``loc_U`` (and the earlier numbers, when the warm start kept them), by the
    ridge of the module docstring. ``auto`` chooses ``λ`` on
    ``trained_rows`` alone, as the warm start did (`choose_ridge`): the checks measure the model that ``λ`` gives,
    and a resumed run chooses as an uninterrupted one; ``by_ridge`` is the report of a choice made before (kept in
    this report). The numbers' noise and the interval factor stay as trained and checked. None (the head unchanged)
    when the rows hold no number."""
    started = time.perf_counter()

    def read(rows: Dataset, ordinals: list[int] | None) -> TrainingPositions:
        loader = DataLoader(rows, batch_size=batch_size, shuffle=False, collate_fn=collator)
        return read_positions(model, loader, target_ordinals=ordinals)

    was_training = model.training
    model.eval()
    try:
        trained = read(trained_rows, trained_ordinals)
        kept = None if kept_rows is None else read(kept_rows, kept_ordinals)
    finally:
        model.train(was_training)
    reads_earlier = model.action.earlier_numbers is not None  # the start's choice stands
    if ridge == "auto":
        if len(trained.number_values) == 0:
            return None
        chosen = _fit_regression(trained.number_features, trained.number_values, trained.number_is_target, "auto",
                                 0.0, earlier=trained.number_earlier if reads_earlier else None)[3]
        ridge, by_ridge = chosen.ridge, chosen.out_of_fold_by_ridge
    rows = [trained] if kept is None else [trained, kept]
    values = torch.cat([read_rows.number_values for read_rows in rows])  # (M,) the numbers of both
    if len(values) == 0:
        return None
    earlier = torch.cat([read_rows.number_earlier for read_rows in rows]) if reads_earlier else None  # (M,K)
    weight, bias, earlier_weight, report = _fit_regression(
        torch.cat([read_rows.number_features for read_rows in rows]), values,
        torch.cat([read_rows.number_is_target for read_rows in rows]), ridge, time.perf_counter() - started,
        earlier=earlier)
    report.out_of_fold_by_ridge = by_ridge
    _set_regression_head(model, weight, bias, earlier_weight)  # (rows of too few targets drop the earlier numbers)
    logger.info("regression refit: %s", report.to_dict())
    if progress is not None:
        rows_read = "the rows trained on, before the checks" if kept is None else "every training row"
        progress(f"regression refit to {rows_read}: {report.numbers} numbers, ridge {report.ridge:g}"
                 f"{' (chosen on the rows trained on)' if by_ridge else ''}, median absolute residual "
                 f"{report.train_mdae:.4g} in sample, {report.out_of_fold_mdae:.4g} out of fold "
                 f"({report.seconds:.0f} s)")
    return report


def scored_numbers(is_target: Tensor) -> Tensor:
    """The numbers the ridge choice and the spread read (M,) bool: the targets, or every number below ``2·FOLDS``
    targets."""
    return is_target if int(is_target.sum()) >= 2 * FOLDS else torch.ones_like(is_target)


def _start_num_token(model, positions: TrainingPositions, ridge: float) -> NumTokenStartReport:
    started = time.perf_counter()
    num_id = model.config.num_token_id
    head = model.action.classification_head
    features, offsets, labels = positions.token_features, positions.rest_log_partition, positions.next_is_number
    before = offset_logistic_nats(features, offsets, labels, head.weight[num_id].detach(), head.bias[num_id].detach())
    weight, bias = offset_logistic_fit(features, offsets, labels, ridge)
    with torch.no_grad():
        head.weight[num_id].copy_(weight.to(head.weight.dtype))
        head.bias[num_id].copy_(bias.to(head.bias.dtype))
        fitted = features[labels].double() @ weight + bias - offsets[labels]  # (M',) logit of P(<NUM>)
    report = NumTokenStartReport(
        positions=len(labels), numbers=int(labels.sum()), ridge=ridge, nats_before=before,
        nats_after=offset_logistic_nats(features, offsets, labels, weight, bias),
        num_probability=float(torch.sigmoid(fitted).median()) if fitted.numel() else math.nan,
        seconds=time.perf_counter() - started,
    )
    logger.info("<NUM> token warm start: %s", report.to_dict())
    return report
