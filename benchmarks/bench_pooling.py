"""Max-pooling on CPU: torch.nn.MaxPool2d against common/pooling.MaxPool2d (the same values and gradients, its
forward on a channels-last copy), one torch thread. Run:

    PYTHONPATH=. python benchmarks/bench_pooling.py [--repeats 7] [--steps 20]

For each shipped CNN at a workload's batch: one SGD step (forward, backward, update) and one evaluation forward of
2,000 images in batches of 64, with either pool, taking turns in every repeat; and the first pool alone (forward and
backward). Medians over the repeats, and the ratio ours / torch's of each repeat's pair.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

from hfl.common.models import build, init_parameters
from hfl.common.pooling import MaxPool2d

CASES = [("mnist-cnn", (1, 28, 28), 32), ("ota-cnn", (1, 28, 28), 60), ("cifar-cnn", (1, 28, 28), 100),
         ("cifar-cnn", (3, 32, 32), 64)]  # cifar-cnn on 28x28x1 is paper 001's workload (batch 100)


def _with_torch_pools(model: nn.Module) -> nn.Module:
    for i, m in enumerate(model):
        if isinstance(m, MaxPool2d):
            model[i] = nn.MaxPool2d(m.kernel_size)
    return model


def _timed(fn, steps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; ms, median of {args.repeats} repeats (ours / torch's per repeat)")
    for name, shape, batch in CASES:
        gen = torch.Generator().manual_seed(0)
        ours = build(name, shape, 10)
        init_parameters(ours, gen)
        theirs = _with_torch_pools(build(name, shape, 10))
        theirs.load_state_dict(ours.state_dict())
        x, y = torch.randn(batch, *shape, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
        test = torch.randn(2000, *shape, generator=gen)
        first = next(i for i, m in enumerate(ours) if isinstance(m, MaxPool2d))
        with torch.no_grad():
            act = ours[:first](x).relu()

        def step(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every repeat times the same model

            def run():
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            return run

        def evaluate(model):
            def run():
                with torch.no_grad():
                    for i in range(0, len(test), 64):
                        model(test[i:i + 64])
            return run

        def pool_alone(pool):
            a = act.clone().requires_grad_(True)

            def run():
                a.grad = None
                pool(a).sum().backward()
            return run

        rows = {"SGD step": (step(ours), step(theirs), args.steps),
                "evaluation, 2,000 images": (evaluate(ours), evaluate(theirs), max(1, args.steps // 10)),
                f"first pool alone {list(act.shape)}": (pool_alone(MaxPool2d(2)), pool_alone(nn.MaxPool2d(2)),
                                                         args.steps)}
        for label, (a, b, steps) in rows.items():
            mine, torchs, ratios = [], [], []
            for _ in range(args.repeats):
                ta, tb = _timed(a, steps), _timed(b, steps)
                mine.append(ta)
                torchs.append(tb)
                ratios.append(ta / tb)
            print(f"{name} {'x'.join(map(str, shape))} batch {batch}, {label}: torch {statistics.median(torchs):.2f}, "
                  f"ours {statistics.median(mine):.2f}, ratio {statistics.median(ratios):.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
