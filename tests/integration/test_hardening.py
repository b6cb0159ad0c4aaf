"""Issue 24's six findings, replayed on real processes: one compromised device or edge (a Tamper proxy in front of an
honest node's upstream, holding the node's valid session; or a raw outsider) does what the finding describes, and
the run ends as a clean run of the same seed did, no node dies, and the hostile message is counted in `refused` with
its reason (in the refusing node's log, and at the cloud in summary.json's refused_by_reason_at_cloud).

The clean reference of each mode is one run shared by the tests of this module."""
import json

import pytest

from hfl.proto import hfl_v1_pb2 as pb

from .conftest import SMALL
from .mitm import Act, Tamper, until
from .test_faults import key, wait_rows

BASE = SMALL + ["topology.host_layout=per_edge", "topology.hosts_per_edge=1", "run.rounds=2",
                "net.phase_timeout_s=60", "net.rejoin_grace_s=5"]
DP = BASE + ["topology.devices_per_edge=2", "model.name=mlp", "run.algorithm=hfl-dp", "train.tau=5", "privacy.clip=1.0",
             "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=2", "privacy.epsilon=1e6",
             "privacy.noise_source=seeded"]  # seeded: a clean run of the same seed releases the same noise


def copy(envelope: pb.Envelope) -> pb.Envelope:
    out = pb.Envelope()
    out.CopyFrom(envelope)
    return out


def refusals_logged(tb, node: str, reason: str) -> int:
    return (tb.logs / f"{node}.log").read_text().count(f"refused {reason} from ")


def started(hfl_testbed, overrides, proxies: dict[str, Tamper], **kwargs):
    """A testbed whose nodes named in `proxies` dial their upstream through that proxy."""
    tb = hfl_testbed(overrides=overrides, via={name: p.address for name, p in proxies.items()}, **kwargs)
    for name, proxy in proxies.items():
        proxy.upstream = tb.cloud_address if name.startswith("edge-") else tb.edge_addresses[int(name.split("-")[1])]
    return tb


def clean_run(tmp_path_factory, overrides, name):
    from hfl.testbed import Testbed

    with Testbed(overrides=overrides, run_dir=tmp_path_factory.mktemp(name)) as tb:
        summary = tb.wait(timeout=600)
        return tb.metrics(), summary


@pytest.fixture(scope="module")
def clean_dp(tmp_path_factory):
    return clean_run(tmp_path_factory, DP, "clean-dp")


def with_z(envelope: pb.Envelope, z: float) -> pb.Envelope:
    out = copy(envelope)
    for t in out.meta.transforms:
        if t.stage == "dp_event":
            t.params["dp.noise_multiplier"] = z
    return out


def test_finding1_a_forged_dp_event_is_refused_at_the_edge_and_the_cloud(hfl_testbed, clean_dp, monkeypatch):
    """Finding 1: a device declaring z = 1e-300 (ZeroDivisionError in the accountant, cloud dead) or z = 1e-3 (a
    ledger charge of ~1e6 that stopped the run), and an edge rewriting its cluster's DP events the same way."""
    def device(method, envelope):
        m = envelope.meta
        if method == "Exchange" and m.sender_id == "dev-00000" and m.round == 0 and m.phase == "edge_model_sync":
            return Act(envelope, [("device z=1e-300", with_z(envelope, 1e-300)), ("device z=1e-3", with_z(envelope, 1e-3))])
        return Act(envelope)

    def edge(method, envelope):
        if method == "Submit" and envelope.meta.round == 0:
            return Act(envelope, [("edge z=1e-300", with_z(envelope, 1e-300)), ("edge z=1e-3", with_z(envelope, 1e-3))])
        return Act(envelope)

    with Tamper(device) as dev, Tamper(edge) as edg:
        tb = started(hfl_testbed, DP, {"devices-000-0": dev, "edge-001": edg})
        summary = tb.wait(timeout=600)
    clean_rows, clean_summary = clean_dp
    assert dev.sent_labels() == {"device z=1e-300": "INVALID_ARGUMENT", "device z=1e-3": "INVALID_ARGUMENT"}, dev.sent
    assert edg.sent_labels() == {"edge z=1e-300": "INVALID_ARGUMENT", "edge z=1e-3": "INVALID_ARGUMENT"}, edg.sent
    assert key(tb.metrics()) == key(clean_rows)
    assert summary["epsilon"] == pytest.approx(clean_summary["epsilon"], rel=1e-9)  # nothing forged was charged
    assert clean_summary["refused"] == 0 and summary["refused"] == 4 and tb.metrics()[0]["refused"] == 4
    assert summary["refused_by_reason_at_cloud"] == {"bad_dp_event": 2}
    assert refusals_logged(tb, "edge-000", "bad_dp_event") == 2
    assert not (tb.run_dir / "pending").exists() or not list((tb.run_dir / "pending").rglob("*.npz"))
