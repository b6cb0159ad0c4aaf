"""Claims in sweep specs: parsing a spec's [[claim]] tables, their errors, and the report a sweep writes
(results.md, results.json, plots) and --report-only recomputes."""
import json
import shutil

import pytest

from hfl import claims, sweep
from tests.unit.test_sweep import fake_run


GRID_SPEC = """
seeds = [0, 1, 2, 3, 4]
[grid]
"train.lr" = [0.01, 0.1, 0.5]
[variants.x]
"run.algorithm" = "hierfavg"
[variants.y]
"run.algorithm" = "qhetfed"
[report]
fields = ["final_accuracy"]
[[claim]]
id = "001/9.4"
statement = "accuracy grows with the step size"
figure = "Fig. 9: +3 then +1 points"
kind = "trend"
metric = "final_accuracy"
axis = "train.lr"
where = { variant = "x" }
direction = "increasing"
[[claim]]
id = "001/9.1"
label = "at lr 0.1"
statement = "x beats y"
kind = "order"
metric = "final_accuracy"
cells = ["x,train.lr=0.1", "y,train.lr=0.1"]
"""


def test_a_spec_with_claims_parses_and_resolves_a_trend_along_its_axis(tmp_path):
    (tmp_path / "s.toml").write_text(GRID_SPEC)
    spec = sweep.load_spec(tmp_path / "s.toml")
    trend, order = spec.claims
    assert trend.cells == ["x,train.lr=0.01", "x,train.lr=0.1", "x,train.lr=0.5"]
    assert [c.relation for c in trend.comparisons] == ["<", "<"] and trend.figure == "Fig. 9: +3 then +1 points"
    assert order.name == "001/9.1 (at lr 0.1)"


@pytest.mark.parametrize("claim_text, message", [
    ('kind = "ladder"\nmetric = "final_accuracy"', "claim 001/9.1: unknown kind 'ladder'; kinds: order, threshold"),
    ('kind = "order"\nmetric = "final_accuracy"\ncells = ["x,train.lr=0.1", "z"]', "claim 001/9.1: cells: unknown cell 'z'"),
    ('kind = "order"\ncells = ["x,train.lr=0.1", "y,train.lr=0.1"]', "claim 001/9.1: missing key 'metric'"),
    ('kind = "order"\nmetric = "best_accuracy"\ncells = ["x,train.lr=0.1", "y,train.lr=0.1"]',
     "claim 001/9.1: metric 'best_accuracy' is not one of [report] fields (final_accuracy)"),
    ('kind = "order"\nmetric = "final_accuracy"\ncell = "x,train.lr=0.1"', "claim 001/9.1: unknown key 'cell' for kind 'order'"),
    ('kind = "trend"\nmetric = "final_accuracy"\naxis = "train.lr"\ndirection = "increasing"',
     "claim 001/9.1: a trend over train.lr needs `where` to fix 'variant'"),
    ('kind = "trend"\nmetric = "final_accuracy"\naxis = "train.tau"\ndirection = "up"', "axis 'train.tau' is not varied"),
    ('kind = "ratio"\nmetric = "final_accuracy"\ncells = ["x,train.lr=0.1", "y,train.lr=0.1"]\npaper = 1.0',
     "paper must be the paper's ratio"),
    ('kind = "order"\nmetric = "final_accuracy"\ncells = ["x,train.lr=0.1", "y,train.lr=0.1"]\nrelation = "=>"',
     "relation must be one of"),
    ('kind = "order"\nmetric = "final_accuracy"\ncells = ["x,train.lr=0.1", "y,train.lr=0.1"]\npaper = [0.8]',
     "paper must be a list of 2 numbers"),
])
def test_a_bad_claim_is_an_error_naming_the_key(tmp_path, claim_text, message):
    (tmp_path / "s.toml").write_text(GRID_SPEC.split("[[claim]]")[0]
                                     + f'[[claim]]\nid = "001/9.1"\nstatement = "s"\n{claim_text}\n')
    with pytest.raises(sweep.SweepError) as err:
        sweep.load_spec(tmp_path / "s.toml")
    assert message in str(err.value)


def test_claim_ids_name_a_check_and_are_unique(tmp_path):
    head = GRID_SPEC.split("[[claim]]")[0]
    one = '[[claim]]\nid = "001/9.1"\nstatement = "s"\nkind = "gap"\nmetric = "final_accuracy"\ncells = ["x,train.lr=0.1", "y,train.lr=0.1"]\n'
    (tmp_path / "s.toml").write_text(head + one + one)
    with pytest.raises(sweep.SweepError, match="claim 001/9.1 appears twice"):
        sweep.load_spec(tmp_path / "s.toml")
    (tmp_path / "s.toml").write_text(head + one.replace("001/9.1", "9.1"))
    with pytest.raises(sweep.SweepError, match="id must name a digest check as PAPER/9.N"):
        sweep.load_spec(tmp_path / "s.toml")


def test_the_sweep_writes_verdicts_to_markdown_json_and_plots_and_report_only_recomputes_them(tmp_path):
    (tmp_path / "s.toml").write_text(GRID_SPEC)
    spec = sweep.load_spec(tmp_path / "s.toml")
    out = tmp_path / "out"
    runs = sweep.expand(spec, out)
    acc = {("x", 0.01): 0.5, ("x", 0.1): 0.6, ("x", 0.5): 0.7, ("y", 0.01): 0.4, ("y", 0.1): 0.6, ("y", 0.5): 0.4}
    for run in runs:
        a = acc[(run.varied["variant"], run.varied["train.lr"])] + 0.01 * run.seed
        fake_run(run, {"final_accuracy": a}, [{"round": 0, "accuracy": a}])
    result = sweep.write_results(spec, runs, out, {})
    assert [c["verdict"] for c in result["claims"]] == [claims.HOLDS, claims.NOT_SHOWN]
    table = (out / "results.md").read_text()
    assert "### 001/9.4: **holds**" in table and "### 001/9.1 (at lr 0.1): **not shown**" in table
    assert "- Paper: accuracy grows with the step size" in table and "- Paper's figure: Fig. 9" in table
    assert "x,train.lr=0.01 0.52 ± 0.016 (n = 5)" in table and "one-sided Welch t-test, alpha 0.05" in table
    assert {"claim_001_9.4.png", "claim_001_9.1-at_lr_0.1.png"} <= set(result["plots"])
    assert (out / "claim_001_9.4.png").read_bytes()[:4] == b"\x89PNG"

    assert sweep.run_sweep(tmp_path / "s.toml", out, quiet=True) == 0  # every run finished: nothing runs, results again
    prov = json.loads((out / "results.json").read_text())["provenance"]
    assert prov["command"] == f"hfl sweep {tmp_path / 's.toml'} --out {out}" and prov["seeds"] == [0, 1, 2, 3, 4]
    assert len(prov["commit"]) == 40 and "CPUs" in prov["machine"] and prov["wall_seconds"] >= 0
    assert f"- Command: `hfl sweep {tmp_path / 's.toml'} --out {out}`" in (out / "results.md").read_text()

    for run in runs:  # the runs are gone (as in a committed report); results.json alone gives the verdicts again
        shutil.rmtree(run.run_dir)
    stored = json.loads((out / "results.json").read_text())
    stored.pop("claims")
    (out / "results.json").write_text(json.dumps(stored))
    (out / "results.md").write_text("old")
    assert sweep.run_sweep(tmp_path / "s.toml", out, only_report=True) == 0
    again = json.loads((out / "results.json").read_text())
    assert [c["verdict"] for c in again["claims"]] == [claims.HOLDS, claims.NOT_SHOWN]
    table = (out / "results.md").read_text()
    assert "### 001/9.4: **holds**" in table and again["cells"] == stored["cells"]
    assert again["provenance"] == prov and again["claims_provenance"]["command"].endswith("--report-only")
    assert "## Provenance\n" in table and "## Provenance of the verdicts" in table


def test_report_only_needs_results_json(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(GRID_SPEC)
    assert sweep.run_sweep(tmp_path / "s.toml", tmp_path / "none", only_report=True) == 2
    err = "".join(capsys.readouterr().err.split())  # rich wraps long paths anywhere, even inside a word
    assert "results.jsonnotfound(runthesweepfirst)" in err


def test_every_paper_scale_spec_parses_and_states_its_cost_seeds_and_setting():
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[2]
    checks = tomllib.loads((root / claims.CHECKS).read_text())["check"]
    primaries = {(c["id"], pathlib.Path(s).stem) for c in checks for s in c.get("primary", [])}
    found = set()
    for path in sorted((root / "deploy" / "experiments" / "paper").glob("*.toml")):
        spec = sweep.load_spec(path)
        head = path.read_text().split("\nname = ")[0]
        assert "CPU-hour estimate: about" in head and "# The paper's setting:" in head and "# Seeds:" in head, path.name
        assert len(spec.seeds) >= 5 and spec.name == path.stem, path.name
        check, stem = path.stem.removeprefix("paper-").split("-", 2)[:2], path.stem.split("-", 3)[3]
        found.add((f"{check[0]}/{check[1]}", stem))
    assert found == primaries
