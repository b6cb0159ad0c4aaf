"""Epsilon per party, recomputed with dp_accounting directly (no project code in the expected figures)."""
import math

import dp_accounting
from dp_accounting import rdp

from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.parties import as_json, party_epsilons

DELTA = 1e-5


def direct(*events) -> float:
    acc = rdp.RdpAccountant()
    for z, count, rate in events:
        event = dp_accounting.GaussianDpEvent(z)
        if rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(rate, event)
        acc.compose(event, count)
    return acc.get_epsilon(DELTA)


def rec(tier, node, covers, z, count=1, rate=1.0, stream="global"):
    return DpRecord(tier=tier, node=node, covers=tuple(covers), mechanism="gaussian", noise_multiplier=z,
                    sensitivity=1.0, sampling_rate=rate, count=count, stream=stream)


MEMBERS = {"edge-000": ["dev-00000", "dev-00001"], "edge-001": ["dev-00002", "dev-00003"],
           "edge-002": ["dev-00004"]}


def test_each_party_sees_what_it_can_see():
    records = [
        # edge-000 untrusted: each device adds its own noise, 3 local and 1 global release
        *[rec("device", d, [d], 2.0, count=3, stream="local") for d in MEMBERS["edge-000"]],
        *[rec("device", d, [d], 4.0) for d in MEMBERS["edge-000"]],
        # edge-001 trusted: the edge adds one draw to the cluster aggregate
        rec("edge", "edge-001", MEMBERS["edge-001"], 1.5, count=2),
        # edge-002: sample-level DP-SGD on its device, lots at rate 0.1
        rec("device-sample", "dev-00004", ["dev-00004"], 1.1, count=50, rate=0.1, stream="sample"),
    ]
    got = party_epsilons(records, DELTA, "rdp", MEMBERS)
    untrusted = direct((2.0, 3, 1.0), (4.0, 1, 1.0))
    aggregated = direct((1.5, 2, 1.0))
    sampled = direct((1.1, 50, 0.1))
    assert math.isclose(got["edge-000"]["cloud"], untrusted, rel_tol=1e-6)
    assert math.isclose(got["edge-000"]["edge"], untrusted, rel_tol=1e-6)  # the edge sees only noisy uploads
    assert math.isclose(got["edge-001"]["cloud"], aggregated, rel_tol=1e-6)
    assert got["edge-001"]["edge"] == math.inf  # it added the noise: it saw the clipped updates before
    assert math.isclose(got["edge-002"]["edge"], sampled, rel_tol=1e-6)
    assert all(p["outsiders"] == p["cloud"] for p in got.values())
    assert as_json(got)["edge-001"]["edge"] == "inf"


def test_no_release_means_no_guarantee():
    got = party_epsilons([], DELTA, "rdp", MEMBERS)
    assert all(v == math.inf for parties in got.values() for v in parties.values())
