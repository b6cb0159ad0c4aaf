"""`hfl attack dlg [CONFIG] [--set ...] [--out DIR]`: DLG against one device's single-image update under each uplink
mechanism (paper 004, Fig. 2b-c / Table I); writes dlg.png (rows: mechanism, columns: iteration, original at the
left) and dlg.json (SSIM per mechanism and iteration, settings, seeds).

Attack settings live in an `[attack]` table of the config file or in `--set attack.KEY=VALUE`; everything else
(`run.seed`, `[data]`) is the ordinary run config. Keys: see `AttackSettings`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
import tomllib
from dataclasses import dataclass
from typing import Any

# The AttackSettings keys that shape each mechanism's perturbation; the other keys are shared by every mechanism.
MECHANISM_KEYS = {"none": (), "sq": ("bits", "range_mode"), "dpsq": ("bits", "range_mode", "epsilon1"),
                  "laplace-sq": ("bits", "range_mode", "epsilon1"), "qsgd": ("qsgd_levels",)}
MECHANISMS = tuple(MECHANISM_KEYS)


@dataclass(frozen=True)
class AttackSettings:
    """[attack] keys; defaults follow digest 004 section 6 and P9."""
    image_index: int = 0                    # index into the training split of [data]
    mechanisms: tuple[str, ...] = ("none", "sq", "dpsq")  # rows of the grid; see MECHANISMS
    bits: int = 6                           # b of the victim's group
    epsilon1: float = 1e-6                  # DP-SQ / LaplaceSQ per-coordinate epsilon
    range_mode: str = "minmax"              # quantizer range (digest 004 P1): minmax | fixed ([-clip, clip])
    qsgd_levels: int = 4                    # for mechanism qsgd
    lr: float = 0.01                        # the victim's SGD step eta (unstated in the paper)
    clip: float = 10.0                      # l1 clipping constant C (0 = no clipping)
    iterations: tuple[int, ...] = (0, 20, 40)  # L-BFGS steps at which reconstructions are recorded
    max_inner: int = 20                     # function evaluations per L-BFGS step (torch default, as in DLG)
    same_init: bool = True                  # every mechanism starts from the same dummy image and label
    torch_threads: int = 1                  # 2 threads cost 28x the CPU per evaluation on 2 loaded cores


def parse_settings(table: dict[str, Any]) -> AttackSettings:
    """AttackSettings from an [attack] table, every value checked (ValueError names the key)."""
    fields = {f.name: f for f in dataclasses.fields(AttackSettings)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ValueError(f"unknown key attack.{unknown[0]}; allowed: {', '.join(fields)}")
    values = {}
    for name, value in table.items():
        default = getattr(AttackSettings, name)
        if isinstance(default, tuple):
            value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        elif isinstance(default, bool):
            value = bool(value)
        elif isinstance(default, (int, float)):
            value = type(default)(value)
        values[name] = value
    s = AttackSettings(**values)
    bad = [m for m in s.mechanisms if m not in MECHANISMS]
    if bad or not s.mechanisms:
        raise ValueError(f"attack.mechanisms must be a non-empty list from {MECHANISMS}, got {list(s.mechanisms)}")
    if not 1 <= s.bits <= 16:
        raise ValueError(f"attack.bits must be in 1..16, got {s.bits}")
    if s.epsilon1 < 0 or s.lr <= 0 or s.clip < 0:
        raise ValueError("attack.epsilon1 must be >= 0, attack.lr > 0, attack.clip >= 0")
    if not s.iterations or min(s.iterations) < 0:
        raise ValueError(f"attack.iterations must be non-empty and >= 0, got {list(s.iterations)}")
    if s.range_mode not in ("minmax", "fixed"):
        raise ValueError(f"attack.range_mode must be minmax or fixed, got {s.range_mode!r}")
    return s


def load_settings(config: str | None, overrides: list[str]):
    """(run Config, AttackSettings): the [attack] table and attack.* overrides are split off the run config."""
    from hfl.common import config as config_mod

    data: dict[str, Any] = {}
    if config is not None:
        p = pathlib.Path(config)
        if not p.is_file():
            raise config_mod.ConfigError(f"config file not found: {p}")
        data = tomllib.loads(p.read_text())
    attack = dict(data.pop("attack", {}))
    rest = []
    for text in overrides:
        path, value = config_mod.parse_override(text)
        if path[0] == "attack":
            attack[path[1]] = value
        else:
            rest.append(text)
    return config_mod.from_dict(config_mod.merge_overrides(data, rest)), parse_settings(attack)


def mechanism(name: str, s: AttackSettings):
    from hfl.common.attacks import dlg

    if name == "none":
        return dlg.identity
    if name == "qsgd":
        return dlg.codec_perturbation("qsgd", levels=s.qsgd_levels)
    grid = {"bits": s.bits, "range_mode": s.range_mode}
    if s.range_mode == "fixed":
        grid["clip"] = s.clip or 1.0
    if name == "sq":
        return dlg.codec_perturbation("sq", **grid)
    return dlg.codec_perturbation(name, epsilon1=s.epsilon1, **grid)


SHARED_KEYS = ("image_index", "lr", "clip", "iterations", "max_inner", "same_init")


def attack_key(cfg, s: AttackSettings, name: str) -> dict:
    """Everything that decides the attack on mechanism `name` (the data, the seed, the shared settings and the
    mechanism's own keys): two runs with equal keys are the same computation."""
    from hfl.common.config import to_dict

    own = {k: getattr(s, k) for k in SHARED_KEYS + MECHANISM_KEYS[name]}
    return {"mechanism": name, "seed": cfg.run.seed, "data": to_dict(cfg)["data"], "attack": own}


def run_dlg(cfg, s: AttackSettings, out: pathlib.Path) -> dict:
    import numpy as np
    import torch

    from hfl.common.attacks import dlg
    from hfl.common.attacks.lenet import build_lenet
    from hfl.common.data import load_dataset
    from hfl.common.seeding import numpy_rng, torch_generator

    torch.set_num_threads(s.torch_threads)
    ds = load_dataset(cfg.data)
    if not 0 <= s.image_index < len(ds.y_train):
        raise ValueError(f"attack.image_index must be in 0..{len(ds.y_train) - 1}, got {s.image_index}")
    image = ds.x_train[s.image_index].astype(np.float32) / 255.0
    label = int(ds.y_train[s.image_index])
    seed = cfg.run.seed
    model = build_lenet(torch_generator(seed, "cloud", "dlg", 0, "lenet-init"), image.shape[0], image.shape[1],
                        ds.num_classes)
    mechs = {name: mechanism(name, s) for name in s.mechanisms}
    start = time.perf_counter()
    every = range(max(s.iterations) + 1)  # SSIM at every L-BFGS step; the grid shows s.iterations
    results = dlg.attack_under_mechanisms(
        model, image, label, mechs, lr=s.lr, clip=s.clip or None, record_at=every, max_inner=s.max_inner,
        seed_generator=lambda name: torch_generator(seed, "cloud", "dlg", 0, "dummy", "" if s.same_init else name),
        seed_rng=lambda name: numpy_rng(seed, "device", "dlg", 0, "uplink", name))
    elapsed = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    columns = sorted(set(s.iterations))
    shown = {name: [r.images[r.iterations.index(i)] for i in columns] for name, r in results.items()}
    _write_grid(out / "dlg.png", image, shown, {name: r.ssim for name, r in results.items()}, columns)
    np.savez_compressed(out / "dlg_images.npz", original=image, iterations=np.asarray(columns),
                        **{name: np.stack(imgs) for name, imgs in shown.items()})
    report = {
        "attack": "dlg", "paper": "004 (Fig. 2b-c, Table I)", "seed": seed, "dataset": ds.name,
        "image_index": s.image_index, "label": label, "settings": dataclasses.asdict(s), "seconds": round(elapsed, 2),
        "ssim": {name: {str(i): r.ssim[i] for i in columns} for name, r in results.items()},
        "ssim_curve": {name: r.ssim for name, r in results.items()},
        "matching_loss": {name: r.losses for name, r in results.items()},
        "perturbation": {name: r.perturbation for name, r in results.items()},
        "label_guess": {name: r.label_guess for name, r in results.items()},
        "final_matching_loss": {name: (r.losses[-1] if r.losses else None) for name, r in results.items()},
        "diverged_at": {name: r.diverged_at for name, r in results.items()},
        "attack_key": {name: attack_key(cfg, s, name) for name in results},
    }
    (out / "dlg.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _write_grid(path: pathlib.Path, original, images: dict[str, list], ssims: dict[str, list[float]],
                columns: list[int]) -> None:
    """Rows: the names of `images` (each its reconstructions at `columns`), the original at the left; `ssims` per
    name is indexed by iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(images)
    cols = len(columns)
    fig, axes = plt.subplots(len(names), cols + 1, figsize=(1.6 * (cols + 1), 1.7 * len(names)), squeeze=False)

    def show(ax, img, title):
        img = np.clip(np.asarray(img), 0, 1)
        ax.imshow(img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])

    for row, name in enumerate(names):
        show(axes[row][0], original, "original")
        axes[row][0].set_ylabel(name, fontsize=8)
        for col, (it, img) in enumerate(zip(columns, images[name]), start=1):
            show(axes[row][col], img, f"it {it}  SSIM {ssims[name][it]:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_attack(args) -> int:
    from hfl.common.config import ConfigError

    try:
        cfg, settings = load_settings(args.config, args.overrides)
    except (ConfigError, ValueError) as exc:
        print(f"hfl attack: {exc}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out or f"runs/attack-dlg-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        report = run_dlg(cfg, settings, out)
    except ValueError as exc:
        print(f"hfl attack: {exc}", file=sys.stderr)
        return 2
    for name, scores in report["ssim"].items():
        print(f"{name:>10}  " + "  ".join(f"it {k}: SSIM {v:.3f}" for k, v in scores.items()))
    print(f"wrote {out / 'dlg.png'} and {out / 'dlg.json'} ({report['seconds']} s)")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("attack", help="gradient-inversion attack (DLG) on a quantized device update")
    p.add_argument("kind", choices=["dlg"], help="attack to run")
    p.add_argument("config", nargs="?", help="TOML config file ([attack] table plus the run config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one value, e.g. attack.epsilon1=1e-6 or run.seed=3 (repeatable)")
    p.add_argument("--out", help="output directory (default runs/attack-dlg-TIMESTAMP)")
    p.set_defaults(func=cmd_attack)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hfl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    from hfl import families  # noqa: F401

    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
