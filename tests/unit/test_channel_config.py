"""[channel] / [clock] sections: defaults from the digests, cross-field checks naming the key."""
import dataclasses

import pytest

from hfl.common.channel.config import ChannelSection, ClockSection, validate_channel
from hfl.common.config import ConfigError, _build


def test_defaults_are_valid_and_match_table_I():
    c, k = ChannelSection(), ClockSection()
    validate_channel(dataclasses.replace(c, model="ota"), k)
    assert (c.lambda_p, c.r0, c.R, c.alpha, c.th0, c.th1, c.interferer_devices) == (20.0, 4.0, 30.0, 4.0, 0.01, 0.5, 15)
    p = c.ota_params()
    assert p.sigma_d2 == 10.0 and p.P_u == 1.0 and c.lambda_p_per_m2 == pytest.approx(2e-5)
    assert k.cycles_per_sample * 60 / k.cpu_hz == pytest.approx(0.05)  # paper 003: t_CM = 0.05 s per step


@pytest.mark.parametrize("key, value, model", [
    ("alpha", 2.0, "ota"), ("alpha", 1.5, "orthogonal"), ("alpha", 0.0, "ideal"),
    ("r0", 30.0, "ota"), ("r0", 0.0, "ota"), ("P_u", -1.0, "ota"), ("P_d", 0.0, "ota"),
    ("sigma_en2", -1e-15, "ota"), ("sigma_dn2", -1.0, "ota"), ("th1", 0.0, "ota"), ("th0", -0.1, "ota"),
    ("window_radius", 30.0, "ota"), ("lambda_p", 0.0, "ota"), ("sigma_d2", -1.0, "ota"),
])
def test_bad_channel_values_name_the_key(key, value, model):
    bad = dataclasses.replace(ChannelSection(), model=model, **{key: value})
    with pytest.raises(ConfigError, match=f"channel\\.{key}"):
        validate_channel(bad)


def test_alpha_two_is_fine_for_an_ideal_channel():
    validate_channel(dataclasses.replace(ChannelSection(), model="ideal", alpha=2.0))


@pytest.mark.parametrize("key, value", [("bandwidth_hz", 0.0), ("cpu_hz", -1.0), ("kappa", -1.0),
                                        ("backhaul_rate_bps", 0.0), ("cpu_spread", 1.0)])
def test_bad_clock_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"clock\\.{key}"):
        validate_channel(ChannelSection(), dataclasses.replace(ClockSection(), **{key: value}))


def test_sections_load_through_the_config_builder():
    c = _build(ChannelSection, {"model": "ota", "alpha": 3, "psi_mode": "paper"}, "channel")
    assert c.alpha == 3.0 and isinstance(c.alpha, float)
    with pytest.raises(ConfigError, match="channel.bogus"):
        _build(ChannelSection, {"bogus": 1}, "channel")
    with pytest.raises(ConfigError, match="clock.cpu_spread"):
        _build(ClockSection, {"cpu_spread": 2.0}, "clock")
