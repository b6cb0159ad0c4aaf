"""Claims: the verdict logic on constructed data (against scipy), the seed rule, a check's verdict from its primary claims, the
pooling of seed extensions, and the index of the committed reports."""
import json
import pathlib
import subprocess
import sys
import tomllib

import pytest
from scipy import stats

from hfl import claims, claims_index, sweep

ROOT = pathlib.Path(__file__).resolve().parents[2]
CELLS = {name: {"variant": name} for name in ("a", "b", "c", "d")}
HIGH = [0.80, 0.81, 0.79, 0.82]
LOW = [0.70, 0.71, 0.69, 0.72]


def claim(**raw):
    """A claim over CELLS; min_seeds 2 unless given, so that the tests of the statistics can use a few seeds (the
    seed rule has its own tests)."""
    raw = {"id": "000/9.2", "statement": "a beats b", "kind": "order", "metric": "final_accuracy", "min_seeds": 2, **raw}
    return claims.parse_claim(raw, CELLS, ["final_accuracy", "energy"])


def verdict(values, **raw):
    return claims.evaluate(claim(**raw), values)


def test_welch_is_scipys_welch_test_and_one_sample_test():
    a, b = [0.8, 0.83, 0.79, 0.85], [0.7, 0.74, 0.69]
    mine = claims.welch([a, b], [1, -1])
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert mine["t"] == pytest.approx(ref.statistic) and mine["p_greater"] == pytest.approx(ref.pvalue)
    assert mine["p_less"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)
    one = claims.welch([a], [1], offset=0.75)
    assert one["p_greater"] == pytest.approx(stats.ttest_1samp(a, 0.75, alternative="greater").pvalue)


@pytest.mark.parametrize("test", ["welch", "bootstrap"])
def test_holds_when_significant_in_the_claimed_direction_and_of_the_papers_size(test):
    r = verdict({"a": HIGH, "b": LOW}, cells=["a", "b"], paper=[0.9, 0.78], test=test)
    assert r["verdict"] == claims.HOLDS and r["why"] == ""
    comp, = r["comparisons"]
    assert comp["effect"] == pytest.approx(0.10) and comp["p"] < 0.05 and comp["magnitude_vs_paper"] == pytest.approx(0.1 / 0.12)
    assert r["values"]["a"] == {"mean": pytest.approx(0.805), "std": pytest.approx(0.01291, abs=1e-5), "n": 4}
    if test == "bootstrap":
        assert comp["interval"][0] > 0 and "bootstrap" in r["test"]
    else:
        assert comp["df"] == pytest.approx(6.0) and r["test"] == "one-sided Welch t-test, alpha 0.05"


def test_shape_only_when_the_magnitude_is_off_by_more_than_the_factor():
    r = verdict({"a": HIGH, "b": LOW}, cells=["a", "b"], paper=[0.9, 0.88])  # our gap is 5x the paper's
    assert r["verdict"] == claims.SHAPE and "5x the paper's" in r["why"]
    assert verdict({"a": HIGH, "b": LOW}, cells=["a", "b"], paper=[0.9, 0.88], factor=6)["verdict"] == claims.HOLDS
    # ours a fifth of the paper's: the upper bound is under half of it, which is more than a shape
    assert verdict({"a": HIGH, "b": LOW}, cells=["a", "b"], paper=[0.9, 0.4])["verdict"] == claims.MAGNITUDE


@pytest.mark.parametrize("test", ["welch", "bootstrap"])
def test_not_shown_when_the_difference_is_within_the_seeds_spread(test):
    r = verdict({"a": [0.5, 0.7, 0.6], "b": [0.55, 0.65, 0.58]}, cells=["a", "b"], test=test)
    assert r["verdict"] == claims.NOT_SHOWN and "not significant" in r["why"]
    assert r["comparisons"][0]["p"] > 0.05 and r["comparisons"][0]["p_other_way"] > 0.05


def test_contradicted_when_significant_the_other_way():
    r = verdict({"a": LOW, "b": HIGH}, cells=["a", "b"])
    assert r["verdict"] == claims.CONTRADICTED and "significant the other way" in r["why"]


def test_one_seed_is_n_too_small_and_a_missing_cell_is_not_run():
    assert verdict({"a": [0.9], "b": LOW}, cells=["a", "b"])["verdict"] == claims.N_SMALL
    r = verdict({"a": HIGH, "b": []}, cells=["a", "b"])
    assert r["verdict"] == claims.NOT_RUN and r["values"]["b"] == {"mean": None, "std": None, "n": 0}


def test_an_order_takes_its_worst_step_and_a_weak_step_is_a_non_inferiority_test():
    values = {"a": HIGH, "b": [0.79, 0.80, 0.81, 0.80], "c": LOW}
    r = verdict(values, cells=["a", "b", "c"], relation=[">=", ">"])
    assert r["verdict"] == claims.HOLDS and [c["comparison"] for c in r["comparisons"]] == ["a >= b", "b > c"]
    r = verdict(values, cells=["a", "b", "c"], relation=">")  # a > b is not significant
    assert r["verdict"] == claims.NOT_SHOWN and r["why"].startswith("a > b:")
    r = verdict({"a": LOW, "b": HIGH, "c": [0.1, 0.11, 0.12]}, cells=["a", "b", "c"], relation=[">=", ">"])
    assert r["verdict"] == claims.CONTRADICTED and [c["verdict"] for c in r["comparisons"]] == [claims.CONTRADICTED, claims.HOLDS]


def test_a_weak_relation_needs_significance_within_its_margin():
    # 6 points below inside a wide spread: neither within the default margin (2% of b) nor significantly below it
    r = verdict({"a": [0.5, 0.7, 0.6], "b": [0.62, 0.7, 0.66]}, cells=["a", "b"], relation=">=")
    comp, = r["comparisons"]
    assert r["verdict"] == claims.NOT_SHOWN and comp["margin"] == pytest.approx(0.02 * 0.66)
    assert "not shown within the margin" in r["why"]
    near = {"a": [0.78, 0.79, 0.80], "b": [0.80, 0.81, 0.79]}  # one point below, std one point
    assert verdict(near, cells=["a", "b"], relation=">=", margin=0.03)["verdict"] == claims.HOLDS
    assert verdict(near, cells=["a", "b"], relation=">=", margin=0.0)["verdict"] == claims.NOT_SHOWN
    # significantly below by more than the margin: contradicted; by less: not shown
    far = {"a": [0.70, 0.71, 0.72], "b": [0.80, 0.81, 0.79]}
    assert verdict(far, cells=["a", "b"], relation=">=", margin=0.05)["verdict"] == claims.CONTRADICTED
    assert verdict(far, cells=["a", "b"], relation=">=", margin=0.12)["verdict"] == claims.HOLDS
    # <= mirrors >=: a is not above b by more than the margin
    assert verdict({"a": [0.80, 0.81, 0.79], "b": [0.70, 0.71, 0.72]}, cells=["a", "b"], relation="<=",
                   margin=0.12)["verdict"] == claims.HOLDS
    with pytest.raises(claims.ClaimError, match="margin must be a number >= 0"):
        claim(cells=["a", "b"], relation=">=", margin=-0.1)


def test_no_spread_decides_by_the_sign():
    assert verdict({"a": [1.0, 1.0], "b": [0.5, 0.5]}, cells=["a", "b"])["verdict"] == claims.HOLDS
    assert verdict({"a": [0.5, 0.5], "b": [0.5, 0.5]}, cells=["a", "b"])["verdict"] == claims.CONTRADICTED


def test_threshold_against_a_value_and_against_another_cell():
    r = verdict({"a": [0.9, 0.91, 0.89]}, kind="threshold", cell="a", op=">=", value=0.85)
    assert r["verdict"] == claims.HOLDS and r["comparisons"][0]["comparison"] == "a >= 0.85"
    # a weak op holds unless the cell is significantly on the wrong side
    assert verdict({"a": [0.80, 0.81, 0.79]}, kind="threshold", cell="a", op=">=", value=0.85)["verdict"] == claims.CONTRADICTED
    # at least 20 points above b: 0.10 is significantly less
    r = verdict({"a": HIGH, "b": LOW}, kind="threshold", cell="a", than="b", op=">", value=0.2)
    assert r["verdict"] == claims.CONTRADICTED and r["comparisons"][0]["comparison"] == "a - b > 0.2"
    assert verdict({"a": HIGH, "b": LOW}, kind="threshold", cell="a", than="b", op=">", value=0.05)["verdict"] == claims.HOLDS


def test_ratio_compares_the_log_ratio_with_the_papers():
    fixed = [100.0, 102.0, 98.0, 101.0]
    r = verdict({"a": [75.0, 76.0, 74.0, 77.0], "b": fixed}, kind="ratio", metric="energy", cells=["a", "b"], paper=0.75)
    assert r["verdict"] == claims.HOLDS and r["comparisons"][0]["effect"] == pytest.approx(0.7525, abs=1e-3)
    r = verdict({"a": [95.0, 95.5, 94.5, 95.2], "b": fixed}, kind="ratio", metric="energy", cells=["a", "b"], paper=0.75)
    assert r["verdict"] == claims.MAGNITUDE  # 5% saved where the paper saves 25%: the bound is under half of it
    r = verdict({"a": [50.0, 51.0, 49.0, 50.5], "b": fixed}, kind="ratio", metric="energy", cells=["a", "b"], paper=0.75)
    assert r["verdict"] == claims.SHAPE  # 50% saved where the paper saves 25%
    r = verdict({"a": [120.0, 121.0, 119.0], "b": fixed}, kind="ratio", metric="energy", cells=["a", "b"], paper=0.75)
    assert r["verdict"] == claims.CONTRADICTED


def test_gap_and_gap_trend():
    r = verdict({"a": HIGH, "b": LOW}, kind="gap", cells=["a", "b"], paper=0.1)
    assert r["verdict"] == claims.HOLDS
    grows = {"a": [0.60, 0.61, 0.59], "b": [0.55, 0.56, 0.54], "c": [0.70, 0.71, 0.69], "d": [0.50, 0.51, 0.49]}
    r = verdict(grows, kind="gap_trend", pairs=[["a", "b"], ["c", "d"]], direction="increasing", paper=[0.05, 0.2])
    assert r["verdict"] == claims.HOLDS and r["comparisons"][0]["effect"] == pytest.approx(-0.15)
    r = verdict(grows, kind="gap_trend", pairs=[["c", "d"], ["a", "b"]], direction="increasing")
    assert r["verdict"] == claims.CONTRADICTED  # the gap shrinks: significant the other way


def test_paired_is_scipys_paired_t_test_and_shows_what_the_seed_spread_hides():
    # every seed moves both cells together: a consistent +1 point under a 10-point seed-to-seed spread
    a, b = [0.61, 0.72, 0.80, 0.66], [0.60, 0.705, 0.792, 0.648]
    r = verdict({"a": a, "b": b}, cells=["a", "b"], test="paired")
    comp, = r["comparisons"]
    ref = stats.ttest_rel(a, b, alternative="greater")
    assert comp["t"] == pytest.approx(ref.statistic) and comp["p"] == pytest.approx(ref.pvalue)
    assert comp["pairs"] == 4 and comp["df"] == pytest.approx(3.0) and r["verdict"] == claims.HOLDS
    assert "paired t-test" in r["test"]
    welch = verdict({"a": a, "b": b}, cells=["a", "b"])
    assert welch["verdict"] == claims.NOT_SHOWN  # Welch: within the spread
    # a Welch verdict carries the paired test's beside it, in results.md and in the index
    assert welch["paired"] == {"verdict": claims.HOLDS, "p": [pytest.approx(ref.pvalue)], "pairs": [4]}
    assert "Paired over seeds (a sensitivity check, not the verdict): holds" in claims.markdown([welch])
    assert claims._paired_note(welch) == " [paired: holds]" and claims._paired_note(r) == ""
    # a trend's steps are paired too, and the other way is contradicted
    assert verdict({"a": b, "b": a}, cells=["a", "b"], test="paired")["verdict"] == claims.CONTRADICTED


def test_paired_pairs_by_seed_and_drops_a_seed_missing_from_a_cell():
    c = claim(cells=["a", "b"], test="paired")
    values = {"a": [0.80, 0.70, 0.90], "b": [0.69, 0.885, 0.60]}
    seeds = {"a": [0, 1, 2], "b": [1, 2, 3]}  # b's seed 0 failed; seed 3 ran only in b
    comp = claims.evaluate(c, values, seeds)["comparisons"][0]
    ref = stats.ttest_rel([0.70, 0.90], [0.69, 0.885], alternative="greater")
    assert comp["pairs"] == 2 and comp["p"] == pytest.approx(ref.pvalue)
    r = claims.evaluate(c, values, {"a": [0, 1, 2], "b": [2, 3, 4]})
    assert r["verdict"] == claims.N_SMALL and "nothing to pair" in r["why"]


def test_evaluate_all_pairs_the_runs_by_their_seed():
    c = claim(cells=["a", "b"], test="paired")
    cells = [{"cell": "a", "runs": [{"seed": 2, "final_accuracy": 0.9}, {"seed": 0, "final_accuracy": 0.7},
                                    {"seed": 1, "final_accuracy": 0.8}]},
             {"cell": "b", "runs": [{"seed": 0, "final_accuracy": 0.69}, {"seed": 1, "final_accuracy": 0.79},
                                    {"seed": 2, "final_accuracy": float("nan")}]}]
    comp = claims.evaluate_all([c], cells)[0]["comparisons"][0]
    assert comp["pairs"] == 2 and comp["effect"] == pytest.approx(0.8 - 0.74)


def test_the_upper_bound_is_scipys_one_sided_confidence_bound():
    a, b = [0.8, 0.83, 0.79, 0.85, 0.81], [0.7, 0.74, 0.69, 0.75]
    mine = claims.welch([a, b], [1, -1], alpha=0.05)
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="less").confidence_interval(0.95)
    assert mine["upper"] == pytest.approx(ref.high)
    # the same bound from its definition: the contrast plus t(0.95, Welch df) standard errors
    se = (stats.tstd(a) ** 2 / len(a) + stats.tstd(b) ** 2 / len(b)) ** 0.5
    assert mine["upper"] == pytest.approx(0.816 - 0.72 + stats.t.ppf(0.95, mine["df"]) * se)
    one = claims.welch([a], [1], alpha=0.1)
    assert one["upper"] == pytest.approx(stats.ttest_1samp(a, 0, alternative="less").confidence_interval(0.9).high)


SMALL = {"a": [0.71, 0.72, 0.70, 0.73, 0.71], "b": [0.70, 0.71, 0.69, 0.72, 0.70]}  # +1 point, tight


def test_contradicted_in_magnitude_when_the_upper_bound_is_under_the_stated_fraction_of_the_papers_effect():
    r = verdict(SMALL, cells=["a", "b"], paper=[0.8, 0.7], min_seeds=5)  # the paper: +10 points
    comp, = r["comparisons"]
    ref = stats.ttest_ind(SMALL["a"], SMALL["b"], equal_var=False, alternative="less").confidence_interval(0.95).high
    assert comp["upper_bound"] == pytest.approx(ref) and comp["paper_effect"] == pytest.approx(0.1)
    assert r["verdict"] == claims.MAGNITUDE and "below 0.5 x the paper's 0.1" in r["why"]
    # under a fraction of 0.1 the same data are compared with 1 point: the bound is above it, the direction is not
    # significant (p ~ 0.1): not shown
    assert verdict(SMALL, cells=["a", "b"], paper=[0.8, 0.7], magnitude_fraction=0.1)["verdict"] == claims.NOT_SHOWN
    # a significant effect a quarter of the paper's is smaller in magnitude, not "shape only"
    big = {"a": [0.80, 0.81, 0.79, 0.80, 0.80], "b": [0.70, 0.71, 0.69, 0.70, 0.70]}
    assert verdict(big, cells=["a", "b"], paper=[1.1, 0.7])["verdict"] == claims.MAGNITUDE
    assert verdict(big, cells=["a", "b"], paper=[0.85, 0.7])["verdict"] == claims.HOLDS
    # the other direction significant is contradicted, whatever the magnitude; no paper value, no magnitude verdict
    assert verdict({"a": SMALL["b"], "b": [0.8] * 4 + [0.81]}, cells=["a", "b"], paper=[0.8, 0.7])["verdict"] == claims.CONTRADICTED
    assert verdict(SMALL, cells=["a", "b"])["verdict"] == claims.NOT_SHOWN
    # a weak relation where the paper gives a step: the bound of the difference itself (its margin left out)
    weak = verdict(SMALL, cells=["a", "b"], relation=">=", paper=[0.8, 0.7])
    assert weak["verdict"] == claims.MAGNITUDE and weak["comparisons"][0]["upper_bound"] == pytest.approx(ref)
    assert verdict(SMALL, cells=["a", "b"], relation=">=", paper=[0.71, 0.7])["verdict"] == claims.HOLDS
    with pytest.raises(claims.ClaimError, match="magnitude_fraction must be in"):
        claim(cells=["a", "b"], magnitude_fraction=1.5)


def test_the_magnitude_of_a_ratio_and_of_a_gap_trend_step():
    fixed = [100.0, 102.0, 98.0, 101.0, 99.0]
    r = verdict({"a": [97.0, 98.0, 96.0, 97.5, 96.5], "b": fixed}, kind="ratio", metric="energy", cells=["a", "b"],
                paper=0.5)  # the paper saves half; ours about 3%: the bound is far under a quarter of b
    assert r["verdict"] == claims.MAGNITUDE and r["comparisons"][0]["paper_effect"] == pytest.approx(0.5 * 100)
    grows = {"a": [0.60, 0.61, 0.59], "b": [0.55, 0.56, 0.54], "c": [0.70, 0.71, 0.69], "d": [0.50, 0.51, 0.49]}
    r = verdict(grows, kind="gap_trend", pairs=[["a", "b"], ["c", "d"]], direction="increasing", paper=[0.05, 0.9])
    assert r["verdict"] == claims.MAGNITUDE and r["comparisons"][0]["paper_effect"] == pytest.approx(0.85)


def test_a_verdict_needs_five_seeds_a_cell_and_shows_what_the_test_alone_says():
    four = {"a": HIGH, "b": LOW}
    r = claims.evaluate(claims.parse_claim({"id": "000/9.2", "statement": "s", "kind": "order", "metric": "final_accuracy",
                                            "cells": ["a", "b"]}, CELLS, ["final_accuracy"]), four)
    comp, = r["comparisons"]
    assert r["verdict"] == claims.N_SMALL and comp["test_verdict"] == claims.HOLDS and comp["p"] < 0.05
    assert r["why"].startswith("a > b: 4 finished seeds in a cell, under the 5 a verdict needs (the test alone: holds")
    five = {"a": HIGH + [0.8], "b": LOW + [0.7]}
    assert verdict(five, cells=["a", "b"], min_seeds=5)["verdict"] == claims.HOLDS
    # the paired test counts pairs: five values a cell but four common seeds
    c = claim(cells=["a", "b"], test="paired", min_seeds=5)
    r = claims.evaluate(c, five, {"a": [0, 1, 2, 3, 4], "b": [0, 1, 2, 3, 9]})
    assert r["verdict"] == claims.N_SMALL and "4 pairs" in r["why"]
    with pytest.raises(claims.ClaimError, match="min_seeds must be an integer >= 2"):
        claim(cells=["a", "b"], min_seeds=1)


def test_seeds_for_power_are_the_normal_approximations_smallest_n():
    a, b = [0.80, 0.83, 0.79, 0.85, 0.81], [0.70, 0.74, 0.69, 0.75, 0.72]
    n = claims.seeds_for_power([a, b], [1, -1], 0.02)
    var = stats.tvar(a) + stats.tvar(b)
    power = lambda m: stats.norm.cdf(0.02 / (var / m) ** 0.5 - stats.norm.ppf(0.95))  # noqa: E731
    assert power(n) >= 0.8 > power(n - 1)
    assert claims.seeds_for_power([a, b], [1, -1], -0.01) is None and claims.seeds_for_power([[1.0] * 3], [1], 0.1) == 2
    # a comparison records it: against the paper's effect where given, else against ours
    r = verdict({"a": a, "b": b}, cells=["a", "b"], paper=[0.82, 0.80])
    assert r["comparisons"][0]["seeds_for_power"] == n
    r = verdict({"a": a, "b": b}, cells=["a", "b"])
    assert r["comparisons"][0]["seeds_for_power"] == claims.seeds_for_power([a, b], [1, -1], 0.096)


def test_deterministic_values_are_decided_from_the_values_at_any_number_of_seeds():
    r = verdict({"a": [3.0, 3.0, 3.0], "b": [2.0, 2.0, 2.0]}, cells=["a", "b"], min_seeds=5)
    assert r["verdict"] == claims.HOLDS and r["deterministic"] and r["comparisons"][0]["deterministic"]
    assert "Deterministic values" in claims.markdown([r])
    r = verdict({"a": [2.0, 2.0, 2.0], "b": [3.0, 3.0, 3.0]}, cells=["a", "b"], min_seeds=5)
    assert r["verdict"] == claims.CONTRADICTED and "deterministic values" in r["why"]
    r = verdict({"a": [2.0] * 3, "b": [2.0] * 3}, cells=["a", "b"], min_seeds=5)  # no difference, exactly
    assert r["verdict"] == claims.CONTRADICTED and "the values are equal" in r["why"]
    r = verdict({"a": [2.1] * 3, "b": [2.0] * 3}, cells=["a", "b"], paper=[3.0, 2.0], min_seeds=5)  # 0.1 of the paper's 1
    assert r["verdict"] == claims.MAGNITUDE and r["comparisons"][0]["upper_bound"] == pytest.approx(0.1)
    # one cell with spread: an ordinary test, and the seed rule
    assert verdict({"a": [3.0, 3.1, 2.9], "b": [2.0] * 3}, cells=["a", "b"], min_seeds=5)["verdict"] == claims.N_SMALL


def share(values, **raw):
    return verdict(values, kind="share", cells=["a", "b"], op="<", value=0.15, **raw)


def test_share_is_fishers_exact_test_of_the_runs_with_the_event():
    collapsed, fine = [0.1] * 6 + [0.7] * 8, [0.6] * 14  # 6 of 14 runs at chance against none
    r = share({"a": collapsed, "b": fine})
    comp, = r["comparisons"]
    ref = stats.fisher_exact([[6, 8], [0, 14]], alternative="greater")
    assert comp["p"] == pytest.approx(ref.pvalue) and comp["events"] == [[6, 14], [0, 14]]
    assert r["verdict"] == claims.HOLDS and comp["effect"] == pytest.approx(6 / 14)
    assert r["values"]["a"]["events"] == 6 and "Fisher" in r["test"]
    assert "6/14 with final_accuracy < 0.15" in claims._value(r["values"]["a"])
    # 2 of 6 against 0 of 6 is not significant; the mean test would not see it either
    few = share({"a": [0.1, 0.1, 0.7, 0.7, 0.7, 0.7], "b": [0.6] * 6})
    assert few["verdict"] == claims.NOT_SHOWN and "2/6 against 0/6" in few["why"]
    assert share({"a": fine, "b": collapsed})["verdict"] == claims.CONTRADICTED
    assert share({"a": fine, "b": collapsed}, relation="<")["verdict"] == claims.HOLDS
    assert share({"a": collapsed, "b": []})["verdict"] == claims.NOT_RUN


@pytest.mark.parametrize("raw, message", [
    ({"test": "welch"}, "tested by Fisher's exact test"),
    ({"relation": ">="}, "relation of a share claim must be > or <"),
    ({"op": "=="}, "op must be one of"),
    ({"paper": 2}, "paper must be the paper's share"),
])
def test_a_bad_share_claim_is_an_error(raw, message):
    with pytest.raises(claims.ClaimError, match=message):
        claim(**{"kind": "share", "cells": ["a", "b"], "op": "<", "value": 0.15, **raw})
    with pytest.raises(claims.ClaimError, match="only a share claim"):
        claim(cells=["a", "b"], test="fisher")


def test_the_checks_list_holds_the_29_digest_checks_and_every_spec_claim_names_one():
    checks = tomllib.loads((ROOT / claims.CHECKS).read_text())["check"]
    ids = [c["id"] for c in checks]
    assert len(ids) == 29 and len(set(ids)) == 29
    assert {p: sum(i.startswith(p) for i in ids) for p in ("000", "001", "002", "003", "004")} == {
        "000": 5, "001": 6, "002": 6, "003": 6, "004": 6}
    for path in sorted((ROOT / "deploy" / "experiments").glob("*.toml")):
        for c in sweep.load_spec(path).claims:
            assert c.id in ids, f"{path.name}: claim {c.id} names no check in {claims.CHECKS}"


def committed_reports():
    """(results.json path, its stored report, its spec) of every committed report under reproductions/."""
    for path in sorted((ROOT / "reproductions").glob("*/*/results.json")):
        stored = json.loads(path.read_text())
        yield path, stored, sweep.load_spec(ROOT / stored["spec"])


def test_every_committed_report_has_the_verdicts_of_its_spec_under_the_current_rules():
    """A change of the claim rules or of a spec's claims re-evaluates the committed reports
    (`hfl sweep SPEC --report-only --out reproductions/PAPER/SPEC`): a report never shows a verdict the rules no longer give."""
    stale = []
    for path, stored, spec in committed_reports():
        if not stored.get("claims"):
            continue
        fresh = {r["id"] + r["label"]: r["verdict"] for r in claims.evaluate_all(spec.claims, stored["cells"])}
        if fresh != {r["id"] + r["label"]: r["verdict"] for r in stored["claims"]}:
            stale.append(path.parent.relative_to(ROOT).as_posix())
    assert not stale, f"re-evaluate with hfl sweep SPEC --report-only --out DIR: {stale}"


def test_every_committed_report_ran_every_cell_and_seed_of_its_spec():
    """A spec that gains seeds or cells (an ablation of a 'not shown': more seeds) is re-run before its report counts:
    resume the sweep on the committed runs (copy `runs/` to the sweep's --out), then commit the new report. A sweep
    run with --max-seeds K holds the first K seeds of the spec in every cell."""
    behind = []
    for path, stored, spec in committed_reports():
        ran = {c["cell"]: sorted(c["seeds"]) for c in stored["cells"]}
        # a sweep stopped by the clock (--max-seeds K, recorded in its provenance) holds the spec's first K seeds
        k = next((len(seeds) for seeds in ran.values()), 0)
        first = spec.seeds[:k] if f"--max-seeds {k}" in stored.get("provenance", {}).get("command", "") else spec.seeds
        if ran != {cell: sorted(first) for cell in spec.cells}:
            behind.append(path.parent.relative_to(ROOT).as_posix())
    assert not behind, f"reports behind their specs' cells or seeds: {behind}"


def test_reproductions_index_and_the_papers_pages_are_current():
    fresh = subprocess.run([sys.executable, "-c", "import json; from hfl import claims; print(json.dumps(claims.index_pages()))"],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout
    pages = json.loads(fresh)
    stale = [rel for rel, text in pages.items() if not (ROOT / rel).is_file() or (ROOT / rel).read_text() != text]
    assert not stale, f"stale: {stale}; write them with python -m hfl.claims index --write"
    page = pages["REPRODUCTIONS.md"]
    assert page.count("\n| [00") == 29
    assert set(pages) == {"REPRODUCTIONS.md"} | {f"{p.relative_to(ROOT).as_posix()}/README.md"
                                                 for p in (ROOT / "reproductions").glob("00?-*")}


def test_every_end_to_end_check_names_its_primary_spec_and_every_other_spec_as_an_ablation():
    checks = tomllib.loads((ROOT / claims.CHECKS).read_text())
    naming = {}
    for path in sorted((ROOT / "deploy" / "experiments").glob("*.toml")):
        for c in sweep.load_spec(path).claims:
            naming.setdefault(c.id, set()).add(path.relative_to(ROOT).as_posix())
    for check in checks["check"]:
        if check.get("unit_tests"):
            assert "primary" not in check, check["id"]
            continue
        primary, ablations = set(check["primary"]), set(check["ablations"])
        assert primary and not primary & ablations and primary | ablations == naming[check["id"]], check["id"]
        assert check["paper_setting"], check["id"]
        labels = {c.label for spec in primary for c in sweep.load_spec(ROOT / spec).claims if c.id == check["id"]}
        assert set(check.get("primary_claims", [])) <= labels, check["id"]
    for pool in checks["pool"]:
        assert (ROOT / pool["parent"]).is_file() and (ROOT / pool["extension"]).is_file()


def result(verdict, label="", id="000/9.2"):
    return {"id": id, "label": label, "verdict": verdict}


def test_a_checks_verdict_is_the_worst_of_its_primary_claims():
    rep = claims_index.Report("p.toml", "reproductions/000-x/p", {}, [
        result(claims.HOLDS, "paper"), result(claims.N_SMALL, "paper, gap"), result(claims.CONTRADICTED, "ablation: x"),
        result(claims.CONTRADICTED, "reference: exact"), result(claims.CONTRADICTED, "", "000/9.3")], [], [])
    check = {"id": "000/9.2", "primary": ["p.toml"]}
    decided = claims_index.primary_results(check, {"p.toml": rep})
    assert [r["label"] for _, r in decided] == ["paper", "paper, gap"]  # ablations, references, other checks: out
    assert claims_index.row_verdict(check, decided) == (claims.N_SMALL, decided[1][1])
    # among claims of the worst verdict, the one whose test alone says least decides, and the row shows it
    few = [result(claims.N_SMALL, "paper, p"), result(claims.N_SMALL, "paper, q")]
    few[0]["comparisons"] = [{"verdict": claims.N_SMALL, "test_verdict": claims.HOLDS}]
    few[1]["comparisons"] = [{"verdict": claims.N_SMALL, "test_verdict": claims.CONTRADICTED}]
    verdict, decider = claims_index.row_verdict(check, [(rep, r) for r in few])
    assert decider is few[1] and claims_index.test_alone(decider) == claims.CONTRADICTED
    named = claims_index.primary_results({**check, "primary_claims": ["paper", "ablation: x"]}, {"p.toml": rep})
    assert claims_index.row_verdict(check, named)[0] == claims.CONTRADICTED
    assert claims_index.row_verdict(check, [])[0] == claims.NOT_RUN
    assert claims_index.row_verdict({"id": "000/9.1", "unit_tests": ["t.py"]}, [])[0] == "unit tests"
    order = [claims.CONTRADICTED, claims.MAGNITUDE, claims.NOT_RUN, claims.N_SMALL, claims.NOT_SHOWN, claims.SHAPE,
             claims.HOLDS]
    assert sorted(order, key=claims.RANK.get) == order


def committed_run(root, cell, seed, lr=0.1):
    d = root / "runs" / cell / f"seed-{seed}"
    d.mkdir(parents=True)
    d.joinpath("config.toml").write_text(f'[run]\nname = "x-{cell}"\nseed = {seed}\n[train]\nlr = {lr}\n')


def test_a_seed_extension_pools_only_runs_that_share_every_setting_but_the_seed(tmp_path):
    parent, ext = tmp_path / "parent", tmp_path / "ext"
    for seed in (0, 1):
        committed_run(parent, "a", seed)
    for seed in (2, 3):
        committed_run(ext, "a", seed)
    assert claims_index.pool_problems(parent, ext, ["a"], sweep.changed_keys) == []
    committed_run(ext, "a", 4, lr=0.2)
    problem, = claims_index.pool_problems(parent, ext, ["a"], sweep.changed_keys)
    assert "ext/seed-4 differs from parent/seed-0 in train.lr" in problem
    committed_run(ext, "b", 1)
    committed_run(parent, "b", 1)
    assert claims_index.pool_problems(parent, ext, ["b"], sweep.changed_keys) == ["b: seed-1 in both"]
    assert "no committed runs in the parent" in claims_index.pool_problems(parent, ext, ["c"], sweep.changed_keys)[0]
    cells = claims_index.pooled([{"cell": "a", "runs": [{"seed": 0}], "seeds": [0]}, {"cell": "z", "runs": [], "seeds": []}],
                                [{"cell": "a", "runs": [{"seed": 2}], "seeds": [2]}])
    assert cells[0]["runs"] == [{"seed": 0}, {"seed": 2}] and cells[0]["seeds"] == [0, 2] and cells[1]["seeds"] == []


def test_the_committed_seed_extensions_pool_into_their_parents():
    checks, reports, _ = claims_index.gather(ROOT, claims_index.Sources(sweep.load_spec, claims.evaluate_all, claims._paired_note, sweep.changed_keys))
    landed = [pool for pool in checks["pool"] if pool["extension"] in reports]  # an extension not yet run pools nothing
    assert len(landed) >= 3
    for pool in landed:
        parent = reports[pool["parent"]]
        assert parent.pool_problems == [] and reports[pool["extension"]].dir in parent.pooled_from
