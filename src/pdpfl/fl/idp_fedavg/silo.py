"""An IDP-FedAvg client on the silo template (Algorithm 2, the client's part).

Each client holds its data, its own ε and one :class:`~pdpfl.ledger.PrivacyLedger` of one unit
-- itself: id = its name from the data, budget = its ε, rate = its group's q_{g(i)}, mechanism
``SampledGaussianPlan("client", σ_g, δ, I, observers)`` (spec B.4) with σ_g the multiplier of
its group's noise description (:meth:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup.release_noise`:
the update sum's noise and the count noise, one Gaussian event; SCALE: per group), under
``privacy.accountant``. The template
(:class:`pdpfl.fl.template.Silo`) does the round duties: catch-up of rounds it was not asked
in, the pre-check that stops the client before it would exceed the ε it is accounted against
(its own; ε_min/ε_max for strict/relaxed), and the charge *before* the step. A stopped client
releases nothing that depends on its data. Non-private clients (ε = ∞) and the ``no-dp``
method keep no ledger (ε = ∞ is reported for them).

Variants are subclasses:

* :class:`CentralIdpSilo` (the paper) -- the trusted aggregator sampled it; it releases its
  unclipped update Δ_i to the aggregator, which clips and adds the noise;
* :class:`DistributedIdpSilo` -- asked every round, it flips its own Bernoulli(q_{g(i)}) coin
  (:meth:`~DistributedIdpSilo.participates`), clips Δ_i to the public C_t (a zero vector when not
  sampled) and adds its share N(0, σ_v²C_t²/t) of the noise and a share σ_b²/t of the count
  noise, t = ``setup.survivors``: the fewest clients any released sum holds (issue #22, item 2:
  a dropout never leaves less noise than the ledgers charge). Both are drawn by
  :func:`pdpfl.dp.noise.add_noise` from the descriptions its ledger's σ_g was built from,
  checked against the ledger before every draw.

Audit canaries (:mod:`pdpfl.audit.client_canaries`; None in an ordinary run): a distributed
client's :attr:`~DistributedIdpSilo.extra_rows` are canary clients riding on it, each with its
own Bernoulli(q) coin from the client's stream, clipped to C_t, counted and added to its clipped
update before its noise share (the total noise is unchanged).

Local training uses the two-phase API of :class:`~pdpfl.fl.template.BatchedSilo`:
:meth:`~IdpSilo.prepare` (shuffle the E epochs), :meth:`~IdpSilo.train_batch` (one batched
computation for many clients, :func:`~pdpfl.fl.idp_fedavg.training.train_clients`),
:meth:`~IdpSilo.finish` (the variant's release); alone, a silo runs the three in a row.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.common import checked_noise
from pdpfl.fl.idp_fedavg.budgets import label_of
from pdpfl.fl.idp_fedavg.mechanism import IdpSetup, client_mechanism
from pdpfl.fl.idp_fedavg.training import evaluate_clients, repeated_epochs, train_clients
from pdpfl.fl.template import BatchedSilo, RoundPlan
from pdpfl.ledger import GroupSummary, PrivacyLedger, PrivacySummary
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.dp.extra_rows import ExtraRows

__all__ = ["CentralIdpSilo", "DistributedIdpSilo", "IdpJob", "IdpSilo"]

#: A client's local update Δ_i (float64 arrays), or None when it did not train this round.
Delta = list[np.ndarray] | None


@dataclass
class IdpJob:
    """One client's round after the charge (nothing released yet)."""

    silo: IdpSilo
    params: Params
    round_index: int
    #: C_t of the round times the client's group clip factor (SCALE).
    clip: float
    #: C_t of the round (public).
    clip_norm: float
    #: The client's data entered the round (sampled and not stopped).
    sampled: bool
    #: Its E shuffled epochs when it trains (``sampled``), else None.
    data: tuple[torch.Tensor, torch.Tensor] | None
    #: t announced by a summation protocol for this round (``SURVIVORS_KEY``), if any.
    announced: int | None = None


class IdpSilo(BatchedSilo[IdpJob, Delta]):
    """One IDP-FedAvg client (see the module docstring); subclasses fix the trust model.

    Parameters
    ----------
    client_id
        The client's index.
    data
        Its :class:`~pdpfl.data.federation.ClientData` (never leaves it); ``data.name`` is the
        ledger's unit id.
    budget
        Its own ε (``inf``: non-private).
    setup
        The server's :class:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup`.
    randomness
        The client's own mechanism randomness (shuffling of its data; in the distributed
        variant its sampling coin and noise shares).
    model_factory
        Builds the public initial model (called once, when the client first trains or tests).
    model_key
        Equal for clients whose models share one architecture (they may train in one batch).
    own_ledger
        False: the client keeps no ledger of its own because a
        :class:`~pdpfl.fl.idp_fedavg.pool.CentralClientPool` accounts it (one row of the pool's
        ledger) and performs the template's round duties for it.
    """

    def __init__(
        self,
        client_id: int,
        data: ClientData,
        budget: float,
        setup: IdpSetup,
        *,
        randomness: Randomness,
        model_factory: Callable[[], torch.nn.Module],
        model_key: str = "",
        own_ledger: bool = True,
    ) -> None:
        import torch

        self.setup = setup
        self.randomness = randomness
        self.name = str(getattr(data, "name", client_id))
        self.budget = float(budget)
        self.group = setup.group_of(self.budget)
        self.rate = float(setup.rates[self.group])
        self.clip_factor = float(setup.clip_factors[self.group])
        self.x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        self.y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        self.x_test = torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))
        self.y_test = torch.as_tensor(np.asarray(data.y_test, dtype=np.int64))
        self._model_factory = model_factory
        self._model: torch.nn.Module | None = None
        self.model_key = str(model_key)
        from pdpfl.fl.idp_fedavg.discrete import encoding

        #: The discrete share encoding (distributed variant, discrete shares; else None).
        self.share_encoding = encoding(setup) if setup.variant == "distributed" else None
        assigned = setup.assigned[self.group]
        ledger = None
        #: The ε the pre-check enforces (its own; ε_min/ε_max for strict/relaxed).
        self.enforced: np.ndarray | None = None
        if (
            own_ledger
            and setup.private
            and math.isfinite(self.budget)
            and assigned is not None
            and setup.accounted(self.group)
        ):
            # the ledger's σ is that of the group's noise description (checked at every draw)
            ledger = PrivacyLedger(
                np.array([self.budget]),
                np.array([self.rate]),
                client_mechanism(setup, self.group),
                ids=np.array([self.name]),
                accountant=setup.accountant,
            )
            self.enforced = np.array([float(assigned)])
        super().__init__(client_id, ledger, adversary="both")

    # -- helpers -----------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self._model = self._model_factory()
        return self._model

    @property
    def stopped(self) -> bool:
        """The pre-check has made this client sit out (its ledger would exceed)."""
        return bool(self.ledger is not None and self.ledger.stopped[0])

    def _precheck(self) -> np.ndarray:
        """The template's pre-check against the ε the client is accounted against (every
        observer of its ledger)."""
        if self.ledger is None:
            return super()._precheck()
        exceed = self.ledger.would_exceed(adversary=self.adversary, budgets=self.enforced)
        return ~np.asarray(exceed, dtype=bool) & (self.ledger.rates > 0)

    def batch_key(self) -> Hashable:
        return (type(self), self.setup, self.model_key)

    # -- the two-phase step ------------------------------------------------------------------
    def prepare(self, global_params: Params, plan: RoundPlan) -> IdpJob:
        """The round's job: whether the client's data enters it and its E shuffled epochs."""
        active = bool(plan.active[0]) if self.ledger is not None else True
        sampled = active and plan.participates
        t = plan.round_index
        clip_norm = float(plan.config.get("clip_norm", self.setup.initial_clip))
        clip = clip_norm * self.clip_factor
        data = None
        if sampled:
            data = repeated_epochs(
                self.x_train,
                self.y_train,
                self.setup.local.epochs,
                self.randomness.stream("local-shuffle", t, self.client_id),
            )
        from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY

        announced = plan.config.get(SURVIVORS_KEY)
        return IdpJob(
            self,
            global_params,
            t,
            clip,
            clip_norm,
            sampled,
            data,
            None if announced is None else int(announced),
        )

    @classmethod
    def train_batch(cls, jobs: Sequence[IdpJob]) -> list[Delta]:
        """Local updates of every job that trains, one batched computation per global model,
        local-training settings and architecture (jobs that do not train get None)."""
        out: list[Delta] = [None] * len(jobs)
        groups: dict[tuple[int, Any, str], list[int]] = {}
        for k, job in enumerate(jobs):
            if job.data is not None:
                key = (id(job.params), job.silo.setup.local, job.silo.model_key)
                groups.setdefault(key, []).append(k)
        for members in groups.values():
            first = jobs[members[0]]
            datasets = [d for d in (jobs[k].data for k in members) if d is not None]
            deltas = train_clients(first.silo.model, first.params, datasets, first.silo.setup.local)
            for k, delta in zip(members, deltas, strict=True):
                out[k] = delta
        return out

    def finish(self, job: IdpJob, result: Delta) -> Contribution:
        delta = (
            result
            if result is not None
            else [np.zeros(np.shape(p), dtype=np.float64) for p in job.params]
        )
        arrays, metrics = self.release_update(job, delta)
        return Contribution(update=arrays, weight=1.0, metrics=metrics)

    @abstractmethod
    def release_update(
        self, job: IdpJob, delta: list[np.ndarray]
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """What the variant releases from the local update (zeros when it did not train)."""

    # -- evaluation --------------------------------------------------------------------------
    def test(self, params: Params) -> Scalars:
        return evaluate_clients(self.model, params, [(self.x_test, self.y_test)])[0]

    @classmethod
    def test_batch(
        cls, silos: Sequence[BatchedSilo[IdpJob, Delta]], params: Params
    ) -> list[Scalars]:
        """One pass of ``params`` over every silo's test split (the same metrics as alone)."""
        mine = [s for s in silos if isinstance(s, IdpSilo)]
        if len(mine) != len(silos) or not mine:
            return [s.test(params) for s in silos]
        return evaluate_clients(mine[0].model, params, [(s.x_test, s.y_test) for s in mine])

    # -- reports -----------------------------------------------------------------------------
    def spent(self) -> dict[str, float]:
        """ε spent so far per observer of the client's ledger (∞ without a ledger)."""
        if self.ledger is None:
            return {o: math.inf for o in self.setup.observers}
        return {o: float(self.ledger.spent_epsilon(o)[0]) for o in self.ledger.observers}

    def privacy_summary(self) -> PrivacySummary:
        """This client's privacy (stays at the client; the simulator merges them), unit
        ``client``; group info: its group's sampling ``rate`` and ``noise_multiplier``."""
        run = (
            {}
            if self.setup.noise_multiplier is None
            else {"noise_multiplier": float(self.setup.noise_multiplier)}
        )
        if self.ledger is not None:
            summary = self.ledger.summary()
            return summary if dict(summary.info) == run else summary.with_info(**run)
        return self._unaccounted_summary(run)

    def _unaccounted_summary(self, run: dict[str, float]) -> PrivacySummary:
        """ε = ∞: a non-private client (budget ∞, never over it) or the ``no-dp`` method."""
        observers = tuple(self.setup.observers)
        b = self.budget
        over = int(math.isfinite(b))  # ε = ∞ exceeds every finite budget
        info = {"mean_rate": self.rate, "rate": self.rate}
        sigma = self.setup.noise_multipliers[self.group]
        if sigma is not None:
            info["noise_multiplier"] = float(sigma)
        group = GroupSummary(
            label=label_of(b),
            units=1,
            budget_min=b,
            budget_max=b,
            spent_max={o: math.inf for o in observers},
            utilization_sum={o: math.inf if over else 0.0 for o in observers},
            over_budget={o: over for o in observers},
            info=info,
        )
        return PrivacySummary(
            unit="client",
            units=1,
            observers=observers,
            accountant="rdp",
            groups=(group,),
            private=self.setup.private,
            info=run,
        )

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The template's state with the one-unit ledger's counters as plain integers (cheap,
        pickle-free checkpoints of thousands of clients)."""
        state = super().state_dict()
        if state["ledger"] is not None:
            state["ledger"] = {
                k: v.tolist() if isinstance(v, np.ndarray) else v
                for k, v in state["ledger"].items()
            }
        return state


class CentralIdpSilo(IdpSilo):
    """Central DP (the paper): the trusted aggregator sampled this client (so its data enters
    the round unless it is stopped) and clips and noises; the client releases Δ_i to it only."""

    def release_update(
        self, job: IdpJob, delta: list[np.ndarray]
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        return [d.astype(np.float32) for d in delta], {}


class DistributedIdpSilo(IdpSilo):
    """Distributed noise: the client samples itself, clips to C_t and adds its noise shares."""

    public_metrics: ClassVar[frozenset[str]] = frozenset({"clip_count"})
    #: Audit canary clients riding on this client (None in every ordinary run).
    extra_rows: ExtraRows | None = None

    def participates(self, round_index: int, config: Scalars) -> bool:
        """This client's own Bernoulli(q_{g(i)}) for ``round_index`` (its own randomness)."""
        return self.coin(round_index)

    def coin(self, round_index: int) -> bool:
        u = self.randomness.stream("client-sampling", int(round_index), self.client_id)
        return bool(u.uniform(1)[0] < self.rate)

    def release_update(
        self, job: IdpJob, delta: list[np.ndarray]
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Clip to C_t·C_p/C, add N(0, σ_v²C_t²/t) and the count share N(0, σ_b²/t) (zeros if
        not sampled); t: the setup's survivors, or a smaller t the protocol announced."""
        import torch

        from pdpfl.dp.noise import add_noise
        from pdpfl.dp.steps import clip_vectors, vector_norms

        setup, clip, t = self.setup, job.clip, job.round_index
        vecs = [torch.as_tensor(d, dtype=torch.float64).unsqueeze(0) for d in delta]
        metrics: dict[str, float] = {}
        if not setup.private:
            return [v[0].numpy().astype(np.float32) for v in vecs], metrics
        if self.share_encoding is not None:
            return self.release_discrete(job, vecs), metrics
        if self.ledger is not None:  # the noise below is what the ledger charges
            checked_noise(setup.release_noise(self.group), self.ledger, f"client {self.name}")
        norm = float(vector_norms(vecs)[0])
        vecs, _ = clip_vectors(vecs, clip)
        canaries = 0
        if self.extra_rows is not None:  # audit canary clients: sampled, clipped, counted
            before = int(self.extra_rows.counts.sum())
            stream = self.randomness.stream("audit-canary-clients", t, self.client_id)
            self.extra_rows.add_sampled([v[0] for v in vecs], stream, clip)
            canaries = int(self.extra_rows.counts.sum()) - before
        out = [v[0].clone() for v in vecs]
        if setup.value_noise_multiplier is not None:
            add_noise(
                out,
                setup.value_noise(self.group, job.clip_norm),
                self.randomness.stream("noise-share", t, self.client_id),
                announced_survivors=job.announced,
            )
        count = setup.count_noise()
        if count is not None:
            below = (1.0 if norm <= clip else 0.0) - 0.5 if job.sampled else 0.0
            below -= 0.5 * canaries  # a canary's update is above C_t
            value = torch.tensor([below], dtype=torch.float64)
            add_noise(
                value,
                count,
                self.randomness.stream("count-share", t, self.client_id),
                announced_survivors=job.announced,
            )
            metrics["clip_count"] = float(value[0])
        return [v.numpy().astype(np.float32) for v in out], metrics

    def release_discrete(self, job: IdpJob, vecs: list[torch.Tensor]) -> list[np.ndarray]:
        """The discrete share (:mod:`pdpfl.fl.idp_fedavg.discrete`): [Clip(Δ, C_t·f_g)/C_t,
        λ·(b − ½)] rounded at the group's bound N_g, + one exact discrete Gaussian share (the
        one noise adder), modulo 2^b; zeros + the share when not sampled."""
        import torch

        from pdpfl.dp.discrete_encoding import add_noise_share, scale_and_round
        from pdpfl.dp.steps import clip_vectors, vector_norms
        from pdpfl.fl.aggregation.discrete_shares import rotation_seed
        from pdpfl.fl.idp_fedavg.discrete import count_factor, group_bound_sq
        from pdpfl.privacy.noise import NoiseBindingError

        enc, setup, t = self.share_encoding, self.setup, job.round_index
        assert enc is not None
        params = enc.params
        noise = params.noise()
        noise.shares_for(job.announced)  # a protocol never gets fewer than t shares
        bound = group_bound_sq(enc, setup, self.group)
        if self.ledger is not None:  # the shares added are those the ledger charges
            plan = self.ledger.mechanism
            if not (
                getattr(plan, "share_variance", None)
                == params.plan("client", 0.5, 1).share_variance
                and getattr(plan, "shares", None) == noise.shares
                and float(getattr(plan, "l2_sensitivity_sq", 0.0)) >= bound
            ):
                raise NoiseBindingError(
                    f"noise: client {self.name} would add discrete shares its ledger does not "
                    "charge; nothing is released"
                )
        norm = float(vector_norms(vecs)[0])
        clipped, _ = clip_vectors(vecs, job.clip)
        flat = torch.cat([v[0].reshape(-1) for v in clipped]).numpy() / job.clip_norm
        lam = count_factor(setup)
        if lam is not None:
            below = (1.0 if norm <= job.clip else 0.0) - 0.5 if job.sampled else 0.0
            flat = np.append(flat, lam * below)
        rounded = scale_and_round(
            flat,
            params,
            self.randomness.stream("rounding", t, self.client_id),
            rotation_seed(t),
            bound_sq=bound,
        )
        if self.extra_rows is not None:  # audit canary clients: units of the integer vector
            rounded = rounded + self.rounded_canaries(job)
        stream = self.randomness.stream("noise-share", t, self.client_id)
        return [add_noise_share(rounded, params, stream)]

    def rounded_canaries(self, job: IdpJob) -> np.ndarray:
        """Σ ũ_i over the audit's canary clients sampled this round (int64, d'): each its own
        q_p coin (the host's stream, as on continuous shares), its vector
        u = [Clip(v, C_t)/C_t, λ·(0 − ½)] (a canary's update is above C_t: counted as clipped)
        rounded on its own at the host group's bound, like a client's (its own stream); without
        the rotation only each row's own coordinates (zeros round to zeros exactly)."""
        from pdpfl.dp.discrete_encoding import conditional_round_rows, round_units
        from pdpfl.dp.steps import poisson_sample
        from pdpfl.fl.aggregation.discrete_shares import rotation_seed
        from pdpfl.fl.idp_fedavg.discrete import count_factor, group_norm

        enc, rows, t = self.share_encoding, self.extra_rows, job.round_index
        assert enc is not None and rows is not None
        params = enc.params
        total = np.zeros(params.padded_dimension, dtype=np.int64)
        coins = self.randomness.stream("audit-canary-clients", t, self.client_id)
        idx = poisson_sample(rows.rates, coins).numpy()
        if idx.size == 0:
            return total
        np.add.at(rows.counts, idx, 1)
        coords, values = rows.coords[idx], rows.values[idx]
        norms = np.sqrt(np.sum(values * values, axis=1, keepdims=True))
        factors = np.ones_like(norms)
        np.divide(job.clip, norms, out=factors, where=norms > job.clip)
        flat = values * factors / job.clip_norm  # Clip(v, C_t·f_g)/C_t
        lam = count_factor(self.setup)
        w = min(1.0, group_norm(self.setup, self.group) / params.clip)  # N_g = N_p(w)
        stream = self.randomness.stream("audit-canary-rounding", t, self.client_id)
        if not params.rotation:  # zeros round to zeros: round each row's own coordinates
            last = np.full((len(idx), 0 if lam is None else 1), -0.5 * (lam or 0.0))
            compact = np.concatenate([flat, last], axis=1) * params.scale
            rounded = conditional_round_rows(compact, [params.part_bound_sq(w)] * len(idx), stream)
            k = coords.shape[1]
            np.add.at(total, coords.reshape(-1), rounded[:, :k].reshape(-1))
            if lam is not None:
                total[params.dimension - 1] += int(rounded[:, k].sum())
            return total
        per = max(1, (1 << 22) // params.padded_dimension)  # dense rows, in batches
        for s in range(0, len(idx), per):
            dense = np.zeros((min(per, len(idx) - s), params.dimension))
            np.put_along_axis(dense, coords[s : s + per], flat[s : s + per], axis=1)
            if lam is not None:
                dense[:, -1] = -0.5 * lam
            weights = np.full(dense.shape[0], w)
            total += round_units(dense / w, weights, params, stream, rotation_seed(t))
        return total
