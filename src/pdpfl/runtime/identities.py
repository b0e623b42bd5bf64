"""The parties' long-term identities in a run folder (the simulator's trust model).

In the simulator one operator owns every silo and the coordinator, so it keeps each party's
private identity (:mod:`pdpfl.crypto.signing`: an Ed25519 key and a certified X25519 key) where
it keeps its sealing keys, ``$PDPFL_KEY_DIR/identity/<party>.key`` (``silo-<i>``, ``server``),
and publishes the public halves in the run folder, ``keys/<party>.pub``: what a person checks a
privacy receipt against, and what each in-process silo knows of the others "out of band". The
silos' secure-summation side (:class:`~pdpfl.fl.aggregation.secure_identity.SiloSecurity`) is
built from these keys and the silo's own view of the configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pdpfl.crypto.signing import PartyIdentity, PartyPublicKey, load_identity, write_public_key
from pdpfl.fl.aggregation.secure_identity import SiloSecurity, security_from_config, silo_party

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = [
    "KEYS_FOLDER",
    "provision_silos",
    "publish_identities",
    "publish_party",
    "simulator_security",
]

#: Where a run folder publishes its parties' public keys.
KEYS_FOLDER = "keys"


def publish_identities(
    out_dir: str | Path, silos: list[int], *, server: bool = True
) -> tuple[dict[int, PartyIdentity], dict[int, PartyPublicKey]]:
    """Load (or create) every silo's identity and the coordinator's, and write their public
    keys to ``<out_dir>/keys/<party>.pub``; returns the silos' identities and public keys."""
    folder = Path(out_dir) / KEYS_FOLDER
    identities = {int(c): load_identity(silo_party(c)) for c in silos}
    publics = {c: ident.public() for c, ident in identities.items()}
    for c, key in publics.items():
        write_public_key(folder / f"{silo_party(c)}.pub", key)
    if server:
        write_public_key(folder / "server.pub", load_identity("server").public())
    return identities, publics


def publish_party(out_dir: str | Path, party: str, *, server: bool = True) -> PartyPublicKey:
    """Load (or create) one party's identity -- e.g. ``clients``, the holder of a simulated
    client pool's one ledger (:mod:`pdpfl.fl.pool`), which signs its clients' receipts -- and
    the coordinator's, and write their public keys to ``<out_dir>/keys/<party>.pub``."""
    folder = Path(out_dir) / KEYS_FOLDER
    public = load_identity(party).public()
    write_public_key(folder / f"{party}.pub", public)
    if server:
        write_public_key(folder / "server.pub", load_identity("server").public())
    return public


def simulator_security(
    config: ExperimentConfig, out_dir: str | Path, silos: list[int]
) -> dict[int, SiloSecurity]:
    """Each in-process silo's side of secure summation: its identity, the others' public keys
    (published in the run folder) and its own settings from ``config``."""
    identities, publics = publish_identities(out_dir, silos)
    return {c: security_from_config(config, c, identities[c], publics) for c in identities}


def provision_silos(state_dirs: dict[int, Path], keys: Path) -> None:
    """Loopback Flower (one operator owns every local silo): each silo's identity in its own
    state folder (``<state-dir>/identity/silo-<i>.key``) and every public key in ``keys``, the
    folder each silo is then given as its ``peer-keys`` (out of band: never via the server)."""
    from pdpfl.ledger.receipts import silo_identity_path

    for i, state in state_dirs.items():
        identity = load_identity(silo_party(i), silo_identity_path(state, int(i)))
        write_public_key(Path(keys) / f"{silo_party(i)}.pub", identity.public())
