"""The run's plane, one air slot as the medium computes it, the medium's checks of an edge's emissions, and the
air-slot clock (paper 003; channel.plane, channel.medium, cloud_server.medium, round_clock.EdgeClock.air_phase)."""
import dataclasses
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from hfl.cloud_server.medium import Medium
from hfl.common import config as config_mod
from hfl.common import plans, wire
from hfl.common.channel import ota
from hfl.common.channel import medium as medium_fn
from hfl.common.channel import plane as air
from hfl.common.channel.round_clock import EdgeClock, slot
from hfl.proto import hfl_v1_pb2 as pb

BASE = ["topology.edges=3", "topology.devices_per_edge=4", "channel.model=ota", "run.algorithm=multiairfed",
        "train.tau=3", "train.gamma=1"]


def _cfg(*extra):
    return config_mod.load(None, BASE + list(extra))


def _quiet(plane, receiver="unbiased"):
    params = dataclasses.replace(plane.params, interference=False, noise=False)
    return dataclasses.replace(plane, params=params, receiver=receiver)


def test_the_runs_edges_are_the_collaborating_clusters_of_a_seeded_plane():
    cfg = _cfg()
    plane = air.plane_for(cfg)
    top = plane.topology
    assert top.collaborating == 3 and top.n_edges > 3  # interferer clusters fill the 1 km window
    assert np.array_equal(top.device_edge[:12], np.repeat(np.arange(3), 4))  # dev-k of the run is plane device k
    assert np.all(top.device_edge[12:] >= 3)
    assert np.array_equal(air.plane_for(_cfg()).topology.devices, top.devices)  # any process draws the same plane
    assert not np.array_equal(air.plane_for(_cfg("run.seed=1")).topology.edges, top.edges)
    assert plane.rho == pytest.approx(ota.rho_for(top, plane.params))
    assert plane.psi == pytest.approx(ota.psi_corrected(20e-6, 15, 1.0, 4.0, 4.0, 4e-15))  # M_n = 15 interferers


def _slot_inputs(plane, phases, round_, step, d=200, seed=0, equal_sigma=False):
    active = air.activity(plane, phases, round_, step)
    tx = np.flatnonzero(active[:12])
    rng = np.random.default_rng(seed)
    true = rng.normal(0.3, 1.0, (tx.size, d)) * (1.0 if equal_sigma else rng.uniform(0.5, 2.0, (tx.size, 1)))
    if equal_sigma:
        true = (true - true.mean(axis=1, keepdims=True)) / true.std(axis=1, keepdims=True) * 0.7 + rng.normal(
            0, 1, (tx.size, 1))
    bar, mu, sigma = air.normalise(true)
    return tx, true, bar, mu, sigma


@pytest.mark.parametrize("group", [False, True])
def test_orthogonal_slot_gives_every_device_the_exact_mean_of_its_active_set(group):
    cfg = _cfg("channel.model=orthogonal")
    plane = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    step = air.air_steps(phases)[-1] if group else 0
    tx, true, bar, mu, sigma = _slot_inputs(plane, phases, 0, step)
    listen = np.arange(12)
    res = medium_fn.air_slot(plane, 0, step, group, bar, tx, mu, sigma, listen, air.alive(plane, phases, 0, step),
                             np.random.default_rng(0))
    cluster = plane.topology.device_edge
    for i, dev in enumerate(listen):
        chosen = np.ones(tx.size, bool) if group else cluster[tx] == cluster[dev]
        np.testing.assert_allclose(res.rows[i], true[chosen].mean(axis=0), rtol=1e-5, atol=1e-5)
        assert res.n_active[i] == chosen.sum()
    np.testing.assert_allclose(res.ideal, true.mean(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [False, True])
def test_ota_chain_without_interference_and_noise_reproduces_eqs_6_and_11(group):
    """Uplink inversion, the edge's (or the core's) power normalisation by the shared E, the downlink and the
    device's estimator: with equal sigma the unbiased receiver returns the exact mean (eq. 21 -> eq. 6)."""
    cfg = _cfg()
    plane = _quiet(air.plane_for(cfg))
    phases = plans.build_plan(cfg)
    step = air.air_steps(phases)[-1] if group else 0
    tx, true, bar, mu, sigma = _slot_inputs(plane, phases, 0, step, equal_sigma=True)
    listen = np.arange(12)
    res = medium_fn.air_slot(plane, 0, step, group, bar, tx, mu, sigma, listen, air.alive(plane, phases, 0, step),
                             np.random.default_rng(0))
    est, ok = medium_fn.estimates(plane, res, 0, step, group, plane.psi)
    cluster = plane.topology.device_edge
    for i, dev in enumerate(listen):
        chosen = np.ones(tx.size, bool) if group else cluster[tx] == cluster[dev]
        if ok[i]:
            np.testing.assert_allclose(est[i], true[chosen].mean(axis=0), rtol=1e-4, atol=1e-4)
    assert ok.sum() >= 10


def test_mmse_receiver_is_eq_27_and_shrinks():
    cfg = _cfg("channel.receiver=mmse")
    plane = _quiet(air.plane_for(cfg), "mmse")
    phases = plans.build_plan(cfg)
    tx, true, bar, mu, sigma = _slot_inputs(plane, phases, 0, 0, equal_sigma=True)
    res = medium_fn.air_slot(plane, 0, 0, False, bar, tx, mu, sigma, np.arange(12), air.alive(plane, phases, 0, 0),
                             np.random.default_rng(0))
    est = air.device_estimates(plane, res.rows[:1], [0], 0, 0, res.n_active[:1], res.E[:1], res.sigma_sum[:1],
                               res.mu_mean[:1], 1, plane.psi, True)[0]
    f_o = ota.own_downlink_fading(plane.topology, slot(0, 0), plane.seed, [0], plane.params)
    dist = np.linalg.norm(plane.topology.offsets[[0]], axis=1)
    theta = ota.receive_factor(res.sigma_sum[0], res.n_active[0], plane.beta,
                               ota.downlink_gain(f_o, dist, 4.0), plane.psi / plane.rho)
    mine = plane.topology.device_edge[tx] == 0
    exact = true[mine].mean(axis=0)
    shrink = float(theta[0] / (res.sigma_sum[0] / res.n_active[0]))
    assert 0 < shrink < 1
    np.testing.assert_allclose(est - res.mu_mean[0], shrink * (exact - res.mu_mean[0]), rtol=1e-3, atol=1e-4)


def test_a_device_that_fails_th0_sits_out_the_round_but_hears_the_final_model():
    cfg = _cfg("channel.th0=1.0")  # |f_o|^2 ~ Exp(mean 10): fails with probability 1 - e^-0.1 ~ 9.5%
    plane = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    steps = air.air_steps(phases)
    for round_ in range(50):
        fails = ~air.passes_th0(plane, round_, steps[0], np.arange(12))
        if fails.any():
            break
    dev = int(np.flatnonzero(fails)[0])
    assert air.alive(plane, phases, round_, steps[0])[dev]
    for step in steps[1:-1]:
        assert not air.alive(plane, phases, round_, step)[dev]
        assert not air.listeners(plane, phases, round_, step)[dev]
        assert not air.activity(plane, phases, round_, step)[dev]
    assert air.listeners(plane, phases, round_, steps[-1])[dev] and not air.activity(plane, phases, round_, steps[-1])[dev]
    assert air.alive(plane, phases, round_, steps[-1])[12:].all()  # interferers never drop
    orth = air.plane_for(_cfg("channel.th0=1.0", "channel.model=orthogonal"))
    assert air.passes_th0(orth, round_, steps[0], np.arange(12)).all()  # ideal downlink


def _emission(cfg, medium, round_, step, edge=0, tweak=None):
    phases = plans.build_plan(cfg)
    plane = medium.plane
    active = air.activity(plane, phases, round_, step)
    members = [4 * edge + k for k in range(4)]
    env = pb.Envelope(meta=pb.Meta(run_id="r", round=round_, step=step, phase=phases[step].kind,
                                   sender_id=f"edge-{edge:03d}"))
    rng = np.random.default_rng(step)
    for k in members:
        row = env.air.rows.add(node=f"dev-{k:05d}")
        if active[k]:
            bar, _, _ = air.normalise(rng.normal(size=(1, medium.dim)))
            row.tensor.CopyFrom(wire.encode(bar[0].astype(np.float32), "float32", "air"))
            row.mu, row.sigma = 0.1, 0.5
    if tweak:
        tweak(env, active, members)
    return env, phases


def _code(fn):
    with pytest.raises(wire.WireError) as err:
        fn()
    return err.value.code


def test_the_medium_refuses_bad_emissions_and_closed_slots(tmp_path):
    cfg = _cfg()
    medium = Medium(cfg, tmp_path, dim=64)
    assert (tmp_path / "topology.json").exists() and (tmp_path / "topology.png").stat().st_size > 0
    env, phases = _emission(cfg, medium, 0, 0)
    emission = medium.parse(env, 0, phases)
    assert set(emission.listen) == {f"dev-{k:05d}" for k in range(4)}

    def inactive_payload(env, active, members):
        idle = [k for k in members if not active[k]]
        row = env.air.rows[members.index(idle[0])]
        bar, _, _ = air.normalise(np.random.default_rng(0).normal(size=(1, 64)))
        row.tensor.CopyFrom(wire.encode(bar[0].astype(np.float32), "float32", "air"))
        row.mu, row.sigma = 0.0, 1.0

    def nan_sigma(env, active, members):
        next(r for r in env.air.rows if r.HasField("tensor")).sigma = float("nan")

    def loud(env, active, members):
        tensor = next(r for r in env.air.rows if r.HasField("tensor")).tensor
        tensor.data = (np.frombuffer(tensor.data, np.float32) * 3).tobytes()

    def stranger(env, active, members):
        env.air.rows.add(node="dev-00007")  # a device of edge-001

    step = next(s for s in air.air_steps(phases)
                if not air.activity(medium.plane, phases, 0, s)[:4].all())  # a slot with an idle device
    assert _code(lambda: medium.parse(_emission(cfg, medium, 0, step, tweak=inactive_payload)[0], 0, phases)) \
        == grpc.StatusCode.FAILED_PRECONDITION
    for tweak in (nan_sigma, loud, stranger):
        assert _code(lambda: medium.parse(_emission(cfg, medium, 0, 0, tweak=tweak)[0], 0, phases)) \
            == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: medium.parse(env, 1, phases)) == grpc.StatusCode.FAILED_PRECONDITION  # wrong round
    local = phases.index(next(p for p in phases if p.kind == plans.LOCAL_SGD))
    env.meta.step = local
    assert _code(lambda: medium.parse(env, 0, phases)) == grpc.StatusCode.FAILED_PRECONDITION  # not an air phase
    env.meta.step = 0

    import asyncio

    async def close_slot():
        emissions = [medium.parse(_emission(cfg, medium, 0, 0, edge=e)[0], 0, phases) for e in range(3)]
        replies = await asyncio.gather(*(medium.air(f"edge-{e:03d}", emissions[e], 0, 0, phases,
                                                    lambda: [f"edge-{i:03d}" for i in range(3)], 30) for e in range(3)))
        return replies

    replies = asyncio.run(close_slot())
    for e, (head, *rows) in enumerate(replies):  # a head, then one envelope per device
        assert [t.name for r in rows for t in r.tensors] == [f"dev-{4 * e + k:05d}" for k in range(4)]
        assert head.scalars["n_active"] >= 1 and head.scalars["E"] > 0 and not head.tensors
    assert _code(lambda: medium.parse(env, 0, phases)) == grpc.StatusCode.FAILED_PRECONDITION  # slot closed
    cols = medium.round_columns(0, {})
    assert cols["air_slots"] == 1 and cols["air_transmitters"] == cols["air_active_expected"]


def test_air_slot_clock_on_a_hand_computed_case():
    cfg = _cfg("clock.cpu_spread=0")
    plane = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    members = [f"dev-{k:05d}" for k in range(4)]
    ec = EdgeClock(cfg, 0, members, {m: 100 for m in members})
    ec.start(0, phases, [], 0)
    active = air.activity(plane, phases, 0, 0)
    d = 1000
    contributions = {m: SimpleNamespace(vec=np.zeros(d) if active[k] else None, scalars={})
                     for k, m in enumerate(members)}
    ec.air_phase(0, contributions, plane, d)
    b = cfg.train.batch_size
    compute = b * cfg.clock.cycles_per_sample / cfg.clock.cpu_hz  # one mini-batch per device
    assert ec.seconds == pytest.approx(compute + 2 * d / 1e6)
    tx = np.flatnonzero(active[:4])
    f = ota.own_uplink_fading(plane.topology, slot(0, 0), plane.seed, tx, plane.params)
    p2 = plane.rho * np.linalg.norm(plane.topology.offsets[tx], axis=1) ** 4 / np.abs(f) ** 2
    cycles = b * cfg.clock.cycles_per_sample
    expected = p2.sum() * d / 1e6 + 4 * cfg.clock.kappa * cfg.clock.cpu_hz ** 2 * cycles
    assert ec.device_j == pytest.approx(expected)
    assert ec.edge_j == pytest.approx(1.0 * d / 1e6)
    before = ec.seconds
    ec.air_phase(4, contributions, plane, d)  # the inter-cluster slot: backhaul up and down
    # steps 1-4 since the last upload: two gradient slots and one local step, three mini-batches
    assert ec.seconds - before == pytest.approx(3 * compute + 2 * d / 1e6 + 2 * 64 * d / 1e8)


@pytest.mark.parametrize("overrides, key", [
    (["run.algorithm=multiairfed"], "needs channel.model = ota or orthogonal"),
    (["run.algorithm=hierfavg", "channel.model=ota"], "needs channel.model = ideal"),
    (BASE + ["pipeline.clip=clip_l2"], "pipeline.clip"),
    (BASE + ["train.participants=2"], "train.participants"),
    (BASE + ["channel.alpha=2"], "channel.alpha"),
    (BASE + ["channel.r0=40"], "channel.r0"),
    (BASE + ["channel.window_radius=50", "channel.lambda_p=1"], "channel.window_radius"),
    (BASE + ["channel.weighting=samples"], "channel.weighting"),  # BASE is on ota: D_y weighting is orthogonal-only
])
def test_bad_medium_configs_name_the_key(overrides, key):
    with pytest.raises(config_mod.ConfigError, match=key.replace(".", r"\.")):
        config_mod.load(None, overrides)


def test_a_slot_nobody_transmits_in_still_answers_everyone():
    cfg = _cfg()
    plane = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    res = medium_fn.air_slot(plane, 0, 0, False, np.zeros((0, 50), np.float32), [], [], [], np.arange(12),
                             air.alive(plane, phases, 0, 0), np.random.default_rng(0))
    assert res.rows.shape == (12, 50) and (res.n_active == 0).all() and res.ideal is None  # in-phase rows
    est, ok = medium_fn.estimates(plane, res, 0, 0, False, plane.psi)
    assert not ok.any()  # nothing to estimate from: no device updates


def test_the_slot_barrier_survives_a_cancelled_closer_and_skips_refused_edges(tmp_path):
    import asyncio
    import time

    cfg = _cfg()
    medium = Medium(cfg, tmp_path, dim=64)
    phases = plans.build_plan(cfg)
    every = lambda: [f"edge-{i:03d}" for i in range(3)]  # noqa: E731

    async def scenario():
        em = [medium.parse(_emission(cfg, medium, 0, 0, edge=e)[0], 0, phases) for e in range(3)]
        waiting = [asyncio.create_task(medium.air(f"edge-{e:03d}", em[e], 0, 0, phases, every, 30)) for e in range(2)]
        await asyncio.sleep(0.05)
        closer = asyncio.create_task(medium.air("edge-002", em[2], 0, 0, phases, every, 30))
        await asyncio.sleep(0)  # it starts the close ...
        closer.cancel()  # ... and dies
        replies = await asyncio.gather(*waiting)
        # next slot: edge-002's emission is refused; the others must not wait 30 s for it
        em = [medium.parse(_emission(cfg, medium, 0, 1, edge=e)[0], 0, phases) for e in range(2)]
        started = time.monotonic()
        pending = [asyncio.create_task(medium.air(f"edge-{e:03d}", em[e], 0, 1, phases, every, 30)) for e in range(2)]
        await asyncio.sleep(0.05)
        medium.refused("edge-002", 0, 1, 30)
        later = await asyncio.gather(*pending)
        return replies, later, time.monotonic() - started

    replies, later, seconds = asyncio.run(scenario())
    assert all(r is not None and len(r) == 5 for r in replies + later)  # head + 4 devices
    assert seconds < 5


def test_implausible_side_information_is_left_out_of_the_slot():
    """Issue 24, finding 2: one device claiming sigma = 1e12 (or mu far off) would scale the whole superposition."""
    from hfl.common.channel.medium import side_info_accepted

    sigma = np.array([0.9, 1.1, 1.0, 1e12, 0.8])
    mu = np.array([0.0, 0.1, -0.1, 0.0, 0.05])
    assert side_info_accepted(mu, sigma, 100.0).tolist() == [True, True, True, False, True]
    assert side_info_accepted(mu + np.array([0, 0, 0, 0, 1e6]), np.ones(5), 100.0).tolist() == [True] * 4 + [False]
    # two transmitters: each judged by the other; one alone, or the check off: accepted
    assert side_info_accepted([0.0, 0.0], [1.0, 1e30], 100.0).tolist() == [True, False]
    assert side_info_accepted([0.0], [1e30], 100.0).tolist() == [True]
    assert side_info_accepted(mu, sigma, 0.0).all()
    # honest spread of 50x passes at the default bound
    assert side_info_accepted(np.zeros(4), [1.0, 50.0, 2.0, 0.5], 100.0).all()


def test_a_silent_edge_costs_one_slots_wait_not_every_slots(tmp_path):
    """Issue 24, finding 5: an edge alive but silent on the medium is waited for once; the slot that closes
    without it drops it for the round's later slots (the cloud's `drop`), so the others' round completes."""
    import asyncio
    import time

    cfg = _cfg()
    medium = Medium(cfg, tmp_path, dim=64)
    phases = plans.build_plan(cfg)
    absent: set = set()
    expected = lambda: [f"edge-{i:03d}" for i in range(3) if f"edge-{i:03d}" not in absent]  # noqa: E731

    async def scenario():
        seconds = []
        for step in range(2):
            started = time.monotonic()
            em = [medium.parse(_emission(cfg, medium, 0, step, edge=e)[0], 0, phases) for e in range(2)]
            replies = await asyncio.gather(*(medium.air(f"edge-{e:03d}", em[e], 0, step, phases, expected, 1.0,
                                                        absent.update) for e in range(2)))
            assert all(r is not None for r in replies)
            seconds.append(time.monotonic() - started)
        return seconds

    first, second = asyncio.run(scenario())
    assert absent == {"edge-002"}
    # the first slot waited its 1 s for edge-002, the second did not wait again (each slot timed alone: a loaded
    # machine's slowness in the first slot cannot read as a second wait)
    assert first >= 1.0 and second < 1.0, (first, second)
    assert medium.round_columns(0, {})["air_edges_dropped"] == 1


def test_dy_side_info_is_the_normalisation_of_dy_times_the_payload():
    """Sending D_y x (digest 2.1) normalises to the same unit payload as x, with side information D_y (mu, sigma)."""
    rng = np.random.default_rng(3)
    x, D = rng.normal(0.4, 1.5, (5, 64)), rng.integers(100, 1001, 5)
    bar, mu, sigma = air.normalise(x)
    bar_w, mu_w, sigma_w = air.normalise(D[:, None] * x)
    np.testing.assert_allclose(bar_w, bar, atol=1e-5)
    np.testing.assert_allclose(ota.dy_side_info(mu, sigma, D), (mu_w, sigma_w), rtol=1e-6)
    assert ota.dy_count(D, [0, 1, 0, 2, 1], 3).tolist() == [D[0] + D[2], D[1] + D[4], D[3]]
    with pytest.raises(ValueError, match="D_y"):
        ota.dy_side_info(mu, sigma, [1, 2, 0, 4, 5])


@pytest.mark.parametrize("group", [False, True])
def test_dy_weighted_orthogonal_slot_is_the_weighted_mean(group):
    """g_x = sum_{y in A_x} D_y g_y / sum_{y in A_x} D_y (eq. 6 with D_y-weighting); the core's w^G likewise over
    every active device of the group (eq. 11)."""
    cfg = _cfg("channel.model=orthogonal")
    plane = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    step = air.air_steps(phases)[-1] if group else 0
    tx, true, bar, mu, sigma = _slot_inputs(plane, phases, 0, step)
    D = np.random.default_rng(1).integers(100, 1001, tx.size).astype(float)  # paper 003's sizes on [100, 1000]
    listen = np.arange(12)
    res = medium_fn.air_slot(plane, 0, step, group, bar, tx, mu, sigma, listen, air.alive(plane, phases, 0, step),
                             np.random.default_rng(0), samples=D)
    cluster = plane.topology.device_edge
    for i, dev in enumerate(listen):
        chosen = np.ones(tx.size, bool) if group else cluster[tx] == cluster[dev]
        weighted = sum(D[j] * true[j] for j in np.flatnonzero(chosen)) / D[chosen].sum()
        np.testing.assert_allclose(res.rows[i], weighted, rtol=1e-4, atol=1e-4)
        assert res.n_active[i] == D[chosen].sum()
    np.testing.assert_allclose(res.ideal, (D[:, None] * true).sum(axis=0) / D.sum(), rtol=1e-4, atol=1e-4)
    assert not np.allclose(res.ideal, true.mean(axis=0), atol=1e-3)  # the weights matter
    with pytest.raises(ValueError, match="orthogonal"):
        medium_fn.air_slot(air.plane_for(_cfg()), 0, step, group, bar, tx, mu, sigma, listen,
                           air.alive(plane, phases, 0, step), np.random.default_rng(0), samples=D)


@pytest.mark.parametrize("overrides, label", [
    (["channel.receiver=mmse", "channel.psi_mode=paper"], "paper: MMSE receiver of eqs. 27 / 35"),
    ([], "corrected: unbiased receiver"),
    (["channel.receiver=mmse-gradients", "channel.psi_mode=paper"], "mixed: receiver mmse-gradients, Psi paper"),
    (["channel.model=orthogonal", "channel.receiver=mmse"], "orthogonal: exact means"),
])
def test_the_summary_labels_the_paper_and_the_corrected_estimator(tmp_path, overrides, label):
    described = Medium(_cfg(*overrides), tmp_path, dim=64).describe()
    assert described["estimator"].startswith(label)
    assert described["receiver"] == _cfg(*overrides).channel.receiver


def test_alive_and_activity_masks_are_computed_once_and_read_only():
    # every device of a host asks for the same slot's masks: one computation per (round, step), the same answer as
    # a fresh plane's, not writable (a caller that wrote into it would change every other device's view); a plane
    # made by dataclasses.replace (other thresholds) starts its own cache
    cfg = _cfg()
    plane = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    step = air.air_steps(phases)[-1]
    first = air.activity(plane, phases, 1, step)
    assert air.activity(plane, phases, 1, step) is first and not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = not first[0]
    fresh = dataclasses.replace(plane)
    assert fresh.masks == {} and np.array_equal(air.activity(fresh, phases, 1, step), first)
    assert np.array_equal(air.alive(fresh, phases, 1, step), air.alive(plane, phases, 1, step))
    strict = dataclasses.replace(plane, params=dataclasses.replace(plane.params, th0=0.5, th1=2.0))
    assert air.activity(strict, phases, 1, step).sum() < first.sum()
