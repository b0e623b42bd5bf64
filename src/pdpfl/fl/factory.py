"""Build the server and the silos of an experiment from its validated config.

The Flower ClientApp calls :func:`build_client` with only its own silo's data; the in-process
simulator calls :func:`build_federation_algorithms` with the whole federation. Both go through
:func:`publish`, so every silo receives the very same public mechanism (σ, δ, T, τ, λ, C and the
rate estimator F).

Per-record budgets are assigned on each silo from ``numpy_generator(seed, "budgets", client_id)``
(:func:`client_budgets`); they never leave it. The uniform baselines need one public number
ε_min (Minimum) or ε_mod = mean budget (Dropout); the paper treats it as known. pdpfl takes it from
``algorithm.epsilon`` when set, and otherwise computes it from all silos' budgets when the
federation is built (``meta["budget_min"]``/``meta["budget_mean"]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pdpfl.config import ExperimentConfig
from pdpfl.fl.publication import Publication
from pdpfl.fl.rpdp import RpdpClient, RpdpServer
from pdpfl.seeding import derive_seed, numpy_generator

#: Algorithms built here (``centralized`` runs on pooled data, see :mod:`pdpfl.fl.baselines`).
FEDERATED_ALGORITHMS = ("rpdp", "minimum", "dropout", "privacy-free", "uniform")


def federation_meta(federation: Any, config: ExperimentConfig | None = None) -> dict[str, Any]:
    """Public facts about a federation (shapes, ids) plus, with ``config``, the budget summary."""
    meta: dict[str, Any] = {
        "input_shape": tuple(int(s) for s in federation.input_shape),
        "num_classes": int(federation.num_classes),
        "client_ids": list(range(len(federation.clients))),
        "client_names": [c.name for c in federation.clients],
    }
    if config is not None:
        all_budgets = np.concatenate(
            [client_budgets(config, i, c) for i, c in enumerate(federation.clients)]
        )
        meta["budget_min"] = float(all_budgets.min())
        meta["budget_mean"] = float(all_budgets.mean())
    return meta


def client_budgets(config: ExperimentConfig, client_id: int, client_data: Any) -> np.ndarray:
    """ε_ij of one silo's training records (computed on the silo)."""
    from pdpfl import budgets as budgets_mod

    n = len(client_data.y_train)
    if config.budgets.file is not None:
        # One file per silo: ``{client_id}``/``{client}`` in the path are replaced.
        path = config.budgets.file.format(client_id=client_id, client=client_data.name)
        values = np.asarray(budgets_mod.load_budgets(path), dtype=float)
        if values.shape != (n,):
            raise ValueError(
                f"budgets.file: client {client_id} has {n} records but {path} has {values.size}"
            )
        return values
    scenario = budgets_mod.make_scenario(config.budgets.scenario, **config.budgets.params)
    rng = numpy_generator(config.seed, "budgets", int(client_id))
    return np.asarray(
        budgets_mod.assign_budgets(scenario, n, rng, labels=client_data.y_train), dtype=float
    )


def _plan(config: ExperimentConfig, sigma: float):
    from pdpfl.privacy.plan import TrainingPlan

    return TrainingPlan(
        noise_multiplier=float(sigma),
        delta=config.privacy.delta,
        steps=config.training.local_steps,
        rounds=config.training.rounds,
        client_rate=config.training.client_rate,
    )


#: Memo of the data-independent calibrations (σ search, estimator fit): ``pdpfl compare``
#: builds several methods with the same mechanism, and these depend only on public parameters.
_MEMO: dict[tuple, Any] = {}


def _memo(key: tuple, compute: Any) -> Any:
    if key not in _MEMO:
        if len(_MEMO) > 64:
            _MEMO.clear()
        _MEMO[key] = compute()
    return _MEMO[key]


def _mechanism_key(config: ExperimentConfig) -> tuple:
    tr, pv = config.training, config.privacy
    return (pv.delta, tr.local_steps, tr.rounds, tr.client_rate, pv.adversary)


def noise_multiplier(config: ExperimentConfig) -> float:
    """σ: ``privacy.noise_multiplier``, or the σ at which q = 1 spends exactly ε_max."""
    if config.privacy.noise_multiplier is not None:
        return float(config.privacy.noise_multiplier)
    from pdpfl.calibrate import noise_for_max_budget

    eps_max = config.privacy.epsilon_max
    return float(_memo(
        ("sigma", eps_max, *_mechanism_key(config)),
        lambda: noise_for_max_budget(
            eps_max, _plan(config, 1.0), adversary=config.privacy.adversary
        ),
    ))


def _estimator(config: ExperimentConfig, sigma: float) -> Any:
    from pdpfl.calibrate import fit_estimator

    method = config.privacy.calibration
    return _memo(
        ("estimator", sigma, method, *_mechanism_key(config)),
        lambda: fit_estimator(
            _plan(config, sigma), method=method, adversary=config.privacy.adversary
        ),
    )


def publish(config: ExperimentConfig, meta: dict[str, Any]) -> Publication:
    """The public mechanism of ``config.algorithm.name`` (Algorithm 3, initialization).

    ``rpdp``: σ and the fitted estimator F (``privacy.calibration``).
    ``minimum`` / ``dropout`` / ``uniform``: uniform DP-FedAvg at ε = ε_min / ε_mod / the given ε.
    By default they keep rPDP-FL's σ and give every kept record q = F(ε) (same mechanism, one
    rate); with ``algorithm.sampling_rate`` they use that fixed q and the σ that makes q spend
    exactly ε (``noise_for_uniform_rate``). Records with ε_ij < ε are dropped (q = 0).
    ``privacy-free``: FedAvg without clipping or noise.
    """
    if "publication" in meta:
        pub = meta["publication"]
        return pub if isinstance(pub, Publication) else Publication.from_dict(pub)
    algo, tr, pv = config.algorithm, config.training, config.privacy
    common = dict(
        delta=pv.delta,
        local_steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        max_grad_norm=tr.max_grad_norm,
        adversary=pv.adversary,
        calibration=pv.calibration,
    )
    if algo.name == "privacy-free":
        return Publication(mode="non-private", noise_multiplier=0.0, **common)
    if algo.name == "rpdp":
        sigma = noise_multiplier(config)
        est = _estimator(config, sigma)
        return Publication(
            mode="personalized", noise_multiplier=sigma, estimator=est.to_dict(), **common
        )
    eps = uniform_epsilon(config, meta)
    if algo.sampling_rate is not None:
        from pdpfl.calibrate import noise_for_uniform_rate

        sigma = float(
            noise_for_uniform_rate(
                eps, algo.sampling_rate, _plan(config, 1.0), adversary=pv.adversary
            )
        )
        return Publication(
            mode="uniform",
            noise_multiplier=sigma,
            uniform_epsilon=eps,
            uniform_rate=float(algo.sampling_rate),
            **common,
        )
    sigma = noise_multiplier(config)
    est = _estimator(config, sigma)
    q = float(np.clip(est.rates(np.array([eps]))[0], 0.0, 1.0))
    return Publication(
        mode="uniform",
        noise_multiplier=sigma,
        uniform_epsilon=eps,
        uniform_rate=q,
        estimator=est.to_dict(),
        **common,
    )


def uniform_epsilon(config: ExperimentConfig, meta: dict[str, Any]) -> float:
    """ε of a uniform baseline: ``algorithm.epsilon``, else ε_min (minimum) / ε_mod (dropout)."""
    algo = config.algorithm
    if algo.epsilon is not None:
        return float(algo.epsilon)
    key = {"minimum": "budget_min", "dropout": "budget_mean"}.get(algo.name)
    if key is None:
        raise ValueError(f"algorithm.epsilon: required for algorithm {algo.name!r}")
    if key not in meta:
        raise ValueError(
            f"algorithm.epsilon: {algo.name} needs {key} (build with federation_meta(federation, "
            "config)) or an explicit algorithm.epsilon"
        )
    return float(meta[key])


def initial_params(config: ExperimentConfig, meta: dict[str, Any]) -> list[np.ndarray]:
    """x^0: the model initialised from ``derive_seed(seed, "model-init")``."""
    from pdpfl.models import create_model, get_params

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(config.seed, "model-init"))
        model = create_model(config.model.name, meta["input_shape"], meta["num_classes"])
        return get_params(model)


def build_server(config: ExperimentConfig, federation_meta: dict[str, Any]) -> RpdpServer:
    """The server of ``config.algorithm`` (every federated algorithm shares :class:`RpdpServer`)."""
    _check_federated(config)
    return RpdpServer(
        initial_params(config, federation_meta),
        client_rate=config.training.client_rate,
        seed=config.seed,
        publication=publish(config, federation_meta),
        weighting=config.algorithm.weighting,
        server_lr=config.algorithm.server_lr,
    )


def build_client(
    config: ExperimentConfig, client_id: int, client_data: Any, meta: dict[str, Any]
) -> RpdpClient:
    """One silo, from its own data only (budgets are assigned here, on the silo)."""
    from pdpfl.models import create_model

    _check_federated(config)
    pub = publish(config, meta)
    n = len(client_data.y_train)
    nonprivate_rate = None
    if pub.mode == "non-private" and config.training.batch_size is not None:
        nonprivate_rate = min(1.0, config.training.batch_size / max(n, 1))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(config.seed, "model-init"))
        model = create_model(config.model.name, meta["input_shape"], meta["num_classes"])
    return RpdpClient(
        client_id,
        model,
        client_data.x_train,
        client_data.y_train,
        client_data.x_test,
        client_data.y_test,
        client_budgets(config, client_id, client_data),
        pub,
        seed=config.seed,
        optimizer=config.training.optimizer,
        lr=config.training.lr,
        momentum=config.training.momentum,
        weight_decay=config.training.weight_decay,
        physical_batch_size=config.training.physical_batch_size,
        nonprivate_rate=nonprivate_rate,
    )


def build_federation_algorithms(
    config: ExperimentConfig, federation: Any
) -> tuple[RpdpServer, dict[int, RpdpClient]]:
    """The server and every silo of an in-process federation (publication computed once)."""
    meta = federation_meta(federation, config)
    meta["publication"] = publish(config, meta)
    server = build_server(config, meta)
    clients = {i: build_client(config, i, c, meta) for i, c in enumerate(federation.clients)}
    return server, clients


def _check_federated(config: ExperimentConfig) -> None:
    if config.algorithm.name not in FEDERATED_ALGORITHMS:
        raise ValueError(
            f"algorithm.name: {config.algorithm.name!r} is not a federated algorithm "
            f"(one of {', '.join(FEDERATED_ALGORITHMS)})"
        )
