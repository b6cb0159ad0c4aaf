"""hfl.testbed.watch_parent: a node whose parent is gone stops (SIGTERM to itself) even without PR_SET_PDEATHSIG."""
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from hfl.testbed import watch_parent

    marker = sys.argv[1]
    parent = os.getpid()  # read before the fork: the child may run only after this process has exited
    if os.fork() == 0:  # the "node": watches its parent, the intermediate process, which exits at once
        def stopped(*_):
            open(marker, "w").write("stopped")
            os._exit(0)
        signal.signal(signal.SIGTERM, stopped)
        watch_parent(parent, every=0.05)
        time.sleep(20)
        os._exit(1)
    os._exit(0)
""")


def test_a_node_whose_parent_died_stops_itself(tmp_path):
    marker = tmp_path / "marker"
    subprocess.run([sys.executable, "-c", SCRIPT, str(marker)], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists() and marker.read_text() == "stopped"
