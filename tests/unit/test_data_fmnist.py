"""Fashion-MNIST without data.root: the Debian package's folder (or $HFL_DATASETS) is found, and a missing
dataset is reported with the package name and data.root."""
import gzip
import struct

import numpy as np
import pytest

from hfl.common import config as c
from hfl.common import data as d


def write_idx(path, arr):
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + arr.astype(np.uint8).tobytes())


def fake_fmnist(folder, n_train=20, n_test=10):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)


def test_found_without_root_under_hfl_datasets(tmp_path, monkeypatch):
    fake_fmnist(tmp_path / "fashion-mnist")
    monkeypatch.setenv("HFL_DATASETS", str(tmp_path))
    cfg = c.load(None, ["data.dataset=fashion-mnist"]).data
    assert d.resolve_root("fashion-mnist", "") == tmp_path / "fashion-mnist"
    data = d.load_dataset(cfg, cache=tmp_path / "cache")
    assert data.x_train.shape == (20, 1, 28, 28) and data.name == "fashion-mnist" and data.mean == (0.2860,)
    assert d.cache_key(cfg) is not None  # cached like any other IDX dataset


def test_missing_names_the_package_and_root(tmp_path, monkeypatch):
    monkeypatch.setattr(d, "default_roots", lambda name: [tmp_path / "nowhere"])
    with pytest.raises(d.DataError, match=r"apt-get install dataset-fashion-mnist.*data\.root"):
        d.load_dataset(c.load(None, ["data.dataset=fashion-mnist"]).data, cache=tmp_path)


def test_default_roots_include_the_debian_folder(monkeypatch):
    monkeypatch.delenv("HFL_DATASETS", raising=False)
    assert d.pathlib.Path("/usr/share/datasets/fashion-mnist") in d.default_roots("fashion-mnist")
