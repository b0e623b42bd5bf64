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

Integrity of the state folder
-----------------------------
Every state file (``silo-<i>.npz``, ``ledger-silo-<i>.npz``, ``releases-silo-<i>.npz``, the
protocol memory files) is sealed (:mod:`pdpfl.integrity`) with the *silo's own* key (party
``silo-<i>`` in the silo's ``$PDPFL_KEY_DIR``, never sent anywhere) over the run key, the silo
and the state's *generation* (a counter raised by every write). A process that rebuilds the
silo verifies each file: an edited, truncated or unsealed file, a file of another run or silo,
or files of different generations mixed together are refused with an error naming the file.
The silo's high-water mark (:func:`pdpfl.integrity.record_progress`) holds the last generation
written: a state folder rolled back to an older copy (or deleted) is refused too, so a
resumed silo never forgets a charge.

A person's budget is for life
-----------------------------
The silo's ledger also charges the silo's **budget store** (:mod:`pdpfl.ledger.lifetime`):
``<state-dir>/budgets`` (or the ``budget-store`` node config), one store per dataset the silo
trains on, kept across runs. The silo opens and locks it when it builds its algorithm for a
run (after restoring its state), every charge is written there before the reply leaves, and
units whose lifetime budget is spent by earlier runs sit out. A run's
``lifetime.allow_respend`` is honoured only when the SuperNode was started with
``allow-respend=true`` (``pdpfl flower supernode --allow-respend``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.aggregation import PUBLIC_MEMORY, holds_secrets
from pdpfl.fl.api import ClientAlgorithm, Contribution, PrivacyBoundaryError
from pdpfl.integrity import (
    IntegrityError,
    check_progress,
    mark_id,
    record_progress,
    seal,
    unseal,
)
from pdpfl.io import decode_state, decode_state_dict, encode_state, write_bytes, write_json
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

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.fl.aggregation.secure_identity import SiloSecurity
    from pdpfl.fl.lifetime import LifetimeSession

__all__ = ["HOST", "Silo", "SiloHost", "decode_memory", "encode_memory", "silo_folder"]

#: Silos kept in memory by one worker (the oldest run's silos are dropped first).
MAX_SILOS = 64
#: Releases a silo remembers (a resumed run re-asks at most the rounds after its checkpoint:
#: the interrupted round and the one announced with it).
MAX_RELEASES = 3
#: Seconds a per-message process waits for the silo's state folder (held by the process of the
#: silo's previous message); a warm worker never waits.
PER_MESSAGE_LOCK_WAIT_S = 10.0


def release_key(round_index: int, params: list[np.ndarray], config: Mapping[str, Any]) -> str:
    """What identifies a training request: round, global parameters (bytes), round config."""
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


def _to_storable(obj: object) -> object:
    if isinstance(obj, bytes | bytearray):
        return {"__bytes__": np.frombuffer(bytes(obj), dtype=np.uint8).copy()}
    if isinstance(obj, dict):
        return {k: _to_storable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_to_storable(v) for v in obj]
    return obj


def _from_storable(obj: object) -> object:
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
    memory = _from_storable(decode_state(data))
    if not isinstance(memory, dict):
        raise ValueError("protocol memory: not a valid pdpfl state file (not a mapping)")
    return memory


# ------------------------------------------------------------------------------ one silo


@dataclass
class Silo:
    """Silo ``silo`` of run ``run_key`` as seen by this process."""

    hooks: AppHooks
    config: ExperimentConfig
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
    #: How many times this silo's state was written (sealed into every state file).
    generation: int = 0
    #: The budget store this silo holds open (locked) for the run (:mod:`pdpfl.fl.lifetime`).
    lifetime: LifetimeSession | None = None
    #: The silo's own side of secure summation (built on first use, :meth:`security`).
    _security: SiloSecurity | None = None

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

    def cached_release(self, key: str) -> Contribution | None:
        """The contribution this silo already released for the same request, or None.

        A resumed run asks again for the rounds after its checkpoint. Answering with the very
        same release is post-processing of an output already charged to the silo's ledger: no
        new noise is drawn, nothing is charged twice, and the resumed run equals an
        uninterrupted one.
        """
        for entry in self.releases:
            if entry["key"] == key:
                return Contribution(
                    update=[np.asarray(u) for u in entry["update"]],
                    weight=float(entry["weight"]),
                    metrics={str(k): float(v) for k, v in entry["metrics"].items()},
                )
        return None

    def remember_release(self, key: str, contribution: Contribution) -> None:
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

    def accounted_rounds(self) -> int:
        """The rounds this silo's sealed state file has accounted (its ``next_round``; 0
        without a state file), read without building the silo. The file is verified as
        :meth:`ensure_client` does (IntegrityError otherwise); the high-water mark is checked
        when the silo is built."""
        if not self.state_path.exists():
            return 0
        payload, _ = self._unseal(self.state_path, "silo-state", None)
        try:
            return int(decode_state_dict(payload)["next_round"])
        except (ValueError, KeyError, TypeError) as err:  # sealed but unreadable
            raise IntegrityError(
                f"silo {self.silo}: its state file {self.state_path} does not decode ({err})"
            ) from None

    # ------------------------------------------------------------- sealed state files

    @property
    def party(self) -> str:
        """Whose key seals this silo's state: the silo's own (``silo-<i>``)."""
        return f"silo-{self.silo}"

    @property
    def identity(self) -> str:
        return f"flower-run-{self.run_key}/silo-{self.silo}"

    @property
    def mark_id(self) -> str:
        """The silo's high-water mark name (alphanumeric, per run and silo)."""
        return mark_id(self.identity)

    def _seal(self, payload: bytes, purpose: str) -> bytes:
        return seal(
            payload,
            purpose=purpose,
            identity=f"{self.identity}@{self.generation}",
            party=self.party,
        )

    def _unseal(self, path: Path, purpose: str, generation: int | None) -> tuple[bytes, int]:
        """The payload of a sealed state file and its generation (IntegrityError otherwise).

        With ``generation`` (the state file's), the file must be of that generation or of the
        one before (a crash between the state file and the others, see :meth:`_persist`).
        """
        what = f"silo {self.silo} state file {path}"
        payload, found = unseal(path.read_bytes(), purpose=purpose, party=self.party, what=what)
        base, _, gen = found.rpartition("@")
        if base != self.identity or not gen.isdigit():
            raise IntegrityError(f"{what}: it belongs to another run or silo ({found})")
        if generation is not None and int(gen) not in (generation, generation - 1):
            raise IntegrityError(
                f"{what}: it was written at state generation {gen}, the silo's state file at "
                f"{generation}: files of different copies of the state folder were mixed"
            )
        return payload, int(gen)

    def _load_state(self, client: ClientAlgorithm) -> None:
        """Verify and load every state file of the silo (see "Integrity" above)."""
        mark = check_progress(self.mark_id, None, self.party)
        if not self.state_path.exists():
            if mark > 0:
                raise IntegrityError(
                    f"silo {self.silo}: its state file {self.state_path} is missing, but this "
                    f"silo already wrote its state {mark} time(s) for run {self.run_key}: the "
                    "state folder was deleted or replaced; refusing to restart its ledger"
                )
            return
        try:
            payload, gen = self._unseal(self.state_path, "silo-state", None)
            if gen < mark:
                raise IntegrityError(
                    f"silo {self.silo} state file {self.state_path}: it is at generation "
                    f"{gen} but this silo already wrote generation {mark}: an older copy of "
                    "the state folder was put back (its ledger would forget charges)"
                )
            self.generation = gen
            client.load_state_dict(decode_state_dict(payload))
            ledger = self.folder / f"ledger-silo-{self.silo}.npz"
            if ledger.exists():
                self._unseal(ledger, "ledger", gen)
            if not is_warm() and self.memory_path.exists():
                data, _ = self._unseal(self.memory_path, "protocol-memory", gen)
                self.memory = decode_memory(data)
            if self.public_memory_path.exists():
                data, _ = self._unseal(self.public_memory_path, "protocol-public", gen)
                self.memory[PUBLIC_MEMORY] = decode_memory(data)
            if self.releases_path.exists():
                data, _ = self._unseal(self.releases_path, "releases", gen)
                releases = decode_state(data)
                if not isinstance(releases, list):
                    raise ValueError("the releases file is not a list")
                self.releases = releases
        except IntegrityError:
            raise
        except (ValueError, KeyError, TypeError, OSError) as err:  # sealed but unreadable
            raise IntegrityError(
                f"silo {self.silo}: a state file in {self.folder} does not decode ({err})"
            ) from None

    def _open_lifetime(self, client: ClientAlgorithm) -> None:
        """Open and lock the silo's budget store for this run, after its state is restored
        and before anything is released (a per-message process waits for the previous one)."""
        from dataclasses import replace

        from pdpfl.fl.lifetime import TARGET_ATTR, open_lifetime

        target = getattr(client, TARGET_ATTR, None)
        if target is None:
            return
        if not is_warm():
            wait = max(target.options.wait_s, PER_MESSAGE_LOCK_WAIT_S)
            target = replace(target, options=replace(target.options, wait_s=wait))
            setattr(client, TARGET_ATTR, target)
        rounds = int(getattr(getattr(self.config, "training", None), "rounds", 1))
        done = int(getattr(client, "next_round", 0))
        self.lifetime = open_lifetime([client], f"flower-{self.run_key}", rounds - done)
        for warning in self.lifetime.warnings:
            with (self.folder / f"lifetime-silo-{self.silo}.log").open("a") as fh:
                fh.write(warning + "\n")

    def security(self) -> SiloSecurity | None:
        """The silo's side of secure summation: its long-term identity (in its state folder,
        created on first use), the peers' public keys from the ``peer-keys`` file it was given
        out of band, and its own configuration's settings; None without ``peer-keys`` (secure
        summation then refuses to run at this silo)."""
        if self._security is not None:
            return self._security
        from pdpfl.crypto.signing import load_identity, read_public_keys
        from pdpfl.fl.aggregation.secure_identity import security_from_config, silo_party
        from pdpfl.ledger.receipts import silo_identity_path
        from pdpfl.runtime.flower.hooks import PEER_KEYS

        source = self.node_config.get(PEER_KEYS)
        if not source:
            return None
        root = Path(str(self.node_config.get(STATE_DIR) or self.folder.parent)).expanduser()
        identity = load_identity(silo_party(self.silo), silo_identity_path(root, self.silo))
        peers = {
            int(name[len("silo-") :]): key
            for name, key in read_public_keys(Path(str(source)).expanduser()).items()
            if name.startswith("silo-") and name[len("silo-") :].isdigit()
        }
        self._security = security_from_config(self.config, self.silo, identity, peers)
        return self._security

    def close(self) -> None:
        """Release the silo's budget store (its files stay)."""
        if self.lifetime is not None:
            self.lifetime.close()
            self.lifetime = None

    def threads(self) -> AbstractContextManager[None]:
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
        self._load_state(client)
        self._open_lifetime(client)
        self.client, self.public_json = client, public_json
        self.build_s = time.perf_counter() - t0
        return client

    def save(
        self,
        action: str,
        round_index: int,
        compute_s: float,
        process_age_s: float | None,
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

    def _persist(self, client: ClientAlgorithm) -> None:
        from pdpfl.checkpoint import finite as _finite
        from pdpfl.ledger import PrivacyLedger, PrivacySummary, save_ledger

        # Every state file is rewritten under the new generation (no file of an older write
        # can be mixed in): the state file (the silo's counters and ledger) first -- a crash
        # before the others are written leaves them one generation behind, which can only make
        # the silo recompute (and charge) a release again -- then the high-water mark.
        self.generation += 1
        ident = f"{self.identity}@{self.generation}"
        write_bytes(self.state_path, self._seal(encode_state(client.state_dict()), "silo-state"))
        ledger = getattr(client, "ledger", None)
        if isinstance(ledger, PrivacyLedger):
            save_ledger(
                ledger,
                self.folder / f"ledger-silo-{self.silo}.npz",
                identity=ident,
                party=self.party,
            )
        # The silo's own privacy report: stays on this disk (never in a reply).
        summary = client.privacy_summary()
        report = summary.to_dict() if isinstance(summary, PrivacySummary) else summary
        if report is not None:
            write_json(self.folder / f"privacy-summary-silo-{self.silo}.json", _finite(report))
        public = self.memory.get(PUBLIC_MEMORY)
        if public or self.public_memory_path.exists():
            write_bytes(
                self.public_memory_path, self._seal(encode_memory(public or {}), "protocol-public")
            )
        if not is_warm():
            storable = {
                k: v for k, v in self.memory.items() if k != PUBLIC_MEMORY and not holds_secrets(k)
            }
            if storable or self.memory_path.exists():
                write_bytes(
                    self.memory_path, self._seal(encode_memory(storable), "protocol-memory")
                )
        if self.releases or self.releases_path.exists():
            write_bytes(self.releases_path, self._seal(encode_state(self.releases), "releases"))
        record_progress(self.mark_id, self.generation, self.party)


class SiloHost:
    """The silos this process serves, by (state folder, silo, run key).

    In a per-message process it holds at most the one silo of the current message.

    While it serves a silo, the process holds the exclusive lock of the silo's state in its
    folder (:func:`pdpfl.runtime.lock.folder_lock`, ``<state-dir>/run-<key>/.pdpfl-silo-<i>.lock``):
    a warm worker for as long as it keeps the silo in memory (across messages), a per-message
    process for its one message. A second process serving the same silo state -- two SuperNodes
    for the same silo started with the same ``--state-dir`` -- is refused with an error naming
    the holder (a per-message process first waits up to :data:`PER_MESSAGE_LOCK_WAIT_S` for the
    one handling the silo's previous message); the kernel releases the lock of a killed
    process, so a stale lock file never blocks.
    """

    def __init__(self) -> None:
        self._silos: OrderedDict[tuple[str, int, str], Silo] = OrderedDict()
        self._locks: dict[tuple[str, int], ExitStack] = {}

    def _lock(self, folder: Path, index: int) -> None:
        """Hold silo ``index``'s lock in ``folder`` in this process (once)."""
        from pdpfl.runtime.lock import folder_lock

        if (str(folder), index) in self._locks:
            return
        stack = ExitStack()
        wait = 0.0 if is_warm() else PER_MESSAGE_LOCK_WAIT_S
        stack.enter_context(
            folder_lock(folder, option="--state-dir", wait_s=wait, name=f".pdpfl-silo-{index}.lock")
        )
        self._locks[(str(folder), index)] = stack

    def _release_unused(self) -> None:
        used = {(str(s.folder), s.silo) for s in self._silos.values()}
        for key in [k for k in self._locks if k not in used]:
            self._locks.pop(key).close()

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
        self._lock(folder, index)
        for (_, other_index, other_run), other in self._silos.items():
            if other_index == index and other_run != run_key:
                # a new run of this silo: the earlier run's budget store lock is released (a
                # charge that run still attempted would fail: never on a stale copy)
                other.close()
        silo = Silo(hooks, config, index, node_config, run_key, folder)
        self._silos[key] = silo
        while len(self._silos) > MAX_SILOS:
            self._silos.popitem(last=False)[1].close()
        self._release_unused()
        return silo

    def clear(self) -> None:
        for silo in self._silos.values():
            silo.close()
        self._silos.clear()
        self._release_unused()


#: The silos of this process.
HOST = SiloHost()
