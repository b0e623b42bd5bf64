"""Every (algorithm, summation protocol, runtime, stage) that can occur, and what it sends.

Issue #33 item 1: each registered algorithm runs one round in-process under each summation
protocol it supports, and the Flower apps run each kind of reply (discovery, training, evaluation,
every stage of every protocol, a diverged reply) over the in-memory grid of
``tests/test_flower_toy.py``. Every message that leaves a silo is recorded where the server
receives it and checked against its declared schema (:mod:`pdpfl.fl.messages`, context-free:
names, types, dtypes, finiteness; the silo's gate already sized it with the full context), and
each case must send exactly the messages listed for it. The coverage test fails when an
algorithm, a protocol or a declared message is added without a case here -- and a stage
without a schema is refused at the silo, so its case fails.

Toy size: scikit-learn's breast-cancer data (30 features) over 3 silos, one round (two on
Flower, so that a training request travels with the previous evaluation), private weighting with
1024-bit Paillier keys (``allow_weak_keys``: no message's form depends on the key size).
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

import pytest

from pdpfl.config import ALGORITHMS, config_from_dict, config_to_dict
from pdpfl.fl import aggregation
from pdpfl.fl.aggregation.private_weighting import PrivateWeightedSum
from pdpfl.fl.algorithm import as_algorithm
from pdpfl.fl.api import contribution_payload
from pdpfl.fl.messages import (
    DIVERGED_REPLY,
    EVALUATE_REPLY,
    HELLO_REPLY,
    SILO_INFO,
    TRAIN_REPLY,
    MessageId,
    check_outgoing,
    declared,
)
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

BASE: dict[str, Any] = {
    "name": "message-enumeration",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 3},
    "model": {"name": "logreg"},
    "algorithm": {"name": "rpdp"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [1.0, 2.0, 5.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
    "training": {"rounds": 1, "local_steps": 1, "batch_size": 8, "lr": 0.3},
    # public data (sklearn's breast-cancer): every case re-runs it, and the non-DP algorithms
    # would be refused by the lifetime budget store otherwise
    "lifetime": {"allow_respend": True},
}
WEAK = {"paillier_bits": 1024, "n_max": 600, "allow_weak_keys": True, "workers": 1}

SECURE = frozenset(
    {("secure", s) for s in ("advertise", "share", "upload", "consistency", "unmask")}
)
WEIGHTING = frozenset(
    ("private-weighting", s)
    for s in ("setup-keys", "setup-seed", "setup-histogram", "weights", "install", "round")
)
OBLIVIOUS = WEIGHTING | {("private-weighting", "weights-ot")}
PLAIN = frozenset({TRAIN_REPLY, EVALUATE_REPLY})

_PW = ["algorithm.weights=private"]
_PRIVATE_SAMPLING = [*_PW, "algorithm.user_rate=0.5", "algorithm.subsampling=private"]

#: Algorithms whose silos can use private weighting (ULDP-FL ``weights: private``).
PRIVATE_WEIGHTING = ("uldp-avg", "uldp-sgd")
#: One silo (the pooled data): a secure round never reaches t >= 2, no stage runs.
ONE_SILO = ("centralized", "centralized-filter")
#: (algorithm, overrides) the configuration refuses: these combinations cannot occur.
REFUSED: list[tuple[str, list[str]]] = [
    ("idp-fedavg", ["aggregation=secure"]),  # central IDP-FedAvg clips at the aggregator
    *((n, _PW) for n in ALGORITHMS.names() if n not in PRIVATE_WEIGHTING),
]


def _in_process_cases() -> dict[str, tuple[str, list[str], frozenset[MessageId]]]:
    """case -> (algorithm, overrides, the messages its silos send in one round): every
    registered algorithm under plain and secure summation and, where it applies, private
    weighting; then the variants that change what is sent."""
    secure = SECURE | {EVALUATE_REPLY}
    cases: dict[str, tuple[str, list[str], frozenset[MessageId]]] = {}
    for name in ALGORITHMS.names():
        cases[name] = (name, [], PLAIN)
        if (name, ["aggregation=secure"]) not in REFUSED:
            lone = frozenset({EVALUATE_REPLY})
            cases[f"{name}/secure"] = (
                name,
                ["aggregation=secure"],
                lone if name in ONE_SILO else secure,
            )
        if name in PRIVATE_WEIGHTING:
            cases[f"{name}/private-weights"] = (name, _PW, WEIGHTING | {EVALUATE_REPLY})
    return {
        **cases,
        "rpdp/secure-hidden": (
            "rpdp",
            ["aggregation=secure", "participation=hidden", "training.client_rate=0.5"],
            secure,
        ),
        "idp-fedavg/distributed": ("idp-fedavg", ["algorithm.variant=distributed"], PLAIN),
        "idp-fedavg/distributed-secure": (
            "idp-fedavg",
            ["algorithm.variant=distributed", "aggregation=secure"],
            secure,
        ),
        "uldp-sgd/private-weights-server-sampling": (
            "uldp-sgd",
            [*_PW, "algorithm.user_rate=0.5"],
            WEIGHTING | {EVALUATE_REPLY},
        ),
        "uldp-avg/private-subsampling": (
            "uldp-avg",
            [*_PRIVATE_SAMPLING, "algorithm.ot_items=2"],
            OBLIVIOUS | {EVALUATE_REPLY},
        ),
    }


IN_PROCESS = _in_process_cases()

_DISCOVERY = {HELLO_REPLY, SILO_INFO}
#: case -> (algorithm, overrides, rounds, messages) through pdpfl's Flower apps.
ON_FLOWER: dict[str, tuple[str, list[str], int, frozenset[MessageId]]] = {
    "rpdp/plain": ("rpdp", [], 2, PLAIN | _DISCOVERY),
    "idp-fedavg/distributed-secure": (
        "idp-fedavg",
        ["algorithm.variant=distributed", "aggregation=secure"],
        1,
        SECURE | _DISCOVERY | {EVALUATE_REPLY},
    ),
    "uldp-avg/private-subsampling": (
        "uldp-avg",
        [*_PRIVATE_SAMPLING, "algorithm.ot_items=2"],
        1,
        OBLIVIOUS | _DISCOVERY | {EVALUATE_REPLY},
    ),
}
#: The toy silo whose training diverges (tests/test_flower_divergence.py), on Flower.
DIVERGED_CASE = PLAIN | _DISCOVERY | {DIVERGED_REPLY}


def _config(name: str, extra: list[str], rounds: int = 1) -> Any:
    overrides = [f"algorithm.name={name}", *ALGORITHMS.get(name).toy_overrides, *extra]
    return config_from_dict(BASE, [*overrides, f"training.rounds={rounds}"])


def _checked(sent: list[tuple[MessageId, dict[str, Any]]]) -> set[MessageId]:
    """Every recorded message conforms to its schema (context-free); the ids sent."""
    for message, payload in sent:
        check_outgoing(message, payload, None)
    return {m for m, _ in sent}


# ----------------------------------------------------------------------------- coverage


def check_coverage() -> None:
    """Every algorithm, every pdpfl protocol and every declared message has a case here."""
    own = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).__module__.startswith("pdpfl.")]
    for name in own:  # every pdpfl algorithm (not the docs' examples), under every protocol
        for protocol in (["aggregation=secure"], _PW):
            has_case = any(n == name and set(protocol) <= set(e) for n, e, _ in IN_PROCESS.values())
            refused = (name, protocol) in REFUSED
            assert has_case or refused, f"{name} {protocol}: add a case or show it is refused"
    registered = aggregation.silo_protocols()  # loads pdpfl's own protocols
    declared_ids = {s.message for s in declared("pdpfl.")}  # pdpfl's own (not the tests')
    protocols = {p: st for p, st in registered.items() if {(p, s) for s in st} <= declared_ids}
    assert {"secure", "private-weighting"} <= set(protocols)
    sent = {m for _, _, ids in IN_PROCESS.values() for m in ids}
    assert {m[0] for m in sent} >= set(protocols), "add a case for the new protocol"
    sent |= {m for *_, ids in ON_FLOWER.values() for m in ids} | DIVERGED_CASE
    assert declared_ids == sent, (
        f"declared but never sent here: {sorted(declared_ids - sent)}; "
        f"sent but not declared: {sorted(sent - declared_ids)}"
    )
    # every stage of every protocol, in both runtimes
    on_flower = {m for *_, ids in ON_FLOWER.values() for m in ids}
    for protocol, stages in protocols.items():
        assert {(protocol, s) for s in stages} <= on_flower
        assert {(protocol, s) for s in stages} <= {
            m for _, _, ids in IN_PROCESS.values() for m in ids
        }


def test_every_algorithm_protocol_and_declared_message_has_a_case() -> None:
    check_coverage()


def test_a_new_stage_or_message_without_a_case_fails_the_coverage(monkeypatch: Any) -> None:
    from pdpfl.fl.messages import Bytes, Field, MessageSchema
    from pdpfl.fl.messages import schema as registry

    stage = MessageSchema(("secure", "debug"), (Field("x", Bytes(1), "crypto"),))
    monkeypatch.setitem(registry._SCHEMAS, stage.message, stage)
    monkeypatch.setitem(registry._OWNERS, stage.message, "pdpfl.fl.aggregation.secure_silo")
    monkeypatch.setitem(registry._ORDER, stage.message, 10_000)
    monkeypatch.setitem(
        aggregation._SILO_STAGES, "secure", aggregation.silo_protocols()["secure"] | {"debug"}
    )
    with pytest.raises(AssertionError, match="debug"):
        check_coverage()


@pytest.mark.parametrize(("name", "extra"), REFUSED)
def test_the_combinations_left_out_cannot_occur(name: str, extra: list[str]) -> None:
    from pdpfl.config import ConfigError

    with pytest.raises(ConfigError):
        _config(name, extra)


# ----------------------------------------------------------------------------- in-process


class Recording(InProcessTransport):
    """The in-process transport, recording every message as the server receives it."""

    def __init__(self, clients: dict[int, Any]) -> None:
        super().__init__(clients)
        self.sent: list[tuple[MessageId, dict[str, Any]]] = []

    def fit(self, selected, params, round_index, config):  # type: ignore[no-untyped-def]
        out = super().fit(selected, params, round_index, config)
        self.sent += [(TRAIN_REPLY, contribution_payload(c)) for c in out]
        return out

    def evaluate(self, client_ids, params, round_index, config):  # type: ignore[no-untyped-def]
        out = super().evaluate(client_ids, params, round_index, config)
        self.sent += [(EVALUATE_REPLY, dict(e)) for e in out.values()]
        return out

    def exchange(self, protocol, stage, requests, round_index):  # type: ignore[no-untyped-def]
        out = super().exchange(protocol, stage, requests, round_index)
        self.sent += [((protocol, stage), dict(r)) for r in out.values()]
        return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(IN_PROCESS))
def test_in_process_every_message_is_declared(case: str, tmp_path: Path) -> None:
    name, extra, expected = IN_PROCESS[case]
    config = _config(name, extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = as_algorithm(config.algorithm).assemble(config, load_federation_for(config))
        protocol = run.protocol
        if protocol.name == "private-weighting":
            protocol = PrivateWeightedSum(expected_rounds=1, **WEAK)
        transport = Recording(run.clients)
        run_federation(
            run.config, run.server, transport, tmp_path, progress=False, protocol=protocol
        )
    assert _checked(transport.sent) == expected


# ----------------------------------------------------------------------------- Flower

HAS_FLWR = importlib.util.find_spec("flwr") is not None
needs_flwr = pytest.mark.skipif(not HAS_FLWR, reason="flwr is not installed")
if HAS_FLWR:
    from test_flower_toy import task_identity  # noqa: F401  (a fixture)


def recording_grid(*args: Any, **kwargs: Any) -> Any:
    """The in-memory grid of ``tests/test_flower_toy.py``, decoding every reply into the
    declared messages it carries (``messages``) and keeping error replies (``errors``)."""
    from pdpfl.runtime.flower.codec import reply_messages
    from pdpfl.runtime.flower.transport import STAGE
    from test_flower_toy import FakeGrid

    class RecordingGrid(FakeGrid):
        def __init__(self) -> None:
            super().__init__(*args, **kwargs)
            self.stage_of: dict[str, MessageId] = {}
            self.messages: list[tuple[MessageId, dict[str, Any]]] = []
            self.errors: list[str] = []

        def push_messages(self, messages: Any) -> list[str]:
            messages = list(messages)
            ids = super().push_messages(messages)
            for msg, mid in zip(messages, ids, strict=True):
                if STAGE in msg.content.config_records:
                    stage = msg.content.config_records[STAGE]
                    self.stage_of[mid] = (str(stage["protocol"]), str(stage["stage"]))
            return ids

        def pull_messages(self, message_ids: Any) -> list[Any]:
            replies = super().pull_messages(message_ids)
            for reply in replies:
                if reply.has_error():
                    self.errors.append(str(reply.error.reason))
                    continue
                stage = self.stage_of.get(reply.metadata.reply_to_message_id)
                self.messages += reply_messages(reply.content, stage)
            return replies

    return RecordingGrid()


def flower_run_config(config: Any, out: Path, **extra: Any) -> dict[str, Any]:
    from pdpfl.runtime.flower.codec import encode_config

    return {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 60.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 3,
        **extra,
    }


@needs_flwr
@pytest.mark.slow
@pytest.mark.usefixtures("task_identity")
@pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")
@pytest.mark.parametrize("case", list(ON_FLOWER))
def test_on_flower_every_message_is_declared(case: str, tmp_path: Path, monkeypatch: Any) -> None:
    name, extra, rounds, expected = ON_FLOWER[case]
    config = _config(name, extra, rounds)
    # Paillier keys of 1024 bits at both ends (the configuration allows 3072 and more).
    monkeypatch.setitem(
        aggregation._PROTOCOLS,
        "private-weighting",
        lambda **options: PrivateWeightedSum(**{**options, **WEAK}),
    )
    out = tmp_path / "flower"
    grid = recording_grid(
        flower_run_config(config, out), out / "silos", 3, hooks=None, monkeypatch=monkeypatch
    )
    from test_flower_toy import serve

    result = serve(grid, out)
    assert result["status"] == "ok", result.get("error")
    assert grid.errors == []
    assert _checked(grid.messages) == expected


@needs_flwr
@pytest.mark.usefixtures("task_identity")
def test_on_flower_a_diverged_reply_is_declared(tmp_path: Path, monkeypatch: Any) -> None:
    from pdpfl.errors import TrainingDiverged
    from test_flower_divergence import SPEC, WHERE
    from test_flower_toy import serve, toy_config, toy_run_config

    WHERE.clear()
    WHERE.update({"silo": 1, "round": 1})
    out = tmp_path / "flower"
    run_config = {**toy_run_config(toy_config(num_silos=3, rounds=3), out), "pdpfl-hooks": SPEC}
    grid = recording_grid(run_config, out / "silos", 3, hooks=SPEC, monkeypatch=monkeypatch)
    with pytest.raises(TrainingDiverged, match="round 2 at silo 1"):
        serve(grid, out)
    assert _checked(grid.messages) == DIVERGED_CASE
    causes = [p["cause"] for m, p in grid.messages if m == DIVERGED_REPLY]
    # the toy's own cause text is not one of the declared ones: the generic text went instead
    assert causes == ["its training produced a non-finite value, so nothing was released"]
