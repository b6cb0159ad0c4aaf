"""Local-training throughput: DP-SGD (per-example clipping + noise) against plain SGD, same model and batch.

    python benchmarks/bench_dpsgd.py [--models linear mlp mnist-cnn ota-cnn cifar-cnn] [--batch 64] [--steps 10]
                                     [--repeats 5] [--wavelet] [--no-vmap] [--opacus] [--per-example] [--wall]

Reports samples/second (median of --repeats runs, each of --steps steps) and the DP/plain cost as the median of
the paired ratios within each repeat. Times are this process' CPU time by default (torch on one thread): on a
2-core machine shared with other work the wall clock measures the neighbours as much as the code (--wall for it).
"dp-sgd" uses the book-keeping (ghost-norm) clipped sum, "dp-sgd[vmap]" materialises per-example gradients with
torch.func, "dp-sgd-wav" is paper 002's DP-SGD-WAV on the book-keeping path (coefficient-domain norms level by
level, noise transformed alone: see privacy/wavelet_norms.py, wavelet_noise.py). --opacus times a full DP step
(per-example gradients, clipping, noise, update) of the project's dp_sgd and of Opacus' PrivacyEngine
(grad_sample_mode "hooks" and, for Linear-only models, "ghost") on the same model, batch, clip and sigma in the same
repeat, and checks both clipped sums on one fixed batch (Opacus is the optional extra: pip install -e ".[bench]",
opacus 1.6.0).
Synthetic uint8 images; throughput does not depend on pixel values.

Measured 2026-11-24 (2 shared CPU cores, load average 10-13, CPU time, batch 64, 10 steps, median of 5):
cost vs plain SGD                       dp-sgd   dp-sgd-wav                 project / Opacus full DP step (hooks; ghost)
    linear     (M = 7,850)              x1.80    x3.67 (x3.49 in a rerun)   x0.39; x0.42
    mlp        (159,010)                x2.03    x3.77 (was x197)           x0.06; x0.47
    mnist-cnn  (28,938)                 x1.38    x1.41                      x0.82
    ota-cnn    (225,034)                x1.37    x1.59                      x0.36
    cifar-cnn  (591,274)                x1.92    x2.25 (was x5.9)           x0.67
    clipped sums, project vs Opacus on one batch: max |diff| / max |sum| = 1.5e-5 to 1.6e-5 (Opacus divides by
    norm + 1e-6, the project shrinks clipped rows by 2^-16 so that float32 norms stay <= C)
Rerun of the Opacus comparison on the models of paper 002's reproduction and mnist-cnn, 2026-11-25 00:42-00:45 UTC,
load average 12.5-13.6, `PYTHONPATH=. python benchmarks/bench_dpsgd.py --models linear mlp mnist-cnn --opacus
--no-vmap --repeats 5 --steps 10` (CPU time, batch 64, median of 5 paired ratios):
                full DP step vs plain SGD: project  Opacus hooks  Opacus ghost   project / Opacus (hooks; ghost)
    linear                                  x1.73        x4.08         x3.94      x0.42; x0.44
    mlp                                     x2.00       x32.58         x3.92      x0.06; x0.51
    mnist-cnn                               x1.47        x1.90           -        x0.77
    clipped sums, project vs Opacus: 1.5e-5 to 1.6e-5 relative. The project's step is the faster on every model,
    so nothing was profiled for this comparison. tests/unit/test_opacus_parity.py checks the clipped sums (hooks,
    ghost; clip 0.05, 1, 100) and one full step with the noise off (book-keeping and vmap paths) against Opacus
    on fixed batches; it is skipped when the bench extra is not installed.
DP-SGD-WAV after issue 25's changes (row-group Gram levels, block products, cached plans and noise scales, noise
scaled inside the inverse), 2026-11-24 22:45-22:55 UTC, load average 3-4, `PYTHONPATH=. python
benchmarks/bench_dpsgd.py --models linear mlp --wavelet --repeats 5 --no-vmap`, 4 runs each of the code before
(9367b9d) and after, in turn; the figure is the median over the runs of each run's median paired ratio:
    linear   x3.32 (3.21-3.86) -> x3.04 (2.82-3.25)      mlp   x4.73 (4.30-4.76) -> x4.36 (4.22-4.55)
    in one process, old and new dp_sgd taking turns (25 repeats): new / old = 0.88 (linear), 0.93 (mlp)
    all five models, one run each (same load): mnist-cnn x1.61 -> x1.60, ota-cnn x1.56 -> x1.44, cifar-cnn x2.29 -> x2.07
The ratios depend on the load: plain SGD gains more from a quiet machine than DP-SGD-WAV does (the unchanged mlp
is x3.8 at load 10-13, x4.3-4.8 at load 3). <= 3x is met on linear only in some runs and missed on the mlp. Where
the time goes (same load, dp_sgd with one part replaced, paired against plain SGD): linear x2.82 = x1.84 without
the coefficient-domain norms (so the norms cost ~1.0x a plain step: about 40 small tensor calls, dispatch-bound)
and x2.44 without the wavelet noise (~0.4x); mlp x4.22 = x2.62 without the norms (~1.6x: memory-bound passes over
the level block sums, the materialised 10 x 200 second layer, the Gram products) and x3.82 without the noise (~0.4x:
ten strided passes of the inverse; the 159k normal draws cost as much as in dp-sgd). What would close it: one
fused pass per level array (a compiled kernel that sums every level's squares in one sweep), drawing the finest
levels' noise in block order so that four inverse levels are one product.
linear-nobias (M = 7,840, the model paper 000's digest states) added to the shipped models measured, 2026-11-27
17:40 UTC, load average 3-5 (a sweep at nice 5 beside it), `PYTHONPATH=. python benchmarks/bench_dpsgd.py --models
linear linear-nobias --wavelet --no-vmap --repeats 7`: dp-sgd x1.64 / x1.66, dp-sgd-wav x2.85 / x3.35 (linear /
linear-nobias): without the bias the 7,840 weights are one factored layer and the padded m = 8,192 leaves the
coarse levels to the dense tail path, so <= 3x is missed there too (by ~12%).
DP-SGD-WAV after this session's norm and noise changes (no float64 copies, no fresh padded arrays, the finest noise
levels in block order; benchmarks/reports/wavelet-norms.md), 2026-11-28 12:10-12:16 UTC, `--models linear linear-nobias
mlp mnist-cnn ota-cnn --wavelet --no-vmap --repeats 7 --steps 20`, the tree before and after in turn, twice:
    linear 2.88x, 2.65x -> 2.58x, 2.60x    linear-nobias 2.87x, 2.72x -> 2.54x, 2.50x    mlp 3.97x, 3.53x -> 3.25x, 3.15x
    mnist-cnn 1.68x, 1.68x -> 1.61x, 1.71x    ota-cnn 1.69x, 1.96x -> 1.78x, 1.63x    cifar-cnn (once) 1.43x -> 1.38x
Run from a worktree, PYTHONPATH=. is needed: `python benchmarks/...` puts benchmarks/ first on sys.path and imports
the installed hfl.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch

from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy.dpsgd import dp_sgd
from hfl.common.privacy.per_example import _bookkeeping_layers, bookkeeping_clipped_sum, per_example_gradients
from hfl.common.secret_random import dp_draws
from hfl.device_client.training import local_sgd, make_shard

SHAPES = {"linear": (1, 28, 28), "linear-nobias": (1, 28, 28), "mlp": (1, 28, 28), "mnist-cnn": (1, 28, 28),
          "cifar-cnn": (3, 32, 32), "ota-cnn": (1, 28, 28)}


def _setup(name: str, n: int):
    shape = SHAPES[name]
    model = build(name, shape, 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n,) + shape, dtype=np.uint8)
    y = rng.integers(0, 10, size=n)
    return model, get_flat(model), make_shard(x, y, [0.5] * shape[0], [0.25] * shape[0])


def _clock(cpu: bool):
    # CPU time of this process (torch on one thread): on a 2-core machine shared with other work, wall time
    # measures the neighbours as much as the code; --wall times the wall clock instead
    return time.process_time if cpu else time.perf_counter


def _median_rates(fns: dict, samples: int, repeats: int, cpu: bool = True) -> tuple[dict, dict]:
    """Median samples/s of each function; the functions take turns within every repeat, so a load change on
    a shared machine hits all of them alike."""
    clock = _clock(cpu)
    for fn in fns.values():
        fn()  # warm-up (vmap tracing, allocator)
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = clock()
            fn()
            times[k].append(clock() - t)
    rates = {k: samples / statistics.median(v) for k, v in times.items()}
    first = next(iter(fns))
    # cost relative to the first function, as the median of the ratios within each repeat
    ratios = {k: statistics.median(a / b for a, b in zip(v, times[first])) for k, v in times.items() if k != first}
    return rates, ratios


def bench_training(name: str, batch: int, steps: int, repeats: int, wavelet: bool, cpu: bool = True,
                   vmap: bool = True, mt19937: bool = False) -> tuple[dict, dict]:
    n = batch * 20
    model, w, shard = _setup(name, n)
    gen = torch.Generator().manual_seed(1)
    draws = dp_draws("secret", 1, "device", 0)  # the device's DP draws: AES-CTR keystream (secret_random)
    q = batch / n
    fns = {
        "plain": lambda: local_sgd(model, w, shard, 0.05, batch, gen, steps=steps),
        # fixed lots of exactly `batch` examples: the same work per step as plain SGD
        "dp-sgd": lambda: dp_sgd(model, w, shard, 0.05, steps, q, 1.0, 1.0, "gaussian", draws, lot="fixed",
                                 grad_method="bookkeeping"),
    }
    if vmap:
        fns["dp-sgd[vmap]"] = lambda: dp_sgd(model, w, shard, 0.05, steps, q, 1.0, 1.0, "gaussian", draws,
                                             lot="fixed", grad_method="vmap")
    if wavelet:
        fns["dp-sgd-wav"] = lambda: dp_sgd(model, w, shard, 0.05, steps, q, 1.0, 1.0, "wavelet", draws, lot="fixed")
    if mt19937:  # the same steps with torch's generator as the draws (before the keystream sampler)
        fns["dp-sgd[mt19937]"] = lambda: dp_sgd(model, w, shard, 0.05, steps, q, 1.0, 1.0, "gaussian", gen,
                                                lot="fixed", grad_method="bookkeeping")
        if wavelet:
            fns["dp-sgd-wav[mt19937]"] = lambda: dp_sgd(model, w, shard, 0.05, steps, q, 1.0, 1.0, "wavelet", gen,
                                                        lot="fixed")
    return _median_rates(fns, batch * steps, repeats, cpu)


def _opacus_private(model, batch: int, clip: float, sigma: float, lr: float, mode: str):
    """Opacus' PrivacyEngine on a copy of `model`: (module, DPOptimizer), fixed-size batches, mean loss."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(batch, 1), torch.zeros(batch, dtype=torch.long)), batch_size=batch)
    module = copy.deepcopy(model)
    out = PrivacyEngine(accountant="rdp").make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=lr),
        data_loader=loader, noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=False,
        grad_sample_mode=mode)
    module, opt = out[0], out[1]
    return module, opt, (out[2] if mode == "ghost" else None)


def opacus_clipped_sum(model, x, y, clip: float, mode: str = "hooks") -> torch.Tensor:
    """Opacus' sum of clipped per-example gradients on one batch (DPOptimizer.clip_and_accumulate), flat."""
    module, opt, criterion = _opacus_private(model, len(y), clip, 0.0, 0.0, mode)
    opt.zero_grad()
    if criterion is not None:
        criterion(module(x), y).backward()
        return torch.cat([p.grad.reshape(-1) for p in module.parameters()])  # ghost: already the sum
    torch.nn.functional.cross_entropy(module(x), y).backward()
    opt.clip_and_accumulate()
    return torch.cat([p.summed_grad.reshape(-1) for p in module.parameters()])


def opacus_step(model, x, y, clip: float, lr: float) -> torch.Tensor:
    """One full DP step of Opacus' PrivacyEngine (hooks, noise multiplier 0) on the batch (x, y) from `model`'s
    weights: the new flat weights, w - lr * (sum of clipped per-example gradients) / len(y)."""
    module, opt, _ = _opacus_private(model, len(y), clip, 0.0, lr, "hooks")
    opt.zero_grad()
    torch.nn.functional.cross_entropy(module(x), y).backward()
    opt.step()
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def bench_opacus(name: str, batch: int, steps: int, repeats: int, cpu: bool = True) -> tuple[dict, dict, dict]:
    """A full DP-SGD step (per-example gradients, clipping, noise, update) of the project and of Opacus'
    PrivacyEngine (hooks and, for Linear-only models, ghost clipping) on the same model, batch, clip and sigma, taking
    turns in every repeat; and the largest difference between the two clipped sums on one fixed batch."""
    n = batch * 20
    model, w, shard = _setup(name, n)
    x, y = shard.batch(torch.arange(batch))
    params = {k: v.detach() for k, v in model.named_parameters()}
    ours, _, _ = bookkeeping_clipped_sum(model, params, x, y, torch.tensor([1.0], dtype=torch.float64), False,
                                         _bookkeeping_layers(model))
    check = {}
    modes = ["hooks"] + (["ghost"] if all(not isinstance(m, torch.nn.Conv2d) for m in model.modules()) else [])
    for mode in modes:
        ref = opacus_clipped_sum(model, x, y, 1.0, mode)
        check[mode] = float((ours - ref).abs().max() / ref.abs().max())
    gen = torch.Generator().manual_seed(1)
    draws = dp_draws("secret", 1, "device", 0)
    fns = {"plain": lambda: local_sgd(model, w, shard, 0.05, batch, gen, steps=steps),
           "project": lambda: dp_sgd(model, w, shard, 0.05, steps, batch / n, 1.0, 1.0, "gaussian", draws,
                                     lot="fixed")}
    for mode in modes:
        module, opt, criterion = _opacus_private(model, batch, 1.0, 1.0, 0.05, mode)

        def run(module=module, opt=opt, criterion=criterion):
            for _ in range(steps):
                xb, yb = shard.batch(torch.randperm(n, generator=gen)[:batch])
                opt.zero_grad()
                loss = (criterion or torch.nn.functional.cross_entropy)(module(xb), yb)
                loss.backward()
                opt.step()
        fns[f"opacus[{mode}]"] = run
    rates, ratios = _median_rates(fns, batch * steps, repeats, cpu)
    return rates, ratios, check


def bench_per_example(name: str, batch: int, repeats: int) -> dict:
    model, w, shard = _setup(name, batch)
    x, y = shard.batch(torch.arange(batch))
    params = {k: v.detach() for k, v in model.named_parameters()}
    out = {}
    try:
        from opacus import GradSampleModule
    except Exception as exc:  # optional dependency
        out["opacus"] = f"unavailable ({type(exc).__name__})"
        return {"torch.func": _median_rates({"f": lambda: per_example_gradients(model, params, x, y)}, batch,
                                            repeats)[0]["f"], **out}
    gsm = GradSampleModule(copy.deepcopy(model), loss_reduction="sum")  # Opacus hooks the module it wraps

    def opacus_grads():
        for p in gsm.parameters():
            p.grad_sample = None
            p.grad = None
        torch.nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
        return torch.cat([p.grad_sample.reshape(batch, -1) for p in gsm.parameters()], dim=1)

    ref, _ = per_example_gradients(model, params, x, y)
    diff = float((opacus_grads() - ref).abs().max())
    out, _ = _median_rates({"torch.func": lambda: per_example_gradients(model, params, x, y),
                            "opacus": opacus_grads}, batch, repeats)
    out["max_abs_diff"] = diff
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "mnist-cnn"], choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wavelet", action="store_true", help="also time DP-SGD-WAV")
    parser.add_argument("--no-vmap", action="store_true", help="skip DP-SGD with torch.func per-example gradients")
    parser.add_argument("--opacus", action="store_true",
                        help="also time a full DP step of Opacus' PrivacyEngine against the project's (pip install "
                             "-e '.[bench]'), and check both clipped sums")
    parser.add_argument("--per-example", action="store_true", help="also time per-example gradients: Opacus "
                        "GradSampleModule vs torch.func")
    parser.add_argument("--wall", action="store_true", help="time the wall clock, not this process' CPU time")
    parser.add_argument("--mt19937", action="store_true", help="also time DP-SGD (and -WAV) drawing lots and noise "
                        "from torch's mt19937 generator instead of the device's AES-CTR keystream")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = not args.wall
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, "
          f"steps {args.steps}, median of {args.repeats}, {'wall' if args.wall else 'CPU'} time")
    for name in args.models:
        rates, cost = bench_training(name, args.batch, args.steps, args.repeats, args.wavelet, cpu, not args.no_vmap,
                                     args.mt19937)
        line = "  ".join(f"{k} {v:.0f}/s" for k, v in rates.items())
        ratios = "  ".join(f"{k} x{v:.2f}" for k, v in cost.items())
        print(f"{name:10s} samples/s: {line}  |  cost vs plain (median paired ratio): {ratios}", flush=True)
        if args.opacus:
            rates, cost, check = bench_opacus(name, args.batch, args.steps, args.repeats, cpu)
            ratios = "  ".join(f"{k} x{v:.2f}" for k, v in cost.items())
            proj = [f"project/{k} x{cost['project'] / v:.2f}" for k, v in cost.items() if k.startswith("opacus")]
            print(f"{'':10s} full DP step vs plain: {ratios}  |  {'  '.join(proj)}  |  clipped sum, max |diff| / "
                  f"max |sum|: " + "  ".join(f"{k} {v:.1e}" for k, v in check.items()), flush=True)
        if args.per_example:
            pe = bench_per_example(name, args.batch, args.repeats)
            print(f"{'':10s} per-example gradients: " + "  ".join(
                f"{k} {v:.0f}/s" if isinstance(v, float) and k != "max_abs_diff" else f"{k} {v}" for k, v in pe.items()))


if __name__ == "__main__":
    main()
