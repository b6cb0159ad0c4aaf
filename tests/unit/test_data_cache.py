"""The dataset cache: same arrays bit for bit, memory-mapped, keyed by source, damaged entries rebuilt."""
import numpy as np
import pytest

from hfl.common import config as c
from hfl.common import data
from tests.unit.test_data import idx_dir, write_idx  # noqa: F401 - idx_dir is a fixture

SMALL = ["data.dataset=synthetic", "data.synthetic_samples=200", "data.synthetic_shape=[1, 8, 8]"]


def same(a: data.Dataset, b: data.Dataset) -> None:
    for name in data.ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert (a.name, a.num_classes, a.mean, a.std) == (b.name, b.num_classes, b.mean, b.std)


def entry_of(cfg, root):
    return root / data.cache_key(cfg)


@pytest.fixture
def counting(monkeypatch):
    """Count how often the registered loaders actually parse."""
    calls = []
    for name in ("synthetic", "mnist", "mnist-embedded"):
        loader = data.DATASETS.get(name)
        monkeypatch.setitem(data.DATASETS._items, name, lambda cfg, _l=loader: calls.append(cfg.dataset) or _l(cfg))
    return calls


@pytest.mark.parametrize("overrides", [[], SMALL], ids=["mnist-embedded", "synthetic"])
def test_cached_arrays_are_the_parsed_arrays_bit_for_bit(tmp_path, overrides, counting):
    cfg = c.load(None, overrides).data
    parsed = data.DATASETS.get(cfg.dataset)(cfg)
    first = data.load_dataset(cfg, cache=tmp_path)
    second = data.load_dataset(cfg, cache=tmp_path)
    assert counting == [cfg.dataset, cfg.dataset]  # the direct call, then the one cache fill
    same(parsed, first)
    same(parsed, second)
    assert isinstance(second.x_train, np.memmap) and str(second.x_train.filename).startswith(str(tmp_path))
    assert second.x_train.flags.writeable  # copy-on-write: torch takes it without a warning ...
    second.x_train[0] = 0
    same(parsed, data.load_dataset(cfg, cache=tmp_path))  # ... and a write never reaches the file


def test_idx_files_cached_and_keyed_by_their_version(tmp_path, idx_dir, counting):  # noqa: F811
    cfg = c.load(None, ["data.dataset=mnist", f"data.root={str(idx_dir)!r}"]).data
    a = data.load_dataset(cfg, cache=tmp_path / "cache")
    data.load_dataset(cfg, cache=tmp_path / "cache")
    assert counting == ["mnist"]
    write_idx(idx_dir / "t10k-labels-idx1-ubyte", (np.arange(10) + 3) % 10)  # a new version of one source file
    b = data.load_dataset(cfg, cache=tmp_path / "cache")
    assert counting == ["mnist", "mnist"] and list(b.y_test) == list((np.arange(10) + 3) % 10)
    assert list(a.y_test) == list(np.arange(10))
    assert len(list((tmp_path / "cache").glob("mnist-*"))) == 2


def test_loader_parameters_are_part_of_the_key():
    base = c.load(None, SMALL).data
    keys = {data.cache_key(base), data.cache_key(c.load(None, SMALL + ["data.test_fraction=0.3"]).data),
            data.cache_key(c.load(None, SMALL + ["data.synthetic_samples=300"]).data),
            data.cache_key(c.load(None, SMALL + ["data.partition='dirichlet'"]).data)}
    assert len(keys) == 3  # the partition is not the loader's business: same entry


def flip_byte(path):
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0xFF
    path.write_bytes(bytes(raw))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def drop_meta(path):
    (path.parent / "meta.json").unlink()


def garble_meta(path):
    (path.parent / "meta.json").write_text("{not json")


@pytest.mark.parametrize("damage", [flip_byte, truncate, drop_meta, garble_meta])
def test_damaged_entry_is_detected_and_rebuilt(tmp_path, damage, counting):
    cfg = c.load(None, SMALL).data
    data.load_dataset(cfg, cache=tmp_path)  # dropped at once: damaging a mapped file in place would crash its readers
    target = entry_of(cfg, tmp_path) / "x_train.npy"
    damage(target)
    again = data.load_dataset(cfg, cache=tmp_path)
    assert counting == ["synthetic", "synthetic"]
    same(data.DATASETS.get("synthetic")(cfg), again)
    assert data._read_entry(entry_of(cfg, tmp_path)) is not None  # the rebuilt entry is whole again


def test_cache_off_and_unwritable_cache_fall_back_to_parsing(tmp_path, monkeypatch, counting):
    cfg = c.load(None, SMALL).data
    monkeypatch.setenv("HFL_CACHE", "off")
    assert data.cache_root() is None
    data.load_dataset(cfg)
    monkeypatch.setenv("HFL_CACHE", str(tmp_path / "c"))
    assert data.cache_root() == tmp_path / "c"
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    same(data.load_dataset(cfg, cache=blocker), data.load_dataset(cfg, cache=tmp_path / "c"))
    assert counting == ["synthetic"] * 3 and not (tmp_path / "c").joinpath(".tmp").exists()
    assert [p.name for p in (tmp_path / "c").iterdir() if not p.name.startswith(".")] == [data.cache_key(cfg)]


def test_missing_source_is_reported_by_the_loader_not_the_cache(tmp_path):
    with pytest.raises(data.DataError, match="missing train-images-idx3-ubyte"):
        data.load_dataset(c.load(None, ["data.dataset=mnist", f"data.root={str(tmp_path)!r}"]).data, cache=tmp_path)
