"""`hfl config` and `hfl run` say what a config means: a round's work for a device and the sections ignored."""
import pathlib

from hfl import families  # noqa: F401
from hfl.common import config as config_mod
from hfl.explain import explain

H2FDP = str(pathlib.Path(__file__).parents[2] / "deploy" / "configs" / "h2fdp-p05.toml")


def test_switching_an_h2fdp_config_to_hierfavg_says_what_changed():
    private = explain(config_mod.load(H2FDP, []))
    assert "4 local phases of 5 steps, 4 edge model syncs" in private[0] and "(= 20 SGD steps a device a round" in private[0]
    assert private[1].startswith("private (by_trust): noise calibrated (paper) to epsilon 1")
    switched = explain(config_mod.load(H2FDP, ["run.algorithm=hierfavg"]))
    assert "20 local phases of 5 steps" in switched[0] and "(= 100 SGD steps a device a round" in switched[0]
    assert switched[1] == "ignored by hierfavg: [privacy] (set, but this algorithm does not read it)"
    assert switched[2] == "not private: no DP noise is added"


def test_the_default_and_other_modes_count_their_steps():
    assert "(= 20 SGD steps a device a round; 2 edges x 5 devices)" in explain(config_mod.load(None, []))[0]
    qhet = explain(config_mod.load(None, ["run.algorithm=qhetfed"]))[0]
    assert "4 edge gradient steps" in qhet and "(= 9 SGD steps" in qhet
    air = explain(config_mod.load(None, ["run.algorithm=multiairfed", "channel.model=ota"]))[0]
    assert "over-the-air slots" in air
    assert len(explain(config_mod.load(None, []))) == 2  # nothing ignored in the defaults


def test_the_noise_the_cloud_set_is_said_per_stream_and_tier():
    from hfl.explain import noise_lines

    privacy = {"calibration": "sound", "noise": {
        "edge-000": {"global": {"tier": "edge", "noise_multiplier": 1.5, "std": 0.12}},
        "edge-001": {"global": {"tier": "device", "noise_multiplier": 1.5, "std": 0.6}},
        "edge-002": {"global": {"tier": "device", "noise_multiplier": 2.0, "std": 0.8}}}}
    assert noise_lines(privacy) == [
        "noise, global stream at the device: multiplier 1.5..2, std 0.6..0.8 (2 edges; sound calibration)",
        "noise, global stream at the edge: multiplier 1.5, std 0.12 (1 edge; sound calibration)"]
    assert noise_lines({}) == []
