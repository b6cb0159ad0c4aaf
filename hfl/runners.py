"""What one run (cell x seed) of `hfl sweep` executes, by name: a spec picks its runner with `runner = "NAME"`.

- `testbed` (the default): a whole testbed of real processes (hfl.testbed), its summary.json and metrics.jsonl.
- `dlg`: the DLG attack of `hfl attack dlg` (hfl/attack_cli.py) on one mechanism per cell (paper 004, 9.3). The
  spec's `attack.*` keys are its settings (see AttackSettings); the rest is the ordinary run config (`run.seed`,
  `[data]`). It writes dlg.png, dlg.json, dlg_images.npz, metrics.jsonl (one row per L-BFGS step: `iteration`,
  `ssim`, `matching_loss`) and summary.json (`ssim.<it>` at each of attack.iterations, `ssim_start`, `ssim_final`,
  `ssim_gain`, and the measured perturbation of the update: `quantization_variance`, `quantization_mse`,
  `error_to_signal`, ...); the sweep's report gains a montage of every cell's reconstructions and SSIM against the
  bit width.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hfl.common import config as config_mod
from hfl.common.registry import Registry


@dataclass(frozen=True)
class SweepRunner:
    sections: tuple[str, ...]                    # top-level spec sections that are the runner's, not the config's
    settings: Callable[[dict], Any]              # {key: value} of those sections -> checked settings (ValueError)
    run: Callable[..., dict]                     # (run, on_round, timeout, active) -> summary (summary.json written)
    preflight: Callable[[Any, Callable], None]   # (run, call) -> None, or ConfigError before anything runs;
    #                                              call(fn, *args) runs work that needs torch elsewhere
    #                                              (node_spawn.caller(), cluster.node_call)
    steps: Callable[[Any], int]                  # (run) -> progress-bar length
    config_text: Callable[[Any], str]            # (run) -> its config.toml: a changed spec is caught against it
    report: Callable[..., tuple[list[pathlib.Path], str]] = lambda spec, runs, out: ([], "")  # extra plots, markdown
    default_report: dict[str, Any] = field(default_factory=dict)
    headline: Callable[[dict], str] = lambda summary: "final accuracy " + (
        "-" if summary.get("final_accuracy") is None else f"{summary['final_accuracy']:.4f}")  # the progress line
    audits: bool = False                         # whether [report] audit applies (testbed privacy audits)


RUNNERS: Registry[SweepRunner] = Registry("sweep runner")


def split(runner: SweepRunner, flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config keys, the runner's own keys without their section) of one cell's dotted keys."""
    own = {k.split(".", 1)[1]: v for k, v in flat.items() if k.split(".", 1)[0] in runner.sections}
    return {k: v for k, v in flat.items() if k.split(".", 1)[0] not in runner.sections}, own


# ---- testbed ---------------------------------------------------------------------------------------
def run_testbed(run, on_round=None, timeout: float = 24 * 3600, active: dict | None = None) -> dict:
    """One whole testbed (real processes) into run.run_dir; a partial earlier attempt is started over.
    The testbed sits in `active` while it runs, so that an interrupt can stop it from another thread."""
    from hfl.testbed import Testbed

    started_before = run.run_dir.exists() and any(run.run_dir.iterdir())
    # no per-run plots: the sweep draws its own from every run's metrics (`hfl plot RUN_DIR` draws a run's)
    bed = Testbed(run.config, run_dir=run.run_dir, force=started_before, plots=False)
    if active is not None:
        active[id(bed)] = bed
    try:
        bed.start()
        for row in bed.iter_metrics(timeout=timeout):
            if on_round:
                on_round(row)
        return bed.wait(timeout=120)
    finally:
        bed.close()
        if active is not None:
            active.pop(id(bed), None)


def _testbed_preflight(run, call: Callable) -> None:
    from hfl.preflight import preflight

    preflight(run.config, call)


RUNNERS.register("testbed", SweepRunner(
    sections=(), settings=lambda own: None, run=run_testbed, preflight=_testbed_preflight,
    steps=lambda run: run.config.run.rounds, config_text=lambda run: config_mod.to_toml(run.config), audits=True))


# ---- dlg -------------------------------------------------------------------------------------------
DLG_FILES = ("dlg.json", "dlg.png", "dlg_images.npz", "metrics.jsonl")


def _dlg_settings(own: dict):
    from hfl import attack_cli

    s = attack_cli.parse_settings(own)
    if len(s.mechanisms) != 1:
        raise ValueError(f"runner dlg: one mechanism per cell (e.g. attack.mechanisms = [\"sq\"]; compare mechanisms "
                         f"as variants), got {list(s.mechanisms)}")
    return s


def _dlg_config_text(run) -> str:
    import dataclasses

    attack = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(run.settings).items()}
    return config_mod.to_toml(run.config) + "\n[attack]\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in attack.items())


def _dlg_preflight(run, call: Callable) -> None:
    from hfl.common.data import DataError, load_dataset

    try:
        n = len(load_dataset(run.config.data).y_train)
    except (DataError, OSError) as exc:
        raise config_mod.ConfigError(f"data.dataset = {run.config.data.dataset!r}: {exc}") from None
    if not 0 <= run.settings.image_index < n:
        raise config_mod.ConfigError(f"attack.image_index must be in 0..{n - 1}, got {run.settings.image_index}")


def _same_attack(run, key: dict) -> pathlib.Path | None:
    """A finished run of this sweep (any cell, same seed) that made exactly this attack: a mechanism ignores the
    grid keys that are not its own (the exact update does not depend on attack.bits), so it is not computed again."""
    key = json.loads(json.dumps(key))  # tuples as the stored JSON has them
    for found in sorted(run.run_dir.parent.parent.glob(f"*/seed-{run.seed}/dlg.json")):
        if found.parent != run.run_dir and (found.parent / "summary.json").is_file():
            if list(json.loads(found.read_text()).get("attack_key", {}).values()) == [key]:
                return found.parent
    return None


def dlg_summary(report: dict) -> tuple[dict, list[dict]]:
    """(summary.json, metrics.jsonl rows) of a one-mechanism dlg.json report."""
    (name,) = report["ssim"]
    curve, losses = report["ssim_curve"][name], report["matching_loss"][name]
    columns = report["ssim"][name]
    summary = {"mechanism": name, "ssim": columns, "ssim_start": curve[0], "ssim_final": curve[-1],
               "ssim_gain": curve[-1] - curve[0], "ssim_max": max(curve), **report["perturbation"][name],
               "label_correct": float(report["label_guess"][name] == report["label"]),
               "final_matching_loss": report["final_matching_loss"][name], "diverged_at": report["diverged_at"][name],
               "attack_seconds": report["seconds"]}
    rows = [{"round": i, "iteration": i, "ssim": v, "matching_loss": losses[i] if i < len(losses) else None}
            for i, v in enumerate(curve)]
    return summary, rows


def run_dlg(run, on_round=None, timeout: float = 24 * 3600, active: dict | None = None) -> dict:
    from hfl import attack_cli
    from hfl.common import metrics

    started = time.perf_counter()
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "config.toml").write_text(_dlg_config_text(run))
    (name,) = run.settings.mechanisms
    twin = _same_attack(run, attack_cli.attack_key(run.config, run.settings, name))
    if twin is not None:
        for f in DLG_FILES:
            shutil.copyfile(twin / f, run.run_dir / f)
        summary = {"same_attack_as": twin.parent.name, **json.loads((twin / "summary.json").read_text())}
    else:
        summary, rows = dlg_summary(attack_cli.run_dlg(run.config, run.settings, run.run_dir))
        (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for row in metrics.read_jsonl(run.run_dir / "metrics.jsonl"):
        if on_round:
            on_round(row)
    summary["total_seconds"] = round(time.perf_counter() - started, 2)
    metrics.write_json(run.run_dir / "summary.json", summary)
    return summary


def dlg_report(spec, runs, out: pathlib.Path) -> tuple[list[pathlib.Path], str]:
    """The reconstructions of every cell (its first finished seed) in one montage, SSIM at the last iteration
    against attack.bits where the sweep varies it, and a table linking every run's dlg.png."""
    from hfl import dlg_report as report_mod

    return report_mod.write(spec, runs, out)


RUNNERS.register("dlg", SweepRunner(
    sections=("attack",), settings=_dlg_settings, run=run_dlg, preflight=_dlg_preflight,
    steps=lambda run: max(run.settings.iterations) + 1, config_text=_dlg_config_text, report=dlg_report,
    headline=lambda summary: f"SSIM {summary['ssim_start']:.3f} -> {summary['ssim_final']:.3f}",
    default_report={"fields": ["ssim_start", "ssim_final", "ssim_gain", "quantization_variance", "error_to_signal"],
                    "curves": ["ssim"], "x": ["iteration"]}))
