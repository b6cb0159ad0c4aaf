"""The run directory's guard: a fresh run never silently overwrites another run's records."""
from __future__ import annotations

import pathlib
import shutil

from .config import ConfigError

RUN_RECORDS = ("metrics.jsonl", "summary.json", "checkpoint.npz", "privacy_ledger.jsonl")


def check_writable(run_dir: pathlib.Path) -> None:
    """A run directory that can be one: not a file, and creatable and writable (ConfigError naming it, at once)."""
    import os

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file: give --out a directory")
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run directory {run_dir}: cannot write under {existing} (permission denied or not a "
                          f"directory)")


def check_run_dir(run_dir: pathlib.Path, resume: bool, force: bool) -> None:
    """Refuse a fresh run in a directory holding one (unless `force`: its records are deleted);
    `resume` needs a checkpoint."""
    found = [name for name in RUN_RECORDS if (run_dir / name).exists()]
    if resume:
        if not (run_dir / "checkpoint.npz").exists():
            raise ConfigError(f"--resume {run_dir}: no checkpoint.npz there, nothing to resume")
        return
    if found and not force:
        raise ConfigError(f"{run_dir} already holds a run ({', '.join(found)}): use --resume to continue it or "
                          "--force to start over (its records are deleted)")
    for name in found:
        (run_dir / name).unlink()
    shutil.rmtree(run_dir / "pending", ignore_errors=True)


def write_data_report(run_dir: pathlib.Path, report: dict) -> None:
    """data.json (partition.data_report)."""
    import json

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "data.json").write_text(json.dumps(report, indent=1) + "\n")


def plot_data_report(run_dir: pathlib.Path, report: dict, title: str = "") -> None:
    """data.png: each edge's label histogram as stacked bars. The cloud draws it with accuracy.png at the end of
    the run: importing matplotlib and drawing cost ~5 s of CPU, which at launch delayed every edge's join."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    hist = np.array([e["labels"] for e in report["edges"]], dtype=float)  # [edges, classes]
    fig, ax = plt.subplots(figsize=(min(12, 3 + 0.5 * len(hist)), 3.5), dpi=200)  # readable at print size
    bottom = np.zeros(len(hist))
    colors = plt.get_cmap("tab10" if hist.shape[1] <= 10 else "tab20")
    for c in range(hist.shape[1]):
        ax.bar(np.arange(len(hist)), hist[:, c], bottom=bottom, color=colors(c % colors.N), label=str(c), width=0.8)
        bottom += hist[:, c]
    ax.set_xlabel("edge")
    ax.set_ylabel("samples")
    ax.set_xticks(np.arange(len(hist)))
    ax.set_title(title or "label distribution per edge", fontsize=9)
    ax.legend(title="label", fontsize=8, title_fontsize=9, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(run_dir / "data.png")
    plt.close(fig)
