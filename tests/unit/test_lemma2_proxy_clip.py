"""Paper 002's Lemma 2 noise as a calibration option (a claim, labelled), and the clip norm from a public proxy set
(digest P13)."""
import dataclasses
import math
from types import SimpleNamespace

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import rdp
from torch import nn

from hfl.common import config
from hfl.common.models import build, init_parameters
from hfl.common.privacy import instructions, on_wire
from hfl.common.privacy.calibration import calibrate_dp_sgd
from hfl.common.privacy.per_example import per_example_gradients
from hfl.common.privacy.proxy_clip import example_gradient_norms, median_clip, proxy_indices, resolve_clip
from hfl.common.privacy.wavelet import WaveletLayout, coefficient_norms, lemma2_multiplier, padded_length
from hfl.common.seeding import numpy_rng
from hfl.common.shard import make_shard
from hfl.cloud_server.privacy_policy import PrivacyPolicy


def poisson_eps(z, q, steps):
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(1e-5)


# ---- Lemma 2 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wavelet", ["sound", "paper"])
def test_lemma2_calibration_adds_less_noise_and_labels_the_claim(wavelet):
    m = 1024
    s = calibrate_dp_sgd(epsilon=1.0, delta=1e-5, steps=20, lot_rate=0.1, clip=2.0, mode="noise_multiplier",
                         noise_multiplier=1.5, wavelet=wavelet, max_weight=m, lemma2=True)
    z_haar = 1.5 * math.sqrt(2 / (2 + 10))  # Lemma 2 corrected: sigma sqrt(2 / (2 + log2 m))
    assert s.std == pytest.approx(z_haar * 2.0)
    true = z_haar if wavelet == "sound" else z_haar / m
    assert s.noise_multiplier == pytest.approx(true)
    assert s.epsilon_claimed == pytest.approx(poisson_eps(1.5, 0.1, 20), rel=1e-9)  # the paper's claim: sigma's
    assert s.epsilon == pytest.approx(poisson_eps(true, 0.1, 20), rel=1e-9) and s.epsilon > s.epsilon_claimed
    with pytest.raises(ValueError, match="wavelet"):
        calibrate_dp_sgd(epsilon=1.0, delta=1e-5, steps=20, lot_rate=0.1, clip=2.0, mode="noise_multiplier",
                         noise_multiplier=1.5, lemma2=True)


def _policy(tmp_path, overrides):
    cfg = config.load(None, ["topology.edges=2", "topology.devices_per_edge=3", "run.rounds=3",
                             "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.0",
                             "privacy.epsilon=5", "privacy.wavelet_sigma=lemma2"] + overrides)
    return PrivacyPolicy(cfg, ["edge-000", "edge-001"], [100] * 6, tmp_path, {}, layer_sizes=[50])


def test_lemma2_wired_at_sample_level(tmp_path):
    policy = _policy(tmp_path, ["run.algorithm=dp-sgd-wav", "privacy.wavelet_mode=sound", "privacy.lot_rate=0.1"])
    z_haar = lemma2_multiplier(1.0, padded_length(50))
    noise = instructions.read_cluster(policy.cluster_plans(0, policy.participants(0))["edge-000"])
    assert noise.get("device-sample", "sample").multiplier == pytest.approx(z_haar)
    out = policy.describe()
    assert out["wavelet_sigma"].startswith("lemma2") and "claim" in out["wavelet_sigma"]
    assert policy.claimed() is not None and "claimed" in out["epsilon_label"]
    assert policy.claim_only  # the paper's claim: its epsilon does not stop the run
    assert policy.refuse_round(0, policy.participants(0)) is None


def test_lemma2_wired_at_a_trusted_aggregator(tmp_path):
    policy = _policy(tmp_path, ["run.algorithm=dp-fedavg-wav", "privacy.trust=trusted", "privacy.wavelet_mode=sound"])
    z_haar = lemma2_multiplier(1.0, padded_length(50))
    setting = policy.settings["edge-000"]["global"]
    assert setting.noise_multiplier == pytest.approx(z_haar) and setting.epsilon_claimed is not None
    ins = instructions.read_cluster(policy.cluster_plans(0, policy.participants(0))["edge-000"]).get("edge", "global")
    assert ins.multiplier == pytest.approx(z_haar)
    # what the edge adds and records (on_wire.apply_noise on the plan) passes the cloud's check
    vec = np.ones(50, np.float32)
    _, recs = on_wire.edge_release(vec, ins, np.random.default_rng(0), [1.0] * 3, 3, "edge-000",
                                   ["dev-00000", "dev-00001", "dev-00002"], 0, mean=False)
    assert recs[0].noise_multiplier == pytest.approx(z_haar)
    policy.check_events(0, "edge-000", recs)


def test_lemma2_needs_wavelet_noise():
    with pytest.raises(config.ConfigError, match=r"privacy\.wavelet_sigma"):
        config.load(None, ["run.algorithm=dp-sgd", "privacy.wavelet_sigma=lemma2"])


# ---- the clip from a public proxy set ----------------------------------------------------------------------

def test_proxy_indices_are_a_seeded_subset():
    a = proxy_indices(1000, 50, numpy_rng(3, "cloud", 0, 0, "clip_proxy"))
    b = proxy_indices(1000, 50, numpy_rng(3, "cloud", 0, 0, "clip_proxy"))
    assert np.array_equal(a, b) and len(set(a)) == 50 and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, proxy_indices(1000, 50, numpy_rng(4, "cloud", 0, 0, "clip_proxy")))
    assert len(proxy_indices(10, 50, np.random.default_rng(0))) == 10


def test_median_clip_of_a_constructed_linear_model():
    # logits W x with W = 0: softmax is uniform over 2 classes, so the gradient (p - e_y) x^T has norm ||x|| / sqrt 2
    model = nn.Sequential(nn.Linear(2, 2, bias=False))
    nn.init.zeros_(model[0].weight)
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0], [0.0, 1.5], [6.0, 8.0]])
    y = torch.tensor([0, 1, 1, 0, 1])
    norms = example_gradient_norms(model, x, y, chunk=2)
    np.testing.assert_allclose(norms, [1 / 2 ** 0.5, 2 / 2 ** 0.5, 5 / 2 ** 0.5, 1.5 / 2 ** 0.5, 10 / 2 ** 0.5],
                               rtol=1e-6)
    assert median_clip(norms) == pytest.approx(2 / 2 ** 0.5, rel=1e-6)
    with pytest.raises(ValueError):
        median_clip(np.zeros(3))


@pytest.fixture(scope="module")
def public():
    rng = np.random.default_rng(1)
    return SimpleNamespace(x_test=rng.integers(0, 256, size=(60, 1, 28, 28), dtype=np.uint8),
                           y_test=rng.integers(0, 10, size=60), mean=(0.5,), std=(0.25,))


@pytest.mark.parametrize("algorithm, mode", [("dp-sgd", ""), ("dp-sgd-wav", "paper"), ("dp-sgd-wav", "sound")])
def test_resolve_clip_takes_the_median_norm_of_the_proxy_at_the_initial_model(public, algorithm, mode):
    cfg = config.load(None, [f"run.algorithm={algorithm}", "model.name=mlp", "privacy.clip_rule=median_proxy",
                             "privacy.clip_proxy=25", "run.seed=9"] + ([f"privacy.wavelet_mode={mode}"] if mode else []))
    model = build("mlp", (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(2))
    got = resolve_clip(cfg, model, public)
    assert got.replace(privacy=cfg.privacy) == cfg  # only the clip changes
    # reference: per-example gradients of the 25 seeded test images, the clipped norm formed from the coefficients
    idx = np.sort(numpy_rng(9, "cloud", 0, 0, "clip_proxy").choice(60, size=25, replace=False))
    shard = make_shard(public.x_test[idx], public.y_test[idx], public.mean, public.std)
    x, y = shard.batch(torch.arange(25))
    g, _ = per_example_gradients(model, {k: v.detach() for k, v in model.named_parameters()}, x, y)
    g = g.double().numpy()
    if mode:
        layout = WaveletLayout([g.shape[1]])
        norms = coefficient_norms(layout.forward(g), layout.weights, mode)
    else:
        norms = np.linalg.norm(g, axis=1)
    assert got.privacy.clip == pytest.approx(float(np.median(norms)), rel=1e-4)
    assert resolve_clip(cfg.replace(privacy=dataclasses.replace(cfg.privacy, clip_rule="fixed")),
                        model, public).privacy.clip == cfg.privacy.clip


@pytest.mark.parametrize("overrides", [["run.algorithm=dp-fedavg", "privacy.trust=trusted"],
                                       ["run.algorithm=dp-sgd", "privacy.layer_clips=[1,1,1,1,1,1]"]])
def test_median_proxy_is_sample_level_and_flat(overrides):
    with pytest.raises(config.ConfigError, match=r"privacy\.clip_rule"):
        config.load(None, overrides + ["privacy.clip_rule=median_proxy"])
