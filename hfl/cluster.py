"""Sweeps on a Ray cluster (`hfl sweep SPEC --cluster ADDRESS`) and what `hfl run CONFIG --cluster ADDRESS` shares with
them: with hfl/cluster_spread.py, the only modules that import Ray (the `cluster` extra: pip install -e
".[cluster]"); everything else, a local `hfl run` and a local sweep included, runs without it.

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

`hfl run CONFIG --cluster ADDRESS` spreads one testbed instead (hfl/cluster_spread.py, on this module's
connection and resources); hfl/cluster_loopback.py starts a two-node cluster on this machine for the tests.

GPUs: a run reserves `gpus_per_host` ([cluster], a run's cluster.gpus_per_host, `hfl run --gpus-per-host`) for each
of its device hosts (Ray's num_gpus); train.device (common/models.torch_device) is where the hosts train.
"""
from __future__ import annotations

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


def node_call(address: str, runs, table: dict):
    """call(fn, *args) for the sweep's preflight: fn runs as a Ray task on a node, in a fork of that node's testbed
    forkserver, so that the driver never imports torch; fn's own exception is raised here. The task asks what a
    warm_up task holds, so it waits for one to end and reuses its worker (whose forkserver is up) instead of
    starting a worker, and a forkserver, of its own."""
    ray = connect(address)
    cpus = min(min(resources(run, table)["cpus"] for run in runs), min(n["cpus"] for n in alive_nodes(ray).values()))
    remote = ray.remote(_call_on_node).options(num_cpus=cpus, max_retries=2, name="hfl-preflight")  # lost: again

    def call(fn, *args):
        ok, value = ray.get(remote.remote(fn, *args))
        if not ok:
            raise value
        return value
    return call


def _call_on_node(fn, *args) -> tuple[bool, Any]:
    from hfl.node_spawn import call_forked, prepare

    prepare()
    try:
        return True, call_forked(fn, *args)
    except Exception as exc:  # fn's error, raised again on the driver (preflight words it)
        return False, exc


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
