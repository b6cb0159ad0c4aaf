"""DP noise samplers, one core: CPU time per call of n standard normals (float32) and of one fixed lot.

    python benchmarks/bench_draws.py [--sizes 7850 159010 225034] [--repeats 9] [--calls 200]

Compares the device's keystream sampler (secret_random.CipherDraws: AES-256-CTR words, Box-Muller in numpy) with
torch's mt19937 `normal_` (what DP-SGD drew from before), numpy's ziggurat on PCG64DXSM (the other DP draws
before 2026-11-28) and the numpy-facing keystream generator they use now (secret_random.CipherGenerator, float64
out as numpy.random.Generator.standard_normal gives), the first three writing into a preallocated buffer, taking turns within every repeat; reports the median per call and the
ratio against torch's in the same repeat (median of the paired ratios).
"""
from __future__ import annotations

import argparse
import secrets
import statistics
import time

import numpy as np
import torch

from hfl.common.secret_random import CipherDraws, dp_numpy_rng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[7850, 159010, 225034])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--lot", type=int, nargs=2, default=[1280, 64], metavar=("N", "K"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cipher, gen = CipherDraws(bytes(32)), torch.Generator().manual_seed(0)
    rng = np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(secrets.randbits(256))))
    numpy_facing = dp_numpy_rng("secret", 0, "device", 0)
    print(f"torch {torch.__version__}, numpy {np.__version__}, one thread, {args.calls} calls x {args.repeats} repeats")
    for n in args.sizes:
        out, arr = torch.empty(n), np.empty(n, np.float32)
        fns = {"torch normal_ (mt19937)": lambda: out.normal_(generator=gen),
               "keystream (AES-CTR, Box-Muller)": lambda: cipher.randn(out=out),
               "numpy ziggurat (PCG64DXSM)": lambda: rng.standard_normal(dtype=np.float32, out=arr),
               "CipherGenerator.standard_normal (float64)": lambda: numpy_facing.standard_normal(n)}
        _report(f"{n:,} normals", fns, args)
    n, k = args.lot
    _report(f"a lot of {k} from {n}", {"torch randperm (mt19937)": lambda: torch.randperm(n, generator=gen)[:k],
                                       "keystream (64-bit keys, top-k)": lambda: cipher.sample(n, k)}, args)


def _report(what: str, fns: dict, args) -> None:
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            t = time.process_time()
            for _ in range(args.calls):
                fn()
            times[name].append((time.process_time() - t) / args.calls)
    first = next(iter(times.values()))
    print(what)
    for name, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(v, first))
        print(f"  {name:34s} {statistics.median(v) * 1e3:7.3f} ms   x{ratio:.2f}")


if __name__ == "__main__":
    main()
