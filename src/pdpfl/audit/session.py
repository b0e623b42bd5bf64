"""One audit run: plan the canaries, train once through the real mechanism, observe, bound.

:class:`AuditSession` follows one-run auditing (Steinke, Nasr & Jagielski 2023, Algorithm 1:
choose canaries, flip a coin per canary, train once, score, guess, bound) in its federated
form (Andrew et al., ICLR 2024: canaries planted in the participants' contributions, scored by
what an observer of the federation sees):

1. :meth:`AuditSession.create` assembles the configured run (the same
   :meth:`~pdpfl.fl.algorithm.Algorithm.assemble` as ``pdpfl run``), reads its budget groups
   from the typed privacy summary, chooses the audit space (:mod:`pdpfl.audit.space`), draws
   the canaries (:mod:`pdpfl.audit.canaries`) and plants them through the algorithm's hook
   (:mod:`pdpfl.audit.hooks`). ``session.run`` is the assembled run: a test may break its
   mechanism there before :meth:`~AuditSession.execute` (that is how the broken-mechanism tests
   work);
2. :meth:`AuditSession.execute` runs the one round loop (:func:`pdpfl.runtime.loop.run_rounds`)
   in-process with each silo behind a :class:`~pdpfl.audit.observe.ReleaseTap`, charges the
   canaries' ledgers round by round like their hosts' units, scores every canary for every
   observer (:mod:`pdpfl.audit.observe`) and bounds each group (:mod:`pdpfl.audit.bound`).

Confidence is **simultaneous**: every reported ε̂ (all groups, the control group, both
observers, every candidate k) is computed at level (1 − confidence) / (number of tests), so with
probability ≥ confidence *all* of them are below their groups' true ε at the audit's δ. A group
whose ε̂ exceeds the accountant's ε is a **violation** (:attr:`AuditResult.violations`).
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdpfl.audit.bound import AuditBound, audit_scores, candidate_ks
from pdpfl.audit.canaries import CONTROL_LABEL, CanaryPlan, GroupSpec, plan_canaries
from pdpfl.audit.hooks import AuditUnsupported, CanaryHook, canary_hook
from pdpfl.audit.observe import FlatIndex, ReleaseLog, ReleaseTap, observer_scores
from pdpfl.audit.space import Space, block_config, choose_space
from pdpfl.fl.algorithm import Assembly, as_algorithm
from pdpfl.ledger import OBSERVERS, GroupSummary, PrivacySummary
from pdpfl.randomness import (
    Randomness,
    ReproducibleRandomnessWarning,
    SecureRandomness,
    SeededRandomness,
)

__all__ = ["AuditResult", "AuditSession", "AuditSettings", "GroupAudit", "default_delta"]

#: Relative slack when comparing ε̂ with the accountant's ε (floating-point noise only).
TOLERANCE = 1e-9


def default_delta(config_delta: float, per_group: int) -> float:
    """The audit's δ: the config's, or 1/(100·m) if smaller, so that the δ-term of the bound
    (2mδ·α) stays small (with m·δ ≈ 1 no count of guesses certifies much more than ε ≈ 1)."""
    return float(min(config_delta, 1.0 / (100.0 * per_group)))


#: Most canaries per group: each is a coordinate of the audited model or of an audit-only block
#: of (groups + 1) × M parameters that every silo holds and trains (10⁶ per group: tens of MB;
#: 10¹¹ would ask for terabytes). The bound's precision barely improves beyond 10⁴.
MAX_CANARIES = 1_000_000


@dataclass(frozen=True)
class AuditSettings:
    """The auditor's choices: canaries per group, observers, space, coins, confidence, δ.

    Checked when made (``ValueError`` naming the field and its allowed range), before any
    training or allocation: ``canaries`` in [2, :data:`MAX_CANARIES`], ``observers`` among
    ``third-party`` and ``server``, ``space`` auto/model/block, ``confidence`` and ``delta``
    in (0, 1)."""

    canaries: int = 1000
    observers: tuple[str, ...] = OBSERVERS
    space: Space = "auto"
    seed: int | None = None
    confidence: float = 0.95
    delta: float | None = None

    def __post_init__(self) -> None:
        m = self.canaries
        if isinstance(m, bool) or not isinstance(m, int | np.integer) or not 2 <= m <= MAX_CANARIES:
            raise ValueError(f"canaries: must be an integer in [2, {MAX_CANARIES:,}], got {m!r}")
        if not self.observers or any(o not in OBSERVERS for o in self.observers):
            raise ValueError(
                f"observers: each must be one of {', '.join(OBSERVERS)}, got {self.observers!r}"
            )
        if self.space not in ("auto", "model", "block"):
            raise ValueError(f"space: must be auto, model or block, got {self.space!r}")
        for name, value in (("confidence", self.confidence), ("delta", self.delta)):
            if value is None and name == "delta":
                continue
            if not isinstance(value, int | float) or not 0 < float(value) < 1:
                raise ValueError(f"{name}: must be in (0, 1), got {value!r}")

    def randomness(self) -> Randomness:
        return SecureRandomness() if self.seed is None else SeededRandomness(int(self.seed))


@dataclass(frozen=True)
class GroupAudit:
    """One group for one observer: the budget, the accountant's ε and the audited ε̂."""

    label: str
    budget: float | None
    rate: float | None
    units: int
    spent: float | None
    spent_audit: float | None
    bound: AuditBound
    control: bool = False

    @property
    def violated(self) -> bool:
        if self.spent_audit is None:
            return False
        return self.bound.epsilon > self.spent_audit * (1 + TOLERANCE) + TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "control": self.control,
            "budget": self.budget,
            "canary_rate": self.rate,
            "units": self.units,
            "spent": self.spent,
            "spent_at_audit_delta": self.spent_audit,
            **self.bound.to_dict(),
            "violated": self.violated,
        }


@dataclass
class AuditResult:
    """Everything an audit found (``to_dict`` is ``audit.json``)."""

    meta: dict[str, Any]
    groups: dict[str, list[GroupAudit]]
    warnings: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        return [
            f"{obs}: group {g.label}: audited ε̂ = {g.bound.epsilon:.4g} > the accountant's "
            f"ε = {g.spent_audit:.4g} at δ = {self.meta['audit_delta']:.3g}"
            for obs, rows in self.groups.items()
            for g in rows
            if g.violated
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "pdpfl.audit/1",
            **self.meta,
            "observers": {obs: [g.to_dict() for g in rows] for obs, rows in self.groups.items()},
            "violations": self.violations,
            "verdict": "violation" if self.violations else "consistent",
            "warnings": list(self.warnings),
        }


def _groups(run: Assembly) -> tuple[list[GroupSpec], dict[str, GroupSummary]]:
    parts = [s.privacy_summary() for s in run.clients.values()]
    own = getattr(run.server, "privacy_summary", None)
    if callable(own):
        parts.append(own())
    present = [p for p in parts if isinstance(p, PrivacySummary)]
    if not present:
        raise ValueError("audit: the run accounts no privacy units (nothing to audit)")
    summary = PrivacySummary.merge(present)
    specs = [GroupSpec(g.label, float(g.budget_max)) for g in summary.groups]
    return specs, {g.label: g for g in summary.groups}


def _total(params: list[np.ndarray]) -> int:
    return int(sum(np.asarray(p).size for p in params))


class AuditSession:
    """One audit of one configuration (module docstring)."""

    def __init__(
        self,
        config: Any,
        federation: Any,
        run: Assembly,
        hook: CanaryHook,
        plan: CanaryPlan,
        settings: AuditSettings,
        meta: dict[str, Any],
        summary_groups: dict[str, GroupSummary],
    ) -> None:
        self.config = config
        self.federation = federation
        self.run = run
        self.hook = hook
        self.plan = plan
        self.settings = settings
        self.meta = meta
        self._summary_groups = summary_groups

    # ------------------------------------------------------------------ planning
    @classmethod
    def create(
        cls, config: Any, settings: AuditSettings | None = None, *, federation: Any | None = None
    ) -> AuditSession:
        """Assemble the run, plan the canaries and plant them (nothing is trained yet)."""
        from pdpfl.runtime.simulation import load_federation_for

        settings = settings or AuditSettings()
        unknown = set(settings.observers) - set(OBSERVERS)
        if unknown or not settings.observers:
            raise ValueError(
                f"--observer: expected third-party, server or both, got {sorted(unknown) or 'none'}"
            )
        if federation is None:
            federation = load_federation_for(config)
        algorithm = as_algorithm(config.algorithm)
        run = algorithm.assemble(config, federation)
        hook = canary_hook(as_algorithm(run.config.algorithm))
        hook.check(run)
        claimed = tuple(hook.observers(run))
        observers = tuple(o for o in OBSERVERS if o in settings.observers and o in claimed)
        if not observers:
            raise AuditUnsupported(
                f"--observer: {run.config.algorithm.name!r} states its guarantee against "
                f"{' and '.join(claimed)} only; audit that observer"
            )
        groups, summary_groups = _groups(run)
        m = int(settings.canaries)
        specs = [*groups, GroupSpec(CONTROL_LABEL, 0.0, control=True)]
        model_params = _total(run.server.initial_params())
        space = choose_space(settings.space, model_params, m * len(specs))
        if space == "block":
            run = algorithm.assemble(block_config(config, m * len(specs)), federation)
            pool = np.arange(model_params, model_params + m * len(specs))
        else:
            pool = np.arange(model_params)
        hosts = hook.hosts(run)
        group_hosts = [hook.group_hosts(run, s.label) for s in groups] + [hosts]
        plan = plan_canaries(
            specs,
            m,
            pool,
            hosts,
            float(run.config.training.max_grad_norm),
            settings.randomness(),
            group_hosts=group_hosts,
        )
        for host in hosts:
            mine = np.flatnonzero((plan.host == host) & (plan.group < len(groups)))
            budgets = np.array([specs[g].budget for g in plan.group[mine]])
            if mine.size:
                plan.rates[mine] = hook.rates(run, host, budgets)
            hook.plant(run, host, plan.rows_for(host, nulls=hook.null_canaries(run)))
        delta = float(run.config.privacy.delta)
        meta = {
            "name": run.config.name,
            "algorithm": run.config.algorithm.name,
            "unit": hook.unit,
            "dataset": getattr(federation, "name", ""),
            "silos": len(run.clients),
            "rounds": int(run.config.training.rounds),
            "randomness": str(run.config.randomness),
            "audit_coins": "secure" if settings.seed is None else f"seeded ({settings.seed})",
            "canaries_per_group": m,
            "space": space,
            "model_parameters": model_params,
            "block_parameters": m * len(specs) if space == "block" else 0,
            "confidence": settings.confidence,
            "delta": delta,
            "audit_delta": float(settings.delta)
            if settings.delta is not None
            else default_delta(delta, m),
            "observers_audited": list(observers),
        }
        return cls(config, federation, run, hook, plan, settings, meta, summary_groups)

    # ------------------------------------------------------------------ the run
    def execute(self, *, progress: bool = False) -> AuditResult:
        """Train once, observe, charge the canaries' ledgers and bound every group."""
        from pdpfl.runtime.loop import LoopSettings, run_rounds
        from pdpfl.runtime.simulation import InProcessTransport, torch_threads

        run, plan = self.run, self.plan
        initial = [np.asarray(p).copy() for p in run.server.initial_params()]
        log = ReleaseLog(FlatIndex([np.shape(p) for p in initial], plan.coords))
        taps: dict[int, Any] = {c: ReleaseTap(s, c, log) for c, s in run.clients.items()}
        settings = LoopSettings.of(run.config)
        started = time.perf_counter()
        with (
            tempfile.TemporaryDirectory(prefix="pdpfl-audit-") as tmp,
            torch_threads(run.config.threads),
            warnings.catch_warnings(),
        ):
            # the reproducible-mode banner: audit.json records the randomness instead
            warnings.simplefilter("ignore", ReproducibleRandomnessWarning)
            record = run_rounds(
                run.server, InProcessTransport(taps), tmp, settings, run.protocol, progress=progress
            )
        seconds = time.perf_counter() - started
        spent = self._spent(log, settings.rounds)
        observers = list(self.meta["observers_audited"])
        # simultaneous confidence: Bonferroni over observers × groups here, over k in the bound
        per_group = 1.0 - (1.0 - self.settings.confidence) / (len(observers) * len(plan.groups))
        ks = candidate_ks(int(self.meta["canaries_per_group"]))
        tests = len(observers) * len(plan.groups) * len(ks)
        out: dict[str, list[GroupAudit]] = {}
        for obs in observers:
            scores = observer_scores(
                obs,
                hosts=plan.host,
                log=log,
                initial=initial,
                final=record["params"],
                hides_individual_updates=bool(run.protocol.hides_individual_updates),
                release_sign=float(self.hook.release_sign(run)),
            )
            out[obs] = [
                self._group(g, obs, scores, spent, per_group) for g in range(len(plan.groups))
            ]
        metrics = record["metrics"]
        meta = {
            **self.meta,
            "seconds": seconds,
            "final_accuracy": metrics[-1]["accuracy"] if metrics else None,
            "tests": tests,
            "level_per_test": (1 - self.settings.confidence) / tests,
            "k_selection": "Bonferroni over the candidate k (and over groups and observers)",
        }
        return AuditResult(meta, out, warnings=list(run.warnings))

    def _spent(self, log: ReleaseLog, rounds: int) -> dict[tuple[str, str], np.ndarray]:
        """ε of every canary per (observer, δ label): its host's charges, replayed."""
        plan, run = self.plan, self.run
        trained_groups = np.array([not s.control for s in plan.groups])[plan.group]
        out: dict[tuple[str, str], np.ndarray] = {}
        for host in sorted(set(plan.host[trained_groups].tolist())):
            mine = np.flatnonzero((plan.host == host) & trained_groups)
            budgets = np.array([plan.groups[g].budget for g in plan.group[mine]])
            took_part = self.hook.participation(run, host, log, rounds, mine.size)
            for tag, delta in (("config", self.meta["delta"]), ("audit", self.meta["audit_delta"])):
                ledger = self.hook.ledger(run, host, budgets, plan.rates[mine], delta)
                for t in range(rounds):
                    ledger.record_round(
                        participated=took_part[t], active=np.ones(mine.size, dtype=bool)
                    )
                for obs in ledger.observers:
                    out.setdefault((obs, tag), np.zeros(plan.size))[mine] = ledger.spent_epsilon(
                        obs
                    )
        return out

    def _group(
        self,
        g: int,
        obs: str,
        scores: np.ndarray,
        spent: dict[tuple[str, str], np.ndarray],
        confidence: float,
    ) -> GroupAudit:
        plan = self.plan
        spec = plan.groups[g]
        idx = plan.members(g)
        bound = audit_scores(
            scores[idx],
            plan.included[idx],
            self.meta["audit_delta"],
            confidence=confidence,
            order=np.argsort(plan.order[idx]),
        )
        summary = self._summary_groups.get(spec.label)
        if spec.control:
            return GroupAudit(spec.label, None, 0.0, 0, 0.0, 0.0, bound, control=True)
        accounted = (obs, "audit") in spent
        return GroupAudit(
            label=spec.label,
            budget=spec.budget,
            rate=float(plan.rates[idx].max()),
            units=int(getattr(summary, "units", 0)),
            spent=float(spent[(obs, "config")][idx].max()) if accounted else None,
            spent_audit=float(spent[(obs, "audit")][idx].max()) if accounted else None,
            bound=bound,
        )
