"""The messages of every run: the training, evaluation, discovery and diverged replies.

Declared here once (:mod:`pdpfl.fl.messages`); a multi-stage summation protocol declares its
stages beside its silo handler. The training reply is the :class:`~pdpfl.fl.api.Contribution`
field for field (``update.{i}``, ``weight``, ``metric.{k}``); the discovery facts are those of
pdpfl's Flower hooks (``AppHooks.silo_info``); a diverged reply's cause is one of three fixed
texts (:func:`public_cause`), so no free text leaves a silo in it.
"""

from __future__ import annotations

import re

import numpy as np

from pdpfl.errors import LIKELY_CAUSES
from pdpfl.fl.messages.schema import (
    Array,
    Bool,
    Field,
    Float,
    Int,
    MessageId,
    MessageSchema,
    Outgoing,
    Rule,
    Str,
    register_schema,
)

__all__ = [
    "DIVERGED_REPLY",
    "EVALUATE_REPLY",
    "HELLO_REPLY",
    "NONFINITE_CAUSE",
    "PUBLIC_WEIGHT",
    "SILO_INFO",
    "TRAIN_REPLY",
    "nonfinite_metric_cause",
    "nonfinite_update_cause",
    "public_cause",
]

TRAIN_REPLY: MessageId = ("train", "reply")
EVALUATE_REPLY: MessageId = ("evaluate", "reply")
HELLO_REPLY: MessageId = ("hello", "reply")
SILO_INFO: MessageId = ("hello", "info")
DIVERGED_REPLY: MessageId = ("diverged", "reply")


def nonfinite_update_cause(parameter: int) -> str:
    """The cause a silo reports when its update of ``parameter`` is not finite."""
    return (
        f"its update of parameter {int(parameter)} is not finite, so nothing was released; "
        f"likely {LIKELY_CAUSES}"
    )


def nonfinite_metric_cause(metric: str) -> str:
    """The cause a silo reports when its declared metric ``metric`` is not finite."""
    return f"its metric {metric!r} is not finite, so nothing was released"


#: The cause a silo reports for any other non-finite value (its own text stays in its log).
NONFINITE_CAUSE = "its training produced a non-finite value, so nothing was released"


def public_cause(cause: str) -> str:
    """The cause a diverged reply may carry: ``cause`` if it is one of the declared texts,
    else :data:`NONFINITE_CAUSE` (a free text could carry anything out of the silo)."""
    return cause if re.fullmatch(_CAUSE, cause) else NONFINITE_CAUSE


_METRIC_NAME = r"[A-Za-z0-9_.:-]{1,64}"
_RELEASED = "is not finite, so nothing was released"
_CAUSE = (
    rf"its update of parameter \d{{1,6}} {_RELEASED}; likely {re.escape(LIKELY_CAUSES)}"
    rf"|its metric '{_METRIC_NAME}' {_RELEASED}|{re.escape(NONFINITE_CAUSE)}"
)


def _update_keys(c: Outgoing) -> range:
    if c.encoding is not None:  # a discrete share replaces the float updates
        return range(0)
    if c.params is not None:
        return range(len(c.params))
    return range(sum(1 for n in c.reply if n.startswith("update.")))


def _update_shape(c: Outgoing) -> tuple[int, ...] | None:
    if c.params is None:
        return None
    p = c.params[int(c.key)]
    return tuple(p.shape) if isinstance(p, np.ndarray) else tuple(np.shape(p))


def _share_shape(c: Outgoing) -> tuple[int, ...] | None:
    return None if c.encoding is None else (int(c.encoding.length),)


def _share_bits(c: Outgoing) -> int | None:
    return None if c.encoding is None else int(c.encoding.bits)


_SILO = Rule("the silo's index", lambda c: c.silo_id)
#: What makes a contribution's weight public (the training reply, the masked upload).
PUBLIC_WEIGHT = (
    "the algorithm's public weight: 1, or the silo's training size under "
    "`algorithm.weighting: num_examples` with `data.public_silo_sizes: true` (0: no update)"
)
_EVALUATION = "federated evaluation (every round): an aggregate of the silo's test split"

_CORE = (
    MessageSchema(
        TRAIN_REPLY,
        (
            Field(
                "update.{i}",
                Array(("float32",), shape=Rule("of the request's parameter i", _update_shape)),
                "dp-output",
                doc="the DP mechanism's noisy update of parameter i",
                keys=Rule("each model parameter i", _update_keys),
            ),
            Field(
                "share",
                Array(
                    ("uint32", "uint64"),
                    shape=Rule("(d',): the discrete encoding's coordinates", _share_shape),
                    bits=Rule("b (secure.bits)", _share_bits),
                ),
                "dp-output",
                doc="`privacy.noise_shares: discrete`: the silo's clipped contribution scaled, "
                "rounded and + one exact discrete Gaussian share, in Z_{2^b} (uint32 if b <= 32)",
                presence=Rule("discrete shares", lambda c: c.encoding is not None),
            ),
            Field("weight", Float(low=0.0), "public", public_by=PUBLIC_WEIGHT),
            Field(
                "metric.{k}",
                Float(),
                "dp-output",
                doc="a Contribution metric the algorithm declares in `public_metrics` "
                "(DP-protected, e.g. IDP-FedAvg's noisy `clip_count` share)",
                keys=Rule(
                    "k in the algorithm's public_metrics (none with discrete shares: they are "
                    "coordinates of the share)",
                    lambda c: [] if c.encoding is not None else sorted(c.public_metrics),
                ),
                presence="optional",
            ),
        ),
        doc="a training round's Contribution (in-process, Flower `train`)",
    ),
    MessageSchema(
        EVALUATE_REPLY,
        (
            Field("loss", Float(low=0.0, finite=False), "public", public_by=_EVALUATION),
            Field("accuracy", Float(0.0, 1.0, finite=False), "public", public_by=_EVALUATION),
            Field("n", Int(low=0), "public", public_by=_EVALUATION + " (its size)"),
        ),
        doc="test metrics of the global model (NaN when the test split is empty)",
    ),
    MessageSchema(
        HELLO_REPLY,
        (
            Field(
                "partition-id",
                Int(_SILO, _SILO),
                "public",
                public_by="the SuperNode's node config `partition-id`",
            ),
            Field(
                "num-partitions",
                Int(low=-1),
                "public",
                public_by="the node config `num-partitions` (-1 when not given)",
            ),
            Field(
                "has-state",
                Bool(),
                "public",
                public_by="whether the silo holds state for the run (`--resume`)",
            ),
        ),
        doc="Flower discovery: who the silo is",
    ),
    MessageSchema(
        SILO_INFO,
        (
            Field(
                "input_shape",
                Str(pattern=r"\[\d{1,9}(, \d{1,9}){0,7}\]"),
                "public",
                public_by="`data.dataset` (the features' shape, JSON)",
            ),
            Field("num_classes", Int(low=1), "public", public_by="`data.dataset`"),
            Field(
                "name",
                Str(pattern=r"[^\x00-\x1f]{1,128}", max_length=128),
                "public",
                public_by="the silo's name in its data (`data.dataset`)",
            ),
            Field(
                "num_examples",
                Int(low=0),
                "public",
                public_by="`data.public_silo_sizes: true` (the silo's training size)",
                presence=Rule(
                    "data.public_silo_sizes",
                    lambda c: bool(
                        getattr(getattr(c.config, "data", None), "public_silo_sizes", 0)
                    ),
                ),
            ),
        ),
        doc="Flower discovery: the public facts pdpfl's hooks send (AppHooks.silo_info)",
    ),
    MessageSchema(
        DIVERGED_REPLY,
        (
            Field(
                "round",
                Int(low=0, high=Rule("the round", lambda c: c.round_index)),
                "public",
                public_by="the run stops for every party: where training diverged",
            ),
            Field(
                "cause",
                Str(
                    pattern=_CAUSE,
                    max_length=512,
                    text="one of three fixed texts (a parameter, a declared metric, or neither)",
                ),
                "public",
                public_by="the run stops: which output was not finite (fixed texts)",
            ),
        ),
        doc="a silo whose update was not finite: nothing released, the run stops",
    ),
)

for _schema in _CORE:
    register_schema(_schema, owner=__name__)
