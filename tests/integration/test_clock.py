"""The emulated clock with real processes: emulated seconds and energy grow every round, same seed same figures."""
import pytest

from .conftest import SMALL

FAST = SMALL + ["train.gamma=2", "data.max_test_samples=500"]
CLOCK = ("round_emulated_seconds", "emulated_seconds", "energy_joules", "device_energy_joules", "energy_joules_total")


def clock_rows(tb):
    return [tuple(r[k] for k in CLOCK) for r in tb.metrics()]


@pytest.mark.parametrize("algorithm", ["hierfavg", "qhetfed", "multiairfed"])
def test_emulated_time_and_energy_grow_every_round(hfl_testbed, algorithm):
    medium = ["channel.model=ota"] if algorithm == "multiairfed" else []
    tb = hfl_testbed(overrides=FAST + [f"run.algorithm={algorithm}"] + medium)
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    assert len(rows) == 3 and all(r["devices"] == 6 for r in rows)
    for prev, row in zip([None] + rows, rows):
        assert row["round_emulated_seconds"] > 0 and 0 < row["device_energy_joules"] < row["energy_joules"]
        if prev is not None:
            assert row["emulated_seconds"] == pytest.approx(prev["emulated_seconds"] + row["round_emulated_seconds"])
            assert row["energy_joules_total"] == pytest.approx(prev["energy_joules_total"] + row["energy_joules"])
    assert summary["emulated_seconds"] == rows[-1]["emulated_seconds"]
    assert summary["energy_joules"] == rows[-1]["energy_joules_total"]
    assert summary["clock"]["geometry"] == "ring"
    if algorithm == "hierfavg":
        again = hfl_testbed(overrides=FAST + [f"run.algorithm={algorithm}"])
        again.wait(timeout=300)
        assert clock_rows(again) == clock_rows(tb)  # wall time plays no part
