"""The cloud's persistence: accepted edge results in `pending/` (written before the edge's Ack), the atomic per-round
checkpoint, and what a resume reads back (the run dir's logs cut to the checkpoint)."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
from dataclasses import dataclass, field

import numpy as np

from hfl.common import metrics
from hfl.common.config_error import ConfigError
from hfl.common.robust import refuse_install
from hfl.common.privacy import on_wire
from hfl.common.privacy.ledger import lines_to_keep
from hfl.proto import hfl_v1_pb2 as pb

log = logging.getLogger("hfl.cloud")


@dataclass
class EdgeResult:
    delta: np.ndarray
    devices: int
    samples: int
    scalars: dict
    transforms: list = field(default_factory=list)  # what was applied on the way, DP events included
    fused: list = field(default_factory=list)       # relay algorithms: one row per fused device upload
    device_states: dict = field(default_factory=dict)  # the edge's report on its devices (observers only; not kept)


@dataclass
class Resumed:
    run_id: str
    w: np.ndarray
    last: int                  # the checkpoint's round
    stats: dict | None         # its counters (for a metrics row lost after the checkpoint)
    mode_state: dict           # what the round mode keeps across rounds (DigitalCloud.state), as of the checkpoint
    claims: dict               # the edges' trust claims (privacy.json)


def write_atomic(path: pathlib.Path, **arrays) -> None:
    tmp = path.with_name(path.stem + ".tmp.npz")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


class RunStore:
    def __init__(self, run_dir: pathlib.Path):
        self.run_dir = run_dir

    def pending(self, round_: int) -> pathlib.Path:
        return self.run_dir / "pending" / f"round-{round_:06d}"

    def persist(self, round_: int, node: str, result: EdgeResult, run_id: str) -> None:
        """Write an accepted edge result durably before the edge is told it was accepted."""
        folder = self.pending(round_)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{node}.npz", delta=result.delta, devices=result.devices, samples=result.samples,
                      scalars=json.dumps(result.scalars), run_id=run_id, fused=json.dumps(result.fused),
                      transforms=np.frombuffer(pb.Meta(transforms=result.transforms).SerializeToString(), np.uint8))

    def load_pending(self, round_: int, run_id: str, size: int) -> dict[str, EdgeResult]:
        """The results accepted for `round_` before a restart, each checked like a message (its delta `size` finite
        values, its DP events parsed); a bad one is discarded with its reason: its edge submits again."""
        results = {}
        folder = self.pending(round_)
        for path in sorted(folder.glob("edge-*.npz")) if folder.exists() else []:
            if path.name.endswith(".tmp.npz"):
                continue
            try:
                with np.load(path) as f:
                    if str(f["run_id"]) != run_id:
                        continue
                    meta = pb.Meta.FromString(f["transforms"].tobytes())
                    on_wire.from_transforms(meta.transforms)  # the DP events must still parse
                    result = EdgeResult(f["delta"], int(f["devices"]), int(f["samples"]),
                                        json.loads(str(f["scalars"])), list(meta.transforms),
                                        json.loads(str(f["fused"])))
                if result.delta.shape != (size,):
                    raise ValueError(f"a delta of shape {result.delta.shape}, the round's results have {size} values")
                if not np.isfinite(result.delta).all():
                    raise ValueError("non-finite delta")
            except Exception as exc:  # noqa: BLE001 - a bad file costs its edge's result, never the resume
                log.error("--resume: discarding %s (%s): %s's result for round %d counts only if it submits again",
                          path, exc, path.stem, round_)
                path.unlink(missing_ok=True)
                continue
            results[path.stem] = result
        if results:
            log.info("resumed round %d with the results already accepted from %s", round_, sorted(results))
        return results

    def checkpoint(self, r: int, w: np.ndarray, model: str, run_id: str, stats: dict, mode_state: dict) -> None:
        """The global model after round r (and the round's counters and the mode's state), replaced atomically and
        fsynced; the round's pending results are then no longer needed."""
        write_atomic(self.run_dir / "checkpoint.npz", round=r, weights=w, model=model, run_id=run_id,
                     row=json.dumps(metrics.clean(stats)), mode_state=json.dumps(mode_state))
        shutil.rmtree(self.pending(r), ignore_errors=True)

    def load_checkpoint(self, initial: np.ndarray, max_ratio: float) -> Resumed:
        """The checkpoint, checked like a message before anything is installed: its weights must be the model's
        shape, finite and within aggregation.max_update_ratio of the initial model (ConfigError, one line, if not)."""
        path = self.run_dir / "checkpoint.npz"
        if not path.exists():
            raise RuntimeError(f"--resume: {path} does not exist (nothing to resume)")
        try:
            with np.load(path) as ckpt:
                run_id, last = str(ckpt["run_id"]), int(ckpt["round"])
                w = np.asarray(ckpt["weights"], dtype=np.float32)
                stats = json.loads(str(ckpt["row"])) if "row" in ckpt.files else None
                mode_state = json.loads(str(ckpt["mode_state"])) if "mode_state" in ckpt.files else {}
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"--resume: {path} is unreadable ({exc.__class__.__name__}: {exc})") from None
        if w.shape != initial.shape:
            raise ConfigError(f"--resume: {path} holds weights of shape {w.shape}, the model has {initial.shape[0]}")
        why = refuse_install(w, initial, max_ratio)
        if why:
            raise ConfigError(f"--resume: {path} refused: {why} from the initial model")
        claims = {}
        if (self.run_dir / "privacy.json").exists():
            claims = json.loads((self.run_dir / "privacy.json").read_text())["trust"]
        return Resumed(run_id, w, last, stats, mode_state, claims)

    def cut_logs(self, last: int, rows: list[dict], noise_source: str) -> None:
        """Rewrite the run's logs as they were at the checkpoint of round `last` (rows: the metrics to keep)."""
        metrics.write_jsonl(self.run_dir / "metrics.jsonl", rows)
        ledger = self.run_dir / "privacy_ledger.jsonl"
        if ledger.exists():
            metrics.write_jsonl(ledger, lines_to_keep(metrics.read_jsonl(ledger), last, noise_source))
        fused = self.run_dir / "fusion.jsonl"
        if fused.exists():  # relay algorithms: rounds past the checkpoint are fused again
            metrics.write_jsonl(fused, [r for r in metrics.read_jsonl(fused) if r["round"] <= last])

    def write_summary(self, cfg, rows: list[dict], facts: dict) -> dict:
        """summary.json: the run's figures from its metrics rows and config, and `facts` the rows do not hold
        (`refused_now`: refusals counted after the last row)."""
        from hfl.common import plans

        evaluated = [r for r in rows if r["accuracy"] is not None]
        facts = dict(facts)
        summary = {
            "run_id": facts.pop("run_id"),
            "algorithm": cfg.run.algorithm,
            "seed": cfg.run.seed,
            "rounds": len(rows),
            "final_accuracy": evaluated[-1]["accuracy"] if evaluated else None,
            "final_loss": evaluated[-1]["loss"] if evaluated else None,
            "best_accuracy": max((r["accuracy"] for r in evaluated), default=None),
            "wall_seconds": facts.pop("wall_seconds"),
            "bytes_up": sum(r["bytes_up"] for r in rows),
            "bytes_down": sum(r["bytes_down"] for r in rows),
            "refused": sum(r["refused"] for r in rows) + facts.pop("refused_now"),
            "aggregator": cfg.pipeline.aggregate,
            "diverged": any(r.get("diverged") for r in rows),
            "model": cfg.model.name,
            "dataset": cfg.data.dataset,
            "devices": cfg.num_devices,
            "edges": cfg.topology.edges,
            "weights": {"edge": plans.weights_rule(cfg, "edge"), "cloud": plans.weights_rule(cfg, "cloud")},
            **facts,
        }
        metrics.write_json(self.run_dir / "summary.json", summary)
        return summary

    def metrics_up_to(self, last: int) -> list[dict]:
        return [r for r in metrics.read_jsonl(self.run_dir / "metrics.jsonl") if r["round"] <= last]
