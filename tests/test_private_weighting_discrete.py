"""Private weighting with exact discrete noise (issue #33 item 5).

Each silo adds Z_s ~ N_Z(0, σ_s²) on the grid P' = 2^m·P and a dither uniform on
[-2^m·DIV/2, 2^m·DIV/2) (:mod:`pdpfl.fl.aggregation.private_weighting_core`, *Exact discrete
noise*); the ledger charges the distributed discrete Gaussian with N = (C/P' + 1.5√d)².
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.discrete_noise import discrete_gaussian_pmf, discrete_gaussian_spec
from pdpfl.dp.noise import add_noise
from pdpfl.fl.aggregation.private_weighting import PrivateWeightedSum, UserUpdates
from pdpfl.fl.aggregation.private_weighting_core import (
    discrete_sensitivity_sq,
    grid_bits,
    no_wrap_bound,
    plain_weighted_sum,
)
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian
from pdpfl.privacy.noise import DiscreteGaussianNoise
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.randomness import make_randomness
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

WEAK = {"paillier_bits": 1024, "n_max": 6, "allow_weak_keys": True, "workers": 1}


def test_the_grid_is_the_finest_power_of_two_with_c_over_p_at_most_2_20() -> None:
    for clip, p in [(1.0, 1e-10), (3.0, 1e-6), (1.0, 2.0**-20), (0.5, 0.25)]:
        m = grid_bits(clip, p)
        assert clip / (p * 2.0**m) <= 2.0**20
        assert m == 0 or clip / (p * 2.0 ** (m - 1)) > 2.0**20
    assert grid_bits(1.0, 1e-10) == 14  # 10^10 / 2^14 ≈ 6.1·10^5 ≤ 2^20 < 10^10 / 2^13
    n_sq = discrete_sensitivity_sq(1.0, 1e-10, 400)
    exact = (Fraction(10**10) / 2**14 + Fraction(3, 2) * 20) ** 2
    assert exact <= Fraction(n_sq) <= exact * (1 + Fraction(1, 10**12))
    # the dither of a silo on the grid m counts 2^m/2 units of P in the no-wrap bound
    assert no_wrap_bound(6, [[3, -4]], [5 << 3], grid=3) == 6 * (3 + 4 + 40) + 6 * 4


def _decrypted(proto: PrivateWeightedSum, d: int) -> list[int]:
    """The centred plaintexts Y the server decrypts in the round (an honest-but-curious read)."""
    pk, sk = proto._pk, proto._PrivateWeightedSum__sk  # type: ignore[attr-defined]
    product = [1] * d
    for stage, _, reply in proto.view:
        if stage == "round":
            cts = pk.ciphertexts_from_bytes(reply["ciphertexts"], d)
            product = [a * b % pk.n2 for a, b in zip(product, cts, strict=True)]
    ys = [int(sk.decrypt(c)) for c in product]
    return [y - int(pk.n) if y > int(pk.n) // 2 else y for y in ys]


class _GridClient:
    """A silo whose users' deltas are zero and whose noise is the exact discrete share."""

    def __init__(self, cid: int, histogram: np.ndarray, d: int, variance: Fraction, m: int):
        self.client_id = cid
        self.histogram = np.asarray(histogram, dtype=np.int64)
        self.d, self.m = d, m
        self.noise = DiscreteGaussianNoise(variance, 1.0, 2)
        self.randomness = make_randomness("reproducible", 11)

    def user_histogram(self) -> np.ndarray:
        return self.histogram.copy()

    def user_updates(self, params, round_index, config) -> UserUpdates:
        users = np.flatnonzero(self.histogram > 0)
        z = np.zeros(self.d, dtype=np.int64)
        add_noise(z, self.noise, self.randomness.stream("share", round_index, self.client_id))
        return UserUpdates(users, np.zeros((users.size, self.d)), np.zeros(self.d), z, self.m)

    def evaluate(self, *args):
        return {"loss": 0.0, "accuracy": 0.0, "n": 0}


class _Server:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False
    num_users = 3

    def sampled_users(self, round_index: int) -> np.ndarray | None:
        return None


def _law(variance: Fraction, m_div: int, silos: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact pmf of R = ⌊(Y + M/2)/M⌋ for a zero signal: Σ_s Z_s (each N_Z(0, σ²_used)) plus
    ⌊(Σ_s u_s + M/2)/M⌋, u_s uniform on the integers of [-M/2, M/2) (exact enumeration)."""
    spec = discrete_gaussian_spec(variance)
    half = 12 * math.isqrt(int(variance) + 1) + 12
    support = np.arange(-half, half + 1)
    pz = discrete_gaussian_pmf(support, spec)
    pz /= pz.sum()
    total = np.array([1.0])
    for _ in range(silos):
        total = np.convolve(total, pz)
    u = np.full(m_div, 1.0 / m_div)  # one dither, offset -M/2
    du = np.array([1.0])
    for _ in range(silos):
        du = np.convolve(du, u)  # Σu + silos·M/2 ∈ [0, silos·M)
    shift = np.arange(du.size) - silos * (m_div // 2) + m_div // 2  # Σu + M/2
    carry = np.bincount(shift // m_div - (shift // m_div).min(), weights=du)
    law = np.convolve(total, carry)
    lo = -silos * half + int((shift // m_div).min())
    return np.arange(lo, lo + law.size), law


@pytest.mark.slow
def test_the_released_sum_has_the_exact_discrete_law_through_the_protocol() -> None:
    """Zero signal, 2 silos, 600 coordinates: the server's plaintext Y = Σ u_s + M·Σ Z_s
    (M = 2^m·DIV) read as R = ⌊(Y + M/2)/M⌋ follows the exact law (chi-square)."""
    from scipy.stats import chisquare

    d, m, variance = 600, 3, Fraction(5, 2)
    hists = np.array([[1, 2, 0], [0, 1, 1]])
    clients = {s: _GridClient(s, h, d, variance, m) for s, h in enumerate(hists)}
    proto = PrivateWeightedSum(**WEAK, precision=1e-6, record_view=True)
    agg = proto.collect(
        InProcessTransport(clients), [0, 1], [np.zeros(d, np.float32)], 0, {}, _Server()
    )
    div = proto.params.divisor
    mod = div << m
    ys = np.array(_decrypted(proto, d), dtype=np.int64)
    np.testing.assert_allclose(np.asarray(agg.total[0], np.float64), 1e-6 * ys / div, atol=1e-12)
    r = (ys + mod // 2) // mod
    values, law = _law(variance, mod, 2)
    edges = [-4, -3, -2, -1, 0, 1, 2, 3, 4]  # bins: ≤ -4, -3, ..., 3, ≥ 4
    observed = [np.sum(r <= edges[0])] + [np.sum(r == e) for e in edges[1:-1]]
    observed.append(np.sum(r >= edges[-1]))
    expected = [law[values <= edges[0]].sum()] + [law[values == e].sum() for e in edges[1:-1]]
    expected.append(law[values >= edges[-1]].sum())
    expected_counts = d * np.asarray(expected) / np.sum(expected)
    assert min(expected_counts) > 5
    assert chisquare(observed, expected_counts).pvalue > 1e-3


BASE = {
    "name": "uldp-private-discrete",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 12}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg", "weights": "private"},
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5},
    "secure": {"precision": 1e-8},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8, "max_grad_norm": 1.0},
}


def _build(*overrides: str, privacy: dict | None = None):
    config = config_from_dict({**BASE, "privacy": privacy or BASE["privacy"]}, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        federation = load_federation_for(config)
        server, clients = build_federation_algorithms(config, federation)
    return config, server, clients


def _size(server) -> int:
    return int(sum(np.asarray(p).size for p in server.initial_params()))


def test_the_ledger_charges_the_distributed_discrete_plan() -> None:
    _, server, clients = _build()
    d = _size(server)
    plan = server.plan
    assert isinstance(plan, DiscreteUserLevelPlan)
    rel = plan.released
    # independently: m = ⌈log2(C/P) − 20⌉ = ⌈log2(10^8) − 20⌉ = 7; N = (C/P' + 1.5√d)²
    m = max(0, math.ceil(math.log2(1.0 / 1e-8) - 20))
    assert m == 7
    n_sq = (1e8 / 2**m + 1.5 * math.sqrt(d)) ** 2
    assert rel.l2_sensitivity_sq == pytest.approx(n_sq, rel=1e-12)
    assert rel.l2_sensitivity_sq >= n_sq * (1 - 1e-15)
    assert (rel.shares, rel.dimension) == (2, d)  # t(3) = 2 survivors, one share each
    assert rel.share_variance <= 4.0 * rel.l2_sensitivity_sq / 2
    assert rel.share_variance == pytest.approx(4.0 * n_sq / 2, rel=1e-12)
    assert plan.server_view == rel  # the server decrypts only the sum
    for silo in clients.values():
        noise, grid = silo.weighting_noise
        assert grid == m and noise.shares == 2 and noise.noise_multiplier == 2.0
        assert noise.variance == Fraction(2.0) ** 2 * Fraction(rel.l2_sensitivity_sq) / 2
    # the planned ε is the distributed discrete Gaussian's (t = 2, N, d), over T = 2 rounds,
    # for both observers
    from pdpfl.privacy import mechanism_epsilon

    own = SampledDiscreteGaussianPlan("user", 4.0 * n_sq / 2, 2, n_sq, d, 1e-5, 2)
    assert own.base_event() == DistributedDiscreteGaussian(4.0 * n_sq / 2, 2, n_sq, d)
    from pdpfl.privacy.uldp import ORDERS

    want = float(mechanism_epsilon(own, np.array([1.0]), "third-party", orders=ORDERS)[0][0])
    for observer in ("third-party", "server"):
        got = plan.planned_epsilon(np.array([1.0]), observer)
        assert got[0] == pytest.approx(want, rel=1e-6)
    # continuous stays available behind the same switch as the other shares
    _, cont, cclients = _build("privacy.noise_shares=continuous")
    assert not isinstance(cont.plan, DiscreteUserLevelPlan)
    assert all(c.weighting_noise is None for c in cclients.values())


@pytest.mark.slow
def test_epsilon_max_calibrates_sigma_against_the_discrete_plan() -> None:
    from pdpfl.privacy import mechanism_epsilon

    _, server, _ = _build(privacy={"epsilon_max": 4.0, "delta": 1e-5})
    rel = server.plan.released
    eps = lambda p: float(mechanism_epsilon(p, np.array([1.0]), "third-party")[0][0])  # noqa: E731
    assert eps(rel) <= 4.0
    assert eps(rel.with_noise(rel.noise_multiplier * (1 - 1e-3))) > 4.0


@pytest.mark.slow
def test_a_protocol_round_releases_the_weighted_sum_plus_the_grid_noise() -> None:
    """Same seeds: the decrypted sum equals Σ w·Δ (computed in the clear) + P'·Σ_s Z_s, within
    the rounding (P/2 per user and silo) and each silo's widened dither (2^m·P/2)."""
    _, server, clients = _build()
    _, _, twins = _build()
    params = server.initial_params()
    cfg = server.round_config(0)
    ids = sorted(clients)
    weak = dict(WEAK, n_max=600)
    agg = PrivateWeightedSum(**weak, precision=1e-8).collect(
        InProcessTransport(clients), ids, params, 0, dict(cfg), server
    )
    ups = {s: twins[s].user_updates(params, 0, dict(cfg)) for s in ids}
    hists = {s: twins[s].user_histogram() for s in ids}
    grid = 1e-8 * 2.0**7
    share_std = math.sqrt(4.0 * server.plan.released.l2_sensitivity_sq / 2)  # σ·√(N/t)
    for up in ups.values():
        assert up.grid == 7 and up.grid_noise is not None and up.grid_noise.dtype == np.int64
        assert np.std(up.grid_noise) == pytest.approx(share_std, rel=0.15)
    noise = sum(up.grid_noise.astype(np.float64) for up in ups.values()) * grid
    ref = plain_weighted_sum(hists, ups) + noise
    got = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in agg.total])
    bound = 1e-8 / 2 * (12 + 3) + 3 * grid / 2 + 1e-12 * np.abs(ref).sum()
    assert np.abs(got - ref).max() <= bound


class _SignalClient(_GridClient):
    """User 0 (only in silo 0, weight 1) moves every coordinate by ``shift``·P."""

    shift = 0

    def user_updates(self, params, round_index, config) -> UserUpdates:
        up = super().user_updates(params, round_index, config)
        if self.client_id == 0:
            up.deltas[list(up.users).index(0)] = self.shift * 1e-6
        return up


def _near_zero_residues(shift: int, d: int = 40, m: int = 3) -> int:
    """#coordinates whose Y mod 2^m·DIV (centred) lies within 2·DIV of 0."""
    hists = np.array([[1, 2, 0], [0, 1, 1]])
    clients = {s: _SignalClient(s, h, d, Fraction(5, 2), m) for s, h in enumerate(hists)}
    for c in clients.values():
        c.shift = shift
        c.randomness = make_randomness("secure")
    proto = PrivateWeightedSum(**WEAK, precision=1e-6, record_view=True)
    proto.collect(InProcessTransport(clients), [0, 1], [np.zeros(d, np.float32)], 0, {}, _Server())
    div = proto.params.divisor
    mod = div << m
    ys = np.array(_decrypted(proto, d), dtype=np.int64)
    centred = (ys + mod // 2) % mod - mod // 2
    return int(np.sum(np.abs(centred) < 2 * div))


def test_the_dither_is_widened_to_the_noise_grid(monkeypatch) -> None:
    """With noise DIV·2^m·Z and a dither on [-DIV/2, DIV/2) only, Y mod 2^m·DIV is W mod 2^m·DIV
    up to ±DIV: a user who moves W by 4·DIV is seen on every coordinate (ε = ∞). With the dither
    on [-2^m·DIV/2, 2^m·DIV/2) the residue is uniform for both datasets."""
    import pdpfl.fl.aggregation.private_weighting_silo as silo_side

    real = silo_side.dithers
    with monkeypatch.context() as mp:  # the grid's noise with the unit-grid dither
        mp.setattr(silo_side, "dithers", lambda div, count, stream: real(div >> 3, count, stream))
        assert _near_zero_residues(0) == 40 and _near_zero_residues(4) == 0
    for shift in (0, 4):  # P[|centred| < 2·DIV] = 1/2 for a uniform residue
        assert 8 <= _near_zero_residues(shift) <= 32
