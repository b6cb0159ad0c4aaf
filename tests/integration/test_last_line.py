"""The last line of defence on real processes: uploads that are finite but absurd (every device's delta x 1e20, a
plugin stage) make an exploding aggregate; the cloud refuses it every round, keeps the initial model, counts it and
says why in metrics.jsonl and summary.json, and the run still ends normally."""
import os
import pathlib

from .conftest import SMALL

ROOT = pathlib.Path(__file__).parents[2]


def test_an_exploding_aggregate_is_never_installed(hfl_testbed):
    cwd = os.getcwd()
    os.chdir(ROOT)  # the plugin is named relative to the working directory
    try:
        tb = hfl_testbed(overrides=SMALL + ['run.plugins=["tests/integration/explode_plugin.py"]', "run.rounds=2",
                                            'pipeline.clip="explode"', "data.max_test_samples=500",
                                            "run.algorithm=fedavg"])
        summary = tb.wait(timeout=300)
        clean = hfl_testbed(overrides=SMALL + ["run.rounds=1", "data.max_test_samples=500", "train.lr=0",
                                               "run.algorithm=fedavg"])
        reference = clean.wait(timeout=300)
    finally:
        os.chdir(cwd)
    rows = tb.metrics()
    assert [r["aggregate_rejected"] for r in rows] == [True, True]
    assert all("max_update_ratio" in r["aggregate_rejected_reason"] for r in rows)
    assert summary["aggregates_rejected"] == 2 and not summary["diverged"]
    # the model never moved: the same accuracy as the initial model (a run with lr = 0)
    assert summary["final_accuracy"] == reference["final_accuracy"]
