"""Sweep runners by name (hfl/runners.py): the default testbed, and `runner = "dlg"` running the DLG attack of
`hfl attack dlg` per cell (paper 004, 9.3) with SSIM per iteration and the measured quantization variance."""
import json

import numpy as np
import pytest
import torch

from hfl import runners, sweep
from hfl.common.attacks import dlg

torch.set_num_threads(1)

DLG_SPEC = """
name = "tiny-dlg"
runner = "dlg"
seeds = [0]
[base]
"attack.iterations" = [0, 2]
"attack.max_inner" = 2
[grid]
"attack.bits" = [6, 12]
[variants.exact]
"attack.mechanisms" = ["none"]
[variants.sq]
"attack.mechanisms" = ["sq"]
[[claim]]
id = "004/9.3"
statement = "the exact update leaks at least as much as SQ-FL"
kind = "order"
metric = "ssim_final"
cells = ["exact,attack.bits=12", "sq,attack.bits=12"]
relation = [">="]
"""


def spec_of(tmp_path, text):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return sweep.load_spec(path)


def test_runners_are_a_registry_and_testbed_is_the_default(tmp_path):
    assert runners.RUNNERS.names() == ["dlg", "testbed"]
    spec = spec_of(tmp_path, "[base]\n'run.rounds' = 2\n")
    assert spec.runner == "testbed" and spec.report["fields"] == ["final_accuracy"]
    with pytest.raises(sweep.SweepError, match="runner = 'nope': unknown; runners: dlg, testbed"):
        spec_of(tmp_path, 'runner = "nope"\n')


def test_a_dlg_spec_splits_attack_keys_from_the_run_config(tmp_path):
    spec = spec_of(tmp_path, DLG_SPEC)
    assert spec.report["fields"][:3] == ["ssim_start", "ssim_final", "ssim_gain"]  # the runner's default report
    runs = sweep.expand(spec, tmp_path / "out")
    assert len(runs) == 4
    one = next(r for r in runs if r.cell == "sq,attack.bits=12")
    assert (one.settings.mechanisms, one.settings.bits, one.settings.iterations) == (("sq",), 12, (0, 2))
    assert one.config.run.seed == 0 and one.config.data.dataset == "mnist-embedded"
    assert "[attack]\n" in runners.RUNNERS.get("dlg").config_text(one)


@pytest.mark.parametrize("extra, message", [
    ('[variants.two]\n"attack.mechanisms" = ["sq", "dpsq"]\n', "one mechanism per cell"),
    ('[variants.bad]\n"attack.mechanisms" = ["sq"]\n"attack.colour" = 1\n', "unknown key attack.colour"),
    ('[variants.bad]\n"attack.mechanisms" = ["sq"]\n"attack.range_mode" = "wide"\n', "range_mode"),
])
def test_bad_attack_settings_are_refused_before_anything_runs(tmp_path, extra, message):
    text = DLG_SPEC.split("[[claim]]")[0] + extra
    with pytest.raises(sweep.SweepError, match=message):
        sweep.expand(spec_of(tmp_path, text), tmp_path / "out")


def test_a_privacy_audit_needs_the_testbed_runner(tmp_path):
    with pytest.raises(sweep.SweepError, match="runner 'dlg' has no privacy audit"):
        spec_of(tmp_path, DLG_SPEC.split("[[claim]]")[0] + "[report]\naudit = { trials = 10 }\n")


def test_a_dlg_sweep_writes_ssim_per_iteration_the_quantization_variance_and_the_images(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(DLG_SPEC)
    out = tmp_path / "out"
    assert sweep.run_sweep(path, out, quiet=True) == 0
    sq = out / "sq,attack.bits=12" / "seed-0"
    summary = json.loads((sq / "summary.json").read_text())
    rows = [json.loads(line) for line in (sq / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2] and [r["ssim"] for r in rows][-1] == summary["ssim_final"]
    assert set(summary["ssim"]) == {"0", "2"} and summary["ssim_gain"] == summary["ssim_final"] - summary["ssim_start"]
    assert 0 < summary["quantization_variance"] < summary["update_variance"] * 1e-3  # 12 bits: a tiny error
    exact = json.loads((out / "exact,attack.bits=6" / "seed-0" / "summary.json").read_text())
    assert exact["quantization_variance"] == 0 and exact["error_to_signal"] == 0
    # the exact update ignores the bit width: attacked once, copied to the other cell
    copy = json.loads((out / "exact,attack.bits=12" / "seed-0" / "summary.json").read_text())
    assert copy["same_attack_as"] == "exact,attack.bits=6" and copy["ssim"] == exact["ssim"]
    assert "same_attack_as" not in exact
    for f in ("dlg.png", "dlg.json", "dlg_images.npz"):
        assert (sq / f).is_file()
    result = json.loads((out / "results.json").read_text())
    assert {"dlg_reconstructions.png", "ssim_final_vs_bits.png"} <= set(result["plots"])
    assert (out / "dlg_reconstructions.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "results.md").read_text()
    assert "## Reconstructions" in md and "[seed 0](sq,attack.bits=12/seed-0/dlg.png)" in md
    assert result["claims"][0]["values"]["exact,attack.bits=12"]["n"] == 1
    assert "done sq,attack.bits=12 seed 0: SSIM" in capsys.readouterr().err
    # --report-only keeps the runner's section
    assert sweep.run_sweep(path, out, quiet=True, only_report=True) == 0
    assert "## Reconstructions" in (out / "results.md").read_text()


@pytest.mark.parametrize("codec, params, ratio", [
    ("sq", {}, 1 / 6),                       # unbiased SR: t (1 - t) Delta^2, mean Delta^2 / 6 (digest 004, 3.4)
    ("dpsq", {"epsilon1": 1e-6}, 1 / 3),     # a fair coin between the neighbours: mean Delta^2 / 3 (digest 3.3)
])
def test_measured_quantization_variance_matches_the_uniform_cell_formula(codec, params, ratio):
    # 400,000 coordinates uniform on [-1, 1] at 4 bits (Delta = 2 / 15), seeded; the relative standard error of a
    # mean of squared errors is below 0.3% here, the tolerance 2%.
    vec = np.random.default_rng(0).uniform(-1, 1, 400_000)
    out = dlg.codec_perturbation(codec, bits=4, **params)(vec, np.random.default_rng(1))
    stats = dlg.perturbation_stats(vec, out)
    delta = (vec.max() - vec.min()) / 15
    assert stats["quantization_variance"] == pytest.approx(ratio * delta ** 2, rel=0.02)
    assert abs(stats["quantization_bias"]) < 0.01 * delta
    assert stats["error_to_signal"] == pytest.approx(stats["quantization_mse"] / np.mean(vec ** 2), rel=1e-9)
    assert stats["update_variance"] == pytest.approx(1 / 3, rel=0.01)
