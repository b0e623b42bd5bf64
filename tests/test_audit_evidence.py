"""One group's evidence (pdpfl.audit.evidence): the guess ladder, the two statistics, honest
verdicts -- an audit that could not have failed says so -- and the measured attack rates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.audit import AuditSession
from pdpfl.audit.bound import epsilon_lower_bound
from pdpfl.audit.evidence import (
    CONSISTENT,
    INCONCLUSIVE,
    MIN_FALSE_POSITIVES,
    VIOLATION,
    canaries_for_power,
    evidence,
    guess_ladder,
    measured_tpr,
)
from pdpfl.cli import app


def test_guess_ladder() -> None:
    assert guess_ladder(1000) == [500, 250, 125, 62, 31, 15]
    assert guess_ladder(16000) == [8000, 4000, 2000, 1000, 500, 250, 125, 62]
    assert guess_ladder(20) == [10]  # 2k = 20 >= 16; k = 5 would guess only 10
    assert guess_ladder(6) == [3]  # always the widest rung
    assert all(2 * k >= 16 for k in guess_ladder(10**6))


def _perfect(m: int) -> tuple[np.ndarray, np.ndarray]:
    included = np.arange(m) % 2 == 0
    return included.astype(float), included


def test_a_saturated_test_is_inconclusive_and_says_how_many_canaries() -> None:
    """Every guess right with 40 canaries: nothing above ~2 can be certified, so against an
    accountant's ε = 6 the group is inconclusive, not consistent; the canary count given would
    let a perfect result certify more than 6."""
    level = 0.05 / 8
    scores, inc = _perfect(40)
    found = evidence(scores, inc, 1e-5, level, claimed=6.0, level_for=lambda m: level)
    assert found.rungs[found.best].v == found.rungs[found.best].r  # every guess right
    assert 0 < found.epsilon < 6.0 and not found.power
    assert found.saturated and found.status == INCONCLUSIVE
    need = found.canaries_for_power
    assert need is not None and need > 40
    assert epsilon_lower_bound(need, need, need, 1e-5, level) > 6.0
    assert epsilon_lower_bound(need // 2, need // 2, need // 2, 1e-5, level) <= 6.0
    # the same perfect result against a claim the test can reach is a violation
    low = evidence(scores, inc, 1e-5, level, claimed=0.5)
    assert low.power and low.status == VIOLATION and low.violated


def test_a_powerless_test_that_did_not_saturate_is_consistent() -> None:
    rng = np.random.default_rng(0)
    inc = rng.random(40) < 0.5
    found = evidence(rng.standard_normal(40), inc, 1e-5, 0.01, claimed=6.0)
    assert found.epsilon == 0.0 and not found.power and not found.saturated
    assert found.status == CONSISTENT


def test_canaries_for_power_none_when_delta_forbids() -> None:
    """With δ = 0.1 the δ-term caps every count of guesses (2mδ ≥ 1 for all m ≥ 5)."""
    assert canaries_for_power(3.0, 0.1, lambda m: 0.01, start=2) is None
    m = canaries_for_power(3.0, 1e-9, lambda m: 0.01, start=2)
    assert m is not None and (m & (m - 1)) == 0


def test_measured_tpr() -> None:
    out = np.arange(1000, dtype=float)  # excluded canaries' scores 0..999
    ins = np.array([999.5, 995.5, 990.5, 900.5, 10.5])
    scores = np.concatenate([out, ins])
    inc = np.concatenate([np.zeros(1000, bool), np.ones(5, bool)])
    rates = measured_tpr(scores, inc, (0.001, 0.01, 0.1))
    assert rates[0.001] is None  # one false positive allowed: not estimated
    assert MIN_FALSE_POSITIVES <= 10
    assert rates[0.01] == pytest.approx(3 / 5)  # t = 989: 999.5, 995.5, 990.5 above
    assert rates[0.1] == pytest.approx(4 / 5)  # t = 899


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


@pytest.mark.slow
def test_cli_exits_4_when_inconclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A saturated group: the outputs are written, the verdict and the canary count named, and
    the exit status is 4 (neither 0, consistent, nor 1, a violation)."""
    from pdpfl.audit.session import AuditResult, GroupAudit

    scores, inc = _perfect(40)
    found = evidence(scores, inc, 1e-5, 0.01, claimed=6.0, level_for=lambda m: 0.01)
    fake = AuditResult(
        meta={
            "name": "x",
            "algorithm": "rpdp",
            "unit": "record",
            "rounds": 1,
            "silos": 1,
            "randomness": "secure",
            "canaries_per_group": 40,
            "space": "block",
            "delta": 1e-3,
            "audit_delta": 1e-5,
            "confidence": 0.95,
            "tests": 2,
            "ladder": guess_ladder(40),
            "level_per_test": 0.01,
            "seconds": 0.1,
        },
        groups={"server": [GroupAudit("5", 5.0, 0.6, 7, 5.0, 6.0, found)]},
    )
    monkeypatch.setattr(AuditSession, "execute", lambda self, progress=False: fake)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["audit", str(cfg), "--out", str(out), "--canaries", "40", "--quiet"]
    )
    assert res.exit_code == 4, res.output
    assert "inconclusive (saturated)" in res.output and "canaries per group" in res.output
    record: dict[str, Any] = json.loads((out / "audit.json").read_text())
    assert record["verdict"] == INCONCLUSIVE and record["inconclusive"]
    assert record["observers"]["server"][0]["canaries_for_power"] == found.canaries_for_power
    assert "INCONCLUSIVE (saturated)" in (out / "AUDIT.md").read_text()


def test_observer_rounds_and_standardized_scores() -> None:
    """Round by round, the third party's view telescopes to −(x_T − x_0) and the server's to
    the host's releases; standardizing by the control canaries' spread weighs every round by
    its own noise (adaptive clipping changes the scale from round to round)."""
    from pdpfl.audit.observe import (
        FlatIndex,
        ReleaseLog,
        observer_rounds,
        observer_scores,
        standardized_scores,
    )
    from pdpfl.fl.api import Contribution

    rng = np.random.default_rng(1)
    n, rounds = 400, 6
    log = ReleaseLog(FlatIndex([(n,)], np.arange(n)))
    hosts = np.zeros(n, dtype=np.int64)
    control = np.arange(n) >= n // 2
    included = (np.arange(n) % 2 == 0) & ~control
    scale = np.array([0.01, 1.0, 100.0, 0.1, 10.0, 1.0])  # a round's noise and signal scale
    x = np.zeros(n)
    for t in range(rounds):
        release = scale[t] * (rng.standard_normal(n) - 0.5 * included)  # canary: −0.5 noise sd
        log.record(t, 0, Contribution(update=[release.astype(np.float32)], weight=1.0))
        x = x + release
        log.record_model(t, [x])
    for obs in ("third-party", "server"):
        per_round = observer_rounds(
            obs,
            hosts=hosts,
            log=log,
            initial=[np.zeros(n)],
            rounds=rounds,
            hides_individual_updates=False,
        )
        assert per_round.shape == (rounds, n)
        np.testing.assert_allclose(
            per_round.sum(axis=0),
            observer_scores(
                obs,
                hosts=hosts,
                log=log,
                initial=[np.zeros(n)],
                final=[x],
                hides_individual_updates=False,
            ),
            rtol=1e-5,
            atol=1e-3,
        )
    z = standardized_scores(per_round, hosts, control)
    raw = per_round.sum(axis=0)
    audited = ~control

    def separation(s: np.ndarray) -> float:
        a, b = s[audited & included], s[audited & ~included]
        return float((a.mean() - b.mean()) / b.std())

    # every round contributes 0.5 sd: √6·0.5 ≈ 1.2 standardized, the raw sum sees one round
    assert separation(z) > 1.0 > 0.8 > separation(raw)
    assert abs(float(z[control].std()) - np.sqrt(rounds)) < 0.5
