"""The server's side of one federated round, for every algorithm and every runtime.

The round loop (:mod:`pdpfl.runtime.loop`) owns the order of rounds, resume and storage; the
steps of one round (Algorithm 3 of the rPDP-FL paper, §6.2) are here, independent of how a
runtime reaches its silos (a :class:`Transport`):

0. :func:`select_round` -- who is asked and the round's request config: the server's Poisson
   sample (an empty round counts and is not redrawn), or every silo when the protocol has
   them flip their own coins (hidden participation);
1. :func:`aggregate_round` -- the summation protocol (:mod:`pdpfl.fl.aggregation`) collects the
   selected silos' :class:`~pdpfl.fl.api.Contribution` s -- the only thing a silo releases --
   and hands the server their sum; the server computes the next global model (which an optional
   server optimizer, :mod:`pdpfl.fl.server_optimizer`, post-processes from the pseudo-gradient),
   records the round in its Type I view, and the model is checked finite (else nothing is
   published);
2. :func:`evaluate_round` -- every silo evaluates the new global model on its test split
   (aggregate metrics only) and catches up its own ledger for the round; the round's metrics
   line and the privacy summary of this view follow (a transport of pooled silos,
   :mod:`pdpfl.fl.pool`, evaluates every client at once: the line carries the pooled metrics,
   ``clients_evaluated`` and ``test_records``, not one entry per client; a transport with
   ``evaluation_clients`` -- Flower's Simulation Engine -- names the silos asked, the sampled
   ones before the final round, and the line says ``clients_evaluated``);
3. :func:`diverged_round` -- the same line for a round that diverged (nothing non-finite is
   published; the charges already made stay).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdpfl.errors import LIKELY_CAUSES, TrainingDiverged
from pdpfl.fl.aggregation import SumProtocol
from pdpfl.fl.api import (
    Aggregate,
    Params,
    Scalars,
    ServerAlgorithm,
    Transport,
    check_evaluation,
)
from pdpfl.fl.pool import PooledEvaluation
from pdpfl.fl.server_optimizer import ServerOptimizer
from pdpfl.ledger import PrivacySummary

__all__ = [
    "Selection",
    "Transport",
    "aggregate_round",
    "check_model",
    "collect_privacy",
    "diverged_round",
    "evaluate_round",
    "metrics_line",
    "pooled_evaluation",
    "select_round",
]

#: One round's selection: the silos asked (in order) and the round's request config.
Selection = tuple[list[int], dict[str, Any]]


def select_round(
    server: ServerAlgorithm, transport: Transport, protocol: SumProtocol | None, t: int
) -> Selection:
    """Step 0: the silos asked in round ``t`` and its request config. Every silo when the
    protocol has ``silo_side_sampling`` (each flips its own λ-coin), else the server's sample
    (``protocol`` None: the server's sample)."""
    if getattr(protocol, "silo_side_sampling", False):
        return list(transport.client_ids), dict(server.round_config(t))
    return list(server.select_clients(t, list(transport.client_ids))), dict(server.round_config(t))


def aggregate_round(
    server: ServerAlgorithm,
    transport: Transport,
    protocol: SumProtocol,
    params: Params,
    t: int,
    selected: list[int],
    round_config: dict[str, Any],
    optimizer: ServerOptimizer | None = None,
) -> tuple[Aggregate, Params]:
    """Step 1: the selected silos' sum through ``protocol``, the server's new global model
    (post-processed by ``optimizer`` from the pseudo-gradient, if given; checked finite:
    :class:`~pdpfl.errors.TrainingDiverged` otherwise) and the round recorded in the server's
    view. Returns the aggregate and the new model."""
    aggregate = protocol.collect(transport, selected, params, t, round_config, server)
    new_params = server.aggregate(t, params, aggregate)
    server.record_round(t, selected)  # the round happened: the server's view counts it
    state = None
    if optimizer is not None:  # post-processing of the released x_t and x̂_{t+1} only
        new_params, state = optimizer.step(params, new_params)
    check_model(new_params, t)
    if optimizer is not None and state is not None:
        optimizer.commit(state)  # only a published (finite) model moves the optimizer
    return aggregate, new_params


def evaluate_round(
    server: ServerAlgorithm,
    transport: Transport,
    params: Params,
    t: int,
    round_config: dict[str, Any],
    selected: list[int],
    contributions: int,
    unit: str,
) -> tuple[dict[str, Any], PrivacySummary | None]:
    """Step 2: every silo's test metrics of ``params`` (each silo also catches up its ledger
    for round ``t``), checked; returns the round's metrics line and the privacy summary of
    this view (``unit``: the algorithm's privacy unit)."""
    pooled = getattr(transport, "evaluate_pooled", None)
    result = pooled(params, t, round_config) if callable(pooled) else None
    if isinstance(result, PooledEvaluation):  # a pool: every client at once, no per-client map
        bad = result.diverged()
        if bad is not None:
            raise TrainingDiverged(
                f"the test loss of the new global model is not finite; likely {LIKELY_CAUSES}",
                round_index=t,
                silo=bad,
            )
        privacy = collect_privacy(transport.privacy_summaries(), server, unit)
        line = metrics_line(t, selected, contributions, {}, privacy)
        del line["clients"]
        line.update(
            result.pooled(),
            clients_evaluated=int(np.size(result.n)),
            test_records=int(np.sum(result.n)),
        )
        return line, privacy
    # Every silo, unless the transport names the ones to ask (Flower's Simulation Engine: the
    # sampled silos; the others catch up when next asked and in the final round).
    choose = getattr(transport, "evaluation_clients", None)
    ids = list(choose(t, selected)) if callable(choose) else list(transport.client_ids)
    evals = transport.evaluate(ids, params, t, round_config)
    for c, e in evals.items():
        check_evaluation(e)
        if not np.isfinite(float(e.get("loss", 0.0))) and float(e.get("n", 0)) > 0:
            raise TrainingDiverged(
                f"the test loss of the new global model is not finite; likely {LIKELY_CAUSES}",
                round_index=t,
                silo=int(c),
            )
    privacy = collect_privacy(transport.privacy_summaries(), server, unit)
    line = metrics_line(t, selected, contributions, evals, privacy)
    if len(ids) < len(transport.client_ids):  # the pooled metrics are over these silos only
        line["clients_evaluated"] = len(evals)
    return line, privacy


def diverged_round(
    err: TrainingDiverged, server: ServerAlgorithm, transport: Transport, unit: str
) -> tuple[dict[str, Any], PrivacySummary | None]:
    """Step 3, for a round that diverged: its metrics line (no model, no metrics: nothing
    non-finite was published) and the privacy summary, whose charges stay (other silos may
    have released)."""
    line = {
        "round": err.round_index,
        "diverged": err.to_dict(),
        "selected": [],
        "contributions": 0,
        "accuracy": None,
        "loss": None,
    }
    return line, collect_privacy(transport.privacy_summaries(), server, unit)


def pooled_evaluation(evals: dict[int, Scalars]) -> dict[str, float]:
    """Pooled (example-weighted) and client-mean test loss/accuracy over the test records
    that exist (silos with an empty test split are left out)."""
    evals = {c: e for c, e in evals.items() if float(e.get("n", 0)) > 0}
    if not evals:
        nan = float("nan")
        return {"accuracy": nan, "loss": nan, "mean_client_accuracy": nan}
    n = np.array([float(e.get("n", 0)) for e in evals.values()])
    acc = np.array([float(e["accuracy"]) for e in evals.values()])
    loss = np.array([float(e["loss"]) for e in evals.values()])
    total = n.sum()
    weights = n / total if total > 0 else np.full(len(n), 1.0 / len(n))
    return {
        "accuracy": float(np.dot(weights, acc)),
        "loss": float(np.dot(weights, loss)),
        "mean_client_accuracy": float(acc.mean()),
    }


def collect_privacy(
    summaries: dict[int, Any], server: ServerAlgorithm, unit: str
) -> PrivacySummary | None:
    """One typed summary of every unit this view can see: the silos' own summaries (the
    operator's view; empty in a deployment) merged with the server's (e.g. ULDP-FL's users,
    whose ledger lives at the server). None when nothing is accounted in this view."""
    parts: list[PrivacySummary | None] = list(summaries.values())
    own = getattr(server, "privacy_summary", None)
    if callable(own):
        parts.append(own())
    present = [p for p in parts if p is not None]
    return PrivacySummary.merge(present) if present else None


def check_model(params: Params, t: int) -> None:
    """The aggregated global model must be finite (else nothing is published)."""
    for k, p in enumerate(params):
        if not np.all(np.isfinite(np.asarray(p))):
            raise TrainingDiverged(
                f"the aggregated global model (parameter {k}) is not finite; likely "
                f"{LIKELY_CAUSES}",
                round_index=t,
            )


def metrics_line(
    t: int,
    selected: list[int],
    contributions: int,
    evals: dict[int, Scalars],
    privacy: PrivacySummary | None,
) -> dict[str, Any]:
    """The round's line of ``metrics.jsonl``: who took part, the pooled and per-silo test
    metrics (aggregates only) and the privacy summary of this view."""
    pooled = pooled_evaluation(evals)
    return {
        "round": t,
        "selected": sorted(int(c) for c in selected),
        "contributions": int(contributions),
        "accuracy": pooled["accuracy"],
        "loss": pooled["loss"],
        "mean_client_accuracy": pooled["mean_client_accuracy"],
        "clients": {
            str(cid): {"accuracy": float(e["accuracy"]), "loss": float(e["loss"]), "n": int(e["n"])}
            for cid, e in sorted(evals.items())
        },
        "privacy": None if privacy is None else privacy.to_dict(),
    }
