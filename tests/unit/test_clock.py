"""Emulated clock and energy (paper 000 App. D, paper 001 sec. IV, paper 003 eq. 36) on hand-computed cases."""
import numpy as np
import pytest

from hfl.common.channel import clock


def test_paper_000_digital_upload_example():
    # digest 000 sec. 3: M = 7840, Q = 32, mean fading, d = 50 m -> SNR ~ 43 dB, ~14.4 Mb/s, ~17 ms, ~4.4 mJ
    beta = clock.pathloss_linear(50.0, -30.0, 3.75, 1.0)
    assert beta == pytest.approx(10 ** ((-30 - 37.5 * np.log10(50)) / 10))
    p = clock.dbm_to_watts(24.0)
    assert p == pytest.approx(0.251189, rel=1e-5)
    snr = clock.snr(p, beta, -173.0, 1e6)
    assert snr == pytest.approx(p * beta / (10 ** (-20.3) * 1e6))  # N0 W = -113 dBm = 10^(-14.3) W
    assert 10 * np.log10(snr) == pytest.approx(43.3, abs=0.1)
    t = clock.digital_air_time(7840 * 32, 1e6, snr)
    assert t == pytest.approx(7840 * 32 / (1e6 * np.log2(1 + snr)))
    assert t == pytest.approx(0.0174, abs=3e-4)
    assert clock.transmit_energy(p, t) == pytest.approx(4.4e-3, abs=0.1e-3)
    # edge -> cloud: 100 Mb/s at 38 dBm: 2.5 ms and 15.8 mJ
    tb = clock.backhaul_time(7840 * 32, 1e8)
    assert tb == pytest.approx(2.5088e-3)
    assert clock.transmit_energy(clock.dbm_to_watts(38.0), tb) == pytest.approx(15.8e-3, abs=0.1e-3)


def test_paper_001_rate_and_round_delay():
    rate = clock.shannon_rate(1e6, 1e-8 * 0.5 / 1e-10)  # h p / N0 = 50
    assert rate == pytest.approx(1e6 * np.log2(51)) and rate == pytest.approx(5.67e6, rel=1e-3)
    assert clock.qhetfed_round_delay(12, 3, 1.0, 2.0, 20.0) == 15 * 1.0 + 12 * 2.0 + 20.0


def test_paper_003_slot_compute_and_round_latency():
    t_bc = clock.ota_slot_time(225_034, 1e6)
    assert t_bc == pytest.approx(0.225034)
    t_cm = clock.compute_time(60, 20 * 2.5e6 / 60, 1e9)  # c N_b / f = 0.05 s
    assert t_cm == pytest.approx(0.05)
    assert clock.multiairfed_round_latency(6, 2, t_cm, t_bc, 10 * t_bc) == pytest.approx(5.8, abs=0.01)  # digest 3.7


def test_energy_and_phase_time():
    cycles = clock.compute_cycles(100, 1e7)  # 1e9 cycles
    assert clock.compute_energy(cycles, 1e9, 1e-28) == pytest.approx(0.1)  # kappa f^2 cycles
    assert clock.device_energy(0.5, 2.0, cycles, 1e9, 1e-28) == pytest.approx(1.1)
    per_device = clock.compute_time([10, 20, 30], 1e6, np.array([1e9, 2e9, 1e9]))
    assert np.allclose(per_device, [0.01, 0.01, 0.03])
    assert clock.phase_time(per_device) == pytest.approx(0.03)
    assert clock.phase_time([]) == 0.0
    assert clock.digital_air_time(0, 1e6, 0.0) == 0.0


def test_heterogeneous_frequencies_and_reproducible_link_gains():
    f = clock.device_frequencies(10000, 1e9, 0.5, np.random.default_rng(0))
    assert f.min() >= 0.5e9 and f.max() <= 1.5e9 and abs(f.mean() - 1e9) < 5 * 0.5e9 / np.sqrt(3 * 10000)
    assert np.all(clock.device_frequencies(5, 1e9, 0.0, np.random.default_rng(0)) == 1e9)
    a = clock.digital_link_gain(3, 9, np.arange(4000), 0, 50.0)
    assert np.array_equal(a, clock.digital_link_gain(3, 9, np.arange(4000), 0, 50.0))
    mean = clock.pathloss_linear(50.0)
    assert abs(a.mean() / mean - 1) < 5 / np.sqrt(4000)  # |u|^2 ~ Exp(1): unit SE per draw
    assert np.all(clock.digital_link_gain(3, 9, np.arange(3), 0, 50.0, fading=False) == mean)


def test_bad_inputs_raise():
    for call, word in [(lambda: clock.snr(-1.0, 1.0, -173, 1e6), "power_w"),
                       (lambda: clock.shannon_rate(0, 1.0), "bandwidth_hz"),
                       (lambda: clock.backhaul_time(10, 0), "rate_bps"),
                       (lambda: clock.compute_time(1, 1, 0.0), "cpu_hz"),
                       (lambda: clock.device_frequencies(3, 1e9, 1.0, np.random.default_rng(0)), "spread"),
                       (lambda: clock.compute_energy(1, 1e9, -1), "kappa"),
                       (lambda: clock.digital_air_time(-1, 1e6, 1.0), "bits"),
                       (lambda: clock.pathloss_linear(0.0), "distance")]:
        with pytest.raises(ValueError, match=word):
            call()


# ---- the run's clock (hfl.common.channel.round_clock): phases, rounds, geometry, config ------------------

from hfl.common import config as config_mod  # noqa: E402
from hfl.common import plans  # noqa: E402
from hfl.common.channel import round_clock as rc  # noqa: E402

N0W = 10 ** ((-173.0 - 30) / 10) * 1e6  # noise power in 1 MHz: 5.01e-15 W


def params(**kw):
    base = dict(bandwidth_hz=1e6, device_power_w=1.0, edge_power_w=2.0, noise_dbm_per_hz=-173.0, beta0_db=-30.0,
                exponent=3.75, d0=1.0, fading=False, backhaul_rate_bps=1e8, cycles_per_sample=1e7, kappa=1e-28,
                downlink=True, pace=False)
    return rc.ClockParams(**{**base, **kw})


def test_upload_phase_by_hand():
    # SNR 3 -> 2 Mb/s, SNR 1 -> 1 Mb/s at 1 W; device A: 4 Mbit (2 s) + 100 samples x 1e7 cycles at 1 GHz (1 s);
    # device B: 1 Mbit (1 s) + 300 samples at 2 GHz (1.5 s): the barrier waits 3 s for A
    seconds, joules = rc.upload_phase(params(), [4e6, 1e6], [100, 300], [3 * N0W, N0W], [1e9, 2e9])
    assert seconds == pytest.approx(3.0)
    # p t_air + kappa f^2 cycles: 1 x 2 + 1e-28 x 1e18 x 1e9 = 2.1 J; 1 x 1 + 1e-28 x 4e18 x 3e9 = 2.2 J
    assert joules == pytest.approx([2.1, 2.2])


def test_broadcast_and_round_by_hand():
    # at 2 W the receivers see SNR 3 and 1: the slower one (1 Mb/s) sets 1 s for 1 Mbit; the edge spends 2 J
    assert rc.broadcast(params(), 1e6, [1.5 * N0W, 0.5 * N0W]) == pytest.approx((1.0, 2.0))
    assert rc.broadcast(params(downlink=False), 1e6, [N0W]) == (0.0, 0.0)
    assert rc.broadcast(params(), 1e6, []) == (0.0, 0.0)
    # 1e8 bits down at 100 Mb/s (1 s), clusters of 2 s and 5 s uploading 1e8 and 2e8 bits: 1 + max(3, 7) = 8 s
    seconds, up = rc.round_time(params(), 1e8, [2.0, 5.0], [1e8, 2e8])
    assert seconds == pytest.approx(8.0) and up == pytest.approx([1.0, 2.0])
    assert rc.round_time(params(), 1e8, [], [])[0] == pytest.approx(1.0)


def cfg_of(*overrides):
    return config_mod.load(None, list(overrides))


def test_planned_samples_follow_the_trainer():
    cfg = cfg_of("train.tau=2", "train.gamma=5", "train.batch_size=32")
    hier = plans.hierfavg(cfg)  # [local 5, sync] x 2 + cloud
    assert rc.planned_samples(hier, -1, 1, 1000, 32) == 5 * 32
    assert rc.planned_samples(hier, 1, 3, 20, 32) == 5 * 20  # a batch is never larger than the shard
    q = plans.qhetfed(cfg)  # grad, grad, local 5, sync, cloud
    assert [rc.planned_samples(q, -1, 0, 1000, 32), rc.planned_samples(q, 1, 3, 1000, 32)] == [32, 5 * 32]
    epochs = plans.hierfavg(cfg_of("train.local_unit=epochs", "train.gamma=2"))
    assert rc.planned_samples(epochs, -1, 1, 70, 32) == 2 * 70


def test_edge_clock_reproduces_paper_001_round_delay():
    # fixed distance, no fading, one CPU speed, no downlink: a QHetFed round of the cluster is
    # (tau + gamma) t_CP + (tau + 1) t_DE (the paper's T_di counts tau uploads, digest 001 sec. 10)
    cfg = cfg_of("run.algorithm=qhetfed", "train.tau=3", "train.gamma=2", "train.batch_size=10",
                 "topology.devices_per_edge=2", "clock.geometry=fixed", "clock.fading=false", "clock.downlink=false")
    members = ["dev-00002", "dev-00003"]  # edge 1
    edge = rc.EdgeClock(cfg, 1, members, {m: 100 for m in members})
    phases = plans.qhetfed(cfg)
    edge.start(0, phases, members, 123_456)
    nbytes = 40_000
    for step in (0, 1, 2, 4):
        for m in members:
            edge.uploaded(step, m, nbytes)
        edge.phase(step, {m: type("C", (), {"scalars": {}})() for m in members}, 999)
    p = rc.ClockParams.from_config(cfg)
    t_cp = 10 * p.cycles_per_sample / 1e9
    t_de = float(clock.digital_air_time(8 * nbytes, 1e6, clock.snr(p.device_power_w, clock.pathloss_linear(50.0),
                                                                         -173.0, 1e6)))
    report = edge.report()
    assert report[rc.CLUSTER_SECONDS] == pytest.approx((3 + 2) * t_cp + (3 + 1) * t_de)
    e_dev = p.device_power_w * t_de * 4 + 1e-28 * 1e18 * 10 * (3 + 2) * p.cycles_per_sample
    assert report[rc.DEVICE_JOULES] == pytest.approx(2 * e_dev) and report[rc.EDGE_JOULES] == 0.0
    # a device's own count of processed samples replaces the plan's
    edge.start(1, phases, members, 0)
    edge.uploaded(0, members[0], 0)
    edge.phase(0, {members[0]: type("C", (), {"scalars": {rc.SAMPLES_PROCESSED: 40.0}})()}, 0)
    assert edge.report()[rc.CLUSTER_SECONDS] == pytest.approx(4 * t_cp)


def test_edge_clock_counts_broadcasts_with_fading_and_is_deterministic():
    cfg = cfg_of("topology.devices_per_edge=3")
    members = ["dev-00000", "dev-00001", "dev-00002"]
    phases = plans.hierfavg(cfg)

    def run(seed_cfg):
        edge = rc.EdgeClock(seed_cfg, 0, members, {m: 50 for m in members})
        edge.start(4, phases, members, 50_000)
        start = dict(edge.report())
        for m in members:
            edge.uploaded(1, m, 50_000)
        edge.phase(1, {m: type("C", (), {"scalars": {}})() for m in members}, 50_000)
        return start, edge.report()

    start, end = run(cfg)
    assert start[rc.CLUSTER_SECONDS] > 0 and start[rc.EDGE_JOULES] > 0 and start[rc.DEVICE_JOULES] == 0
    assert end[rc.CLUSTER_SECONDS] > start[rc.CLUSTER_SECONDS] and end[rc.DEVICE_JOULES] > 0
    assert run(cfg) == (start, end)
    assert run(cfg_of("topology.devices_per_edge=3", "run.seed=1"))[1] != end


def test_cloud_clock_accumulates_resumes_and_paces():
    cfg = cfg_of("clock.backhaul_rate_bps=8e6")  # 1 MB/s
    res = {"edge-001": type("R", (), {"scalars": {rc.CLUSTER_SECONDS: 2.0, rc.DEVICE_JOULES: 1.0, rc.EDGE_JOULES: 0.5,
                                                  rc.BACKHAUL_BYTES: 3e6}})(),
           "edge-000": type("R", (), {"scalars": {rc.CLUSTER_SECONDS: 4.0, rc.DEVICE_JOULES: 2.0, rc.BACKHAUL_BYTES: 1e6}})()}
    cloud = rc.CloudClock(cfg)
    row = cloud.round(res, 1e6)  # 1 s down, then max(2 + 3, 4 + 1) = 5 s
    p_edge = float(clock.dbm_to_watts(38.0))
    assert row["round_emulated_seconds"] == pytest.approx(6.0) and row["emulated_seconds"] == pytest.approx(6.0)
    assert row["device_energy_joules"] == pytest.approx(3.0)
    assert row["energy_joules"] == pytest.approx(3.5 + p_edge * 4.0)
    again = cloud.round(res, 1e6)
    assert again["emulated_seconds"] == pytest.approx(12.0)
    assert again["energy_joules_total"] == pytest.approx(2 * row["energy_joules"])
    resumed = rc.CloudClock(cfg, [row])
    assert resumed.round(res, 1e6) == again
    assert cloud.lag(1.0) == 0.0
    paced = rc.CloudClock(cfg_of("clock.pace=true"), [again])
    assert paced.lag(2.0) == pytest.approx(10.0) and paced.lag(20.0) == 0.0
    assert cloud.summary()["emulated_seconds"] == pytest.approx(12.0)


def test_run_geometry_is_seeded_and_in_the_ring():
    cfg = cfg_of("topology.edges=3", "topology.devices_per_edge=4")
    d = rc.device_distances(cfg)
    assert d.shape == (12,) and np.all((d >= 4.0) & (d <= 30.0))
    assert np.array_equal(d, rc.device_distances(cfg))
    assert not np.array_equal(d, rc.device_distances(cfg_of("topology.edges=3", "topology.devices_per_edge=4",
                                                              "run.seed=5")))
    m = rc.device_distances(cfg_of("topology.edges=3", "topology.devices_per_edge=4", "clock.geometry=matern"))
    assert m.shape == (12,) and np.all((m >= 4.0) & (m <= 30.0))
    assert np.all(rc.device_distances(cfg_of("clock.geometry=fixed", "clock.device_distance=7")) == 7.0)
    f = rc.device_cpu_hz(cfg_of("clock.cpu_spread=0.5"))
    assert np.all((f >= 0.5e9) & (f <= 1.5e9)) and len(set(f)) == len(f)


@pytest.mark.parametrize("override, key", [
    ("clock.geometry=grid", "bad value for clock.geometry"),
    ("clock.bandwidth_hz=0", "clock.bandwidth_hz"),
    ("clock.backhaul_rate_bps=-1", "clock.backhaul_rate_bps"),
    ("clock.kappa=-1e-28", "clock.kappa"),
    ("clock.cpu_spread=1.5", "clock.cpu_spread"),
    ("clock.pace=1", "clock.pace must be true or false"),
    ("clock.bogus=1", "unknown key 'clock.bogus'"),
    ("channel.r0=40", "channel.r0"),
    ("channel.model=ota", "channel.model"),
])
def test_clock_config_errors_name_the_key(override, key):
    with pytest.raises(config_mod.ConfigError, match=key.replace(".", r"\.")):
        cfg_of(override)
