"""Pure parts of the reliability work: bounds, tokens, robust aggregators, JSON without NaN, run-dir guard,
the cloud's refusal of a non-finite aggregate."""
import json
import math
import pathlib
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from hfl.cloud_server.modes import DigitalCloud
from hfl.common import metrics, robust, session, validate, wire
from hfl.common.config import ConfigError
from hfl.common.rundir import check_run_dir
from hfl.proto import hfl_v1_pb2 as pb


def test_scalars_out_of_range_or_unknown_are_refused():
    assert validate.check_scalars({"train_loss": 2.3, "bytes_up": 10.0}, "edge-000") == {"train_loss": 2.3, "bytes_up": 10.0}
    for bad in ({"refused": -1.0}, {"dropped": -3.0}, {"bytes_up": -5.0}, {"train_loss": 1e300},
                {"train_loss": math.nan}, {"bytes_down": math.inf}, {"made_up": 1.0}):
        with pytest.raises(wire.WireError) as err:
            validate.check_scalars(bad, "edge-000")
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.reason == "bad_scalar"


def test_ids_are_capped_and_echoes_truncated():
    huge = "dev-" + "x" * (1 << 20)
    with pytest.raises(wire.WireError) as err:
        validate.check_id(huge, "sender_id")
    assert len(str(err.value)) < 200 and err.value.reason == "oversized_id"
    assert len(validate.short(huge)) < 200
    assert len(validate.truncate("y" * 10_000)) < 700


def test_meta_counts_and_transforms_bounded():
    meta = pb.Meta(run_id="r", round=0, phase="edge_model_sync", step=1, sender_id="dev-00000")
    validate.check_meta(meta, rounds=3, plan_len=3)
    for field, value in (("round", 99), ("round", -1), ("step", 7), ("attempt", -2)):
        bad = pb.Meta()
        bad.CopyFrom(meta)
        setattr(bad, field, value)
        with pytest.raises(wire.WireError):
            validate.check_meta(bad, rounds=3, plan_len=3)
    bad = pb.Meta()
    bad.CopyFrom(meta)
    bad.transforms.add(stage="clip", name="x", tier="device", params={"c": math.nan})
    with pytest.raises(wire.WireError):
        validate.check_meta(bad, rounds=3, plan_len=3)


class _Context:
    def __init__(self, token):
        self.token = token

    def invocation_metadata(self):
        return session.metadata(self.token) if self.token is not None else ()


def test_session_tokens_bind_a_node():
    sessions = session.Sessions()
    token = sessions.issue("dev-00001")
    assert len(token) >= 24 and token != sessions.issue("dev-00002")
    assert sessions.check(_Context(token), "dev-00001") == token
    for ctx, node in ((_Context(None), "dev-00001"), (_Context("guess"), "dev-00001"), (_Context(token), "dev-00002")):
        with pytest.raises(wire.WireError) as err:
            sessions.check(ctx, node)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert not sessions.end("dev-00001", "stale") and sessions.end("dev-00001", token)
    with pytest.raises(wire.WireError):
        sessions.check(_Context(token), "dev-00001")


def test_robust_aggregators_bound_an_absurd_update():
    rng = np.random.default_rng(0)
    honest = [rng.normal(size=50).astype(np.float32) for _ in range(9)]
    attack = np.full(50, 1e30, np.float32)
    vectors, weights = honest + [attack], [1.0] * 10
    mean_honest = np.mean(honest, axis=0)
    for name, params in (("norm_bound", {}), ("coordinate_median", {}), ("trimmed_mean", {"trimmed_mean": {"beta": 0.1}})):
        out = robust.aggregate(name, params, vectors, weights)
        assert np.isfinite(out).all() and np.linalg.norm(out - mean_honest) < 3 * np.linalg.norm(mean_honest) + 1, name
    plain = robust.aggregate("weighted_mean", {}, vectors, weights)
    assert np.abs(plain).max() > 1e28  # what the robust rules protect against
    # norm_bound with an explicit bound: every update scaled to norm <= bound before the mean
    out = robust.aggregate("norm_bound", {"norm_bound": {"bound": 1.0}}, [np.array([3.0, 4.0])], [1.0])
    np.testing.assert_allclose(out, [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(robust.aggregate("trimmed_mean", {}, [np.array([x]) for x in [0, 1, 2, 3, 100.0]],
                                                [1] * 5), [21.2], rtol=1e-6)  # beta 0.1 of 5 values trims nothing
    with pytest.raises(ValueError):
        robust.aggregate("trimmed_mean", {"trimmed_mean": {"beta": 0.5}}, honest, [1] * 9)


def test_trimmed_mean_trims():
    vals = [np.array([x]) for x in [0, 1, 2, 3, 100.0]]
    np.testing.assert_allclose(robust.aggregate("trimmed_mean", {"trimmed_mean": {"beta": 0.2}}, vals, [1] * 5), [2.0])


def test_json_records_have_null_not_nan(tmp_path):
    path = tmp_path / "m.jsonl"
    metrics.append_jsonl(path, {"round": 0, "accuracy": float("nan"), "loss": float("inf"), "diverged": True})
    row = json.loads(path.read_text())  # strict JSON parses
    assert row["accuracy"] is None and row["loss"] is None and row["diverged"] is True
    metrics.write_json(tmp_path / "s.json", {"final_loss": float("nan")})
    assert json.loads((tmp_path / "s.json").read_text())["final_loss"] is None


def test_run_dir_guard(tmp_path: pathlib.Path):
    check_run_dir(tmp_path, resume=False, force=False)  # empty: fine
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="--resume"):
        check_run_dir(tmp_path, resume=False, force=False)
    with pytest.raises(ConfigError, match="nothing to resume"):
        check_run_dir(tmp_path, resume=True, force=False)
    check_run_dir(tmp_path, resume=False, force=True)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_cloud_refuses_a_non_finite_or_exploding_aggregate():
    from hfl.cloud_server.driver import RoundDriver
    from hfl.cloud_server.store import EdgeResult
    from hfl.common.config import Config

    cloud = RoundDriver.__new__(RoundDriver)
    cloud.cfg, cloud.rejected_aggregates = Config(), 0
    cloud.w = np.full(4, 3e38, np.float32)  # finite, as is every edge delta; their sum is not
    big = np.full(4, 3e38, np.float32)
    results = {"edge-000": EdgeResult(big, 1, 10, {}), "edge-001": EdgeResult(big, 1, 10, {})}
    mode = DigitalCloud(SimpleNamespace(cfg=cloud.cfg, dim=4, run_dir=None))
    assert "non-finite" in cloud.install(3, mode.model(3, results, cloud.w))
    assert cloud.rejected_aggregates == 1 and np.array_equal(cloud.w, np.full(4, 3e38, np.float32))
    cloud.w = np.ones(4, np.float32)
    # one edge's absurd (finite) delta moves the model by ~1e30: refused, the previous model kept
    results = {"edge-000": EdgeResult(np.full(4, 1e30, np.float32), 1, 10, {}),
               "edge-001": EdgeResult(np.ones(4, np.float32), 1, 10, {})}
    assert "max_update_ratio" in cloud.install(4, mode.model(4, results, cloud.w))
    assert cloud.rejected_aggregates == 2 and np.array_equal(cloud.w, np.ones(4, np.float32))
    results = {"edge-000": EdgeResult(np.ones(4, np.float32), 1, 10, {})}
    assert cloud.install(5, mode.model(5, results, cloud.w)) == ""
    assert np.array_equal(cloud.w, np.full(4, 2.0, np.float32))
    assert cloud.install(6, mode.model(6, {}, cloud.w)) == "" and cloud.rejected_aggregates == 2  # nothing came


def test_refuse_install_threshold():
    from hfl.common.robust import refuse_install

    old = np.full(100, 0.1, np.float32)  # ||old|| = 1: the limit is ratio x 1
    assert refuse_install(old + np.float32(0.99 / 10), old, 1.0) == ""            # moved 0.99
    assert "moved by 1.1" in refuse_install(old + np.float32(0.11), old, 1.0)      # moved 1.1
    assert refuse_install(old + np.float32(1e6), old, 0.0) == ""                   # 0: only non-finite refused
    assert "non-finite" in refuse_install(np.full(100, np.nan, np.float32), old, 0.0)


def test_an_upload_far_beyond_the_others_is_left_out_and_honest_spreads_are_kept():
    from hfl.common.robust import outliers

    rng = np.random.default_rng(0)
    honest = [rng.normal(0, s, 50).astype(np.float32) for s in (1.0, 2.0, 3.0, 0.5)]  # a 6x spread of norms
    assert outliers(honest, 10.0) == {}
    insider = np.full(50, 1e30, np.float32)
    out = outliers([*honest, insider], 10.0)
    assert list(out) == [4] and "aggregation.max_member_ratio" in out[4]
    assert list(outliers([honest[0], insider], 10.0)) == [1]  # two uploads: each is judged against the other
    assert list(outliers([honest[0], np.full(50, np.inf, np.float32), honest[1]], 10.0)) == [1]
    assert outliers([insider], 10.0) == {} and outliers([*honest, insider], 0.0) == {}
    zeros = [np.zeros(50, np.float32)] * 2  # others that sent nothing give no scale: nobody is judged by them
    assert outliers([*zeros, honest[0]], 10.0) == {}
    # the bound is the stated ratio of the median of the others, to the value
    base = [np.ones(4), np.ones(4), 10 * np.ones(4) * (1 + 1e-9), 10 * np.ones(4) * (1 - 1e-9)]
    assert list(outliers(base[:3], 10.0)) == [2] and outliers([base[0], base[1], base[3]], 10.0) == {}
