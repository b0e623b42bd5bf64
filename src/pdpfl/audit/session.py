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

Each observer's view of every canary, round by round (:func:`~pdpfl.audit.observe.observer_rounds`),
is standardized by the control canaries' spread and summed into one score per canary; each
group's scores become two lower bounds, Steinke et al.'s and the f-DP audit's against the
group's own mechanism family (:mod:`pdpfl.audit.fdp`), over a ladder of guess counts, with a
verdict, the one-shot estimate and the measured attack rates (:mod:`pdpfl.audit.evidence`),
beside the accountant's risk card (:mod:`pdpfl.privacy.risk`).

Confidence is **simultaneous**: every (group -- the control included --, observer) gets an
equal share (1 − confidence)/(groups × observers) of the error, split among its tests (both
statistics, every rung of the ladder) by weighted Bonferroni -- half of it to the f-DP test at
the number of guesses planned from ideal canaries of the claim before any score is seen
(:func:`~pdpfl.audit.ideal.plan_rung`), the rest equally (:class:`~pdpfl.audit.evidence
.Levels`) --, so with probability ≥ confidence *all* ε̂ are below their groups' true ε at the
audit's δ. A group whose ε̂ exceeds the accountant's ε is a **violation**
(:attr:`AuditResult.violations`); one whose test saturated where it could not have failed is
**inconclusive** (:attr:`AuditResult.inconclusive`).
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.audit.canaries import CONTROL_LABEL, CanaryPlan, GroupSpec, plan_canaries
from pdpfl.audit.evidence import (
    CONSISTENT,
    INCONCLUSIVE,
    PLANNED_WEIGHT,
    STATISTICS,
    VIOLATION,
    Evidence,
    Levels,
    evidence,
    guess_ladder,
)
from pdpfl.audit.fdp import MechanismFamily, ledger_epsilon
from pdpfl.audit.hooks import AuditUnsupported, CanaryHook, canary_hook
from pdpfl.audit.ideal import plan_rung
from pdpfl.audit.observe import (
    FlatIndex,
    ReleaseLog,
    ReleaseTap,
    observer_rounds,
    sampled_gaussian_scores,
    standardized_rounds,
)
from pdpfl.audit.space import Space, block_config, choose_space
from pdpfl.fl.algorithm import Assembly, as_algorithm
from pdpfl.ledger import OBSERVERS, GroupSummary, PrivacyLedger, PrivacySummary
from pdpfl.privacy.risk import RiskCard, privacy_curve, risk_card
from pdpfl.randomness import (
    Randomness,
    ReproducibleRandomnessWarning,
    SecureRandomness,
    SeededRandomness,
)

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation

__all__ = ["AuditResult", "AuditSession", "AuditSettings", "GroupAudit", "default_delta"]


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
    """The auditor's choices: canaries per group, observers, space, coins, confidence, δ, and
    whether each group's f-DP test at one number of guesses is planned from ideal canaries of
    the claim (``plan``, default on; off: every test of a group at the same level).

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
    plan: bool = True

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
    """One group for one observer: the budget, the accountant's ε, the audit's evidence and
    the accountant's risk card for the group's strongest unit."""

    label: str
    budget: float | None
    rate: float | None
    units: int
    spent: float | None
    spent_audit: float | None
    evidence: Evidence
    control: bool = False
    risk: RiskCard | None = None

    @property
    def epsilon(self) -> float:
        return self.evidence.epsilon

    @property
    def violated(self) -> bool:
        return self.evidence.violated

    @property
    def status(self) -> str:
        return self.evidence.status

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "control": self.control,
            "budget": self.budget,
            "canary_rate": self.rate,
            "units": self.units,
            "spent": self.spent,
            "spent_at_audit_delta": self.spent_audit,
            **self.evidence.to_dict(),
            "risk": None if self.risk is None else self.risk.to_dict(),
        }


@dataclass
class AuditResult:
    """Everything an audit found (``to_dict`` is ``audit.json``)."""

    meta: dict[str, Any]
    groups: dict[str, list[GroupAudit]]
    warnings: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        out = []
        for obs, rows in self.groups.items():
            for g in rows:
                if not g.violated:
                    continue
                above = g.spent_audit is None or g.epsilon > g.spent_audit
                why = "" if above else " (the f-DP test rejects the accountant's privacy curve)"
                out.append(
                    f"{obs}: group {g.label}: audited ε̂ = {g.epsilon:.4g} "
                    f"{'>' if above else '≥'} the accountant's ε = {g.spent_audit:.4g} at "
                    f"δ = {self.meta['audit_delta']:.3g}{why}"
                )
        return out

    @property
    def inconclusive(self) -> list[str]:
        """Groups whose test saturated: every guess right, yet no test could have failed."""
        out = []
        for obs, rows in self.groups.items():
            for g in rows:
                if g.status != INCONCLUSIVE:
                    continue
                need = g.evidence.canaries_for_power
                more = (
                    f"about {need} canaries per group would give it power"
                    if need is not None
                    else "no canary count gives it power at this δ (lower --delta)"
                )
                out.append(
                    f"{obs}: group {g.label}: every guess right, but no test with "
                    f"{g.evidence.m} canaries can certify the accountant's ε = "
                    f"{g.spent_audit:.4g}: {more}"
                )
        return out

    @property
    def verdict(self) -> str:
        if self.violations:
            return VIOLATION
        if self.inconclusive:
            return INCONCLUSIVE
        return CONSISTENT

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "pdpfl.audit/2",
            **self.meta,
            "observers": {obs: [g.to_dict() for g in rows] for obs, rows in self.groups.items()},
            "violations": self.violations,
            "inconclusive": self.inconclusive,
            "verdict": self.verdict,
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
        config: ExperimentConfig,
        federation: Federation,
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
        #: What the statistics could not do (reported with the run's warnings).
        self.notes: list[str] = []
        #: Planned rungs already computed (:meth:`levels`).
        self._plans: dict[tuple[object, ...], int | None] = {}

    # ------------------------------------------------------------------ planning
    @classmethod
    def create(
        cls,
        config: ExperimentConfig,
        settings: AuditSettings | None = None,
        *,
        federation: Federation | None = None,
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

    def group_share(self) -> float:
        """Each (group, observer)'s share of the audit's error, 1 − confidence: Bonferroni
        over the groups (the control included) and the observers audited."""
        tail = 1.0 - float(self.settings.confidence)
        return tail / (len(self.plan.groups) * len(self.meta["observers_audited"]))

    def seen_noise_factor(self, observer: str, family: MechanismFamily) -> float:
        """ν of the noise the real canaries meet, where the hook states it
        (:meth:`~pdpfl.audit.hooks.CanaryHook.round_signal`: ν = 1/(μ·σ), e.g. IDP-FedAvg's
        value noise σ_v against the charged σ_p under adaptive clipping); 1 where it states
        nothing."""
        signal = self.hook.round_signal(self.run, observer)
        return 1.0 if signal is None else 1.0 / (signal * family.noise)

    def levels(self, family: MechanismFamily | None, observer: str, m: int) -> Levels:
        """One group's :class:`~pdpfl.audit.evidence.Levels` with m canaries: its share, and the
        planned f-DP rung where it has a family to plan with (``settings.plan``)."""
        share = self.group_share()
        planned = None
        if family is not None and self.settings.plan:
            seen = self.seen_noise_factor(observer, family)
            delta = float(self.meta["audit_delta"])
            key = (repr(family.mechanism), observer, family.rate, family.count, family.noise, m)
            if key not in self._plans:  # a plan is a function of these (and δ, share, ν)
                self._plans[key] = plan_rung(family, m, delta, share, noise_factor=seen)
            planned = self._plans[key]
        return Levels.split(share, m, planned)

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
        transport = InProcessTransport(taps)
        transport.configure_security(run.config)  # each silo's own secure-summation settings
        started = time.perf_counter()
        with (
            tempfile.TemporaryDirectory(prefix="pdpfl-audit-") as tmp,
            torch_threads(run.config.threads),
            warnings.catch_warnings(),
        ):
            # the reproducible-mode banner: audit.json records the randomness instead
            warnings.simplefilter("ignore", ReproducibleRandomnessWarning)
            record = run_rounds(
                run.server,
                transport,
                tmp,
                settings,
                run.protocol,
                progress=progress,
                # the sequence of global models third parties see (the run id is not needed)
                save_model=lambda t, params, _run_id: log.record_model(t, params),
            )
        seconds = time.perf_counter() - started
        spent, ledgers = self._spent(log, settings.rounds)
        observers = list(self.meta["observers_audited"])
        m = int(self.meta["canaries_per_group"])
        groups = len(plan.groups)
        share = self.group_share()

        def level_for(size: int) -> float:
            """A test's level at ``size`` canaries per group; with planning, the other tests'
            (the planned rung may add one): the smaller, for the canary count of power."""
            n = len(STATISTICS) * len(guess_ladder(size))
            if not self.settings.plan:
                return share / n
            return share * (1.0 - PLANNED_WEIGHT) / (n + len(STATISTICS) - 1)

        planned: dict[str, dict[str, int | None]] = {}
        tests = 0
        out: dict[str, list[GroupAudit]] = {}
        for obs in observers:
            per_round = observer_rounds(
                obs,
                hosts=plan.host,
                log=log,
                initial=initial,
                rounds=settings.rounds,
                hides_individual_updates=bool(run.protocol.hides_individual_updates),
                release_sign=float(self.hook.release_sign(run)),
            )
            control = np.array([s.control for s in plan.groups], dtype=bool)[plan.group]
            scores = self._scores(obs, standardized_rounds(per_round, plan.host, control), control)
            families = {g: self._family(g, obs, ledgers) for g in range(groups)}
            top = max(
                (g for g in range(groups) if families[g] is not None),
                key=lambda g: plan.groups[g].budget,
                default=None,
            )
            out[obs] = []
            for g in range(groups):
                is_control = plan.groups[g].control
                # the control group is tested against the largest group's family, unplanned
                family = families[top] if is_control and top is not None else families[g]
                levels = self.levels(None if is_control else family, obs, m)
                planned.setdefault(obs, {})[plan.groups[g].label] = levels.planned
                tests += levels.tests
                out[obs].append(self._group(g, obs, scores, spent, levels, level_for, family))
        metrics = record["metrics"]
        meta = {
            **self.meta,
            "seconds": seconds,
            "seconds_statistics": time.perf_counter() - started - seconds,
            "final_accuracy": metrics[-1]["accuracy"] if metrics else None,
            "statistics": list(STATISTICS),
            "ladder": guess_ladder(m),
            "tests": tests,
            "level_per_group": share,
            "level_per_test": level_for(m),
            "planned": planned,
            "planned_weight": PLANNED_WEIGHT if self.settings.plan else None,
            "k_selection": (
                "a ladder fixed by m before the scores are seen (k = m/2, m/4, ... while 2k >= "
                "16, at most 8 rungs); each (group, observer) an equal share of 1 - confidence "
                "(Bonferroni), split among its tests: "
                + (
                    "half to the f-DP test at the k planned from ideal canaries of the claim "
                    "(a fixed seed; added to the ladder if not on it), the rest equally"
                    if self.settings.plan
                    else "equally"
                )
            ),
        }
        return AuditResult(meta, out, warnings=[*run.warnings, *self.notes])

    def _scores(self, obs: str, z: np.ndarray, control: np.ndarray) -> np.ndarray:
        """Each canary's score from its standardized rounds ``z``: the exact likelihood ratio
        of a once-per-round sampled Gaussian where the hook states that law
        (:meth:`~pdpfl.audit.hooks.CanaryHook.round_signal`; the control canaries scored at the
        largest rate, as if they were its group's), else the standardized sum."""
        signal = self.hook.round_signal(self.run, obs)
        if signal is None:
            self.meta.setdefault("scores", {})[obs] = "standardized sum over rounds"
            out: np.ndarray = z.sum(axis=0)
            return out
        rates = self.plan.rates.copy()
        rates[control] = float(rates[~control].max()) if (~control).any() else 0.0
        self.meta.setdefault("scores", {})[obs] = (
            f"likelihood ratio of a once-per-round sampled Gaussian, μ = {signal:.4g}"
        )
        return sampled_gaussian_scores(z, rates, signal)

    def _spent(
        self, log: ReleaseLog, rounds: int
    ) -> tuple[dict[tuple[str, str], np.ndarray], dict[int, tuple[np.ndarray, PrivacyLedger]]]:
        """ε of every canary per (observer, δ label): its host's charges, replayed; and per
        host its canaries and their ledger at the audit's δ."""
        plan, run = self.plan, self.run
        trained_groups = np.array([not s.control for s in plan.groups])[plan.group]
        out: dict[tuple[str, str], np.ndarray] = {}
        ledgers: dict[int, tuple[np.ndarray, PrivacyLedger]] = {}
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
                if tag == "audit":
                    ledgers[host] = (mine, ledger)
        return out, ledgers

    def _family(
        self, g: int, obs: str, ledgers: dict[int, tuple[np.ndarray, PrivacyLedger]]
    ) -> MechanismFamily | None:
        """The f-DP hypothesis family of group ``g`` against ``obs``: the mechanism its canaries'
        ledgers charge, at their largest rate and count and smallest σ (a member less private
        than every canary's own); None when the hosts' mechanisms differ or none applies."""
        plan = self.plan
        if plan.groups[g].control:
            return None
        mechanisms, rates, counts, sigmas = [], [], [], []
        base: PrivacyLedger | None = None
        for mine, ledger in ledgers.values():
            rows = np.flatnonzero(plan.group[mine] == g)
            if rows.size == 0 or obs not in ledger.observers:
                continue
            base = ledger
            mechanisms.append(ledger.mechanism)
            rates.append(float(ledger.rates[rows].max()))
            counts.append(int(ledger.counts[obs][rows].max()))
            sigmas.append(float(ledger.noise_multipliers[rows].min()))
        if base is None:
            return None
        if any(mech != mechanisms[0] for mech in mechanisms):
            self.notes.append(
                f"no f-DP test for group {plan.groups[g].label} ({obs}): its canaries' hosts "
                "charge different mechanisms (one family cannot describe them all)"
            )
            return None
        rate, count, sigma = max(rates), max(counts), min(sigmas)
        if rate <= 0.0 or count <= 0:
            return None
        family = MechanismFamily(
            mechanisms[0], obs, rate, count, sigma, ledger_epsilon(base, obs, rate, count, sigma)
        )
        try:
            family.member(0)  # the claim itself: an accountant must interpret the mechanism
        except ValueError as err:
            self.notes.append(f"no f-DP test for group {plan.groups[g].label} ({obs}): {err}")
            return None
        return family

    def _group(
        self,
        g: int,
        obs: str,
        scores: np.ndarray,
        spent: dict[tuple[str, str], np.ndarray],
        levels: Levels,
        level_for: Callable[[int], float],
        family: MechanismFamily | None,
    ) -> GroupAudit:
        plan = self.plan
        spec = plan.groups[g]
        idx = plan.members(g)
        accounted = (obs, "audit") in spent
        claimed = (
            0.0 if spec.control else float(spent[(obs, "audit")][idx].max()) if accounted else None
        )
        found = evidence(
            scores[idx],
            plan.included[idx],
            self.meta["audit_delta"],
            levels,
            claimed=claimed,
            family=family,
            order=np.argsort(plan.order[idx]),
            level_for=level_for,
        )
        if spec.control:
            return GroupAudit(spec.label, None, 0.0, 0, 0.0, 0.0, found, control=True)
        summary = self._summary_groups.get(spec.label)
        risk = None
        if family is not None:
            curve = privacy_curve(
                family.mechanism, family.rate, obs, family.count, noise_multiplier=family.noise
            )
            risk = risk_card(curve, obs)
        return GroupAudit(
            label=spec.label,
            budget=spec.budget,
            rate=float(plan.rates[idx].max()),
            units=int(getattr(summary, "units", 0)),
            spent=float(spent[(obs, "config")][idx].max()) if accounted else None,
            spent_audit=claimed,
            evidence=found,
            risk=risk,
        )
