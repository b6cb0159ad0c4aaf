"""Trust resolution, participation sampling and the [privacy] section's checks."""
import numpy as np
import pytest

from hfl.common.config import ConfigError, _build
from hfl.common.privacy.config import PrivacySection, validate_privacy
from hfl.common.privacy.trust import (TRUSTED, UNTRUSTED, effective_trust, noise_tier, resolve_trust,
                                      sample_participants, trusted_count)
from hfl.common.seeding import numpy_rng

EDGES = [f"edge-{i:03d}" for i in range(10)]


@pytest.mark.parametrize("p, expected", [(0.0, 0), (0.5, 5), (1.0, 10), (0.25, 3), (0.04, 0), (0.05, 1), (0.33, 3)])
def test_trusted_fraction_gives_exact_count(p, expected):
    levels = resolve_trust(EDGES, trusted_fraction=p, rng=numpy_rng(7, "cloud", 0, 0, "trust"))
    assert sum(w == TRUSTED for w in levels.values()) == expected == trusted_count(p, 10)
    assert sorted(levels) == EDGES


def test_trusted_fraction_is_seed_determined():
    draw = lambda seed: resolve_trust(list(reversed(EDGES)), trusted_fraction=0.5,  # noqa: E731
                                      rng=numpy_rng(seed, "cloud", 0, 0, "trust"))
    assert draw(3) == draw(3)  # and independent of the order the ids are listed in
    assert len({tuple(sorted(e for e, w in draw(s).items() if w == TRUSTED)) for s in range(20)}) > 5


def test_word_and_table():
    assert set(resolve_trust(EDGES, TRUSTED).values()) == {TRUSTED}
    levels = resolve_trust(EDGES, UNTRUSTED, table={"edge-003": TRUSTED})
    assert [e for e, w in levels.items() if w == TRUSTED] == ["edge-003"]
    assert resolve_trust(EDGES, {"edge-001": TRUSTED}) == {e: TRUSTED if e == "edge-001" else UNTRUSTED for e in EDGES}


@pytest.mark.parametrize("kwargs, message", [
    ({"trust": "maybe"}, "trust"),
    ({"table": {"edge-999": TRUSTED}}, "unknown edge"),
    ({"table": {"cloud": TRUSTED}}, "cloud is never trusted"),
    ({"table": {"edge-001": "yes"}}, "edge-001"),
    ({"trusted_fraction": 1.5, "rng": np.random.default_rng(0)}, "trusted_fraction"),
    ({"trusted_fraction": 0.5}, "rng"),
    ({"trusted_fraction": 0.5, "rng": np.random.default_rng(0), "table": {"edge-001": TRUSTED}}, "not both"),
])
def test_resolve_trust_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_trust(EDGES, **kwargs)


def test_a_site_may_lower_but_never_raise_its_trust():
    assert effective_trust(TRUSTED, UNTRUSTED) == UNTRUSTED
    assert effective_trust(TRUSTED, None) == TRUSTED
    assert effective_trust(TRUSTED, "") == TRUSTED
    assert effective_trust(UNTRUSTED, TRUSTED) == UNTRUSTED
    assert effective_trust(UNTRUSTED, UNTRUSTED) == UNTRUSTED
    with pytest.raises(ValueError, match="claimed"):
        effective_trust(UNTRUSTED, "root")
    assert (noise_tier(TRUSTED), noise_tier(UNTRUSTED)) == ("edge", "device")


def test_sample_participants_uniform_without_replacement():
    members = [f"dev-{i:05d}" for i in range(5)]
    picks = [sample_participants(members, 2, numpy_rng(1, "cloud", 0, k, "participants")) for k in range(5000)]
    assert all(len(set(p)) == 2 and list(p) == sorted(p) for p in picks)
    freq = np.array([sum(m in p for p in picks) for m in members]) / 5000
    # each device is picked with probability 2/5; binomial SE sqrt(0.4*0.6/5000) = 0.0069, 0.035 is ~5 SE
    np.testing.assert_allclose(freq, 0.4, atol=0.035)
    assert sample_participants(members, 2, numpy_rng(1, "cloud", 0, 3, "participants")) == picks[3]
    with pytest.raises(ValueError, match="count"):
        sample_participants(members, 6, np.random.default_rng(0))


def section(**kw):
    return _build(PrivacySection, kw, "privacy")


def test_section_defaults_and_toml_table():
    s = section(enabled=True, trust_table={"edge-000": "trusted"}, calibration="paper", c2=0.5)
    assert s.trust == UNTRUSTED and s.trust_table == {"edge-000": "trusted"} and s.calibration == "paper"
    assert PrivacySection().enabled is False and PrivacySection().calibration == "sound"
    validate_privacy(s, EDGES)
    validate_privacy(section(enabled=True, placement="aggregator", trust="trusted"), EDGES)
    validate_privacy(section(enabled=True, placement="aggregator", trusted_fraction=1.0), EDGES)


@pytest.mark.parametrize("kw, key", [
    ({"epsilon": 0.0}, "privacy.epsilon"),
    ({"epsilon": -1.0}, "privacy.epsilon"),
    ({"delta": 0.0}, "privacy.delta"),
    ({"delta": 1.0}, "privacy.delta"),
    ({"clip": -0.1}, "privacy.clip"),
    ({"trust_table": {"edge-042": "trusted"}}, "privacy.trust_table"),
    ({"trust_table": {"edge-001": "sort of"}}, "privacy.trust_table.edge-001"),
    ({"trusted_fraction": 1.2}, "privacy.trusted_fraction"),
    ({"trusted_fraction": -0.5}, "privacy.trusted_fraction"),
    ({"trusted_fraction": 0.5, "trust_table": {"edge-001": "trusted"}}, "privacy.trusted_fraction"),
    ({"client_rate": 0.0}, "privacy.client_rate"),
    ({"calibration": "noise_multiplier", "noise_multiplier": 0.0}, "privacy.noise_multiplier"),
    ({"enabled": True, "placement": "aggregator"}, "user-level DP needs a trusted aggregator"),
    ({"enabled": True, "placement": "aggregator", "trusted_fraction": 0.0}, "user-level DP needs a trusted aggregator"),
])
def test_validation_names_the_key(kw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_privacy(section(**kw), EDGES)


def test_dp_fedavg_by_algorithm_name_needs_trust():
    with pytest.raises(ConfigError, match="trusted aggregator"):
        validate_privacy(section(enabled=True), EDGES, algorithm="dp-fedavg")
    validate_privacy(section(enabled=True), EDGES, algorithm="h2fdp")  # HFL-DP: devices add the noise


@pytest.mark.parametrize("algorithm", ["hfl-dp", "pedpfl-style"])
def test_fixed_trust_algorithms_refuse_a_trust_setting(algorithm):
    from hfl.common.config import load

    edges = ["topology.edges=1"] if algorithm == "pedpfl-style" else []
    with pytest.raises(ConfigError, match=r"privacy\.trusted_fraction = 1\.0: .* fixes every edge's trust"):
        load(overrides=[f"run.algorithm={algorithm}", "privacy.trusted_fraction=1.0"] + edges)
    assert load(overrides=[f"run.algorithm={algorithm}", "train.tau=10"] + edges).run.algorithm == algorithm
