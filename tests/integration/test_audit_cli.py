"""`hfl audit privacy` as a user runs it: the configured mechanism, calibrated by the run's own policy, audited at
the level of one release; a broken mechanism and the paper's wavelet calibration exceed their claims, the sound
ones do not."""
import json
import subprocess
import sys

import pytest

NOISE = ["privacy.calibration=noise_multiplier", "privacy.noise_multiplier=3", "privacy.trust=trusted"]


def audit(tmp_path, *overrides, extra=()):
    out = tmp_path / "audit"
    args = [sys.executable, "-m", "hfl.cli", "audit", "privacy", "--trials", "1000", "--out", str(out), *extra]
    for o in list(overrides) + NOISE:
        args += ["--set", o]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "audit.json").read_text())
    assert (out / "scores.png").stat().st_size > 1000 and "lower bound" in (out / "audit.md").read_text()
    assert report["audit_level"] == "one release"
    return report


@pytest.mark.parametrize("algorithm", ["dp-sgd", "dp-sgd-wav", "dp-fedavg", "dp-fedavg-wav"])
def test_sound_mechanisms_stay_at_or_below_their_claim(tmp_path, algorithm):
    report = audit(tmp_path, f"run.algorithm={algorithm}")
    # one Gaussian release at z = 3, delta 1e-5, by the tight PLD accountant (RDP's conversion says 1.386)
    assert report["epsilon_claimed"] == pytest.approx(1.271, abs=0.01)
    assert not report["exceeds_claim"] and report["epsilon_lower_bound"] <= report["epsilon_claimed"]


def test_a_broken_mechanism_is_caught(tmp_path):
    report = audit(tmp_path, "run.algorithm=dp-sgd", extra=["--break-noise", "100"])
    assert report["exceeds_claim"] and report["epsilon_lower_bound"] > 3 * report["epsilon_claimed"]


@pytest.mark.parametrize("algorithm", ["dp-sgd-wav", "dp-fedavg-wav"])
def test_the_papers_wavelet_calibration_exceeds_its_claim(tmp_path, algorithm):
    report = audit(tmp_path, f"run.algorithm={algorithm}", "privacy.wavelet_mode=paper")
    assert report["wavelet_calibration"] == "paper"
    assert report["exceeds_claim"] and report["epsilon_lower_bound"] > 3 * report["epsilon_claimed"]


def test_an_algorithm_without_an_auditable_release_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hfl.cli", "audit", "privacy", "--set", "run.algorithm=hierfavg",
                           "--out", str(tmp_path / "a")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "the audit covers" in proc.stderr


H2 = ["train.tau=10", "train.gamma=5"]


@pytest.mark.parametrize("algorithm, tier", [("hfl-dp", "device"), ("h2fdp", "edge"), ("h2fdp", "device")])
def test_by_trust_releases_are_audited_through_the_nodes_own_code(tmp_path, algorithm, tier):
    trust = ['privacy.trust_table={"edge-000" = "trusted", "edge-001" = "untrusted"}'] if algorithm == "h2fdp" else []
    report = audit(tmp_path, f"run.algorithm={algorithm}", *H2, *trust, extra=["--tier", tier])
    assert report["level"] == "by_trust" and report["epsilon_claimed"] == pytest.approx(1.271, abs=0.01)
    assert ("trusted edge" if tier == "edge" else "untrusted edge") in report["mode"]
    assert not report["exceeds_claim"]
    broken = audit(tmp_path / "broken", f"run.algorithm={algorithm}", *H2, *trust, extra=["--tier", tier,
                                                                                       "--break-noise", "100"])
    assert broken["exceeds_claim"]
