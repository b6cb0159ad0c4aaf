"""Sweep specs: parsing, expansion into runs, validation before anything runs, and the results."""
import json
import pathlib

import pytest

from hfl import sweep
from hfl.common import config as c

SMOKE = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "experiments" / "smoke.toml"


def spec_of(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return sweep.load_spec(path)


GRID = """
seeds = [3, 4]
[base]
run.rounds = 2
"topology.edges" = 1
[base.train]
gamma = 1
[grid]
"train.lr" = [0.01, 0.1]
data.partition = ["iid", "classes"]
[variants.plain]
"run.algorithm" = "hierfavg"
[variants.q]
"run.algorithm" = "qhetfed"
"train.tau" = 3
"""


def test_expansion_is_variants_times_grid_times_seeds(tmp_path):
    spec = spec_of(tmp_path, GRID)
    assert spec.base == {"run.rounds": 2, "topology.edges": 1, "train.gamma": 1}
    assert spec.varied_keys == ["variant", "train.lr", "data.partition"]
    runs = sweep.expand(spec, tmp_path / "out")
    assert len(runs) == 2 * 2 * 2 * 2 and len({r.run_dir for r in runs}) == 16
    one = next(r for r in runs if r.varied == {"variant": "q", "train.lr": 0.1, "data.partition": "classes"} and r.seed == 4)
    assert one.run_dir == tmp_path / "out" / "q,train.lr=0.1,data.partition=classes" / "seed-4"
    cfg = one.config
    assert (cfg.run.algorithm, cfg.train.tau, cfg.train.lr, cfg.data.partition, cfg.run.seed) == ("qhetfed", 3, 0.1, "classes", 4)
    assert (cfg.run.rounds, cfg.topology.edges, cfg.train.gamma) == (2, 1, 1)
    plain = next(r for r in runs if r.varied["variant"] == "plain")
    assert plain.config.train.tau == c.Config().train.tau  # a variant's overrides stay in that variant


def test_runs_go_seed_by_seed_and_max_seeds_keeps_the_first(tmp_path):
    runs = sweep.expand(spec_of(tmp_path, GRID.replace("seeds = [3, 4]", "seeds = [7, 3, 5]")), tmp_path / "out")
    ordered = sweep.first_seeds(runs, None)
    assert [r.seed for r in ordered] == [7] * 8 + [3] * 8 + [5] * 8  # every cell at a seed before the next seed
    assert [r.cell for r in ordered[:8]] == [r.cell for r in ordered[8:16]]  # the cells in the spec's order each time
    assert {r.seed for r in sweep.first_seeds(runs, 2)} == {7, 3} and len(sweep.first_seeds(runs, 2)) == 16
    assert sweep.first_seeds(runs, 9) == ordered


def test_max_seeds_below_one_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text("seeds = [1, 2]\n")
    assert sweep.run_sweep(path, tmp_path / "out", max_seeds=0) == 2
    assert "--max-seeds must be at least 1, got 0" in capsys.readouterr().err


def test_volatility_is_the_spread_of_round_to_round_changes_after_from_round():
    rows = [{"round": i, "accuracy": a} for i, a in enumerate([0.1, 0.5, 0.6, 0.62, 0.58, 0.63])]
    steps = [0.02, -0.04, 0.05]  # rounds 2 -> 3 -> 4 -> 5
    mean = sum(steps) / 3
    expected = (sum((x - mean) ** 2 for x in steps) / 2) ** 0.5
    assert sweep.volatility(rows, "accuracy", 2) == pytest.approx(expected)
    assert sweep.volatility(rows, "accuracy", 4) is None  # two rows: no spread of changes
    assert sweep.volatility([{"round": i, "accuracy": 0.5} for i in range(9)], "accuracy", 0) == 0.0


@pytest.mark.parametrize("value", ["'accuracy'", "{ metric = 'accuracy' }", "{ metric = 'accuracy', from_round = -1 }",
                                   "{ metric = 'accuracy', from_round = 2, x = 1 }"])
def test_a_bad_volatility_table_is_refused(tmp_path, value):
    with pytest.raises(sweep.SweepError, match="report.volatility must be a table like"):
        spec_of(tmp_path, f"[report]\nvolatility = {value}\n")


def test_volatility_adds_its_field(tmp_path):
    spec = spec_of(tmp_path, "[report]\nvolatility = { metric = 'accuracy', from_round = 3 }\n")
    assert spec.report["fields"][-1] == "volatility.accuracy"


def test_config_file_relative_to_the_spec_and_base_overrides_it(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.toml").write_text('[run]\nrounds = 7\nseed = 9\n[train]\nlr = 0.2\n')
    (tmp_path / "exp").mkdir()
    spec = spec_of(tmp_path / "exp", 'config = "../configs/x.toml"\n[base]\n"train.lr" = 0.3\n')
    runs = sweep.expand(spec, tmp_path / "out")
    assert [(r.cell, r.seed, r.config.run.rounds, r.config.train.lr) for r in runs] == [("base", 9, 7, 0.3)]
    assert spec.name == "s" and runs[0].config.run.name == "s-base"


def test_the_shipped_smoke_spec_is_valid_and_small():
    spec = sweep.load_spec(SMOKE)
    runs = sweep.expand(spec, pathlib.Path("/nonexistent/out"))
    assert len(runs) == 4 and {r.config.run.algorithm for r in runs} == {"hierfavg", "qhetfed"}
    assert all(r.config.run.rounds == 2 and r.config.num_devices == 4 for r in runs)


@pytest.mark.parametrize("text, message", [
    ("colour = 1", "unknown key 'colour' in the sweep spec; allowed keys: name, description, config"),
    ("[report]\nfield = ['x']", "unknown key 'field' in [report]; allowed keys: fields, curves, x, group_by"),
    ("[grid]\n'train.lrr' = [0.1]", "unknown key 'train.lrr'; allowed keys in [train]: lr, batch_size"),
    ("[variants.v]\n'run.algorithm' = 'fedprox'", "cell v (variants.v): bad value for run.algorithm: 'fedprox'; allowed: "),
    ("[base]\n'run.rounds' = 0", "run.rounds"),
    ("[grid]\n'train.lr' = 0.1", "[grid] train.lr must be a non-empty list of values"),
    ("[grid]\n'train.lr' = []", "[grid] train.lr must be a non-empty list"),
    ("[grid]\n'run.seed' = [1, 2]", "[grid] run.seed: list the seeds in the top-level `seeds`"),
    ("seeds = [1, 1]", "seeds: [1, 1] repeats a seed"),
    ("seeds = [-1]", "seeds must be a non-empty list of non-negative integers"),
    ("seeds = 3", "seeds must be a non-empty list"),
    ("[base]\nrounds = 2", "key 'rounds' must name a config key as section.key"),
    ("base = 3", "[base] must be a table"),
    ("config = 'missing.toml'", "config: file not found"),
    ("[report]\ngroup_by = 'train.lr'", "report.group_by = 'train.lr' is not varied by the sweep"),
    ("[report]\nfields = [1]", "report.fields must be a list of names"),
    ("[grid]\n'run.algorithm' = ['hierfavg']\n[variants.a]\n'run.algorithm' = 'qhetfed'", "which [grid] varies too"),
    ("[variants.'a b']\n'run.rounds' = 1", "a variant name may hold"),
    ("[variants.a.b]\n'run.rounds' = 1", "unknown key 'b'; allowed keys in the top level: run, topology"),
    ("[variants.a.b]\n'run.rounds' = 1", 'a variant name with a dot needs quotes: [variants."a.b"]'),
    ("[grid\n", "s.toml"),
])
def test_bad_specs_name_the_key(tmp_path, text, message):
    with pytest.raises(sweep.SweepError) as err:
        sweep.expand(spec_of(tmp_path, text), tmp_path / "out")
    assert message in str(err.value)


def test_a_bad_later_cell_stops_the_sweep_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text("[grid]\n'train.batch_size' = [8, 0]\n")
    out = tmp_path / "out"
    assert sweep.run_sweep(path, out) == 2
    assert "cell train.batch_size=0" in capsys.readouterr().err and not out.exists()


def test_cells_with_the_same_directory_name_are_refused(tmp_path):
    with pytest.raises(sweep.SweepError, match="share the directory name"):
        sweep.expand(spec_of(tmp_path, "[grid]\n'run.name' = ['a b', 'a_b']\n"), tmp_path / "out")


def fake_run(run, summary, rows):
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "config.toml").write_text(c.to_toml(run.config))
    (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run.run_dir / "summary.json").write_text(json.dumps(summary))


def test_results_table_json_and_plots(tmp_path):
    spec = spec_of(tmp_path, "seeds = [0, 1]\n[grid]\n'train.lr' = [0.1, 0.2]\n[report]\nfields = ['final_accuracy', 'bytes_up']\n"
                             "curves = ['accuracy']\ngroup_by = 'train.lr'\n")
    runs = sweep.expand(spec, tmp_path / "out")
    accs = {(0.1, 0): 0.5, (0.1, 1): 0.7, (0.2, 0): 0.9}
    for run in runs:
        key = (run.config.train.lr, run.seed)
        if key in accs:
            summary = {"final_accuracy": accs[key], "bytes_up": 10, "privacy": {"epsilon": 1.0 + run.seed, "delta": 1e-5},
                       "epsilon_claimed": 2.0}
            rows = [{"round": r, "accuracy": accs[key] * (r + 1) / 2, "emulated_seconds": 1.5 * (r + 1)} for r in range(2)]
            fake_run(run, summary, rows)
    result = sweep.write_results(spec, runs, tmp_path / "out", {runs[-1].run_dir: "TestbedError: cloud failed\nlog"})
    first, second = result["cells"]
    assert first["stats"]["final_accuracy"]["mean"] == pytest.approx(0.6)
    assert first["stats"]["final_accuracy"]["std"] == pytest.approx(0.1414213562)  # sample std, ddof = 1
    assert first["epsilon"]["privacy.epsilon"]["mean"] == pytest.approx(1.5) and "privacy.delta" not in first["epsilon"]
    assert second["finished"] == [0] and second["stats"]["final_accuracy"] == {"mean": 0.9, "std": 0.0, "n": 1}
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| train.lr=0.1 | 0.1 | 2/2 | n/a | n/a | 0.6000 ± 0.1414 | 10.0000 ± 0.0000 | 2.0000 ± 0.0000 | 1.5000 ± 0.7071 |" in table
    assert "| train.lr=0.2 | 0.2 | 1/2 | n/a | n/a | 0.9000 (n = 1) |" in table
    assert "epsilon_claimed (the paper's claim, not a measurement)" in table and "privacy.epsilon (accountant)" in table
    assert "TestbedError: cloud failed" in table and "\nlog" not in table
    assert json.loads((tmp_path / "out" / "results.json").read_text())["cells"][1]["runs"][1]["error"].startswith("TestbedError")
    assert sorted(result["plots"]) == ["accuracy_vs_emulated_seconds__train.lr-0.1.png", "accuracy_vs_emulated_seconds__train.lr-0.2.png",
                                       "accuracy_vs_round__train.lr-0.1.png", "accuracy_vs_round__train.lr-0.2.png"]
    assert (tmp_path / "out" / "accuracy_vs_round__train.lr-0.1.png").read_bytes()[:4] == b"\x89PNG"
    points = sweep.curve_points([r for r in runs if r.config.train.lr == 0.1], "accuracy", "emulated_seconds")
    assert points[1][:3] == pytest.approx((3.0, 0.6, 0.1414213562)) and points[1][3] == 2


def test_no_plot_for_an_x_the_metrics_lack(tmp_path):
    spec = spec_of(tmp_path, "[report]\nx = ['round', 'emulated_seconds']\n")
    runs = sweep.expand(spec, tmp_path / "out")
    fake_run(runs[0], {"final_accuracy": None}, [{"round": 0, "accuracy": 0.3}, {"round": 1, "accuracy": None}])
    result = sweep.write_results(spec, runs, tmp_path / "out", {})
    assert result["plots"] == ["accuracy_vs_round.png"]
    assert result["cells"][0]["stats"]["final_accuracy"] == {"mean": None, "std": None, "n": 0}
    assert "| base | 1/1 | n/a |" in (tmp_path / "out" / "results.md").read_text()


def test_finished_runs_are_skipped_and_a_changed_spec_is_caught(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text("seeds = [0]\n[base]\n'run.rounds' = 2\n")
    out = tmp_path / "out"
    runs = sweep.expand(sweep.load_spec(path), out)
    fake_run(runs[0], {"final_accuracy": 0.5}, [{"round": 0, "accuracy": 0.5}])
    assert sweep.run_sweep(path, out, quiet=True) == 0  # nothing to run: no process is started
    assert "0 to run, 1 already finished" in capsys.readouterr().err
    assert (out / "results.md").exists()
    path.write_text("seeds = [0]\n[base]\n'run.rounds' = 3\n")
    assert sweep.run_sweep(path, out, dry_run=True) == 2
    err = "".join(capsys.readouterr().err.split())  # rich may wrap the message anywhere
    assert "finishedwithanotherconfigthanthespecnowgives(run.rounds:2->3)" in err


def test_config_changes_names_each_key_that_differs():
    stored = "[run]\nrounds = 2\nseed = 0\n[data]\nroot = ''\n"
    now = "[run]\nrounds = 3\nseed = 0\n[data]\nroot = ''\nclass_draw = 'independent'\n"
    assert sweep.config_changes(stored, now) == "data.class_draw: absent -> 'independent'; run.rounds: 2 -> 3"
    assert sweep.config_changes(stored, now, most=1) == "data.class_draw: absent -> 'independent'; 1 more"
    assert sweep.config_changes(stored, stored + "\n") == "its config.toml differs in form only"
    assert sweep.config_changes("not toml [", now) == "its config.toml differs"


def test_a_field_added_since_the_run_at_its_default_is_no_change():
    """A finished run's config.toml predates a new field: absent there and at its default now, the run still counts
    (it did what the default does); absent and set to another value, it does not."""
    stored = "[run]\nrounds = 2\nseed = 0\n[data]\nroot = ''\n"
    assert sweep.changed_keys(stored, stored.replace("root = ''", "root = ''\nclass_draw = 'deck'")) == []
    assert sweep.changed_keys(stored, stored.replace("root = ''", "root = ''\nclass_draw = 'independent'")) == [
        "data.class_draw"]
    assert sweep.changed_keys(stored.replace("root = ''", "root = ''\nclass_draw = 'deck'"), stored) == [
        "data.class_draw"]  # a key the spec no longer gives is a change
    assert sweep.changed_keys("not toml [", stored) is None


def test_mean_std():
    assert sweep.mean_std([1.0, None, 3.0, float("nan")]) == {"mean": 2.0, "std": pytest.approx(2 ** 0.5), "n": 2}
    assert sweep.mean_std([]) == {"mean": None, "std": None, "n": 0}


@pytest.mark.parametrize("path", sorted(SMOKE.parent.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_spec_expands(path):
    assert sweep.expand(sweep.load_spec(path), pathlib.Path("/nonexistent/out"))


def test_to_target_finds_the_first_round_reaching_the_value():
    rows = [{"round": 0, "accuracy": 0.5, "emulated_seconds": 1.0, "energy_joules_total": 2.0, "wall_seconds": 3.0},
            {"round": 1, "accuracy": None, "emulated_seconds": 2.0, "energy_joules_total": 4.0, "wall_seconds": 4.0},
            {"round": 2, "accuracy": 0.8, "emulated_seconds": 3.0, "energy_joules_total": 6.0, "wall_seconds": 5.0},
            {"round": 3, "accuracy": 0.9, "emulated_seconds": 4.0, "energy_joules_total": 8.0, "wall_seconds": 6.0}]
    assert sweep.to_target(rows, {"accuracy": 0.75}) == {"reached": 1.0, "round": 2, "virtual_seconds": None,
                                                         "emulated_seconds": 3.0, "energy_joules_total": 6.0,
                                                         "wall_seconds": 5.0, "at_least": {
                                                             "round": 2, "emulated_seconds": 3.0,
                                                             "energy_joules_total": 6.0}}
    for t, row in enumerate(rows):  # paper 001's runtime axis, where the algorithm has a latency model
        row["virtual_seconds"] = 1.5 * (t + 1)
    assert sweep.to_target(rows, {"accuracy": 0.75})["virtual_seconds"] == 4.5
    missed = sweep.to_target(rows, {"accuracy": 0.95})
    assert missed["reached"] == 0.0 and missed["round"] is None and missed["energy_joules_total"] is None
    # a run that never got there took at least what it spent: the last row's values, a lower bound
    assert missed["at_least"] == {"round": 3, "emulated_seconds": 4.0, "energy_joules_total": 8.0}
    assert sweep.to_target([], {"accuracy": 0.95})["at_least"] == dict.fromkeys(sweep.TARGET_BOUNDS)
    with pytest.raises(sweep.SweepError, match="report.target"):
        sweep.parse_spec('seeds = [0]\n[report]\ntarget = { accuracy = "high" }\n', pathlib.Path("/tmp/x.toml"))


def test_report_audit_is_checked_and_labelled():
    spec = sweep.parse_spec('seeds = [0]\n[report]\naudit = { trials = 500 }\n', pathlib.Path("/tmp/x.toml"))
    assert spec.report["audit"] == {"trials": 500}
    for bad in ('audit = { trials = 2 }', 'audit = { rounds = 5 }', 'audit = true'):
        with pytest.raises(sweep.SweepError, match="report.audit"):
            sweep.parse_spec(f'seeds = [0]\n[report]\n{bad}\n', pathlib.Path("/tmp/x.toml"))
    assert "lower bound" in sweep.epsilon_label("audit.epsilon_lower_bound")
    assert "claim" not in sweep.epsilon_label("audit.epsilon_lower_bound")
