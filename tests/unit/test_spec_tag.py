"""The run's spec as a device host receives it from its edge: checked against the cloud's tag (common/relay_tag.py)."""
import json

import pytest

from hfl.common import relay_tag
from hfl.common.config_error import ConfigError

SPEC = {"config": {"train": {"lr": 0.05}}, "model_dim": 10, "samples": [3, 4]}


def test_the_cloud_tags_the_spec_and_a_host_with_the_secret_checks_it():
    signed = relay_tag.sign_spec(b"secret", "run-1", SPEC)
    assert relay_tag.check_spec(b"secret", "run-1", signed, "edge-000") == SPEC
    altered = json.loads(signed)
    altered["config"]["train"]["lr"] = 50.0
    for run_id, text in [("run-1", json.dumps(altered)), ("run-2", signed), ("run-1", json.dumps(SPEC))]:
        with pytest.raises(ConfigError, match="edge-000"):
            relay_tag.check_spec(b"secret", run_id, text, "edge-000")
    with pytest.raises(ConfigError):
        relay_tag.check_spec(b"other", "run-1", signed, "edge-000")


def test_without_the_secret_nothing_is_tagged_or_checked():
    plain = relay_tag.sign_spec(None, "run-1", SPEC)
    assert json.loads(plain) == SPEC and relay_tag.check_spec(None, "run-1", plain, "edge-000") == SPEC
    assert relay_tag.check_spec(None, "run-1", relay_tag.sign_spec(b"s", "run-1", SPEC), "edge-000") == SPEC
