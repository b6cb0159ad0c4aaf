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


def test_children_not_drawn_get_the_task_without_its_tensors():
    async def go():
        board = RoundBoard()
        sent = envelope(2)
        await board.publish(2, sent, 64 << 10, idle={"dev-00001"})
        r, chunks, size = await board.wait_after(1, 0, "dev-00000")
        assert r == 2 and fetched(chunks) == sent and size == sent.ByteSize() == board.size and len(chunks) > 1
        r, chunks, size = await board.wait_after(1, 0, "dev-00001")
        idle = fetched(chunks)
        assert r == 2 and not idle.tensors and idle.task == sent.task and idle.meta == sent.meta
        assert size == idle.ByteSize() < 1000 and len(chunks) == 1
        await board.publish(3, envelope(3), 64 << 10)  # the next round draws everyone
        r, chunks, _ = await board.wait_after(2, 0, "dev-00001")
        assert r == 3 and len(fetched(chunks).tensors) == 1
    asyncio.run(go())
