"""Benchmark (not a test): paper 004's DP-SQ encode of one model-sized vector against one pass over it. Run:

    python benchmarks/bench_dpsq_encode.py [--dim 159010] [--bits 4] [--repeats 31]

CPU per call (process time, median of the repeats, the parts taking turns) of `wire.encode(v, "dpsq", ...)` with a
DP release's generator (fresh CSPRNG key, as a device draws its coins), its quantizer alone, and, as the unit, one
pass over the vector (`v.astype(float64)`, the first thing the quantizer does): the encode's cost in passes. The
default size is the 784-200-10 MLP of paper 004 (159,010 values). The process keeps freed buffers in its heap as a
node does (common/heap.configure); --plain leaves malloc's defaults.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=159_010)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--plain", action="store_true", help="malloc's defaults, not a node's heap settings")
    args = ap.parse_args()
    import numpy as np

    from hfl import families  # noqa: F401  (the codecs' registrations)
    from hfl.common import wire
    from hfl.common.quantization.dpsq import dpsq_quantize
    from hfl.common.secret_random import dp_numpy_rng

    if not args.plain:
        from hfl.common import heap

        heap.configure()

    v = np.random.default_rng(0).normal(size=args.dim).astype(np.float32)

    def rng():
        return dp_numpy_rng("secret", 0, "device", 1, 0, 0, "encode")

    parts = {
        "one pass (astype float64)": lambda: v.astype(np.float64),
        "dpsq quantize": lambda: dpsq_quantize(v, rng(), args.bits, 1e-6),
        "encode (quantize + pack + tensor)": lambda: wire.encode(v, "dpsq", "delta", rng(), bits=args.bits,
                                                                 epsilon1=1e-6, range_mode="minmax"),
    }
    times: dict[str, list[float]] = {k: [] for k in parts}
    for fn in parts.values():
        fn()
    for _ in range(args.repeats):
        for name, fn in parts.items():
            t = time.process_time()
            fn()
            times[name].append(time.process_time() - t)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    unit = ms["one pass (astype float64)"]
    for name, value in ms.items():
        print(f"{name:40s} {value:7.3f} ms  {value / unit:6.1f} passes")
    print(json.dumps(ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
