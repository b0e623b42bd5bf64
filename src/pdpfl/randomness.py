"""Where mechanism randomness comes from: a CSPRNG by default, seeded streams on request.

Every random choice that a differential-privacy guarantee depends on -- the Gaussian noise, the
per-record (or per-user) Poisson coins and the client-sampling coins -- is drawn from a
:class:`RandomStream` obtained from the :class:`Randomness` of *the party that owns the coin*
(a silo owns its noise and record coins; the server owns the client coins).

Two modes (``randomness:`` in the experiment config):

``secure`` (default) -- :class:`SecureRandomness`
    Each party creates its own 256-bit key from :func:`secrets.token_bytes` (the operating
    system's CSPRNG) when it is built. A stream for ``(purpose, *indices)`` is the ChaCha20
    keystream (RFC 7539, via the ``cryptography`` package: OpenSSL) under a per-stream subkey
    ``BLAKE2b(key=party key, purpose ‖ indices)``. The key lives only in that party's memory: it is
    never written to a config, log, checkpoint, state file or message, cannot be pickled, and a
    resumed run or a new Flower message simply draws a fresh one. Knowing the configuration (seed
    included) therefore says nothing about the noise or the coins.

``reproducible`` -- :class:`SeededRandomness`
    The research mode: streams derived from the configured seed with
    :func:`pdpfl.seeding.torch_generator`, so a run can be replayed bit for bit and the
    in-process simulator and a Flower federation draw the same numbers. **Anyone who knows the
    seed can regenerate the noise and subtract it**: no privacy guarantee holds against them.
    Runs in this mode print a warning and record :data:`REPRODUCIBLE_LABEL` in ``summary.json``.

Gaussian noise on the secure path (floating-point attacks, Mironov 2012)
-----------------------------------------------------------------------
Standard normals are produced in float64 by the Box–Muller transform from 53-bit uniforms in
(0, 1) (the radius uses a memoryless tail extension, so it is truncated only at R² ≤ 115, an
event of probability below 1e-25 per pair). As Opacus' ``secure_mode`` does (after Holohan &
Braghin 2021), each returned normal is the sum of four independent standard normals divided by
two, which smooths the float64 lattice of a single draw (the two normals R·cos θ, R·sin θ of a
Box–Muller pair sum to √2·R·sin(θ + π/4), so one sine per pair suffices). All the normals of
one DP step are drawn at once (``normals``): one keystream read, then vectorised float64
arithmetic -- on the device that needs them (the keystream words cross to the accelerator, the
key never does). The caller
adds the float64 noise to a float64 copy of the clipped sum and rounds once to the parameter
dtype (float32), so the released value lives on a grid much coarser than the noise's. Residual
risk, stated as Opacus states it: these measures make the known attacks impractical but are not
a proof; the exact output distribution is a discretised Gaussian, whose distance from the ideal
one is not included in the reported δ.

Exact random bits (``words``)
-----------------------------
Every stream also hands out raw uniform 64-bit words (``words(n)``, uint64): the ChaCha20
keystream itself on the secure path, two 32-bit draws of the seeded generator per word on the
reproducible one. Integer samplers (:mod:`pdpfl.discrete_noise`: the exact discrete Gaussian of
distributed and central discrete noise) consume only these words, so no floating-point number
lies on their path from random bits to the released integer.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch  # imported where it is used: parsing a config never needs it

__all__ = [
    "RandomStream",
    "Randomness",
    "SecureRandomness",
    "SeededRandomness",
    "draw_normals",
    "make_randomness",
    "stream_from_generator",
    "RandomnessMode",
    "REPRODUCIBLE_LABEL",
    "SECURE_LABEL",
    "ReproducibleRandomnessWarning",
]

RandomnessMode = Literal["secure", "reproducible"]

#: What ``summary.json`` says about a run's randomness.
SECURE_LABEL = "secure (ChaCha20 keystream, fresh secret key per party)"
REPRODUCIBLE_LABEL = "reproducible (no guarantee against anyone who knows the seed)"

_TWO_PI = 2.0 * math.pi
_QUARTER_PI = 0.25 * math.pi
_INV_2_53 = 2.0**-53
#: Box–Muller radius: uniforms below this are refined (memoryless property of Exp(1)).
_TAIL_CUT = 2.0**-30
_TAIL_SHIFT = 30.0 * math.log(2.0)
#: Up to this many normals, the CPU draws them with numpy (fewer fixed costs than torch).
_NUMPY_NORMALS = 2048
#: Uniforms per CPU draw that go through a reused per-thread scratch buffer: fresh buffers of
#: a few MB cost more in page faults than the keystream and the arithmetic together.
_SCRATCH_WORDS = 2**20
#: The keystream is ChaCha20 applied to zeros, read in blocks of this many 64-bit words.
_ZERO_WORDS = 2**16
_ZEROS = memoryview(bytes(8 * _ZERO_WORDS))  # sliced without copying
_SCRATCH = threading.local()


def _scratch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This thread's reused ``n``-element int64 and float64 buffers (grown on demand, at most
    :data:`_SCRATCH_WORDS` elements). Callers return fresh tensors, never views of them."""
    import torch

    words = getattr(_SCRATCH, "words", None)
    if words is None or words.numel() < n:
        size = max(n, 2 * words.numel() if words is not None else 0)
        size = min(size, _SCRATCH_WORDS)
        _SCRATCH.words = torch.empty(size, dtype=torch.int64)
        _SCRATCH.floats = torch.empty(size, dtype=torch.float64)
    return _SCRATCH.words[:n], _SCRATCH.floats[:n]


class ReproducibleRandomnessWarning(UserWarning):
    """The run draws its noise and coins from the configured seed (no guarantee)."""


@runtime_checkable
class RandomStream(Protocol):
    """One named stream of random numbers (sequential draws advance it)."""

    def uniform(self, n: int) -> np.ndarray:
        """``n`` independent float64 uniforms in the open interval (0, 1)."""
        ...

    def normal(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """Independent standard normals, float64 CPU tensor of ``shape``.

        pdpfl's streams also accept ``device=`` (the result's device) and offer
        ``normals(shapes, device=)`` (several tensors in one draw; see :func:`draw_normals`).
        """
        ...

    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words (uint64): the exact random bits that integer
        samplers (:mod:`pdpfl.discrete_noise`) consume, with no floating point on the way."""
        ...


@runtime_checkable
class Randomness(Protocol):
    """A party's source of mechanism randomness."""

    mode: RandomnessMode

    def stream(self, purpose: str, *indices: int) -> RandomStream:
        """The stream for ``purpose`` (e.g. ``"local-training"``) and integer ``indices``."""
        ...

    @property
    def label(self) -> str:
        """What a run's summary says about this randomness."""
        ...


# ----------------------------------------------------------------------------- secure mode


def _stream_message(purpose: str, indices: tuple[int, ...]) -> bytes:
    head = purpose.encode("utf-8")
    return (
        struct.pack("<I", len(head)) + head + b"".join(struct.pack("<q", int(i)) for i in indices)
    )


class _ChaChaStream:
    """The ChaCha20 keystream of one subkey, read sequentially."""

    __slots__ = ("_enc",)

    def __init__(self, subkey: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        # The subkey is unique per stream, so a fixed all-zero nonce/counter block is safe.
        self._enc = Cipher(algorithms.ChaCha20(subkey, bytes(16)), mode=None).encryptor()

    def __getstate__(self) -> None:  # never serialise keystream state
        raise TypeError("random streams cannot be pickled or copied")

    def _words_into(self, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` (int64) with 53-bit integers, the top 53 bits of 64-bit keystream
        words (< 2**53: exact in float64), without temporaries."""
        w = out.view(np.uint64)
        for i in range(0, w.size, _ZERO_WORDS):  # keystream = ChaCha20(zeros)
            blk = w[i : i + _ZERO_WORDS]
            self._enc.update_into(_ZEROS[: 8 * blk.size], blk.view(np.uint8).data)
        np.right_shift(w, np.uint64(11), out=w)
        return out

    def _words_np(self, n: int) -> np.ndarray:
        """``n`` 53-bit integers (int64), see :meth:`_words_into`."""
        return self._words_into(np.empty(n, dtype=np.int64))

    @staticmethod
    def _to_uniform(k: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float64 uniforms ``(k + 1/2)·2⁻⁵³`` in the open interval (0, 1) (into ``out``)."""
        import torch

        u = k.to(torch.float64) if out is None else out.copy_(k)
        return u.add_(0.5).mul_(_INV_2_53)

    def _uniform_tensor(
        self, n: int, device: torch.device | None = None, scratch: bool = True
    ) -> torch.Tensor:
        """``n`` float64 uniforms on ``device``; on the CPU (``scratch``), up to
        :data:`_SCRATCH_WORDS` of them in this thread's scratch buffer (valid until the next
        call in the thread)."""
        import torch

        cpu = device is None or device.type == "cpu"
        if scratch and cpu and n <= _SCRATCH_WORDS:
            words, floats = _scratch(n)
            self._words_into(words.numpy())
            return self._to_uniform(words, floats)
        k = torch.from_numpy(self._words_np(n))
        return self._to_uniform(k if device is None else k.to(device))

    def words(self, n: int) -> np.ndarray:
        """``n`` raw 64-bit keystream words (uint64, little-endian), in keystream order.

        The next ``8n`` keystream bytes, exactly as :meth:`uniform` would consume them (it keeps
        the top 53 bits of the same words); no shift, no floating point.
        """
        n = int(n)
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        out = np.empty(n, dtype=np.uint64)
        for i in range(0, n, _ZERO_WORDS):  # keystream = ChaCha20(zeros)
            blk = out[i : i + _ZERO_WORDS]
            self._enc.update_into(_ZEROS[: 8 * blk.size], blk.view(np.uint8).data)
        return out

    def uniform(self, n: int) -> np.ndarray:
        n = int(n)
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        if n == 0:
            return np.zeros(0, dtype=np.float64)
        out = np.empty(n, dtype=np.float64)
        np.add(self._words_np(n), 0.5, out=out)  # the int64 words convert exactly
        return np.multiply(out, _INV_2_53, out=out)

    def _standard_normals(self, n: int, device: torch.device | None) -> torch.Tensor:
        """``n`` normals, each (N₁ + N₂ + N₃ + N₄)/2 from two Box–Muller pairs.

        Keystream layout: 2n radius uniforms and 2n angle uniforms (one read), then (rarely) one
        refinement uniform per radius uniform below 2⁻³⁰. A pair (R = √(2E), θ), E ~ Exp(1),
        gives the two independent normals R·cos θ and R·sin θ, whose sum is
        √2·R·sin(θ + π/4); normal k sums those of pairs k and n + k and halves, i.e.
        √E_k·sin φ_k + √E_{n+k}·sin φ_{n+k} with φ = θ + π/4 (one sine, no cosine).
        """
        import torch

        pairs = 2 * n
        if n <= _NUMPY_NORMALS and (device is None or device.type == "cpu"):
            return torch.from_numpy(self._standard_normals_np(n))
        u = self._uniform_tensor(2 * pairs, device)
        radius, theta = u[:pairs], u[pairs:]
        small = radius < _TAIL_CUT if float(radius.min()) < _TAIL_CUT else None
        e = radius.log_().neg_()  # Exp(1)
        if small is not None:  # memoryless tail: -log U given U < 2⁻³⁰ is 30·log 2 + Exp(1)
            count = int(small.sum())
            refine = self._uniform_tensor(count, device, scratch=False).log_()  # u is scratch
            e[small] = _TAIL_SHIFT - refine
        s = e.sqrt_().mul_(theta.mul_(_TWO_PI).add_(_QUARTER_PI).sin_())  # √E·sin φ, E ≤ 58
        return torch.add(s[:n], s[n:])  # a fresh tensor (u may be scratch)

    def _standard_normals_np(self, n: int) -> np.ndarray:
        """:meth:`_standard_normals` in numpy (same keystream layout and arithmetic): fewer
        fixed costs for the few normals of a small model."""
        pairs = 2 * n
        u = self.uniform(2 * pairs)
        radius, theta = u[:pairs], u[pairs:]
        small = radius < _TAIL_CUT if radius.min() < _TAIL_CUT else None
        e = np.log(radius)
        np.negative(e, out=e)
        if small is not None:
            count = int(small.sum())
            e[small] = _TAIL_SHIFT - np.log(self.uniform(count))
        np.multiply(theta, _TWO_PI, out=theta)
        np.add(theta, _QUARTER_PI, out=theta)
        s = np.sqrt(e, out=e)
        s *= np.sin(theta, out=theta)
        out: np.ndarray = s[:n] + s[n:]
        return out

    def normal(
        self, shape: tuple[int, ...] | torch.Size, *, device: torch.device | str | None = None
    ) -> torch.Tensor:
        import torch

        shape = tuple(int(s) for s in shape)
        dev = None if device is None else torch.device(device)
        n = math.prod(shape)
        if n == 0:
            return torch.zeros(shape, dtype=torch.float64, device=dev)
        return self._standard_normals(n, dev).reshape(shape)

    def normals(
        self,
        shapes: Sequence[tuple[int, ...] | torch.Size],
        *,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Normals for several tensors as one flat float64 vector (one draw, in order)."""
        return self.normal((sum(math.prod(tuple(s)) for s in shapes),), device=device)


class SecureRandomness:
    """Mechanism randomness from a fresh secret key (see the module docstring).

    Parameters
    ----------
    key
        32 secret bytes. Leave it ``None`` (the default): a fresh key is drawn from
        :func:`secrets.token_bytes`. Passing a key exists for tests of the stream derivation only.
    """

    mode: RandomnessMode = "secure"

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = secrets.token_bytes(32)
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise ValueError("key: expected 32 bytes")
        self.__key = bytes(key)

    @property
    def label(self) -> str:
        return SECURE_LABEL

    def stream(self, purpose: str, *indices: int) -> RandomStream:
        subkey = hashlib.blake2b(
            _stream_message(str(purpose), tuple(int(i) for i in indices)),
            key=self.__key,
            digest_size=32,
            person=b"pdpfl-rng-v1",
        ).digest()
        return _ChaChaStream(subkey)

    def __repr__(self) -> str:
        return "SecureRandomness(<secret key>)"

    def __getstate__(self) -> None:
        raise TypeError("SecureRandomness holds a secret key and cannot be pickled or copied")

    def __deepcopy__(self, memo: dict[int, object]) -> SecureRandomness:
        raise TypeError("SecureRandomness holds a secret key and cannot be copied")


# ------------------------------------------------------------------------- reproducible mode


class _TorchStream:
    """A stream backed by a seeded ``torch.Generator`` (reproducible mode)."""

    __slots__ = ("_gen",)

    def __init__(self, generator: torch.Generator) -> None:
        self._gen = generator

    def uniform(self, n: int) -> np.ndarray:
        import torch

        n = int(n)
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        u = torch.rand(n, generator=self._gen, dtype=torch.float64).numpy()
        # torch.rand is in [0, 1): map an exact 0 into the open interval.
        return np.where(u > 0.0, u, _INV_2_53 / 2)

    def words(self, n: int) -> np.ndarray:
        """``n`` uniform 64-bit words (uint64): two uniform 32-bit halves from the generator
        (``torch.randint(0, 2**32)``), high half first; reproducible from the seed."""
        import torch

        n = int(n)
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        halves = torch.randint(0, 1 << 32, (n, 2), generator=self._gen, dtype=torch.int64)
        h = halves.numpy().astype(np.uint64)
        return (h[:, 0] << np.uint64(32)) | h[:, 1]

    def normal(
        self, shape: tuple[int, ...] | torch.Size, *, device: torch.device | str | None = None
    ) -> torch.Tensor:
        # drawn on the CPU whatever ``device`` is: the same numbers on every machine
        import torch

        z = torch.randn(tuple(int(s) for s in shape), generator=self._gen, dtype=torch.float64)
        return z if device is None else z.to(device)

    def normals(
        self,
        shapes: Sequence[tuple[int, ...] | torch.Size],
        *,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """The concatenation of ``normal(shape).flatten()`` for each shape, in order."""
        import torch

        parts = [self.normal(tuple(s)).reshape(-1) for s in shapes]
        z = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        return z if device is None else z.to(device)


def draw_normals(
    stream: RandomStream,
    shapes: Sequence[tuple[int, ...] | torch.Size],
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Standard normals for several tensors as one flat float64 vector on ``device``.

    Uses the stream's ``normals`` (one draw: the secure stream converts its CPU keystream to
    normals on ``device``; the seeded stream draws on the CPU, in tensor order) and falls back to
    one ``normal`` call per shape for other :class:`RandomStream` implementations.
    """
    import torch

    fn = getattr(stream, "normals", None)
    if callable(fn):
        out: torch.Tensor = fn(shapes, device=device)
        return out
    parts = [stream.normal(tuple(s)).reshape(-1) for s in shapes]
    z = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    return z if device is None else z.to(device)


def stream_from_generator(generator: torch.Generator) -> RandomStream:
    """Wrap a seeded ``torch.Generator`` as a stream (reproducible research use only)."""
    import torch

    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    return _TorchStream(generator)


class SeededRandomness:
    """Streams derived from the experiment seed (``randomness: reproducible``; no guarantee)."""

    mode: RandomnessMode = "reproducible"

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    @property
    def label(self) -> str:
        return REPRODUCIBLE_LABEL

    def stream(self, purpose: str, *indices: int) -> RandomStream:
        from pdpfl.seeding import torch_generator

        return _TorchStream(torch_generator(self.seed, str(purpose), *indices))

    def __repr__(self) -> str:
        return f"SeededRandomness(seed={self.seed})"


def make_randomness(mode: str, seed: int | None = None, *, warn: bool = False) -> Randomness:
    """The randomness of one party: ``"secure"`` (fresh key) or ``"reproducible"`` (``seed``).

    With ``warn=True`` the reproducible mode emits a :class:`ReproducibleRandomnessWarning`.
    """
    if mode == "secure":
        return SecureRandomness()
    if mode == "reproducible":
        if seed is None:
            raise ValueError("seed: required for randomness 'reproducible'")
        if warn:
            warnings.warn(
                "randomness: reproducible -- noise and sampling coins are derived from the "
                "configured seed; anyone who knows it can remove the noise (no privacy guarantee "
                "against them). Use randomness: secure for real deployments.",
                ReproducibleRandomnessWarning,
                stacklevel=2,
            )
        return SeededRandomness(seed)
    raise ValueError(f"randomness: expected 'secure' or 'reproducible', got {mode!r}")
