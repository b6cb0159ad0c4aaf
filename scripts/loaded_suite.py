"""Run the README's test command N times with CPU-burning processes beside it; list every test that failed.

    python scripts/loaded_suite.py                                  # 3 runs of the full suite, 2 burners
    python scripts/loaded_suite.py --runs 1 --out /tmp/loaded       # one run, its logs and junit xml kept there
    python scripts/loaded_suite.py --runs 2 -- tests/integration/test_edge_processes.py tests/integration/test_mtls.py

A test that passes alone but fails on a loaded machine depends on timing rather than on a node's readiness signal
(issue 49). Each run is `python -m pytest --full -n 2 --dist loadgroup` (the README's test command, .ci/run) plus the
arguments after `--`, with --burners processes spinning on the CPU for as long as it lasts. Everything is bounded: a
run past --timeout is stopped (its whole process group), the burners stop with the script, and a burner whose
script died stops by itself. Exit 0 when every run passed (no test failed, none timed out), else 1."""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMMAND = ["-m", "pytest", "--full", "-n", "2", "--dist", "loadgroup"]  # the README's test command
# a burner: spin until its deadline or until its parent (this script) is gone
BURNER = """import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(200000):
        pass
"""
_SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+)")
_GROUP = re.compile(r"@[^\[\]@]*$")  # `test[id]@group`: the suffix xdist's loadgroup adds to a name
_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")


@dataclasses.dataclass
class Run:
    index: int
    seconds: float
    returncode: int | None  # None: stopped at the timeout
    failed: list[str]
    counts: dict[str, int]
    log: pathlib.Path

    def line(self) -> str:
        how = "TIMED OUT" if self.returncode is None else f"exit {self.returncode}"
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items() if n) or f"{len(self.failed)} failed seen"
        return f"run {self.index}: {self.seconds:.0f} s, {how}, {counts}"


def nodeid(classname: str, name: str, root: pathlib.Path = ROOT) -> str:
    """pytest's node id from a junit testcase: classname `tests.integration.test_x.TestY` names a module path, then
    classes; the longest dotted prefix that is a file under `root` is the module."""
    name = _GROUP.sub("", name)
    parts = classname.split(".") if classname else []
    for i in range(len(parts), 0, -1):
        if (root / pathlib.Path(*parts[:i])).with_suffix(".py").is_file():
            return "::".join(["/".join(parts[:i]) + ".py", *parts[i:], name])
    return "::".join([*parts, name]) if parts else name


def junit_failures(xml_path: pathlib.Path, root: pathlib.Path = ROOT) -> tuple[list[str], dict[str, int]]:
    """The node ids of the testcases with a <failure> or <error>, and the suite's counts."""
    tree = ET.parse(xml_path)
    failed, counts = [], {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in tree.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(nodeid(case.get("classname", ""), case.get("name", ""), root))
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return list(dict.fromkeys(failed)), {"passed": passed, "failed": counts["failures"], "errors": counts["errors"],
                                         "skipped": counts["skipped"]}


def summary_failures(text: str) -> tuple[list[str], dict[str, int]]:
    """The same from pytest's terminal output (`-rfE` short summary and final counts line): for a run without junit xml."""
    failed = [_GROUP.sub("", m.group(2)) for m in map(_SUMMARY_LINE.match, text.splitlines()) if m]
    counts: dict[str, int] = {}
    tail = text.rstrip().splitlines()[-1] if text.strip() else ""
    for n, kind in _COUNTS.findall(tail):
        kind = {"error": "errors"}.get(kind, kind)
        counts[kind] = counts.get(kind, 0) + int(n)
    return list(dict.fromkeys(failed)), counts


def start_burners(n: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BURNER, str(os.getpid()), str(seconds)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def run_once(index: int, out: pathlib.Path, extra: list[str], timeout: float, burners: int) -> Run:
    xml, log = out / f"run-{index}.xml", out / f"run-{index}.log"
    xml.unlink(missing_ok=True)
    argv = [sys.executable, *COMMAND, "-rfE", f"--junitxml={xml}", *extra]
    spinning = start_burners(burners, timeout + 60)
    started = time.monotonic()
    try:
        with open(log, "wb") as sink:
            sink.write(f"$ {' '.join(argv)}  # beside {burners} CPU burner(s)\n".encode())
            sink.flush()
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # its own group: a timeout stops its workers and nodes too
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
    finally:
        stop(spinning)
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    if xml.is_file():
        failed, counts = junit_failures(xml)
        for extra_failed in summary_failures(text)[0]:  # e.g. an error in a session fixture's teardown
            if extra_failed not in failed:
                failed.append(extra_failed)
    else:
        failed, counts = summary_failures(text)
    return Run(index, seconds, code, failed, counts, log)


def report(runs: list[Run]) -> str:
    lines = [r.line() for r in runs]
    seen: dict[str, list[int]] = {}
    for r in runs:
        for test in r.failed:
            seen.setdefault(test, []).append(r.index)
    if seen:
        lines.append(f"failed in any run ({len(seen)}):")
        lines += [f"  {test}  (run{'s' if len(idx) > 1 else ''} {', '.join(map(str, idx))})" for test, idx in seen.items()]
    else:
        lines.append("no test failed in any run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="how many runs (default 3)")
    parser.add_argument("--burners", type=int, default=2, help="CPU-burning processes beside each run (default 2)")
    parser.add_argument("--timeout", type=float, default=2400,
                        help="seconds one run may take before it is stopped and counted as timed out (default 2400)")
    parser.add_argument("--out", type=pathlib.Path, help="folder for each run's log and junit xml (default: a new "
                                                         "temporary folder, named at the end)")
    parser.add_argument("pytest_args", nargs="*", help="after `--`: more pytest arguments, e.g. test files")
    args = parser.parse_args(argv)
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="loaded-suite-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(1, args.runs + 1):
        runs.append(run_once(i, out, args.pytest_args, args.timeout, args.burners))
        print(runs[-1].line(), flush=True)
    print("--- all runs:", report(runs), sep="\n")
    print(f"logs and junit xml: {out}")
    return 0 if all(r.returncode == 0 and not r.failed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
