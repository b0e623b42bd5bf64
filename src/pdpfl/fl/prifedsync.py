"""PriFedSync: personalized local models synchronized privately (Zheng, Chen, Long, Su, AISTATS 2021).

Algorithm 1 (the PriFedSync framework) with Algorithm 2 (NoisySGD) as local training,
instantiated as in the paper's §4: aggregation rate η = 1 and the interpolated helper model of
Eq. (2.1) with α = 0.1.

Each of the m clients keeps its own personalized local model h_j (all start from the public x⁰).
Round r:

1. **Join** (Algorithm 1, "Poisson sample Ω"): every client flips its own coin -- an independent
   Bernoulli(p) from the client's own randomness, p = ``training.client_rate``. Nobody redraws an
   empty round (the reference code does); a round nobody joins leaves the global model as it is.
   The server asks every client; a client that does not join releases a zero update of weight 0,
   so under secure summation the server learns only |Ω| (the summed weight).
2. **Local training** (Algorithm 2): a joined client runs K DP-SGD steps from h_j (K =
   ``training.local_steps``; ``algorithm.local_epoch: true`` makes it one local epoch,
   K_j = min(K, ⌈n_j/B⌉), computed at the silo), each on a
   batch of exactly B records drawn uniformly **without replacement**
   (:func:`pdpfl.dp.steps.wor_sample`; ``algorithm.sampler: poisson`` draws one Bernoulli(B/n)
   coin per record instead), per-sample clipping to C, Gaussian noise of std σ·C and division by
   the public normaliser B (``training.batch_size``). The optimizer's state (e.g. Adam moments)
   persists across rounds at the client, as in the reference; it is a function of the noisy
   gradients only. The client releases its new local model w̃_j as a
   :class:`~pdpfl.fl.api.Contribution` of weight 1 (the mechanism's output: post-processing of
   its noisy gradients).
3. **Aggregation**: the global model is w̄ ← (1 − η)·w̄ + η·Σ_{j∈Ω} w̃_j / |Ω| -- computed from the
   sum of the contributions, so any summation protocol applies.
4. **Elastic sync** (Eq. 2.1): each joined client moves its local model a fraction α toward the
   new global model, h_j ← (1 − α)·w̃_j + α·w̄, when it next receives w̄ (the evaluation that
   follows every round, or its next fit); clients that did not join keep h_j unchanged.

Metric (§4): the mean over clients of each local model's accuracy on the client's own test
split. Evaluation replies carry only ``loss``, ``accuracy`` and ``n`` (aggregate test metrics), so
with ``algorithm.evaluate: local`` (default) each silo's reply is its *local model's* metrics on
its test split: ``mean_client_accuracy`` in ``metrics.jsonl`` and ``summary.json`` is the paper's
metric and ``accuracy`` the pooled local-model accuracy. ``evaluate: global`` reports the global
model instead (as every other algorithm does); :func:`evaluate_models` gives both at once to an
operator who owns every silo (simulation, benchmarks).

Accounting (record level; :class:`ClientMechanism`, :class:`ClientLedger`)
-------------------------------------------------------------------------
With WOR batches the neighbouring relation is *replace one record* of one client; the clipped
sum's sensitivity is 2C, so the paper's σ_j is σ/2 (Algorithm 2 adds N(0, 4C²σ_j²)). Client j's
records are touched only by its own noisy steps; everything any observer sees -- each
contribution, every global model, every other client's models, the server's view -- is
post-processing of those steps (Lemma 3.7), so one composition over the N_j rounds j joined ×
K steps covers every observer:

* **rigorous (headline)**: RDP of the WOR-subsampled Gaussian (Wang, Balle, Kasiviswanathan 2019,
  Theorem 9; :mod:`pdpfl.privacy.wor`) composed over N_j·K steps → ε_j at δ. Poisson batches:
  the Poisson-subsampled Gaussian's RDP under add/remove neighbours. This is
  ``eps_third_party_max`` / ``eps_server_max`` of the run summary.
* **CLT (labelled approximation)**: Theorem 2's μ_j = √2·c_j·√(e^{σ_j⁻²}Φ(1.5/σ_j) +
  3Φ(−0.5/σ_j) − 2), c_j = (B/n_j)·√(K·N_j) (Bu et al.'s formula for Poisson), its ε at δ, weak
  federated GDP μ_max and the paper's strong federated √(m−1)·μ_max (Theorem 2, which assumes
  nothing about the helper maps F_i; here F_i is deterministic, so the coalition of the m − 1
  other clients sees a post-processing of the same releases and the per-client bound already
  covers it). The paper's Table 1 counts every one of the R rounds (p does not enter).

Per-client budgets: ``algorithm.target_epsilon`` (one value or one per client) or
``algorithm.target_mu`` (enforced as the (ε, δ) that μ-GDP implies at ``privacy.delta``);
``privacy.epsilon_max`` is the target of every client without its own. The
silo picks its own σ_j (``calibrate: noise``) or K_j (``calibrate: steps``) so that
``planned_rounds`` participations (default: all R rounds) stay within the target under the
configured accounting (``budget_accounting``: ``rigorous`` by default, or ``clt``), from its
own n_j -- nothing about it leaves the silo. Its ledger refuses a round (the client stops
joining) before a participation would exceed the target; the charge is written before the
contribution is returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from pdpfl.fl.api import Aggregate, Contribution, FederationInfo, Params, Scalars
from pdpfl.fl.common import initial_params, silo_model
from pdpfl.fl.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig

__all__ = [
    "ClientLedger",
    "ClientMechanism",
    "PriFedSyncClient",
    "PriFedSyncConfig",
    "PriFedSyncServer",
    "build_client",
    "build_server",
    "calibrate_noise",
    "calibrate_steps",
    "evaluate_models",
    "federation_report",
    "setup",
]

#: Relative tolerance when comparing a spent ε with a target (float rounding only).
_TOL = 1e-9
Sampler = Literal["wor", "poisson"]
Accounting = Literal["rigorous", "clt"]


# ------------------------------------------------------------------------------ configuration


class PriFedSyncConfig(AlgorithmConfig):
    """``algorithm: {name: prifedsync, ...}`` -- see the module docstring."""

    name: Literal["prifedsync"] = "prifedsync"
    sampler: Sampler = Field(
        "wor",
        description="wor: batches of exactly B records drawn uniformly without replacement "
        "(the paper's Algorithm 2); poisson: one Bernoulli(B/n) coin per record",
    )
    alpha: float = Field(
        0.1, ge=0, le=1, description="elastic sync: a joined client moves its local model this "
        "fraction toward the global model (Eq. 2.1)"
    )
    server_lr: float = Field(
        1.0, gt=0, le=1, description="η: global ← (1 − η)·global + η·mean of joined local models"
    )
    target_epsilon: float | list[float | None] | None = Field(
        None, description="per-client target ε at privacy.delta (one value, or one per client; "
        "privacy.epsilon_max is the target of every client without one)"
    )
    target_mu: float | list[float | None] | None = Field(
        None, description="per-client target μ-GDP, enforced as its (ε, δ) at privacy.delta"
    )
    calibrate: Literal["noise", "steps"] = Field(
        "noise", description="what a client with a target adjusts: its noise σ_j or its local "
        "steps K_j (≤ training.local_steps, at privacy.noise_multiplier)"
    )
    local_epoch: bool = Field(
        False, description="K_j = min(training.local_steps, ⌈n_j/B⌉): one local epoch per "
        "round (computed at the silo from its own n_j, as in the paper's §4)"
    )
    planned_rounds: int | None = Field(
        None, ge=1, description="participations a target is calibrated for (default: all "
        "training.rounds); the ledger stops a client before it would exceed its target"
    )
    budget_accounting: Accounting = Field(
        "rigorous", description="rigorous: RDP bound (WOR: Wang et al. 2019 Thm 9); clt: the "
        "paper's Theorem 2 μ (an approximation that can under-report)"
    )
    evaluate: Literal["local", "global"] = Field(
        "local", description="what each silo's evaluation reply measures on its test split: its "
        "personalized local model (the paper's metric) or the global model"
    )

    #: Whether the algorithm adds DP noise.
    private: ClassVar[bool] = True

    @field_validator("target_epsilon", "target_mu")
    @classmethod
    def _positive_targets(cls, value: Any) -> Any:
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            raise ValueError("expected a number > 0 or a non-empty list (one per client)")
        for v in values:
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"every target must be a finite number > 0 (or null), got {v}")
        return value

    def targets_given(self) -> bool:
        return self.target_epsilon is not None or self.target_mu is not None

    def check(self, config: ExperimentConfig) -> list[str]:
        problems = []
        tr, pv = config.training, config.privacy
        if tr.batch_size is None:
            problems.append(
                "training.batch_size: required -- the public batch size B (records per step, "
                "and the constant dividing each noisy sum); one value or one per client"
            )
        elif self.sampler == "wor":
            values = tr.batch_size if isinstance(tr.batch_size, list) else [tr.batch_size]
            if any(float(v) != int(v) for v in values):
                problems.append(
                    "training.batch_size: batches drawn without replacement have a whole number "
                    f"of records; got {tr.batch_size}"
                )
        if self.target_epsilon is not None and self.target_mu is not None:
            problems.append("algorithm: set only one of target_epsilon and target_mu")
        if pv.epsilon_max is not None and pv.noise_multiplier is not None:
            problems.append(
                "privacy: set only one of privacy.noise_multiplier and privacy.epsilon_max (the "
                "target ε of every client without its own algorithm.target_epsilon/target_mu)"
            )
        targets = self.target_epsilon if self.target_epsilon is not None else self.target_mu
        per_client = targets if isinstance(targets, list) else [targets]
        some_without = not self.targets_given() or None in per_client
        needs_sigma = self.calibrate == "steps" or (some_without and pv.epsilon_max is None)
        if needs_sigma and pv.noise_multiplier is None:
            problems.append(
                "privacy.noise_multiplier: required (σ: noise std σ·C per step) unless every "
                "client has a target (algorithm.target_epsilon / target_mu, or privacy."
                "epsilon_max for all) and algorithm.calibrate is noise"
            )
        if self.planned_rounds is not None and self.planned_rounds > tr.rounds:
            problems.append(
                f"algorithm.planned_rounds: at most training.rounds ({tr.rounds}), got "
                f"{self.planned_rounds}"
            )
        n = config.data.num_clients
        for field in ("target_epsilon", "target_mu"):
            value = getattr(self, field)
            if isinstance(value, list) and n is not None and len(value) != n:
                problems.append(
                    f"algorithm.{field}: {len(value)} values for {n} clients (data.num_clients)"
                )
        return problems


# ------------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class ClientMechanism:
    """One client's mechanism per participation: K noisy steps on its n records.

    ``noise_multiplier`` is pdpfl's σ (noise std σ·C). WOR batches: replace-one neighbours,
    sensitivity 2C, so the GDP/RDP noise multiplier is σ/2 (the paper's σ_j) and the ratio
    γ = B/n. Poisson batches: add/remove neighbours, sensitivity C, multiplier σ, rate q = B/n.
    """

    sampler: Sampler
    batch_size: float
    n_records: int
    noise_multiplier: float
    local_steps: int
    delta: float

    def __post_init__(self) -> None:
        if self.sampler not in ("wor", "poisson"):
            raise ValueError(f"sampler: expected 'wor' or 'poisson', got {self.sampler!r}")
        if not (self.n_records >= 1):
            raise ValueError(f"n_records: must be >= 1, got {self.n_records}")
        if not (0 < self.batch_size <= self.n_records):
            raise ValueError(
                f"training.batch_size: B = {self.batch_size:g} must be in (0, n] for a client "
                f"with n = {self.n_records} training records"
            )
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier: must be > 0, got {self.noise_multiplier}")
        if int(self.local_steps) != self.local_steps or self.local_steps < 0:
            raise ValueError(f"local_steps: must be an integer >= 0, got {self.local_steps}")
        if not (0.0 < self.delta < 1.0):
            raise ValueError(f"privacy.delta: must be in (0, 1), got {self.delta}")

    @property
    def ratio(self) -> float:
        """γ = B/n (WOR) or the Poisson rate q = B/n."""
        return float(self.batch_size) / float(self.n_records)

    @property
    def sensitivity_multiplier(self) -> float:
        """Noise std over the neighbouring relation's sensitivity (σ/2 for WOR, σ for Poisson)."""
        return self.noise_multiplier / 2.0 if self.sampler == "wor" else self.noise_multiplier

    @property
    def neighbouring(self) -> str:
        return (
            "replace one record of one client (batches without replacement)"
            if self.sampler == "wor"
            else "add/remove one record of one client (Poisson batches)"
        )

    def step_rdp(self) -> tuple[np.ndarray, np.ndarray]:
        """(orders, RDP of ONE noisy step) -- the rigorous per-step bound."""
        return _step_rdp(self.sampler, self.ratio, self.sensitivity_multiplier)

    def epsilon(self, participations: int, accounting: Accounting = "rigorous") -> float:
        """ε at δ after ``participations`` rounds (K steps each) under ``accounting``."""
        steps = int(participations) * int(self.local_steps)
        if steps == 0:
            return 0.0
        if accounting == "clt":
            from pdpfl.privacy.gdp import gdp_epsilon

            mu = self.clt_mu(participations)
            return float(gdp_epsilon(mu, self.delta)) if math.isfinite(mu) else math.inf
        from pdpfl.privacy.conversion import rdp_to_epsilon

        orders, rdp = self.step_rdp()
        return float(rdp_to_epsilon(steps * rdp, orders, self.delta)[0])

    def strong_epsilon(self, participations: int, num_clients: int) -> float:
        """Rigorous ε of the paper's strong notion: the (m − 1)-fold composition (Theorem 1)."""
        from pdpfl.privacy.conversion import rdp_to_epsilon

        steps = int(participations) * int(self.local_steps) * max(int(num_clients) - 1, 0)
        if steps == 0:
            return 0.0
        orders, rdp = self.step_rdp()
        return float(rdp_to_epsilon(steps * rdp, orders, self.delta)[0])

    def clt_mu(self, participations: int) -> float:
        """CLT μ after ``participations`` rounds: Theorem 2 (WOR) or Bu et al. (Poisson)."""
        n = int(participations)
        if n == 0 or self.local_steps == 0:
            return 0.0
        if self.sampler == "wor":
            from pdpfl.privacy.gdp import prifedsync_mu

            return float(
                prifedsync_mu(
                    self.sensitivity_multiplier, self.batch_size, self.n_records,
                    int(self.local_steps), n,
                )
            )
        from pdpfl.privacy.gdp import poisson_gaussian_mu_clt

        return float(
            poisson_gaussian_mu_clt(self.ratio, self.noise_multiplier, int(self.local_steps) * n)[0]
        )

    def with_noise(self, noise_multiplier: float) -> ClientMechanism:
        return ClientMechanism(self.sampler, self.batch_size, self.n_records,
                               float(noise_multiplier), self.local_steps, self.delta)

    def with_steps(self, local_steps: int) -> ClientMechanism:
        return ClientMechanism(self.sampler, self.batch_size, self.n_records,
                               self.noise_multiplier, int(local_steps), self.delta)


@lru_cache(maxsize=256)
def _step_rdp(sampler: str, ratio: float, multiplier: float) -> tuple[np.ndarray, np.ndarray]:
    if sampler == "wor":
        from pdpfl.privacy.wor import WOR_ORDERS, wor_gaussian_rdp

        rdp = wor_gaussian_rdp(ratio, multiplier, WOR_ORDERS)
        orders = np.asarray(WOR_ORDERS)
    else:
        from pdpfl.privacy.orders import DEFAULT_ORDERS
        from pdpfl.privacy.rdp import poisson_gaussian_rdp

        rdp = poisson_gaussian_rdp(min(ratio, 1.0), multiplier, DEFAULT_ORDERS)[0]
        orders = np.asarray(DEFAULT_ORDERS)
    rdp.setflags(write=False)
    return orders, rdp


def target_as_epsilon(
    target_epsilon: float | None, target_mu: float | None, delta: float
) -> float | None:
    """A client's target as ε at δ (a μ target becomes the ε that μ-GDP implies at δ)."""
    if target_epsilon is not None:
        return float(target_epsilon)
    if target_mu is not None:
        from pdpfl.privacy.gdp import gdp_epsilon

        return float(gdp_epsilon(float(target_mu), delta))
    return None


def calibrate_noise(
    mechanism: ClientMechanism,
    target_epsilon: float,
    participations: int,
    accounting: Accounting = "rigorous",
    *,
    rtol: float = 1e-4,
) -> float:
    """Smallest σ (to ``rtol``, rounded up) with ε(participations) ≤ ``target_epsilon``.

    ε decreases in σ, so bisection on log σ in [1e-3, 1e4] is safe; the returned σ always meets
    the target.
    """
    target = float(target_epsilon)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target_epsilon: must be a finite number > 0, got {target_epsilon!r}")

    def spent(sigma: float) -> float:
        return mechanism.with_noise(sigma).epsilon(participations, accounting)

    lo, hi = 1e-3, 1e4
    if spent(hi) > target * (1 + _TOL):
        raise ValueError(
            f"target: ε = {target:g} cannot be met with σ ≤ {hi:g} over {participations} "
            "rounds; raise the target or lower training.rounds / algorithm.planned_rounds"
        )
    if spent(lo) <= target:
        return lo
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        if spent(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def calibrate_steps(
    mechanism: ClientMechanism,
    target_epsilon: float,
    participations: int,
    accounting: Accounting = "rigorous",
) -> int:
    """Largest K ≤ ``mechanism.local_steps`` with ε(participations) ≤ ``target_epsilon``."""
    target = float(target_epsilon)
    lo, hi = 0, int(mechanism.local_steps)
    if mechanism.with_steps(1).epsilon(participations, accounting) > target * (1 + _TOL):
        raise ValueError(
            f"target: ε = {target:g} cannot be met even with one local step per round at "
            f"σ = {mechanism.noise_multiplier:g} over {participations} rounds; raise σ "
            "(privacy.noise_multiplier) or the target, or use algorithm.calibrate: noise"
        )
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mechanism.with_steps(mid).epsilon(participations, accounting) <= target * (1 + _TOL):
            lo = mid
        else:
            hi = mid - 1
    return lo


class ClientLedger:
    """One client's record-level ledger: participations, spent ε, and the stop rule.

    Every record of a client has the same mechanism, so one counter describes them all. The
    ledger is charged *before* a round's contribution leaves the silo (write-ahead) and
    :meth:`would_exceed` refuses a participation that would take the spent ε (under
    ``accounting``) past the target.
    """

    def __init__(
        self,
        mechanism: ClientMechanism,
        target_epsilon: float | None = None,
        accounting: Accounting = "rigorous",
    ) -> None:
        self.mechanism = mechanism
        self.target_epsilon = None if target_epsilon is None else float(target_epsilon)
        self.accounting: Accounting = accounting
        self.participations = 0

    def spent(self, participations: int | None = None, accounting: Accounting | None = None) -> float:
        n = self.participations if participations is None else int(participations)
        return self.mechanism.epsilon(n, accounting or self.accounting)

    def would_exceed(self) -> bool:
        if self.target_epsilon is None:
            return False
        return self.spent(self.participations + 1) > self.target_epsilon * (1 + _TOL)

    def charge(self) -> None:
        self.participations += 1

    def state_dict(self) -> dict[str, Any]:
        return {"participations": self.participations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participations = int(state["participations"])

    def save(self, path: str | Path) -> None:
        """The ledger as a pickle-free ``.npz`` (written atomically)."""
        from pdpfl.io import save_npz

        m = self.mechanism
        save_npz(
            path,
            participations=np.asarray(self.participations),
            epsilon_rigorous=np.asarray(self.spent(accounting="rigorous")),
            epsilon_clt=np.asarray(self.spent(accounting="clt")),
            mu_clt=np.asarray(m.clt_mu(self.participations)),
            target_epsilon=np.asarray(
                np.nan if self.target_epsilon is None else self.target_epsilon
            ),
            noise_multiplier=np.asarray(m.noise_multiplier),
            local_steps=np.asarray(m.local_steps),
            delta=np.asarray(m.delta),
        )


# ------------------------------------------------------------------------------- publication


def setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    """The public description every silo receives (config values only; no data read)."""
    tr, pv, algo = config.training, config.privacy, config.algorithm
    return {
        "prifedsync": {
            "sampler": algo.sampler,
            "alpha": float(algo.alpha),
            "server_lr": float(algo.server_lr),
            "client_rate": float(tr.client_rate),
            "local_steps": int(tr.local_steps),
            "local_epoch": bool(algo.local_epoch),
            "rounds": int(tr.rounds),
            "planned_rounds": int(algo.planned_rounds or tr.rounds),
            "max_grad_norm": float(tr.max_grad_norm),
            "noise_multiplier": None if pv.noise_multiplier is None else float(pv.noise_multiplier),
            "delta": float(pv.delta),
            "num_clients": int(info.num_clients),
            "calibrate": algo.calibrate,
            "budget_accounting": algo.budget_accounting,
            "evaluate": algo.evaluate,
        }
    }


# ------------------------------------------------------------------------------- silo side


def _as_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(np.asarray(x, dtype=np.float32)), torch.as_tensor(
        np.asarray(y, dtype=np.int64)
    )


class PriFedSyncClient:
    """One PriFedSync client: its data, personalized local model, ledger and randomness.

    Parameters
    ----------
    client_id
        The client's index.
    model
        A torch model with the public initialisation x⁰ (its weights become h_j).
    data
        The client's :class:`~pdpfl.data.federation.ClientData` (never leaves it).
    public
        ``setup(...)["prifedsync"]``.
    randomness
        The client's own randomness (join coins, batches, noise).
    batch_size
        B: records per step (WOR) / expected batch size (Poisson), and the public normaliser.
    target_epsilon
        This client's target ε at δ (None: no target, σ and K as configured).
    optimizer, lr, momentum, weight_decay, physical_batch_size
        The local optimizer (created once; its state persists across rounds).
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: Any,
        public: dict[str, Any],
        *,
        randomness: Randomness,
        batch_size: float,
        target_epsilon: float | None = None,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        physical_batch_size: int = 512,
    ) -> None:
        from pdpfl.dp.engine import make_optimizer
        from pdpfl.dp.steps import check_normalizer
        from pdpfl.models import get_params

        self.client_id = int(client_id)
        self.model = model
        self.public = dict(public)
        self.randomness = randomness
        self.sampler: Sampler = public["sampler"]
        self.alpha = float(public["alpha"])
        self.client_rate = float(public["client_rate"])
        self.max_grad_norm = float(public["max_grad_norm"])
        self.evaluate_model = str(public.get("evaluate", "local"))
        self.num_clients = int(public["num_clients"])
        self.physical_batch_size = int(physical_batch_size)
        self.x_train, self.y_train = _as_tensors(data.x_train, data.y_train)
        self.x_test, self.y_test = _as_tensors(data.x_test, data.y_test)
        n = int(self.y_train.shape[0])
        self.batch_size = check_normalizer(batch_size, "training.batch_size")
        if self.sampler == "wor" and float(self.batch_size) != int(self.batch_size):
            raise ValueError(f"training.batch_size: must be a whole number, got {batch_size}")
        sigma = public.get("noise_multiplier")
        steps = int(public["local_steps"])
        if public.get("local_epoch", False):
            steps = min(steps, math.ceil(n / self.batch_size))
        base = ClientMechanism(
            self.sampler,
            self.batch_size,
            n,
            1.0 if sigma is None else float(sigma),
            steps,
            float(public["delta"]),
        )
        accounting: Accounting = public.get("budget_accounting", "rigorous")
        planned = int(public["planned_rounds"])
        if target_epsilon is not None:
            if public.get("calibrate", "noise") == "noise":
                base = base.with_noise(calibrate_noise(base, target_epsilon, planned, accounting))
            else:
                if sigma is None:
                    raise ValueError("privacy.noise_multiplier: required with calibrate: steps")
                base = base.with_steps(calibrate_steps(base, target_epsilon, planned, accounting))
        elif sigma is None:
            raise ValueError(
                f"privacy.noise_multiplier: required for client {client_id}, which has no target"
            )
        self.mechanism = base
        self.ledger = ClientLedger(base, target_epsilon, accounting)
        self.optimizer = make_optimizer(
            optimizer, self.model.parameters(), lr=lr, weight_decay=weight_decay, momentum=momentum
        )
        #: h_j: the personalized local model (float32 arrays, trainable parameters only).
        self.local: Params = get_params(self.model)
        #: Next round this client has not played yet.
        self.next_round = 0
        #: Round whose global model the client still has to sync with (-1: none).
        self.pending_sync = -1
        self.stopped = False
        #: Batches of the last local training (stays at the silo; for tests).
        self.last_batches: list[np.ndarray] = []
        self.last_train_loss: float | None = None

    # -- helpers -----------------------------------------------------------------------------
    def _sync(self, global_params: Params) -> None:
        """Eq. (2.1): h ← (1 − α)·h + α·global, in float64, rounded once to float32."""
        a = self.alpha
        self.local = [
            (np.asarray(h, np.float64) + a * (np.asarray(g, np.float64) - np.asarray(h, np.float64)))
            .astype(np.float32)
            for h, g in zip(self.local, global_params, strict=True)
        ]
        self.pending_sync = -1

    def _join_coin(self, round_index: int) -> bool:
        if self.client_rate >= 1.0:
            return True
        u = self.randomness.stream("client-join", int(round_index), self.client_id).uniform(1)
        return bool(u[0] < self.client_rate)

    def _train(self, round_index: int) -> None:
        from pdpfl.dp.engine import PersonalizedDPSGD, train_steps
        from pdpfl.dp.steps import wor_sample
        from pdpfl.models import get_params, set_params

        set_params(self.model, self.local)
        stream = self.randomness.stream("local-training", int(round_index), self.client_id)
        k = int(self.mechanism.local_steps)
        sigma = float(self.mechanism.noise_multiplier)
        n = int(self.y_train.shape[0])
        self.last_batches = []
        self.model.train()
        if self.sampler == "poisson":
            res = train_steps(
                self.model, self.x_train, self.y_train,
                rates=torch.full((n,), self.mechanism.ratio, dtype=torch.float64),
                steps=k, noise_multiplier=sigma, max_grad_norm=self.max_grad_norm,
                optimizer=self.optimizer, stream=stream, normalizer=self.batch_size,
                physical_batch_size=self.physical_batch_size,
            )
            self.last_train_loss = float(res.mean_loss)
        else:
            engine = PersonalizedDPSGD(
                self.model, self.optimizer, noise_multiplier=sigma,
                max_grad_norm=self.max_grad_norm, physical_batch_size=self.physical_batch_size,
            )
            b = int(self.batch_size)
            loss_total = 0.0
            for _ in range(k):
                idx = wor_sample(n, b, stream)
                self.last_batches.append(idx.numpy())
                grads, loss_sum = engine.privatized_gradient(
                    self.x_train[idx], self.y_train[idx], self.batch_size, stream
                )
                self.optimizer.zero_grad(set_to_none=True)
                for p, g in zip(engine.params, grads, strict=True):
                    p.grad = g
                self.optimizer.step()
                loss_total += loss_sum
            self.last_train_loss = loss_total / (k * b) if k else float("nan")
        self.local = get_params(self.model)

    # -- ClientAlgorithm ---------------------------------------------------------------------
    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"client {self.client_id}: round {t} was already played")
        if self.pending_sync >= 0:
            self._sync(global_params)
        self.next_round = t + 1
        joined = self._join_coin(t)
        if joined and self.ledger.would_exceed():
            joined, self.stopped = False, True
        if not joined:
            return Contribution(
                update=[np.zeros(np.shape(p), dtype=np.float32) for p in self.local], weight=0.0
            )
        self.ledger.charge()  # write-ahead: charged before the release
        self._train(t)
        self.pending_sync = t
        return Contribution(update=[p.astype(np.float32) for p in self.local], weight=1.0)

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        if 0 <= self.pending_sync <= int(round_index):
            self._sync(params)
        set_params(self.model, self.local if self.evaluate_model == "local" else params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def evaluate_pair(self, global_params: Params) -> dict[str, Scalars]:
        """Test metrics of the local model and of ``global_params`` (operator use only)."""
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        out = {}
        for key, params in (("local", self.local), ("global", global_params)):
            set_params(self.model, params)
            res = evaluate(self.model, self.x_test, self.y_test)
            out[key] = {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]),
                        "n": int(res["n"])}
        return out

    def privacy_summary(self) -> Scalars:
        """This client's privacy state (stays at the silo; merged by the simulator's operator)."""
        m, led = self.mechanism, self.ledger
        n = int(m.n_records)
        eps = led.spent(accounting="rigorous")
        mu = m.clt_mu(led.participations)
        target = led.target_epsilon
        # Judged by the rigorous bound even under budget_accounting: clt (every reported ε is
        # an upper bound): a CLT-enforced target the bound exceeds shows up as over budget.
        over = target is not None and eps > target * (1 + _TOL)
        out: Scalars = {
            "n_records": n,
            "participations": led.participations,
            "stopped": n if self.stopped else 0,
            "excluded": 0,
            "private": True,
            "noise_multiplier": m.noise_multiplier,
            "local_steps": int(m.local_steps),
            "clt_mu": mu,
            "clt_mu_strong": math.sqrt(max(self.num_clients - 1, 0)) * mu,
            "clt_eps": led.spent(accounting="clt"),
            "eps_strong_paper": m.strong_epsilon(led.participations, self.num_clients),
        }
        for tag in ("third_party", "server"):
            out[f"eps_{tag}_max"] = eps
            out[f"eps_{tag}_p50"] = eps
            out[f"eps_{tag}_p90"] = eps
            out[f"over_budget_{tag}"] = n if over else 0
            if target is not None:
                key = f"group.{target:g}"
                out[f"{key}.count"] = n
                out[f"{key}.budget"] = target
                out[f"{key}.excluded"] = 0
                out[f"{key}.max_spent_{tag}"] = eps
                out[f"{key}.sum_utilization_{tag}"] = n * eps / target
                out[f"{key}.over_budget_{tag}"] = n if over else 0
        return out

    def state_dict(self) -> dict[str, Any]:
        opt_state = {
            int(k): {name: (v.detach().clone() if torch.is_tensor(v) else v)
                     for name, v in entry.items()}
            for k, entry in self.optimizer.state_dict()["state"].items()
        }
        return {
            "next_round": self.next_round,
            "pending_sync": self.pending_sync,
            "stopped": self.stopped,
            "local": [np.asarray(p, dtype=np.float32).copy() for p in self.local],
            "optimizer": opt_state,
            "ledger": self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])
        self.pending_sync = int(state["pending_sync"])
        self.stopped = bool(state["stopped"])
        local = [np.asarray(p, dtype=np.float32).copy() for p in state["local"]]
        if len(local) != len(self.local) or any(
            a.shape != b.shape for a, b in zip(local, self.local, strict=True)
        ):
            raise ValueError(f"client {self.client_id}: state holds a different model")
        self.local = local
        groups = self.optimizer.state_dict()["param_groups"]
        opt_state = {
            int(k): {name: (torch.as_tensor(v) if isinstance(v, np.ndarray | torch.Tensor) else v)
                     for name, v in entry.items()}
            for k, entry in dict(state["optimizer"]).items()
        }
        self.optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
        self.ledger.load_state_dict(state["ledger"])


# ----------------------------------------------------------------------------- server side


class PriFedSyncServer:
    """Algorithm 1's server: global ← (1 − η)·global + η·(Σ w̃_j)/|Ω| from the aggregate.

    It asks every client each round (each flips its own join coin) and never redraws a round
    nobody joined. It sees only the aggregate's sums: Σ w̃_j and |Ω| = Σ weights.
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False

    def __init__(self, initial: Params, *, server_lr: float = 1.0) -> None:
        if not 0 < server_lr <= 1:
            raise ValueError(f"algorithm.server_lr: must be in (0, 1], got {server_lr}")
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial]
        self.server_lr = float(server_lr)
        self.joined: list[int] = []
        self.rounds_done = 0
        self.empty_rounds = 0
        self._last_joined = 0

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Every client: whether it joins is its own coin (Algorithm 1's Ω is never redrawn)."""
        return sorted(int(c) for c in client_ids)

    def round_config(self, round_index: int) -> Scalars:
        return {"round": int(round_index)}

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        joined = int(round(aggregate.weight)) if not aggregate.empty else 0
        self._last_joined = joined
        if joined <= 0:
            return [np.asarray(p).copy() for p in global_params]
        eta = self.server_lr
        return [
            ((1.0 - eta) * np.asarray(g, np.float64)
             + eta * np.asarray(t, np.float64) / aggregate.weight).astype(np.float32)
            for g, t in zip(global_params, aggregate.total, strict=True)
        ]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        self.joined.append(self._last_joined)
        self.rounds_done += 1
        self.empty_rounds += int(self._last_joined == 0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "joined": list(self.joined),
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
            "participation": {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.joined = [int(v) for v in state["joined"]]
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])


# ------------------------------------------------------------------------------ builders


def _client_target(config: ExperimentConfig, client_id: int) -> float | None:
    """The client's target as ε at δ: its own entry, else ``privacy.epsilon_max``, else None."""
    algo = config.algorithm
    for field in ("target_epsilon", "target_mu"):
        value = getattr(algo, field)
        if isinstance(value, list):
            if not 0 <= client_id < len(value):
                raise ValueError(
                    f"algorithm.{field}: {len(value)} values given but client {client_id} exists"
                )
            value = value[client_id]
        if value is not None:
            eps = float(value) if field == "target_epsilon" else None
            mu = float(value) if field == "target_mu" else None
            return target_as_epsilon(eps, mu, config.privacy.delta)
    if config.privacy.epsilon_max is not None:
        return float(config.privacy.epsilon_max)
    return None


def build_server(
    config: ExperimentConfig, info: FederationInfo, public: dict[str, Any], randomness: Randomness
) -> PriFedSyncServer:
    return PriFedSyncServer(initial_params(config, info), server_lr=config.algorithm.server_lr)


def build_client(
    config: ExperimentConfig,
    client_id: int,
    data: Any,
    info: FederationInfo,
    public: dict[str, Any],
    randomness: Randomness,
) -> PriFedSyncClient:
    """One client, from its own data, the public setup and its own randomness."""
    tr = config.training
    batch = tr.batch_size_for(client_id)
    if batch is None:
        raise ValueError("training.batch_size: required (the public batch size B)")
    return PriFedSyncClient(
        client_id,
        silo_model(config, info),
        data,
        public["prifedsync"],
        randomness=randomness,
        batch_size=batch,
        target_epsilon=_client_target(config, client_id),
        optimizer=tr.optimizer,
        lr=tr.lr,
        momentum=tr.momentum,
        weight_decay=tr.weight_decay,
        physical_batch_size=tr.physical_batch_size,
    )


# ------------------------------------------------------------------------- operator helpers


def evaluate_models(clients: dict[int, PriFedSyncClient], global_params: Params) -> dict[str, float]:
    """Local models vs the global model on every client's own test split (operator view).

    Returns the paper's metric ``local_mean_client_accuracy`` (mean over clients of each local
    model's accuracy), ``global_mean_client_accuracy`` (the global model, same averaging),
    and the pooled (test-record-weighted) accuracies of both.
    """
    rows = [c.evaluate_pair(global_params) for _, c in sorted(clients.items())]
    out: dict[str, float] = {}
    for key in ("local", "global"):
        acc = np.array([r[key]["accuracy"] for r in rows if r[key]["n"] > 0])
        n = np.array([r[key]["n"] for r in rows if r[key]["n"] > 0], dtype=float)
        out[f"{key}_mean_client_accuracy"] = float(acc.mean()) if acc.size else float("nan")
        out[f"{key}_pooled_accuracy"] = float(np.dot(acc, n) / n.sum()) if n.sum() else float("nan")
    return out


def federation_report(clients: dict[int, PriFedSyncClient]) -> dict[str, Any]:
    """Per-client and federated privacy numbers (operator view: reads every client's ledger).

    ``eps_rigorous`` (the headline, every observer), ``mu_clt`` / ``eps_clt`` (Theorem 2's CLT,
    an approximation), the weak (μ_max) and the paper's strong (√(m − 1)·μ_max) federated GDP,
    and the rigorous ε of the strong notion's (m − 1)-fold composition.
    """
    m = len(clients)
    per = {}
    for cid, c in sorted(clients.items()):
        n = c.ledger.participations
        per[cid] = {
            "participations": n,
            "noise_multiplier": c.mechanism.noise_multiplier,
            "local_steps": int(c.mechanism.local_steps),
            "eps_rigorous": c.mechanism.epsilon(n, "rigorous"),
            "mu_clt": c.mechanism.clt_mu(n),
            "eps_clt": c.mechanism.epsilon(n, "clt"),
            "target_epsilon": c.ledger.target_epsilon,
            "stopped": c.stopped,
        }
    mus = [v["mu_clt"] for v in per.values()]
    from pdpfl.privacy.gdp import federated_mu, gdp_epsilon

    any_c = next(iter(clients.values()))
    delta = any_c.mechanism.delta
    weak = federated_mu(mus, "weak")
    strong = federated_mu(mus, "strong")
    return {
        "delta": delta,
        "neighbouring": any_c.mechanism.neighbouring,
        "clients": per,
        "eps_rigorous_max": max(v["eps_rigorous"] for v in per.values()),
        "clt_mu_weak": weak,
        "clt_mu_strong": strong,
        "clt_eps_weak": float(gdp_epsilon(weak, delta)),
        "clt_eps_strong": float(gdp_epsilon(strong, delta)),
        "eps_strong_paper_rigorous": max(
            c.mechanism.strong_epsilon(c.ledger.participations, m) for c in clients.values()
        ),
    }


register_algorithm(
    AlgorithmSpec(
        name="prifedsync",
        config=PriFedSyncConfig,
        unit="record",
        setup=setup,
        server=build_server,
        client=build_client,
        summary="PriFedSync: personalized local models, elastic sync, federated f-DP",
    )
)
