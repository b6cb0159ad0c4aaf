"""Randomness of DP mechanisms: secret by default, seeded only as an explicit replay option.

Every tier knows `run.seed` (it is in the config the cloud sends and in `config.toml`), so noise drawn from it can
be regenerated and subtracted by anyone who receives the release. A DP draw (noise, lots, client draws that claim
amplification, DP-SQ coins) therefore comes from a generator keyed by 256 fresh bits of the operating system's
CSPRNG (`secrets`, i.e. os.urandom), made on the node that adds the noise, per release, never logged or sent.

`privacy.noise_source = "seeded"` keeps the old behaviour (a generator seeded by run seed, tier, node, round,
purpose) for bit-identical replays; such a run is not private against anyone holding the seed, and every privacy
figure it reports says so (`SEEDED_LABEL`).

Every DP draw comes from an AES-256-CTR keystream under that key (`CipherDraws`: a CSPRNG, as Opacus' optional
torchcsprng), normals by Box-Muller on its 32-bit words: DP-SGD's lots and noise (`dp_draws`), and through
`CipherGenerator` (numpy.random.Generator's methods: `dp_numpy_rng`) the devices' and edges' noise, DP-FedAvg's client
draw and DP-SQ's coins; `seeded` keys the same keystream from the run seed. It is also the fastest sampler measured
here: 159,010 normals in 0.30 ms against torch's mt19937 normal_ at 0.54 ms and numpy's ziggurat at 1.49 ms
(benchmarks/reports/dp-draws.md; 0.43 ms as float64 through CipherGenerator).

What the float samplers do not protect against: floating-point Gaussian / Laplace samplers leak
through the low-order bits of their outputs (Mironov 2012). A party that sees a noisy release at full float32
precision could in principle exploit that; the emulator does not snap or use a discrete sampler (README, Privacy).
Box-Muller on 32-bit words bounds a normal by sqrt(64 ln 2) = 6.66 (torch's 24-bit uniforms: 5.77); the mass the
bound removes, 2.7e-11, is far below any delta the accountant is asked for.
"""
from __future__ import annotations

import math
import secrets

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .seeding import seed_sequence

SOURCES = ("secret", "seeded")
SEEDED_LABEL = "not private against anyone holding run.seed (privacy.noise_source = seeded: DP noise is replayable)"


def dp_numpy_rng(source: str, seed: int, tier: str, node, round_: int = 0, *purpose) -> "CipherGenerator":
    """The draws of one DP release outside DP-SGD (a device's or an edge's noise, DP-FedAvg's client draw, DP-SQ's
    coins) with numpy.random.Generator's methods: dp_draws' keystream (fresh CSPRNG key, or the run seed's for a
    seeded replay)."""
    return CipherGenerator(dp_draws(source, seed, tier, node, round_, *purpose))


def dp_draws(source: str, seed: int, tier: str, node, round_: int = 0, *purpose) -> "CipherDraws":
    """DP-SGD's lots and noise for one release: a keystream under 256 fresh CSPRNG bits (secret) or under a key
    derived from (run seed, tier, node, round, purpose) (seeded replay: the same draws bit for bit)."""
    if source == "seeded":
        return CipherDraws(seed_sequence(seed, tier, node, round_, *purpose).generate_state(8, np.uint32).tobytes())
    if source != "secret":
        raise ValueError(f"noise source must be one of {', '.join(SOURCES)}, got {source!r}")
    return CipherDraws(secrets.token_bytes(32))


_ANGLE = np.float32(2 * math.pi / 2 ** 32)
_LOG_2_32 = np.float32(32 * math.log(2))
_SQRT2 = np.float32(math.sqrt(2))


def box_muller(first: np.ndarray, second: np.ndarray, out: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Normals N(0, scale^2) from pairs of uint32 words (Box & Muller 1958): r = sqrt(-2 ln u1), u1 = (a + 1) 2^-32 in
    (0, 1], theta = 2 pi b 2^-32; out[:k] = scale r cos theta, out[k:] = scale r sin theta for the first len(out) - k
    pairs (k = len(first) = ceil(len(out) / 2)). float32 throughout (log1p of a uint32 rounds a + 1 to 24 significant
    bits, which moves ln u1 by at most 2^-24 relative); nine numpy calls, as few as the formula allows (the scale
    rides on sqrt 2's)."""
    k = len(first)
    r = np.log1p(first, dtype=np.float32)
    np.subtract(_LOG_2_32, r, out=r)  # -ln u1 = 32 ln 2 - ln(a + 1)
    np.sqrt(r, out=r)
    r *= _SQRT2 if scale == 1.0 else np.float32(math.sqrt(2) * scale)
    theta = np.multiply(second, _ANGLE, dtype=np.float32)
    np.cos(theta, out=out[:k])
    out[:k] *= r
    rest = len(out) - k
    np.sin(theta[:rest], out=out[k:])
    out[k:] *= r[:rest]
    return out


class CipherDraws:
    """Lots and noise of DP-SGD from one AES-256-CTR keystream (counter from 0: a key serves one release only).
    Tensors are float32 / int64 torch tensors sharing numpy's memory."""

    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ValueError(f"a CipherDraws key is 32 bytes (AES-256), got {len(key)}")
        self._stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self._zeros = self._scratch = bytearray()

    def words(self, n: int, dtype=np.uint32) -> np.ndarray:
        """The next n words of the keystream: a view of a scratch buffer that the next call overwrites (fresh buffers
        of this size are mapped afresh by malloc: their page faults cost 5x the cipher)."""
        size = n * np.dtype(dtype).itemsize
        if len(self._zeros) < size:
            self._zeros, self._scratch = bytearray(size), bytearray(size + 15)  # update_into: block size - 1 spare
        self._stream.update_into(memoryview(self._zeros)[:size], self._scratch)
        return np.frombuffer(self._scratch, dtype, count=n)

    def randn(self, *shape: int, out=None, scale: float = 1.0):
        """Normals N(0, scale^2) of `shape` (or into the float32 tensor `out`, which gives the shape)."""
        import torch

        n = math.prod(shape) if out is None else out.numel()
        if out is None or not out.is_contiguous() or out.dtype != torch.float32:
            out = torch.empty(shape if out is None else out.shape, dtype=torch.float32)
        k = -(-n // 2)
        w = self.words(2 * k)
        box_muller(w[:k], w[k:], out.view(-1).numpy(), scale)
        return out

    def rand(self, n: int):
        """n uniforms on [0, 1) with 24-bit resolution (float32's)."""
        import torch

        return torch.from_numpy((self.words(n) >> 8).astype(np.float32) * np.float32(2 ** -24))

    def sample(self, n: int, k: int):
        """k distinct indices of range(n), a uniformly random subset (in no particular order): the k smallest of n
        64-bit keystream words (a tie has probability below n^2 2^-65). A selection, not a sort: 2-4x cheaper."""
        import torch

        keys = torch.from_numpy(self.words(n, np.uint64).view(np.int64))
        return keys.topk(k, largest=False, sorted=False).indices


def _shape(size) -> tuple[int, tuple | None]:
    """(values, shape) of numpy's `size` argument (None: one value, returned as a float)."""
    if size is None:
        return 1, None
    shape = (int(size),) if np.ndim(size) == 0 else tuple(int(v) for v in size)
    return math.prod(shape), shape


def _broadcast(size, *params):
    """numpy's rule: without `size`, one draw per element of the broadcast parameters (None where they are scalars)."""
    if size is not None:
        return size
    shape = np.broadcast(*[np.asarray(p) for p in params]).shape
    return shape or None


class CipherGenerator:
    """The numpy.random.Generator methods DP releases call (random, standard_normal, normal, laplace, spawn), drawn
    from a CipherDraws keystream: float64 arrays as numpy gives them. Uniforms have 53 random bits (64-bit words);
    normals are Box-Muller's on 32-bit words (float32, bounded by 6.66); Laplace is the inverse CDF of a uniform in
    (0, 1) that never reaches either end, (k + 1/2) 2^-52 for a 52-bit k, so its tails reach ln 2^52 = 36 scales."""

    def __init__(self, draws: CipherDraws):
        self.draws = draws

    def _uniform(self, n: int) -> np.ndarray:
        return (self.draws.words(n, np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

    @staticmethod
    def _out(values: np.ndarray, shape):
        return float(values[0]) if shape is None else values.reshape(shape)

    def random(self, size=None):
        n, shape = _shape(size)
        return self._out(self._uniform(n), shape)

    def below(self, n: int, p: float) -> np.ndarray:
        """self.random(n) < p, the same booleans from the same words, in one comparison: u = k 2^-53 for the word's top
        53 bits k, and k 2^-53 < p exactly when the word is below ceil(p 2^53) 2^11 (p 2^53 is exact in float64)."""
        words = self.draws.words(n, np.uint64)  # used up whatever p is: the stream stays where random(n) leaves it
        if not p > 0:
            return np.zeros(n, bool)
        if p >= 1:
            return np.ones(n, bool)
        return words < np.uint64(math.ceil(p * 2.0 ** 53) << 11)

    def standard_normal(self, size=None, dtype=np.float64):
        n, shape = _shape(size)
        k = -(-n // 2)
        w = self.draws.words(2 * k)
        z = box_muller(w[:k], w[k:], np.empty(n, np.float32))
        return self._out(z if dtype == np.float32 else z.astype(dtype), shape)

    def normal(self, loc=0.0, scale=1.0, size=None):
        z = self.standard_normal(_broadcast(size, loc, scale))
        return loc + scale * z

    def laplace(self, loc=0.0, scale=1.0, size=None):
        n, shape = _shape(_broadcast(size, loc, scale))
        k = (self.draws.words(n, np.uint64) >> np.uint64(12)).astype(np.float64)
        u = (k + 0.5) * 2.0 ** -52  # exact in float64: never 0 or 1
        x = np.log(2.0 * np.minimum(u, 1.0 - u))  # ln 2u below 1/2, -ln 2(1 - u) above
        np.copysign(x, u - 0.5, out=x)
        return loc + scale * self._out(x, shape)

    def spawn(self, n: int) -> list["CipherGenerator"]:
        """n independent generators, each keyed by 32 bytes of this keystream."""
        return [CipherGenerator(CipherDraws(self.draws.words(8).tobytes())) for _ in range(n)]


class TorchDraws:
    """A torch.Generator behind CipherDraws' methods (tests, benchmarks and callers that pass one)."""

    def __init__(self, generator):
        self.generator = generator

    def randn(self, *shape: int, out=None, scale: float = 1.0):
        import torch

        if out is not None:
            z = torch.randn(out.shape, generator=self.generator, out=out)
        else:
            z = torch.randn(shape, generator=self.generator)
        return z if scale == 1.0 else z.mul_(scale)

    def rand(self, n: int):
        import torch

        return torch.rand(n, generator=self.generator)

    def sample(self, n: int, k: int):
        import torch

        return torch.randperm(n, generator=self.generator)[:k]


def as_draws(source):
    """CipherDraws and TorchDraws as they are; a torch.Generator wrapped in TorchDraws."""
    return source if isinstance(source, (CipherDraws, TorchDraws)) else TorchDraws(source)


def source_of(cfg) -> str:
    """The run's DP noise source (privacy.noise_source)."""
    return getattr(cfg.privacy, "noise_source", "secret")
