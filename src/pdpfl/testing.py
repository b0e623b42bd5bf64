"""Conformance checks for federated algorithms (in the spirit of scikit-learn's
``check_estimator``): every registered algorithm must keep the privacy boundary and resume
exactly.

:func:`check_algorithm` builds a toy federation of ``name`` (``TOY_CONFIG`` plus the algorithm's
``toy_overrides``) with reproducible randomness and checks that

* ``fit`` returns a :class:`~pdpfl.fl.api.Contribution` whose metrics the server declares public,
  with one float32 array per model parameter, and nothing else;
* ``evaluate`` returns only ``loss``, ``accuracy``, ``n``;
* a silo's ``state_dict`` encodes without pickle and a silo rebuilt from it produces the same
  next contribution (exact resume);
* catching up unsampled rounds is idempotent (evaluating a round twice changes nothing);
* ``privacy_summary`` is a typed :class:`~pdpfl.ledger.PrivacySummary` in the algorithm's unit
  (or None for a silo that accounts nothing itself);
* a template silo's ledger is charged *before* its step runs (nothing can be released before
  its charge), and a silo resumed from its state refuses a round it already accounted and
  charges the next one exactly once;
* the server's ``aggregate`` accepts the sum of the contributions and returns a model of the same
  shapes, and its ``state_dict`` round-trips.
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.fl.api import ClientAlgorithm, Contribution, Params, ServerAlgorithm
    from pdpfl.fl.template import RoundPlan

__all__ = ["TOY_CONFIG", "check_algorithm", "toy_config"]

#: A few digits silos, two rounds: the base of every algorithm's toy run.
TOY_CONFIG: dict[str, Any] = {
    "name": "toy",
    "seed": 7,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3},
    "model": {"name": "logreg"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [1.0, 3.0, 8.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "client_rate": 1.0, "lr": 0.3, "batch_size": 8},
}


def toy_config(name: str, extra: list[str] | None = None) -> ExperimentConfig:
    """The validated toy config of the registered algorithm ``name``."""
    from pdpfl.config import ALGORITHMS, config_from_dict

    return config_from_dict(
        copy.deepcopy(TOY_CONFIG),
        [f"algorithm.name={name}", *ALGORITHMS.get(name).toy_overrides, *(extra or [])],
    )


def _build(
    config: ExperimentConfig,
) -> tuple[ServerAlgorithm, dict[int, ClientAlgorithm], ExperimentConfig]:
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.simulation import load_federation_for

    algorithm = as_algorithm(config.algorithm)
    config, federation = algorithm.prepare(config, load_federation_for(config))
    server, clients = algorithm.build(config, federation)
    return server, clients, config


def check_algorithm(name: str, extra: list[str] | None = None) -> None:
    """Run the conformance checks for the registered algorithm ``name`` (AssertionError)."""
    from pdpfl.fl.aggregation import sum_contributions
    from pdpfl.fl.api import EVALUATION_METRICS, Contribution, check_contribution
    from pdpfl.io import decode_state_dict, encode_state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = toy_config(name, extra)
        server, clients, config = _build(config)
        params = server.initial_params()
        ids = sorted(clients)
        selected = server.select_clients(0, ids)
        round_config = server.round_config(0)
        public: frozenset[str] = getattr(server, "public_metrics", frozenset())
        contributions = []
        for c in selected:
            _watch_charge(name, clients[c])
            out = clients[c].fit(params, 0, round_config)
            assert type(out) is Contribution, f"{name}: fit returned {type(out).__name__}"
            encoding = getattr(clients[c], "share_encoding", None)
            check_contribution(out, public, len(params), encoding=encoding)
            if encoding is None:
                for u, p in zip(out.update, params, strict=True):
                    assert u.dtype == np.float32 and u.shape == np.shape(p), f"{name}: shape"
            else:  # a discrete share: one integer vector in Z_{2^b}
                assert encoding == getattr(server, "share_encoding", None), f"{name}: encoding"
            contributions.append(out)
        encoding = getattr(server, "share_encoding", None)
        if encoding is not None:
            from pdpfl.fl.aggregation.discrete_shares import ring_sum

            agg = encoding.decode(
                ring_sum([c.update[0] for c in contributions], encoding),
                params,
                0,
                weight=sum(c.weight for c in contributions),
                count=len(contributions),
            )
        else:
            agg = sum_contributions(
                contributions,
                params,
                keep_individual=bool(getattr(server, "needs_individual_updates", False)),
            )
        new = server.aggregate(0, params, agg)
        assert [np.shape(a) for a in new] == [np.shape(p) for p in params], f"{name}: shapes"
        server.record_round(0, selected)
        state = decode_state_dict(encode_state(server.state_dict()))
        server.load_state_dict(state)
        for c in ids:
            e = clients[c].evaluate(new, 0, round_config)
            assert set(e) <= EVALUATION_METRICS, f"{name}: evaluate released {sorted(e)}"
            _check_summary(name, clients[c].privacy_summary(), config.algorithm.unit)
        # Catch-up is idempotent: evaluating the same round again changes no state.
        c0 = ids[0]
        before = encode_state(clients[c0].state_dict())
        clients[c0].evaluate(new, 0, round_config)
        assert encode_state(clients[c0].state_dict()) == before, f"{name}: catch-up not idempotent"
        # Exact resume: a silo rebuilt from its state makes the same next contribution.
        saved = decode_state_dict(encode_state(clients[c0].state_dict()))
        _, rebuilt, _ = _build(config)
        rebuilt[c0].load_state_dict(saved)
        a = clients[c0].fit(new, 1, server.round_config(1))
        b = rebuilt[c0].fit(new, 1, server.round_config(1))
        for x, y in zip(a.update, b.update, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=f"{name}: resume")
        assert a.weight == b.weight and a.metrics == b.metrics
        # A resumed silo never charges twice: the round it already accounted is refused, and
        # its ledger holds exactly what the uninterrupted silo's does.
        try:
            rebuilt[c0].fit(new, 1, server.round_config(1))
        except ValueError:
            pass
        else:
            raise AssertionError(f"{name}: a resumed silo accepted round 1 twice")
        ledger_a = getattr(clients[c0], "ledger", None)
        ledger_b = getattr(rebuilt[c0], "ledger", None)
        if ledger_a is not None and ledger_b is not None:
            for key, value in ledger_a.state_dict().items():
                np.testing.assert_array_equal(
                    value, ledger_b.state_dict()[key], err_msg=f"{name}: resume charged twice"
                )


def _watch_charge(name: str, client: ClientAlgorithm) -> None:
    """Make a template silo's step assert that its round is already charged when it runs."""
    from pdpfl.fl.template import Silo

    if not isinstance(client, Silo):
        return
    step = client.step
    before = client.next_round

    def checked(global_params: Params, plan: RoundPlan) -> Contribution:
        assert client.next_round == plan.round_index + 1 > before, (
            f"{name}: the step of round {plan.round_index} ran before the round was charged"
        )
        if client.ledger is not None:
            assert client.ledger.rounds_recorded == client.next_round, (
                f"{name}: the ledger was not charged before the step"
            )
        return step(global_params, plan)

    client.step = checked  # type: ignore[method-assign]


def _check_summary(name: str, summary: object, unit: str) -> None:
    from pdpfl.ledger import PrivacySummary

    if summary is None:  # nothing accounted at this silo
        return
    assert isinstance(summary, PrivacySummary), (
        f"{name}: privacy_summary returned {type(summary).__name__}, not a PrivacySummary"
    )
    expected = "record" if unit == "none" else unit
    assert summary.unit == expected, f"{name}: summary unit {summary.unit}, expected {expected}"
