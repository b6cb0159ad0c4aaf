"""Trust boundaries between the tiers, on real processes: no party makes another import code, a device host
registers its own device ids only, one insider cannot freeze the model, a forged relayed upload costs only itself,
and resumed state is checked like a message."""
import os
import threading
import subprocess
import sys
import time

import numpy as np
import pytest

from .conftest import SMALL

CANARY = os.path.join(os.path.dirname(__file__), "canary_plugin.py")


def _role(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hfl.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **(env or {})})


def _port(path, proc, timeout=120.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.05)
    return f"127.0.0.1:{path.read_text().strip()}"


def _refused(proc, timeout=120.0) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 2, out[-2000:]
    return out


def test_a_node_refuses_plugins_named_by_a_remote_spec(tmp_path):
    """The cloud's config names a plugin: an edge and a device host that were not given it refuse the run's spec with
    its name and never import it; an edge given it (--plugins) runs."""
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nplugins = ["{CANARY}"]\nrounds = 1\n[topology]\nedges = 1\ndevices_per_edge = 2\n')
    env = {"HFL_CANARY_DIR": str(canaries), "HFL_PLUGINS": ""}
    procs = []
    try:
        cloud = _role("cloud", str(config), "--listen", "127.0.0.1:0", "--run-dir", str(tmp_path / "run"),
                      "--port-file", str(tmp_path / "cloud.port"), env=env)
        procs.append(cloud)
        address = _port(tmp_path / "cloud.port", cloud)
        assert {p.name for p in canaries.iterdir()} == {str(cloud.pid)}  # the cloud's own config names it
        bare = _role("edge", "--id", "edge-000", "--listen", "127.0.0.1:0", "--cloud", address, "--wait", "60", env=env)
        procs.append(bare)
        out = _refused(bare)
        assert "names plugins this node did not load" in out and CANARY in out and "Traceback" not in out
        edge = _role("edge", "--id", "edge-000", "--listen", "127.0.0.1:0", "--cloud", address, "--wait", "60",
                     "--port-file", str(tmp_path / "edge.port"), "--plugins", CANARY, env=env)
        procs.append(edge)
        edge_address = _port(tmp_path / "edge.port", edge)
        host = _role("devices", "--edge", edge_address, "--wait", "60", env=env)  # the edge's spec names it too
        procs.append(host)
        out = _refused(host)
        assert "names plugins this node did not load" in out and CANARY in out and "Traceback" not in out
        assert {p.name for p in canaries.iterdir()} == {str(cloud.pid), str(edge.pid)}
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


class HeldSubmit:
    """A proxy's rule for an edge: its first Submit of `round_` waits on the way until `release` is set."""

    def __init__(self, round_: int):

        self.round, self.release, self.envelope = round_, threading.Event(), None

    def tamper(self, method, envelope):
        from .mitm import Act, until

        if method == "Submit" and envelope.meta.round == self.round and self.envelope is None:
            self.envelope = envelope
            return Act(envelope, hold=until(self.release.is_set, 300))
        return Act(envelope)

    def wait(self, tb, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while self.envelope is None:
            assert time.monotonic() < deadline, f"the edge never submitted round {self.round}"
            tb.check()
            time.sleep(0.05)


HOSTS2 = SMALL + ["topology.host_layout=per_edge", "topology.hosts_per_edge=2", "run.rounds=3"]


def test_a_device_host_cannot_register_another_hosts_device(hfl_testbed):
    """Every device host holds a credential for its own device ids only: host 1 of edge-000, holding its own valid
    token, cannot claim host 0's dev-00000 before host 0 starts; host 0 then registers it and the run ends."""
    import grpc

    from hfl.common import session

    from .mitm import Tamper
    from .rawclient import RawDevice

    with Tamper() as late:  # host 0 of edge-000 (dev-00000) waits in this proxy
        tb = hfl_testbed(overrides=HOSTS2, via={"devices-000-0": late.address})
        assert tb.host_ranges["devices-000-0"] == (0, 0) and tb.host_ranges["devices-000-1"] == (1, 2)
        insider = RawDevice(tb.edge_addresses[0], "dev-00000", insider=False)
        own = ((session.HOST_KEY, tb.host_token("devices-000-1")),)
        with pytest.raises(grpc.RpcError) as err:
            insider.stub.Register(insider_request(insider), metadata=own)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
        assert "dev-00001..dev-00002" in err.value.details() and "its own devices only" in err.value.details()
        insider.channel.close()
        late.upstream = tb.edge_addresses[0]
        summary = tb.wait(timeout=600)
    assert summary["rounds"] == 3 and all(r["devices"] == 6 for r in tb.metrics()) and not tb.deaths()


def insider_request(device):
    from hfl.proto import hfl_v1_pb2 as pb

    return pb.RegisterRequest(run_id=device.run_id, node_id=device.id, num_samples=device.num_samples)


def test_one_accepted_insider_cannot_freeze_the_global_model(hfl_testbed):
    """A device that registered as itself (the host's own credential) uploads deltas of 1e30 every round: its edge
    leaves them out (aggregation.max_member_ratio), the cloud installs every round and the model learns."""
    from hfl.common import wire

    from .mitm import Act, Tamper

    def scaled(method, envelope):
        if method == "Exchange" and envelope.meta.sender_id == "dev-00000" and envelope.tensors:
            tensor = envelope.tensors[0]
            vec = wire.decode_vector(tensor, len(tensor.data) // 4)
            del envelope.tensors[:]
            envelope.tensors.append(wire.encode(vec * np.float32(1e30) + np.float32(1e30), "float32", tensor.name))
        return Act(envelope)

    with Tamper(scaled) as proxy:
        tb = hfl_testbed(overrides=HOSTS2, via={"devices-000-0": proxy.address})
        proxy.upstream = tb.edge_addresses[0]
        summary = tb.wait(timeout=600)
    rows = tb.metrics()
    assert summary["aggregates_rejected"] == 0 and summary["rounds"] == 3, summary
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] and rows[-1]["accuracy"] > 0.5, [r["accuracy"] for r in rows]
    log = (tb.logs / "edge-000.log").read_text()
    left_out = log.count("refused outlier from dev-00000")  # each of its uploads, and no honest one
    assert left_out >= 3 and log.count("refused outlier from ") == left_out
    assert sum(r["refused"] for r in rows) == left_out


def test_one_forged_relayed_upload_costs_only_itself(hfl_testbed):
    """A relaying edge zeroes one device's reported distortion (FWO with the device's own estimate: it would take most
    of the fusion weight). The device's tag covers that record: the cloud refuses that upload alone and fuses the
    edge's other one in the same submit; the run goes on."""
    import json

    from .mitm import Act, Tamper
    from .test_hardening import RELAY, relayed

    def zero_first(i, upload):
        if i == 0:
            for t in upload.meta.transforms:
                if t.stage == "encode":
                    t.params["expected_distortion"] = 0.0
        return upload

    def edge(method, envelope):
        if method == "Submit" and envelope.meta.round == 0:
            return Act(relayed(envelope, zero_first))
        return Act(envelope)

    with Tamper(edge) as proxy:
        tb = hfl_testbed(overrides=RELAY + ["precision.distortion_estimate=device"], via={"edge-001": proxy.address})
        proxy.upstream = tb.cloud_address
        summary = tb.wait(timeout=600)
    rows = tb.metrics()
    assert proxy.sent_labels() == {} and summary["rounds"] == 3 and not tb.deaths()
    assert rows[0]["relay_refused"] == 1 and rows[0]["relay_missing"] == 1 and rows[0]["refused"] == 1
    assert [r["relay_refused"] for r in rows[1:]] == [0, 0] and summary["refused_by_reason_at_cloud"] == {"bad_relay_tag": 1}
    fused = [json.loads(x) for x in (tb.run_dir / "fusion.jsonl").read_text().splitlines()]
    round0 = sorted(x["device"] for x in fused if x["round"] == 0 and x["edge"] == "edge-001")
    assert round0 == ["dev-00003"]  # dev-00002's altered upload left out, its edge's other one fused
    assert all(np.isfinite(r["loss"]) for r in rows)


def test_resumed_state_is_checked_like_a_message(hfl_testbed):
    """A checkpoint of NaN or 1e30 weights, or of the wrong size, refuses the resume in one line (exit 2) and changes
    nothing; a pending result ten values short is discarded with its reason (edge-000's real result, held on the way
    while the cloud is down, then counts); the good checkpoint resumes and the run ends."""
    from hfl.proto import hfl_v1_pb2 as pb

    from .mitm import Tamper

    held = HeldSubmit(round_=1)

    with Tamper(held.tamper) as proxy:
        tb = hfl_testbed(overrides=SMALL + ["run.rounds=3", "net.rejoin_grace_s=60"], via={"edge-000": proxy.address})
        proxy.upstream = tb.cloud_address
        held.wait(tb)
        tb.kill("cloud")
        path = tb.run_dir / "checkpoint.npz"
        good = path.read_bytes()
        with np.load(path) as ckpt:
            saved = {k: ckpt[k] for k in ckpt.files}
        w = saved["weights"]
        assert int(saved["round"]) == 0
        for label, weights, says in [("nan", np.where(np.arange(w.size) == 3, np.nan, w).astype(np.float32),
                                      "non-finite"),
                                     ("1e30", np.full_like(w, 1e30), "aggregation.max_update_ratio"),
                                     ("short", w[:-10], "shape")]:
            np.savez(path, **{**saved, "weights": weights})
            before = path.read_bytes()
            log_before = (tb.logs / "cloud.log").read_text()
            node = tb.restart("cloud", resume=True)
            deadline = time.monotonic() + 120
            while node.returncode() is None:
                assert time.monotonic() < deadline, label
                time.sleep(0.05)
            log = (tb.logs / "cloud.log").read_text()[len(log_before):]
            assert node.returncode() == 2 and says in log and "--resume:" in log and "Traceback" not in log, (label, log)
            assert path.read_bytes() == before, label
            node.expected_exit = True
        path.write_bytes(good)
        folder = tb.run_dir / "pending" / "round-000001"
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "edge-000.npz", delta=np.zeros(w.size - 10, np.float32), devices=3, samples=1, scalars="{}",
                 run_id=str(saved["run_id"]), fused="[]",
                 transforms=np.frombuffer(pb.Meta().SerializeToString(), np.uint8))
        tb.restart("cloud", resume=True)
        held.release.set()
        summary = tb.wait(timeout=600)
    log = (tb.logs / "cloud.log").read_text()
    assert summary["rounds"] == 3 and "--resume: discarding" in log and "edge-000.npz" in log and "shape" in log
    assert all(np.isfinite(r["loss"]) and r["edges"] == 2 for r in tb.metrics())


def test_an_air_run_resumed_after_the_cloud_died_matches_the_uninterrupted_run(hfl_testbed, tmp_path_factory):
    """Over the air a device keeps its own estimate of the global model across rounds: a cloud killed in the middle
    of round 1 (every slot done, edge-000's submit of it held on the way) and resumed from its checkpoint re-runs the round
    from the same estimates, so the metrics equal a clean run's."""
    from .mitm import Tamper
    from .test_faults import key
    from .test_hardening import AIR, clean_run

    overrides = AIR + ["run.rounds=3", "net.rejoin_grace_s=60"]
    clean = clean_run(tmp_path_factory, overrides, "clean-air")
    held = HeldSubmit(round_=1)

    with Tamper(held.tamper) as proxy:
        tb = hfl_testbed(overrides=overrides, via={"edge-000": proxy.address})
        proxy.upstream = tb.cloud_address
        held.wait(tb)
        tb.kill("cloud")
        tb.restart("cloud", resume=True)
        held.release.set()
        summary = tb.wait(timeout=600)
    assert summary["resumed"] is True and summary["rounds"] == 3
    assert key(tb.metrics()) == key(clean.metrics())


def test_a_stopped_edge_exits_once_its_cloud_has_ended(hfl_testbed):
    """An edge stopped (SIGSTOP) mid-run costs the run its cluster only; continued after the cloud has ended, it finds
    no cloud and stops within its --wait instead of retrying for ever."""
    import signal

    from .test_faults import wait_rows

    tb = hfl_testbed(overrides=SMALL + ["run.rounds=3", "net.phase_timeout_s=5", "net.rejoin_grace_s=3",
                                        "net.presence_deadline_s=3"], extra_args={"edge": ["--wait", "8"]})
    wait_rows(tb, 1)
    edge = tb.node("edge-000")
    edge.expected_exit = True
    os.killpg(edge.proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 300
    while tb.nodes["cloud"].returncode() is None:
        assert time.monotonic() < deadline, "the run did not end without the stopped edge"
        time.sleep(0.2)
    assert tb.nodes["cloud"].returncode() == 0 and len(tb.metrics()) == 3
    assert edge.returncode() is None  # still stopped
    os.killpg(edge.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while edge.returncode() is None:
        assert time.monotonic() < deadline, "the continued edge went on retrying its ended cloud"
        time.sleep(0.2)
    log = (tb.logs / "edge-000.log").read_text()
    assert "unreachable for" in log and "it ended or died; stopping" in log and "Traceback" not in log
