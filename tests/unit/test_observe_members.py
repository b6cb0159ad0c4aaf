"""Device hosts as nodes of the live page (common/observe/members.py): what an edge reports upward with its submit,
and the cloud's check of it (bounded, known members only, finite numbers; anything else refused)."""
import asyncio
import math
import time

import grpc
import pytest

from hfl.common import wire
from hfl.common.observe import members
from hfl.common.service_base import Liveness
from hfl.proto import hfl_v1_pb2 as pb

MEMBERS = ["dev-00003", "dev-00004", "dev-00005"]


def liveness() -> Liveness:
    asyncio.set_event_loop(asyncio.new_event_loop())  # Liveness holds an asyncio.Event
    return Liveness(30.0)


def test_the_report_follows_each_member_through_its_states():
    live, book = liveness(), members.MemberBook(MEMBERS)
    states = lambda: {e.id: members.STATES[e.state] for e in book.report(live)}  # noqa: E731
    assert states() == dict.fromkeys(MEMBERS, "waiting")
    tokens = {m: live.registered(m) for m in MEMBERS}
    assert states() == dict.fromkeys(MEMBERS, "live")
    live.lose("dev-00004", tokens["dev-00004"], "test")
    assert states()["dev-00004"] == "late"  # lost, within its grace period
    live.grace_s = 0.0
    assert live.expire() == {"dev-00004"} and states()["dev-00004"] == "lost"
    live.registered("dev-00004")
    report = {e.id: e for e in book.report(live)}
    assert members.STATES[report["dev-00004"].state] == "rejoined" and report["dev-00004"].rejoins == 1
    assert [report[m].rejoins for m in ("dev-00003", "dev-00005")] == [0, 0]


def test_the_report_carries_last_seen_refusals_and_round_time():
    live, book = liveness(), members.MemberBook(MEMBERS)
    token = live.registered("dev-00003")
    live.registered("dev-00004")
    book.start_round()
    time.sleep(0.05)
    book.uploaded("dev-00004")
    book.refusal("dev-00005")
    book.refusal("dev-00005")
    live.lose("dev-00003", token, "test")
    time.sleep(0.05)
    report = {e.id: e for e in book.report(live)}
    assert report["dev-00004"].HasField("last_seen_s") and report["dev-00004"].last_seen_s == 0.0  # connected
    assert 0.04 <= report["dev-00003"].last_seen_s < 5  # since its session ended
    assert not report["dev-00005"].HasField("last_seen_s")  # never seen
    assert 0.04 <= report["dev-00004"].round_s < 5 and not report["dev-00003"].HasField("round_s")
    assert report["dev-00005"].refused == 2 and report["dev-00004"].refused == 0
    book.start_round()  # a new round (or attempt): round times count afresh
    assert not any(e.HasField("round_s") for e in book.report(live))
    # small on the wire: a state code and a few numbers per member
    assert len(pb.Envelope(members=book.report(live)).SerializeToString()) <= 30 * len(MEMBERS)


def test_a_valid_report_reads_back_as_sent():
    live, book = liveness(), members.MemberBook(MEMBERS)
    live.registered("dev-00003")
    book.uploaded("dev-00003")
    got = members.check_members(book.report(live), MEMBERS, "edge-001")
    assert set(got) == set(MEMBERS)
    assert got["dev-00003"]["state"] == "live" and got["dev-00003"]["last_seen_s"] == 0.0
    assert got["dev-00004"] == {"state": "waiting", "last_seen_s": None, "refused": 0, "round_s": None, "rejoins": 0}
    assert members.check_members([], MEMBERS, "edge-001") == {}  # an edge that reports nothing (an older one)


def entry(**fields) -> pb.MemberState:
    base = {"id": "dev-00003", "state": 1, "last_seen_s": 0.0, "refused": 0, "round_s": 1.0}
    base.update(fields)
    return pb.MemberState(**base)


@pytest.mark.parametrize("entries, message", [
    ([entry(id="dev-00000")], "not a device of 'edge-001'"),  # another edge's device
    ([entry(id="x" * 500)], "not a device of"),
    ([entry(), entry()], "two member states for dev-00003"),
    ([entry(id=m) for m in MEMBERS] + [entry(id="dev-00006")], "4 member states"),
    ([entry(state=5)], "state code 5"),
    ([entry(state=-1)], "state code -1"),
    ([entry(last_seen_s=math.nan)], "last_seen_s = nan"),
    ([entry(round_s=math.inf)], "round_s = inf"),
    ([entry(round_s=-1.0)], "round_s = -1.0"),
    ([entry(last_seen_s=3e9)], "last_seen_s"),
    ([entry(refused=2 ** 32 - 1)], "counts above"),
    ([entry(rejoins=2 ** 31)], "counts above"),
])
def test_bad_member_data_is_refused(entries, message):
    with pytest.raises(wire.WireError, match=message) as caught:
        members.check_members(entries, MEMBERS, "edge-001")
    assert caught.value.reason == "bad_members" and caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_state_counts_name_every_state():
    assert members.state_counts(["live", "live", "lost"]) == {"waiting": 0, "live": 2, "late": 0, "lost": 1,
                                                              "rejoined": 0}
