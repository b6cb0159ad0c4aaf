"""A node for tests/unit/test_node_spawn.py: `python -m tests.unit.spawn_target ACTION ARG...`."""
import atexit
import json
import os
import sys
import threading
import time


def main(argv: list[str]) -> int:
    action, *rest = argv
    if action == "exit":
        return int(rest[0])
    if action == "raise":
        raise RuntimeError("the node failed")
    if action == "sleep":
        print("sleeping", flush=True)
        time.sleep(float(rest[0]))
        return 0
    if action == "node":  # a node as hfl.cli starts one: bound to its launcher, then long-lived
        from hfl.testbed import die_with_parent

        die_with_parent()
        print("running", flush=True)
        time.sleep(float(rest[0]))
        return 0
    if action == "report":  # what the node sees of its process, environment and path
        print(json.dumps({"env": dict(os.environ), "sid": os.getsid(0), "pid": os.getpid(), "stdin": sys.stdin.read(),
                          "sys_path": sys.path}))
        print("to stderr", file=sys.stderr)
        return 0
    if action == "frozen":  # how many objects the collector never traverses (gc.freeze)
        import gc

        print(json.dumps({"frozen": gc.get_freeze_count()}))
        return 0
    if action == "import":
        __import__(rest[0])
        return 0
    if action == "exit_work":  # a non-daemon thread and an atexit handler: both must run before the exit
        atexit.register(lambda: sys.stdout.write("atexit ran\n"))
        threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread finished\n"))).start()
        sys.stdout.write("buffered, no newline")
        return 5
    raise SystemExit(f"unknown action {action}")


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not picklable")


def fail_unpicklably() -> None:
    """For node_spawn.call_forked: an exception that cannot come back through the pipe as itself."""
    raise Unpicklable("a reason")


def torch_loaded() -> bool:
    """For node_spawn.call_forked: whether the process it runs in imported torch."""
    return "torch" in sys.modules


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
