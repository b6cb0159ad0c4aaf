"""CIFAR-10 from the user's own copy (issue 21: paper 001's dataset when a user has it): the python-pickle batches
read from data.root, pixel layout (1,024 red, then green, then blue values, row-major), labels, cache, errors. The
fixture is written in the distribution's format (protocol 2, bytes keys, extra keys of the real batches)."""
import pickle

import numpy as np
import pytest

from hfl import families  # noqa: F401  (the config's family sections)
from hfl.common import config as c
from hfl.common.data import DataError, load_dataset

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_batches(folder, per_batch=3):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    written = {}
    for b, name in enumerate(BATCHES):
        data = rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8)
        labels = [(b + i) % 10 for i in range(per_batch)]
        batch = {b"batch_label": f"{name} of 6".encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"img_{b}_{i}.png".encode() for i in range(per_batch)]}
        with open(folder / name, "wb") as fh:
            pickle.dump(batch, fh, protocol=2)
        written[name] = (data, labels)
    return written


def cifar(root):
    return c.load(None, ["data.dataset=cifar10", f"data.root={str(root)!r}"]).data


@pytest.mark.parametrize("nested", [True, False])
def test_batches_load_with_the_right_pixel_layout(tmp_path, nested):
    written = write_batches(tmp_path / "cifar-10-batches-py" if nested else tmp_path / "flat")
    data = load_dataset(cifar(tmp_path if nested else tmp_path / "flat"), cache=tmp_path / "cache")
    assert data.x_train.shape == (15, 3, 32, 32) and data.x_test.shape == (3, 3, 32, 32)
    assert data.x_train.dtype == np.uint8 and data.num_classes == 10 and len(data.mean) == 3
    row, labels = written["data_batch_2"][0][1], written["data_batch_2"][1][1]
    img = data.x_train[3 + 1]  # second image of the second batch
    for ch in range(3):
        for i, j in [(0, 0), (0, 31), (5, 7), (31, 31)]:
            assert img[ch, i, j] == row[ch * 1024 + i * 32 + j]
    assert data.y_train[4] == labels
    assert list(data.y_test) == written["test_batch"][1]
    again = load_dataset(cifar(tmp_path if nested else tmp_path / "flat"), cache=tmp_path / "cache")
    assert np.array_equal(again.x_train, data.x_train)  # read back from the cache entry
    assert any((tmp_path / "cache").iterdir())


def test_missing_root_or_batch_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="needs data.root"):
        load_dataset(c.load(None, ["data.dataset=cifar10"]).data)
    write_batches(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3"):
        load_dataset(cifar(tmp_path), cache=tmp_path / "cache")
