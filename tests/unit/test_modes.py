"""Round modes (common/modes.py): the registry, each tier's class, the config check against channel.model, the
example plugin mode, and the services' promise to hold no mode flag."""
import pathlib
import re

import numpy as np
import pytest

from hfl.common import modes, plans, plugins
from hfl.common.config import ConfigError, load

ROOT = pathlib.Path(__file__).parents[2]


def test_every_algorithm_names_a_registered_mode_and_every_tier_class_resolves():
    from hfl.cloud_server import modes as cloud_modes  # noqa: F401 - each tier registers its own classes
    from hfl.device_client import modes as device_modes  # noqa: F401
    from hfl.edge_server import modes as edge_modes  # noqa: F401

    assert {"digital", "relay", "air"} <= set(modes.MODES)
    for name in plans.ALGORITHMS:
        mode = modes.MODES.get(plans.ALGORITHMS.get(name).mode)
        for tier in modes.TIERS:
            assert isinstance(modes.tier_class(mode, tier), type)
    assert plans.ALGORITHMS.get("dpsq-fl").mode == "relay" and plans.ALGORITHMS.get("multiairfed").mode == "air"
    assert plans.ALGORITHMS.get("hierfavg").mode == "digital"
    with pytest.raises(KeyError, match="unknown round mode 'smoke'"):
        modes.MODES.get("smoke")
    with pytest.raises(ValueError, match="tier 'fog'"):
        modes.tier_class(modes.MODES.get("digital"), "fog")
    assert modes.tier_class(modes.MODES.get("air"), "edge") is edge_modes.AirEdge


def test_the_engine_names_no_tier_class():
    text = (ROOT / "common" / "modes.py").read_text()
    assert not re.search(r"hfl\.(cloud_server|edge_server|device_client)", text)


@pytest.mark.parametrize("overrides, message", [
    (["run.algorithm=multiairfed"], "multiairfed runs in air mode, which needs channel.model = ota or orthogonal"),
    (["channel.model=ota"], "hierfavg runs in digital mode, which needs channel.model = ideal"),
])
def test_the_mode_decides_the_channel_model(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(None, overrides)


def _plugin():
    # the loader `run.plugins` uses: one module per file in a process, so a later `run.plugins` naming the same file
    # (tests/integration/test_plugins.py, on the same xdist worker or not) finds it instead of registering twice
    return plugins._import_file(str(ROOT / "examples" / "sign_vote_mode.py"))


def test_sign_vote_is_the_majority_sign_at_the_mean_step():
    vote = _plugin().sign_vote
    v = [np.array([1.0, -2.0, 3.0, 0.5]), np.array([1.0, 2.0, -3.0, -0.5]), np.array([-1.0, 2.0, 3.0, 0.0])]
    mean_abs = np.mean(np.abs(np.stack(v)))
    np.testing.assert_allclose(vote(v), np.array([1, 1, 1, 0]) * mean_abs, rtol=1e-6)


SERVICES = ["cloud_server/service.py", "edge_server/service.py", "device_client/host.py"]
FLAGS = r"\.(?:relay|medium|plane|fusion|policy|controller|own_w|relay_key|private)\b|ALGORITHMS\.get\([^)]*\)\.\w+|\bis_private"


@pytest.mark.parametrize("path", SERVICES)
def test_services_hold_no_mode_flag_and_read_no_algorithm_flag(path):
    text = (ROOT / path).read_text()
    assert [m.group(0) for m in re.finditer(FLAGS, text)] == []
