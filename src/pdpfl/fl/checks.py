"""Checks of a federation before training that every algorithm shares (operator's view).

An algorithm adds its own (e.g. rPDP-FL's budget-mix check) by overriding
:meth:`pdpfl.fl.algorithm.Algorithm.algorithm_checks`; these run first, while the run's
environment is resolved (:func:`pdpfl.fl.environment.resolve_environment`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdpfl.config import ExperimentConfig

if TYPE_CHECKING:
    from pdpfl.data.federation import Federation

__all__ = ["check_federation", "check_silos", "few"]


def check_federation(config: ExperimentConfig, federation: Federation) -> list[str]:
    """Problems that make a run meaningless (raised) and warnings (returned), before training:
    :func:`check_silos`, then the budget table
    (:func:`pdpfl.data.budget_table.check_budget_file`)."""
    from pdpfl.data.budget_table import check_budget_file

    return [*check_silos(config, federation), *check_budget_file(config, federation)]


def check_silos(config: ExperimentConfig, federation: Federation) -> list[str]:
    """The silos' own problems (raised) and warnings (returned), before training.

    * a silo without training records is an error naming the silo;
    * silos without test records are left out of the pooled metrics (one warning naming them;
      when no silo has any, accuracy and loss are not measured at all);
    * a public batch size B larger than a silo's training set is a warning.
    """
    clients = list(federation.clients)
    empty = [f"{k} ({c.name!r})" for k, c in enumerate(clients) if len(c.y_train) == 0]
    if empty:
        raise ValueError(
            f"data: silo(s) {few(empty)} have no training records; use fewer silos "
            "(data.num_clients), a partition that gives every silo records (e.g. dirichlet "
            "min_size), or leave those silos out of the federation"
        )
    warnings: list[str] = []
    no_test = [str(c.name) for c in clients if len(c.y_test) == 0]
    if len(no_test) == len(clients):
        warnings.append(
            "data: no silo has test records, so test accuracy and loss are not measured "
            "(they are reported as missing and the accuracy plot says so)"
        )
    elif no_test:
        warnings.append(
            f"data: {len(no_test)} silo(s) have no test records ({few(no_test)}); pooled test "
            f"metrics use the {sum(len(c.y_test) for c in clients)} test records of the "
            f"other {len(clients) - len(no_test)} silo(s)"
        )
    warnings.extend(_batch_size_warnings(config, clients))
    return warnings


def few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _batch_size_warnings(config: ExperimentConfig, clients: list[Any]) -> list[str]:
    """B larger than a silo's training set: no Poisson batch can reach it (operator view)."""
    batch = config.training.batch_size
    if batch is None:
        return []
    too_big = []
    for k, c in enumerate(clients):
        b = config.training.batch_size_for(k)
        if b is not None and b > len(c.y_train):
            too_big.append((k, b, len(c.y_train)))
    if not too_big:
        return []
    k, b, n = max(too_big, key=lambda t: t[1] / max(t[2], 1))
    private = bool(getattr(config.algorithm, "private", True))
    effect = (
        "each noisy sum is divided by B although at most n records can be sampled, so the "
        f"updates shrink by at least B/n = {b / max(n, 1):.3g}x"
        if private
        else "the privacy-free baseline samples at rate min(1, B/n) = 1 (full batches)"
    )
    return [
        f"training.batch_size: B = {b:g} is larger than the training set of {len(too_big)} "
        f"silo(s) (e.g. silo {k} has n = {n}): {effect}; set B near the expected number of "
        "records sampled per step"
    ]
