"""Who an edge's attempt waits for (edge_server/round_state.attempt_members) and what a member that comes back does
to it (edge_server/attempt.ClusterAttempt.wait): one lost before the attempt began joins it as it stands, one lost during it
restarts the round."""
import asyncio

from hfl.common.service_base import Liveness
from hfl.edge_server.attempt import COMPLETE, RESTART, ClusterAttempt
from hfl.edge_server.round_state import Barrier, ClusterRound, Contribution, attempt_members

MEMBERS = ["dev-00000", "dev-00001", "dev-00002"]


def cluster(grace_s=30.0):
    live = Liveness(grace_s)
    tokens = {m: live.registered(m) for m in MEMBERS}
    live.returned.clear()
    return live, tokens


def test_a_member_lost_within_its_grace_is_waited_for_unless_the_cluster_cannot_restart():
    async def go():
        live, tokens = cluster()
        live.lose("dev-00001", tokens["dev-00001"], "test")
        everyone = set(MEMBERS)
        assert attempt_members(MEMBERS, everyone, live, True) == (everyone, {"dev-00001"})
        assert attempt_members(MEMBERS, everyone, live, False) == ({"dev-00000", "dev-00002"}, set())
        # not drawn this round: neither live nor late counts it
        assert attempt_members(MEMBERS, {"dev-00000"}, live, True) == ({"dev-00000"}, set())
        live.grace_s = 0.0
        live.expire()  # past its grace: absent, not waited for
        assert attempt_members(MEMBERS, everyone, live, True) == ({"dev-00000", "dev-00002"}, set())
    asyncio.run(go())


def edge(live, may_restart=True):
    node = ClusterAttempt("edge-000", ClusterRound("run", 3, {}, set(MEMBERS)), MEMBERS, live, may_restart, 30.0)
    node.begin([])
    return node


def upload(barrier, *nodes):
    for n in nodes:
        barrier.contributions[n] = Contribution(vec=None, samples=1, scalars={})


def test_a_member_lost_between_rounds_and_back_takes_the_attempt_without_a_restart():
    async def go():
        live, tokens = cluster()
        live.lose("dev-00002", tokens["dev-00002"], "killed between rounds")
        node, barrier = edge(live), Barrier(0, "upload")
        upload(barrier, "dev-00000", "dev-00001")
        waiting = asyncio.create_task(node.wait(barrier, 0))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # waits for the late member within its grace
        live.registered("dev-00002")  # back: it fetches this attempt and uploads
        await asyncio.sleep(0.05)
        assert not waiting.done() and not node.late and not live.returned
        upload(barrier, "dev-00002")
        live.poke()
        assert await asyncio.wait_for(waiting, 5) == COMPLETE and not node.out
    asyncio.run(go())


def test_a_member_lost_during_the_attempt_and_back_restarts_it():
    async def go():
        live, tokens = cluster()
        node, barrier = edge(live), Barrier(0, "upload")
        upload(barrier, "dev-00000", "dev-00001")
        waiting = asyncio.create_task(node.wait(barrier, 0))
        await asyncio.sleep(0.05)
        live.lose("dev-00001", tokens["dev-00001"], "killed after its upload")
        await asyncio.sleep(0.05)
        assert not waiting.done()
        live.registered("dev-00001")
        assert await asyncio.wait_for(waiting, 5) == RESTART
    asyncio.run(go())


def test_a_late_member_past_its_grace_is_dropped_and_the_others_complete():
    async def go():
        live, tokens = cluster(grace_s=0.2)
        live.lose("dev-00002", tokens["dev-00002"], "killed for good")
        node, barrier = edge(live), Barrier(0, "upload")
        upload(barrier, "dev-00000", "dev-00001")
        assert await asyncio.wait_for(node.wait(barrier, 0), 5) == COMPLETE
        assert node.out == {"dev-00002"}
    asyncio.run(go())
