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
