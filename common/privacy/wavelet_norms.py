"""DP-SGD-WAV's clip norms without [B, P]: ||W (.) H_i|| (sound) or ||H_i|| (paper) of each example's Haar
coefficients from book-keeping parts (per_example.bookkeeping_clipped_sum), level by level (wavelet_part_norms).

What is exploited (paper 002's unnormalised Haar transform, wavelet.py; P values zero-padded to m = 2^n).
Let S_j,k(g) be the sum of g over the k-th block of 2^j coordinates (S_0 = g) and Q_j = sum_k S_j,k^2
(Q_0 = ||g||^2). Level j's detail is d(j)_k = (S_j-1,2k - S_j-1,2k+1) / 2^j and H_0 = S_n,0 / m, so with the
level's energy E_j = sum_k (S_j-1,2k - S_j-1,2k+1)^2 = 2 Q_j-1 - Q_j:
    ||W (.) H(g)||^2 = sum_{j=1..n} E_j + Q_n = 2 Q_0 + Q_1 + ... + Q_n-1      (sound: W_c d(j)_k = S_L - S_R)
    ||H(g)||^2       = sum_{j=1..n} 4^-j E_j + Q_n / m^2                        (paper)
The sound norm is a positive sum of the block sums' squared norms: one pair-sum and one norm per level, no
differences, no cancellation; the paper norm keeps the differences (its weights would cancel). (The transform is
orthogonal up to a scale per level, not one scale, so neither norm is ||g||: the levels must be visited, but not
the coefficients of each example.)
A Linear layer's per-example gradient is the outer product d a^T (row-major [out, in]). When 2^j divides `in`
and the layer's offset in the transformed vector, every block of 2^j lies inside one row, S_j(d a^T) = d (x)
S_j(a), and
    Q_j(d a^T) = ||d||^2 Q_j(a),   E_j(d a^T) = ||d||^2 E_j(a),
so levels 1..J cost O(B (out + in)) and the first array of the layer's size class is its level-J block sums
[B, out in / 2^J] (2^J = 16 for the mlp's 784 inputs: 1/16 of [B, P]); the coarser levels run on those.
Other parameters (biases, Conv2d weights that book-keeping forms per example, small Linear layers) are dense
rows. Clipping scales an example's whole gradient (or one layer of it) and the HWT is linear:
    sum_i s_i HWT(g_i) = HWT(sum_i s_i g_i),
so the clipped sum is the book-keeping one ((s (.) d)^T a per Linear layer).
Past level J (sound calibration, large layers): with the layer's rows in groups of G = 2^t (G | out), a group holds
exactly `in / 2^J` blocks of level J + t, so Q_J+t(d a^T) = <sum_g d_g d_g^T, C_t^T C_t> with C_t a fixed 0/1
product of S_J(a): [B, G, G] Gram matrices instead of the [B, out in / 2^J] outer product (_grouped_levels).
"""
from __future__ import annotations

import functools
import threading
from typing import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from .wavelet import CALIBRATIONS, WaveletLayout

_FACTORED_MIN = 4096  # Linear layers at least this large keep their outer-product form


def _trailing_zeros(v: int) -> int:
    return (v & -v).bit_length() - 1 if v else 62


def _sq(v: torch.Tensor) -> torch.Tensor:
    """Per-row squared L2 norm [B] float64. Accumulated in v's float32 (torch's cascade sum, relative error ~1e-7 on
    these positive sums, well inside clip_factors' 2^-16 shrink): a float64 accumulation first copies v to float64,
    which cost the mlp's DP-SGD-WAV step a tenth of a plain step."""
    return torch.linalg.vector_norm(v, dim=1).to(torch.float64).square_()


_TAIL = 64  # rows this short finish their levels in one product with a cached matrix (dispatch, not flops, costs)


@functools.lru_cache(maxsize=256)
def _tail_matrix(length: int, first: int, count: int, n: int, weighted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels first..first+count-1 of rows of `length` block sums as one product: M [length, K] (rows zero padded
    to whole blocks of the last level) and weights w [K], so that (s M)^2 w is what _haar_levels adds and the last columns are
    the block sums after the levels."""
    c = min(count, max(0, (length - 1).bit_length()))  # the levels that still pair values (then one sum is left)
    lp = -(-length // (1 << c)) << c  # padded to whole blocks of the last of them
    cols, weights = [], []
    for t in range(1, c + 1):
        j, size = first + t - 1, 1 << t
        for k in range(lp // size):
            col = np.zeros(lp)
            if weighted:
                col[k * size:(k + 1) * size] = 1.0
                weights.append(1.0 if j < n else 0.0)
            else:
                col[k * size:k * size + size // 2] = 1.0
                col[k * size + size // 2:(k + 1) * size] = -1.0
                weights.append(4.0 ** -j)
            cols.append(col)
    size = 1 << c
    extra = range(first + c, first + count)  # levels past a single block sum S: (S - 0)^2 each
    for k in range(lp // size):
        col = np.zeros(lp)
        col[k * size:(k + 1) * size] = 1.0
        cols.append(col)
        weights.append(sum(1.0 for j in extra if j < n) if weighted else sum(4.0 ** -j for j in extra))
    m = torch.from_numpy(np.stack(cols, 1)[:length].astype(np.float32))
    return m, torch.tensor(weights, dtype=torch.float64)


_BLOCK = 4  # arrays of at most _BLOCK_MAX values go through blocks of 2^_BLOCK values, _BLOCK levels in one product
_BLOCK_MAX = 1 << 17


@functools.lru_cache(maxsize=256)
def _tail_weights(length: int, first: int, count: int, n: int, weighted: bool) -> torch.Tensor:
    """The weights of _tail_matrix(length, first, count, n, weighted) as float32 (its products are float32)."""
    return _tail_matrix(length, first, count, n, weighted)[1].to(torch.float32)


def _haar_levels(s: torch.Tensor, first: int, last: int, n: int, acc: torch.Tensor, weighted: bool) -> torch.Tensor:
    """Levels first..last of an n-level HWT on block sums s [B, L] (blocks of 2^(first-1), zero padded on the
    right). Adds to acc [B] (float64) Q_j for each j < n (weighted) or 4^-j E_j (not); returns the block sums at
    level `last`. Large arrays go level by level (strided pair sums: about one add per value, memory bound);
    smaller ones _BLOCK levels at a time, viewed as [B L / 2^_BLOCK, 2^_BLOCK] in one product with the cached
    matrix of a block's pair sums (or differences) at those levels, whose last column is the block's sum (2^_BLOCK
    multiply-adds per value, but a handful of calls where per-call dispatch is what costs); short rows finish in
    one product (_tail_matrix)."""
    b = s.shape[0]
    j, norms, weights = first, [], []
    while j <= last and s.shape[1] > _TAIL and s.numel() > _BLOCK_MAX:
        if s.shape[1] % 2:
            s = F.pad(s, (0, 1))
        left, right = s[:, 0::2], s[:, 1::2]
        if not weighted:
            norms.append(torch.linalg.vector_norm(left - right, dim=1))
            weights.append(4.0 ** -j)
        s = left + right
        if weighted and j < n:
            norms.append(torch.linalg.vector_norm(s, dim=1))
            weights.append(1.0)
        j += 1
    if norms:
        acc.add_(torch.stack(norms, 1).square() @ torch.tensor(weights))
    while j <= last and s.shape[1] > _TAIL:
        c = min(_BLOCK, last - j + 1)
        size = 1 << c
        if s.shape[1] % size:
            s = F.pad(s, (0, -s.shape[1] % size))
        m, _ = _tail_matrix(size, j, c, n, weighted)
        out = s.reshape(-1, size) @ m  # [B L / size, K]: every level's values of each block, its sum last
        s = out[:, -1].view(b, -1).contiguous()  # a strided view would take the product's slow path
        acc.add_(out.square_().view(b, -1, m.shape[1]).sum(1) @ _tail_weights(size, j, c, n, weighted))
        j += c
    if j <= last:
        m, _ = _tail_matrix(s.shape[1], j, last - j + 1, n, weighted)
        out = s @ m
        acc.add_(out.square() @ _tail_weights(s.shape[1], j, last - j + 1, n, weighted))
        s = out[:, m.shape[1] - _tail_width(s.shape[1], last - j + 1):]
    return s


def _tail_width(length: int, count: int) -> int:
    """How many block sums rows of `length` have after `count` more levels (as _tail_matrix pads them)."""
    c = min(count, max(0, (length - 1).bit_length()))
    return -(-length // (1 << c))


_GROUP_LEVELS = 3  # at most this many levels past J0 in row groups of up to 2^_GROUP_LEVELS rows


@functools.lru_cache(maxsize=64)
def _group_matrix(cols: int, k: int) -> torch.Tensor:
    """[cols, cols (2 + 4 + ... + 2^k)] 0/1: S @ it gives, for t = 1..k in turn, C_t [cols, 2^t] (row-major) of a row S
    of `cols` block sums: rows r of a group of G = 2^t laid out row-major and cut into blocks of G values, C_t[c, r]
    the sum of the part of block c that lies in row r."""
    parts = []
    for t in range(1, k + 1):
        g = 1 << t
        m = np.zeros((cols, cols, g), dtype=np.float32)
        col, r = np.meshgrid(np.arange(cols), np.arange(g), indexing="ij")  # the value S[col] in row r of the group
        m[col, (r * cols + col) // g, r] = 1.0
        parts.append(m.reshape(cols, -1))
    return torch.from_numpy(np.concatenate(parts, 1))


def _grouped_levels(d: torch.Tensor, sx: torch.Tensor, j0: int, k: int, n: int, acc: torch.Tensor,
                    out: torch.Tensor) -> None:
    """Levels j0+1..j0+k of a factored Linear layer d (x) S (S = sx, its input's level-j0 block sums [B, c]) without
    the [B, out c] outer product: with rows in groups of G = 2^t (G | out), a group's G c values are exactly c blocks
    of level j0+t, and block b of group g sums to sum_r d[g G + r] C_t[b, r], C_t[b, r] the part of S (in row r of
    the group) inside block b (one product with a cached 0/1 matrix for every t). So Q_j0+t = sum_g ||C_t^T d_g||^2
    = <sum_g d_g d_g^T, C_t^T C_t>, two [B, G, G] Gram matrices per level below j0+k, and the level-(j0+k)
    block sums are one batched product [B, out / G, G] @ [B, G, c], written to `out` [B, out / G, c]. Adds Q_j
    (j < n) to acc."""
    b, cols = sx.shape
    every = sx @ _group_matrix(cols, k)  # C_1, ..., C_k side by side
    at = 0
    for t in range(1, k + 1):
        g = 1 << t
        part = every[:, at:at + cols * g].view(b, cols, g)
        at += cols * g
        if t < k:
            if j0 + t < n:
                # float32 Grams: float64 ones (a copy of both operands and a batched double product) cost twice as much
                # and the sum hardly cancels (only blocks that straddle two rows give C_t^T C_t off-diagonal terms)
                dg = d.view(b, -1, g)
                gram = torch.bmm(dg.transpose(1, 2), dg).mul_(torch.bmm(part.transpose(1, 2), part))
                acc.add_(gram.view(b, -1).sum(1, dtype=torch.float64))
        else:
            # into a fresh array, then copied: bmm into a view of the coarse array (row stride != its width) takes a
            # per-example loop, twice the time of the product and the copy
            out.copy_(torch.bmm(d.view(b, -1, g), part.transpose(1, 2)))
            if j0 + t < n:
                acc.add_(_sq(out.reshape(b, -1)))


@functools.lru_cache(maxsize=256)
def _norm_plan(shapes: tuple, m: int, weighted: bool, b: int) -> tuple:
    """What _segment_norm_sq does for pieces of these shapes (("linear", out, in) or ("rows", width)), computed once:
    (n, J0, k, J, factored, sizes, width). Python bookkeeping per step is as costly as the small layers' arithmetic."""
    n = m.bit_length() - 1
    sizes = [s[1] * s[2] if s[0] == "linear" else s[1] for s in shapes]
    offsets = np.cumsum([0] + sizes[:-1]).tolist()
    aligned = [min(_trailing_zeros(s[2]), _trailing_zeros(off)) if s[0] == "linear" and size >= _FACTORED_MIN else 0
               for s, size, off in zip(shapes, sizes, offsets)]
    # the common coarse level J: the alignment of the least aligned large Linear layer (those below J materialise)
    big = [a for a in aligned if a > 0]
    J = min(min(big), n) if big else 0
    factored = [J > 0 and a >= J for a in aligned]
    # sound calibration: the factored layers go on k more levels in row groups (Gram products, see the comment above)
    k = 0
    if weighted and any(factored):
        k = max(0, min([_GROUP_LEVELS, n - J] + [min(_trailing_zeros(shapes[i][1]), _trailing_zeros(offsets[i]) - J)
                                                 for i, f in enumerate(factored) if f]))
        if b * sum(sizes[i] >> J for i, f in enumerate(factored) if f) <= _BLOCK_MAX:
            k = 0  # a small outer product costs less than the Gram products that replace it
    J0, J = J, J + k  # the coarse array holds the level-J block sums; a's own levels stop at J0
    # the level-J block sums of the whole vector: factored layers as d (x) S_J(a), runs of dense rows (each starts
    # on a 2^J boundary and ends on one or, zero padded, at the data's end) after their levels 1..J
    width = sum(size >> J if f else 0 for size, f in zip(sizes, factored))
    runs, run = [], []
    for i, f in enumerate(factored):
        if f:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(i)
    if run:
        runs.append(run)
    width += sum(-(-sum(sizes[i] for i in r) // (1 << J)) for r in runs)
    width += -width % (1 << min(n - J, 6))  # whole pairs for the next six levels (fewer pads)
    return n, J0, k, J, tuple(factored), tuple(sizes), width


def _segment_norm_sq(pieces: list, m: int, weighted: bool) -> torch.Tensor:
    """||W (.) HWT(g)||^2 (weighted) or ||HWT(g)||^2 [B] float64 of the per-example vectors g made of `pieces`
    (book-keeping parts, contiguous from offset 0), padded to m: see the comment above."""
    b = pieces[0][1].shape[0]
    dtype = pieces[0][1].dtype
    n, J0, k, J, factored, sizes, width = _norm_plan(
        tuple((p[0], p[1].shape[1], p[2].shape[1]) if p[0] == "linear" else (p[0], p[1].shape[1]) for p in pieces),
        m, weighted, b)
    acc = torch.zeros(b, dtype=torch.float64)
    coarse = _scratch("coarse", b, width, dtype)
    at, i = 0, 0
    while i < len(pieces):
        if factored[i]:
            d, x = pieces[i][1], pieces[i][2]
            qa = _sq(x).mul_(2.0) if weighted else torch.zeros(b, dtype=torch.float64)
            sx = _haar_levels(x, 1, J0, n, qa, weighted)  # the levels 1..J0 of a; d's norm factors out
            acc.add_(qa * _sq(d))
            w = sizes[i] >> J
            out = coarse[:, at:at + w].view(b, d.shape[1] >> k, sx.shape[1])
            if k:
                _grouped_levels(d, sx, J0, k, n, acc, out)
            else:
                torch.mul(d[:, :, None], sx[:, None, :], out=out)
            at += w
            i += 1
            continue
        run = [pieces[i]]
        i += 1
        while i < len(pieces) and not factored[i]:
            run.append(pieces[i])
            i += 1
        width_run = sum(_dense_width(p) for p in run)
        tail = -width_run % (1 << J)
        r = _scratch("run", b, width_run + tail, dtype)  # the run and its zero padding, written in place
        col = 0
        for p in run:
            col = _dense_into(p, r, col)
        r[:, col:].zero_()
        if weighted:
            acc.add_(_sq(r), alpha=2.0)
        r = _haar_levels(r, 1, J, n, acc, weighted)
        coarse[:, at:at + r.shape[1]] = r
        at += r.shape[1]
    coarse[:, at:].zero_()
    s = _haar_levels(coarse, J + 1, n, n, acc, weighted)
    if n == 0:  # m = 1: the one coefficient is the value
        return acc.add_(_sq(s), alpha=-1.0 if weighted else 1.0)
    return acc if weighted else acc.add_(_sq(s) / float(m) ** 2)


_SCRATCH = threading.local()


def _scratch(name: str, b: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's reused buffer `name` ([b, width]): a fresh array of a few hundred KB per step is mapped anew by
    the allocator and costs its page faults (zero-padding the mlp's 2,210-value dense run took a third of a plain
    step)."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (b, width, dtype)
    if name not in bufs or bufs[name][0] != key:
        bufs[name] = (key, torch.empty(b, width, dtype=dtype))
    return bufs[name][1]


def _dense_width(part) -> int:
    return part[1].shape[1] * part[2].shape[1] if part[0] == "linear" else part[1].shape[1]


def _dense_into(part, out: torch.Tensor, col: int) -> int:
    """Write a book-keeping part's per-example rows (d a^T flattened, or the rows themselves) into out[:, col:];
    returns the next column."""
    w = _dense_width(part)
    if part[0] == "linear":
        d, a = part[1], part[2]
        torch.mul(d[:, :, None], a[:, None, :], out=out[:, col:col + w].view(d.shape[0], d.shape[1], a.shape[1]))
    else:
        out[:, col:col + w] = part[1]
    return col + w


def wavelet_part_norms(parts: Sequence, layout: WaveletLayout, calibration: str) -> torch.Tensor:
    """[B, layout segments] norms ||W (.) H_i|| (sound) or ||H_i|| (paper) of each example's Haar coefficients,
    from book-keeping parts (one per parameter tensor, in order: ("linear", d, a) or ("rows", g)), without
    forming [B, P]. Equals layout.row_norms of the materialised per-example gradients (up to float32 rounding)."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")
    weighted = calibration == "sound"
    if layout.scope == "flat":
        groups = [list(parts)]
    else:
        groups = [[p] for p in parts]
    if len(groups) != len(layout.padded):
        raise ValueError(f"{len(groups)} parameter groups for a layout of {len(layout.padded)} segments")
    return torch.stack([_segment_norm_sq(g, m, weighted) for g, m in zip(groups, layout.padded)], 1).sqrt()
