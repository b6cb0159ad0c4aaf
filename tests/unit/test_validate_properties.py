"""Property tests (hypothesis) on the envelope decoder and the validators: whatever a peer sends, they raise
nothing but WireError, what they accept is within bounds, and what they echo back stays short."""
from __future__ import annotations

import asyncio
import contextlib
import math
import resource

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfl.common import validate, wire
from hfl.proto import hfl_v1_pb2 as pb

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIM = 37
MESSAGE_CHARS = 2048  # the longest refusal text any input may produce (before refuse() truncates it further)

# text, including non-printable, astral and very long strings (built by repetition so they stay cheap)
long_text = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(1, 300_000))
any_text = st.one_of(st.text(max_size=80), long_text, st.sampled_from(["", "dev-00004", "\x00", "\U0001F600" * 65]))
any_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, -0.0, 5e-324, 1e4, 1e15, 1e9]))
int64 = st.integers(-(2 ** 63), 2 ** 63 - 1)


def refused(fn, *args):
    """Call fn; return its result or the WireError it raised (anything else fails the test)."""
    try:
        return fn(*args)
    except wire.WireError as exc:
        assert isinstance(exc.code, grpc.StatusCode) and exc.reason
        if len(str(exc)) > MESSAGE_CHARS:  # (no assert: pytest would print the whole message)
            raise AssertionError(f"{len(str(exc))}-char message: {str(exc)[:200]}") from None
        return exc


# ---- wire: parse_envelope / read_envelope / decode_vector --------------------------------------------------

@FAST
@given(st.binary(max_size=4096))
def test_parse_envelope_raises_only_wire_error(data):
    out = refused(wire.parse_envelope, data)
    if isinstance(out, wire.WireError):
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT and out.reason == "malformed"
    else:
        assert isinstance(out, pb.Envelope)


@FAST
@given(st.binary(max_size=512), st.integers(0, 400), st.lists(st.integers(0, 600), max_size=6))
def test_parse_envelope_of_mutated_valid_envelopes(noise, at, cuts):
    """A valid envelope with bytes overwritten, cut short or spliced: WireError or an Envelope, nothing else."""
    env = pb.Envelope(meta=pb.Meta(run_id="r", round=1, phase="edge_model_sync", step=2, sender_id="dev-00004"),
                      tensors=[wire.encode(np.arange(DIM, dtype=np.float32), "float32", "delta")],
                      scalars={"train_loss": 0.5})
    payload = env.SerializeToString()
    mutated = payload[:at] + noise + payload[at + len(noise):]
    for cut in cuts:
        mutated = mutated[:cut]
    out = refused(wire.parse_envelope, mutated)
    assert isinstance(out, (pb.Envelope, wire.WireError))


@FAST
@given(st.lists(st.binary(max_size=300), max_size=12), st.integers(0, 2000))
def test_read_envelope_enforces_the_byte_limit(chunks, limit):
    async def source():
        for c in chunks:
            yield pb.Chunk(data=c)

    total = sum(map(len, chunks))
    out = refused(lambda: asyncio.run(wire.read_envelope(source(), limit)))
    if total > limit:
        assert isinstance(out, wire.WireError) and out.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    elif isinstance(out, wire.WireError):
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert out[1] == total


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@FAST
@given(st.lists(finite32, min_size=0, max_size=200))
def test_float32_vectors_round_trip_bit_exactly(values):
    vec = np.asarray(values, dtype=np.float32)
    tensor = wire.encode(vec, "float32", "delta")
    back = pb.Tensor.FromString(tensor.SerializeToString())
    out = wire.decode_vector(back, len(values))
    assert out.dtype == np.float32 and out.tobytes() == vec.tobytes()


@FAST
@given(st.lists(finite32, min_size=1, max_size=100), st.data(),
       st.sampled_from([np.nan, np.inf, -np.inf]), st.sampled_from(["float32", "float16"]))
def test_any_non_finite_value_is_refused(values, data, bad, encoding):
    vec = np.asarray(values, dtype=np.float32)
    if encoding == "float16":
        vec = np.clip(vec, -60000, 60000)
    for i in data.draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=5)):
        vec[i] = bad
    out = refused(wire.decode_vector, wire.encode(vec, encoding, "delta"), len(values))
    assert isinstance(out, wire.WireError) and out.reason == "non_finite"
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT


def test_float16_overflow_on_the_wire_is_refused():
    """float16 bytes that decode to inf (0x7c00) are refused like a float32 inf."""
    tensor = pb.Tensor(name="delta", dtype="float16", shape=[2], encoding="float16",
                       data=np.array([0x3c00, 0x7c00], "<u2").tobytes())
    out = refused(wire.decode_vector, tensor, 2)
    assert isinstance(out, wire.WireError) and out.reason == "non_finite"


tensors = st.builds(
    pb.Tensor,
    name=st.one_of(st.just("delta"), st.text(max_size=20)),
    dtype=st.sampled_from(["float32", "float16", "float64", "int8", "", "<f4"]),
    shape=st.one_of(st.just([DIM]), st.lists(st.integers(-(2 ** 62), 2 ** 62), max_size=4),
                    st.lists(st.integers(0, 64), max_size=3)),
    encoding=st.one_of(st.sampled_from(sorted(wire.CODECS.names())), st.text(max_size=12)),
    data=st.one_of(st.binary(max_size=4 * DIM + 8), st.binary(min_size=4 * DIM, max_size=4 * DIM),
                   st.binary(min_size=2 * DIM, max_size=2 * DIM)),
)


@FAST
@given(tensors)
def test_decode_vector_of_arbitrary_tensors(tensor):
    out = refused(wire.decode_vector, tensor, DIM)
    if not isinstance(out, wire.WireError):
        assert out.shape == (DIM,) and out.dtype == np.float32 and np.isfinite(out).all()


@contextlib.contextmanager
def memory_cap(extra: int = 1 << 30):
    """Cap this process's address space at its current size + `extra` while decoding hostile input, so that a
    header that makes the decoder allocate tens of GiB fails fast (MemoryError) instead of filling the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    cap = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


QUANTIZING = sorted(set(wire.CODECS.names()) - {"float32", "float16"})
CODEC_PARAMS = {"qsgd": {"levels": 4}, "sq": {"bits": 3}, "dpsq": {"bits": 3, "epsilon1": 1.0},
                "laplace-sq": {"bits": 3, "epsilon1": 1.0}}


@FAST
@given(st.sampled_from(QUANTIZING), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                                             max_size=6), st.integers(0, 2 ** 32 - 1))
def test_quantized_payloads_with_corrupted_bytes(encoding, flips, seed):
    """Header fields (width, levels, length, buckets, side count, norms) and indices overwritten at random."""
    vec = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    tensor = wire.encode(vec, encoding, "delta", np.random.default_rng(seed), **CODEC_PARAMS.get(encoding, {}))
    data = bytearray(tensor.data)
    for pos, value in flips:
        data[pos % len(data)] = value
    tensor.data = bytes(data)
    with np.errstate(all="ignore"), memory_cap():
        out = refused(wire.decode_vector, tensor, DIM)
    if not isinstance(out, wire.WireError):
        assert out.shape == (DIM,) and np.isfinite(out).all()


# ---- validate: check_id / check_scalars / check_meta ------------------------------------------------------

@FAST
@given(any_text, st.integers(0, 200))
def test_check_id(value, limit):
    out = refused(validate.check_id, value, "node_id", limit)
    if isinstance(out, wire.WireError):
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT
        assert len(str(out)) <= 10 * min(limit, validate.ECHO) + 80  # repr() of at most that many characters
    else:
        assert out == value and len(value) <= limit and value.isprintable()


@FAST
@given(any_text, st.integers(1, 1000))
def test_short_and_truncate_are_bounded(text, limit):
    assert len(validate.short(text)) <= 10 * validate.ECHO + 40  # repr() escapes a char to at most 10
    assert len(validate.truncate(text, limit)) <= limit + 40


scalar_names = st.one_of(st.sampled_from(sorted(validate.SCALARS.names())), any_text)


@FAST
@given(st.dictionaries(scalar_names, any_float, max_size=validate.MAX_SCALARS + 8))
def test_check_scalars(scalars):
    out = refused(validate.check_scalars, scalars, "dev-00004")
    if isinstance(out, wire.WireError):
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT and out.reason == "bad_scalar"
        return
    assert len(out) == len(scalars) <= validate.MAX_SCALARS
    for name, value in out.items():
        spec = validate.SCALARS.get(name)
        assert isinstance(value, float) and math.isfinite(value) and spec.lo <= value <= spec.hi


@FAST
@given(st.sampled_from(sorted(validate.SCALARS.names())), any_float)
def test_every_registered_scalar_is_range_checked(name, value):
    """Through the real proto map (doubles), as a service sees it."""
    env = pb.Envelope(scalars={name: value})
    out = refused(validate.check_scalars, env.scalars, "edge-001")
    spec = validate.SCALARS.get(name)
    ok = math.isfinite(value) and spec.lo <= value <= spec.hi
    assert (not isinstance(out, wire.WireError)) == ok
    if ok:
        assert out == {name: value}


@FAST
@given(long_text, any_text)
def test_unknown_scalar_names_are_echoed_short(name, sender):
    if name in validate.SCALARS:
        return
    out = refused(validate.check_scalars, {name: 1.0}, sender)
    assert isinstance(out, wire.WireError) and len(str(out)) <= 1500


transforms = st.builds(
    pb.Transform, stage=any_text, name=any_text, tier=st.sampled_from(["device", "edge", "", "x" * 70]),
    bits=int64, params=st.dictionaries(st.one_of(st.text(max_size=8), long_text), any_float, max_size=4))
metas = st.builds(
    pb.Meta, run_id=any_text, round=int64, phase=any_text, step=int64, sender_id=any_text, num_samples=int64,
    num_devices=int64, attempt=int64, transforms=st.lists(transforms, max_size=3))
sane_metas = st.builds(
    pb.Meta, run_id=st.just("hfl-1234"), round=st.integers(-3, 12), phase=st.just("edge_model_sync"),
    step=st.integers(-3, 12), sender_id=st.sampled_from(["dev-00004", "edge-001"]), num_samples=int64,
    num_devices=int64, attempt=st.one_of(st.integers(-3, 3), int64),
    transforms=st.lists(st.builds(pb.Transform, stage=st.just("encode"), name=st.just("qsgd"),
                                  tier=st.just("device"), params=st.dictionaries(st.sampled_from(["levels", "q"]),
                                                                                 any_float, max_size=2)),
                        max_size=validate.MAX_TRANSFORMS + 3))


@FAST
@given(st.one_of(metas, sane_metas), st.integers(0, 10), st.integers(0, 10))
def test_check_meta(meta, rounds, plan_len):
    out = refused(validate.check_meta, meta, rounds, plan_len)
    if isinstance(out, wire.WireError):
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT
        return
    for text, limit in ((meta.sender_id, validate.MAX_ID), (meta.phase, validate.MAX_ID),
                        (meta.run_id, validate.MAX_RUN_ID)):
        assert len(text) <= limit and text.isprintable()
    assert 0 <= meta.round <= rounds and 0 <= meta.step <= max(plan_len - 1, 0) and 0 <= meta.attempt <= 1 << 20
    assert len(meta.transforms) <= validate.MAX_TRANSFORMS
    for t in meta.transforms:
        assert len(t.params) <= validate.MAX_SCALARS
        assert all(math.isfinite(v) for v in t.params.values())
        assert all(len(s) <= validate.MAX_ID for s in (t.stage, t.name, t.tier, *t.params))


@pytest.mark.parametrize("field", ["run_id", "phase", "sender_id"])
def test_check_meta_does_not_echo_a_mebibyte_id(field):
    meta = pb.Meta(run_id="r", phase="p", sender_id="s")
    setattr(meta, field, "\U0001F600" * (1 << 20))
    out = refused(validate.check_meta, meta, 3, 3)
    assert isinstance(out, wire.WireError) and len(str(out).encode()) < 200


# ---- regressions found by the bad-input corpus (tests/integration/test_bad_input_corpus.py) ---------------

def test_a_stream_of_undecodable_chunks_is_a_refusal():
    """gRPC raises DecodeError from the request iterator when a message is not a Chunk; that must become
    INVALID_ARGUMENT (counted, logged in one line), not escape the servicer as UNKNOWN with a traceback."""
    from google.protobuf.message import DecodeError

    async def chunks():
        yield pb.Chunk(data=b"\x0a")
        raise DecodeError("Error parsing message with type 'hfl.v1.Chunk': Wire format was corrupt")

    out = refused(lambda: asyncio.run(wire.read_envelope(chunks(), 1 << 20)))
    assert isinstance(out, wire.WireError) and out.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("field", ["name", "encoding"])
def test_a_huge_tensor_name_is_not_echoed_at_length(field):
    """What refuse() sends as the status detail and logs: under 1 KiB in bytes, whatever characters an
    attacker uses (600 characters of 4-byte UTF-8 are 2.4 KB)."""
    tensor = wire.encode(np.zeros(DIM, np.float32), "float32", "delta")
    setattr(tensor, field, "\U0001F600" * (128 << 10))
    refusals = []
    for fn in (lambda: wire.single_tensor(pb.Envelope(tensors=[tensor]), "delta"),
               lambda: wire.decode_vector(tensor, DIM)):
        try:
            fn()
        except wire.WireError as exc:
            refusals.append(validate.truncate(str(exc)).encode())  # what refuse() sends and logs
    assert refusals  # a huge name is refused by single_tensor (wrong name), a huge encoding by decode_vector
    for detail in refusals:
        if len(detail) >= 1024:
            raise AssertionError(f"a {len(detail)}-byte status detail: {detail[:100]!r}...")


def test_a_qsgd_bucket_size_from_the_header_does_not_drive_an_allocation():
    """qsgd header with bucket = 2**32 - 1 (>= length, so one norm passes the side-count check): the decoder
    repeats the norm `bucket` times (32 GiB of float64) before cutting it to the vector's length. A single
    hostile upload must be refused INVALID_ARGUMENT (or decoded with bounded memory), not raise MemoryError."""
    vec = np.random.default_rng(0).normal(size=DIM).astype(np.float32)
    tensor = wire.encode(vec, "qsgd", "delta", np.random.default_rng(0), levels=4)
    data = bytearray(tensor.data)
    bucket_at = 1 + data[0] + 1 + 1 + 4 + 8  # name, version, width, levels, length
    data[bucket_at:bucket_at + 4] = (2 ** 32 - 1).to_bytes(4, "little")
    tensor.data = bytes(data)
    with memory_cap():
        out = refused(wire.decode_vector, tensor, DIM)
    if not isinstance(out, wire.WireError):
        assert out.shape == (DIM,) and np.isfinite(out).all()
