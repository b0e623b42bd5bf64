"""``privacy.accountant``: an open registry, honoured or refused by every algorithm (issue #33
item 2, issue #40 item 2).

* the field is validated against :mod:`pdpfl.privacy.registry`: a newly registered accountant is
  choosable from a config, an approximate one (``gdp-clt``) or an unknown name is refused;
* every algorithm × accountant: accepted where the accountant interprets the events the
  algorithm charges, otherwise refused (exit 2, ``error: privacy.accountant: ...`` naming the
  accountants that can);
* the ledgers (and calibrations) of an accepted run use it;
* ``supports(event)`` of every built-in accountant is the ε computation's own traversal: for
  any event, ``supports`` is True exactly when the ε computation does not refuse it.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ConfigError
from pdpfl.privacy.accountant import RdpAccountant, mechanism_epsilon
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    GroupPrivacy,
    Mechanism,
    PoissonSampled,
    SampledWithoutReplacement,
    Sequence,
    TwoStageRound,
)
from pdpfl.privacy.pld import PldAccountant
from pdpfl.privacy.registry import (
    UnsupportedEventError,
    accountant_names,
    make_accountant,
    register_accountant,
    unregister_accountant,
)
from pdpfl.testing import TOY_CONFIG, _build, toy_config


class ToyAccountant:
    """A registered third-party accountant: RDP's numbers, but only for Poisson-sampled
    Gaussians, their compositions and two-stage rounds (no sequences, no sampling without
    replacement, no group privacy)."""

    name = "toy"
    approximate = False

    def __init__(self, **options: Any) -> None:
        self.rdp = RdpAccountant(**options)

    def supports(self, event: Mechanism) -> bool:
        if isinstance(event, Composed):
            return self.supports(event.inner)
        if isinstance(event, TwoStageRound):
            return self.supports(event.local)
        if isinstance(event, PoissonSampled):
            return isinstance(event.inner, GaussianMechanism)
        return isinstance(event, GaussianMechanism)

    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        return self.composed_epsilon(event, 1, delta)

    def composed_epsilon(
        self, event: Mechanism, counts: Any, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        if not self.supports(event):
            raise UnsupportedEventError(f"toy cannot interpret {event!r}")
        return self.rdp.composed_epsilon(event, counts, delta)


@pytest.fixture
def toy() -> Iterator[str]:
    register_accountant("toy", ToyAccountant)
    try:
        yield "toy"
    finally:
        unregister_accountant("toy")


def _config(algorithm: str, accountant: str, extra: tuple[str, ...] = ()) -> Any:
    return toy_config(algorithm, [f"privacy.accountant={accountant}", *extra])


#: algorithm (+ overrides) → the accountants it accepts (of rdp, pld, toy).
ACCEPTS: dict[tuple[str, tuple[str, ...]], set[str]] = {
    ("rpdp", ()): {"rdp", "pld", "toy"},  # two-stage rounds (Lemma 6)
    ("minimum", ()): {"rdp", "pld", "toy"},
    ("centralized", ()): {"rdp", "pld", "toy"},
    ("centralized-filter", ()): {"rdp"},  # a Rényi filter: no event
    ("idp-fedavg", ()): {"rdp", "pld", "toy"},  # a Poisson-sampled Gaussian per round
    # discrete noise shares (the default): the distributed discrete Gaussian, rdp only
    ("idp-fedavg", ("algorithm.variant=distributed", "aggregation=secure")): {"rdp"},
    (
        "idp-fedavg",
        ("algorithm.variant=distributed", "aggregation=secure", "privacy.noise_shares=continuous"),
    ): {"rdp", "pld", "toy"},
    ("uldp-naive", ()): {"rdp", "pld", "toy"},
    # discrete noise shares (the default): the distributed discrete Gaussian, rdp only
    ("uldp-avg", ()): {"rdp"},
    ("uldp-sgd", ()): {"rdp"},
    ("uldp-avg", ("privacy.noise_shares=continuous",)): {"rdp", "pld", "toy"},
    ("uldp-sgd", ("privacy.noise_shares=continuous",)): {"rdp", "pld", "toy"},
    ("uldp-group", ()): {"rdp"},  # group privacy (Lemma 8/9)
    ("prifedsync", ()): {"rdp"},  # batches without replacement (Theorem 9)
    ("prifedsync", ("algorithm.sampler=poisson",)): {"rdp", "pld", "toy"},
    ("privacy-free", ()): {"rdp", "pld", "toy"},  # no DP: nothing to account
    ("uldp-default", ()): {"rdp", "pld", "toy"},
}


@pytest.mark.parametrize("case", list(ACCEPTS), ids=lambda c: " ".join((c[0], *c[1])))
def test_every_algorithm_honours_or_refuses_each_accountant(
    toy: str, case: tuple[str, tuple[str, ...]]
) -> None:
    algorithm, extra = case
    for accountant in ("rdp", "pld", toy):
        if accountant in ACCEPTS[case]:
            assert _config(algorithm, accountant, extra).privacy.accountant == accountant
            continue
        with pytest.raises(ConfigError) as info:
            _config(algorithm, accountant, extra)
        (problem,) = [p for p in info.value.problems if p.startswith("privacy.accountant")]
        named = re.search(r"choose one of ([\w, -]+)$", problem) or re.search(
            r"only (rdp) interprets", problem
        )
        assert named, problem
        assert sorted(named.group(1).split(", ")) == sorted(ACCEPTS[case]), problem


def test_the_field_is_validated_against_the_registry(toy: str) -> None:
    assert "toy" in accountant_names(rigorous=True)
    assert _config("idp-fedavg", "TOY").privacy.accountant == "toy"  # case-insensitive
    with pytest.raises(ConfigError, match=r"privacy.accountant: gdp-clt reports an approx"):
        _config("idp-fedavg", "gdp-clt")
    with pytest.raises(ConfigError, match=r"privacy.accountant: expected one of rdp, pld, toy"):
        _config("idp-fedavg", "moments")
    unregister_accountant("toy")
    try:
        with pytest.raises(ConfigError, match="got 'toy'"):
            _config("idp-fedavg", "toy")
    finally:
        register_accountant("toy", ToyAccountant)


def test_a_refused_accountant_exits_2_before_anything_runs(tmp_path: Path) -> None:
    raw = copy.deepcopy(TOY_CONFIG)
    raw["algorithm"] = {"name": "prifedsync"}  # batches without replacement (Theorem 9)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["run", str(path), "--out", str(out), "--set", "privacy.accountant=pld"],
    )
    assert res.exit_code == 2, res.output
    assert "error: privacy.accountant: pld cannot interpret Composed(SampledWith" in res.output
    assert "choose one of rdp" in res.output and "Traceback" not in res.output
    assert not out.exists()


# ----------------------------------------------------------------------- the runs use it


def _build_quiet(config: Any) -> tuple[Any, dict[int, Any], Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _build(config)


@pytest.mark.slow
def test_the_ledgers_and_calibrations_use_the_configured_accountant(toy: str) -> None:
    """Client ledgers (IDP-FedAvg, PriFedSync), the user ledger (ULDP-FL) and the record
    ledgers (rPDP-FL) charge through the configured accountant, and their ε are its ε."""
    # IDP-FedAvg: σ calibrated (strict: getNoise) and every client ledger under toy
    server, clients, _ = _build_quiet(_config("idp-fedavg", toy, ("algorithm.method=strict",)))
    ledger = clients[0].ledger
    assert ledger.accountant == toy and server.setup.accountant == toy
    ledger.record_round(np.array([True]), np.array([True]))
    expected, _ = mechanism_epsilon(
        ledger.mechanism, ledger.rates, "third-party", 1, accountant=ToyAccountant()
    )
    assert ledger.spent_epsilon("third-party")[0] == pytest.approx(expected[0], rel=1e-12)
    # ULDP-AVG: the user ledger and the planned budgets under PLD
    server, _, config = _build_quiet(
        _config("uldp-avg", "pld", ("privacy.noise_shares=continuous",))
    )
    assert server.ledger.accountant == "pld"
    planned = server.plan.planned_epsilon(np.ones(1), "third-party", accountant="pld")
    assert server.ledger.budgets[0] == pytest.approx(planned[0], rel=1e-12)
    assert planned[0] < server.plan.planned_epsilon(np.ones(1), "third-party")[0]  # tighter
    # PriFedSync (Poisson batches): the records' ledger and the σ_j calibration under toy
    _, clients, _ = _build_quiet(_config("prifedsync", toy, ("algorithm.sampler=poisson",)))
    silo = clients[0]
    assert silo.ledger.accountant == toy and silo.setup.accountant == toy
    spent = silo.spent(participations=silo.setup.planned_rounds)
    assert spent <= silo.target_epsilon * (1 + 1e-9)
    # ULDP-GROUP-k: only rdp interprets its event, and its ledger uses it
    server, _, _ = _build_quiet(_config("uldp-group", "rdp"))
    assert server.ledger.accountant == "rdp"


def test_rpdp_silos_charge_under_the_configured_accountant() -> None:
    """rPDP-FL's record ledger (a uniform-rate setup: no estimator to fit)."""
    from pdpfl.fl.rpdp.mechanism import DpFedAvgSetup
    from pdpfl.fl.rpdp.silo import DpFedAvgSilo
    from pdpfl.randomness import SeededRandomness

    setup = DpFedAvgSetup(
        mode="uniform",
        noise_multiplier=1.2,
        delta=1e-3,
        local_steps=2,
        rounds=3,
        client_rate=0.5,
        max_grad_norm=1.0,
        accountant="pld",
        uniform_epsilon=1.0,
        uniform_rate=0.3,
    )
    data = _TinyData()
    silo = DpFedAvgSilo(
        0,
        _model(),
        data,
        np.full(8, 2.0),
        setup,
        randomness=SeededRandomness(0),
        normalizer=4.0,
    )
    assert silo.ledger is not None and silo.ledger.accountant == "pld"
    silo.ledger.record_round(np.ones(8, bool), np.ones(8, bool))
    pld, _ = mechanism_epsilon(setup.plan(), [0.3], "server", 1, accountant="pld")
    assert silo.spent("server")[0] == pytest.approx(pld[0], rel=1e-12)


class _TinyData:
    x_train = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    y_train = np.arange(8) % 2
    x_test, y_test = x_train[:2], y_train[:2]
    record_ids = np.arange(8)


def _model() -> Any:
    import torch

    return torch.nn.Linear(3, 2)


# ----------------------------------------------------------------------- supports


def _events(rates: bool) -> st.SearchStrategy[Mechanism]:
    sigma = st.floats(0.7, 4.0)
    rate = (
        st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).map(np.array)
        if rates
        else st.floats(0.01, 1.0)
    )
    leaf = sigma.map(GaussianMechanism)
    sampled = st.builds(PoissonSampled, rate, leaf) | st.builds(
        SampledWithoutReplacement, st.floats(0.01, 0.5), leaf
    )

    def grow(inner: st.SearchStrategy[Mechanism]) -> st.SearchStrategy[Mechanism]:
        return (
            st.builds(Composed, inner, st.integers(0, 3))
            | st.builds(TwoStageRound, st.floats(0.1, 1.0), inner)
            | st.builds(lambda es: Sequence(tuple(es)), st.lists(inner, min_size=1, max_size=2))
            | st.builds(GroupPrivacy, inner, st.integers(1, 3))
            | st.builds(PoissonSampled, rate, inner)
        )

    return st.recursive(leaf | sampled, grow, max_leaves=3)


ACCOUNTANTS = {
    "rdp": RdpAccountant(),
    # coarse but valid PLDs: this test is about structure, not resolution
    "pld": PldAccountant(max_interval=0.5, min_interval=0.2, rate_grid_rel_step=0.5),
    "gdp-clt": make_accountant("gdp-clt"),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=_events(rates=False), name=st.sampled_from(sorted(ACCOUNTANTS)))
def test_supports_is_the_traversal_of_the_epsilon_computation(event: Mechanism, name: str) -> None:
    acc: Any = ACCOUNTANTS[name]
    if acc.supports(event):
        eps, _ = acc.composed_epsilon(event, 1, 1e-5)
        assert np.all(np.asarray(eps) >= 0)
    else:
        with pytest.raises(UnsupportedEventError):
            acc.composed_epsilon(event, 1, 1e-5)
