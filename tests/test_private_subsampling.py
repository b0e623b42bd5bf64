"""Private user-level sub-sampling hidden from the server (ULDP-FL Sec. 4.1, issue #24 item 4).

The oblivious transfer (``pdpfl.crypto.ot``): correctness, perfect receiver privacy (the
server's transcript is consistent with every choice, once each), at most one item opened (also
by a receiver that deviates), tampering detected. The protocol: the decrypted sum is the
enhanced-weighted sum over exactly the users whose obliviously chosen ciphertext carried the
weight; the server's view has the same structure whatever the silos chose and holds no user
mask; a silo's other items stay sealed. The accounting: the server is charged like a third party
(Poisson(q)-subsampled, every round). The configuration: q a multiple of 1/P, else exit 2.

Paillier keys are 1024-bit (``allow_weak_keys``): no property here depends on the key size.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from Crypto.PublicKey.ECC import EccPoint

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.crypto import IntegrityError, ot
from pdpfl.crypto.keys import context, open_sealed
from pdpfl.fl.aggregation import private_sampling, private_weighting, private_weighting_silo
from pdpfl.fl.aggregation.private_weighting import PrivateWeightedSum
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.privacy.uldp import user_epsilon
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

WEAK: dict[str, Any] = {"paillier_bits": 1024, "n_max": 600, "allow_weak_keys": True, "workers": 1}
ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

BASE = {
    "name": "uldp-private-subsampling",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 12}},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "uldp-avg",
        "weights": "private",
        "user_rate": 0.5,
        "subsampling": "private",
        "ot_items": 4,
    },
    # float shares: the private weighting protocol's own encoding, compared with the public
    # enhanced weights in the clear (which would otherwise use discrete shares)
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5, "noise_shares": "continuous"},
    "training": {"rounds": 3, "local_steps": 1, "lr": 0.3, "batch_size": 8, "max_grad_norm": 1.0},
}


def _build(*overrides: str):
    config = config_from_dict(BASE, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server, clients = build_federation_algorithms(config, load_federation_for(config))
    return config, server, clients


def _point(blob: bytes) -> EccPoint:
    return ot.point_from_bytes(blob)


# ------------------------------------------------------------------- the transfer itself


@pytest.mark.parametrize("count", [2, 5])
def test_the_receiver_opens_exactly_its_choice(count: int) -> None:
    messages = [bytes([i]) * 40 for i in range(count)]
    for choice in range(count):
        sender = ot.new_sender()
        receiver = ot.choose(sender.public, choice, count)
        sealed = ot.transfer(sender, receiver.message, messages, b"ctx")
        assert ot.receive(receiver, sender.public, sealed, b"ctx") == messages[choice]
        # the same key opens no other item (each is bound to its index and its own key)
        for i in range(count):
            if i != choice:
                with pytest.raises(IntegrityError):
                    ot.receive(
                        ot.OtReceiver(i, receiver.b, receiver.message),
                        sender.public,
                        sealed,
                        b"ctx",
                    )
        with pytest.raises(IntegrityError):  # another transfer's context
            ot.receive(receiver, sender.public, sealed, b"other")


def test_the_senders_view_is_consistent_with_every_choice_once() -> None:
    """Perfect receiver privacy: even knowing a, the server finds for B = c·A + b·G exactly one
    b' with B = c'·A + b'·G for *every* c' (b' = b + (c − c')·a): B says nothing about c."""
    sender = ot.new_sender()
    A, G = _point(sender.public), ot._G
    for choice in range(4):
        receiver = ot.choose(sender.public, choice, 4)
        B = _point(receiver.message)
        for other in range(4):
            b2 = (receiver.b + (choice - other) * sender.a) % ORDER
            alt = G * b2 + A * other if other else G * b2
            assert ot.point_bytes(alt) == receiver.message
        assert B.xy != A.xy


def test_a_deviating_receiver_still_opens_at_most_one_item() -> None:
    """A receiver that picks B as it likes knows the discrete log of B − i·A for at most one i
    (two would give a²·G from a·G). For B = b·G, b·G − A and A, every point it can form from
    what it knows (b, A, G, B) opens at most one item."""
    count = 4
    messages = [bytes([65 + i]) * 32 for i in range(count)]
    sender = ot.new_sender()
    A, G = _point(sender.public), ot._G
    b = 12345678901234567890
    for name, B in {"b·G": G * b, "b·G - A": G * b + (-A), "A": A}.items():
        sealed = ot.transfer(sender, ot.point_bytes(B), messages, b"ctx")
        candidates = [A * b, G * b, A, G, B, A * b + (-A), A * b + A]
        opened = set()
        for i in range(count):
            for shared in candidates:
                key = ot._key(b"ctx", sender.public, ot.point_bytes(B), shared, i)
                try:
                    open_sealed(key, sealed[i], context(b"pdpfl-ot-item", b"ctx", i))
                except IntegrityError:
                    continue
                opened.add(i)
        assert len(opened) <= 1, name
    assert opened == set()  # B = A: B − i·A is a multiple of A, whose a-multiple it lacks


def test_malformed_points_are_refused() -> None:
    sender = ot.new_sender()
    bad = bytearray(sender.public)
    bad[-1] ^= 1  # off the curve
    for blob in (bytes(bad), sender.public[:64], b"\x02" + sender.public[1:]):
        with pytest.raises(IntegrityError):
            ot.choose(blob, 0, 2)
        with pytest.raises(IntegrityError):
            ot.transfer(sender, blob, [b"x", b"y"], b"ctx")
    with pytest.raises(ValueError, match="choice"):
        ot.choose(sender.public, 2, 2)


def test_the_servers_orders_hold_k_weights_per_user_uniformly_placed() -> None:
    inverse = [7, 11, 13]
    rows = np.array(private_sampling.ot_plaintexts(inverse, 1, 4), dtype=object).reshape(3, 4)
    for u, row in enumerate(rows):
        assert sorted(int(v) for v in row) == [0, 0, 0, inverse[u]]
    # the position of the weight is uniform: χ² over 4 000 draws, p = 1e-6 threshold
    positions = np.zeros(4)
    for _ in range(1000):
        rows = np.array(private_sampling.ot_plaintexts(inverse + [5], 1, 4)).reshape(4, 4)
        positions += (rows != 0).sum(axis=0)
    expected = positions.sum() / 4
    assert float(((positions - expected) ** 2 / expected).sum()) < 30.0  # χ²_3 at 1e-6: 30.7
    with pytest.raises(ValueError, match="k"):
        private_sampling.ot_plaintexts(inverse, 0, 4)


# ------------------------------------------------------------------------- the protocol


class Recorder:
    """Records the server's plaintext orders and the silos' OT choices."""

    def __init__(self, monkeypatch) -> None:
        self.orders: list[list[int]] = []
        self.choices: list[dict[int, int]] = []
        plaintexts, choose = private_sampling.ot_plaintexts, private_sampling.choose_items

        def record_orders(inverse, k, p):
            out = plaintexts(inverse, k, p)
            self.orders.append([int(v != 0) for v in out])
            return out

        def record_choices(sender_public, users, p):
            receivers, message = choose(sender_public, users, p)
            self.choices.append({u: r.choice for u, r in receivers.items()})
            return receivers, message

        monkeypatch.setattr(private_weighting, "ot_plaintexts", record_orders)
        monkeypatch.setattr(private_weighting_silo, "choose_items", record_choices)

    def sampled(self, num_users: int, p: int) -> np.ndarray:
        choice = {
            u: c for per_silo in self.choices[-len(self.choices) :] for u, c in per_silo.items()
        }
        order = self.orders[-1]
        return np.array([bool(order[u * p + choice[u]]) for u in range(num_users)])


def test_the_sum_is_the_enhanced_sum_over_the_obliviously_sampled_users(monkeypatch) -> None:
    from pdpfl.fl.uldp.server import encode_mask

    rec = Recorder(monkeypatch)
    _, private, pclients = _build()
    _, public, eclients = _build(
        "algorithm.weights=enhanced",
        "data.public_user_histograms=true",
        "algorithm.subsampling=server",
    )
    assert private.private_sampling == (2, 4) and private.sampled_users(0) is None
    params = private.initial_params()
    cfg = private.round_config(0)
    assert "users" not in cfg  # no user mask leaves the server
    protocol = PrivateWeightedSum(**WEAK, record_view=True)
    agg = protocol.collect(
        InProcessTransport(pclients), sorted(pclients), params, 0, dict(cfg), private
    )
    sampled = rec.sampled(12, 4)
    public_cfg = {**public.round_config(0), "users": encode_mask(sampled)}
    outs = [eclients[c].fit(params, 0, public_cfg) for c in sorted(eclients)]
    plain = [sum(np.asarray(o.update[i], np.float64) for o in outs) for i in range(len(params))]
    for got, want in zip(agg.total, plain, strict=True):
        assert np.abs(np.asarray(got, np.float64) - want).max() < 1e-5
    if not sampled.all():  # and it is not the sum over every user
        _, _, fresh = _build(
            "algorithm.weights=enhanced",
            "data.public_user_histograms=true",
            "algorithm.subsampling=server",
        )
        everyone = {**public_cfg, "users": encode_mask(np.ones(12, bool))}
        full = [fresh[c].fit(params, 0, everyone).update for c in sorted(fresh)]
        total = [sum(np.asarray(o[i], np.float64) for o in full) for i in range(len(params))]
        assert any(np.abs(a - b).max() > 1e-6 for a, b in zip(total, plain, strict=True))
    # the server never learnt the mask: its view holds only OT points and ciphertexts
    stages = {stage for stage, _, _ in protocol.view}
    assert {"weights-ot", "weights", "install", "round"} <= stages
    for stage, _, reply in protocol.view:
        if stage == "weights-ot":
            assert set(reply) == {"ot_choices"}
            assert len(reply["ot_choices"]) % ot.POINT_BYTES == 0


@pytest.mark.parametrize("forced", [0, 3])
def test_the_servers_view_has_the_same_structure_whatever_the_silos_chose(
    forced: int, monkeypatch
) -> None:
    """Every silo forced to choose item ``forced`` for every user (all sampled or none, given
    the server's order): the server's view -- stages, fields, sizes, points on the curve -- is
    the same; the only difference is the DP-protected sum."""

    def forced_choices(sender_public, users, p):
        receivers = {int(u): ot.choose(sender_public, forced, p) for u in users}
        return receivers, b"".join(receivers[int(u)].message for u in users)

    views = {}
    for choice in ("forced", "random"):
        if choice == "forced":
            monkeypatch.setattr(private_weighting_silo, "choose_items", forced_choices)
        else:
            monkeypatch.undo()
        _, server, clients = _build()
        protocol = PrivateWeightedSum(**WEAK, record_view=True)
        params = server.initial_params()
        protocol.collect(
            InProcessTransport(clients),
            sorted(clients),
            params,
            0,
            dict(server.round_config(0)),
            server,
        )
        views[choice] = [
            (
                stage,
                c,
                {
                    k: (type(v).__name__, len(v) if isinstance(v, bytes) else np.shape(v))
                    for k, v in reply.items()
                },
            )
            for stage, c, reply in protocol.view
        ]
        for stage, _, reply in protocol.view:
            if stage == "weights-ot":
                blob = reply["ot_choices"]
                for j in range(0, len(blob), ot.POINT_BYTES):
                    ot.point_from_bytes(blob[j : j + ot.POINT_BYTES])  # a valid point
    assert views["forced"] == views["random"]


def test_a_silo_opens_one_item_per_user_and_no_other(monkeypatch) -> None:
    """The sealed items a silo receives: its own choice opens, every other index fails
    authentication under the key its secret gives."""
    seen: dict[str, Any] = {}
    original = private_sampling.open_items

    def spy(receivers, sender_public, sealed, users, p, item_bytes, session, epoch):
        seen.update(
            receivers=receivers,
            sender=sender_public,
            sealed=sealed,
            users=users,
            p=p,
            width=item_bytes,
            session=session,
            epoch=epoch,
        )
        return original(receivers, sender_public, sealed, users, p, item_bytes, session, epoch)

    monkeypatch.setattr(private_weighting_silo, "open_items", spy)
    _, server, clients = _build()
    params = server.initial_params()
    PrivateWeightedSum(**WEAK).collect(
        InProcessTransport(clients),
        sorted(clients),
        params,
        0,
        dict(server.round_config(0)),
        server,
    )
    receivers, users, p = seen["receivers"], seen["users"], int(seen["p"])
    width = int(seen["width"]) + private_sampling.SEAL_OVERHEAD
    sealed = seen["sealed"]
    assert isinstance(sealed, bytes) and isinstance(receivers, dict)
    for j, u in enumerate(users):
        row = [sealed[(j * p + i) * width : (j * p + i + 1) * width] for i in range(p)]
        r = receivers[u]
        ctx = private_sampling.item_context(seen["session"], seen["epoch"], u)
        opened = []
        for i in range(p):
            try:
                ot.receive(ot.OtReceiver(i, r.b, r.message), seen["sender"], row, ctx)
                opened.append(i)
            except IntegrityError:
                pass
        assert opened == [r.choice]


# ------------------------------------------------------------------ accounting and config


def test_the_server_is_charged_like_a_third_party() -> None:
    """σ = 2, q = 0.5, 3 rounds: both observers spent the Poisson(0.5)-subsampled ε of 3
    rounds; with the server drawing the coins it is charged plain Gaussian rounds instead."""
    _, server, _ = _build()
    assert server.plan.hidden_sampling and server.plan.charged_on("server") == "active"
    assert server.plan.with_noise(3.0).hidden_sampling  # calibration keeps the rule
    for t in range(3):
        server.round_users(t)  # charged write-ahead, before any silo is asked
    q_eps = user_epsilon(2.0, 1e-5, 3, 0.5)
    for observer in ("third-party", "server"):
        spent = server.ledger.spent_epsilon(observer)
        assert float(spent.max()) == pytest.approx(q_eps, rel=1e-9)
    _, open_server, _ = _build("algorithm.subsampling=server")
    assert not open_server.plan.hidden_sampling
    assert open_server.plan.charged_on("server") == "participated"
    assert float(open_server.plan.planned_epsilon([0.5], "server")[0]) > q_eps * 1.5


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.user_rate=0.3"], r"algorithm.user_rate: .*multiple of 1/P = 1/4"),
        (["algorithm.user_rate=null"], r"algorithm.subsampling: private needs one user_rate"),
        (["algorithm.weights=uniform"], r"set algorithm.weights: private"),
        (["algorithm.name=uldp-naive", "algorithm.weights=uniform"], r"uldp-avg / uldp-sgd"),
    ],
)
def test_the_configuration_is_checked(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict(BASE, overrides)
    algo: Any = config_from_dict(BASE, ["algorithm.user_rate=0.75"]).algorithm
    assert algo.user_rate == 0.75


def test_the_cli_refuses_a_rate_off_the_grid_with_exit_2(tmp_path) -> None:
    """``pdpfl run``: ``error: algorithm.user_rate: ...`` naming P, exit 2, nothing written."""
    import json

    from typer.testing import CliRunner

    from pdpfl.cli import app

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(BASE))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["run", str(cfg), "--out", str(out), "--quiet", "--set", "algorithm.user_rate=0.3"]
    )
    assert res.exit_code == 2, res.output
    assert "error: algorithm.user_rate:" in res.output and "1/4" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.slow
def test_end_to_end_run_with_3072_bit_keys(tmp_path) -> None:
    """A simulated run: both observers' ε is the Poisson(q)-subsampled one of the rounds."""
    import json

    from pdpfl.runtime.simulation import run_simulation

    config = config_from_dict(BASE, ["secure.workers=1", "secure.n_max=600", "rounds=2"])
    run_simulation(config, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["completed"] and saved["rounds_completed"] == 2
    assert saved["aggregation"]["protocol"] == "private-weighting"
    q_eps = user_epsilon(2.0, 1e-5, 2, 0.5)
    assert saved["eps_spent_max"]["third_party"] == pytest.approx(q_eps, rel=1e-6)
    assert saved["eps_spent_max"]["server"] == pytest.approx(q_eps, rel=1e-6)


@pytest.mark.parametrize("stage", ["weights-ot", "weights"])
def test_a_silo_lost_while_weights_are_prepared_has_its_users_taken_over(
    stage: str, monkeypatch
) -> None:
    """Silo 2 does not answer ``stage``: its users go to silos 0 and 1 in a second attempt
    (with a fresh transfer under private sub-sampling; ``weights`` also covers the plain
    protocol), the verification masks run over the silos left, and the round is released by
    the two survivors (t(3) = 2). Before, the second attempt overwrote the first one's shares
    and the check masks still counted silo 2: the install failed."""
    rec = Recorder(monkeypatch)
    extra = [] if stage == "weights-ot" else ["algorithm.subsampling=server"]
    _, server, clients = _build(*extra)

    class Dropping(InProcessTransport):
        def exchange(self, protocol, name, requests, round_index):
            if name == stage:
                requests = {c: r for c, r in requests.items() if c != 2}
            return super().exchange(protocol, name, requests, round_index)

    protocol = PrivateWeightedSum(**WEAK, record_view=True)
    params = server.initial_params()
    agg = protocol.collect(
        Dropping(clients), sorted(clients), params, 0, dict(server.round_config(0)), server
    )
    assert agg.count == 2 and protocol.participants == [0, 1]
    answered = {c for name, c, _ in protocol.view if name == stage}
    assert answered == {0, 1}
    if stage == "weights-ot":
        chosen = [u for per_silo in rec.choices for u in per_silo]
        assert sorted(chosen) == list(range(12))  # every user transferred once, by 0 and 1
