"""The next-step view: what CausalQwen would decide right after a text, every score side by side.

Shape legend: P prompt length, V vocabulary rows, K shown candidates.

At the last position of the text:

    S_k ~ Cauchy(loc_S_k, scale_S_k)          P_k = P(S_k > t_k) = atan2(scale_S_k, t_k − loc_S_k)/π   (OvR)
    softmax_k = exp(loc_S_k) / Σ_j exp(loc_S_j)                                                   (traditional)
    Y ~ Cauchy(loc_Y, scale_Y)                 median loc_Y, central q-interval loc_Y ± scale_Y·tan(π·q/2)

Candidates are ranked by the OvR decision (``(loc_S − t)/scale_S``, `cauchy.decision_score`, the order of
``P_k``; t are the thresholds); the first one is what standard mode generates.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ..core import cauchy
from ..core.numbers import format_prediction

logger = logging.getLogger(__name__)

__all__ = ["TokenCandidate", "NumberForecast", "NextStepView", "next_step_view", "predict_next"]


@dataclass
class TokenCandidate:
    """One vocabulary entry at the next step: its OvR probability, Cauchy score and softmax probability."""

    token_id: int
    token: str
    ovr_probability: float
    loc_S: float
    scale_S: float
    threshold: float
    softmax_probability: float
    softmax_rank: int


@dataclass
class NumberForecast:
    """The ``<NUM>`` decision and, should a number come next, its Cauchy median and central intervals; ``text``:
    the median as generation would write it, to the precision its scale carries (`numbers.format_prediction`);
    ``earlier_numbers``: the values of the row's numbers the read-out added, latest first (`heads.EarlierNumbers`:
    where the row's target comes next, for a model that reads them), else empty; ``row_numbers_before`` /
    ``earlier_numbers_wanted``: for a model that reads them, how many numbers the prompt's row holds before the
    forecast (since its latest line break) and how many a row holds before its target (None for other models)."""

    token_id: int
    ovr_probability: float
    softmax_probability: float
    ovr_rank: int
    median: float
    scale: float
    interval_50: tuple[float, float]
    interval_90: tuple[float, float]
    text: str = ""
    after: str = ""
    earlier_numbers: list[float] = field(default_factory=list)
    row_numbers_before: int | None = None
    earlier_numbers_wanted: int | None = None


@dataclass
class NextStepView:
    """``candidates``: the top-k by OvR probability; ``number``: the ``<NUM>`` forecast (always filled);
    ``standard_choice`` / ``traditional_choice``: argmax of OvR probability / of softmax; ``probability_sum``:
    ``Σ_k P_k`` over the whole vocabulary (OvR probabilities are separate decisions: near 1 for a calibrated model,
    far above it when many tokens' tails reach their thresholds)."""

    text: str
    threshold: float | None
    candidates: list[TokenCandidate]
    number: NumberForecast
    standard_choice: int
    traditional_choice: int
    probability_sum: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["number"]["interval_50"] = list(self.number.interval_50)
        out["number"]["interval_90"] = list(self.number.interval_90)
        return out


def next_step_view(
    model,
    input_ids: Tensor,
    numeric_values: Tensor | None = None,
    top_k: int = 10,
    token_text: Callable[[int], str] | None = None,
    text: str = "",
    min_decimals: int | None = None,
    lower_bound: float | None = None,
    decimal_comma: bool = False,
) -> NextStepView:
    """The view after ``input_ids`` (P,) or (1,P) (one sequence, no padding); ``token_text(id)`` names ids;
    ``min_decimals``: the fewest decimals the number's ``text`` is written with; ``lower_bound``: the least value
    the number takes (the tokenizer's ``number_lower_bound``), where its median and intervals are cut;
    ``decimal_comma``: the ``text`` is written with a decimal comma (the tokenizer's ``decimal_comma``)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)  # (1,P)
        numeric_values = None if numeric_values is None else numeric_values.reshape(1, -1)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must hold one non-empty sequence, got shape {tuple(input_ids.shape)}")
    token_text = token_text or str
    with torch.inference_mode():
        out = model(input_ids=input_ids, numeric_values=numeric_values, logits_to_keep=1, return_scores=True)
        loc_S, scale_S = out.loc_S[0, -1].float(), out.scale_S[0, -1].float()  # (V,) each
        threshold = model.ovr_thresholds().detach().float()  # () or (V,)
        probability = cauchy.ovr_probability(loc_S, scale_S, threshold)  # (V,)
        decision = cauchy.decision_score(loc_S, scale_S, threshold)  # (V,) (loc_S − t)/scale_S: the order of P
        softmax = torch.softmax(loc_S, dim=-1)  # (V,)
        k = min(top_k, loc_S.numel())
        order = decision.topk(k).indices.tolist()  # (K,)
        loc_Y, scale_Y = float(out.loc_Y[0, -1]), float(out.scale_Y[0, -1])

    def softmax_rank(token: int) -> int:
        return int((softmax > softmax[token]).sum()) + 1

    candidates = [
        TokenCandidate(
            token_id=token,
            token=token_text(token),
            ovr_probability=float(probability[token]),
            loc_S=float(loc_S[token]),
            scale_S=float(scale_S[token]),
            threshold=float(threshold if threshold.dim() == 0 else threshold[token]),
            softmax_probability=float(softmax[token]),
            softmax_rank=softmax_rank(token),
        )
        for token in order
    ]
    num_id = int(model.config.num_token_id)
    loc = torch.tensor(loc_Y, dtype=torch.float64)
    width = torch.tensor(scale_Y, dtype=torch.float64)
    floor = -math.inf if lower_bound is None else lower_bound  # the field's least value: no interval reaches below
    intervals = {q: tuple(max(float(x), floor) for x in cauchy.central_interval(loc, width, q)) for q in (0.5, 0.9)}
    median = max(loc_Y, floor)  # the median of the forecast cut at the floor: never outside its own intervals
    number = NumberForecast(
        token_id=num_id,
        ovr_probability=float(probability[num_id]),
        softmax_probability=float(softmax[num_id]),
        ovr_rank=int((decision > decision[num_id]).sum()) + 1,
        median=median,
        scale=scale_Y,
        interval_50=intervals[0.5],
        interval_90=intervals[0.9],
        text=format_prediction(median, scale_Y, min_decimals=min_decimals, decimal_comma=decimal_comma)
        if math.isfinite(median) else str(median),
        **earlier_numbers_read(model, input_ids, numeric_values),
    )
    return NextStepView(
        text=text,
        threshold=float(threshold) if threshold.dim() == 0 else None,
        candidates=candidates,
        number=number,
        standard_choice=order[0],
        traditional_choice=int(softmax.argmax()),
        probability_sum=float(probability.double().sum()),
    )


def earlier_numbers_read(model, input_ids: Tensor, numeric_values: Tensor | None) -> dict[str, Any]:
    """`NumberForecast`'s earlier-numbers fields at the last position of ``input_ids`` (1,P): the values the
    read-out adds there, latest first (the row's last ``K`` numbers where its target comes next,
    `heads.EarlierNumbers`; empty elsewhere), the numbers the row holds before that position and the count a row
    holds before its target; nothing for a model without them."""
    earlier = model.action.earlier_numbers
    if earlier is None:
        return {}
    with torch.inference_mode():
        values, read = earlier.values(input_ids, numeric_values, int(model.config.num_token_id))  # (1,P,K), (1,P)
    before = int(read[0, -1])
    added = values[0, -1, :earlier.target].tolist() if before == earlier.target else []  # k read before number k
    return {"earlier_numbers": added, "row_numbers_before": before, "earlier_numbers_wanted": int(earlier.target)}


_WRITTEN_WITHOUT_SPACES = ("CJK ", "IDEOGRAPHIC ", "HIRAGANA", "KATAKANA", "HALFWIDTH KATAKANA", "BOPOMOFO", "YI ",
                           "THAI ", "LAO ", "KHMER ", "MYANMAR ", "TIBETAN ", "FULLWIDTH ")
"""Unicode names of the scripts (and full-width forms) whose text puts no space between a word and a number
(``温度是25度``); Korean does (``온도는 25도``)."""


_BINDS_TO_A_NUMBER = "#+±~≈^/\"'\u2212"  # ~25, ±0.5, 1/4, "25": signs and quotes written against the number


def space_before_number(text: str) -> bool:
    """Whether a number written right after ``text`` would come after a space: after a word, a number or closing
    and separating punctuation (``sold``, ``24``, ``Total:``, ``x =``, ``3,``), but not after a space already
    there, an opening bracket or quote, a currency sign, a dash or a sign that binds to the number (``(``, ``“``,
    ``"``, ``$``, ``10-``, ``±``, ``~``, ``#``), nor after a script written without spaces (``温度是``, ``温度：``)."""
    last = text[-1]
    if last.isspace() or last in _BINDS_TO_A_NUMBER or unicodedata.category(last) in ("Ps", "Pi", "Pd", "Sc"):
        return False
    return not unicodedata.name(last, "").startswith(_WRITTEN_WITHOUT_SPACES)


def predict_next(model, tokenizer, text: str, top_k: int = 10) -> NextStepView:
    """`next_step_view` after ``text`` tokenized by the `NumericTokenizer` (numbers read as values).

    A number written after a word has a token of its own before it, the space (``"sold 24.3"`` reads ``' sold'``,
    ``' '``, ``<NUM>``; ``"Total: 5"`` reads ``':'``, ``' '``, ``<NUM>``), so right after such a text the model
    predicts that space, not the number, and its number forecast there was never trained. Where a number would
    follow a space (`space_before_number`) the ``<NUM>`` forecast is read one token on, after ``text + " "``
    (``number.after == " "``); the candidates stay those right after ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    if text == "":
        raise ValueError("text is empty: give the text whose next step to predict")
    device = model.model.embed_tokens.weight.device
    encoded = tokenizer([text], return_tensors="pt")
    input_ids = encoded["input_ids"].to(device)  # (1,P)
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and input_ids.shape[1] > limit:
        raise ValueError(f"the text is {input_ids.shape[1]:,} tokens long; the model reads at most {limit:,} positions "
                         "(config.max_position_embeddings): shorten it")
    values = encoded["numeric_values"].to(device) if "numeric_values" in encoded else None
    num_id = int(model.config.num_token_id)

    def token_text(token: int) -> str:
        if token == num_id:
            return "<NUM>"
        return tokenizer.decode([token], skip_special_tokens=False)

    written = dict(min_decimals=getattr(tokenizer, "number_min_decimals", None),  # as generation writes it
                   lower_bound=getattr(tokenizer, "number_lower_bound", None),
                   decimal_comma=getattr(tokenizer, "decimal_comma", False))
    view = next_step_view(model, input_ids, values, top_k=top_k, token_text=token_text, text=text, **written)
    spaced = tokenizer([text + " "], return_tensors="pt") if space_before_number(text) else None
    if spaced is not None and (not isinstance(limit, int) or spaced["input_ids"].shape[1] <= limit):
        after_space = next_step_view(model, spaced["input_ids"].to(device), spaced["numeric_values"].to(device),
                                     top_k=1, token_text=token_text, text=text + " ", **written)
        view.number = replace(after_space.number, after=" ")
    return view
