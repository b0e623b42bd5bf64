"""Run a paper's experiments through pdpfl's simulator and collect what the reports need.

An :class:`Experiment` is a shipped config (``configs/<name>.yaml``, the schema of
``pdpfl run``), experiment-level ``--set`` overrides, and methods (``pdpfl compare`` method
names plus overrides) run over seeds. Every run goes through
:func:`pdpfl.runtime.simulation.run_simulation` into ``OUT/runs/<experiment>/<method>/seed<N>``;
its accuracy per round comes from ``metrics.jsonl`` and every ε from the run's typed privacy
summary (:class:`pdpfl.ledger.PrivacySummary`). Federations are loaded once per seed and data
section. A dataset whose files are not on disk is skipped -- nothing is downloaded -- and the
report names the command that fetches it.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pdpfl.ledger import PrivacySummary

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation

T = TypeVar("T")

__all__ = [
    "TIERS",
    "Context",
    "Experiment",
    "Method",
    "RunResult",
    "config_path",
    "missing_files",
    "public_split",
]

#: The tiers, cheapest first: ``smoke`` (tests: one tiny experiment per paper), ``quick``
#: (every experiment shortened; all four papers in under 15 minutes on 2 cores), ``full``
#: (the papers' settings that the data allows).
TIERS: tuple[str, ...] = ("smoke", "quick", "full")


@dataclass(frozen=True)
class Method:
    """One compared method: a ``pdpfl compare`` method name plus overrides, and its label."""

    label: str
    method: str
    overrides: tuple[str, ...] = ()
    key: str = ""

    @property
    def slug(self) -> str:
        return self.key or self.method.replace(":", "-")

    def config_overrides(self) -> list[str]:
        from pdpfl.config import get_method

        return [*get_method(self.method)[1], *self.overrides]


@dataclass(frozen=True)
class Experiment:
    """A config, its experiment-level overrides, the methods and the seeds."""

    key: str
    config: str
    methods: tuple[Method, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    dataset: str = ""
    metric: str = "accuracy"


@dataclass
class RunResult:
    """One finished run: its summary, accuracy per round and typed privacy summary."""

    experiment: str
    method: str
    label: str
    seed: int
    summary: dict[str, Any]
    curve: list[float]
    privacy: PrivacySummary | None
    wall_seconds: float
    run_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final(self) -> float:
        return self.curve[-1] if self.curve else math.nan

    @property
    def n_test(self) -> int:
        """Test records behind the last round's accuracy (the silos' evaluations summed)."""
        clients = self.metrics[-1].get("clients") if self.metrics else None
        if self.metrics and "test_records" in self.metrics[-1]:  # pooled clients: the total
            return int(self.metrics[-1]["test_records"])
        if not isinstance(clients, dict):
            return 0
        return int(sum(int(c.get("n", 0)) for c in clients.values() if isinstance(c, dict)))

    @property
    def train_seconds(self) -> float:
        return float(self.summary.get("seconds", math.nan))

    def epsilon_curve(self, observer: str = "third-party") -> list[float]:
        """The largest ε spent after each round (from each round's typed summary)."""
        out = []
        for m in self.metrics:
            p = m.get("privacy")
            if isinstance(p, dict) and p.get("schema"):
                v = PrivacySummary.from_dict(p).spent_max(observer)
                out.append(math.nan if v is None else float(v))
        return out


def config_path(name: str) -> Path:
    """The shipped config ``configs/<name>.yaml``."""
    ref = resources.files("pdpfl.reproduce").joinpath("configs", f"{name}.yaml")
    path = Path(str(ref))
    if not path.is_file():
        raise FileNotFoundError(f"reproduce config {name!r} not found at {path}")
    return path


def missing_files(dataset: str, data_dir: str | None) -> list[str]:
    """Files of ``dataset`` found in neither ``data_dir``, ``$PDPFL_DATA_DIR`` nor the cache
    (no download is attempted)."""
    from pdpfl.data.registry import file_specs
    from pdpfl.data.sources import find_local

    try:
        specs = file_specs(dataset)
    except (KeyError, ValueError):
        return []
    return [s.filename for s in specs if find_local(s, data_dir) is None]


def public_split(federation: Federation, seed: int = 0) -> Federation:
    """A tuning federation made of each silo's *test* records only (pdpfl treats test records
    as public: they are not covered by the training guarantee): the first half of a seeded
    shuffle trains, the second half validates. No training record of any silo is in it."""
    from pdpfl.data.federation import ClientData, Federation

    rng = np.random.default_rng(seed)
    clients = []
    for c in federation.clients:
        order = rng.permutation(len(c.y_test))
        half = max(1, len(order) // 2)
        tr, va = order[:half], order[half:]
        ids = (
            np.asarray(c.test_record_ids)[tr]
            if c.test_record_ids is not None
            else np.arange(tr.size, dtype=np.int64)
        )
        clients.append(
            ClientData(
                name=f"{c.name}-public",
                x_train=c.x_test[tr],
                y_train=c.y_test[tr],
                x_test=c.x_test[va],
                y_test=c.y_test[va],
                record_ids=ids,
            )
        )
    return Federation(
        name=f"{federation.name}-public-split",
        clients=clients,
        input_shape=federation.input_shape,
        num_classes=federation.num_classes,
        feature_names=federation.feature_names,
        class_names=federation.class_names,
    )


@dataclass
class Context:
    """One ``pdpfl reproduce`` invocation: tier, seeds, data folder, output folder, logging."""

    tier: str
    out: Path
    data_dir: str | None = None
    seeds: tuple[int, ...] | None = None
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr))
    federations: dict[str, Federation] = field(default_factory=dict)
    runs: int = 0
    #: One plain record per finished run (``results.json``).
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier: expected one of {', '.join(TIERS)}, got {self.tier!r}")

    def pick(self, smoke: T, quick: T, full: T) -> T:
        """The value of the current tier."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.tier]

    def seeds_for(self, default: Sequence[int]) -> tuple[int, ...]:
        """The user's ``--seeds`` if given, else the tier's default."""
        return tuple(self.seeds) if self.seeds else tuple(default)

    def load(self, name: str, overrides: Iterable[str]) -> ExperimentConfig:
        from pdpfl.config import load_config

        extra = [f"data.data_dir={self.data_dir}"] if self.data_dir else []
        return load_config(str(config_path(name)), [*extra, *overrides])

    def federation(self, config: ExperimentConfig) -> Federation:
        from pdpfl.runtime.simulation import load_federation_for

        key = json.dumps([config.data.model_dump(mode="json"), config.seed], sort_keys=True)
        if key not in self.federations:
            self.federations[key] = load_federation_for(config)
        return self.federations[key]

    def run_one(
        self,
        exp: Experiment,
        method: Method,
        seed: int,
        *,
        federation: Federation | None = None,
        extra: Sequence[str] = (),
        subdir: str = "",
    ) -> RunResult:
        """One (method, seed) of ``exp`` through :func:`run_simulation`."""
        from pdpfl.runtime.loop import read_metrics
        from pdpfl.runtime.simulation import run_simulation

        config = self.load(
            exp.config, [*exp.overrides, *method.config_overrides(), *extra, f"seed={seed}"]
        )
        fed = federation if federation is not None else self.federation(config)
        run_dir = self.out / "runs" / exp.key / (subdir or method.slug) / f"seed{seed}"
        t0 = time.perf_counter()
        summary = run_simulation(config, run_dir, progress=False, federation=fed, overwrite=True)
        wall = time.perf_counter() - t0
        metrics = list(read_metrics(run_dir))
        curve = [
            float(m[exp.metric]) if m.get(exp.metric) is not None else math.nan for m in metrics
        ]
        privacy = summary.get("privacy")
        typed = PrivacySummary.from_dict(privacy) if isinstance(privacy, dict) else None
        self.runs += 1
        eps = None if typed is None else typed.headline_epsilon(config.privacy.adversary)
        self.records.append(
            {
                "experiment": exp.key,
                "method": method.slug,
                "label": method.label,
                "seed": seed,
                "final": curve[-1] if curve else None,
                "curve": curve,
                "epsilon": None if eps is None or not math.isfinite(eps) else eps,
                "private": None if typed is None else typed.private,
                "over_budget": None if typed is None else typed.over_budget_any("both"),
                "seconds": round(float(summary.get("seconds", math.nan)), 3),
                "run_dir": str(run_dir),
            }
        )
        self.log(
            f"  {exp.key} {method.label} seed {seed}: "
            f"{exp.metric} {curve[-1] if curve else math.nan:.4f} ({wall:.1f}s)"
        )
        return RunResult(
            exp.key, method.slug, method.label, seed, summary, curve, typed, wall, run_dir, metrics
        )

    def tune(
        self,
        exp: Experiment,
        method: Method,
        param: str,
        grid: Sequence[Any],
        *,
        seed: int = 0,
        extra: Sequence[str] = (),
    ) -> tuple[Any, list[tuple[Any, float]]]:
        """The value of ``param`` in ``grid`` with the best final validation accuracy of
        ``method`` on :func:`public_split` (test records only -- never a training record),
        and every (value, accuracy) tried."""
        config = self.load(
            exp.config, [*exp.overrides, *method.config_overrides(), *extra, f"seed={seed}"]
        )
        fed = public_split(self.federation(config), seed)
        tuning = Experiment(
            f"{exp.key}-tuning",
            exp.config,
            exp.methods,
            (seed,),
            exp.overrides,
            exp.dataset,
            exp.metric,
        )
        scores = []
        for value in grid:
            r = self.run_one(
                tuning,
                method,
                seed,
                federation=fed,
                extra=[*extra, f"{param}={value}"],
                subdir=f"{method.slug}/{param}={value}",
            )
            scores.append((value, r.final))
        best = max(scores, key=lambda t: t[1] if math.isfinite(t[1]) else -math.inf)
        return best[0], scores

    def run(self, exp: Experiment) -> list[RunResult]:
        """Every (method, seed) of ``exp``, seeds outermost (one federation per seed)."""
        return [self.run_one(exp, m, s) for s in exp.seeds for m in exp.methods]


def by_method(results: Iterable[RunResult]) -> dict[str, list[RunResult]]:
    """Results grouped by method label (first-seen order)."""
    out: dict[str, list[RunResult]] = {}
    for r in results:
        out.setdefault(r.label, []).append(r)
    return out
