"""Which devices of a host share one fetch of their edge's round task (device_client/feed.py): those of one edge,
when one call's credentials cover them all; a device with its own certificate, or alone at its edge, fetches alone."""
from types import SimpleNamespace

from hfl.common.host_credentials import DeviceCredentials, SharedCredentials
from hfl.device_client import feed


def devices(*edges):
    return [SimpleNamespace(id=f"dev-{i:05d}", edge_id=e, run_id="r") for i, e in enumerate(edges)]


def test_a_host_shares_a_fetch_per_edge_only_where_its_credentials_cover_every_device():
    assert SharedCredentials.shared and not DeviceCredentials.shared
    host = devices("edge-000", "edge-000", "edge-000", "edge-001")
    shared = feed.feeds(host, "r", 1 << 20, shared=True)
    assert isinstance(shared["edge-000"], feed.RoundFeed) and [d.id for d in shared["edge-000"].devices] == \
        ["dev-00000", "dev-00001", "dev-00002"]
    assert isinstance(shared["edge-001"], feed.Alone)  # one device: nothing to share
    assert all(isinstance(f, feed.Alone) for f in feed.feeds(host, "r", 1 << 20, shared=False).values())


def test_a_device_that_stops_is_not_named_in_later_fetches():
    host = devices("edge-000", "edge-000")
    f = feed.feeds(host, "r", 1 << 20, shared=True)["edge-000"]
    f.leave(host[0])
    assert f.devices == [host[1]]
