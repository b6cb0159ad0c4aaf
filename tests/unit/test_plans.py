import pytest

from hfl.common import config as c
from hfl.common import plans


def kinds(plan):
    return [p.kind for p in plan]


def test_hierfavg_plan():
    cfg = c.load(None, ["train.tau=2", "train.gamma=3"])
    plan = plans.build_plan(cfg)
    assert kinds(plan) == ["local_sgd", "edge_model_sync"] * 2 + ["cloud_sync"]
    assert plan[0].params["steps"] == 3 and plan[0].params["lr"] == cfg.train.lr
    # edge results go down after the first edge round, up to the cloud after the last
    assert [plans.downlink_after(plan, i) for i in range(len(plan))] == [False, True, False, False, False]
    assert (plans.weights_rule(cfg, "edge"), plans.weights_rule(cfg, "cloud")) == ("samples", "samples")


def test_qhetfed_plan_is_algorithm_1():
    cfg = c.load(None, ["run.algorithm=qhetfed", "train.tau=3", "train.gamma=2", "train.local_unit=epochs"])
    plan = plans.build_plan(cfg)
    assert kinds(plan) == ["edge_gradient_step"] * 3 + ["local_sgd", "edge_model_sync", "cloud_sync"]
    assert plan[3].params["epochs"] == 2
    assert [plans.downlink_after(plan, i) for i in range(len(plan))] == [True] * 3 + [False] * 3
    # paper 001: plain means at the edge, N_l / N at the cloud
    assert (plans.weights_rule(cfg, "edge"), plans.weights_rule(cfg, "cloud")) == ("devices", "devices")
    override = c.load(None, ["run.algorithm=qhetfed", "aggregation.cloud_weights=samples"])
    assert plans.weights_rule(override, "cloud") == "samples"


def test_unknown_phase():
    with pytest.raises(ValueError, match="unknown phase"):
        plans.phase("edge_magic")


def test_every_cloud_weight_rule_has_its_weight():
    from types import SimpleNamespace

    from hfl.cloud_server.fusion_center import FUSION_WEIGHT
    from hfl.cloud_server.modes import CLOUD_WEIGHTS

    res = SimpleNamespace(samples=120, devices=3, scalars={FUSION_WEIGHT: 0.25})
    assert {rule: f(res) for rule, f in CLOUD_WEIGHTS.items()} == {"samples": 120.0, "devices": 3.0, "equal": 1.0,
                                                                  "fusion": 0.25}
    # every rule the config accepts (auto resolves to one of them) and every algorithm's own rule
    from hfl.common import plans
    from hfl.common.config import AggregationSection

    allowed = set(dataclasses_choices(AggregationSection, "cloud_weights")) - {"auto"}
    assert allowed | {a.cloud_weights for a in map(plans.ALGORITHMS.get, plans.ALGORITHMS)} <= set(CLOUD_WEIGHTS)


def dataclasses_choices(cls, name):
    import dataclasses

    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["choices"]
