"""The run directory's records: metrics.jsonl (one object per round), summary.json, accuracy plot.

Rounds are numbered from 0 everywhere a user sees them: the `round` field of every record (metrics.jsonl,
privacy_ledger.jsonl, fusion.jsonl, checkpoint.npz), the nodes' logs, the console, the plots, the sweep's tables
and plots and summary.json's messages. Round r is the (r + 1)-th cloud round; its row holds the global model
after it. Counts (`summary.json`'s `rounds`, the progress `done` column) are counts, not round numbers."""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Iterable


def clean(obj: Any) -> Any:
    """JSON has no NaN or infinity: a diverged value is written as null (rows also carry `diverged`)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    return json.dumps(clean(obj), sort_keys=True, allow_nan=False, **kwargs)


def append_jsonl(path: pathlib.Path, row: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def write_jsonl(path: pathlib.Path, rows: list[dict[str, Any]]) -> None:
    """Replace a JSON-lines file atomically (used when a resumed run drops rows past its checkpoint)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        fh.writelines(dumps(r) + "\n" for r in rows)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line still being written
    return rows


def write_json(path: pathlib.Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(obj, indent=2) + "\n")
    tmp.replace(path)


ROUND_AXIS = "global round (0 = the first cloud round, as in metrics.jsonl)"


def round_cell(r: int, total: int) -> str:
    """How the console shows round r of a run of `total` rounds: its number and how many are done."""
    return f"{r} ({r + 1}/{total} done)"


def round_axis(ax: Any) -> None:
    import matplotlib.ticker

    ax.set_xlabel(ROUND_AXIS)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def plot_accuracy(rows: Iterable[dict[str, Any]], path: pathlib.Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig = accuracy_figure(rows, title)
    fig.savefig(path)
    plt.close(fig)


def accuracy_figure(rows: Iterable[dict[str, Any]], title: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("accuracy") is not None]
    timed = bool(rows) and all(r.get("emulated_seconds") is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 6, 4), dpi=110, squeeze=False)
    xs = [(ROUND_AXIS, [r["round"] for r in rows])]
    if timed:
        xs.append(("emulated time (s): air time, compute, backhaul", [r["emulated_seconds"] for r in rows]))
    for ax, (label, x) in zip(axes[0], xs):
        ax.plot(x, [100 * r["accuracy"] for r in rows], marker="o", label="global model")
        for key, name in (("accuracy_reference", "reference device"), ("accuracy_device_mean", "mean of devices")):
            if any(r.get(key) is not None for r in rows):  # the wireless medium: devices hold their own models
                ax.plot(x, [100 * r[key] if r.get(key) is not None else float("nan") for r in rows], marker=".",
                        label=name)
                ax.legend(loc="lower right", fontsize=8)
        if label == ROUND_AXIS:
            round_axis(ax)
        else:
            ax.set_xlabel(label)
        ax.set_ylabel("test accuracy (%)")
        ax.set_ylim(0, 100)  # a fixed axis: chance-level accuracy must not look like learning
        ax.grid(alpha=0.3)
        if rows:
            ax2 = ax.twinx()
            ax2.plot(x, [r["loss"] for r in rows], color="tab:red", alpha=0.6, ls="--")
            ax2.set_ylabel("test loss", color="tab:red")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_privacy(rows: Iterable[dict[str, Any]], path: pathlib.Path, title: str, budget: float,
                 claimed: float | None = None) -> None:
    """epsilon spent per round (the accountant's max and mean over devices) against the budget, and the
    paper's claim as a separate, labelled line when there is one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("epsilon_max") is not None]
    x = [r["round"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot(x, [r["epsilon_max"] for r in rows], marker="o", label="epsilon max over devices (accountant)")
    ax.plot(x, [r["epsilon_mean"] for r in rows], ls="--", label="epsilon mean over devices (accountant)")
    ax.axhline(budget, color="tab:red", alpha=0.6, label=f"budget {budget:g}")
    if claimed is not None:
        ax.axhline(claimed, color="tab:gray", ls=":", label=f"paper's claim {claimed:g} (not measured)")
    values = [r["epsilon_max"] for r in rows if r["epsilon_max"] > 0] + [budget]
    if values and max(values) / min(values) > 50:
        ax.set_yscale("log")  # the paper's claim and the accountant's figure can be orders of magnitude apart
    round_axis(ax)
    ax.set_ylabel("epsilon")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
