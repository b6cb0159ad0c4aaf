"""One testbed spread over a Ray cluster: `hfl run CONFIG --cluster ADDRESS` (docs/cluster.md).

A placement group of one bundle per role process (SPREAD strategy), each role a Ray actor (`Role`) that starts its
`hfl cloud|edge|devices` process on its node, listening on every interface; the edges dial the cloud at its node's
address, the device hosts their edges', with the run's join secret (a host token per device host) and relay secret.
The cloud's run directory and every role's log come back to --out; out/placement.json names each role's node.
--certs ships each role's certificate to its node, --resume the run directory to the cloud's; edges sharing a process
are refused. Ctrl-C stops every role at once and brings back what they wrote within STOP_BUDGET_S, then prints the
command that resumes the run."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

from hfl.cluster import ClusterError, _tar, _untar, alive_nodes, check_device, check_gpus, connect

STOP_BUDGET_S = 60.0  # from Ctrl-C to the prompt: the roles' stops and their files, all of them at once


class Role:
    """A Ray actor that runs one role process (`hfl cloud|edge|devices`) on its node, listening on every interface,
    with its own directory (config, port files, logs, the cloud's run directory)."""

    def __init__(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="hfl-ray-role-"))
        self.proc = None
        self.log = None

    def start(self, name: str, args: list[str], env: dict, config_text: str, files: dict[str, bytes] | None = None
              ) -> dict:
        """Start the role's process (`{dir}` in its args: this role's directory), after writing `files` (relative path
        -> bytes: its certificates, a resumed cloud's run directory) there."""
        import ray

        from hfl.node_spawn import node_env, spawn_exec

        (self.dir / "ports").mkdir(exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        (self.dir / "config.toml").write_text(config_text)
        for rel, data in (files or {}).items():
            path = self.dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if rel.endswith(".key"):
                path.chmod(0o600)
        self.log = self.dir / "logs" / f"{name}.log"
        argv = [sys.executable, "-m", "hfl.cli", *[a.replace("{dir}", str(self.dir)) for a in args]]
        full = dict(os.environ, PYTHONUNBUFFERED="1", HFL_PARENT_PID=str(os.getpid()), **env)
        self.proc = spawn_exec(argv, self.log, node_env(full))  # the node dies with this actor (die_with_parent)
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname()}

    def ready(self) -> bool:
        """Answered once the actor's worker is up (Starter.create)."""
        return True

    def address(self, port_name: str, timeout: float = 120.0) -> str:
        import ray

        path = self.dir / "ports" / port_name
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.is_file() and path.read_text().strip():
                return f"{ray.util.get_node_ip_address()}:{path.read_text().strip()}"
            if self.proc.poll() is not None:
                raise RuntimeError(f"{port_name} exited with {self.proc.returncode} before listening: "
                                   f"{self.log.read_text()[-1500:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{port_name} did not listen within {timeout:.0f}s")

    def rows(self, since: int) -> tuple[list[str], int | None]:
        """New lines of the run's metrics.jsonl (the cloud's) and the process's exit code (None: running)."""
        path = self.dir / "run" / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        return lines[since:], self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except Exception:
            return None

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM to the role's process group, SIGKILL after `grace` (a stopped process, as under SIGSTOP, acts on
        nothing but SIGKILL)."""
        if self.proc is None:  # interrupted before its process started
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def files(self) -> bytes:
        """The role's directory as tar bytes (its certificates and keys left out); the node keeps no copy."""
        shutil.rmtree(self.dir / "certs", ignore_errors=True)
        data = _tar(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        return data


def plan_roles(cfg, nodes: int) -> list[tuple[str, str | None]]:
    """(role name, the edge it serves or None) in start order: the cloud, one process per edge, the device hosts
    (per_edge layout: hosts_per_edge per edge; per_core: topology.device_hosts, else one per node)."""
    from hfl.common import topology

    t = cfg.topology
    if t.edge_processes not in (0, t.edges):
        raise ClusterError("--cluster: topology.edge_processes shares processes among edges; a spread run starts one "
                           "process per edge (set it to 0)")
    roles: list[tuple[str, str | None]] = [("cloud", None)]
    edges = [members[0] for members in topology.edge_groups(cfg)]
    roles += [(e, e) for e in edges]
    if t.host_layout == "per_edge":
        roles += [(f"devices-{e:03d}-{h}", edges[e]) for e in range(t.edges) for h in range(t.hosts_per_edge)]
    else:
        hosts = topology.host_count(cfg, cpus=t.device_hosts or nodes)
        roles += [(f"devices-c{h}", None) for h in range(hosts)]
    return roles


def role_cpus(node_cpus: list[float], roles: int) -> float:
    """The largest CPU share per role process (at most one) at which every process fits a node's bundle."""
    shares = sorted({min(1.0, n / m) for n in node_cpus if n > 0 for m in range(1, roles + 1)}, reverse=True)
    for share in shares:
        if sum(int(n / share + 1e-9) for n in node_cpus) >= roles:
            return share
    return 0.0


def spread_config(config, overrides, out, resume: bool):
    """The run's config and the files its cloud starts with: a new run's (none), or under --resume the run
    directory `out` (config.toml from it, the one override taken more rounds, as a local resume)."""
    from hfl.common import config as config_mod

    if not resume:
        return config_mod.load(config, overrides), {}
    from hfl.testbed import _check_resume_overrides

    run_dir = pathlib.Path(out)
    saved = run_dir / "config.toml"
    if config is not None and pathlib.Path(config).resolve() != saved.resolve():
        raise ClusterError(f"--resume continues the run with its own config ({saved}): give no config file")
    if not saved.is_file():
        raise ClusterError(f"--resume {run_dir}: no config.toml there (not a run directory)")
    if (run_dir / "summary.json").is_file():
        raise ClusterError(f"{run_dir} holds a summary.json: the run finished, nothing to resume")
    _check_resume_overrides(overrides)
    cfg = config_mod.load(saved, overrides)
    before = config_mod.load(saved).run.rounds
    if cfg.run.rounds < before:
        raise ClusterError(f"--resume --set run.rounds={cfg.run.rounds}: the run has {before} rounds; a resume can "
                           f"only add rounds")
    skip = {"logs", "placement.json"}  # this driver's, not the cloud's
    files = {f"run/{f.relative_to(run_dir).as_posix()}": f.read_bytes() for f in sorted(run_dir.rglob("*"))
             if f.is_file() and f.relative_to(run_dir).parts[0] not in skip}
    if cfg.run.rounds != before:
        files["run/config.toml"] = config_mod.to_toml(cfg).encode()
    return cfg, files


def tls_files(flags: list[str], root: pathlib.Path) -> tuple[list[str], dict[str, bytes]]:
    """A role's TLS flags (hfl/testbed_certs.py) as paths on its node, {dir}/certs/REL, and the files to ship there:
    each path's, a device manifest's with its folder of certificates."""
    args, files = [], {}
    root = root.resolve()
    for flag, value in zip(flags[::2], flags[1::2]):
        path = pathlib.Path(value).resolve()
        for f in sorted(q for q in path.parent.iterdir() if q.is_file()) if flag == "--device-certs" else [path]:
            files[f"certs/{f.relative_to(root).as_posix()}"] = f.read_bytes()
        args += [flag, "{dir}/certs/" + path.relative_to(root).as_posix()]
    return args, files


def check_gpu_fit(nodes: dict[str, dict], hosts: int, gpus: float) -> None:
    """A spread run's device hosts of `gpus` each: each fits a node, all fit the cluster."""
    most = max((n.get("gpus", 0.0) for n in nodes.values()), default=0.0)
    total = sum(n.get("gpus", 0.0) for n in nodes.values())
    if gpus > most or hosts * gpus > total + 1e-9:
        raise ClusterError(f"--gpus-per-host {gpus:g}: {hosts} device hosts need {hosts * gpus:g} GPUs, {gpus:g} on "
                           f"one node; the cluster has {total:g} (at most {most:g} on a node)")


def run_spread(config, overrides, out, address: str, quiet: bool = False, cpus_per_role: float | None = None,
               gpus_per_host: float | None = None, certs: str | None = None, resume: bool = False) -> int:
    """One testbed over the cluster: a placement group of one bundle per role process, SPREAD over the nodes;
    the cloud first, each edge dialling the cloud's node address, each device host its edges'. The cloud's run
    directory comes back to `out` (and every role's log to out/logs, where each ran to out/placement.json).
    `certs`: mutual TLS as a local run's (hfl/testbed_certs.py), each role's certificate and key shipped to its node;
    `resume`: `out` is a run directory, its files shipped to the cloud's node and the cloud started on its checkpoint;
    `gpus_per_host`: each device host's bundle and actor reserve that many GPUs."""
    from hfl.preflight import devices_elsewhere, preflight

    gpus = check_gpus(gpus_per_host, "--gpus-per-host")
    cfg, run_files = spread_config(config, overrides, out, resume)
    with devices_elsewhere():  # train.device = "cuda": the nodes' GPUs (check_device, the hosts themselves)
        preflight(cfg)
    check_device(cfg, gpus, "--cluster")
    out = pathlib.Path(out or pathlib.Path("runs") / f"{cfg.run.name}-cluster-{time.strftime('%Y%m%d-%H%M%S')}")
    if (out / "summary.json").is_file() and not resume:
        raise ClusterError(f"{out} holds a finished run: give another --out")
    ray = connect(address)
    tls = {}
    if certs:  # a CA in DIR (made when missing) and each role's certificate, as for a local run
        from hfl.testbed_certs import testbed_tls_args

        tls = testbed_tls_args(certs, cfg)
    nodes = alive_nodes(ray)
    roles = plan_roles(cfg, len(nodes))
    hosts = len(roles) - 1 - cfg.topology.edges
    if gpus:
        check_gpu_fit(nodes, hosts, gpus)
    total = sum(n["cpus"] for n in nodes.values())
    cpus_per_role = cpus_per_role or role_cpus([n["cpus"] for n in nodes.values()], len(roles))
    if not cpus_per_role or cpus_per_role * len(roles) > total:
        raise ClusterError(f"--cluster: {len(roles)} role processes at {cpus_per_role:g} CPU each need more CPUs "
                           f"than the cluster has ({total:g})")
    from ray.util.placement_group import remove_placement_group

    group = reserve(ray, len(roles), hosts, cpus_per_role, gpus)
    start = Starter(ray, group, cfg, cpus_per_role, gpus, tls, certs)
    say = (lambda *a: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    code = 1
    with interrupts() as stop:
        try:
            start.all(roles, run_files, resume, stop)
            say(f"run {cfg.run.name} on {address}: " + ", ".join(f"{n} on {p['ip']}/{p['node_id'][:8]}"
                                                                for n, p in start.placed.items()))
            code = follow(ray, start.actors, out, resume, say, stop)
        except KeyboardInterrupt:  # Ctrl-C: every role stopped, what they wrote brought back, then the way on
            code = 130
            say(f"interrupted: stopping the run's {len(start.actors)} processes (at most {STOP_BUDGET_S:.0f} s)")
        finally:
            lost = bring_back(ray, start.actors, out)
            remove_placement_group(group)
            if out.is_dir():
                (out / "placement.json").write_text(json.dumps(start.placed, indent=1) + "\n")
            if lost:
                say(f"not brought back (lost with their node, or past {STOP_BUDGET_S:.0f} s): {', '.join(lost)}")
    say(f"run directory: {out}")
    if code == 130 and not (out / "summary.json").is_file():
        print(f"interrupted; continue this run with:\n  hfl run --resume {out} --cluster {address}"
              + (f" --certs {certs}" if certs else "") + (f" --gpus-per-host {gpus:g}" if gpus else ""),
              file=sys.stderr, flush=True)
    return code


def reserve(ray, roles: int, hosts: int, cpus_per_role: float, gpus: float):
    """The run's placement group, ready: a bundle of `cpus_per_role` per role process (the last `hosts` of them, the
    device hosts', with `gpus` each), SPREAD over the nodes."""
    from ray.util.placement_group import placement_group, remove_placement_group

    host_bundle = {"CPU": cpus_per_role, **({"GPU": gpus} if gpus else {})}
    group = placement_group([{"CPU": cpus_per_role}] * (roles - hosts) + [host_bundle] * hosts, strategy="SPREAD")
    try:
        ray.get(group.ready(), timeout=120)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ClusterError(f"--cluster: the cluster did not place {roles} processes at {cpus_per_role:g} CPU "
                           f"each{f' ({gpus:g} GPU a device host)' if gpus else ''} within 120 s (other work holds "
                           f"its CPUs?)") from None
    return group


class Starter:
    """Starts the run's roles in their bundles, in order (the cloud, the edges at the cloud's address, the device
    hosts at their edges'), each with the run's secrets and its own certificate; `actors` and `placed` (role -> its
    node) hold what started so far, for the stop."""

    def __init__(self, ray, group, cfg, cpus_per_role: float, gpus: float, tls: dict, certs: str | None):
        from hfl.common import config as config_mod
        from hfl.common import plugins, session

        self.ray, self.group, self.cfg, self.cpus, self.gpus = ray, group, cfg, cpus_per_role, gpus
        self.tls, self.certs = tls, certs
        self.join = os.environ.get(session.JOIN_ENV) or secrets.token_hex(16)
        self.relay = os.environ.get("HFL_RELAY_SECRET") or secrets.token_hex(32)
        self.env = {plugins.ENV: ",".join(dict.fromkeys([*plugins.env_plugins(), *cfg.run.plugins])),
                    "HFL_LAUNCHED_AT": repr(time.time())}
        self.text = config_mod.to_toml(cfg)
        self.actors: dict[str, Any] = {}
        self.placed: dict[str, dict] = {}

    def create(self, roles: list[tuple[str, str | None]]) -> None:
        """Every role's actor, in its bundle, all at once, and alive before any process starts: a worker starting
        under load takes seconds, and a resumed cloud gives an edge that is not back its rejoin grace only."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        edges = self.cfg.topology.edges
        for i, (name, _) in enumerate(roles):
            self.actors[name] = self.ray.remote(Role).options(
                num_cpus=self.cpus, num_gpus=self.gpus if i > edges else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                                     placement_group_bundle_index=i)).remote()
        self.ray.get([a.ready.remote() for a in self.actors.values()])

    def launch(self, starts: list[tuple[str, list[str], dict, str | None, dict | None]]) -> None:
        """Start these roles' processes at once: (name, args, env, the TLS key to use or None: its name, files)."""
        calls = {}
        for name, args, env, key, files in starts:
            flags, cert_files = tls_files(self.tls.get(key or name, []), pathlib.Path(self.certs)) if self.tls \
                else ([], {})
            calls[name] = self.actors[name].start.remote(name, args + flags, {**self.env, **env}, self.text,
                                                         {**(files or {}), **cert_files})
        self.placed.update(zip(calls, self.ray.get(list(calls.values()))))

    def all(self, roles: list[tuple[str, str | None]], run_files: dict, resume: bool, stop: threading.Event) -> None:
        from hfl.common import session, topology

        cfg, ray, edges = self.cfg, self.ray, self.cfg.topology.edges
        self.create(roles)
        self.launch([("cloud", ["cloud", "{dir}/run/config.toml" if resume else "{dir}/config.toml", "--listen",
                                "0.0.0.0:0", "--run-dir", "{dir}/run", "--port-file", "{dir}/ports/cloud"]
                      + (["--resume"] if resume else []), {session.JOIN_ENV: self.join, "HFL_RELAY_SECRET": self.relay},
                      None, run_files)])
        cloud = ray.get(self.actors["cloud"].address.remote("cloud"))
        interrupted(stop)
        self.launch([(name, ["edge", "--id", edge, "--cloud", cloud, "--port-file", "{dir}/ports/" + edge, "--listen",
                             "0.0.0.0:0", "--metrics-listen", "127.0.0.1:0"] + (["--rejoin"] if resume else []),
                      {session.JOIN_ENV: self.join}, None, None) for name, edge in roles[1:1 + edges]])
        edge_address = dict(zip([edge for _, edge in roles[1:1 + edges]],
                                ray.get([self.actors[name].address.remote(edge) for name, edge in roles[1:1 + edges]])))
        interrupted(stop)
        members = [topology.edge_members(cfg, e) for e in range(edges)]
        hosts, starts = roles[1 + edges:], []
        for h, (name, edge) in enumerate(hosts):
            if cfg.topology.host_layout == "per_edge":
                e, k = list(edge_address).index(edge), int(name.rsplit("-", 1)[1])
                share = topology.host_slice(members[e], k, cfg.topology.hosts_per_edge)
                args = ["devices", "--edge", edge_address[edge], "--host-index", str(k), "--hosts",
                        str(cfg.topology.hosts_per_edge)]
            else:
                share = topology.union_slice(members, h, len(hosts))
                args = ["devices", *[a for e, addr in edge_address.items() for a in ("--edge", f"{e}={addr}")],
                        "--host-index", str(h), "--hosts", str(len(hosts))]
            token = session.host_token(self.join, topology.device_index(share[0]), topology.device_index(share[-1]))
            starts.append((name, args, {session.HOST_ENV: token, "HFL_RELAY_SECRET": self.relay},
                           name if cfg.topology.host_layout == "per_edge" else "devices", None))
        self.launch(starts)

def follow(ray, actors: dict[str, Any], out: pathlib.Path, resume: bool, say, stop: threading.Event) -> int:
    """The run's rounds as they land (the cloud's metrics rows), until the cloud exits; then the other roles' exit.
    Returns the cloud's exit code."""
    done = out / "metrics.jsonl"  # a resumed run's rounds before this part: not shown again
    seen = len(done.read_text().splitlines()) if resume and done.is_file() else 0
    while True:
        interrupted(stop)
        rows, code = ray.get(actors["cloud"].rows.remote(seen))
        for line in rows:
            row = json.loads(line)
            say(f"round {row.get('round')}: accuracy {row.get('accuracy')}")
        seen += len(rows)
        if code is not None:
            break
        if stop.wait(1.0):
            raise KeyboardInterrupt
    ray.get([a.wait.remote(60) for n, a in actors.items() if n != "cloud"])
    return code

@contextlib.contextmanager
def interrupts():
    """Ctrl-C (SIGINT) and SIGTERM during a spread run: an Event that the run checks between its Ray calls, and a
    KeyboardInterrupt where Python raises one. Ray's calls run Python's signal handlers from inside, and one of them
    can drop the KeyboardInterrupt the default handler raises (seen: a driver polling its cloud went on for minutes
    after Ctrl-C, under a full test suite's load); the Event is set whatever becomes of the exception. Off the main
    thread (where handlers cannot be set) the Event is never set and Ctrl-C acts as Python's default does."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        stop.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def interrupted(stop: threading.Event) -> None:
    if stop.is_set():
        raise KeyboardInterrupt


def bring_back(ray, actors: dict[str, Any], out: pathlib.Path, budget: float = STOP_BUDGET_S) -> list[str]:
    """Every role stopped at once and its directory brought back into `out` (the cloud's run directory, every role's
    log appended to out/logs), all within `budget` seconds; then every actor killed. Returns the roles whose files did
    not come back (lost with their node, or past the budget). A second Ctrl-C skips to the kill."""
    deadline = time.monotonic() + budget
    left = lambda: max(0.0, deadline - time.monotonic())  # noqa: E731
    missing = list(actors)
    try:
        stops = [a.stop.remote() for a in actors.values()]
        ray.wait(stops, num_returns=len(stops), timeout=left())
        # an actor runs its calls in order: each role's files are read once its stop has returned
        files = {name: a.files.remote() for name, a in actors.items()}
        ready, _ = ray.wait(list(files.values()), num_returns=len(files), timeout=left())
        for name, ref in files.items():
            if ref in ready:
                try:
                    data = ray.get(ref, timeout=left())
                except Exception:  # the role was lost with its node: its files are gone with it
                    continue
                _unpack(name, data, out)
                missing.remove(name)
    except KeyboardInterrupt:
        pass
    finally:
        for a in actors.values():
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
    return missing


def _unpack(name: str, data: bytes, out: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _untar(data, pathlib.Path(tmp))
        if name == "cloud" and (pathlib.Path(tmp) / "run").is_dir():
            shutil.copytree(pathlib.Path(tmp) / "run", out, dirs_exist_ok=True)
        for log in (pathlib.Path(tmp) / "logs").glob("*.log"):
            (out / "logs").mkdir(parents=True, exist_ok=True)
            with open(out / "logs" / log.name, "ab") as f:  # a resumed run's after the first part's
                f.write(log.read_bytes())


def run_command(config, overrides, out, address: str, quiet: bool, certs: str | None, resume: bool,
                gpus_per_host: float | None = None) -> int:
    """`hfl run CONFIG --cluster ADDRESS`: one line on bad input, before anything starts."""
    from hfl.common.certs import CertError
    from hfl.common.config import ConfigError

    try:
        return run_spread(config, overrides, out, address, quiet=quiet, gpus_per_host=gpus_per_host, certs=certs,
                          resume=resume)
    except (ClusterError, ConfigError, CertError) as exc:
        print(f"cluster error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a role that did not start, a lost node: Ray's error, the logs in --out
        if not type(exc).__module__.startswith("ray."):
            raise
        print(f"cluster run failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1


