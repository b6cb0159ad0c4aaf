"""Privacy around every tier, from the plan: the edge's release around a mode's combine (edge_server/release.py),
the device's release and its statistics flag (common/privacy/on_wire.DeviceRelease), and device phases as
registered handlers (device_client/phases.py)."""
import numpy as np
import pytest

from hfl.common import plans, plugins
from hfl.common.config import load
from hfl.common.privacy import instructions
from hfl.common.privacy.instructions import NoisePlan, NoisePlanError
from hfl.common.privacy.stages import fixed_denominator_sum
from hfl.edge_server.modes import DigitalEdge
from hfl.edge_server.release import EdgeRelease
from hfl.edge_server.round_state import ClusterRound
from hfl.proto import hfl_v1_pb2 as pb

from .test_modes import ROOT

PHASES = [pb.Phase(kind=plans.EDGE_MODEL_SYNC), pb.Phase(kind=plans.CLOUD_SYNC)]  # step 0 is the global stream
VECS = [np.full(100, 0.3, np.float32), np.full(100, -0.05, np.float32), np.full(100, 0.2, np.float32)]


def _ctx(cplan=None) -> ClusterRound:
    ctx = ClusterRound("run", 4, cplan or {}, {"dev-00000", "dev-00001", "dev-00002"})
    ctx.plan = PHASES
    return ctx


def _edge_plan(clip=1.0, multiplier=2.0) -> NoisePlan:
    return NoisePlan([instructions.parse(instructions.build("edge", "global", "gaussian", multiplier, 0.5, clip=clip,
                                                            clip_at=["edge"]))])


def _release(noise, cplan=None) -> EdgeRelease:
    return EdgeRelease(noise, cplan or {}, "edge-000", 0, 100, 0, "seeded")


def _sign_vote_edge():
    return plugins._import_file(str(ROOT / "examples" / "sign_vote_mode.py")).SignVoteEdge


def test_the_sign_vote_example_overrides_combine_only():
    edge = _sign_vote_edge()
    assert issubclass(edge, DigitalEdge) and {k for k in vars(edge) if not k.startswith("__")} == {"combine"}


def test_an_empty_plan_leaves_combine_alone():
    seen = []

    def combine(vectors, weights):
        seen.append([v.copy() for v in vectors])
        return np.mean(vectors, axis=0)

    ctx = _ctx()
    out = _release(NoisePlan())(combine, ctx, VECS, [1, 1, 1], [10, 10, 10], ["a", "b", "c"], PHASES[0], 0)
    np.testing.assert_array_equal(out, np.mean(VECS, axis=0))
    assert all(np.array_equal(a, b) for a, b in zip(seen[0], VECS)) and not ctx.dp_records and ctx.clipped == 0


def test_the_edge_clips_before_and_adds_its_noise_after_any_combine():
    vote = _sign_vote_edge().combine
    seen = []

    def combine(vectors, weights):
        seen.extend(vectors)
        return vote(None, vectors, weights)

    ctx = _ctx()
    nodes = ["dev-00000", "dev-00001", "dev-00002"]
    out = _release(_edge_plan())(combine, ctx, VECS, [1, 1, 1], [10, 10, 10], nodes, PHASES[0], 0)
    assert all(np.linalg.norm(v) <= 1.0 + 1e-6 for v in seen) and ctx.clipped == 2  # norms 3 and 2 were over
    assert not np.array_equal(out, vote(None, seen, [1, 1, 1]))  # the noise went on after the vote
    assert [(r.tier, r.node, r.stream, r.covers) for r in ctx.dp_records] == [("edge", "edge-000", "global",
                                                                               tuple(nodes))]


def test_the_fixed_denominator_is_the_registered_aggregator_whatever_the_mode_combines():
    ctx = _ctx({"fixed_denominator": 20.0})
    out = _release(NoisePlan(), {"fixed_denominator": 20.0})(lambda v, w: 1 / 0, ctx, VECS, [1, 1, 1], [2, 3, 5],
                                                             ["a", "b", "c"], PHASES[0], 0)
    np.testing.assert_array_equal(out, fixed_denominator_sum(VECS, [2 / 20.0, 3 / 20.0, 5 / 20.0]))
    empty = _release(NoisePlan(), {"fixed_denominator": 20.0})
    assert empty.always and not _release(NoisePlan()).always  # an empty draw still releases
    np.testing.assert_array_equal(empty(None, ctx, [], [], [], [], PHASES[0], 0), np.zeros(100, np.float32))


def test_a_mode_that_settles_its_own_phases_is_refused_an_edge_release():
    with pytest.raises(NoisePlanError, match="edge release"):
        _release(_edge_plan()).require(True, "MyEdge")
    _release(_edge_plan()).require(False, "DigitalEdge")
    _release(NoisePlan()).require(True, "AirEdge")  # nothing to release: any mode


def test_whether_a_device_reports_statistics_is_a_plan_field():
    from hfl.common.privacy.on_wire import DeviceRelease

    def release(overrides):
        phases = plans.build_plan(load(None, overrides))
        step = next(i for i, p in enumerate(phases) if p.kind == plans.EDGE_MODEL_SYNC)
        return DeviceRelease(NoisePlan(), phases, "dev-00000", 0, 0, 0, 0, "seeded").reports_stats(step)

    assert release([]) is True
    assert release(["run.algorithm=h2fdp", "train.tau=10", "train.gamma=5"]) is False


def test_every_phase_kind_has_one_device_handler():
    from hfl.device_client import modes  # noqa: F401 - registers the air phases
    from hfl.device_client.phases import PHASES as HANDLERS

    assert set(plans.PHASE_KINDS) <= set(HANDLERS)
    with pytest.raises(ValueError, match="already registered"):
        HANDLERS.register(plans.EDGE_MODEL_SYNC, lambda device, state, step: None)
