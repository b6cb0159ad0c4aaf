"""Sample-level DP-SGD / DP-SGD-WAV on the devices and DP-FedAvg-WAV at trusted edges, on real processes (paper 002):
the events each device puts on its uploads, the ledger the cloud composes from them, the paper mode's claim."""
import json
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting import rdp

from hfl.common.privacy.events import DpRecord

from .conftest import SMALL

SAMPLE = SMALL + ["run.rounds=2", "train.tau=2", "train.gamma=4", "privacy.lot_rate=0.1", "privacy.epsilon=20"]
DEVICES = {f"dev-{i:05d}" for i in range(6)}


def ledger_events(tb):
    lines = [json.loads(line) for line in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()]
    return lines, [[DpRecord.from_json(e) for e in line["events"]] for line in lines]


@pytest.mark.parametrize("algorithm", ["dp-sgd", "dp-sgd-wav"])
def test_dp_sgd_on_every_device_is_accounted_per_device(hfl_testbed, algorithm):
    tb = hfl_testbed(overrides=SAMPLE + [f"run.algorithm={algorithm}"])
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 2 and not summary.get("node_deaths")
    lines, events = ledger_events(tb)
    assert [line["round"] for line in lines] == [0, 1]
    for round_events in events:
        # every device released its own lots: tau x gamma = 8 subsampled Gaussians per round, nobody else adds noise
        assert {e.tier for e in round_events} == {"device-sample"}
        per_device = {d: sum(e.count for e in round_events if d in e.covers) for d in DEVICES}
        assert per_device == {d: 8 for d in DEVICES}
        assert {e.sampling_rate for e in round_events} == {0.1}
    z = events[0][0].noise_multiplier
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z)), 16)
    assert lines[-1]["epsilon"] == pytest.approx({d: acc.get_epsilon(1e-5) for d in DEVICES}, rel=1e-9)
    assert acc.get_epsilon(1e-5) <= 20.0 and summary["epsilon"] == pytest.approx(20.0, rel=1e-3)  # the budget, spent
    assert summary["privacy"]["mechanism"] == ("wavelet" if algorithm.endswith("wav") else "gaussian")
    assert "epsilon_claimed" not in summary
    assert summary["final_accuracy"] > 0.0


def test_paper_wavelet_calibration_is_labelled_a_claim(hfl_testbed):
    tb = hfl_testbed(overrides=SAMPLE + ["run.algorithm=dp-sgd-wav", "privacy.calibration=paper", "run.rounds=1"])
    summary = tb.wait(timeout=300)
    assert summary["epsilon_claimed"] == pytest.approx(20.0, rel=1e-3)
    # the noise really added (std sigma C / W_c against ||H|| <= C) gives sigma / max W_c: far past the claim
    assert summary["epsilon"] > 1e3 * summary["epsilon_claimed"]
    assert "claimed" in summary["privacy"]["epsilon_label"] and summary["privacy"]["wavelet_calibration"] == "paper"


def test_fixed_lots_are_accounted_without_replacement(hfl_testbed):
    tb = hfl_testbed(overrides=SAMPLE + ["run.algorithm=dp-sgd", "privacy.lot=fixed", "run.rounds=1"])
    summary = tb.wait(timeout=300)
    lines, events = ledger_events(tb)
    assert {e.population > 0 for e in events[0]} == {True}
    e = events[0][0]  # each device its own population: its data
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        e.population, round(e.sampling_rate * e.population), dp_accounting.GaussianDpEvent(e.noise_multiplier)), 8)
    assert lines[-1]["epsilon"][e.covers[0]] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert 19.0 < summary["privacy"]["epsilon_max"] <= 20.0


def test_dp_fedavg_wav_behind_trusted_edges(hfl_testbed):
    tb = hfl_testbed(overrides=SMALL + ["run.algorithm=dp-fedavg-wav", "privacy.trust=trusted", "privacy.clip=0.5",
                                        "privacy.epsilon=50", "privacy.client_rate=0.5", "run.rounds=2",
                                        # seeded draws: with secret ones about one run in five drew no device twice,
                                        # so no device spent the planned two releases (a flaky test, not a bug)
                                        "privacy.noise_source=seeded"])
    summary = tb.wait(timeout=300)
    _, events = ledger_events(tb)
    flat = [e for round_events in events for e in round_events]
    assert summary["rounds"] == 2 and flat and {e.tier for e in flat} == {"edge"}
    planned = summary["privacy"]["noise"]["edge-000"]["global"]["epsilon_planned"]
    assert summary["privacy"]["epsilon_max"] == pytest.approx(planned, rel=1e-6) and planned <= 50


def test_dp_fedavg_wav_refused_when_a_site_lowers_its_trust(hfl_testbed):
    tb = hfl_testbed(overrides=SMALL + ["run.algorithm=dp-fedavg-wav", "privacy.trust=trusted", "run.rounds=1"],
                     extra_args={"edge-000": ["--trust", "untrusted"]})
    with pytest.raises(Exception, match="trusted aggregator"):
        tb.wait(timeout=120)


def test_dp_fedavg_wav_refused_behind_an_untrusted_edge(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hfl.cli", "run", "--out", str(tmp_path / "r"),
                          "--set", "run.algorithm=dp-fedavg-wav", "--set", 'privacy.trust_table={"edge-001" = "trusted"}'],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "user-level DP needs a trusted aggregator" in out.stderr
