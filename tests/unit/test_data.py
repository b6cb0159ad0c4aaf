import gzip
import pickle
import struct

import numpy as np
import pytest

from hfl.common import config as c
from hfl.common.data import DataError, load_dataset, read_idx


def write_idx(path, arr, gz=False):
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    payload = header + arr.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(payload)


@pytest.fixture
def idx_dir(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), gz=True)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    return tmp_path


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_loaders(idx_dir, name):
    data = load_dataset(c.load(None, [f"data.dataset={name}", f"data.root={str(idx_dir)!r}"]).data)
    assert data.x_train.shape == (30, 1, 28, 28) and data.x_test.shape == (10, 1, 28, 28)
    assert data.x_train.dtype == np.uint8 and list(data.y_train[:12]) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    raw = read_idx(idx_dir / "train-images-idx3-ubyte.gz")
    assert np.array_equal(raw, data.x_train[:, 0])


def test_idx_errors(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataError, match="bad magic"):
        read_idx(tmp_path / "bad")
    with pytest.raises(DataError, match="missing train-images-idx3-ubyte"):
        load_dataset(c.load(None, ["data.dataset=mnist", f"data.root={str(tmp_path)!r}"]).data)
    with pytest.raises(DataError, match="needs data.root"):
        load_dataset(c.load(None, ["data.dataset=mnist"]).data)


def test_cifar10_python_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (4, 3072)).astype(np.uint8), b"labels": [1, 2, 3, 4]}
        with open(folder / name, "wb") as fh:
            pickle.dump(batch, fh)
    data = load_dataset(c.load(None, ["data.dataset=cifar10", f"data.root={str(tmp_path)!r}"]).data)
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    assert list(data.y_test) == [1, 2, 3, 4] and len(data.mean) == 3


def test_embedded_mnist_is_real_and_fixed():
    data = load_dataset(c.Config().data)
    assert data.x_train.shape == (4000, 1, 28, 28) and data.x_test.shape == (1000, 1, 28, 28)
    assert set(np.unique(data.y_train)) == set(range(10)) and data.x_train.max() == 255
    again = load_dataset(c.Config().data)
    assert np.array_equal(again.y_test, data.y_test)


def test_synthetic_is_deterministic_and_sized():
    cfg = c.load(None, ["data.dataset=synthetic", "data.synthetic_samples=500", "data.synthetic_shape=[3, 16, 16]"]).data
    a, b = load_dataset(cfg), load_dataset(cfg)
    assert a.x_train.shape == (400, 3, 16, 16) and np.array_equal(a.x_train, b.x_train)


def test_a_dataset_that_would_train_at_chance_is_refused_where_it_loads():
    """Float features (scaled by 1/255 like images, they train at chance), labels outside [0, num_classes) or a
    label count that differs from the images: refused with the dataset's name, in every process that loads it."""
    import dataclasses

    import numpy as np
    import pytest

    from hfl.common.data import Dataset, DataError, check_dataset

    rng = np.random.default_rng(0)
    good = Dataset("mine", rng.integers(0, 256, (20, 1, 4, 4), dtype=np.uint8), rng.integers(0, 3, 20),
                   rng.integers(0, 256, (5, 1, 4, 4), dtype=np.uint8), rng.integers(0, 3, 5), 3, (0.5,), (0.25,))
    assert check_dataset(good, "mine") is good
    cases = {
        "float32 of shape": dataclasses.replace(good, x_train=good.x_train.astype(np.float32) / 255),
        "(N, C, H, W)": dataclasses.replace(good, x_test=good.x_test.reshape(5, 16)),
        "outside [0, num_classes = 3)": dataclasses.replace(good, y_train=good.y_train + 1),
        "integer labels": dataclasses.replace(good, y_test=good.y_test[:4]),
        "num_classes must be": dataclasses.replace(good, num_classes=1),
    }
    for says, bad in cases.items():
        with pytest.raises(DataError, match="dataset 'mine'") as err:
            check_dataset(bad, "mine")
        assert says in str(err.value), (says, str(err.value))
    assert "(x * 255).round().astype(np.uint8)" in str(pytest.raises(DataError, check_dataset, cases["float32 of shape"],
                                                                     "mine").value)
