"""The run directory's records: metrics.jsonl (one object per round), summary.json, accuracy plot."""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Iterable


def append_jsonl(path: pathlib.Path, row: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


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
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def plot_accuracy(rows: Iterable[dict[str, Any]], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("accuracy") is not None]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot([r["round"] + 1 for r in rows], [100 * r["accuracy"] for r in rows], marker="o")
    ax.set_xlabel("global round (1 = after the first cloud sync)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if rows:
        ax2 = ax.twinx()
        ax2.plot([r["round"] + 1 for r in rows], [r["loss"] for r in rows], color="tab:red", alpha=0.6, ls="--")
        ax2.set_ylabel("test loss", color="tab:red")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
