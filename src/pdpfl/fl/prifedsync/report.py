"""Operator views of a PriFedSync federation (simulation, benchmarks): they read every client.

Nothing here runs in a deployment, where each client's model, ledger and metrics stay at its
silo; an operator who owns every silo (the in-process simulator, ``benchmarks/prifedsync.py``)
gets the paper's comparisons at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pdpfl.fl.api import Params
from pdpfl.fl.prifedsync.mechanism import neighbouring
from pdpfl.fl.prifedsync.silo import PriFedSyncSilo

__all__ = ["evaluate_models", "federation_report"]


def _silos(clients: Mapping[int, object]) -> dict[int, PriFedSyncSilo]:
    """``clients`` (e.g. from ``build_federation_algorithms``) as PriFedSync silos, by id."""
    out = {}
    for cid, c in sorted(clients.items()):
        if not isinstance(c, PriFedSyncSilo):
            raise TypeError(f"client {cid}: expected a PriFedSync silo, got {type(c).__name__}")
        out[cid] = c
    if not out:
        raise ValueError("clients: expected at least one PriFedSync client")
    return out


def evaluate_models(clients: Mapping[int, object], global_params: Params) -> dict[str, float]:
    """Local models vs the global model on every client's own test split (operator view).

    Returns the paper's metric ``local_mean_client_accuracy`` (mean over clients of each local
    model's accuracy), ``global_mean_client_accuracy`` (the global model, same averaging),
    and the pooled (test-record-weighted) accuracies of both.
    """
    rows = [c.evaluate_pair(global_params) for c in _silos(clients).values()]
    out: dict[str, float] = {}
    for key in ("local", "global"):
        acc = np.array([r[key]["accuracy"] for r in rows if r[key]["n"] > 0])
        n = np.array([r[key]["n"] for r in rows if r[key]["n"] > 0], dtype=float)
        out[f"{key}_mean_client_accuracy"] = float(acc.mean()) if acc.size else float("nan")
        out[f"{key}_pooled_accuracy"] = float(np.dot(acc, n) / n.sum()) if n.sum() else float("nan")
    return out


def federation_report(clients: Mapping[int, object]) -> dict[str, Any]:
    """Per-client and federated privacy numbers (operator view: reads every client's ledger).

    ``eps_rigorous`` (the headline, every observer), ``mu_clt`` / ``eps_clt`` (Theorem 2's CLT,
    an approximation), the weak (μ_max) and the paper's strong (√(m − 1)·μ_max) federated GDP
    (Defs. 3.5 / 3.6), and the rigorous ε of the strong notion's (m − 1)-fold composition.
    With ``privacy.central_noise: discrete`` every CLT/GDP figure is None (the exact discrete
    Gaussian has no proven μ-GDP bound; only the rigorous ε is stated).
    """
    from pdpfl.privacy.gdp import federated_mu, gdp_epsilon

    silos = _silos(clients)
    per: dict[int, dict[str, Any]] = {}
    mus: list[float] = []
    eps: list[float] = []
    gdp = all(c.gdp_figures for c in silos.values())
    for cid, c in silos.items():
        if gdp:
            mus.append(c.clt_mu())
        eps.append(c.spent("rigorous"))
        per[cid] = {
            "participations": c.participations_charged,
            "noise_multiplier": c.mechanism.noise_multiplier,
            "local_steps": int(c.mechanism.local_steps),
            "eps_rigorous": eps[-1],
            "mu_clt": mus[-1] if gdp else None,
            "eps_clt": c.spent("clt") if gdp else None,
            "target_epsilon": c.target_epsilon,
            "stopped": c.stopped,
        }
    any_c = next(iter(silos.values()))
    delta = any_c.mechanism.delta
    weak = federated_mu(mus, "weak") if gdp else None
    strong = federated_mu(mus, "strong") if gdp else None
    return {
        "delta": delta,
        "neighbouring": neighbouring(any_c.sampler),
        "clients": per,
        "eps_rigorous_max": max(eps),
        "clt_mu_weak": weak,
        "clt_mu_strong": strong,
        "clt_eps_weak": None if weak is None else float(gdp_epsilon(weak, delta)),
        "clt_eps_strong": None if strong is None else float(gdp_epsilon(strong, delta)),
        "eps_strong_paper_rigorous": max(c.strong_epsilon() for c in silos.values()),
    }
