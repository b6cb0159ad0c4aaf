"""Sweeps and testbeds on a Ray cluster (`hfl sweep SPEC --cluster ADDRESS`, `hfl run CONFIG --cluster ADDRESS`): the
one module that imports Ray (the `cluster` extra: pip install -e ".[cluster]"); everything else, a local `hfl run`
and a local sweep included, runs without it.

Every run of the grid is one Ray task that starts its whole testbed on one node, by the local run path of
hfl/sweep.py (each role still its own OS process on real sockets, on that node's loopback), into a temporary
directory of the node. The task returns the finished run directory as tar bytes, unpacked into the driver's --out,
so results.md, the plots and the claims' verdicts are computed exactly as for a local sweep, and no shared
filesystem is needed. A run reserves the CPUs and memory it needs: the spec's [cluster] table, a `cluster.KEY`
override in a variant or the grid (per run), else derived from its topology (one CPU and half a GiB per role
process). Ray CPUs are logical: a node started with `ray start --num-cpus N` runs runs that together reserve N.

A run lost with its node (a system failure, not an error of the run itself) is submitted once more (Ray places it
on a node still alive) and the retry is reported; OUT/CELL/seed-S/node.json names the node a run ran on (and the
node it was lost with), and the sweep's provenance lists the runs per node.

`hfl run CONFIG --cluster ADDRESS` spreads one testbed instead: a placement group of one bundle per role process
(SPREAD strategy), each role a Ray actor that starts its `hfl cloud|edge|devices` process on its node, listening on
every interface; the edges dial the cloud at its node's address, the device hosts their edges', with the run's join
secret (a host token per device host) and relay secret. The cloud's run directory and every role's log come back to
--out; out/placement.json names each role's node. --certs ships each role's certificate to its node, --resume the
run directory to the cloud's; edges sharing a process are refused.

GPUs: a run reserves `gpus_per_host` ([cluster], a run's cluster.gpus_per_host, `hfl run --gpus-per-host`) for each
of its device hosts (Ray's num_gpus); train.device (common/models.torch_device) is where the hosts train.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import pathlib
import shutil
import socket
import tarfile
import tempfile
import time
from typing import Any

EXTRA = 'pip install -e ".[cluster]"'
KEYS = {"cpus": "logical CPUs a run reserves on its node (default: one per role process)",
        "memory_gb": "memory a run reserves, GiB (default: 0.5 per role process)",
        "gpus_per_host": "GPUs each device host reserves (Ray's num_gpus): a fraction in (0, 1] (0.25: four hosts "
                         "share one GPU) or a whole number (default: none; for train.device = auto or cuda)"}
NODE_FILE = "node.json"


class ClusterError(ValueError):
    pass


# ---- resources (no Ray) --------------------------------------------------------------------------
def check_table(table: Any, where: str) -> dict[str, float]:
    """A [cluster] table (or a run's cluster.* overrides): known keys, positive numbers."""
    if not isinstance(table, dict):
        raise ClusterError(f"{where} must be a table with keys {', '.join(KEYS)}, got {table!r}")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ClusterError(f"unknown key {unknown[0]!r} in {where}; allowed keys: {', '.join(KEYS)}")
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ClusterError(f"{where} {key} must be a positive number, got {value!r}")
    check_gpus(table.get("gpus_per_host"), f"{where} gpus_per_host")
    return dict(table)


def check_gpus(value: float | None, where: str) -> float:
    """gpus_per_host: a fraction in (0, 1] or a whole number of GPUs, as Ray takes them (None: no GPU, 0.0)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or (value > 1 and not float(value).is_integer()):
        raise ClusterError(f"{where} must be a fraction in (0, 1] (a share of one GPU) or a whole number of GPUs, "
                           f"got {value!r}")
    return float(value)


def gpus_needed(hosts: int, per_host: float) -> float:
    """GPUs `hosts` device hosts of `per_host` each reserve together, as one Ray request (over one: whole GPUs)."""
    total = hosts * per_host
    return total if total <= 1 else float(math.ceil(total - 1e-9))


def check_device(cfg, gpus: float, where: str) -> None:
    """train.device = "cuda" on a cluster needs GPUs reserved: a run without them may land on a node without one."""
    if cfg.train.device == "cuda" and not gpus:
        raise ClusterError(f'{where}: train.device = "cuda" needs GPUs reserved on the cluster: set gpus_per_host')


def processes(cfg) -> int:
    """Role processes of a local testbed of this config: the cloud, the edge processes, the device hosts (a per_core
    layout with device_hosts = 0 starts one host per core of the node it lands on: counted as one here)."""
    from hfl.common import topology

    t = cfg.topology
    edges = t.edge_processes or t.edges
    return 1 + edges + topology.host_count(cfg, cpus=1)


def resources(run, table: dict[str, float]) -> dict[str, float]:
    """What one run reserves: its own cluster.* overrides, else the spec's [cluster], else derived; GPUs:
    gpus_per_host for each of its device hosts (gpus_needed)."""
    from hfl.common import topology

    n = processes(run.config)
    merged = {"cpus": float(n), "memory_gb": 0.5 * n, **table, **(run.resources or {})}
    gpus = gpus_needed(topology.host_count(run.config, cpus=1), float(merged.get("gpus_per_host", 0.0)))
    return {"cpus": float(merged["cpus"]), "memory_gb": float(merged["memory_gb"]), "gpus": gpus}


def committed_seconds(spec, out: pathlib.Path) -> dict[str, float]:
    """Cell -> mean whole-run seconds from a finished results.json of this spec: --out's own, else a committed
    report under reproductions/ whose name is the spec's."""
    root = pathlib.Path(__file__).resolve().parents[1] / "reproductions"
    candidates = [out / "results.json"] + sorted(root.glob(f"*/{spec.name}/results.json"))
    for path in candidates:
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if stored.get("name") != spec.name:
            continue
        found = {c["cell"]: c.get("timing", {}).get("total_seconds", {}).get("mean") for c in stored.get("cells", [])}
        found = {k: v for k, v in found.items() if isinstance(v, (int, float))}
        if found:
            return found
    return {}


def estimate_lines(spec, runs, todo, table, out: pathlib.Path) -> list[str]:
    """--dry-run: each run's reservation and the CPU-hours of the runs to do (from committed run times)."""
    seconds = committed_seconds(spec, out)
    to_do = {id(r) for r in todo}
    lines, cpu_s, unknown = [], 0.0, 0
    for run in runs:
        r = resources(run, table)
        s = seconds.get(run.cell)
        lines.append(f"  {'todo' if id(run) in to_do else 'done'}  {run.run_dir.relative_to(out)}  {r['cpus']:g} CPU, "
                     f"{r['memory_gb']:g} GiB" + (f", {r['gpus']:g} GPU" if r["gpus"] else "")
                     + (f", ~{s:.0f} s" if s is not None else ""))
        if id(run) in to_do:
            if s is None:
                unknown += 1
            else:
                cpu_s += s * r["cpus"]
    if not todo:
        lines.append("estimate: nothing to run")
    elif unknown == len(todo):
        lines.append(f"estimate: no committed run times for spec {spec.name!r}; CPU-hours unknown")
    else:
        lines.append(f"estimate: {cpu_s / 3600:.2f} CPU-hours for {len(todo) - unknown} runs with committed run times"
                     + (f"; {unknown} runs without one not counted" if unknown else ""))
    return lines


# ---- Ray -----------------------------------------------------------------------------------------
def import_ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--cluster needs Ray, which is not installed: {EXTRA} (the `cluster` extra)") from None
    return ray


def resolve(address: str) -> str:
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise ClusterError("--cluster auto: RAY_ADDRESS is not set (export it, or give HOST:PORT of the Ray head)")
    return address


def _reachable(address: str, timeout: float = 5.0) -> None:
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"--cluster {address}: give the Ray head as HOST:PORT (e.g. 127.0.0.1:6379) or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(f"--cluster {address}: cannot reach a Ray head there ({exc.strerror or exc})") from None


def connect(address: str):
    """Ray, connected to the cluster at `address` (the run's HFL_* environment handed to its workers); once a
    process (a second call, as after `warm_up`, gives the same connection or the same error)."""
    if address in _connected:
        if isinstance(_connected[address], ClusterError):
            raise _connected[address]
        return _connected[address]
    try:
        _connected[address] = _connect(address)
    except ClusterError as exc:
        _connected[address] = exc
        raise
    return _connected[address]


_connected: dict[str, Any] = {}


def _connect(address: str):
    ray = import_ray()
    address = resolve(address)
    _reachable(address)
    env = {k: v for k, v in os.environ.items() if k.startswith("HFL_")}
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR", configure_logging=True,
                 runtime_env={"env_vars": env} if env else None)
    except Exception as exc:  # ConnectionError, RuntimeError, ...: one line, before anything starts
        raise ClusterError(f"--cluster {address}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None
    return ray


def alive_nodes(ray) -> dict[str, dict]:
    """Node id -> {name, ip, cpus, memory_gb} of the nodes alive now."""
    out = {}
    listed = ray.nodes()
    ips = [n.get("NodeManagerAddress") for n in listed]
    for node in listed:
        if node.get("Alive"):
            res = node.get("Resources", {})
            ip = node.get("NodeManagerAddress")
            out[node["NodeID"]] = {"name": label(ip, node["NodeID"], ips.count(ip) > 1), "ip": ip,
                                   "cpus": res.get("CPU", 0.0), "memory_gb": res.get("memory", 0.0) / 2 ** 30,
                                   "gpus": res.get("GPU", 0.0),
                                   "custom": sorted(k for k in res if k not in STANDARD and not k.startswith("node:"))}
    return out


STANDARD = ("CPU", "GPU", "memory", "object_store_memory", "accelerator_type")


def label(ip: str, node_id: str, shared_ip: bool) -> str:
    """A node's name in progress and provenance: its address, with its id's head where nodes share one (several
    nodes on one machine, as in the tests)."""
    return f"{ip}/{node_id[:8]}" if shared_ip else ip


def check_fits(runs, table, nodes: dict[str, dict]) -> None:
    if not nodes:
        raise ClusterError("the Ray cluster has no node alive")
    most_cpus = max(n["cpus"] for n in nodes.values())
    most_mem = max(n["memory_gb"] for n in nodes.values())
    most_gpus = max(n.get("gpus", 0.0) for n in nodes.values())
    for run in runs:
        r = resources(run, table)
        check_device(run.config, r["gpus"], f"cell {run.cell}")
        if r["gpus"] > most_gpus:
            per_host = {**table, **(run.resources or {})}.get("gpus_per_host")
            raise ClusterError(f"cell {run.cell}: a run reserves {r['gpus']:g} GPUs (gpus_per_host = {per_host:g} for "
                               f"each device host), more than any node has (at most {most_gpus:g})")
        if r["cpus"] > most_cpus:
            raise ClusterError(f"cell {run.cell}: a run reserves {r['cpus']:g} CPUs, more than any node has (at most "
                               f"{most_cpus:g}); set [cluster] cpus (or cluster.cpus in its variant) lower")
        if r["memory_gb"] > most_mem:
            raise ClusterError(f"cell {run.cell}: a run reserves {r['memory_gb']:g} GiB, more than any node has (at "
                               f"most {most_mem:.1f}); set [cluster] memory_gb lower")


def warm_up(address: str, runs, table: dict, runner: str = "testbed") -> int:
    """Connect and make each node's workers ready for runs while the driver checks the runs (preflight): a task per
    run slot of every node (its CPUs over the smallest run's) that starts the worker, its testbed forkserver (which
    imports the nodes' modules, torch among them) and the project's modules, which the first run of each worker would
    otherwise do first; the runs then find those workers idle and reuse them. Returns the tasks sent (0: none, a bad
    address or Ray missing among them: `connect` says so afterwards, in its place)."""
    try:
        ray = connect(address)
        nodes = alive_nodes(ray)
    except ClusterError:
        return 0
    if not runs or not nodes:
        return 0
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cpus = min(resources(run, table)["cpus"] for run in runs)
    remote = ray.remote(prepare_worker)
    sent = 0
    for node_id, node in nodes.items():
        for _ in range(min(len(runs), max(1, int(node["cpus"] / cpus + 1e-9)))):
            remote.options(num_cpus=min(cpus, node["cpus"]), max_retries=0, name="hfl-warm-up",
                           scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True)).remote(runner)
            sent += 1
    return sent


def prepare_worker(runner: str) -> int:
    """A Ray worker made ready for runs (warm_up, run_on_node): a testbed's forkserver starting first (it imports the
    nodes' modules in its own process while this worker imports the rest; idempotent), then the config's sections
    and algorithms and the runners, as the driver has them."""
    if runner == "testbed":
        from hfl.node_spawn import prepare

        prepare()
    from hfl import families, runners  # noqa: F401
    return os.getpid()


def _tar(folder: pathlib.Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def _untar(data: bytes, into: pathlib.Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")


def run_on_node(run, runner: str, cwd: str, timeout: float) -> dict:
    """The Ray task: one whole testbed on this node, into a temporary directory; the directory comes back as tar
    bytes (an error of the run comes back as text, with its logs)."""
    import ray

    from hfl import runners

    prepare_worker(runner)
    ctx = ray.get_runtime_context()
    node = {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname()}
    if os.path.isdir(cwd):  # a shared filesystem (or this machine): relative data paths resolve as on the driver
        os.chdir(cwd)
    with tempfile.TemporaryDirectory(prefix="hfl-ray-run-") as tmp:
        local = dataclasses.replace(run, run_dir=pathlib.Path(tmp) / "run")
        error = None
        t0 = time.monotonic()
        try:
            runners.RUNNERS.get(runner).run(local, on_round=None, timeout=timeout, active=None)
        except Exception as exc:  # the run's own failure: reported, not retried
            error = f"{exc.__class__.__name__}: {exc}"
        seconds = time.monotonic() - t0
        data = _tar(local.run_dir) if local.run_dir.is_dir() else b""
    return {"node": node, "error": error, "tar": data, "seconds": seconds, "run_dir": str(local.run_dir)}


def execute(spec, todo, out: pathlib.Path, table: dict, address: str, ray, console, progress, overall,
            errors: dict, timeout: float = 24 * 3600) -> dict[str, Any]:
    """Run `todo` as Ray tasks; finished run directories unpacked under `out`. Returns the cluster provenance
    (address, run -> node, retries)."""
    remote = ray.remote(run_on_node)
    cwd = os.getcwd()
    nodes = alive_nodes(ray)
    per_node: dict[str, dict[str, int]] = {}
    node_tasks: dict[str, Any] = {}
    placed: dict[str, str] = {}
    retried: dict[str, str] = {}

    def submit(run):
        r = resources(run, table)
        return remote.options(num_cpus=r["cpus"], memory=int(r["memory_gb"] * 2 ** 30), num_gpus=r["gpus"],
                              max_retries=0,
                              name=f"hfl-{spec.name}-{run.cell}-seed-{run.seed}").remote(run, spec.runner, cwd, timeout)

    def show(name: str, key: str) -> None:
        counts = per_node.setdefault(name, {"done": 0, "failed": 0})
        counts[key] += 1
        text = f"node {name}: {counts['done']} done" + (f", {counts['failed']} failed" if counts["failed"] else "")
        if name not in node_tasks:
            node_tasks[name] = progress.add_task(text, total=None)
        progress.update(node_tasks[name], description=text)

    pending = {submit(run): (run, 1, time.monotonic()) for run in todo}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                run, attempt, t0 = pending.pop(ref)
                label = f"{run.cell} seed {run.seed}"
                rel = run.run_dir.relative_to(out).as_posix()
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the task's own code raised outside the run
                    errors[run.run_dir] = f"{exc.__class__.__name__}: {str(exc).splitlines()[0]}"
                    progress.update(overall, advance=1)
                    progress.console.print(f"FAILED {label}: {errors[run.run_dir]}", markup=False, soft_wrap=True)
                    continue
                except ray.exceptions.RayError as exc:  # lost with its node or worker: once more, elsewhere
                    now = alive_nodes(ray)
                    gone = [n["name"] for k, n in nodes.items() if k not in now]
                    nodes.update(now)
                    where = (f"node {', '.join(gone)} gone" if gone else "its node died"
                             if isinstance(exc, ray.exceptions.NodeDiedError) else "its worker died")
                    if attempt == 1:
                        retried[rel] = f"{exc.__class__.__name__} ({where})"
                        progress.console.print(f"LOST {label} ({exc.__class__.__name__}, {where}): retrying once on "
                                               f"another node", markup=False, soft_wrap=True)
                        pending[submit(run)] = (run, 2, time.monotonic())
                    else:
                        errors[run.run_dir] = f"lost twice: {exc.__class__.__name__} ({where})"
                        progress.update(overall, advance=1)
                        progress.console.print(f"FAILED {label}: {errors[run.run_dir]}", markup=False, soft_wrap=True)
                    continue
                node = result["node"]
                if node["node_id"] not in nodes:
                    nodes.update(alive_nodes(ray))
                known = nodes.get(node["node_id"], {})
                name = known.get("name") or label(node["ip"], node["node_id"], True)
                node = {**node, "custom_resources": known.get("custom", [])}
                if result["tar"]:
                    if run.run_dir.exists():  # a partial earlier attempt: replaced by the finished one
                        shutil.rmtree(run.run_dir)
                    _untar(result["tar"], run.run_dir)
                record = {**node, "name": name, "attempt": attempt, "task_seconds": round(result["seconds"], 2),
                          **({"lost_first": retried[rel]} if rel in retried else {})}
                if run.run_dir.is_dir():
                    (run.run_dir / NODE_FILE).write_text(json.dumps(record, indent=1) + "\n")
                placed[rel] = name
                if result["error"] is not None:  # its logs came back: name them where they are now
                    errors[run.run_dir] = result["error"].replace(result["run_dir"], str(run.run_dir))
                    line = f"FAILED {label}: {errors[run.run_dir].splitlines()[0]}"
                    show(name, "failed")
                else:
                    summary = json.loads((run.run_dir / "summary.json").read_text())
                    line = f"done {label}: {spec.sweep_runner.headline(summary)}"
                    show(name, "done")
                progress.update(overall, advance=1)
                progress.console.print(f"{line} ({time.monotonic() - t0:.1f}s on {name}"
                                       + (", retried" if attempt > 1 else "") + ")", markup=False, soft_wrap=True)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    counts = {}
    for name in placed.values():
        counts[name] = counts.get(name, 0) + 1
    return {"address": address, "runs_per_node": counts, "nodes": placed, "retried": retried}


# ---- one testbed over the cluster: `hfl run CONFIG --cluster ADDRESS` ------------------------------------
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
        import sys

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

    def stop(self) -> int:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
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
    import secrets
    import sys

    from hfl.common import config as config_mod
    from hfl.common import plugins, session, topology
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
    hosts = roles[1 + cfg.topology.edges:]
    if gpus:
        check_gpu_fit(nodes, len(hosts), gpus)
    total = sum(n["cpus"] for n in nodes.values())
    cpus_per_role = cpus_per_role or role_cpus([n["cpus"] for n in nodes.values()], len(roles))
    if not cpus_per_role or cpus_per_role * len(roles) > total:
        raise ClusterError(f"--cluster: {len(roles)} role processes at {cpus_per_role:g} CPU each need more CPUs "
                           f"than the cluster has ({total:g})")
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    host_bundle = {"CPU": cpus_per_role, **({"GPU": gpus} if gpus else {})}
    group = placement_group([{"CPU": cpus_per_role}] * (len(roles) - len(hosts)) + [host_bundle] * len(hosts),
                            strategy="SPREAD")
    try:
        ray.get(group.ready(), timeout=120)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ClusterError(f"--cluster: the cluster did not place {len(roles)} processes at {cpus_per_role:g} CPU "
                           f"each{f' ({gpus:g} GPU a device host)' if gpus else ''} within 120 s (other work holds "
                           f"its CPUs?)") from None
    actor = ray.remote(Role)
    join = os.environ.get(session.JOIN_ENV) or secrets.token_hex(16)
    relay = os.environ.get("HFL_RELAY_SECRET") or secrets.token_hex(32)
    common_env = {plugins.ENV: ",".join(dict.fromkeys([*plugins.env_plugins(), *cfg.run.plugins])),
                  "HFL_LAUNCHED_AT": repr(time.time())}
    text = config_mod.to_toml(cfg)
    actors: dict[str, Any] = {}
    placed: dict[str, dict] = {}
    say = (lambda *a: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    code = 1
    try:
        def launch(i: int, name: str, args: list[str], env: dict, key: str | None = None, files=None) -> None:
            flags, cert_files = tls_files(tls.get(key or name, []), pathlib.Path(certs)) if tls else ([], {})
            actors[name] = actor.options(num_cpus=cpus_per_role, num_gpus=gpus if i > edges else 0,
                                         scheduling_strategy=PlacementGroupSchedulingStrategy(
                                             placement_group=group, placement_group_bundle_index=i)).remote()
            placed[name] = ray.get(actors[name].start.remote(name, args + flags, {**common_env, **env}, text,
                                                             {**(files or {}), **cert_files}))

        edges = cfg.topology.edges
        launch(0, "cloud", ["cloud", "{dir}/run/config.toml" if resume else "{dir}/config.toml", "--listen",
                            "0.0.0.0:0", "--run-dir", "{dir}/run", "--port-file", "{dir}/ports/cloud"]
               + (["--resume"] if resume else []), {session.JOIN_ENV: join, "HFL_RELAY_SECRET": relay},
               files=run_files)
        cloud = ray.get(actors["cloud"].address.remote("cloud"))
        edge_address = {}
        for i, (name, edge) in enumerate(roles[1:1 + edges], start=1):
            launch(i, name, ["edge", "--id", edge, "--cloud", cloud, "--port-file", "{dir}/ports/" + edge, "--listen",
                             "0.0.0.0:0", "--metrics-listen", "127.0.0.1:0"] + (["--rejoin"] if resume else []),
                   {session.JOIN_ENV: join})
        for name, edge in roles[1:1 + edges]:
            edge_address[edge] = ray.get(actors[name].address.remote(edge))
        members = [topology.edge_members(cfg, e) for e in range(edges)]
        for h, (name, edge) in enumerate(hosts, start=0):
            i = 1 + edges + h
            if cfg.topology.host_layout == "per_edge":
                e, k = list(edge_address).index(edge), int(name.rsplit("-", 1)[1])
                share = topology.host_slice(members[e], k, cfg.topology.hosts_per_edge)
                args = ["devices", "--edge", edge_address[edge], "--host-index", str(k), "--hosts",
                        str(cfg.topology.hosts_per_edge)]
            else:
                share = topology.union_slice(members, h, len(hosts))
                args = ["devices", *[a for e, addr in edge_address.items() for a in ("--edge", f"{e}={addr}")],
                        "--host-index", str(h), "--hosts", str(len(hosts))]
            token = session.host_token(join, topology.device_index(share[0]), topology.device_index(share[-1]))
            launch(i, name, args, {session.HOST_ENV: token, "HFL_RELAY_SECRET": relay},
                   key=name if cfg.topology.host_layout == "per_edge" else "devices")
        say(f"run {cfg.run.name} on {address}: " + ", ".join(f"{n} on {placed[n]['ip']}/{placed[n]['node_id'][:8]}"
                                                            for n in placed))
        done = out / "metrics.jsonl"  # a resumed run's rounds before this part: not shown again
        seen = len(done.read_text().splitlines()) if resume and done.is_file() else 0
        while True:
            rows, code = ray.get(actors["cloud"].rows.remote(seen))
            for line in rows:
                row = json.loads(line)
                say(f"round {row.get('round')}: accuracy {row.get('accuracy')}")
            seen += len(rows)
            if code is not None:
                break
            time.sleep(1.0)
        ray.get([a.wait.remote(60) for n, a in actors.items() if n != "cloud"])
    except KeyboardInterrupt:  # Ctrl-C: every role stopped, what they wrote brought back, then the way on
        code = 130
    finally:
        for name, a in actors.items():
            try:
                ray.get(a.stop.remote(), timeout=30)
                data = ray.get(a.files.remote(), timeout=120)
            except Exception:  # a role lost with its node: its files are gone with it
                continue
            with tempfile.TemporaryDirectory() as tmp:
                _untar(data, pathlib.Path(tmp))
                if name == "cloud" and (pathlib.Path(tmp) / "run").is_dir():
                    shutil.copytree(pathlib.Path(tmp) / "run", out, dirs_exist_ok=True)
                for log in (pathlib.Path(tmp) / "logs").glob("*.log"):
                    (out / "logs").mkdir(parents=True, exist_ok=True)
                    with open(out / "logs" / log.name, "ab") as f:  # a resumed run's after the first part's
                        f.write(log.read_bytes())
            ray.kill(a)
        remove_placement_group(group)
        if out.is_dir():
            (out / "placement.json").write_text(json.dumps(placed, indent=1) + "\n")
    say(f"run directory: {out}")
    if code == 130 and not (out / "summary.json").is_file():
        print(f"interrupted; continue this run with:\n  hfl run --resume {out} --cluster {address}"
              + (f" --certs {certs}" if certs else "") + (f" --gpus-per-host {gpus:g}" if gpus else ""),
              file=sys.stderr, flush=True)
    return code


def run_command(config, overrides, out, address: str, quiet: bool, certs: str | None, resume: bool,
                gpus_per_host: float | None = None) -> int:
    """`hfl run CONFIG --cluster ADDRESS`: one line on bad input, before anything starts."""
    import sys

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


# ---- a Ray cluster on this machine's loopback (tests/integration/test_cluster.py, benchmarks/bench_cluster.py) ----
LOOPBACK_HEAD = "127.0.0.1:6379"  # the namespace is private: Ray's default port cannot clash with anything


def loopback_unavailable() -> str | None:
    """Why no loopback-only network namespace can be made here (None: it can)."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or shutil.which("nsenter") is None or shutil.which("ip") is None:
        return "needs unshare, nsenter and ip (util-linux, iproute2) for a loopback-only network namespace"
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        return "`unshare -n` is not allowed here (needs CAP_SYS_ADMIN): no loopback-only namespace for Ray"
    return None


def namespace_pids(holder: int) -> list[int]:
    """Every process in the holder's network namespace but the holder: the processes started there."""
    ns = os.readlink(f"/proc/{holder}/ns/net")
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != holder:
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == ns:
                    found.append(int(entry))
            except OSError:
                pass  # gone, or not ours to read
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pids(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what still runs after `grace`; back once every one has exited (or after `grace` more)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                if alive(pid):
                    os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)


@contextlib.contextmanager
def loopback_namespace():
    """A network namespace with only `lo` (up), held by a `sleep` in it; yields the holder's PID. On leaving, every
    process in it is stopped by its PID (never `ray stop`, which stops every Ray process of the machine by name),
    then the holder; RuntimeError if one is left."""
    import subprocess

    holder = subprocess.Popen(["unshare", "-n", "sleep", "86400"], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline:
                raise RuntimeError("unshare did not enter its namespace")
            time.sleep(0.05)
        subprocess.run(["nsenter", "-t", str(holder.pid), "-n", "ip", "link", "set", "lo", "up"], check=True)
        yield holder.pid
    finally:
        left = []
        if holder.poll() is None:
            for _ in range(3):  # a raylet may start a worker while the others stop: again until none is left
                stop_pids(namespace_pids(holder.pid))
            left = [p for p in namespace_pids(holder.pid) if alive(p)]
            holder.kill()
        holder.wait()
        if left:
            raise RuntimeError(f"processes left in the namespace: {left}")


def ray_start(holder: int, *args: str, cpus: int = 1) -> None:
    """`ray start` in the holder's namespace at 127.0.0.1."""
    import shutil
    import subprocess

    done = subprocess.run(["nsenter", "-t", str(holder), "-n", shutil.which("ray") or "ray", "start",
                           "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--disable-usage-stats", *args],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")


@contextlib.contextmanager
def two_node_cluster(cpus: int = 1):
    """A head and a second node (`ray start --address`), each with its own temp dir and custom resource (hfl_node_a,
    hfl_node_b) and `cpus` CPUs, at LOOPBACK_HEAD in a loopback-only namespace; yields {"ns", "dirs"}."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="hfl-ray-", dir="/tmp"))  # Ray's socket paths: 107 bytes at most
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        ns = stack.enter_context(loopback_namespace())
        dirs = {"a": base / "a", "b": base / "b"}
        ray_start(ns, "--head", "--port", LOOPBACK_HEAD.rsplit(":", 1)[1], "--include-dashboard", "false",
                  "--resources", '{"hfl_node_a": 1}', "--temp-dir", str(dirs["a"]), cpus=cpus)
        ray_start(ns, "--address", LOOPBACK_HEAD, "--resources", '{"hfl_node_b": 1}', "--temp-dir", str(dirs["b"]),
                  cpus=cpus)
        yield {"ns": ns, "dirs": dirs}
