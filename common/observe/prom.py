"""Prometheus metrics of the cloud and of an edge, read at scrape time from what the services already track.

Names follow Prometheus conventions: the `hfl_` prefix, base units in the name (`_seconds`, `_bytes`, `_ratio`),
counters end in `_total`. The cloud's counters are sums over its metrics rows, so `/metrics` and metrics.jsonl agree
(a row is written when its round's evaluation ends, during the next round). Nothing here writes to a service.
"""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# round and phase times span milliseconds (emulated links) to minutes (real rounds on a shared machine)
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# emulated phase times in each metrics row (common/channel/round_clock.py): compute, device -> edge, edge -> cloud
PHASES = {"compute": "t_cp_emulated", "device_edge": "t_de_emulated", "edge_cloud": "t_ec_emulated"}


def histogram(name: str, doc: str, values) -> HistogramMetricFamily:
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    buckets = [(str(b), sum(1 for v in values if v <= b)) for b in BUCKETS] + [("+Inf", len(values))]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=sum(values))


def counter(name: str, doc: str, value: float, labels: dict | None = None) -> CounterMetricFamily:
    """`name` without _total (prometheus_client adds it to the exposed sample)."""
    family = CounterMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def labelled(kind, name: str, doc: str, label: str, values: dict):
    family = kind(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([str(key)], value)
    return family


def total(rows, key: str) -> float:
    return float(sum(r.get(key) or 0 for r in rows))


def last(rows, key: str):
    for r in reversed(rows):
        if r.get(key) is not None:
            return r[key]
    return None


class CloudCollector:
    def __init__(self, view):
        self.view = view  # live.CloudView

    def collect(self):
        v = self.view
        rows = v.rows()
        yield counter("hfl_rounds_completed", "rounds whose metrics row is written (metrics.jsonl)", len(rows))
        yield GaugeMetricFamily("hfl_round", "the round in progress (0-based; -1 before the first)", value=v.round())
        yield GaugeMetricFamily("hfl_rounds_planned", "run.rounds", value=v.cfg.run.rounds)
        yield GaugeMetricFamily("hfl_run_finished", "1 once the run wrote summary.json", value=float(v.finished()))
        yield histogram("hfl_round_duration_seconds", "wall time of each round at the cloud",
                        (r.get("round_seconds") for r in rows))
        yield histogram("hfl_eval_duration_seconds", "wall time of each evaluation of the global model",
                        (r.get("eval_seconds") for r in rows))
        yield histogram("hfl_round_emulated_duration_seconds", "emulated time of each round (the clock)",
                        (r.get("round_emulated_seconds") for r in rows))
        yield labelled(CounterMetricFamily, "hfl_phase_emulated_seconds", "emulated time per phase, summed over "
                       "rounds (compute, device -> edge upload, edge -> cloud upload)", "phase",
                       {p: total(rows, k) for p, k in PHASES.items()})
        yield GaugeMetricFamily("hfl_emulated_time_seconds", "emulated time of the run so far",
                                value=float(last(rows, "emulated_seconds") or 0.0))
        yield labelled(CounterMetricFamily, "hfl_bytes", "bytes on every link of the tree (metrics.jsonl bytes_up, "
                       "bytes_down)", "direction", {"up": total(rows, "bytes_up"), "down": total(rows, "bytes_down")})
        family = CounterMetricFamily("hfl_link_bytes", "bytes per link and direction", labels=["link", "direction"])
        for (link, direction), n in sorted(v.link_bytes().items()):
            family.add_metric([link, direction], n)
        yield family
        yield counter("hfl_refused_messages", "messages refused anywhere in the tree (metrics.jsonl refused)",
                      total(rows, "refused"))
        yield labelled(CounterMetricFamily, "hfl_refusals", "messages the cloud refused, by reason", "reason",
                       v.refusals())
        yield labelled(GaugeMetricFamily, "hfl_members", "edges of the cloud by state", "state", v.member_counts())
        yield labelled(GaugeMetricFamily, "hfl_devices", "devices of the run by state, as their edges last reported "
                       "them (unknown: no report yet; rejoined: live again after a loss)", "state", v.device_counts())
        yield GaugeMetricFamily("hfl_devices_reporting", "devices in the last round's results",
                                value=float(last(rows, "devices") or 0))
        yield counter("hfl_dropped_devices", "devices dropped from rounds (lost or late)", total(rows, "dropped_devices"))
        for key, name, doc in (("accuracy", "hfl_accuracy_ratio", "test accuracy of the last evaluated global model"),
                               ("loss", "hfl_loss", "test loss of the last evaluated global model"),
                               ("train_loss", "hfl_train_loss", "mean training loss of the last round")):
            value = last(rows, key)
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=float(value))
        energy = last(rows, "energy_joules_total")
        if energy is not None:
            yield counter("hfl_energy_joules", "emulated energy of the run so far", float(energy))
        privacy = v.privacy()
        if privacy:
            yield labelled(GaugeMetricFamily, "hfl_epsilon", "privacy spent over devices (the accountant)", "stat",
                           {s: float(privacy[f"epsilon_{s}"]) for s in ("max", "mean")
                            if privacy.get(f"epsilon_{s}") is not None})
            yield GaugeMetricFamily("hfl_epsilon_budget", "privacy.epsilon", value=float(privacy["epsilon_budget"]))
        if any("medium_seconds" in r for r in rows):
            yield counter("hfl_medium_seconds", "time the wireless medium spent on air slots",
                          total(rows, "medium_seconds"))
            yield counter("hfl_air_slots", "air slots the medium superposed", total(rows, "air_slots"))
            yield counter("hfl_air_missing_transmitters", "expected transmitters missing from air slots",
                          total(rows, "air_missing"))


class EdgeCollector:
    def __init__(self, observer):
        self.o = observer  # live.EdgeObserver

    def collect(self):
        o, edge = self.o, self.o.edge
        yield counter("hfl_rounds_completed", "rounds this edge submitted to the cloud", o.rounds)
        yield GaugeMetricFamily("hfl_round", "the round in progress (-1 before the first)", value=edge.round)
        yield GaugeMetricFamily("hfl_round_attempt", "attempt of the round in progress (restarts)", value=edge.attempt)
        yield histogram("hfl_round_duration_seconds", "wall time between this edge's submits", o.durations)
        yield histogram("hfl_round_emulated_duration_seconds", "emulated time of the cluster's part of each round",
                        o.emulated)
        family = CounterMetricFamily("hfl_link_bytes", "bytes per link and direction", labels=["link", "direction"])
        for direction in ("up", "down"):
            family.add_metric(["device_edge", direction], o.totals.get(f"bytes_{direction}", 0.0))
        yield family
        yield labelled(CounterMetricFamily, "hfl_refusals", "messages this edge refused, by reason", "reason",
                       dict(edge.refusals.total))
        yield labelled(GaugeMetricFamily, "hfl_members", "devices of this edge by state", "state", o.member_counts())
        for key, name, doc in (("dropped", "hfl_dropped_devices", "devices dropped from rounds (lost or late)"),
                               ("restarts", "hfl_round_restarts", "restarts of a round for this cluster"),
                               ("rejoined", "hfl_rejoined_devices", "devices that came back after a loss"),
                               ("device_joules", "hfl_device_energy_joules", "emulated energy of the devices"),
                               ("edge_joules", "hfl_edge_energy_joules", "emulated energy of this edge")):
            yield counter(name, doc, o.totals.get(key, 0.0))


class Exposition:
    """One registry per process; `body()` renders it at scrape time."""

    def __init__(self, collector):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)

    def body(self) -> bytes:
        return generate_latest(self.registry)

    def handler(self, query: dict):
        return 200, CONTENT_TYPE, self.body()
