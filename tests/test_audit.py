"""`pdpfl audit`: a small one-run audit of rPDP-FL, its negative control, and two broken
mechanisms (noise divided by 10; a leaked noise-free field) that the audit must catch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from noise_faults import weaken_noise
from pdpfl.audit import AuditSession, AuditSettings, AuditUnsupported, run_audit
from pdpfl.audit.canaries import CONTROL_LABEL
from pdpfl.cli import app
from pdpfl.config import load_config
from pdpfl.fl.api import Contribution
from pdpfl.fl.rpdp import DpFedAvgSilo

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits_demo.yaml"

#: scikit-learn digits over 4 silos, 5 rounds of 20 DP-SGD steps (about 10 s per audit).
SMALL = [
    "randomness=reproducible",
    "training.rounds=5",
    "training.local_steps=20",
    "data.num_clients=4",
]
#: Budget groups whose canaries reach q = 1 at ε_max: a strong signal for the top group.
STRONG = [*SMALL, "budgets.params.values=[1.0,3.0,10.0]"]
#: Small budgets (ε_max = 2, σ ≈ 16): a 10× smaller noise is far outside what is claimed.
CLAIM = [*SMALL, "budgets.params.values=[0.5,1.0,2.0]", "privacy.epsilon_max=2.0"]


def _config(overrides: list[str]) -> Any:
    return load_config(DIGITS, overrides)


def _rows(result: Any, observer: str) -> dict[str, dict[str, Any]]:
    return {g["label"]: g for g in result.to_dict()["observers"][observer]}


@pytest.fixture(scope="module")
def strong(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("audit")
    result = run_audit(
        _config(STRONG), AuditSettings(canaries=200, seed=11, space="block"), out_dir=out
    )
    return result, out


@pytest.mark.slow
def test_small_audit_sees_the_top_group_and_says_where_it_had_no_power(
    strong: tuple[Any, Path],
) -> None:
    result, out = strong
    record = result.to_dict()
    # no ε̂ above its accountant's ε; but the server's q = 1 group got every guess right where
    # 200 canaries cannot certify ε ≈ 12: that test could not have failed, and the audit says so
    assert not result.violations
    assert record["verdict"] == "inconclusive (saturated)"
    assert [line.split(":")[:2] for line in record["inconclusive"]] == [["server", " group 10"]]
    assert record["space"] == "block" and record["block_parameters"] == 4 * 200
    assert record["audit_delta"] == pytest.approx(min(1e-3, 1 / (100 * 200)))
    for obs in ("third-party", "server"):
        rows = record["observers"][obs]
        assert [g["label"] for g in rows] == ["1", "3", "10", CONTROL_LABEL]
        for g in rows[:-1]:
            assert 0.0 <= g["epsilon_lower"] <= g["spent_at_audit_delta"]
            assert g["spent_at_audit_delta"] >= g["spent"] > 0  # a smaller δ costs more ε
    server = _rows(result, "server")
    # the q = 1 group carries a signal the audit certifies; budgets order the bounds
    assert server["10"]["canary_rate"] == 1.0 and server["10"]["epsilon_lower"] > 0.5
    top = server["10"]
    assert top["status"] == "inconclusive (saturated)" and top["saturated"] and not top["power"]
    assert any(r["correct"] == r["guesses"] >= 16 for r in top["rungs"])  # a test at its ceiling
    assert top["canaries_for_power"] > 200
    assert top["epsilon_lower"] < top["spent_at_audit_delta"]
    assert all(g["status"] == "consistent" for g in record["observers"]["third-party"])
    assert top["risk"]["observer"] == "server" and len(top["risk"]["tpr_max"]) == 3
    lows = [server[k]["epsilon_lower"] for k in ("1", "3", "10")]
    assert lows == sorted(lows)
    # the outputs: json (strict), figure, page
    assert json.loads((out / "audit.json").read_text())["schema"] == "pdpfl.audit/2"
    assert (out / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "AUDIT.md").read_text()
    assert "Verdict: INCONCLUSIVE (saturated)" in page and "lower bound" in page
    assert "canaries per group would give it power" in page


@pytest.mark.slow
def test_negative_control_is_at_chance(strong: tuple[Any, Path]) -> None:
    """The control group's canaries have coins and coordinates but are never trained."""
    result, _ = strong
    for obs in ("third-party", "server"):
        control = _rows(result, obs)[CONTROL_LABEL]
        assert control["epsilon_lower"] == 0.0
        assert control["canary_rate"] == 0.0 and control["spent_at_audit_delta"] == 0.0
        assert abs(control["correct"] / control["guesses"] - 0.5) < 0.2


def _break_noise(session: AuditSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug: every silo adds a tenth of the noise its ledger is charged for (the sampler is
    broken: the noise description itself is bound to the ledger, tests/test_noise_binding.py)."""
    assert all(isinstance(s, DpFedAvgSilo) for s in session.run.clients.values())
    weaken_noise(monkeypatch)


class _LeakySilo:
    """The bug: besides its noisy update a silo releases its noise-free clipped sum (here its
    canaries' part, on the audit block where the records' gradients are exactly 0), summed into
    the one update field the transport carries."""

    def __init__(self, silo: Any) -> None:
        self._silo = silo

    def fit(self, params: Any, round_index: int, config: Any) -> Contribution:
        rows = self._silo.extra_rows
        before = rows.counts.copy()
        c = self._silo.fit(params, round_index, config)
        flat = np.concatenate([np.ravel(u) for u in c.update]).astype(np.float64)
        np.add.at(flat, rows.coords[:, 0], -(rows.counts - before) * rows.values[:, 0])
        cuts = np.cumsum([np.size(u) for u in c.update])[:-1]
        update = [
            part.reshape(np.shape(u)).astype(np.float32)
            for part, u in zip(np.split(flat, cuts), c.update, strict=True)
        ]
        return Contribution(update=update, weight=c.weight, metrics=dict(c.metrics))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._silo, name)


def _break_release(session: AuditSession, monkeypatch: pytest.MonkeyPatch) -> None:
    for c in list(session.run.clients):
        session.run.clients[c] = _LeakySilo(session.run.clients[c])


@pytest.mark.slow
@pytest.mark.parametrize("breaks", [_break_noise, _break_release], ids=["noise/10", "leak"])
def test_a_broken_mechanism_is_caught(breaks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    session = AuditSession.create(
        _config(CLAIM), AuditSettings(canaries=200, seed=5, space="block", observers=("server",))
    )
    breaks(session, monkeypatch)
    result = session.execute()
    server = _rows(result, "server")
    # ε̂ above what the ledgers claim, in the small-budget groups: the audit fails loudly
    assert server["0.5"]["violated"] and server["1"]["violated"]
    assert server["0.5"]["epsilon_lower"] > server["0.5"]["spent_at_audit_delta"]
    assert result.to_dict()["verdict"] == "violation" and len(result.violations) >= 2
    assert server[CONTROL_LABEL]["epsilon_lower"] == 0.0  # still nothing from nothing


def test_unsupported_and_nonprivate_algorithms_are_refused() -> None:
    with pytest.raises(AuditUnsupported, match="without differential privacy"):
        AuditSession.create(
            _config([*SMALL, "algorithm.name=privacy-free"]), AuditSettings(canaries=10)
        )


# ------------------------------------------------------------------------------ the CLI

TINY = {
    "name": "audit-tiny",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 3, "lr": 0.3, "batch_size": 8},
}


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--observer", "everyone"], "--observer"),
        (["--space", "sideways"], "--space"),
        (["--delta", "2"], "--delta"),
        (["--space", "model", "--canaries", "500"], "--space block"),
        (["--set", "algorithm.name=privacy-free"], "without differential privacy"),
        (["--set", "training.rounds=0"], "training.rounds"),
        # central IDP-FedAvg trusts its aggregator: no claim against the server to audit
        (
            [
                "--set",
                "algorithm.name=idp-fedavg",
                "--set",
                "algorithm.clients_per_round=1",
                "--set",
                "algorithm.clipping=fixed",
                "--observer",
                "server",
            ],
            "third-party only",
        ),
    ],
)
@pytest.mark.slow
def test_cli_bad_input_exits_2_and_writes_nothing(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    res = _invoke("audit", str(_write(tmp_path, TINY)), "--out", str(out), *extra)
    assert res.exit_code == 2, res.output
    assert "error: " in res.output and message in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.slow
def test_cli_writes_the_audit_and_refuses_to_overwrite(tmp_path: Path) -> None:
    cfg, out = _write(tmp_path, TINY), tmp_path / "out"
    res = _invoke("audit", str(cfg), "--out", str(out), "--canaries", "20", "--seed", "1", "--json")
    assert res.exit_code == 0, res.output
    record = json.loads(res.output.strip().splitlines()[-1])
    assert record["canaries_per_group"] == 20 and record["audit_coins"] == "seeded (1)"
    assert sorted(p.name for p in out.iterdir()) == ["AUDIT.md", "audit.json", "audit.png"]
    again = _invoke("audit", str(cfg), "--out", str(out), "--canaries", "20")
    assert again.exit_code == 2 and "--force" in again.output
    forced = _invoke(
        "audit",
        str(cfg),
        "--out",
        str(out),
        "--canaries",
        "20",
        "--force",
        "--observer",
        "server",
        "--seed",
        "1",  # seeded coins: a correct audit's control group fails by chance in <= 5 % of runs
        "--quiet",
    )
    assert forced.exit_code == 0, forced.output
    assert "audit: server" in forced.output and "third party" not in forced.output


@pytest.mark.slow
def test_cli_exits_1_on_a_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A found bug: the outputs are written, the violation is named, the exit status is 1."""
    from pdpfl.audit.evidence import evidence, guess_ladder
    from pdpfl.audit.session import AuditResult, GroupAudit

    included = np.arange(20) % 2 == 0  # every guess right: ε̂ ≈ 1.35 against a claimed 1.0
    found = evidence(included.astype(float), included, 1e-4, 0.01, claimed=1.0)
    fake = AuditResult(
        meta={
            "name": "x",
            "algorithm": "rpdp",
            "unit": "record",
            "rounds": 1,
            "silos": 1,
            "randomness": "secure",
            "canaries_per_group": 20,
            "space": "block",
            "delta": 1e-3,
            "audit_delta": 1e-4,
            "confidence": 0.95,
            "tests": 2,
            "ladder": guess_ladder(20),
            "level_per_test": 0.01,
            "seconds": 0.1,
        },
        groups={"server": [GroupAudit("1", 1.0, 0.2, 5, 0.8, 1.0, found)]},
    )
    monkeypatch.setattr(AuditSession, "execute", lambda self, progress=False: fake)
    out = tmp_path / "out"
    res = _invoke(
        "audit", str(_write(tmp_path, TINY)), "--out", str(out), "--canaries", "20", "--quiet"
    )
    assert res.exit_code == 1, res.output
    assert f"group 1: audited ε̂ = {found.epsilon:.4g} > the accountant's ε = 1" in res.output
    assert found.epsilon > 1.0
    assert json.loads((out / "audit.json").read_text())["verdict"] == "violation"


def test_what_each_observer_scores() -> None:
    """Third party: −(final − initial); server: −Σ own releases / weight, or −Σ round sums
    when the summation protocol hides individual updates."""
    from pdpfl.audit.observe import FlatIndex, ReleaseLog, observer_scores

    shapes = [(2, 2), (3,)]
    coords = np.array([1, 4, 6])  # one coordinate in each tensor, the last one in the bias
    hosts = np.array([0, 1, 0])
    log = ReleaseLog(FlatIndex(shapes, coords))

    def update(value: float) -> list[np.ndarray]:
        return [np.full((2, 2), value, np.float32), np.full(3, 10 * value, np.float32)]

    log.record(0, 0, Contribution(update=update(1.0), weight=2.0))
    log.record(0, 1, Contribution(update=update(-1.0)))
    log.record(1, 1, Contribution(update=update(3.0)))
    assert log.released(0, 2).tolist() == [True, False]
    initial, final = update(0.0), update(0.5)
    np.testing.assert_allclose(
        observer_scores(
            "third-party",
            hosts=hosts,
            log=log,
            initial=initial,
            final=final,
            hides_individual_updates=False,
        ),
        [-0.5, -5.0, -5.0],
    )
    np.testing.assert_allclose(
        observer_scores(
            "server",
            hosts=hosts,
            log=log,
            initial=initial,
            final=final,
            hides_individual_updates=False,
        ),
        [-0.5, -20.0, -5.0],
    )
    np.testing.assert_allclose(
        observer_scores(
            "server",
            hosts=hosts,
            log=log,
            initial=initial,
            final=final,
            hides_individual_updates=True,
        ),
        [-3.0, -30.0, -30.0],
    )
    with pytest.raises(ValueError, match="outside"):
        FlatIndex(shapes, np.array([7]))
