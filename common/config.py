"""Run configuration: frozen dataclasses loaded from TOML, with `--set section.key=value` overrides.

Unknown keys and bad values fail with a message that names the key and the allowed values. The engine's sections are
declared here; a family (privacy, quantization, channel, control, ...) adds its own section and its checks from its
own package with `register_section` and `register_validator`, so this module imports none of them.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import pathlib
import tomllib
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .config_error import ConfigError
from .registry import Registry


def choice(default: Any, choices: tuple[str, ...] | str, doc: str = "") -> Any:
    """A field whose value must be one of `choices` (a tuple, or "module:REGISTRY" resolved lazily)."""
    return field(default=default, metadata={"choices": choices, "doc": doc})


def doc(default: Any, text: str, **extra: Any) -> Any:
    return field(default=default, metadata={"doc": text, **extra})


@dataclass(frozen=True)
class RunSection:
    name: str = doc("default", "label of the run, used in the run directory name")
    seed: int = doc(0, "run seed; every generator is derived from (seed, tier, node, round)")
    rounds: int = doc(8, "global (cloud) rounds", min=1)
    algorithm: str = choice("hierfavg", "hfl.common.plans:ALGORITHMS", "round schedule")
    eval_every: int = doc(1, "evaluate the global model every this many rounds (the last round always)", min=1)
    plugins: tuple[str, ...] = doc((), "modules every process imports before the config is checked (their "
                                       "registrations become valid names; also $HFL_PLUGINS, comma-separated); "
                                       "see docs/plugins.md")


@dataclass(frozen=True)
class TopologySection:
    edges: int = doc(2, "edge servers (clusters)", min=1)
    devices_per_edge: int = doc(5, "emulated devices per edge", min=1)
    hosts_per_edge: int = doc(1, "device host processes per edge (host_layout=per_edge)", min=1)
    host_layout: str = choice("per_core", ("per_core", "per_edge"),
                              "device hosts: per_core = `device_hosts` processes, each emulating devices of any edges; "
                              "per_edge = `hosts_per_edge` processes per edge (containers, edge sites)")
    device_hosts: int = doc(0, "host_layout=per_core: device host processes (0 = one per core)", min=0)
    edge_processes: int = doc(0, "local testbed: edge server processes (0 = one per edge); fewer share them, each edge "
                                 "on its own port with its own certificate (less memory at scale; a crash stops the "
                                 "process's edges together)", min=0)


@dataclass(frozen=True)
class DataSection:
    dataset: str = choice("mnist-embedded", "hfl.common.data:DATASETS", "dataset name")
    root: str = doc("", "directory with the dataset files (mnist, fashion-mnist, cifar10)")
    partition: str = choice("iid", "hfl.common.partition:PARTITIONERS", "how training data is split over devices")
    classes_per_device: int = doc(2, "partition=classes, edge-classes, mixed: labels per device", min=1)
    classes_per_edge: int = doc(4, "partition=edge-classes: labels per edge; its devices draw theirs from these", min=1)
    edge_partitions: tuple[str, ...] = doc((), "partition=mixed: per edge one of iid, classes, half; [] = paper 001's "
                                               "iid, classes, half repeated")
    class_draw: str = choice("deck", ("deck", "independent"), "partition=classes, non-iid1, non-iid2, mixed, "
                             "edge-classes: deck = every label held by equally many devices (+-1), dealt as a shuffled "
                             "deck; independent = each device draws its labels on its own (paper 001's literal reading)")
    dirichlet_alpha: float = doc(0.5, "partition=dirichlet, hier-dirichlet (within an edge): concentration", min=1e-6)
    edge_alpha: float = doc(1.0, "partition=hier-dirichlet: concentration across edges", min=1e-6)
    samples_per_device: tuple[int, int] = doc((0, 0), "[lo, hi]: draw each device's sample count; [0, 0] = split all")
    sample_sizes: str = choice("uniform", ("uniform", "power-law"), "law of the counts on samples_per_device: "
                               "uniform, or power-law p(n) ~ n^-2 (paper 003; [100, 1000] when the range is unset)")
    test_fraction: float = doc(0.2, "mnist-embedded/synthetic: share held out for the cloud's test set", min=0.01, max=0.9)
    synthetic_samples: int = doc(12000, "synthetic: total samples generated", min=10)
    synthetic_shape: tuple[int, int, int] = doc((1, 28, 28), "synthetic: image shape (C, H, W)")
    max_test_samples: int = doc(0, "evaluate on at most this many test samples (0 = all)", min=0)


@dataclass(frozen=True)
class ModelSection:
    name: str = choice("mnist-cnn", "hfl.common.models:MODELS", "model architecture")


@dataclass(frozen=True)
class TrainSection:
    lr: float = doc(0.05, "learning rate (mu)", min=0.0)
    batch_size: int = doc(32, "mini-batch size B", min=1)
    tau: int = doc(4, "hierfavg: edge rounds per cloud round; qhetfed: edge gradient steps per round; "
                      "h2fdp family: SGD steps per global round (a multiple of gamma)", min=0)
    gamma: int = doc(5, "local SGD steps (or epochs, see local_unit) per local phase", min=0)
    local_unit: str = choice("steps", ("steps", "epochs"), "unit of gamma")
    torch_threads: int = doc(1, "torch intra-op threads per process", min=1)
    device: str = choice("cpu", ("cpu", "auto", "cuda"), "device hosts' torch device: cpu (results bit for bit as "
                         "without the key), auto = cuda where torch.cuda.is_available() else cpu, cuda = refused before "
                         "the run where CUDA is missing; a host uses GPU host_index mod the visible GPUs, DP-SGD's "
                         "per-example step stays on the CPU; see docs/cluster.md")
    participants: int = doc(0, "devices per cluster taking part in a round (s_c^k, drawn uniformly from the run seed); "
                               "0 = every device", min=0)


@dataclass(frozen=True)
class AggregationSection:
    edge_weights: str = choice("auto", ("auto", "samples", "devices"), "edge averaging weights; auto = the algorithm's paper")
    cloud_weights: str = choice("auto", ("auto", "samples", "devices", "equal"),
                                "cloud averaging weights (equal: 1/N per edge); auto = the algorithm's paper")
    max_update_ratio: float = doc(1e4, "the cloud refuses a round whose model moves by more than this times "
                                  "max(1, ||w||) (the previous model is kept; 0 = only non-finite models are refused)",
                                  min=0)
    max_member_ratio: float = doc(10.0, "an edge leaves out a device's upload whose norm is over this times the median "
                                  "norm of the phase's other uploads (one insider cannot swamp its cluster; 0 = off)",
                                  min=0)


@dataclass(frozen=True)
class PipelineSection:
    clip: str = choice("identity", "hfl.common.pipeline:VECTOR_STAGES", "device uplink clipping")
    device_noise: str = choice("identity", "hfl.common.pipeline:VECTOR_STAGES", "device-tier DP noise")
    uplink_encoding: str = choice("float32", "hfl.common.wire:CODECS", "device -> edge encoding")
    uplink_channel: str = choice("ideal", "hfl.common.pipeline:CHANNELS", "device -> edge channel")
    aggregate: str = choice("weighted_mean", "hfl.common.robust:AGGREGATORS", "aggregation rule at edges and cloud (robust rules bound what one absurd update can do)")
    edge_noise: str = choice("identity", "hfl.common.pipeline:VECTOR_STAGES", "edge-tier DP noise")
    backhaul_encoding: str = choice("float32", "hfl.common.wire:CODECS", "edge -> cloud encoding")
    backhaul_channel: str = choice("ideal", "hfl.common.pipeline:CHANNELS", "edge -> cloud channel")
    downlink_encoding: str = choice("float32", "hfl.common.wire:CODECS", "cloud -> edge -> device encoding")
    params: dict = field(default_factory=dict, metadata={"doc": "per-stage parameters: [pipeline.params.STAGE_NAME] key = value"})


@dataclass(frozen=True)
class NetSection:
    max_message_mb: int = doc(64, "largest payload a server accepts (MiB)", min=1)
    chunk_kib: int = doc(1024, "stream chunk size (KiB)", min=1, max=8192)
    phase_timeout_s: float = doc(300.0, "how long a barrier waits for missing members before dropping them", min=0.1)
    join_timeout_s: float = doc(300.0, "how long the cloud waits for every edge and device to join", min=0.1)
    grace_s: float = doc(3.0, "graceful-stop time of every server", min=0.0)
    rejoin_grace_s: float = doc(20.0, "how long a round waits for a lost node (process or link gone) to come back before "
                                      "going on without it", min=0.0)
    presence_deadline_s: float = doc(20.0, "how long a server keeps a session whose node opened no Presence stream "
                                           "after registering (its Register reply was lost): then the session ends, as "
                                           "when a presence stream ends", min=0.1)
    max_samples_per_device: int = doc(10_000_000, "largest sample count a device may claim at registration", min=1)
    host_fetch: bool = doc(True, "a device host fetches each round's task once per edge for all its devices of that "
                                 "edge (each still counted as fetching it, each uploading on its own connection); false: "
                                 "each device fetches its own (with a certificate per device, each always does)")


@dataclass(frozen=True)
class LatencySection:
    auto_tau_gamma: bool = doc(False, "qhetfed: the cloud picks (tau, gamma) before every round with paper 001's Sec. IV "
                                      "optimiser (integer search) for deadline_s and q1 measured in the previous round "
                                      "(the QSGD bound for s1 before any measurement); train.tau and train.gamma are unused")
    deadline_s: float = doc(156.0, "per-round time budget T_di (paper 001 Fig. 9)")
    t_cp_s: float = doc(0.049152, "T_di model with time_base = config: one local SGD step, c D / f (Table III: c = 20 "
                                  "cycles/bit, f = 1 GHz; D = 100 x 3072 x 8 bits, digest 001 section 5)")
    t_de_s: float = doc(3.3356, "T_di model with time_base = config: one device -> edge upload, d_b / (B log2(1 + h p / N0)) (Table III; d_b = 32 d "
                                "of the paper's CNN, d = 591,274)", min=0.0)
    t_ec_s: float = doc(33.356, "T_di model with time_base = config: one edge -> cloud upload (Table III: 10 t_DE)", min=0.0)
    time_base: str = choice("model", ("model", "config"), "T_di model: t_cp_s, t_de_s, t_ec_s of the model the run "
                            "trains (D = batch x input x 8 bits, d_b = 32 d, Table III radio), or config: t_cp_s, "
                            "t_de_s, t_ec_s as set (their defaults: paper 001's CIFAR CNN, d = 591,274); "
                            "summary.json: tau_gamma.time_base")
    pick: str = choice("optimised", ("optimised", "random"), "auto_tau_gamma: the optimiser's pair, or a feasible pair "
                       "drawn uniformly each round from the run seed (the baseline of digest 001 section 9.5)")
    source: str = choice("config", ("config", "emulated"), "where auto_tau_gamma takes t_CP, t_DE, t_EC: these keys, or "
                         "the emulated clock of the previous round (slowest device's SGD step and upload, slowest backhaul)")
    uploads: str = choice("paper", ("paper", "exact"), "device uploads per QHetFed round in T_di: paper = tau (the "
                          "paper's formula), exact = tau + 1 (digest 001 section 10)")


@dataclass(frozen=True)
class FamilySection:
    name: str
    cls: type
    after: str  # the section it follows in files and docs ("" = at the end)


SECTIONS: Registry[FamilySection] = Registry("config section")
_FAMILY_ORDER: list[str] = []  # registration order (the Registry lists names sorted)


def register_section(name: str, cls: type, after: str = "") -> type:
    """A family's [name] table: `cls` is a frozen dataclass of defaults; `after` places it in files and docs."""
    if name in ENGINE_SECTIONS or name == "families":
        raise ValueError(f"config section {name!r} is the engine's")
    SECTIONS.register(name, FamilySection(name, cls, after))
    _FAMILY_ORDER.append(name)
    return cls


def _family_defaults() -> dict[str, Any]:
    return {name: cls() for name, cls in sections() if name in SECTIONS}


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    topology: TopologySection = field(default_factory=TopologySection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    aggregation: AggregationSection = field(default_factory=AggregationSection)
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    net: NetSection = field(default_factory=NetSection)
    latency: LatencySection = field(default_factory=LatencySection)
    families: Mapping[str, Any] = field(default_factory=_family_defaults)  # the families' sections by name

    def __getattr__(self, name: str) -> Any:  # config.privacy, config.channel, ...: a family's section
        families = self.__dict__.get("families")
        if families is not None and name in families:
            return families[name]
        if name.startswith("__") or families is None:
            raise AttributeError(name)
        raise AttributeError(f"config has no section {name!r}; registered: {', '.join(n for n, _ in sections())} "
                             "(the built-in families register theirs when `hfl.families` is imported)")

    @property
    def num_devices(self) -> int:
        return self.topology.edges * self.topology.devices_per_edge

    def replace(self, **changes: Any) -> "Config":
        """A copy with whole sections replaced, the engine's or a family's (dataclasses.replace knows only the
        engine's): cfg.replace(privacy=dataclasses.replace(cfg.privacy, clip=2.0))."""
        engine = {k: v for k, v in changes.items() if k in ENGINE_SECTIONS}
        unknown = [k for k in changes if k not in engine and k not in self.families]
        if unknown:
            raise AttributeError(f"config has no section {unknown[0]!r}; registered: "
                                 f"{', '.join(n for n, _ in sections())}")
        families = {**self.families, **{k: v for k, v in changes.items() if k not in engine}}
        return dataclasses.replace(self, **engine, families=families)


ENGINE_SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.name != "families")


def sections() -> list[tuple[str, type]]:
    """Every section, the engine's and the families', in the order of files and docs: a family's section follows
    the one it names (once that one is placed), the rest in registration order at the end."""
    types = {f.name: f.default_factory for f in dataclasses.fields(Config) if f.name != "families"}
    order, pending = list(ENGINE_SECTIONS), list(_FAMILY_ORDER)
    followers: dict[str, int] = {}  # anchor -> sections placed after it so far (kept in registration order)
    while ready := [n for n in pending if SECTIONS.get(n).after in order]:
        name, after = ready[0], SECTIONS.get(ready[0]).after
        order.insert(order.index(after) + 1 + followers.get(after, 0), name)
        followers[after] = followers.get(after, 0) + 1
        pending.remove(name)
    order += pending
    return [(name, types[name] if name in types else SECTIONS.get(name).cls) for name in order]


def _resolve_choices(choices: tuple[str, ...] | str) -> list[str]:
    if isinstance(choices, tuple):
        return list(choices)
    module, attr = choices.split(":")
    return getattr(importlib.import_module(module), attr).names()


def _coerce(key: str, f: dataclasses.Field, value: Any) -> Any:
    hint = _hints(f)
    origin = typing.get_origin(hint)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        value = float(value)
    elif hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
    elif origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[int, ...]: a list of any length
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{key} must be a list, got {value!r}")
            return tuple(_scalar(key, args[0], v) for v in value)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key} must be a list of {len(args)} values, got {value!r}")
        return tuple(_scalar(key, a, v) for a, v in zip(args, value))
    elif hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a table, got {value!r}")
        return {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and value < lo:
        raise ConfigError(f"{key} must be >= {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ConfigError(f"{key} must be <= {hi}, got {value!r}")
    return value


def _scalar(key: str, hint: type, value: Any) -> Any:
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key} must hold integers, got {value!r}")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must hold numbers, got {value!r}")
        return float(value)
    return value


def _section_class(f: dataclasses.Field) -> type | None:
    """The dataclass of a field that holds a nested table."""
    if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
        return f.default_factory
    return None


def _hints(f: dataclasses.Field) -> Any:
    return f.type if not isinstance(f.type, str) else eval(f.type, {"tuple": tuple, "dict": dict})  # noqa: S307 - our own annotations


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        name = sorted(unknown)[0]
        where = f"[{prefix}]" if prefix else "the top level"
        raise ConfigError(f"unknown key {(prefix + '.' if prefix else '') + name!r}; allowed keys in {where}: {', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        key = f"{prefix}.{name}" if prefix else name
        section = _section_class(f)
        if section is not None:
            if not isinstance(data[name], Mapping):
                raise ConfigError(f"[{key}] must be a table")
            kwargs[name] = _build(section, data[name], key)
        else:
            kwargs[name] = _coerce(key, f, data[name])
    return cls(**kwargs)


def _build_config(data: Mapping[str, Any]) -> Config:
    classes = dict(sections())
    unknown = set(data) - set(classes)
    if unknown:
        raise ConfigError(f"unknown key {sorted(unknown)[0]!r}; allowed keys in the top level: {', '.join(classes)}")
    built = {}
    for name, cls in classes.items():
        if name in data:
            if not isinstance(data[name], Mapping):
                raise ConfigError(f"[{name}] must be a table")
            built[name] = _build(cls, data[name], name)
    engine = {name: built.pop(name) for name in ENGINE_SECTIONS if name in built}
    return Config(**engine, families={**_family_defaults(), **built})


def from_dict(data: Mapping[str, Any], check_choices: bool = True, remote: bool = False) -> Config:
    """Build a Config; `check_choices=False` skips registry look-ups (and their heavy imports)
    for a config the cloud already validated. The plugins load first, so that a section they add is known. A
    `remote` config (the spec a peer hands this node) loads no plugin: the ones it names must be loaded already,
    from this node's own configuration."""
    from hfl.common.plugins import check_loaded, load_plugins

    run = data.get("run", {})
    names = _build(RunSection, run, "run").plugins if isinstance(run, Mapping) else ()
    if remote:
        check_loaded(names)
    else:
        load_plugins(names)
    config = _build_config(data)
    if check_choices:
        validate_choices(config)
        validate_cross(config)
    return config


@dataclass(frozen=True)
class Validator:
    check: Callable[[Config], None]  # raises ConfigError naming the key to change
    after_plan: bool                  # runs once the round plan builds (it may rely on the plan's checks)


_VALIDATORS: list[Validator] = []


def register_validator(check: Callable[[Config], None], after_plan: bool = False) -> Callable[[Config], None]:
    """A family's check across sections, run by `validate_cross` in registration order: before the pipeline's and
    the plan's checks, or after them (`after_plan`)."""
    if any(v.check is check for v in _VALIDATORS):
        raise ValueError(f"validator {check.__qualname__} is already registered")
    _VALIDATORS.append(Validator(check, after_plan))
    return check


def validate_cross(config: Config) -> None:
    """Checks across sections: the algorithm's topology needs, then the families' checks, the pipeline's and the
    round plan's."""
    from hfl.common import plans

    algorithm = plans.ALGORITHMS.get(config.run.algorithm)
    if algorithm.max_edges and config.topology.edges > algorithm.max_edges:
        raise ConfigError(f"topology.edges = {config.topology.edges}: {algorithm.name} runs one cluster "
                          f"(at most {algorithm.max_edges} edge)")
    if config.train.participants > config.topology.devices_per_edge:
        raise ConfigError(f"train.participants = {config.train.participants} exceeds topology.devices_per_edge "
                          f"= {config.topology.devices_per_edge}")
    for v in _VALIDATORS:
        if not v.after_plan:
            v.check(config)
    validate_pipeline(config)  # after the mechanism sections, whose own messages name their keys
    try:  # a round plan the algorithm cannot build (e.g. h2fdp's tau not a multiple of m) is a config error
        plans.build_plan(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for v in _VALIDATORS:
        if v.after_plan:
            v.check(config)


HOP_SECTIONS = ("uplink_encoding", "backhaul_encoding", "downlink_encoding")


def validate_pipeline(config: Config) -> None:
    """[pipeline.params.*] before any process starts: every table names a registered stage, codec, channel,
    aggregator or hop; the codecs of the three hops accept their parameters (unknown and required ones); the
    stages in use accept theirs (by their signature, when it has no **params)."""
    import inspect

    from hfl.common import pipeline, plans, wire
    from hfl.common.pipeline import Link

    p = config.pipeline
    registries = {"pipeline stage": pipeline.VECTOR_STAGES, "codec": wire.CODECS, "channel": pipeline.CHANNELS,
                  "aggregator": pipeline.AGGREGATORS}
    known = set(HOP_SECTIONS).union(*(r.names() for r in registries.values()))
    for name, params in p.params.items():
        if name not in known:
            raise ConfigError(f"[pipeline.params.{name}]: no stage, codec, channel or aggregator is called {name!r}; "
                              f"allowed: {', '.join(sorted(known))}")
        if not isinstance(params, Mapping):
            raise ConfigError(f"pipeline.params.{name} must be a table of parameters, got {params!r}")
    for hop, build in (("uplink", lambda: Link.device_uplink(config)), ("backhaul", lambda: Link.from_config(p, "backhaul")),
                       ("downlink", lambda: Link.from_config(p, "downlink"))):
        try:
            build()
        except ValueError as exc:
            encoding = getattr(p, f"{hop}_encoding")
            raise ConfigError(f"pipeline.{hop}_encoding = {encoding!r} ([pipeline.params.{encoding}]): {exc}") from None
    used = [("clip", p.clip, pipeline.VECTOR_STAGES), ("device_noise", p.device_noise, pipeline.VECTOR_STAGES),
            ("edge_noise", p.edge_noise, pipeline.VECTOR_STAGES), ("uplink_channel", p.uplink_channel, pipeline.CHANNELS),
            ("backhaul_channel", p.backhaul_channel, pipeline.CHANNELS), ("aggregate", p.aggregate, pipeline.AGGREGATORS)]
    for key, name, registry in used:
        params = dict(p.params.get(name, {}))
        try:
            sig = inspect.signature(registry.get(name))
        except (TypeError, ValueError):
            continue
        fixed = list(sig.parameters.values())[2:]  # (vec, rng, ...) or (vectors, weights, ...)
        if any(q.kind is q.VAR_KEYWORD for q in fixed):
            accepted = None
        else:
            accepted = [q.name for q in fixed if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)]
        if accepted is not None and set(params) - set(accepted):
            raise ConfigError(f"[pipeline.params.{name}]: unknown parameter(s) {sorted(set(params) - set(accepted))} "
                              f"for pipeline.{key} = {name!r}; allowed: {', '.join(accepted) or 'none'}")
        required = [q.name for q in fixed if q.default is q.empty and q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)]
        missing = [r for r in required if r not in params]
        if missing and not plans.is_private(config):  # a private algorithm's plan carries the clip and noise parameters
            raise ConfigError(f"pipeline.{key} = {name!r} needs [pipeline.params.{name}] {', '.join(missing)} = ...")


def validate_choices(config: Config) -> None:
    for name, _ in sections():
        obj = getattr(config, name)
        for f in dataclasses.fields(obj):
            if "choices" in f.metadata:
                allowed = _resolve_choices(f.metadata["choices"])
                value = getattr(obj, f.name)
                if value not in allowed:
                    raise ConfigError(f"bad value for {name}.{f.name}: {value!r}; allowed: {', '.join(allowed)}")


def to_dict(config: Config) -> dict[str, Any]:
    return json.loads(json.dumps({name: dataclasses.asdict(getattr(config, name)) for name, _ in sections()}))


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if len(path) < 2:
        raise ConfigError(f"--set key must look like section.key, got {key!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text}: {part!r} is not a section")
        node[path[-1]] = value
    return data


def load(path: str | pathlib.Path | None = None, overrides: list[str] | None = None) -> Config:
    data: dict[str, Any] = {}
    if path is not None:
        p = pathlib.Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: {exc}") from None
    return from_dict(merge_overrides(data, list(overrides or [])))


def to_toml(config: Config) -> str:
    lines = []
    tables = []
    for section, values in to_dict(config).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
                for sub, params in value.items():
                    tables.append((f"{section}.{key}.{sub}", params))
                continue
            if isinstance(value, dict):
                lines.append(f"{key} = {{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items()) + " }")
                continue
            lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    for name, params in tables:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in params.items())
        lines.append("")
    return "\n".join(lines)


def reference() -> str:
    """Markdown table of every key, its default and meaning (used by the README)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    defaults = to_dict(Config())
    for name, cls in sections():
        for f in dataclasses.fields(cls):
            meaning = f.metadata.get("doc", "")
            choices = f.metadata.get("choices")
            if choices is not None:
                meaning += f" (one of: {', '.join(_resolve_choices(choices))})"
            rows.append(f"| `{name}.{f.name}` | `{json.dumps(defaults[name][f.name])}` | {meaning} |")
    return "\n".join(rows)

