"""What a config means, in a few lines: each round's work for a device (the SGD steps the plan adds up to), the
sections the chosen algorithm ignores, and for a private run what it protects and how. `hfl config` prints it, and
`hfl run` prints its first line when it starts."""
from __future__ import annotations

import dataclasses

from hfl.common import plans
from hfl.common.config import Config, sections

# the sections an algorithm may ignore, and whether it reads them
_READS = {
    "privacy": plans.is_private,
    "precision": lambda cfg: plans.ALGORITHMS.get(cfg.run.algorithm).mode == "relay",
}


def round_work(cfg: Config) -> str:
    """One line: a round's phases and the SGD steps one device takes in it."""
    plan = plans.build_plan(cfg)
    steps, epochs, syncs, grads, air = 0, 0, 0, 0, 0
    for p in plan:
        if p.kind in plans.LOCAL_PHASES:
            steps += int(p.params.get("steps", 0))
            epochs += int(p.params.get("epochs", 0))
        elif p.kind == plans.EDGE_MODEL_SYNC:
            syncs += 1
        elif p.kind == plans.EDGE_GRADIENT_STEP:
            grads += 1
        elif p.kind in plans.AIR_PHASES:
            air += 1
    local = [p for p in plan if p.kind in plans.LOCAL_PHASES]
    parts = []
    if local:
        each = local[0].params
        unit = f"{int(each['epochs'])} epochs" if "epochs" in each else f"{int(each.get('steps', 0))} steps"
        parts.append(f"{len(local)} local phase{'s' * (len(local) > 1)} of {unit}")
    if syncs:
        parts.append(f"{syncs} edge model sync{'s' * (syncs > 1)}")
    if grads:
        parts.append(f"{grads} edge gradient step{'s' * (grads > 1)}")
    if air:
        parts.append(f"{air} over-the-air slot{'s' * (air > 1)}")
    total = steps + grads + sum(1 for p in plan if p.kind == plans.AIR_GRADIENT_STEP)
    work = (f"{total} SGD steps a device" + (f" and {epochs} epochs" if epochs else "")) if total or epochs else \
        "no local training"
    return (f"{cfg.run.algorithm}: {cfg.run.rounds} rounds of {', '.join(parts)}, then the cloud sync "
            f"(= {work} a round; {cfg.topology.edges} edges x {cfg.topology.devices_per_edge} devices)")


def ignored(cfg: Config) -> list[str]:
    """The sections set away from their defaults that the algorithm does not read."""
    out = []
    defaults = dict(sections())
    for name, reads in _READS.items():
        section = cfg.families.get(name) if hasattr(cfg, "families") else getattr(cfg, name, None)
        if section is None or name not in defaults or reads(cfg):
            continue
        if dataclasses.asdict(section) != dataclasses.asdict(defaults[name]()):
            out.append(name)
    return out


def explain(cfg: Config) -> list[str]:
    lines = [round_work(cfg)]
    skipped = ignored(cfg)
    if skipped:
        lines.append(f"ignored by {cfg.run.algorithm}: " + ", ".join(f"[{s}]" for s in skipped)
                     + " (set, but this algorithm does not read it)")
    if plans.is_private(cfg):
        p = cfg.privacy
        how = (f"noise multiplier {p.noise_multiplier:g} as given" if p.calibration == "noise_multiplier"
               else f"noise calibrated ({p.calibration}) to epsilon {p.epsilon:g}, delta {p.delta:g}")
        lines.append(f"private ({plans.ALGORITHMS.get(cfg.run.algorithm).privacy}): {how}; the noise multiplier and std "
                     f"are set by the cloud at its start (privacy.json; hfl run prints them), the accountant's epsilon "
                     f"per device and per party is in summary.json and privacy.json")
    else:
        lines.append("not private: no DP noise is added")
    return lines


def noise_lines(privacy: dict) -> list[str]:
    """privacy.json's noise, one line per stream: the multiplier and std each tier adds (the range over edges)."""
    streams: dict[tuple[str, str], list[dict]] = {}
    for edge_streams in (privacy.get("noise") or {}).values():
        for stream, v in edge_streams.items():
            streams.setdefault((stream, v.get("tier", "?")), []).append(v)
    out = []
    for (stream, tier), values in sorted(streams.items()):
        z = [v["noise_multiplier"] for v in values if v.get("noise_multiplier") is not None]
        std = [v["std"] for v in values if v.get("std") is not None]
        if not z:
            continue
        span = (lambda xs: f"{min(xs):.4g}" if min(xs) == max(xs) else f"{min(xs):.4g}..{max(xs):.4g}")
        out.append(f"noise, {stream} stream at the {tier}: multiplier {span(z)}" + (f", std {span(std)}" if std else "")
                   + f" ({len(values)} edge{'s' * (len(values) > 1)}; {privacy.get('calibration')} calibration)")
    return out
