"""DLG gradient inversion (Zhu et al. 2019) with the DLG LeNet, under SQ-FL / DP-SQ perturbations (paper 004, 9.3)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hfl.common.attacks import dlg
from hfl.common.attacks.lenet import LeNetDLG, build_lenet

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def digit():
    from hfl.common.config import DataSection
    from hfl.common.data import load_dataset

    ds = load_dataset(DataSection())
    return ds.x_train[0].astype(np.float32) / 255.0, int(ds.y_train[0])


def test_lenet_shape_matches_digest_p9():
    # 3 convs 5x5 x 12 channels (1->12, 12->12, 12->12), FC 588 -> 10: 312 + 3612 + 3612 + 5890 parameters.
    model = LeNetDLG()
    assert model.fc.in_features == 588
    assert sum(p.numel() for p in model.parameters()) == 13426
    a = build_lenet(torch.Generator().manual_seed(3))
    b = build_lenet(torch.Generator().manual_seed(3))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert max(float(p.detach().abs().max()) for p in a.parameters()) <= 0.5


def test_soft_cross_entropy_is_cross_entropy_for_one_hot():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([1, 0, 9, 3])
    assert torch.allclose(dlg.soft_cross_entropy(logits, F.one_hot(labels, 10).float()), F.cross_entropy(logits, labels))


def test_device_update_is_a_clipped_sgd_step(digit):
    image, label = digit
    model = build_lenet(torch.Generator().manual_seed(0))
    x = torch.as_tensor(image)[None]
    raw = dlg.device_update(model, x, label, lr=0.01, clip=None)
    clipped = dlg.device_update(model, x, label, lr=0.01, clip=1.0)
    assert np.abs(raw).sum() > 1.0
    assert np.abs(clipped).sum() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(clipped / np.abs(clipped).sum(), raw / np.abs(raw).sum(), rtol=1e-4, atol=1e-10)
    with pytest.raises(ValueError, match="lr"):
        dlg.device_update(model, x, label, lr=0.0, clip=None)
    with pytest.raises(ValueError, match="clip"):
        dlg.device_update(model, x, label, lr=0.1, clip=-1.0)


def test_ssim_bounds(digit):
    image, _ = digit
    assert dlg.ssim(image, image) == pytest.approx(1.0)
    noise = np.random.default_rng(0).random(image.shape)
    assert dlg.ssim(noise, image) < 0.2
    with pytest.raises(ValueError, match="shape"):
        dlg.ssim(image[:, :10], image)


def _attack(image, label, perturb, steps):
    model = build_lenet(torch.Generator().manual_seed(1))
    return dlg.attack_under_mechanisms(
        model, image, label, {"m": perturb}, lr=0.01, clip=10.0, record_at=(0, steps),
        seed_generator=lambda n: torch.Generator().manual_seed(5), seed_rng=lambda n: np.random.default_rng(3))["m"]


def test_dlg_reconstructs_from_the_exact_update_and_not_through_dpsq(digit):
    # Fixed seeds (model 1, dummy 5, uplink 3), 8 L-BFGS steps. Measured: exact update 0.016 -> ~0.99 (the digit is
    # recovered; SSIM > 0.9 leaves room for BLAS round-off), DP-SQ at eps1 = 1e-6, b = 6 stalls near 0.6. A broken
    # gradient-matching loss, label handling or clipping model would leave the first near its start.
    image, label = digit
    clean = _attack(image, label, dlg.identity, 8)
    assert clean.ssim[0] < 0.1 and clean.ssim[-1] > 0.9 and clean.label_guess == label
    try:
        from hfl.common.quantization import roundtrip  # noqa: F401
    except ImportError:
        pytest.skip("codecs not available")
    private = _attack(image, label, dlg.codec_perturbation("dpsq", bits=6, epsilon1=1e-6), 8)
    assert private.ssim[0] == clean.ssim[0]  # same dummy start
    assert private.ssim[-1] < clean.ssim[-1] - 0.2


def test_sq_fl_leaks_at_a_high_bit_width_above_dp_sq_at_the_papers_and_dp_sq_leaks_there_too(digit):
    # Paper 004 9.3 where a leak is expected. Fixed seeds (model 1, dummy 5, uplink 3), 10 L-BFGS steps, per-vector
    # [min, max] range. Measured: SQ-FL at 12 bits 0.016 -> 0.997 (error / signal 9e-7), DP-SQ at eps1 = 1e-6 at
    # the paper's 6 bits 0.62, and DP-SQ at 12 bits 0.996: at eps1 = 1e-6 each coordinate is a fair coin between
    # its two neighbours, which the DLG shrugs off once the grid is fine (the guarantee covers only inputs in the same
    # cell, digest 004 P2). Thresholds sit 0.1 below the measured leaks and 0.2 inside the measured gap.
    image, label = digit
    sq12 = _attack(image, label, dlg.codec_perturbation("sq", bits=12), 10)
    assert sq12.ssim[0] < 0.1 and sq12.ssim[-1] > 0.9 and sq12.label_guess == label
    assert 0 < sq12.perturbation["error_to_signal"] < 1e-5
    dpsq6 = _attack(image, label, dlg.codec_perturbation("dpsq", bits=6, epsilon1=1e-6), 10)
    assert dpsq6.ssim[0] == sq12.ssim[0] and dpsq6.ssim[-1] < sq12.ssim[-1] - 0.2
    dpsq12 = _attack(image, label, dlg.codec_perturbation("dpsq", bits=12, epsilon1=1e-6), 10)
    assert dpsq12.ssim[-1] > 0.9


def test_dlg_is_seeded(digit):
    image, label = digit
    a = _attack(image, label, dlg.identity, 2)
    b = _attack(image, label, dlg.identity, 2)
    np.testing.assert_array_equal(a.images[-1], b.images[-1])


def test_codec_perturbation_uses_only_its_rng():
    try:
        perturb = dlg.codec_perturbation("sq", bits=6)
    except ImportError:
        pytest.skip("codecs not available")
    v = np.random.default_rng(0).normal(size=100)
    a, b = perturb(v, np.random.default_rng(9)), perturb(v, np.random.default_rng(9))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - v).max() <= (v.max() - v.min()) / 63 + 1e-6  # one 6-bit step at most


def test_record_at_validation(digit):
    image, _ = digit
    model = build_lenet(torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="record_at"):
        dlg.dlg_attack(model, np.zeros(13426), image, lr=0.1, clip=None, record_at=(), generator=torch.Generator())


def test_attack_cli_writes_png_and_json(tmp_path):
    from hfl.attack_cli import main

    rc = main(["attack", "dlg", "--set", "attack.iterations=[0, 1]", "--set", "attack.mechanisms=['none']",
               "--set", "attack.max_inner=2", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "dlg.json").read_text())
    assert set(report["ssim"]["none"]) == {"0", "1"} and (tmp_path / "dlg.png").stat().st_size > 1000
    assert main(["attack", "dlg", "--set", "attack.bits=0", "--out", str(tmp_path)]) == 2
    assert main(["attack", "dlg", "--set", "attack.colour=1", "--out", str(tmp_path)]) == 2
