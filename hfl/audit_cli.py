"""`hfl audit privacy [CONFIG] [--set ...] [--trials N] [--out DIR]`: an empirical check of the configured DP
mechanism's noise calibration, at the level of ONE release.

The run's own privacy policy (cloud_server.privacy_policy) calibrates the noise exactly as `hfl run` would; the
audit then applies the emulator's own functions to a canary and to nothing, `--trials` times each:
- sample level (dp-sgd, dp-sgd-wav): per_example.example_norms / clip_factors, dpsgd.noisy_sum, the code of dp_sgd, on
  a gradient canary (one example's clipped gradient; white-box, the other examples' known sum cancels). For the
  gaussian mechanism dp_sgd clips through the book-keeping sum (same factors, no per-example rows; its equality with
  the per-example path is a unit test), so the audit covers its clip through that equality;
- user level at a trusted aggregator (dp-fedavg, dp-fedavg-wav): on_wire.enforce_clip and on_wire.edge_release, the
  code of the device and the edge, on an update canary weighted like the largest client (p_k = max);
- by-trust placement (h2fdp, hfl-dp, pedpfl-style): on_wire.device_release (a device behind an untrusted edge) or
  on_wire.edge_release (a trusted edge's mean of s_c uploads), the device's or edge's own code, replace-one canary.
Every noise draw comes from the node's own DP randomness (secret unless privacy.noise_source = seeded), not from the
audit's generator; the statement compared with is the PLD (tight) epsilon of one release.
The canary is the worst case for the mechanism: for wavelet noise the vector whose Haar energy sits on the two
coefficients of weight m (audit.wavelet_canary), else a constant vector over the clip bound. The likelihood-ratio
score (audit.projection_score, audit.wavelet_lr_score) separates the two sets of outputs; the audit reports a
Clopper-Pearson 95% lower bound on epsilon (audit.audit_release) beside the epsilon the configuration CLAIMS for one
such release (the accountant on the multiplier that scales the noise). A bound above the claim is evidence that the
claim is false. The whole run's epsilon (composed, subsampled) is printed for context only: one release cannot
test it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile
import time

import numpy as np

from hfl.common.secret_random import dp_draws, dp_numpy_rng

LEVELS = ("sample", "aggregator", "by_trust")


def _policy(cfg, tmp: pathlib.Path, tier: str = "auto"):
    from hfl.cloud_server.privacy_policy import PrivacyPolicy
    from hfl.common.privacy.trust import TRUSTED, UNTRUSTED
    from hfl.common import topology
    from hfl.common.data import load_dataset
    from hfl.common.models import build
    from hfl.common.partition import partition
    from hfl.common.seeding import numpy_rng

    data = load_dataset(cfg.data)
    parts = partition(data.y_train, cfg.num_devices, numpy_rng(cfg.run.seed, "data", "partition"), cfg.data,
                      edges=cfg.topology.edges)
    sizes = [p.numel() for p in build(cfg.model.name, data.input_shape, data.num_classes).parameters()]
    policy = PrivacyPolicy(cfg, topology.edge_ids(cfg), [len(p) for p in parts], tmp, {}, sizes)
    edge = policy.edges[0]
    if tier != "auto":  # by-trust placement: audit a trusted edge's release or an untrusted edge's device's
        want = TRUSTED if tier == "edge" else UNTRUSTED
        edges = [e for e in policy.edges if policy.levels[e] == want]
        if not edges:
            raise ValueError(f"--tier {tier}: no {want} edge in this configuration (trust {policy.levels})")
        edge = edges[0]
    from hfl.common.privacy import instructions

    noise = instructions.read_cluster(policy.cluster_plans(0, policy.participants(0))[edge])
    return policy, edge, noise, sizes


def _sample_release(policy, edge, noise, sizes, breaking: float):
    """Batched release of one DP-SGD lot: the canary's clipped gradient (or nothing) plus the lot's noise."""
    import torch

    from hfl.common.privacy import audit, dpsgd, per_example
    from hfl.common.privacy.wavelet import WaveletLayout

    p = policy.p
    layout = WaveletLayout(sizes, p.wavelet_scope) if p.mechanism == "wavelet" else None
    calibration = policy.wavelet or "sound"
    segments = sizes if p.layer_clips else None
    bounds = torch.tensor(list(p.layer_clips) or [p.clip], dtype=torch.float64)
    setting = policy.settings[edge].get("sample") or next(iter(policy.settings[edge].values()))
    z = setting.std / setting.sensitivity
    if layout is not None:
        canary = audit.wavelet_canary(layout, 10.0 * float(bounds.max()))
    else:
        canary = np.full(sum(sizes), 10.0 * float(bounds.square().sum().sqrt()) / np.sqrt(sum(sizes)))
    rows = torch.from_numpy(canary.astype(np.float32))[None, :]
    scale = per_example.clip_factors(per_example.example_norms(rows, layout, calibration, segments), bounds)
    clipped = per_example.clipped_sum(rows, scale, segments)
    scales = dpsgd.noise_scales(z, setting.sensitivity, layout) / breaking

    def release(rng: np.random.Generator, with_canary: bool, count: int) -> np.ndarray:
        gen = dp_draws(policy.p.noise_source, policy.cfg.run.seed, "device", 0, 0, "audit")  # the device's
        total = clipped.repeat(count, 1) if with_canary else torch.zeros(count, clipped.numel())
        return dpsgd.noisy_sum(total, scales, layout, gen).double().numpy()

    shift = clipped.double().numpy()
    score = audit.wavelet_lr_score(layout, shift) if layout is not None else audit.projection_score(shift)
    # the pair tested is canary vs nothing (add/remove one example, shift C): its statement is epsilon(z), also for
    # fixed lots, whose run accounting states the same noise as z / 2 under replace-one
    return release, score, True, z, "gaussian"


def _aggregator_release(policy, edge, noise, sizes, breaking: float):
    """One trusted-edge release: p_max x the canary update clipped as the device clips it, plus the edge's noise
    (the plan's edge-tier instruction of the global stream)."""
    from hfl.common.privacy import audit, on_wire
    from hfl.common.privacy.wavelet import WaveletLayout

    dim = sum(sizes)
    ins = noise.get("edge", "global")
    bound, sens, z = ins.clip, ins.sensitivity, ins.multiplier
    wavelet = ins.shape.config == "wavelet"
    p_max = sens / bound  # the sensitivity S max_k p_k over the clip S
    layout = WaveletLayout([dim])
    canary = audit.wavelet_canary(layout, 10.0 * bound) if wavelet else np.full(dim, 10.0 * bound / np.sqrt(dim))
    shift = p_max * on_wire.enforce_clip(canary.astype(np.float32), ins)[0].astype(np.float64)
    noisy = dataclasses.replace(ins, multiplier=z / breaking)

    def release(rng: np.random.Generator, with_canary: bool) -> np.ndarray:
        base = shift.astype(np.float32) if with_canary else np.zeros(dim, np.float32)
        draws = dp_numpy_rng(policy.p.noise_source, policy.cfg.run.seed, "edge", 0, 0, "audit")  # the edge's own
        return on_wire.edge_release(base, noisy, draws, [1.0], 1, edge, ["canary"], 0, mean=False)[0]

    score = audit.wavelet_lr_score(layout, shift) if wavelet else audit.projection_score(shift)
    return release, score, False, z, ins.mechanism


def _by_trust_release(policy, edge, noise, sizes, breaking: float):
    """One H2FDP / HFL-DP global-stream release, through the code the device or the trusted edge runs
    (on_wire.device_release / edge_release, with the node's own secret randomness): behind an untrusted edge a
    device's noisy upload, behind a trusted one the edge's noisy mean of s_c uploads, the canary device sending +u
    or -u (replace-one: ||u|| = eta m G, the plan's clip, so the pair differs by the sensitivity 2 eta m G; the other
    devices' known uploads cancel, white-box)."""
    from hfl.common.privacy import audit, on_wire
    from hfl.common.privacy.instructions import NoisePlan

    dim = sum(sizes)
    ins = noise.get("edge", "global") or noise.get("device", "global")  # the tier the plan has add the noise
    u = np.full(dim, ins.clip / np.sqrt(dim), np.float32)
    z = ins.multiplier
    noisy = dataclasses.replace(ins, multiplier=z / breaking)
    members = len(policy.members[edge]) if not policy.cfg.train.participants else policy.cfg.train.participants

    def release(rng: np.random.Generator, with_canary: bool) -> np.ndarray:
        sign = 1.0 if with_canary else -1.0
        if noisy.tier == "edge":
            draws = dp_numpy_rng(policy.p.noise_source, policy.cfg.run.seed, "edge", 0, 0, "audit")
            mean = (sign * u / members).astype(np.float32)
            return on_wire.edge_release(mean, noisy, draws, [1.0] * members, members, edge, ["canary"], 0)[0]
        draws = dp_numpy_rng(policy.p.noise_source, policy.cfg.run.seed, "device", 0, 0, "audit")
        return on_wire.device_release(sign * u, NoisePlan([noisy]), "global", draws, "dev-canary", 0)[0]

    return release, audit.projection_score(u), False, z, "gaussian"


RELEASES = {"sample": _sample_release, "aggregator": _aggregator_release, "by_trust": _by_trust_release}


def run_audit(cfg, out: pathlib.Path, trials: int, seed: int, breaking: float = 1.0, log=print,
              tier: str = "auto") -> dict:
    from hfl.common import plans
    from hfl.common.privacy import audit
    from hfl.common.privacy.accountant import epsilon_of_releases

    algorithm = plans.ALGORITHMS.get(cfg.run.algorithm)
    if algorithm.privacy not in LEVELS:
        auditable = [n for n in plans.ALGORITHMS if plans.ALGORITHMS.get(n).privacy in LEVELS]
        raise ValueError(f"run.algorithm = {cfg.run.algorithm}: the audit covers sample-level DP-SGD, DP-FedAvg at a "
                         f"trusted aggregator and by-trust placement ({', '.join(auditable)})")
    if not breaking > 0:
        raise ValueError(f"--break-noise must be > 0, got {breaking}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        policy, edge, noise, sizes = _policy(cfg, pathlib.Path(tmp), tier)
        release, score, batched, claimed_z, mechanism = RELEASES[algorithm.privacy](policy, edge, noise, sizes, breaking)
    delta = policy.p.delta
    # the tight (PLD) figure for one release: RDP's conversion is loose (1.386 at z = 3 where PLD gives 1.271), and
    # a lower bound compared with a loose statement would hide a violation between the two
    claimed = epsilon_of_releases([(mechanism, claimed_z, 1.0, 1)], delta, "pld")
    if algorithm.privacy == "by_trust":
        mode_tier = "trusted edge" if noise.get("edge", "global") else "device behind an untrusted edge"
    else:
        mode_tier = "device" if algorithm.privacy == "sample" else "trusted edge"
    mode = (f"{mode_tier}: {policy.p.mechanism}" + (f", {policy.wavelet} wavelet clip" if policy.wavelet else "")
            + f", calibration {policy.p.calibration}" + (f", noise divided by {breaking:g} (deliberately broken)"
                                                          if breaking != 1.0 else ""))
    log(f"auditing {cfg.run.algorithm} ({mode}): {trials} trials with and {trials} without the canary, "
        f"one release, {sum(sizes)} coordinates")
    result = audit.audit_release(release, np.random.default_rng([seed, 2002]), trials=trials, delta=delta,
                                 epsilon_claimed=claimed, score=score, batched=batched, label=cfg.run.algorithm)
    out.mkdir(parents=True, exist_ok=True)
    report = {**result.summary(), "algorithm": cfg.run.algorithm, "mode": mode, "level": algorithm.privacy,
              "mechanism": policy.p.mechanism, "wavelet_calibration": policy.wavelet or None,
              "calibration": policy.p.calibration, "noise_broken_by": breaking,
              "claimed_noise_multiplier": claimed_z,
              "epsilon_claimed_meaning": "the accountant's epsilon for ONE unsampled release at the multiplier that "
                                         "scales the noise: what the configuration claims for the audited release",
              "max_provable_epsilon": audit.max_provable_epsilon(result.negatives, delta),
              "run_epsilon_planned": max(s.epsilon for s in policy.settings[edge].values()),
              "run_epsilon_claimed": policy.claimed(), "seed": seed, "seconds": round(time.monotonic() - started, 1)}
    (out / "audit.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    audit.plot_scores(result, out / "scores.png",
                      title=f"{cfg.run.algorithm} ({mode})\neps lower bound {result.epsilon_lower:.3g}, "
                            f"claimed {claimed:.3g} for one release")
    (out / "audit.md").write_text(table([report]))
    return report


def table(reports: list[dict]) -> str:
    head = ("| algorithm | mode | epsilon claimed (one release) | epsilon lower bound (95%) | exceeds claim | "
            "max provable | held-out trials | run epsilon (accountant) | run epsilon claimed |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    rows = "".join(
        f"| {r['algorithm']} | {r['mode']} | {r['epsilon_claimed']:.4g} | {r['epsilon_lower_bound']:.4g} | "
        f"{'**yes**' if r['exceeds_claim'] else 'no'} | {r['max_provable_epsilon']:.3g} | "
        f"{r['held_out'][0]} + {r['held_out'][1]} | {r['run_epsilon_planned']:.4g} | "
        f"{'-' if r['run_epsilon_claimed'] is None else format(r['run_epsilon_claimed'], '.4g')} |\n" for r in reports)
    return head + rows + ("\nAudit level: one release (one DP-SGD lot, or one aggregator round), white-box canary. "
                          "A lower bound above the claim disproves the claim; one at or below it proves nothing more "
                          "than that this test could not find a violation.\n")


def cmd_audit(args) -> int:
    from hfl.common import config
    from hfl.common.config import ConfigError

    try:
        cfg = config.load(args.config, args.overrides)
        out = pathlib.Path(args.out or f"runs/audit-{time.strftime('%Y%m%d-%H%M%S')}")
        report = run_audit(cfg, out, args.trials, args.seed, args.break_noise, tier=args.tier)
    except (ConfigError, ValueError) as exc:
        print(f"hfl audit: {exc}", file=sys.stderr)
        return 2
    print(table([report]), end="")
    print(f"wrote {out / 'audit.md'}, {out / 'audit.json'} and {out / 'scores.png'} ({report['seconds']} s)")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("audit", help="empirical privacy audit of the configured DP mechanism (one release)")
    p.add_argument("kind", choices=["privacy"], help="what to audit")
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. run.algorithm=dp-sgd-wav (repeatable)")
    p.add_argument("--trials", type=int, default=4000, help="trials per hypothesis (half choose the threshold, half "
                                                           "give the bound; default 4000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the audit's own draws")
    p.add_argument("--break-noise", type=float, default=1.0, metavar="F",
                   help="divide the noise by F: a deliberately broken mechanism, to see the audit catch it")
    p.add_argument("--out", help="output directory (default runs/audit-TIMESTAMP)")
    p.add_argument("--tier", choices=["auto", "device", "edge"], default="auto",
                   help="by-trust placement (h2fdp, hfl-dp, pedpfl-style): audit a device's release behind an "
                        "untrusted edge or a trusted edge's (default: the first edge's)")
    p.set_defaults(func=cmd_audit)
