"""Secure summation (``aggregation: secure``, SecAgg with double masking): equals the plain sum,
survives dropouts at every stage without a retry, releases nothing below the survivor threshold
t, and resists the attacks of issue #22 -- attempt difference with a late reply, lone survivor,
both seeds of one silo, replayed and late messages (each shown succeeding on the old protocol
where it did)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.crypto import IntegrityError, RingOverflowError, shamir
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.dp.discrete_encoding import encode_share
from pdpfl.dp.discrete_params import discrete_share_params
from pdpfl.fl.aggregation import (
    SURVIVORS_KEY,
    PlainSum,
    SiloContext,
    get_protocol,
    protocol_from_config,
    summary_fields,
    survivor_threshold,
)
from pdpfl.fl.aggregation.discrete_shares import ShareEncoding, rotation_seed
from pdpfl.fl.aggregation.secure import SecureSum, silo_handler
from pdpfl.fl.aggregation.secure_common import mask_key, pair_mask
from pdpfl.fl.aggregation.secure_identity import ephemeral_security
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import Contribution
from pdpfl.randomness import SecureRandomness
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for
from secagg_attacks import RecordingDropTransport, attempt_difference, legacy_abort_and_retry

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")

TINY = {
    "name": "secure-tiny",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 4},
    "model": {"name": "logreg"},
    # ε = 8 is above what q = 1 spends at σ = 2: those records train at q = 1 (opted in).
    "budgets": {
        "scenario": "three-levels",
        "cap_at_epsilon_max": True,
        "params": {"values": [0.5, 2.0, 8.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-3, "adversary": "both"},
    "training": {"rounds": 4, "local_steps": 2, "client_rate": 0.5, "lr": 0.5, "batch_size": 16},
}


# --------------------------------------------------------------------------- test doubles


class ScriptedClient:
    """A silo whose round-t update is a fixed pseudo-random vector (and a scripted λ-coin);
    with a ``share_encoding`` it releases that vector as a discrete share (tiny noise)."""

    def __init__(
        self,
        cid: int,
        shapes: list[tuple[int, ...]],
        coins: dict[int, bool] | None = None,
        scale: float = 1.0,
        share_encoding: ShareEncoding | None = None,
    ) -> None:
        self.client_id = cid
        self.shapes = shapes
        self.coins = coins or {}
        self.scale = scale
        self.share_encoding = share_encoding
        self.fits: list[int] = []
        self.configs: list[dict[str, Any]] = []

    def update(self, t: int) -> list[np.ndarray]:
        rng = np.random.default_rng(1000 * t + self.client_id)
        return [(self.scale * rng.normal(size=s)).astype(np.float32) for s in self.shapes]

    def flat(self, t: int) -> np.ndarray:
        return np.concatenate([u.astype(np.float64).ravel() for u in self.update(t)])

    def fit(self, params, round_index, config):
        self.fits.append(int(round_index))
        self.configs.append(dict(config))
        t = int(round_index)
        enc = self.share_encoding
        if enc is not None:  # rotate, scale, round, + an exact discrete Gaussian share, mod 2^b
            stream = SecureRandomness().stream("noise-share", t, self.client_id)
            share = encode_share(self.flat(t), enc.params, stream, rotation_seed(t))
            return Contribution(update=[share], weight=1.0)
        return Contribution(update=self.update(t), weight=1.0)

    def participation_coin(self, round_index: int) -> bool:
        return self.coins.get(int(round_index), True)

    def public_weight(self) -> float:
        return 1.0

    def evaluate(self, params, round_index, config):
        return {"loss": 0.0, "accuracy": 0.0, "n": 0}

    def privacy_summary(self):
        return None

    def state_dict(self):
        return {}

    def load_state_dict(self, state) -> None:
        pass


class Server:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False

    def __init__(self, share_encoding: ShareEncoding | None = None) -> None:
        self.share_encoding = share_encoding


SHAPES = [(3, 4), (5,)]
PARAMS = [np.zeros(s, dtype=np.float32) for s in SHAPES]
#: The fault matrix runs with float updates and with discrete shares (issue #33).
SHARES = pytest.mark.parametrize("shares", ["continuous", "discrete"])


def _encoding(shares: str) -> ShareEncoding | None:
    """Discrete shares of the scripted updates (norm < 10), noise σ = 10^-6 (t ≥ 2 silos)."""
    if shares == "continuous":
        return None
    params = discrete_share_params(
        clip=10.0, noise_multiplier=1e-6, silos=8, survivors=2, dimension=17, bits=32
    )
    return ShareEncoding(params, 17)


def _clients(n: int, shares: str = "continuous", **kw: Any) -> dict[int, ScriptedClient]:
    enc = _encoding(shares)
    return {c: ScriptedClient(c, SHAPES, share_encoding=enc, **kw) for c in range(n)}


def _plain_total(clients, ids, t) -> list[np.ndarray]:
    return [
        sum(np.asarray(clients[c].update(t)[i], dtype=np.float64) for c in ids)
        for i in range(len(SHAPES))
    ]


def _close(agg, clients, ids, t, tol=1e-4) -> bool:
    return all(
        np.all(np.abs(a - b) <= tol)
        for a, b in zip(agg.total, _plain_total(clients, ids, t), strict=True)
    )


# --------------------------------------------------------------------------- equality


def test_secure_sum_equals_the_plain_sum_within_the_stated_precision() -> None:
    clients = {c: ScriptedClient(c, SHAPES, scale=50.0) for c in range(5)}
    transport = InProcessTransport(clients)
    proto = SecureSum()
    for t, selected in enumerate([[0, 1, 2, 3, 4], [1, 3], [0, 2, 4]]):
        agg = proto.collect(transport, selected, PARAMS, t, {"round": t}, Server())
        # the silo algorithm is told the round's t (noise shares are sized σ²C²/t)
        assert clients[selected[0]].configs[-1] == {
            "round": t,
            SURVIVORS_KEY: survivor_threshold(len(selected)),
        }
        plain = PlainSum().collect(transport, selected, PARAMS, t, {}, Server())
        assert agg.count == plain.count == len(selected) and agg.weight == plain.weight
        for a, b, exact in zip(
            agg.total, plain.total, _plain_total(clients, selected, t), strict=True
        ):
            assert a.dtype == np.float32 and a.shape == b.shape
            assert np.all(
                np.abs(a.astype(np.float64) - exact)
                <= proto.precision(len(selected)) + 1e-5 * np.abs(exact)
            )
    assert proto.collect(transport, [], PARAMS, 9, {}, Server()).empty


@pytest.mark.slow
def test_secure_run_equals_the_plain_run_in_reproducible_mode(tmp_path: Path) -> None:
    results = {}
    for agg in ("plain", "secure"):
        cfg = config_from_dict(TINY, [f"aggregation={agg}"])
        server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
        protocol = protocol_from_config(cfg)
        assert type(protocol) is {"plain": PlainSum, "secure": SecureSum}[agg]
        results[agg] = run_federation(
            cfg, server, InProcessTransport(clients), tmp_path / agg, progress=False
        )
    plain, secure = results["plain"], results["secure"]
    assert [m["selected"] for m in plain["metrics"]] == [m["selected"] for m in secure["metrics"]]
    # A round with one selected silo is summed in the clear but never unmasked alone.
    for s in secure["metrics"]:
        n = len(s["selected"])
        assert s["contributions"] == (n if n >= survivor_threshold(n) else 0)
    if all(len(m["selected"]) != 1 for m in plain["metrics"]):
        for a, b in zip(plain["params"], secure["params"], strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_heart_example_secure_equals_plain(tmp_path: Path, shared_data_dir: Path) -> None:
    """``pdpfl run examples/heart_disease.yaml --set aggregation=secure`` equals the plain run
    (reproducible mode; fewer rounds and steps than the example to keep the test short)."""
    from typer.testing import CliRunner

    from pdpfl.cli import app

    example = Path(__file__).resolve().parents[1] / "examples" / "heart_disease.yaml"
    common = [
        "--data-dir",
        str(shared_data_dir),
        "--set",
        "randomness=reproducible",
        "--set",
        "rounds=3",
        "--set",
        "local_steps=10",
    ]
    out = {}
    for agg in ("plain", "secure"):
        out[agg] = tmp_path / agg
        res = CliRunner().invoke(
            app,
            ["run", str(example), "--out", str(out[agg]), *common, "--set", f"aggregation={agg}"],
        )
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


STAGES = ["advertise", "share", "upload", "consistency", "unmask"]


@SHARES
@pytest.mark.parametrize("stage", ["advertise", "share", "upload"])
def test_a_silo_lost_at_any_stage_is_left_out_without_a_retry(stage: str, shares: str) -> None:
    """Seven silos: t = 5 and the consistency quorum q = ⌈(7 + 5)/2⌉ = 6, so one may be lost."""
    clients = _clients(7, shares)
    transport = RecordingDropTransport(clients, victims=(2,), stage=stage)
    proto = SecureSum()
    agg = proto.collect(transport, list(range(7)), PARAMS, 0, {}, Server(_encoding(shares)))
    rest = [0, 1, 3, 4, 5, 6]
    assert agg.count == 6 and _close(agg, clients, rest, 0)
    assert proto.last_round["outcome"] == "released" and proto.last_round["u3"] == rest
    assert proto.last_round["quorum"] == 6 and proto.last_round["u4"] == rest
    assert transport.stages() == STAGES  # one pass, no retry
    # Every silo computed its contribution at most once; the victim only if it reached upload.
    fits = [[0]] * 7
    fits[2] = [0] if stage == "upload" else []
    assert [c.fits for c in clients.values()] == fits
    if stage == "upload":
        assert proto.last_round["dropped"] == [2] and 2 in transport.late


@SHARES
def test_a_round_below_the_consistency_quorum_stops_before_anything_is_computed(
    shares: str,
) -> None:
    """Four silos: t = 3, q = 4. One lost at advertise: the server stops, and no silo computes
    (or is charged for) an update that could never be unmasked."""
    clients = _clients(4, shares)
    transport = RecordingDropTransport(clients, victims=(2,), stage="advertise")
    proto = SecureSum()
    agg = proto.collect(transport, [0, 1, 2, 3], PARAMS, 0, {}, Server(_encoding(shares)))
    assert agg.empty and proto.last_round["outcome"] == "no aggregate: 3 silo(s) sent keys < q = 4"
    assert transport.stages() == ["advertise"] and all(c.fits == [] for c in clients.values())


@SHARES
def test_a_round_that_cannot_keep_t_silos_has_no_aggregate_and_never_unmasks(shares: str) -> None:
    clients = _clients(3, shares)  # t(3) = 2
    transport = RecordingDropTransport(clients, victims=(0, 1), stage="upload")
    proto = SecureSum()
    agg = proto.collect(transport, [0, 1, 2], PARAMS, 0, {}, Server(_encoding(shares)))
    assert agg.empty and proto.last_round["outcome"].startswith("no aggregate: 1 masked upload")
    assert "unmask" not in transport.stages()
    # What the ledgers were charged: every silo that reached the upload computed its update.
    assert [c.fits for c in clients.values()] == [[0], [0], [0]]


@SHARES
def test_a_lone_silo_is_never_summed(shares: str) -> None:
    """With one silo asked (rPDP-FL's λ-sampling can select one) the old protocol sent its update
    unmasked (no pair, no mask); now the round is refused before any message: t ≥ 2."""
    clients = _clients(3, shares)
    transport = RecordingDropTransport(clients)
    proto = SecureSum()
    agg = proto.collect(transport, [1], PARAMS, 0, {}, Server(_encoding(shares)))
    assert agg.empty and transport.requests == [] and clients[1].fits == []
    assert proto.last_round["outcome"] == "refused: 1 silo(s) asked < t = 2"
    # and a silo refuses any round whose t would allow a lone or a minority unmasking
    sec = ephemeral_security([0, 1, 2, 3])
    for participants, asked, own in ((np.array([0, 1]), 1, 2), (np.arange(4), 2, 3)):
        with pytest.raises(IntegrityError, match=f"threshold t = {asked} .* gives t = {own}"):
            silo_handler(
                "advertise",
                {
                    "session": b"s" * 16,
                    "participants": participants,
                    "threshold": asked,
                    "hidden": False,
                },  # fmt: skip
                0,
                SiloContext(clients[0], 0, {}, sec[0]),
            )
    # and without an identity and peer keys of its own, a silo does not take part at all
    with pytest.raises(IntegrityError, match="no identity, peer keys and settings"):
        silo_handler(
            "advertise",
            {"session": b"s" * 16, "participants": np.arange(4), "threshold": 3, "hidden": False},
            0,
            SiloContext(clients[0], 0, {}),
        )


# ------------------------------------------------------------------- attack: attempt difference


def test_attempt_difference_with_a_late_reply_broke_the_old_protocol_and_fails_now() -> None:
    """Issue #22: silo 2 misses the timeout; its late upload still arrives. Old protocol:
    Σ attempt 0 − Σ attempt 1 = its update (max error ~1e-10). New protocol: one pass, the late
    upload stays masked by PRG(b_2), which the server never reconstructs; no second session."""
    clients = _clients(7)  # t = 5, q = 6: one silo may be lost
    victim = 2
    ring = FixedPointRing()
    truth = clients[victim].flat(0)
    a0, a1 = legacy_abort_and_retry({c: cl.flat(0) for c, cl in clients.items()}, victim, ring)
    recovered = attempt_difference(a0, a1, ring)
    assert np.max(np.abs(recovered - truth)) < 1e-8  # the old protocol leaked the update

    transport = RecordingDropTransport(clients, victims=(victim,), stage="upload")
    proto = SecureSum()
    rest = [0, 1, 3, 4, 5, 6]
    agg = proto.collect(transport, list(range(7)), PARAMS, 0, {}, Server())
    assert agg.count == 6 and _close(agg, clients, rest, 0)
    # The attacker's best use of the late upload: remove its pairwise masks with the victim's
    # mask seed, which the server legitimately reconstructed from the unmask replies.
    late = transport.late[victim]["masked"]
    u1, t = proto.last_round["u1"], proto.last_round["t"]
    unmask = transport.replies_at("unmask")
    seed = shamir.combine({h: r["mask_shares"][:16] for h, r in unmask.items()}, t, u1)
    keys = {c: r["mask_key"] for c, r in transport.replies_at("advertise").items()}
    session = transport.requests[0][2]["session"]
    y = late.copy()
    for other in rest:
        mask = pair_mask(mask_key(seed, session, 0), victim, keys[other], other, session, 0, y.size)
        y = y - mask if victim < other else y + mask
    # What is left is x_2 + PRG(b_2): uniform in Z_2^64, never the update.
    with pytest.raises(IntegrityError, match="did not cancel"):
        proto.ring.decode(y, 1)
    # A second attempt at the same round: refused by the server object, and a fresh session
    # (a restarted server) finds every silo that masked the round declining it.
    with pytest.raises(ValueError, match="already summed"):
        proto.collect(transport, rest, PARAMS, 0, {}, Server())
    again = SecureSum()
    assert again.collect(transport, rest, PARAMS, 0, {}, Server()).empty
    assert again.last_round["declined"] == rest
    assert all(c.fits == [0] for c in clients.values())  # no contribution was masked twice


# --------------------------------------------------------- attack: both seeds of one silo


def _to_upload(n: int, victims: tuple[int, ...] = ()):
    """Run advertise → upload by hand; return (transport, proto state) at the consistency step."""
    clients = _clients(n)
    transport = RecordingDropTransport(clients, victims=victims, stage="upload")
    proto = SecureSum()

    class Halt(Exception):
        pass

    original = transport.exchange

    def exchange(protocol, stage, requests, round_index):
        if stage == "consistency":
            raise Halt
        return original(protocol, stage, requests, round_index)

    transport.exchange = exchange  # type: ignore[method-assign]
    with pytest.raises(Halt):
        proto.collect(transport, list(range(n)), PARAMS, 0, {}, Server())
    transport.exchange = original  # type: ignore[method-assign]
    session = transport.requests[0][2]["session"]
    return clients, transport, proto, session


def test_a_silo_never_reveals_both_seeds_of_one_silo() -> None:
    clients, transport, proto, session = _to_upload(5)  # t(5) = 4, q = 5
    everyone = np.arange(5)
    both = {"session": session, "survivors": everyone, "dropped": np.array([3])}
    with pytest.raises(IntegrityError, match="both as a survivor and as dropped"):
        transport.exchange("secure", "consistency", {0: both}, 0)
    # One survivor set per round: silo 0 confirms the honest one, then refuses any other, and
    # unmasks only the set it confirmed, once q silos confirmed it (the equivocation attack
    # itself: tests/test_secure_active.py).
    honest = {"session": session, "survivors": everyone, "dropped": np.array([], np.int64)}
    transport.exchange("secure", "consistency", {0: honest}, 0)
    liar = {"session": session, "survivors": np.array([0, 1, 2, 4]), "dropped": np.array([3])}
    with pytest.raises(IntegrityError, match="stage 'confirmed'"):
        transport.exchange("secure", "consistency", {0: liar}, 0)
    alone = {"signers": np.array([0]), "confirmations": b""}
    with pytest.raises(IntegrityError, match="not the one this silo confirmed"):
        transport.exchange("secure", "unmask", {0: {**liar, **alone}}, 0)
    with pytest.raises(IntegrityError, match=r"1 silo\(s\) confirmed the survivor set < q = 5"):
        transport.exchange("secure", "unmask", {0: {**honest, **alone}}, 0)
    forged = {"signers": everyone, "confirmations": bytes(16 * 4)}
    with pytest.raises(IntegrityError, match="confirmation of the survivor set does not verify"):
        transport.exchange("secure", "unmask", {0: {**honest, **forged}}, 0)


def test_a_dropped_silo_is_not_asked_to_unmask_and_late_or_replayed_messages_are_refused() -> None:
    clients, transport, proto, session = _to_upload(7, victims=(1,))  # t = 5, q = 6
    ctx = SiloContext(clients[1], 1, transport._silo_memory[1], transport.security[1])
    # The late silo 1 wakes up: a replayed upload request is refused (stage already passed).
    upload = next(r for s, c, r in transport.requests if s == "upload" and c == 1)
    with pytest.raises(IntegrityError, match="stage 'uploaded'"):
        silo_handler("upload", upload, 0, ctx)
    # A request of another session or round finds no state.
    with pytest.raises(IntegrityError, match="no state"):
        silo_handler("upload", {**upload, "session": b"x" * 16}, 0, ctx)
    with pytest.raises(IntegrityError, match="no state"):
        silo_handler("upload", upload, 1, ctx)
    # Re-advertising the same session and round is refused; shares are never sent twice.
    advertise = next(r for s, c, r in transport.requests if s == "advertise" and c == 0)
    with pytest.raises(IntegrityError, match="already begun"):
        silo_handler(
            "advertise",
            advertise,
            0,
            SiloContext(clients[0], 0, transport._silo_memory[0], transport.security[0]),
        )
    share = next(r for s, c, r in transport.requests if s == "share" and c == 0)
    with pytest.raises(IntegrityError, match="stage 'uploaded'"):
        transport.exchange("secure", "share", {0: share}, 0)
    # A survivor set needs t survivors, and q to be confirmed, at the silo too.
    few = {"session": session, "survivors": np.array([0, 2]), "dropped": np.array([1, 3, 4, 5, 6])}
    with pytest.raises(IntegrityError, match="2 survivors < t = 5"):
        transport.exchange("secure", "consistency", {0: few}, 0)
    short = {**few, "survivors": np.array([0, 2, 3, 4, 5]), "dropped": np.array([1, 6])}
    with pytest.raises(IntegrityError, match="5 survivors < q = 6"):
        transport.exchange("secure", "consistency", {0: short}, 0)


# --------------------------------------------------------------------------- integrity


def test_a_tampered_upload_or_a_forged_key_list_fails_loudly() -> None:
    class Tamper(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            replies = super().exchange(protocol, stage, requests, round_index)
            if stage == "upload":
                replies[1] = {**replies[1], "masked": replies[1]["masked"] ^ np.uint64(1 << 62)}
            return replies

    clients = {c: ScriptedClient(c, [(40,)]) for c in range(3)}
    with pytest.raises(IntegrityError, match="did not cancel"):
        SecureSum().collect(Tamper(clients), [0, 1, 2], [np.zeros(40, np.float32)], 0, {}, Server())

    class Forge(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "share":
                keys = bytearray(requests[0]["mask_keys"])
                keys[:32] = bytes(32)
                requests = {**requests, 0: {**requests[0], "mask_keys": bytes(keys)}}
            return super().exchange(protocol, stage, requests, round_index)

    with pytest.raises(IntegrityError, match="does not hold this silo's keys"):
        SecureSum().collect(Forge(_clients(3)), [0, 1, 2], PARAMS, 0, {}, Server())


def test_discrete_uploads_live_in_z_2b_and_masks_that_do_not_cancel_fail_loudly() -> None:
    """Discrete shares: each masked upload is uint32 below 2^b (masks reduced modulo 2^b: the
    server learns the sum modulo 2^b only), and the zero check words catch an unmask that did
    not cancel (here: a tampered check word). A tampered *share* coordinate is a valid residue
    -- active attacks are outside the semi-honest model, and change utility, not privacy."""
    params = discrete_share_params(
        clip=10.0, noise_multiplier=1e-3, silos=3, survivors=2, dimension=17, bits=24
    )
    enc = ShareEncoding(params, 17)
    clients = {c: ScriptedClient(c, SHAPES, share_encoding=enc) for c in range(3)}
    transport = RecordingDropTransport(clients)
    agg = SecureSum().collect(transport, [0, 1, 2], PARAMS, 0, {}, Server(enc))
    assert agg.count == 3 and _close(agg, clients, [0, 1, 2], 0, tol=0.1)
    for r in transport.replies_at("upload").values():
        assert r["masked"].dtype == np.uint32 and int(r["masked"].max()) < 2**24
        assert r["masked"].shape == (enc.upload_length,)

    class Tamper(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            replies = super().exchange(protocol, stage, requests, round_index)
            if stage == "upload":
                masked = replies[1]["masked"].copy()
                masked[-1] ^= np.uint32(1)
                replies[1] = {**replies[1], "masked": masked}
            return replies

    clients = {c: ScriptedClient(c, SHAPES, share_encoding=enc) for c in range(3)}
    with pytest.raises(IntegrityError, match="did not cancel"):
        SecureSum().collect(Tamper(clients), [0, 1, 2], PARAMS, 0, {}, Server(enc))
    # a server that announces another size or ring is refused by the silo
    clients = {c: ScriptedClient(c, SHAPES, share_encoding=enc) for c in range(3)}
    with pytest.raises(IntegrityError, match="announces shares"):
        SecureSum().collect(InProcessTransport(clients), [0, 1, 2], PARAMS, 0, {}, Server())


def test_overflow_of_the_fixed_point_ring_is_a_clear_error() -> None:
    clients = {c: ScriptedClient(c, SHAPES, scale=1e7) for c in range(2)}
    with pytest.raises(RingOverflowError, match="secure.fractional_bits"):
        SecureSum().collect(InProcessTransport(clients), [0, 1], PARAMS, 0, {}, Server())
    # fewer fractional bits widen the range
    SecureSum(fractional_bits=8).collect(
        InProcessTransport(clients), [0, 1], PARAMS, 0, {}, Server()
    )


def test_secrets_stay_in_the_silos_memory(tmp_path: Path, monkeypatch: Any) -> None:
    """Every seed and private key a silo drew: never in a message, a file or the config."""
    import pdpfl.fl.aggregation.secure_silo as silo_side

    drawn: list[bytes] = []
    token_bytes, new_key = silo_side.secrets.token_bytes, silo_side.new_private_key

    def record_token(n: int) -> bytes:
        drawn.append(token_bytes(n))
        return drawn[-1]

    def record_key():
        key = new_key()
        drawn.append(silo_side._raw(key))
        return key

    from types import SimpleNamespace

    monkeypatch.setattr(silo_side, "secrets", SimpleNamespace(token_bytes=record_token))
    monkeypatch.setattr(silo_side, "new_private_key", record_key)
    cfg = config_from_dict(TINY, ["aggregation=secure", "rounds=2", "client_rate=1"])
    server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
    transport = RecordingDropTransport(clients)
    run_federation(cfg, server, transport, tmp_path, progress=False)
    assert len(drawn) == 2 * 4 * 3  # two rounds × four silos × (channel key, two seeds)
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    stored += json.dumps(cfg.model_dump(mode="json")).encode()
    wire = b"".join(
        v if isinstance(v, bytes) else v.tobytes() if isinstance(v, np.ndarray) else b""
        for _, _, m in transport.requests + transport.received
        for v in m.values()
    )
    for raw in drawn:
        assert raw not in stored and raw not in wire
    # After a round only public facts remain at the silo: the rounds it masked.
    for memory in transport._silo_memory.values():
        assert memory["public"]["secure"]["masked"] == [0, 1]
        assert set(memory["secure"]) == {"session", "round", "stage"}


# --------------------------------------------------------------------------- hidden mode


def test_hidden_view_of_the_server_does_not_depend_on_who_took_part() -> None:
    """Message names, types and sizes are the same whatever the coins (timing is not: see
    docs/secure_aggregation.md)."""
    views, weights = [], []
    for coins in ({0: True, 1: False, 2: False}, {0: False, 1: True, 2: True}):
        clients = {c: ScriptedClient(c, SHAPES, coins={0: coins[c]}) for c in range(3)}
        transport = RecordingDropTransport(clients)
        transport.security = ephemeral_security([0, 1, 2], participation="hidden")
        proto = SecureSum(participation="hidden", client_rate=0.5)
        assert proto.silo_side_sampling
        agg = proto.collect(transport, [0, 1, 2], PARAMS, 0, {"round": 0}, Server())
        chosen = [c for c in range(3) if coins[c]]
        assert _close(agg, clients, chosen, 0)
        assert [c for c in range(3) if clients[c].fits] == chosen
        views.append([(s, c, _shape(r)) for s, c, r in transport.requests + transport.received])
        weights.append((agg.weight, agg.count))
    assert views[0] == views[1]
    assert weights[0] == weights[1] == (0.5 * 3, 3)  # the public constant λ·Σ w_i


def _shape(payload: dict[str, Any]) -> tuple:
    out = []
    for k in sorted(payload):
        v = payload[k]
        if isinstance(v, np.ndarray):
            out.append((k, str(v.dtype), v.shape))
        elif isinstance(v, bytes):
            out.append((k, "bytes", len(v)))
        else:
            out.append((k, type(v).__name__))
    return tuple(out)


@pytest.mark.slow
def test_hidden_participation_asks_every_silo_every_round(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["aggregation=secure", "participation=hidden"])
    server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
    result = run_federation(cfg, server, InProcessTransport(clients), tmp_path, progress=False)
    rounds = cfg.training.rounds
    assert all(m["selected"] == [0, 1, 2, 3] for m in result["metrics"])
    took_part = {c: cl.participations for c, cl in clients.items()}
    assert min(took_part.values()) < rounds  # the silos' own coins left some out


def test_hidden_participation_needs_secure_summation_and_a_supporting_algorithm() -> None:
    with pytest.raises(ConfigError, match="participation: hidden needs aggregation: secure"):
        config_from_dict(TINY, ["participation=hidden"])
    cfg = config_from_dict(TINY, ["aggregation=secure", "participation=hidden"])
    assert protocol_from_config(cfg).silo_side_sampling

    class MetricServer(Server):
        public_metrics = frozenset({"loss"})

    with pytest.raises(ValueError, match="reveal how many silos"):
        SecureSum(participation="hidden").collect(
            InProcessTransport(_clients(2)), [0, 1], PARAMS, 0, {}, MetricServer()
        )

    class NoCoin(ScriptedClient):
        participation_coin = None  # type: ignore[assignment]

    with pytest.raises(ValueError, match="draw their own participation coin"):
        SecureSum(participation="hidden").collect(
            InProcessTransport(
                {0: NoCoin(0, SHAPES), 1: NoCoin(1, SHAPES)},
                ephemeral_security([0, 1], participation="hidden"),
            ),
            [0, 1],
            PARAMS,
            0,
            {},
            Server(),
        )
    assert isinstance(get_protocol("secure"), SecureSum)


# --------------------------------------------------------------------------- the threshold


@given(n=st.integers(1, 500), threshold=st.floats(0.5001, 1.0), floor=st.integers(2, 10))
def test_the_survivor_threshold_is_a_majority_of_at_least_two(
    n: int, threshold: float, floor: int
) -> None:
    t = survivor_threshold(n, threshold, floor)
    assert t >= floor >= 2 and 2 * t > n and t >= threshold * n - 1e-9
    assert survivor_threshold(n + 1, threshold, floor) >= t  # monotone in n
    if t <= n:  # any admissible survivor set carries σ²C²: t shares of σ²C²/t
        assert t * (1.0 / t) == pytest.approx(1.0)


def test_the_threshold_is_validated_and_reported() -> None:
    assert [survivor_threshold(n) for n in (1, 2, 3, 4, 10, 100)] == [2, 2, 2, 3, 7, 67]
    for bad, match in (
        (["secure.threshold=0.5"], "secure.threshold: must be in \\(1/2, 1\\]"),
        (["secure.min_survivors=1"], "secure.min_survivors: must be >= 2"),
    ):
        with pytest.raises(ConfigError, match=match):
            config_from_dict(TINY, bad)
    with pytest.raises(ValueError, match="secure.threshold"):
        SecureSum(threshold=0.4)
    cfg = config_from_dict(TINY, ["aggregation=secure", "secure.threshold=0.75"])
    proto = protocol_from_config(cfg)
    assert isinstance(proto, SecureSum) and proto.survivors_needed(4) == 3
    fields = summary_fields(cfg)
    assert fields["all_silos"] == {
        "n": 4,
        "t": 3,
        "quorum": 4,
        "dropout_tolerance": 0,
        "collusion_bound": {"semi_honest": 2, "active": 2},
    }
    assert fields["threshold"] == 0.75
    assert "t - 1 silos" in fields["collusion"]["semi_honest"]
    assert (
        "t - 1" in fields["collusion"]["active"] and "consistency" in fields["collusion"]["active"]
    )
    assert "participation revealed" in fields["server_observer"]
    hidden = summary_fields(config_from_dict(TINY, ["aggregation=secure", "participation=hidden"]))
    assert "timing" in hidden["server_observer"]


def test_plain_summation_refuses_a_sum_of_too_few_noise_shares() -> None:
    class SharesServer(Server):
        distributed_noise = True

    clients = _clients(4)
    agg = PlainSum().collect(
        InProcessTransport(clients), [0, 1, 2, 3], PARAMS, 0, {}, SharesServer()
    )
    assert agg.count == 4 and SURVIVORS_KEY not in clients[0].configs[-1]  # config unchanged

    class Losing(InProcessTransport):
        def fit(self, selected, params, round_index, config):
            return super().fit(selected, params, round_index, config)[:2]

    assert PlainSum().collect(Losing(clients), [0, 1, 2, 3], PARAMS, 1, {}, SharesServer()).empty
    assert PlainSum().collect(Losing(clients), [0, 1, 2, 3], PARAMS, 1, {}, Server()).count == 2
