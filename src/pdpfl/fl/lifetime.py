"""Which budget store each party charges, and opening them for a run (before any release).

A person's budget is for life (:mod:`pdpfl.ledger.lifetime`). This module connects a run's
parties to their stores:

* :func:`set_targets` (called by :meth:`pdpfl.fl.algorithm.Algorithm.assemble`, so the
  simulator, ``pdpfl compare``, ``pdpfl reproduce``, an audit and any search that runs trials
  through the simulator all get it) marks every silo that keeps a ledger with its store: party
  ``silo-<i>``, keyed by a fingerprint of the silo's training data and unit ids; the
  coordinator's user ledger (ULDP-FL), which holds no data, is keyed by the public data
  description. A Flower silo is marked by its own process (:func:`silo_target`), with the store
  in its SuperNode's state folder.
* :func:`open_lifetime` (called by the round loop once the checkpoint, if any, is restored, and
  before round 1's first charge) opens and locks each marked store, attaches it to the ledger
  and writes the run's entry. An algorithm whose units cannot sit out a round (no per-unit
  pre-check, or no DP at all) is **refused** when some unit's lifetime budget would be
  exceeded by this run -- naming how many -- unless ``lifetime.allow_respend``; an algorithm
  with the pre-check runs, and the units without lifetime budget left sit out (counted in the
  warnings and the summary).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.ledger import PrivacyLedger, observers_of
from pdpfl.ledger.budget_store import BudgetStore, StoredRun, dataset_fingerprint
from pdpfl.ledger.budget_store import default_store_dir as _default_dir
from pdpfl.ledger.describe import mechanism_to_dict
from pdpfl.ledger.lifetime import LifetimeAccount, LifetimeOptions, LifetimeTarget

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.fl.api import ClientAlgorithm, ServerAlgorithm, Transport
    from pdpfl.fl.pool import SiloPool

__all__ = [
    "TARGET_ATTR",
    "LifetimeExceeded",
    "LifetimeSession",
    "lifetime_options",
    "open_lifetime",
    "pool_target",
    "run_holders",
    "server_target",
    "set_targets",
    "silo_target",
]

#: The attribute of a silo or server object naming its store (set at build time).
TARGET_ATTR = "lifetime_target"


class LifetimeExceeded(ValueError):
    """This run would take some units over their lifetime budget and cannot stop them."""


def lifetime_options(config: ExperimentConfig, root: str | Path | None = None) -> LifetimeOptions:
    """The config's ``lifetime`` section (``root`` overrides the store folder, e.g. a Flower
    silo's own)."""
    section = getattr(config, "lifetime", None)
    folder = root or getattr(section, "store", None) or _default_dir()
    return LifetimeOptions(
        root=Path(str(folder)).expanduser(),
        allow_respend=bool(getattr(section, "allow_respend", False)),
        wait_s=float(getattr(section, "wait_s", 0.0) or 0.0),
    )


def _description(config: ExperimentConfig, **extra: object) -> dict[str, object]:
    algorithm = getattr(config, "algorithm", None)
    return {
        "algorithm": str(getattr(algorithm, "name", "?")),
        "name": str(getattr(config, "name", "")),
        "private": bool(getattr(type(algorithm), "private", True)),
        **extra,
    }


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def silo_target(
    config: ExperimentConfig,
    silo: int,
    data: ClientData,
    *,
    root: str | Path | None = None,
    allow_respend: bool | None = None,
) -> LifetimeTarget:
    """The store of silo ``silo``: keyed by its training data and record (and user) ids.
    ``allow_respend`` overrides the config's (a Flower silo decides for itself)."""
    ids = np.asarray(data.record_ids)
    fp = dataset_fingerprint(ids, data.x_train, data.y_train, getattr(data, "user_ids", None))
    options = lifetime_options(config, root)
    if allow_respend is not None:
        options = replace(options, allow_respend=bool(allow_respend))
    return LifetimeTarget(
        options,
        f"silo-{int(silo)}",
        fp,
        _description(config, silo=int(silo), silo_name=str(getattr(data, "name", "")), ids=ids),
    )


def server_target(
    config: ExperimentConfig, units: int, *, root: str | Path | None = None
) -> LifetimeTarget:
    """The coordinator's store (ULDP-FL's users): it holds no data, so the key is the public
    data description (dataset, options, partition, seed) and the number of users."""
    data = config.data.model_dump(mode="json")
    data.pop("data_dir", None)
    key = _key("server-units", data, int(config.seed), int(units))
    ids = np.arange(int(units), dtype=np.int64)
    return LifetimeTarget(
        lifetime_options(config, root), "server", key, _description(config, ids=ids)
    )


def pool_target(config: ExperimentConfig, federation: Federation) -> LifetimeTarget:
    """The store of a :class:`~pdpfl.fl.pool.SiloPool`'s one client ledger (party ``clients``):
    keyed by every client's training data and name (each client's own content hash, hashed in
    id order); its units are the clients, by name."""
    names = np.array([str(getattr(c, "name", i)) for i, c in enumerate(federation.clients)])
    parts = [
        dataset_fingerprint(np.asarray(c.record_ids), c.x_train, c.y_train)
        for c in federation.clients
    ]
    key = dataset_fingerprint(names, np.array(parts))
    return LifetimeTarget(
        lifetime_options(config), "clients", key, _description(config, silos=len(names), ids=names)
    )


def set_targets(
    config: ExperimentConfig,
    federation: Federation,
    server: ServerAlgorithm,
    clients: dict[int, ClientAlgorithm] | SiloPool,
) -> None:
    """Mark the parties of an in-process run with their stores (see the module docstring);
    ``clients``: the ``{client id: silo}`` dictionary, or a :class:`~pdpfl.fl.pool.SiloPool`
    (its one ledger gets one store, :func:`pool_target`)."""
    private = bool(getattr(type(config.algorithm), "private", True))
    if not isinstance(clients, dict):  # a pool: one ledger for every client
        if isinstance(getattr(clients, "ledger", None), PrivacyLedger) or not private:
            setattr(clients, TARGET_ATTR, pool_target(config, federation))
        clients = {}
    for i, client in clients.items():
        if isinstance(getattr(client, "ledger", None), PrivacyLedger) or not private:
            setattr(client, TARGET_ATTR, silo_target(config, i, federation.clients[int(i)]))
    ledger = getattr(server, "ledger", None)
    units = (
        ledger.n if isinstance(ledger, PrivacyLedger) else np.size(getattr(server, "budgets", []))
    )
    if isinstance(ledger, PrivacyLedger) or (not private and units):
        setattr(server, TARGET_ATTR, server_target(config, int(units)))


def _filters(holder: object) -> bool:
    """Whether the holder's units sit out a round that would exceed their budget (every silo
    of the template; a server that says so, e.g. ULDP-FL with personal budgets)."""
    return bool(getattr(holder, "enforces_budgets", False))


def run_holders(server: ServerAlgorithm, transport: Transport) -> list[object]:
    """The parties of a run this process holds: the in-process silos and the server."""
    clients = getattr(transport, "clients", None)
    pool = getattr(transport, "pool", None)
    silos = list(clients.values()) if isinstance(clients, dict) else []
    return [*silos, *([pool] if pool is not None else []), server]


@dataclass
class LifetimeSession:
    """The stores a run holds open (locked) from before its first charge until it ends."""

    accounts: list[LifetimeAccount] = field(default_factory=list)
    stores: list[BudgetStore] = field(default_factory=list)
    respend: bool = False
    #: (unit, units without lifetime budget for one more round, usable units, parties).
    blocked: dict[str, list[int]] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        out = []
        for unit, (blocked, usable, parties) in self.blocked.items():
            if not blocked:
                continue
            where = f" ({parties} parties)" if parties > 1 else ""
            every = " -- all of them: this run trains on noise only" if blocked == usable else ""
            out.append(
                f"lifetime: {blocked} of {usable} {unit}(s){where} have no lifetime budget left "
                f"for one more round (earlier runs on this data spent it): they sit out{every}"
            )
        return out

    def close(self) -> None:
        for account in self.accounts:
            account.closed = True
        for store in self.stores:
            store.close()

    def report(self) -> dict[str, Any] | None:
        """``summary["lifetime"]`` of this view (None: no store was charged here)."""
        if not self.stores:
            return None
        return {
            "enforced": not self.respend,
            "stores": [
                {"store": str(s.folder), "party": s.party, "dataset": s.key} for s in self.stores
            ],
            "earlier_runs": max((a.prior_runs for a in self.accounts), default=0),
            "warnings": list(self.warnings),
        }


def _meta(target: LifetimeTarget, run_id: str, ledger: PrivacyLedger | None) -> dict[str, Any]:
    desc = {k: v for k, v in target.description.items() if k != "ids"}
    meta: dict[str, Any] = {
        **desc,
        "run": run_id,
        "started": time.time(),
        "enforced": not target.options.allow_respend,
    }
    if ledger is not None:
        meta.update(
            mechanism=mechanism_to_dict(ledger.mechanism),
            observers=list(ledger.observers),
            delta=float(ledger.mechanism.delta),
            unit=ledger.unit,
        )
    else:
        meta.update(private=False, mechanism=None, observers=["third-party", "server"])
    return meta


def open_lifetime(holders: list[Any], run_id: str, remaining_rounds: int) -> LifetimeSession:
    """Open, lock and attach the store of every marked holder (module docstring); raises
    :class:`LifetimeExceeded` (nothing charged) for a run that would overspend and cannot stop
    its units, :class:`~pdpfl.ledger.budget_store.StoreBusy` when another run holds a store."""
    session = LifetimeSession()
    writes: list[Callable[[], None]] = []
    try:
        for holder in holders:  # every store opened and checked first: a refusal charges none
            target = getattr(holder, TARGET_ATTR, None)
            if not isinstance(target, LifetimeTarget):
                continue
            writes.append(_open_one(session, holder, target, run_id, int(remaining_rounds)))
        for write in writes:  # then the run enters every store, before anything is released
            write()
    except BaseException:
        session.close()
        raise
    return session


def _open_one(
    session: LifetimeSession, holder: object, target: LifetimeTarget, run_id: str, remaining: int
) -> Callable[[], None]:
    """Open and check one holder's store; returns the write that enters the run there."""
    store = target.store().open(lock=True, wait_s=target.options.wait_s)
    session.stores.append(store)
    enforce = not target.options.allow_respend
    session.respend |= not enforce
    ledger = getattr(holder, "ledger", None)
    store.describe(party=target.party, silo_name=target.description.get("silo_name"))
    if not isinstance(ledger, PrivacyLedger):  # no DP: every unit it trains on spends ε = ∞
        ids = np.asarray(target.description.get("ids", np.zeros(0, np.int64)))
        if enforce and ids.size:
            raise LifetimeExceeded(
                f"lifetime: algorithm {target.description.get('algorithm')!r} trains without "
                f"differential privacy: all {ids.size} units of {target.party} would spend ε = ∞ "
                f"of their lifetime budget (budget store {store.folder}); set "
                "lifetime.allow_respend: true to run it on public or synthetic data"
            )
        budgets = np.asarray(getattr(holder, "budgets", []), dtype=np.float64).reshape(-1)
        if budgets.shape != ids.shape:
            budgets = np.full(ids.size, np.nan)
        ones = np.ones(ids.size, np.int64)
        entry = StoredRun(
            _meta(target, run_id, None),
            ids,
            budgets,
            np.ones(ids.size),
            np.ones(ids.size),
            {"third-party": ones, "server": ones},
        )
        return lambda: store.put(entry)
    meta = _meta(target, run_id, ledger)
    account = LifetimeAccount.attach(ledger, store, meta, enforce=enforce, write=False)
    session.accounts.append(account)
    if enforce:
        _check(session, holder, ledger, store, remaining, bool(account.prior_units.any()))
    return lambda: account.charge(ledger)


def _check(
    session: LifetimeSession,
    holder: object,
    ledger: PrivacyLedger,
    store: BudgetStore,
    remaining: int,
    prior: bool,
) -> None:
    """Units whose lifetime budget this run would exceed: a warning (they sit out) or, for an
    algorithm that cannot stop them, the refusal."""
    usable = ledger.rates > 0
    unit = ledger.unit
    view = str(getattr(holder, "adversary", "both"))
    if not any(o in ledger.observers for o in observers_of(view)):
        view = "both"
    if _filters(holder):
        blocked = usable & prior & (ledger.lifetime_spent(view, extra=1) > ledger.budgets)
        counts = session.blocked.setdefault(unit, [0, 0, 0])
        counts[0] += int(blocked.sum())
        counts[1] += int(usable.sum())
        counts[2] += 1
        return
    if not prior:
        return
    over = usable & (ledger.lifetime_spent("both", extra=max(remaining, 1)) > ledger.budgets)
    if over.any():
        raise LifetimeExceeded(
            f"lifetime: {int(over.sum())} of {ledger.n} {unit}(s) would exceed their lifetime "
            f"budget in this run (earlier runs on this data are in the budget store "
            f"{store.folder}), and this algorithm cannot make them sit out; set "
            "lifetime.allow_respend: true to run anyway on public or "
            "synthetic data"
        )
