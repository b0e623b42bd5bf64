"""Long-term party identities: an Ed25519 signing key and an Ed25519-certified X25519 key.

Every party that must be recognised by others (a silo, the coordinating server) holds one
*identity* for as long as it lives, beside (never inside) its run folders:

* an **Ed25519** signing key (RFC 8032, from ``cryptography``): privacy receipts
  (:mod:`pdpfl.ledger.receipts`) and the binding of the key below;
* a static **X25519** key, whose public half the Ed25519 key signs (the *binding*): two parties
  derive a pairwise authentication key K_ij = HKDF-SHA256(X25519(x_i, X_j), both identities)
  from it (:meth:`PartyIdentity.pairwise_key`). Secure summation authenticates each silo's
  advertised round keys and the survivor set it confirms with HMAC-SHA256 under K_ij
  (:mod:`pdpfl.fl.aggregation.secure_identity`): only i and j can compute it, so a server that
  relays the messages can neither substitute a key nor forge a confirmation, and a MAC costs a
  microsecond where an Ed25519 verification costs about a hundred.

Trust model: the public halves travel *out of band* -- a file per party
(``pdpfl-party-key/1``, JSON: party name, both public keys, the binding signature) that each
party is given (in the simulator, written by the operator who owns every silo into the run
folder, ``keys/silo-<i>.pub``). A key relayed by the server is never trusted.

Private keys live in a file readable by the owner only (mode 0600; ``pdpfl-identity/1``: a
magic line and the two 32-byte private keys), by default ``$PDPFL_KEY_DIR/identity/<party>.key``;
a Flower silo keeps its own in its SuperNode's state folder. Nothing here is new cryptography:
signatures, key agreement, HKDF and HMAC are ``cryptography``'s (OpenSSL).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from pdpfl.crypto import IntegrityError
from pdpfl.crypto.keys import context, derive

__all__ = [
    "PUBLIC_FORMAT",
    "SIGNATURE_BYTES",
    "PartyIdentity",
    "PartyPublicKey",
    "default_identity_path",
    "load_identity",
    "public_key_file",
    "read_public_key",
    "read_public_keys",
    "write_public_key",
]

PUBLIC_FORMAT = "pdpfl-party-key/1"
_SECRET_MAGIC = b"PDPFL-IDENTITY-1\n"
SIGNATURE_BYTES = 64
_KEY_BYTES = 32


def _raw_public(key: Ed25519PublicKey | X25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _binding_message(party: str, sign: bytes, agree: bytes) -> bytes:
    return context(PUBLIC_FORMAT, "binding", party, sign, agree)


def _plain_name(party: str) -> str:
    if not party or not party.replace("-", "").replace("_", "").isalnum() or len(party) > 64:
        raise ValueError(f"party: {party!r} is not a plain name (letters, digits, - and _)")
    return party


@dataclass(frozen=True)
class PartyPublicKey:
    """A party's public identity: its Ed25519 key, its X25519 key and the binding signature."""

    party: str
    sign: bytes
    agree: bytes
    binding: bytes

    def __post_init__(self) -> None:
        if len(self.sign) != _KEY_BYTES or len(self.agree) != _KEY_BYTES:
            raise IntegrityError(f"public key of {self.party}: expected two 32-byte keys")
        if len(self.binding) != SIGNATURE_BYTES:
            raise IntegrityError(f"public key of {self.party}: malformed binding signature")
        if not self.verify(_binding_message(self.party, self.sign, self.agree), self.binding):
            raise IntegrityError(
                f"public key of {self.party}: its X25519 key is not signed by its Ed25519 key"
            )

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the Ed25519 public key (hex, 16 bytes): what a person compares."""
        return hashlib.sha256(self.sign).hexdigest()[:32]

    def verify(self, message: bytes, signature: bytes) -> bool:
        """True iff ``signature`` is this party's Ed25519 signature of ``message``."""
        if not isinstance(signature, bytes | bytearray) or len(signature) != SIGNATURE_BYTES:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(self.sign).verify(bytes(signature), message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def to_dict(self) -> dict[str, str]:
        return {
            "format": PUBLIC_FORMAT,
            "party": self.party,
            "sign": self.sign.hex(),
            "agree": self.agree.hex(),
            "binding": self.binding.hex(),
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: object, *, what: str = "public key") -> PartyPublicKey:
        """Rebuild (and check the binding of) a :meth:`to_dict` record."""
        if not isinstance(data, dict) or data.get("format") != PUBLIC_FORMAT:
            raise IntegrityError(f"{what}: not a {PUBLIC_FORMAT} record")
        try:
            return cls(
                party=_plain_name(str(data["party"])),
                sign=bytes.fromhex(str(data["sign"])),
                agree=bytes.fromhex(str(data["agree"])),
                binding=bytes.fromhex(str(data["binding"])),
            )
        except (KeyError, ValueError) as err:
            if isinstance(err, IntegrityError):
                raise IntegrityError(f"{what}: {err}") from None
            raise IntegrityError(f"{what}: malformed ({err})") from None


@dataclass
class PartyIdentity:
    """A party's private identity (see the module docstring). Never serialised into a message,
    a run folder or a log."""

    party: str
    sign_key: Ed25519PrivateKey = field(repr=False)
    agree_key: X25519PrivateKey = field(repr=False)
    _pairwise: dict[tuple[bytes, bytes], bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def generate(cls, party: str) -> PartyIdentity:
        """A fresh identity from the operating system's CSPRNG."""
        return cls(_plain_name(party), Ed25519PrivateKey.generate(), X25519PrivateKey.generate())

    def public(self) -> PartyPublicKey:
        sign = _raw_public(self.sign_key.public_key())
        agree = _raw_public(self.agree_key.public_key())
        binding = self.sign(_binding_message(self.party, sign, agree))
        return PartyPublicKey(self.party, sign, agree, binding)

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message``."""
        return self.sign_key.sign(bytes(message))

    def pairwise_key(self, peer: PartyPublicKey, purpose: str) -> bytes:
        """K = HKDF-SHA256(X25519(own, peer), purpose ‖ both identities, sorted): the same at
        both ends, for ``purpose`` only (cached per peer)."""
        own = _raw_public(self.sign_key.public_key())
        if peer.sign == own:
            raise IntegrityError(f"{self.party}: no pairwise key with itself")
        cache = (peer.sign + peer.agree, purpose.encode())
        found = self._pairwise.get(cache)
        if found is not None:
            return found
        try:
            shared = self.agree_key.exchange(X25519PublicKey.from_public_bytes(peer.agree))
        except ValueError as exc:  # low-order point
            raise IntegrityError(f"public key of {peer.party}: rejected ({exc})") from None
        lo, hi = sorted((own, peer.sign))
        key = derive(shared, context("pdpfl/pairwise-auth/v1", purpose, lo, hi))
        self._pairwise[cache] = key
        return key

    def mac(self, peer: PartyPublicKey, purpose: str, message: bytes, size: int = 16) -> bytes:
        """HMAC-SHA256 of ``message`` under the pairwise key with ``peer``, truncated."""
        tag = hmac.new(self.pairwise_key(peer, purpose), message, hashlib.sha256).digest()
        return tag[:size]

    def check_mac(self, peer: PartyPublicKey, purpose: str, message: bytes, tag: bytes) -> bool:
        """True iff ``tag`` is ``peer``'s :meth:`mac` of ``message`` for this party."""
        if not isinstance(tag, bytes | bytearray) or not 16 <= len(tag) <= 32:
            return False
        return hmac.compare_digest(self.mac(peer, purpose, message, len(tag)), bytes(tag))

    def secret_bytes(self) -> bytes:
        sign = self.sign_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        agree = self.agree_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return _SECRET_MAGIC + sign + agree


def default_identity_path(party: str) -> Path:
    """``$PDPFL_KEY_DIR/identity/<party>.key`` (default ``~/.local/share/pdpfl``)."""
    from pdpfl.integrity import key_dir

    folder = key_dir() / "identity"
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder / f"{_plain_name(party)}.key"


def load_identity(
    party: str, path: str | os.PathLike[str] | None = None, *, create: bool = True
) -> PartyIdentity:
    """The identity of ``party`` from ``path`` (default :func:`default_identity_path`), created
    from the OS CSPRNG on first use when ``create`` (mode 0600, never overwritten)."""
    target = Path(path) if path is not None else default_identity_path(party)
    if not target.exists():
        if not create:
            raise FileNotFoundError(f"{target}: no identity key for {party}")
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        identity = PartyIdentity.generate(party)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # created meanwhile by another process: read that one
            return load_identity(party, target, create=False)
        try:
            os.write(fd, identity.secret_bytes())
        finally:
            os.close(fd)
        return identity
    data = target.read_bytes()
    body = data[len(_SECRET_MAGIC) :]
    if not data.startswith(_SECRET_MAGIC) or len(body) != 2 * _KEY_BYTES:
        raise IntegrityError(f"{target}: not a pdpfl identity key (pdpfl-identity/1)")
    return PartyIdentity(
        _plain_name(party),
        Ed25519PrivateKey.from_private_bytes(body[:_KEY_BYTES]),
        X25519PrivateKey.from_private_bytes(body[_KEY_BYTES:]),
    )


def public_key_file(folder: str | os.PathLike[str], party: str) -> Path:
    """``<folder>/<party>.pub``."""
    return Path(folder) / f"{_plain_name(party)}.pub"


def write_public_key(path: str | os.PathLike[str], key: PartyPublicKey) -> None:
    """Write ``key`` as a ``pdpfl-party-key/1`` JSON file (atomically)."""
    from pdpfl.io import write_json

    write_json(path, key.to_dict())


def read_public_key(path: str | os.PathLike[str], party: str | None = None) -> PartyPublicKey:
    """A public key file (its binding checked; ``party``, when given, must be the one named)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise IntegrityError(f"{p}: not a readable {PUBLIC_FORMAT} file ({err})") from None
    key = PartyPublicKey.from_dict(data, what=str(p))
    if party is not None and key.party != party:
        raise IntegrityError(f"{p}: the key of {key.party}, not of {party}")
    return key


def read_public_keys(path: str | os.PathLike[str]) -> dict[str, PartyPublicKey]:
    """Every party's public key: a folder of ``<party>.pub`` files, or one JSON file holding a
    list of ``pdpfl-party-key/1`` records (each party once)."""
    p = Path(path)
    keys: dict[str, PartyPublicKey] = {}
    if p.is_dir():
        for f in sorted(p.glob("*.pub")):
            key = read_public_key(f)
            if key.party != f.stem:
                raise IntegrityError(f"{f}: the key of {key.party}, not of {f.stem}")
            keys[key.party] = key
        return keys
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise IntegrityError(f"{p}: not a readable list of public keys ({err})") from None
    records = data if isinstance(data, list) else [data]
    for i, record in enumerate(records):
        key = PartyPublicKey.from_dict(record, what=f"{p} (entry {i})")
        if key.party in keys:
            raise IntegrityError(f"{p}: {key.party} is listed twice")
        keys[key.party] = key
    return keys
