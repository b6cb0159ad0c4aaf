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


def test_a_sweeps_runs_pay_the_model_check_once_and_the_partition_check_each():
    """The forward pass is remembered per (data, model, plugins): runs of other seeds or topologies reuse it, while
    each seed's partition is still checked (a seed whose partition fails is refused)."""
    from hfl import preflight as pf
    from hfl.node_spawn import call_here

    calls = []

    def counting(fn, *args):
        calls.append(fn.__name__)
        return call_here(fn, *args)

    pf._checked.clear(), pf._models.clear()
    base = ["data.dataset=synthetic", "data.synthetic_samples=400", "model.name=linear"]
    infos = [pf.preflight(config_mod.load(None, base + [f"run.seed={s}"]), counting) for s in range(3)]
    pf.preflight(config_mod.load(None, base + ["topology.edges=4"]), counting)
    assert calls == ["model_outputs"] and infos[0] == infos[2]
    pf.preflight(config_mod.load(None, base[:2] + ["model.name=mlp"]), counting)
    assert calls == ["model_outputs", "model_outputs"]  # another model: checked again
    with pytest.raises(config_mod.ConfigError, match="data.partition"):
        pf.preflight(config_mod.load(None, base + ["run.seed=7", "data.partition=classes", "data.classes_per_device=11"]),
                     counting)
