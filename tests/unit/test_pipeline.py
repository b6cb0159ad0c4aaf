import numpy as np
import pytest

from hfl.common import config as c
from hfl.common.pipeline import AGGREGATORS, Link, VECTOR_STAGES, aggregate, weighted_mean
from hfl.common.registry import Registry, UnknownName


def test_weighted_mean_matches_formula():
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=50).astype(np.float32) for _ in range(4)]
    w = [3, 1, 2, 4]
    expected = sum(wi * x.astype(np.float64) for wi, x in zip(w, xs)) / sum(w)
    assert np.allclose(weighted_mean(xs, w), expected, atol=1e-6)
    with pytest.raises(ValueError):
        weighted_mean([], [])


def test_registry_fails_loudly():
    reg = Registry("thing")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", 2)
    with pytest.raises(UnknownName, match="unknown thing 'b'; allowed: a"):
        reg.get("b")
    assert "weighted_mean" in AGGREGATORS and "identity" in VECTOR_STAGES
    with pytest.raises(UnknownName):
        aggregate("median", [np.zeros(2)], [1])


def test_identity_links_record_nothing_and_change_nothing():
    cfg = c.Config()
    v = np.random.default_rng(0).normal(size=100).astype(np.float32)
    for hop in ("uplink", "backhaul", "downlink"):
        link = Link.from_config(cfg.pipeline, hop)
        tensor, transforms = link.send(v, "delta", 0, 1, 2, 3)
        out, received = link.receive(tensor, 100, 0, 1, 2, 3)
        assert transforms == [] and received == [] and np.array_equal(out, v)


def test_float16_encoding_is_recorded():
    cfg = c.load(None, ["pipeline.uplink_encoding=float16"])
    tensor, transforms = Link.from_config(cfg.pipeline, "uplink").send(np.ones(10, np.float32), "delta", 0, 0, 0, 0)
    assert [(t.stage, t.name, t.tier, t.bits) for t in transforms] == [("encode", "float16", "device", 160)]


def test_registered_stage_runs_with_its_params_and_seeded_rng():
    name = "test-scale"
    if name not in VECTOR_STAGES:
        VECTOR_STAGES.register(name, lambda vec, rng, factor=1.0: vec * factor + rng.normal(size=vec.shape) * 0)
    cfg = c.load(None, [f"pipeline.clip={name}", f"pipeline.params.{name}.factor=2.0"])
    tensor, transforms = Link.from_config(cfg.pipeline, "uplink").send(np.ones(3, np.float32), "delta", 0, 0, 0, 0)
    assert transforms[0].stage == "clip" and transforms[0].params["factor"] == 2.0
    assert np.array_equal(np.frombuffer(tensor.data, np.float32), [2, 2, 2])


@pytest.mark.parametrize("encoding", ["float32", "float16", "qsgd"])
def test_send_gives_the_tensor_of_the_seeded_encode(encoding):
    """A codec that draws nothing (draws = False) gets no generator; the tensor is the one its encode makes with the
    seeded generator that Link.send built for every codec before (and still builds for one that draws, like qsgd)."""
    from hfl.common import wire
    from hfl.common.seeding import numpy_rng

    cfg = c.load(None, [f"pipeline.uplink_encoding={encoding}"])
    link = Link.from_config(cfg.pipeline, "uplink")
    v = np.random.default_rng(5).normal(size=1000).astype(np.float32)
    tensor, _ = link.send(v, "delta", 7, 3, 2, 1)
    reference = wire.encode(v, encoding, "delta", numpy_rng(7, "device", 3, 2, 1, "encode"), **link.encode_params)
    assert tensor.SerializeToString() == reference.SerializeToString()
    assert getattr(wire.CODECS.get(encoding), "draws", True) is (encoding == "qsgd")
