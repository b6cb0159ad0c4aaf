"""Issue 22: rounds are numbered from 0 everywhere a user sees them, as in metrics.jsonl's `round` field."""
import json

from rich.console import Console

from hfl import sweep
from hfl.common import config, metrics
from hfl.launcher import progress_table, run_info
from hfl.verdict import not_learning

ROWS = [{"round": r, "accuracy": a, "loss": l, "bytes_up": 10, "bytes_down": 20, "refused": 0, "round_seconds": 1.0,
         "emulated_seconds": 2.0 * (r + 1)} for r, (a, l) in enumerate([(0.2, 2.0), (0.5, 1.2), (0.7, 0.8)])]


def test_console_table_shows_the_rows_round_and_the_next_one():
    cfg = config.load(None, ["run.rounds=4"])
    console = Console(width=200, record=True)
    console.print(progress_table(run_info(cfg), ROWS, 0.0, "running"))
    text = console.export_text()
    lines = [line.split()[0] for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert lines == ["0", "1", "2", "3"]  # rounds 0..2, then round 3 in progress
    assert metrics.round_cell(2, 4) == "2 (3/4 done)"  # the one-line-per-round form (a pipe, a log)
    assert "3/4 rounds done, running" in text


def test_console_table_fits_80_columns_with_the_privacy_column():
    """A pipe is 80 columns wide: no cell or heading of a long private run is cut (rich marks a cut with an
    ellipsis)."""
    cfg = config.load(None, ["run.rounds=300"])
    rows = [dict(ROWS[0], round=r, bytes_up=123_456, bytes_down=1_234_567, round_seconds=11.6, epsilon_max=1.234)
            for r in range(128)]
    console = Console(width=80, record=True)
    console.print(progress_table(run_info(cfg), rows, 47.6, "running", "http://127.0.0.1:39015/"))
    text = console.export_text()
    assert "…" not in text and "128/300 rounds done" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "eps max" in text and "120.6 KiB" in text and "   127 " in text
    assert "\nlive page http://127.0.0.1:39015/" in text  # the URL whole, on its own line
    wide = Console(width=140, record=True)  # a path wider than the table, narrower than the terminal: not cut
    long_path = "/tmp/" + "a-run-directory-with-a-long-name/" * 3 + "live.html"
    wide.print(progress_table(run_info(cfg), rows, 47.6, "done", long_path))
    assert f"live page snapshot {long_path}" in wide.export_text()


def test_accuracy_plot_x_is_the_rows_round():
    fig = metrics.accuracy_figure(ROWS, "t")
    by_round, by_time = fig.axes[0], fig.axes[1] if fig.axes[1].get_xlabel().startswith("emulated") else fig.axes[2]
    assert by_round.get_xlabel() == metrics.ROUND_AXIS
    assert list(by_round.lines[0].get_xdata()) == [0, 1, 2]
    assert list(by_time.lines[0].get_xdata()) == [2.0, 4.0, 6.0]


def test_sweep_curves_and_targets_use_the_rows_round(tmp_path):
    run_dir = tmp_path / "cell" / "seed-0"
    run_dir.mkdir(parents=True)
    metrics.write_jsonl(run_dir / "metrics.jsonl", ROWS)
    (run_dir / "summary.json").write_text(json.dumps({"rounds": 3}))
    run = sweep.Run("cell", {}, 0, config.load(None, []), run_dir)
    assert [p[0] for p in sweep.curve_points([run], "accuracy", "round")] == [0.0, 1.0, 2.0]
    assert sweep.to_target(ROWS, {"accuracy": 0.5})["round"] == 1


def test_verdicts_name_the_rows_round():
    diverged = ROWS[:2] + [{"round": 2, "accuracy": None, "loss": None, "diverged": True}]
    assert not_learning(diverged, 10) == "the model diverged at round 2 (non-finite values)"
