"""`hfl plot RUN_DIR|SWEEP_DIR [--format pdf|svg|png] [--out DIR]`: the curves a paper shows, from the runs'
metrics.jsonl: test accuracy and loss against rounds and against emulated seconds, one line per run or, for a
sweep, per cell (the mean over its seeds with a band of one standard deviation), with units on every axis. It also
writes curves.csv (cell, round, n, the mean and std of each curve) beside the figures."""
from __future__ import annotations

import csv
import pathlib
import sys

import numpy as np

from hfl.common import metrics

CURVES = ("accuracy", "loss", "emulated_seconds")
LABELS = {"accuracy": "test accuracy (fraction)", "loss": "test loss (cross-entropy)",
          "emulated_seconds": "emulated time (s)", "round": "round"}


def find_runs(target: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    """cell -> its runs' directories: a run directory is one cell of one run; a sweep's are runs/CELL/seed-N/."""
    if (target / "metrics.jsonl").is_file():
        return {target.name: [target]}
    cells: dict[str, list[pathlib.Path]] = {}
    for path in sorted(target.rglob("metrics.jsonl")):
        run = path.parent
        cell = run.parent.name if run.name.startswith("seed-") else run.name
        cells.setdefault(cell, []).append(run)
    return cells


def curves(runs: list[pathlib.Path]) -> list[dict]:
    """Per round: n (runs that reached it) and the mean and std of each curve over those runs."""
    rows = [metrics.read_jsonl(r / "metrics.jsonl") for r in runs]
    out = []
    for r in range(max((len(x) for x in rows), default=0)):
        at = [x[r] for x in rows if len(x) > r]
        row: dict = {"round": r, "n": len(at)}
        for key in CURVES:
            values = np.array([float(a[key]) for a in at if a.get(key) is not None], dtype=np.float64)
            row[f"{key}_mean"] = float(values.mean()) if values.size else None
            row[f"{key}_std"] = float(values.std(ddof=1)) if values.size > 1 else (0.0 if values.size else None)
        out.append(row)
    return out


def write_csv(table: dict[str, list[dict]], path: pathlib.Path) -> None:
    fields = ["cell", "round", "n"] + [f"{k}_{s}" for k in CURVES for s in ("mean", "std")]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fields)
        writer.writeheader()
        for cell, rows in table.items():
            for row in rows:
                writer.writerow({"cell": cell, **row})


def draw(table: dict[str, list[dict]], out: pathlib.Path, fmt: str, title: str) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for y in ("accuracy", "loss"):
        for x in ("round", "emulated_seconds"):
            fig, ax = plt.subplots(figsize=(6.0, 3.8), dpi=150)
            for cell, rows in table.items():
                rows = [r for r in rows if r[f"{y}_mean"] is not None and (x == "round" or r[f"{x}_mean"] is not None)]
                if not rows:
                    continue
                xs = np.array([r["round"] if x == "round" else r[f"{x}_mean"] for r in rows])
                mean = np.array([r[f"{y}_mean"] for r in rows])
                std = np.array([r[f"{y}_std"] or 0.0 for r in rows])
                n = max(r["n"] for r in rows)
                ax.plot(xs, mean, marker="." if len(rows) < 40 else None, label=f"{cell} (n={n})")
                if n > 1:
                    ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
            ax.set_xlabel(LABELS[x])
            ax.set_ylabel(LABELS[y])
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            if table:
                ax.legend(fontsize=7)
            fig.tight_layout()
            path = out / f"{y}_vs_{'round' if x == 'round' else 'emulated_time'}.{fmt}"
            fig.savefig(path)
            plt.close(fig)
            written.append(path)
    return written


def cmd_plot(args) -> int:
    target = pathlib.Path(args.target)
    if not target.is_dir():
        print(f"hfl plot: {target} is not a run or sweep directory", file=sys.stderr)
        return 2
    cells = find_runs(target)
    if not cells:
        print(f"hfl plot: no metrics.jsonl under {target}: not a run or sweep directory (or no round finished yet)",
              file=sys.stderr)
        return 2
    out = pathlib.Path(args.out) if args.out else target
    out.mkdir(parents=True, exist_ok=True)
    table = {cell: curves(runs) for cell, runs in cells.items()}
    write_csv(table, out / "curves.csv")
    written = draw(table, out, args.format, target.name)
    print(f"{len(cells)} curve(s) from {sum(len(r) for r in cells.values())} run(s): "
          + ", ".join(str(p) for p in [*written, out / "curves.csv"]))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="figures for a paper from a run or a sweep directory: accuracy and loss against "
                                    "rounds and emulated time, mean and std over seeds, and curves.csv")
    p.add_argument("target", metavar="RUN_DIR|SWEEP_DIR")
    p.add_argument("--format", choices=("pdf", "svg", "png"), default="pdf")
    p.add_argument("--out", help="where the figures and curves.csv go (default: the directory itself)")
    p.set_defaults(func=cmd_plot)
