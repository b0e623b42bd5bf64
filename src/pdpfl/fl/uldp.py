"""ULDP-FL: user-level DP when one person's records sit in several silos (Kato et al., PVLDB 2024).

The privacy unit is a *user*: all of one person's records in every silo (add/remove one user,
Def. 1 of §3). Users are linked across silos by a global id ``0 .. |U|-1``; ``|U|`` is the
public, configured number of users (``data.options.num_users``). Every silo takes part in every
round. Formulas follow the paper's numbering as restated in the spec (`uldp-fl_idp-fedavg.md`,
Part A), including the corrections of the reference code's bugs it lists (D1-D29).

Algorithms (``algorithm.name``)
-------------------------------
``uldp-naive`` (Alg. 1, Theorem 3)
    Each silo trains Q epochs of plain SGD on its data, clips its delta to C and adds Gaussian
    noise; the server averages (η_g/|S|). Removing one user moves *each* clipped silo delta by up
    to 2C (two points of the C-ball; spec D29), so the rigorous sensitivity of Σ_s is 2|S|C and
    the per-silo noise is N(0, σ²(2C)²|S|) (``sensitivity: rigorous``, default). The paper's
    |S|·C (``sensitivity: paper``) halves the noise; pdpfl then reports the honest ε, which is
    that of noise multiplier σ/2, and the summary warns.
``uldp-group`` (Alg. 2, Theorem 4, Prop. 2, Lemmas 8-9)
    Flags b_{s,u,i}, fixed for the whole run, keep at most k records per user across all silos;
    each silo runs record-level DP-SGD (Poisson rate ``record_rate``, τ = ``training.local_steps``
    steps per round, clip C, noise σC, public normaliser B) on the kept records; group privacy
    turns record-level RDP into user-level ε. k is an integer, ``max`` or ``median`` of N_u.
    Group conversion: Lemma 9 (RDP, for k = 2^c with orders α ≥ 2k; a k that is not a power of
    two is rounded *up*, never to ε = 0 -- spec D4-D6) or Lemma 8 ((ε, δ) route, any k);
    ``group_conversion: best`` reports the smaller of the two (both are upper bounds).
``uldp-avg`` / ``uldp-sgd`` (Alg. 3, Theorem 5, Eq. 4)
    In each silo, for each user u present there: a fresh copy of the global model trained Q
    epochs on u's records only (AVG) or u's mean gradient at x_t (SGD: one mean over the user's
    records, no double division -- D7); the user's vector is clipped to C and weighted by
    w_{s,u}; the silo adds N(0, σ²C²/|S|). Weights: ``uniform`` w = 1/|S| or ``enhanced``
    w_{s,u} = n_{s,u}/N_u (Eq. 4); Σ_s w_{s,u} ≤ 1 is validated, so one user moves Σ_s by at
    most C and the summed noise σC gives noise multiplier σ. The server applies
    x ← x + η_g/(q|S||U|)·Σ (AVG) and x ← x − η_g/(q|S||U|)·Σ (SGD: a gradient -- the sign the
    reference gets wrong for SGD-ws, D1).
``uldp-default``
    DEFAULT: FedAvg with two-sided learning rates (Q epochs of SGD(η_l) per silo, x ← x +
    η_g·mean Δ_s), no DP: the utility ceiling (``pdpfl compare`` method ``default``).

User sub-sampling (Alg. 4, ``user_rate: q``; the -s / -ws variants)
    The server draws one Bernoulli(q) per user per round from its own randomness and tells the
    silos which users take part (a bit mask in the round configuration); unselected users get
    weight 0. Divisor q·|S|·|U| (a float, for AVG and SGD alike -- D2, D24). Accounted as the
    Poisson-subsampled Gaussian (Lemma 6 evaluated numerically, Mironov et al. 2019).
Personal budgets per user (``personal_budgets: true``, with ``uldp-avg``/``uldp-sgd``)
    Each user u has a budget ε_u (``budgets:`` scenario drawn over users, or a file with one
    budget per user). The certified calibrator maps ε_u to a Poisson rate q_u at the user level
    (user u's RDP after T rounds is T·ρ_SGM(α, q_u, σ)); the server samples user u with q_u and
    its per-user :class:`~pdpfl.ledger.PrivacyLedger` pre-checks every round, so a user whose
    next round would exceed ε_u sits out. The server (which samples) knows the rates and hence
    the budgets; the silos do not. Divisor |S|·Σ_u q_u.

Observers and the plain-aggregation boundary
--------------------------------------------
* ``third-party`` (sees the global models): the guarantees above.
* ``server``: under plain aggregation it sees every silo's noisy update and the sampling coins
  it drew. One user moves the vector of silo updates by at most C·‖w_{·,u}‖₂; with per-silo
  noise σC/√|S| the server's noise multiplier is σ for uniform weights (‖w‖₂ ≤ 1/√|S|) but
  only σ/√|S| for enhanced weights (‖w‖₂ ≤ 1), and it is charged a full Gaussian round in
  exactly the rounds it sampled the user (no amplification: it knows the coins). NAIVE and
  GROUP have the same ε for both observers. ``privacy.adversary`` says which observers budgets
  are enforced against; both are always reported.
* Enhanced weights, GROUP flags (``fair``) and k = max/median need every silo's per-user counts
  n_{s,u}. With plain aggregation they are **disclosed** to the server (and N_u to the silos,
  through the weights): an explicit opt-in, ``data.public_user_histograms: true``, and a warning
  in every run summary. The private weighting protocol (Paillier + masking, Sec. 4) replaces the
  silo's weighted sum over users (:meth:`UldpSilo.weighted_user_sum`) -- see docs/uldp.md.

Everything a silo releases is one :class:`~pdpfl.fl.api.Contribution` (the noisy update).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from pdpfl.fl.api import Aggregate, Contribution, FederationInfo, Params, Scalars
from pdpfl.fl.common import initial_params, noise_source_problems, silo_model
from pdpfl.fl.registry import (
    AlgorithmConfig,
    AlgorithmSpec,
    MethodSpec,
    register_algorithm,
    register_method,
)
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.ledger import PrivacyLedger

__all__ = [
    "OPACUS_ORDERS",
    "ORDERS",
    "UldpAvgConfig",
    "UldpConfig",
    "UldpDefaultConfig",
    "UldpGroupConfig",
    "UldpNaiveConfig",
    "UldpServer",
    "UldpSgdConfig",
    "UldpSilo",
    "enhanced_weights",
    "fair_group_quotas",
    "group_epsilon",
    "split_group_quotas",
    "user_epsilon",
    "uniform_weights",
]

#: Opacus' ``DEFAULT_ALPHAS`` (1.1 … 10.9 in steps of 0.1, then 12 … 63): the orders behind the
#: paper's ε values (spec A.3).
OPACUS_ORDERS: np.ndarray = np.array(
    [1.0 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)]
)
#: Orders used for every ULDP account: pdpfl's default grid ∪ Opacus' (ε is a minimum over the
#: orders, so it is never above either grid's value).
ORDERS: np.ndarray = np.union1d(DEFAULT_ORDERS, OPACUS_ORDERS)
ORDERS.setflags(write=False)

Variant = Literal["naive", "group", "avg", "sgd", "default"]
_EPS_TOL = 1e-9


# ------------------------------------------------------------------------------ configuration


class UldpConfig(AlgorithmConfig):
    """Fields shared by every ULDP-FL algorithm (each uses the ones its docstring names).

    One shared set of fields lets ``pdpfl compare`` switch between the algorithms of one config.
    """

    local_epochs: int = Field(
        1, ge=1, le=100_000, description="Q: local epochs per user (AVG) or per silo (NAIVE, "
        "DEFAULT); ULDP-SGD takes one mean gradient per user"
    )
    server_lr: float | None = Field(
        None, gt=0, description="η_g, the global learning rate; default: the paper's choice, "
        "10 for AVG/SGD (Remark 2: |S|-times larger than FedAvg's) and 1 otherwise"
    )
    weights: Literal["uniform", "enhanced", "private"] = Field(
        "uniform",
        description="AVG/SGD user weights: uniform w = 1/|S|; enhanced w = n_{s,u}/N_u "
        "(Eq. 4; needs data.public_user_histograms: true -- discloses the histograms); or "
        "private: the same n_{s,u}/N_u computed by the private weighting protocol (Protocol 1: "
        "Paillier + masking; no histogram leaves a silo, the server sees only the sum)",
    )
    user_rate: float | None = Field(
        None, gt=0, le=1, description="q: user-level Poisson sub-sampling (Alg. 4, AVG/SGD); "
        "None = every user every round"
    )
    personal_budgets: bool = Field(
        False, description="AVG/SGD: each user's own ε_u (the budgets section, drawn over "
        "users) enforced through per-user sampling rates q_u and a per-user ledger"
    )
    sensitivity: Literal["rigorous", "paper"] = Field(
        "rigorous", description="NAIVE: rigorous 2|S|C (default) or the paper's |S|C (the "
        "honest ε is then reported, with a warning)"
    )
    group_k: Annotated[int, Field(ge=1)] | Literal["max", "median"] = Field(
        8, description="GROUP: records kept per user across silos (an integer, max or median "
        "of N_u; max/median need data.public_user_histograms)"
    )
    group_flags: Literal["fair", "split"] = Field(
        "split", description="GROUP: fair = round-robin over the silos holding the user's "
        "records (needs the histograms); split = data-independent share ⌈k/|S|⌉ per silo"
    )
    group_conversion: Literal["best", "rdp", "dp"] = Field(
        "best", description="GROUP: Lemma 9 (rdp), Lemma 8 (dp) or the smaller (best)"
    )
    record_rate: float | None = Field(
        None, gt=0, le=1, description="GROUP: public per-record Poisson rate of the silos' "
        "DP-SGD (τ = training.local_steps steps per round)"
    )

    #: Which ULDP algorithm the subclass is.
    variant: ClassVar[Variant] = "avg"

    @property
    def private(self) -> bool:
        return self.variant != "default"

    def check(self, config: ExperimentConfig) -> list[str]:
        problems: list[str] = []
        tr, pv, data = config.training, config.privacy, config.data
        if tr.client_rate != 1.0:
            problems.append(
                "training.client_rate: ULDP-FL trains every silo every round (the server divides "
                "by |S|); set 1.0"
            )
        if config.aggregation != "plain" and self.weights == "private":
            problems.append(
                "aggregation: algorithm.weights: private runs its own protocol (which includes "
                "secure summation); leave aggregation: plain"
            )
        num_users = dict(data.options).get("num_users")
        if self.variant != "default" and num_users is None:
            problems.append(
                "data.options.num_users: required by user-level DP (the public number of users "
                "|U|, linked across silos)"
            )
        needs_hist = (self.variant in ("avg", "sgd") and self.weights == "enhanced") or (
            self.variant == "group"
            and (self.group_flags == "fair" or self.group_k in ("max", "median"))
        )
        if needs_hist and not data.public_user_histograms:
            what = (
                "algorithm.weights: enhanced weights n_{s,u}/N_u"
                if self.variant in ("avg", "sgd")
                else "algorithm.group_k/group_flags: max/median k and fair flags"
            )
            problems.append(
                f"{what} need every silo's per-user record counts, which plain aggregation "
                "discloses to the server; set data.public_user_histograms: true to accept that "
                "(or use uniform weights / group_flags: split with an integer group_k)"
            )
        if not self.private:
            return problems
        problems += noise_source_problems(config, "σ such that the planned user-level ε is ε_max")
        if self.variant == "group":
            if pv.noise_multiplier is None:
                problems.append("privacy.noise_multiplier: required by uldp-group")
            if self.record_rate is None:
                problems.append(
                    "algorithm.record_rate: required by uldp-group (the public per-record Poisson "
                    "rate of the silos' DP-SGD, e.g. 0.1)"
                )
            if tr.batch_size is None:
                problems.append(
                    "training.batch_size: required by uldp-group (the public expected batch size "
                    "B dividing each DP-SGD step's noisy sum)"
                )
        if self.weights == "private" and self.variant not in ("avg", "sgd"):
            problems.append("algorithm.weights: private applies to uldp-avg and uldp-sgd only")
        if self.personal_budgets and self.variant not in ("avg", "sgd"):
            problems.append("algorithm.personal_budgets: applies to uldp-avg and uldp-sgd only")
        if self.personal_budgets and self.user_rate is not None:
            problems.append(
                "algorithm.user_rate: with personal_budgets each user's rate q_u comes from its "
                "budget; leave user_rate unset"
            )
        return problems


class UldpNaiveConfig(UldpConfig):
    """ULDP-NAIVE (Alg. 1): silo-level clipping and noise for a user present in every silo."""

    name: Literal["uldp-naive"] = "uldp-naive"
    variant: ClassVar[Variant] = "naive"


class UldpGroupConfig(UldpConfig):
    """ULDP-GROUP-k (Alg. 2): ≤ k records per user, silo DP-SGD, group privacy."""

    name: Literal["uldp-group"] = "uldp-group"
    variant: ClassVar[Variant] = "group"


class UldpAvgConfig(UldpConfig):
    """ULDP-AVG (Alg. 3): per-user local models, clipped, weighted, noised per silo."""

    name: Literal["uldp-avg"] = "uldp-avg"
    variant: ClassVar[Variant] = "avg"


class UldpSgdConfig(UldpConfig):
    """ULDP-SGD (Alg. 3): per-user mean gradients, clipped, weighted, noised per silo."""

    name: Literal["uldp-sgd"] = "uldp-sgd"
    variant: ClassVar[Variant] = "sgd"


class UldpDefaultConfig(UldpConfig):
    """DEFAULT: FedAvg with two-sided learning rates, no DP (the utility ceiling)."""

    name: Literal["uldp-default"] = "uldp-default"
    variant: ClassVar[Variant] = "default"


# ------------------------------------------------------------------------- weights and flags


def uniform_weights(present: np.ndarray) -> np.ndarray:
    """w_{s,u} = 1/|S| where user u has records in silo s, else 0 (``present``: (S, U) bool).

    Users absent from a silo get no weight there (the reference assigns 1/|S| even there, but
    such a silo trains nothing for the user, so the aggregate is the same).
    """
    present = np.asarray(present, dtype=bool)
    return np.where(present, 1.0 / present.shape[0], 0.0)


def enhanced_weights(histogram: np.ndarray) -> np.ndarray:
    """Eq. (4): w_{s,u} = n_{s,u}/N_u, shrunk by a few ulps so that Σ_s w_{s,u} ≤ 1 exactly.

    ``histogram``: (S, U) non-negative counts. A user with no records (N_u = 0) gets no weight.
    """
    h = np.asarray(histogram, dtype=np.float64)
    if h.ndim != 2 or (h < 0).any() or not np.isfinite(h).all():
        raise ValueError("user_histogram: expected an (S, U) array of non-negative counts")
    totals = h.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(totals > 0, h / np.where(totals > 0, totals, 1.0), 0.0)
    w *= 1.0 - 4.0 * h.shape[0] * np.finfo(np.float64).eps
    check_weights(w)
    return w


def check_weights(weights: np.ndarray) -> None:
    """Validate user weights: w ≥ 0 and Σ_s w_{s,u} ≤ 1 for every user (Theorem 5's premise)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights: expected an (S, U) array of finite weights >= 0")
    sums = w.sum(axis=0)
    if (sums > 1.0).any():
        u = int(np.argmax(sums))
        raise ValueError(
            f"weights: Σ_s w_(s,u) = {sums[u]!r} > 1 for user {u}; the user-level sensitivity "
            "would exceed C"
        )


def _waterfill(counts: np.ndarray, target: int, offset: int) -> np.ndarray:
    """Take ``target`` items from bins ``counts`` as evenly as possible (round-robin)."""
    counts = np.asarray(counts, dtype=np.int64)
    if target >= counts.sum():
        return counts.copy()
    lo, hi = 0, int(counts.max())
    while lo < hi:  # largest level L with Σ min(n_s, L) ≤ target
        mid = (lo + hi + 1) // 2
        if np.minimum(counts, mid).sum() <= target:
            lo = mid
        else:
            hi = mid - 1
    take = np.minimum(counts, lo)
    rest = target - int(take.sum())
    s = len(counts)
    for j in range(s):  # one more record from the next silos that still have some
        if rest == 0:
            break
        k = (offset + j) % s
        if counts[k] > take[k]:
            take[k] += 1
            rest -= 1
    return take


def fair_group_quotas(histogram: np.ndarray, k: int) -> np.ndarray:
    """GROUP flags from the histograms: per user, min(k, N_u) records spread round-robin over
    the silos holding them (the reference's "fair" rule; user u starts at silo u mod |S|).

    Returns (S, U) quotas n̂_{s,u} ≤ n_{s,u} with Σ_s n̂_{s,u} ≤ k.
    """
    h = np.asarray(histogram, dtype=np.int64)
    k = _check_k(k)
    out = np.zeros_like(h)
    for u in range(h.shape[1]):
        out[:, u] = _waterfill(h[:, u], min(k, int(h[:, u].sum())), u % h.shape[0])
    return out


def split_group_quotas(num_silos: int, num_users: int, k: int) -> np.ndarray:
    """Data-independent GROUP flags: silo s keeps at most ⌊k/|S|⌋ (+1 for k mod |S| silos,
    rotating with the user id) of each user's records, so Σ_s n̂_{s,u} ≤ k without any
    histogram."""
    k = _check_k(k)
    s = np.arange(int(num_silos))[:, None]
    u = np.arange(int(num_users))[None, :]
    return k // num_silos + ((s - u) % num_silos < k % num_silos).astype(np.int64)


def _check_k(k: int) -> int:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"group_k: must be an integer >= 1, got {k!r}")
    return int(k)


def resolve_group_k(k: int | str, totals: np.ndarray | None) -> int:
    """k as an integer: fixed, ``max`` N_u or ``median`` N_u (floor; at least 1)."""
    if isinstance(k, str):
        if totals is None:
            raise ValueError(
                f"algorithm.group_k: {k} needs the silos' per-user record counts "
                "(data.public_user_histograms: true; not collected by the Flower runtime yet)"
            )
        t = np.asarray(totals, dtype=np.float64)
        t = t[t > 0]
        if t.size == 0:
            raise ValueError("algorithm.group_k: no user has any record")
        return max(1, int(t.max() if k == "max" else math.floor(float(np.median(t)))))
    return _check_k(k)


# --------------------------------------------------------------------------------- accounting


def user_epsilon(
    noise_multiplier: float, delta: float, rounds: int, rate: float = 1.0, orders=None
) -> float:
    """User-level ε of T rounds of the (Poisson-subsampled) Gaussian (Theorems 3, 5; Lemma 6).

    ε = min_α [T·ρ_SGM(α, q, σ) + log((α−1)/α) − (log δ + log α)/(α − 1)] (Lemma 4).

    By default the minimum runs over :data:`ORDERS` with pdpfl's continuous refinement of the
    optimal order -- the one conversion path the ledger uses, so a user charged T rounds spends
    exactly this ε. ``orders=`` restricts α to that grid alone (e.g. ``OPACUS_ORDERS`` to
    reproduce Opacus' numbers).
    """
    from pdpfl.privacy.conversion import rdp_to_epsilon
    from pdpfl.privacy.rdp import poisson_gaussian_rdp

    if int(rounds) <= 0:
        return 0.0
    if orders is None:
        from pdpfl.privacy.accountant import mechanism_epsilon
        from pdpfl.privacy.unit import SampledGaussianPlan

        plan = SampledGaussianPlan("user", float(noise_multiplier), float(delta), int(rounds))
        eps, _ = mechanism_epsilon(plan, np.array([float(rate)]), "third-party", int(rounds),
                                   orders=ORDERS)
        return float(eps[0])
    rdp = np.asarray(poisson_gaussian_rdp(np.array([rate]), noise_multiplier, orders))
    return float(rdp_to_epsilon(int(rounds) * rdp, orders, delta)[0][0])


def group_orders(k: int) -> np.ndarray:
    """Orders for Lemma 9 with groups of k (rounded up to 2^c): ORDERS plus a grid ≥ 2·2^c."""
    c = math.ceil(math.log2(k)) if k > 1 else 0
    lo = 2.0 ** (c + 1)
    extra = np.concatenate(
        [lo + np.arange(100) / 10.0, lo * np.array([1.25, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32])]
    )
    return np.union1d(ORDERS, extra)


def group_epsilon(
    rdp_fn: Any, delta: float, k: int, route: str = "best"
) -> dict[str, float]:
    """User-level ε of a record-level RDP curve for groups of k records (Theorem 4).

    ``rdp_fn(orders) -> rdp`` gives the record-level RDP (any orders). Routes:

    * ``rdp`` -- Lemma 9 (Mironov 2017, Prop. 2): k rounded *up* to 2^c, orders α ≥ 2^{c+1},
      (α/2^c, 3^c ρ(α))-RDP, then Lemma 4. Never 0 for k that is not a power of two (D4), never
      an order below 2k (D5).
    * ``dp`` -- Lemma 4 then Lemma 8 with the optimal inner δ_in over the whole range that can
      matter (:func:`pdpfl.privacy.group.group_epsilon_dp`, exact for the orders; any k).
    * ``best`` -- the smaller of the two.

    Returns ``{"rdp": ε, "dp": ε, "epsilon": reported, "k_rdp": 2^c}``.
    """
    from pdpfl.privacy.group import group_epsilon_dp, group_epsilon_from_rdp

    k = _check_k(k)
    if route not in ("best", "rdp", "dp"):
        raise ValueError(f"group_conversion: expected best, rdp or dp, got {route!r}")
    out: dict[str, float] = {"k_rdp": float(2 ** (math.ceil(math.log2(k)) if k > 1 else 0))}
    go = group_orders(k)
    eps_rdp = float(group_epsilon_from_rdp(rdp_fn(go), go, delta, k)[0].reshape(-1)[0])
    out["rdp"] = eps_rdp
    rec = np.asarray(rdp_fn(ORDERS), dtype=np.float64)
    best_dp = float(group_epsilon_dp(rec, ORDERS, delta, k)[0].reshape(-1)[0])
    out["dp"] = best_dp
    out["epsilon"] = {"rdp": eps_rdp, "dp": best_dp, "best": min(eps_rdp, best_dp)}[route]
    return out


def server_learning_rate(algo: UldpConfig) -> float:
    """η_g: ``algorithm.server_lr``, else the paper's per-method value (spec A.5.4)."""
    if algo.server_lr is not None:
        return float(algo.server_lr)
    return 10.0 if algo.variant in ("avg", "sgd") else 1.0


def observer_noise(variant: Variant, sigma: float, num_silos: int, config: UldpConfig) -> dict:
    """Noise multipliers each observer sees per round (see the module docstring).

    ``third-party`` sees Σ_s (sensitivity C, or 2|S|C for NAIVE); the ``server`` sees each silo's
    update under plain aggregation.
    """
    if variant == "naive":
        kappa = 2.0 if config.sensitivity == "rigorous" else 1.0
        eff = sigma * kappa / 2.0
        return {"third-party": eff, "server": eff}
    if variant in ("avg", "sgd"):
        # enhanced weights under plain aggregation: the server sees silo s's update, where one
        # user can weigh w_{s,u} = 1 against noise σC/√|S|. Uniform weights (w = 1/|S|), or
        # private weights (the protocol sums the silos' updates before the server sees them),
        # leave it the sum's σ.
        server = sigma / math.sqrt(num_silos) if config.weights == "enhanced" else sigma
        return {"third-party": sigma, "server": server}
    return {"third-party": sigma, "server": sigma}


# ------------------------------------------------------------------------------ setup (server)


def _variant(config: ExperimentConfig) -> Variant:
    return config.algorithm.variant


def num_users(config: ExperimentConfig) -> int:
    value = dict(config.data.options).get("num_users")
    if value is None:
        raise ValueError("data.options.num_users: required by user-level DP")
    return int(value)


def noise_multiplier(config: ExperimentConfig) -> float:
    """σ: ``privacy.noise_multiplier``, or the σ whose planned third-party ε (T rounds at the
    user rate q, 1 without sub-sampling / with personal budgets) equals ``privacy.epsilon_max``."""
    pv, algo = config.privacy, config.algorithm
    if pv.noise_multiplier is not None:
        return float(pv.noise_multiplier)
    if pv.epsilon_max is None:
        raise ValueError("privacy: set privacy.noise_multiplier or privacy.epsilon_max")
    from pdpfl.calibrate import noise_for_uniform_rate
    from pdpfl.privacy.unit import SampledGaussianPlan

    q = 1.0 if algo.personal_budgets or algo.user_rate is None else float(algo.user_rate)
    plan = SampledGaussianPlan("user", 1.0, pv.delta, config.training.rounds)
    return float(noise_for_uniform_rate(float(pv.epsilon_max), q, plan.as_training_plan()))


def user_budgets(config: ExperimentConfig) -> np.ndarray:
    """ε_u of every user: the ``budgets`` scenario drawn over |U| users (seeded: the users'
    choices are part of the simulated data), or ``budgets.file`` with one value per user."""
    from pdpfl import budgets as budgets_mod
    from pdpfl.seeding import numpy_generator

    n = num_users(config)
    if config.budgets.file is not None:
        values = np.asarray(budgets_mod.load_budgets(config.budgets.file), dtype=float)
        if values.shape != (n,):
            raise ValueError(
                f"budgets.file: {n} users but {config.budgets.file} has {values.size} budgets"
            )
        return values
    scenario = budgets_mod.make_scenario(config.budgets.scenario, **config.budgets.params)
    rng = numpy_generator(config.seed, "user-budgets")
    return np.asarray(budgets_mod.assign_budgets(scenario, n, rng), dtype=float)


def _need_histogram(hist: np.ndarray | None, what: str) -> np.ndarray:
    if hist is None:
        raise ValueError(
            f"{what} need the silos' per-user record counts, which this runtime did not collect "
            "(data.public_user_histograms: true in the simulator; the Flower runtime does not "
            "collect them yet)"
        )
    return hist


def setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    """What the server publishes before round 1 (to every silo): the mechanism and, when the
    histograms are declared public, what the silos need from them (N_u, GROUP quotas)."""
    algo, tr = config.algorithm, config.training
    variant = _variant(config)
    S = info.num_clients
    U = num_users(config) if variant != "default" else 0
    hist = None
    if info.user_histogram is not None and variant != "default":
        hist = np.asarray(info.user_histogram, dtype=np.int64)
        if hist.shape[0] != S or hist.shape[1] > U:
            raise ValueError(
                f"data.public_user_histograms: histogram of shape {hist.shape} for {S} silos and "
                f"{U} users"
            )
        hist = np.pad(hist, ((0, 0), (0, U - hist.shape[1])))
    sigma = noise_multiplier(config) if variant != "default" else 0.0
    C = float(tr.max_grad_norm)
    pub: dict[str, Any] = {
        "variant": variant,
        "num_silos": S,
        "num_users": U,
        "noise_multiplier": sigma,
        "delta": config.privacy.delta,
        "rounds": tr.rounds,
        "max_grad_norm": C,
        "local_epochs": algo.local_epochs,
        "local_steps": tr.local_steps,
        "weights": algo.weights,
        "user_totals": None,
        "group_k": None,
        "group_quota": None,
        "record_rate": algo.record_rate,
        "user_sampling": bool(
            variant in ("avg", "sgd") and (algo.personal_budgets or algo.user_rate is not None)
        ),
    }
    if variant == "naive":
        kappa = 2.0 if algo.sensitivity == "rigorous" else 1.0
        pub["noise_std"] = sigma * kappa * C * math.sqrt(S)  # Alg. 1 line 14
    elif variant in ("avg", "sgd"):
        pub["noise_std"] = sigma * C / math.sqrt(S)  # Alg. 3 line 17
        if algo.weights == "enhanced":
            enhanced_weights(_need_histogram(hist, "algorithm.weights: enhanced weights"))
            pub["user_totals"] = [int(v) for v in hist.sum(axis=0)]
    elif variant == "group":
        pub["noise_std"] = sigma * C  # per DP-SGD step, on the clipped sum
        totals = None if hist is None else hist.sum(axis=0)
        k = resolve_group_k(algo.group_k, totals)
        pub["group_k"] = k
        if algo.group_flags == "fair":
            hist = _need_histogram(hist, "algorithm.group_flags: fair flags")
            pub["group_quota"] = fair_group_quotas(hist, k).tolist()
        else:
            pub["group_quota"] = split_group_quotas(S, U, k).tolist()
    else:
        pub["noise_std"] = 0.0
    return {"uldp": pub}


# ------------------------------------------------------------------------------- silo side


def encode_mask(mask: np.ndarray) -> str:
    """A user bit mask as a hex string (a scalar, so it fits any runtime's round config)."""
    return np.packbits(np.asarray(mask, dtype=bool)).tobytes().hex()


def decode_mask(text: str, num_users: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(str(text)), dtype=np.uint8))
    if bits.size < num_users:
        raise ValueError(f"users: mask has {bits.size} bits for {num_users} users")
    return bits[:num_users].astype(bool)


class UldpSilo:
    """One silo of a ULDP-FL algorithm (holds its records, their user ids and its randomness).

    Per round (:meth:`fit`) it computes its release in separable steps -- local training
    (:meth:`user_vectors` for AVG/SGD), per-user clipping, :meth:`weighted_user_sum` (the step a
    private weighting protocol replaces) and :meth:`privatize` (noise) -- and returns only the
    noisy update.
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: Any,
        public: dict[str, Any],
        *,
        randomness: Randomness,
        batch_size: float | None,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        optimizer: str = "sgd",
        physical_batch_size: int = 512,
    ) -> None:
        from pdpfl.models import get_params

        self.client_id = int(client_id)
        self.model = model
        self.pub = dict(public)
        self.variant: Variant = self.pub["variant"]
        self.randomness = randomness
        self.batch_size = None if batch_size is None else max(1, int(round(float(batch_size))))
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.optimizer = optimizer
        self.physical_batch_size = int(physical_batch_size)
        self.num_params = len(get_params(model))
        self.x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        self.y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        self.x_test = torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))
        self.y_test = torch.as_tensor(np.asarray(data.y_test, dtype=np.int64))
        self.num_users = int(self.pub["num_users"])
        self.num_silos = int(self.pub["num_silos"])
        self.next_round = 0
        self.last_train_loss: float | None = None
        self.users = np.zeros(0, dtype=np.int64)
        self.user_index: list[np.ndarray] = []
        self.counts = np.zeros(0, dtype=np.int64)
        self.user_weights = np.zeros(0, dtype=np.float64)
        self.kept = np.arange(len(self.y_train))
        if self.variant in ("avg", "sgd", "group"):
            self._index_users(data.user_ids)
        if self.variant in ("avg", "sgd"):
            self.user_weights = self._weights()
        if self.variant == "group":
            self.kept = self._group_kept()

    # -- setup at the silo ---------------------------------------------------------------------
    def _index_users(self, user_ids: np.ndarray | None) -> None:
        if user_ids is None:
            raise ValueError(
                f"silo {self.client_id}: user-level DP needs user ids (data.options.num_users)"
            )
        ids = np.asarray(user_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_users):
            raise ValueError(
                f"silo {self.client_id}: user ids must lie in [0, {self.num_users}) "
                "(data.options.num_users)"
            )
        order = np.argsort(ids, kind="stable")  # dataset order within each user
        self.users, starts, self.counts = np.unique(
            ids[order], return_index=True, return_counts=True
        )
        self.user_index = [order[s : s + c] for s, c in zip(starts, self.counts, strict=True)]

    def _weights(self) -> np.ndarray:
        """w_{s,u} for this silo's users (Eq. 4 or 1/|S|; empty for private weights, which only
        the protocol computes, encrypted)."""
        if self.pub["weights"] == "uniform":
            return np.full(len(self.users), 1.0 / self.num_silos)
        if self.pub["weights"] == "private":
            return np.zeros(0)
        totals = np.asarray(self.pub["user_totals"], dtype=np.float64)[self.users]
        if (self.counts > totals).any():
            raise ValueError(
                f"silo {self.client_id}: a user has more records here than the published total "
                "N_u; the disclosed histogram does not match the data"
            )
        w = self.counts / totals * (1.0 - 4.0 * self.num_silos * np.finfo(np.float64).eps)
        return w

    def _group_kept(self) -> np.ndarray:
        """Indices of the records the fixed GROUP flags keep (first n̂_{s,u} of each user)."""
        quota = np.asarray(self.pub["group_quota"], dtype=np.int64)[self.client_id]
        parts = [idx[: int(quota[u])] for u, idx in zip(self.users, self.user_index, strict=True)]
        kept = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return np.sort(kept)

    def local_spec(self, sgd: bool = False):  # -> LocalTrainingSpec
        from pdpfl.dp.batched import LocalTrainingSpec

        if sgd:  # one mean gradient per user at x_t (lr 1: the delta is −g)
            return LocalTrainingSpec(epochs=1, batch_size=None, optimizer="sgd", lr=1.0, steps=1)
        return LocalTrainingSpec(
            epochs=int(self.pub["local_epochs"]),
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )

    # -- the release, step by step --------------------------------------------------------------
    def selected_users(self, config: Scalars) -> np.ndarray:
        """Positions (into :attr:`users`) of this round's users: all, or the server's mask."""
        if "users" not in config:
            if self.pub.get("user_sampling"):
                raise ValueError(f"silo {self.client_id}: the round config lacks the user mask")
            return np.arange(len(self.users))
        mask = decode_mask(str(config["users"]), self.num_users)
        return np.flatnonzero(mask[self.users])

    def user_vectors(self, global_params: Params, positions: np.ndarray, round_index: int):
        """Δ_{s,u} (AVG: trained − global after Q epochs; SGD: the mean gradient g_{s,u}) for the
        users at ``positions``, stacked as one (K, *shape) tensor per parameter."""
        from pdpfl.dp.batched import train_copies
        from pdpfl.models import set_params

        set_params(self.model, global_params)
        datasets = [
            (self.x_train[self.user_index[p]], self.y_train[self.user_index[p]]) for p in positions
        ]
        sgd = self.variant == "sgd"
        deltas = train_copies(
            self.model,
            datasets,
            self.local_spec(sgd=sgd),
            # One stream per user: a user's local training depends on its own coins only.
            stream=[
                self.randomness.stream("local-training", round_index, self.client_id, int(u))
                for u in self.users[positions]
            ],
            # up to 256 users per vectorized step; records per step capped by the default
            # (layer outputs near 16 MB: cache-friendly for convolutional models)
            group_size=256,
        )
        return [-d for d in deltas] if sgd else deltas

    @staticmethod
    def weighted_user_sum(clipped: list[torch.Tensor], weights: np.ndarray) -> list[torch.Tensor]:
        """Σ_u w_{s,u}·Clip(Δ_{s,u}) (Alg. 3 line 16), in float64.

        The one step that needs the weights: a private weighting protocol (Paillier + masking,
        Sec. 4) replaces it with an encrypted weighted sum whose inputs are ``clipped``, this
        silo's counts n_{s,u} and the user mask.
        """
        w = torch.as_tensor(np.asarray(weights, dtype=np.float64))
        return [torch.tensordot(w, c.to(torch.float64), dims=1) for c in clipped]

    def privatize(self, sums: list[torch.Tensor], round_index: int) -> list[np.ndarray]:
        """Add this silo's Gaussian noise N(0, noise_std²) in float64 (silo's own stream)."""
        from pdpfl.dp.steps import noisy_normalised_sum

        std = float(self.pub["noise_std"])
        stream = self.randomness.stream("noise", round_index, self.client_id) if std > 0 else None
        out = noisy_normalised_sum([s.to(torch.float64) for s in sums], std, 1.0, stream)
        return [o.to(torch.float32).numpy() for o in out]

    # -- ULDP-FL private weighting (Protocol 1): what the silo supplies, never sent itself -----
    def user_histogram(self) -> np.ndarray:
        """n_{s,u} for every user u = 0..|U|-1: this silo's training records per user."""
        hist = np.zeros(self.num_users, dtype=np.int64)
        hist[self.users] = self.counts
        return hist

    def user_updates(self, global_params: Params, round_index: int, config: Scalars):
        """Clip(Δ_{s,u}, C) of this round's users, flattened, and the silo's noise z_s (Alg. 3
        lines 10-17 without the weighting, which the protocol does under encryption)."""
        from pdpfl.dp.steps import clip_vectors
        from pdpfl.fl.aggregation.private_weighting import UserUpdates

        if self.variant not in ("avg", "sgd") or self.pub["weights"] != "private":
            raise ValueError("weights: private applies to uldp-avg / uldp-sgd configured with "
                             "algorithm.weights: private")
        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"silo {self.client_id}: round {t} was already trained")
        shapes = [tuple(np.shape(p)) for p in global_params]
        d = int(sum(math.prod(s) for s in shapes))
        positions = self.selected_users(config)
        if len(positions):
            vectors = self.user_vectors(global_params, positions, t)
            clipped, _ = clip_vectors(vectors, float(self.pub["max_grad_norm"]))
            deltas = torch.cat(
                [c.to(torch.float64).reshape(len(positions), -1) for c in clipped], dim=1
            ).numpy()
        else:
            deltas = np.zeros((0, d))
        zeros = [torch.zeros(s, dtype=torch.float64) for s in shapes]
        noise = np.concatenate([np.asarray(z, dtype=np.float64).ravel()
                                for z in self._noise(zeros, t)])
        self.next_round = t + 1
        return UserUpdates(users=self.users[positions].astype(np.int64), deltas=deltas,
                           noise=noise)

    def _noise(self, zeros: list[torch.Tensor], round_index: int) -> list[torch.Tensor]:
        """z_s ~ N(0, noise_std²) per coordinate in float64 from the silo's own stream."""
        from pdpfl.dp.steps import noisy_normalised_sum

        std = float(self.pub["noise_std"])
        stream = self.randomness.stream("noise", round_index, self.client_id) if std > 0 else None
        return noisy_normalised_sum(zeros, std, 1.0, stream)

    def _avg_release(self, global_params: Params, t: int, config: Scalars) -> list[np.ndarray]:
        from pdpfl.dp.steps import clip_vectors

        positions = self.selected_users(config)
        shapes = [tuple(np.shape(p)) for p in global_params]
        if len(positions):
            vectors = self.user_vectors(global_params, positions, t)
            clipped, _ = clip_vectors(vectors, float(self.pub["max_grad_norm"]))
            sums = self.weighted_user_sum(clipped, self.user_weights[positions])
        else:  # nobody of this silo was sampled: a noise-only release of the same shape
            sums = [torch.zeros(s, dtype=torch.float64) for s in shapes]
        return self.privatize(sums, t)

    def _silo_delta(self, global_params: Params, t: int) -> list[torch.Tensor]:
        """NAIVE / DEFAULT: Q epochs of SGD(η_l) on all of the silo's records (Alg. 1 l. 8-12)."""
        from pdpfl.dp.batched import train_copies
        from pdpfl.models import set_params

        set_params(self.model, global_params)
        deltas = train_copies(
            self.model,
            [(self.x_train, self.y_train)],
            self.local_spec(),
            stream=self.randomness.stream("local-training", t, self.client_id),
        )
        return [d[0] for d in deltas]

    def _group_release(self, global_params: Params, t: int) -> list[np.ndarray]:
        """Alg. 2 lines 8-10: DP-SGD on the flagged records D̂_s (the flags never change)."""
        from pdpfl.dp.engine import make_optimizer, train_steps
        from pdpfl.models import get_params, set_params

        set_params(self.model, global_params)
        opt = make_optimizer(
            self.optimizer,
            self.model.parameters(),
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )
        idx = torch.as_tensor(self.kept, dtype=torch.long)
        n = len(idx)
        result = train_steps(
            self.model,
            self.x_train[idx],
            self.y_train[idx],
            rates=torch.full((n,), float(self.pub["record_rate"]), dtype=torch.float64),
            steps=int(self.pub["local_steps"]),
            noise_multiplier=float(self.pub["noise_multiplier"]),
            max_grad_norm=float(self.pub["max_grad_norm"]),
            optimizer=opt,
            stream=self.randomness.stream("local-training", t, self.client_id),
            normalizer=float(self.batch_size or 0) or None,
            private=True,
            physical_batch_size=self.physical_batch_size,
        )
        self.last_train_loss = float(result.mean_loss)
        new = get_params(self.model)
        return [
            (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).astype(np.float32)
            for a, b in zip(new, global_params, strict=True)
        ]

    # -- ClientAlgorithm --------------------------------------------------------------------------
    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        from pdpfl.dp.steps import clip_vectors

        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"silo {self.client_id}: round {t} was already trained")
        if self.variant in ("avg", "sgd") and self.pub["weights"] == "private":
            raise ValueError(
                "algorithm.weights: private weights are computed only inside the private "
                "weighting protocol (aggregation by Protocol 1); this runtime called fit()"
            )
        if self.variant in ("avg", "sgd"):
            update = self._avg_release(global_params, t, config)
        elif self.variant == "group":
            update = self._group_release(global_params, t)
        else:
            delta = self._silo_delta(global_params, t)
            if self.variant == "naive":  # Alg. 1 line 14: Clip(Δ_s, C) + N(0, σ²κ²C²|S|)
                clipped, _ = clip_vectors(
                    [d.unsqueeze(0) for d in delta], float(self.pub["max_grad_norm"])
                )
                update = self.privatize([c[0].to(torch.float64) for c in clipped], t)
            else:
                update = [d.to(torch.float32).numpy() for d in delta]
        self.next_round = t + 1
        return Contribution(update=[np.asarray(u, dtype=np.float32) for u in update])

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def privacy_summary(self) -> Scalars:
        """This silo's counts (stays at the silo). User-level ε is accounted by the server."""
        return {
            "n_records": int(len(self.y_train)),
            "users_here": int(len(self.users)),
            "kept_records": int(len(self.kept)),
            "private": self.variant != "default",
        }

    def state_dict(self) -> dict[str, Any]:
        return {"next_round": self.next_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])


# ----------------------------------------------------------------------------- server side


class UldpServer:
    """The ULDP-FL server: user sampling (Alg. 4), the global step and the user-level ledgers.

    Parameters
    ----------
    config, info, public
        The experiment, the federation's public facts and the published setup.
    randomness
        The server's own randomness (user-sampling coins).
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False

    def __init__(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        public: dict[str, Any],
        randomness: Randomness,
    ) -> None:
        self.pub = dict(public["uldp"])
        self.variant: Variant = self.pub["variant"]
        self.algo = config.algorithm
        self.randomness = randomness
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial_params(config, info)]
        self.num_silos = int(self.pub["num_silos"])
        self.num_users = int(self.pub["num_users"])
        self.server_lr = server_learning_rate(self.algo)
        self.delta = float(self.pub["delta"])
        self.rounds = int(self.pub["rounds"])
        self.adversary = config.privacy.adversary
        self.rounds_done = 0
        self.participation: dict[int, int] = {}
        self._pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.warnings = self._warnings(config)
        self.rates = np.ones(self.num_users)
        self.budgets: np.ndarray | None = None
        self.excluded = np.zeros(self.num_users, dtype=bool)
        self.ledgers: dict[str, PrivacyLedger] = {}
        if self.variant in ("avg", "sgd", "naive"):
            self._build_ledgers(config)
        if self.variant in ("avg", "sgd"):
            total_rate = float(self.rates.sum())
            if total_rate <= 0:
                raise ValueError("budgets: no user can be sampled (every q_u = 0)")
            self.divisor = self.num_silos * total_rate  # q·|S|·|U| (a float: D24)
            self.sign = 1.0 if self.variant == "avg" else -1.0  # SGD releases gradients (D1)
        else:
            self.divisor = float(self.num_silos)
            self.sign = 1.0

    # -- accounting ---------------------------------------------------------------------------
    def _build_ledgers(self, config: ExperimentConfig) -> None:
        from pdpfl.ledger import PrivacyLedger
        from pdpfl.privacy.unit import SampledGaussianPlan

        sigma = float(self.pub["noise_multiplier"])
        noise = observer_noise(self.variant, sigma, self.num_silos, self.algo)
        if config.aggregation == "secure":  # the server sees only the sum, like a third party
            noise["server"] = noise["third-party"]
        self.observer_noise = noise
        U, T = self.num_users, self.rounds
        if self.variant in ("avg", "sgd") and self.algo.personal_budgets:
            self.budgets = user_budgets(config)
            self.rates = self._calibrate(self.budgets, noise["third-party"], config)
        elif self.variant in ("avg", "sgd") and self.algo.user_rate is not None:
            self.rates = np.full(U, float(self.algo.user_rate))
        q = float(self.rates.max()) if U else 1.0
        tp_plan = SampledGaussianPlan("user", noise["third-party"], self.delta, T, ("third-party",))
        sv_plan = SampledGaussianPlan("user", noise["server"], self.delta, T, ("server",))
        if self.budgets is not None:
            tp_budget = sv_budget = self.budgets
        else:  # one planned ε for everybody: reported, never a reason to stop
            tp_budget = np.full(U, user_epsilon(noise["third-party"], self.delta, T, q) + 1e-9)
            sv_budget = np.full(U, user_epsilon(noise["server"], self.delta, T, 1.0) + 1e-9)
        self.ledgers["third-party"] = PrivacyLedger(tp_budget, self.rates, tp_plan, orders=ORDERS)
        # The server drew the coins: a sampled round costs it a full Gaussian round (q = 1).
        self.ledgers["server"] = PrivacyLedger(sv_budget, np.ones(U), sv_plan, orders=ORDERS)

    def _calibrate(self, budgets: np.ndarray, sigma: float, config: ExperimentConfig) -> np.ndarray:
        """q_u = F(ε_u): the certified calibrator at the user level (T rounds of SGM(q_u, σ))."""
        from pdpfl.calibrate import fit_estimator
        from pdpfl.privacy.unit import SampledGaussianPlan

        plan = SampledGaussianPlan("user", sigma, self.delta, self.rounds)
        est = fit_estimator(plan.as_training_plan(), method="certified", adversary="third-party")
        rates = np.clip(np.asarray(est.rates(budgets), dtype=np.float64), 0.0, 1.0)
        self.excluded = rates <= 0
        if self.excluded.any() and not config.privacy.allow_exclusion:
            low = budgets[self.excluded]
            raise ValueError(
                f"budgets: {int(self.excluded.sum())} user(s) have budgets in [{low.min():g}, "
                f"{low.max():g}], below the smallest ε this mechanism can give a positive rate "
                f"(σ = {sigma:g}, T = {self.rounds}); set privacy.allow_exclusion: true to "
                "exclude them, or raise σ"
            )
        return rates

    def _warnings(self, config: ExperimentConfig) -> list[str]:
        out = []
        if config.data.public_user_histograms and self.variant != "default":
            out.append(
                "data.public_user_histograms: every silo's per-user record counts n_(s,u) were "
                "disclosed to the server (and N_u to every silo through the weights/flags); "
                "they are not protected by the reported ε"
            )
        if self.variant == "naive" and self.algo.sensitivity == "paper":
            sigma = float(self.pub["noise_multiplier"])
            claimed = user_epsilon(sigma, self.delta, self.rounds)
            out.append(
                "algorithm.sensitivity: paper -- noise scaled for the published sensitivity "
                "|S|·C, but removing a user moves each clipped silo update by up to 2C (spec "
                f"D29); the reported ε is that of noise multiplier σ/2 = {sigma / 2:g}, not the "
                f"paper's claim ε = {claimed:.4g}"
            )
        if self.variant == "default":
            out.append("uldp-default is FedAvg without differential privacy (ε = ∞)")
        return out

    # -- ServerAlgorithm ----------------------------------------------------------------------
    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Every silo, every round (ULDP-FL's |S| divisor assumes full participation)."""
        return sorted(int(c) for c in client_ids)

    def _round_users(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(active, taking part) users of round t: pre-check, then one Bernoulli(q_u) each."""
        if t in self._pending:
            return self._pending[t]
        U = self.num_users
        active = ~self.excluded
        if self.budgets is not None:  # personal budgets: sit out before overspending
            for obs, ledger in self.ledgers.items():
                if self.adversary in (obs, "both"):
                    active &= ~np.asarray(ledger.would_exceed(adversary=obs), dtype=bool)
        if self.pub.get("user_sampling"):
            coins = self.randomness.stream("user-sampling", t).uniform(U)
            taking = active & (coins < self.rates)
        else:
            taking = active.copy()
        self._pending = {t: (active, taking)}
        return active, taking

    def sampled_users(self, round_index: int) -> np.ndarray | None:
        """Algorithm 4's user mask of ``round_index`` for the private weighting protocol (users
        not taking part get weight 0), or None without user sub-sampling."""
        if not self.pub.get("user_sampling"):
            return None
        return self._round_users(int(round_index))[1]

    def round_config(self, round_index: int) -> Scalars:
        cfg: Scalars = {"round": int(round_index)}
        if self.pub.get("user_sampling"):
            cfg["users"] = encode_mask(self._round_users(int(round_index))[1])
        return cfg

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """Alg. 1/2 line 7: x + η_g/|S|·Σ; Alg. 3/4: x ± η_g/(q|S||U|)·Σ (+ AVG, − SGD)."""
        if aggregate.empty:
            return [np.asarray(p).copy() for p in global_params]
        scale = self.sign * self.server_lr / self.divisor
        return [
            (np.asarray(x, dtype=np.float64) + scale * np.asarray(s, dtype=np.float64)).astype(
                np.float32
            )
            for x, s in zip(global_params, aggregate.total, strict=True)
        ]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        t = int(round_index)
        if self.ledgers:
            active, taking = self._round_users(t)
            for ledger in self.ledgers.values():
                ledger.record_round(participated=taking, active=active)
        self._pending.pop(t, None)
        for c in selected:
            self.participation[int(c)] = self.participation.get(int(c), 0) + 1
        self.rounds_done += 1

    # -- reporting ----------------------------------------------------------------------------
    def group_account(self, rounds: int | None = None) -> dict[str, float]:
        """ULDP-GROUP: user-level ε after ``rounds`` rounds (Theorem 4)."""
        t = self.rounds_done if rounds is None else int(rounds)
        cache = self.__dict__.setdefault("_group_cache", {})
        if t not in cache:
            cache[t] = self._group_account(t)
        return dict(cache[t])

    def _group_account(self, t: int) -> dict[str, float]:
        from pdpfl.privacy.rdp import poisson_gaussian_rdp

        sigma, q = float(self.pub["noise_multiplier"]), float(self.pub["record_rate"])
        steps = t * int(self.pub["local_steps"])
        if steps == 0:
            return {"epsilon": 0.0, "rdp": 0.0, "dp": 0.0, "record": 0.0}

        def rdp(orders: np.ndarray) -> np.ndarray:
            return steps * np.asarray(poisson_gaussian_rdp(np.array([q]), sigma, orders))

        res = group_epsilon(rdp, self.delta, int(self.pub["group_k"]), self.algo.group_conversion)
        res["record"] = user_epsilon(sigma, self.delta, steps, q)
        return res

    def privacy_report(self) -> dict[str, Any]:
        """The server's user-level privacy view (scalars; merged into ``summary.json``)."""
        out: dict[str, Any] = {"users": self.num_users}
        if self.variant == "default":
            out.update(eps_third_party_max=math.inf, eps_server_max=math.inf)
            return out
        if self.variant == "group":
            g = self.group_account()
            out.update(
                eps_third_party_max=g["epsilon"],
                eps_server_max=g["epsilon"],
                group_k=int(self.pub["group_k"]),
                group_eps_rdp=g["rdp"],
                group_eps_dp=g["dp"],
                record_level_eps=g["record"],
            )
            return out
        tp = self.ledgers["third-party"].spent_epsilon("third-party")
        sv = self.ledgers["server"].spent_epsilon("server")
        out.update(
            eps_third_party_max=float(tp.max()) if tp.size else 0.0,
            eps_server_max=float(sv.max()) if sv.size else 0.0,
            noise_multiplier_third_party=self.observer_noise["third-party"],
            noise_multiplier_server=self.observer_noise["server"],
            mean_user_rate=float(self.rates.mean()) if self.rates.size else 0.0,
        )
        if self.budgets is not None:
            from pdpfl.ledger import budget_groups

            over_tp = tp > self.budgets * (1 + _EPS_TOL) + _EPS_TOL
            over_sv = sv > self.budgets * (1 + _EPS_TOL) + _EPS_TOL
            stopped = self.ledgers["third-party"].sat_out_rounds > 0
            out.update(
                over_budget_third_party=int(over_tp.sum()),
                over_budget_server=int(over_sv.sum()),
                stopped=int((stopped & ~self.excluded).sum()),
                excluded=int(self.excluded.sum()),
            )
            groups, labels = budget_groups(self.budgets)
            for g, label in enumerate(labels):
                m = groups == g
                if not m.any():
                    continue
                key = f"group.{label}"
                out[f"{key}.count"] = int(m.sum())
                out[f"{key}.budget"] = float(self.budgets[m].max())
                out[f"{key}.excluded"] = int(self.excluded[m].sum())
                out[f"{key}.mean_rate"] = float(self.rates[m].mean())
                for tag, eps, over in (("third_party", tp, over_tp), ("server", sv, over_sv)):
                    out[f"{key}.max_spent_{tag}"] = float(eps[m].max())
                    out[f"{key}.sum_utilization_{tag}"] = float((eps[m] / self.budgets[m]).sum())
                    out[f"{key}.over_budget_{tag}"] = int(over[m].sum())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rounds_done": self.rounds_done,
            "participation": {str(k): v for k, v in self.participation.items()},
            "empty_rounds": 0,
            "ledgers": {k: v.state_dict() for k, v in self.ledgers.items()},
            # Derived, for the run summary (ignored when loading):
            "privacy": self.privacy_report(),
            "warnings": list(self.warnings),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds_done = int(state["rounds_done"])
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        for k, ledger_state in state.get("ledgers", {}).items():
            self.ledgers[k].load_state_dict(ledger_state)


# ------------------------------------------------------------------------------ builders


def build_server(
    config: ExperimentConfig, info: FederationInfo, public: dict[str, Any], randomness: Randomness
) -> UldpServer:
    return UldpServer(config, info, public, randomness)


def build_client(
    config: ExperimentConfig,
    client_id: int,
    data: Any,
    info: FederationInfo,
    public: dict[str, Any],
    randomness: Randomness,
) -> UldpSilo:
    tr = config.training
    return UldpSilo(
        client_id,
        silo_model(config, info),
        data,
        public["uldp"],
        randomness=randomness,
        batch_size=tr.batch_size_for(client_id),
        lr=tr.lr,
        momentum=tr.momentum,
        weight_decay=tr.weight_decay,
        optimizer=tr.optimizer,
        physical_batch_size=tr.physical_batch_size,
    )


#: Turn pdpfl.testing.TOY_CONFIG (3 digits silos, 2 rounds) into a user-level toy run.
_TOY = ("data.options.num_users=12",)
_SPEC = dict(
    unit="user", setup=setup, server=build_server, client=build_client, toy_overrides=_TOY
)
register_algorithm(
    AlgorithmSpec(
        name="uldp-naive",
        config=UldpNaiveConfig,
        summary="ULDP-NAIVE: silo-level clipping and noise (rigorous 2|S|C sensitivity)",
        **_SPEC,
    )
)
register_algorithm(
    AlgorithmSpec(
        name="uldp-group",
        config=UldpGroupConfig,
        summary="ULDP-GROUP-k: ≤ k records per user, silo DP-SGD, group privacy",
        **{
            **_SPEC,
            "toy_overrides": (
                *_TOY, "privacy.epsilon_max=null", "privacy.noise_multiplier=2.0",
                "algorithm.record_rate=0.2",
            ),
        },
    )
)
register_algorithm(
    AlgorithmSpec(
        name="uldp-avg",
        config=UldpAvgConfig,
        summary="ULDP-AVG: per-user local models, clipped and weighted (user-level DP)",
        **_SPEC,
    )
)
register_algorithm(
    AlgorithmSpec(
        name="uldp-sgd",
        config=UldpSgdConfig,
        summary="ULDP-SGD: per-user mean gradients, clipped and weighted (user-level DP)",
        **_SPEC,
    )
)
register_algorithm(
    AlgorithmSpec(
        name="uldp-default",
        config=UldpDefaultConfig,
        unit="none",
        setup=setup,
        server=build_server,
        client=build_client,
        summary="DEFAULT (ULDP-FL): FedAvg with two-sided learning rates, no DP",
        toy_overrides=_TOY,
    )
)

_ENHANCED = ["algorithm.weights=enhanced", "data.public_user_histograms=true"]


def _rate(arg: str | None, name: str) -> list[str]:
    if arg is None:
        return []
    return [f"algorithm.user_rate={arg}"]


def _group(arg: str | None) -> list[str]:
    out = ["algorithm.name=uldp-group"]
    if arg is None:
        return out
    out.append(f"algorithm.group_k={arg}")
    if arg in ("max", "median"):
        out += ["algorithm.group_flags=fair", "data.public_user_histograms=true"]
    return out


for _name, _help, _over, _arg in (
    ("default", "DEFAULT: FedAvg with two-sided learning rates, no DP", lambda a: [
        "algorithm.name=uldp-default"], False),
    ("uldp-group", "ULDP-GROUP-k (uldp-group:K with K an integer, max or median)", _group, True),
    ("uldp-avg-w", "ULDP-AVG with enhanced weights (discloses the histograms to the server)",
     lambda a: ["algorithm.name=uldp-avg", *_ENHANCED], False),
    ("uldp-sgd-w", "ULDP-SGD with enhanced weights (discloses the histograms to the server)",
     lambda a: ["algorithm.name=uldp-sgd", *_ENHANCED], False),
    ("uldp-avg-s", "ULDP-AVG with user sub-sampling q = ARG",
     lambda a: ["algorithm.name=uldp-avg", *_rate(a, "s")], True),
    ("uldp-avg-ws", "ULDP-AVG-w with user sub-sampling q = ARG",
     lambda a: ["algorithm.name=uldp-avg", *_ENHANCED, *_rate(a, "ws")], True),
    ("uldp-sgd-s", "ULDP-SGD with user sub-sampling q = ARG",
     lambda a: ["algorithm.name=uldp-sgd", *_rate(a, "s")], True),
    ("uldp-sgd-ws", "ULDP-SGD-w with user sub-sampling q = ARG",
     lambda a: ["algorithm.name=uldp-sgd", *_ENHANCED, *_rate(a, "ws")], True),
    ("puldp-avg-w", "ULDP-AVG-w with personal budgets per user (budgets section; per-user "
     "rates q_u from the certified calibrator)", lambda a: [
         "algorithm.name=uldp-avg", *_ENHANCED, "algorithm.personal_budgets=true"], False),
    ("puldp-avg", "ULDP-AVG (uniform weights) with personal budgets per user", lambda a: [
        "algorithm.name=uldp-avg", "algorithm.personal_budgets=true"], False),
):
    register_method(MethodSpec(_name, _over, _help, takes_argument=_arg), replace=True)
