"""From correct guesses to a lower bound on ε: one-run auditing's hypothesis test.

Steinke, Nasr & Jagielski (NeurIPS 2023, "Privacy Auditing with One (1) Training Run", §3 and
the algorithm of their Appendix D): m canaries are each included independently with
probability ½; an auditor who sees the output guesses "in" or "out" for r of them (abstaining on
the others) and gets W right. If the mechanism is (ε, δ)-DP with respect to every canary, then
for every v

    P[W ≥ v] ≤ β(v) + 2m·δ·α(v),                                     (the main theorem)
    β(v) = P[Binomial(r, p) ≥ v],     p = e^ε / (1 + e^ε),
    α(v) = max_{i = 1..v} P[v − i ≤ Binomial(r, p) < v] / i.

:func:`p_value` evaluates the right-hand side exactly (scipy's binomial tails; the window sums
are accumulated from the probability masses, so nothing cancels). The audited lower bound at
confidence 1 − a is the smallest ε whose p-value reaches a,

    ε̂ = inf{ε ≥ 0 : p_value(m, r, v, ε, δ) ≥ a}                     (:func:`epsilon_lower_bound`)

(0 when even ε = 0 cannot be rejected). If the true ε were below ε̂, the observed count would
have a p-value below a under it, which happens with probability at most a -- for the observed
count v₀, ``{v : p(v) < a} ⊆ {v ≥ min}`` and the theorem applies at that minimum, so neither a
non-monotone δ-term in v nor in ε makes the bound overstate. The search scans ε on a grid
(:data:`GRID_POINTS` points up to the perfect-guessing value) and refines the first crossing
with Brent's method; between grid points it relies on the continuity of the p-value.

Choosing how many to guess (:func:`audit_scores`): the auditor guesses the k highest scores "in"
and the k lowest "out" for every k of a fixed candidate set (:func:`candidate_ks`) and reports
the largest ε̂, each computed at level a / |candidates| (Bonferroni): the reported number is a
lower bound at confidence 1 − a for the chosen k too. ``pdpfl audit`` itself tests a ladder of
k and a second statistic (the f-DP audit) with one Bonferroni correction over both
(:mod:`pdpfl.audit.evidence`); :func:`audit_scores` is this statistic alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

__all__ = [
    "GRID_POINTS",
    "AuditBound",
    "audit_scores",
    "candidate_ks",
    "epsilon_lower_bound",
    "guess_counts",
    "p_value",
    "perfect_guessing_epsilon",
]

#: Grid points for the first-crossing search (then refined with Brent's method).
GRID_POINTS = 256


def _check(m: int, r: int, v: int, delta: float) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta: must be in [0, 1], got {delta}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[W ≥ v] bound for an (ε, δ)-DP mechanism: β(v) + 2mδ·α(v), at most 1 (see module)."""
    _check(m, r, v, delta)
    if epsilon < 0:
        raise ValueError(f"epsilon: must be >= 0, got {epsilon}")
    if v == 0:
        return 1.0
    p = float(special.expit(epsilon))
    beta = float(stats.binom.sf(v - 1, r, p))
    if delta == 0 or beta >= 1:
        return min(beta, 1.0)
    # window sums P[v - i <= B <= v - 1] for i = 1..v, accumulated downwards from v - 1
    masses = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)
    alpha = float(np.max(np.cumsum(masses) / np.arange(1, v + 1)))
    return min(beta + 2.0 * m * delta * alpha, 1.0)


def _p_values(m: int, r: int, v: int, epsilons: np.ndarray, delta: float) -> np.ndarray:
    """:func:`p_value` at many ε at once (the grid scan of :func:`epsilon_lower_bound`)."""
    p = special.expit(np.asarray(epsilons, dtype=np.float64))
    if v == 0:
        return np.ones_like(p)
    beta = stats.binom.sf(v - 1, r, p)
    if delta == 0:
        out: np.ndarray = np.minimum(beta, 1.0)
        return out
    # the masses in log space (one numpy expression for the whole grid; ~1e-13 relative)
    x = np.arange(v - 1, -1, -1, dtype=np.float64)[:, None]
    log_choose = special.gammaln(r + 1) - special.gammaln(x + 1) - special.gammaln(r - x + 1)
    masses = np.exp(log_choose + x * np.log(p) + (r - x) * np.log1p(-p))
    alpha = np.max(np.cumsum(masses, axis=0) / np.arange(1, v + 1)[:, None], axis=0)
    bound: np.ndarray = np.minimum(beta + 2.0 * m * delta * alpha, 1.0)
    return bound


def perfect_guessing_epsilon(r: int, level: float) -> float:
    """The ε̂ of r correct guesses out of r with δ = 0: e^ε/(1+e^ε) = level^(1/r) (0 when
    even that cannot reject ε = 0).

    No count of r guesses can give more (δ > 0 only raises the p-value)."""
    if r <= 0:
        return 0.0
    return max(0.0, float(special.logit(level ** (1.0 / r))))


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, level: float = 0.05) -> float:
    """ε̂: the smallest ε ≥ 0 whose p-value for v correct of r guesses reaches ``level``."""
    _check(m, r, v, delta)
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level}")

    def gap(eps: float) -> float:
        return p_value(m, r, v, eps, delta) - level

    if r == 0 or gap(0.0) >= 0:
        return 0.0
    # At `top`, β alone equals the level (v = r) or exceeds it (v < r): the first crossing
    # lies in [0, top]; rounding may leave gap(top) a hair below 0, then `top` is the answer.
    top = perfect_guessing_epsilon(r, level)
    grid = np.linspace(0.0, top, GRID_POINTS)
    reached = np.flatnonzero(_p_values(m, r, v, grid, delta) >= level)
    if reached.size == 0 or reached[0] == 0:  # rounding at `top` (or at 0, checked above)
        return top
    hi = int(reached[0])
    if gap(float(grid[hi])) < 0:  # the vectorized and the scalar evaluation disagree by ulps
        return float(grid[hi])
    root = optimize.brentq(gap, float(grid[hi - 1]), float(grid[hi]), xtol=1e-10, rtol=1e-12)
    return float(min(root, top))


def candidate_ks(m: int, count: int = 6) -> list[int]:
    """Guesses per side to try: k = m/2, m/4, ... (``count`` halvings at most, k >= 1).

    The k highest scores are guessed in and the k lowest out (r = 2k guesses)."""
    ks: list[int] = []
    for j in range(count):
        k = m // 2 ** (j + 1)
        if k < 1:
            break
        if k not in ks:
            ks.append(k)
    return ks


def guess_counts(
    scores: np.ndarray, included: np.ndarray, k: int, order: np.ndarray | None = None
) -> tuple[int, int]:
    """``(r, v)`` for guessing the k highest scores in and the k lowest out.

    ``order`` (optional) is a permutation applied before a stable sort: ties are broken by it
    (pass a random permutation so that ties never follow the canaries' order).
    """
    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    if s.shape != inc.shape or s.ndim != 1:
        raise ValueError("scores and included must be 1-D arrays of the same length")
    if not 0 <= 2 * k <= s.size:
        raise ValueError(f"k: need 0 <= 2k <= m = {s.size}, got k = {k}")
    perm = np.arange(s.size) if order is None else np.asarray(order)
    ranked = perm[np.argsort(-s[perm], kind="stable")]
    top, bottom = ranked[:k], ranked[s.size - k :] if k else ranked[:0]
    return 2 * k, int(inc[top].sum() + (~inc[bottom]).sum())


@dataclass(frozen=True)
class AuditBound:
    """The audited lower bound of one group of canaries.

    ``epsilon`` is ε̂ at confidence 1 − ``level`` (Bonferroni over ``ks``), reached by guessing
    ``k`` per side: ``r`` guesses, ``v`` correct, among ``m`` canaries (``included`` of them in).
    """

    epsilon: float
    m: int
    included: int
    k: int
    r: int
    v: int
    level: float
    ks: tuple[int, ...]
    per_k: tuple[float, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "epsilon_lower": self.epsilon,
            "m": self.m,
            "included": self.included,
            "k": self.k,
            "guesses": self.r,
            "correct": self.v,
            "accuracy": (self.v / self.r) if self.r else None,
            "level": self.level,
            "candidate_ks": list(self.ks),
            "epsilon_lower_per_k": list(self.per_k),
        }


def audit_scores(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    *,
    confidence: float = 0.95,
    ks: list[int] | None = None,
    order: np.ndarray | None = None,
) -> AuditBound:
    """ε̂ of one group from its canaries' scores (higher = "more likely included").

    Every k in ``ks`` (default :func:`candidate_ks`) is tried at level (1 − confidence)/|ks|;
    the largest ε̂ is returned with the k that reached it.
    """
    inc = np.asarray(included, dtype=bool)
    m = int(inc.size)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    ks = candidate_ks(m) if ks is None else [int(k) for k in ks]
    level = (1.0 - confidence) / max(len(ks), 1)
    tried: list[tuple[int, int, int]] = []
    per_k: list[float] = []
    for k in ks:
        r, v = guess_counts(scores, inc, k, order)
        tried.append((k, r, v))
        per_k.append(epsilon_lower_bound(m, r, v, delta, level))
    if not tried:  # fewer than two canaries: nothing to guess
        return AuditBound(0.0, m, int(inc.sum()), 0, 0, 0, level, (), ())
    best = int(np.argmax(per_k))  # the first k reaching the largest bound
    k, r, v = tried[best]
    return AuditBound(
        epsilon=per_k[best],
        m=m,
        included=int(inc.sum()),
        k=k,
        r=r,
        v=v,
        level=level,
        ks=tuple(ks),
        per_k=tuple(per_k),
    )
