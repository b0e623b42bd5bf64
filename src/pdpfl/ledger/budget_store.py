"""The budget store's files: every run that ever charged a dataset's units, sealed and locked.

A person's budget is for life: the store keeps, per dataset and per party that accounts its
units (a silo for records and clients, the coordinator for ULDP-FL's users), one entry per run
with everything needed to compose that run's mechanism again -- the mechanism description (as
the ledger files serialize it), the accountant, and per unit its id, budget, sampling rate q,
noise multiplier σ and charged rounds per observer. :mod:`pdpfl.ledger.lifetime` turns the
entries into each unit's lifetime ε (:mod:`pdpfl.privacy.lifetime`).

Layout (``ROOT`` = ``lifetime.store``, ``$PDPFL_BUDGET_DIR`` or ``$XDG_DATA_HOME/pdpfl/budgets``;
a Flower silo: its SuperNode's ``<state-dir>/budgets``)::

    ROOT/<party>/<dataset key>/index.sealed     the list of runs (JSON), generation g
    ROOT/<party>/<dataset key>/run-<run>.npz    one run's units and counts (sealed)
    ROOT/<party>/<dataset key>/.lock            held by the run that writes (flock)

Integrity (the ledgers' scheme, :mod:`pdpfl.integrity`): every file is sealed with the party's
key over the party, the dataset key, the run and the write's *generation*; the store's
high-water mark (in the key folder) holds the last generation written. Refused: an edited or
truncated file, a file sealed with another party's key, a store of another dataset (its index
names its key), a run file older than the index says (a rollback of one run) and an index older
than the mark (a rollback of the store, or a deleted store whose mark remains). Writes: the run
file first, then the index, then the mark -- a crash between them leaves a run file one
generation *ahead* of the index (or, for a new run, a run file the index does not list yet),
which is accepted: it can only over-count.

A **sealed search entry** (``meta["kind"] == "search"``, written by ``pdpfl tune`` before its
first trial) holds instead of a mechanism each unit's RDP curve of the whole private
hyper-parameter search per observer (``rdp_third_party``, ``rdp_server`` on ``orders``;
Papernot & Steinke 2022, Thm. 2/3) and ``meta["tail"]``, the probability per observer that the
capped search departs from the one the curves bound; it composes with the other entries by RDP
addition (:class:`pdpfl.privacy.lifetime.CurveCharges`).

Concurrency: a run holds the store's exclusive lock (``flock``) from before its first charge
until it ends; a second run on the same store waits ``wait_s`` seconds and is then refused with
the holder named. The kernel drops the lock of a killed process, so a stale lock never blocks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.integrity import IntegrityError, check_progress, record_progress, seal, unseal
from pdpfl.io import write_bytes

__all__ = [
    "FORMAT",
    "SEARCH_KIND",
    "STORE_ENV",
    "BudgetStore",
    "StoreBusy",
    "StoredRun",
    "dataset_fingerprint",
    "default_store_dir",
    "find_stores",
]

FORMAT = "pdpfl-budget-store/1"
#: Environment variable naming the default store folder.
STORE_ENV = "PDPFL_BUDGET_DIR"
_INDEX = "index.sealed"
_LOCK = ".lock"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_OBSERVER_KEYS = {"third-party": "third_party_rounds", "server": "server_rounds"}
_CURVE_KEYS = {"third-party": "rdp_third_party", "server": "rdp_server"}
#: ``meta["kind"]`` of a sealed search entry (per-unit RDP curves instead of a mechanism).
SEARCH_KIND = "search"


class StoreBusy(ValueError):
    """Another process is charging this store (a concurrent run on the same dataset)."""


def default_store_dir() -> Path:
    """``$PDPFL_BUDGET_DIR``, else ``$XDG_DATA_HOME/pdpfl/budgets``, else
    ``~/.local/share/pdpfl/budgets``."""
    env = os.environ.get(STORE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "pdpfl" / "budgets"


def dataset_fingerprint(ids: np.ndarray, *arrays: np.ndarray | None) -> str:
    """A content hash of a party's units: their ids and the data rows (``arrays``, one row per
    id, e.g. features and labels), taken in id order so the order of rows does not matter."""
    keys = np.asarray(ids)
    order = np.argsort(keys, kind="stable")
    h = hashlib.sha256(b"pdpfl-dataset/1")
    for arr in (keys, *arrays):
        if arr is None:
            h.update(b"|none")
            continue
        a = np.ascontiguousarray(np.asarray(arr)[order])
        if a.dtype.kind in "OU":
            a = np.ascontiguousarray(a.astype(str)).astype("U")
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


@dataclass
class StoredRun:
    """One run's entry: its public description and, per unit, what it charged.

    ``meta`` holds ``run``, ``started``, ``algorithm``, ``name``, ``unit``, ``private``,
    ``accountant``, ``mechanism`` (the ledger files' JSON description; None without DP),
    ``observers``, ``delta``, ``enforced`` (False: ``lifetime.allow_respend``) and ``orders``.
    """

    meta: dict[str, Any]
    ids: np.ndarray
    budgets: np.ndarray
    rates: np.ndarray
    noise_multipliers: np.ndarray
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    generation: int = 0
    #: A sealed search entry: per observer, each unit's RDP curve on :attr:`orders`.
    curves: dict[str, np.ndarray] = field(default_factory=dict)
    orders: np.ndarray | None = None

    @property
    def run_id(self) -> str:
        return str(self.meta["run"])

    @property
    def sealed_curves(self) -> bool:
        """Whether this entry is a sealed search (curves, no mechanism)."""
        return self.meta.get("kind") == SEARCH_KIND

    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {
            "meta": np.array(json.dumps(self.meta, sort_keys=True)),
            "ids": self.ids,
            "budgets": self.budgets,
            "rates": self.rates,
            "noise_multipliers": self.noise_multipliers,
        }
        for obs, c in self.counts.items():
            arrays[_OBSERVER_KEYS[obs]] = np.asarray(c, dtype=np.int64)
        if self.curves:
            if self.orders is None:
                raise ValueError("a sealed search entry needs its orders")
            arrays["orders"] = np.asarray(self.orders, dtype=np.float64)
            for obs, r in self.curves.items():
                arrays[_CURVE_KEYS[obs]] = np.asarray(r, dtype=np.float64)
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy stubs: **kwds
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, generation: int) -> StoredRun:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if not isinstance(meta, dict) or "run" not in meta:
                raise ValueError("the run entry has no description")
            ids = z["ids"]
            n = ids.size
            counts = {
                obs: z[key].astype(np.int64) for obs, key in _OBSERVER_KEYS.items() if key in z
            }
            curves = {
                obs: z[key].astype(np.float64) for obs, key in _CURVE_KEYS.items() if key in z
            }
            orders = z["orders"].astype(np.float64) if "orders" in z else None
            run = cls(
                meta,
                ids.astype(np.int64) if ids.dtype.kind in "iu" else ids.astype(str),
                z["budgets"].astype(np.float64),
                z["rates"].astype(np.float64),
                z["noise_multipliers"].astype(np.float64),
                counts,
                generation,
                curves,
                orders,
            )
        shapes = [run.budgets, run.rates, run.noise_multipliers, *counts.values()]
        if ids.ndim != 1 or any(a.shape != (n,) for a in shapes):
            raise ValueError("the run entry's arrays do not have one value per unit")
        if any(np.any(c < 0) for c in counts.values()):
            raise ValueError("the run entry has negative counts")
        if run.sealed_curves:
            if orders is None or orders.ndim != 1 or not curves:
                raise ValueError("the search entry has no curves or orders")
            if any(r.shape != (n, orders.size) or np.any(~(r >= 0)) for r in curves.values()):
                raise ValueError("the search entry's curves are malformed")
        return run


class BudgetStore:
    """The store of one party's units of one dataset (see the module docstring).

    ``BudgetStore(root, party, key).open(lock=True)`` reads and verifies every file and, with
    ``lock``, holds the exclusive lock until :meth:`close` (a context manager too). Without
    ``lock`` the store is read-only (``pdpfl privacy --store``).
    """

    def __init__(self, root: str | os.PathLike[str], party: str, key: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", party):
            raise ValueError(f"party: {party!r} is not a plain name")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", key) or key.startswith("."):
            raise ValueError(f"dataset key: {key!r} is not a plain name")
        self.root = Path(root).expanduser()
        self.party, self.key = party, key
        self.folder = self.root / party / key
        self.index: dict[str, Any] = {}
        self.runs: dict[str, StoredRun] = {}
        self.generation = 0
        self._fd: int | None = None
        self.writable = False

    # ------------------------------------------------------------------ identity
    @property
    def mark_id(self) -> str:
        """The store's high-water mark name (alphanumeric): per party, dataset and store folder
        (another folder is another store -- choosing one is the operator's decision)."""
        where = str(self.folder.resolve())
        return hashlib.sha256(f"budget-store/{where}".encode()).hexdigest()[:32]

    def _ident(self, what: str, generation: int) -> str:
        return f"{self.party}/{self.key}/{what}@{generation}"

    def __repr__(self) -> str:
        return f"BudgetStore({self.folder}, runs={len(self.runs)}, generation={self.generation})"

    # ------------------------------------------------------------------ lock
    def _lock(self, wait_s: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.folder / _LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + max(0.0, float(wait_s))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _holder(path)
                    os.close(fd)
                    raise StoreBusy(
                        f"lifetime.store: the budget store {self.folder} is being charged by "
                        f"{holder}; two runs on the same data cannot charge one store at once "
                        "(wait for it to finish)"
                    ) from None
                time.sleep(0.05)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        info["command"] = " ".join(sys.argv[:4])[:200]
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    def close(self) -> None:
        """Release the lock (the files stay)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        self.writable = False

    def __enter__(self) -> BudgetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def open(self, *, lock: bool = True, wait_s: float = 0.0) -> BudgetStore:
        """Read and verify the store (creating nothing but its folder); ``lock``: hold the
        exclusive lock for writing until :meth:`close`."""
        if lock:
            self._lock(wait_s)
        try:
            self._read()
        except BaseException:
            self.close()
            raise
        self.writable = lock
        return self

    def _unseal(self, path: Path, purpose: str) -> tuple[bytes, str, int]:
        what = f"budget store file {path}"
        payload, found = unseal(path.read_bytes(), purpose=purpose, party=self.party, what=what)
        base, _, gen = found.rpartition("@")
        prefix = f"{self.party}/{self.key}/"
        if not base.startswith(prefix) or not gen.isdigit():
            raise IntegrityError(
                f"{what}: it belongs to another dataset or party ({base}), not {prefix[:-1]}; "
                "refusing a foreign store"
            )
        return payload, base[len(prefix) :], int(gen)

    def _read(self) -> None:
        mark = check_progress(self.mark_id, None, self.party)
        index_path = self.folder / _INDEX
        if not index_path.exists():
            if mark > 0:
                raise IntegrityError(
                    f"budget store {self.folder}: its index is missing, but this store was "
                    f"written {mark} time(s): it was deleted or replaced; refusing to start "
                    "every unit's lifetime budget again"
                )
            self.index, self.runs, self.generation = self._empty_index(), {}, 0
            return
        payload, what, gen = self._unseal(index_path, "budget-store")
        if what != "index":
            raise IntegrityError(f"budget store file {index_path}: not the store's index")
        if gen < mark:
            raise IntegrityError(
                f"budget store {self.folder}: its index is at generation {gen} but the store "
                f"already wrote generation {mark}: an older copy was put back (it would forget "
                "charges); refusing it"
            )
        index = json.loads(payload.decode())
        if index.get("format") != FORMAT or index.get("key") != self.key:
            raise IntegrityError(
                f"budget store {self.folder}: not a {FORMAT} index of dataset {self.key}"
            )
        runs: dict[str, StoredRun] = {}
        top = gen
        for entry in index.get("runs", []):
            run_id, recorded = str(entry["run"]), int(entry["generation"])
            path = self.folder / f"run-{run_id}.npz"
            if not path.exists():
                raise IntegrityError(
                    f"budget store {self.folder}: run {run_id} is listed but its file {path.name} "
                    "is missing (deleted?); refusing to forget its charges"
                )
            data, found, run_gen = self._unseal(path, "budget-run")
            if found != f"run-{run_id}":
                raise IntegrityError(f"budget store file {path}: it holds another run ({found})")
            if run_gen < recorded:
                raise IntegrityError(
                    f"budget store file {path}: it is at generation {run_gen} but the index "
                    f"recorded {recorded}: an older copy of this run was put back"
                )
            try:
                runs[run_id] = StoredRun.from_bytes(data, run_gen)
            except (ValueError, KeyError, OSError) as err:
                raise IntegrityError(f"budget store file {path}: does not decode ({err})") from None
            top = max(top, run_gen)
        for path in sorted(self.folder.glob("run-*.npz")):
            run_id = path.stem[len("run-") :]
            if run_id in runs:
                continue
            # written, but the index write did not follow (a crash): a genuine charge (the seal
            # verifies) is kept -- the store never forgets what it recorded
            data, found, run_gen = self._unseal(path, "budget-run")
            if found != f"run-{run_id}":
                raise IntegrityError(f"budget store file {path}: it holds another run ({found})")
            try:
                runs[run_id] = StoredRun.from_bytes(data, run_gen)
            except (ValueError, KeyError, OSError) as err:
                raise IntegrityError(f"budget store file {path}: does not decode ({err})") from None
            index.setdefault("runs", []).append({"run": run_id, "generation": run_gen})
            top = max(top, run_gen)
        self.index, self.runs, self.generation = index, runs, top

    def _empty_index(self) -> dict[str, Any]:
        return {"format": FORMAT, "party": self.party, "key": self.key, "runs": []}

    # ------------------------------------------------------------------ writing
    def describe(self, **info: str | int | float | None) -> None:
        """Public facts about the dataset kept in the index (unit, name, size), on first use."""
        for k, v in info.items():
            self.index.setdefault(k, v)

    def put(self, run: StoredRun) -> None:
        """Write (or replace) ``run``'s entry: its file, then the index, then the mark."""
        if not self.writable:
            raise ValueError(f"budget store {self.folder}: opened read-only (not locked)")
        if not _RUN_ID.fullmatch(run.run_id):
            raise ValueError(f"run id: {run.run_id!r} is not a plain name")
        gen = self.generation + 1
        name = f"run-{run.run_id}"
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_bytes(
            self.folder / f"{name}.npz",
            seal(run.to_bytes(), purpose="budget-run", identity=self._ident(name, gen),
                 party=self.party),
        )  # fmt: skip
        run.generation = gen
        self.runs[run.run_id] = run
        entries = [e for e in self.index.get("runs", []) if e["run"] != run.run_id]
        entries.append({"run": run.run_id, "generation": gen, "started": run.meta.get("started")})
        self.index["runs"] = entries
        body = json.dumps(self.index, sort_keys=True).encode()
        write_bytes(
            self.folder / _INDEX,
            seal(body, purpose="budget-store", identity=self._ident("index", gen),
                 party=self.party),
        )  # fmt: skip
        self.generation = gen
        record_progress(self.mark_id, gen, self.party)


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("since", 0))))
    return f"pid {info.get('pid')} on {info.get('host')} since {since} ({info.get('command', '?')})"


def find_stores(path: str | os.PathLike[str]) -> list[tuple[Path, str, str]]:
    """``(root, party, key)`` of every store under ``path``: a store root, a party's folder or
    one store's folder."""
    p = Path(path).expanduser()
    if (p / _INDEX).is_file():
        return [(p.parent.parent, p.parent.name, p.name)]
    found = sorted(p.glob(f"*/{_INDEX}")) or sorted(p.glob(f"*/*/{_INDEX}"))
    out = []
    for index in found:
        store = index.parent
        depth = len(store.relative_to(p).parts)
        root = p.parent if depth == 1 else p
        out.append((root, store.parent.name, store.name))
    return out
