"""How the Testbed starts a node process, chosen by name (`HFL_SPAWN`, default `fork`):

- `exec`: a fresh `python -m hfl.cli ROLE ...` per node (subprocess.Popen); every node imports torch and the
  services itself (~2.2 s of CPU per cloud and device host, ~0.5 s per edge).
- `fork`: a fork of one multiprocessing forkserver that imported those modules once (PRELOAD); the node then runs
  the same `hfl.cli` entry with the same argv, environment and log as under `exec`.

Both return an object with Popen's pid, returncode, poll, wait, send_signal, terminate and kill. A node is the
leader of its own session under both (the Testbed signals its process group).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing
import os
import subprocess
import sys
import threading
from typing import Callable

SPAWN_ENV = "HFL_SPAWN"
DEFAULT = "fork"

# Imported once by the forkserver: what a cloud, an edge and a device host import before round 0 (measured with
# PYTHONPROFILEIMPORTTIME on `hfl run`). Imports only: no torch op, no gRPC channel or server (both start threads,
# and a process that forks must have one).
PRELOAD = ["torch", "numpy", "grpc", "asyncio", "importlib.metadata", "hfl.cli", "hfl.families", "hfl.testbed",
           "hfl.audit_cli", "hfl.attack_cli", "hfl.plan_cli", "hfl.common.tls", "hfl.common.plugins",
           "hfl.cloud_server.service", "hfl.cloud_server.controller", "hfl.edge_server.service",
           "hfl.device_client.host", "hfl.plot_backend", "hfl.forkserver_freeze"]


def spawn_exec(argv: list[str], log_path, env: dict) -> subprocess.Popen:
    with open(log_path, "ab") as log:  # no preexec_fn: see hfl.testbed.die_with_parent
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@contextlib.contextmanager
def _main_hidden():
    """multiprocessing makes the forkserver and every child import the launcher's __main__ again (as __mp_main__):
    a user's script without an `if __name__ == "__main__"` guard would then start its testbed once per node. A node
    runs `hfl.cli`, never the launcher's script: hide it (its __spec__ and __file__) while a process starts."""
    with _MAIN_LOCK:  # two threads starting nodes at once would otherwise save the hidden state as the real one
        main = sys.modules["__main__"]
        saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


_MAIN_LOCK = threading.Lock()


# What every node's process starts with unless the launcher's environment says otherwise. numpy's OpenBLAS starts one
# busy-waiting thread per core at import; on a testbed's shared cores they take turns with the nodes' torch threads
# (the medium's slot at paper 003's scale: 2.4-2.5 s a round on one BLAS thread, 3.4-4.6 s on two;
# benchmarks/reports/medium-paper003.md). The forkserver imports numpy, so it must start with them too.
NODE_ENV = {"OPENBLAS_NUM_THREADS": "1"}


def node_env(env: dict) -> dict:
    """`env` with NODE_ENV's defaults under it."""
    return {**NODE_ENV, **env}


@contextlib.contextmanager
def _environ(defaults: dict):
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def warm() -> None:
    """Start the forkserver now (its imports then run while the launcher does other work); idempotent."""
    from multiprocessing import forkserver

    _context()
    with _main_hidden(), _environ(NODE_ENV):
        forkserver.ensure_running()


def server_pid() -> int | None:
    """The forkserver's pid, None before it started (benchmarks count its memory with the nodes')."""
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid


def _forkserver_pid() -> int:
    warm()
    return server_pid()


class ForkedNode:
    """A node forked by the forkserver, with the Popen methods the Testbed and its callers use."""

    def __init__(self, argv: list[str], log_path, env: dict):
        self.args = list(argv)
        env = dict(env, HFL_PARENT_PID=str(_forkserver_pid()))  # the node's parent: die_with_parent arms against it
        self._proc = _context().Process(target=run_node, args=(self.args, str(log_path), env))
        with _main_hidden():
            self._proc.start()
        # not joined by multiprocessing's exit handler: a launcher that exits with nodes left (no Testbed.close)
        # must not hang on them; they die with it, as Popen ones do (PR_SET_PDEATHSIG through the forkserver)
        multiprocessing.process._children.discard(self._proc)
        self.pid = self._proc.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._proc.exitcode  # the forkserver's waitpid status: -N for signal N, like Popen
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self._proc.terminate()

    def kill(self) -> None:
        self._proc.kill()


def _set_title(argv: list[str]) -> None:
    """Show the node's argv in ps / psutil.cmdline() (a fork keeps the forkserver's): write it, NUL-separated and
    truncated, over this process's argument area (its bounds are fields 48-49 of /proc/self/stat)."""
    import ctypes

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])
    except (OSError, IndexError, ValueError):
        return
    size = end - start
    if size <= 1:
        return
    title = "\0".join(argv).encode(errors="replace")[:size - 1]
    ctypes.memmove(start, title + b"\0" * (size - len(title)), size)


def run_node(argv: list[str], log_path: str, env: dict) -> None:
    """The forked node (multiprocessing's target): what `exec` gives a fresh process, then `-m MODULE`'s main(args).
    Ends with os._exit, as every multiprocessing child does, after the exit work an interpreter does: non-daemon
    threads joined, atexit handlers (logging's flush) run."""
    from multiprocessing import forkserver

    alive = forkserver._forkserver._forkserver_alive_fd
    if alive is not None:  # only the launcher may hold it: the forkserver then exits with the launcher, and its
        os.close(alive)   # nodes with it (PR_SET_PDEATHSIG, armed by die_with_parent)
        forkserver._forkserver._forkserver_alive_fd = None
    os.setsid()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")
    os.environ.clear()
    os.environ.update(env)
    head = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in head if p not in sys.path]
    _set_title(argv)
    if argv[1:2] != ["-m"] or len(argv) < 3:
        raise ValueError(f"a forked node runs `python -m MODULE ...`, not {argv}")
    sys.argv = [argv[2], *argv[3:]]
    code = 1
    try:
        code = importlib.import_module(argv[2]).main(argv[3:])
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # the traceback an interpreter prints for an uncaught exception
        import traceback

        traceback.print_exc()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code & 0xFF)


def call_here(fn: Callable, *args):
    return fn(*args)


class CallFailed(RuntimeError):
    """call_forked's process did not start, or died before it answered: not an error of the function called."""


def call_forked(fn: Callable, *args):
    """fn(*args) in a fork of the forkserver, which imported torch once for every node: the launcher then never
    imports it. Its result comes back through a pipe; so does its exception (one that does not pickle as a
    RuntimeError with its class name and message)."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_call_and_send, args=(send, fn, args))
    name = getattr(fn, "__qualname__", fn)
    try:
        with _main_hidden():
            proc.start()
    except OSError as exc:  # the forkserver is gone
        raise CallFailed(f"cannot fork a process for {name}: {exc}") from exc
    finally:
        send.close()
    try:
        ok, value = receive.recv()
    except EOFError:  # it died before it answered
        ok, value = False, None
    finally:
        receive.close()
        proc.join()
    if not ok:
        raise value or CallFailed(f"{name} died in its forked process (exit {proc.exitcode})")
    return value


def _call_and_send(conn, fn: Callable, args: tuple) -> None:
    import pickle

    try:
        out = (True, fn(*args))
    except Exception as exc:
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{exc.__class__.__name__}: {exc}")
        out = (False, exc)
    conn.send(out)
    conn.close()


SPAWNERS: dict[str, Callable] = {"exec": spawn_exec, "fork": ForkedNode}
# How the launcher runs work that needs the nodes' modules (torch) before any node starts (preflight's model check).
CALLERS: dict[str, Callable] = {"exec": call_here, "fork": call_forked}
# What a spawner needs started before its first node: the forkserver's imports (~3 s of CPU, mostly torch) then run
# on the other core while the launcher imports its own modules, loads the config and checks the data.
PREPARERS: dict[str, Callable[[], None]] = {"exec": lambda: None, "fork": warm}


def _name(name: str | None) -> str:
    name = name or os.environ.get(SPAWN_ENV) or DEFAULT
    if name not in SPAWNERS:
        raise ValueError(f"{SPAWN_ENV}={name!r}: choose one of {', '.join(SPAWNERS)}")
    return name


def spawner(name: str | None = None) -> Callable:
    """The spawner called `name`, else $HFL_SPAWN, else DEFAULT."""
    return SPAWNERS[_name(name)]


def caller(name: str | None = None) -> Callable:
    """call_here or call_forked, for the spawner called `name` (else $HFL_SPAWN, else DEFAULT)."""
    return CALLERS[_name(name)]


def prepare(name: str | None = None) -> None:
    """Start now what spawner(name) needs before its first node (idempotent)."""
    PREPARERS[_name(name)]()
