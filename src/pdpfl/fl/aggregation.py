"""Summation protocols: how the silos' contributions become the server's :class:`Aggregate`.

The round loop never hands individual contributions to a server algorithm. It asks the
configured :class:`SumProtocol` to *collect* the round: the protocol reaches the selected silos
through the runtime's transport and returns the sum of their updates, weights and public
metrics. Following TFF's ``DifferentiallyPrivateFactory(query, record_aggregation_factory)``, a
protocol may replace the plain sum as long as it does not change what is summed (and so does not
increase the sensitivity).

* :class:`PlainSum` -- the server receives every contribution and adds them up (it *could* look
  at each one: the server's view is every silo's noisy update).
* Secure summation (``aggregation: secure``) plugs in here: the server learns only the sum.

A server algorithm that needs the individual contributions (e.g. central-DP FedAvg clipping
each client update at the server) declares ``needs_individual_updates = True``;
:func:`check_compatible` refuses to run it with a protocol that hides individual updates.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from pdpfl.fl.api import (
    Aggregate,
    Contribution,
    Params,
    Scalars,
    ServerAlgorithm,
    check_contribution,
)

__all__ = [
    "PlainSum",
    "SumProtocol",
    "check_compatible",
    "empty_aggregate",
    "get_protocol",
    "register_protocol",
    "sum_contributions",
]


@runtime_checkable
class SumProtocol(Protocol):
    """How one round's contributions are collected and summed."""

    name: str
    #: True if the server cannot see individual contributions under this protocol.
    hides_individual_updates: bool

    def collect(
        self,
        transport: Any,
        selected: list[int],
        params: Params,
        round_index: int,
        config: Scalars,
        server: ServerAlgorithm,
    ) -> Aggregate:
        """Ask ``selected`` silos (through ``transport``) for their contributions; sum them."""
        ...


def empty_aggregate(params: Params) -> Aggregate:
    """The aggregate of a round without contributions (zeros, weight 0, count 0)."""
    return Aggregate(
        total=[np.zeros_like(np.asarray(p, dtype=np.float32)) for p in params],
        weight=0.0,
        metrics={},
        count=0,
    )


def sum_contributions(
    contributions: list[Contribution], params: Params, *, keep_individual: bool = False
) -> Aggregate:
    """Σ updates (accumulated in float64, returned as float32), Σ weights, Σ metrics."""
    if not contributions:
        agg = empty_aggregate(params)
        if keep_individual:
            agg.contributions = []
        return agg
    total = [np.zeros(np.shape(p), dtype=np.float64) for p in params]
    metrics: dict[str, float] = {}
    weight = 0.0
    for c in contributions:
        for acc, u in zip(total, c.update, strict=True):
            acc += np.asarray(u, dtype=np.float64)
        weight += float(c.weight)
        for k, v in c.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + float(v)
    return Aggregate(
        total=[t.astype(np.float32) for t in total],
        weight=weight,
        metrics=metrics,
        count=len(contributions),
        contributions=list(contributions) if keep_individual else None,
    )


class PlainSum:
    """The server receives each contribution and sums them (no cryptography)."""

    name = "plain"
    hides_individual_updates = False

    def collect(
        self,
        transport: Any,
        selected: list[int],
        params: Params,
        round_index: int,
        config: Scalars,
        server: ServerAlgorithm,
    ) -> Aggregate:
        contributions = transport.fit(selected, params, round_index, config) if selected else []
        public = getattr(server, "public_metrics", frozenset())
        for c in contributions:
            check_contribution(c, public, len(params))
        return sum_contributions(
            contributions,
            params,
            keep_individual=bool(getattr(server, "needs_individual_updates", False)),
        )


def check_compatible(server: ServerAlgorithm, protocol: SumProtocol) -> None:
    """Refuse a server that needs individual updates under a protocol that hides them."""
    if getattr(server, "needs_individual_updates", False) and protocol.hides_individual_updates:
        raise ValueError(
            f"aggregation: {type(server).__name__} needs each silo's update (server-side "
            f"clipping), which the {protocol.name!r} protocol hides; use aggregation: plain or an "
            "algorithm variant in which each silo clips and noises its own update"
        )


_PROTOCOLS: dict[str, Any] = {"plain": PlainSum}


def register_protocol(name: str, factory: Any) -> None:
    """Register a summation protocol ``factory(**options) -> SumProtocol`` under ``name``."""
    if name in _PROTOCOLS:
        raise ValueError(f"aggregation protocol {name!r} is already registered")
    _PROTOCOLS[name] = factory


def get_protocol(name: str, **options: Any) -> SumProtocol:
    """Build the summation protocol ``name`` (``plain``; ``secure`` once registered)."""
    if name not in _PROTOCOLS:
        raise ValueError(
            f"aggregation: unknown protocol {name!r}; available: {', '.join(sorted(_PROTOCOLS))}"
        )
    return _PROTOCOLS[name](**options)
