"""The contract between federated algorithms and the runtimes that execute them.

An algorithm is split into what a silo computes (:class:`ClientAlgorithm`: it holds the silo's
private data, budgets, sampling rates, ledger and secret randomness) and what the server computes
(:class:`ServerAlgorithm`: client sampling and the next global model). Neither side does I/O,
threads or sockets.

The privacy boundary
--------------------
The **only** thing a silo releases in a training round is one :class:`Contribution`: the noisy
update of the algorithm's DP mechanism, a public weight, and metrics the algorithm declares in
:attr:`ServerAlgorithm.public_metrics` (each DP-protected or computed from values the
configuration declares public). Runtimes carry exactly this object -- the simulator hands it over
in memory, the Flower codec encodes exactly its fields -- and reject a contribution carrying
anything else (:func:`check_contribution`: the gate of :mod:`pdpfl.fl.messages` for the
training reply, ``update.{i}`` / ``weight`` / ``metric.{k}``). Silo sizes, noise-free losses,
realized batch sizes, budgets and their statistics never leave a silo. Every other message a silo
sends (evaluation, discovery, protocol stages) is declared there too and passes the same gate.

Contributions reach the server through a summation protocol (:mod:`pdpfl.fl.aggregation`):
the server algorithm receives only the :class:`Aggregate` -- the sum of the updates, weights
and metrics -- unless it declares :attr:`ServerAlgorithm.needs_individual_updates` (server-side
clipping in central-DP FedAvg), which a runtime refuses to pair with secure summation.

Evaluation replies (:meth:`ClientAlgorithm.evaluate`) carry only aggregate test metrics
(``loss``, ``accuracy``, ``n``) of the silo's *test* split, which the training guarantee does not
cover. Per-record and per-group privacy summaries (:meth:`ClientAlgorithm.privacy_summary`) stay
at the silo: the in-process simulator reads them because one operator owns every silo there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from pdpfl.fl.messages import (
    EVALUATE_REPLY,
    TRAIN_REPLY,
    Outgoing,
    PrivacyBoundaryError,
    ShareLayout,
    check_outgoing,
)
from pdpfl.ledger import PrivacySummary

__all__ = [
    "Aggregate",
    "ClientAlgorithm",
    "Contribution",
    "EVALUATION_METRICS",
    "FederationInfo",
    "Params",
    "PrivacyBoundaryError",
    "Scalars",
    "ServerAlgorithm",
    "Transport",
    "check_contribution",
    "check_evaluation",
    "contribution_payload",
]

#: Model parameters as float32 arrays (trainable parameters only, in ``model.parameters()`` order).
Params = list[np.ndarray]

#: Scalars only (int, float, str, bool): safe to send as a Flower ConfigRecord/MetricRecord.
Scalars = dict[str, Any]

#: The keys an evaluation reply may carry (aggregate metrics of the silo's test split).
EVALUATION_METRICS = frozenset({"loss", "accuracy", "n"})


@dataclass
class Contribution:
    """What one silo releases in one training round -- and nothing else.

    Attributes
    ----------
    update
        The output of the algorithm's DP mechanism (e.g. rPDP-FL's noisy local model delta),
        float32 arrays in parameter order. Summation protocols add these up.
    weight
        A public weight (default 1): summed by the protocol; e.g. the number of contributions for
        a simple mean, or a silo size that the configuration declares public.
    metrics
        Public or DP-protected scalars, summed by the protocol. Only keys listed in the server
        algorithm's :attr:`~ServerAlgorithm.public_metrics` are allowed.
    """

    update: Params
    weight: float = 1.0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Aggregate:
    """What the server algorithm receives for one round: sums over the contributions.

    ``count`` is the number of contributions combined (the server knows whom it asked).
    ``contributions`` holds the individual contributions only for a server algorithm that
    declares ``needs_individual_updates`` under plain summation; it is ``None`` otherwise.
    """

    total: Params
    weight: float
    metrics: dict[str, float]
    count: int
    contributions: list[Contribution] | None = None

    @property
    def empty(self) -> bool:
        return self.count == 0


@dataclass(frozen=True)
class FederationInfo:
    """Public facts about a federation, known to the server before round 1.

    ``silo_sizes`` (training records per silo) is present only when the configuration declares
    silo sizes public (``data.public_silo_sizes: true``); otherwise it is ``None``.
    ``user_histogram`` (``user_histogram[s][u]`` = training records of user ``u`` in silo ``s``,
    for user-level DP across silos) is present only when the configuration declares the per-user
    counts public (``data.public_user_histograms: true``), which discloses them to the server.
    """

    input_shape: tuple[int, ...]
    num_classes: int
    client_ids: tuple[int, ...]
    client_names: tuple[str, ...] = ()
    silo_sizes: tuple[int, ...] | None = None
    user_histogram: tuple[tuple[int, ...], ...] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "client_ids": list(self.client_ids),
            "client_names": list(self.client_names),
            "silo_sizes": None if self.silo_sizes is None else list(self.silo_sizes),
            "user_histogram": (
                None if self.user_histogram is None else [list(r) for r in self.user_histogram]
            ),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FederationInfo:
        sizes = d.get("silo_sizes")
        hist = d.get("user_histogram")
        return cls(
            input_shape=tuple(int(s) for s in d["input_shape"]),
            num_classes=int(d["num_classes"]),
            client_ids=tuple(int(c) for c in d["client_ids"]),
            client_names=tuple(str(c) for c in d.get("client_names", ())),
            silo_sizes=None if sizes is None else tuple(int(s) for s in sizes),
            user_histogram=(
                None if hist is None else tuple(tuple(int(c) for c in r) for r in hist)
            ),
        )


@runtime_checkable
class ClientAlgorithm(Protocol):
    """The silo side of an algorithm (lives where the data lives)."""

    client_id: int

    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        """Run this round's local mechanism from ``global_params``; return the release.

        The silo's ledger is charged *before* this returns (write-ahead accounting).
        """
        ...

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        """``loss``, ``accuracy``, ``n`` of ``params`` on this silo's test split.

        Also catches the silo's accounting up to ``round_index`` (rounds it was not sampled in).
        """
        ...

    def privacy_summary(self) -> PrivacySummary | None:
        """Per-group privacy of this silo's units (None: it accounts none). Never sent."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this silo exactly (ledger, counters; never keys)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class ServerAlgorithm(Protocol):
    """The server side of an algorithm."""

    #: Keys a :class:`Contribution`'s ``metrics`` may carry (public or DP-protected values).
    public_metrics: ClassVar[frozenset[str]]
    #: True if :meth:`aggregate` needs each contribution (incompatible with secure summation).
    needs_individual_updates: ClassVar[bool]

    def initial_params(self) -> Params: ...

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Clients asked to contribute this round (e.g. Poisson sampling; may be empty)."""
        ...

    def round_config(self, round_index: int) -> Scalars:
        """Public per-round configuration sent to the selected silos."""
        ...

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """The next global model (an empty aggregate usually returns ``global_params``)."""
        ...

    def record_round(self, round_index: int, selected: list[int]) -> None:
        """Update the server's own (Type I) view after a round."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def contribution_payload(contribution: Contribution) -> dict[str, Any]:
    """The :data:`~pdpfl.fl.messages.TRAIN_REPLY` message of a contribution: ``update.{i}``,
    ``weight`` and ``metric.{k}`` (what the Flower codec encodes, field for field)."""
    update = contribution.update
    if len(update) == 1 and isinstance(update[0], np.ndarray) and update[0].dtype.kind in "iu":
        # a discrete share (privacy.noise_shares: discrete): one integer vector in Z_{2^b}
        out: dict[str, Any] = {"share": update[0]}
    else:
        out = {f"update.{i}": u for i, u in enumerate(update)}
    out["weight"] = contribution.weight
    out.update({f"metric.{k}": v for k, v in contribution.metrics.items()})
    return out


def check_contribution(
    contribution: object,
    public_metrics: frozenset[str] | set[str],
    num_params: int | None = None,
    *,
    params: Params | None = None,
    silo: int | None = None,
    round_index: int = 0,
    encoding: ShareLayout | None = None,
) -> Contribution:
    """Validate what a silo is about to release; raise :class:`PrivacyBoundaryError` otherwise.

    A contribution must be a :class:`Contribution` (no extra attributes) whose message
    (:func:`contribution_payload`) passes the gate for :data:`~pdpfl.fl.messages.TRAIN_REPLY`:
    one finite float32 array per parameter (``num_params`` of them, of the shapes of ``params``
    when given), a finite weight >= 0, and metric keys from ``public_metrics``. With the
    algorithm's discrete share ``encoding`` (``share_encoding``; None: float updates) the update
    is instead one integer share of the encoding's size and values below 2^b, and no metric
    travels beside it (metrics are coordinates of the share).
    """
    at = "" if silo is None else f"silo {silo}: "
    if type(contribution) is not Contribution:
        raise PrivacyBoundaryError(
            f"{at}a silo may release only a Contribution, got {type(contribution).__name__}"
        )
    extra = set(vars(contribution)) - {"update", "weight", "metrics"}
    if extra:
        raise PrivacyBoundaryError(f"{at}contribution carries undeclared fields {sorted(extra)}")
    if not isinstance(contribution.update, list):
        raise PrivacyBoundaryError(f"{at}contribution.update: expected a list of arrays")
    if not isinstance(contribution.metrics, dict):
        raise PrivacyBoundaryError(f"{at}contribution.metrics: expected a dict")
    expected = len(params) if params is not None else num_params
    if encoding is not None:
        expected = 1
    if expected is not None and len(contribution.update) != expected:
        raise PrivacyBoundaryError(
            f"{at}contribution.update: expected {expected} arrays, got {len(contribution.update)}"
        )
    undeclared = set(contribution.metrics) - (
        set() if encoding is not None else set(public_metrics)
    )
    if undeclared:
        raise PrivacyBoundaryError(
            f"{at}contribution.metrics: {sorted(undeclared)} are not declared public by the "
            f"algorithm (declared: {sorted(public_metrics) or 'none'})"
        )
    context = Outgoing(
        round_index=int(round_index),
        silo_id=silo,
        params=params,
        public_metrics=frozenset(public_metrics),
        encoding=encoding,
    )
    check_outgoing(TRAIN_REPLY, contribution_payload(contribution), context)
    return contribution


def check_evaluation(metrics: Scalars, *, silo: int | None = None, round_index: int = 0) -> Scalars:
    """Validate an evaluation reply: exactly :data:`EVALUATION_METRICS` (``loss`` >= 0 and
    ``accuracy`` in [0, 1] or NaN, ``n`` an integer >= 0) -- the gate for
    :data:`~pdpfl.fl.messages.EVALUATE_REPLY`."""
    extra = set(metrics) - EVALUATION_METRICS if isinstance(metrics, Mapping) else set()
    if extra:
        at = "" if silo is None else f"silo {silo}: "
        raise PrivacyBoundaryError(
            f"{at}evaluation reply carries {sorted(extra)}; allowed: {sorted(EVALUATION_METRICS)}"
        )
    check_outgoing(EVALUATE_REPLY, metrics, Outgoing(round_index=int(round_index), silo_id=silo))
    return metrics


@runtime_checkable
class Transport(Protocol):
    """How the round loop reaches the silos (direct calls in-process, messages with Flower).

    Part of the FL contract: a runtime implements it (:mod:`pdpfl.runtime.simulation`'s
    in-process transport, the Flower transport); :mod:`pdpfl.fl.rounds` and the summation
    protocols of :mod:`pdpfl.fl.aggregation` use only these methods."""

    client_ids: list[int]

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        """Local training on each selected silo; their contributions in ``selected`` order.

        A silo that is lost (deployment runtimes) is simply missing from the result.
        """
        ...

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        """Test metrics (``loss``, ``accuracy``, ``n``) of ``params`` on each silo's test split.

        Every silo is told ``round_index`` so that one not selected this round catches up its
        third-party (Type II) accounting for the rounds it did not train in.
        """
        ...

    def privacy_summaries(self) -> dict[int, PrivacySummary | None]:
        """The operator's view of each silo's privacy state (aggregates only).

        Only meaningful where one operator owns every silo (the in-process simulator). A
        deployment transport returns ``{}``: privacy summaries stay at the silos.
        """
        ...

    def exchange(
        self, protocol: str, stage: str, requests: dict[int, dict[str, Any]], round_index: int
    ) -> dict[int, dict[str, Any]]:
        """One stage of a multi-message protocol: send each silo its request payload and return
        the replies of the silos that answered (see :mod:`pdpfl.fl.aggregation`)."""
        ...

    def client_states(self) -> dict[int, dict[str, Any]]:
        """Everything needed to resume each silo exactly."""
        ...

    def load_client_states(self, states: dict[int, dict[str, Any]]) -> None: ...
