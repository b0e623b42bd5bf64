"""Parameters of distributed discrete noise, derived from public configuration values only.

The integer encoding of distributed DP (Kairouz, Liu & Steinke, "The Distributed Discrete
Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML 2021, §4; encoding in
:mod:`pdpfl.dp.discrete_encoding`): each silo rotates its clipped update (optional randomized
Walsh–Hadamard transform, dimension padded to d' = 2^⌈log₂ d⌉), scales it by γ = 2^k, rounds it
to an integer vector with conditional randomized rounding (‖x̃‖₂² ≤ N, checked exactly), adds
one exact discrete Gaussian share N_Z(0, σ_s²)^{d'} and reduces modulo 2^b; the secure sum of
the survivors' vectors modulo 2^b is decoded by the centred lift, ÷γ and the inverse rotation.

Everything here is a function of public values -- clip C, noise multiplier σ, silos asked n,
survivors t, dimension d, bits b, rotation, contributors, parts, β -- never of data
(:func:`discrete_share_params`):

Sensitivity (KLS Theorem 1, conditional randomized rounding). A vector of L2 norm ≤ c = γC,
rounded coordinate-wise up with probability equal to its fractional part, has
‖x̃‖₂² ≤ c² + d'/4 + √(2 log(1/β))·(c + √d'/2) with probability ≥ 1 − β, and always
‖x̃‖₂ ≤ c + √d'. The encoding redraws the rounding until ‖x̃‖₂² ≤ N with
N = ⌊Δ̃(c)²⌋, Δ̃(c)² = min((c + √d')², c² + d'/4 + √(2 log(1/β))(c + √d'/2)) -- so every
released contribution satisfies the bound exactly (integer arithmetic), whatever the input.
β only sets the expected number of redraws (≤ 1/(1 − β)), never the guarantee.

Units in several parts (ULDP-FL). A user's records sit in up to P silos; each silo rounds the
user's weighted clipped vector (norm ≤ c_p = w_p·γC, Σ_p w_p ≤ 1) separately with its own bound
N_p = ⌊Δ̃(c_p)²⌋. The user's total integer contribution then has norm
≤ Σ_p Δ̃(c_p) ≤ Δ̃(γC) + (P − 1)·Δ̃(0): Δ̃(c) = √(min(...)) is a minimum of the linear c + √d'
and the convex √(c² + b·c + a), so the sum over parts is at most the sum of the convex branch,
a convex function of (c_1, …, c_P) on the simplex {Σ c_p ≤ γC}, maximal at a vertex (all of
γC on one part) -- and at most γC + P·√d' through the linear branch. The accounted
N = ⌈min(Δ̃(γC) + (P − 1)Δ̃(0), γC + P√d')²⌉: Cγ plus P − 1 times the rounding inflation of
a zero vector (≈ √d'/2 each).

Noise. Each share carries σ_s² = σ²·N/t (rounded up by the exact sampler, recorded), so every
released sum of at least t survivors holds noise of multiplier ≥ σ relative to the accounted
sensitivity √N; the ledger charges :meth:`DiscreteShareParams.plan`
(:class:`~pdpfl.privacy.discrete_plan.SampledDiscreteGaussianPlan`: the distributed discrete
bound, never the continuous one).

Modular clipping (wrapping is post-processing of the exact integer sum: it costs utility, never
privacy). A coordinate of the sum of m ≤ n survivors wraps iff it leaves [−2^{b−1}, 2^{b−1}).
The discrete Gaussian is sub-Gaussian with variance proxy σ² (Canonne, Kamath & Steinke 2020,
Cor. 9: E[e^{λX}] ≤ e^{λ²σ²/2}), so the noise of ≤ n shares has proxy n·σ²_used. The signal of
K contributors (each ≤ γC before rounding, ≤ √N after): without rotation |signal_j| ≤ K·√N;
with the rotation (random signs from a seed independent of the data), each rotated coordinate of
the pre-rounding sum is a Rademacher sum with proxy (KγC)²/d' (Hoeffding), and rounding moves it
by < R (the number of rounded vectors, K·P). Hence per coordinate

    P(wrap) ≤ 2·exp(−A²/(2·(proxy_signal + n·σ²_used))),  A = 2^{b−1} − (R or K√N),

and per round at most d' times that (:attr:`DiscreteShareParams.wrap_probability`). The scale γ
is the largest power of two with that bound ≤ ``max_wrap``, N < 2^62 (exact norm checks in
int64) and σ_s² ≤ 2^50 (the exact sampler's fast int64 path; the rounding inflation is then
already negligible). Refused (ValueError naming the field and the allowed range): bits outside
[2, 62], a bound that no γ meets, a sensitivity inflation √N/(γC) − 1 above ``max_inflation``.

Intended call sites (wiring phase of issue #33): the setup of ULDP-AVG/SGD and IDP-FedAvg
``distributed`` builds one :class:`DiscreteShareParams` from the config (``secure.bits`` etc.)
and puts :meth:`DiscreteShareParams.summary` into ``summary.json``; each silo encodes with
:mod:`pdpfl.dp.discrete_encoding`; the ledgers charge :meth:`DiscreteShareParams.plan`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pdpfl.discrete_noise import DiscreteGaussianSpec, discrete_gaussian_spec
from pdpfl.privacy.discrete import sum_log_ratio_bound
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.noise import DiscreteGaussianNoise
from pdpfl.privacy.unit import PrivacyUnit

__all__ = ["DiscreteShareParams", "discrete_share_params", "rounding_bound_sq"]

#: Default β of conditional randomized rounding (KLS use e^{-0.5}); only the retry rate.
DEFAULT_BETA = math.exp(-0.5)
DEFAULT_MAX_WRAP = 1e-6
DEFAULT_MAX_INFLATION = 0.05
_MIN_BITS, _MAX_BITS = 2, 62
#: N stays below this so that exact norm checks run in int64 (see the encoding module).
_MAX_NORM_SQ = 1 << 62
_SLACK = 1e-12
#: Largest share variance: the exact sampler's int64 path covers |Y| ≤ 64σ up to σ² ≈ 2^51
#: (:func:`pdpfl.discrete_noise.discrete_gaussian_spec`); a larger scale would buy nothing.
_MAX_SHARE_VARIANCE = 1 << 50
#: Scales 2^k are tried for k from 62 down to −_MAX_SCALE_STEPS.
_MAX_SCALE_STEPS = 200


def _rounding_bound(c: float, dim: int, beta: float) -> float:
    """Δ̃(c)² = min((c + √d')², c² + d'/4 + √(2 log(1/β))(c + √d'/2)) (module docstring)."""
    root = math.sqrt(dim)
    b = math.sqrt(2.0 * math.log(1.0 / beta))
    return min((c + root) ** 2, c * c + dim / 4.0 + b * (c + root / 2.0))


def rounding_bound_sq(part_bound: float, dim: int, beta: float) -> int:
    """N_p = ⌊Δ̃(c_p)²⌋ (rounded down with slack): the exact integer bound a silo checks when it
    rounds one vector of L2 norm ≤ c_p (integer units) in ``dim`` coordinates."""
    c = float(part_bound)
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"part_bound: must be a finite number >= 0, got {part_bound!r}")
    return max(math.floor(_rounding_bound(c, int(dim), float(beta)) * (1.0 - _SLACK)), 0)


def _accounted_sq(c: float, dim: int, beta: float, parts: int) -> int:
    if parts == 1:
        return rounding_bound_sq(c, dim, beta)
    sens = min(
        math.sqrt(_rounding_bound(c, dim, beta))
        + (parts - 1) * math.sqrt(_rounding_bound(0.0, dim, beta)),
        c + parts * math.sqrt(dim),
    )
    return math.ceil(sens * sens * (1.0 + _SLACK)) + 1


@dataclass(frozen=True)
class DiscreteShareParams:
    """Everything a silo and the server need to encode and decode discrete shares (module
    docstring); build with :func:`discrete_share_params`."""

    clip: float
    noise_multiplier: float
    silos: int
    survivors: int
    dimension: int
    bits: int
    rotation: bool
    contributors: int
    parts: int
    beta: float
    #: d' (a power of two with the rotation, else d).
    padded_dimension: int
    #: γ = 2^scale_log2.
    scale_log2: int
    #: N: the accounted squared L2 sensitivity (integer units).
    l2_sensitivity_sq: int
    #: The exact sampler's spec of one share (σ²_used ≥ σ²·N/t).
    share: DiscreteGaussianSpec
    #: Upper bound on P(some coordinate of a round's sum wraps modulo 2^b).
    wrap_probability: float

    @property
    def scale(self) -> float:
        """γ (exact power of two)."""
        return math.ldexp(1.0, self.scale_log2)

    @property
    def unit_bound(self) -> float:
        """γ·C: the L2 norm of a clipped contribution in integer units."""
        return self.scale * self.clip

    @property
    def inflation(self) -> float:
        """√N/(γC) − 1: the sensitivity added by rounding (relative)."""
        return math.sqrt(self.l2_sensitivity_sq) / self.unit_bound - 1.0

    @property
    def modulus(self) -> int:
        """2^b."""
        return 1 << self.bits

    @property
    def container(self) -> str:
        """``uint32`` when b ≤ 32, else ``uint64``."""
        return "uint32" if self.bits <= 32 else "uint64"

    def required_share_variance(self) -> Fraction:
        """σ²·N/t exactly (what every share must carry at least)."""
        return SampledDiscreteGaussianPlan.required_share_variance(
            self.noise_multiplier, self.survivors, self.l2_sensitivity_sq
        )

    def part_bound_sq(self, weight: float = 1.0) -> int:
        """N_p for one part of a unit with weight w_p ≤ 1 (``parts`` > 1; the whole unit when
        ``parts`` = 1 and w = 1 gives N itself)."""
        w = float(weight)
        if not (math.isfinite(w) and 0.0 <= w <= 1.0):
            raise ValueError(f"weight: must be in [0, 1], got {weight!r}")
        if self.parts == 1 and w == 1.0:
            return self.l2_sensitivity_sq
        return rounding_bound_sq(w * self.unit_bound, self.padded_dimension, self.beta)

    def parts_view_sq(self, uniform: bool) -> int:
        """N_sv ≥ Σ_p N_p: the squared sensitivity of a unit's ``parts`` seen one by one (the
        server under plain summation sees each silo's share on its own; one-share RDP adds with
        the squared part norms). ``uniform``: every part has weight 1/P, so N_sv = P·N_p(1/P);
        otherwise (weights summing to ≤ 1) Σ_p Δ̃(c_p)² ≤ Σ_p q(c_p) with q the convex branch of
        Δ̃², maximal at a vertex of the simplex: q(γC) + (P − 1)·q(0)."""
        p = self.parts
        if uniform:
            return p * self.part_bound_sq(1.0 / p)
        d, b = self.padded_dimension, math.sqrt(2.0 * math.log(1.0 / self.beta))

        def q(c: float) -> float:
            return c * c + d / 4.0 + b * (c + math.sqrt(d) / 2.0)

        return math.ceil((q(self.unit_bound) + (p - 1) * q(0.0)) * (1.0 + _SLACK)) + 1

    def plan(
        self,
        unit: PrivacyUnit | str,
        delta: float,
        rounds: int,
        observers: tuple[str, ...] = ("third-party", "server"),
    ) -> SampledDiscreteGaussianPlan:
        """What the ledgers charge: the distributed discrete Gaussian with these shares."""
        return SampledDiscreteGaussianPlan.for_multiplier(
            unit,
            self.noise_multiplier,
            self.survivors,
            self.l2_sensitivity_sq,
            self.padded_dimension,
            delta,
            rounds,
            observers,
        )

    def noise(self) -> DiscreteGaussianNoise:
        """The noise description one share is drawn from (:func:`pdpfl.dp.noise.add_noise`):
        the variance the share's spec was built for (σ²·N/t), sized for t survivors,
        multiplier σ (what :meth:`plan` charges)."""
        return DiscreteGaussianNoise(
            Fraction(self.share.requested), self.noise_multiplier, self.survivors
        )

    def summary(self) -> dict[str, Any]:
        """A JSON-able description for ``summary.json``."""
        used = self.share.variance
        return {
            "mechanism": "distributed discrete Gaussian (exact integer sampler)",
            "bits": self.bits,
            "container": self.container,
            "scale": self.scale,
            "scale_log2": self.scale_log2,
            "dimension": self.dimension,
            "padded_dimension": self.padded_dimension,
            "rotation": "randomized Walsh-Hadamard" if self.rotation else "none",
            "clip": self.clip,
            "noise_multiplier": self.noise_multiplier,
            "silos": self.silos,
            "survivors": self.survivors,
            "contributors": self.contributors,
            "parts": self.parts,
            "beta": self.beta,
            "l2_sensitivity_sq": self.l2_sensitivity_sq,
            "accounted_sensitivity": math.sqrt(self.l2_sensitivity_sq) / self.scale,
            "sensitivity_inflation": self.inflation,
            "share": self.share.to_dict(),
            "noise_std_at_survivors": math.sqrt(self.survivors * float(used)) / self.scale,
            "wrap_probability_per_round": self.wrap_probability,
        }


def _wrap_bound(
    bits: int,
    n_sq: int,
    scale: float,
    clip: float,
    dim: int,
    silos: int,
    contributors: int,
    parts: int,
    rotation: bool,
    share_variance: float,
) -> float:
    half = math.ldexp(1.0, bits - 1)
    noise = silos * share_variance
    if rotation:
        signal = (contributors * scale * clip) ** 2 / dim
        room = half - contributors * parts
    else:
        signal = 0.0
        room = half - contributors * math.sqrt(n_sq)
    if room <= 0:
        return 1.0
    log_p = math.log(2.0 * dim) - room * room / (2.0 * (signal + noise))
    return 1.0 if log_p >= 0 else math.exp(log_p)


def _check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or int(value) < low
        or (high is not None and int(value) > high)
    ):
        upper = f" and <= {high}" if high is not None else ""
        raise ValueError(f"{name}: must be an integer >= {low}{upper}, got {value!r}")
    return int(value)


def _check_real(value: object, name: str, low: float, high: float | None, strict: bool) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool):
        v = math.nan
    bad = not math.isfinite(v) or (v <= low if strict else v < low)
    if high is not None:
        bad = bad or v >= high
    if bad:
        lo = f"> {low:g}" if strict else f">= {low:g}"
        hi = f" and < {high:g}" if high is not None else ""
        raise ValueError(f"{name}: must be a finite number {lo}{hi}, got {value!r}")
    return v


def discrete_share_params(
    *,
    clip: float,
    noise_multiplier: float,
    silos: int,
    survivors: int,
    dimension: int,
    bits: int,
    rotation: bool = True,
    contributors: int | None = None,
    parts: int = 1,
    beta: float = DEFAULT_BETA,
    max_wrap: float = DEFAULT_MAX_WRAP,
    max_inflation: float = DEFAULT_MAX_INFLATION,
    prefix: str = "secure.",
) -> DiscreteShareParams:
    """Derive the encoding of distributed discrete noise (module docstring).

    Parameters
    ----------
    clip
        C > 0: every unit's contribution has L2 norm ≤ C (data units).
    noise_multiplier
        σ > 0: the released sum's noise std over the accounted sensitivity.
    silos, survivors
        n ≥ 1 silos asked per round (the most shares a sum holds) and t ∈ [1, n], the fewest.
    dimension
        d ≥ 1 coordinates of one update.
    bits
        b ∈ [2, 62]: the sum is taken modulo 2^b (uint32 containers when b ≤ 32).
    rotation
        Apply the randomized Walsh–Hadamard rotation (flattens coordinates; pads to 2^k).
    contributors
        K: the most units whose contributions one sum holds (default n).
    parts
        P ≥ 1: separately rounded parts of one unit's contribution (ULDP-FL: its silos).
    beta
        β ∈ (0, 1) of conditional randomized rounding (redraw rate only).
    max_wrap
        The largest accepted bound on P(a round's sum wraps), in (0, 1).
    max_inflation
        The largest accepted √N/(γC) − 1, ≥ 0.
    prefix
        Prefix of the configuration field names ``bits``, ``beta``, ``max_wrap`` and
        ``max_inflation`` in error messages (``secure.``); the other arguments are named as
        they are here (the caller maps them to its configuration).

    Raises
    ------
    ValueError
        ``<prefix><field>: ...`` naming the allowed range, when the values cannot work.
    """
    c = _check_real(clip, "clip", 0.0, None, True)
    sigma = _check_real(noise_multiplier, "noise_multiplier", 0.0, None, True)
    n = _check_int(silos, "silos", 1)
    t = _check_int(survivors, "survivors", 1, n)
    d = _check_int(dimension, "dimension", 1, 1 << 40)
    b = _check_int(bits, f"{prefix}bits", _MIN_BITS, _MAX_BITS)
    k_units = n if contributors is None else _check_int(contributors, "contributors", 1)
    p = _check_int(parts, "parts", 1)
    bt = _check_real(beta, f"{prefix}beta", 0.0, 1.0, True)
    mw = _check_real(max_wrap, f"{prefix}max_wrap", 0.0, 1.0, True)
    mi = _check_real(max_inflation, f"{prefix}max_inflation", 0.0, None, False)
    rot = bool(rotation)
    args = (c, sigma, n, t, d, k_units, p, bt, mw, rot)
    found = _derive(b, *args)
    if found is not None and found.inflation <= mi:
        if not math.isfinite(sum_log_ratio_bound(t, float(found.share.variance))):
            raise ValueError(  # pragma: no cover - σ_s ≈ σγC/√t is never this small
                "noise_multiplier: the shares are too small for the distributed discrete "
                "bound (it needs sigma_s >= 0.3 in integer units)"
            )
        return found
    needed = next(
        (bb for bb in range(b + 1, _MAX_BITS + 1) if _works(_derive(bb, *args), mi)), None
    )
    allowed = f"allowed: {needed} <= bits <= {_MAX_BITS}" if needed else "no bits <= 62 work"
    dim = 1 << (d - 1).bit_length() if rot else d
    if found is None:
        raise ValueError(
            f"{prefix}bits: b = {b} cannot hold the sum of {n} shares of {dim} coordinates with "
            f"wrap probability <= {mw:g} ({prefix}max_wrap) at any scale; {allowed}"
        )
    raise ValueError(
        f"{prefix}bits: at b = {b} the largest scale is 2^{found.scale_log2}, where rounding "
        f"inflates the sensitivity by {100 * found.inflation:.3g} % (more than "
        f"{prefix}max_inflation = {100 * mi:.3g} %); {allowed}"
    )


def _works(params: DiscreteShareParams | None, max_inflation: float) -> bool:
    return params is not None and params.inflation <= max_inflation


def _derive(
    b: int,
    c: float,
    sigma: float,
    n: int,
    t: int,
    d: int,
    k_units: int,
    p: int,
    bt: float,
    mw: float,
    rot: bool,
) -> DiscreteShareParams | None:
    """The largest scale 2^k whose wrap bound is ≤ ``mw`` (None if none): the bound grows with
    the scale, so the first feasible k from the top is the largest."""
    dim = 1 << (d - 1).bit_length() if rot else d
    for k in range(_MAX_BITS, -_MAX_SCALE_STEPS, -1):
        scale = math.ldexp(1.0, k)
        n_sq = _accounted_sq(scale * c, dim, bt, p)
        if n_sq >= _MAX_NORM_SQ:
            continue
        required = SampledDiscreteGaussianPlan.required_share_variance(sigma, t, n_sq)
        if required > _MAX_SHARE_VARIANCE:
            continue
        approx = float(required) * (1.0 + 1e-6)  # σ²_used exceeds it by far less
        if _wrap_bound(b, n_sq, scale, c, dim, n, k_units, p, rot, approx) > mw:
            continue
        spec = discrete_gaussian_spec(required)
        wrap = _wrap_bound(b, n_sq, scale, c, dim, n, k_units, p, rot, float(spec.variance))
        if wrap > mw:  # pragma: no cover - the margin above covers the spec's rounding
            continue
        return DiscreteShareParams(
            clip=c,
            noise_multiplier=sigma,
            silos=n,
            survivors=t,
            dimension=d,
            bits=b,
            rotation=rot,
            contributors=k_units,
            parts=p,
            beta=bt,
            padded_dimension=dim,
            scale_log2=k,
            l2_sensitivity_sq=n_sq,
            share=spec,
            wrap_probability=wrap,
        )
    return None
