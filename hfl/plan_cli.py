"""`hfl plan [CONFIG] [--set ...] [--q1 Q] [--dim D] [--rows N] [--out DIR]`: the (tau, gamma) that paper 001's
Sec. IV optimiser picks for the config's [latency] deadline and model (the same choice the cloud makes for round 0
with latency.auto_tau_gamma = true, or for a later round given its measured q1 with --q1), the objective Phi over
every feasible tau as a table, and with --out DIR plan.png (Phi and gamma against tau) and plan.json.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys


def model_dim(cfg) -> int:
    from hfl.common.data import load_dataset
    from hfl.common.models import build, num_parameters

    data = load_dataset(cfg.data)
    return num_parameters(build(cfg.model.name, data.input_shape, data.num_classes))


def make_plan(cfg, dim: int, q1: float | None = None) -> dict:
    from hfl.common.quantization import latency_opt as lo
    from hfl.common.quantization import schedule

    cfg, time_base = schedule.with_time_base(cfg, dim)  # the T_di times the cloud uses (latency.time_base)
    choice, q1_used, source = schedule.choose(cfg, dim, q1)
    s = cfg.latency
    closed = lo.closed_form_tau_gamma(s.deadline_s, s.t_cp_s, s.t_de_s, s.t_ec_s, num_edges=cfg.topology.edges,
                                      num_devices=cfg.num_devices, q1=q1_used, uploads=s.uploads)
    return {"choice": choice, "closed": closed, "q1": q1_used, "q1_source": source, "dim": dim,
            "edges": cfg.topology.edges, "devices": cfg.num_devices, "latency": dataclasses.asdict(s),
            "time_base": time_base}


def plot(plan: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = plan["choice"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=110)
    ax.plot(c.curve_tau, c.curve_phi, marker=".", label="Phi(tau, gamma = floor(slack))")
    ax.plot([c.tau], [c.phi], "r*", ms=14, label=f"chosen tau={c.tau}, gamma={c.gamma}")
    for root in plan["closed"].roots:
        if c.curve_tau.min() <= root <= c.curve_tau.max() + 1:
            ax.axvline(root, ls=":", color="grey")
    ax.set(xlabel="tau (intra-set gradient steps)", ylabel="Phi (Lemma 2, 2nd term)",
           title=f"paper 001 Sec. IV: T_di <= {c.deadline:g} s, q1 = {plan['q1']:.3g} ({plan['q1_source'].split(' ')[0]})")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(c.curve_tau, c.curve_gamma, color="tab:green", alpha=0.6, ls="--", label="gamma")
    ax2.set_ylabel("gamma (local steps)", color="tab:green")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cmd_plan(args) -> int:
    from hfl.common import config as config_mod
    from hfl.common.quantization import latency_opt as lo

    try:
        cfg = config_mod.load(args.config, args.overrides)
        if args.q1 is not None and not args.q1 >= 0:
            raise config_mod.ConfigError(f"--q1 must be a number >= 0, got {args.q1!r}")
        if args.dim is not None and args.dim < 1:
            raise config_mod.ConfigError(f"--dim must be >= 1, got {args.dim!r}")
        dim = args.dim or model_dim(cfg)
        plan = make_plan(cfg, dim, args.q1)
    except (config_mod.ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"hfl plan: {exc}", file=sys.stderr)
        return 2
    s, c = plan["latency"], plan["choice"]
    print(f"{cfg.run.algorithm}: C = {cfg.topology.edges} edges, N = {cfg.num_devices} devices, d = {dim}; "
          f"t_CP = {s['t_cp_s']:g} s, t_DE = {s['t_de_s']:g} s, t_EC = {s['t_ec_s']:g} s (time base: "
          f"{'the model trained' if plan['time_base']['source'] == 'model' else 'latency.* as set'})")
    print(f"q1 = {plan['q1']:.6g} from {plan['q1_source']}; k = C (1 + q1) / N = "
          f"{lo.split_constant(cfg.topology.edges, cfg.num_devices, plan['q1']):.6g}")
    print(lo.format_choice(c, plan["closed"], limit=args.rows or c.curve_tau.size))
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot(plan, out / "plan.png")
        closed = plan["closed"]
        report = {**c.as_dict(), "q1": plan["q1"], "q1_source": plan["q1_source"], "model_parameters": dim,
                  "edges": plan["edges"], "devices": plan["devices"], "latency": plan["latency"],
                  "time_base": plan["time_base"],
                  "closed_form": {"tau": closed.tau, "gamma": closed.gamma, "j": closed.j, "roots": list(closed.roots),
                                  "feasible": closed.feasible}}
        (out / "plan.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out / 'plan.png'} and {out / 'plan.json'}")
    return 0


def add_parser(subparsers) -> None:
    from hfl.cli_args import add_config_args

    p = subparsers.add_parser("plan", help="paper 001's (tau, gamma) for the [latency] deadline, with its cost curve")
    add_config_args(p)
    p.add_argument("--q1", type=float, help="uplink q1 to plan for (e.g. a run's measured q_uplink); default: the "
                                            "theoretical q1 of the uplink codec (QSGD bound for s1)")
    p.add_argument("--dim", type=int, help="model parameters d (default: build the config's model on its dataset)")
    p.add_argument("--rows", type=int, default=40, help="curve rows printed, evenly spaced (0 = all)")
    p.add_argument("--out", help="write plan.png and plan.json here")
    p.set_defaults(func=cmd_plan)
