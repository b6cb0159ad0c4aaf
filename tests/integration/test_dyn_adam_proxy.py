"""Paper 002's missing baselines and options on real processes (issue 20, item 4): Dyn-DP-SGD and Dyn-DP-FedAvg (each
round's DP events carry that round's multiplier, composed round by round), DP-Adam / DP-AdaGrad (the release and its
epsilon are DP-SGD's), Lemma 2 noise (labelled a claim) and the clip from a public proxy set. Full tier only."""
import json

import dp_accounting
import pytest
from dp_accounting import rdp

from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.schedules import dyn_base_multiplier

from .conftest import SMALL

SAMPLE = SMALL + ["run.rounds=2", "train.tau=1", "train.gamma=3", "privacy.lot_rate=0.1", "privacy.epsilon=1e9",
                  "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.0"]
DEVICES = {f"dev-{i:05d}" for i in range(6)}


def ledger(tb):
    lines = [json.loads(line) for line in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()]
    return lines, [[DpRecord.from_json(e) for e in line["events"]] for line in lines]


def test_dyn_dp_sgd_releases_each_rounds_multiplier(hfl_testbed):
    tb = hfl_testbed(overrides=SAMPLE + ["run.algorithm=dyn-dp-sgd", "privacy.dyn_budget=gdp"])
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 2 and not summary.get("node_deaths")
    lines, events = ledger(tb)
    z0 = dyn_base_multiplier(1.0, rho_mu=0.5, rounds=2, steps=3, q=0.1, budget="gdp")
    acc = rdp.RdpAccountant()
    for r, round_events in enumerate(events):
        assert {e.tier for e in round_events} == {"device-sample"}
        assert {d for e in round_events for d in e.covers} == DEVICES
        assert [e.noise_multiplier for e in round_events] == pytest.approx([z0 * 0.5 ** (r / 2)] * len(round_events))
        assert [e.sensitivity for e in round_events] == pytest.approx([0.5 ** (r / 2)] * len(round_events))  # C_r
        acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z0 * 0.5 ** (r / 2))), 3)
    assert lines[-1]["epsilon"] == pytest.approx({d: acc.get_epsilon(1e-5) for d in DEVICES}, rel=1e-9)
    assert summary["privacy"]["schedule"]["name"] == "dyn"


def test_dyn_dp_fedavg_edges_add_each_rounds_noise(hfl_testbed):
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=2", "run.algorithm=dyn-dp-fedavg", "privacy.trust=trusted",
                                        "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.0",
                                        "privacy.epsilon=1e9", "privacy.clip=2.0"])
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 2 and not summary.get("node_deaths")
    _, events = ledger(tb)
    z0 = dyn_base_multiplier(1.0, rho_mu=0.5, rounds=2, steps=1, q=1.0)
    for r, round_events in enumerate(events):
        assert {e.tier for e in round_events} == {"edge"}
        assert [e.noise_multiplier for e in round_events] == pytest.approx([z0 * 0.5 ** (r / 2)] * len(round_events))
    # unsampled Gaussians compose exactly: the run's multiplier is (sum_r 1 / z_r^2)^(-1/2), the constant one's 1/sqrt 2
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(1.0 / sum((z0 * 0.5 ** (r / 2)) ** -2 for r in range(2)) ** 0.5))
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_dp_adam_and_adagrad_are_charged_as_dp_sgd(hfl_testbed, optimizer):
    tb = hfl_testbed(overrides=SAMPLE + ["run.algorithm=dp-sgd", f"privacy.optimizer={optimizer}", "train.lr=0.01"])
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 2 and not summary.get("node_deaths")
    _, events = ledger(tb)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 6)
    assert {e.noise_multiplier for round_events in events for e in round_events} == {1.0}
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)  # DP-SGD's, by post-processing
    assert summary["privacy"]["optimizer"] == optimizer and summary["final_accuracy"] > 0.0


def test_lemma2_and_the_proxy_clip_on_dp_sgd_wav(hfl_testbed):
    tb = hfl_testbed(overrides=SAMPLE + ["run.algorithm=dp-sgd-wav", "privacy.wavelet_mode=sound",
                                         "privacy.wavelet_sigma=lemma2", "privacy.clip_rule=median_proxy",
                                         "privacy.clip_proxy=64"])
    summary = tb.wait(timeout=300)
    assert summary["rounds"] == 2 and not summary.get("node_deaths")
    _, events = ledger(tb)
    clip = summary["privacy"]["clip"]
    assert clip != 1.0 and summary["privacy"]["clip_rule"] == "median_proxy"
    sens = [e.sensitivity for round_events in events for e in round_events]
    assert sens == pytest.approx([clip] * len(sens))
    assert all(e.noise_multiplier < 1.0 for round_events in events for e in round_events)  # Lemma 2's smaller noise
    assert summary["epsilon_claimed"] < summary["epsilon"] and summary["privacy"]["wavelet_sigma"].startswith("lemma2")
