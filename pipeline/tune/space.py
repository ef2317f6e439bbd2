"""The feasible weights of a mixture, as pure maths: what `sweep` samples and `fit` searches.

A mixture weighs cells in one or more groups (its phases, or the one unnamed group). In a
group the weights sum to 1 and a cell's weight is capped by what it can give without more
than its `max_epochs`:

    cap(c) = min(1, max_epochs(c) x available_tokens(c) / target_tokens)

(the target of simulated epoching when the mixture has one: the epochs are the full run's;
no target: the mixture takes the largest size that repeats nothing, so every weight is
feasible). The feasible set is each group's simplex cut by its caps; `clip` maps any point
of the simplex into it by water-filling (capped cells take their cap, the others share the
rest in proportion), the same rule the mix's `on_shortfall: renormalize` applies, so an
optimum beyond a cap lands on the cap.

Example:

    sp = Space([Group(None, ["web", "wiki"], np.array([1.0, 0.4]), np.array([0.5, 0.5]))])
    sp.clip(np.array([0.3, 0.7]))   # -> [0.6, 0.4]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DECIMALS = 4  # weights written to variant files



def normed(w) -> np.ndarray:
    """Weights scaled to sum to 1 (uniform when they sum to 0)."""
    w = np.asarray(w, float)
    return w / w.sum() if w.sum() > 0 else np.full(len(w), 1 / len(w))

@dataclass(frozen=True)
class Group:
    phase: str | None  # None: the mixture's top-level weights
    cells: list[str]
    caps: np.ndarray  # per cell, in [0, 1]
    base: np.ndarray  # the file's weights, summing to 1

    def columns(self) -> list[str]:
        return [c if self.phase is None else f"{self.phase}:{c}" for c in self.cells]


class Space:
    """The product of the groups' capped simplices; a point is one flat vector of weights."""

    def __init__(self, groups: list[Group]):
        self.groups = groups
        self.slices = []
        at = 0
        for g in groups:
            self.slices.append(slice(at, at + len(g.cells)))
            at += len(g.cells)
        self.dim = at
        self.caps = np.concatenate([g.caps for g in groups])
        self.base = np.concatenate([g.base for g in groups])

    def columns(self) -> list[str]:
        return [c for g in self.groups for c in g.columns()]

    def clip(self, w: np.ndarray) -> np.ndarray:
        """The point of the feasible set that water-filling gives for `w` (each group
        normalized to 1 first)."""
        out = np.empty(self.dim)
        for sl in self.slices:
            out[sl] = water_fill(np.asarray(w[sl], float), self.caps[sl])
        return out

    def feasible(self, w: np.ndarray, tol: float = 1e-6) -> bool:
        return bool(np.all(w >= -tol) and np.all(w <= self.caps + tol)
                    and all(abs(w[sl].sum() - 1) <= tol for sl in self.slices))

    def sample(self, n: int, seed: int, concentration: float = 1.0) -> np.ndarray:
        """n feasible points: per group a Dirichlet centred on the file's weights (mixed with
        5% uniform so no cell is never drawn), concentration x cells in total: 1 spreads
        about as widely as a uniform draw, 10 stays near the file's weights; then clipped."""
        rng = np.random.default_rng(seed)
        out = np.empty((n, self.dim))
        for g, sl in zip(self.groups, self.slices, strict=True):
            k = len(g.cells)
            alpha = concentration * k * (0.95 * g.base + 0.05 / k)
            draws = rng.dirichlet(alpha, size=n)
            out[:, sl] = [water_fill(d, g.caps) for d in draws]
        return out

    def candidates(self, n: int, seed: int) -> np.ndarray:
        """Uniform feasible points (Dirichlet(1), clipped) and every vertex clipped: where
        the fit starts its search."""
        rng = np.random.default_rng(seed)
        pts = [self.clip(np.concatenate([rng.dirichlet(np.ones(len(g.cells))) for g in self.groups])) for _ in range(n)]
        for sl in self.slices:  # vertices of one group at a time, the others at the file's weights
            for i in range(sl.start, sl.stop):
                v = self.base.copy()
                v[sl] = 0.0
                v[i] = 1.0
                pts.append(self.clip(v))
        pts.append(self.clip(self.base))
        return np.array(pts)

    def rounded(self, w: np.ndarray) -> np.ndarray:
        """`w` at DECIMALS decimals, each group summing to exactly 1 and every cap kept (the
        rounding error goes to the cell with the most room)."""
        out = np.round(np.asarray(w, float), DECIMALS)
        step = 10.0 ** -DECIMALS
        for sl in self.slices:
            caps = np.floor(self.caps[sl] / step + 1e-9) * step
            part = np.minimum(out[sl], caps)
            for _ in range(len(part) + 1):
                err = round(1.0 - part.sum(), DECIMALS)
                if abs(err) < step / 2:
                    break
                room = (caps - part) if err > 0 else part
                i = int(np.argmax(room))
                part[i] = round(part[i] + (min(err, room[i]) if err > 0 else -min(-err, room[i])), DECIMALS)
            out[sl] = part
        return out


def water_fill(w: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """`w` normalized to sum 1, then every cell above its cap set to the cap and the excess
    shared among the others in proportion to their weights (their caps in turn respected);
    cells of weight 0 share what is left when no other can take it."""
    w = np.clip(np.asarray(w, float), 0, None)
    if w.sum() <= 0:
        w = np.ones_like(w)
    w = w / w.sum()
    if caps.sum() < 1 - 1e-9:
        raise ValueError("the caps sum to less than 1: no weights are feasible")
    fixed = np.zeros(len(w), bool)
    for _ in range(len(w) + 1):
        left = 1.0 - caps[fixed].sum()
        free = ~fixed
        share = w[free].sum()
        out = np.where(fixed, caps, 0.0)
        if share > 0:
            out[free] = w[free] / share * left
        else:  # only zero-weight cells have room: share equally within their caps
            out[free] = left / free.sum()
        over = free & (out > caps + 1e-12)
        if not over.any():
            return out
        fixed |= over
    return np.minimum(out, caps)
