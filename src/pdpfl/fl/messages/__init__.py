"""Every message a silo sends, declared once, and the one gate that checks it (issue #33).

The privacy boundary of CONTRIBUTING.md -- only the mechanism's output leaves a silo -- is a
typed schema per message, in the manner of Flower's SecAgg+ client mod, which checks every
stage's keys and types before it acts (``check_stage``, ``check_configs``). A message is named
by a runtime-independent id ``(topic, kind)``: :data:`TRAIN_REPLY`, :data:`EVALUATE_REPLY`,
:data:`HELLO_REPLY`, :data:`SILO_INFO`, :data:`DIVERGED_REPLY` and, for each stage of a
multi-stage summation protocol, ``(protocol, stage)`` (registered beside the protocol's silo
handler: :func:`pdpfl.fl.aggregation.register_silo_handler`).

A :class:`MessageSchema` lists its :class:`Field` s. A field has a name (or a family such as
``"update.{i}"``, one member per key of a public rule), a type -- :class:`Array` (dtypes and a
shape; unsigned integer arrays may also bound their values below 2^b), :class:`Bytes` (a
length), :class:`Int`, :class:`Float`, :class:`Bool`, :class:`Str` (a closed set or a pattern)
-- and a classification:

``dp-output``
    the output of the DP mechanism that the ledgers charge (a noisy update, a noisy count);
``public``
    public by the configuration; ``public_by`` names the setting or fact that makes it so;
``crypto``
    keys, sealed shares, masked vectors, ciphertexts: they hide what they carry.

Every size is a :class:`Rule` of public facts (:class:`Outgoing`): the request the message
answers, the model's shapes, the participant lists, the protocol's public parameters. The
receiver can compute each of them, so no size depends on a silo's data.

:func:`check_outgoing` is the gate; every runtime calls it at the silo before a reply leaves
(the in-process transport and the Flower ClientApp; protocol stages through
:func:`pdpfl.fl.aggregation.handle_silo_stage`). An undeclared message, a missing or extra
field, a wrong type or dtype (a float where an integer is declared), a wrong shape or length, a
non-finite float or a string outside its set raises :class:`PrivacyBoundaryError` and nothing
leaves. Its message names the field and what was expected, never the value. With
``context=None`` it checks what needs no context (names, types, dtypes, finiteness, ranges that
are constants): the server's defence in depth, and the checks of recorded messages in tests.

Large arrays cost one dtype and shape comparison and one vectorized finiteness pass.
"""

from pdpfl.fl.messages.core import (
    DIVERGED_REPLY,
    EVALUATE_REPLY,
    HELLO_REPLY,
    NONFINITE_CAUSE,
    PUBLIC_WEIGHT,
    SILO_INFO,
    TRAIN_REPLY,
    nonfinite_metric_cause,
    nonfinite_update_cause,
    public_cause,
)
from pdpfl.fl.messages.schema import (
    CLASSIFICATIONS,
    Array,
    Bool,
    Bytes,
    Field,
    Float,
    Int,
    MessageId,
    MessageSchema,
    Outgoing,
    PrivacyBoundaryError,
    Rule,
    ShareLayout,
    Str,
    check_outgoing,
    declared,
    register_schema,
    render_table,
    schema_of,
)

__all__ = [
    "CLASSIFICATIONS",
    "DIVERGED_REPLY",
    "EVALUATE_REPLY",
    "HELLO_REPLY",
    "NONFINITE_CAUSE",
    "PUBLIC_WEIGHT",
    "SILO_INFO",
    "TRAIN_REPLY",
    "Array",
    "Bool",
    "Bytes",
    "Field",
    "Float",
    "Int",
    "MessageId",
    "MessageSchema",
    "Outgoing",
    "PrivacyBoundaryError",
    "Rule",
    "ShareLayout",
    "Str",
    "check_outgoing",
    "declared",
    "nonfinite_metric_cause",
    "nonfinite_update_cause",
    "public_cause",
    "register_schema",
    "render_table",
    "schema_of",
]
