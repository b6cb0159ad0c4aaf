"""Values that used to fail only once a run was under way are config errors before any process starts."""
import pytest

from hfl import families  # noqa: F401
from hfl.common import config as config_mod
from hfl.preflight import check_aggregator


def test_an_aggregators_bad_parameter_fails_before_launch():
    bad = config_mod.load(None, ["pipeline.aggregate=trimmed_mean", "pipeline.params.trimmed_mean.beta=0.7"])
    with pytest.raises(config_mod.ConfigError, match=r"pipeline.aggregate = 'trimmed_mean'.*beta must be in \[0, 0.5\)"):
        check_aggregator(bad)
    check_aggregator(config_mod.load(None, ["pipeline.aggregate=trimmed_mean", "pipeline.params.trimmed_mean.beta=0.2"]))
    check_aggregator(config_mod.load(None, []))


@pytest.mark.parametrize("listen", ["abc", "127.0.0.1:", "127.0.0.1:99999", ":8780", "host:port"])
def test_a_bad_observe_listen_is_a_config_error(listen):
    with pytest.raises(config_mod.ConfigError, match="observe.listen"):
        config_mod.load(None, [f"observe.listen={listen}"])


def test_good_observe_listens_pass():
    for listen in ("", "127.0.0.1:8780", "0.0.0.0:0", "[::1]:8780", "localhost:9000"):
        assert config_mod.load(None, [f"observe.listen={listen}"]).observe.listen == listen


def test_a_stages_bad_parameter_fails_before_launch():
    import pathlib

    from hfl.preflight import check_stages

    plugin = str(pathlib.Path(__file__).parents[2] / "examples" / "tiny_plugin.py")
    bad = config_mod.load(None, [f'run.plugins=["{plugin}"]', "pipeline.clip=clip_linf",
                                 "pipeline.params.clip_linf.bound=-1"])
    with pytest.raises(config_mod.ConfigError, match=r"pipeline.clip = 'clip_linf'.*bound must be > 0"):
        check_stages(bad)
    check_stages(config_mod.load(None, [f'run.plugins=["{plugin}"]', "pipeline.clip=clip_linf",
                                        "pipeline.params.clip_linf.bound=2"]))
