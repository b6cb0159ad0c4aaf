"""hfl/node_spawn.py: a forked node behaves like the Popen one (exit codes, signals, wait, environment, log,
session, title), and the forkserver stays safe to fork (one thread) and dies with its launcher."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from hfl import node_spawn

SPAWNERS = ["exec", "fork"]


def start(kind, tmp_path, *args, env=None, name="node"):
    argv = [sys.executable, "-m", "tests.unit.spawn_target", *args]
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    return node_spawn.spawner(kind)(argv, tmp_path / f"{name}.log", {**base, **(env or {})})


@pytest.mark.parametrize("kind", SPAWNERS)
def test_exit_codes(kind, tmp_path):
    assert start(kind, tmp_path, "exit", "3").wait(timeout=60) == 3
    failed = start(kind, tmp_path, "raise", name="raise")
    assert failed.wait(timeout=60) == 1 and failed.returncode == 1 and failed.poll() == 1
    assert "RuntimeError: the node failed" in (tmp_path / "raise.log").read_text()


@pytest.mark.parametrize("kind", SPAWNERS)
def test_signals_wait_timeout_and_kill(kind, tmp_path):
    node = start(kind, tmp_path, "sleep", "60")
    with pytest.raises(subprocess.TimeoutExpired):
        node.wait(timeout=0.2)
    assert node.poll() is None and node.returncode is None
    deadline = time.monotonic() + 60
    while "sleeping" not in (tmp_path / "node.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=30) == -signal.SIGTERM
    node = start(kind, tmp_path, "sleep", "60", name="killed")
    node.kill()
    assert node.wait(timeout=30) == -signal.SIGKILL
    node = start(kind, tmp_path, "sleep", "60", name="terminated")
    node.terminate()
    assert node.wait(timeout=30) == -signal.SIGTERM


@pytest.mark.parametrize("kind", SPAWNERS)
def test_environment_log_session_and_title(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("HFL_RELAY_SECRET", "the launcher's")  # an edge's environment is given without it
    (tmp_path / "node.log").write_text("earlier line\n")
    node = start(kind, tmp_path, "report", env={"HFL_JOIN_SECRET": "j"})
    deadline = time.monotonic() + 60
    cmdline = []
    while node.poll() is None and time.monotonic() < deadline:
        try:
            cmdline = psutil.Process(node.pid).cmdline() or cmdline
        except psutil.Error:
            pass
        time.sleep(0.01)
    assert node.wait(timeout=60) == 0
    lines = (tmp_path / "node.log").read_text().splitlines()
    assert lines[0] == "earlier line" and "to stderr" in lines  # appended; stdout and stderr both in the log
    seen = json.loads(next(ln for ln in lines if ln.startswith("{")))
    assert seen["env"]["HFL_JOIN_SECRET"] == "j" and "HFL_RELAY_SECRET" not in seen["env"]
    assert seen["stdin"] == "" and seen["sid"] == seen["pid"] == node.pid
    if kind == "fork":
        from multiprocessing import forkserver

        assert seen["env"]["HFL_PARENT_PID"] == str(forkserver._forkserver._forkserver_pid)  # die_with_parent's
        assert "report" in cmdline and "tests.unit.spawn_target" in cmdline, cmdline


def test_pythonpath_entries_import_in_a_forked_node(tmp_path):
    """Plugins loaded by path: the PYTHONPATH the Testbed computes (child_pythonpath) is importable in the node."""
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "my_fork_plugin.py").write_text("VALUE = 1\n")
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_dir), os.getcwd()])}
    assert start("fork", tmp_path, "import", "my_fork_plugin", env=env).wait(timeout=60) == 0
    assert start("fork", tmp_path, "import", "my_fork_plugin", name="without").wait(timeout=60) == 1


@pytest.mark.parametrize("kind", SPAWNERS)
def test_threads_joined_and_atexit_run_before_exit(kind, tmp_path):
    assert start(kind, tmp_path, "exit_work").wait(timeout=60) == 5
    text = (tmp_path / "node.log").read_text()
    assert text.index("buffered, no newline") < text.index("thread finished") < text.index("atexit ran"), text


def test_forkserver_has_one_thread(tmp_path):
    """No torch op and no gRPC channel or server in the forkserver: either starts threads, and a process that
    forks must have one (the preloaded modules are imported, nothing more)."""
    from multiprocessing import forkserver

    assert start("fork", tmp_path, "exit", "0").wait(timeout=60) == 0  # the preload is over once a node ran
    server = psutil.Process(forkserver._forkserver._forkserver_pid)
    assert server.num_threads() == 1
    assert {"torch", "grpc", "hfl.device_client.host"} <= set(node_spawn.PRELOAD)


def test_forked_nodes_die_with_the_launcher(tmp_path):
    """kill -9 of the launcher: its forkserver exits (the nodes do not hold its 'alive' pipe), and the nodes with it
    (die_with_parent's PR_SET_PDEATHSIG, armed against the forkserver)."""
    launcher = textwrap.dedent(f"""
        import pathlib, sys, time
        from hfl import node_spawn
        node_spawn.PRELOAD = ["hfl.testbed"]  # a launcher of its own: a quick forkserver
        argv = [sys.executable, "-m", "tests.unit.spawn_target", "node", "600"]
        node = node_spawn.spawner("fork")(argv, pathlib.Path({str(tmp_path)!r}) / "node.log",
                                          {{"PATH": "/usr/bin:/bin", "PYTHONPATH": {os.getcwd()!r}}})
        print(node.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        node = psutil.Process(int(proc.stdout.readline()))
        deadline = time.monotonic() + 60
        log = tmp_path / "node.log"
        while not (log.exists() and "running" in log.read_text()):  # bound to its parent by now
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs([node], timeout=30)
    assert not alive, "a forked node outlived its launcher"


def test_nodes_forked_from_several_threads(tmp_path):
    """`hfl sweep --jobs N` runs testbeds in threads of one process: they share the forkserver."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        return start("fork", tmp_path, "exit", str(i), name=f"n{i}").wait(timeout=120)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(8))) == list(range(8))


def test_a_launcher_exits_without_waiting_for_its_forked_nodes(tmp_path):
    """A launcher that exits with nodes left (no Testbed.close) neither hangs on them, as multiprocessing would
    join its children at exit, nor leaves them behind."""
    launcher = textwrap.dedent(f"""
        import pathlib, sys, time
        from hfl import node_spawn
        node_spawn.PRELOAD = ["hfl.testbed"]
        argv = [sys.executable, "-m", "tests.unit.spawn_target", "node", "600"]
        log = pathlib.Path({str(tmp_path)!r}) / "node.log"
        node = node_spawn.spawner("fork")(argv, log, {{"PATH": "/usr/bin:/bin", "PYTHONPATH": {os.getcwd()!r}}})
        while not (log.exists() and "running" in log.read_text()):
            time.sleep(0.05)
        print(node.pid, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-2000:]
    gone, alive = psutil.wait_procs([psutil.Process(int(done.stdout))], timeout=30)
    assert not alive, "a forked node outlived its launcher"


def test_a_launcher_script_without_a_main_guard_runs_once(tmp_path):
    """multiprocessing would import the launcher's script again in the forkserver and in each node: an unguarded
    script would then launch once more per node. Its nodes run `python -m ...`, never the script."""
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent(f"""
        import pathlib, sys
        from hfl import node_spawn
        node_spawn.PRELOAD = ["hfl.testbed"]
        print("launcher body ran", flush=True)
        env = {{"PATH": "/usr/bin:/bin", "PYTHONPATH": {os.getcwd()!r}}}
        nodes = [node_spawn.spawner("fork")([sys.executable, "-m", "tests.unit.spawn_target", "exit", str(i)],
                                            pathlib.Path({str(tmp_path)!r}) / f"n{{i}}.log", env) for i in (3, 4)]
        print("codes", [n.wait(timeout=60) for n in nodes], flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("launcher body ran") == 1 and "codes [3, 4]" in done.stdout
    assert "launcher body ran" not in (tmp_path / "n3.log").read_text()


def test_nodes_and_the_forkserver_start_with_one_blas_thread(tmp_path, monkeypatch):
    """numpy's OpenBLAS reads OPENBLAS_NUM_THREADS once, at import: the forkserver (which imports numpy for every
    forked node) starts with it, a Testbed's nodes get it, and a value the launcher's environment sets wins."""
    assert node_spawn.node_env({"PATH": "/bin"})["OPENBLAS_NUM_THREADS"] == "1"
    assert node_spawn.node_env({"OPENBLAS_NUM_THREADS": "2"})["OPENBLAS_NUM_THREADS"] == "2"
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert start("fork", tmp_path, "exit", "0").wait(timeout=60) == 0
    environ = pathlib.Path(f"/proc/{node_spawn.server_pid()}/environ").read_bytes().split(b"\0")
    assert b"OPENBLAS_NUM_THREADS=1" in environ
    assert "OPENBLAS_NUM_THREADS" not in os.environ  # the launcher's own environment is left as it was


@pytest.mark.parametrize("kind", SPAWNERS)
def test_a_forked_node_never_collects_the_preloaded_objects(kind, tmp_path):
    """The forkserver freezes what its preload created, last (hfl/forkserver_freeze.py): a forked node's collections
    leave those objects, and the pages it shares with the forkserver, untouched; an exec'd node freezes nothing."""
    assert node_spawn.PRELOAD[-1] == "hfl.forkserver_freeze"
    node = start(kind, tmp_path, "frozen")
    assert node.wait(timeout=60) == 0
    frozen = json.loads((tmp_path / "node.log").read_text())["frozen"]
    assert frozen > 100_000 if kind == "fork" else frozen == 0, frozen


def test_unknown_spawner_is_refused(monkeypatch):
    monkeypatch.setenv(node_spawn.SPAWN_ENV, "thread")
    with pytest.raises(ValueError, match="exec, fork"):
        node_spawn.spawner()
    assert node_spawn.spawner("exec") is node_spawn.spawn_exec


@pytest.mark.parametrize("kind", SPAWNERS)
def test_a_call_through_the_spawner_returns_its_result_and_raises_its_error(kind):
    """preflight's model check runs through caller(kind): in a fork of the forkserver (torch preloaded), or here."""
    from tests.unit import spawn_target

    call = node_spawn.caller(kind)
    assert call(divmod, 17, 5) == (3, 2)
    assert (call(os.getpid) != os.getpid()) == (kind == "fork")
    with pytest.raises(ValueError, match="invalid literal"):
        call(int, "x")
    if kind == "fork":
        assert call(spawn_target.torch_loaded)  # the forkserver's preload
        with pytest.raises(RuntimeError, match="Unpicklable: a reason"):
            call(spawn_target.fail_unpicklably)
        with pytest.raises(node_spawn.CallFailed, match="exit 3"):
            call(os._exit, 3)


def test_the_launcher_itself_starts_with_one_blas_thread():
    """`hfl` shares the cores with its nodes: its own OpenBLAS and OpenMP pools are one thread unless the user's
    environment says otherwise (set before numpy's import, which reads them once)."""
    code = ("import json, os, hfl.cli, numpy\n"
            "try:\n    import threadpoolctl\n    pools = [i['num_threads'] for i in threadpoolctl.threadpool_info()]\n"
            "except ImportError:\n    pools = None\n"
            "print(json.dumps([os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'], pools]))")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    blas, omp, pools = json.loads(out.stdout)
    assert (blas, omp) == ("1", "1") and (pools is None or set(pools) == {1})
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "2"}, capture_output=True,
                         text=True, timeout=120, check=True)
    assert json.loads(out.stdout)[0] == "2"
