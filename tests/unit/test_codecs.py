"""Quantizing codecs on the wire: sizes, round trips, Link integration and every refusal."""
import dataclasses

import grpc
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hfl.common import config as c
from hfl.common import wire
from hfl.common.pipeline import Link
from hfl.common.quantization import roundtrip
from hfl.common.quantization.codecs import QUANTIZING_CODECS, Payload, header_bytes, read_payload, write_payload
from hfl.common.wire import CODECS, WireError
from hfl.proto import hfl_v1_pb2 as pb

EPS = {"epsilon1": 0.5}
PARAMS = {"qsgd": {"levels": 4}, "sq": {"bits": 3}, "dpsq": {"bits": 3, **EPS}, "laplace-sq": {"bits": 3, **EPS}}


def _widths(name):
    return range(2, 17) if name == "qsgd" else range(1, 17)  # qsgd needs a sign bit plus >= 1 level bit


def _params_for(name, width):
    return {"bits": width} if name in ("qsgd", "sq") else {"bits": width, **EPS}


def test_codecs_are_registered():
    for name in ("qsgd", "sq", "dpsq", "laplace-sq"):
        assert name in CODECS


@pytest.mark.parametrize("name", sorted(QUANTIZING_CODECS))
def test_bytes_on_the_wire_within_5_percent_of_d_b_over_8_plus_header(name):
    d = 10_001
    vec = np.random.default_rng(0).normal(size=d).astype(np.float32)
    codec = CODECS.get(name)
    for width in _widths(name):
        p = _params_for(name, width)
        tensor = wire.encode(vec, name, "delta", np.random.default_rng(width), **p)
        header = header_bytes(name, 1 if name == "qsgd" else 2)
        ideal = d * width / 8
        assert len(tensor.data) == header + -(-d * width // 8)
        assert codec.bits(d, **p) == 8 * len(tensor.data)
        # the whole serialized Tensor, protobuf framing (name, dtype, shape, encoding) included
        assert tensor.ByteSize() <= 1.05 * ideal + header, (width, tensor.ByteSize(), ideal)
        out = wire.decode_vector(tensor, d)
        assert out.shape == (d,) and out.dtype == np.float32


@pytest.mark.parametrize("name", sorted(QUANTIZING_CODECS))
def test_roundtrip_helper_equals_what_the_receiver_decodes(name):
    vec = np.random.default_rng(1).normal(size=333).astype(np.float32)
    direct = roundtrip(name, vec, np.random.default_rng(7), **PARAMS[name])
    tensor = wire.encode(vec, name, "delta", np.random.default_rng(7), **PARAMS[name])
    assert np.array_equal(direct, wire.decode_vector(tensor, 333))
    assert direct.dtype == np.float32 and direct.shape == (333,)
    with pytest.raises(ValueError, match="codec_name"):
        roundtrip("float32", vec, np.random.default_rng(0))


def test_qsgd_with_buckets_and_high_bits_is_near_lossless():
    vec = np.random.default_rng(2).normal(size=1000).astype(np.float32)
    tensor = wire.encode(vec, "qsgd", "delta", np.random.default_rng(0), bits=16, bucket_size=64)
    out = wire.decode_vector(tensor, 1000)
    assert len(tensor.data) == header_bytes("qsgd", 16) + 2000
    # level step is bucket_norm / 32767 ~ 8 / 32767: every coordinate within one step
    assert np.max(np.abs(out - vec)) < 10 / 32767


def test_dpsq_fixed_range_and_sq_params_travel():
    vec = np.linspace(-0.5, 0.5, 11).astype(np.float32)
    tensor = wire.encode(vec, "dpsq", "delta", np.random.default_rng(0), bits=4, epsilon1=50.0,
                         range_mode="fixed", clip=1.0)
    payload = read_payload(tensor)
    assert payload.side.tolist() == [-1.0, 1.0] and payload.levels == 16 and payload.width == 4
    out = wire.decode_vector(tensor, 11)
    assert np.max(np.abs(out - vec)) <= 1 / 15 + 1e-6  # eps1 = 50: nearest level, half a step of 2/15


def test_links_carry_codecs_with_config_params_seeded_rng_and_overrides():
    cfg = c.load(None, ["pipeline.uplink_encoding=dpsq", "pipeline.params.dpsq.bits=4",
                        "pipeline.params.dpsq.epsilon1=1e-6",
                        "pipeline.backhaul_encoding=qsgd", "pipeline.params.qsgd.levels=4",
                        "pipeline.params.backhaul_encoding.levels=10"])
    vec = np.random.default_rng(3).normal(size=257).astype(np.float32)
    up, back = Link.from_config(cfg.pipeline, "uplink"), Link.from_config(cfg.pipeline, "backhaul")
    # dpsq's coins are DP randomness: secret by default (two sends of one vector differ), and its error statistics
    # stay on the device
    secret_a, secret_t = up.send(vec, "delta", 11, 5, 2, 0)
    secret_b, _ = up.send(vec, "delta", 11, 5, 2, 0)
    assert secret_a.data != secret_b.data
    assert not {"q_measured", "sq_error", "expected_distortion"} & set(secret_t[0].params)
    up = dataclasses.replace(up, dp_source="seeded", private_stats=True)  # a replay, FWO on the device's word

    tensor, transforms = up.send(vec, "delta", 11, 5, 2, 0)
    again, _ = up.send(vec, "delta", 11, 5, 2, 0)
    other, _ = up.send(vec, "delta", 11, 6, 2, 0)
    assert tensor.data == again.data and tensor.data != other.data  # rng from (seed, tier, node, round, step)
    out, _ = up.receive(tensor, 257, 11, 5, 2, 0)
    assert out.shape == (257,)
    (t,) = transforms
    assert (t.stage, t.name, t.tier, t.bits) == ("encode", "dpsq", "device", 8 * len(tensor.data))
    assert t.params["bits"] == 4 and t.params["epsilon1"] == 1e-6 and t.params["range_mode=minmax"] == 1.0
    assert t.params["q_measured"] == pytest.approx(
        float(np.sum((out.astype(np.float64) - vec) ** 2) / np.sum(vec.astype(np.float64) ** 2)), rel=1e-6)

    assert t.params["expected_distortion"] > 0  # eq. 7 summed, for FWO option (a)

    narrow, transforms = up.send(vec, "delta", 11, 5, 2, 0, overrides={"encode": {"bits": 2}})
    assert read_payload(narrow).width == 2 and transforms[0].params["bits"] == 2
    with pytest.raises(ValueError, match="overrides"):
        up.send(vec, "delta", 11, 5, 2, 0, overrides={"quantize": {"bits": 2}})

    tensor, transforms = back.send(vec, "delta", 11, 0, 2, 1)
    assert read_payload(tensor).levels == 10 and transforms[0].tier == "edge"  # hop table overrides codec table
    # one draw of q against its expectation: its relative sd here is 6.5% (2000 seeds), so 30% is ~4.6 sd
    assert transforms[0].params["q_measured"] == pytest.approx(transforms[0].params["q_expected"], rel=0.3)
    assert back.receive(tensor, 257, 11, 0, 2, 1)[0].shape == (257,)


@pytest.mark.parametrize("override,match", [
    ({"pipeline.params.dpsq.bits": "0"}, "bits"), ({"pipeline.params.dpsq.bits": "17"}, "bits"),
    ({"pipeline.params.dpsq.epsilon1": "-1"}, "epsilon1"), ({"pipeline.params.dpsq.colour": "1"}, "colour"),
])
def test_bad_codec_params_fail_at_link_construction(override, match):
    sets = ["pipeline.uplink_encoding=dpsq", "pipeline.params.dpsq.epsilon1=1.0"]
    sets += [f"{k}={v}" for k, v in override.items()]
    with pytest.raises(ValueError, match=match):
        Link.from_config(c.load(None, sets).pipeline, "uplink")
    with pytest.raises(ValueError, match="epsilon1 is required"):
        Link.from_config(c.load(None, ["pipeline.uplink_encoding=dpsq"]).pipeline, "uplink")
    with pytest.raises(ValueError, match="levels"):
        Link.from_config(c.load(None, ["pipeline.uplink_encoding=qsgd", "pipeline.params.qsgd.levels=0"]).pipeline,
                         "uplink")


def _refused(tensor, reason, expected_len=None):
    with pytest.raises(WireError) as info:
        wire.decode_vector(tensor, expected_len if expected_len is not None else int(tensor.shape[0]))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.reason == reason, str(info.value)


def _tensor(payload: Payload, encoding=None) -> pb.Tensor:
    return pb.Tensor(name="delta", dtype="float32", shape=[payload.length], encoding=encoding or payload.name,
                     data=write_payload(payload))


@pytest.mark.parametrize("name", sorted(QUANTIZING_CODECS))
def test_refusals(name):
    vec = np.random.default_rng(4).normal(size=50).astype(np.float32)
    good = wire.encode(vec, name, "delta", np.random.default_rng(0), **PARAMS[name])
    payload = read_payload(good)

    _refused(pb.Tensor(name="delta", dtype="float32", shape=[50], encoding=name, data=good.data[:-1]), "bad_length")
    _refused(pb.Tensor(name="delta", dtype="float32", shape=[50], encoding=name, data=good.data + b"\0"), "bad_length")
    longer = Payload(**{**payload.__dict__, "length": 51})
    _refused(pb.Tensor(name="delta", dtype="float32", shape=[50], encoding=name, data=write_payload(longer)),
             "bad_length")
    _refused(pb.Tensor(name="delta", dtype="float32", shape=[50], encoding=name, data=b""), "bad_header")
    _refused(pb.Tensor(name="delta", dtype="float32", shape=[50], encoding=name, data=good.data[:10]), "bad_header")

    other = "sq" if name != "sq" else "dpsq"
    _refused(pb.Tensor(name="delta", dtype="float32", shape=[50], encoding=other, data=good.data), "codec_mismatch")

    for bad in (np.nan, np.inf, -np.inf):
        side = payload.side.copy()
        side[-1] = bad
        _refused(_tensor(Payload(**{**payload.__dict__, "side": side})), "non_finite_header")

    if name == "qsgd":  # s = 4 in 4 bits: level 5 is representable but above the level count
        idx = payload.indices.copy()
        idx[3] = (5 << 1) | 1
        _refused(_tensor(Payload(**{**payload.__dict__, "indices": idx})), "bad_index")
        _refused(_tensor(Payload(**{**payload.__dict__, "levels": 3})), "bad_header")  # width 4 needs s in 4..7
    else:  # 5 levels travel in 3 bits: indices 5..7 are representable but above the level count
        idx = payload.indices.copy()
        idx[3] = 6
        _refused(_tensor(Payload(**{**payload.__dict__, "levels": 5, "indices": idx})), "bad_index")
        _refused(_tensor(Payload(**{**payload.__dict__, "side": payload.side[::-1].copy()})), "bad_header")


def test_nothing_but_wire_errors_come_out_of_garbage():
    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=80), st.sampled_from(sorted(QUANTIZING_CODECS)), st.integers(0, 40))
    def check(data, name, length):
        try:
            out = wire.decode_vector(pb.Tensor(name="x", dtype="float32", shape=[length], encoding=name, data=data),
                                     length)
            assert out.shape == (length,)
        except WireError as err:
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT

    check()


def test_qsgd_dequantize_is_sign_norm_level_over_s_bit_for_bit():
    """qsgd_dequantize against its formula in float64, byte for byte: sign * norm * level / s, so a negative value
    quantized to level 0 decodes to -0.0 (the sign bit kept), per bucket and for the whole vector."""
    from hfl.common.quantization import qsgd

    codes = np.array([1, 2, 0, 9, 7, 1 << 1, (3 << 1) | 1], np.uint32)  # (level << 1) | sign
    for norms, bucket in ((np.array([2.5], np.float32), 0), (np.array([2.5, 0.75], np.float32), 4)):
        got = qsgd.qsgd_dequantize(norms, codes, 4, bucket)
        norm_of = np.repeat(norms.astype(np.float64), 4 if bucket else codes.size)[:codes.size]
        want = ((1.0 - 2.0 * (codes & 1)) * norm_of * (codes >> 1) / 4).astype(np.float32)
        assert got.tobytes() == want.tobytes()
        assert np.signbit(got[0]) and got[0] == 0.0
