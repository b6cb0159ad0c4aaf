"""Immutable DP events: one per noise addition, recorded on the message that carries the noisy vector.

A DpRecord says who added noise (tier, node), whose data it protects (`covers`: device ids), and the
mechanism with its noise multiplier z = std / sensitivity (Gaussian: L2 sensitivity; Laplace: scale /
L1 sensitivity), the sampling rate that amplifies it (1.0 = none) and how many times it was applied.
Sampling is Poisson at that rate (add/remove-one neighbours), or, when `population` n > 0, a uniform
subset of round(rate n) of n without replacement (replace-one neighbours: the multiplier recorded is the
one against that adjacency, e.g. sigma / 2 for a sum of clipped vectors).
It converts to a `dp_accounting` DpEvent, and to/from a flat {str: float} map so it can travel in a
protobuf Transform's `params` (map<string, double>) and be rebuilt at the cloud.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterable, Mapping

TIERS = ("device", "edge", "device-sample")
MECHANISMS = ("gaussian", "laplace")
STREAMS = ("local", "global", "sample")
TRANSFORM_STAGE = "dp_event"  # Transform.stage under which the integrator records events
MIN_MULTIPLIER = 1e-12

_PREFIX = "dp."
_NODE = _PREFIX + "node/"
_COVER = _PREFIX + "covers/"
_CODED = {"tier": TIERS, "mechanism": MECHANISMS, "stream": STREAMS}
_NUMERIC = ("noise_multiplier", "sensitivity", "sampling_rate", "count", "round", "population")


@dataclass(frozen=True)
class DpRecord:
    tier: str
    node: str
    covers: tuple[str, ...]
    mechanism: str
    noise_multiplier: float
    sensitivity: float
    sampling_rate: float = 1.0
    count: int = 1
    round: int = 0
    stream: str = "global"
    population: int = 0  # > 0: sampled without replacement from this many records (fixed-size lots)

    def __post_init__(self) -> None:
        for name, allowed in _CODED.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        covers = tuple(sorted(str(c) for c in self.covers))
        if not covers or len(set(covers)) != len(covers):
            raise ValueError(f"covers must name at least one device, each once, got {self.covers!r}")
        object.__setattr__(self, "covers", covers)
        object.__setattr__(self, "node", str(self.node))
        if not (self.noise_multiplier >= MIN_MULTIPLIER and math.isfinite(self.noise_multiplier)):
            # below it the accountant's arithmetic degenerates (1 / z^2 overflows); no mechanism of the project
            # plans such a multiplier, so only a forged event states one
            raise ValueError(f"noise_multiplier must be a finite number >= {MIN_MULTIPLIER:g}, got "
                             f"{self.noise_multiplier!r}")
        if not (self.sensitivity > 0 and math.isfinite(self.sensitivity)):
            raise ValueError(f"sensitivity must be a finite number > 0, got {self.sensitivity!r}")
        if not 0.0 < self.sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must lie in (0, 1], got {self.sampling_rate!r}")
        if int(self.count) != self.count or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count!r}")
        if int(self.round) != self.round or self.round < 0:
            raise ValueError(f"round must be an integer >= 0, got {self.round!r}")
        if int(self.population) != self.population or self.population < 0:
            raise ValueError(f"population must be an integer >= 0, got {self.population!r}")
        if self.population and not 1 <= round(self.sampling_rate * self.population) <= self.population:
            raise ValueError(f"sampling_rate x population must give a sample of 1..population, got "
                             f"{self.sampling_rate!r} x {self.population!r}")
        object.__setattr__(self, "population", int(self.population))
        object.__setattr__(self, "count", int(self.count))
        object.__setattr__(self, "round", int(self.round))
        object.__setattr__(self, "noise_multiplier", float(self.noise_multiplier))
        object.__setattr__(self, "sensitivity", float(self.sensitivity))
        object.__setattr__(self, "sampling_rate", float(self.sampling_rate))

    @property
    def std(self) -> float:
        """Noise std (Gaussian) or scale (Laplace) per coordinate."""
        return self.noise_multiplier * self.sensitivity

    def accounting_key(self) -> tuple[str, float, float, int]:
        """What the accountant needs, apart from the count: equal keys compose as one SelfComposed event."""
        return self.mechanism, self.noise_multiplier, self.sampling_rate, self.population

    def to_dp_event(self):
        return accounting_event(self.mechanism, self.noise_multiplier, self.sampling_rate, self.count, self.population)

    def to_params(self) -> tuple[dict[str, float], list[str]]:
        """Flat params (enums as their index, the node folded into a key) and the covered device ids."""
        params = {_PREFIX + k: float(_CODED[k].index(getattr(self, k))) for k in _CODED}
        params.update({_PREFIX + k: float(getattr(self, k)) for k in _NUMERIC})
        params[_NODE + self.node] = 1.0
        return params, list(self.covers)

    @classmethod
    def from_params(cls, params: Mapping[str, float], covers: Iterable[str]) -> "DpRecord":
        try:
            kwargs = {k: _CODED[k][int(params[_PREFIX + k])] for k in _CODED}
            kwargs.update({k: params[_PREFIX + k] for k in _NUMERIC if k != "population"})
            kwargs["population"] = params.get(_PREFIX + "population", 0.0)  # absent in events written before it
        except (KeyError, IndexError) as exc:
            raise ValueError(f"params do not describe a DP event (missing or bad {exc})") from None
        nodes = [k[len(_NODE):] for k in params if k.startswith(_NODE)]
        if len(nodes) != 1:
            raise ValueError(f"params must name exactly one node ({_NODE}<id>), got {nodes}")
        return cls(node=nodes[0], covers=tuple(covers), **kwargs)

    def to_transform_params(self) -> dict[str, float]:
        """Everything in one map<string, double>: covered ids become keys `dp.covers/<id>` = 1."""
        params, covers = self.to_params()
        params.update({_COVER + c: 1.0 for c in covers})
        return params

    @classmethod
    def from_transform_params(cls, params: Mapping[str, float]) -> "DpRecord":
        covers = [k[len(_COVER):] for k in params if k.startswith(_COVER)]
        return cls.from_params({k: v for k, v in params.items() if not k.startswith(_COVER)}, covers)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["covers"] = list(self.covers)
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> "DpRecord":
        return cls(**{**data, "covers": tuple(data["covers"])})

    def replace(self, **changes) -> "DpRecord":
        return dataclasses.replace(self, **changes)


def accounting_event(mechanism: str, noise_multiplier: float, sampling_rate: float = 1.0, count: int = 1,
                     population: int = 0):
    """dp_accounting event: Gaussian or Laplace, Poisson-subsampled when rate < 1 (or sampled without
    replacement, round(rate n) of n = `population`, when population > 0), self-composed when count > 1."""
    import dp_accounting  # only the cloud accounts; devices and edges only build records

    if mechanism == "gaussian":
        event = dp_accounting.GaussianDpEvent(noise_multiplier)
    elif mechanism == "laplace":
        event = dp_accounting.LaplaceDpEvent(noise_multiplier)
    else:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    if population > 0 and sampling_rate < 1.0:
        event = dp_accounting.SampledWithoutReplacementDpEvent(int(population), int(round(sampling_rate * population)),
                                                               event)
    elif sampling_rate < 1.0:
        event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
    if count > 1:
        event = dp_accounting.SelfComposedDpEvent(event, int(count))
    return event
