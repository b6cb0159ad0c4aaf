"""Start-up of a hand-started testbed: the cloud does not wait out net.join_timeout_s for an edge that registered and
then went away (its process exited) before the run started; it says which edges it waits for."""
import time

from hfl.testbed import Testbed

from .conftest import SMALL


def _wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"{what} within {timeout:.0f}s"
        time.sleep(0.1)
    return time.monotonic() - start


def test_the_cloud_stops_waiting_for_an_edge_that_went_away(tmp_path):
    tb = Testbed(overrides=SMALL + ["topology.host_layout=per_edge", "net.join_timeout_s=240", "net.rejoin_grace_s=3",
                                    "run.rounds=1", "data.max_test_samples=300"],
                 run_dir=tmp_path / "run", skip_hosts=["devices-001-0"])  # edge-001 waits for devices that never come
    tb.start()
    try:
        logs = tb.run_dir / "logs"
        _wait_for(lambda: "joined run" in (logs / "edge-001.log").read_text(), 120, "edge-001 registered")
        tb.kill("edge-001")  # gone before it ever fetched a round
        took = _wait_for(lambda: len(tb.metrics()) >= 1, 120, "the run started without edge-001 and did round 0")
        assert took < 120 < 240  # far less than net.join_timeout_s
        cloud = (logs / "cloud.log").read_text()
        assert "edge-001 registered, then went away" in cloud
        assert "starting without edges ['edge-001']" in cloud
        assert tb.metrics()[0]["edges"] == 1
    finally:
        tb.close()
