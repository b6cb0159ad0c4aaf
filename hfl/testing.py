"""pytest plugin: the `hfl_testbed` fixture starts whole testbeds and always tears them down.

    def test_learns(hfl_testbed):
        tb = hfl_testbed(overrides=["run.rounds=3"])
        assert tb.wait(timeout=300)["final_accuracy"] > 0.5
"""
from __future__ import annotations

import pytest

from hfl.testbed import Testbed


@pytest.fixture
def hfl_testbed(tmp_path):
    beds: list[Testbed] = []

    def start(config=None, overrides=(), **kwargs) -> Testbed:
        bed = Testbed(config, list(overrides), run_dir=kwargs.pop("run_dir", tmp_path / f"run{len(beds)}"), **kwargs)
        beds.append(bed)
        return bed.start()

    yield start
    for bed in beds:
        bed.close()
