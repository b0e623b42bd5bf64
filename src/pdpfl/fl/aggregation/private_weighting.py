"""ULDP-FL's private weighting protocol (Kato et al., PVLDB 2024, Protocol 1; spec A.4.3).

ULDP-AVG-w weights user u's clipped delta at silo s by w_{s,u} = n_{s,u} / N_u (Eq. 4), with
N_u = Σ_s n_{s,u}. Sending these weights in the clear would reveal every silo's user histogram.
This protocol computes, at the server,

    Δ = Σ_s ( Σ_u w_{s,u} · Clip(Δ_{s,u}, C) + z_s )                       (Algorithm 3, l. 16-17)

while the server learns only Δ and the blinded totals r_u·N_u mod n, and a silo learns only its
own histogram and Paillier ciphertexts. It is a clean API over plain arrays: a silo supplies its
histogram n_{s,·} (:meth:`PrivateWeightingClient.user_histogram`) and each round its users'
clipped deltas and its noise (:meth:`PrivateWeightingClient.user_updates`); the server
algorithm supplies |U| and, for ULDP-AVG-ws, the user-sampling mask of Algorithm 4
(:class:`PrivateWeightingServer`).

Protocol 1, as implemented (stage names in brackets; ⟦·⟧ Paillier under the server's key):

Setup (once per run)
  (a) [``setup-keys``] A draws a Paillier key pair (``secure.paillier_bits`` ≥ 3072) and sends
      pk; every silo draws an X25519 key pair and returns its public key.
  (b) [``setup-seed``] A relays all public keys; silos derive pairwise keys
      k_{s,s'} = HKDF(X25519(s, s')).
  (c) the first silo draws the shared seed R (32 bytes from :mod:`secrets`) and seals it for every
      other silo with ChaCha20-Poly1305 under k_{s0,s'}; A relays the sealed seeds.
  (d) [``setup-histogram``] every silo derives r_u ∈ Z_n^* from a ChaCha20 stream keyed by R
      (identical at every silo) and blinds h_{s,u} = r_u·n_{s,u} mod n;
  (e) adds pairwise masks (mod n, from k_{s,s'}) and sends h̃_{s,u}; A sums B_u = r_u·N_u.
  (f) A inverts B_u^{-1} mod n (N_u = 0 is an error naming the user).
Weighting (every round t)
  (a) [``weights``, once without user sub-sampling] A encrypts β_u = B_u^{-1} (0 for a user
      not sampled) and sends ⟦β_u⟧; silos compute X_u = ⟦β_u⟧^{r_u·DIV} = ⟦DIV/N_u⟧ (or ⟦0⟧);
      [``install``] each silo then forms C_{s,u} = X_u^{n_{s,u}} = ⟦DIV·w_{s,u}⟧.
  (b) [``round``] silo s encodes v_{s,u} = round(Clip(Δ_{s,u})/P) and computes, per coordinate,
      ⟦Y_s⟧ = Π_u C_{s,u}^{v_{s,u}} ⊕ (η_s + M_s), η_s = DIV·round(z_s/P) + u_s with the dither
      u_s uniform on [-DIV/2, DIV/2) -- the paper's DIV·round(z_s/P) leaves Y mod DIV
      noise-free (issue #22; :mod:`~pdpfl.fl.aggregation.private_weighting_core`)
  (c) with pairwise masks M_s (mod n, fresh per round) added as a plaintext; A multiplies the
      silos' ciphertexts, decrypts Y = DIV·Σ_s(Σ_u w v + round(z/P)) + Σ_s u_s and decodes
      Δ = centred(Y)/DIV · P (Algorithm 5).

Speed (the reference needs ≈ 85 s per silo per round at d = 16, |U| = 10; see
benchmarks/secure_weighting.py): gmpy2; step (a) runs once per run without sub-sampling
(spec D19) and its full-size exponentiations X_u are computed by one silo each and shared with
the others, sealed under a key derived from R that the server does not know; per coordinate a
simultaneous multi-exponentiation over users with short signed exponents
(:class:`~pdpfl.crypto.multiexp.MultiExp`) instead of one full-size exponentiation per user and
parameter (spec D28); CRT decryption and encryption at the server; both cores via forked workers.
Each outgoing ciphertext is re-randomised by h^k with h a random n-th residue of the silo and k a
fresh 256-bit exponent (the short-exponent re-randomiser of Damgård-Jurik-Nielsen), so the
server, which holds the factorisation, cannot read the structure of the silo's exponents from
the ciphertext's randomness.

Correctness conditions (Theorem 1 of the paper; never silent garbage)
  * 1 ≤ N_u for every user (else step (f) fails: an error naming the user);
  * N_u | DIV, with DIV = lcm(1..N_max) or lcm(``allowed_totals``): a silo refuses a local count
    above N_max, and a verification aggregate after every (a) detects any user whose total does
    not divide DIV (probability of missing it ≤ 2^-40 with a 3072-bit key and N_max = 2000);
  * no wrap-around: |Y| < n / 2^65 -- each silo checks its own encoded values (dither
    included) against its share of that room (derivation and property test: ``no_wrap_bound``),
    and A checks every decrypted coordinate (a wrong key, a modified ciphertext or masks that
    did not cancel give a uniform residue, which fails this check with probability 1 - 2^-64);
  * precision: |Δ - Δ_plain| ≤ P/2 · (Σ_{s,u} w_{s,u} + 2|S|) ≤ P/2 · (|U| + 2|S|) per
    coordinate (rounding of the deltas and the noise, and the dither).
  The paper's remedy for large N_u (DIV = lcm(1..N_max) has 2878 bits for N_max = 2000, so a
  3072-bit key cannot go much beyond N_max ≈ 2040): restrict the totals to ``allowed_totals``
  (e.g. powers of two, DIV = the largest), or cap every user's records per silo at
  ⌊N_max / |S|⌋, which guarantees N_u ≤ N_max locally.

Threat model: semi-honest parties, no collusion between the server and a silo (a colluding silo
knows r_u and would reveal N_u = B_u·r_u^{-1} to the server). The server sees pk-ciphertexts of
uniformly masked values, the blinded totals r_u·N_u (uniform in Z_n when r_u is), the noisy
aggregate Δ, the decrypted Y (whose residue modulo DIV is uniform: the dither) and the
verification value DIV·Σ w t + Σ ω with ω uniform below DIV·2^76 (hiding everything but the
pass/fail bit, residues modulo DIV included). A silo sees its own histogram, pk, the other silos'
X25519 public keys, the sealed seed, ⟦β_u⟧ and the X_u shares (ciphertexts).

Dropouts (issue #22). A silo lost during setup aborts the setup (an error). A round is released
only if every silo asked answered and they number at least t = t(|S|)
(:mod:`pdpfl.fl.aggregation.threshold`, |S| the silos set up): a silo lost during a round leaves
that round **without aggregate** (no retry under fresh masks: re-masking the same contributions
for fewer silos would reveal the lost silo's weighted update as a difference), and is left out of
later rounds. The silos' noise shares are sized σ²C²/t (they receive t in the round
configuration under ``SURVIVORS_KEY``), so every released sum -- at least t shares -- carries the
noise the ledgers charge; Σ_s w_{s,u} ≤ 1 bounds each user's contribution (sensitivity), but it
is the t-share rule, not the weights, that guarantees the noise.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import gmpy2
import numpy as np
from gmpy2 import mpz

from pdpfl.crypto import IntegrityError, ot
from pdpfl.crypto import parallel as par
from pdpfl.crypto.keys import PUBLIC_KEY_BYTES
from pdpfl.crypto.paillier import (
    MIN_SECURE_BITS,
    PaillierPrivateKey,
    PaillierPublicKey,
    generate_keypair,
)
from pdpfl.fl.aggregation import (
    Payload,
    empty_aggregate,
    register_protocol,
    register_silo_handler,
)
from pdpfl.fl.aggregation.private_sampling import ot_plaintexts, transfer_items
from pdpfl.fl.aggregation.private_weighting_core import (
    _CHECK_BOUND_BITS,
    _CHECKS,
    GUARD_BITS,
    PROTOCOL,
    PrivateWeightingClient,
    PrivateWeightingServer,
    UserUpdates,
    WeightingParams,
    cpu_seconds,
    dithers,
    divisor,
    no_wrap_bound,
    noise_plaintext,
    plain_weighted_sum,
)
from pdpfl.fl.aggregation.private_weighting_messages import SCHEMAS
from pdpfl.fl.aggregation.private_weighting_silo import silo_handler
from pdpfl.fl.aggregation.threshold import (
    DEFAULT_MIN_SURVIVORS,
    DEFAULT_THRESHOLD,
    survivor_threshold,
)
from pdpfl.fl.api import Aggregate, Params, Scalars, ServerAlgorithm, Transport

__all__ = [
    "PROTOCOL",
    "PrivateWeightedSum",
    "PrivateWeightingClient",
    "PrivateWeightingServer",
    "UserUpdates",
    "WeightingParams",
    "cpu_seconds",
    "dithers",
    "divisor",
    "no_wrap_bound",
    "noise_plaintext",
    "plain_weighted_sum",
    "silo_handler",
]


# ------------------------------------------------------------------------------ workers


def _encrypt_chunk(sk: PaillierPrivateKey, values: list[int]) -> list[mpz]:
    return [sk.encrypt(v) for v in values]


def _decrypt_chunk(sk: PaillierPrivateKey, per_silo: list[list[mpz]]) -> list[mpz]:
    """⊕ of the silos' ciphertexts, coordinate by coordinate, then CRT decryption."""
    n2 = sk.public_key.n2
    out = []
    for cts in zip(*per_silo, strict=True):
        c = cts[0]
        for other in cts[1:]:
            c = c * other % n2
        out.append(sk.decrypt(c))
    return out


# ------------------------------------------------------------------------------ server side


class PrivateWeightedSum:
    """The server side of Protocol 1: a :class:`~pdpfl.fl.aggregation.SumProtocol`.

    ``threshold`` and ``min_survivors``: the survivor rule (``secure.threshold``,
    ``secure.min_survivors``); a round is released only with every silo asked and at least
    t(|S|) of them. ``last_round`` holds the public facts of the last round and its outcome.

    The first :meth:`collect` runs the setup; every later round reuses it. The Paillier private
    key is created here and never leaves this object. ``timings`` holds the wall time of each
    phase of the last setup/round (for benchmarks). ``view`` (when ``record_view``) keeps every
    reply the server received, for tests of what the server learns.
    """

    name = PROTOCOL
    hides_individual_updates = True

    def __init__(
        self,
        paillier_bits: int = MIN_SECURE_BITS,
        n_max: int = 2000,
        allowed_totals: list[int] | tuple[int, ...] | None = None,
        precision: float = 1e-10,
        workers: int | None = None,
        expected_rounds: int = 1,
        allow_weak_keys: bool = False,
        record_view: bool = False,
        threshold: float = DEFAULT_THRESHOLD,
        min_survivors: int = DEFAULT_MIN_SURVIVORS,
        **_: object,
    ) -> None:
        survivor_threshold(0, threshold, min_survivors)  # validates the rule
        self.threshold = float(threshold)
        self.min_survivors = int(min_survivors)
        #: |S|: the silos set up (t is t(|S|) for the whole run).
        self.set_up = 0
        self.last_round: dict[str, Any] = {}
        self.params = WeightingParams(
            paillier_bits=int(paillier_bits),
            n_max=int(n_max),
            allowed_totals=tuple(allowed_totals) if allowed_totals else None,
            precision=float(precision),
            workers=workers,
            allow_weak_keys=bool(allow_weak_keys),
        )
        self.expected_rounds = max(1, int(expected_rounds))
        self.session: bytes | None = None
        self.participants: list[int] = []
        self.num_users = 0
        self._pk: PaillierPublicKey | None = None
        self.__sk: PaillierPrivateKey | None = None
        self._inverse: list[mpz] = []
        self._epoch = -1
        self._installed_for: tuple[str] | tuple[str, int] | None = None
        self.timings: dict[str, float] = {}
        self.record_view = bool(record_view)
        self.view: list[tuple[str, int, Payload]] = []

    # -- helpers ------------------------------------------------------------------------------
    def _exchange(
        self,
        transport: Transport,
        stage: str,
        requests: dict[int, Payload],
        t: int,
        *,
        required: bool,
    ) -> dict[int, Payload]:
        started = time.perf_counter()
        replies = transport.exchange(PROTOCOL, stage, requests, t)
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - started
        if self.record_view:
            self.view += [(stage, c, dict(r)) for c, r in replies.items()]
        missing = [c for c in requests if c not in replies]
        if required and missing:
            raise RuntimeError(
                f"private weighting: silo(s) {missing} did not answer stage {stage!r}; the setup "
                "needs every silo -- restart the run (a silo lost in a round is dropped instead)"
            )
        return replies

    def _base(self) -> Payload:
        return {"session": self.session}

    # -- setup --------------------------------------------------------------------------------
    def setup(
        self, transport: Transport, participants: list[int], num_users: int, t: int = 0
    ) -> None:
        """Setup (a)-(f) with ``participants`` (all silos) for ``num_users`` users."""
        if not participants:
            raise ValueError("private weighting: no silos to set up")
        started = time.perf_counter()
        self.session = secrets.token_bytes(16)
        self.participants = sorted(int(c) for c in participants)
        self.set_up = len(self.participants)
        self.num_users = int(num_users)
        if self.num_users < 1:
            raise ValueError("private weighting: num_users must be >= 1")
        pk, sk = generate_keypair(self.params.paillier_bits, allow_weak=self.params.allow_weak_keys)
        self._pk, self.__sk = pk, sk
        self.timings["keygen"] = time.perf_counter() - started
        # (a) pk to the silos, DH public keys back
        req = {
            **self._base(),
            **self.params.to_payload(),
            "paillier_n": pk.to_bytes(),
            "num_users": self.num_users,
            "participants": np.asarray(self.participants, dtype=np.int64),
        }
        replies = self._exchange(
            transport, "setup-keys", {c: req for c in self.participants}, t, required=True
        )
        for c in self.participants:
            if replies[c].get("pk_fingerprint") != pk.fingerprint():
                raise IntegrityError(f"private weighting: silo {c} holds another Paillier key")
        dh = b"".join(_pub(replies[c], c) for c in self.participants)
        # (b)-(c) relay DH keys; the first silo seals R for the others
        req = {**self._base(), "dh_publics": dh}
        replies = self._exchange(
            transport, "setup-seed", {c: req for c in self.participants}, t, required=True
        )
        leader = self.participants[0]
        seeds = {c: replies[leader].get(f"seed.{c}") for c in self.participants[1:]}
        if any(not isinstance(v, bytes) for v in seeds.values()):
            raise IntegrityError("private weighting: the first silo did not seal the shared seed")
        # (d)-(e) blinded, masked histograms
        requests = {
            c: {**self._base(), **({"seed": seeds[c]} if c in seeds else {})}
            for c in self.participants
        }
        replies = self._exchange(transport, "setup-histogram", requests, t, required=True)
        started = time.perf_counter()
        n = pk.n
        totals = [mpz(0)] * self.num_users
        for c in self.participants:
            values = pk.integers_from_bytes(
                replies[c].get("blinded_histogram", b""),
                self.num_users,
                what=f"blinded histogram of silo {c}",
            )
            totals = [(a + b) % n for a, b in zip(totals, values, strict=True)]
        # (f) B_u^{-1} mod n
        inverse = []
        for u, b in enumerate(totals):
            if b == 0:
                raise ValueError(
                    f"private weighting: user {u} has no records in any silo (N_u = 0); weights "
                    "n_{s,u}/N_u need 1 <= N_u -- leave users without records out of the user set"
                )
            if gmpy2.gcd(b, n) != 1:  # probability ≈ 2^-1535 for uniform r_u
                raise IntegrityError("private weighting: a blinded total is not invertible; rerun")
            inverse.append(gmpy2.invert(b, n))
        self._inverse = inverse
        self._installed_for = None
        self.timings["inverses"] = time.perf_counter() - started

    def _install(
        self,
        transport: Transport,
        sampled: np.ndarray | None,
        d: int,
        t: int,
        private: tuple[int, int] | None = None,
    ) -> None:
        """Step 2(a): encrypt β_u, let the silos compute and share X_u, install, verify.

        ``private`` = (k, P): private sub-sampling (Sec. 4.1) -- per user P ciphertexts, k of
        β_u and P − k of 0 in a random order; the silo computing X_u obtains one of them by
        1-out-of-P oblivious transfer (:mod:`pdpfl.fl.aggregation.private_sampling`)."""
        assert self._pk is not None and self.__sk is not None
        pk, sk = self._pk, self.__sk
        self._epoch += 1
        epoch = self._epoch
        started = time.perf_counter()
        items: list[list[bytes]] = []
        if private is None:
            beta = [
                b if sampled is None or sampled[u] else mpz(0) for u, b in enumerate(self._inverse)
            ]
        else:
            beta = ot_plaintexts(self._inverse, *private)
        workers = par.worth_parallel(len(beta) * pk.bits * 0.8, self.params.workers)
        chunks = [beta[r.start : r.stop] for r in par.split(len(beta), workers)]
        cts = [c for part in par.run_chunks(_encrypt_chunk, sk, chunks, workers) for c in part]
        self.timings["encrypt_weights"] = self.timings.get("encrypt_weights", 0.0) + (
            time.perf_counter() - started
        )
        if private is None:
            blob = pk.ciphertexts_to_bytes(cts)
        else:
            size = private[1]
            items = [
                [pk.ciphertexts_to_bytes([c]) for c in cts[u * size : (u + 1) * size]]
                for u in range(self.num_users)
            ]
        pending = list(range(self.num_users))
        silos = list(self.participants)
        # (silo, its users, its sealed X_u) per answer: a silo that took over a lost silo's
        # users in a later attempt answers more than once.
        answers: list[tuple[int, list[int], bytes]] = []
        while pending:
            if not silos:
                raise RuntimeError("private weighting: no silo left to compute the weight shares")
            parts = np.array_split(np.asarray(pending, dtype=np.int64), len(silos))
            ask = {c: [int(u) for u in part] for c, part in zip(silos, parts, strict=True)}
            if private is None:
                requests = {
                    c: {
                        **self._base(),
                        "epoch": epoch,
                        "weights": blob,
                        "assign": np.asarray(ask[c], dtype=np.int64),
                    }
                    for c in silos
                }
            else:
                requests = self._oblivious(transport, items, ask, epoch, t)
            replies = self._exchange(transport, "weights", requests, t, required=False)
            for c in silos:
                if c in replies:
                    answers.append((c, ask[c], replies[c].get("shares", b"")))
            pending = sorted(u for c in silos if c not in replies for u in ask[c])
            silos = [c for c in silos if c in replies]
        install: Payload = {
            **self._base(),
            "epoch": epoch,
            "participants": np.asarray(silos, dtype=np.int64),
            "senders": np.asarray([c for c, _, _ in answers], dtype=np.int64),
            "coordinates": int(d),
            "reuse": 1 if sampled is not None or private is not None else self.expected_rounds,
        }
        for i, (_, users, blob_i) in enumerate(answers):
            install[f"shares.{i}"] = blob_i
            install[f"assign.{i}"] = np.asarray(users, dtype=np.int64)
        replies = self._exchange(
            transport, "install", {c: install for c in silos}, t, required=False
        )
        self.participants = [c for c in silos if c in replies]
        if not self.participants:
            raise RuntimeError("private weighting: every silo was lost while installing weights")
        # Verification aggregate: DIV·(Σ w t + Σ ω) must be small; garbage is not.
        started = time.perf_counter()
        product = [mpz(1)] * _CHECKS
        for c in self.participants:
            cts = pk.ciphertexts_from_bytes(
                replies[c].get("check", b""), _CHECKS, what=f"verification ciphertexts of silo {c}"
            )
            product = [pk.add(a, b) for a, b in zip(product, cts, strict=True)]
        ys = [sk.decrypt(c) for c in product]
        bound = mpz(self.params.divisor) << _CHECK_BOUND_BITS
        if not all(y < bound for y in ys):
            raise IntegrityError(
                "private weighting: the verification aggregate is garbage -- some user's total "
                f"N_u does not divide DIV (N_u > N_max = {self.params.max_total}, or not one of "
                "secure.allowed_totals), or a silo used a different key or the weights were "
                "modified; cap each user's records at N_max/|S| per silo, give allowed_totals, "
                "or raise secure.n_max"
            )
        self.timings["verify"] = self.timings.get("verify", 0.0) + time.perf_counter() - started
        self._installed_for = ("all",) if sampled is None and private is None else ("round", t)

    def _oblivious(
        self,
        transport: Transport,
        items: list[list[bytes]],
        ask: dict[int, list[int]],
        epoch: int,
        t: int,
    ) -> dict[int, Payload]:
        """The oblivious transfers of one ``weights`` attempt: stage ``weights-ot`` collects
        each silo's receiver messages B_u for its users, then each user's P sealed items go
        into that silo's ``weights`` request (silos that did not answer get none)."""
        sender = ot.new_sender()
        requests = {
            c: {
                **self._base(),
                "epoch": epoch,
                "ot_sender": sender.public,
                "ot_items": len(items[0]) if items else 0,
                "assign": np.asarray(ask[c], dtype=np.int64),
            }
            for c in ask
        }
        replies = self._exchange(transport, "weights-ot", requests, t, required=False)
        started = time.perf_counter()
        out: dict[int, Payload] = {}
        assert self.session is not None
        for c, reply in replies.items():
            if c not in ask:
                continue
            out[c] = {
                **requests[c],
                "ot_sealed": transfer_items(
                    sender,
                    reply.get("ot_choices"),
                    [items[u] for u in ask[c]],
                    ask[c],
                    self.session,
                    epoch,
                    what=f"silo {c}",
                ),
            }
        self.timings["ot_transfer"] = self.timings.get("ot_transfer", 0.0) + (
            time.perf_counter() - started
        )
        return out

    # -- SumProtocol --------------------------------------------------------------------------
    def collect(
        self,
        transport: Transport,
        selected: list[int],
        params: Params,
        round_index: int,
        config: Scalars,
        server: ServerAlgorithm,
    ) -> Aggregate:
        t = int(round_index)
        d = sum(int(np.asarray(p).size) for p in params)
        num_users = getattr(server, "num_users", None)
        if not isinstance(num_users, int) or num_users < 1:
            raise ValueError(
                "weights: private needs a server algorithm that declares num_users (|U|)"
            )
        sampler = getattr(server, "sampled_users", None)
        sampled = None if sampler is None else sampler(t)
        private = getattr(server, "private_sampling", None)
        if private is not None and sampled is not None:
            raise ValueError("subsampling: private and a server-drawn user mask exclude each other")
        if sampled is not None:
            sampled = np.asarray(sampled, dtype=bool)
            if sampled.shape != (num_users,):
                raise ValueError(f"sampled_users: expected ({num_users},) booleans")
        self.timings = {}
        if self.session is None or self.num_users != num_users:
            self.setup(transport, list(selected) or list(transport.client_ids), num_users, t)
        if sampled is not None or private is not None or self._installed_for is None:
            self._install(transport, sampled, d, t, private)
        participants = [c for c in self.participants if c in set(selected)] if selected else []
        t_needed = self.survivors_needed()
        self.last_round = {"round": t, "asked": list(participants), "t": t_needed}
        if not participants:
            return self._stop("no silo asked", params)
        if len(participants) < t_needed:
            return self._stop(f"refused: {len(participants)} silo(s) < t = {t_needed}", params)
        request: Payload = {
            **self._base(),
            "epoch": self._epoch,
            "threshold": t_needed,
            "participants": np.asarray(participants, dtype=np.int64),
            "num_params": len(params),
        }
        for i, p in enumerate(params):
            request[f"param.{i}"] = np.asarray(p)
        for k, v in config.items():
            request[f"config.{k}"] = v
        replies = self._exchange(
            transport, "round", {c: request for c in participants}, t, required=False
        )
        lost = [c for c in participants if c not in replies]
        if lost:
            # No aggregate and no retry: the partial product still holds the lost silos' masks,
            # and re-masking the others' contributions would reveal theirs as a difference.
            self.participants = [c for c in self.participants if c not in lost]
            self.last_round["lost"] = lost
            return self._stop(f"no aggregate: silo(s) {lost} lost in the round", params)
        total = self._aggregate(replies, participants, d)
        out, start = [], 0
        for p in params:
            arr = np.asarray(p)
            out.append(total[start : start + arr.size].reshape(arr.shape))
            start += arr.size
        self.last_round["outcome"] = "released"
        return Aggregate(
            total=out, weight=float(len(participants)), metrics={}, count=len(participants)
        )

    def survivors_needed(self) -> int:
        """t(|S|) for the silos set up: the fewest silos whose sum a round releases."""
        return survivor_threshold(self.set_up, self.threshold, self.min_survivors)

    def _stop(self, why: str, params: Params) -> Aggregate:
        self.last_round["outcome"] = why
        return empty_aggregate(params)

    def _aggregate(
        self, replies: dict[int, Payload], participants: list[int], d: int
    ) -> np.ndarray:
        """Step 2(c): ⊕ over silos, CRT decryption, no-wrap check, Decode (Algorithm 5)."""
        assert self._pk is not None and self.__sk is not None
        pk, sk = self._pk, self.__sk
        started, cpu = time.perf_counter(), cpu_seconds()
        per_silo = []
        for c in participants:
            if replies[c].get("pk_fingerprint") != pk.fingerprint():
                raise IntegrityError(f"private weighting: silo {c} encrypted under another key")
            per_silo.append(
                pk.ciphertexts_from_bytes(
                    replies[c].get("ciphertexts", b""), d, what=f"ciphertexts of silo {c}"
                )
            )
        workers = par.worth_parallel(d * 1.2 * pk.bits, self.params.workers)
        chunks = [[cts[r.start : r.stop] for cts in per_silo] for r in par.split(d, workers)]
        plain = [m for part in par.run_chunks(_decrypt_chunk, sk, chunks, workers) for m in part]
        n = pk.n
        half = n >> 1
        limit = n >> (GUARD_BITS + 1)
        div = int(self.params.divisor)
        P = float(self.params.precision)
        out = np.empty(d, dtype=np.float64)
        for j, y in enumerate(plain):
            y = int(y - n) if y > half else int(y)
            if abs(y) >= limit:
                raise IntegrityError(
                    "private weighting: a decrypted coordinate is outside the no-wrap range -- "
                    "a wrong key, a modified ciphertext, masks that did not cancel, or a user "
                    "whose N_u does not divide DIV; the aggregate is discarded"
                )
            out[j] = (y / div) * P
        self.timings["aggregate"] = time.perf_counter() - started
        self.timings["aggregate_cpu"] = cpu_seconds() - cpu
        return out


def _pub(reply: Payload, silo: int) -> bytes:
    value = reply.get("dh_public")
    if not isinstance(value, bytes) or len(value) != PUBLIC_KEY_BYTES:
        raise IntegrityError(f"private weighting: silo {silo} sent a malformed DH public key")
    return value


register_protocol(PROTOCOL, PrivateWeightedSum)
register_silo_handler(PROTOCOL, silo_handler, schemas=SCHEMAS, secret_memory=True)
