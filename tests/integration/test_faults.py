"""kill -9 of a device host, an edge or the cloud, with and without a restart, on real processes.

Training in a round is a pure function of (global model, seed, device, round, step), so a node that
comes back within `net.rejoin_grace_s` lets its round be redone and the run ends with exactly the
metrics of an uninterrupted run with the same seed.
"""
import json
import os
import signal
import subprocess
import sys
import time

import grpc
import psutil
import pytest

from hfl.common import session
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .conftest import SMALL
from .mitm import Act, Tamper, Unary, until
from .rawclient import wait_serving

SMALL = SMALL + ["topology.host_layout=per_edge"]  # these tests kill and read device hosts by per-edge name

# a restarted host must be back within the grace: 40 s was too short for a host start-up at load 15-20 (seen under
# two xdist workers beside sweeps); the grace only bounds a wait, a member that comes back restarts the round at once
FAULTS = SMALL + ["run.rounds=4", "topology.hosts_per_edge=2", "net.rejoin_grace_s=120", "net.phase_timeout_s=60"]


def key(rows):
    return [(r["round"], r["accuracy"], r["loss"], r["train_loss"]) for r in rows]


@pytest.fixture(scope="module")
def clean_rows(tmp_path_factory):
    from hfl.testbed import Testbed

    with Testbed(overrides=FAULTS, run_dir=tmp_path_factory.mktemp("clean")) as tb:
        tb.wait(timeout=300)
        return tb.metrics()


def wait_rows(tb, n, timeout=120):
    deadline = time.monotonic() + timeout
    while len(tb.metrics()) < n:
        assert time.monotonic() < deadline, "run did not progress"
        tb.check()
        time.sleep(0.05)


def test_edge_killed_and_restarted_gives_the_clean_metrics(hfl_testbed, clean_rows):
    tb = hfl_testbed(overrides=FAULTS)
    wait_rows(tb, 1)
    tb.kill("edge-001")
    killed = time.monotonic()
    cloud_log = tb.run_dir / "logs" / "cloud.log"
    while "lost edge-001" not in cloud_log.read_text():
        assert time.monotonic() - killed < 5, "the cloud did not notice the dead edge within 5 s"
        time.sleep(0.05)
    tb.restart("edge-001")
    tb.wait(timeout=300)
    assert key(tb.metrics()) == key(clean_rows)
    edge_log = (tb.run_dir / "logs" / "edge-001.log").read_text()
    assert "registered again with the cloud" in edge_log or "rejoin" in edge_log
    hosts = (tb.run_dir / "logs" / "devices-001-0.log").read_text()
    assert "reconnecting" in hosts and "registered again with its edge" in hosts


def test_cloud_killed_and_resumed_gives_the_clean_metrics(hfl_testbed, clean_rows):
    tb = hfl_testbed(overrides=FAULTS)
    wait_rows(tb, 2)
    tb.kill("cloud")
    tb.restart("cloud", resume=True)
    tb.wait(timeout=300)
    rows = tb.metrics()
    assert key(rows) == key(clean_rows)
    assert [r["emulated_seconds"] for r in rows] == [r["emulated_seconds"] for r in clean_rows]  # the clock resumes too
    summary = tb.summary()
    assert summary["resumed"] is True and summary["rounds"] == 4
    assert len({r["round"] for r in rows}) == len(rows) == 4  # no round twice, none missing


def lose_a_register_reply(hfl_testbed, overrides, renonce: bool):
    """Edge-000's round-1 Submit is lost on the way, so the edge drops its session and registers again; once the cloud
    has seen that session's presence end, it handles the new Register (it holds a new session, and no presence stream
    comes for it) but its reply is lost too: the lockout the flaky resume test hit. `renonce`: every later Register is
    sent with a nonce of its own, as a party other than that session's. Returns the testbed and the Register replies
    (token, delivered) the edge's proxy saw, the lost one's index."""
    state, tb = {"failed": False, "lost": False}, None

    def edge(method, envelope):
        if method == "Submit" and envelope.meta.round == 1 and not state["failed"]:
            state["failed"] = True
            return Act(envelope, fail=grpc.StatusCode.UNAVAILABLE)
        return Act(envelope)

    def cloud_lost_the_edge() -> bool:
        return "lost edge-000: " in (tb.logs / "cloud.log").read_text()

    def unary(method, request):
        if method != "Register" or not state["failed"]:
            return Unary()
        if not state["lost"]:
            state["lost"] = True
            return Unary(hold=until(cloud_lost_the_edge, 60), lose_reply=True)
        if not renonce:
            return Unary()
        other = pb.RegisterRequest.FromString(request)
        other.nonce = session.new_nonce()
        return Unary(request=other.SerializeToString())

    with Tamper(edge, unary) as proxy:
        tb = hfl_testbed(overrides=overrides, via={"edge-000": proxy.address})
        proxy.upstream = tb.cloud_address
        tb.wait(timeout=300)
    assert state == {"failed": True, "lost": True}
    registers = [(pb.RegisterReply.FromString(reply).session_token, delivered)
                 for method, reply, delivered in proxy.replies if method == "Register"]
    lost = next(i for i, (_, delivered) in enumerate(registers) if not delivered)
    assert lost >= 1 and len(registers) == lost + 2, registers  # the join, the lost one, the one that let it back in
    assert registers[lost][0] != registers[0][0] and registers[lost + 1][1]
    assert "registered again with the cloud" in (tb.logs / "edge-000.log").read_text()
    return tb, registers, lost


def test_a_register_whose_reply_was_lost_is_retried_into_the_same_session(hfl_testbed, clean_rows):
    """The edge's retry carries the same nonce, so the cloud hands it the session's token again instead of refusing
    it as already registered. The presence deadline is set past the run's end: only the nonce can let the edge in."""
    tb, registers, lost = lose_a_register_reply(hfl_testbed, FAULTS + ["net.presence_deadline_s=3600"], renonce=False)
    assert registers[lost + 1][0] == registers[lost][0]
    cloud = (tb.logs / "cloud.log").read_text()
    assert "already_registered" not in cloud and "edge-000 rejoined during round 1" in cloud
    assert key(tb.metrics()) == key(clean_rows)


def test_a_session_that_no_presence_stream_holds_ends_at_the_presence_deadline(hfl_testbed, clean_rows):
    """Registers with other nonces are refused while the session of the lost reply lives; no presence stream comes for
    it, so it ends after net.presence_deadline_s and the next Register opens a new session."""
    tb, registers, lost = lose_a_register_reply(hfl_testbed, FAULTS + ["net.presence_deadline_s=5"], renonce=True)
    assert registers[lost + 1][0] != registers[lost][0]
    cloud = (tb.logs / "cloud.log").read_text()
    assert "lost edge-000: no presence stream within 5s of its registration" in cloud
    assert cloud.count("refused already_registered from ") >= 1
    assert key(tb.metrics()) == key(clean_rows)


def test_device_host_killed_and_restarted_gives_the_clean_metrics(hfl_testbed, clean_rows):
    tb = hfl_testbed(overrides=FAULTS)
    wait_rows(tb, 1)
    tb.kill("devices-000-1")
    time.sleep(0.5)
    tb.restart("devices-000-1")
    tb.wait(timeout=300)
    rows = tb.metrics()
    assert key(rows) == key(clean_rows)
    assert sum(r["rejoined_devices"] for r in rows) >= 1


def test_device_host_killed_for_good_the_run_goes_on(hfl_testbed):
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=4", "topology.hosts_per_edge=3", "net.rejoin_grace_s=2"])
    rows = []
    for row in tb.iter_metrics(timeout=300):
        rows.append(row)
        if len(rows) == 1:
            tb.kill("devices-001-2")
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 4
    assert rows[0]["devices"] == 6 and rows[-1]["devices"] == 5 and rows[-1]["dropped_devices"] == 1
    assert "dropping dev-00005" in (tb.run_dir / "logs" / "edge-001.log").read_text()


def test_a_cloud_resumed_after_its_last_round_tells_the_returning_edges_that_the_run_ended(hfl_testbed):
    """The cloud crashed after its last checkpoint, before its summary: resumed, it has no round left to run. Its
    edges, back a moment later, must still be told that the run ended (or they dial a cloud that is gone for
    ever): the cloud waits for them as for edges lost within their grace."""
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=2"])
    tb.wait(timeout=300)
    (tb.run_dir / "summary.json").unlink()
    tb.restart("cloud", resume=True)
    with grpc.insecure_channel(tb.cloud_address) as chan:  # SERVING: its (empty) loop has begun before anyone is back
        wait_serving(chan, what="the resumed cloud")
    for name in [n for n in tb.nodes if n != "cloud"]:
        tb.restart(name)
    started = time.monotonic()
    summary = tb.wait(timeout=300)
    assert time.monotonic() - started < 30
    assert summary["rounds"] == 2 and summary["resumed"] is True
    cloud = (tb.run_dir / "logs" / "cloud.log").read_text()
    assert "edges that did not collect the final task" not in cloud.split("resuming run")[-1]


def test_edge_killed_for_good_the_run_goes_on_and_its_hosts_are_stopped_at_the_end(hfl_testbed):
    """An edge that never comes back: the run goes on with the other edge, and its device host (whose devices only
    their edge could tell that the run ended) is stopped once everything else has ended: named in the summary, not a
    failure, no 30 s wait."""
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=4", "net.rejoin_grace_s=2"])
    rows = []
    for row in tb.iter_metrics(timeout=300):
        rows.append(row)
        if len(rows) == 1:
            tb.kill("edge-001")
    started = time.monotonic()
    summary = tb.wait(timeout=300)
    assert time.monotonic() - started < 25
    assert summary["rounds"] == 4 and summary["stopped_device_hosts"] == ["devices-001-0"]
    assert rows[0]["edges"] == 2 and rows[-1]["edges"] == 1 and rows[-1]["devices"] == 3
    assert tb.failures() == [] and tb.deaths() == []


@pytest.mark.parametrize("clip", ["identity", "clip_l2"])
def test_a_diverging_device_sits_out_and_its_host_survives(hfl_testbed, clip):
    # lr = 1e30 makes every local model non-finite: each device sends nothing, withdraws from the round and goes
    # on (no barrier waits for net.phase_timeout_s); a clip stage, which refuses non-finite input, changes nothing.
    # (A non-finite upload that does reach an edge is refused: test_bad_input.)
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=2", "train.tau=1", "train.lr=1e30", "net.phase_timeout_s=120",
                                        f"pipeline.clip={clip}", "pipeline.params.clip_l2.clip=1.0"])
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    assert summary["rounds"] == 2 and all(n.returncode() == 0 for n in tb.nodes.values())
    assert all(r["devices"] == 0 and r["dropped_devices"] == 6 for r in rows), rows
    logs = "".join((tb.logs / f"{name}.log").read_text() for name in tb.device_hosts())
    assert logs.count("local training diverged") == 6 * 2 and "diverged rounds: " in logs
    assert "it withdrew" in (tb.logs / "edge-000.log").read_text()
    assert all(r["round_seconds"] < 60 for r in rows)


def test_exchange_before_the_edge_joined_is_unavailable(tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "edge", "--id", "edge-000", "--listen", "127.0.0.1:0",
                             "--cloud", "127.0.0.1:9", "--port-file", str(port_file), "--wait", "30"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text().strip()}") as chan:
            stub = pbg.EdgeServiceStub(chan)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Exchange(iter([pb.Chunk(data=b"")]), timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.RpcError) as err:
                stub.Register(pb.RegisterRequest(node_id="dev-00000", num_samples=1), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.kill()
        proc.wait()


def _hfl_run(tmp_path, *extra):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "run", "--quiet", "--out", str(out), *extra,
                             *[f"--set={o}" for o in SMALL + ["run.rounds=4", "topology.hosts_per_edge=2",
                                                              "net.rejoin_grace_s=2"]]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    victim = None
    while victim is None:
        assert time.monotonic() < deadline and proc.poll() is None
        rows = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        if rows:
            victim = next((c for c in me.children(recursive=True) if "--host-index" in c.cmdline() and
                           c.cmdline()[c.cmdline().index("--host-index") + 1] == "1"), None)
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    return proc.returncode, json.loads((out / "summary.json").read_text()), stderr


def test_hfl_run_goes_on_when_a_device_host_dies_and_records_it(tmp_path):
    code, summary, stderr = _hfl_run(tmp_path)
    assert code == 1, stderr[-2000:]
    assert summary["rounds"] == 4
    deaths = summary["node_deaths"]
    assert len(deaths) == 1 and deaths[0]["node"].endswith("-1") and deaths[0]["exit_status"] == -9
    assert deaths[0]["seconds_after_launch"] > 0 and "log_tail" in deaths[0]
    assert "node death" in stderr


def test_hfl_run_allow_deaths_exits_zero(tmp_path):
    code, summary, stderr = _hfl_run(tmp_path, "--allow-deaths")
    assert code == 0, stderr[-2000:]
    assert len(summary["node_deaths"]) == 1
