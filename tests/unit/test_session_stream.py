"""The framing of a device's Session stream (common/session_stream.py), against protobuf's own parser."""
import asyncio

import grpc
import pytest

from hfl.common import session_stream as ss
from hfl.common import wire
from hfl.proto import hfl_v1_pb2 as pb


def frames_of(envelope: pb.Envelope, chunk_bytes: int) -> list[bytes]:
    chunks = wire.chunked(envelope, chunk_bytes)
    return [c.SerializeToString() + (ss.END if i == len(chunks) - 1 else b"") for i, c in enumerate(chunks)]


async def collect(frames, max_bytes=1 << 20):
    async def it():
        for f in frames:
            yield f
    return [await u.read() for u in [u async for u in ss.uploads(it(), max_bytes)]]


ENV = pb.Envelope(meta=pb.Meta(run_id="r", sender_id="dev-00001", round=3), scalars={"train_loss": 0.5},
                  tensors=[pb.Tensor(name="delta", dtype="float32", shape=[64], encoding="raw", data=bytes(range(256)))])


@pytest.mark.parametrize("raw", [pb.Chunk(data=b"abc").SerializeToString(), pb.Chunk(data=b"abc", end=True).SerializeToString(),
                                 pb.Chunk(data=b"abc").SerializeToString() + ss.END, pb.Chunk(end=True).SerializeToString(),
                                 pb.Chunk(data=b"x", end=True).SerializeToString() + b"\x10\x00", b""])
def test_frame_end_reads_the_flag_as_protobuf_does(raw):
    assert ss.frame_end(raw) == pb.Chunk.FromString(raw).end


def test_a_reply_frame_parses_as_the_same_chunk_with_end_set():
    whole = pb.Chunk(data=ENV.SerializeToString()).SerializeToString()
    parsed = pb.Chunk.FromString(ss.reply(whole))
    assert parsed.end and pb.Envelope.FromString(parsed.data) == ENV


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 64, 7])
def test_uploads_reassemble_each_framed_envelope(chunk_bytes):
    other = pb.Envelope(meta=pb.Meta(run_id="r", sender_id="dev-00001", round=4, withdraw=True))
    got = asyncio.run(collect(frames_of(ENV, chunk_bytes) + frames_of(other, chunk_bytes)))
    assert [e for e, _ in got] == [ENV, other]
    assert [n for _, n in got] == [ENV.ByteSize(), other.ByteSize()]


def test_a_one_frame_upload_is_read_in_place():
    frame = frames_of(ENV, 1 << 20)[0]

    async def first():
        async def it():
            yield frame
        return [u async for u in ss.uploads(it(), 1 << 20)][0]
    upload = asyncio.run(first())
    assert upload.received is frame and upload.parts == ()


@pytest.mark.parametrize("frames, code", [
    ([b"\xff\xff\xff"], grpc.StatusCode.INVALID_ARGUMENT),              # not a Chunk
    ([b"\x0a\x7f"], grpc.StatusCode.INVALID_ARGUMENT),                  # a data field past the end
    ([pb.Chunk(data=b"\x00" * 600).SerializeToString()] * 2, grpc.StatusCode.RESOURCE_EXHAUSTED),  # 1,200 > 1,000
])
def test_a_bad_frame_or_an_oversized_upload_is_refused(frames, code):
    with pytest.raises(wire.WireError) as err:
        asyncio.run(collect(frames, max_bytes=1000))
    assert err.value.code == code


def test_a_stream_that_ends_inside_an_upload_yields_nothing_of_it():
    frames = frames_of(ENV, 64)
    assert asyncio.run(collect(frames[:-1])) == []
