"""The private random search itself: candidates, the pre-run check, the trials, the outputs.

:func:`tune` (also ``pdpfl tune``) follows Papernot & Steinke (ICLR 2022), §3: draw K from a
public distribution (truncated negative binomial, Theorem 2, or Poisson, Theorem 3) with the
tuner's own randomness (:mod:`pdpfl.randomness`), run K trials -- each a real
:func:`~pdpfl.runtime.simulation.run_simulation` of a candidate drawn uniformly from the grid --
and release only the best one (highest final test accuracy; test records are outside the
training guarantee, as everywhere in pdpfl). Before any trial runs, every unit's ε for the
whole search is computed per observer (:mod:`pdpfl.tune.accounting`) and a search that would put
any unit over its budget is refused.

On data whose lifetime budgets are enforced (no ``lifetime.allow_respend``), the whole search
is charged to every party's budget store as **one sealed entry** before the first trial runs
(:func:`pdpfl.ledger.lifetime.charge_search`: each unit's RDP curve of the search per observer,
composed with every other run on the data by RDP addition), and a search that would take a unit
over its *lifetime* budget is refused; the trials, covered by that entry, then record their
runs in a scratch store under the output folder (``trial-stores``) instead of charging again.

The trials' folders (``trials/trial-NNN``) are the operator's working files: the released result
is the selected configuration, its model and the search's ε (``result.json``). Publishing the
other trials, their scores or their number is not covered by the search's guarantee.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.privacy.tuning import PoissonTrials, TrialDistribution, TruncatedNegativeBinomial
from pdpfl.tune.accounting import (
    ORDERS,
    SearchCost,
    UnitCurves,
    ledger_curves,
    party_ledgers,
    search_cost,
)

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation
    from pdpfl.fl.algorithm import Assembly
    from pdpfl.fl.api import ClientAlgorithm, ServerAlgorithm
    from pdpfl.ledger import PrivacySummary

__all__ = [
    "SearchPlan",
    "TuneRefused",
    "TuneResult",
    "candidates_from_grid",
    "parse_grid",
    "plan_search",
    "tune",
]

log = logging.getLogger(__name__)

#: What ``tune`` writes in its output folder (``overwrite`` replaces these only).
OUTPUTS: tuple[str, ...] = (
    "tune.json",
    "result.json",
    "ledgers",
    "trials",
    "trial-budgets",
    "trial-stores",
)
#: Grid keys that would change who the units are or what they own.
FORBIDDEN_PREFIXES: tuple[str, ...] = (
    "data.",
    "budgets.",
    "lifetime.",
    "seed",
    "name",
    "output_dir",
)
SCHEMA = "pdpfl.tune/1"


class TuneRefused(ValueError):
    """The search would put some unit over its budget (raised before any trial runs)."""


def _split_values(text: str) -> list[str]:
    """``a,[b,c],{d: e}`` → ``['a', '[b,c]', '{d: e}']`` (commas inside brackets kept)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [v for v in out if v]


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """``["training.lr=0.01,0.1", "batch_size=8,16"]`` → ``{key: [value texts]}``."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_.]+", key):
            raise ValueError(
                f"--grid: expected key=v1,v2,... (e.g. training.lr=0.01,0.1), got {item!r}"
            )
        if key in grid:
            raise ValueError(f"--grid: {key} is given twice")
        if any(key == p.rstrip(".") or key.startswith(p) for p in FORBIDDEN_PREFIXES):
            raise ValueError(
                f"--grid: {key} would change the data, the budgets, their budget store or the "
                "seed, i.e. who the units are and what they own; tune hyper-parameters of the "
                "training and the algorithm only"
            )
        vals = list(dict.fromkeys(_split_values(values)))
        if not vals:
            raise ValueError(f"--grid: {key} has no value")
        grid[key] = vals
    if not grid:
        raise ValueError("--grid: give at least one key=v1,v2,... to search over")
    return grid


def candidates_from_grid(grid: dict[str, list[str]]) -> list[list[str]]:
    """Every combination of the grid's values, as ``--set`` override lists (grid order)."""
    keys = list(grid)
    return [
        [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        for combo in itertools.product(*(grid[k] for k in keys))
    ]


@dataclass
class SearchPlan:
    """Everything decided before the first trial: candidates, distribution, cap, the cost."""

    candidates: list[list[str]]
    configs: list[Any]
    distribution: TrialDistribution
    cost: SearchCost
    fraction: float
    #: The observers the configuration promises every budget against (``privacy.adversary``).
    promised: tuple[str, ...] = ()
    #: Per ledger name (``client_<i>``, ``server``): its budget-store target and unit ids.
    targets: dict[str, tuple[Any, np.ndarray]] = field(default_factory=dict)

    def _checked(self) -> dict[str, np.ndarray]:
        over = self.cost.over_budget
        return {o: v for o, v in over.items() if not self.promised or o in self.promised}

    @property
    def refused(self) -> bool:
        return any(bool(v.any()) for v in self._checked().values())

    def refusal(self) -> str:
        c = self.cost
        parts = []
        for obs, over in self._checked().items():
            if over.any():
                ratio = float(np.max(c.epsilon[obs] / c.curves.budgets))
                parts.append(
                    f"{int(over.sum())} of {over.size} {c.curves.unit}s against the {obs} "
                    f"(up to {ratio:.3g}× their budget)"
                )
        hint = (
            "calibrate each trial for a smaller part of the budgets (--trial-budget-fraction, "
            f"now {self.fraction:g}), expect fewer trials, or search fewer candidates"
        )
        return (
            "--grid: the search would spend more than the budget of "
            + "; ".join(parts)
            + f" (E[K] = {self.distribution.mean:.3g} trials, at most {c.cap}); {hint}"
        )


@dataclass
class TuneResult:
    """The selected configuration and the search's privacy, as ``result.json`` holds them."""

    selected: list[str] | None
    accuracy: float | None
    run_dir: str | None
    privacy: PrivacySummary
    distribution: dict[str, Any]
    candidates: list[list[str]]
    trials: list[dict[str, Any]] = field(default_factory=list)
    out: str = ""
    #: The budget stores the search was charged to as one entry (enforced lifetime budgets).
    lifetime: dict[str, Any] | None = None

    @property
    def epsilon(self) -> dict[str, float | None]:
        """The largest ε any unit spends in the whole search, per observer."""
        return {o: self.privacy.spent_max(o) for o in self.privacy.observers}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "selected": self.selected,
            "final_accuracy": self.accuracy,
            "run": self.run_dir,
            "privacy": self.privacy.to_dict(),
            "distribution": self.distribution,
            "candidates": self.candidates,
            **({"lifetime": self.lifetime} if self.lifetime is not None else {}),
        }


def make_distribution(
    distribution: str, expected_trials: float, eta: float = 0.0
) -> TrialDistribution:
    """The public distribution of K with E[K] = ``expected_trials``."""
    if distribution in ("tnb", "truncated-negative-binomial"):
        return TruncatedNegativeBinomial.with_mean(expected_trials, eta=eta)
    if distribution == "poisson":
        return PoissonTrials(expected_trials)
    raise ValueError(f"--distribution: expected tnb or poisson, got {distribution!r}")


def _describe(dist: TrialDistribution, cap: int) -> dict[str, Any]:
    if isinstance(dist, TruncatedNegativeBinomial):
        d: dict[str, Any] = {"name": dist.name, "eta": dist.eta, "gamma": dist.gamma}
    else:
        d = {"name": dist.name, "mu": dist.mu}
    return {**d, "expected_trials": dist.mean, "max_trials": cap}


def _assemble(config: ExperimentConfig, federation: Federation) -> Assembly:
    import warnings

    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.simulation import config_for_federation

    config = config_for_federation(config, federation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return as_algorithm(config.algorithm).assemble(config, federation)


def _curves(
    config: ExperimentConfig,
    federation: Federation,
    targets: dict[str, tuple[Any, np.ndarray]] | None = None,
) -> UnitCurves:
    """The configuration's per-unit curves; ``targets`` (filled): each ledger's budget-store
    target and unit ids."""
    if not getattr(type(config.algorithm), "private", True):
        raise ValueError(
            f"--grid: algorithm {config.algorithm.name!r} is not differentially private; "
            "there is nothing to account"
        )
    run = _assemble(config, federation)
    ledgers = party_ledgers(run.server, run.clients)
    if targets is not None:
        from pdpfl.fl.lifetime import TARGET_ATTR

        holders: dict[str, ClientAlgorithm | ServerAlgorithm] = {
            f"client_{i}": c for i, c in run.clients.items()
        }
        holders["server"] = run.server
        for name, led in ledgers.items():
            targets[name] = (getattr(holders[name], TARGET_ATTR, None), np.asarray(led.ids))
    return ledger_curves(ledgers)


def _scaled(config: ExperimentConfig, base: UnitCurves, fraction: float, folder: Path) -> list[str]:
    """Overrides that calibrate a trial for ``fraction`` of every unit's budget."""
    if fraction == 1.0:
        return []
    algo = config.algorithm
    if hasattr(algo, "group_budgets"):  # IDP-FedAvg: the privacy groups' client budgets
        values = [float(v) * fraction for v in algo.group_budgets]
        return [f"algorithm.group_budgets=[{', '.join(repr(v) for v in values)}]"]
    from pdpfl.fl.rpdp.config import DpFedAvgConfig

    if isinstance(algo, DpFedAvgConfig) and base.unit == "record":
        from pdpfl.io import write_text

        folder.mkdir(parents=True, exist_ok=True)
        for party in np.unique(base.party):
            sel = base.party == party
            rows = ["record_id,epsilon"] + [
                f"{i},{float(b) * fraction!r}"
                for i, b in zip(base.ids[sel], base.budgets[sel], strict=True)
            ]
            write_text(folder / f"{party}.csv", "\n".join(rows) + "\n")
        out = [f"budgets.file={folder / 'client_{client_id}.csv'}"]
        uniform = getattr(algo, "uniform_epsilon", None)
        if callable(uniform):  # Minimum / Dropout / uniform: their public ε, scaled
            out.append(f"algorithm.epsilon={float(uniform(config)) * fraction!r}")
        return out
    raise ValueError(
        f"--trial-budget-fraction: not supported for algorithm {algo.name!r}; set the trials' "
        "privacy parameters in the config instead (e.g. privacy.noise_multiplier)"
    )


def plan_search(
    config: ExperimentConfig,
    grid: dict[str, list[str]],
    *,
    distribution: str = "poisson",
    expected_trials: float | None = None,
    eta: float = 0.0,
    max_trials: int | None = None,
    trial_budget_fraction: float = 1.0,
    federation: Federation | None = None,
    work_dir: str | Path | None = None,
) -> SearchPlan:
    """Candidates, distribution and every unit's ε for the search -- nothing is trained.

    The units and their budgets are those of ``config``; each candidate is ``config`` with one
    combination of the grid's values (and, with ``trial_budget_fraction`` f < 1, calibrated for
    f times every budget: rPDP-FL and its baselines through a per-record budgets file written to
    ``work_dir``, IDP-FedAvg through its group budgets).
    """
    from pdpfl.config import ConfigError, with_updates
    from pdpfl.runtime.simulation import load_federation_for

    if not (0.0 < trial_budget_fraction <= 1.0):
        raise ValueError(f"--trial-budget-fraction: must be in (0, 1], got {trial_budget_fraction}")
    candidates = candidates_from_grid(grid)
    fed = federation if federation is not None else load_federation_for(config)
    targets: dict[str, tuple[Any, np.ndarray]] = {}
    base = _curves(config, fed, targets)
    folder = Path(work_dir or ".") / "trial-budgets"
    scale = _scaled(config, base, float(trial_budget_fraction), folder)
    configs, curves = [], []
    for i, overrides in enumerate(candidates):
        try:
            cfg = with_updates(config, [*overrides, *scale])
        except ConfigError as err:
            raise ValueError(
                f"--grid: candidate {i + 1} ({' '.join(overrides)}): " + "; ".join(err.problems)
            ) from None
        configs.append(cfg)
        curves.append(_curves(cfg, fed))
    mean = float(expected_trials) if expected_trials is not None else float(max(2, len(candidates)))
    dist = make_distribution(distribution, mean, eta)
    cost = search_cost(base, curves, dist, max_trials)
    from pdpfl.ledger import observers_of

    promised = tuple(o for o in observers_of(config.privacy.adversary) if o in cost.epsilon)
    return SearchPlan(
        candidates,
        configs,
        dist,
        cost,
        float(trial_budget_fraction),
        promised or cost.curves.observers,
        targets,
    )


def lifetime_enforced(config: ExperimentConfig) -> bool:
    """Whether the data's lifetime budgets are enforced (no ``lifetime.allow_respend``)."""
    lifetime = getattr(config, "lifetime", None)
    return lifetime is not None and not bool(getattr(lifetime, "allow_respend", False))


def charge_stores(config: ExperimentConfig, plan: SearchPlan) -> dict[str, Any]:
    """Charge the whole search to every party's budget store as one sealed entry (module
    docstring), before any trial: every store is opened and checked first, so a refusal
    (:class:`TuneRefused`, naming the units and their budgets) charges none. Returns what
    ``result.json`` says about the stores."""
    import secrets
    import time

    from pdpfl.ledger.lifetime import SearchOverBudget, charge_search

    cost, c = plan.cost, plan.cost.curves
    run_id = f"tune-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    meta = {
        "run": run_id,
        "started": time.time(),
        "algorithm": str(config.algorithm.name),
        "name": str(getattr(config, "name", "")),
        "unit": c.unit,
        "trials": plan.distribution.mean,
        "max_trials": cost.cap,
    }
    check = plan.promised or c.observers
    tail = {"third-party": cost.tail, "server": 0.0}
    opened: list[tuple[Any, dict[str, Any]]] = []
    try:
        for party in dict.fromkeys(c.party.tolist()):
            target, ids = plan.targets.get(party, (None, None))
            if target is None or ids is None:
                raise TuneRefused(
                    f"lifetime: the units of {party} have no budget store to charge the search to"
                )
            rows = np.flatnonzero(c.party == party)
            store = target.store().open(lock=True, wait_s=target.options.wait_s)
            opened.append(
                (
                    store,
                    dict(
                        meta={
                            **meta,
                            **{k: v for k, v in target.description.items() if k != "ids"},
                        },
                        ids=ids,
                        budgets=c.budgets[rows],
                        curves={o: cost.search_rdp[o][rows] for o in c.observers},
                        orders=ORDERS,
                        delta=float(np.min(c.delta[rows])),
                        tail={o: tail[o] for o in c.observers},
                        check=check,
                    ),
                )
            )
        try:
            for store, args in opened:  # check every store first: a refusal charges none
                charge_search(store, **args, write=False)
        except SearchOverBudget as err:
            raise TuneRefused(
                f"lifetime: {err}; calibrate each trial for a smaller part of the budgets "
                "(--trial-budget-fraction), expect fewer trials, or search fewer "
                "candidates"
            ) from None
        for store, args in opened:
            charge_search(store, **args)
    finally:
        for store, _ in opened:
            store.close()
    return {
        "enforced": True,
        "entry": run_id,
        "stores": [{"party": s.party, "dataset": s.key} for s, _ in opened],
    }


def _draw(config: ExperimentConfig, plan: SearchPlan) -> tuple[int, list[int]]:
    """K (capped) and each trial's candidate, from the tuner's own randomness."""
    from pdpfl.randomness import make_randomness

    rand = make_randomness(config.randomness, config.seed)
    u = float(rand.stream("tune-trials", 0).uniform(1)[0])
    k = min(int(plan.distribution.sample(u)), plan.cost.cap)
    picks = rand.stream("tune-candidates", 0).uniform(max(k, 1))
    n = len(plan.candidates)
    return k, [min(int(p * n), n - 1) for p in picks[:k]]


def _save_search_ledger(path: Path, cost: SearchCost) -> None:
    """Per unit: its id, party, budget, δ and per observer the search's RDP curve, one trial's
    curve, the extra curve and the ε -- what a unit's ledger or budget store charges."""
    from pdpfl.io import save_npz

    c = cost.curves
    arrays: dict[str, np.ndarray] = {
        "orders": ORDERS,
        "party": c.party.astype(str),
        "ids": c.ids.astype(str),
        "budgets": c.budgets,
        "delta": c.delta,
    }
    extra = cost.extra_rdp
    for obs in c.observers:
        key = obs.replace("-", "_")
        arrays[f"rdp_search_{key}"] = cost.search_rdp[obs]
        arrays[f"rdp_trial_{key}"] = cost.trial_rdp[obs]
        arrays[f"rdp_extra_{key}"] = extra[obs]
        arrays[f"epsilon_{key}"] = cost.epsilon[obs]
    save_npz(path, **arrays)


def tune(
    config: ExperimentConfig,
    grid: dict[str, list[str]] | Sequence[str],
    out: str | Path,
    *,
    distribution: str = "poisson",
    expected_trials: float | None = None,
    eta: float = 0.0,
    max_trials: int | None = None,
    trial_budget_fraction: float = 1.0,
    overwrite: bool = False,
    federation: Federation | None = None,
    log_fn: Callable[[str], None] | None = None,
) -> TuneResult:
    """Run a private random search over ``grid`` and return the selected configuration with
    the whole search's ε (see the module docstring). Raises :class:`TuneRefused` before any
    trial if some unit's budget -- its lifetime budget, when the data's budgets are enforced
    (:func:`charge_stores`) -- cannot pay for the search."""
    from pdpfl.io import write_json
    from pdpfl.runtime.outputs import prepare_output_dir
    from pdpfl.runtime.simulation import load_federation_for, run_simulation

    say = log_fn or log.info
    grid = parse_grid(list(grid)) if not isinstance(grid, dict) else grid
    root = prepare_output_dir(
        out, overwrite=overwrite, option="--out", outputs=OUTPUTS, flags=("--force", "--resume")
    )
    fed = federation if federation is not None else load_federation_for(config)
    plan = plan_search(
        config,
        grid,
        distribution=distribution,
        expected_trials=expected_trials,
        eta=eta,
        max_trials=max_trials,
        trial_budget_fraction=trial_budget_fraction,
        federation=fed,
        work_dir=root,
    )
    summary = plan.cost.summary()
    described = _describe(plan.distribution, plan.cost.cap)
    if plan.refused:
        raise TuneRefused(plan.refusal())
    lifetime = None
    configs = list(plan.configs)
    if lifetime_enforced(config):
        lifetime = charge_stores(config, plan)  # before anything is trained or released
        from pdpfl.config import with_updates

        scratch = root / "trial-stores"  # the trials are covered by the search's entry
        configs = [
            with_updates(cfg, [f"lifetime.store={scratch}", "lifetime.allow_respend=true"])
            for cfg in configs
        ]
    (root / "ledgers").mkdir(exist_ok=True)
    _save_search_ledger(root / "ledgers" / "search.npz", plan.cost)
    k, picks = _draw(config, plan)
    say(
        f"tune: {len(plan.candidates)} candidate(s), E[K] = {plan.distribution.mean:.3g}; "
        f"the whole search spends at most ε = "
        + ", ".join(f"{summary.spent_max(o):.4g} ({o})" for o in summary.observers)
    )
    trials: list[dict[str, Any]] = []
    best: tuple[float, int] | None = None
    for j, c in enumerate(picks):
        run_dir = root / "trials" / f"trial-{j + 1:03d}"
        say(f"tune: trial {j + 1}: {' '.join(plan.candidates[c])}")
        try:
            s = run_simulation(configs[c], run_dir, progress=False, overwrite=True, federation=fed)
            acc = s.get("final_accuracy")
        except Exception as err:  # a diverged trial scores nothing and is not selected
            from pdpfl.errors import TrainingDiverged

            if not isinstance(err, TrainingDiverged):
                raise
            acc = None
        score = float(acc) if acc is not None and math.isfinite(float(acc)) else -math.inf
        trials.append(
            {
                "trial": j + 1,
                "candidate": c,
                "overrides": plan.candidates[c],
                "final_accuracy": acc,
                "run": str(run_dir.relative_to(root)),
            }
        )
        if best is None or score > best[0]:
            best = (score, j)
    selected = None if best is None or best[0] == -math.inf else trials[best[1]]
    result = TuneResult(
        selected=None if selected is None else list(selected["overrides"]),
        accuracy=None if selected is None else selected["final_accuracy"],
        run_dir=None if selected is None else selected["run"],
        privacy=summary,
        distribution=described,
        candidates=plan.candidates,
        trials=trials,
        out=str(root),
        lifetime=lifetime,
    )
    write_json(root / "result.json", result.to_dict())
    write_json(
        root / "tune.json",
        {
            **result.to_dict(),
            "note": "the operator's record: the number of trials and the other trials' scores "
            "are not covered by the search's guarantee (publish result.json only)",
            "trials": trials,
            "trial_budget_fraction": plan.fraction,
        },
    )
    return result
