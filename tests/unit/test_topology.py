from types import SimpleNamespace

import pytest

from hfl.common import config, topology


def members(edges, per_edge):
    cfg = SimpleNamespace(topology=SimpleNamespace(devices_per_edge=per_edge))
    return [topology.edge_members(cfg, e) for e in range(edges)]


def test_edge_groups_are_one_per_edge_or_contiguous_balanced_groups():
    def groups(edges, processes):
        return topology.edge_groups(SimpleNamespace(topology=SimpleNamespace(edges=edges, edge_processes=processes)))

    assert groups(3, 0) == [["edge-000"], ["edge-001"], ["edge-002"]]
    assert groups(5, 2) == [["edge-000", "edge-001"], ["edge-002", "edge-003", "edge-004"]]
    assert groups(2, 9) == [["edge-000"], ["edge-001"]]  # never more processes than edges
    assert [len(g) for g in groups(20, 2)] == [10, 10]


def test_union_slice_is_contiguous_balanced_and_covers_every_device_once():
    lists = members(20, 500)
    for hosts in (1, 2, 3, 7):
        shares = [topology.union_slice(lists, h, hosts) for h in range(hosts)]
        assert [d for s in shares for d in s] == [topology.device_id(i) for i in range(10_000)]
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        for s in shares:  # contiguous: one certificate range
            idx = [topology.device_index(d) for d in s]
            assert idx == list(range(idx[0], idx[0] + len(idx)))


def test_union_slice_ignores_edge_order_and_matches_host_slice_for_one_edge():
    lists = members(3, 4)
    assert topology.union_slice(lists[::-1], 1, 2) == topology.union_slice(lists, 1, 2)
    for h in range(3):
        assert topology.union_slice(lists[1:2], h, 3) == topology.host_slice(lists[1], h, 3)
    assert topology.union_slice(members(2, 3), 1, 3) == ["dev-00002", "dev-00003"]  # spans both edges
    with pytest.raises(ValueError):
        topology.union_slice(lists, 2, 2)


def test_host_count_per_layout():
    cfg = config.load(None, ["topology.edges=10", "topology.devices_per_edge=10", "topology.hosts_per_edge=2"])
    assert cfg.topology.host_layout == "per_core"
    assert topology.host_count(cfg, cpus=2) == 2
    assert topology.host_count(cfg, cpus=500) == 100  # never more hosts than devices
    per_edge = config.load(None, ["topology.edges=10", "topology.hosts_per_edge=2", "topology.host_layout=per_edge"])
    assert topology.host_count(per_edge) == 20
    fixed = config.load(None, ["topology.device_hosts=3"])
    assert topology.host_count(fixed, cpus=2) == 3
