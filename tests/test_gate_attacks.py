"""Attacks on the privacy boundary that the silo's gate stops (issue #33 item 1).

A silo whose algorithm or protocol handler adds a field, sends a larger array, sends a float
where an integer is declared, or sends NaN is refused *at the silo*, in both runtimes: the
server side receives nothing from it (before the gate, these replies left the silo and only
some of them were caught -- after they had left -- by the server's own checks).

In-process, the server's side is the transport's caller (a summation protocol): the recording
transports below keep what reached it. On Flower, the real ClientApp answers over the in-memory
grid of ``tests/test_flower_toy.py`` and the test keeps every reply the server pulled; a refused
reply is an error reply naming ``PrivacyBoundaryError``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdpfl.fl.aggregation import PlainSum, private_weighting_silo, secure_silo
from pdpfl.fl.aggregation.private_weighting import PrivateWeightedSum
from pdpfl.fl.aggregation.secure import SecureSum
from pdpfl.fl.api import Contribution, PrivacyBoundaryError
from pdpfl.runtime.simulation import InProcessTransport
from test_private_weighting import WEAK, UserServer, _federation
from test_secure_sum import PARAMS, ScriptedClient, Server

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")

TRAINING_ATTACKS = ["extra-metric", "extra-attribute", "larger-array", "float64-update", "nan"]


def tamper_contribution(c: Contribution, kind: str) -> Contribution:
    """What a malicious or buggy algorithm releases instead of its honest contribution."""
    update = [np.array(u, copy=True) for u in c.update]
    if kind == "extra-metric":  # a silo size, not declared public
        return Contribution(update, c.weight, {**c.metrics, "n_train": 120.0})
    if kind == "extra-attribute":
        out = Contribution(update, c.weight, dict(c.metrics))
        out.mean_loss = 0.31  # type: ignore[attr-defined]
        return out
    if kind == "larger-array":  # one more coordinate: room for a record
        update[0] = np.append(update[0].ravel(), np.float32(0.25)).astype(np.float32)
    elif kind == "float64-update":
        update[0] = update[0].astype(np.float64)
    elif kind == "nan":
        update[0].flat[0] = np.nan
    return Contribution(update, c.weight, dict(c.metrics))


class Tampering:
    """A silo (any ClientAlgorithm) whose releases are tampered with after its algorithm ran."""

    def __init__(self, silo: Any, kind: str) -> None:
        self._silo, self._kind = silo, kind

    def fit(self, params: Any, round_index: int, config: Any) -> Contribution:
        return tamper_contribution(self._silo.fit(params, round_index, config), self._kind)

    def evaluate(self, params: Any, round_index: int, config: Any) -> dict[str, Any]:
        metrics = dict(self._silo.evaluate(params, round_index, config))
        if self._kind == "float-n":  # a float where an integer is declared
            metrics["n"] = metrics["n"] + 0.5
        elif self._kind == "extra-evaluation":
            metrics["n_train"] = 120
        return metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._silo, name)


class ServerSide(InProcessTransport):
    """The in-process transport; ``received``: what reached its caller (the server's side)."""

    def __init__(self, clients: dict[int, Any]) -> None:
        super().__init__(clients)
        self.received: list[tuple[str, int, Any]] = []

    def fit(self, selected, params, round_index, config):  # type: ignore[no-untyped-def]
        out = super().fit(selected, params, round_index, config)
        self.received += [("fit", c, x) for c, x in zip(selected, out, strict=True)]
        return out

    def evaluate(self, client_ids, params, round_index, config):  # type: ignore[no-untyped-def]
        out = super().evaluate(client_ids, params, round_index, config)
        self.received += [("evaluate", c, x) for c, x in out.items()]
        return out

    def exchange(self, protocol, stage, requests, round_index):  # type: ignore[no-untyped-def]
        out = super().exchange(protocol, stage, requests, round_index)
        self.received += [(stage, c, x) for c, x in out.items()]
        return out


# ------------------------------------------------------------------------------ in-process


@pytest.mark.parametrize("kind", TRAINING_ATTACKS)
def test_in_process_a_tampered_training_reply_never_reaches_the_server(kind: str) -> None:
    clients = {0: ScriptedClient(0, [(3, 4), (5,)]), 1: ScriptedClient(1, [(3, 4), (5,)])}
    clients[1] = Tampering(clients[1], kind)  # type: ignore[assignment]
    transport = ServerSide(clients)
    with pytest.raises(PrivacyBoundaryError, match="silo 1"):
        PlainSum().collect(transport, [0, 1], PARAMS, 0, {}, Server())
    assert transport.received == []


@pytest.mark.parametrize("kind", ["float-n", "extra-evaluation"])
def test_in_process_a_tampered_evaluation_never_reaches_the_server(kind: str) -> None:
    clients: dict[int, Any] = {0: ScriptedClient(0, [(2,)])}
    clients[1] = Tampering(ScriptedClient(1, [(2,)]), kind)
    transport = ServerSide(clients)
    with pytest.raises(PrivacyBoundaryError, match="silo 1"):
        transport.evaluate([0, 1], [np.zeros(2, np.float32)], 0, {})
    assert transport.received == []


UPLOAD_ATTACKS = ["extra-field", "larger-array", "float-where-int", "nan-weight"]


def tamper_upload(reply: dict[str, Any], kind: str) -> dict[str, Any]:
    """A masked upload changed by a malicious or buggy silo handler."""
    reply = dict(reply)
    masked = np.asarray(reply["masked"])
    if kind == "extra-field":  # the unmasked contribution beside the masked one
        reply["update"] = masked.astype(np.float32)
    elif kind == "larger-array":
        reply["masked"] = np.append(masked, np.uint64(7))
    elif kind == "float-where-int":
        reply["masked"] = masked.astype(np.float64)
    elif kind == "nan-weight":
        reply["weight"] = float("nan")
    return reply


@pytest.mark.parametrize("kind", UPLOAD_ATTACKS)
def test_in_process_a_tampered_stage_reply_never_reaches_the_server(
    kind: str, monkeypatch: Any
) -> None:
    honest = secure_silo._upload

    def upload(ctx: Any, payload: Any, t: int) -> dict[str, Any]:
        reply = honest(ctx, payload, t)
        return tamper_upload(reply, kind) if ctx.silo_id == 1 else reply

    monkeypatch.setattr(secure_silo, "_upload", upload)
    transport = ServerSide({c: ScriptedClient(c, [(3, 4), (5,)]) for c in range(3)})
    with pytest.raises(PrivacyBoundaryError, match="silo 1, message secure/upload"):
        SecureSum().collect(transport, [0, 1, 2], PARAMS, 0, {}, Server())
    assert [s for s, _, _ in transport.received if s == "upload"] == []


@pytest.mark.parametrize("kind", ["extra-field", "larger-blob"])
def test_in_process_a_tampered_private_weighting_reply_never_reaches_the_server(
    kind: str, monkeypatch: Any
) -> None:
    honest = private_weighting_silo._round

    def round_(ctx: Any, payload: Any, t: int) -> dict[str, Any]:
        reply = dict(honest(ctx, payload, t))
        if ctx.silo_id == 2 and kind == "extra-field":  # its noise share in the clear
            reply["noise"] = np.asarray(ctx.client.updates[t].noise, dtype=np.float64)
        elif ctx.silo_id == 2:
            reply["ciphertexts"] += b"\x00" * 16
        return reply

    monkeypatch.setattr(private_weighting_silo, "_round", round_)
    clients, _ = _federation(d=5, seed=3)
    transport = ServerSide(clients)
    with pytest.raises(PrivacyBoundaryError, match="silo 2, message private-weighting/round"):
        PrivateWeightedSum(**WEAK).collect(
            transport, [0, 1, 2], [np.zeros(5, np.float32)], 0, {}, UserServer(6)
        )
    assert [s for s, _, _ in transport.received if s == "round"] == []


# ------------------------------------------------------------------------------ Flower

ATTACK_SPEC = "test_gate_attacks:ATTACK_HOOKS"
#: silo -> tamper kind, set by each Flower test (the ClientApp builds its silos from here).
TAMPER: dict[int, str] = {}


def _attack_hooks() -> Any:
    from test_flower_toy import TOY_HOOKS, ToyClient

    def build(config: Any, silo: int, node_config: Any, public: Any) -> Any:
        client = ToyClient(silo, config.seed)
        return Tampering(client, TAMPER[silo]) if silo in TAMPER else client

    return dataclasses.replace(TOY_HOOKS, build_client=build)


try:
    from test_flower_toy import task_identity  # noqa: F401  (a fixture)

    ATTACK_HOOKS = _attack_hooks()
except pytest.skip.Exception:  # flwr is not installed: the Flower tests below skip
    ATTACK_HOOKS = None


def _carries(reply: Any, field: str) -> bool:
    """Whether a protocol-stage reply carries the array ``field``."""
    arrays = reply.content.array_records.get("payload.arrays")
    return arrays is not None and field in arrays


def _pulled(grid: Any) -> list[tuple[int, Any]]:
    """Wrap ``grid.pull_messages``: every reply the server pulls, with its silo."""
    seen: list[tuple[int, Any]] = []
    nodes = {n: c["partition-id"] for n, c in grid.node_configs.items()}
    pull = grid.pull_messages

    def recording(message_ids: Any) -> list[Any]:
        replies = pull(message_ids)
        seen.extend((nodes.get(r.metadata.src_node_id, -1), r) for r in replies)
        return replies

    grid.pull_messages = recording
    return seen


@pytest.mark.skipif(ATTACK_HOOKS is None, reason="flwr is not installed")
@pytest.mark.usefixtures("task_identity")
def test_on_flower_tampered_replies_never_leave_the_silo(tmp_path: Path, monkeypatch: Any) -> None:
    from test_flower_toy import FakeGrid, serve, toy_config, toy_run_config

    kinds = ["extra-metric", "larger-array", "float64-update", "nan", "float-n"]
    TAMPER.clear()
    TAMPER.update({i + 1: kind for i, kind in enumerate(kinds)})
    out = tmp_path / "flower"
    n = len(kinds) + 1
    run_config = {
        **toy_run_config(toy_config(num_silos=n, rounds=1), out),
        "pdpfl-hooks": ATTACK_SPEC,
    }
    grid = FakeGrid(run_config, out / "silos", n, hooks=ATTACK_SPEC, monkeypatch=monkeypatch)
    seen = _pulled(grid)
    try:
        serve(grid, out)
    except Exception:  # noqa: BLE001 -- what the server makes of it is not the point here
        pass
    for silo, kind in TAMPER.items():
        replies = [r for s, r in seen if s == silo]
        assert replies, f"silo {silo} sent nothing at all"
        carried = [r for r in replies if r.has_content()]
        if kind == "float-n":  # its training reply is honest; its evaluation never left
            assert all("metrics" not in r.content for r in carried), kind
        else:  # no training reply left this silo
            assert all("update" not in r.content for r in carried), kind
        refused = [r.error.reason for r in replies if r.has_error()]
        assert refused and all("PrivacyBoundaryError" in why for why in refused), kind
    honest = [r for s, r in seen if s == 0]
    assert honest and all(r.has_content() for r in honest)


@pytest.mark.slow
@pytest.mark.skipif(ATTACK_HOOKS is None, reason="flwr is not installed")
@pytest.mark.usefixtures("task_identity")
def test_on_flower_a_tampered_masked_upload_never_leaves_the_silo(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """pdpfl's own apps and secure summation: each of four silos tampers with its upload in
    another way; none of them reaches the server (the round ends without an aggregate)."""
    from pdpfl.config import config_from_dict, config_to_dict
    from pdpfl.runtime.flower.codec import encode_config
    from test_flower_toy import FakeGrid, serve

    honest = secure_silo._upload

    def upload(ctx: Any, payload: Any, t: int) -> dict[str, Any]:
        reply = honest(ctx, payload, t)
        kind = dict(enumerate(UPLOAD_ATTACKS, start=1)).get(ctx.silo_id)
        return tamper_upload(reply, kind) if kind else reply

    monkeypatch.setattr(secure_silo, "_upload", upload)
    n = len(UPLOAD_ATTACKS) + 1
    config = config_from_dict(
        {
            "name": "gate-attack",
            "seed": 3,
            "threads": 1,
            "randomness": "reproducible",
            "aggregation": "secure",
            "data": {"dataset": "breast-cancer", "num_clients": n},
            "model": {"name": "logreg"},
            "algorithm": {"name": "privacy-free"},
            "training": {"rounds": 1, "local_steps": 1, "batch_size": 8, "lr": 0.3},
            "lifetime": {"allow_respend": True},  # public data, a non-DP algorithm
        }
    )
    out = tmp_path / "flower"
    run_config = {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 60.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 1,
    }
    grid = FakeGrid(run_config, out / "silos", n, hooks=None, monkeypatch=monkeypatch)
    for node_config in grid.node_configs.values():
        node_config["allow-respend"] = True  # the SuperNodes agree to re-spend public data
    seen = _pulled(grid)
    try:
        serve(grid, out)
    except Exception:  # noqa: BLE001
        pass
    uploads = [s for s, r in seen if r.has_content() and _carries(r, "masked")]
    assert 0 in uploads  # the honest silo's masked upload arrived
    assert set(uploads) == {0}, f"tampered uploads reached the server from {set(uploads) - {0}}"
    errors = [str(r.error.reason) for s, r in seen if s != 0 and r.has_error()]
    assert len(errors) == len(UPLOAD_ATTACKS) and all("PrivacyBoundaryError" in e for e in errors)
