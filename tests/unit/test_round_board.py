"""The round board an edge (or the cloud) publishes each round's task on: one serialisation for everyone, the task
without its tensors for the children not drawn this round."""
import asyncio

import numpy as np

from hfl.common import wire
from hfl.common.service_base import RoundBoard
from hfl.proto import hfl_v1_pb2 as pb


def envelope(round_: int) -> pb.Envelope:
    task = pb.RoundTask(round=round_, phases=[pb.Phase(kind="local_sgd")])
    task.clusters["edge-000"].participants.extend(["dev-00000"])
    model = wire.encode(np.arange(300_000, dtype=np.float32), "float32", "model")
    return pb.Envelope(meta=pb.Meta(run_id="r", round=round_, sender_id="edge-000"), tensors=[model], task=task)


def fetched(chunks) -> pb.Envelope:
    return wire.read_envelope_sync(iter(chunks))[0]


def test_children_not_drawn_are_not_sent_the_round_but_the_next_that_draws_them_and_the_end():
    async def go():
        board = RoundBoard()
        sent = envelope(2)
        await board.publish(2, sent, 64 << 10, idle={"dev-00001"})
        r, chunks, size = await board.wait_after(1, 0, "dev-00000")
        assert r == 2 and fetched(chunks) == sent and size == sent.ByteSize() == board.size and len(chunks) > 1
        waiting = asyncio.create_task(board.wait_after(1, 0, "dev-00001"))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # not drawn in round 2: nothing to fetch
        await board.publish(3, envelope(3), 64 << 10)  # the next round draws everyone
        r, chunks, _ = await asyncio.wait_for(waiting, 1)
        assert r == 3 and len(fetched(chunks).tensors) == 1
        await board.publish(4, envelope(4), 64 << 10, idle={"dev-00001"})
        waiting = asyncio.create_task(board.wait_after(3, 0, "dev-00001"))
        final = pb.Envelope(meta=pb.Meta(run_id="r", round=5), task=pb.RoundTask(round=5, finished=True))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await board.publish(5, final, 64 << 10, idle={"dev-00001"})  # the end reaches everyone
        r, chunks, _ = await asyncio.wait_for(waiting, 1)
        assert r == 5 and fetched(chunks).task.finished
    asyncio.run(go())


def test_a_fetch_for_several_children_takes_the_first_task_that_draws_any_of_them_and_marks_each():
    async def go():
        board = RoundBoard()
        await board.publish(2, envelope(2), 64 << 10, idle={"dev-00001", "dev-00002"})
        waiting = asyncio.create_task(board.wait_after(1, 0, ["dev-00001", "dev-00002"]))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # neither is drawn in round 2
        await board.publish(3, envelope(3), 64 << 10, idle={"dev-00001"})  # round 3 draws dev-00002
        r, _, _ = await asyncio.wait_for(waiting, 1)
        assert r == 3
        r, _, _ = await board.wait_after(1, 0, ["dev-00001", "dev-00000"])
        assert r == 3
        await board.mark_fetched(3, ["dev-00001", "dev-00002"])
        assert await board.wait_fetched(3, {"dev-00000", "dev-00001", "dev-00002"}, 0.05) == {"dev-00000"}
    asyncio.run(go())
