"""[control] checks name their key; the controller plug point builds the configured controller."""
import pytest

from hfl.cloud_server import controller
from hfl.common import config

H2FDP = ["run.algorithm=h2fdp", "train.tau=10", "train.gamma=5", "control.controller=h2fdp"]


@pytest.mark.parametrize("overrides, key", [
    (["run.algorithm=hierfavg"], "control.controller"),
    (["control.tau_max=1"], "control.tau_max"),
    (["control.eta=0"], "control.eta"),
    (["control.beta=-2"], "control.beta"),
    (["control.s_max=99"], "control.s_max"),
    (["control.controller=pid"], "control.controller"),
    (["control.alpha1=-1"], "control.alpha1"),
])
def test_bad_control_settings_name_their_key(overrides, key):
    with pytest.raises(config.ConfigError, match=key.replace(".", r"\.")):
        config.load(None, H2FDP + overrides)


def test_no_controller_by_default_and_h2fdp_registered():
    assert controller.build(config.load(None, []), None, 10, [1]) is None
    assert "h2fdp" in controller.CONTROLLERS
    assert config.load(None, H2FDP).control.controller == "h2fdp"
