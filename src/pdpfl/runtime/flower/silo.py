"""The silo side of the pdpfl Flower apps: one silo's algorithm, protocol memory and state files.

A :class:`Silo` is what the ClientApp works with when a message for silo *i* of run *key*
arrives: the silo's :class:`~pdpfl.fl.api.ClientAlgorithm` (built from the silo's own data and
the server's public setup), the private ``memory`` of multi-stage protocols, and the silo's
state folder ``<state-dir>/run-<key>/``.

Where the silo lives between messages
-------------------------------------
* **Warm worker** (:mod:`pdpfl.runtime.flower.worker`, the default): the process survives
  between messages, so :data:`HOST` keeps each silo in memory -- torch, its data, model, ledger,
  secret randomness and protocol memory. Nothing is rebuilt per message.
* **Per-message process** (Flower's stock ``flower-superexec``, ``mode="per-message"``): every
  message starts a fresh process, which rebuilds the silo from its data and its state file, and
  reloads the protocol memory from the silo's state folder. Its secret randomness is drawn
  afresh in every process.

In both modes the silo's state file, its records' ledger and its own privacy summary are written
to the silo's disk (atomically) after every message and *before* the reply leaves: an update is
never released before its charge is on disk.

Protocol memory
---------------
* The memory of a protocol registered with ``secret_memory=True`` (secure aggregation: X25519
  keys, mask seeds, shares, the contribution being masked) is **never written to disk**: it
  lives in the warm worker's memory and dies with it (a restarted silo draws new keys in the
  next round). Such a protocol cannot run in the per-message mode: the stage handler refuses
  with an error naming the fix (use the warm worker).
* The protocols' public memory (``memory["public"]``: e.g. the rounds a silo has masked, so that
  a resumed round is never masked twice) is written with the silo's state in both modes
  (``protocol-public-silo-<i>.npz``).
* Any other protocol memory is written to disk only in the per-message mode (a fresh process
  has no other place to keep it): ``protocol-memory-silo-<i>.npz``.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.fl.aggregation import PUBLIC_MEMORY, holds_secrets
from pdpfl.fl.api import ClientAlgorithm, PrivacyBoundaryError
from pdpfl.io import decode_state, encode_state, write_bytes, write_json
from pdpfl.runtime.flower.codec import decode_config
from pdpfl.runtime.flower.hooks import (
    CONFIG_HASH_KEY,
    DEFAULT_HOOKS,
    HOOKS_KEY,
    PARTITION_ID,
    STATE_DIR,
    WARM_ENV,
    AppHooks,
    config_digest,
    load_hooks,
)

__all__ = ["HOST", "Silo", "SiloHost", "decode_memory", "encode_memory", "silo_folder"]

#: Silos kept in memory by one worker (the oldest run's silos are dropped first).
MAX_SILOS = 64
#: Releases a silo remembers (a resumed run re-asks at most the rounds after its checkpoint:
#: the interrupted round and the one announced with it).
MAX_RELEASES = 3


def release_key(round_index: int, params: list[np.ndarray], config: Mapping[str, Any]) -> str:
    """What identifies a training request: round, global parameters (bytes), round config."""
    import hashlib

    h = hashlib.sha256(f"{int(round_index)}|".encode())
    for p in params:
        a = np.ascontiguousarray(p)
        h.update(f"{a.dtype.str}{a.shape}|".encode())
        h.update(a.tobytes())
    h.update(json.dumps(dict(config), sort_keys=True, default=str).encode())
    return h.hexdigest()


def is_warm() -> bool:
    """True inside a warm worker (silos stay in memory between messages)."""
    return os.environ.get(WARM_ENV) == "1"


def silo_folder(node_config: Mapping[str, Any], run_key: str) -> Path:
    """``<state-dir>/run-<key>``: the silo's own folder for one run."""
    root = node_config.get(STATE_DIR) or Path.home() / ".pdpfl" / "silo-state"
    return Path(str(root)).expanduser() / f"run-{run_key}"


# ------------------------------------------------------------------- protocol memory on disk


def _to_storable(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray):
        return {"__bytes__": np.frombuffer(bytes(obj), dtype=np.uint8).copy()}
    if isinstance(obj, dict):
        return {k: _to_storable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_to_storable(v) for v in obj]
    return obj


def _from_storable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__bytes__"} and isinstance(obj["__bytes__"], np.ndarray):
            return obj["__bytes__"].tobytes()
        return {k: _from_storable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_storable(v) for v in obj]
    return obj


def encode_memory(memory: dict[str, Any]) -> bytes:
    """A protocol's silo memory as a pickle-free ``.npz`` (arrays, bytes, scalars, nesting)."""
    try:
        return encode_state(_to_storable(memory))
    except TypeError as err:
        raise TypeError(
            f"protocol memory: {err}; in per-message mode the memory must hold only arrays, "
            "bytes and scalars (use the warm worker to keep other objects in memory)"
        ) from None


def decode_memory(data: bytes) -> dict[str, Any]:
    return _from_storable(decode_state(data))


# ------------------------------------------------------------------------------ one silo


@dataclass
class Silo:
    """Silo ``silo`` of run ``run_key`` as seen by this process."""

    hooks: AppHooks
    config: Any
    silo: int
    node_config: dict[str, Any]
    run_key: str
    folder: Path
    client: ClientAlgorithm | None = None
    public_json: str | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    #: The last releases (key, update, weight, metrics): a repeated request gets the same answer.
    releases: list[dict[str, Any]] = field(default_factory=list)
    messages: int = 0
    build_s: float = 0.0

    @property
    def state_path(self) -> Path:
        return self.folder / f"silo-{self.silo}.npz"

    @property
    def memory_path(self) -> Path:
        return self.folder / f"protocol-memory-silo-{self.silo}.npz"

    @property
    def public_memory_path(self) -> Path:
        return self.folder / f"protocol-public-silo-{self.silo}.npz"

    @property
    def releases_path(self) -> Path:
        return self.folder / f"releases-silo-{self.silo}.npz"

    def cached_release(self, key: str) -> Any:
        """The contribution this silo already released for the same request, or None.

        A resumed run asks again for the rounds after its checkpoint. Answering with the very
        same release is post-processing of an output already charged to the silo's ledger: no
        new noise is drawn, nothing is charged twice, and the resumed run equals an
        uninterrupted one.
        """
        from pdpfl.fl.api import Contribution

        for entry in self.releases:
            if entry["key"] == key:
                return Contribution(
                    update=[np.asarray(u) for u in entry["update"]],
                    weight=float(entry["weight"]),
                    metrics={str(k): float(v) for k, v in entry["metrics"].items()},
                )
        return None

    def remember_release(self, key: str, contribution: Any) -> None:
        """Keep ``contribution`` (written to disk with the state, before the reply leaves)."""
        self.releases.append(
            {
                "key": key,
                "update": [np.asarray(u) for u in contribution.update],
                "weight": float(contribution.weight),
                "metrics": {str(k): float(v) for k, v in contribution.metrics.items()},
            }
        )
        del self.releases[:-MAX_RELEASES]

    def has_state(self) -> bool:
        return self.state_path.exists()

    def threads(self) -> Any:
        """Torch's thread count while this silo computes (``config.threads``)."""
        threads = getattr(self.config, "threads", None)
        if threads is None:
            return nullcontext()
        from pdpfl.runtime.simulation import torch_threads

        return torch_threads(threads)

    def ensure_client(self, public_json: str) -> ClientAlgorithm:
        """The silo's algorithm: built once per process (from its data and state file)."""
        if self.client is not None:
            if public_json != self.public_json:
                raise PrivacyBoundaryError(
                    f"silo {self.silo}: run {self.run_key} changed its public setup mid-run"
                )
            self.build_s = 0.0
            return self.client
        t0 = time.perf_counter()
        public = json.loads(public_json)
        client = self.hooks.build_client(self.config, self.silo, self.node_config, public)
        if self.state_path.exists():
            client.load_state_dict(decode_state(self.state_path.read_bytes()))
        if not is_warm() and self.memory_path.exists():
            self.memory = decode_memory(self.memory_path.read_bytes())
        if self.public_memory_path.exists():
            self.memory[PUBLIC_MEMORY] = decode_memory(self.public_memory_path.read_bytes())
        if self.releases_path.exists():
            self.releases = list(decode_state(self.releases_path.read_bytes()))
        self.client, self.public_json = client, public_json
        self.build_s = time.perf_counter() - t0
        return client

    def save(
        self,
        action: str,
        round_index: int,
        compute_s: float,
        process_age_s: Any,
        *,
        persist: bool = True,
    ) -> None:
        """Write the silo's state, ledger and own privacy summary (before the reply leaves).

        Also appends this message's timings to ``timings-silo-<i>.jsonl`` (silo-local).
        ``persist=False`` records the timings only: for a part of a message whose reply is
        preceded by another ``save`` (the evaluation inside a training request).
        """
        client = self.client
        if client is None:
            return
        t0 = time.perf_counter()
        if persist:
            self._persist(client)
        self.messages += 1
        timing = {
            "action": action,
            "round": int(round_index),
            "warm": is_warm(),
            "message": self.messages,
            "process_age_s": process_age_s,
            "build_s": round(self.build_s, 4),
            "compute_s": round(compute_s, 4),
            "save_s": round(time.perf_counter() - t0, 4),
        }
        with (self.folder / f"timings-silo-{self.silo}.jsonl").open("a") as fh:
            fh.write(json.dumps(timing) + "\n")

    def _persist(self, client: Any) -> None:
        from pdpfl.ledger import PrivacyLedger, PrivacySummary, save_ledger
        from pdpfl.runtime.loop import _finite

        write_bytes(self.state_path, encode_state(client.state_dict()))
        ledger = getattr(client, "ledger", None)
        if isinstance(ledger, PrivacyLedger):
            save_ledger(ledger, self.folder / f"ledger-silo-{self.silo}.npz")
        # The silo's own privacy report: stays on this disk (never in a reply).
        report = client.privacy_summary()
        if isinstance(report, PrivacySummary):
            report = report.to_dict()
        if report is not None:
            write_json(self.folder / f"privacy-summary-silo-{self.silo}.json", _finite(report))
        public = self.memory.get(PUBLIC_MEMORY)
        if public:
            write_bytes(self.public_memory_path, encode_memory(public))
        if not is_warm():
            storable = {
                k: v for k, v in self.memory.items() if k != PUBLIC_MEMORY and not holds_secrets(k)
            }
            if storable:
                write_bytes(self.memory_path, encode_memory(storable))
        if self.releases:
            write_bytes(self.releases_path, encode_state(self.releases))


class SiloHost:
    """The silos this process serves, by (state folder, silo, run key).

    In a per-message process it holds at most the one silo of the current message.
    """

    def __init__(self) -> None:
        self._silos: OrderedDict[tuple[str, int, str], Silo] = OrderedDict()

    def silo(
        self, run_config: Mapping[str, Any], node_config: Mapping[str, Any], run_key: str
    ) -> Silo:
        node_config = dict(node_config)
        if PARTITION_ID not in node_config:
            raise ValueError(f"SuperNode started without --node-config '{PARTITION_ID}=<silo>'")
        index = int(node_config[PARTITION_ID])
        folder = silo_folder(node_config, run_key)
        key = (str(folder), index, run_key)
        found = self._silos.get(key)
        if found is not None:
            self._silos.move_to_end(key)
            return found
        spec = str(run_config.get("pdpfl-hooks", DEFAULT_HOOKS))
        if spec != DEFAULT_HOOKS and str(node_config.get(HOOKS_KEY, "")) != spec:
            raise PermissionError(
                f"the run asks this silo to load hooks {spec!r}; a silo only loads pdpfl's own "
                f"hooks unless its SuperNode was started with --node-config '{HOOKS_KEY}=\"...\"'"
            )
        hooks = load_hooks(spec)

        config = hooks.config_from_dict(decode_config(str(run_config["pdpfl-config"])))
        expected = node_config.get(CONFIG_HASH_KEY)
        if expected:
            got = config_digest(hooks.config_to_dict(config))
            if got != str(expected):
                raise PermissionError(
                    f"silo {index} only runs the experiment it was started for "
                    f"({CONFIG_HASH_KEY}={expected}); this run's config hashes to {got}"
                )
        folder.mkdir(parents=True, exist_ok=True)
        silo = Silo(hooks, config, index, node_config, run_key, folder)
        self._silos[key] = silo
        while len(self._silos) > MAX_SILOS:
            self._silos.popitem(last=False)
        return silo

    def clear(self) -> None:
        self._silos.clear()


#: The silos of this process.
HOST = SiloHost()
