"""The run directory's guard: a fresh run never silently overwrites another run's records."""
from __future__ import annotations

import pathlib
import shutil

from .config import ConfigError

RUN_RECORDS = ("metrics.jsonl", "summary.json", "checkpoint.npz", "privacy_ledger.jsonl")


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
