"""Start a whole testbed (cloud, edges, device hosts) as real processes on 127.0.0.1 with free ports.

    from hfl.testbed import Testbed
    with Testbed(overrides=["run.rounds=3"]) as tb:
        summary = tb.wait(timeout=300)
        print(tb.metrics()[-1]["accuracy"], tb.run_dir)

This is the engine behind `hfl run` and the `hfl_testbed` pytest fixture. Every child is tied to
this process (it gets SIGTERM if we die) and `close()` kills whatever is left, also on errors.

Device hosts follow `topology.host_layout`: per_core (default) starts `topology.device_hosts` hosts (0 =
one per core) named devices-cH, each emulating a contiguous share of all devices of all edges; per_edge
starts `hosts_per_edge` hosts per edge named devices-EEE-H. `skip_hosts` names per-edge hosts (a test
plays their devices), so a Testbed given skip_hosts uses the per_edge layout. Under mutual TLS (`certs`)
every device of a per-core host presents its own certificate on its own channel, and a per-edge host one
certificate naming its devices (hfl/testbed_certs.py). Edges run one per process (edge-NNN), or
`topology.edge_processes` processes named edge-cG serve them in contiguous groups, each edge on its own
port with its own certificate (fewer processes: less memory at scale). `via` names nodes (an
edge, a per-edge host) that dial another address than their upstream's: a test's proxy in front of it
(tests/integration/mitm.py plays a compromised node that way).
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import re
import resource
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from hfl import families  # noqa: F401  (the configs a testbed builds name their sections and algorithms)
from hfl.common import config as config_mod
from hfl.common import metrics, plugins, session
from hfl.common import topology
from hfl.common.topology import edge_id
from hfl.node_spawn import caller, node_env, prepare, spawner

PR_SET_PDEATHSIG = 1


def _check_resume_overrides(overrides) -> None:
    """A resume continues the run as it was configured; the one change it takes is more rounds."""
    for item in overrides or ():
        key = str(item).partition("=")[0].strip()
        if key != "run.rounds":
            raise config_mod.ConfigError(f"--resume continues the run as it was configured: --set {item} is refused "
                                         f"(the one change a resume takes is more rounds: --set run.rounds=N)")


def die_with_parent() -> None:
    """Run first in a launched node (`HFL_PARENT_PID` set): die with the launcher (PR_SET_PDEATHSIG), and lift the
    descriptor soft limit to the hard one (one descriptor per emulated device connection, on both ends).

    This runs in the child itself, not as a Popen preexec_fn: a preexec_fn makes Python fork() instead of vfork(),
    and gRPC's fork handlers then restart its poller in the child while close_fds closes the poller's epoll
    descriptor, which aborts the child before exec ("epoll_wait error: Bad file descriptor", grpc/grpc#43055).
    A forked node's parent is the forkserver (hfl/node_spawn.py), which exits with the launcher: the signal is armed
    against it, and HFL_PARENT_PID names it."""
    parent = os.environ.get("HFL_PARENT_PID")
    if not parent:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    if str(os.getppid()) != parent:  # the launcher died before the signal was armed
        os._exit(143)
    watch_parent(int(parent))
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


def watch_parent(parent: int, every: float = 1.0) -> None:
    """A fallback for PR_SET_PDEATHSIG, which a node under load was once seen to miss (it outlived `kill -9` of the
    launcher with ppid 1 and its SIGTERM handler installed): a daemon thread that sends this process SIGTERM once
    its parent is no longer `parent`."""
    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=loop, name="parent-watch", daemon=True).start()


class TestbedError(RuntimeError):
    __test__ = False  # not a pytest test class


class RunFinished(TestbedError):
    """--resume of a run that already ended: nothing to do, nothing changed."""


_ERROR_LINE = re.compile(r"^([\w.]*(Error|Exception|Interrupt)\b|[\w.-]+: error:)")


def error_line(path: pathlib.Path) -> str:
    """The line of a node's log that says why it stopped: the last ERROR / CRITICAL record or exception line,
    else the last line."""
    if not path.exists():
        return "(no log)"
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if " ERROR " in ln or " CRITICAL " in ln or _ERROR_LINE.match(ln):
            return ln
    return lines[-1] if lines else "(empty log)"


def core_host_name(index: int) -> str:
    """Name (and log file) of a per-core device host."""
    return f"devices-c{index}"


def edge_group_name(index: int) -> str:
    """Name (and log file) of a process serving several edges (topology.edge_processes); "edge-" like an edge's:
    the run's relay secret is withheld from it."""
    return f"edge-c{index}"


@dataclass
class Node:
    name: str
    argv: list[str]
    log_path: pathlib.Path
    proc: subprocess.Popen | None = None  # or a ForkedNode (hfl/node_spawn.py): the same methods
    expected_exit: bool = False  # killed on purpose: its death is not a failure
    address: str | None = None
    started_at: float = 0.0
    deaths: list = field(default_factory=list)

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def _signal_group(node: Node, sig: int) -> None:
    """Signal a node's session (a node may have started processes of its own). A forked node that has not run its
    setsid() yet leads no group: then the node itself."""
    try:
        os.killpg(node.proc.pid, sig)
    except ProcessLookupError:
        try:
            os.kill(node.proc.pid, sig)
        except ProcessLookupError:
            pass


def _log_tail(path: pathlib.Path, lines: int = 25) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Testbed:
    __test__ = False  # a fixture, not a pytest test class (no collection warning when imported into a test module)
    config: config_mod.Config | str | os.PathLike | None = None
    overrides: Sequence[str] = ()
    run_dir: str | os.PathLike | None = None
    skip_hosts: Sequence[str] = ()          # per-edge device hosts not to start, e.g. "devices-001-2" (a test plays them)
    start_timeout: float = 180.0
    env: dict | None = None
    extra_args: dict = field(default_factory=dict)  # node name or role -> extra CLI args (e.g. TLS flags)
    certs: str | os.PathLike | None = None  # mutual TLS: CA directory (created if missing), one certificate per node
    resume: bool = False                    # continue the run in run_dir from its checkpoint (config from run_dir)
    force: bool = False                     # start over in a run_dir that holds a run (its records are deleted)
    tolerate_failures: bool = False         # a dead edge or device host is recorded, not fatal (the cloud's death is)
    via: dict = field(default_factory=dict)  # node name -> address it dials instead of its upstream (a test's proxy)
    spawn: str | None = None                # how nodes start (hfl/node_spawn.py): exec | fork; None: $HFL_SPAWN or fork
    plots: bool = True                      # the cloud draws accuracy.png, data.png and its mode's plots at the end
    nodes: dict[str, Node] = field(default_factory=dict, init=False)
    edge_address: dict[str, str] = field(default_factory=dict, init=False)  # edge id -> address, once listening
    host_ranges: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)  # device host -> its devices

    def __post_init__(self) -> None:
        prepare(self.spawn)  # the forkserver imports the nodes' modules while the config loads and preflight runs
        self.rounds_extended: tuple[int, int] | None = None  # a resume asked for more rounds: (before, after)
        if self.resume:
            if self.run_dir is None:
                raise config_mod.ConfigError("resume needs the run directory")
            saved = pathlib.Path(self.run_dir) / "config.toml"
            if self.config is not None and not (isinstance(self.config, (str, os.PathLike))
                                                and pathlib.Path(self.config).resolve() == saved.resolve()):
                raise config_mod.ConfigError(f"--resume continues the run with its own config ({saved}): give no "
                                             f"config file")
            self.config = saved
            _check_resume_overrides(self.overrides)
        if isinstance(self.config, config_mod.Config):
            cfg = self.config
            if self.overrides:
                cfg = config_mod.from_dict(config_mod.merge_overrides(config_mod.to_dict(cfg), list(self.overrides)))
        else:
            cfg = config_mod.load(self.config, list(self.overrides))
        if self.skip_hosts and cfg.topology.host_layout != "per_edge":  # skip_hosts names per-edge hosts
            cfg = config_mod.from_dict(config_mod.merge_overrides(config_mod.to_dict(cfg), ["topology.host_layout=per_edge"]))
        self.cfg = cfg
        if self.run_dir is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.run_dir = pathlib.Path("runs") / f"{cfg.run.name}-{stamp}"
        self.run_dir = pathlib.Path(self.run_dir).resolve()
        from hfl.common.rundir import check_writable

        check_writable(self.run_dir)  # before the preflight's seconds of work
        self.logs = self.run_dir / "logs"
        self._callers_args = set(self.extra_args)  # a process of several edges cannot take one edge's own arguments
        if self.certs is not None:
            from hfl.testbed_certs import testbed_tls_args

            self.extra_args = {**testbed_tls_args(self.certs, cfg), **self.extra_args}
        self.ports = self.run_dir / "ports"
        self.launched = time.monotonic()
        self._rows_at_start = 0
        self._rounds_running = False
        self._created = time.monotonic()  # whole wall time: config checks and start-up included
        self.data_info: dict = {}
        self.stopped_orphans: list[str] = []  # device hosts stopped after the end: their edge was gone

    # ---- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "Testbed":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self, name: str, args: list[str]) -> Node:
        extra = self.extra_args.get(name, self.extra_args.get(name.split("-")[0], []))  # per node, else per role
        argv = [sys.executable, "-m", "hfl.cli", *args, *extra]
        node = Node(name, argv, self.logs / f"{name}.log")
        self._launch(node)
        self.nodes[name] = node
        return node

    def _launch(self, node: Node, restarted: bool = False) -> None:
        from hfl.common.plugins import child_pythonpath

        env = dict(os.environ, PYTHONUNBUFFERED="1", HFL_PARENT_PID=str(os.getpid()), **(self.env or {}))
        env["PYTHONPATH"] = child_pythonpath(env)  # what the launcher imported (plugins), its children can import
        # relayed uploads' device tags (common/relay_tag.py): a per-run secret for the cloud and the device hosts,
        # never for an edge (the party it guards against), never in config.toml or a log
        if not getattr(self, "_relay_secret", None):
            self._relay_secret = os.environ.get("HFL_RELAY_SECRET") or secrets.token_hex(32)
        env[session.JOIN_ENV] = self._run_join_secret()
        # a node imports only the plugins of its own configuration: the launcher's children get the run's
        env[plugins.ENV] = ",".join(dict.fromkeys([*plugins.env_plugins(), *self.cfg.run.plugins]))
        if node.name in self.host_ranges:  # a device host registers its own devices only (common/session.py)
            env.pop(session.JOIN_ENV, None)
            env.pop(session.JOIN_ENV + "_FILE", None)
            env[session.HOST_ENV] = self.host_token(node.name)
        if node.name.startswith("edge-"):
            env.pop("HFL_RELAY_SECRET", None)
        else:
            env["HFL_RELAY_SECRET"] = self._relay_secret
        if restarted:  # a restarted cloud's start-up runs from its own launch
            env.pop("HFL_LAUNCHED_AT", None)
        node.proc = spawner(self.spawn)(node.argv, node.log_path, node_env(env))
        node.started_at = time.monotonic()

    def _wait_port(self, node: Node, deadline: float, server: str | None = None) -> str:
        """The address `node` listens on (or, for a process of several edges, its edge `server`), once written."""
        port_file = self.ports / (server or node.name)
        while time.monotonic() < deadline:
            if port_file.exists():
                address = f"127.0.0.1:{port_file.read_text().strip()}"
                if server in (None, node.name):
                    node.address = address
                return address
            if node.returncode() is not None:
                raise TestbedError(f"{node.name} exited with {node.returncode()} before listening: "
                                   f"{error_line(node.log_path)}\n{_log_tail(node.log_path)}")
            time.sleep(0.05)
        raise TestbedError(f"{node.name} did not listen within {self.start_timeout}s:\n{_log_tail(node.log_path)}")

    def start(self) -> "Testbed":
        from hfl.common.rundir import check_run_dir
        from hfl.preflight import preflight

        if self.resume and (self.run_dir / "summary.json").is_file():
            raise RunFinished(self._finished_message())
        # data, partition and model: a ConfigError before any process starts (the model's check in a fork of the
        # forkserver, where torch is imported already)
        self.data_info = preflight(self.cfg, caller(self.spawn))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        check_run_dir(self.run_dir, self.resume, self.force)
        self._rows_at_start = len(self.metrics())
        self.logs.mkdir(exist_ok=True)
        self.ports.mkdir(exist_ok=True)
        for stale in self.ports.glob("*"):
            stale.unlink()
        config_path = self.run_dir / "config.toml"
        if self.resume and self.overrides:
            before = config_mod.load(config_path).run.rounds
            done = len(self.metrics())
            if self.cfg.run.rounds < max(before, done):
                raise config_mod.ConfigError(f"--resume --set run.rounds={self.cfg.run.rounds}: the run has "
                                             f"{before} rounds ({done} done); a resume can only add rounds")
            self.rounds_extended = (before, self.cfg.run.rounds)
        if not self.resume or self.rounds_extended:
            config_path.write_text(config_mod.to_toml(self.cfg))
        deadline = time.monotonic() + self.start_timeout
        self.launched = time.monotonic()
        self.env = {**(self.env or {}), "HFL_LAUNCHED_AT": repr(time.time())}  # start-up time in summary.json
        try:
            cloud = self._spawn("cloud", ["cloud", str(config_path), "--listen", "127.0.0.1:0", "--run-dir", str(self.run_dir),
                                          "--port-file", str(self.ports / "cloud")]
                                + (["--resume"] if self.resume else []) + ([] if self.plots else ["--no-plots"]))
            cloud_address = self._wait_port(cloud, deadline)
            groups = topology.edge_groups(self.cfg)
            edges = []  # (edge id, its process's node)
            for g, members in enumerate(groups):
                if len(members) == 1:
                    name = members[0]
                    args = ["--id", name, "--cloud", self.via.get(name, cloud_address), "--port-file", str(self.ports / name)]
                else:  # several edges in one process (topology.edge_processes): each writes its own port file
                    if any(e in self.via or e in self._callers_args for e in members):
                        raise TestbedError(f"edges {', '.join(members)} share a process: no proxy (via) in front of "
                                           f"one, no arguments (extra_args) for one alone")
                    name = edge_group_name(g)
                    args = [a for e in members for a in ("--id", e)] + ["--cloud", cloud_address,
                                                                        "--port-file", str(self.ports / "{id}")]
                node = self._spawn(name, ["edge", *args, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
                                   + (["--rejoin"] if self.resume else []))
                edges.extend((e, node) for e in members)
            self.edge_address = {e: self._wait_port(node, deadline, e) for e, node in edges}
            if self.cfg.topology.host_layout == "per_edge":
                for e, (edge, _) in enumerate(edges):
                    address = self.edge_address[edge]
                    for h in range(self.cfg.topology.hosts_per_edge):
                        name = f"devices-{e:03d}-{h}"
                        share = topology.host_slice(topology.edge_members(self.cfg, e), h, self.cfg.topology.hosts_per_edge)
                        self._host_range(name, share)
                        if name not in self.skip_hosts:
                            self._spawn(name, ["devices", "--edge", self.via.get(name, address), "--host-index", str(h),
                                               "--hosts", str(self.cfg.topology.hosts_per_edge)])
            else:
                # each address named by its edge: a host with a certificate per device dials only its share's edges
                addresses = [f"{name}={address}" for name, address in self.edge_address.items()]
                hosts = topology.host_count(self.cfg)
                members = [topology.edge_members(self.cfg, e) for e in range(self.cfg.topology.edges)]
                for h in range(hosts):
                    self._host_range(core_host_name(h), topology.union_slice(members, h, hosts))
                    self._spawn(core_host_name(h), ["devices", *[a for address in addresses for a in ("--edge", address)],
                                                    "--host-index", str(h), "--hosts", str(hosts)])
        except BaseException:
            self.close()
            raise
        return self

    def _host_range(self, name: str, share: list[str]) -> None:
        if share:
            self.host_ranges[name] = (topology.device_index(share[0]), topology.device_index(share[-1]))

    def host_token(self, name: str) -> str:
        """The credential the testbed hands device host `name` (a test that plays a host presents it)."""
        return session.host_token(self._run_join_secret(), *self.host_ranges[name])

    def _run_join_secret(self) -> str:
        """The run's join secret (a Register without it is refused, common/session.py): one for the testbed's life."""
        if not getattr(self, "_join_secret", None):
            self._join_secret = os.environ.get(session.JOIN_ENV) or secrets.token_hex(16)
        return self._join_secret

    def device_hosts(self) -> list[str]:
        """Names of the device host processes started (or skipped) by this testbed."""
        return [n for n in self.nodes if n.startswith("devices-")]

    @property
    def cloud_address(self) -> str:
        return self.nodes["cloud"].address

    @property
    def edge_addresses(self) -> list[str]:
        return [self.edge_address[edge_id(e)] for e in range(self.cfg.topology.edges)]

    def live_url(self, timeout: float = 60.0) -> str:
        """The cloud's live page (observe.listen), once it serves it."""
        return self._wait_file(self.run_dir / "live_url", timeout)

    def edge_metrics_url(self, name: str, timeout: float = 60.0) -> str:
        """An edge's Prometheus /metrics (every testbed edge serves one on a free port)."""
        scheme = "https" if self.certs is not None else "http"  # under mutual TLS, with the edge's certificate
        return f"{scheme}://127.0.0.1:{self._wait_file(self.ports / f'{name}.metrics', timeout)}/metrics"

    def _wait_file(self, path: pathlib.Path, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not (path.exists() and path.read_text().strip()):
            self.check()
            if time.monotonic() > deadline:
                raise TestbedError(f"{path} was not written within {timeout}s")
            time.sleep(0.05)
        return path.read_text().strip()

    def failures(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.returncode() not in (None, 0) and not n.expected_exit]

    def deaths(self) -> list[dict]:
        """Every node that died unexpectedly (now or before a restart): node, seconds after launch, exit status, log tail."""
        out = []
        for node in self.nodes.values():
            out.extend(node.deaths)
            if node.returncode() not in (None, 0) and not node.expected_exit:
                out.append(self._death(node))
        return out

    def _death(self, node: Node) -> dict:
        return {"node": node.name, "seconds_after_launch": round(time.monotonic() - self.launched, 1),
                "exit_status": node.returncode(), "log_tail": _log_tail(node.log_path, 12)}

    def node(self, name: str) -> Node:
        """The node called `name`; an unknown name is a TestbedError listing the valid ones."""
        try:
            return self.nodes[name]
        except KeyError:
            raise TestbedError(f"no node {name!r} in this testbed; nodes: {', '.join(self.nodes) or 'none started'}") from None

    def restart(self, name: str, resume: bool = False) -> Node:
        """Start a node again with the same arguments (a server on the same address, so that its
        clients can reconnect); `resume` restarts the cloud on its checkpoint."""
        node = self.node(name)
        if node.returncode() is None:
            raise TestbedError(f"{name} is still running")
        if node.argv.count("--id") > 1:
            raise TestbedError(f"{name} serves several edges, each on a port the restart would not keep: restart "
                               f"edges of a testbed with topology.edge_processes = 0")
        if not node.expected_exit:
            node.deaths.append(self._death(node))
        argv = list(node.argv)
        if node.address and "--listen" in argv:
            argv[argv.index("--listen") + 1] = node.address
        if resume and "--resume" not in argv:
            argv.append("--resume")
        node.argv, node.expected_exit = argv, False
        (self.ports / name).unlink(missing_ok=True)
        self._launch(node, restarted=True)
        return node

    def running(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.returncode() is None]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one node on purpose (SIGKILL by default: a crash); its death is not counted as a failure."""
        node = self.node(name)
        node.expected_exit = True
        if node.returncode() is None:
            _signal_group(node, sig)
            node.proc.wait(timeout=30)

    def close(self, grace: float = 5.0, nodes: list[Node] | None = None) -> None:
        """Terminate every process still running, or those of `nodes` (SIGTERM, then SIGKILL after `grace`)."""
        alive = [n for n in (self.running() if nodes is None else nodes) if n.returncode() is None]
        for node in alive:
            _signal_group(node, signal.SIGTERM)
            _signal_group(node, signal.SIGCONT)  # a stopped (SIGSTOP) node handles its SIGTERM only once continued
        deadline = time.monotonic() + grace
        for node in alive:
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(node, signal.SIGKILL)
                node.proc.wait()

    # ---- results ------------------------------------------------------------------------------
    def metrics(self) -> list[dict]:
        return metrics.read_jsonl(self.run_dir / "metrics.jsonl")

    def finished(self) -> bool:
        return self.nodes["cloud"].returncode() == 0

    def iter_metrics(self, timeout: float = 600.0, poll: float = 0.2, on_poll=None) -> Iterator[dict]:
        """Yield each round's metrics as the cloud writes them, until the run ends (`on_poll()` is called at every
        poll, e.g. to report node deaths at once)."""
        seen = 0
        deadline = time.monotonic() + timeout
        while True:
            rows = self.metrics()
            yield from rows[seen:]
            seen = len(rows)
            self.check()
            if on_poll is not None:
                on_poll()
            if self.nodes["cloud"].returncode() == 0:
                yield from self.metrics()[seen:]
                return
            if time.monotonic() > deadline:
                raise TestbedError(f"run did not finish within {timeout}s")
            time.sleep(poll)

    def rounds_running(self) -> bool:
        """Whether the run wrote a round since this testbed started it (start-up is over)."""
        if not self._rounds_running:
            self._rounds_running = len(self.metrics()) > self._rows_at_start
        return self._rounds_running

    def check(self) -> None:
        """Raise TestbedError (after stopping everything) if any process failed. When failures are tolerated, the
        deaths of edges and device hosts after the first round are faults the run goes on without; the cloud's
        death, and any death during start-up (a node that cannot start would leave the cloud waiting out its join
        timeout), still stop everything at once."""
        failed = self.failures()
        if self.tolerate_failures and failed and self.rounds_running():
            failed = [n for n in failed if n.name == "cloud"]
        if failed:
            first = failed[0]
            when = "" if self._rounds_running else " during start-up"
            detail = "\n".join(f"--- {n.name} exited {n.returncode()}:\n{_log_tail(n.log_path)}" for n in failed)
            self.close()
            raise TestbedError(f"{first.name} exited with {first.returncode()}{when}: {error_line(first.log_path)} "
                               f"(log {first.log_path}); stopped the other processes\n{detail}")

    def wait(self, timeout: float = 600.0) -> dict:
        """Wait until the cloud finished and every other process exited; return summary.json."""
        for _ in self.iter_metrics(timeout):
            pass
        deadline = time.monotonic() + 30
        orphaned_since = None
        while self.running() and time.monotonic() < deadline:
            self.check()
            if len(self._orphaned_hosts()) == len(self.running()):
                orphaned_since = orphaned_since or time.monotonic()
                if time.monotonic() - orphaned_since > 3:
                    break
            time.sleep(0.1)
        self.check()
        self._stop_orphans()
        lingering = [n.name for n in self.running()]
        if lingering:
            self.close()
            raise TestbedError(f"processes still running 30s after the cloud finished: {lingering}")
        return self._complete_summary()

    def _orphaned_hosts(self) -> list[Node]:
        """Device hosts still running once the cloud and every edge process have exited, where an edge process ended
        killed or crashed: their devices of that edge cannot learn that the run ended (only their edge tells them)
        and would retry it for ever."""
        nodes = list(self.nodes.values())
        if any(n.returncode() is None for n in nodes if not n.name.startswith("devices")):
            return []
        if not any(n.name.startswith("edge") and n.returncode() != 0 for n in nodes):
            return []
        return [n for n in nodes if n.name.startswith("devices") and n.returncode() is None]

    def _stop_orphans(self) -> None:
        """Stop the orphaned device hosts (`close`): an end of the run, not a failure; the summary names them
        (`stopped_device_hosts`)."""
        orphans = self._orphaned_hosts()
        for node in orphans:
            node.expected_exit = True
        self.close(nodes=orphans)
        self.stopped_orphans += [n.name for n in orphans]

    def summary(self) -> dict:
        import json

        return json.loads((self.run_dir / "summary.json").read_text())

    def _finished_message(self) -> str:
        try:
            s = self.summary()
            acc = "-" if s.get("final_accuracy") is None else f"{100 * s['final_accuracy']:.2f}%"
            how = f"stopped: {s['stop_reason']}" if s.get("stop_reason") else f"final accuracy {acc}"
            return (f"{self.run_dir} is a finished run ({s.get('rounds')} of {self.cfg.run.rounds} rounds, {how}): "
                    "nothing to resume, nothing changed. Start it over with --force, or run more rounds in a new "
                    "directory.")
        except (OSError, ValueError):
            return f"{self.run_dir} holds a summary.json: the run finished, nothing to resume"

    def _complete_summary(self) -> dict:
        """summary.json as the cloud wrote it, plus what only the launcher knows: the whole wall time (config
        checks and start-up included) and whether the run learned at all."""
        from hfl.verdict import not_learning

        summary = self.summary()
        summary["total_seconds"] = round(time.monotonic() - self._created, 2)
        verdict = not_learning(self.metrics(), self.data_info.get("num_classes"))
        summary["not_learning"] = verdict
        if self.stopped_orphans:
            summary["stopped_device_hosts"] = sorted(set(self.stopped_orphans))
        metrics.write_json(self.run_dir / "summary.json", summary)
        return summary
