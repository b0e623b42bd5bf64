"""One noise adder bound to the ledger's event (issue #33 item 2).

* exactly one module of ``src/`` draws DP noise (:func:`pdpfl.dp.noise.add_noise`; an AST scan,
  with its allow-list, that flags today's five draw sites when pointed at them);
* the noise descriptions (:mod:`pdpfl.privacy.noise`): std per share, the event, joint releases
  (checked against the RDP additivity of Gaussians);
* per algorithm: the std every party actually asks the sampler for equals σ·C (a share:
  σ·C/√t) of the event its ledger charges, and a description changed after the ledger was built
  is refused before anything is drawn.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.dp import noise as noise_module
from pdpfl.dp.engine import PersonalizedDPSGD, make_optimizer
from pdpfl.dp.noise import PreparedNoise, add_noise
from pdpfl.fl.aggregation import sum_contributions
from pdpfl.privacy.accountant import RdpAccountant
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
from pdpfl.privacy.noise import GaussianNoise, JointGaussian, NoiseBindingError
from pdpfl.randomness import SecureRandomness, stream_from_generator
from pdpfl.testing import _build, toy_config

SRC = Path(__file__).resolve().parents[1] / "src" / "pdpfl"
#: The one module that draws DP noise, and the module that turns key streams into normals.
#: (discrete_noise.py: the exact discrete Gaussian sampler itself, called only by the adder)
ADDER = {"dp/noise.py", "randomness.py", "discrete_noise.py"}
#: Normals that are not DP noise: simulated users' budget choices (data, not a mechanism).
ALLOWED = {
    ("budgets/scenarios.py", "normal"),
    # an ideal audit's simulated observations (the ceiling of a canary audit), not DP noise
    ("audit/ideal.py", "standard_normal"),
}
DRAWS = {
    "normal",
    "normals",
    "normal_",
    "randn",
    "randn_like",
    "standard_normal",
    "gauss",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_exact",
}


def draw_sites(source: str) -> list[tuple[int, str]]:
    """(line, name) of every call in ``source`` that draws normals."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in DRAWS or name == "draw_normals":
                out.append((node.lineno, name))
    return sorted(out)


def test_exactly_one_module_draws_dp_noise() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ADDER:
            continue
        for line, name in draw_sites(path.read_text()):
            if (rel, name) not in ALLOWED:
                found.append(f"{rel}:{line}: {name}(...)")
    assert not found, "DP noise drawn outside pdpfl.dp.noise.add_noise:\n" + "\n".join(found)


def test_the_scan_flags_what_the_adder_replaced() -> None:
    """The draws of the five former sites (engine, steps, IDP silo twice, IDP server) are
    flagged: the test above fails on the code before the adder."""
    former = """
flat.add_(draw_normals(stream, self._shapes, device=flat.device), alpha=std)
acc = acc + std * stream.normal(tuple(s.shape)).to(acc.device)
out = [v[0] + std * stream.normal(tuple(v.shape[1:])) for v in vecs]
z = float(self.randomness.stream("count-share", t, self.client_id).normal((1,))[0])
noise = torch.randn(3)
"""
    assert [n for _, n in draw_sites(former)] == [
        "draw_normals",
        "normal",
        "normal",
        "normal",
        "randn",
    ]


# ----------------------------------------------------------------------- the descriptions


def test_gaussian_noise_shares_event_and_validation() -> None:
    n = GaussianNoise(2.0, 0.5, shares=4)
    assert n.total_std == 1.0 and n.std() == 0.5 and n.std(announced_survivors=1) == 1.0
    assert n.std(announced_survivors=9) == 0.5  # never less noise than the setup's t needs
    assert n.event() == GaussianMechanism(2.0) and n.share().noise_multiplier == 1.0
    scaled = n.for_sensitivity(0.25)  # the same noise, stated for a smaller clipping bound
    assert scaled.total_std == pytest.approx(n.total_std) and scaled.noise_multiplier == 4.0
    assert n.with_sensitivity(1.0).total_std == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.noise_multiplier = 0.1  # type: ignore[misc]
    for bad in ({"noise_multiplier": -1.0}, {"noise_multiplier": math.nan}):
        with pytest.raises(ValueError, match="noise_multiplier"):
            GaussianNoise(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_grad_norm"):
        GaussianNoise(1.0, 0.0)
    with pytest.raises(ValueError, match="shares"):
        GaussianNoise(1.0, 1.0, shares=0)
    with pytest.raises(ValueError, match="nothing to account"):
        GaussianNoise(0.0).event()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.3, 20.0), min_size=1, max_size=4))
def test_a_joint_release_is_the_gaussian_its_parts_compose_to(sigmas: list[float]) -> None:
    """Independent reference: the RDP of Gaussians adds (Mironov 2017, Prop. 1)."""
    joint = JointGaussian(tuple(GaussianNoise(s) for s in sigmas))
    acc = RdpAccountant()
    parts = Sequence(tuple(GaussianMechanism(s) for s in sigmas))
    np.testing.assert_allclose(acc.rdp(joint.event()), acc.rdp(parts), rtol=1e-12)


def test_add_noise_in_place_for_every_layout() -> None:
    stream = SecureRandomness().stream("t")
    flat = torch.zeros(40_000, dtype=torch.float64)
    assert add_noise(flat, GaussianNoise(1.5, 2.0), stream) is flat
    assert float(flat.std()) == pytest.approx(3.0, rel=0.03)
    arr = np.zeros(40_000)
    add_noise(arr, GaussianNoise(1.0, 1.0, shares=4), stream)
    assert float(arr.std()) == pytest.approx(0.5, rel=0.03)
    parts = [torch.zeros(200, 100, dtype=torch.float64), torch.zeros(20_000, dtype=torch.float64)]
    add_noise(parts, GaussianNoise(1.0), stream, announced_survivors=3)
    assert all(float(p.std()) == pytest.approx(1.0, rel=0.05) for p in parts)
    untouched = torch.ones(3, dtype=torch.float64)
    add_noise(untouched, GaussianNoise(0.0), None)  # σ = 0: nothing drawn, no stream needed
    assert torch.equal(untouched, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="float64"):
        add_noise(torch.zeros(3), GaussianNoise(1.0), stream)
    with pytest.raises(ValueError, match="stream"):
        add_noise(torch.zeros(3, dtype=torch.float64), GaussianNoise(1.0), None)
    with pytest.raises(ValueError, match="shapes"):
        add_noise(torch.zeros(3, dtype=torch.float64), GaussianNoise(1.0), stream, shapes=[(2,)])
    with pytest.raises(ValueError, match="no sampler"):
        add_noise(torch.zeros(3, dtype=torch.float64), JointGaussian((GaussianNoise(1.0),)), stream)  # type: ignore[arg-type]


def test_seeded_draws_follow_the_shapes_layout() -> None:
    """One flat draw in parameter layout = one draw per tensor (reproducible mode)."""
    shapes = [(3, 4), (5,), (2, 2, 2)]
    flat = torch.zeros(25, dtype=torch.float64)
    add_noise(flat, GaussianNoise(1.0), torch.Generator().manual_seed(1), shapes=shapes)
    ref = stream_from_generator(torch.Generator().manual_seed(1))
    expected = torch.cat([ref.normal(s).reshape(-1) for s in shapes])
    torch.testing.assert_close(flat, expected, rtol=0, atol=0)


# ----------------------------------------------------------------------- per algorithm


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, float]]:
    """Every (description, std) the sampler is asked for (and then draws)."""
    seen: list[tuple[Any, float]] = []
    original = noise_module._SAMPLERS["gaussian"]

    def record(targets: Any, noise: Any, std: float, stream: Any, shapes: Any) -> None:
        seen.append((noise, std))
        original(targets, noise, std, stream, shapes)

    monkeypatch.setitem(noise_module._SAMPLERS, "gaussian", record)
    return seen


def _round(name: str, extra: list[str] | None = None) -> tuple[Any, dict[int, Any], Any]:
    """One round of the toy federation of ``name``: every silo fits, the server aggregates."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server, clients, config = _build(toy_config(name, extra))
        params = server.initial_params()
        selected = server.select_clients(0, sorted(clients))
        round_config = server.round_config(0)
        outs = [clients[c].fit(params, 0, round_config) for c in selected]
        agg = sum_contributions(
            outs, params, keep_individual=getattr(server, "needs_individual_updates", False)
        )
        server.aggregate(0, params, agg)
    return server, clients, config


def _leaf(event: Mechanism) -> GaussianMechanism:
    """The Gaussian of an event with one Gaussian leaf."""
    while not isinstance(event, GaussianMechanism):
        if isinstance(event, Composed | PoissonSampled | SampledWithoutReplacement | GroupPrivacy):
            event = event.inner
        elif isinstance(event, TwoStageRound):
            event = event.local
        else:
            raise AssertionError(f"no single Gaussian leaf in {event!r}")
    return event


@pytest.mark.slow
def test_rpdp_adds_the_sigma_c_its_ledger_charges(draws: list[tuple[Any, float]]) -> None:
    _, clients, config = _round("rpdp")
    c = config.training.max_grad_norm
    for silo in clients.values():
        charged = _leaf(silo.ledger.mechanism.round_event(np.array([0.5]), "server"))
        assert set(silo.ledger.noise_multipliers.tolist()) == {charged.noise_multiplier}
        assert silo.noise.event() == charged
    assert len(draws) == len(clients) * config.training.local_steps
    assert {std for _, std in draws} == {charged.noise_multiplier * c}
    silo = clients[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        silo.noise.noise_multiplier = 0.1
    silo.noise = dataclasses.replace(silo.noise, noise_multiplier=silo.noise.noise_multiplier / 10)
    before = len(draws)
    with pytest.raises(NoiseBindingError, match="ledger charges"):
        silo.fit(silo_params(silo), 1, {})
    assert len(draws) == before  # refused before anything was drawn


def silo_params(silo: Any) -> list[np.ndarray]:
    from pdpfl.models import get_params

    return get_params(silo.model)


def test_filter_adds_the_sigma_c_it_accounts(draws: list[tuple[Any, float]]) -> None:
    _, clients, config = _round("centralized-filter", ["privacy.accountant=rdp"])
    silo = clients[0]
    assert {std for _, std in draws} == {silo._charged * config.training.max_grad_norm}
    object.__setattr__(silo.noise, "noise_multiplier", silo._charged * 2)  # bypasses frozen
    with pytest.raises(NoiseBindingError):
        silo.fit(silo_params(silo), 1, {})


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["central", "distributed"])
def test_idp_fedavg_value_and_count_noise_compose_to_the_charged_sigma(
    draws: list[tuple[Any, float]], variant: str
) -> None:
    extra = ["algorithm.method=strict", f"algorithm.variant={variant}"]
    if variant == "distributed":  # float shares (discrete: tests/test_discrete_shares.py)
        extra += ["aggregation=secure", "privacy.noise_shares=continuous"]
    server, clients, _ = _round("idp-fedavg", extra)
    setup = server.setup
    t = setup.shares
    clip = setup.initial_clip
    value = [std for n, std in draws if n.sensitivity != 0.5]
    count = [std for n, std in draws if n.sensitivity == 0.5]
    assert value and count
    for silo in clients.values():
        if silo.ledger is None:
            continue
        charged = _leaf(silo.ledger.mechanism.round_event(np.array([0.5]), "third-party"))
        f = setup.clip_factors[silo.group]
        # the stds actually drawn (t shares each), over the unit's sensitivities, compose to
        # exactly the Gaussian the client's ledger charges
        drawn = (max(value) * math.sqrt(t) / (clip * f)) ** -2 + (
            max(count) * math.sqrt(t) / 0.5
        ) ** -2
        assert drawn**-0.5 == pytest.approx(charged.noise_multiplier, rel=1e-12)
        assert silo.ledger.accountant == "rdp"
    if variant == "distributed":
        silo = clients[0]
        silo.setup = dataclasses.replace(
            setup, value_noise_multiplier=setup.value_noise_multiplier / 10
        )
        with pytest.raises(NoiseBindingError):
            silo.fit(server.initial_params(), 1, server.round_config(1))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("uldp-avg", marks=pytest.mark.slow),
        pytest.param("uldp-naive", marks=pytest.mark.slow),
        "uldp-group",
    ],
)
def test_uldp_silos_add_what_the_user_ledger_charges(
    draws: list[tuple[Any, float]], name: str
) -> None:
    # float shares (discrete shares: tests/test_discrete_shares.py)
    extra = ["privacy.noise_shares=continuous"] if name == "uldp-avg" else None
    server, clients, config = _round(name, extra)
    c = config.training.max_grad_norm
    silo = clients[0]
    plan = server.ledger.mechanism
    charged = _leaf(plan.round_event(np.array([0.5]), "third-party")).noise_multiplier
    assert silo.noise.noise_multiplier == charged
    stds = {std for _, std in draws}
    assert len(stds) == 1
    std = stds.pop()
    if name == "uldp-avg":  # a share of σC for t survivors
        t = silo.user_setup.survivors
        assert std * math.sqrt(t) / c == pytest.approx(charged, rel=1e-12)
    elif name == "uldp-naive":  # |S| shares of σκ|S|C over the sensitivity 2|S|C
        s = len(clients)
        assert std * math.sqrt(s) / (2 * s * c) == pytest.approx(charged, rel=1e-12)
    else:  # every DP-SGD step: σC (group privacy is accounting only)
        assert std == charged * c
    silo.noise = dataclasses.replace(silo.noise, noise_multiplier=charged / 10)
    with pytest.raises(NoiseBindingError):
        silo.fit(server.initial_params(), 1, server.round_config(1))


def test_prifedsync_steps_add_what_the_record_ledger_charges(
    draws: list[tuple[Any, float]],
) -> None:
    _, clients, config = _round("prifedsync")
    c = config.training.max_grad_norm
    silo = next(s for s in clients.values() if s.participations)
    event = _leaf(silo.ledger.mechanism.round_event(np.array([0.5]), "server"))
    # batches without replacement: replace-one neighbours, sensitivity 2C
    assert silo.noise.noise_multiplier * c in {std for _, std in draws}
    assert silo.noise.noise_multiplier * c / (2 * c) == event.noise_multiplier
    object.__setattr__(silo.noise, "noise_multiplier", silo.noise.noise_multiplier * 0.5)
    with pytest.raises(NoiseBindingError):
        silo.fit(silo.local, 1, {})


def test_the_engine_draws_its_description(draws: list[tuple[Any, float]]) -> None:
    model = torch.nn.Linear(3, 2)
    opt = make_optimizer("sgd", model.parameters(), lr=0.1)
    noise = GaussianNoise(0.7, 0.5)
    engine = PersonalizedDPSGD(model, opt, noise=noise)
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    engine.step(x, y, np.full(6, 0.5), torch.Generator().manual_seed(0), normalizer=3.0)
    assert draws == [(noise, 0.35)] and engine.max_grad_norm == 0.5
    with pytest.raises(ValueError, match="not both"):
        PersonalizedDPSGD(model, opt, noise=noise, noise_multiplier=0.7)
    with pytest.raises(ValueError, match="one share"):
        PersonalizedDPSGD(model, opt, noise=GaussianNoise(0.7, 0.5, shares=2))
    prepared = PreparedNoise(noise, [(2, 3), (2,)])  # the engine's hot path, checked once
    with pytest.raises(ValueError, match="shapes"):
        prepared(torch.zeros(7, dtype=torch.float64), SecureRandomness().stream("p"))
