"""The causal temperature ``τ``, calibrated at conversion: causal choices per token close to the base's softmax.

Shape legend: N positions, H hidden size, C causal size, V vocabulary rows, K candidates per position (each
position's ``top`` largest logits), D draws of ``ε`` per position, G temperatures.

In causal mode an individual is drawn for each generated token and decides with only the exogenous noise left:

    u      = loc_U + τ·ρ(g)·scale_U ⊙ tan(π(ε − ½)),   ε ~ U(0,1)^C,   g the top-two logit margin
    choice = argmax over the K candidates of (W_k u + b_k − t_k) / scale_S_k,   scale_S = |W_cls|·|b_noise| + γ_S

(`core.decisions`: ``ρ`` the spread factor, the candidates the ``K`` best standard-mode scores). Since
``W_k u + b_k = l_k + τ·ρ(g)·n_k`` with ``l = loc_S`` (the base's logits) and ``n_k = W_k (scale_U ⊙ tan(π(ε − ½)))``,
``τ`` only scales the individual's spread: every token's score moves by a Cauchy of scale ``τ·ρ(g)·(|W| scale_U)_k``,
the moves correlated across tokens through the shared ``ε``. The calibration draws exactly that decision: the same
candidates, the same ``ρ``, so no causal choice falls outside what it measures. ``τ`` is read by causal mode alone; it touches neither
``loc_S`` nor ``scale_S``, so standard mode, the losses and training never see it. After the OvR calibration
``scale_U`` is ~4e-9 (sparse probabilities need it), so ``τ = 1`` leaves causal mode almost deterministic.

`calibrate_causal_temperature` chooses ``τ`` to minimise the cross-entropy ``−Σ_k p_k log f_k(τ)`` (nats per
position, averaged) between the base's next-token distribution ``p = softmax(l)`` and the causal choice
frequencies ``f(τ)``, measured by `choice_cross_entropy`. The cross-entropy is at least the softmax entropy
``H(p)``, with equality only when ``f = p``; the Cauchy family cannot reach it in general (its choices are not a
Gumbel-max), so the fit reports how far it stays. With two candidates ``ρ`` makes it exact: one ``τ`` matches the
softmax at every margin (`core.decisions.spread_factor`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from .. import progress
from ..core.decisions import spread_factor

DEFAULT_POSITIONS = 512  # of the calibration text's positions, spread evenly over them
# ε per position: fewer bias τ down through the add-½ smoothing (real weights: 0.87, 0.90, 0.96 τ₀ at 256, 512, 1024)
DEFAULT_DRAWS = 512
DEFAULT_TOP = 64  # candidates per position when the model's config names none (causal_candidates 0: every token)
COARSE_EXPONENTS = tuple(range(-3, 3))  # τ = τ₀·10^e for whole decades e
REFINEMENTS = (8, 64)  # then steps of 1/8 and 1/64 decade, ±8 steps around the best so far
STEPS_PER_DECADE = 64  # exponents are kept as integers in units of the finest step
CHUNK = 32  # positions per block of draws
LOGIT_CHUNK = 256  # positions per pass over the vocabulary
MAX_EVALUATIONS = 1 + len(COARSE_EXPONENTS) + 17 * len(REFINEMENTS)  # τ tried by `search_temperature`, at most
EPSILON_FLOOR = 2.0**-24  # float32 ε: |tan(π(ε − ½))| ≤ ~5e6 (the Cauchy mass cut off beyond is ~6e-8)


@dataclass
class CausalTemperatureFit:
    """The calibrated ``τ`` and what it measured (nats per position, means over ``positions``).

    temperature: the chosen ``τ`` (0 when no ``τ > 0`` beats it); objective: what it minimised (`objective_of`);
    surprisal: ``E_f[−log p]`` at it (to compare with softmax_entropy); cross_entropy: ``−Σ_k p_k log f_k`` at it;
    softmax_entropy: ``H(p)`` over the candidates (the cross-entropy's lower bound); grid / grid_cross_entropy:
    every ``τ`` tried, ascending, and its cross-entropy; unit: ``τ₀``, at which the median candidate's score moves
    by a Cauchy of scale one logit; outside_mass: the softmax mass outside the candidates, mean.
    """

    temperature: float
    cross_entropy: float
    softmax_entropy: float
    grid: list[float]
    grid_cross_entropy: list[float]
    positions: int
    draws: int
    top: int = DEFAULT_TOP
    objective: str = "surprisal"
    surprisal: float = math.nan
    unit: float = math.nan
    outside_mass: float = math.nan
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CandidateDraws:
    """Each position's candidates and its draws of the individual's noise, shared by every ``τ`` tried.

    probs: ``p`` renormalised over the candidates (N,K); distance: ``l_k − t_k`` (N,K); noise:
    ``n = W_top (scale_U ⊙ tan(π(ε − ½)))`` (N,D,K); scale: causal ``scale_S_k`` (N,K), or ``None`` when every
    candidate's is positive and ``distance`` and ``noise`` are already divided by it (the choice at ``τ`` is then
    ``argmax_k distance_k + τ·noise_k``, one pass); unit_scale: ``(|W_top| scale_U)_k`` (N,K), the Cauchy scale of
    ``n_k``; entropy: ``H(p)`` over the candidates (N,); full_entropy: the softmax entropy over the whole vocabulary
    (N,); outside_mass: ``1 − Σ_candidates softmax`` (N,). probs and the (N,) tensors are float64, the rest float32.
    """

    probs: Tensor
    distance: Tensor
    noise: Tensor
    scale: Tensor | None
    unit_scale: Tensor
    entropy: Tensor
    full_entropy: Tensor
    outside_mass: Tensor

    @property
    def positions(self) -> int:
        return self.noise.shape[0]

    @property
    def draws(self) -> int:
        return self.noise.shape[1]

    @property
    def top(self) -> int:
        return self.noise.shape[2]

    @classmethod
    @torch.no_grad()
    def draw(
        cls, model, features: Tensor, draws: int, top: int, generator: torch.Generator | None = None,
        advance: Callable[[int], object] | None = None,
    ) -> "CandidateDraws":
        """Candidates and ``draws`` ε per position of ``features`` (N,H), the backbone's last hidden states, on their
        device (ε drawn on the CPU by ``generator``: the same draws on every device). ``advance(1)`` after each
        block of `CHUNK` positions."""
        if draws < 1 or top < 1:
            raise ValueError(f"draws and top must be positive, got draws={draws!r}, top={top!r}")
        heads = _Heads.of(model)
        loc_U, scale_U = heads.abduct(features.float())  # (N,C) each
        top = min(top, heads.weight.shape[0])
        logits, ids, full_entropy, outside_mass, margin = top_candidates(heads, loc_U, scale_U, top)  # (N,K)×2, (N,)×3
        log_probs = logits.double().log_softmax(dim=-1)  # (N,K) p renormalised over the candidates
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(dim=-1)  # (N,)
        parts = []
        for start in range(0, len(features), CHUNK):
            parts.append(_draw_block(heads, loc_U, scale_U, logits, ids, start, draws, generator))
            if advance is not None:
                advance(1)
        distance, scale, noise, unit_scale = (torch.cat(part) for part in zip(*parts))
        noise.mul_(spread_factor(margin).to(noise.device)[:, None, None])  # (N,D,K) ρ(g)·n
        if bool((scale > 0).all()):  # (d + τ n)/scale_S = d/scale_S + τ·(n/scale_S)
            distance, noise, scale = distance / scale, noise.div_(scale[:, None, :]), None
        return cls(probs, distance, noise, scale, unit_scale, entropy, full_entropy, outside_mass)

    def counts(self, temperature: float) -> Tensor:
        """How often each candidate is chosen at ``τ = temperature`` (N,K), over the D draws of every position."""
        shifted = torch.add(self.distance[:, None, :], self.noise, alpha=temperature)  # (N,D,K) d + τ n
        choice = shifted.argmax(dim=-1) if self.scale is None else causal_choice(shifted, self.scale)  # (N,D)
        flat = choice + self.top * torch.arange(self.positions, device=choice.device)[:, None]  # (N,D) position·K + k
        return torch.bincount(flat.reshape(-1), minlength=self.positions * self.top).view(self.probs.shape).double()

    def cross_entropy(self, temperature: float) -> float:
        """Mean over positions of ``−Σ_k p_k log f_k``, ``f_k = (count_k + ½)/(D + K/2)`` (add-½ smoothing)."""
        frequencies = (self.counts(temperature) + 0.5) / (self.draws + 0.5 * self.top)  # (N,K)
        return float(-(self.probs * frequencies.log()).sum(dim=-1).mean())

    def surprisal(self, temperature: float) -> float:
        """Mean over positions of ``E_f[−log p̄] = −Σ_k f_k log p̄_k``, ``f_k = count_k / D``, with ``p̄`` the base's
        softmax over the whole vocabulary (``log p̄_k = log p_k + log(1 − outside_mass)``): how surprising the base
        finds the causal choices. Its own samples score ``H(p̄)`` (``full_entropy``) here, the target of the
        ``"surprisal"`` objective, whatever share of its mass lies outside the candidates."""
        frequencies = self.counts(temperature) / self.draws  # (N,K)
        log_full = self.probs.log() + torch.log1p(-self.outside_mass.clamp_max(1 - 1e-12))[:, None]  # (N,K) log p̄
        return float(-(frequencies * log_full).sum(dim=-1).mean())

    def unit(self) -> float:
        """``τ₀ = 1/median(|W_top| scale_U)``: at ``τ = τ₀`` the median candidate's score moves by a Cauchy of scale
        one logit (``inf`` when the individual has no spread)."""
        median = float(self.unit_scale.median())
        return 1.0 / median if median > 0 else math.inf


@dataclass
class _Heads:
    """The parts of a CausalQwen model that causal mode reads, float32 and detached."""

    loc_weight: Tensor  # (C,H)
    loc_bias: Tensor  # (C,)
    scale_weight: Tensor  # (C,H)
    scale_bias: Tensor  # (C,)
    weight: Tensor  # (V,C) W_cls (its own dtype; rows are gathered and cast as needed)
    bias: Tensor | None  # (V,) b_cls
    noise: Tensor  # (C,) |b_noise|
    token_noise: float  # γ_S
    thresholds: Tensor  # () or (V,)

    @classmethod
    def of(cls, model) -> "_Heads":
        abduction, action = model.abduction, model.action
        head = action.classification_head

        def f32(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.detach().float()

        return cls(
            loc_weight=f32(abduction.loc_net.weight),
            loc_bias=f32(abduction.loc_net.bias),
            scale_weight=f32(abduction.scale_net.weight),
            scale_bias=f32(abduction.scale_net.bias),
            weight=head.weight.detach(),
            bias=f32(head.bias),
            noise=f32(action.b_noise).abs(),
            token_noise=float(action.token_noise.detach().abs()),
            thresholds=f32(model.ovr_thresholds.values),
        )

    def abduct(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """``loc_U = W_loc z + b_loc``, ``scale_U = softplus(W_scale z + b_scale)``: (N,C) each."""
        loc_U = F.linear(features, self.loc_weight, self.loc_bias)
        scale_U = F.softplus(F.linear(features, self.scale_weight, self.scale_bias))
        return loc_U, scale_U

    def thresholds_of(self, ids: Tensor) -> Tensor:
        """``t_k`` of the candidates ``ids`` (n,K)."""
        return self.thresholds.expand(ids.shape) if self.thresholds.dim() == 0 else self.thresholds[ids]


@torch.no_grad()
def top_candidates(
    heads: _Heads, loc_U: Tensor, scale_U: Tensor, top: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Each position's causal candidates, as causal mode picks them (`core.decisions`): the ``top`` best standard-mode
    scores ``(l_k − t_k)/scale_S_k``, ``scale_S = |W_cls|(scale_U + |b_noise|) + γ_S``. Returns their logits
    ``l = W_cls loc_U + b_cls`` and ids (N,K) each, in the order of the scores; the softmax entropy over the whole
    vocabulary, the softmax mass outside the candidates and the top-two logit margin ``g`` (N,) each, float64 (the
    mass as ``exp(lse_rest − lse)``, exact to float32's relative precision however small it is)."""
    w = heads.weight.float()  # (V,C)
    magnitude = w.abs()  # (V,C) |W_cls|, formed once for every block
    values, ids, entropies, outside, margins = [], [], [], [], []
    for start in range(0, len(loc_U), LOGIT_CHUNK):
        rows = slice(start, start + LOGIT_CHUNK)
        logits = F.linear(loc_U[rows], w, heads.bias)  # (n,V)
        scale = F.linear(scale_U[rows] + heads.noise, magnitude) + heads.token_noise  # (n,V) standard scale_S
        scores = (logits - heads.thresholds) / scale.clamp_min(torch.finfo(torch.float32).tiny)  # (n,V)
        normaliser = logits.logsumexp(dim=-1)  # (n,)
        probs = torch.softmax(logits, dim=-1)  # (n,V)
        entropies.append((normaliser - (probs * logits).sum(dim=-1)).double())  # H = lse − Σ p l
        pair = logits.topk(min(2, logits.shape[-1]), dim=-1).values  # (n,≤2)
        margins.append((pair[:, 0] - pair[:, -1]).double())  # (n,) 0 with one row
        best = scores.topk(top, dim=-1).indices  # (n,K)
        chosen = logits.gather(1, best)  # (n,K)
        rest = logits.scatter_(1, best, -math.inf).logsumexp(dim=-1)  # (n,) lse over the others
        outside.append((rest.double() - torch.logaddexp(rest, chosen.logsumexp(dim=-1)).double()).exp())
        values.append(chosen)
        ids.append(best)
    return torch.cat(values), torch.cat(ids), torch.cat(entropies), torch.cat(outside), torch.cat(margins)


def _draw_block(
    heads: _Heads, loc_U: Tensor, scale_U: Tensor, logits: Tensor, ids: Tensor, start: int, draws: int,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For positions ``start:start+CHUNK``: ``l − t`` (n,K), causal ``scale_S`` (n,K), the noise (n,D,K) and
    ``|W_top| scale_U`` (n,K)."""
    rows = slice(start, start + CHUNK)
    block_ids = ids[rows]  # (n,K)
    gathered = heads.weight[block_ids].float()  # (n,K,C) W_top
    magnitude = gathered.abs()  # (n,K,C)
    distance = logits[rows] - heads.thresholds_of(block_ids)  # (n,K) l_k − t_k
    scale = magnitude @ heads.noise + heads.token_noise  # (n,K) |W_k|·|b_noise| + γ_S
    spread = scale_U[rows]  # (n,C)
    unit_scale = (magnitude @ spread[:, :, None])[..., 0]  # (n,K) Σ_c |W_kc| scale_U_c
    epsilon = torch.rand((len(block_ids), draws, spread.shape[-1]), generator=generator).to(spread.device)  # (n,D,C)
    offsets = torch.tan(math.pi * (epsilon.clamp_min_(EPSILON_FLOOR) - 0.5))  # (n,D,C) standard Cauchy
    noise = torch.bmm(offsets * spread[:, None, :], gathered.transpose(1, 2))  # (n,D,K) W_top (scale_U ⊙ c)
    return distance, scale, noise, unit_scale


def causal_choice(distance: Tensor, scale: Tensor) -> Tensor:
    """The causal decision among candidates: ``argmax_k d_k/scale_S_k`` over the last dimension.

    distance: (N,D,K) ``d = W_k u + b_k − t_k`` (float32); scale: (N,K) causal ``scale_S_k ≥ 0``  →  (N,D) indices.
    A candidate with ``scale_S_k = 0`` is certain (``P_k = 1`` if ``d_k > 0``, else 0): where some certain
    candidate has ``d > 0`` the largest such ``d`` wins, else the largest ratio of the others; with no scale at all
    (no exogenous noise), ``argmax_k d_k`` (as causal mode decides, `causal_scores` in core/generation.py).
    """
    zero = (scale == 0)[:, None, :]  # (N,1,K)
    if not bool(zero.any()):
        return (distance / scale[:, None, :]).argmax(dim=-1)
    if bool(zero.all()):
        return distance.argmax(dim=-1)
    ratio = (distance / scale[:, None, :].masked_fill(zero, 1.0)).masked_fill(zero, -math.inf)  # (N,D,K)
    certain = distance.masked_fill(~zero | (distance <= 0), -math.inf)  # (N,D,K) d of candidates with P = 1
    has_certain = (certain > -math.inf).any(dim=-1, keepdim=True)  # (N,D,1)
    return torch.where(has_certain, certain, ratio).argmax(dim=-1)


def choice_cross_entropy(
    model, features: Tensor, temperature: float | Sequence[float], draws: int = DEFAULT_DRAWS, top: int | None = None,
    generator: torch.Generator | None = None,
) -> dict:
    """How close token-scope causal sampling at ``τ = temperature`` comes to the base's softmax ``p = softmax(loc_S)``.

    features: (N,H) backbone last hidden states; temperature: one ``τ ≥ 0`` or several (G); ``draws`` ε per
    position; ``top`` candidates per position; ``generator`` seeds the ε. Returns ``temperature`` (G,),
    ``cross_entropy`` (G,) ``−Σ_k p_k log f_k`` (mean nats per position), ``softmax_entropy`` ``H(p)`` over the
    candidates, ``softmax_entropy_full`` ``H`` over the vocabulary, ``outside_mass`` (the softmax mass outside
    the candidates), ``unit`` (``τ₀``, see `CandidateDraws.unit`), ``positions`` and ``draws``.

    The frequencies are a Monte Carlo estimate, ``f_k = (count_k + ½)/(D + K/2)`` over each position's candidates:
    the add-½ (Krichevsky–Trofimov) smoothing keeps ``log f_k`` finite for a candidate never chosen. Three
    simplifications, with their biases:

    * *Candidates.* Each position's ``top`` largest logits, ``p`` renormalised over them (the mass outside is
      reported). A token outside them can never be chosen here, while in causal mode a large ``τ`` lets any token
      of the vocabulary win: at large ``τ`` this understates how spread out the choices are, so it favours large
      ``τ`` slightly; at the ``τ`` that matters the choice rarely leaves the top logits.
    * *Smoothing.* It pulls ``f`` towards uniform: the cross-entropy is overstated by about ``K/(2D)`` nats where
      ``f`` is estimated well, and capped at ``log((D + K/2)/½)`` for candidates never chosen. Both are nearly the
      same at every ``τ``, so the minimiser moves little; the value itself sits above the true cross-entropy.
    * *Common random numbers.* The noise ``n = W_top (scale_U ⊙ tan(π(ε − ½)))`` (D,K) of a position is drawn once
      and reused for every ``τ``: the choice at ``τ`` is ``argmax_k (l_k + τ n_k − t_k)/scale_S_k``. Differences
      between two ``τ`` then come from ``τ`` alone, not from fresh noise, so the curve is smooth enough to take its
      minimum on a fine grid (and the draws are paid for once).
    """
    temperatures = [float(temperature)] if isinstance(temperature, (int, float)) else [float(t) for t in temperature]
    for value in temperatures:
        _check_temperature(value)
    candidates = CandidateDraws.draw(model, features, draws, candidate_count(model, top), generator)
    return {
        "temperature": torch.tensor(temperatures, dtype=torch.float64),
        "cross_entropy": torch.tensor([candidates.cross_entropy(value) for value in temperatures], dtype=torch.float64),
        "softmax_entropy": float(candidates.entropy.mean()),
        "softmax_entropy_full": float(candidates.full_entropy.mean()),
        "outside_mass": float(candidates.outside_mass.mean()),
        "unit": candidates.unit(),
        "positions": candidates.positions,
        "draws": candidates.draws,
    }


def candidate_count(model, top: int | None = None) -> int:
    """The candidates per position to draw: ``top`` when given, else the model's ``config.causal_candidates`` (the
    ``K`` causal mode chooses among), or `DEFAULT_TOP` when that is 0 (every token: the calibration then measures
    the 64 best, an approximation) or absent."""
    if top is not None:
        return top
    configured = int(getattr(getattr(model, "config", None), "causal_candidates", 0) or 0)
    return configured if configured > 0 else DEFAULT_TOP


def _check_temperature(value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"a causal temperature must be a finite number >= 0, got {value!r}")


def spread_subset(features: Tensor, positions: int) -> Tensor:
    """``positions`` rows of ``features`` (N,H) spread evenly over them (all rows when there are no more)."""
    if len(features) <= positions:
        return features
    rows = torch.linspace(0, len(features) - 1, positions, device=features.device).round().long()  # (P,)
    return features[rows]


OBJECTIVES = ("surprisal", "cross_entropy")


def objective_of(candidates: CandidateDraws, objective: str) -> Callable[[float], float]:
    """What `search_temperature` minimises: ``"surprisal"``, the distance ``|E_f[−log p̄] − H(p̄)|`` between how
    surprising the base finds causal choices and its own samples, under its softmax ``p̄`` over the whole vocabulary
    (the fluency of sampling, per token); ``"cross_entropy"``, ``−Σ_k p_k log f_k`` over the candidates (how well
    the choices cover the softmax)."""
    if objective == "cross_entropy":
        return candidates.cross_entropy
    if objective == "surprisal":
        entropy = float(candidates.full_entropy.mean())
        return lambda temperature: abs(candidates.surprisal(temperature) - entropy)
    raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")


def search_temperature(
    candidates: CandidateDraws, advance: Callable[[int], object] | None = None, objective: str = "surprisal"
) -> tuple[float, dict[float, float]]:
    """The ``τ`` with the lowest value of the ``objective`` (`objective_of`), and that value for every ``τ`` tried.

    ``τ = τ₀·10^e``: whole decades ``e`` of `COARSE_EXPONENTS`, then ±8 steps of each of `REFINEMENTS` around the
    best so far (the first refinement spans the neighbouring decades, the next the neighbouring eighths). ``τ = 0``
    is a candidate too and wins ties: when no ``τ > 0`` beats it, the answer is 0. ``advance(1)`` after each ``τ``
    (at most `MAX_EVALUATIONS`)."""
    step = advance if advance is not None else (lambda n: None)
    measure = objective_of(candidates, objective)
    tried = {0.0: measure(0.0)}
    step(1)
    unit = candidates.unit()
    if not math.isfinite(unit):
        return 0.0, tried
    by_exponent: dict[int, float] = {}  # e in units of 1/STEPS_PER_DECADE decade → cross-entropy

    def evaluate(exponents) -> None:
        for exponent in exponents:
            if exponent not in by_exponent:
                by_exponent[exponent] = measure(unit * 10.0 ** (exponent / STEPS_PER_DECADE))
                step(1)

    evaluate(e * STEPS_PER_DECADE for e in COARSE_EXPONENTS)
    for steps in REFINEMENTS:
        best = min(by_exponent, key=by_exponent.get)
        stride = STEPS_PER_DECADE // steps
        evaluate(best + q * stride for q in range(-8, 9))
    tried.update({unit * 10.0 ** (e / STEPS_PER_DECADE): value for e, value in by_exponent.items()})
    best = min(tried, key=lambda value: (tried[value], value))  # ties: the smaller τ (0 first)
    return best, tried


def calibrate_causal_temperature(
    model, features: Tensor, *, positions: int = DEFAULT_POSITIONS, draws: int = DEFAULT_DRAWS, top: int | None = None,
    seed: int = 0, objective: str = "surprisal",
) -> CausalTemperatureFit:
    """``τ`` minimising the ``objective`` (`objective_of`) on ``positions`` of ``features`` (N,H) spread evenly, by
    `search_temperature` (a log-spaced grid relative to ``τ₀``, so the same whatever the size of ``scale_U``);
    deterministic given ``seed``. ``model`` is read, never changed."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    subset = spread_subset(features, positions)
    blocks = math.ceil(len(subset) / CHUNK)
    with progress.bar(total=blocks + MAX_EVALUATIONS, desc="calibration: causal temperature", unit="step") as bar:
        candidates = CandidateDraws.draw(model, subset, draws, candidate_count(model, top), generator,
                                         advance=bar.update)
        temperature, tried = search_temperature(candidates, advance=bar.update, objective=objective)
        bar.update(bar.total - bar.n)  # the τ not tried (repeats, or no spread at all)
    grid = sorted(tried)
    return CausalTemperatureFit(
        temperature=temperature,
        cross_entropy=candidates.cross_entropy(temperature),
        softmax_entropy=float(candidates.entropy.mean()),
        grid=grid,
        grid_cross_entropy=[candidates.cross_entropy(value) for value in grid],
        objective=objective,
        surprisal=candidates.surprisal(temperature),
        positions=candidates.positions,
        draws=candidates.draws,
        top=candidates.top,
        unit=candidates.unit(),
        outside_mass=float(candidates.outside_mass.mean()),
        seconds=time.perf_counter() - started,
    )
