"""ULDP-FL's private weighting protocol (Protocol 1): the decrypted aggregate equals the plain
weighted sum Σ_s Σ_u (n_{s,u}/N_u)·Δ_{s,u} + Σ_s z_s within the stated precision, the server's
recorded view holds no n_{s,u}, N_u or w_{s,u}, and every broken condition fails loudly.

Keys: 1024-bit Paillier keys (``allow_weak_keys``) wherever the property does not depend on the
key size -- correctness, integrity checks and views are the same arithmetic at any size -- and
one end-to-end test with the deployed 3072-bit size.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.crypto import IntegrityError, RingOverflowError
from pdpfl.fl.aggregation import SURVIVORS_KEY, protocol_from_config
from pdpfl.fl.aggregation.private_weighting import (
    PrivateWeightedSum,
    UserUpdates,
    WeightingParams,
    divisor,
    no_wrap_bound,
    plain_weighted_sum,
)
from pdpfl.runtime.simulation import InProcessTransport

WEAK = {"paillier_bits": 1024, "n_max": 60, "allow_weak_keys": True, "workers": 1}


class UserClient:
    """A silo with a user histogram and, each round, random clipped deltas and noise."""

    def __init__(self, cid: int, histogram: np.ndarray, d: int, scale: float = 1.0) -> None:
        self.client_id = cid
        self.histogram = np.asarray(histogram, dtype=np.int64)
        self.d = d
        self.scale = scale
        self.updates: dict[int, UserUpdates] = {}
        self.calls: list[int] = []

    def user_histogram(self) -> np.ndarray:
        return self.histogram.copy()

    def user_updates(self, params, round_index, config) -> UserUpdates:
        self.calls.append(int(round_index))
        rng = np.random.default_rng(100 * round_index + self.client_id)
        users = np.flatnonzero(self.histogram > 0)
        deltas = rng.uniform(-1, 1, size=(users.size, self.d)) * self.scale
        norms = np.maximum(1.0, np.linalg.norm(deltas, axis=1, keepdims=True))
        up = UserUpdates(users, deltas / norms, rng.normal(0, 0.5, self.d))
        self.updates[int(round_index)] = up
        return up

    def fit(self, *args):  # pragma: no cover - never called by Protocol 1
        raise AssertionError("Protocol 1 must not call fit")

    def evaluate(self, *args):
        return {"loss": 0.0, "accuracy": 0.0, "n": 0}


class UserServer:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False

    def __init__(self, num_users: int, q: float | None = None) -> None:
        self.num_users = num_users
        self.q = q
        self.masks: dict[int, np.ndarray] = {}

    def sampled_users(self, round_index: int) -> np.ndarray | None:
        if self.q is None:
            return None
        rng = np.random.default_rng(7 + round_index)
        self.masks[round_index] = rng.uniform(size=self.num_users) < self.q
        return self.masks[round_index]


def _federation(num_users=6, silos=3, d=5, seed=0, histograms=None, scale=1.0):
    rng = np.random.default_rng(seed)
    if histograms is None:
        histograms = rng.integers(0, 6, size=(silos, num_users))
        histograms[0, histograms.sum(axis=0) == 0] = 1  # every user has a record somewhere
    clients = {s: UserClient(s, histograms[s], d, scale) for s in range(len(histograms))}
    return clients, {s: c.histogram for s, c in clients.items()}


def _check(agg, clients, hists, t, sampled=None, silos=None, num_users=None):
    silos = list(clients) if silos is None else silos
    ref = plain_weighted_sum(hists, {s: clients[s].updates[t] for s in silos}, sampled)
    got = np.concatenate([np.asarray(a).reshape(-1) for a in agg.total])
    # P/2·(|U| + 2|S|): rounding of deltas and noise, and each silo's dither (≤ P/2)
    bound = 1e-10 / 2 * (len(hists[0]) + 2 * len(silos)) + 1e-12 * np.abs(ref).sum()
    assert np.all(np.abs(got - ref) <= bound), np.abs(got - ref).max()
    return got, ref


# --------------------------------------------------------------------------- correctness


def test_aggregate_equals_the_plain_weighted_sum_over_rounds() -> None:
    clients, hists = _federation()
    transport = InProcessTransport(clients)
    proto = PrivateWeightedSum(**WEAK, expected_rounds=3)
    server = UserServer(6)
    params = [np.zeros((5,), np.float32)]
    for t in range(3):
        agg = proto.collect(transport, [0, 1, 2], params, t, {}, server)
        assert agg.count == 3 and agg.total[0].dtype == np.float64
        _check(agg, clients, hists, t)
    # Without sub-sampling the encrypted weights are installed once (setup work done once).
    assert proto._epoch == 0
    assert all(c.calls == [0, 1, 2] for c in clients.values())


def test_user_subsampling_zeroes_the_weights_of_users_not_sampled() -> None:
    clients, hists = _federation(num_users=8, d=3, seed=1)
    proto = PrivateWeightedSum(**WEAK)
    server = UserServer(8, q=0.5)
    transport = InProcessTransport(clients)
    for t in range(2):
        agg = proto.collect(transport, [0, 1, 2], [np.zeros(3, np.float32)], t, {}, server)
        assert 0 < server.masks[t].sum() < 8
        _check(agg, clients, hists, t, sampled=server.masks[t])
    assert proto._epoch == 1  # fresh ⟦β⟧ every round


def test_the_3072_bit_protocol_end_to_end() -> None:
    clients, hists = _federation(num_users=4, silos=2, d=3, seed=2)
    proto = PrivateWeightedSum(paillier_bits=3072, workers=1)
    agg = proto.collect(
        InProcessTransport(clients), [0, 1], [np.zeros(3, np.float32)], 0, {}, UserServer(4)
    )
    assert proto._pk.bits == 3072
    _check(agg, clients, hists, 0)


def test_both_cores_give_the_same_result(monkeypatch) -> None:
    import pdpfl.crypto.parallel as par

    used: list[tuple[str, int]] = []
    run = par.run_chunks

    def spy(func, shared, chunks, workers):
        used.append((func.__name__, len(chunks)))
        return run(func, shared, chunks, workers)

    monkeypatch.setattr(par, "run_chunks", spy)
    clients, hists = _federation(num_users=30, silos=2, d=120, seed=3)
    proto = PrivateWeightedSum(**{**WEAK, "workers": 2})
    agg = proto.collect(
        InProcessTransport(clients), [0, 1], [np.zeros(120, np.float32)], 0, {}, UserServer(30)
    )
    _check(agg, clients, hists, 0)
    for name in ("_encrypt_chunk", "_power_chunk", "_round_chunk", "_decrypt_chunk"):
        assert (name, 2) in used, (name, used)


def test_allowed_totals_remedy_handles_large_record_counts() -> None:
    """N_u far above what lcm(1..N_max) allows, made exact by allowed totals (powers of two)."""
    hists = np.array([[1000, 3000, 0, 512], [1048, 1096, 64, 512]])  # totals 2048, 4096, 64, 1024
    clients, hists = _federation(histograms=hists, d=4)
    assert WeightingParams(**{**WEAK, "allowed_totals": (64, 1024, 2048, 4096)}).divisor == 4096
    proto = PrivateWeightedSum(**{**WEAK, "allowed_totals": [64, 1024, 2048, 4096]})
    agg = proto.collect(
        InProcessTransport(clients), [0, 1], [np.zeros(4, np.float32)], 0, {}, UserServer(4)
    )
    _check(agg, clients, hists, 0)


# --------------------------------------------------------------------------- what the server sees


def test_the_servers_view_contains_no_histogram_total_or_weight() -> None:
    clients, hists = _federation(num_users=6, silos=3, d=4, seed=4)
    proto = PrivateWeightedSum(**WEAK, record_view=True)
    proto.collect(
        InProcessTransport(clients), [0, 1, 2], [np.zeros(4, np.float32)], 0, {}, UserServer(6)
    )
    pk = proto._pk
    allowed = {
        "setup-keys": {"dh_public", "pk_fingerprint"},
        "setup-seed": {"ok"} | {f"seed.{c}" for c in clients},
        "setup-histogram": {"blinded_histogram"},
        "weights": {"shares"},
        "install": {"check"},
        "round": {"ciphertexts", "pk_fingerprint"},
    }
    totals = sum(hists.values())
    div = divisor(60)
    secrets_ints = {int(v) for h in hists.values() for v in h} | {int(v) for v in totals}
    secrets_ints |= {
        div * int(h[u]) // int(totals[u]) for h in hists.values() for u in range(6) if totals[u]
    }
    for stage, _silo, reply in proto.view:
        assert set(reply) <= allowed[stage], (stage, set(reply))
        for key, value in reply.items():
            assert isinstance(value, bytes | bool), (stage, key)
        if stage == "setup-histogram":
            blinded = pk.integers_from_bytes(reply["blinded_histogram"], 6)
            # uniform in Z_n (1024 bits): never a small count, total or weight
            assert all(int(b) not in secrets_ints and b.bit_length() > 900 for b in blinded)
    # Decrypting a single silo's round ciphertexts (the server can) gives masked, uniform values.
    sk = proto._PrivateWeightedSum__sk
    for stage, _silo, reply in proto.view:
        if stage == "round":
            values = [sk.decrypt(c) for c in pk.ciphertexts_from_bytes(reply["ciphertexts"], 4)]
            assert all(v.bit_length() > 900 for v in values)
    # What the server keeps: the blinded inverses, not N_u.
    assert all(int(b) not in secrets_ints for b in proto._inverse)


# --------------------------------------------------------------------------- loud failures


def test_a_tampered_round_ciphertext_fails_loudly() -> None:
    clients, _ = _federation(d=4, seed=5)

    class Tamper(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            replies = super().exchange(protocol, stage, requests, round_index)
            if stage == "round":
                blob = bytearray(replies[1]["ciphertexts"])
                blob[5] ^= 0x40
                replies[1] = {**replies[1], "ciphertexts": bytes(blob)}
            return replies

    with pytest.raises(IntegrityError, match="no-wrap"):
        PrivateWeightedSum(**WEAK).collect(
            Tamper(clients), [0, 1, 2], [np.zeros(4, np.float32)], 0, {}, UserServer(6)
        )


def test_tampered_encrypted_weights_are_caught_by_the_verification() -> None:
    clients, _ = _federation(d=3, seed=6)

    class Tamper(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "weights":
                blob = bytearray(requests[0]["weights"])
                blob[3] ^= 0x01
                requests = {c: {**r, "weights": bytes(blob)} for c, r in requests.items()}
            return super().exchange(protocol, stage, requests, round_index)

    with pytest.raises(IntegrityError, match="verification aggregate is garbage"):
        PrivateWeightedSum(**WEAK).collect(
            Tamper(clients), [0, 1, 2], [np.zeros(3, np.float32)], 0, {}, UserServer(6)
        )


def test_wrong_keys_fail_loudly() -> None:
    clients, _ = _federation(d=3, seed=7)

    class SwapKeys(InProcessTransport):  # the relay swaps two silos' DH public keys
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "setup-seed":
                blob = requests[0]["dh_publics"]
                swapped = blob[32:64] + blob[:32] + blob[64:]
                requests = {c: {**r, "dh_publics": swapped} for c, r in requests.items()}
            return super().exchange(protocol, stage, requests, round_index)

    with pytest.raises(IntegrityError, match="does not hold this silo's key"):
        PrivateWeightedSum(**WEAK).collect(
            SwapKeys(clients), [0, 1, 2], [np.zeros(3, np.float32)], 0, {}, UserServer(6)
        )

    class OtherPaillier(InProcessTransport):  # a silo is handed another Paillier key
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "setup-keys":
                from pdpfl.crypto.paillier import generate_keypair

                other = generate_keypair(1024, allow_weak=True)[0].to_bytes()
                requests = {**requests, 2: {**requests[2], "paillier_n": other}}
            return super().exchange(protocol, stage, requests, round_index)

    with pytest.raises(IntegrityError, match="another Paillier key"):
        PrivateWeightedSum(**WEAK).collect(
            OtherPaillier(clients), [0, 1, 2], [np.zeros(3, np.float32)], 0, {}, UserServer(6)
        )

    class BadSeed(InProcessTransport):  # the sealed seed R is modified in transit
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "setup-histogram":
                blob = bytearray(requests[1]["seed"])
                blob[-1] ^= 1
                requests = {**requests, 1: {**requests[1], "seed": bytes(blob)}}
            return super().exchange(protocol, stage, requests, round_index)

    with pytest.raises(IntegrityError, match="shared seed R: authentication failed"):
        PrivateWeightedSum(**WEAK).collect(
            BadSeed(clients), [0, 1, 2], [np.zeros(3, np.float32)], 0, {}, UserServer(6)
        )


def test_a_silo_refuses_a_weaker_paillier_key_than_configured(monkeypatch) -> None:
    import pdpfl.fl.aggregation.private_weighting as pw
    from pdpfl.crypto.paillier import generate_keypair

    weak = generate_keypair(1024, allow_weak=True)
    monkeypatch.setattr(pw, "generate_keypair", lambda bits, allow_weak=False: weak)
    clients, _ = _federation(d=2)
    with pytest.raises(IntegrityError, match="fewer than the configured 3072"):
        PrivateWeightedSum(paillier_bits=3072, workers=1).collect(
            InProcessTransport(clients), [0, 1, 2], [np.zeros(2, np.float32)], 0, {}, UserServer(6)
        )


def test_correctness_conditions_are_enforced() -> None:
    params = [np.zeros(2, np.float32)]
    # N_u = 0: a user without records anywhere
    clients, _ = _federation(histograms=np.array([[1, 0, 2], [3, 0, 1]]), d=2)
    with pytest.raises(ValueError, match="user 1 has no records in any silo"):
        PrivateWeightedSum(**WEAK).collect(
            InProcessTransport(clients), [0, 1], params, 0, {}, UserServer(3)
        )
    # a local count above N_max is refused by the silo itself
    clients, _ = _federation(histograms=np.array([[61, 1], [0, 1]]), d=2)
    with pytest.raises(ValueError, match="more than N_max = 60 records"):
        PrivateWeightedSum(**WEAK).collect(
            InProcessTransport(clients), [0, 1], params, 0, {}, UserServer(2)
        )
    # N_u = 59 + 2 = 61 > N_max: 61 is prime, so it does not divide DIV = lcm(1..60)
    clients, _ = _federation(histograms=np.array([[59, 1], [2, 1]]), d=2)
    with pytest.raises(IntegrityError, match="N_u does not divide DIV"):
        PrivateWeightedSum(**WEAK).collect(
            InProcessTransport(clients), [0, 1], params, 0, {}, UserServer(2)
        )
    # ... while N_u = 62 = 2·31 divides lcm(1..60): exact, accepted
    clients, hists = _federation(histograms=np.array([[59, 1], [3, 1]]), d=2)
    agg = PrivateWeightedSum(**WEAK).collect(
        InProcessTransport(clients), [0, 1], params, 0, {}, UserServer(2)
    )
    _check(agg, clients, hists, 0)


def test_parameters_that_cannot_work_are_refused_with_the_remedy() -> None:
    with pytest.raises(ValueError, match="largest usable N_max is"):
        WeightingParams(paillier_bits=3072, n_max=2200)
    WeightingParams(paillier_bits=3072, n_max=2000)
    WeightingParams(paillier_bits=3072, n_max=10**5, allowed_totals=tuple(2**k for k in range(17)))
    with pytest.raises(ValueError, match="3072"):
        WeightingParams(paillier_bits=2048)
    with pytest.raises(ValueError, match="secure.precision"):
        WeightingParams(precision=0.0)


def test_values_beyond_the_no_wrap_room_are_refused_at_the_silo() -> None:
    class Huge(UserClient):
        def user_updates(self, params, round_index, config) -> UserUpdates:
            users = np.flatnonzero(self.histogram > 0)
            return UserUpdates(users, np.full((users.size, 2), 1e300), np.zeros(2))

    _, hists = _federation(d=2, seed=8)
    clients = {s: Huge(s, h, 2) for s, h in hists.items()}
    with pytest.raises(RingOverflowError, match="no-wrap room"):
        PrivateWeightedSum(**WEAK).collect(
            InProcessTransport(clients), [0, 1, 2], [np.zeros(2, np.float32)], 0, {}, UserServer(6)
        )


# --------------------------------------------------------------------------- dropouts


def test_a_silo_lost_in_a_round_leaves_it_without_aggregate_and_no_retry() -> None:
    """Issue #22: the old protocol repeated the round with the survivors under fresh masks, so
    the lost silo's late reply completed attempt 0 and attempt 0 − attempt 1 was its weighted
    update. Now the round has no aggregate, nothing is re-masked, and later rounds go on with
    the others while they are at least t = t(|S|)."""
    clients, hists = _federation(num_users=5, silos=3, d=4, seed=9)

    class Drop(InProcessTransport):
        late: dict = {}

        def exchange(self, protocol, stage, requests, round_index):
            replies = super().exchange(protocol, stage, requests, round_index)
            if stage == "round" and round_index == 1:
                self.late[2] = replies.pop(2)  # computed, masked, encrypted, then late
            return replies

    transport = Drop(clients)
    proto = PrivateWeightedSum(**WEAK)
    server = UserServer(5)
    params = [np.zeros(4, np.float32)]
    _check(proto.collect(transport, [0, 1, 2], params, 0, {}, server), clients, hists, 0)
    agg = proto.collect(transport, [0, 1, 2], params, 1, {}, server)
    assert agg.empty and proto.participants == [0, 1]
    assert proto.last_round["outcome"] == "no aggregate: silo(s) [2] lost in the round"
    assert clients[0].calls == [0, 1]  # one contribution per round, never re-masked
    # Round 2 with the two remaining silos (t(3) = 2); their noise shares were sized σ²C²/2.
    agg = proto.collect(transport, [0, 1, 2], params, 2, {}, server)
    _check(agg, clients, hists, 2, silos=[0, 1])
    assert agg.count == 2 and clients[2].calls == [0, 1]
    # A repeated round request is refused by the silo (it masks each round once).
    with pytest.raises(IntegrityError, match="already masked"):
        proto.collect(transport, [0, 1], params, 2, {}, server)
    # One more loss leaves fewer than t silos: no round is released any more.
    proto.participants = [0]
    assert proto.collect(transport, [0, 1, 2], params, 3, {}, server).empty
    assert proto.last_round["outcome"] == "refused: 1 silo(s) < t = 2"


def test_a_silo_lost_during_setup_aborts_with_a_clear_error() -> None:
    clients, _ = _federation(d=2)

    class Lose(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            replies = super().exchange(protocol, stage, requests, round_index)
            if stage == "setup-histogram":
                replies.pop(1)
            return replies

    with pytest.raises(RuntimeError, match="did not answer stage 'setup-histogram'"):
        PrivateWeightedSum(**WEAK).collect(
            Lose(clients), [0, 1, 2], [np.zeros(2, np.float32)], 0, {}, UserServer(6)
        )


def test_protocol_from_config_selects_private_weighting() -> None:
    class Cfg:
        aggregation = "plain"
        participation = "visible"

        class algorithm:  # noqa: N801
            weights = "private"

        class secure:  # noqa: N801
            @staticmethod
            def model_dump():
                return dict(WEAK)

    proto = protocol_from_config(Cfg)
    assert isinstance(proto, PrivateWeightedSum) and proto.params.n_max == 60
    assert proto.hides_individual_updates


# ------------------------------------------------- issue #22: residues, no-wrap room, shares


class NoisyClient(UserClient):
    """Deltas on the P grid's full range and Gaussian noise of std ``sigma`` (σ = 50)."""

    sigma = 50.0

    def user_updates(self, params, round_index, config) -> UserUpdates:
        self.calls.append(int(round_index))
        self.configs = [*getattr(self, "configs", []), dict(config)]
        rng = np.random.default_rng()
        users = np.flatnonzero(self.histogram > 0)
        deltas = rng.uniform(-1, 1, size=(users.size, self.d)) / np.sqrt(self.d)
        up = UserUpdates(users, deltas, rng.normal(0, self.sigma, self.d))
        self.updates[int(round_index)] = up
        return up


def _decrypted(proto: PrivateWeightedSum, stage: str, field: str, count: int) -> list[int]:
    """The plaintexts the server decrypts at ``stage`` (Y per coordinate), centred -- what an
    honest-but-curious server reads before decoding."""
    pk, sk = proto._pk, proto._PrivateWeightedSum__sk  # type: ignore[attr-defined]
    replies = [r for s, _, r in proto.view if s == stage]
    product = [1] * count
    for r in replies:
        cts = pk.ciphertexts_from_bytes(r[field], count)
        product = [a * b % pk.n2 for a, b in zip(product, cts, strict=True)]
    out = []
    for c in product:
        y = int(sk.decrypt(c))
        out.append(y - int(pk.n) if y > int(pk.n) // 2 else y)
    return out


def _residue_attack(histograms: np.ndarray, d: int = 40) -> tuple[int, int, int]:
    """One round; returns (#coordinates with Y mod (DIV/2) ≠ 0, #coordinates, DIV)."""
    clients = {s: NoisyClient(s, h, d) for s, h in enumerate(histograms)}
    proto = PrivateWeightedSum(**WEAK, record_view=True)
    proto.collect(
        InProcessTransport(clients),
        list(clients),
        [np.zeros(d, np.float32)],
        0,
        {},
        UserServer(histograms.shape[1]),
    )
    div = proto.params.divisor
    ys = _decrypted(proto, "round", "ciphertexts", d)
    return sum(1 for y in ys if y % (div // 2) != 0), d, div


#: Two neighbouring datasets: user 0 has N_0 = 3 (2 + 1 records) or N_0 = 2 (1 + 1).
WITH_USER = np.array([[2, 1, 0], [1, 0, 1]])
WITHOUT = np.array([[1, 1, 0], [1, 0, 1]])


def test_the_residue_attack_broke_the_papers_noise_grid_and_finds_nothing_now(
    monkeypatch,
) -> None:
    """Issue #22 item 3: with noise DIV·round(z/P) the server's Y mod DIV is noise-free. Weights
    (DIV/N_u)·n: with N_0 = 2 every term is a multiple of DIV/2, with N_0 = 3 most are not, so
    counting coordinates with Y mod (DIV/2) ≠ 0 tells the datasets apart (ε = ∞). With the
    dither on the unit grid the residue is uniform for both."""
    import pdpfl.fl.aggregation.private_weighting_silo as silo_side

    with monkeypatch.context() as m:  # the published encoding
        m.setattr(silo_side, "noise_plaintext", lambda div, z, u=None: int(div) * int(z))
        hit, d, _ = _residue_attack(WITH_USER)
        miss, _, _ = _residue_attack(WITHOUT)
    assert hit >= 15 and miss == 0  # distinguishes the datasets every time
    hit, d, _ = _residue_attack(WITH_USER)
    miss, _, _ = _residue_attack(WITHOUT)
    assert hit == miss == d  # uniform residues (a zero residue has probability 2/DIV)


def test_the_verification_value_hides_the_lcm_of_the_totals(monkeypatch) -> None:
    """The verification value DIV·Σ w·t + Σ ω: with ω a multiple of DIV (the paper) its residue
    modulo DIV is DIV·Σ w·t mod DIV, a multiple of DIV/lcm(N_u); now ω is on the unit grid."""
    import pdpfl.fl.aggregation.private_weighting_silo as silo_side

    def residues() -> list[int]:
        clients = {s: NoisyClient(s, h, 4) for s, h in enumerate(WITHOUT)}
        proto = PrivateWeightedSum(**WEAK, record_view=True)
        proto.collect(
            InProcessTransport(clients), [0, 1], [np.zeros(4, np.float32)], 0, {}, UserServer(3)
        )
        div = proto.params.divisor
        return [y % (div // 2) for y in _decrypted(proto, "install", "check", 8)]

    with monkeypatch.context() as m:
        m.setattr(silo_side, "check_mask", lambda div: int(div) * secrets_randbits(76))
        assert residues() == [0] * 8  # lcm(N_u) = 2 is visible
    assert all(r != 0 for r in residues())


def secrets_randbits(bits: int) -> int:
    import secrets

    return secrets.randbits(bits)


@settings(max_examples=200)
@given(
    n_max=st.integers(1, 40),
    key_bits=st.sampled_from([512, 768, 1024]),
    silos=st.integers(1, 6),
    data=st.data(),
)
def test_the_no_wrap_room_bounds_every_decrypted_coordinate(n_max, key_bits, silos, data):
    """Each silo keeps Σ_u |v| + |z| + 1 < R = 2^(vb-1)/|S| ⇒ |Y| ≤ no_wrap_bound < n/2^65 for
    any modulus n of ``key_bits`` bits, whatever the weights (≤ 1) and dithers (|u| ≤ DIV/2)."""
    params = WeightingParams(paillier_bits=1024, n_max=n_max, allow_weak_keys=True)
    vb = params.value_bits(key_bits)
    if vb < 8:
        return
    room = params.silo_room(key_bits, silos)
    div = params.divisor
    values, noise = [], []
    for _ in range(silos):
        users = data.draw(st.integers(0, 3))
        budget = int(room) - 2  # the largest integers a silo accepts (strictly below R)
        parts = data.draw(st.lists(st.integers(0, budget), min_size=users + 1, max_size=users + 1))
        total = sum(parts)
        if total > budget:
            parts = [p * budget // total for p in parts]
        values.append([p * data.draw(st.sampled_from([-1, 1])) for p in parts[:-1]])
        noise.append(parts[-1] * data.draw(st.sampled_from([-1, 1])))
        assert sum(abs(v) for v in values[-1]) + abs(noise[-1]) + 1 < room
    bound = no_wrap_bound(div, values, noise)
    smallest_n = 1 << (key_bits - 1)
    assert bound < smallest_n >> 65
    # the worst realisation (every weight 1, every dither -DIV/2) stays within the bound
    worst = sum(
        div * (sum(abs(v) for v in vs) + abs(z)) + div // 2
        for vs, z in zip(values, noise, strict=True)
    )
    assert worst <= bound


def test_values_at_the_edge_of_the_room_decode_exactly() -> None:
    """End to end at a 1024-bit key: noise at the edge of each silo's room decodes exactly."""

    class Edge(NoisyClient):
        def user_updates(self, params, round_index, config) -> UserUpdates:
            self.configs = [*getattr(self, "configs", []), dict(config)]
            users = np.flatnonzero(self.histogram > 0)
            room = self.room - 2 - users.size * 1e9
            up = UserUpdates(
                users, np.full((users.size, 2), 1e9 * 1e-10), np.array([room, -room]) * 1e-10
            )
            self.updates[int(round_index)] = up
            return up

    params = WeightingParams(paillier_bits=1024, n_max=60, allow_weak_keys=True)
    clients = {s: Edge(s, h, 2) for s, h in enumerate(WITH_USER)}
    for c in clients.values():
        c.room = params.silo_room(1024, 2) / 1e6  # floats: stay well inside, still ~2^800
    agg = PrivateWeightedSum(**WEAK).collect(
        InProcessTransport(clients), [0, 1], [np.zeros(2, np.float32)], 0, {}, UserServer(3)
    )
    ref = plain_weighted_sum(
        {s: c.histogram for s, c in clients.items()}, {s: c.updates[0] for s, c in clients.items()}
    )
    np.testing.assert_allclose(agg.total[0], ref, rtol=1e-12)
    assert all(c.configs[-1][SURVIVORS_KEY] == 2 for c in clients.values())


def test_dithers_cover_the_unit_grid_from_the_silos_own_randomness() -> None:
    from pdpfl.fl.aggregation.private_weighting import dithers
    from pdpfl.randomness import make_randomness

    div = divisor(12)  # 27720
    seeded = [
        dithers(div, 3000, make_randomness("reproducible", 3).stream("d", 0)) for _ in range(2)
    ]
    assert seeded[0] == seeded[1]  # reproducible mode replays them
    for values in (
        seeded[0],
        dithers(div, 3000, make_randomness("secure").stream("d", 0)),
        dithers(div, 3000),
    ):
        assert all(-div // 2 <= u < div - div // 2 for u in values)
        for m in (2, 3, 5, 7, 11):  # residues modulo every divisor of DIV: uniform
            counts = np.bincount([u % m for u in values], minlength=m)
            assert counts.min() > 3000 / m * 0.8
