"""Benchmark (not a test): what a quantizing link costs per message at paper 001's size, one core. Run:

    python benchmarks/bench_codecs.py [--dim 467818] [--codec qsgd] [--repeats 15]

Times, CPU per call (median of the repeats, the parts taking turns), the parts of `Link.send` / `receive` for one
model-sized float32 vector (default: paper 001's CNN, d = 467,818, QSGD with s = 4): bit packing and unpacking of the
codes, quantize and dequantize, the whole encode and decode, the measured distortion and the expected error a
sender records. Each part runs twice, in two fresh processes: with glibc's default heap thresholds, and with the
thresholds a node sets (`common/heap.py` `configure`: freed buffers of up to 32 MiB stay in the heap until the
node's once-a-second trim), so the ratio shows what the page faults of fresh model-sized buffers cost.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def measure(dim: int, codec_name: str, repeats: int, configured: bool) -> dict:
    import numpy as np

    from hfl import families  # noqa: F401
    from hfl.common import heap, wire
    from hfl.common.pipeline import _distortion
    from hfl.common.quantization import packing, qsgd
    from hfl.common.seeding import numpy_rng

    if configured:
        heap.configure()
    v = np.random.default_rng(0).normal(size=dim).astype(np.float32)
    codec = wire.CODECS.get(codec_name)
    rng = numpy_rng(0, "device", 1, 0, 0, "encode")
    norms, codes = qsgd.qsgd_quantize(v, 4, rng)
    width = qsgd.code_width(4)
    packed = packing.pack(codes, width)
    tensor = wire.encode(v, codec_name, "delta", rng)
    decoded = codec.decode(tensor)
    parts = {
        "pack": lambda: packing.pack(codes, width),
        "unpack": lambda: packing.unpack(packed, width, dim),
        "qsgd quantize": lambda: qsgd.qsgd_quantize(v, 4, rng),
        "qsgd dequantize": lambda: qsgd.qsgd_dequantize(norms, codes, 4),
        "encode (quantize + pack + envelope)": lambda: wire.encode(v, codec_name, "delta", rng),
        "decode (parse + unpack + dequantize)": lambda: codec.decode(tensor),
        "measured distortion": lambda: _distortion(v, decoded),
        "expected error": lambda: codec.expected_stats(v),
    }
    times: dict[str, list[float]] = {k: [] for k in parts}
    for fn in parts.values():
        fn()
    for _ in range(repeats):
        for name, fn in parts.items():
            t = time.process_time()
            fn()
            times[name].append(time.process_time() - t)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=467_818)
    ap.add_argument("--codec", default="qsgd")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--one", choices=["default", "configured"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.dim, args.codec, args.repeats, args.one == "configured")))
        return 0
    out = {}
    for mode in ("default", "configured"):
        run = subprocess.run([sys.executable, __file__, "--dim", str(args.dim), "--codec", args.codec, "--repeats",
                              str(args.repeats), "--one", mode], capture_output=True, text=True, check=True)
        out[mode] = json.loads(run.stdout.splitlines()[-1])
    print(f"{args.codec}, d = {args.dim:,}, one thread, CPU ms per call (median of {args.repeats}):")
    print(f"  {'part':40s} {'glibc default':>14s} {'heap.configure':>15s}")
    for name in out["default"]:
        a, b = out["default"][name], out["configured"][name]
        print(f"  {name:40s} {a:14.2f} {b:15.2f}   x{b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
