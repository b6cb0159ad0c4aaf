"""Device hosts per core and per edge: the same seed gives the same per-round metrics."""
from .conftest import SMALL

LAYOUT = SMALL + ["data.partition=dirichlet"]


def key(rows):
    return [(r["round"], r["accuracy"], r["loss"], r["train_loss"]) for r in rows]


def test_per_core_and_per_edge_hosts_give_the_same_metrics(hfl_testbed):
    per_edge = hfl_testbed(overrides=LAYOUT + ["topology.host_layout=per_edge", "topology.hosts_per_edge=2"])
    per_edge.wait(timeout=300)
    assert sorted(per_edge.device_hosts()) == ["devices-000-0", "devices-000-1", "devices-001-0", "devices-001-1"]
    # 6 devices over 3 processes: devices-c1 emulates dev-00002 (edge-000) and dev-00003 (edge-001)
    per_core = hfl_testbed(overrides=LAYOUT + ["topology.host_layout=per_core", "topology.device_hosts=3"])
    per_core.wait(timeout=300)
    assert sorted(per_core.device_hosts()) == ["devices-c0", "devices-c1", "devices-c2"]
    assert "2 devices (dev-00002..dev-00003) of 2 edge(s)" in (per_core.run_dir / "logs" / "devices-c1.log").read_text()
    rows = per_core.metrics()
    assert len(rows) == 3 and all(r["devices"] == 6 and r["refused"] == 0 for r in rows)
    assert key(rows) == key(per_edge.metrics())
