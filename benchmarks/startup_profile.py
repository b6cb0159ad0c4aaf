"""Where `hfl run`'s start-up goes: one run of the launcher in this process (no torch imported before it), with a
timestamp and the CPU time at each phase, from this interpreter's start to the publication of round 0.

    PYTHONPATH=$PWD nice python benchmarks/startup_profile.py [--data default|synthetic] [--json FILE] [--set k=v ...]

Phases of the launcher (this process): interpreter start, `hfl.cli` and `hfl.launcher` imports, the config, the
forkserver's start, preflight (dataset load, partition, the model's module and torch import, one forward pass), the
spawn of each node. Phases of the nodes, from their logs and psutil: the forkserver's preload (its end is the first
fork), the cloud listening, its preparation (test set, model, partition), each edge listening and joined, each
device host up, its devices ready, every edge's devices joined, and round 0 published (HFL_LAUNCHED_AT +
`startup_seconds`). CPU: this process (time.process_time), the forkserver and every node (psutil, sampled every
0.1 s; the figure is the last sample before round 0). `--data` picks the default data (mnist-embedded) or the
synthetic set of bench_round.py's workload a; the run's rounds are shrunk (train.tau = gamma = 1, one round) so
that it ends soon after round 0, which changes nothing before it.
"""
from __future__ import annotations

import time

T_IMPORT = time.time()  # before anything of ours is imported
CPU_IMPORT = time.process_time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

import psutil  # noqa: E402

DATA = {
    "default": [],
    "synthetic": ["data.dataset=synthetic", "data.synthetic_samples=75000", "data.max_test_samples=1000"],
}
TOPOLOGY = ["topology.edges=10", "topology.devices_per_edge=10"]
SHORT_ROUNDS = ["run.rounds=1", "train.tau=1", "train.gamma=1"]


class Marks:
    """Named instants of this process: wall time and CPU time."""

    def __init__(self):
        self.rows: list[tuple[str, float, float]] = []

    def __call__(self, name: str) -> None:
        self.rows.append((name, time.time(), time.process_time()))

    def wrap(self, owner, attr: str, name: str, before: bool = False):
        """Replace owner.attr by a function that marks `name` when it returns (and `name: start` before)."""
        fn = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            if before:
                self(f"{name}: start")
            out = fn(*args, **kwargs)
            self(name)
            return out

        setattr(owner, attr, wrapped)


class CpuSampler(threading.Thread):
    """CPU seconds (user + system) of the forkserver and of every node, sampled every `interval` seconds."""

    def __init__(self, interval: float = 0.1):
        super().__init__(daemon=True)
        self.interval = interval
        self.pids: dict[str, int] = {}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            now, cpu = time.time(), {}
            for name, pid in list(self.pids.items()):
                try:
                    proc = self._procs.setdefault(pid, psutil.Process(pid))
                    t = proc.cpu_times()
                    cpu[name] = t.user + t.system
                except psutil.Error:
                    pass
            self.samples.append((now, cpu))
            self.stop.wait(self.interval)

    def at(self, when: float) -> dict[str, float]:
        """Each process's CPU seconds in the last sample taken before `when`."""
        out: dict[str, float] = {}
        for t, cpu in self.samples:
            if t > when:
                break
            out.update(cpu)
        return out


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
NODE_EVENTS = {  # (log, regex of the line) -> event
    "cloud": [("cloud listening", r"cloud listening on"), ("cloud prepared (test set, model, partition)", r" model \S+: \d+ parameters")],
    "edge": [("edge listening", r" listening on "), ("edge joined the cloud", r" joined run "),
             ("edge: its devices joined", r" devices joined")],
    "devices": [("device host: config (first log line)", r"transport:"), ("device host: every edge answered", r" host \d+/\d+ of "),
                ("device host: devices ready (data, model, channels)", r" devices ready in ")],
}


def log_events(logs: pathlib.Path) -> list[tuple[str, str, float]]:
    """(event, node, epoch seconds) of the first line matching each event in each node's log."""
    out = []
    for path in sorted(logs.glob("*.log")):
        node = path.stem
        events = NODE_EVENTS.get(node.split("-")[0], [])
        seen = set()
        for line in path.read_text(errors="replace").splitlines():
            m = LOG_TIME.match(line)
            if not m:
                continue
            for event, pattern in events:
                if event not in seen and re.search(pattern, line):
                    seen.add(event)
                    stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
                    out.append((event, node, stamp))
    return out


def _boot_time() -> float:
    """The boot instant on time.time()'s clock to 10 ms (psutil.boot_time() is /proc/stat's whole seconds)."""
    with open("/proc/uptime") as f:
        return time.time() - float(f.read().split()[0])


def created(pid: int, boot: float) -> float:
    """When process `pid` started, on time.time()'s clock (to a clock tick)."""
    return psutil.Process(pid).create_time() - psutil.boot_time() + boot


def profile(data: str, extra: list[str]) -> dict:
    marks = Marks()
    boot = _boot_time()
    started = created(os.getpid(), boot)
    marks.rows.append(("python started (interpreter)", started, 0.0))
    marks.rows.append(("profiler's own imports (argparse, json, psutil)", T_IMPORT, CPU_IMPORT))
    marks("profiler ready")
    import hfl.cli as cli

    marks("import hfl.cli")
    first = getattr(cli, "FIRST", {}).get("run")  # what main() starts before it parses the command line
    if first is not None:
        first()
        marks("forkserver start requested (hfl.cli.FIRST)")
    import hfl.launcher  # what cmd_run imports first

    marks("import hfl.launcher (rich, testbed, families)")
    from hfl import node_spawn, preflight, testbed
    from hfl.common import data as data_mod
    from hfl.common import partition as partition_mod

    beds = []
    post_init = testbed.Testbed.__post_init__

    def post_init_marked(self):
        post_init(self)
        beds.append(self)
        marks("config loaded (Testbed built)")

    testbed.Testbed.__post_init__ = post_init_marked
    marks.wrap(preflight, "preflight", "preflight done (after the partition: the model's forward pass)", before=True)
    marks.wrap(data_mod, "load_dataset", "preflight: dataset loaded")
    marks.wrap(partition_mod, "partition", "preflight: partition")
    sampler = CpuSampler()
    spawn = testbed.Testbed._spawn

    def spawn_marked(self, name, args):
        if not sampler.is_alive():
            pid = node_spawn.server_pid()
            if pid:
                sampler.pids["forkserver"] = pid
            sampler.start()
        node = spawn(self, name, args)
        sampler.pids[name] = node.proc.pid
        marks(f"spawn requested: {name}")
        return node

    testbed.Testbed._spawn = spawn_marked
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        overrides = [*TOPOLOGY, *DATA[data], *SHORT_ROUNDS, *extra]
        argv = ["run", "--quiet", "--out", str(run_dir)] + [a for o in overrides for a in ("--set", o)]
        code = cli.main(argv)
        sampler.stop.set()
        if code != 0:
            raise SystemExit(f"hfl run exited {code}")
        summary = json.loads((run_dir / "summary.json").read_text())
        bed = beds[0]
        launched = float(bed.env["HFL_LAUNCHED_AT"])
        round0 = launched + summary["startup_seconds"]
        events = log_events(run_dir / "logs")
        births = {}
        for name, pid in sampler.pids.items():
            try:
                births[name] = created(pid, boot)
            except psutil.Error:
                pass
    rows = [(name, t, cpu) for name, t, cpu in marks.rows if t <= round0]
    forks = {name: t for name, t in births.items() if name != "forkserver"}
    node_cpu = sampler.at(round0)
    timeline = [{"event": name, "process": "launcher", "t": t - started, "cpu": cpu} for name, t, cpu in rows]
    if "forkserver" in births:
        timeline.append({"event": "forkserver process started", "process": "forkserver", "t": births["forkserver"] - started})
    if forks:
        first = min(forks, key=forks.get)
        timeline.append({"event": f"first fork ({first}): the forkserver's preload is done", "process": "forkserver",
                         "t": forks[first] - started})
    grouped: dict[tuple[str, str], list[float]] = {}
    for event, node, t in events:
        grouped.setdefault((event, node.split("-")[0]), []).append(t)
    for name, t in forks.items():
        grouped.setdefault(("forked", name.split("-")[0]), []).append(t)
    for (event, role), ts in grouped.items():
        label = event if len(ts) == 1 else f"{event} (first .. last of {len(ts)})"
        timeline.append({"event": label, "process": role, "t": min(ts) - started,
                         **({"t_last": max(ts) - started} if len(ts) > 1 else {})})
    timeline.append({"event": "round 0 published (HFL_LAUNCHED_AT + startup_seconds)", "process": "cloud",
                     "t": round0 - started})
    timeline.sort(key=lambda r: r["t"])
    launcher_cpu = max((cpu for _, t, cpu in marks.rows if t <= round0), default=0.0)
    by_role: dict[str, float] = {}
    for name, cpu in node_cpu.items():
        by_role[name.split("-")[0]] = by_role.get(name.split("-")[0], 0.0) + cpu
    return {
        "data": data, "overrides": overrides, "load_average": os.getloadavg(),
        "startup_seconds": summary["startup_seconds"],  # the cloud's: HFL_LAUNCHED_AT (after preflight) to round 0
        "command_to_round0_seconds": round0 - started,  # from this interpreter's start
        "launched_after_seconds": launched - started,
        "final_accuracy": summary["final_accuracy"],
        "cpu_to_round0": {"launcher": launcher_cpu, **{k: round(v, 3) for k, v in sorted(by_role.items())}},
        "cpu_to_round0_total": launcher_cpu + sum(by_role.values()),
        "timeline": timeline,
    }


def render(out: dict) -> str:
    lines = [f"data {out['data']}: command to round 0 {out['command_to_round0_seconds']:.2f} s wall; startup_seconds "
             f"{out['startup_seconds']:.2f} (from the nodes' launch at {out['launched_after_seconds']:.2f} s); load "
             f"average {out['load_average'][0]:.1f}",
             "CPU seconds to round 0: " + ", ".join(f"{k} {v:.2f}" for k, v in out["cpu_to_round0"].items())
             + f"; total {out['cpu_to_round0_total']:.2f}",
             f"{'t (s)':>7} {'':>7}  {'launcher CPU':>12}  {'process':<10} event"]
    for r in out["timeline"]:
        last = f"..{r['t_last']:.2f}" if "t_last" in r else ""
        cpu = f"{r['cpu']:.2f}" if "cpu" in r else ""
        lines.append(f"{r['t']:7.2f} {last:>7}  {cpu:>12}  {r['process']:<10} {r['event']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=sorted(DATA), default="default")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    out = profile(args.data, args.overrides)
    print(render(out), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
