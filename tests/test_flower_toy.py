"""A toy algorithm for the Flower runtime tests, plus fast in-process tests of the plumbing.

The toy silo keeps a ledger (``fits``: how many updates it has released) that must survive
between messages -- a SuperNode starts a fresh ClientApp process for each message -- and its
updates depend on (seed, round, silo) only, like pdpfl's algorithms. The Flower subprocesses
import this module through ``PYTHONPATH`` (hooks spec ``test_flower_toy:TOY_HOOKS``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pdpfl.fl.api import ClientAlgorithm, ClientUpdate, Params, Scalars, ServerAlgorithm
from pdpfl.seeding import numpy_generator

pytest.importorskip("flwr")

from pdpfl.runtime.flower.codec import (  # noqa: E402
    config_to_scalars,
    decode_state,
    encode_state,
    params_to_record,
    record_to_params,
    records_to_scalars,
    scalars_to_config,
    scalars_to_records,
)
from pdpfl.runtime.flower.hooks import AppHooks, load_hooks  # noqa: E402

DIM = 5


class ToyClient:
    def __init__(self, client_id: int, seed: int, fit_sleep_s: float = 0.0) -> None:
        self.client_id = client_id
        self.seed = seed
        self.fit_sleep_s = fit_sleep_s
        self.target = numpy_generator(seed, "toy-target", client_id).normal(size=DIM)
        self.fits = 0
        self.fit_rounds: list[int] = []
        self.evaluated_until = -1

    def fit(self, global_params: Params, round_index: int, config: Scalars) -> ClientUpdate:
        if self.fit_sleep_s:
            time.sleep(self.fit_sleep_s)
        noise = numpy_generator(self.seed, "toy-noise", round_index, self.client_id).normal(
            scale=0.01, size=DIM
        )
        w = global_params[0].astype(np.float64)
        delta = (float(config["lr"]) * (self.target - w) + noise).astype(np.float32)
        self.fits += 1
        self.fit_rounds.append(round_index)
        return ClientUpdate(
            self.client_id, [delta], {"mean_loss": float(np.mean((w - self.target) ** 2))}, 7
        )

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        self.evaluated_until = max(self.evaluated_until, round_index)
        loss = float(np.mean((params[0] - self.target) ** 2))
        return {"loss": loss, "accuracy": 1.0 / (1.0 + loss), "n": 10}

    def privacy_summary(self) -> Scalars:
        return {"count": 1, "fits": self.fits, "label": f"silo-{self.client_id}"}

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
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.participation: dict[int, int] = {}

    def initial_params(self) -> Params:
        return [np.zeros(DIM, dtype=np.float32)]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        return list(client_ids)

    def round_config(self, round_index: int) -> Scalars:
        return {"lr": 0.5, "tag": "toy"}

    def aggregate(self, round_index: int, global_params: Params, updates: list[ClientUpdate]):
        if not updates:
            return global_params
        mean = np.sum([u.delta[0] for u in updates], axis=0) / len(updates)
        return [(global_params[0] + mean).astype(np.float32)]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        for c in selected:
            self.participation[c] = self.participation.get(c, 0) + 1

    def state_dict(self) -> dict[str, Any]:
        return {"participation": dict(self.participation)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}


def toy_config(num_silos: int = 2, rounds: int = 3, seed: int = 7, fit_sleep_s: float = 0.0):
    return SimpleNamespace(
        seed=seed,
        num_silos=num_silos,
        fit_sleep_s=fit_sleep_s,
        training=SimpleNamespace(rounds=rounds),
    )


def _from_dict(d: dict[str, Any]) -> Any:
    return toy_config(d["num_silos"], d["rounds"], d["seed"], d["fit_sleep_s"])


def _to_dict(c: Any) -> dict[str, Any]:
    return {
        "num_silos": c.num_silos,
        "rounds": c.training.rounds,
        "seed": c.seed,
        "fit_sleep_s": c.fit_sleep_s,
    }


def _run(config: Any, server: Any, transport: Any, out_dir: Path, resume: bool):
    from pdpfl.runtime.loop import run_federation

    return run_federation(config, server, transport, out_dir, resume=resume, progress=False)


def _finish(config: Any, result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from pdpfl.io import save_npz

    save_npz(Path(out_dir) / "model.npz", p000=result["params"][0])
    return {"rounds_completed": len(result["metrics"]), "privacy": result["privacy"]}


TOY_HOOKS = AppHooks(
    config_from_dict=_from_dict,
    config_to_dict=_to_dict,
    num_silos=lambda c: int(c.num_silos),
    silo_info=lambda c, silo, node_config: {"silo": silo},
    build_server=lambda c, infos: (ToyServer(c.seed), {"silos": sorted(infos)}),
    build_client=lambda c, silo, node_config, public: ToyClient(silo, c.seed, c.fit_sleep_s),
    run=_run,
    finish=_finish,
)


def toy_simulation(config: Any, out_dir: Path) -> dict[str, Any]:
    """The same toy federation in-process (the reference for the Flower runs)."""
    from pdpfl.runtime.loop import run_federation

    clients = {i: ToyClient(i, config.seed) for i in range(config.num_silos)}

    class Direct:
        client_ids = sorted(clients)

        def fit(self, selected, params, t, cfg):
            return [clients[c].fit(params, t, cfg) for c in selected]

        def evaluate(self, ids, params, t, cfg):
            return {c: clients[c].evaluate(params, t, cfg) for c in ids}

        def privacy_summaries(self):
            return {c: x.privacy_summary() for c, x in clients.items()}

        def client_states(self):
            return {c: x.state_dict() for c, x in clients.items()}

        def load_client_states(self, states):
            pass

    result = run_federation(config, ToyServer(config.seed), Direct(), out_dir, progress=False)
    result["clients"] = clients
    return result


# ------------------------------------------------------------------ fast tests (no processes)


def test_toy_satisfies_the_protocols() -> None:
    assert isinstance(ToyClient(0, 1), ClientAlgorithm)
    assert isinstance(ToyServer(1), ServerAlgorithm)
    assert load_hooks("test_flower_toy:TOY_HOOKS") is TOY_HOOKS


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


# ------------------------------------- the real ServerApp + ClientApp over an in-memory grid


class FakeGrid:
    """A Grid that delivers each message straight to the pdpfl ClientApp of its node.

    ``dead`` nodes never reply (a crashed SuperNode); ``failing`` nodes reply with an error.
    """

    def __init__(self, run_config: dict[str, Any], state_root: Path, num_silos: int) -> None:
        self.run_config = run_config
        self.node_configs = {
            1000 + 7 * i: {
                "partition-id": i,
                "num-partitions": num_silos,
                "state-dir": str(state_root / f"silo-{i}"),
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

        ids = []
        for msg in messages:
            mid = f"msg-{len(self.sent)}"
            msg.metadata.__dict__["_message_id"] = mid
            node = msg.metadata.dst_node_id
            self.sent.append((node, str(msg.content.config_records["pdpfl"]["action"])))
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
            self._replies[mid] = client_app(msg, context)
        return ids

    def pull_messages(self, message_ids: Any) -> list[Any]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]


@pytest.fixture
def task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _serve(grid: FakeGrid, out: Path) -> dict[str, Any]:
    import json

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


def _run_config(config: Any, out: Path, **extra: Any) -> dict[str, Any]:
    from pdpfl.runtime.flower.apps import encode_config

    return {
        "pdpfl-config": encode_config(_to_dict(config)),
        "pdpfl-hooks": "test_flower_toy:TOY_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 5.0,
        "pdpfl-startup-timeout": 5.0,
        "pdpfl-min-silos": 1,
        **extra,
    }


def _silo_state(out: Path, silo: int, run_key: str) -> dict[str, Any]:
    path = out / "silo-state" / f"silo-{silo}" / f"run-{run_key}" / f"silo-{silo}.npz"
    return decode_state(path.read_bytes())


def test_apps_reproduce_the_simulation_exactly(tmp_path: Path, task_identity: None) -> None:
    config = toy_config(num_silos=3, rounds=4)
    ref = toy_simulation(config, tmp_path / "sim")
    out = tmp_path / "flower"
    grid = FakeGrid(_run_config(config, out), out / "silo-state", 3)
    result = _serve(grid, out)
    assert result["status"] == "ok" and result["lost"] == {}
    model = np.load(out / "model.npz")["p000"]
    np.testing.assert_array_equal(model, ref["params"][0])
    # State survived between messages (one fresh client object per message) at each silo.
    for silo in range(3):
        state = _silo_state(out, silo, result["run_key"])
        assert state["fits"] == 4 and list(state["fit_rounds"]) == [0, 1, 2, 3]
        assert state["evaluated_until"] == 3
    assert result["summary"]["privacy"]["2"]["fits"] == 4


def test_failing_silo_is_dropped_and_its_charges_kept(tmp_path: Path, task_identity: None) -> None:
    config = toy_config(num_silos=3, rounds=3)
    out = tmp_path / "flower"
    grid = FakeGrid(_run_config(config, out, **{"pdpfl-round-timeout": 0.3}), out / "silo-state", 3)
    dead, failing = grid.node_of(1), grid.node_of(2)
    original_push = grid.push_messages

    def push(messages: Any) -> list[str]:
        ids = original_push(messages)
        # Silo 1 crashes, and silo 2 starts failing, after the first round's training.
        if any(a == "fit" for _, a in grid.sent):
            grid.dead.add(dead)
            grid.failing.add(failing)
        return ids

    grid.push_messages = push  # type: ignore[method-assign]
    result = _serve(grid, out)
    assert result["status"] == "ok"
    assert sorted(result["lost"]) == ["1", "2"]
    # Lost silos are not contacted again after the exchange in which they failed.
    later = [node for node, action in grid.sent[-2:]]
    assert dead not in later and failing not in later
    # Their ledgers hold every update they released (round 0), never less.
    assert _silo_state(out, 1, result["run_key"])["fits"] >= 1
    assert _silo_state(out, 0, result["run_key"])["fits"] == 3


def test_run_aborts_when_fewer_than_min_silos_remain(tmp_path: Path, task_identity: None) -> None:
    config = toy_config(num_silos=2, rounds=2)
    out = tmp_path / "flower"
    run_config = _run_config(config, out, **{"pdpfl-round-timeout": 0.3, "pdpfl-min-silos": 2})
    grid = FakeGrid(run_config, out / "silo-state", 2)
    original_push = grid.push_messages

    def push(messages: Any) -> list[str]:
        if any(a == "fit" for _, a in grid.sent):
            grid.dead.add(grid.node_of(0))
        return original_push(messages)

    grid.push_messages = push  # type: ignore[method-assign]
    from pdpfl.runtime.flower.transport import FlowerRunError

    with pytest.raises(FlowerRunError, match="min_silos=2"):
        _serve(grid, out)
    result = json.loads((out / "flower" / "server_result.json").read_text())
    assert result["status"] == "error" and "silo 0" in result["error"]


def test_bad_partition_ids_are_rejected(tmp_path: Path, task_identity: None) -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError

    config = toy_config(num_silos=2, rounds=1)
    out = tmp_path / "flower"
    grid = FakeGrid(_run_config(config, out), out / "silo-state", 2)
    for node_config in grid.node_configs.values():
        node_config["partition-id"] = 0  # both SuperNodes claim silo 0
    with pytest.raises(FlowerRunError, match="partition-id=0 already taken"):
        _serve(grid, out)


def test_resume_refuses_a_checkpoint_holding_silo_states() -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError, FlowerTransport

    transport = FlowerTransport(grid=None, silo_nodes={0: 11, 1: 12}, run_key="abc")
    transport.load_client_states(transport.client_states())  # Flower's own references: fine
    with pytest.raises(FlowerRunError, match="runtime: simulation"):
        transport.load_client_states({0: {"fits": 3}})
    with pytest.raises(FlowerRunError, match="belongs to run zzz"):
        transport.load_client_states({0: {"location": "silo", "run_key": "zzz"}})


def test_missing_silo_fails_after_the_startup_timeout(tmp_path: Path, task_identity: None) -> None:
    from pdpfl.runtime.flower.transport import FlowerRunError

    config = toy_config(num_silos=3, rounds=1)
    out = tmp_path / "flower"
    grid = FakeGrid(_run_config(config, out, **{"pdpfl-startup-timeout": 1.0}), out / "s", 3)
    del grid.node_configs[grid.node_of(1)]  # silo 1's SuperNode never connects
    with pytest.raises(FlowerRunError, match=r"silos \[1\] did not connect within 1 s"):
        _serve(grid, out)
