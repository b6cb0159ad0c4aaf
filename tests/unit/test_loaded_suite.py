"""scripts/loaded_suite.py: which tests failed, from a run's junit xml or its terminal summary (no pytest run here)."""
import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("loaded_suite", ROOT / "scripts" / "loaded_suite.py")
loaded_suite = sys.modules["loaded_suite"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up
spec.loader.exec_module(loaded_suite)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="1" failures="2" skipped="1" tests="6">
<testcase classname="tests.integration.test_edge_processes" name="test_edges_sharing_a_process_under_mutual_tls">
  <failure message="AssertionError">UNAVAILABLE</failure></testcase>
<testcase classname="tests.unit.test_loaded_suite" name="test_ok" />
<testcase classname="tests.integration.test_live.TestPage" name="test_x[a@b]@tests/integration/test_live.py">
  <failure message="x"/></testcase>
<testcase classname="tests.integration.test_mtls" name="test_the_run_finishes_despite_the_rogues"><error message="e"/></testcase>
<testcase classname="tests.unit.test_loaded_suite" name="test_skipped"><skipped message="s"/></testcase>
<testcase classname="tests.unit.test_loaded_suite" name="test_ok_too" />
</testsuite></testsuites>"""


def test_failures_from_junit_xml(tmp_path):
    xml = tmp_path / "run.xml"
    xml.write_text(JUNIT)
    failed, counts = loaded_suite.junit_failures(xml)
    assert failed == ["tests/integration/test_edge_processes.py::test_edges_sharing_a_process_under_mutual_tls",
                      "tests/integration/test_live.py::TestPage::test_x[a@b]",
                      "tests/integration/test_mtls.py::test_the_run_finishes_despite_the_rogues"]
    assert counts == {"passed": 2, "failed": 2, "errors": 1, "skipped": 1}


def test_failures_from_the_terminal_summary():
    text = """........F.
=========================== short test summary info ============================
FAILED tests/integration/test_edge_processes.py::test_a@tests/integration/test_edge_processes.py - AssertionError
ERROR tests/integration/test_mtls.py::test_b@tests/integration/test_mtls.py
FAILED tests/unit/test_x.py::test_c[1-2]
FAILED tests/unit/test_x.py::test_d[x@y]@tests/unit/test_x.py - assert 1 == 2
=========== 2 failed, 1553 passed, 2 skipped, 1 error in 738.12s (0:12:18) ===========
"""
    failed, counts = loaded_suite.summary_failures(text)
    assert failed == ["tests/integration/test_edge_processes.py::test_a", "tests/integration/test_mtls.py::test_b",
                      "tests/unit/test_x.py::test_c[1-2]", "tests/unit/test_x.py::test_d[x@y]"]
    assert counts == {"failed": 2, "passed": 1553, "skipped": 2, "errors": 1}


def test_report_lists_each_failed_test_once_with_its_runs(tmp_path):
    runs = [loaded_suite.Run(1, 700.4, 1, ["t::a", "t::b"], {"passed": 9, "failed": 2}, tmp_path / "1.log"),
            loaded_suite.Run(2, 720.0, None, ["t::a"], {}, tmp_path / "2.log"),
            loaded_suite.Run(3, 690.0, 0, [], {"passed": 11}, tmp_path / "3.log")]
    assert loaded_suite.report(runs).splitlines() == [
        "run 1: 700 s, exit 1, 9 passed, 2 failed",
        "run 2: 720 s, TIMED OUT, 1 failed seen",
        "run 3: 690 s, exit 0, 11 passed",
        "failed in any run (2):",
        "  t::a  (runs 1, 2)",
        "  t::b  (run 1)",
    ]
