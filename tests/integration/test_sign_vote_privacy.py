"""The edge's privacy wraps a plugin mode's `combine` (edge_server/release.py): a private run whose edges settle by
the sign-vote example still has its trusted edge clip and add its noise, and the cloud's check of the edges' DP
events against the plan accepts every result."""
import json
import os
import pathlib

from hfl.common.privacy.events import DpRecord

from .conftest import SMALL

ROOT = pathlib.Path(__file__).parents[2]


def test_a_private_sign_vote_run_keeps_the_edge_noise_and_passes_the_cloud_check(hfl_testbed):
    cwd = os.getcwd()
    os.chdir(ROOT)  # the plugins are named relative to the working directory
    try:
        tb = hfl_testbed(overrides=SMALL + [
            'run.plugins=["examples/sign_vote_mode.py", "tests/integration/signvote_h2fdp_plugin.py"]',
            "run.algorithm=h2fdp-signvote", "train.tau=10", "train.gamma=5", "train.lr=0.05", "privacy.clip=1.0",
            'privacy.trust_table={"edge-000" = "trusted"}', "privacy.epsilon=200", "run.rounds=2"])
        summary = tb.wait(timeout=300)
    finally:
        os.chdir(cwd)
    assert summary["algorithm"] == "h2fdp-signvote" and summary["rounds"] == 2
    assert summary["refused"] == 0 and summary["refused_by_reason_at_cloud"] == {}  # every DP event as planned
    lines = [json.loads(line) for line in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [0, 1]
    trusted = {"dev-00000", "dev-00001", "dev-00002"}
    for line in lines:
        edge_events = [e for e in map(DpRecord.from_json, line["events"]) if e.tier == "edge"]
        assert {e.node for e in edge_events} == {"edge-000"}  # the trusted edge's own draw, around the sign vote
        assert {e.stream for e in edge_events} == {"local", "global"}
        assert all(set(e.covers) == trusted and e.noise_multiplier > 0 for e in edge_events)
    assert 0 < summary["epsilon"] < float("inf")
