"""`hfl plot`: per-round mean and std over a cell's seeds, curves.csv, and the figures in the asked format."""
import csv
import json

import numpy as np

from hfl.cli import main


def _run(path, accuracies, seconds=1.0):
    path.mkdir(parents=True)
    rows = [{"round": r, "accuracy": a, "loss": 1 - a, "emulated_seconds": seconds * (r + 1)}
            for r, a in enumerate(accuracies)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_sweep_gives_mean_and_std_per_round_per_cell(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _run(sweep / "runs" / "a" / "seed-0", [0.1, 0.5, 0.7])
    _run(sweep / "runs" / "a" / "seed-1", [0.3, 0.6])
    _run(sweep / "runs" / "b" / "seed-0", [0.2, 0.4, 0.8], seconds=2.0)
    assert main(["plot", str(sweep), "--format", "svg"]) == 0
    rows = list(csv.DictReader(open(sweep / "curves.csv")))
    a = [r for r in rows if r["cell"] == "a"]
    assert [int(r["n"]) for r in a] == [2, 2, 1]
    assert float(a[0]["accuracy_mean"]) == np.mean([0.1, 0.3])
    assert np.isclose(float(a[1]["accuracy_std"]), np.std([0.5, 0.6], ddof=1))
    assert float(a[2]["accuracy_std"]) == 0.0
    b = [r for r in rows if r["cell"] == "b"]
    assert [float(r["emulated_seconds_mean"]) for r in b] == [2.0, 4.0, 6.0]
    for name in ("accuracy_vs_round", "accuracy_vs_emulated_time", "loss_vs_round", "loss_vs_emulated_time"):
        assert (sweep / f"{name}.svg").read_text().startswith("<?xml")
    assert "2 curve(s) from 3 run(s)" in capsys.readouterr().out


def test_a_run_directory_and_bad_targets(tmp_path, capsys):
    _run(tmp_path / "run", [0.2, 0.3])
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "figs"), "--format", "png"]) == 0
    assert (tmp_path / "figs" / "accuracy_vs_round.png").stat().st_size > 1000
    assert main(["plot", str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")]) == 2 and "no metrics.jsonl" in capsys.readouterr().err
