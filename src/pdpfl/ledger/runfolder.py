"""Reading a run's ledgers, verified: what every reader of a run folder trusts (issue #34).

A run folder (``pdpfl run``, :func:`pdpfl.train`, a Flower coordinator's output folder) holds
its ledgers in ``ledgers/``. The run writes them with :func:`seal_ledgers`: each file sealed
(:mod:`pdpfl.integrity`, the operator's key) under the identity ``<run id>@<round>`` -- the
run's id and the round its checkpoint had reached -- and a sealed manifest
(``ledgers/manifest.sealed``) naming every ledger file and its SHA-256. :func:`open_run` is the
one way pdpfl reads them back (``pdpfl privacy``, ``pdpfl export``, ``pdpfl compare``,
:func:`pdpfl.privacy_table`, :func:`pdpfl.load_model`):

1. the run's identity comes from its checkpoint (:func:`pdpfl.checkpoint.run_identity`: sealed,
   checked against the run's high-water mark, so an older checkpoint put back is refused);
2. the manifest must verify under ``<run id>@<round>``, and the ledger files must be exactly the
   ones it lists, with the listed digests (a deleted, added or replaced file is refused);
3. every ledger file must be sealed under that same identity: an **unsealed** file, a file of
   **another run** or one written at an **earlier round** (stale) is refused with an error naming
   the file (:class:`RunFolderError`). Nothing is reported from a folder that fails.

A folder that names no run -- no checkpoint and no ``run_id`` in its ``summary.json``: written
by a version before run ids, or assembled by hand -- cannot be verified: it is read as before
(sealed files must still verify) and every report says so (:attr:`RunCheck.note`, an
:class:`UnverifiedRunWarning` in Python). A folder whose ``summary.json`` names a run id but
whose checkpoint is gone is refused. A Flower silo's state folder (``run-<key>/``) is verified
with the silo's own key and high-water mark instead (:func:`open_silo_state`).

What this does not do: the seal is an HMAC under the operator's key, so a run folder verifies
on the machine (the ``$PDPFL_KEY_DIR``) that ran it; whoever holds that key can forge anything.
A person who wants a statement they can check anywhere asks for a signed privacy receipt
(:mod:`pdpfl.ledger.receipts`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from pdpfl.checkpoint import run_identity
from pdpfl.integrity import IntegrityError, check_progress, is_sealed, mark_id, seal, unseal
from pdpfl.io import write_bytes
from pdpfl.ledger.core import PrivacyLedger
from pdpfl.ledger.store import ledger_bytes, ledger_from_bytes

__all__ = [
    "MANIFEST_NAME",
    "POOLED_LEDGER",
    "RunCheck",
    "RunFolderError",
    "UnverifiedRunWarning",
    "ledger_identity",
    "open_run",
    "open_silo_state",
    "seal_ledgers",
    "summary_run_id",
]

MANIFEST_NAME = "manifest.sealed"
#: The file stem of the one ledger of a simulated client pool (IDP-FedAvg central,
#: :mod:`pdpfl.fl.pool`): ``ledgers/clients.npz``, one row per client, held (and its receipts
#: signed) by one party of that name, whose public key the run publishes as ``keys/clients.pub``.
POOLED_LEDGER = "clients"
_MANIFEST_FORMAT = "pdpfl-ledger-manifest/1"


class RunFolderError(IntegrityError):
    """A run folder whose ledgers do not verify (unsealed, foreign, stale, edited, missing)."""


class UnverifiedRunWarning(UserWarning):
    """A folder without a run id: its numbers are what its files say, unverified."""


def ledger_identity(run_id: str, next_round: int) -> str:
    """What a run's ledgers are sealed under: ``<run id>@<round its checkpoint reached>``."""
    return f"{run_id}@{int(next_round)}"


@dataclass(frozen=True)
class RunCheck:
    """What :func:`open_run` found: the ledgers and how far they are verified."""

    path: Path
    #: ``run`` (a run folder with a run id), ``silo-state`` (a Flower silo's state folder),
    #: ``unverified`` (a folder or a file that names no run).
    kind: str
    #: The run id (a Flower silo: its run key and silo), None when there is none.
    run_id: str | None
    #: The round the checkpoint records (a Flower silo: its state generation).
    round: int | None
    ledgers: dict[str, PrivacyLedger] = field(repr=False)

    @property
    def verified(self) -> bool:
        return self.run_id is not None

    @property
    def note(self) -> str:
        """The sentence every report prints about where its numbers come from."""
        n = len(self.ledgers)
        if self.kind == "run":
            return (
                f"verified: run {self.run_id} at round {self.round} (sealed checkpoint, "
                f"high-water mark, manifest and {n} sealed ledger file(s))"
            )
        if self.kind == "silo-state":
            return (
                f"verified: {self.run_id}, state generation {self.round} (the silo's key and "
                f"high-water mark, {n} sealed ledger file(s))"
            )
        return (
            f"NOT VERIFIED: {self.path} names no run (no checkpoint, no run_id in summary.json): "
            "these numbers are what its files say"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "verified": self.verified,
            "kind": self.kind,
            "run_id": self.run_id,
            "round": self.round,
            "ledgers": sorted(self.ledgers),
            "note": self.note,
        }


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_manifest(folder: Path, run_id: str, next_round: int) -> dict[str, str]:
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise RunFolderError(
            f"{path}: missing -- the run's ledger files cannot be checked against what the run "
            "wrote; refusing to report from them"
        )
    payload = _check_identity(path, path.read_bytes(), run_id, next_round, "ledger-manifest")
    data = json.loads(payload.decode())
    if not isinstance(data, dict) or data.get("format") != _MANIFEST_FORMAT:
        raise RunFolderError(f"{path}: not a {_MANIFEST_FORMAT} manifest")
    files = data.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise RunFolderError(f"{path}: malformed manifest")
    return {str(k): str(v) for k, v in files.items()}


def _check_identity(path: Path, data: bytes, run_id: str, next_round: int, purpose: str) -> bytes:
    """The payload of a file sealed by run ``run_id`` at ``next_round`` (RunFolderError naming
    the file: unsealed, edited, of another run, stale)."""
    if not is_sealed(data):
        raise RunFolderError(
            f"{path}: not sealed -- a run with an id ({run_id}) writes only sealed ledger "
            "files; this one was written or replaced by something else; refusing to report "
            "from it"
        )
    try:
        payload, found = unseal(data, purpose=purpose, what=str(path))
    except IntegrityError as err:
        raise RunFolderError(str(err)) from None
    base, _, at = found.rpartition("@")
    if base != run_id:
        raise RunFolderError(
            f"{path}: sealed for another run ({base or found}); this folder's checkpoint is "
            f"run {run_id}; refusing to report from it"
        )
    if at != str(int(next_round)):
        raise RunFolderError(
            f"{path}: stale -- written at round {at}, but the run's checkpoint records round "
            f"{next_round}: an earlier copy was put back, or the run went on after its outputs "
            "were written (finish it with --resume); refusing to report from it"
        )
    return payload


def seal_ledgers(
    folder: str | Path,
    ledgers: dict[str, PrivacyLedger],
    run_id: str,
    next_round: int,
    *,
    add: bool = False,
    party: str = "operator",
) -> None:
    """Write ``ledgers`` (holder name → ledger) as ``<folder>/<name>.npz``, each sealed under
    :func:`ledger_identity`, then the sealed manifest of every ledger file of the run.

    ``add``: keep the ledgers an earlier call listed (verified first; e.g. a Flower coordinator
    adding the silos' ledgers it collected beside its own).
    """
    out = Path(folder)
    identity = ledger_identity(run_id, next_round)
    listed: dict[str, str] = {}
    if add and (out / MANIFEST_NAME).exists():
        listed = _read_manifest(out, run_id, int(next_round))
    for name, ledger in ledgers.items():
        if "/" in name or not name:
            raise ValueError(f"ledger name: {name!r} is not a plain file name")
        data = seal(ledger_bytes(ledger), purpose="ledger", identity=identity, party=party)
        write_bytes(out / f"{name}.npz", data)
        listed[f"{name}.npz"] = _digest(data)
    manifest = {"format": _MANIFEST_FORMAT, "run": run_id, "round": int(next_round),
                "files": dict(sorted(listed.items()))}  # fmt: skip
    write_bytes(
        out / MANIFEST_NAME,
        seal(
            json.dumps(manifest, sort_keys=True).encode(),
            purpose="ledger-manifest",
            identity=identity,
            party=party,
        ),
    )


def summary_run_id(run_dir: Path) -> str | None:
    """The ``run_id`` a folder's ``summary.json`` names (None: no summary or no id)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    rid = data.get("run_id") if isinstance(data, dict) else None
    return str(rid) if rid else None


def _verified_ledger(path: Path, run_id: str, next_round: int, data: bytes) -> PrivacyLedger:
    payload = _check_identity(path, data, run_id, next_round, "ledger")
    return ledger_from_bytes(payload, str(path))


def open_run(path: str | Path) -> RunCheck:
    """The ledgers under ``path``, verified as far as ``path`` allows (module docstring).

    ``path``: a run folder, a Flower silo's state folder (``run-<key>/``) or its parent (the
    SuperNode's ``--state-dir``), or one ledger file (unverified). Raises
    :class:`RunFolderError` (a ``ValueError``) naming the file that fails, ``ValueError`` when
    there is no ledger.
    """
    p = Path(path)
    if p.is_file():
        return _unverified(p, [p])
    silo_dirs = ([p] if _is_silo_state(p) else []) + sorted(
        d for d in p.glob("run-*") if d.is_dir() and _is_silo_state(d)
    )
    if silo_dirs and not (p / "ledgers").is_dir():
        checks = [open_silo_state(d) for d in silo_dirs]
        if len(checks) == 1:
            return checks[0]
        merged = {f"{c.path.name}/{k}": v for c in checks for k, v in c.ledgers.items()}
        ids = ", ".join(str(c.run_id) for c in checks)
        return RunCheck(p, "silo-state", ids, None, merged)
    folder = p / "ledgers"
    files = sorted(folder.glob("*.npz")) if folder.is_dir() else []
    ident = run_identity(p)
    if ident is None:
        named = summary_run_id(p)
        if named is not None:
            raise RunFolderError(
                f"{p}: its summary.json names run {named}, but its checkpoint "
                f"({p / 'checkpoint.npz'}) is missing: the ledgers cannot be verified; refusing "
                "to report from them"
            )
        if not files:
            raise ValueError(_no_ledgers(p))
        return _unverified(p, files)
    run_id, next_round = ident
    if not files and not (folder / MANIFEST_NAME).exists():
        raise ValueError(_no_ledgers(p))
    listed = _read_manifest(folder, run_id, next_round)
    present = {f.name: f for f in files}
    for name in sorted(set(present) - set(listed)):
        raise RunFolderError(
            f"{present[name]}: not written by run {run_id} (its sealed manifest does not list "
            "it); refusing to report from this folder"
        )
    ledgers: dict[str, PrivacyLedger] = {}
    for name, digest in listed.items():
        f = folder / name
        if not f.is_file():
            raise RunFolderError(
                f"{f}: missing -- run {run_id} wrote it (its sealed manifest lists it); a report "
                "without it would leave its units out; refusing"
            )
        data = f.read_bytes()
        ledger = _verified_ledger(f, run_id, next_round, data)
        if _digest(data) != digest:
            raise RunFolderError(
                f"{f}: not the file run {run_id} listed in its manifest (another sealed copy); "
                "refusing to report from it"
            )
        ledgers[f.stem] = ledger
    return RunCheck(p, "run", run_id, next_round, ledgers)


def _no_ledgers(p: Path) -> str:
    return (
        f"{p}: no ledger files (a run folder holds ledgers/*.npz, a Flower silo's state folder "
        "ledger-silo-<i>.npz; a run without differential privacy has none)"
    )


def _unverified(p: Path, files: list[Path]) -> RunCheck:
    from pdpfl.ledger.store import load_ledger

    check = RunCheck(p, "unverified", None, None, {f.stem: load_ledger(f) for f in files})
    warnings.warn(check.note, UnverifiedRunWarning, stacklevel=3)
    return check


def _is_silo_state(folder: Path) -> bool:
    return folder.name.startswith("run-") and any(folder.glob("ledger-silo-*.npz"))


def open_silo_state(folder: str | Path) -> RunCheck:
    """A Flower silo's ledger(s) in its state folder ``<state-dir>/run-<key>/``, verified with
    the silo's own key (party ``silo-<i>``) and high-water mark: sealed, of this run key and
    silo, and not older than the last state the silo wrote."""
    p = Path(folder)
    run_key = p.name[len("run-") :]
    ledgers: dict[str, PrivacyLedger] = {}
    ident: list[str] = []
    generation: int | None = None
    for f in sorted(p.glob("ledger-silo-*.npz")):
        silo = f.stem[len("ledger-silo-") :]
        party = f"silo-{silo}"
        base = f"flower-run-{run_key}/silo-{silo}"
        data = f.read_bytes()
        if not is_sealed(data):
            raise RunFolderError(f"{f}: not sealed -- a pdpfl silo seals its ledger; refusing")
        try:
            payload, found = unseal(data, purpose="ledger", party=party, what=str(f))
        except IntegrityError as err:
            raise RunFolderError(str(err)) from None
        head, _, gen = found.rpartition("@")
        if head != base or not gen.isdigit():
            raise RunFolderError(f"{f}: sealed for another run or silo ({found}); refusing")
        mark = check_progress(mark_id(base), None, party)
        if int(gen) < mark:
            raise RunFolderError(
                f"{f}: stale -- written at state generation {gen}, but silo {silo} already wrote "
                f"generation {mark}: an earlier copy was put back; refusing"
            )
        ledgers[f.stem] = ledger_from_bytes(payload, str(f))
        ident.append(base)
        generation = int(gen) if generation is None else max(generation, int(gen))
    if not ledgers:
        raise ValueError(_no_ledgers(p))
    return RunCheck(p, "silo-state", ", ".join(ident), generation, ledgers)
