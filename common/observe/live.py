"""The cloud's live page (`/`, `/api/state`) and every server's Prometheus `/metrics`.

The services hand this module a read-only view of themselves: the cloud its object (its `live` presence state, the
metrics rows it writes to metrics.jsonl, privacy.json) and a per-round callback; an edge its object and a per-submit
callback. Nothing here changes a service's state. What the page shows is whitelisted: numbers from the metrics rows,
node ids and states, privacy figures; never a session token, a key, a secret or an upload.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import pathlib
import re
import ssl
import time

from hfl.common import metrics, topology

from . import prom
from .http import BadRequest, WebServer
from .members import member_state, state_counts

log = logging.getLogger("hfl.observe")

STATIC = pathlib.Path(__file__).parent / "static"
STATIC_FILES = {"uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css", "live.js": "text/javascript",
                "live.css": "text/css", "uPlot.LICENSE": "text/plain"}
URL_FILE = "live_url"  # in the run directory: where the live page is served
SNAPSHOT_FILE = "live.html"  # in the run directory: the page's final state, written when the cloud stops


def server_ssl(tls, client_certs: bool = True) -> ssl.SSLContext | None:
    """Under mutual TLS: the node's certificate, and (client_certs) a client certificate signed by the run's CA."""
    if tls is None or not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls.ca)
    ctx.load_cert_chain(tls.cert, tls.key)
    ctx.verify_mode = ssl.CERT_REQUIRED if client_certs else ssl.CERT_NONE
    return ctx


def client_ssl(tls) -> ssl.SSLContext | None:
    if tls is None or not tls.enabled:
        return None
    ctx = ssl.create_default_context(cafile=tls.ca)
    ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


def never_raises(callback):
    """A service's callback into this module: a bug here is logged, never the cost of a round."""
    def wrapped(*args):
        try:
            callback(*args)
        except Exception:  # noqa: BLE001
            log.exception("live page / metrics: %s failed (the run goes on)", callback.__qualname__)
    return wrapped


def number(value):
    """A JSON-safe scalar from a metrics row, or None (nested values and strings are not shown)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    return None


def json_response(obj) -> tuple[int, str, bytes]:
    return 200, "application/json", metrics.dumps(obj).encode()


class CloudView:
    """What the live page and /metrics read from the cloud; `round_done` is the cloud's per-round callback."""

    def __init__(self, cloud):
        self.cloud = cloud
        self.cfg = cloud.cfg
        self.started = time.monotonic()
        self.edge_rounds: dict[str, dict] = {}   # edge -> its figures in the last round it took part in
        self.edge_refused: dict[str, float] = {}  # edge -> messages its cluster refused, summed over rounds
        self.links: dict[tuple[str, str], float] = {}
        self.device_reports: dict[str, dict] = {}  # edge -> {round, at (monotonic), devices: id -> figures}
        self._plane: dict | None = None
        self.polled_at: float | None = None  # the last /api/state request
        self.end_served = asyncio.Event()    # a page has fetched the state with the run finished
        self._privacy: tuple[float, dict | None] = (-1.0, None)
        self._device_eps: tuple[int, dict] = (-1, {})

    # ---- fed by the cloud ------------------------------------------------------------------------
    def part(self, name: str):
        """The run's round mode's named part (cloud_server/modes.py: component), None before the cloud prepared."""
        mode = self.cloud.mode
        return None if mode is None else mode.component(name)

    def round_done(self, r: int, results: dict, stats: dict) -> None:
        device_up = device_down = 0.0
        for edge, res in results.items():
            s = res.scalars
            device_up += s.get("bytes_up", 0.0)
            device_down += s.get("bytes_down", 0.0)
            self.edge_refused[edge] = self.edge_refused.get(edge, 0.0) + s.get("refused", 0.0)
            self.edge_rounds[edge] = {"round": r, "devices": res.devices, "dropped": s.get("dropped", 0.0),
                                      "restarts": s.get("restarts", 0.0), "emulated_seconds": s.get("clock_seconds"),
                                      "train_loss": s.get("train_loss"),
                                      "fusion_weight": s.get("fusion_weight")}  # relay: the cloud's share for it
            if res.device_states:
                self.device_reports[edge] = {"round": r, "at": time.monotonic(), "devices": res.device_states}
        for key, n in ((("device_edge", "up"), device_up), (("device_edge", "down"), device_down),
                       (("edge_cloud", "up"), stats.get("bytes_up", 0) - device_up),
                       (("edge_cloud", "down"), stats.get("bytes_down", 0) - device_down)):
            self.links[key] = self.links.get(key, 0.0) + max(0.0, float(n))

    # ---- read ------------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        return list(getattr(self.cloud, "rows", []))

    def round(self) -> int:
        return self.cloud.round

    def finished(self) -> bool:
        return (self.cloud.run_dir / "summary.json").exists()

    def link_bytes(self) -> dict:
        return dict(self.links)

    def refusals(self) -> dict:
        return dict(self.cloud.refusals.total)

    def edge_state(self, edge: str) -> str:
        """members.member_state, and "done" for an edge that collected the final task."""
        c = self.cloud
        if c.board.finished and edge in c.board.fetched.get(c.board.round, ()):
            return "done"
        return member_state(c.live, edge)

    def last_seen(self, edge: str) -> float | None:
        live = self.cloud.live
        if live.sessions.has(edge):
            return 0.0
        ended = live.ended.get(edge)
        return None if ended is None else round(time.monotonic() - ended, 1)

    def member_counts(self) -> dict:
        counts = {"live": 0, "late": 0, "lost": 0, "waiting": 0, "done": 0}
        for e in self.cloud.edges:
            state = self.edge_state(e)
            counts["live" if state == "rejoined" else state] += 1
        return counts

    def devices(self) -> list[dict]:
        """Every device of the run, per edge, as its edge last reported it ("unknown": no report yet); last_seen_s
        counts on from the report's time."""
        now, out = time.monotonic(), []
        for e in self.cloud.edges:
            report = self.device_reports.get(e, {})
            reported, age = report.get("devices", {}), now - report.get("at", now)
            ended = self.edge_state(e) == "done"  # its devices took the final task with it: they are done too
            rows = []
            for d in topology.edge_members(self.cfg, topology.edge_index(e)):
                figures = reported.get(d)
                if figures is None:
                    rows.append({"id": d, "state": "unknown"})
                    continue
                seen = figures["last_seen_s"]
                rows.append({"id": d, **figures, "last_seen_s": None if seen is None else round(seen + age, 1),
                             "round_s": None if figures["round_s"] is None else round(figures["round_s"], 3)})
                if ended and rows[-1].get("state") in ("live", "rejoined", "late", "waiting"):
                    rows[-1]["state"] = "done"
            out.append({"edge": e, "round": report.get("round"), "devices": rows})
        return out

    def device_counts(self) -> dict:
        counts = {"unknown": 0, **state_counts(())}
        for group in self.devices():
            for d in group["devices"]:
                counts[d["state"]] += 1
        return counts

    def plane(self) -> dict | None:
        """The wireless medium's plane (positions of edges, devices, interferers), drawn once by the page."""
        if self._plane is None:
            medium = self.part("medium")
            if medium is None:
                return None
            self._plane = medium.positions()
        return self._plane

    def ended(self, closing: bool = False) -> str | None:
        """Why the run is over (None while it goes on): its stop reason, every round done, or how far it got."""
        c, rounds, done = self.cloud, self.cfg.run.rounds, len(self.rows())
        if c.stop_reason:
            return c.stop_reason
        if self.finished():
            return f"all {rounds} rounds done" if done >= rounds else \
                f"stopped after {done} of {rounds} rounds (every edge gone; see the cloud's log)"
        if closing:
            return f"the cloud stopped before the run finished ({done} of {rounds} rounds; see the cloud's log)"
        return None

    def privacy(self) -> dict | None:
        path = self.cloud.run_dir / "privacy.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        if mtime != self._privacy[0]:
            try:
                self._privacy = (mtime, json.loads(path.read_text()))
            except (OSError, ValueError):  # being replaced: keep the last one read
                pass
        return self._privacy[1]

    def device_epsilons(self) -> dict:
        policy = self.part("policy")
        if policy is None:
            return {}
        ledger = policy.ledger
        records = list(ledger.records)
        if len(records) != self._device_eps[0]:
            from hfl.common.privacy.accountant import device_epsilons

            self._device_eps = (len(records), device_epsilons(records, ledger.delta, ledger.accountant, ledger.devices))
        return self._device_eps[1]

    # ---- the page's JSON ---------------------------------------------------------------------------
    def state(self, since: int = 0) -> dict:
        c, cfg = self.cloud, self.cfg
        rows = self.rows()
        finished = self.finished()
        if finished:
            phase = "finished" + (f": {c.stop_reason}" if c.stop_reason else "")
        elif not c.started:
            phase = f"waiting for edges to join ({len(c.ready)} of {len(c.edges)})"
        elif c.round < 0:
            phase = "starting"
        else:
            phase = "round " + " -> ".join(p.kind for p in c.plan) if c.plan else "round"
        privacy = self.privacy()
        trust = (privacy or {}).get("trust") or {}
        nodes = []
        for e in c.edges:
            nodes.append({"id": e, "role": "edge", "state": self.edge_state(e), "trust": trust.get(e),
                          "last_seen_s": self.last_seen(e), "refused": self.edge_refused.get(e, 0.0),
                          **self.edge_rounds.get(e, {})})
        return {
            "run": {"run_id": c.run_id, "algorithm": cfg.run.algorithm, "dataset": cfg.data.dataset,
                    "model": cfg.model.name, "rounds": cfg.run.rounds, "edges": cfg.topology.edges,
                    "devices_per_edge": cfg.topology.devices_per_edge,  # no seed: it keys seeded DP noise
                    "medium": self.part("medium") is not None, "relay": self.part("fusion") is not None,
                    "refresh_s": cfg.observe.refresh_s},
            "progress": {"round": c.round, "attempt": c.board.attempt, "phase": phase, "completed": len(rows),
                         "elapsed_s": round(time.monotonic() - self.started, 1),
                         "emulated_s": number(prom.last(rows, "emulated_seconds")),
                         "finished": finished, "stop_reason": c.stop_reason, "ended": self.ended()},
            "rows": [{k: number(v) for k, v in r.items() if number(v) is not None or v is None}
                     for r in rows[max(0, since):]],
            "rows_from": max(0, since),
            "links": {f"{link} {direction}": n for (link, direction), n in sorted(self.links.items())},
            "refusals_at_cloud": self.refusals(),
            "privacy": self._privacy_view(privacy),
            "nodes": nodes,
            "devices": self.devices(),
            "topology": {"edges": [{"id": e, "trust": trust.get(e),
                                    "devices": topology.edge_members(cfg, topology.edge_index(e))} for e in c.edges],
                         "medium": self._medium()},
        }

    @staticmethod
    def _privacy_view(p: dict | None) -> dict | None:
        if not p:
            return None
        claims = sorted({v["epsilon_claimed"] for streams in (p.get("noise") or {}).values() for v in streams.values()
                         if v.get("epsilon_claimed") is not None})
        return {"epsilon_max": p.get("epsilon_max"), "epsilon_mean": p.get("epsilon_mean"),
                "epsilon_budget": p.get("epsilon_budget"), "delta": p.get("delta"), "calibration": p.get("calibration"),
                "accountant": p.get("accountant"), "placement": p.get("placement"), "trust": p.get("trust"),
                "budget_exceeded": p.get("budget_exceeded"), "label": p.get("epsilon_label"),
                "by_party": p.get("epsilon_by_party"),
                "caveats": p.get("guarantee") or [],
                "claimed": {"values": claims, "label": "the paper's arithmetic (a claim, not a measurement)"}
                if claims else None}

    def _medium(self) -> dict | None:
        medium = self.part("medium")
        if medium is None:
            return None
        try:
            return {k: number(v) if not isinstance(v, str) else v for k, v in medium.describe().items()
                    if isinstance(v, (str, int, float, bool)) or v is None}
        except Exception:  # noqa: BLE001 - the medium's figures are optional on the page
            return None


class EdgeObserver:
    """An edge's counters, fed by its per-submit callback, read by /metrics."""

    def __init__(self, edge):
        self.edge = edge
        self.rounds = 0
        self.durations: list[float] = []
        self.emulated: list[float] = []
        self.totals: dict[str, float] = {}
        self.last = time.monotonic()

    def submitted(self, round_: int, scalars: dict) -> None:
        now = time.monotonic()
        self.rounds += 1
        self.durations.append(now - self.last)
        self.last = now
        if scalars.get("clock_seconds") is not None:
            self.emulated.append(float(scalars["clock_seconds"]))
        for key in ("bytes_up", "bytes_down", "dropped", "restarts", "rejoined", "device_joules", "edge_joules"):
            self.totals[key] = self.totals.get(key, 0.0) + float(scalars.get(key, 0.0))

    def member_counts(self) -> dict:
        live = self.edge.live
        return state_counts(member_state(live, m) for m in getattr(self.edge, "members", []))


def static_handler(name: str):
    data = (STATIC / name).read_bytes()
    ctype = STATIC_FILES[name]

    def handler(query: dict):
        return 200, f"{ctype}; charset=utf-8", data
    return handler


def check_query(query: dict, allowed: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise BadRequest(400, f"unknown query parameter {unknown[0][:40]!r}"
                              + (f"; allowed: {', '.join(allowed)}" if allowed else "; this page takes none"))


def no_query(handler):
    def wrapped(query: dict):
        check_query(query)
        return handler(query)
    return wrapped


def cloud_routes(view: CloudView, exposition: prom.Exposition) -> dict:
    def state(query: dict):
        check_query(query, ("since",))
        since = query.get("since", "0")
        if not since.isdigit() or len(since) > 9:
            raise BadRequest(400, "since: a round count (a non-negative integer)")
        response = json_response(view.state(int(since)))
        view.polled_at = time.monotonic()
        if view.finished():
            view.end_served.set()
        return response

    async def device_epsilons(query: dict):
        check_query(query)
        policy = view.part("policy")
        if policy is None:
            return json_response({"devices": {}, "note": "this run adds no DP noise"})
        eps = await asyncio.get_running_loop().run_in_executor(None, view.device_epsilons)
        return json_response({"devices": eps, "delta": policy.ledger.delta})

    def plane(query: dict):
        check_query(query)
        return json_response({"plane": view.plane()})

    routes = {"/": no_query(page_handler()), "/api/state": state, "/api/plane": plane,
              "/api/privacy/devices": device_epsilons, "/metrics": no_query(exposition.handler)}
    routes.update({f"/static/{name}": no_query(static_handler(name)) for name in STATIC_FILES})
    return routes


def page_handler():
    data = (STATIC / "index.html").read_bytes()
    return lambda query: (200, "text/html; charset=utf-8", data)


# the served page's tags for its own files, and what the snapshot puts in their place
LINKED = {'<link rel="stylesheet" href="/static/uPlot.min.css">': ("style", "uPlot.min.css"),
          '<link rel="stylesheet" href="/static/live.css">': ("style", "live.css"),
          '<script src="/static/uPlot.iife.min.js"></script>': ("script", "uPlot.iife.min.js"),
          '<script src="/static/live.js"></script>': ("script", "live.js")}


def snapshot_html(state: dict) -> str:
    """The live page as one file that needs no server: its CSS and scripts inlined, `state` (the final /api/state
    with the plane and the per-device epsilons) embedded as JSON that live.js renders instead of polling."""
    page = (STATIC / "index.html").read_text()
    data = metrics.dumps(state).replace("<", "\\u003c")  # JSON inside <script>: no "</script>" can appear
    for tag, (kind, name) in LINKED.items():
        if tag not in page:
            raise ValueError(f"index.html no longer has {tag}: update live.LINKED")
        text = re.sub(r"</(script|style)", r"<\\/\1", (STATIC / name).read_text(), flags=re.I)
        inline = f"<{kind}>\n{text}\n</{kind}>"
        if name == "live.js":
            inline = f'<script type="application/json" id="hfl-snapshot">{data}</script>\n' + inline
        page = page.replace(tag, inline)
    return page


def final_state(view: CloudView) -> dict:
    state = view.state(0)
    state["progress"]["ended"] = view.ended(closing=True)
    state["plane"] = view.plane()
    try:
        state["device_epsilons"] = view.device_epsilons() if view.part("policy") is not None else None
    except Exception:  # noqa: BLE001 - the snapshot is written without them rather than not at all
        log.exception("live page snapshot: epsilon per device failed")
        state["device_epsilons"] = None
    state["snapshot"] = {"written_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "file": SNAPSHOT_FILE}
    return state


def write_snapshot(view: CloudView) -> pathlib.Path:
    path = view.cloud.run_dir / SNAPSHOT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(snapshot_html(final_state(view)))
    tmp.replace(path)
    return path


class Observed:
    """A started web server (or none) and the cloud's view: `close()` in the service's finally writes the page's
    snapshot (RUN_DIR/live.html, whatever observe.listen) and stops the server."""

    def __init__(self, server: WebServer | None = None, view: CloudView | None = None):
        self.server = server
        self.view = view

    async def close(self) -> None:
        if self.view is not None and getattr(self.view.cloud, "spec_json", None) is not None:
            try:
                log.info("live page snapshot: %s", write_snapshot(self.view))
            except Exception:  # noqa: BLE001 - the run's results are written already; a snapshot must not cost them
                log.exception("could not write the live page snapshot")
        if self.server is not None:
            await self._linger()
            await self.server.close()

    async def _linger(self) -> None:
        """A page polled lately: keep serving until it has seen the run finished (a few polls at most), so that it
        shows why the run ended rather than a cloud that stopped answering."""
        view = self.view
        if view is None:  # an edge's /metrics: scraped, not followed
            return
        refresh = view.cfg.observe.refresh_s
        # "lately" is generous: the run's last steps (plots) can hold the event loop for seconds between two polls
        if view.polled_at is None or time.monotonic() - view.polled_at > 30.0 or not view.finished():
            return
        try:
            await asyncio.wait_for(view.end_served.wait(), 2 * refresh + 1.0)
        except asyncio.TimeoutError:
            pass


async def start_cloud(cloud, tls=None) -> Observed:
    """Serve the live page and /metrics on observe.listen ("" = off); write the URL to RUN_DIR/live_url."""
    listen = cloud.cfg.observe.listen
    view = CloudView(cloud)
    cloud.on_round = never_raises(view.round_done)
    if not listen:
        return Observed(None, view)
    server = WebServer(cloud_routes(view, prom.Exposition(prom.CloudCollector(view))), listen,
                       server_ssl(tls, cloud.cfg.observe.client_certs))
    # a port in use (another run's page) costs the page its port, never the run: a free one, logged and in live_url
    await server.start(fallback_to_free_port=True)
    url = server.url()
    (cloud.run_dir / URL_FILE).write_text(url + "\n")
    log.info("live page on %s (Prometheus metrics on %smetrics)", url, url)
    return Observed(server, view)


async def start_edge(edge, listen: str, tls=None, port_file: str | None = None) -> Observed:
    """Serve an edge's /metrics on `listen` ("" = off); its port goes to PORT_FILE.metrics."""
    observer = EdgeObserver(edge)
    edge.on_submit = never_raises(observer.submitted)
    if not listen:
        return Observed()
    exposition = prom.Exposition(prom.EdgeCollector(observer))
    server = WebServer({"/metrics": no_query(exposition.handler)}, listen, server_ssl(tls))
    await server.start()
    if port_file:
        pathlib.Path(f"{port_file}.metrics").write_text(str(server.port))
    log.info("%s: Prometheus metrics on %smetrics", edge.id, server.url())
    return Observed(server)
