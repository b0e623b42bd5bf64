"""Building blocks shared by the algorithm modules (no I/O, no runtime).

The builders take plain values, never the whole configuration: an algorithm's config section
reads the experiment config once, at its edge (``setup``/``server``/``client``/its checks), into
the frozen values below -- :class:`ModelSource` (what x⁰ is built from) and :class:`BudgetSource`
(where a silo's budgets come from) -- and hands those on, as dp-accounting's builders take
numbers and jax_privacy's ``DPExecutionPlan`` is built once from its config.

* :func:`federation_info` -- the public :class:`~pdpfl.fl.api.FederationInfo` of a federation;
* :func:`client_budgets` -- a silo's per-record budgets, computed on the silo;
* :func:`public_budget_statistics` -- the budget scenario's public (minimum, mean);
* :func:`initial_params` / :func:`silo_model` -- the public initial model x⁰;
* :func:`noise_source_problems` -- exactly one of σ and ε_max configured;
* :func:`party_randomness` -- one party's mechanism randomness (secure unless the config
  explicitly asks for the reproducible research mode);
* :func:`checked_noise` -- the noise description a party is about to draw from, after checking
  that it is what its ledger charges (:mod:`pdpfl.privacy.noise`);
* :func:`accountant_problems` -- ``privacy.accountant`` refused (naming the accountants that
  can) when it cannot interpret the events an algorithm charges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pdpfl.fl.api import FederationInfo, Params
from pdpfl.privacy.mechanisms import Mechanism, outline
from pdpfl.privacy.noise import (
    CentralDiscreteGaussianNoise,
    GaussianNoise,
    JointGaussian,
    check_charged,
)
from pdpfl.privacy.registry import accountant_names, make_accountant

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.config import BudgetsConfig, ExperimentConfig, ModelConfig, PrivacyConfig
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.ledger import PrivacyLedger
    from pdpfl.randomness import Randomness

N = TypeVar("N", bound=GaussianNoise | JointGaussian | CentralDiscreteGaussianNoise)

__all__ = [
    "BudgetSource",
    "ModelSource",
    "accountant_problems",
    "checked_noise",
    "client_budgets",
    "federation_info",
    "initial_params",
    "noise_for_max_budget_cached",
    "noise_source_problems",
    "party_randomness",
    "public_budget_statistics",
    "silo_model",
    "training_device",
]


@dataclass(frozen=True)
class ModelSource:
    """What the public initial model x⁰ is built from: the registered model ``name`` with its
    ``options`` (``model:``), the run's ``seed`` (x⁰ is public) and where the silos train
    (``training.device``)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    device: str = "cpu"

    @classmethod
    def of(cls, model: ModelConfig, *, seed: int, device: str) -> ModelSource:
        """From the ``model:`` section, the run's seed and ``training.device``."""
        return cls(model.name, dict(model.options), int(seed), device)


@dataclass(frozen=True)
class BudgetSource:
    """Where every silo's per-record budgets come from: a ``budgets.file`` (per silo through
    its placeholders), or the ``scenario`` with its ``params`` drawn with the run's ``seed``."""

    scenario: str = "three-levels"
    params: Mapping[str, Any] = field(default_factory=dict)
    file: str | None = None
    on_unmatched: str = "error"
    seed: int = 0

    @classmethod
    def of(cls, budgets: BudgetsConfig, *, seed: int) -> BudgetSource:
        """From the ``budgets:`` section and the run's seed."""
        return cls(
            budgets.scenario, dict(budgets.params), budgets.file, budgets.on_unmatched, int(seed)
        )


def federation_info(
    federation: Federation, config: ExperimentConfig | None = None
) -> FederationInfo:
    """Public facts of ``federation``: shapes, ids, names (+ sizes, per-user histograms only if
    the config declares them public)."""
    sizes = None
    if config is not None and config.data.public_silo_sizes:
        sizes = tuple(int(len(c.y_train)) for c in federation.clients)
    hist = None
    if config is not None and getattr(config.data, "public_user_histograms", False):
        hist = user_histogram(federation, config)
    return FederationInfo(
        input_shape=tuple(int(s) for s in federation.input_shape),
        num_classes=int(federation.num_classes),
        client_ids=tuple(range(len(federation.clients))),
        client_names=tuple(str(c.name) for c in federation.clients),
        silo_sizes=sizes,
        user_histogram=hist,
    )


def user_histogram(federation: Federation, config: ExperimentConfig) -> tuple[tuple[int, ...], ...]:
    """``n_{s,u}``: training records of user ``u`` in silo ``s`` (``data.options.num_users``
    users). What silos disclose when ``data.public_user_histograms`` is true."""
    num_users = int(dict(config.data.options).get("num_users") or 0)
    rows = []
    for c in federation.clients:
        if c.user_ids is None:
            raise ValueError(
                "data.public_user_histograms: the federation has no user ids; set "
                "data.options.num_users"
            )
        ids = np.asarray(c.user_ids, dtype=np.int64)
        size = max(num_users, int(ids.max()) + 1 if ids.size else 0)
        rows.append(tuple(int(v) for v in np.bincount(ids, minlength=size)))
    width = max(len(r) for r in rows)
    return tuple(r + (0,) * (width - len(r)) for r in rows)


def client_budgets(source: BudgetSource, client_id: int, client_data: ClientData) -> np.ndarray:
    """ε of one silo's training records (computed on the silo; never sent anywhere).

    From ``source.file`` (``{client_id}``/``{client}`` in the path are replaced; a ``.csv``
    with the columns ``record_id`` and ``epsilon`` is matched to the silo's records by id, any
    other file is read in the silo's train order) or drawn from the scenario with
    ``numpy_generator(seed, "budgets", client_id)`` -- the budgets are simulated users' choices,
    i.e. part of the data, not mechanism randomness.
    """
    from pdpfl import budgets as budgets_mod
    from pdpfl.data.user import is_budget_table, silo_budgets
    from pdpfl.seeding import numpy_generator

    n = len(client_data.y_train)
    if n == 0:
        raise ValueError(
            f"data: silo {client_id} ({getattr(client_data, 'name', client_id)!r}) has no "
            "training records, so it has no budgets; use fewer silos or leave it out"
        )
    if source.file is not None:
        path = source.file.format(client_id=client_id, client=client_data.name)
        if is_budget_table(path):
            own = path != source.file  # this silo's own file: check its ids here
            return silo_budgets(
                path,
                client_data.record_ids,
                silo=client_data if own else None,
                on_unmatched=source.on_unmatched,
            )
        try:
            values = np.asarray(budgets_mod.load_budgets(path), dtype=float)
        except FileNotFoundError:
            raise ValueError(f"budgets.file: {path} does not exist (silo {client_id})") from None
        if values.shape != (n,):
            raise ValueError(
                f"budgets.file: silo {client_id} has {n} records but {path} has {values.size}"
            )
        return values
    scenario = budgets_mod.make_scenario(source.scenario, **source.params)
    rng = numpy_generator(source.seed, "budgets", int(client_id))
    return np.asarray(
        budgets_mod.assign_budgets(scenario, n, rng, labels=client_data.y_train), dtype=float
    )


def public_budget_statistics(source: BudgetSource) -> tuple[float | None, float | None]:
    """(minimum, mean) of the budget *scenario* (public); (None, None) for files."""
    from pdpfl import budgets as budgets_mod

    if source.file is not None:
        return None, None
    scenario = budgets_mod.make_scenario(source.scenario, **source.params)
    return budgets_mod.public_statistics(scenario)


def training_device(device: str) -> torch.device:
    """The device ``training.device`` names, checked on this machine
    (:func:`pdpfl.dp.device.training_device_for`)."""
    from pdpfl.dp.device import training_device_for

    return training_device_for(device)


def silo_model(
    model: ModelSource, info: FederationInfo, *, on_device: bool = True
) -> torch.nn.Module:
    """The model of ``model`` with the public initialisation x⁰ (seeded: x⁰ is public).

    x⁰ is drawn on the CPU, so it is the same on every device; with ``on_device`` the model is
    then moved to :func:`training_device` (where the silo trains it).
    """
    from pdpfl.models import initial_model

    built = initial_model(
        model.name, info.input_shape, info.num_classes, dict(model.options), seed=model.seed
    )
    if on_device:
        dev = training_device(model.device)
        if dev.type != "cpu":
            built.to(dev)
    return built


def initial_params(model: ModelSource, info: FederationInfo) -> Params:
    """x⁰: the trainable parameters of :func:`silo_model`."""
    from pdpfl.models import get_params

    return get_params(silo_model(model, info, on_device=False))


def noise_source_problems(privacy: PrivacyConfig, meaning: str) -> list[str]:
    """Exactly one of ``privacy.noise_multiplier`` and ``privacy.epsilon_max`` must be set;
    ``meaning`` says what ε_max calibrates σ to (it differs per algorithm)."""
    if privacy.noise_multiplier is None and privacy.epsilon_max is None:
        return [f"privacy: set privacy.noise_multiplier (σ) or privacy.epsilon_max ({meaning})"]
    if privacy.noise_multiplier is not None and privacy.epsilon_max is not None:
        return ["privacy: set only one of privacy.noise_multiplier and privacy.epsilon_max"]
    return []


def party_randomness(config: ExperimentConfig, party: str) -> Randomness:
    """The mechanism randomness of one party (``"server"``, ``"silo-3"``, ...).

    ``randomness: secure`` (default): a fresh secret key, different for every party and every
    process. ``randomness: reproducible``: streams derived from ``config.seed`` (the stream
    names include the party's role and index, so parties still draw different numbers).
    """
    from pdpfl.randomness import make_randomness  # torch: not needed to parse a config

    return make_randomness(config.randomness, config.seed)


@lru_cache(maxsize=64)
def noise_for_max_budget_cached(
    epsilon_max: float,
    delta: float,
    steps: int,
    rounds: int | None,
    client_rate: float,
    adversary: str,
    accountant: str = "rdp",
    central_noise: str = "continuous",
) -> float:
    """σ at which q = 1 spends exactly ε_max under ``accountant`` (a pure function of public
    parameters; memoized because ``pdpfl compare`` builds several methods with the same
    mechanism); ``central_noise: discrete`` calibrates against the central discrete plan."""
    from pdpfl.calibration import noise_for_max_budget
    from pdpfl.privacy.plan import TrainingPlan

    template = TrainingPlan(
        noise_multiplier=1.0,
        delta=delta,
        steps=steps,
        rounds=rounds,
        client_rate=client_rate,
        noise="discrete" if central_noise == "discrete" else "continuous",
    )
    return float(
        noise_for_max_budget(epsilon_max, template, adversary=adversary, accountant=accountant)
    )


def checked_noise(noise: N, ledger: PrivacyLedger | None, what: str) -> N:
    """``noise`` after checking that every unit of ``ledger`` is charged its multiplier.

    The ledger's mechanism was built from this description when the party was built; a
    description replaced (or altered) since then is refused before any noise is drawn
    (:class:`~pdpfl.privacy.noise.NoiseBindingError`). ``what`` names the party.
    """
    if ledger is not None:
        charged = np.asarray(ledger.noise_multipliers, dtype=np.float64)
        other = charged[charged != noise.noise_multiplier]
        if other.size:
            check_charged(noise, float(other[0]), what=what)
    return noise


def accountant_problems(
    accountant: str, events: Sequence[Mechanism] | None, what: str
) -> list[str]:
    """``privacy.accountant`` (the registered ``accountant``) must interpret every event the
    algorithm charges.

    ``events`` are the algorithm's round events for its configuration (one per observer and
    kind of round; ``None``: the algorithm is not accounted by an event, e.g. a Rényi filter,
    which only ``rdp`` interprets). Returns one ``privacy.accountant: ...`` problem naming the
    registered (rigorous) accountants that can, or nothing.
    """
    name = accountant
    if events is None:
        if name == "rdp":
            return []
        return [
            f"privacy.accountant: {what} is accounted by its individual Rényi filter, which "
            f"only rdp interprets; got {name!r} (set privacy.accountant: rdp)"
        ]
    wanted = list(events)
    missing = [e for e in wanted if not make_accountant(name).supports(e)]
    if not missing:
        return []
    able = [
        n
        for n in accountant_names(rigorous=True)
        if all(make_accountant(n).supports(e) for e in wanted)
    ]
    return [
        f"privacy.accountant: {name} cannot interpret {outline(missing[0])}, the event {what} "
        f"charges; choose one of {', '.join(able) or '(none registered)'}"
    ]
