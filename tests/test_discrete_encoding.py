"""The integer encoding of distributed discrete noise (issue #33 item 3, Kairouz et al. 2021).

* parameters from public values: a power-of-two scale, an integer sensitivity N < 2^62, the
  share variance rounded up, a wrap bound within ``max_wrap``; refusals name the field;
* the rotation is L2-preserving and inverted exactly; the rounding bound ‖x̃‖₂² ≤ N holds for
  every input, adversarial and unclipped ones included (checked in exact integers), also for a
  unit rounded in several parts (ULDP-FL);
* the released sum at exactly t survivors is Σ x̃_i + (sum of t shares): chi-square of its noise
  part against the exact convolution pmf; wrapping stays within the stated bound.
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pdpfl.discrete_noise import discrete_gaussian_pmf, discrete_gaussian_spec
from pdpfl.dp.discrete_encoding import (
    add_noise_share,
    conditional_round,
    conditional_round_rows,
    decode_sum,
    encode_share,
    hadamard_rotate,
    hadamard_unrotate,
    norm_sq_at_most,
    round_units,
    scale_and_round,
)
from pdpfl.dp.discrete_params import DiscreteShareParams, discrete_share_params
from pdpfl.privacy import mechanism_epsilon
from pdpfl.randomness import SeededRandomness


def _stream(*indices: int):
    return SeededRandomness(33).stream("encoding-test", *indices)


def _params(**kw) -> DiscreteShareParams:
    args = dict(clip=1.0, noise_multiplier=1.0, silos=5, survivors=3, dimension=1000, bits=20)
    args.update(kw)
    return discrete_share_params(**args)  # type: ignore[arg-type]


def _exact_norm_sq(x: np.ndarray) -> int:
    return sum(int(v) * int(v) for v in x.tolist())


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("rotation", [True, False])
@pytest.mark.parametrize("bits", [16, 32, 48])
def test_parameters_from_public_values(rotation, bits):
    p = _params(bits=bits, rotation=rotation, dimension=3000)
    assert p.padded_dimension == (4096 if rotation else 3000)
    assert p.scale == 2.0**p.scale_log2 and p.unit_bound == p.scale * p.clip
    assert isinstance(p.l2_sensitivity_sq, int) and p.unit_bound**2 < p.l2_sensitivity_sq < 2**62
    assert p.share.variance >= p.required_share_variance()
    assert p.required_share_variance() == Fraction(1.0) ** 2 * p.l2_sensitivity_sq / 3
    assert 0 <= p.inflation <= 0.05 and p.wrap_probability <= 1e-6
    assert p.container == ("uint32" if bits <= 32 else "uint64")
    summary = json.loads(json.dumps(p.summary()))
    assert summary["bits"] == bits and summary["l2_sensitivity_sq"] == p.l2_sensitivity_sq
    # the scale is the largest: one step up breaks the wrap bound, N's range or the sampler's
    # fast path
    from pdpfl.dp import discrete_params as dpar

    up = 2.0 ** (p.scale_log2 + 1)
    n_up = dpar._accounted_sq(up * p.clip, p.padded_dimension, p.beta, 1)
    var_up = n_up / 3  # σ = 1, t = 3
    wrap_up = dpar._wrap_bound(bits, n_up, up, 1.0, p.padded_dimension, 5, 5, 1, rotation, var_up)
    assert n_up >= 2**62 or var_up > dpar._MAX_SHARE_VARIANCE or wrap_up > 1e-6
    plan = p.plan("client", 1e-5, 10)
    assert plan.share_variance <= float(p.share.variance)
    assert plan.l2_sensitivity_sq == p.l2_sensitivity_sq and plan.shares == 3
    assert plan.dimension == p.padded_dimension
    eps, _ = mechanism_epsilon(plan, [1.0], "server")
    assert np.isfinite(eps[0]) and eps[0] > 0


def test_several_parts_add_the_zero_vector_inflation():
    one = _params(dimension=10_000, bits=32)
    five = _params(dimension=10_000, bits=32, parts=5)
    assert five.scale == one.scale
    extra = math.sqrt(five.l2_sensitivity_sq) - math.sqrt(one.l2_sensitivity_sq)
    dim, b = five.padded_dimension, math.sqrt(2 * math.log(1 / five.beta))
    zero = math.sqrt(dim / 4 + b * math.sqrt(dim) / 2)  # Δ̃(0): a zero vector's inflation
    assert 4 * zero <= extra <= 4 * zero + 2


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(bits=1), "secure.bits: must be an integer >= 2 and <= 62"),
        (dict(bits=63), "secure.bits: must be an integer >= 2 and <= 62"),
        (dict(bits=True), "secure.bits"),
        (dict(bits=8, dimension=100_000), r"secure.bits: .*allowed: \d+ <= bits <= 62"),
        (dict(survivors=6), "survivors: must be an integer >= 1 and <= 5"),
        (dict(clip=0.0), "clip: must be a finite number > 0"),
        (dict(noise_multiplier=float("nan")), "noise_multiplier"),
        (dict(beta=1.0), "secure.beta"),
        (dict(max_wrap=0.0), "secure.max_wrap"),
        (dict(max_inflation=-0.1), "secure.max_inflation"),
        (dict(parts=0), "parts"),
    ],
)
def test_parameters_that_cannot_work_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _params(**kwargs)


def test_too_much_inflation_is_refused_with_the_bits_that_work():
    with pytest.raises(ValueError, match=r"inflates the sensitivity by .* allowed: \d+ <= bits"):
        _params(dimension=10_000, bits=14, max_inflation=0.001)


# ----------------------------------------------------------------------------- rotation


@settings(max_examples=25, deadline=None)
@given(
    d=st.integers(1, 300),
    seed=st.integers(-(2**63), 2**63 - 1),
    data=st.data(),
)
def test_rotation_preserves_the_norm_and_inverts(d, seed, data):
    x = np.asarray(
        data.draw(st.lists(st.floats(-1e3, 1e3), min_size=d, max_size=d)), dtype=np.float64
    )
    dim = 1 << (d - 1).bit_length()
    y = hadamard_rotate(x, seed, dim)
    assert y.shape == (dim,)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(hadamard_unrotate(y, seed, d), x, rtol=0, atol=1e-9)


def test_rotation_depends_only_on_the_seed():
    x = np.arange(1.0, 11.0)
    a, b = hadamard_rotate(x, 7, 16), hadamard_rotate(x, 7, 16)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, hadamard_rotate(x, 8, 16))
    # a spike is spread evenly: every rotated coordinate has magnitude 1/√d'
    spike = np.zeros(64)
    spike[5] = 1.0
    np.testing.assert_allclose(np.abs(hadamard_rotate(spike, 3, 64)), 1 / 8, rtol=1e-12)
    with pytest.raises(ValueError, match="power of two"):
        hadamard_rotate(x, 1, 12)


# ----------------------------------------------------------------------------- rounding


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.integers(-(2**31) + 1, 2**31 - 1), min_size=0, max_size=40),
    delta=st.integers(-2, 2),
)
def test_exact_norm_check(values, delta):
    x = np.asarray(values, dtype=np.int64)
    exact = _exact_norm_sq(x)
    bound = max(0, min(exact + delta, 2**62 - 1))
    assert norm_sq_at_most(x, bound) == (exact <= bound)


_adversarial = st.one_of(
    st.lists(st.floats(-1e9, 1e9), min_size=64, max_size=64),  # unclipped, huge
    st.lists(st.sampled_from([0.5, -0.5, 1.5, 2.5, -0.49999999]), min_size=64, max_size=64),
    st.lists(st.floats(-0.2, 0.2), min_size=64, max_size=64),
)


@settings(max_examples=40, deadline=None)
@given(values=_adversarial, rotation=st.booleans(), weight=st.floats(0.0, 1.0))
def test_rounding_bound_holds_for_every_input(values, rotation, weight):
    """Whatever the input (clipped or not, on rounding ties), the released integer vector
    satisfies ‖x̃‖₂² ≤ N_p exactly."""
    p = _params(dimension=64, bits=24, rotation=rotation, parts=3)
    bound = p.part_bound_sq(weight)
    x = scale_and_round(np.asarray(values), p, _stream(1), 99, bound_sq=bound)
    assert x.dtype == np.int64 and _exact_norm_sq(x) <= bound


def test_rounding_refuses_non_finite_input():
    p = _params(dimension=4, bits=16, rotation=False)
    with pytest.raises(ValueError, match="NaN or infinity"):
        scale_and_round(np.array([0.0, np.nan, 0.0, 0.0]), p, _stream(2), None)
    with pytest.raises(ValueError, match="rotation_seed"):
        scale_and_round(np.zeros(4), dataclasses.replace(p, rotation=True), _stream(2), None)


class _NoWords:
    def words(self, n: int) -> np.ndarray:
        raise AssertionError("an integer row must not draw rounding words")


@pytest.mark.parametrize("rotation", [True, False])
def test_integer_rows_round_without_drawing(rotation):
    """A silo's zeros (not sampled) and any row already on the integer grid: the rounding is
    deterministic, so nothing is drawn and the rotation of zeros is skipped (zeros out); a row
    with a fraction still draws, and an integer row above the bound still goes through the
    redraws and the fallback."""
    p = _params(dimension=64, bits=24, rotation=rotation)
    x = scale_and_round(np.zeros(64), p, _NoWords(), 99)  # type: ignore[arg-type]
    assert x.shape == (p.padded_dimension,) and not x.any() and x.dtype == np.int64
    rows = np.zeros((3, p.padded_dimension))
    rows[1, 0] = 5.0
    rows[2, 0] = 2.0**40  # an integer row far above the bound
    bounds = [p.l2_sensitivity_sq] * 3
    out = conditional_round_rows(rows, bounds, _stream(9))
    assert out[1, 0] == 5 and not out[0].any() and _exact_norm_sq(out[2]) <= bounds[2]
    with pytest.raises(AssertionError, match="must not draw"):
        conditional_round_rows(rows + 0.5, bounds, _NoWords())  # type: ignore[arg-type]


def test_clipped_input_rounds_within_one_unit_per_coordinate():
    """A clipped vector passes the check with its randomized rounding: each coordinate moves
    by less than one integer unit and rounds up with probability ≈ its fractional part."""
    p = _params(dimension=2000, bits=24, rotation=False)
    rng = np.random.default_rng(0)
    v = rng.normal(size=2000)
    v /= np.linalg.norm(v)
    scaled = v * p.scale
    ups = np.zeros(2000)
    for i in range(30):
        x = conditional_round(scaled, p.l2_sensitivity_sq, _stream(3, i))
        assert np.all(np.abs(x - scaled) < 1.0)
        ups += x > np.floor(scaled)
    frac = scaled - np.floor(scaled)
    assert abs(float(np.mean(ups / 30 - frac))) < 0.01


# ----------------------------------------------------------------------------- several parts


@settings(max_examples=25, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
)
def test_a_unit_rounded_in_several_parts_stays_within_n(weights, seed):
    """ULDP-FL: one user's weighted clipped vectors at up to P silos, each rounded at its own
    bound; the user's total integer contribution has ‖·‖₂² ≤ N (weights summing to ≤ 1)."""
    w = np.asarray(weights)
    w = w / max(1.0, float(w.sum()))
    p = _params(dimension=100, bits=24, parts=4)
    rng = np.random.default_rng(seed)
    total = np.zeros(p.padded_dimension, dtype=np.int64)
    for i, wi in enumerate(w):
        v = rng.normal(size=100)
        v /= np.linalg.norm(v)  # ‖Clip(Δ)‖ = C: the worst case
        total += round_units(v[None, :], np.array([wi]), p, _stream(4, seed % 97, i), 5)
    assert _exact_norm_sq(total) <= p.l2_sensitivity_sq


# ----------------------------------------------------------------------------- the released sum


def test_round_trip_without_noise_is_within_the_rounding_bound():
    rng = np.random.default_rng(1)
    for rotation in (False, True):
        p = _params(dimension=500, bits=32, rotation=rotation)
        xs = [v / np.linalg.norm(v) for v in rng.normal(size=(3, 500))]
        total = np.zeros(p.padded_dimension, dtype=np.uint64)
        for i, x in enumerate(xs):
            r = scale_and_round(x, p, _stream(5, i), 11)
            total += r.view(np.uint64) & np.uint64(p.modulus - 1)
        out = decode_sum(total.astype(np.uint32), p, 11)
        err = out - np.sum(xs, axis=0)
        # three roundings, each < 1 unit per coordinate: ‖err‖₂ < 3·√d'/γ
        assert np.linalg.norm(err) < 3 * math.sqrt(p.padded_dimension) / p.scale
        if not rotation:
            assert np.max(np.abs(err)) < 3 / p.scale


def _small_params(bits: int, variance: Fraction, d: int = 4000) -> DiscreteShareParams:
    """A hand-made encoding with a small share variance (integer units), no rotation."""
    return DiscreteShareParams(
        clip=1e4,
        noise_multiplier=1.0,
        silos=4,
        survivors=3,
        dimension=d,
        bits=bits,
        rotation=False,
        contributors=4,
        parts=1,
        beta=math.exp(-0.5),
        padded_dimension=d,
        scale_log2=0,
        l2_sensitivity_sq=10**9,
        share=discrete_gaussian_spec(variance),
        wrap_probability=1.0,
    )


def test_released_sum_at_t_survivors_has_the_accounted_law():
    """Exactly t = 3 survivors: the lifted sum minus Σ x̃_i is a sum of 3 i.i.d.
    N_Z(0, σ_s²) per coordinate -- chi-square against the exact convolution pmf."""
    p = _small_params(bits=20, variance=Fraction(5, 2))
    rng = np.random.default_rng(2)
    data = [rng.integers(-3, 4, size=p.dimension).astype(np.float64) for _ in range(3)]
    total = np.zeros(p.dimension, dtype=np.uint64)
    for i, x in enumerate(data):  # integer data: the rounding is exact, x̃ = x
        total += encode_share(x, p, _stream(6, i), None).astype(np.uint64)
    released = decode_sum(total.astype(np.uint32), p, None)
    noise = np.rint(released - np.sum(data, axis=0)).astype(np.int64)
    one = discrete_gaussian_pmf(np.arange(-40, 41), p.share)
    law = np.convolve(np.convolve(one, one), one)  # support −120..120
    support = np.arange(-120, 121)
    edges = np.arange(-8, 10)
    obs = np.array([np.sum(noise < -8)] + [np.sum(noise == v) for v in edges[:-1]] + [0])
    obs[-1] = noise.size - obs[:-1].sum()
    exp = np.array(
        [law[support < -8].sum()]
        + [law[support == v].sum() for v in edges[:-1]]
        + [law[support >= 9].sum()]
    )
    keep = exp * noise.size >= 5
    o = np.append(obs[keep], obs[~keep].sum())
    e = np.append(exp[keep], exp[~keep].sum()) * noise.size
    o, e = (o[:-1], e[:-1]) if e[-1] < 5 else (o, e)
    assert stats.chisquare(o, e * o.sum() / e.sum()).pvalue > 1e-3
    assert noise.var() == pytest.approx(3 * float(p.share.variance) * 0.999, rel=0.1)


def test_wrapping_stays_within_the_stated_bound():
    """b = 7 with shares of variance 200: a sum of 3 survivors wraps on a visible fraction of
    coordinates, and that fraction is at most the derived per-coordinate bound."""
    p = _small_params(bits=7, variance=Fraction(200), d=20_000)
    from pdpfl.dp.discrete_params import _wrap_bound

    per_coordinate = _wrap_bound(7, 0, 1.0, 0.0, 1, 3, 3, 1, False, float(p.share.variance)) / 2
    total = np.zeros(p.dimension, dtype=np.uint64)
    for i in range(3):  # zero data: the sum is the noise, which wraps where |Z| ≥ 64
        total += encode_share(np.zeros(p.dimension), p, _stream(7, i), None).astype(np.uint64)
    released = decode_sum(total.astype(np.uint32), p, None)
    exact = np.zeros(p.dimension, dtype=np.int64)
    for i in range(3):
        s = _stream(7, i)
        scale_and_round(np.zeros(p.dimension), p, s, None)
        from pdpfl.discrete_noise import sample_discrete_gaussian

        exact += sample_discrete_gaussian(p.dimension, p.share, s)
    wrapped = np.rint(released).astype(np.int64) != exact
    assert np.array_equal(wrapped, (exact < -64) | (exact >= 64))  # the centred lift
    freq = float(wrapped.mean())
    assert 0.001 < freq <= per_coordinate


@pytest.mark.parametrize("bits,dtype", [(20, np.uint32), (32, np.uint32), (40, np.uint64)])
def test_shares_live_in_z_2b(bits, dtype):
    p = _params(dimension=300, bits=bits)
    share = encode_share(np.ones(300) / math.sqrt(300), p, _stream(8, bits), 4)
    assert share.dtype == dtype and share.shape == (p.padded_dimension,)
    assert int(share.max()) < 2**bits
    with pytest.raises(ValueError, match="int64 vector"):
        add_noise_share(np.zeros(3, dtype=np.int64), p, _stream(9))
    with pytest.raises(ValueError, match="uint32/uint64"):
        decode_sum(share.astype(np.int64), p, 4)
