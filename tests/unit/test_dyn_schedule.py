"""Dyn-DP-SGD / Dyn-DP-FedAvg (Du et al. 2021, paper 002's baseline): the per-round schedule of clip and noise
multiplier, the budget its first multiplier is solved for, and what the cloud plans and the ledger charges."""
import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from hfl.common import config
from hfl.common.config import ConfigError
from hfl.common.privacy import instructions, on_wire, schedules
from hfl.common.privacy.schedules import (RoundScale, dyn_base_multiplier, dyn_clip_factor, dyn_multiplier_factor,
                                          gdp_total_mu)
from hfl.cloud_server.privacy_policy import PrivacyPolicy
from hfl.proto import hfl_v1_pb2 as pb


def test_factors_follow_the_exponential_schedule():
    # C_t = C_0 rho_c^(t/T), z_t = z_0 rho_mu^(t/T): 1 at the start, rho at t = T, sqrt(rho) half way
    assert dyn_clip_factor(0.5, 0, 10) == 1.0 and dyn_clip_factor(0.5, 10, 10) == 0.5
    assert dyn_clip_factor(0.25, 5, 10) == pytest.approx(0.5)
    assert dyn_multiplier_factor(0.5, 5, 10) == pytest.approx(math.sqrt(0.5))


def test_gdp_total_is_the_clt_formula_and_exact_without_sampling():
    mus = [0.5, 1.0, 2.0]
    assert gdp_total_mu(mus, 0.1, [2, 1, 3]) == pytest.approx(
        0.1 * math.sqrt(2 * math.expm1(0.25) + math.expm1(1.0) + 3 * math.expm1(4.0)))
    assert gdp_total_mu(mus, 1.0) == pytest.approx(math.sqrt(0.25 + 1 + 4))


@pytest.mark.parametrize("sigma, q, steps", [(1.0, 0.05, 20), (3.0, 0.1, 5), (1.5, 1.0, 1)])
def test_gdp_budget_matches_eq10_of_the_constant_run(sigma, q, steps):
    rounds, rho = 12, 0.5
    z0 = dyn_base_multiplier(sigma, rho_mu=rho, rounds=rounds, steps=steps, q=q, budget="gdp")
    mus = [1 / (z0 * dyn_multiplier_factor(rho, r, rounds)) for r in range(rounds)]
    assert gdp_total_mu(mus, q, [steps] * rounds) == pytest.approx(gdp_total_mu([1 / sigma], q, [rounds * steps]),
                                                                   rel=1e-9)
    # as noisy as vanilla on average: the first round noisier, the last one less
    assert sigma < z0 < sigma / rho and z0 * dyn_multiplier_factor(rho, rounds - 1, rounds) < sigma


def test_accountant_budget_spends_what_the_constant_run_spends():
    sigma, q, steps, rounds, rho = 1.2, 0.05, 10, 8, 0.5
    z0 = dyn_base_multiplier(sigma, rho_mu=rho, rounds=rounds, steps=steps, q=q, budget="accountant")
    orders = list(schedules._ORDERS)

    def eps(zs, count):
        acc = rdp.RdpAccountant(orders)
        for z in zs:  # one event per round: a changing multiplier composes round by round
            acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), count)
        return acc.get_epsilon(1e-5)

    dyn = eps([z0 * dyn_multiplier_factor(rho, r, rounds) for r in range(rounds)], steps)
    assert dyn == pytest.approx(eps([sigma], rounds * steps), rel=1e-5)


def _instruction(**kw):
    return pb.NoiseInstruction(**{**dict(tier="edge", stream="global", shape="gaussian", multiplier=2.0,
                                         sensitivity=1.5, clip=3.0, clip_at=["edge"]), **kw})


def test_round_scale_rescales_the_noise_instructions_only():
    plan = pb.ClusterPlan(params={"client_rate": 0.5}, noise=[_instruction()],
                          devices={"dev-00001": pb.DevicePlan(noise=[_instruction(tier="device-sample", stream="sample",
                                                                                  clip=0.0, clip_at=[])])})
    RoundScale(multiplier=0.5, clip=0.8).apply(plan)
    assert dict(plan.params) == {"client_rate": 0.5, "clip_scale": 0.8}
    for ins, clip in ((plan.noise[0], 2.4), (plan.devices["dev-00001"].noise[0], 0.0)):
        assert (ins.multiplier, ins.sensitivity, ins.clip) == (1.0, pytest.approx(1.2), pytest.approx(clip))
        assert (ins.shape, list(ins.clip_at) == ["edge"]) == ("gaussian", ins.tier == "edge")
    same = pb.ClusterPlan(noise=[_instruction()])
    RoundScale().apply(same)
    assert same == pb.ClusterPlan(noise=[_instruction()])


def _policy(tmp_path, overrides, edges=2):
    cfg = config.load(None, [f"topology.edges={edges}", "topology.devices_per_edge=3", "run.rounds=4",
                             "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.0",
                             "privacy.epsilon=1e9"] + overrides)
    ids = [f"edge-{i:03d}" for i in range(edges)]
    return PrivacyPolicy(cfg, ids, [100] * (3 * edges), tmp_path, {}, layer_sizes=[50]), cfg


def test_dyn_dp_sgd_plans_each_rounds_noise_and_the_ledger_charges_it(tmp_path):
    policy, cfg = _policy(tmp_path, ["run.algorithm=dyn-dp-sgd", "privacy.lot_rate=0.1", "train.tau=1",
                                     "train.gamma=3", "privacy.dyn_budget=gdp"])
    z0 = dyn_base_multiplier(1.0, rho_mu=0.5, rounds=4, steps=3, q=0.1, budget="gdp")
    charged = []
    for r in range(4):
        participants = policy.participants(r)
        cluster = policy.cluster_plans(r, participants)["edge-000"]
        plan, z = cluster.params, instructions.read_cluster(cluster).get("device-sample", "sample").multiplier
        assert z == pytest.approx(z0 * 0.5 ** (r / 4), rel=1e-12)
        assert plan["clip_scale"] == pytest.approx(0.5 ** (r / 4)) if r else "clip_scale" not in plan
        planned = policy.planned_records(r, participants)
        assert [rec.noise_multiplier for rec in planned] == pytest.approx([z] * len(planned))
        assert {rec.count for rec in planned} == {3}
        policy.record(r, {"edge-000": [on_wire.to_transform(rec) for rec in planned]})
        charged.append(z)
    line = json.loads((tmp_path / "privacy_ledger.jsonl").read_text().splitlines()[-1])
    acc = rdp.RdpAccountant()
    for z in charged:
        acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z)), 3)
    assert line["epsilon"]["dev-00000"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert policy.describe()["schedule"]["name"] == "dyn"


def test_dyn_dp_fedavg_scales_the_edge_noise_and_its_bound(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=dyn-dp-fedavg", "privacy.trust=trusted", "privacy.clip=2.0"])
    setting = policy.settings["edge-000"]["global"]
    z0 = dyn_base_multiplier(1.0, rho_mu=0.5, rounds=4, steps=1, q=1.0)
    ins = instructions.read_cluster(policy.cluster_plans(2, policy.participants(2))["edge-001"]).get("edge", "global")
    assert ins.multiplier == pytest.approx(z0 * 0.5 ** 0.5)
    assert ins.clip == pytest.approx(2.0 * 0.5 ** 0.5) and ins.clip_at == ("device", "edge")
    assert ins.sensitivity == pytest.approx(setting.sensitivity * 0.5 ** 0.5)
    # an edge event at the round's multiplier passes the cloud's check; one at the constant multiplier does not
    rec = setting.record("edge-001", ("dev-00003",), 2).replace(noise_multiplier=ins.multiplier,
                                                                 sensitivity=ins.sensitivity)
    policy.check_events(2, "edge-001", [rec])
    with pytest.raises(Exception, match="does not match"):
        policy.check_events(2, "edge-001", [rec.replace(noise_multiplier=1.0)])


def test_constant_algorithms_plan_what_they_did_before(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=dp-sgd", "privacy.lot_rate=0.1"])
    cluster = policy.cluster_plans(3, policy.participants(3))["edge-000"]
    assert instructions.read_cluster(cluster).get("device-sample", "sample").multiplier == 1.0
    assert "clip_scale" not in cluster.params


@pytest.mark.parametrize("overrides, key", [
    (["run.algorithm=dyn-dp-sgd", "privacy.mechanism=wavelet"], "privacy.mechanism"),
    (["run.algorithm=dyn-dp-sgd", "privacy.lot=fixed"], "privacy.lot"),
    (["run.algorithm=dyn-dp-sgd", "privacy.dyn_rho_c=0"], "privacy.dyn_rho_c"),
])
def test_bad_dyn_configs_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config.load(overrides=overrides)
