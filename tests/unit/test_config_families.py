"""Config sections and checks registered by the families (and plugins) rather than imported by the engine."""
from __future__ import annotations

import dataclasses
import tomllib

import pytest

from hfl.common import config as c


@pytest.fixture
def scratch_section():
    """Registers [scratch] (after [net]) and a check on it for one test, then takes both out again."""
    @dataclasses.dataclass(frozen=True)
    class ScratchSection:
        level: int = c.doc(3, "a level", min=0)
        mode: str = c.choice("a", ("a", "b"), "a mode")

    def check(cfg) -> None:
        if cfg.scratch.level > cfg.topology.edges:
            raise c.ConfigError(f"scratch.level = {cfg.scratch.level} exceeds topology.edges")

    c.register_section("scratch", ScratchSection, after="net")
    c.register_validator(check)
    yield ScratchSection
    c.SECTIONS._items.pop("scratch")
    c._FAMILY_ORDER.remove("scratch")
    c._VALIDATORS[:] = [v for v in c._VALIDATORS if v.check is not check]


def test_the_built_in_sections_keep_the_order_of_files_and_docs():
    assert [name for name, _ in c.sections()] == [
        "run", "topology", "data", "model", "train", "aggregation", "pipeline", "net", "privacy", "latency",
        "channel", "clock", "precision", "control", "observe"]
    assert list(c.to_dict(c.Config())) == [name for name, _ in c.sections()]


def test_the_families_checks_run_in_their_order_and_the_mode_check_after_the_plan():
    names = [(v.check.__module__.rsplit(".", 2)[-2:], v.check.__name__, v.after_plan) for v in c._VALIDATORS]
    assert names == [(["privacy", "config"], "validate_config", False),
                     (["quantization", "config"], "validate_latency", False),
                     (["quantization", "config"], "validate_precision", False),
                     (["control", "config"], "validate_control", False),
                     (["channel", "config"], "validate_sections", False),
                     (["channel", "config"], "validate_mode", True),
                     (["observe", "config"], "validate_observe", False)]


def test_a_registered_section_is_read_placed_checked_and_round_trips(scratch_section):
    order = [name for name, _ in c.sections()]
    assert order[order.index("net") + 1:order.index("net") + 4] == ["privacy", "scratch", "latency"]  # after net,
    # behind the section registered there before it
    cfg = c.from_dict({"scratch": {"level": 1, "mode": "b"}})
    assert cfg.scratch == scratch_section(level=1, mode="b")
    assert c.Config().scratch == scratch_section()
    assert c.from_dict(tomllib.loads(c.to_toml(cfg))) == cfg
    with pytest.raises(c.ConfigError, match="scratch.level = 7 exceeds topology.edges"):
        c.from_dict({"scratch": {"level": 7}})
    with pytest.raises(c.ConfigError, match=r"bad value for scratch.mode: 'c'; allowed: a, b"):
        c.from_dict({"scratch": {"mode": "c"}})
    with pytest.raises(c.ConfigError, match=r"scratch.level must be >= 0"):
        c.from_dict({"scratch": {"level": -1}})
    assert "| `scratch.mode` | `\"a\"` | a mode (one of: a, b) |" in c.reference()


def test_a_section_name_is_taken_once_and_never_the_engines():
    with pytest.raises(ValueError, match="already registered"):
        c.register_section("privacy", object)
    with pytest.raises(ValueError, match="engine's"):
        c.register_section("train", object)
    with pytest.raises(ValueError, match="already registered"):
        c.register_validator(c._VALIDATORS[0].check)


def test_an_unknown_section_names_the_registered_ones_and_where_they_come_from():
    with pytest.raises(AttributeError, match=r"no section 'nosuch'; registered: run, .*observe.*hfl\.families"):
        c.Config().nosuch
    with pytest.raises(c.ConfigError, match=r"unknown key 'nosuch'; allowed keys in the top level: run, topology"):
        c.from_dict({"nosuch": {}})
    from hfl.common.privacy.config import PrivacySection

    assert c.Config().privacy == PrivacySection()  # a family's section reads as an attribute


def test_replace_swaps_an_engine_or_a_family_section_and_refuses_an_unknown_one():
    import dataclasses

    import pytest

    from hfl.common import config

    cfg = config.load(None)
    got = cfg.replace(privacy=dataclasses.replace(cfg.privacy, clip=2.5), train=dataclasses.replace(cfg.train, lr=0.5))
    assert (got.privacy.clip, got.train.lr) == (2.5, 0.5)
    assert (cfg.privacy.clip, cfg.train.lr) != (2.5, 0.5)   # the original is untouched
    assert got.channel == cfg.channel
    with pytest.raises(AttributeError, match="no section 'nosuch'"):
        cfg.replace(nosuch=1)
