"""`hfl sweep` on the shipped smoke spec: four real testbeds, the table and plots, then a resumed re-run."""
import json
import pathlib
import subprocess
import sys

SMOKE = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "experiments" / "smoke.toml"


def sweep(out, *args, timeout=240):
    return subprocess.run([sys.executable, "-m", "hfl.cli", "sweep", str(SMOKE), "--out", str(out), "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_smoke_sweep_tabulates_plots_and_resumes(tmp_path):
    out = tmp_path / "sweep"
    first = sweep(out, "--jobs", "2")  # two testbeds at a time
    assert first.returncode == 0, first.stderr[-3000:]
    assert "4 to run, 0 already finished" in first.stderr
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| hierfavg |") or line.startswith("| qhetfed |")]
    assert len(rows) == 2 and all("| 2/2 |" in row for row in rows), table
    results = json.loads((out / "results.json").read_text())
    for cell in results["cells"]:
        stat = cell["stats"]["final_accuracy"]
        accs = [r["final_accuracy"] for r in cell["runs"]]
        assert stat["n"] == 2 and abs(stat["mean"] - sum(accs) / 2) < 1e-12 and 0.1 < stat["mean"] <= 1.0
    curves = results["curves"]  # per cell and round: mean and std over its seeds (also in curves.csv)
    assert sorted(curves) == sorted(c["cell"] for c in results["cells"]) and (out / "curves.csv").is_file()
    for cell in results["cells"]:
        last = curves[cell["cell"]][-1]
        accs = [r["final_accuracy"] for r in cell["runs"]]
        assert last["n"] == 2 and abs(last["accuracy_mean"] - sum(accs) / 2) < 1e-9, (last, accs)
    for name in ("accuracy_vs_round.png", "loss_vs_round.png", "accuracy_vs_emulated_seconds.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    summaries = {p: p.stat().st_mtime_ns for p in out.glob("*/seed-*/summary.json")}
    assert len(summaries) == 4
    assert not list(out.glob("*/seed-*/accuracy.png"))  # no per-run plots in a sweep: the sweep draws its own

    redo = out / "qhetfed" / "seed-1" / "summary.json"  # as if the sweep had stopped during this run
    redo.unlink()
    second = sweep(out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "1 to run, 3 already finished" in second.stderr and "done qhetfed seed 1" in second.stderr
    assert "hierfavg seed" not in second.stderr.split("already finished", 1)[1]
    assert {p: p.stat().st_mtime_ns for p in summaries if p != redo} == {p: t for p, t in summaries.items() if p != redo}
    assert redo.exists()
