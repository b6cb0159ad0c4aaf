"""H2FDP(ctrl) on real processes: the cloud re-plans (eta, tau, participation of trusted / untrusted clusters)
every round from what the last round measured, the noise follows the new plan, and every decision is in the
metrics."""
import json

from .conftest import SMALL

CTRL = SMALL + ["run.algorithm=h2fdp", "train.tau=10", "train.gamma=5", "privacy.clip=1.0", "run.rounds=4",
                'privacy.trust_table={"edge-000" = "trusted"}', "privacy.epsilon=200", "control.controller=h2fdp",
                "control.eta=0.05"]


def test_h2fdp_controller_replans_from_measurements(hfl_testbed):
    tb = hfl_testbed(overrides=CTRL)
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    assert summary["rounds"] == 4 and summary["control"]["controller"] == "h2fdp" and summary["control"]["K_l"] == 1
    assert rows[0]["ctrl"] == "configured" and rows[0]["tau"] == 10 and rows[0]["s_trusted"] == 3
    decided = rows[1:]
    assert all(r["ctrl"] == "nested_line_search" and r["tau"] % 2 == 0 and 1 <= r["s_trusted"] <= 3
               and 1 <= r["s_untrusted"] <= 3 for r in decided)
    # the plan moves with what was measured: not every round keeps the configured (tau, s)
    assert {(r["tau"], r["s_trusted"], r["s_untrusted"]) for r in decided} != {(10, 3, 3)}
    assert all(r["devices"] == r["s_trusted"] + r["s_untrusted"] for r in rows)  # one trusted, one untrusted edge
    assert all(r["ctrl_e_dev_local"] > 0 and r["ctrl_t_dev_local"] > 0 for r in rows)
    assert all(r["beta_hat"] > 0 for r in decided)  # the devices' smoothness estimates reached the controller
    # the noise follows the plan: every DP event's sensitivity is 2 eta_k m_k G (/ s_c at the trusted edge), the
    # window m_k = tau_k / (K_l + 1) (privacy.sensitivity = window, issue 18)
    ledger = [json.loads(line) for line in (tb.run_dir / "privacy_ledger.jsonl").read_text().splitlines()]
    for row, line in zip(rows, ledger):
        for event in line["events"]:
            s_c = row["s_trusted"] if event["tier"] == "edge" else 1
            m = row["tau"] // 2  # K_l + 1 = 10 / 5 windows per round
            assert abs(event["sensitivity"] - 2 * row["lr"] * m * 1.0 / s_c) < 1e-9, (row, event)
    # beta_estimate travels in the clear (control.beta = -1): the run says it is not DP
    assert any("beta_estimate" in c for c in summary["privacy_caveats"])
    assert summary["epsilon"] <= 200 + 1e-6  # no plan over the budget
