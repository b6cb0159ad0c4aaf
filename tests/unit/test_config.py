import pytest

from hfl.common import config as c


def test_defaults_and_overrides():
    cfg = c.load(None, ["train.lr=0.1", "run.name=abc", "data.samples_per_device=[5, 9]"])
    assert cfg.train.lr == 0.1 and cfg.run.name == "abc" and cfg.data.samples_per_device == (5, 9)
    assert cfg.num_devices == cfg.topology.edges * cfg.topology.devices_per_edge


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", "unknown key 'train.lrr'; allowed keys in [train]: lr,"),
    ("bogus.x=1", "unknown key 'bogus'"),
    ("train.local_unit=epoch", "bad value for train.local_unit: 'epoch'; allowed: steps, epochs"),
    ("model.name=resnet", "bad value for model.name: 'resnet'; allowed: cifar-cnn, "),
    ("run.algorithm=fedprox", "bad value for run.algorithm: 'fedprox'; allowed: dp-fedavg, dp-fedavg-wav, dp-sgd, dp-sgd-wav, dpsq-fl, dpsq-fl-fwo, dpsq-fl-fwo-cso, dyn-dp-fedavg, dyn-dp-sgd, fedavg, fedsgd, h2fdp, hfl-dp, hier-local-qsgd, hierfavg"),
    ("run.algorithm=fedsgd", "fedsgd runs in air mode, which needs channel.model = ota or orthogonal"),
    ("pipeline.clip=l2", "bad value for pipeline.clip: 'l2'; allowed:"),
    ("pipeline.uplink_encoding=int3", "allowed: dpsq, float16, float32, laplace-sq, qsgd, sq"),
    ("train.batch_size=0", "train.batch_size must be >= 1"),
    ("run.rounds=1.5", "run.rounds must be an integer"),
    ("data.samples_per_device=[1]", "must be a list of 2 values"),
    ("train", "--set expects section.key=value"),
])
def test_bad_input_names_the_key(override, message):
    with pytest.raises(c.ConfigError) as err:
        c.load(None, [override])
    assert message in str(err.value)


def test_toml_round_trip(tmp_path):
    cfg = c.load(None, ["run.rounds=3", "topology.edges=4", "pipeline.params.clip_l2.clip=1.5"])
    path = tmp_path / "x.toml"
    path.write_text(c.to_toml(cfg))
    again = c.load(path)
    assert again == cfg


def test_file_errors(tmp_path):
    with pytest.raises(c.ConfigError, match="not found"):
        c.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nrounds = 3")
    with pytest.raises(c.ConfigError, match="bad.toml"):
        c.load(bad)


def test_shipped_configs_load():
    import pathlib

    configs = sorted((pathlib.Path(__file__).parents[2] / "deploy" / "configs").glob("*.toml"))
    assert configs, "deploy/configs/*.toml must exist"
    for path in configs:
        c.load(path)


def test_reference_lists_every_key():
    text = c.reference()
    for key in ("run.seed", "train.tau", "pipeline.uplink_encoding", "net.chunk_kib"):
        assert f"`{key}`" in text


def _fresh_docgen(what: str) -> str:
    """`python -m hfl.docgen WHAT` in a fresh interpreter: a plugin that an earlier test imported into this process
    (tests/integration/test_plugins.py) would add its names to the registries' "one of" lists."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "hfl.docgen", what], capture_output=True, text=True, check=True,
                          env={k: v for k, v in __import__("os").environ.items() if k != "HFL_PLUGINS"}).stdout


def test_configuration_reference_is_current():
    import pathlib

    page = (pathlib.Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    assert page.rstrip("\n") == _fresh_docgen("configuration").rstrip("\n"), \
        "docs/configuration.md is stale: python -m hfl.docgen configuration > docs/configuration.md"


def test_default_toml_is_the_built_in_defaults():
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "deploy" / "configs" / "default.toml"
    assert path.read_text().rstrip("\n") == _fresh_docgen("default-config").rstrip("\n"), \
        "deploy/configs/default.toml is stale: python -m hfl.docgen default-config > deploy/configs/default.toml"
    assert c.load(path) == c.Config()


@pytest.mark.parametrize("overrides, message", [
    (["pipeline.uplink_encoding=qsgd", "pipeline.params.qsgd.s=4"], "allowed: levels"),
    (["run.algorithm=qhetfed", "pipeline.uplink_encoding=dpsq"], "epsilon1 is required"),
    (["pipeline.backhaul_encoding=sq", "pipeline.params.backhaul_encoding.levls=4"], "unknown parameter"),
    (["pipeline.params.qsdg.levels=4"], "no stage, codec, channel or aggregator is called 'qsdg'"),
    (["pipeline.clip=clip_l2"], "needs [pipeline.params.clip_l2] clip"),
    (["pipeline.aggregate=trimmed_mean", "pipeline.params.trimmed_mean.b=0.2"], "allowed: beta"),
    (["pipeline.uplink_channel=awgn", "pipeline.params.awgn.sigma=0.1"], "allowed: std"),
])
def test_stage_and_codec_parameters_are_checked_at_config_time(overrides, message):
    with pytest.raises(c.ConfigError) as err:
        c.load(None, overrides)
    assert message in str(err.value)


def test_good_stage_parameters_pass():
    cfg = c.load(None, ["pipeline.uplink_encoding=qsgd", "pipeline.params.qsgd.levels=4", "pipeline.clip=clip_l2",
                        "pipeline.params.clip_l2.clip=1.0", "pipeline.aggregate=trimmed_mean",
                        "pipeline.params.trimmed_mean.beta=0.2"])
    assert cfg.pipeline.params["qsgd"] == {"levels": 4}


def test_plugins_are_imported_before_names_are_checked(tmp_path, monkeypatch):
    (tmp_path / "my_hfl_plugin_mod.py").write_text(
        "from hfl.common.models import MODELS, mlp\nMODELS.register('my-plugin-mlp', mlp)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(c.ConfigError, match="bad value for model.name: 'my-plugin-mlp'"):
        c.load(None, ["model.name=my-plugin-mlp"])
    cfg = c.load(None, ["model.name=my-plugin-mlp", 'run.plugins=["my_hfl_plugin_mod"]'])
    assert cfg.run.plugins == ("my_hfl_plugin_mod",) and cfg.model.name == "my-plugin-mlp"


def test_plugin_errors_name_the_module(tmp_path, monkeypatch):
    (tmp_path / "broken_hfl_plugin_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(c.ConfigError, match="cannot import 'no_such_plugin_xyz'"):
        c.load(None, ['run.plugins=["no_such_plugin_xyz"]'])
    with pytest.raises(c.ConfigError, match="importing 'broken_hfl_plugin_mod' failed: RuntimeError: boom at import"):
        c.load(None, ['run.plugins=["broken_hfl_plugin_mod"]'])
    monkeypatch.setenv("HFL_PLUGINS", "no_such_plugin_xyz")
    with pytest.raises(c.ConfigError, match="cannot import 'no_such_plugin_xyz'"):
        c.load(None, [])
