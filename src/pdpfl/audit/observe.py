"""What each observer sees, projected on the canaries' coordinates: the canaries' scores.

Two observers, as the ledgers account them (rPDP-FL §4: Type II third party, Type I server):

``third-party``
    sees the final global model only: canary i scores ``−(x_T − x_0)[j_i]``;
``server``
    sees every released update: under plain summation each silo's own contribution, so canary
    i scores ``−Σ_t Δ_{h_i,t}[j_i] / w_{h_i,t}`` over the rounds t its host h_i released in
    (w: the contribution's public weight; a canary unit hosted :data:`EVERYWHERE` sums over
    every silo's releases); under a summation protocol that hides individual
    updates (secure summation, private weighting) the server sees only each round's sum, so
    ``−Σ_t (Σ_h Δ_{h,t})[j_i]``.

The sign: a Dirac canary's gradient ``+C·e_j`` moves coordinate j *down* under gradient
descent, so a larger score means "more likely included". The releases are recorded by a thin
proxy around each silo (:class:`ReleaseTap`) that the in-process transport calls instead of the
silo; it forwards everything and keeps only the released values at the canaries' coordinates
(a discrete noise share decoded first: centred lift modulo 2^b, ÷γ, inverse rotation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdpfl.audit.canaries import EVERYWHERE
from pdpfl.fl.api import Contribution, Params, Scalars

__all__ = [
    "FlatIndex",
    "ReleaseLog",
    "ReleaseTap",
    "observer_rounds",
    "observer_scores",
    "sampled_gaussian_scores",
    "standardized_rounds",
    "standardized_scores",
]


class FlatIndex:
    """Reads flat coordinates of the concatenated parameters without concatenating them."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], coords: np.ndarray) -> None:
        sizes = [int(np.prod(s)) for s in shapes]
        self.total = sum(sizes)
        coords = np.asarray(coords, dtype=np.int64)
        if coords.size and (coords.min() < 0 or coords.max() >= self.total):
            raise ValueError(f"canary coordinates outside the {self.total} parameters")
        starts = np.cumsum([0, *sizes])
        self._parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        for k in range(len(sizes)):
            where = np.flatnonzero((coords >= starts[k]) & (coords < starts[k + 1]))
            if where.size:
                self._parts.append((k, where, coords[where] - starts[k]))
        self.size = int(coords.size)

    def read(self, params: Sequence[Any]) -> np.ndarray:
        out = np.zeros(self.size, dtype=np.float64)
        for k, where, local in self._parts:
            out[where] = np.asarray(params[k], dtype=np.float64).reshape(-1)[local]
        return out


@dataclass
class ReleaseLog:
    """Every release of every silo at the canaries' coordinates, by (round, silo), and every
    round's global model there (what third parties see)."""

    index: FlatIndex
    values: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    weights: dict[tuple[int, int], float] = field(default_factory=dict)
    models: dict[int, np.ndarray] = field(default_factory=dict)

    def record(self, round_index: int, silo: int, contribution: Contribution) -> None:
        key = (int(round_index), int(silo))
        self.values[key] = self.index.read(contribution.update)
        self.weights[key] = float(contribution.weight)

    def record_model(self, round_index: int, params: Params) -> None:
        """The global model after round ``round_index`` (the loop's ``save_model`` hook)."""
        self.models[int(round_index)] = self.index.read(params)

    def released(self, silo: int, rounds: int) -> np.ndarray:
        """Per round: whether ``silo`` released an update (took part)."""
        return np.array([(t, int(silo)) in self.values for t in range(rounds)], dtype=bool)


class ReleaseTap:
    """A silo as the transport sees it, recording what :meth:`fit` releases (forwards the
    rest: evaluation, privacy summary, state, participation coins)."""

    def __init__(self, silo: Any, client_id: int, log: ReleaseLog) -> None:
        self._silo = silo
        self._id = int(client_id)
        self._log = log

    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        contribution: Contribution = self._silo.fit(global_params, round_index, config)
        self._log.record(
            round_index, self._id, self._decoded(contribution, global_params, round_index)
        )
        return contribution

    def _decoded(
        self, contribution: Contribution, params: Params, round_index: int
    ) -> Contribution:
        """A discrete share (``share_encoding``: d' integers modulo 2^b) as the float values
        it encodes -- centred lift, ÷γ, inverse rotation, the model's shapes -- what the
        server reads off it on its own; a float release as it is."""
        encoding = getattr(self._silo, "share_encoding", None)
        if encoding is None:
            return contribution
        share = encoding.check_share(contribution.update[0], f"silo {self._id}")
        decoded = encoding.decode(share, params, round_index, weight=contribution.weight, count=1)
        return Contribution(update=decoded.total, weight=contribution.weight)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._silo, name)


def observer_scores(
    observer: str,
    *,
    hosts: np.ndarray,
    log: ReleaseLog,
    initial: Params,
    final: Params,
    hides_individual_updates: bool,
    release_sign: float = 1.0,
) -> np.ndarray:
    """Each canary's score for ``observer`` (higher = more likely included; module doc).

    ``release_sign``: −1 when the releases are gradients rather than model deltas (ULDP-SGD),
    whose canary coordinate goes *up* in each release."""
    if observer == "third-party":
        out: np.ndarray = -(log.index.read(final) - log.index.read(initial))
        return out
    if observer != "server":
        raise ValueError(f"observer: expected third-party or server, got {observer!r}")
    total = np.zeros(log.index.size, dtype=np.float64)
    if hides_individual_updates:  # the server sees each round's sum only
        for values in log.values.values():
            total += values
        return -release_sign * total
    hosts = np.asarray(hosts, dtype=np.int64)
    for key, values in log.values.items():
        weight = log.weights[key]
        mine = (hosts == key[1]) | (hosts == EVERYWHERE)
        total[mine] += values[mine] / (weight if weight > 0 else 1.0)
    return -release_sign * total


def observer_rounds(
    observer: str,
    *,
    hosts: np.ndarray,
    log: ReleaseLog,
    initial: Params,
    rounds: int,
    hides_individual_updates: bool,
    release_sign: float = 1.0,
) -> np.ndarray:
    """``(rounds, n)``: what ``observer`` sees of each canary round by round, signed so that a
    canary's contribution is positive -- the terms whose sum is :func:`observer_scores`.

    third party: −(x_{t+1} − x_t)[j] from every round's global model (the sequence of global
    models it sees); server: −Δ_{h,t}[j] / w_{h,t} of the canary's host (every silo for
    :data:`EVERYWHERE`; each round's sum under a protocol that hides individual updates), 0 in
    rounds the host did not release."""
    n = log.index.size
    out = np.zeros((rounds, n), dtype=np.float64)
    if observer == "third-party":
        previous = log.index.read(initial)
        for t in range(rounds):
            current = log.models.get(t)
            if current is None:  # a round without a model (it diverged): nothing seen
                continue
            out[t] = -(current - previous)
            previous = current
        return out
    if observer != "server":
        raise ValueError(f"observer: expected third-party or server, got {observer!r}")
    hosts = np.asarray(hosts, dtype=np.int64)
    for (t, silo), values in log.values.items():
        if t >= rounds:
            continue
        if hides_individual_updates:
            out[t] += values
            continue
        weight = log.weights[(t, silo)]
        mine = (hosts == silo) | (hosts == EVERYWHERE)
        out[t, mine] += values[mine] / (weight if weight > 0 else 1.0)
    return -release_sign * out


#: Fewer control canaries of one host than this: that round's scale uses every control canary.
MIN_CONTROLS = 20


def standardized_rounds(
    per_round: np.ndarray, hosts: np.ndarray, control: np.ndarray
) -> np.ndarray:
    """``(rounds, n)``: z_{t,i}, each round's values divided by that round's noise scale,
    estimated as the standard deviation of the never-trained control canaries' values (of the
    same host, when it has at least :data:`MIN_CONTROLS` of them). A canary contributes the
    same multiple of its round's noise whatever the round's clip bound or learning rate
    (IDP-FedAvg's adaptive clipping); rounds without noise (a host that did not release) are 0.
    The control group's coins and values are independent of every audited group's, so the
    scale is not tuned on the data a group is tested on."""
    values = np.asarray(per_round, dtype=np.float64)
    hosts = np.asarray(hosts, dtype=np.int64)
    control = np.asarray(control, dtype=bool)
    rounds, n = values.shape
    scale = np.zeros((rounds, n), dtype=np.float64)
    everywhere = values[:, control]
    overall = everywhere.std(axis=1, ddof=1) if everywhere.shape[1] > 1 else np.zeros(rounds)
    scale[:] = overall[:, None]
    for h in np.unique(hosts):
        mine = hosts == h
        ref = mine & control
        if ref.sum() >= MIN_CONTROLS:
            scale[:, mine] = values[:, ref].std(axis=1, ddof=1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, values / scale, 0.0)


def standardized_scores(
    per_round: np.ndarray, hosts: np.ndarray, control: np.ndarray
) -> np.ndarray:
    """Σ_t z_{t,i} (:func:`standardized_rounds`): every round weighted as the Gaussian
    likelihood ratio weighs it when the canary is in every round (without scale changes, the
    plain sum)."""
    out: np.ndarray = standardized_rounds(per_round, hosts, control).sum(axis=0)
    return out


def sampled_gaussian_scores(z: np.ndarray, rates: np.ndarray, signal: float) -> np.ndarray:
    """The exact log-likelihood ratio ("in" against "out") of a canary that each round is
    sampled by its own coin of rate q_i and then adds ``signal`` = μ (its clipped contribution
    in units of the round's noise) to its standardized value z_t ~ N(μ·coin, 1):

        s_i = Σ_t log(1 − q_i + q_i·exp(μ z_{t,i} − μ²/2))

    (Neyman–Pearson: no score of one canary's rounds ranks canaries better; the ideal
    canaries of :mod:`pdpfl.audit.ceiling` are scored the same way). With q = 1 this is
    μ·Σ_t z − Tμ²/2, the linear score's order; q = 0 scores 0. The rates are public (the
    algorithm's own ε → q map), so the score is a function of the observations alone, as the
    one-run theorem needs (any score gives a valid bound; this one the most power)."""
    zz = np.asarray(z, dtype=np.float64)
    q = np.asarray(rates, dtype=np.float64)
    mu = float(signal)
    if not (math.isfinite(mu) and mu > 0):
        raise ValueError(f"signal: must be a finite number > 0, got {signal!r}")
    if q.shape != zz.shape[1:] or np.any((q < 0) | (q > 1)):
        raise ValueError("rates: one rate in [0, 1] per canary")
    with np.errstate(divide="ignore"):
        stay = np.log1p(-q)  # −inf at q = 1
        take = np.log(q)  # −inf at q = 0
    terms = np.logaddexp(stay[None, :], take[None, :] + mu * zz - 0.5 * mu * mu)
    out: np.ndarray = np.where(q[None, :] > 0, terms, 0.0).sum(axis=0)
    return out
