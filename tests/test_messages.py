"""The declared messages and the gate (issue #33 item 1): types, schemas, registry, docs table.

Every message a silo sends has one schema (:mod:`pdpfl.fl.messages`); the gate refuses an
undeclared message, a missing or extra field, a float where an integer is declared, a wrong
dtype, shape or length, a non-finite float or a string outside its set -- and never echoes the
value it refused. What a real run sends is enumerated in ``tests/test_message_enumeration.py``;
the attacks in ``tests/test_gate_attacks.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.fl import aggregation
from pdpfl.fl.api import Contribution, check_contribution, check_evaluation, contribution_payload
from pdpfl.fl.messages import (
    DIVERGED_REPLY,
    EVALUATE_REPLY,
    NONFINITE_CAUSE,
    SILO_INFO,
    TRAIN_REPLY,
    Array,
    Bool,
    Bytes,
    Field,
    Float,
    Int,
    MessageSchema,
    Outgoing,
    PrivacyBoundaryError,
    Rule,
    Str,
    check_outgoing,
    declared,
    nonfinite_metric_cause,
    nonfinite_update_cause,
    public_cause,
    register_schema,
    schema_of,
)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- field types


@pytest.mark.parametrize(
    ("kind", "good", "bad"),
    [
        (Int(low=0, high=9), [0, 9, np.int64(3), np.uint8(1)], [3.0, True, "3", -1, 10, None]),
        (Float(low=0.0), [0.0, 1, np.float32(2.5), np.int64(4)], [True, "1", -0.5, np.nan]),
        (Float(0.0, 1.0, finite=False), [np.nan, 0.5], [-np.inf, np.inf, 1.5]),
        (Float(low=0.0, finite=False), [np.inf, np.nan], [-np.inf]),
        (Bool(), [True, False, np.bool_(True)], [1, 0, "true", None]),
        (Bool(True), [True], [False]),
        (Bytes(4), [b"abcd", bytearray(4)], [b"abc", b"abcde", "abcd", np.zeros(4, np.uint8)]),
        (Str(choices=frozenset({"a", "b"})), ["a", "b"], ["c", b"a", 1]),
        (Str(pattern=r"[a-z]{1,3}", max_length=3), ["abc"], ["abcd", "A", ""]),
    ],
)
def test_each_type_accepts_its_values_and_refuses_the_rest(kind: Any, good: list, bad: list):
    for value in good:
        assert kind.check(value, None) is None, value
    for value in bad:
        assert kind.check(value, None) is not None, value


def test_arrays_are_checked_by_dtype_shape_finiteness_and_bits() -> None:
    shape = Rule("(3,)", lambda c: (3,))
    floats = Array(("float32",), shape=shape)
    ctx = Outgoing()
    assert floats.check(np.zeros(3, np.float32), ctx) is None
    assert "dtype" in str(floats.check(np.zeros(3, np.float64), ctx))
    assert "dtype" in str(floats.check(np.zeros(3, np.int32), ctx))  # an integer array
    assert "shape" in str(floats.check(np.zeros(4, np.float32), ctx))  # one more element
    assert "shape" in str(floats.check(np.zeros((3, 1), np.float32), ctx))
    assert "non-finite" in str(floats.check(np.array([0, np.nan, 0], np.float32), ctx))
    assert "non-finite" in str(floats.check(np.array([0, -np.inf, 0], np.float32), ctx))
    assert "array" in str(floats.check([0.0, 0.0, 0.0], ctx))
    # without a context the shape rule is not evaluated (names, types and dtypes still are)
    assert floats.check(np.zeros(4, np.float32), None) is None
    # discrete shares in Z_{2^b} (issue #33 item 3): uint32/uint64 with values below 2^b
    ring = Array(("uint32", "uint64"), bits=Rule("b", lambda c: 20))
    assert ring.check(np.array([0, 2**20 - 1], np.uint64), ctx) is None
    assert ring.check(np.array([0, 2**20 - 1], np.uint32), ctx) is None
    assert "2^20" in str(ring.check(np.array([2**20], np.uint64), ctx))
    assert "dtype" in str(ring.check(np.array([1.0]), ctx))  # a float where integers are declared
    signed = Array(("int64",), bits=8)
    assert "outside" in str(signed.check(np.array([-1], np.int64), ctx))


def _schema(*fields: Field, message: tuple[str, str] = ("test", "reply")) -> MessageSchema:
    return MessageSchema(message, tuple(fields))


def test_a_schema_refuses_missing_extra_and_forbidden_fields() -> None:
    schema = _schema(
        Field("a", Int(), "public", public_by="a test"),
        Field("b", Bytes(2), "crypto", presence="optional"),
        Field(
            "c",
            Bool(),
            "public",
            public_by="a test",
            presence=Rule("a is positive", lambda c: c.reply["a"] > 0),
        ),
    )
    ctx = Outgoing(silo_id=3)
    schema.check({"a": 1, "c": True}, ctx)
    schema.check({"a": 0}, ctx)
    schema.check({"a": 0, "b": b"xy"}, ctx)
    with pytest.raises(PrivacyBoundaryError, match="silo 3, message test/reply: missing field 'a'"):
        schema.check({"c": True}, ctx)
    with pytest.raises(PrivacyBoundaryError, match="missing field 'c'"):
        schema.check({"a": 1}, ctx)
    with pytest.raises(PrivacyBoundaryError, match="'c' must be absent.*a is positive"):
        schema.check({"a": 0, "c": False}, ctx)
    with pytest.raises(PrivacyBoundaryError, match=r"undeclared field\(s\) \['n_train'\]"):
        schema.check({"a": 0, "n_train": 120}, ctx)
    with pytest.raises(PrivacyBoundaryError, match="field 'a' expected an integer, got a float"):
        schema.check({"a": 1.0, "c": True}, ctx)
    with pytest.raises(PrivacyBoundaryError, match="named fields"):
        schema.check([("a", 1)], ctx)
    # context-free: a conditional field is optional, the rest is checked alike
    schema.check({"a": 0, "c": True}, None)
    with pytest.raises(PrivacyBoundaryError, match="undeclared"):
        schema.check({"a": 0, "d": 1}, None)


def test_a_family_has_exactly_the_members_its_rule_names() -> None:
    schema = _schema(
        Field(
            "part.{i}",
            Array(("float32",), shape=Rule("s", lambda c: (int(c.key) + 1,))),
            "dp-output",
            keys=Rule("i < 2", lambda c: range(2)),
        )
    )
    good = {"part.0": np.zeros(1, np.float32), "part.1": np.zeros(2, np.float32)}
    schema.check(good, Outgoing())
    with pytest.raises(PrivacyBoundaryError, match="missing field 'part.1'"):
        schema.check({"part.0": good["part.0"]}, Outgoing())
    with pytest.raises(PrivacyBoundaryError, match="undeclared"):
        schema.check({**good, "part.2": np.zeros(3, np.float32)}, Outgoing())
    with pytest.raises(PrivacyBoundaryError, match="'part.1' expected shape"):
        schema.check({**good, "part.1": np.zeros(3, np.float32)}, Outgoing())
    schema.check({**good, "part.2": np.zeros(3, np.float32)}, None)  # members by name only
    with pytest.raises(PrivacyBoundaryError, match="undeclared"):
        schema.check({"partx": np.zeros(1, np.float32)}, None)


def test_a_rule_that_cannot_be_evaluated_refuses() -> None:
    schema = _schema(
        Field("b", Bytes(Rule("from the request", lambda c: c.request["n"])), "crypto")
    )
    with pytest.raises(PrivacyBoundaryError, match="cannot be sized.*KeyError"):
        schema.check({"b": b""}, Outgoing(request={}))


def test_fields_declare_their_classification() -> None:
    with pytest.raises(ValueError, match="classification"):
        Field("x", Int(), "secret")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="what makes it public"):
        Field("x", Int(), "public")
    with pytest.raises(ValueError, match="placeholder"):
        Field("x.{i}", Int(), "crypto")
    with pytest.raises(ValueError, match="exactly one"):
        Str()


def test_refusals_never_echo_the_refused_value() -> None:
    secret = "patient-4711-hba1c-9.3"
    schema = _schema(
        Field("s", Str(choices=frozenset({"ok"})), "public", public_by="a test"),
        Field("n", Int(high=10), "public", public_by="a test", presence="optional"),
    )
    for payload in ({"s": secret}, {"s": "ok", "n": 987654321}):
        with pytest.raises(PrivacyBoundaryError) as info:
            schema.check(payload, Outgoing())
        assert secret not in str(info.value) and "987654321" not in str(info.value)


# -------------------------------------------------------------- the training reply, by property

_MUTATIONS = ["extra-field", "drop-update", "float64", "int-array", "grow", "nan", "str-weight"]


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(
        st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple), min_size=1, max_size=4
    ),
    metrics=st.sets(st.sampled_from(["clip_count", "count"]), max_size=2),
    mutation=st.sampled_from(_MUTATIONS),
    seed=st.integers(0, 2**16),
)
def test_any_mutation_of_a_training_reply_is_refused(
    shapes: list[tuple[int, ...]], metrics: set[str], mutation: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    params = [np.zeros(s, np.float32) for s in shapes]
    update = [rng.normal(size=s).astype(np.float32) for s in shapes]
    c = Contribution(update=update, weight=1.0, metrics={k: 0.5 for k in metrics})
    public = frozenset({"clip_count", "count"})
    check_contribution(c, public, params=params, silo=1)  # the honest release passes
    payload = contribution_payload(c)
    k = int(rng.integers(len(shapes)))
    if mutation == "extra-field":
        payload["num_examples"] = 120.0
    elif mutation == "drop-update":
        del payload[f"update.{k}"]
    elif mutation == "float64":
        payload[f"update.{k}"] = update[k].astype(np.float64)
    elif mutation == "int-array":
        payload[f"update.{k}"] = np.rint(update[k]).astype(np.int32)
    elif mutation == "grow":
        payload[f"update.{k}"] = np.append(update[k].ravel(), np.float32(0))
    elif mutation == "nan":
        bad = update[k].copy()
        bad.flat[int(rng.integers(bad.size))] = np.nan
        payload[f"update.{k}"] = bad
    else:
        payload["weight"] = "1.0"
    with pytest.raises(PrivacyBoundaryError):
        check_outgoing(TRAIN_REPLY, payload, Outgoing(params=params, public_metrics=public))


def test_check_contribution_is_the_training_replys_gate() -> None:
    params = [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)]
    ok = Contribution([np.ones((2, 2), np.float32), np.ones(3, np.float32)], weight=2.0)
    assert check_contribution(ok, frozenset(), params=params) is ok
    wrong_shape = Contribution([np.ones(4, np.float32), np.ones(3, np.float32)])
    with pytest.raises(PrivacyBoundaryError, match=r"'update.0' expected shape \(2, 2\)"):
        check_contribution(wrong_shape, frozenset(), params=params)
    check_contribution(wrong_shape, frozenset(), 2)  # only the count without the shapes
    doubles = Contribution([np.ones((2, 2)), np.ones(3)])
    with pytest.raises(PrivacyBoundaryError, match="expected dtype float32, got float64"):
        check_contribution(doubles, frozenset(), params=params)
    with pytest.raises(PrivacyBoundaryError, match="'weight' expected a finite number"):
        check_contribution(Contribution(ok.update, weight=np.inf), frozenset(), params=params)
    with pytest.raises(PrivacyBoundaryError, match="'weight' expected a number >= 0"):
        check_contribution(Contribution(ok.update, weight=-1.0), frozenset(), params=params)
    with pytest.raises(PrivacyBoundaryError, match="metric.clip_count' expected a finite"):
        check_contribution(
            Contribution(ok.update, metrics={"clip_count": np.nan}),
            frozenset({"clip_count"}),
            params=params,
        )


def test_evaluation_replies_are_three_aggregates() -> None:
    check_evaluation({"loss": 0.3, "accuracy": 0.9, "n": 12})
    check_evaluation({"loss": np.nan, "accuracy": np.nan, "n": 0})  # an empty test split
    for bad, why in (
        ({"loss": 0.3, "accuracy": 0.9, "n": 12.0}, "'n' expected an integer"),
        ({"loss": 0.3, "accuracy": 1.5, "n": 12}, "'accuracy' expected a number in"),
        ({"loss": 0.3, "accuracy": 0.9}, "missing field 'n'"),
        ({"loss": 0.3, "accuracy": 0.9, "n": 1, "n_train": 5}, "n_train"),
    ):
        with pytest.raises(PrivacyBoundaryError, match=why):
            check_evaluation(bad, silo=2)


def test_discovery_facts_follow_the_configuration() -> None:
    class Data:
        public_silo_sizes = False

    class Config:
        data = Data()

    info = {"input_shape": "[8, 8]", "num_classes": 10, "name": "hospital-north"}
    check_outgoing(SILO_INFO, info, Outgoing(silo_id=0, config=Config()))
    with pytest.raises(PrivacyBoundaryError, match="'num_examples' must be absent"):
        check_outgoing(SILO_INFO, {**info, "num_examples": 120}, Outgoing(config=Config()))
    Data.public_silo_sizes = True
    check_outgoing(SILO_INFO, {**info, "num_examples": 120}, Outgoing(config=Config()))
    with pytest.raises(PrivacyBoundaryError, match="missing field 'num_examples'"):
        check_outgoing(SILO_INFO, info, Outgoing(config=Config()))
    with pytest.raises(PrivacyBoundaryError, match="'input_shape' does not have"):
        check_outgoing(SILO_INFO, {**info, "input_shape": "[8, 8] x"}, Outgoing(config=None))


def test_a_diverged_reply_carries_a_declared_cause_only() -> None:
    for cause in (nonfinite_update_cause(3), nonfinite_metric_cause("clip_count")):
        assert public_cause(cause) == cause
        check_outgoing(DIVERGED_REPLY, {"round": 2, "cause": cause}, Outgoing(round_index=2))
    assert public_cause("loss nan at record 4711 (age 54)") == NONFINITE_CAUSE
    with pytest.raises(PrivacyBoundaryError, match="'cause' does not have"):
        check_outgoing(
            DIVERGED_REPLY, {"round": 2, "cause": "record 4711"}, Outgoing(round_index=2)
        )
    with pytest.raises(PrivacyBoundaryError, match="'round' expected an integer in"):
        check_outgoing(
            DIVERGED_REPLY, {"round": 3, "cause": NONFINITE_CAUSE}, Outgoing(round_index=2)
        )


# ------------------------------------------------------------------------------- the registry


def test_undeclared_messages_and_duplicate_schemas_are_refused() -> None:
    with pytest.raises(PrivacyBoundaryError, match="undeclared message"):
        check_outgoing(("telemetry", "reply"), {}, Outgoing(silo_id=1))
    with pytest.raises(ValueError, match="already has a schema"):
        register_schema(schema_of(EVALUATE_REPLY))  # type: ignore[arg-type]


def test_a_protocol_registers_one_schema_per_stage() -> None:
    def handler(stage: str, payload: Any, round_index: int, ctx: Any) -> dict:
        return {}

    with pytest.raises(TypeError, match="schemas"):
        aggregation.register_silo_handler("no-schemas", handler)  # type: ignore[call-arg]
    other = _schema(message=("another", "stage"))
    with pytest.raises(ValueError, match="each stage's reply once"):
        aggregation.register_silo_handler("wrong-ids", handler, schemas=[other])
    assert "wrong-ids" not in aggregation.silo_protocols()


def test_an_undeclared_stage_is_refused_before_its_handler_runs(monkeypatch: Any) -> None:
    calls: list[str] = []

    def handler(stage: str, payload: Any, round_index: int, ctx: Any) -> dict:
        calls.append(stage)
        return {"value": 1} if stage == "declared" else {"value": 1, "extra": b"x"}

    monkeypatch.setitem(aggregation._SILO_HANDLERS, "gate-test", handler)
    schema = _schema(
        Field("value", Int(), "public", public_by="a test"), message=("gate-test", "declared")
    )
    monkeypatch.setitem(aggregation._SILO_STAGES, "gate-test", frozenset({"declared"}))
    from pdpfl.fl.messages import schema as registry

    monkeypatch.setitem(registry._SCHEMAS, ("gate-test", "declared"), schema)
    ctx = aggregation.SiloContext(client=None, silo_id=4)  # type: ignore[arg-type]
    assert aggregation.handle_silo_stage("gate-test", "declared", {}, 0, ctx) == {"value": 1}
    with pytest.raises(PrivacyBoundaryError, match="silo 4: protocol 'gate-test' declares no"):
        aggregation.handle_silo_stage("gate-test", "undeclared", {}, 0, ctx)
    assert calls == ["declared"]  # nothing was computed for the undeclared stage


def test_pdpfls_protocols_declare_every_stage_they_answer() -> None:
    protocols = aggregation.silo_protocols()
    assert {"secure", "private-weighting"} <= set(protocols)
    assert protocols["secure"] == {"advertise", "share", "upload", "consistency", "unmask"}
    assert protocols["private-weighting"] == {
        "setup-keys",
        "setup-seed",
        "setup-histogram",
        "weights-ot",
        "weights",
        "install",
        "round",
    }
    for schema in declared("pdpfl."):
        for f in schema.fields:
            assert f.classification in ("dp-output", "public", "crypto")


def test_the_docs_table_is_the_registry() -> None:
    """docs/architecture.md lists every declared message (regenerate the block between the
    markers with ``python -c "from pdpfl.fl.aggregation import message_table;
    print(message_table())"``)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    found = re.search(
        r"<!-- message-schemas:begin[^>]*-->\n(.*?)<!-- message-schemas:end -->", text, re.S
    )
    assert found, "docs/architecture.md lost its message-schemas block"
    assert found.group(1) == aggregation.message_table()
