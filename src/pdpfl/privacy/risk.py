"""Attack risk from the accountant: the best membership attack's true-positive rate at a given
false-positive rate, for one unit (a record, a client or a user).

Kulynych, Gomez, Kaissis, du Pin Calmon & Troncoso (2024, "Attack-aware noise calibration for
differential privacy") read a mechanism's guarantee as the power of the best test of "this unit
took part" against "it did not": at false-positive rate (FPR) α no attack has a true-positive
rate (TPR) above 1 − f(α), where f is the mechanism's trade-off function (Dong, Roth & Su 2022,
Def. 2.1). riskcal computes f from the privacy-loss distribution (PLD); pdpfl does the same from
the PLD its accountant builds (:meth:`pdpfl.privacy.pld.PldAccountant.loss_distribution`).

**From (ε, δ) pairs to the trade-off curve.** A mechanism that is (ε, δ(ε))-DP for every ε ≥ 0
(both orders of the neighbouring datasets) is f-DP with (Dong et al., Prop. 2.12 / 2.5)

    f(α) = sup_ε max{0, 1 − δ(ε) − e^ε α, e^{−ε}(1 − δ(ε) − α)},

so every membership attack has

    TPR(α) ≤ inf_ε min{1, δ(ε) + e^ε α, 1 − e^{−ε}(1 − δ(ε) − α)}         (:meth:`PrivacyCurve.tpr`)

and needs FPR ≥ sup_ε max{0, (y − δ(ε))e^{−ε}, 1 − δ(ε) − e^ε(1 − y)} to reach TPR y
(:meth:`PrivacyCurve.fpr`, the inverse "blow-up" function f̄⁻¹ of Mahloujifar et al. 2024 that
the f-DP audit uses). Each pair (ε, δ(ε)) is a valid guarantee on its own, so the infimum over
any *subset* of pairs is still a valid upper bound on TPR: a finite grid of ε never overstates
the guarantee, it only loses a little tightness.

**Where the pairs come from** (:func:`privacy_curve`):

* the PLD (dp-accounting's pessimistic connect-the-dots discretization, both the *remove* and
  the *add* direction: δ(ε) = max of the two, plus the FFT error bound η) on a grid of ε with
  the PLD's own resolution -- for every event the PLD accountant supports (Gaussian,
  Poisson-sampled Gaussian, compositions, rPDP-FL's two-stage rounds);
* the RDP accountant's ε at a grid of δ from 10⁻¹⁵ to ½, for every event (without-replacement
  sampling and group privacy included), which the PLD cannot interpret;

and the union of both lists is used (each pair is valid, so more pairs only tighten).
The PLD path agrees with an independent conversion of dp-accounting's own PLD to 10⁻³
(``tests/test_privacy_risk.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.registry import make_accountant

__all__ = [
    "FPRS",
    "PrivacyCurve",
    "RiskCard",
    "privacy_curve",
    "risk_card",
]

#: The false-positive rates a risk card reports (one in a thousand, a hundred, ten).
FPRS: tuple[float, ...] = (1e-3, 1e-2, 1e-1)

#: δ of the RDP pairs (every one a valid (ε, δ) statement).
_RDP_DELTAS = np.geomspace(1e-15, 0.5, 16)

#: Losses above this are left out of the subtracted term of δ(ε) (e^{−700} underflows).
_EXP_CAP = 700.0

#: The PLD's discretization interval for attack risk (finer than the accountant's default: the
#: card must agree with an exact conversion to 10⁻³; any interval gives a valid bound).
RISK_INTERVAL = 1e-3

#: Rows evaluated at once (bounds the memory of the rates × pairs table).
_CHUNK = 256

#: ε above which pairs are dropped (e^ε overflows nothing below 700, but δ(ε) is 0 long before).
_EPS_CAP = 200.0


def _check_rates(values: ArrayLike, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if np.any(np.isnan(a)) or np.any(a < 0) or np.any(a > 1):
        raise ValueError(f"{name}: every rate must be in [0, 1]")
    return a


@dataclass(frozen=True)
class PrivacyCurve:
    """Valid (ε, δ) pairs of one unit's mechanism and the attack bounds they imply.

    ``epsilons`` (≥ 0) and ``deltas`` (in [0, 1]) have the same shape; every pair is a
    statement "the mechanism is (ε, δ)-DP" (upper bounds). ``source`` says where they came
    from (``pld``, ``rdp`` or ``pld+rdp``).
    """

    epsilons: np.ndarray
    deltas: np.ndarray
    source: str

    def __post_init__(self) -> None:
        e = np.asarray(self.epsilons, dtype=np.float64).reshape(-1)
        d = np.asarray(self.deltas, dtype=np.float64).reshape(-1)
        if e.shape != d.shape or e.size == 0:
            raise ValueError("privacy curve: need as many δ as ε (at least one pair)")
        if np.any(~np.isfinite(e)) or np.any(e < 0) or np.any(np.isnan(d)):
            raise ValueError("privacy curve: ε must be finite and >= 0, δ a number")
        keep = e <= _EPS_CAP
        if not keep.any():
            keep = e == e.min()
        e, d = e[keep], np.clip(d[keep], 0.0, 1.0)
        e.setflags(write=False)
        d.setflags(write=False)
        object.__setattr__(self, "epsilons", e)
        object.__setattr__(self, "deltas", d)

    @staticmethod
    def union(*curves: PrivacyCurve) -> PrivacyCurve:
        """Every pair of every curve (each is valid, so the union is at least as tight)."""
        if not curves:
            raise ValueError("privacy curve: nothing to unite")
        return PrivacyCurve(
            np.concatenate([c.epsilons for c in curves]),
            np.concatenate([c.deltas for c in curves]),
            "+".join(dict.fromkeys(c.source for c in curves)),
        )

    def tpr(self, fpr: ArrayLike) -> np.ndarray:
        """The largest TPR any membership attack can have at FPR ``fpr`` (module docstring)."""
        a = _check_rates(fpr, "fpr")
        flat = a.reshape(-1)
        out = np.empty(flat.size, dtype=np.float64)
        e, d = self.epsilons, self.deltas
        with np.errstate(over="ignore"):
            up, down = np.exp(e), np.exp(-e)
        for s in range(0, flat.size, _CHUNK):
            x = flat[s : s + _CHUNK, None]
            with np.errstate(over="ignore", invalid="ignore"):
                first = d + up * x
            second = 1.0 - down * (1.0 - d - x)
            out[s : s + _CHUNK] = np.min(np.minimum(first, second), axis=1)
        out = np.maximum(np.minimum(out, 1.0), flat)  # guessing at random reaches TPR = FPR
        return np.asarray(out.reshape(a.shape), dtype=np.float64)

    def fpr(self, tpr: ArrayLike) -> np.ndarray:
        """The smallest FPR at which any attack can reach TPR ``tpr`` (a lower bound; the
        inverse of :meth:`tpr`): f̄⁻¹ of the f-DP audit (module docstring)."""
        y = _check_rates(tpr, "tpr")
        flat = y.reshape(-1)
        out = np.empty(flat.size, dtype=np.float64)
        e, d = self.epsilons, self.deltas
        with np.errstate(over="ignore"):
            up, down = np.exp(e), np.exp(-e)
        for s in range(0, flat.size, _CHUNK):
            x = flat[s : s + _CHUNK, None]
            first = (x - d) * down
            with np.errstate(over="ignore", invalid="ignore"):
                second = 1.0 - d - up * (1.0 - x)
            second = np.where(np.isnan(second), -np.inf, second)
            out[s : s + _CHUNK] = np.max(np.maximum(first, second), axis=1)
        out = np.minimum(np.clip(out, 0.0, 1.0), flat)  # f̄⁻¹(y) ≤ y (random guessing)
        return np.asarray(out.reshape(y.shape), dtype=np.float64)

    def pruned(self, points: int = 256) -> PrivacyCurve:
        """The pairs that decide :meth:`tpr` or :meth:`fpr` somewhere on a grid of ``points``
        rates in each tail, with their neighbours in ε. Any subset of valid pairs is valid, so
        the result never overstates the guarantee; it is much faster to evaluate."""
        if self.epsilons.size <= 8:
            return self
        tails = np.geomspace(1e-15, 0.5, points)
        grid = np.unique(np.concatenate([tails, 1.0 - tails]))
        e, d = self.epsilons, self.deltas
        with np.errstate(over="ignore"):
            up, down = np.exp(e), np.exp(-e)
        keep = np.zeros(e.size, dtype=bool)
        for s in range(0, grid.size, _CHUNK):
            x = grid[s : s + _CHUNK, None]
            with np.errstate(over="ignore", invalid="ignore"):
                lines = (
                    d + up * x,
                    1.0 - down * (1.0 - d - x),
                    -((x - d) * down),
                    -np.where(np.isnan(z := 1.0 - d - up * (1.0 - x)), -np.inf, z),
                )
            for values in lines:
                keep[np.argmin(values, axis=1)] = True
        idx = np.flatnonzero(keep)
        idx = np.unique(np.clip(np.concatenate([idx - 1, idx, idx + 1]), 0, e.size - 1))
        return PrivacyCurve(e[idx], d[idx], self.source)

    def epsilon(self, delta: float) -> float:
        """The smallest ε among the pairs whose δ is at most ``delta`` (∞ if none)."""
        ok = self.deltas <= float(delta)
        return float(self.epsilons[ok].min()) if ok.any() else math.inf


@dataclass(frozen=True)
class RiskCard:
    """An attacker's best TPR at each FPR for one unit of a budget group, per observer."""

    observer: str
    fprs: tuple[float, ...]
    tprs: tuple[float, ...]
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "observer": self.observer,
            "fpr": list(self.fprs),
            "tpr_max": list(self.tprs),
            "source": self.source,
        }

    def sentence(self, unit: str = "record") -> str:
        """What the card says in words, at the middle false-positive rate: "at a 1 %
        false-alarm rate an attacker identifies at most 16 % of the records that took part"."""
        i = len(self.fprs) // 2
        return (
            f"at a {_percent(self.fprs[i])} false-alarm rate an attacker identifies at most "
            f"{_percent(self.tprs[i])} of the {unit}s that took part"
        )


def _percent(rate: float) -> str:
    return f"{100.0 * rate:.3g} %"


def _hockey_stick(pmf: Any, top: int) -> np.ndarray:
    """δ(ε) of one direction of a dp-accounting PLD at ε = j·Δ for j = 0..``top`` (Δ its
    discretization): inf_mass + Σ_{l > ε} p_l (1 − e^{ε − l}), by suffix sums over the losses
    above 0 (no overflow: every exponent is ≤ 0)."""
    dense = pmf.to_dense_pmf()
    lower = int(dense._lower_loss)  # noqa: SLF001 (dp-accounting's dense PMF)
    probs = np.asarray(dense._probs, dtype=np.float64)  # noqa: SLF001
    step = float(dense._discretization)  # noqa: SLF001
    inf_mass = float(dense._infinity_mass)  # noqa: SLF001
    index = lower + np.arange(probs.size)
    keep = index > 0
    index, probs = index[keep], probs[keep]
    out = np.full(top + 1, inf_mass)
    if probs.size == 0:
        return out
    # mass[j] = Σ_{i > j} p_i and tail[j] = e^{jΔ}·Σ_{i > j} p_i e^{−iΔ}, j = 0..top. Losses
    # above _EXP_CAP leave tail out (a term subtracted from δ: dropping it only raises δ).
    hi = int(index.max())
    p_full = np.zeros(hi + 2)
    p_full[index] = probs
    mass = np.cumsum(p_full[::-1])[::-1][1:]  # mass[j] = Σ_{i ≥ j+1}
    lim = min(hi + 1, int(_EXP_CAP / step))
    weights = p_full[: lim + 1] * np.exp(-np.arange(lim + 1) * step)
    suffix = np.concatenate([np.cumsum(weights[::-1])[::-1][1:], [0.0]])  # Σ_{i ≥ j+1}
    width = min(top + 1, lim + 1, mass.size)
    j = np.arange(width)
    tail = np.exp(j * step) * suffix[:width]
    out[:width] += np.maximum(mass[:width] - tail, 0.0)  # beyond: no loss above ε
    return out


def _pld_pairs(
    event: Mechanism, count: int, interval: float | None, max_pairs: int | None = None
) -> PrivacyCurve | None:
    """Pairs from the PLD of ``count`` repetitions of ``event`` at the discretization
    ``interval`` (None: the accountant's own choice), every grid point of ε or, with
    ``max_pairs``, every s-th (a subset: still valid) (None: unsupported)."""
    from pdpfl.privacy.pld import PldAccountant

    acc = PldAccountant(rate_grid_rel_step=0.0)  # the exact rate (no rounding up)
    if not acc.supports(event):
        return None
    pld, eta, interval = acc.loss_distribution(event, count, interval=interval)
    top = math.inf
    for floor in (1e-14, 1e-12, 1e-10):  # the truncated tails (mass ~1e-15) sit at +inf
        top = float(pld.get_epsilon_for_delta(floor))
        if math.isfinite(top):
            break
    if not math.isfinite(top):
        top = _EPS_CAP
    steps = int(math.ceil(min(top, _EPS_CAP) / interval)) + 1
    deltas = np.maximum(
        _hockey_stick(pld._pmf_remove, steps),  # noqa: SLF001 (both directions of the PLD)
        _hockey_stick(pld._pmf_add, steps),  # noqa: SLF001
    )
    eps = np.arange(steps + 1) * interval
    if max_pairs is not None and eps.size > max_pairs:
        keep = np.unique(np.linspace(0, eps.size - 1, int(max_pairs)).round().astype(np.int64))
        eps, deltas = eps[keep], deltas[keep]
    return PrivacyCurve(eps, deltas + eta, "pld")


def _rdp_pairs(event: Mechanism, count: int) -> PrivacyCurve | None:
    """Pairs from the RDP accountant: its ε at a grid of δ (None: unsupported)."""
    acc = make_accountant("rdp")
    if not acc.supports(event):
        return None
    eps = [float(acc.composed_epsilon(event, [count], float(d))[0][0]) for d in _RDP_DELTAS]
    e = np.array(eps)
    ok = np.isfinite(e)
    if not ok.any():
        return None
    return PrivacyCurve(e[ok], _RDP_DELTAS[ok], "rdp")


def privacy_curve(
    mechanism: Any,
    rate: float,
    observer: str,
    count: int,
    noise_multiplier: float | None = None,
    *,
    interval: float | None = RISK_INTERVAL,
    rdp: bool = False,
    max_pairs: int | None = None,
) -> PrivacyCurve:
    """The pairs of ``count`` charged rounds of ``mechanism``'s round event at ``rate`` against
    ``observer`` (with ``noise_multiplier`` if given): the PLD's pairs, and the RDP
    accountant's where the PLD cannot interpret the event.

    ``mechanism`` is a :class:`~pdpfl.privacy.unit.UnitMechanism`. 0 rounds or rate 0 leak
    nothing: the single pair (0, 0). ``interval``: the PLD's discretization (None: the PLD
    accountant's own, coarser and faster); ``rdp=True`` adds the RDP pairs also where the PLD
    interprets the event (they only tighten, at tiny rates); ``max_pairs`` keeps at most that
    many of the PLD's pairs (evenly spaced in ε; faster to evaluate). Results are cached per
    process (the mechanism descriptions are frozen dataclasses).
    """
    q = float(rate)
    k = int(count)
    if not (0.0 <= q <= 1.0) or k < 0:
        raise ValueError(f"rate/count: need q in [0, 1] and count >= 0, got {rate!r}, {count!r}")
    if q == 0.0 or k == 0:
        return PrivacyCurve(np.zeros(1), np.zeros(1), "none")
    mech = mechanism if noise_multiplier is None else mechanism.with_noise(noise_multiplier)
    try:
        return _cached_curve(mech, q, str(observer), k, interval, bool(rdp), max_pairs)
    except TypeError:  # an unhashable description: not cached
        return _curve(mech, q, str(observer), k, interval, bool(rdp), max_pairs)


def _curve(
    mech: Any,
    q: float,
    observer: str,
    k: int,
    interval: float | None,
    rdp: bool,
    max_pairs: int | None,
) -> PrivacyCurve:
    event = mech.round_event(np.array([q]), observer)
    pld = _pld_pairs(event, k, interval, max_pairs)
    extra = _rdp_pairs(event, k) if rdp or pld is None else None
    parts = [p for p in (pld, extra) if p is not None]
    if not parts:
        raise ValueError(
            f"risk: no accountant interprets {type(event).__name__} (neither PLD nor RDP)"
        )
    return PrivacyCurve.union(*parts)


_cached_curve = functools.lru_cache(maxsize=512)(_curve)


def risk_card(curve: PrivacyCurve, observer: str, fprs: tuple[float, ...] = FPRS) -> RiskCard:
    """The card of one curve: the largest TPR at each FPR of ``fprs``."""
    tprs = tuple(float(t) for t in curve.tpr(np.asarray(fprs, dtype=np.float64)))
    return RiskCard(observer, tuple(float(a) for a in fprs), tprs, curve.source)
