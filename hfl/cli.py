"""`hfl`: one entry point for the whole emulator.

    hfl run [CONFIG] [--set section.key=value ...] [--out DIR]   everything on 127.0.0.1, live progress
    hfl run --resume RUN_DIR                                      continue an interrupted run from its checkpoint
    hfl sweep SPEC.toml [--out DIR] [--jobs N] [--dry-run] [--report-only]   runs over seeds, table, plots, claims
    hfl watch URL|RUN_DIR                                         the progress table of a run started elsewhere
    hfl cloud | hfl edge | hfl devices ...                        one role (containers, real machines)
    hfl config [CONFIG] [--set ...] [--reference]                 check and print the resolved config, or the key reference
    hfl health ADDRESS                                            probe a server's gRPC health service
    hfl certs init | issue ROLE ID | devices | show FILE          mutual TLS: CA, node and per-device certificates
    hfl attack [CONFIG] [--set ...]                               gradient inversion (DLG) on a quantized device update
    hfl audit privacy [CONFIG] [--set ...] [--trials N]           empirical lower bound on one release's epsilon
    hfl plan [CONFIG] [--set ...]                                 paper 001's (tau, gamma) for a deadline
    hfl --version

Plugins (your own model, dataset, stage, codec, algorithm): run.plugins = ["my_module"] or HFL_PLUGINS; see
docs/plugins.md.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from typing import Callable

# The launcher shares the cores with the nodes it starts, as they share them with each other (node_spawn.NODE_ENV):
# numpy's OpenBLAS would start a busy-waiting thread per core at import. A local sweep with --jobs 2 of 5-round runs
# took 12.0 s with the launcher's pool sized to the cores, 8.2-8.6 s with one thread (its runs 2.1 against 1.2 s).
# Set before any import of numpy; a value the user exported is kept.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

from hfl.cli_args import add_config_args  # noqa: E402
from hfl.common import config_error

STARTED = time.monotonic()  # `hfl run` reports the whole wall time from here, imports and config checks included

def _setup_logging(role: str) -> None:
    logging.basicConfig(level=os.environ.get("HFL_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format=f"%(asctime)s {role} %(name)s %(levelname)s %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)


def _run_async(coro_factory) -> int:
    """Run a role's coroutine; SIGTERM/SIGINT cancel it so servers stop gracefully."""
    async def main() -> int:
        from hfl.common import heap

        heap.start_trimming()  # a node's transient message buffers do not stay resident (common/heap.py)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        return await coro_factory()

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        logging.getLogger("hfl").warning("stopped by signal")
        return 143
    except TimeoutError as exc:  # an upstream that never came: one line, not a traceback
        logging.getLogger("hfl").error("%s", exc)
        return 1
    except config_error.ConfigError as exc:  # e.g. a spec from the upstream that this node refuses: one line, not a traceback
        logging.getLogger("hfl").error("%s", exc)
        return 2
    except Exception as exc:
        code = getattr(exc, "code", None)
        if callable(code) and callable(getattr(exc, "details", None)):  # a peer's gRPC refusal: its answer, one line
            logging.getLogger("hfl").error("refused by its upstream: %s: %s", code().name, exc.details())
            return 1
        logging.getLogger("hfl").exception("fatal error")
        return 1


def cmd_cloud(args) -> int:
    from hfl.cloud_server.service import serve
    from hfl.common import config as config_mod

    import pathlib

    config = args.config
    if args.resume and config is None:
        config = pathlib.Path(args.run_dir) / "config.toml"
    cfg = config_mod.load(config, args.overrides)
    tls = _tls(args, "cloud")
    return _run_async(lambda: serve(cfg, args.listen, args.run_dir, args.port_file, resume=args.resume, force=args.force,
                                    web_tls=tls, plots=not args.no_plots, **tls.server_kwargs()))


def cmd_edge(args) -> int:
    from hfl.common import topology
    from hfl.edge_server.service import serve

    ids = [topology.edge_id(topology.edge_index(i)) for i in args.id]
    if len(ids) > 1:  # several edges in this process: each on its own port, files and certificate
        if len(set(ids)) < len(ids):
            raise SystemExit(f"hfl edge: an edge id given twice in {', '.join(ids)}")
        for flag, value in (("--listen", args.listen), ("--metrics-listen", args.metrics_listen)):
            if value and not value.endswith(":0"):
                raise SystemExit(f"hfl edge: {flag} {value}: with several --id each edge binds its own port; give port 0")
        if args.port_file and "{id}" not in args.port_file:
            raise SystemExit("hfl edge: --port-file needs {id} (each edge's id) with several --id")
    tls = _tls(args, "edge")

    def one(node_id: str):
        own = tls.for_node(node_id)
        return serve(node_id, args.listen, args.cloud, args.port_file and args.port_file.replace("{id}", node_id),
                     wait_s=args.wait, trust=args.trust, rejoin=args.rejoin, metrics_listen=args.metrics_listen,
                     web_tls=own, **own.edge_kwargs(node_id))

    async def every() -> int:  # one edge's failure ends the process, as it would end a process of its own
        return max(await asyncio.gather(*(one(i) for i in ids)))

    return _run_async(every)


def cmd_devices(args) -> int:
    from hfl.device_client.host import DeviceHost

    if args.hosts < 1 or not 0 <= args.host_index < args.hosts:
        raise SystemExit(f"hfl devices: --host-index {args.host_index} with --hosts {args.hosts}: the index must be "
                         f"0 to {max(args.hosts, 1) - 1} (and --hosts at least 1)")

    tls = _tls(args, "devices")
    host = DeviceHost(args.edge, args.host_index, args.hosts, wait_s=args.wait, **tls.client_kwargs())
    return _run_async(host.run)


def _add_plugins_arg(p) -> None:
    p.add_argument("--plugins", action="append", default=[], metavar="MODULE",
                   help="a plugin module or .py file this node imports (repeatable; also $HFL_PLUGINS): the run's "
                        "spec may name only plugins the node loaded itself")


def _tls(args, role: str):
    from hfl.common.tls import TlsOptions

    tls = TlsOptions.from_args(args, role)
    if role != "probe":
        logging.getLogger("hfl").info("transport: %s", tls.described)
    return tls


def cmd_config(args) -> int:
    from hfl.common import config as config_mod

    if args.reference:
        print(config_mod.reference())
        return 0
    cfg = config_mod.load(args.config, args.overrides)
    if not args.no_data_check:
        from hfl.preflight import preflight

        preflight(cfg)
    print(config_mod.to_toml(cfg), end="")
    from hfl.explain import explain

    for line in explain(cfg):  # on stderr: stdout stays a config file
        print(f"# {line}", file=sys.stderr)
    return 0


def cmd_host_token(args) -> int:
    from hfl.common import certs, session

    secret = session.join_secret()
    if not secret:
        print("hfl host-token: no join secret: set HFL_JOIN_SECRET (or HFL_JOIN_SECRET_FILE) to the run's",
              file=sys.stderr)
        return 2
    try:
        ident = certs.parse_identity("device", args.devices)
    except certs.CertError as exc:
        print(f"hfl host-token: {exc}", file=sys.stderr)
        return 2
    print(session.host_token(secret, ident.lo, ident.hi))
    return 0


def cmd_health(args) -> int:
    import grpc

    from hfl.common.rpc import check_health_sync

    try:
        status = check_health_sync(args.address, args.timeout, **_tls(args, "probe").probe_kwargs())
    except Exception as exc:  # the probe's whole job is to say "no"
        detail = exc.details() if isinstance(exc, grpc.RpcError) else exc
        print(f"{args.address}: {exc.__class__.__name__}: {detail}", file=sys.stderr)
        return 1
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


def cmd_certs(args) -> int:
    from hfl.common import certs

    try:
        if args.action == "init":
            path, created = certs.init_ca(args.dir, force=args.force, days=args.days or certs.CA_DAYS)
            print(f"{'created' if created else 'kept existing'} CA: {certs.describe(path)}")
            return 0
        if args.action == "show":
            for path in args.files:
                print(certs.describe(path))
            return 0
        if args.action == "devices":
            import pathlib

            from hfl.common import device_certs

            started = time.monotonic()
            manifest, issued = device_certs.issue_topology(args.dir, args.edges, args.devices_per_edge,
                                                           args.out or pathlib.Path(args.dir) / "devices")
            print(f"{manifest}: {args.edges * args.devices_per_edge} devices of {args.edges} edges, a certificate each "
                  f"({issued} issued, {args.edges * args.devices_per_edge - issued} kept) in "
                  f"{time.monotonic() - started:.1f}s")
            return 0
        node_id = args.id
        if args.edge is not None:
            if args.role != "device" or node_id or not args.devices_per_edge:
                raise certs.CertError("--edge needs ROLE device, --devices-per-edge and no ID")
            from hfl.common import topology

            e, m = topology.edge_index(args.edge), args.devices_per_edge
            ids = topology.host_slice([topology.device_id(g) for g in range(e * m, (e + 1) * m)], args.host_index, args.hosts)
            if not ids:
                raise certs.CertError(f"host {args.host_index} of {args.hosts} has no devices of {args.edge}")
            node_id = certs.device_range(topology.device_index(ids[0]), len(ids))
        if not node_id:
            raise certs.CertError("give the node ID (or, for devices, --edge and --devices-per-edge)")
        cert, key = certs.issue(args.dir, args.role, node_id, args.san, name=args.name, days=args.days or certs.NODE_DAYS,
                                out_dir=args.out)
        print(f"issued {cert} and {key}: {certs.describe(cert)}")
        return 0
    except (certs.CertError, OSError) as exc:
        print(f"hfl certs: {exc}", file=sys.stderr)
        return 2


def cmd_run(args) -> int:
    from hfl.common.config import ConfigError
    from hfl.launcher import run_with_progress

    out = args.resume or args.out
    if args.cluster:  # one testbed spread over a Ray cluster (hfl/cluster_spread.py)
        from hfl.cluster_spread import run_command

        return run_command(args.config, args.overrides, out, args.cluster, args.quiet, args.certs, bool(args.resume),
                           args.gpus_per_host)
    if args.gpus_per_host is not None:
        print("config error: --gpus-per-host reserves GPUs on a Ray cluster: give --cluster too (on this machine "
              "train.device picks the GPU)", file=sys.stderr)
        return 2
    try:
        return run_with_progress(args.config, args.overrides, out, quiet=args.quiet, certs=args.certs,
                                 resume=bool(args.resume), force=args.force, allow_deaths=args.allow_deaths,
                                 t0=STARTED)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2


def cmd_watch(args) -> int:
    from hfl.watch import watch

    return watch(args.target, interval=args.interval, once=args.once, tls=_tls(args, "probe"))


def cmd_sweep(args) -> int:
    from hfl.sweep import run_sweep

    return run_sweep(args.spec, args.out, jobs=args.jobs, dry_run=args.dry_run, quiet=args.quiet,
                     only_report=args.report_only, cluster=args.cluster,
                     max_seeds=args.max_seeds)


def _add_tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mutual TLS (all three or none)")
    g.add_argument("--ca", help="CA certificate (PEM) that signs every node")
    g.add_argument("--cert", help="this node's certificate (PEM)")
    g.add_argument("--key", help="this node's private key (PEM)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hfl-emulator")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a whole experiment on this machine with live progress")
    add_config_args(p)
    p.add_argument("--out", help="run directory (default: runs/NAME-TIMESTAMP)")
    p.add_argument("--quiet", action="store_true", help="no live progress, one line per round")
    p.add_argument("--certs", metavar="DIR", help="mutual TLS between all processes: CA in DIR (created if missing), "
                                                  "a certificate per node in DIR/nodes and per device in DIR/devices "
                                                  "(issued once, kept)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint (same run id, "
                                                        "config from RUN_DIR/config.toml)")
    p.add_argument("--force", action="store_true", help="start over in a run directory that already holds a run")
    p.add_argument("--allow-deaths", action="store_true",
                   help="exit 0 even if an edge or device host died (fault-injection experiments); deaths are still "
                        "recorded in summary.json")
    p.add_argument("--cluster", metavar="ADDRESS", help="spread the testbed's processes over a Ray cluster (HOST:PORT "
                   "of its head, or auto: $RAY_ADDRESS); needs the cluster extra; see docs/cluster.md")
    p.add_argument("--gpus-per-host", type=float, metavar="N", help="--cluster: GPUs each device host reserves (a "
                   "fraction in (0, 1]: 0.25 = four hosts share one GPU; or a whole number); for train.device")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a grid of experiments (variants x grid x seeds) and tabulate them")
    p.add_argument("spec", help="sweep spec (TOML; see deploy/experiments/smoke.toml)")
    p.add_argument("--out", help="output directory (default: runs/sweep-NAME); finished runs in it are not run again")
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (each is a whole testbed)")
    p.add_argument("--dry-run", action="store_true", help="validate every run's config and list the runs, run nothing")
    p.add_argument("--quiet", action="store_true", help="no live progress, one line per finished run")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: evaluate the spec's claims on OUT/results.json and rewrite results.md/.json")
    p.add_argument("--max-seeds", type=int, metavar="N", help="run and report only the spec's first N seeds (runs go "
                   "seed by seed, every cell at each seed); a later call with a larger N adds the rest")
    p.add_argument("--cluster", metavar="ADDRESS", help="run every run as a task on a Ray cluster (HOST:PORT of its "
                   "head, or auto: $RAY_ADDRESS); needs the cluster extra; see docs/cluster.md")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("cloud", help="start the cloud server (drives the run)")
    add_config_args(p)
    p.add_argument("--listen", default="0.0.0.0:50051", help="address to serve edges on")
    p.add_argument("--run-dir", default="runs/cloud", help="where metrics, summary and plot go")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint (same run id); "
                                                         "edges and devices reconnect on their own")
    p.add_argument("--force", action="store_true", help="start over in a run directory that already holds a run")
    p.add_argument("--no-plots", action="store_true", help="draw no accuracy.png, data.png or mode plots at the end "
                   "(metrics and summary as always; `hfl plot RUN_DIR` draws them later); sweeps start clouds so")
    _add_tls_args(p)
    p.set_defaults(func=cmd_cloud)

    p = sub.add_parser("edge", help="start one edge server (or several in one process)")
    p.add_argument("--id", required=True, action="append",
                   help="edge id: edge-NNN or its index; repeat it to serve several edges from this process, each on "
                        "its own port with its own certificate ({id} in --port-file, --cert and --key stands for each)")
    p.add_argument("--listen", default="0.0.0.0:50061", help="address to serve devices on")
    p.add_argument("--cloud", required=True, help="cloud address HOST:PORT")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the cloud to be SERVING")
    p.add_argument("--rejoin", action="store_true", help="join a run already under way (a resumed cloud): register "
                                                         "with rejoin at once")
    p.add_argument("--trust", choices=["", "trusted", "untrusted"], default=os.environ.get("HFL_TRUST", ""),
                   help="this site's own trust claim (default $HFL_TRUST): untrusted makes its devices add their own "
                        "DP noise; a site can lower the cloud's policy, never raise it")
    p.add_argument("--metrics-listen", default=os.environ.get("HFL_METRICS_LISTEN", ""), metavar="HOST:PORT",
                   help="serve Prometheus /metrics here (default $HFL_METRICS_LISTEN; empty = off); under mutual TLS "
                        "over TLS with this edge's certificate")
    _add_plugins_arg(p)
    _add_tls_args(p)
    p.set_defaults(func=cmd_edge)

    p = sub.add_parser("devices", help="start one device host (many emulated devices of one or more edges)")
    p.add_argument("--edge", required=True, action="append",
                   help="edge address HOST:PORT or EDGE_ID=HOST:PORT (checked on discovery) (repeatable: the host takes "
                        "its share of the union of their devices)")
    p.add_argument("--host-index", type=int, default=0, help="which share of the (union of the) edges' devices to emulate")
    p.add_argument("--hosts", type=int, default=1, help="how many hosts share those devices")
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the edge to be SERVING")
    _add_tls_args(p)
    p.add_argument("--device-certs", metavar="MANIFEST",
                   help="mutual TLS with a certificate per device instead of --cert/--key (with --ca; default "
                        "$HFL_DEVICE_CERTS): the manifest `hfl certs devices` writes; name each edge address by its "
                        "id, --edge edge-001=HOST:PORT")
    _add_plugins_arg(p)
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("watch", help="the progress table of a run started elsewhere (its live page URL or run directory)")
    p.add_argument("target", metavar="URL|RUN_DIR", help="the cloud's live page (http(s)://HOST:PORT/) or a run directory")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between updates")
    p.add_argument("--once", action="store_true", help="print the table once and exit")
    _add_tls_args(p)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("config", help="print the resolved config (or --reference: every key)")
    add_config_args(p)
    p.add_argument("--reference", action="store_true", help="print the table of every key, default and meaning")
    p.add_argument("--no-data-check", action="store_true",
                   help="skip the checks that load the dataset and build the model (data present, devices against "
                        "samples, model against data shape), e.g. to write a config for another machine")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("certs", help="mutual TLS: create a CA, issue node certificates")
    csub = p.add_subparsers(dest="action", required=True)
    default_dir = os.environ.get("HFL_CERTS_DIR", "deploy/certs")
    c = csub.add_parser("init", help="create DIR/ca.pem and DIR/ca.key (kept if they exist)")
    c.add_argument("--dir", default=default_dir, help="CA directory (default $HFL_CERTS_DIR or deploy/certs)")
    c.add_argument("--force", action="store_true", help="replace an existing CA (every node certificate must be reissued)")
    c.add_argument("--days", type=int, help="validity (default 3650)")
    c = csub.add_parser("issue", help="issue DIR/ID.pem and DIR/ID.key for one node, signed by the CA in DIR")
    c.add_argument("role", choices=["cloud", "edge", "device"])
    c.add_argument("id", nargs="?", help="cloud: a name (cloud); edge: edge-NNN; device: dev-NNNNN or a range dev-A..dev-B")
    c.add_argument("--dir", default=default_dir, help="CA directory (default $HFL_CERTS_DIR or deploy/certs)")
    c.add_argument("--out", help="write the certificate and key here instead of DIR")
    c.add_argument("--name", help="file name without extension (default: the id)")
    c.add_argument("--san", action="append", default=[], metavar="NAME",
                   help="extra DNS name or IP address a server is reached at (repeatable; role names such as "
                        "cloud.hfl, localhost and 127.0.0.1 are always included)")
    c.add_argument("--days", type=int, help="validity (default 825)")
    c.add_argument("--edge", help="device: issue for the devices of this edge (with --devices-per-edge)")
    c.add_argument("--devices-per-edge", type=int, help="device: topology.devices_per_edge of the run")
    c.add_argument("--host-index", type=int, default=0, help="device: this host's share of the cluster")
    c.add_argument("--hosts", type=int, default=1, help="device: device hosts per edge")
    c = csub.add_parser("devices", help="a certificate per device of a run (DEVICE.pem, DEVICE.key; kept if still "
                                        "valid) and the manifest a device host reads (--device-certs)")
    c.add_argument("--edges", type=int, required=True, help="topology.edges of the run")
    c.add_argument("--devices-per-edge", type=int, required=True, help="topology.devices_per_edge of the run")
    c.add_argument("--dir", default=default_dir, help="CA directory (default $HFL_CERTS_DIR or deploy/certs)")
    c.add_argument("--out", help="where the certificates and OUT/edges-ExM.json go (default DIR/devices)")
    c = csub.add_parser("show", help="print subject, issuer, validity and names of certificates")
    c.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_certs)

    p = sub.add_parser("host-token", help="print a device host's credential for its own device ids (plaintext runs: "
                                          "give it to the host as HFL_HOST_TOKEN instead of the join secret)")
    p.add_argument("devices", metavar="dev-A..dev-B", help="the host's devices: an id or a range")
    p.set_defaults(func=cmd_host_token)

    p = sub.add_parser("health", help="exit 0 if the server at ADDRESS reports SERVING")
    p.add_argument("address")
    p.add_argument("--timeout", type=float, default=3.0)
    _add_tls_args(p)
    p.set_defaults(func=cmd_health)

    from hfl.attack_cli import add_parser as add_attack_parser

    add_attack_parser(sub)
    from hfl.audit_cli import add_parser as add_audit_parser

    add_audit_parser(sub)
    from hfl.plan_cli import add_parser as add_plan_parser

    add_plan_parser(sub)
    from hfl.plot_cli import add_parser as add_plot_parser

    add_plot_parser(sub)
    return parser


def _prepare_nodes() -> None:
    from hfl.node_spawn import prepare

    prepare()


# Started before the command line is even parsed: the forkserver's imports (torch: ~3 s of CPU, the longest part of
# `hfl run`'s start-up) then overlap everything the launcher does before its first node.
FIRST: dict[str, Callable[[], None]] = {"run": _prepare_nodes}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    FIRST.get(argv[0] if argv else "", lambda: None)()
    args = build_parser().parse_args(argv)
    from hfl import families  # noqa: F401  (every role and command reads configs that name them)
    from hfl.common.config import ConfigError

    if args.command in ("cloud", "edge", "devices"):
        from hfl.testbed import die_with_parent

        die_with_parent()  # a node launched by `hfl run` / the Testbed
        _setup_logging(args.command)
        try:
            from hfl.common.plugins import load_plugins

            # this node's own plugins: $HFL_PLUGINS and --plugins (the cloud's also from its config file); a spec
            # from a peer may name only these
            load_plugins(getattr(args, "plugins", None) or ())
            return args.func(args)
        except (ConfigError, ValueError) as exc:
            logging.getLogger("hfl").error("%s", exc)
            return 2
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
