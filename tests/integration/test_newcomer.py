"""Mistakes a newcomer makes get a clear line, never a silently wrong result: plugin data checked in every process,
an honest --resume, the role commands' arguments checked before anything is dialled."""
import json
import subprocess
import sys
import textwrap
import time

from .conftest import SMALL

PLUGIN = textwrap.dedent('''
    import numpy as np

    from hfl.common.data import DATASETS, Dataset


    @DATASETS.register("{name}")
    def make(cfg) -> Dataset:
        rng = {rng}
        x = rng.integers(0, 256, size=(120, 1, 8, 8)).astype({dtype})
        y = np.arange(120) % 4
        return Dataset("{name}", x[20:], y[20:], x[:20], y[:20], 4, (0.5,), (0.25,))
''')


def hfl(*args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, "-m", "hfl.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def _plugin(tmp_path, name, rng, dtype="np.uint8"):
    path = tmp_path / f"{name}_plugin.py"
    path.write_text(PLUGIN.format(name=name, rng=rng, dtype=dtype))
    return str(path)


def _sets(*extra):
    return [a for s in [*SMALL, "run.rounds=1", "model.name=mlp", *extra] for a in ("--set", s)]


def test_float_features_are_refused_before_launch(tmp_path):
    plugin = _plugin(tmp_path, "floaty", "np.random.default_rng(0)", "np.float32")
    result = hfl("run", *_sets(f'run.plugins=["{plugin}"]', "data.dataset=floaty"), "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and "x_train is float32" in result.stderr and "Traceback" not in result.stderr, \
        result.stderr[-2000:]
    assert not (tmp_path / "r" / "logs").exists()  # no process started


def test_a_dataset_that_differs_between_processes_is_refused(tmp_path):
    plugin = _plugin(tmp_path, "unseeded", "np.random.default_rng()")  # a new draw in every process
    start = time.monotonic()
    result = hfl("run", *_sets(f'run.plugins=["{plugin}"]', "data.dataset=unseeded"), "--out", str(tmp_path / "r"))
    assert result.returncode != 0 and "differs here from the cloud's" in result.stdout + result.stderr, \
        (result.stdout + result.stderr)[-3000:]
    assert "seed it" in result.stdout + result.stderr and time.monotonic() - start < 200
    assert not (tmp_path / "r" / "summary.json").exists()


def test_a_seeded_plugin_dataset_runs(tmp_path):
    plugin = _plugin(tmp_path, "seeded", "np.random.default_rng(7)")
    result = hfl("run", *_sets(f'run.plugins=["{plugin}"]', "data.dataset=seeded"), "--out", str(tmp_path / "r"),
                 "--quiet")
    assert result.returncode == 0, result.stderr[-2000:]


def test_resume_refuses_changes_but_takes_more_rounds(tmp_path):
    out = tmp_path / "run"
    first = hfl("run", *_sets(), "--out", str(out), "--quiet")
    assert first.returncode == 0, first.stderr[-2000:]
    (out / "summary.json").unlink()  # as if it had stopped after its checkpoint
    refused = hfl("run", "--resume", str(out), "--set", "train.lr=0.5")
    assert refused.returncode == 2 and "--set train.lr=0.5 is refused" in refused.stderr
    assert hfl("run", "deploy/configs/default.toml", "--resume", str(out)).returncode == 2
    fewer = hfl("run", "--resume", str(out), "--set", "run.rounds=0")
    assert fewer.returncode == 2
    more = hfl("run", "--resume", str(out), "--set", "run.rounds=2", "--quiet")
    assert more.returncode == 0 and "run.rounds 1 -> 2" in more.stderr, more.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["rounds_extended"] == {"from": 1, "to": 2}


def test_role_commands_check_their_arguments_before_dialling(tmp_path):
    start = time.monotonic()
    result = hfl("devices", "--edge", "127.0.0.1:1", "--host-index", "5", "--hosts", "2", "--wait", "60")
    assert result.returncode != 0 and "--host-index 5 with --hosts 2" in result.stderr
    assert "not there yet" not in result.stderr and time.monotonic() - start < 30
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = hfl("run", "--out", str(afile), "--set", "run.rounds=1")
    assert result.returncode == 2 and "is a file" in result.stderr and "Traceback" not in result.stderr


def test_role_commands_fail_in_one_line(hfl_testbed, tmp_path):
    """A port in use, and an edge id the cloud already serves: one line each, no traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = hfl("cloud", "--listen", f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "c"))
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}: the port is in use" in result.stderr
    assert "Traceback" not in result.stderr
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=30"])
    next(tb.iter_metrics(timeout=300))
    twin = hfl("edge", "--id", "edge-000", "--listen", "127.0.0.1:0", "--cloud", tb.cloud_address, "--wait", "30")
    assert twin.returncode != 0 and "ALREADY_EXISTS" in twin.stderr and "Traceback" not in twin.stderr, \
        twin.stderr[-2000:]


def test_epsilon_per_party_equals_dp_accounting_on_the_ledger(hfl_testbed):
    """H2FDP with half of the edges trusted: privacy.json gives, per cluster, the epsilon against the cloud, its edge
    and outsiders; recomputed here from privacy_ledger.jsonl with dp_accounting directly."""
    import math

    import dp_accounting
    from dp_accounting import rdp

    tb = hfl_testbed(config="deploy/configs/h2fdp-p05.toml",
                     overrides=["topology.edges=4", "topology.devices_per_edge=2", "run.rounds=2", "train.tau=4",
                                "train.gamma=2", "privacy.epsilon=1000", "privacy.calibration=sound",
                                "data.max_test_samples=200"])
    summary = tb.wait(timeout=600)
    privacy = json.loads((tb.run_dir / "privacy.json").read_text())
    by_party = privacy["epsilon_by_party"]
    assert by_party == summary["privacy"]["epsilon_by_party"]
    delta = privacy["delta"]
    events = [e for line in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()
              for e in json.loads(line)["events"]]

    def direct(es):
        if not es:
            return math.inf
        acc = rdp.RdpAccountant()
        for e in es:
            event = dp_accounting.GaussianDpEvent(e["noise_multiplier"])
            if e.get("sampling_rate", 1.0) < 1:
                event = dp_accounting.PoissonSampledDpEvent(e["sampling_rate"], event)
            acc.compose(event, int(e.get("count", 1)))
        return acc.get_epsilon(delta)

    trust = privacy["trust"]
    assert set(trust.values()) == {"trusted", "untrusted"}
    for e in range(4):
        edge = f"edge-{e:03d}"
        devices = [f"dev-{2 * e + i:05d}" for i in range(2)]
        cover = {d: [x for x in events if d in x["covers"]] for d in devices}
        cloud = max(direct(cover[d]) for d in devices)
        at_edge = math.inf if trust[edge] == "trusted" else max(
            direct([x for x in cover[d] if x["tier"] in ("device", "device-sample")]) for d in devices)
        got = {k: math.inf if v == "inf" else v for k, v in by_party[edge].items()}
        assert math.isclose(got["cloud"], cloud, rel_tol=1e-6) and got["outsiders"] == got["cloud"], (edge, got)
        assert got["edge"] == at_edge if math.isinf(at_edge) else math.isclose(got["edge"], at_edge, rel_tol=1e-6)
