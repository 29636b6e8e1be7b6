"""Sums over the whole vocabulary of the One-vs-Rest angles ``π·P_k = atan2(σ·r_k, t − l_k)``, for many settings.

Shape legend: N positions, V vocabulary rows, K the top logits of a position computed exactly.

The calibration (`calibration.ovr_figures`) needs ``Σ_k atan2(σ r_k, t − l_k)`` at every position for a grid of
thresholds ``t = L − m·σ`` and scales ``σ``. One ``atan2`` over (N,V) per setting costs about ten times a
multiplication, and most of the V terms are far below the threshold, where the angle is a power series:

    z_k = σ r_k / (t − l_k) = σ r_k u_k / (1 − ε u_k),   u_k = 1/(L − l_k),  ε = m·σ,
    atan z = z − z³/3 + O(z⁵),      1/(1 − ε u) = 1 + ε u + (ε u)² + …

so over a position's *tail* (every token outside its `EXACT_TOP` largest logits) the sum is

    Σ_tail atan z_k ≈ σ·Σ_{j=0..4} ε^j·M1_{j+1} − (σ³/3)·(M3_3 + 3 ε M3_4),   M1_j = Σ r u^j,  M3_j = Σ r³ u^j,

with moments that depend on the level ``L`` only, computed once per level in a few cheap passes. The series is
used where every tail gap is wide, ``L − l_k ≥ TAIL_GAP·σ·(max r + |m|)``: there ``z ≤ 10⁻²`` and ``ε u ≤ 10⁻²``,
so the terms left out are below 10⁻⁸ of the sum (float32's own rounding is 6·10⁻⁸). The top logits are
computed exactly, and so is every position whose tail is too close to the level for a setting.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.row_blocks import row_blocks, rows_per_block

EXACT_TOP = 256  # per position: the largest logits whose angles are computed exactly
TAIL_GAP = 100.0  # the series needs every tail gap L − l_k ≥ TAIL_GAP·σ·(max r + |m|) ...
MIN_TAIL_GAP = 1e-3  # ... and ≥ this, which keeps the powers u^j of the moments within float32's range
MARGIN_ORDERS = 5  # M1_1 … M1_5: the expansion of 1/(1 − ε u) to (ε u)⁴


class AngleSums:
    """``Σ_k atan2(σ r_k, t − l_k)`` per position for settings ``(L, σ, m)``, ``t = L − m σ``.

    logits (N,V) float32, scales ``r`` (V,) float32 (near 1). `top` may pass each position's largest logits and
    their ids, descending, at least ``EXACT_TOP + 1`` of them when V is larger."""

    def __init__(self, logits: Tensor, scales: Tensor, top: tuple[Tensor, Tensor] | None = None) -> None:
        self.logits = logits  # (N,V)
        self.scales = scales  # (V,)
        self.max_scale = float(scales.max())
        self.block_rows = rows_per_block(logits.shape[-1])  # a few rows at a time: temporaries stay on the heap
        kept = min(EXACT_TOP, logits.shape[-1])
        if top is None:
            top = logits.topk(min(kept + 1, logits.shape[-1]), dim=-1)
        values, ids = top
        self.top_values = values[:, :kept]  # (N,K)
        self.top_ids = ids[:, :kept]  # (N,K)
        self.has_tail = logits.shape[-1] > kept
        self.tail_max = values[:, kept] if self.has_tail else None  # (N,) the largest logit of the tail
        self._moments: dict[tuple[float, bool], tuple[Tensor, Tensor]] = {}

    def __call__(self, level: float, sigma: float, margin: float) -> Tensor:
        """(N,) float64: the sum of the angles over the whole vocabulary at every position."""
        threshold = level - margin * sigma
        column_scales = sigma * self.scales  # (V,) σ r_k
        if not self.has_tail:
            return self._exact(threshold, column_scales, torch.arange(len(self.logits), device=self.logits.device))
        top_angles = torch.atan2(column_scales[self.top_ids], threshold - self.top_values)  # (N,K)
        total = top_angles.sum(dim=-1).double()  # (N,)
        gap = level - self.tail_max  # (N,) the narrowest tail gap
        series = gap >= max(TAIL_GAP * sigma * (self.max_scale + abs(margin)), MIN_TAIL_GAP)  # (N,) bool
        if bool(series.any()):
            m1, m3 = self._tail_moments(level, with_margin=margin != 0.0)  # (N,J), (N,2) float64
            epsilon = margin * sigma
            powers = torch.tensor([epsilon**j for j in range(m1.shape[1])], dtype=torch.float64)  # (J,)
            powers = powers.to(m1.device)
            tail = sigma * (m1 * powers).sum(dim=-1) - sigma**3 / 3.0 * (m3[:, 0] + 3.0 * epsilon * m3[:, 1])
            total = torch.where(series, total + tail, total)
        exact_rows = (~series).nonzero()[:, 0]
        if len(exact_rows):
            total[exact_rows] = self._exact(threshold, column_scales, exact_rows)
        return total

    def _exact(self, threshold: float, column_scales: Tensor, rows: Tensor) -> Tensor:
        """(R,) float64: atan2 over every token of the given rows (summed in float32, pairwise)."""
        sums = []
        for block in rows.split(self.block_rows):
            angle = torch.atan2(column_scales, threshold - self.logits[block])  # (n,V)
            sums.append(angle.sum(dim=-1).double())
        return torch.cat(sums)

    def _tail_moments(self, level: float, with_margin: bool) -> tuple[Tensor, Tensor]:
        """Per position, over its tail: ``M1_j = Σ r u^j`` for j = 1 … (`MARGIN_ORDERS` with a margin, else 1)
        and ``M3_3, M3_4 = Σ r³ u³, Σ r³ u⁴``, ``u = 1/(L − l)``: (N,J) and (N,2) float64. Rows whose tail
        reaches the level hold meaningless values (the caller computes those exactly)."""
        cached = self._moments.get((level, True)) or self._moments.get((level, with_margin))
        if cached is not None:  # the longer expansion serves any setting of the level
            return cached
        orders = MARGIN_ORDERS if with_margin else 1
        m1 = torch.empty(len(self.logits), orders, dtype=torch.float64, device=self.logits.device)
        m3 = torch.empty(len(self.logits), 2, dtype=torch.float64, device=self.logits.device)
        for rows in row_blocks(*self.logits.shape):
            u = (level - self.logits[rows]).reciprocal_()  # (n,V)
            u.scatter_(1, self.top_ids[rows], 0.0)  # the tail only
            term = u * self.scales  # (n,V) r u
            cube = term * term * term  # (n,V) r³ u³
            for j in range(orders):
                m1[rows, j] = term.sum(dim=-1).double()  # M1_{j+1}
                if j + 1 < orders:
                    term.mul_(u)
            m3[rows, 0] = cube.sum(dim=-1).double()
            m3[rows, 1] = cube.mul_(u).sum(dim=-1).double()
        self._moments[level, with_margin] = (m1, m3)
        return m1, m3
