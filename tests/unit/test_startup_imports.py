"""Start-up cost (issue 25): what a node's process imports before it listens. Every edge of a run is its own
process, so a heavy library on the edge's import path is paid once per edge at every launch."""
import json
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "scipy", "matplotlib")


def _loaded(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


@pytest.mark.parametrize("module,allowed", [("hfl.edge_server.service", ()),
                                            ("hfl.cloud_server.service", ("torch",)),
                                            ("hfl.device_client.host", ("torch",))])
def test_a_node_imports_no_heavy_library_it_does_not_use_at_launch(module, allowed):
    loaded = _loaded(module)
    assert "hfl" in loaded and "grpc" in loaded  # the probe saw the node's imports
    assert {h for h in HEAVY if h in loaded} == set(allowed)


def test_nearest_probability_is_expit_bit_for_bit():
    import numpy as np
    from scipy.special import expit

    from hfl.common.quantization.dpsq import nearest_probability

    eps = np.concatenate([np.linspace(0, 60, 20001), [1e-300, 1e-9, 709.0, 1e308, np.inf]])
    assert np.array_equal([nearest_probability(e) for e in eps], expit(eps))


def test_theory_expit_equals_scipy_expit():
    import numpy as np
    from scipy.special import expit

    from hfl.common.quantization import theory

    eps = np.concatenate([np.linspace(0, 60, 20001), [1e-300, 1e-9, 709.0, 1e308, np.inf]])
    assert np.allclose(theory.expit(eps), expit(eps), rtol=4e-16, atol=0)
    assert theory.expit(np.inf) == 1.0 and theory.expit(0.0) == 0.5


def _printed(code: str) -> str:
    """The last line `code` prints in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()[-1]


def test_a_run_without_privacy_loads_no_accountant_before_round_0():
    """The cloud wraps its round mode after the edges joined, before round 0: the privacy policy (dp_accounting,
    scipy: ~2 s of CPU) only for a private algorithm."""
    code = ("import sys; from hfl import families; from hfl.common import config, plans; "
            "from hfl.cloud_server.round_wrappers import wrap; "
            "cfg = config.load(None, []); assert not plans.is_private(cfg); mode = object(); "
            "assert wrap(mode, cfg, '.', [], {}, None, [10], []) is mode; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(_printed(code).split())
    assert "hfl" in loaded and not {"dp_accounting", "scipy"} & loaded


SMALL_SYNTHETIC = ["data.dataset=synthetic", "data.synthetic_samples=500"]


def test_the_launcher_checks_the_model_without_importing_torch():
    """`hfl run` validates the config (model names) and runs preflight's model check in a fork of the forkserver
    (node_spawn.call_forked): the launcher never imports torch (~2.5 s of CPU); the check learns what it did in
    process and still refuses a model that does not fit the data."""
    code = textwrap.dedent(f"""
        import json, sys
        from hfl import families
        from hfl.common import config
        from hfl.common.config import ConfigError
        from hfl.node_spawn import call_forked
        from hfl.preflight import preflight

        info = preflight(config.load(None, {SMALL_SYNTHETIC!r}), call_forked)
        try:
            preflight(config.load(None, {SMALL_SYNTHETIC!r} + ["data.synthetic_shape=[1, 2, 2]"]), call_forked)
            refused = None
        except ConfigError as exc:
            refused = str(exc)
        print(json.dumps({{"info": info, "refused": refused, "torch": "torch" in sys.modules}}))
        """)
    got = json.loads(_printed(code))
    assert got["torch"] is False
    assert "model.name = 'mnist-cnn' does not run on synthetic" in got["refused"]

    from hfl.common import config
    from hfl.preflight import preflight

    here = preflight(config.load(None, SMALL_SYNTHETIC))
    assert got["info"] == {**here, "input_shape": list(here["input_shape"])}
    assert here["parameters"] == 28938  # mnist-cnn on 1x28x28, 10 classes


def test_a_sweep_checks_its_runs_without_importing_torch(tmp_path):
    """`hfl sweep` checks every run (preflight, the model's forward pass once per data and model) in a fork of the
    forkserver its testbeds start from, as `hfl run` does: the sweep's own process never imports torch (1.2 s before
    its first run); a model that does not fit the data is still refused before any run starts."""
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\nseeds = [0]\n[base]\n"run.rounds" = 1\n"data.dataset" = "synthetic"\n'
                    '"data.synthetic_samples" = 500\n[grid]\n"data.synthetic_shape" = [[1, 28, 28], [1, 2, 2]]\n')
    code = textwrap.dedent(f"""
        import sys
        from hfl import sweep
        code = sweep.run_sweep({str(spec)!r}, out={str(tmp_path / "out")!r}, quiet=True)
        print(code, "torch" in sys.modules)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr[-2000:]
    assert "model.name = 'mnist-cnn' does not run on synthetic" in done.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("summary.json"))
