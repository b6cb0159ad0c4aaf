"""The medium's random lanes and threads (ota.py's rows are built on them): a slot's N(0, 1) draws split over LANES
generators seeded from the slot's stream, by column blocks dealt round-robin, so the values do not depend on the
threads; the column-block loops that share that work over medium_threads() threads, each block writing only its
own columns (numpy's BLAS and SFC64's random_raw release the GIL), with sums added in the blocks' order.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..secret_random import box_muller

TRIANGLE_BLOCK = 48  # rows per block of the triangular product (triangular_rows): two blocks for 45 listeners
MEASURE_COLUMNS = 8192  # columns per block where the rows' powers are measured and the own part added
COLUMN_BLOCK = 4096  # columns per block of the folded draws and product (the block's rows stay in cache)
LANES = 4  # generators a slot's draws are split over (block b in lane b % LANES), whatever the threads


def _lane_seeds(rng: np.random.Generator) -> np.ndarray:
    """One 128-bit seed per lane (LANES rows of 2 words), drawn from `rng` in one call (so from the slot's seeded
    stream)."""
    return rng.integers(0, 2 ** 64, size=(LANES, 2), dtype=np.uint64)


def _lane_blocks(lane: int, d: int):
    """The (start, stop) column blocks of a lane, in the order its generator fills them."""
    return [(c0, min(d, c0 + COLUMN_BLOCK)) for c0 in range(lane * COLUMN_BLOCK, d, LANES * COLUMN_BLOCK)]


class _LaneNormals:
    """A lane's N(0, 1) float32 sampler: numpy's SFC64 words (random_raw releases the GIL) through the Box-Muller of
    the DP draws (secret_random.box_muller). Per value, 2026-11-28: 2.35 ns on one thread, 1.20 ns on two; torch's
    mt19937 normal_ (used before) 3.39 and 1.70 ns; the AES keystream 1.86 and 1.37 ns (it holds the GIL). A slot of
    paper 003's downlink draws 10.1M of them."""

    def __init__(self, seed):
        self._bits = np.random.SFC64(np.random.SeedSequence([int(w) for w in np.asarray(seed).reshape(-1)]))

    def fill(self, out: np.ndarray) -> None:
        """Fill the C-contiguous float32 array `out` with iid N(0, 1)."""
        if not out.flags.c_contiguous or out.dtype != np.float32:
            raise ValueError("_LaneNormals.fill needs a C-contiguous float32 array")
        flat = out.reshape(-1)
        k = -(-flat.size // 2)
        words = self._bits.random_raw(k).view(np.uint32)  # 2k words: k for the radii, k for the angles
        box_muller(words[:k], words[k:], flat)


def standard_normals(rng: np.random.Generator, out: np.ndarray) -> np.ndarray:
    """Fill float32 `out` [r, d] with iid N(0, 1): column blocks of COLUMN_BLOCK columns dealt round-robin to LANES
    lanes, each lane's blocks filled in turn from its own generator (_lane_seeds), each block drawn as a C-contiguous
    [r, width] array: the same values triangular_rows draws, on however many threads."""
    for lane, seed in enumerate(_lane_seeds(rng)):
        gen = _LaneNormals(seed)
        for c0, c1 in _lane_blocks(lane, out.shape[1]):
            block = np.empty((out.shape[0], c1 - c0), dtype=np.float32)
            gen.fill(block)
            out[:, c0:c1] = block
    return out


def row_combination(weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """weights @ rows ([k] @ [k, d], float32) by column blocks of MEASURE_COLUMNS on medium_threads() threads (each
    column's sum is the same whatever the threads)."""
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    d = rows.shape[1]
    out = np.empty(d, dtype=np.float32)

    def block(b: int) -> None:
        c0, c1 = b * MEASURE_COLUMNS, min(d, (b + 1) * MEASURE_COLUMNS)
        np.matmul(weights, rows[:, c0:c1], out=out[c0:c1])

    _over_blocks(block, -(-d // MEASURE_COLUMNS))
    return out


_POOL: dict = {}
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    # nodes are forked from a preloaded forkserver: a child inherits the pool object but none of its threads
    _POOL.pop("executor", None)
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _default_threads() -> int:
    return min(4, os.cpu_count() or 1)


def medium_threads(n: int | None = None) -> int:
    """Threads that share the medium's column blocks (set once per process: the cloud sets channel.medium_threads;
    0 sets the default: the machine's cores, up to 4, since the devices wait at the slot's barrier). The rows do not
    depend on it."""
    with _POOL_LOCK:
        if n is not None:
            _POOL["threads"] = int(n) if n > 0 else _default_threads()
            old = _POOL.pop("executor", None)
            if old is not None:
                old.shutdown(wait=False)
        return _POOL.setdefault("threads", _default_threads())


def _over_blocks(work, blocks: int) -> None:
    """work(b) for b in range(blocks), on medium_threads() threads (numpy's BLAS and SFC64's random_raw release the
    GIL): thread t takes b = t, t + threads, ...; each b must write only its own columns."""
    threads = min(medium_threads(), blocks)
    if threads <= 1:
        for b in range(blocks):
            work(b)
        return
    with _POOL_LOCK:
        pool = _POOL.get("executor")
        if pool is None:
            pool = _POOL["executor"] = ThreadPoolExecutor(_POOL["threads"], thread_name_prefix="medium")
    list(pool.map(lambda t: [work(b) for b in range(t, blocks, threads)], range(threads)))


def triangular_rows(left: np.ndarray, head: np.ndarray, rng) -> np.ndarray:
    """[R, d] float32 rows = left @ [head; W] (R = left's rows, k = head's rows): W iid N(0, 1) [R, d]
    (standard_normals' values from `rng`) behind a lower-triangular left[:, k:]. By column blocks, the LANES lanes on
    medium_threads() threads, each block's normals drawn into a cache-sized scratch under its head columns; the
    product goes by blocks of TRIANGLE_BLOCK rows, each over only the head and the W rows its block reaches: about
    half of the W part's multiply-adds (~R^2 / 2 instead of R^2 a column)."""
    k, d = head.shape
    flat = np.empty((left.shape[0], d), dtype=np.float32)
    seeds = _lane_seeds(rng)

    def lane(j: int) -> None:
        gen, stack = _LaneNormals(seeds[j]), None
        for c0, c1 in _lane_blocks(j, d):
            if stack is None or stack.shape[1] != c1 - c0:
                stack = np.empty((left.shape[1], c1 - c0), dtype=np.float32)
            stack[:k] = head[:, c0:c1]
            gen.fill(stack[k:])  # rows k.. of a C-contiguous block: contiguous
            for r0 in range(0, flat.shape[0], TRIANGLE_BLOCK):
                r1 = min(flat.shape[0], r0 + TRIANGLE_BLOCK)
                np.matmul(left[r0:r1, :k + r1], stack[:k + r1], out=flat[r0:r1, c0:c1])

    _over_blocks(lane, LANES)
    return flat


def measure_then_add(rows: np.ndarray, own: np.ndarray, head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per receiver, ||rows_i||^2 as they are, then rows += own @ head and ||(own @ head)_i||^2: one pass over the
    [n, 2, d] rows by blocks of MEASURE_COLUMNS columns on medium_threads() threads (each block's sums in float32
    while it is in cache, added in float64 in the blocks' order, so the sums do not depend on the threads).
    rows [n, 2, d] float32; own [2 n, k]; head [k, d]."""
    n, d = rows.shape[0], rows.shape[-1]
    flat = rows.reshape(2 * n, d)
    head = head.reshape(-1, d)
    # the small products by einsum's own loop, not BLAS: numpy's BLAS would wake its threads for each block and spin
    # them (~10x the CPU time on the shared 2 cores), and torch's gemm is not bitwise repeatable across runs (a seeded
    # run must repeat exactly: tests/integration/test_medium.py)
    own = np.ascontiguousarray(own, dtype=np.float32)
    blocks = -(-d // MEASURE_COLUMNS)
    sums = np.zeros((blocks, 2, 2 * n))  # per block: the rows' power as they were, the own part's power

    def block(b: int) -> None:
        c0, c1 = b * MEASURE_COLUMNS, min(d, (b + 1) * MEASURE_COLUMNS)
        part = flat[:, c0:c1]
        sums[b, 0] = np.einsum("ij,ij->i", part, part)
        add = np.einsum("ik,kj->ij", own, head[:, c0:c1])
        sums[b, 1] = np.einsum("ij,ij->i", add, add)
        part += add

    _over_blocks(block, blocks)
    power, own_power = sums.sum(axis=0)
    return power.reshape(n, 2).sum(axis=1), own_power.reshape(n, 2).sum(axis=1)
