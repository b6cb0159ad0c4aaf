"""Checks of a config that need data or a model but no running node, done before any process starts
(`hfl run`, `hfl config`, `hfl sweep --dry-run`, the Testbed): the dataset is there, every device gets samples,
the model accepts the data's shape, a latency.auto_tau_gamma deadline fits the model's T_di, an air run's
messages fit net.max_message_mb, and train.device = "cuda" finds CUDA (here, unless the device hosts run on a Ray
cluster's nodes: `devices_elsewhere`). Each failure is a ConfigError naming the key to change."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Sequence

from hfl.common.channel.config import check_air_messages
from hfl.common.config import Config, ConfigError
from hfl.node_spawn import CallFailed, call_here

_checked: dict[str, dict] = {}
_devices_here = contextvars.ContextVar("devices_here", default=True)


@contextlib.contextmanager
def devices_elsewhere(elsewhere: bool = True):
    """Within: the runs' device hosts start on other machines (`--cluster`), so train.device = "cuda" is not checked
    against this one's GPUs (a task's testbed checks its node's; hfl/cluster.py checks the reservation)."""
    token = _devices_here.set(not elsewhere)
    try:
        yield
    finally:
        _devices_here.reset(token)


def check_train_device(cfg: Config, call: Callable = call_here) -> None:
    """train.device = "cuda" without a CUDA GPU here: refused before any process starts (through `call`, so that the
    launcher itself need not import torch)."""
    from hfl.common.models import cuda_devices, no_cuda

    if cfg.train.device == "cuda" and _devices_here.get() and not call(cuda_devices):
        raise ConfigError(no_cuda())
_models: dict[str, tuple] = {}  # (data, model, plugins) -> the forward pass's (output shape, parameters)


def preflight(cfg: Config, call: Callable = call_here) -> dict:
    """Load the dataset (through the shared cache), partition it as the cloud will, and run one forward pass of
    the model on two training samples (through `call`: node_spawn.call_forked runs it in a fork of the forkserver,
    so that the launcher does not import torch). Remembered per (data, model, topology, seed), the forward pass per
    (data, model), so a sweep pays it once. Returns what it learned: num_classes, train_samples, input_shape,
    parameters."""
    import json

    from hfl.common.config import to_dict

    check_train_device(cfg, call)
    d = to_dict(cfg)
    key = json.dumps([d["data"], d["model"], d["topology"], d["run"]["seed"], d["run"]["plugins"]], sort_keys=True)
    if key in _checked:
        check_model_deadline(cfg, _checked[key])
        check_air_messages(cfg, _checked[key]["parameters"])
        return _checked[key]
    from hfl.common.data import DataError, load_dataset
    from hfl.common.partition import partition
    from hfl.common.seeding import numpy_rng

    try:
        data = load_dataset(cfg.data)
    except (DataError, OSError) as exc:
        raise ConfigError(f"data.dataset = {cfg.data.dataset!r}: {exc}") from None
    if len(data.x_train) < cfg.num_devices:
        raise ConfigError(f"topology: {cfg.num_devices} devices ({cfg.topology.edges} edges x "
                          f"{cfg.topology.devices_per_edge}) but {cfg.data.dataset} has {len(data.x_train)} training "
                          "samples: use fewer devices")
    import inspect

    extra = {"edges": cfg.topology.edges} if "edges" in inspect.signature(partition).parameters else {}
    try:
        partition(data.y_train, cfg.num_devices, numpy_rng(cfg.run.seed, "data", "partition"), cfg.data, **extra)
    except ValueError as exc:
        raise ConfigError(f"data.partition = {cfg.data.partition!r} with {cfg.num_devices} devices: {exc}") from None
    model_key = json.dumps([d["data"], d["model"], d["run"]["plugins"]], sort_keys=True)
    if model_key not in _models:
        _models[model_key] = _forward(cfg, data, call)
    shape, parameters = _models[model_key]
    if shape != (2, data.num_classes):
        raise ConfigError(f"model.name = {cfg.model.name!r} gives outputs of shape {shape[1:]} per sample; "
                          f"{cfg.data.dataset} has {data.num_classes} classes")
    check_aggregator(cfg)
    check_stages(cfg)
    _checked[key] = {"num_classes": data.num_classes, "train_samples": len(data.x_train),
                     "input_shape": tuple(data.input_shape), "parameters": parameters}
    check_model_deadline(cfg, _checked[key])
    check_air_messages(cfg, _checked[key]["parameters"])
    return _checked[key]


def _forward(cfg: Config, data, call: Callable) -> tuple:
    """(output shape, parameter count) of the model on two training samples, through `call`."""
    import sys

    import numpy as np

    try:
        return call(model_outputs, cfg.model.name, tuple(data.input_shape), data.num_classes,
                    np.asarray(data.x_train[:2], dtype=np.float32), list(cfg.run.plugins), list(sys.path))
    except CallFailed:
        raise
    except Exception as exc:  # any shape mismatch or a plugin model's own error
        raise ConfigError(f"model.name = {cfg.model.name!r} does not run on {cfg.data.dataset} (input shape "
                          f"{tuple(data.input_shape)}, {data.num_classes} classes): {exc.__class__.__name__}: {exc}") from None


def model_outputs(name: str, input_shape: tuple[int, ...], num_classes: int, x, plugins: Sequence[str] = (),
                  path: Sequence[str] = ()) -> tuple[tuple[int, ...], int]:
    """The output shape of model `name` on the batch `x` and its parameter count. In a forked process, `path`
    (the launcher's sys.path) and `plugins` (run.plugins) make the launcher's plugin models known."""
    import sys

    import torch

    from hfl.common.models import build
    from hfl.common.plugins import load_plugins

    sys.path.extend(p for p in path if p not in sys.path)
    load_plugins(plugins)
    model = build(name, input_shape, num_classes)
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    return tuple(out.shape), sum(p.numel() for p in model.parameters())


def check_aggregator(cfg: Config) -> None:
    """Run the aggregation rule once on a cluster's worth of small vectors, so that its parameters' errors (e.g.
    trimmed_mean's beta >= 0.5) come before any process starts, not in the first round."""
    import numpy as np

    from hfl.common import robust

    n = max(2, cfg.topology.devices_per_edge)
    vectors = list(np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32))
    try:
        out = robust.aggregate(cfg.pipeline.aggregate, cfg.pipeline.params, vectors, [1.0] * n)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"pipeline.aggregate = {cfg.pipeline.aggregate!r} with [pipeline.params."
                          f"{cfg.pipeline.aggregate}]: {exc}") from None
    if np.shape(out) != (8,) or not np.isfinite(out).all():
        raise ConfigError(f"pipeline.aggregate = {cfg.pipeline.aggregate!r} gives {np.shape(out)} values (or non-finite "
                          f"ones) for {n} vectors of 8: an aggregator returns one finite vector of their length")


def check_stages(cfg: Config) -> None:
    """Run each configured vector stage (clip, device and edge noise) once on a small vector with its
    [pipeline.params.NAME], so that a bad parameter fails before launch. A private algorithm's noise and clip take
    parameters from the round plan at run time: those are checked by the privacy configuration instead."""
    import numpy as np

    from hfl.common import plans
    from hfl.common.pipeline import IDENTITY_NAMES, VECTOR_STAGES

    if plans.is_private(cfg):
        return
    vec = np.random.default_rng(0).normal(size=16).astype(np.float32)
    for slot in ("clip", "device_noise", "edge_noise"):
        name = getattr(cfg.pipeline, slot)
        if name in IDENTITY_NAMES:
            continue
        try:
            out = VECTOR_STAGES.get(name)(vec.copy(), np.random.default_rng(0), **dict(cfg.pipeline.params.get(name, {})))
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"pipeline.{slot} = {name!r} with [pipeline.params.{name}]: {exc.__class__.__name__}: "
                              f"{exc}") from None
        if np.shape(out) != vec.shape or not np.isfinite(out).all():
            raise ConfigError(f"pipeline.{slot} = {name!r} gives {np.shape(out)} values (or non-finite ones) for 16: a "
                              f"stage returns a finite vector of its input's length")


def check_model_deadline(cfg: Config, learned: dict) -> None:
    """latency.auto_tau_gamma on the model's time base (latency.time_base = "model"): the deadline must leave room
    for tau = gamma = 1 with the T_di times of this model (config validation checks the configured times)."""
    import math

    from hfl.common.quantization import schedule

    s = cfg.latency
    if s.auto_tau_gamma and s.source == "config" and s.time_base == "model":
        timed, _ = schedule.with_time_base(cfg, learned["parameters"], math.prod(learned["input_shape"]))
        schedule.check_deadline(timed.latency)
