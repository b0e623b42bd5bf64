"""Each client's own ε: privacy groups with ratios, or one ε per client from a file.

IDP-FedAvg's privacy unit is a whole client (Lange et al., §III): client i chooses ε_i, in the
paper from privacy groups (ε = 1 / 2 / 3 for 54 / 37 / 9 % of the clients, §V), ``inf`` for a
non-private client. The assignment is part of the simulated data (the clients' choices), so it
is a pure function of the configuration:

* ``assignment: iid`` -- client i draws its group with the ratios from
  ``numpy_generator(seed, "idp-budgets", i)`` (flidp draws i.i.d., unseeded);
* ``assignment: exact`` -- round(ratio · N) budgets (largest remainder), dealt in a seeded
  random order;
* ``budget_file`` -- one ε per client (``.csv``/``.txt`` one per line, ``.json`` list, ``.npy``).

In the central variant the server needs every client's group to sample it at q_{g(i)}
(Algorithm 2, line 4); each client computes only its own entry (:func:`client_budget`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from pdpfl.budgets.files import is_number
from pdpfl.seeding import numpy_generator

__all__ = [
    "GroupAssignment",
    "assign_client_budgets",
    "client_budget",
    "label_of",
    "read_budget_file",
]


class GroupAssignment(Protocol):
    """The fields of the ``idp-fedavg`` config section that decide the clients' budgets."""

    @property
    def group_budgets(self) -> Sequence[float]: ...
    @property
    def group_ratios(self) -> Sequence[float]: ...
    @property
    def budget_file(self) -> str | None: ...
    @property
    def assignment(self) -> str: ...


def label_of(budget: float) -> str:
    """The report label of a privacy group (``"1"``, ``"0.6"``, ``"inf"``)."""
    return "inf" if math.isinf(budget) else f"{budget:g}"


def _largest_remainder(total: int, ratios: np.ndarray) -> np.ndarray:
    ideal = total * ratios / ratios.sum()
    counts: np.ndarray = np.floor(ideal).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.argsort(-(ideal - counts), kind="stable")
    counts[order[:rest]] += 1
    return counts


def read_budget_file(path: str | Path) -> np.ndarray:
    """ε per client from ``.npy``, ``.json`` (a list) or text/CSV (one number per line; ``inf``
    allowed, an optional header line is skipped). No pickle."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"algorithm.budget_file: {p} does not exist")
    try:
        if p.suffix.lower() == ".npy":
            values = np.load(p, allow_pickle=False)
        elif p.suffix.lower() == ".json":
            values = np.asarray(json.loads(p.read_text()), dtype=np.float64)
        else:
            lines = [ln.split(",")[0].strip() for ln in p.read_text().splitlines()]
            lines = [ln for ln in lines if ln]
            if lines and not is_number(lines[0]):
                lines = lines[1:]
            values = np.asarray([float(v) for v in lines], dtype=np.float64)
    except (ValueError, OSError, TypeError) as exc:
        raise ValueError(
            f"algorithm.budget_file: {p.name} is not a list of numbers ({exc})"
        ) from None
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0 or np.isnan(values).any() or (values <= 0).any():
        raise ValueError(f"algorithm.budget_file: {p.name} needs one ε > 0 per client (inf ok)")
    return values


def _ratios(algo: GroupAssignment) -> tuple[np.ndarray, np.ndarray]:
    budgets = np.asarray(algo.group_budgets, dtype=np.float64)
    ratios = np.asarray(algo.group_ratios, dtype=np.float64)
    return budgets, ratios / ratios.sum()


@lru_cache(maxsize=8)
def _exact_assignment(
    budgets: tuple[float, ...], ratios: tuple[float, ...], seed: int, n: int
) -> np.ndarray:
    """The ``exact`` deal (a pure function of public numbers; read-only result)."""
    counts = _largest_remainder(n, np.asarray(ratios))
    values = np.repeat(np.asarray(budgets), counts)
    out = values[numpy_generator(seed, "idp-budgets").permutation(n)]
    out.setflags(write=False)
    return out


@lru_cache(maxsize=8)
def _file_budgets(path: str, mtime_ns: int, size: int) -> np.ndarray:
    """The budget file's values, read once per version of the file (read-only result)."""
    out = read_budget_file(path)
    out.setflags(write=False)
    return out


def _iid_budget(budgets: np.ndarray, ratios: np.ndarray, seed: int, i: int) -> float:
    cum = np.cumsum(ratios)
    cum[-1] = 1.0
    u = numpy_generator(seed, "idp-budgets", int(i)).random()
    return float(budgets[min(int(np.searchsorted(cum, u, side="right")), len(budgets) - 1)])


def client_budget(algo: GroupAssignment, seed: int, num_clients: int, client_id: int) -> float:
    """ε of one client, computed where it is needed (see :func:`assign_client_budgets`)."""
    n, i = int(num_clients), int(client_id)
    if not 0 <= i < n:
        raise ValueError(f"client_id: must be in [0, {n}), got {client_id}")
    if algo.budget_file is not None or algo.assignment == "exact":
        return float(assign_client_budgets(algo, seed, n)[i])
    budgets, ratios = _ratios(algo)
    return _iid_budget(budgets, ratios, seed, i)


def assign_client_budgets(algo: GroupAssignment, seed: int, num_clients: int) -> np.ndarray:
    """ε of every client (``inf`` = non-private): from ``budget_file`` or the privacy groups.

    A pure function of the configuration (the clients' privacy choices are part of the simulated
    data): ``iid`` draws client i's group from ``numpy_generator(seed, "idp-budgets", i)``
    (flidp draws i.i.d., unseeded); ``exact`` deals round(ratio·N) budgets (largest remainder)
    in a seeded random order. In the central variant the server needs these memberships to
    sample clients at q_{g(i)} (as in the paper); each client computes only its own entry
    (:func:`client_budget`).
    """
    n = int(num_clients)
    if algo.budget_file is not None:
        path = Path(algo.budget_file)
        if not path.is_file():
            raise ValueError(f"algorithm.budget_file: {path} does not exist")
        stat = path.stat()
        values = _file_budgets(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        if values.size != n:
            raise ValueError(
                f"algorithm.budget_file: {values.size} budgets for {n} clients (one per client)"
            )
        return values.copy()
    budgets, ratios = _ratios(algo)
    if algo.assignment == "exact":
        return _exact_assignment(
            tuple(budgets.tolist()), tuple(ratios.tolist()), int(seed), n
        ).copy()
    return np.array([_iid_budget(budgets, ratios, seed, i) for i in range(n)])
