"""Issue 22's honest output: not_learning verdicts, whole wall time and n = 1 in the sweep table, Testbed hygiene."""
import pytest

from hfl import sweep
from hfl.verdict import not_learning


def rows(*pairs):
    return [{"round": i, "accuracy": a, "loss": l} for i, (a, l) in enumerate(pairs)]


@pytest.mark.parametrize("data, classes, reason", [
    (rows((0.10, 2.30), (0.11, 884027.0)), 10, "the test loss exploded: 2.3 after round 0, 8.84e+05 after round 1"),
    (rows((0.10, 2.30), (0.11, 2.29), (0.12, 2.28)), 10, "accuracy stayed at chance: best 12.00% over 3 evaluations"),
    (rows((0.30, 1.40), (0.31, 1.39)), 4, "chance is 25.0% (4 classes)"),
    ([{"round": 0, "accuracy": None, "loss": None, "diverged": True}], 10, "diverged at round 0"),
])
def test_runs_that_do_not_learn_are_flagged_with_the_reason(data, classes, reason):
    assert reason in not_learning(data, classes)


@pytest.mark.parametrize("data", [rows((0.5, 1.2), (0.9, 0.3)), rows((0.12, 2.3)), []])
def test_runs_that_learn_or_are_too_short_to_tell_are_not_flagged(data):
    assert not_learning(data, 10) is None


def test_sweep_cells_show_n_1_and_the_whole_time():
    assert sweep._fmt({"mean": 0.9, "std": 0.0, "n": 1}) == "0.9000 (n = 1)"
    assert sweep._fmt({"mean": 0.6, "std": 0.1, "n": 2}) == "0.6000 ± 0.1000"
    assert list(sweep.TIMING) == ["total_seconds", "startup_seconds"]


def test_testbed_is_not_collected_by_pytest():
    from hfl.testbed import Testbed, TestbedError

    assert Testbed.__test__ is False and TestbedError.__test__ is False
