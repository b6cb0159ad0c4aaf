"""The report a DLG sweep (runner `dlg`, hfl/runners.py) adds to results.md: every cell's reconstructions in one
montage (its first finished seed), SSIM at the last iteration against attack.bits when the sweep varies it, and a
table with each run's dlg.png, so the images travel with the committed report."""
from __future__ import annotations

import json
import math
import pathlib

MONTAGE = "dlg_reconstructions.png"
AXIS = "attack.bits"


def _summaries(runs) -> dict[str, list[tuple[object, dict]]]:
    """cell -> [(run, summary)] of its finished runs, in the sweep's order."""
    out: dict[str, list] = {}
    for run in runs:
        out.setdefault(run.cell, [])
        if run.done:
            out[run.cell].append((run, json.loads((run.run_dir / "summary.json").read_text())))
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def montage(done: dict[str, list], out: pathlib.Path) -> pathlib.Path | None:
    """Rows: every cell's first finished seed (a run copied from an identical attack, see `same_attack_as`, shown
    once), columns: the original and the reconstructions at attack.iterations, SSIM in each title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [(cell, pairs[0]) for cell, pairs in done.items() if pairs and "same_attack_as" not in pairs[0][1]]
    if not rows:
        return None
    columns = [int(i) for i in np.load(rows[0][1][0].run_dir / "dlg_images.npz")["iterations"]]
    fig, axes = plt.subplots(len(rows), len(columns) + 1, figsize=(0.95 * (len(columns) + 1) + 1.9, 1.0 * len(rows)),
                             squeeze=False)
    for row, (cell, (run, summary)) in enumerate(rows):
        arrays = np.load(run.run_dir / "dlg_images.npz")
        panels = [("original", arrays["original"])] + [
            (f"it {it}: {summary['ssim'][str(it)]:.2f}", img) for it, img in zip(columns, arrays[summary["mechanism"]])]
        for col, (title, img) in enumerate(panels):
            ax = axes[row][col]
            img = np.clip(np.asarray(img), 0, 1)
            ax.imshow(img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0), cmap="gray", vmin=0, vmax=1)
            ax.set_title(title if col or not row else "", fontsize=6, pad=2)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row][0].set_ylabel(f"{cell}\nseed {run.seed}", fontsize=6, rotation=0, ha="right", va="center")
    fig.tight_layout(pad=0.3, h_pad=0.4, w_pad=0.2)
    path = out / MONTAGE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ssim_vs_bits(spec, done: dict[str, list], out: pathlib.Path, field: str = "ssim_final") -> pathlib.Path | None:
    """Mean ± std over seeds of `field` against attack.bits, one line per combination of the other varied keys."""
    if AXIS not in spec.grid:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [k for k in spec.varied_keys if k != AXIS]
    lines: dict[tuple, list[tuple[float, float, float]]] = {}
    for cell, varied in spec.cells.items():
        values = [s[field] for _, s in done.get(cell, []) if isinstance(s.get(field), (int, float))]
        if values:
            lines.setdefault(tuple(varied[k] for k in others), []).append((varied[AXIS], *_mean_std(values)))
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=110)
    for key, pts in lines.items():
        pts.sort()
        xs, ys, sd = zip(*pts)
        ax.errorbar(xs, ys, yerr=sd, marker="o", ms=3, capsize=2,
                    label=", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, key)) or "all")
    ax.set(xlabel="bits per coordinate (attack.bits)", ylabel=f"{field} (mean ± std over seeds)",
           title=f"{spec.name}: DLG {field} against the bit width", ylim=(-0.1, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"{field}_vs_bits.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def markdown(done: dict[str, list], out: pathlib.Path, plots: list[pathlib.Path]) -> str:
    lines = ["", "## Reconstructions", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    iterations = next((list(s["ssim"]) for pairs in done.values() for _, s in pairs), [])
    head = (["cell", "runs"] + [f"SSIM it {i}" for i in iterations]
            + ["quantization variance", "error / signal", "label recovered", "dlg.png per seed"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell, pairs in done.items():
        if not pairs:
            lines.append(f"| {cell} | 0 |" + " n/a |" * (len(head) - 2))
            continue

        def stat(get) -> str:
            vals = [get(s) for _, s in pairs]
            vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
            if not vals:
                return "n/a"
            mean, std = _mean_std(vals)
            return f"{mean:.3g} ± {std:.2g}" if len(vals) > 1 else f"{mean:.3g}"

        links = " ".join(f"[seed {r.seed}]({(r.run_dir / 'dlg.png').relative_to(out).as_posix()})"
                         if r.run_dir.is_relative_to(out) else f"`{r.run_dir / 'dlg.png'}`" for r, _ in pairs)
        lines.append("| " + " | ".join([cell, str(len(pairs))] + [stat(lambda s, i=i: s["ssim"][i]) for i in iterations]
                                      + [stat(lambda s: s["quantization_variance"]),
                                         stat(lambda s: s["error_to_signal"]), stat(lambda s: s["label_correct"]),
                                         links]) + " |")
    return "\n".join(lines) + "\n"


def write(spec, runs, out: pathlib.Path) -> tuple[list[pathlib.Path], str]:
    done = _summaries(runs)
    plots = [p for p in (montage(done, out), ssim_vs_bits(spec, done, out)) if p is not None]
    return plots, markdown(done, out, plots)

