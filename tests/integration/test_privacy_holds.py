"""Privacy that holds (issue 18) on real processes: DP noise is secret (two runs with one config and seed release
different noise; only the explicit replay option reproduces it), nothing un-noised leaves a private device (the
envelopes an edge receives, as it logs their keys), and a resumed run keeps every release charged."""
import json
import time

import numpy as np
import pytest

from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.ledger import PrivacyLedger

from .conftest import SMALL
from .test_faults import wait_rows

ONE = SMALL + ["topology.edges=1", "topology.devices_per_edge=2", "model.name=mlp", "train.tau=5", "train.gamma=5",
               "run.rounds=1", "privacy.clip=1.0", "privacy.calibration=noise_multiplier", "privacy.trace_uploads=true",
               "privacy.epsilon=1e6"]  # no budget stop: these tests look at the releases, not at what they cost
HFL_DP = ONE + ["run.algorithm=hfl-dp", "privacy.noise_multiplier=50"]
CLEAR = {"train_loss", "beta_estimate", "sq_error", "q_measured", "expected_distortion"}


def weights(tb):
    with np.load(tb.run_dir / "checkpoint.npz") as f:
        return f["weights"].copy()


def upload_keys(tb) -> list[dict]:
    out = []
    for path in sorted(tb.logs.glob("edge-*.log")):
        for line in path.read_text().splitlines():
            if "upload keys " in line:
                out.append(json.loads(line.split("upload keys ", 1)[1]))
    return out


def test_private_runs_with_one_seed_release_different_noise(hfl_testbed):
    secret = [hfl_testbed(overrides=HFL_DP) for _ in range(2)]
    for tb in secret:
        tb.wait(timeout=300)
    a, b = (weights(tb) for tb in secret)
    # the noise (std 50 x 2 eta m G per device) dominates the update: two releases of one config differ everywhere
    assert np.mean(a != b) > 0.99
    assert 'noise_source = "secret"' in (secret[0].run_dir / "config.toml").read_text()
    assert secret[0].summary().get("privacy_caveats") is None
    seeded = [hfl_testbed(overrides=HFL_DP + ["privacy.noise_source=seeded"]) for _ in range(2)]
    for tb in seeded:
        tb.wait(timeout=300)
    np.testing.assert_array_equal(weights(seeded[0]), weights(seeded[1]))  # the replay option: bit-identical
    summary = seeded[0].summary()
    assert any("run.seed" in c for c in summary["privacy_caveats"])
    ledger = json.loads((seeded[0].run_dir / "privacy_ledger.jsonl").read_text().splitlines()[-1])
    assert any("run.seed" in c for c in ledger["caveats"])


@pytest.mark.parametrize("name, overrides", [
    ("hfl-dp", HFL_DP),
    ("dp-sgd", ONE + ["run.algorithm=dp-sgd", "train.tau=1", "train.gamma=2", "privacy.lot_rate=0.1",
                      "privacy.noise_multiplier=1.0"]),
    ("dpsq", ONE + ["run.algorithm=dpsq-fl-fwo-cso", "topology.devices_per_edge=4", "train.gamma=5",
                    "pipeline.clip=clip_l1", "pipeline.params.clip_l1.clip=10.0", "pipeline.uplink_encoding=dpsq",
                    "pipeline.params.dpsq.epsilon1=1e-6", "precision.group_sizes=[2, 2]", "precision.bits=[2, 4]",
                    "precision.participants=4"]),
])
def test_no_private_upload_carries_a_value_in_the_clear(hfl_testbed, name, overrides):
    tb = hfl_testbed(overrides=overrides)
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 1
    uploads = upload_keys(tb)
    assert uploads, "the edges logged no upload keys"
    for up in uploads:
        params = {p for _, _, names in up["transforms"] for p in names}
        assert not CLEAR & (set(up["scalars"]) | params), (name, up)
    if name == "hfl-dp":  # every delta upload carries its device's DP event
        assert all(any(stage == "dp_event" for stage, _, _ in up["transforms"]) for up in uploads)
    if name == "dpsq":
        assert summary["epsilon"] == "inf" and "not DP" in summary["fusion"]["epsilon_label"]


def test_a_resumed_private_run_keeps_every_release_charged(hfl_testbed):
    tb = hfl_testbed(overrides=HFL_DP + ["run.rounds=4", "privacy.noise_multiplier=5", "topology.host_layout=per_edge"])
    wait_rows(tb, 2, timeout=300)
    tb.kill("cloud")
    tb.restart("cloud", resume=True)
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 4 and summary["resumed"] is True
    lines = [json.loads(x) for x in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()]
    assert {line["round"] for line in lines} == {0, 1, 2, 3}
    records = [DpRecord.from_json(e) for line in lines for e in line["events"]]
    rebuilt = PrivacyLedger.from_records(records, delta=1e-5).epsilons()
    # the cloud's figure composes every line it wrote, a round redone after the resume included (fresh noise)
    assert rebuilt == pytest.approx(lines[-1]["epsilon"], rel=1e-9)
    assert summary["epsilon"] == pytest.approx(max(rebuilt.values()), rel=1e-9)


def test_uploads_of_a_restarted_attempt_are_charged(hfl_testbed):
    """A device host killed mid-round and back within the grace restarts its edge's round (attempt 1): the uploads
    the edge received in attempt 0 were released all the same, so the ledger charges both attempts."""
    tb = hfl_testbed(overrides=SMALL + ["run.algorithm=hfl-dp", "train.tau=10", "train.gamma=5", "run.rounds=3",
                                        "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=5",
                                        "privacy.epsilon=1e6", "topology.host_layout=per_edge", "topology.hosts_per_edge=3",
                                        "net.rejoin_grace_s=40"])
    wait_rows(tb, 1, timeout=300)
    tb.kill("devices-000-0")
    time.sleep(0.5)
    tb.restart("devices-000-0")
    tb.wait(timeout=300)
    rows = tb.metrics()
    lines = {json.loads(x)["round"]: json.loads(x) for x in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()}
    restarted = [r["round"] for r in rows if r["round_restarts"] > 0]
    if not restarted:
        pytest.skip("the killed host came back before its edge restarted the round (nothing to charge twice)")
    for r in restarted:
        releases = sum(e["count"] * len(e["covers"]) for e in lines[r]["events"] if e["tier"] == "device")
        # 6 devices x (K_l + 1 = 2) uploads in one attempt; the aborted attempt's uploads come on top
        assert releases > 12, lines[r]

