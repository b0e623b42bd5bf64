"""User-level sensitivity, checked numerically: remove one user (all records, every silo).

ULDP-AVG/SGD (Theorem 5): the pre-noise aggregate Σ_s Σ_u w_{s,u} Clip(Δ_{s,u}) moves by at most
C. ULDP-NAIVE (Theorem 3, spec D29): by at most 2|S|C -- and more than the paper's |S|C on a
constructed federation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdpfl.data.federation import ClientData
from pdpfl.dp.steps import clip_vectors
from pdpfl.fl.uldp import AvgSilo, NaiveSilo, SgdSilo, UldpSetup, UserLevelSetup
from pdpfl.models import create_model, get_params
from pdpfl.randomness import SeededRandomness

C = 0.5


SILOS = {"avg": AvgSilo, "sgd": SgdSilo, "naive": NaiveSilo}


def _public(variant, S, U, weights="uniform", totals=None, epochs=2):
    common = dict(
        num_silos=S,
        num_users=U,
        noise_multiplier=1.0,
        noise_std=0.0,
        delta=1e-5,
        rounds=1,
        max_grad_norm=C,
        local_epochs=epochs,
        local_steps=1,
    )
    if variant == "naive":
        return UldpSetup(**common)
    return UserLevelSetup(**common, weights=weights, user_totals=totals)


def _federation(rng, S, U, d=5, classes=3):
    """Random silos; user 0 has records in every silo, other users in random silos."""
    silos = []
    for _ in range(S):
        n = int(rng.integers(6, 14))
        users = rng.integers(0, U, size=n)
        users[0] = 0  # the user present everywhere
        silos.append(
            (rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, classes, size=n), users)
        )
    return silos


def _silos(fed, variant, U, weights, drop=None, lr=2.0, model=None):
    S = len(fed)
    keep = [
        (x, y, u) if drop is None else (x[u != drop], y[u != drop], u[u != drop]) for x, y, u in fed
    ]
    hist = np.zeros((S, U), dtype=np.int64)
    for s, (_, _, u) in enumerate(keep):
        np.add.at(hist[s], u, 1)
    pub = _public(variant, S, U, weights, totals=hist.sum(0).tolist())
    out = []
    for s, (x, y, u) in enumerate(keep):
        data = ClientData(
            name=f"s{s}",
            x_train=x,
            y_train=y,
            x_test=x[:1],
            y_test=y[:1],
            record_ids=np.arange(len(y)) + 1000 * s,
            user_ids=u,
        )
        out.append(
            SILOS[variant](
                s, model, data, pub, randomness=SeededRandomness(11), batch_size=4, lr=lr
            )
        )
    return out


def _pre_noise(silos, params):
    total = None
    for silo in silos:
        pos = np.arange(len(silo.users))
        vec = silo.user_vectors(params, pos, 0)
        clipped, _ = clip_vectors(vec, C)
        part = silo.weighted_user_sum(clipped, silo.user_weights[pos])
        flat = torch.cat([p.flatten() for p in part])
        total = flat if total is None else total + flat
    return total


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["avg", "sgd"])
@pytest.mark.parametrize("weights", ["uniform", "enhanced"])
def test_removing_a_user_moves_the_aggregate_by_at_most_c(variant, weights) -> None:
    torch.manual_seed(0)
    model = create_model("logreg", (5,), 3)
    params = get_params(model)
    worst = 0.0
    for seed in range(2):
        rng = np.random.default_rng(seed)
        S, U = int(rng.integers(2, 5)), 5
        fed = _federation(rng, S, U)
        full = _pre_noise(_silos(fed, variant, U, weights, model=model), params)
        for user in range(U):
            without = _pre_noise(_silos(fed, variant, U, weights, drop=user, model=model), params)
            diff = float((full - without).norm())
            assert diff <= C * (1 + 1e-6), (seed, user, diff)
            worst = max(worst, diff)
    assert worst > 0.3 * C  # the bound is not vacuous: a user really moves the aggregate


def test_user_weights_sum_to_one_per_user_across_silos() -> None:
    torch.manual_seed(0)
    model = create_model("logreg", (5,), 3)
    fed = _federation(np.random.default_rng(4), 4, 6)
    for weights, expected in (("enhanced", 1.0), ("uniform", None)):
        silos = _silos(fed, "avg", 6, weights, model=model)
        total = np.zeros(6)
        for silo in silos:
            total[silo.users] += silo.user_weights
            assert len(silo.user_weights) == len(silo.users)  # absent users: no weight
        assert (total <= 1.0).all()
        if expected is not None:
            present = [u for u in range(6) if any(u in s.users for s in silos)]
            np.testing.assert_allclose(total[present], 1.0, atol=1e-12)
        else:
            assert total[0] == pytest.approx(1.0)  # user 0 is in all 4 silos: 4 × 1/4


def _naive_pre_noise(silos, params):
    total = None
    for silo in silos:
        delta = silo.local_delta(params, 0)
        clipped, _ = clip_vectors([d.unsqueeze(0) for d in delta], C)
        flat = torch.cat([c[0].flatten().double() for c in clipped])
        total = flat if total is None else total + flat
    return total


def test_naive_rigorous_bound_holds_and_the_papers_does_not() -> None:
    torch.manual_seed(0)
    model = create_model("logreg", (1,), 2)
    params = get_params(model)
    S, U = 3, 2
    # Every silo: user 0 has 1 record of class 0, user 1 has 7 of class 1, all with x = 1.
    # With user 1 the silo's delta raises the logit; without, it lowers it: both clipped to C.
    x = np.ones((8, 1), dtype=np.float32)
    y = np.array([0, 1, 1, 1, 1, 1, 1, 1])
    u = np.array([0, 1, 1, 1, 1, 1, 1, 1])
    fed = [(x, y, u) for _ in range(S)]
    full = _naive_pre_noise(_silos(fed, "naive", U, "uniform", lr=1.0, model=model), params)
    without = _naive_pre_noise(
        _silos(fed, "naive", U, "uniform", drop=1, lr=1.0, model=model), params
    )
    diff = float((full - without).norm())
    assert diff <= 2 * S * C * (1 + 1e-6)
    assert diff > 1.5 * S * C  # the published |S|·C sensitivity is exceeded (spec D29)
