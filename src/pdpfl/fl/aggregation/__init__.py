"""Summation protocols: how the silos' contributions become the server's :class:`Aggregate`.

The round loop never hands individual contributions to a server algorithm. It asks the
configured :class:`SumProtocol` to *collect* the round: the protocol reaches the selected silos
through the runtime's transport and returns the sum of their updates, weights and public
metrics. Following TFF's ``DifferentiallyPrivateFactory(query, record_aggregation_factory)``, a
protocol may replace the plain sum as long as it does not change what is summed (and so does not
increase the sensitivity).

* :class:`PlainSum` -- the server receives every contribution and adds them up (it *could* look
  at each one: the server's view is every silo's noisy update).
* :class:`~pdpfl.fl.aggregation.secure.SecureSum` (``aggregation: secure``): dropout-robust
  secure aggregation (Bonawitz et al. 2017: double masking, Shamir-shared seeds, threshold t),
  the server learns only the sum of at least t survivors' updates.
* :class:`~pdpfl.fl.aggregation.private_weighting.PrivateWeightedSum` (ULDP-FL
  ``weights: private``): Protocol 1 of ULDP-FL, the server learns only
  Σ_s Σ_u w_{s,u}·Δ_{s,u} + noise.

:func:`protocol_from_config` builds the protocol an experiment config asks for.

A server algorithm that needs the individual contributions (e.g. central-DP FedAvg clipping
each client update at the server) declares ``needs_individual_updates = True``;
:func:`check_compatible` refuses to run it with a protocol that hides individual updates.

Multi-message protocols
-----------------------
A protocol with several message rounds (key agreement, masked upload, unmasking) drives them
through ``transport.exchange(protocol, stage, requests, round_index)``: one request payload per
silo, one reply per silo that answered. At the silo the runtime hands each request to the
protocol's silo-side handler registered with :func:`register_silo_handler`, together with a
:class:`SiloContext` (the silo's algorithm and a private ``memory`` dict that survives between
stages and rounds at that silo and is never sent). Payload values are NumPy arrays, ``bytes``,
``str``, ``int``, ``float`` or ``bool``. The in-process transport calls the handler directly; the
Flower transport carries the payloads in messages. A protocol declares the reply of every stage
(``register_silo_handler(..., schemas=...)``, :mod:`pdpfl.fl.messages`): each field's type,
size rule and classification; :func:`handle_silo_stage` refuses an undeclared stage and passes
every reply through the gate before it leaves the silo.

A protocol registered with ``secret_memory=True`` keeps secrets in that memory (keys, seeds, its
unreleased contribution): a runtime keeps it in the silo's process only -- never on disk, so it
needs a silo process that lives through the round (Flower's warm worker). Non-secret facts that
must survive a silo restart (e.g. the rounds a silo has already masked) go in
:func:`public_memory`, which runtimes persist with the silo's state.

Survivor threshold
------------------
Every protocol releases a round's sum only if at least t(n) of the n silos asked contributed
(:mod:`pdpfl.fl.aggregation.threshold`; plain summation only for a server that declares
``distributed_noise``). Silos that add a share of the noise size it σ²C²/t with
t = :func:`share_threshold` ``(config, n)``; the multi-stage protocols also hand the round's t to
``fit`` / ``user_updates`` in the round configuration under :data:`SURVIVORS_KEY`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from pdpfl.fl.aggregation.threshold import (
    DEFAULT_MIN_SURVIVORS,
    DEFAULT_THRESHOLD,
    SURVIVORS_KEY,
    share_std,
    share_threshold,
    summary_fields,
    survivor_threshold,
    threshold_of,
)
from pdpfl.fl.api import (
    Aggregate,
    ClientAlgorithm,
    Contribution,
    Params,
    PrivacyBoundaryError,
    Scalars,
    ServerAlgorithm,
    Transport,
    check_contribution,
)
from pdpfl.fl.messages import (
    MessageSchema,
    Outgoing,
    check_outgoing,
    declared,
    register_schema,
    render_table,
    schema_of,
)

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
    from pdpfl.fl.aggregation.secure_identity import SiloSecurity

__all__ = [
    "PUBLIC_MEMORY",
    "SURVIVORS_KEY",
    "Payload",
    "PlainSum",
    "SiloContext",
    "SumProtocol",
    "check_compatible",
    "empty_aggregate",
    "get_protocol",
    "handle_silo_stage",
    "holds_secrets",
    "message_table",
    "protocol_from_config",
    "public_memory",
    "register_protocol",
    "register_silo_handler",
    "share_std",
    "share_threshold",
    "silo_protocols",
    "sum_contributions",
    "summary_fields",
    "survivor_threshold",
    "threshold_of",
]


@runtime_checkable
class SumProtocol(Protocol):
    """How one round's contributions are collected and summed."""

    name: str
    #: True if the server cannot see individual contributions under this protocol.
    hides_individual_updates: bool

    def collect(
        self,
        transport: Transport,
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
    """The server receives each contribution and sums them (no cryptography).

    For a server algorithm that declares ``distributed_noise = True`` (its silos each add a share
    σ²C²/t of the noise, t = :func:`share_threshold` ``(config, n)`` = min(n, t(n))), a round
    with fewer than t contributions is not summed: it returns the empty aggregate, since the
    survivors' noise would fall short of what the ledgers charge.
    """

    name = "plain"
    hides_individual_updates = False

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        min_survivors: int = DEFAULT_MIN_SURVIVORS,
        **_: object,
    ) -> None:
        survivor_threshold(0, threshold, min_survivors)  # validates
        self.threshold = float(threshold)
        self.min_survivors = int(min_survivors)

    def collect(
        self,
        transport: Transport,
        selected: list[int],
        params: Params,
        round_index: int,
        config: Scalars,
        server: ServerAlgorithm,
    ) -> Aggregate:
        # min(n, t(n)): a lone silo asked adds all the noise itself (share_threshold).
        t = min(
            len(selected), survivor_threshold(len(selected), self.threshold, self.min_survivors)
        )
        shares = bool(getattr(server, "distributed_noise", False))
        if shares and len(selected) < t:
            return empty_aggregate(params)
        # The round configuration travels unchanged (a prefetched request must match it):
        # algorithms with noise shares size them with threshold_of(config, n) themselves.
        contributions = transport.fit(selected, params, round_index, config) if selected else []
        if shares and len(contributions) < t:
            return empty_aggregate(params)  # the survivors' noise shares fall short
        public: frozenset[str] = getattr(server, "public_metrics", frozenset())
        encoding: ShareEncoding | None = getattr(server, "share_encoding", None)
        for c in contributions:  # defence in depth: each silo's gate checked it before
            check_contribution(c, public, params=params, encoding=encoding)
        if encoding is not None:  # discrete shares: the integers are summed modulo 2^b
            from pdpfl.fl.aggregation.discrete_shares import ring_sum

            total = ring_sum([c.update[0] for c in contributions], encoding)
            return encoding.decode(
                total,
                params,
                round_index,
                weight=sum(float(c.weight) for c in contributions),
                count=len(contributions),
            )
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


_PROTOCOLS: dict[str, Callable[..., SumProtocol]] = {"plain": PlainSum}

#: Modules that register pdpfl's own protocols (imported on first use).
BUILTIN_PROTOCOL_MODULES: tuple[str, ...] = (
    "pdpfl.fl.aggregation.secure",
    "pdpfl.fl.aggregation.private_weighting",
)


def _load_builtin_protocols() -> None:
    import importlib

    for module in BUILTIN_PROTOCOL_MODULES:
        importlib.import_module(module)


def register_protocol(name: str, factory: Callable[..., SumProtocol]) -> None:
    """Register a summation protocol ``factory(**options) -> SumProtocol`` under ``name``."""
    if name in _PROTOCOLS:
        raise ValueError(f"aggregation protocol {name!r} is already registered")
    _PROTOCOLS[name] = factory


def get_protocol(name: str, **options: Any) -> SumProtocol:
    """Build the summation protocol ``name`` (``plain``, ``secure``, ``private-weighting``)."""
    if name not in _PROTOCOLS:
        _load_builtin_protocols()
    if name not in _PROTOCOLS:
        raise ValueError(
            f"aggregation: unknown protocol {name!r}; available: {', '.join(sorted(_PROTOCOLS))}"
        )
    return _PROTOCOLS[name](**options)


def protocol_from_config(config: ExperimentConfig) -> SumProtocol:
    """The summation protocol of an experiment config.

    ``algorithm.weights: private`` (ULDP-FL) -> Protocol 1 of ULDP-FL (``private-weighting``,
    which includes secure summation); otherwise ``aggregation`` (``plain`` or ``secure``, the
    latter with ``participation`` and the ``secure`` section's parameters).
    """
    secure = getattr(config, "secure", None)
    options: dict[str, Any] = {} if secure is None else dict(secure.model_dump())
    training = getattr(config, "training", None)
    if getattr(getattr(config, "algorithm", None), "weights", None) == "private":
        rounds = getattr(training, "rounds", 1)
        return get_protocol("private-weighting", expected_rounds=rounds, **options)
    name = getattr(config, "aggregation", "plain")
    if name == "plain":
        return get_protocol(
            "plain",
            threshold=options.get("threshold", DEFAULT_THRESHOLD),
            min_survivors=options.get("min_survivors", DEFAULT_MIN_SURVIVORS),
        )
    return get_protocol(
        name,
        participation=getattr(config, "participation", "visible"),
        client_rate=getattr(training, "client_rate", 1.0),
        **options,
    )


# -------------------------------------------------------------- silo side of multi-stage protocols

#: One message's content in a protocol stage: arrays, bytes and scalars by name.
Payload = dict[str, Any]


@dataclass
class SiloContext:
    """What a silo-side protocol handler may use at the silo.

    ``memory`` persists between the stages and rounds of this run at this silo (in-process: an
    attribute of the transport; Flower: the silo worker's process, or -- for a protocol without
    ``secret_memory`` in per-message mode -- the silo's state folder) and never leaves the silo:
    protocol secrets (e.g. a round's X25519 private key) live here. ``memory["public"]``
    (:func:`public_memory`) is persisted with the silo's state in every mode.
    """

    client: ClientAlgorithm
    silo_id: int
    memory: dict[str, Any] = field(default_factory=dict)
    #: What the silo brings from its own side (never from the server): its long-term identity,
    #: its peers' public keys and its own protocol settings
    #: (:class:`~pdpfl.fl.aggregation.secure_identity.SiloSecurity`); None where the runtime has
    #: none (secure summation then refuses to run).
    security: SiloSecurity | None = None


#: ``handler(stage, payload, round_index, context) -> reply payload``.
SiloStageHandler = Callable[[str, Payload, int, SiloContext], Payload]

_SILO_HANDLERS: dict[str, SiloStageHandler] = {}
_SILO_STAGES: dict[str, frozenset[str]] = {}
_SECRET_MEMORY: set[str] = set()

#: Key of :attr:`SiloContext.memory` holding each protocol's non-secret, persisted facts.
PUBLIC_MEMORY = "public"


def register_silo_handler(
    protocol: str,
    handler: SiloStageHandler,
    *,
    schemas: Sequence[MessageSchema],
    secret_memory: bool = False,
) -> None:
    """Register the silo side of the multi-stage protocol named ``protocol``.

    ``schemas``: one :class:`~pdpfl.fl.messages.MessageSchema` per stage, with message id
    ``(protocol, stage)``: the reply of each stage the handler answers, declared field by field
    (:mod:`pdpfl.fl.messages`). A stage without a schema is refused before the handler runs,
    and every reply passes the gate before it leaves (:func:`handle_silo_stage`).

    ``secret_memory``: the handler keeps secrets in ``memory[protocol]``; runtimes must never
    write that entry to disk (see :func:`holds_secrets`).
    """
    if protocol in _SILO_HANDLERS:
        raise ValueError(f"silo handler for protocol {protocol!r} is already registered")
    if protocol == PUBLIC_MEMORY:
        raise ValueError(f"{PUBLIC_MEMORY!r} is reserved for the protocols' public memory")
    stages = [s.message[1] for s in schemas]
    if (
        not stages
        or any(s.message[0] != protocol for s in schemas)
        or len(set(stages)) < len(stages)
    ):
        raise ValueError(
            f"protocol {protocol!r}: schemas must declare each stage's reply once, with message "
            f"ids ({protocol!r}, stage)"
        )
    owner = getattr(handler, "__module__", "") or ""
    for schema in schemas:
        register_schema(schema, owner=owner)
    _SILO_HANDLERS[protocol] = handler
    _SILO_STAGES[protocol] = frozenset(stages)
    if secret_memory:
        _SECRET_MEMORY.add(protocol)


def silo_protocols() -> dict[str, frozenset[str]]:
    """Every protocol with a silo handler (pdpfl's own loaded) and its declared stages."""
    _load_builtin_protocols()
    return dict(_SILO_STAGES)


def message_table() -> str:
    """The Markdown table of every message a pdpfl silo can send (the docs' threat model)."""
    _load_builtin_protocols()
    return render_table(declared("pdpfl."))


def holds_secrets(protocol: str) -> bool:
    """True if ``protocol``'s silo memory holds secrets: keep it in the silo's process only."""
    if protocol not in _SILO_HANDLERS:
        _load_builtin_protocols()
    return protocol in _SECRET_MEMORY


def public_memory(context: SiloContext, protocol: str) -> dict[str, Any]:
    """``protocol``'s non-secret memory at a silo (plain data; persisted with the silo's state,
    so it survives a restart of the silo's process)."""
    memory: dict[str, Any] = context.memory.setdefault(PUBLIC_MEMORY, {}).setdefault(protocol, {})
    return memory


def handle_silo_stage(
    protocol: str, stage: str, payload: Payload, round_index: int, context: SiloContext
) -> Payload:
    """Run one protocol stage at a silo (every runtime's silo side calls this).

    The stage must be declared (else :class:`~pdpfl.fl.api.PrivacyBoundaryError` before the
    handler runs) and its reply passes the gate (:func:`~pdpfl.fl.messages.check_outgoing`,
    sized by the request and the protocol's public state) before it is returned.
    """
    handler = _SILO_HANDLERS.get(protocol)
    if handler is None:
        _load_builtin_protocols()  # importing a protocol module registers its silo handler
        handler = _SILO_HANDLERS.get(protocol)
    if handler is None:
        raise ValueError(f"aggregation: protocol {protocol!r} has no silo-side handler")
    message = (str(protocol), str(stage))
    if schema_of(message) is None:
        raise PrivacyBoundaryError(
            f"silo {context.silo_id}: protocol {protocol!r} declares no stage {stage!r}; "
            "nothing was computed or sent"
        )
    reply = handler(stage, payload, int(round_index), context)
    check_outgoing(
        message,
        reply,
        Outgoing(
            round_index=int(round_index),
            silo_id=context.silo_id,
            request=payload,
            state=context.memory.get(protocol),
        ),
    )
    return reply
