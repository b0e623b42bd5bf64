"""Secure summation (``aggregation: secure``): equals the plain sum, survives a silo lost
between masking and unmasking without ever releasing garbage, keeps secrets at the silos, and
-- with ``participation: hidden`` -- gives the server a view that does not depend on who took
part (with the accounting to match)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.crypto import IntegrityError, RingOverflowError
from pdpfl.fl.aggregation import PlainSum, get_protocol, protocol_from_config
from pdpfl.fl.aggregation.secure import SecureSum
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import Contribution
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")

TINY = {
    "name": "secure-tiny",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 4},
    "model": {"name": "logreg"},
    # ε = 8 is above what q = 1 spends at σ = 2: those records train at q = 1 (opted in).
    "budgets": {"scenario": "three-levels", "cap_at_epsilon_max": True,
                "params": {"values": [0.5, 2.0, 8.0], "ratios": [0.5, 0.3, 0.2]}},
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-3, "adversary": "both"},
    "training": {"rounds": 4, "local_steps": 2, "client_rate": 0.5, "lr": 0.5,
                 "batch_size": 16},
}


# --------------------------------------------------------------------------- test doubles


class ScriptedClient:
    """A silo whose round-t update is a fixed pseudo-random vector (and a scripted λ-coin)."""

    def __init__(self, cid: int, shapes: list[tuple[int, ...]], coins: dict[int, bool] | None = None,
                 scale: float = 1.0) -> None:
        self.client_id = cid
        self.shapes = shapes
        self.coins = coins or {}
        self.scale = scale
        self.fits: list[int] = []

    def update(self, t: int) -> list[np.ndarray]:
        rng = np.random.default_rng(1000 * t + self.client_id)
        return [(self.scale * rng.normal(size=s)).astype(np.float32) for s in self.shapes]

    def fit(self, params, round_index, config):
        self.fits.append(int(round_index))
        return Contribution(update=self.update(int(round_index)), weight=1.0)

    def participation_coin(self, round_index: int) -> bool:
        return self.coins.get(int(round_index), True)

    def public_weight(self) -> float:
        return 1.0

    def evaluate(self, params, round_index, config):
        return {"loss": 0.0, "accuracy": 0.0, "n": 0}

    def privacy_summary(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state) -> None:
        pass


class Server:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False


SHAPES = [(3, 4), (5,)]
PARAMS = [np.zeros(s, dtype=np.float32) for s in SHAPES]


class DroppingTransport(InProcessTransport):
    """In-process transport where ``victim`` computes its masked upload but the reply is lost
    (the silo fails between the masking and the unmasking step)."""

    def __init__(self, clients, victim: int, stage: str = "upload") -> None:
        super().__init__(clients)
        self.victim, self.stage = victim, stage
        self.lost_replies: list[dict[str, Any]] = []
        self.replies: list[tuple[str, int, dict[str, Any]]] = []

    def exchange(self, protocol, stage, requests, round_index):
        replies = super().exchange(protocol, stage, requests, round_index)
        self.replies += [(stage, c, r) for c, r in replies.items()]
        if stage == self.stage and self.victim in replies:
            self.lost_replies.append(replies.pop(self.victim))
        return replies


class RecordingTransport(InProcessTransport):
    """Records the shape of everything the server sends and receives (the server's view)."""

    def __init__(self, clients) -> None:
        super().__init__(clients)
        self.view: list[tuple] = []
        self.messages: list[bytes] = []

    @staticmethod
    def _shape(payload: dict[str, Any]) -> tuple:
        out = []
        for k in sorted(payload):
            v = payload[k]
            if isinstance(v, np.ndarray):
                out.append((k, "array", str(v.dtype), v.shape, v.nbytes))
            elif isinstance(v, bytes | bytearray):
                out.append((k, "bytes", len(v)))
            else:
                out.append((k, type(v).__name__))
        return tuple(out)

    def exchange(self, protocol, stage, requests, round_index):
        replies = super().exchange(protocol, stage, requests, round_index)
        for c in sorted(requests):
            self.view.append(("request", stage, c, self._shape(requests[c])))
        for c in sorted(replies):
            self.view.append(("reply", stage, c, self._shape(replies[c])))
        for payload in [*requests.values(), *replies.values()]:
            for v in payload.values():
                if isinstance(v, bytes | bytearray):
                    self.messages.append(bytes(v))
                elif isinstance(v, np.ndarray):
                    self.messages.append(v.tobytes())
        return replies


def _plain_total(clients, ids, t) -> list[np.ndarray]:
    return [sum(np.asarray(clients[c].update(t)[i], dtype=np.float64) for c in ids)
            for i in range(len(SHAPES))]


# --------------------------------------------------------------------------- equality


def test_secure_sum_equals_the_plain_sum_within_the_stated_precision() -> None:
    clients = {c: ScriptedClient(c, SHAPES, scale=50.0) for c in range(5)}
    transport = InProcessTransport(clients)
    proto = SecureSum()
    for t, selected in enumerate([[0, 1, 2, 3, 4], [1, 3], [2]]):
        agg = proto.collect(transport, selected, PARAMS, t, {"round": t}, Server())
        plain = PlainSum().collect(transport, selected, PARAMS, t, {}, Server())
        assert agg.count == plain.count == len(selected) and agg.weight == plain.weight
        for a, b, exact in zip(agg.total, plain.total, _plain_total(clients, selected, t),
                               strict=True):
            assert a.dtype == np.float32 and a.shape == b.shape
            assert np.all(np.abs(a.astype(np.float64) - exact)
                          <= proto.precision(len(selected)) + 1e-5 * np.abs(exact))
    assert proto.collect(transport, [], PARAMS, 9, {}, Server()).empty


@pytest.mark.slow
def test_secure_run_equals_the_plain_run_in_reproducible_mode(tmp_path: Path) -> None:
    results = {}
    for agg in ("plain", "secure"):
        cfg = config_from_dict(TINY, [f"aggregation={agg}"])
        server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
        protocol = protocol_from_config(cfg)
        assert type(protocol) is {"plain": PlainSum, "secure": SecureSum}[agg]
        results[agg] = run_federation(cfg, server, InProcessTransport(clients), tmp_path / agg,
                                      progress=False)
    plain, secure = results["plain"], results["secure"]
    assert [m["selected"] for m in plain["metrics"]] == [m["selected"] for m in secure["metrics"]]
    for a, b in zip(plain["params"], secure["params"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert [m["accuracy"] for m in plain["metrics"]] == pytest.approx(
        [m["accuracy"] for m in secure["metrics"]], abs=1e-3
    )


@pytest.mark.slow
def test_heart_example_secure_equals_plain(tmp_path: Path, shared_data_dir: Path) -> None:
    """``pdpfl run examples/heart_disease.yaml --set aggregation=secure`` equals the plain run
    (reproducible mode; fewer rounds and steps than the example to keep the test short)."""
    from typer.testing import CliRunner

    from pdpfl.cli import app

    example = Path(__file__).resolve().parents[1] / "examples" / "heart_disease.yaml"
    common = ["--data-dir", str(shared_data_dir), "--set", "randomness=reproducible",
              "--set", "rounds=3", "--set", "local_steps=10"]
    out = {}
    for agg in ("plain", "secure"):
        out[agg] = tmp_path / agg
        res = CliRunner().invoke(app, ["run", str(example), "--out", str(out[agg]), *common,
                                       "--set", f"aggregation={agg}"])
        assert res.exit_code == 0, res.output
    plain = np.load(out["plain"] / "model.npz")
    secure = np.load(out["secure"] / "model.npz")
    for k in plain.files:
        np.testing.assert_allclose(plain[k], secure[k], atol=1e-5)
    sp = json.loads((out["plain"] / "summary.json").read_text())
    ss = json.loads((out["secure"] / "summary.json").read_text())
    assert ss["final_accuracy"] == pytest.approx(sp["final_accuracy"], abs=1e-6)
    assert ss["aggregation"]["protocol"] == "secure"
    assert ss["aggregation"]["server_sees"] == "only the sum of the updates"


# --------------------------------------------------------------------------- dropouts


def test_a_silo_lost_between_masking_and_unmasking_never_yields_garbage() -> None:
    clients = {c: ScriptedClient(c, SHAPES) for c in range(4)}
    transport = DroppingTransport(clients, victim=2)
    proto = SecureSum()
    agg = proto.collect(transport, [0, 1, 2, 3], PARAMS, 0, {}, Server())
    # The victim masked its update (its reply was produced) but never reached the server.
    assert len(transport.lost_replies) == 1
    assert proto.last_round["attempts"] == 2 and proto.last_round["lost"] == [2]
    survivors = [0, 1, 3]
    assert agg.count == 3
    for a, exact in zip(agg.total, _plain_total(clients, survivors, 0), strict=True):
        assert np.all(np.abs(a - exact) <= 1e-5)
    # Each silo released one update only: the retry re-masked the cached contribution.
    assert all(c.fits == [0] for c in clients.values())
    # What the abort prevents: the first attempt's surviving uploads sum to garbage.
    first = [r["masked"] for stage, c, r in transport.replies if stage == "upload"][:3]
    with pytest.raises(IntegrityError, match="did not cancel"):
        proto.ring.decode(sum(first[1:], first[0]), 4)


def test_a_silo_lost_at_the_key_stage_is_left_out() -> None:
    clients = {c: ScriptedClient(c, SHAPES) for c in range(3)}
    transport = DroppingTransport(clients, victim=0, stage="keys")
    proto = SecureSum()
    agg = proto.collect(transport, [0, 1, 2], PARAMS, 0, {}, Server())
    assert proto.last_round["attempts"] == 1 and agg.count == 2
    assert clients[0].fits == []
    np.testing.assert_allclose(agg.total[0], _plain_total(clients, [1, 2], 0)[0], atol=1e-5)


def test_every_silo_lost_gives_an_empty_round() -> None:
    clients = {0: ScriptedClient(0, SHAPES)}
    agg = SecureSum().collect(DroppingTransport(clients, victim=0), [0], PARAMS, 0, {}, Server())
    assert agg.empty


# --------------------------------------------------------------------------- integrity


def test_an_upload_whose_masks_do_not_cancel_is_rejected() -> None:
    """A corrupted upload, or one masked for another participant list, sums to garbage, which
    decoding refuses. (Targeted small changes are the transport's to prevent -- TLS -- as in
    any semi-honest secure-aggregation protocol.)"""

    class Tamper(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "upload":  # silo 1 is told another participant list (no silo 2)
                forged = dict(requests[1], participants=np.array([0, 1]),
                              public_keys=requests[1]["public_keys"][:64])
                requests = {**requests, 1: forged}
            return super().exchange(protocol, stage, requests, round_index)

    clients = {c: ScriptedClient(c, [(40,)]) for c in range(3)}
    with pytest.raises(IntegrityError, match="did not cancel"):
        SecureSum().collect(Tamper(clients), [0, 1, 2], [np.zeros(40, np.float32)], 0, {},
                            Server())


def test_silos_refuse_a_reused_attempt_and_a_foreign_key_list() -> None:
    from pdpfl.fl.aggregation.secure import silo_handler

    clients = {c: ScriptedClient(c, SHAPES) for c in range(2)}
    transport = InProcessTransport(clients)
    proto = SecureSum()
    keys = proto._keys(transport, [0, 1], 0)
    request = proto._upload_request([0, 1], keys, PARAMS, {}, [], 0)
    transport.exchange("secure", "upload", {0: request}, 0)
    with pytest.raises(IntegrityError, match="already used"):
        transport.exchange("secure", "upload", {0: request}, 0)
    forged = dict(request, attempt=1, public_keys=bytes(64))
    with pytest.raises(IntegrityError, match="does not hold this silo's key"):
        transport.exchange("secure", "upload", {1: forged}, 0)
    ctx_missing = dict(request, attempt=2)
    from pdpfl.fl.aggregation import SiloContext

    with pytest.raises(IntegrityError, match="no key"):
        silo_handler("upload", ctx_missing, 5, SiloContext(clients[0], 0, {}))


def test_overflow_of_the_fixed_point_ring_is_a_clear_error() -> None:
    clients = {c: ScriptedClient(c, SHAPES, scale=1e7) for c in range(2)}
    with pytest.raises(RingOverflowError, match="secure.fractional_bits"):
        SecureSum().collect(InProcessTransport(clients), [0, 1], PARAMS, 0, {}, Server())
    # fewer fractional bits widen the range
    SecureSum(fractional_bits=8).collect(InProcessTransport(clients), [0, 1], PARAMS, 0, {},
                                         Server())


def test_secrets_stay_in_the_silos_memory(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["aggregation=secure", "rounds=2"])
    server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
    transport = RecordingTransport(clients)
    run_federation(cfg, server, transport, tmp_path, progress=False)
    secrets_raw = [m["secure"]["private_key"] for m in transport._silo_memory.values()
                   if m.get("secure")]
    assert secrets_raw and all(len(k) == 32 for k in secrets_raw)
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    stored += json.dumps(cfg.model_dump(mode="json")).encode()
    for raw in secrets_raw:
        assert raw not in stored
        assert not any(raw in m for m in transport.messages)


# --------------------------------------------------------------------------- hidden mode


def test_hidden_view_of_the_server_does_not_depend_on_who_took_part() -> None:
    views, weights = [], []
    for coins in ({0: True, 1: False, 2: False}, {0: False, 1: True, 2: True}):
        clients = {c: ScriptedClient(c, SHAPES, coins={0: coins[c]}) for c in range(3)}
        transport = RecordingTransport(clients)
        proto = SecureSum(participation="hidden", client_rate=0.5)
        assert proto.silo_side_sampling
        agg = proto.collect(transport, [0, 1, 2], PARAMS, 0, {"round": 0}, Server())
        chosen = [c for c in range(3) if coins[c]]
        for a, exact in zip(agg.total, _plain_total(clients, chosen, 0), strict=True):
            assert np.all(np.abs(a - exact) <= 1e-5)
        assert [c for c in range(3) if clients[c].fits] == chosen
        views.append(transport.view)
        weights.append((agg.weight, agg.count))
    assert views[0] == views[1]  # names, types, shapes and sizes of every message
    assert weights[0] == weights[1] == (0.5 * 3, 3)  # the public constant λ·Σ w_i


@pytest.mark.slow
def test_hidden_participation_asks_every_silo_and_accounts_the_server_as_a_third_party(
    tmp_path: Path,
) -> None:
    from pdpfl.runtime.outputs import build_summary

    runs = {}
    for mode in ("visible", "hidden"):
        cfg = config_from_dict(TINY, ["aggregation=secure", f"participation={mode}"])
        server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
        result = run_federation(cfg, server, InProcessTransport(clients), tmp_path / mode,
                                progress=False)
        runs[mode] = (cfg, server, clients, result)
    cfg, server, clients, result = runs["hidden"]
    rounds = cfg.training.rounds
    assert all(m["selected"] == [0, 1, 2, 3] for m in result["metrics"])
    assert server.participation == {c: rounds for c in range(4)}
    took_part = {c: cl.participations for c, cl in clients.items()}
    assert min(took_part.values()) < rounds  # the silos' own coins left some out
    for c in clients.values():
        assert c.ledger.server_sees_participation is False
        np.testing.assert_array_equal(c.spent("server"), c.spent("third-party"))
        assert np.all(c.spent("server") <= c.budgets * (1 + 1e-9))
    summary = build_summary(cfg, result)
    assert summary["aggregation"]["participation"] == "hidden"
    assert "third party" in summary["aggregation"]["server_observer"]
    # The same budgets buy higher record rates when the server is a third party too.
    _, _, visible_clients, _ = runs["visible"]
    assert all(np.all(clients[c].rates >= visible_clients[c].rates - 1e-12) for c in clients)
    assert any(np.any(clients[c].rates > visible_clients[c].rates + 1e-9) for c in clients)


def test_hidden_participation_needs_secure_summation_and_a_supporting_algorithm() -> None:
    with pytest.raises(ConfigError, match="participation: hidden needs aggregation: secure"):
        config_from_dict(TINY, ["participation=hidden"])
    cfg = config_from_dict(TINY, ["aggregation=secure", "participation=hidden"])
    assert protocol_from_config(cfg).silo_side_sampling

    class MetricServer(Server):
        public_metrics = frozenset({"loss"})

    clients = {c: ScriptedClient(c, SHAPES) for c in range(2)}
    with pytest.raises(ValueError, match="reveal how many silos"):
        SecureSum(participation="hidden").collect(InProcessTransport(clients), [0, 1], PARAMS,
                                                  0, {}, MetricServer())

    class NoCoin(ScriptedClient):
        participation_coin = None  # type: ignore[assignment]

    with pytest.raises(ValueError, match="draw their own participation coin"):
        SecureSum(participation="hidden").collect(
            InProcessTransport({0: NoCoin(0, SHAPES), 1: NoCoin(1, SHAPES)}), [0, 1], PARAMS,
            0, {}, Server())
    assert isinstance(get_protocol("secure"), SecureSum)
