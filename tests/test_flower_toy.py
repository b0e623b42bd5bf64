"""A toy algorithm for the Flower runtime tests, plus fast in-process tests of the plumbing.

The toy silo keeps a ledger (``fits``: how many updates it has released) that must survive
between messages -- in a warm worker the silo stays in memory, in the per-message mode a fresh
process rebuilds it from its state file -- and its updates depend on (seed, round, silo) only,
like pdpfl's algorithms in reproducible mode. The Flower subprocesses import this module through
``PYTHONPATH`` (hooks spec ``test_flower_toy:TOY_HOOKS``).

:class:`FakeGrid` runs the real ServerApp and ClientApp code in this process: every message and
every reply is deflated to Flower's wire objects and inflated again, as between two processes.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pdpfl.fl.api import (
    Aggregate,
    ClientAlgorithm,
    Contribution,
    Params,
    Scalars,
    ServerAlgorithm,
)
from pdpfl.seeding import numpy_generator

pytest.importorskip("flwr")

from pdpfl.runtime.flower.codec import (  # noqa: E402
    config_to_scalars,
    decode_state,
    encode_state,
    params_to_record,
    payload_to_records,
    record_to_params,
    records_to_payload,
    records_to_scalars,
    scalars_to_config,
    scalars_to_records,
)
from pdpfl.runtime.flower.hooks import AppHooks, load_hooks  # noqa: E402

DIM = 5
TOY_SPEC = "test_flower_toy:TOY_HOOKS"


class ToyClient:
    def __init__(self, client_id: int, seed: int, fit_sleep_s: float = 0.0) -> None:
        self.client_id = client_id
        self.seed = seed
        self.fit_sleep_s = fit_sleep_s
        self.target = numpy_generator(seed, "toy-target", client_id).normal(size=DIM)
        self.fits = 0
        self.fit_rounds: list[int] = []
        self.evaluated_until = -1

    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        if self.fit_sleep_s:
            time.sleep(self.fit_sleep_s)
        noise = numpy_generator(self.seed, "toy-noise", round_index, self.client_id).normal(
            scale=0.01, size=DIM
        )
        w = global_params[0].astype(np.float64)
        delta = (float(config["lr"]) * (self.target - w) + noise).astype(np.float32)
        self.fits += 1
        self.fit_rounds.append(round_index)
        return Contribution(update=[delta])

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        self.evaluated_until = max(self.evaluated_until, round_index)
        loss = float(np.mean((params[0] - self.target) ** 2))
        return {"loss": loss, "accuracy": 1.0 / (1.0 + loss), "n": 10}

    def privacy_summary(self) -> None:
        return None  # the toy accounts no privacy unit (its "ledger" is the fits counter)

    def state_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "fit_rounds": np.asarray(self.fit_rounds, dtype=np.int64),
            "evaluated_until": self.evaluated_until,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fits = int(state["fits"])
        self.fit_rounds = [int(r) for r in state["fit_rounds"]]
        self.evaluated_until = int(state["evaluated_until"])


class ToyServer:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False

    def __init__(self, seed: int, client_rate: float = 1.0) -> None:
        self.seed = seed
        self.client_rate = client_rate
        self.participation: dict[int, int] = {}

    def initial_params(self) -> Params:
        return [np.zeros(DIM, dtype=np.float32)]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        if self.client_rate >= 1:
            return list(client_ids)
        coins = numpy_generator(self.seed, "toy-select", round_index).random(len(client_ids))
        return [c for c, u in zip(client_ids, coins, strict=True) if u < self.client_rate]

    def round_config(self, round_index: int) -> Scalars:
        return {"lr": 0.5, "tag": "toy"}

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        if aggregate.empty:
            return global_params
        mean = aggregate.total[0] / aggregate.weight
        return [(global_params[0] + mean).astype(np.float32)]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        for c in selected:
            self.participation[c] = self.participation.get(c, 0) + 1

    def state_dict(self) -> dict[str, Any]:
        return {"participation": dict(self.participation)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}


def toy_config(
    num_silos: int = 2,
    rounds: int = 3,
    seed: int = 7,
    fit_sleep_s: float = 0.0,
    client_rate: float = 1.0,
    aggregation: str = "plain",
):
    return SimpleNamespace(
        seed=seed,
        num_silos=num_silos,
        fit_sleep_s=fit_sleep_s,
        client_rate=client_rate,
        aggregation=aggregation,
        training=SimpleNamespace(rounds=rounds),
    )


def _from_dict(d: dict[str, Any]) -> Any:
    return toy_config(
        d["num_silos"], d["rounds"], d["seed"], d["fit_sleep_s"], d["client_rate"], d["aggregation"]
    )


def _to_dict(c: Any) -> dict[str, Any]:
    return {
        "num_silos": c.num_silos,
        "rounds": c.training.rounds,
        "seed": c.seed,
        "fit_sleep_s": c.fit_sleep_s,
        "client_rate": c.client_rate,
        "aggregation": c.aggregation,
    }


def _run(config: Any, server: Any, transport: Any, out_dir: Path, resume: bool, on_round=None):
    from pdpfl.fl.aggregation import get_protocol
    from pdpfl.runtime.loop import run_federation

    return run_federation(
        config,
        server,
        transport,
        out_dir,
        resume=resume,
        progress=False,
        on_round=on_round,
        protocol=get_protocol(config.aggregation),
    )


def _finish(config: Any, result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from pdpfl.io import save_npz

    save_npz(Path(out_dir) / "model.npz", p000=result["params"][0])
    return {"rounds_completed": len(result["metrics"]), "privacy": result["privacy"]}


TOY_HOOKS = AppHooks(
    config_from_dict=_from_dict,
    config_to_dict=_to_dict,
    num_silos=lambda c: int(c.num_silos),
    # public facts in the form of pdpfl's declared silo info (pdpfl.fl.messages.SILO_INFO)
    silo_info=lambda c, silo, node_config: {
        "input_shape": f"[{DIM}]",
        "num_classes": 1,
        "name": f"toy-{silo}",
    },
    build_server=lambda c, infos: (ToyServer(c.seed, c.client_rate), {"silos": sorted(infos)}),
    build_client=lambda c, silo, node_config, public: ToyClient(silo, c.seed, c.fit_sleep_s),
    run=_run,
    finish=_finish,
)


# ------------------------------------------------ a toy two-stage protocol (sum of ids squared)


def _commitment(salt: bytes, value: int) -> bytes:
    return hashlib.sha256(salt + value.to_bytes(8, "big")).digest()


def toy_silo_handler(stage: str, payload: dict[str, Any], round_index: int, ctx: Any) -> dict:
    """Stage ``commit``: keep a secret (id², a nonce) in the silo's memory, send a commitment;
    stage ``reveal``: send the value and the nonce. ``rounds`` counts this silo's rounds in
    its memory, which must survive between stages *and* rounds at the silo."""
    memory = ctx.memory
    if stage == "commit":
        memory["rounds"] = int(memory.get("rounds", 0)) + 1
        memory["secret"] = {"value": ctx.silo_id**2, "nonce": bytes([ctx.silo_id]) * 16}
        salt = payload["salt"] + memory["secret"]["nonce"]
        return {"commitment": _commitment(salt, memory["secret"]["value"]), "ok": True}
    if stage == "reveal":
        secret = memory.pop("secret")
        return {
            "value": int(secret["value"]),
            "nonce": secret["nonce"],
            "rounds": int(memory["rounds"]),
            "echo": np.asarray(payload["vector"]) * 2,
        }
    raise ValueError(f"unknown stage {stage!r}")


def _toy_schemas() -> tuple[Any, ...]:
    """The replies of the toy protocol's two stages, declared (pdpfl.fl.messages)."""
    from pdpfl.fl.messages import Array, Bool, Bytes, Field, Int, MessageSchema, Rule

    toy = "the toy protocol (tests)"
    vector = Rule("of the request's vector", lambda c: np.shape(c.request["vector"]))
    return (
        MessageSchema(
            ("toy-sum-sq", "commit"),
            (
                Field("commitment", Bytes(32), "crypto", doc="SHA-256 commitment"),
                Field("ok", Bool(True), "public", public_by=toy),
            ),
        ),
        MessageSchema(
            ("toy-sum-sq", "reveal"),
            (
                Field("value", Int(low=0), "public", public_by=toy),
                Field("nonce", Bytes(16), "crypto", doc="the commitment's nonce"),
                Field("rounds", Int(low=1), "public", public_by=toy),
                Field("echo", Array(("int64",), shape=vector), "public", public_by=toy),
            ),
        ),
    )


class ToySumOfSquares:
    """A multi-stage SumProtocol: the server learns Σ id² through two exchanges per round
    (and, to drive the model, the plain sum of the contributions fetched with ``fit``)."""

    name = "toy-sum-sq"
    hides_individual_updates = False
    totals: list[int] = []

    def collect(self, transport, selected, params, round_index, config, server) -> Aggregate:
        from pdpfl.fl.aggregation import sum_contributions

        salt = b"round-%d" % round_index
        commits = transport.exchange(
            self.name, "commit", {s: {"salt": salt} for s in selected}, round_index
        )
        vector = np.arange(3, dtype=np.int64)
        reveals = transport.exchange(
            self.name, "reveal", {s: {"vector": vector} for s in commits}, round_index
        )
        for s, r in reveals.items():
            assert _commitment(salt + r["nonce"], r["value"]) == commits[s]["commitment"]
            np.testing.assert_array_equal(r["echo"], vector * 2)
        ToySumOfSquares.totals.append(sum(r["value"] for r in reveals.values()))
        ToySumOfSquares.rounds_seen = {s: r["rounds"] for s, r in reveals.items()}
        return sum_contributions(transport.fit(selected, params, round_index, config), params)


def register_toy_protocol() -> None:
    from pdpfl.fl import aggregation

    if "toy-sum-sq" not in aggregation._PROTOCOLS:
        aggregation.register_protocol("toy-sum-sq", ToySumOfSquares)
        aggregation.register_silo_handler("toy-sum-sq", toy_silo_handler, schemas=_toy_schemas())


register_toy_protocol()


def toy_simulation(config: Any, out_dir: Path) -> dict[str, Any]:
    """The same toy federation in-process (the reference for the Flower runs)."""
    from pdpfl.runtime.simulation import InProcessTransport

    clients = {i: ToyClient(i, config.seed) for i in range(config.num_silos)}
    server = ToyServer(config.seed, config.client_rate)
    result = _run(config, server, InProcessTransport(clients), out_dir, False)
    result["clients"] = clients
    return result


# ------------------------------------------------------------------ fast tests (no processes)


def test_toy_satisfies_the_protocols() -> None:
    assert isinstance(ToyClient(0, 1), ClientAlgorithm)
    assert isinstance(ToyServer(1), ServerAlgorithm)
    assert load_hooks(TOY_SPEC) is TOY_HOOKS


def test_load_hooks_rejects_bad_specs() -> None:
    with pytest.raises(ValueError, match="module:attribute"):
        load_hooks("no_colon_here")
    with pytest.raises(TypeError, match="not an AppHooks"):
        load_hooks("test_flower_toy:toy_config")


def test_params_round_trip_bit_exact() -> None:
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(3, 4)).astype(np.float32), np.arange(5, dtype=np.float32)]
    back = record_to_params(params_to_record(params))
    assert [p.dtype for p in back] == [np.float32, np.float32]
    for a, b in zip(params, back, strict=True):
        np.testing.assert_array_equal(a, b)


def test_scalars_round_trip_keeps_types() -> None:
    values = {"lr": 0.1, "t": 3, "name": "x", "flag": True, "none": None, "nan": float("nan")}
    back = config_to_scalars(scalars_to_config(values))
    assert back["lr"] == 0.1 and back["t"] == 3 and back["name"] == "x"
    assert back["flag"] is True and back["none"] is None and np.isnan(back["nan"])
    metrics = {"loss": 0.5, "n": np.int64(4), "group": "a", "ok": False}
    m, rest = scalars_to_records(metrics)
    assert set(m) == {"loss", "n"}
    assert records_to_scalars(m, rest) == {"loss": 0.5, "n": 4, "group": "a", "ok": False}


def test_payload_round_trip_and_refusals() -> None:
    from flwr.app import RecordDict

    payload = {
        "key": b"\x00\x01secret-free",
        "n": 3,
        "x": 2.5,
        "flag": False,
        "name": "s",
        "mask": np.arange(6, dtype=np.uint64).reshape(2, 3),
        "bits": np.array([True, False]),
        "np_int": np.int32(7),
    }
    rd = _wire(RecordDict(payload_to_records(payload)))
    back = records_to_payload(set(rd.keys()), rd)
    assert back["key"] == payload["key"] and back["n"] == 3 and back["x"] == 2.5
    assert back["flag"] is False and back["name"] == "s" and back["np_int"] == 7
    assert back["mask"].dtype == np.uint64 and back["mask"].shape == (2, 3)
    np.testing.assert_array_equal(back["mask"], payload["mask"])
    assert back["bits"].dtype == bool
    with pytest.raises(TypeError, match=r"payload\['obj'\]"):
        payload_to_records({"obj": object()})
    with pytest.raises(TypeError, match="numeric"):
        payload_to_records({"s": np.array(["a"])})
    from pdpfl.fl.api import PrivacyBoundaryError

    rd["extra"] = rd["payload.values"]
    with pytest.raises(PrivacyBoundaryError, match="only"):
        records_to_payload(set(rd.keys()), rd)


def test_state_codec_round_trip() -> None:
    torch = pytest.importorskip("torch")
    state = {
        "fits": 3,
        1: {"eps": np.array([0.5, 1.0]), "mask": np.array([True, False])},
        "list": [1, 2.5, None, "s", (4, 5)],
        "inf": float("inf"),
        "tensor": torch.arange(3.0),
    }
    back = decode_state(encode_state(state))
    assert back["fits"] == 3 and back["list"] == [1, 2.5, None, "s", [4, 5]]
    np.testing.assert_array_equal(back[1]["eps"], state[1]["eps"])
    assert back[1]["mask"].dtype == bool and back["inf"] == float("inf")
    assert torch.equal(back["tensor"], state["tensor"])
    with pytest.raises(TypeError, match="cannot store"):
        encode_state({"bad": object()})


def test_protocol_memory_codec_keeps_bytes() -> None:
    from pdpfl.runtime.flower.silo import decode_memory, encode_memory

    memory = {"rounds": 2, "secret": {"nonce": b"\x00" * 4, "v": 9}, "arr": np.ones(2)}
    back = decode_memory(encode_memory(memory))
    assert back["secret"]["nonce"] == b"\x00" * 4 and back["rounds"] == 2
    with pytest.raises(TypeError, match="per-message mode"):
        encode_memory({"key": object()})


def test_worker_refuses_non_loopback_runtime_apis(tmp_path: Path) -> None:
    from pdpfl.runtime.flower.worker import check_loopback, main, read_secret, write_secret

    assert check_loopback("127.0.0.1:9094") == "127.0.0.1:9094"
    assert check_loopback("[::1]:9094") == "[::1]:9094"
    for bad in ("10.0.0.5:9094", "example.org:1", "nohost"):
        with pytest.raises(ValueError, match="--runtime-api"):
            check_loopback(bad)
    secret = write_secret(tmp_path / "s" / "secret")
    assert len(read_secret(secret)) == 64 and (secret.stat().st_mode & 0o777) == 0o600
    secret.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_secret(secret)
    with pytest.raises(SystemExit):
        main(["--runtime-api", "10.0.0.5:9094"])


# ------------------------------------- the real ServerApp + ClientApp over an in-memory grid


def _wire(obj: Any) -> Any:
    """``obj`` after a trip over the wire: deflated to Flower's objects and inflated again."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    contents = {k: o.deflate() for k, o in get_all_nested_objects(obj).items()}
    return inflate_object_from_contents(obj.object_id, contents)


class FakeGrid:
    """A Grid that delivers each message (over a simulated wire) to the pdpfl ClientApp of its
    node, in push order, as one SuperNode per silo would.

    ``mode="warm"``: silos stay in memory between messages (a warm worker);
    ``mode="per-message"``: every message is handled as by a fresh process (the silo is rebuilt
    from its state folder). ``dead`` nodes never reply; ``failing`` nodes reply with an error.
    """

    def __init__(
        self,
        run_config: dict[str, Any],
        state_root: Path,
        num_silos: int,
        *,
        mode: str = "warm",
        hooks: str | None = TOY_SPEC,
        monkeypatch: Any = None,
    ) -> None:
        self.run_config = run_config
        self.mode = mode
        self.monkeypatch = monkeypatch
        from pdpfl.runtime.identities import provision_silos

        # each silo's long-term identity in its state folder, the public keys given out of band
        provision_silos(
            {i: state_root / f"silo-{i}" for i in range(num_silos)}, state_root / "keys"
        )
        self.node_configs = {
            1000 + 7 * i: {
                "partition-id": i,
                "num-partitions": num_silos,
                "state-dir": str(state_root / f"silo-{i}"),
                "peer-keys": str(state_root / "keys"),
                **({"hooks": hooks} if hooks else {}),
            }
            for i in range(num_silos)
        }
        self.dead: set[int] = set()
        self.failing: set[int] = set()
        self.sent: list[tuple[int, str]] = []
        self._replies: dict[str, Any] = {}

    def node_of(self, silo: int) -> int:
        return next(n for n, c in self.node_configs.items() if c["partition-id"] == silo)

    def get_node_ids(self) -> list[int]:
        return list(self.node_configs)

    def push_messages(self, messages: Any) -> list[str]:
        from flwr.app import Context, Error, Message, RecordDict

        from pdpfl.runtime.flower.apps import client_app
        from pdpfl.runtime.flower.silo import HOST
        from pdpfl.runtime.flower.worker import WARM_ENV

        ids = []
        for msg in messages:
            msg = _wire(msg)
            mid = msg.object_id
            msg.metadata.__dict__["_message_id"] = mid
            node = msg.metadata.dst_node_id
            self.sent.append((node, msg.metadata.message_type))
            ids.append(mid)
            if node in self.dead:
                continue
            if node in self.failing:
                self._replies[mid] = Message(Error(code=1, reason="boom"), reply_to=msg)
                continue
            context = Context(
                run_id=1,
                node_id=node,
                node_config=dict(self.node_configs[node]),
                state=RecordDict(),
                run_config=dict(self.run_config),
            )
            if self.mode == "per-message":
                HOST.clear()  # a fresh process knows nothing
                self.monkeypatch.delenv(WARM_ENV, raising=False)
            else:
                self.monkeypatch.setenv(WARM_ENV, "1")
            try:
                reply = client_app(msg, context)
            except Exception as err:  # what flwr-clientapp does with an exception
                reply = Message(Error(code=2, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
            self._replies[mid] = _wire(reply) if reply.has_content() else reply
        return ids

    def pull_messages(self, message_ids: Any) -> list[Any]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]


@pytest.fixture
def task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    from pdpfl.runtime.flower.silo import HOST

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    HOST.clear()
    yield
    HOST.clear()
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def serve(grid: FakeGrid, out: Path) -> dict[str, Any]:
    from flwr.app import Context, RecordDict

    from pdpfl.runtime.flower.apps import _main

    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=grid.run_config
    )
    try:
        _main(grid, context)
    finally:
        result = json.loads((out / "flower" / "server_result.json").read_text())
    return result


def toy_run_config(config: Any, out: Path, **extra: Any) -> dict[str, Any]:
    from pdpfl.runtime.flower.codec import encode_config

    return {
        "pdpfl-config": encode_config(_to_dict(config)),
        "pdpfl-hooks": TOY_SPEC,
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 5.0,
        "pdpfl-startup-timeout": 5.0,
        "pdpfl-min-silos": 1,
        **extra,
    }


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _silo_state(out: Path, silo: int, run_key: str) -> dict[str, Any]:
    from pdpfl.integrity import unseal

    path = out / "silo-state" / f"silo-{silo}" / f"run-{run_key}" / f"silo-{silo}.npz"
    payload, _ = unseal(path.read_bytes(), purpose="silo-state", party=f"silo-{silo}")
    return decode_state(payload)


@pytest.mark.parametrize("mode", ["warm", "per-message"])
@pytest.mark.parametrize("client_rate", [1.0, 0.5])
def test_apps_reproduce_the_simulation_exactly(
    tmp_path: Path, task_identity: None, monkeypatch: Any, mode: str, client_rate: float
) -> None:
    config = toy_config(num_silos=3, rounds=4, client_rate=client_rate)
    ref = toy_simulation(config, tmp_path / "sim")
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out), out / "silo-state", 3, mode=mode,
                    monkeypatch=monkeypatch)  # fmt: skip
    result = serve(grid, out)
    assert result["status"] == "ok" and result["lost"] == {}
    model = np.load(out / "model.npz")["p000"]
    np.testing.assert_array_equal(model, ref["params"][0])
    sim_lines = _lines(tmp_path / "sim" / "metrics.jsonl")
    flw_lines = _lines(out / "metrics.jsonl")
    assert [m["selected"] for m in flw_lines] == [m["selected"] for m in sim_lines]
    # State survived between messages at each silo, and is on the silo's disk.
    for silo in range(3):
        state = _silo_state(out, silo, result["run_key"])
        assert state["fits"] == ref["clients"][silo].fits
        assert state["fit_rounds"].tolist() == ref["clients"][silo].fit_rounds
        assert state["evaluated_until"] == 3
    # The coordinator's summary holds no silo privacy summary: they stay at the silos.
    assert result["summary"]["privacy"] is None  # (typed summary: None when nothing is seen)
    # The same evaluations as in the simulator, round by round.
    assert [m["accuracy"] for m in flw_lines] == [m["accuracy"] for m in sim_lines]
    assert [m["loss"] for m in flw_lines] == [m["loss"] for m in sim_lines]
    # Round t's evaluation travelled with round t + 1's training request (one message per
    # selected silo): a separate training exchange only in the first round.
    events = _lines(out / "flower" / "transport.jsonl")
    sent = [e for e in events if "sent" in e]
    first_fit = [0] * bool(sim_lines[0]["selected"])
    assert [e["round"] for e in sent if e["action"] == "fit"] == first_fit
    assert [(e["round"], e["sent"]) for e in sent if e["action"] == "fit+evaluate"] == [
        (m["round"], m["selected"]) for m in sim_lines[1:] if m["selected"]
    ]
    # At every silo: its evaluation of round t comes before (or with) its training of t + 1.
    for silo in range(3):
        types = [t for node, t in grid.sent if node == grid.node_of(silo)]
        rounds = [m["round"] for m in sim_lines if silo in m["selected"]]
        expected = ["query.hello"] + ["train"] * (0 in rounds)
        for t in range(4):
            expected += ["train" if t + 1 in rounds else "evaluate"]
        assert types == expected


@pytest.mark.parametrize("tamper", ["extra-metric", "extra-record", "no-metrics"])
def test_a_combined_reply_with_anything_else_is_refused(
    tmp_path: Path, task_identity: None, monkeypatch: Any, tamper: str
) -> None:
    """A silo whose training + evaluation reply carries a field beyond its Contribution and the
    three test metrics (here: its training-set size) stops the run at the server."""
    from flwr.app import ConfigRecord, MetricRecord

    from pdpfl.fl.api import PrivacyBoundaryError

    config = toy_config(num_silos=2, rounds=3)
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out), out / "silo-state", 2, monkeypatch=monkeypatch)
    original_pull = grid.pull_messages

    def pull(message_ids: Any) -> list[Any]:
        replies = original_pull(message_ids)
        for reply in replies:
            content = reply.content
            if "metrics" not in content or "update" not in content:
                continue
            if tamper == "extra-metric":
                values = dict(content.metric_records["metrics"].items())
                content["metrics"] = MetricRecord({**values, "n_train": 123})
            elif tamper == "extra-record":
                content["info"] = ConfigRecord({"num_examples": 123})
            else:
                del content["metrics"]
        return replies

    grid.pull_messages = pull  # type: ignore[method-assign]
    with pytest.raises(PrivacyBoundaryError, match="silo"):
        serve(grid, out)
    # Round 0's evaluation travelled with round 1's training: no round was recorded.
    assert not (out / "metrics.jsonl").exists()
    result = json.loads((out / "flower" / "server_result.json").read_text())
    assert result["status"] == "error" and "PrivacyBoundaryError" in result["error"]


def test_failing_silo_is_dropped_and_its_charges_kept(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    config = toy_config(num_silos=3, rounds=3)
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out, **{"pdpfl-round-timeout": 0.3}),
                    out / "silo-state", 3, monkeypatch=monkeypatch)  # fmt: skip
    dead, failing = grid.node_of(1), grid.node_of(2)
    original_push = grid.push_messages

    def push(messages: Any) -> list[str]:
        ids = original_push(messages)
        # Silo 1 crashes, and silo 2 starts failing, after the first round's training.
        if any(t == "train" for _, t in grid.sent):
            grid.dead.add(dead)
            grid.failing.add(failing)
        return ids

    grid.push_messages = push  # type: ignore[method-assign]
    result = serve(grid, out)
    assert result["status"] == "ok"
    assert sorted(result["lost"]) == ["1", "2"]
    # Lost silos are not contacted again after the exchange in which they failed: round 0's
    # evaluation, which travelled with round 1's training request.
    trains = [i for i, (_, t) in enumerate(grid.sent) if t == "train"]
    assert len(trains) >= 6 and trains[3:6] == list(range(trains[3], trains[3] + 3))
    assert {node for node, _ in grid.sent[trains[3] : trains[3] + 3]} == set(grid.node_configs)
    later = [node for node, _ in grid.sent[trains[3] + 3 :]]
    assert later and dead not in later and failing not in later
    # Their ledgers hold every update they released (round 0), never less.
    assert _silo_state(out, 1, result["run_key"])["fits"] >= 1
    assert _silo_state(out, 0, result["run_key"])["fits"] == 3


def test_run_aborts_when_fewer_than_min_silos_remain(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    config = toy_config(num_silos=2, rounds=2)
    out = tmp_path / "flower"
    run_config = toy_run_config(config, out, **{"pdpfl-round-timeout": 0.3, "pdpfl-min-silos": 2})
    grid = FakeGrid(run_config, out / "silo-state", 2, monkeypatch=monkeypatch)
    original_push = grid.push_messages

    def push(messages: Any) -> list[str]:
        if any(t == "train" for _, t in grid.sent):
            grid.dead.add(grid.node_of(0))
        return original_push(messages)

    grid.push_messages = push  # type: ignore[method-assign]
    from pdpfl.runtime.flower.transport import FlowerRunError

    with pytest.raises(FlowerRunError, match="min_silos=2"):
        serve(grid, out)
    result = json.loads((out / "flower" / "server_result.json").read_text())
    assert result["status"] == "error" and "silo 0" in result["error"]


def test_bad_partition_ids_are_rejected(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError

    config = toy_config(num_silos=2, rounds=1)
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out), out / "silo-state", 2, monkeypatch=monkeypatch)
    for node_config in grid.node_configs.values():
        node_config["partition-id"] = 0  # both SuperNodes claim silo 0
    with pytest.raises(FlowerRunError, match="partition-id=0 already taken"):
        serve(grid, out)


def test_silo_refuses_hooks_it_did_not_agree_to(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError

    config = toy_config(num_silos=2, rounds=1)
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out), out / "s", 2, hooks=None, monkeypatch=monkeypatch)
    with pytest.raises(FlowerRunError, match="only loads pdpfl's own hooks"):
        serve(grid, out)


def test_resume_refuses_a_checkpoint_holding_silo_states() -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError, FlowerTransport

    transport = FlowerTransport(grid=None, silo_nodes={0: 11, 1: 12}, run_key="abc")
    transport.load_client_states(transport.client_states())  # Flower's own references: fine
    with pytest.raises(FlowerRunError, match="runtime: simulation"):
        transport.load_client_states({0: {"fits": 3}})
    with pytest.raises(FlowerRunError, match="belongs to run zzz"):
        transport.load_client_states({0: {"location": "silo", "run_key": "zzz"}})


def test_missing_silo_is_named_after_the_startup_timeout(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError

    config = toy_config(num_silos=3, rounds=1)
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out, **{"pdpfl-startup-timeout": 1.0}), out / "s", 3,
                    monkeypatch=monkeypatch)  # fmt: skip
    del grid.node_configs[grid.node_of(1)]  # silo 1's SuperNode never connects
    grid.dead.add(grid.node_of(2))  # silo 2's connects but never answers
    with pytest.raises(FlowerRunError, match=r"silos \[1, 2\] did not connect within 1 s") as err:
        serve(grid, out)
    assert "2 SuperNode(s) connected, 1 of them did not answer" in str(err.value)
    status = json.loads((out / "flower" / "status.json").read_text())
    assert status["phase"] == "error" and status["ready"] == [0] and status["missing"] == [1, 2]


def _asks_evaluation(msg: Any) -> bool:
    """An evaluation request: its own message, or within the next round's training request."""
    from pdpfl.runtime.flower.transport import EVALUATE_FIRST

    return msg.metadata.message_type == "evaluate" or EVALUATE_FIRST in msg.content.config_records


def test_resume_requires_every_silo_to_hold_its_state(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    """A silo that lost its state folder would restart its ledger from zero: refused."""
    import shutil

    from pdpfl.runtime.flower.transport import FlowerRunError

    config = toy_config(num_silos=2, rounds=3)
    out = tmp_path / "flower"
    first = FakeGrid(toy_run_config(config, out), out / "silo-state", 2, monkeypatch=monkeypatch)
    original_push = first.push_messages

    evaluations = []

    def push(messages: Any) -> list[str]:  # the server dies in round 2 (before evaluating)
        if any(_asks_evaluation(m) for m in messages):
            evaluations.append(1)
            if len(evaluations) == 2:
                raise KeyboardInterrupt
        return original_push(messages)

    first.push_messages = push  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        serve(first, out)
    assert len(_lines(out / "metrics.jsonl")) == 1
    run_key = (out / "flower" / "run_key").read_text().strip()
    resume = toy_run_config(config, out, **{"pdpfl-resume": True})
    shutil.rmtree(out / "silo-state" / "silo-1" / f"run-{run_key}")
    with pytest.raises(FlowerRunError, match="silo 1 .* has no state for run"):
        serve(FakeGrid(resume, out / "silo-state", 2, monkeypatch=monkeypatch), out)


@pytest.mark.parametrize("mode", ["warm", "per-message"])
def test_resumed_run_replays_releases_instead_of_charging_twice(
    tmp_path: Path, task_identity: None, monkeypatch: Any, mode: str
) -> None:
    """Interrupted after round 2 was trained (its request travelled with round 1's evaluation)
    but before it was evaluated, the resumed run asks again; the silos answer with the very
    same releases (nothing charged twice, no new noise), so the result equals an uninterrupted
    run."""
    from pdpfl.runtime.flower.silo import HOST

    config = toy_config(num_silos=3, rounds=4)
    ref = toy_simulation(config, tmp_path / "sim")
    out = tmp_path / "flower"
    first = FakeGrid(toy_run_config(config, out), out / "silo-state", 3, mode=mode,
                     monkeypatch=monkeypatch)  # fmt: skip
    original_push = first.push_messages

    evaluations = []

    def push(messages: Any) -> list[str]:  # the server dies before evaluating round 2
        if any(_asks_evaluation(m) for m in messages):
            evaluations.append(1)
            if len(evaluations) == 3:
                raise KeyboardInterrupt
        return original_push(messages)

    first.push_messages = push  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        serve(first, out)
    assert [m["round"] for m in _lines(out / "metrics.jsonl")] == [0, 1]
    run_key = (out / "flower" / "run_key").read_text().strip()
    # Round 2 (the interrupted one) and round 3 (announced with it) were trained... or not yet:
    # whatever was released is in the silo's ledger.
    trained = _silo_state(out, 0, run_key)["fits"]
    assert trained in (3, 4)
    HOST.clear()  # the workers restart with the run
    resume = toy_run_config(config, out, **{"pdpfl-resume": True})
    result = serve(FakeGrid(resume, out / "silo-state", 3, mode=mode, monkeypatch=monkeypatch), out)
    assert result["status"] == "ok" and result["run_key"] == run_key
    np.testing.assert_array_equal(np.load(out / "model.npz")["p000"], ref["params"][0])
    for silo in range(3):
        state = _silo_state(out, silo, run_key)
        assert state["fits"] == 4 and state["fit_rounds"].tolist() == [0, 1, 2, 3]
        timings = _lines(out / "silo-state" / f"silo-{silo}" / f"run-{run_key}" /
                         f"timings-silo-{silo}.jsonl")  # fmt: skip
        replays = [t["round"] for t in timings if t["action"] == "fit-replay"]
        assert replays == list(range(2, trained))


@pytest.mark.parametrize("mode", ["warm", "per-message"])
def test_multi_stage_protocol_on_flower(
    tmp_path: Path, task_identity: None, monkeypatch: Any, mode: str
) -> None:
    """Two stages per round through ``FlowerTransport.exchange``: the silo's memory persists
    between stages and rounds at the silo and never travels; the result equals the simulator's."""
    log = tmp_path / "messages.jsonl"
    monkeypatch.setenv("PDPFL_MESSAGE_LOG", str(log))
    config = toy_config(num_silos=3, rounds=3, aggregation="toy-sum-sq")
    ToySumOfSquares.totals = []
    ref = toy_simulation(config, tmp_path / "sim")
    assert ToySumOfSquares.totals == [5, 5, 5]
    assert ToySumOfSquares.rounds_seen == {0: 3, 1: 3, 2: 3}
    ToySumOfSquares.totals = []
    ToySumOfSquares.rounds_seen = {}
    out = tmp_path / "flower"
    grid = FakeGrid(toy_run_config(config, out), out / "silo-state", 3, mode=mode,
                    monkeypatch=monkeypatch)  # fmt: skip
    result = serve(grid, out)
    assert result["status"] == "ok", result.get("error")
    assert ToySumOfSquares.totals == [5, 5, 5]  # 0² + 1² + 2² each round
    assert ToySumOfSquares.rounds_seen == {0: 3, 1: 3, 2: 3}  # memory survived 3 rounds
    np.testing.assert_array_equal(np.load(out / "model.npz")["p000"], ref["params"][0])
    stages = _lines(log)
    commit = [s for s in stages if s["action"] == "stage:toy-sum-sq/commit"]
    reveal = [s for s in stages if s["action"] == "stage:toy-sum-sq/reveal"]
    assert len(commit) == len(reveal) == 9
    assert all(s["records"] == {"payload.arrays": [], "payload.values": ["commitment", "ok"]}
               for s in commit)  # fmt: skip
    assert all(s["records"] == {"payload.arrays": ["echo"],
                                "payload.values": ["nonce", "rounds", "value"]}
               for s in reveal)  # fmt: skip
    # No prefetch under a multi-stage protocol: fit is always a fresh request.
    events = _lines(out / "flower" / "transport.jsonl")
    assert not any(e.get("prefetched") for e in events)
    memory_files = list((out / "silo-state").rglob("protocol-memory-silo-*.npz"))
    # Per-message processes must keep the memory on the silo's disk; a warm worker never does.
    assert bool(memory_files) == (mode == "per-message")


def test_exchange_loses_a_failing_silo(tmp_path: Path, task_identity: None, monkeypatch) -> None:
    from pdpfl.runtime.flower.transport import FlowerTransport

    grid = FakeGrid(toy_run_config(toy_config(2), tmp_path), tmp_path / "s", 2,
                    monkeypatch=monkeypatch)  # fmt: skip
    grid.failing.add(grid.node_of(1))
    transport = FlowerTransport(
        grid, {0: grid.node_of(0), 1: grid.node_of(1)}, run_key="k", public={}
    )
    replies = transport.exchange("toy-sum-sq", "commit", {0: {"salt": b"x"}, 1: {"salt": b"x"}}, 0)
    assert list(replies) == [0] and "error boom" in transport.lost[1]
    with pytest.raises(ValueError, match="unknown silo 5"):
        transport.exchange("toy-sum-sq", "commit", {5: {}}, 0)


def test_a_pinned_silo_refuses_any_other_experiment(
    tmp_path: Path, task_identity: None, monkeypatch: Any
) -> None:
    from pdpfl.runtime.flower.hooks import config_digest
    from pdpfl.runtime.flower.transport import FlowerRunError

    agreed = toy_config(num_silos=2, rounds=1)
    for config, ok in ((agreed, True), (toy_config(num_silos=2, rounds=1, seed=8), False)):
        out = tmp_path / f"run-{ok}"
        grid = FakeGrid(toy_run_config(config, out), out / "s", 2, monkeypatch=monkeypatch)
        for node_config in grid.node_configs.values():
            node_config["config-hash"] = config_digest(_to_dict(agreed))
        if ok:
            assert serve(grid, out)["status"] == "ok"
        else:
            with pytest.raises(FlowerRunError, match="only runs the experiment it was started"):
                serve(grid, out)


def test_round_loop_announces_each_next_round_once(tmp_path: Path) -> None:
    """The loop computes each round's selection once, announces round t + 1 right after
    aggregating round t (never past the last round, never under a multi-stage protocol), and
    then trains exactly what it announced."""
    from pdpfl.runtime.simulation import InProcessTransport

    class Recording(InProcessTransport):
        def __init__(self, clients: dict[int, ToyClient]) -> None:
            super().__init__(clients)
            self.events: list[tuple] = []

        def prefetch_fit(self, selected, params, round_index, config) -> None:
            self.events.append(("announce", round_index, list(selected), params[0].copy()))

        def fit(self, selected, params, round_index, config):
            self.events.append(("fit", round_index, list(selected), params[0].copy()))
            return super().fit(selected, params, round_index, config)

        def evaluate(self, client_ids, params, round_index, config):
            self.events.append(("evaluate", round_index))
            return super().evaluate(client_ids, params, round_index, config)

    class CountingServer(ToyServer):
        calls: list[int] = []

        def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
            self.calls.append(round_index)
            return super().select_clients(round_index, client_ids)

    config = toy_config(num_silos=4, rounds=4, client_rate=0.6)
    ref = toy_simulation(config, tmp_path / "ref")
    clients = {i: ToyClient(i, config.seed) for i in range(4)}
    transport, server = Recording(clients), CountingServer(config.seed, config.client_rate)
    result = _run(config, server, transport, tmp_path / "run", False)
    np.testing.assert_array_equal(result["params"][0], ref["params"][0])
    assert server.calls == [0, 1, 2, 3]  # once per round
    kinds = [e[0] for e in transport.events]
    assert kinds.count("evaluate") == 4 and "announce" in kinds
    for i, event in enumerate(transport.events):
        if event[0] == "announce":
            t = event[1]
            assert transport.events[i + 1] == ("evaluate", t - 1)  # before round t - 1's eval
            fit = next(e for e in transport.events if e[0] == "fit" and e[1] == t)
            assert fit[2] == event[2]
            np.testing.assert_array_equal(fit[3], event[3])
    assert all(e[1] < 4 for e in transport.events if e[0] == "announce")
    # A multi-stage protocol is never announced ahead.
    ToySumOfSquares.totals = []
    transport = Recording({i: ToyClient(i, config.seed) for i in range(4)})
    _run(toy_config(num_silos=4, rounds=2, aggregation="toy-sum-sq"), ToyServer(7), transport,
         tmp_path / "stages", False)  # fmt: skip
    assert not any(e[0] == "announce" for e in transport.events)
