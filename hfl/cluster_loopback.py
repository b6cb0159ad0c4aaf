"""A Ray cluster on this machine's loopback, for tests/integration/test_cluster.py and benchmarks/bench_cluster.py:
a head and a second node (`ray start`, never Ray's Python API: this module does not import Ray) in a network namespace
of their own with only `lo`, so that every address Ray hands out is 127.0.0.1, and every process in it stopped by its
PID on the way out (never `ray stop`, which stops every Ray process of the machine by name)."""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

LOOPBACK_HEAD = "127.0.0.1:6379"  # the namespace is private: Ray's default port cannot clash with anything


def loopback_unavailable() -> str | None:
    """Why no loopback-only network namespace can be made here (None: it can)."""
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
