"""The live page and Prometheus /metrics of a running testbed (common/observe/), `hfl watch`, a headless Chromium
screenshot of the page during a run, the devices as their edges report them, the wireless medium's plane, and the
page's snapshot (RUN_DIR/live.html) once the cloud has stopped.

One testbed serves most tests of this module: a run long enough that each test sees rounds go by, stopped at the
end of the module (its later rounds are never needed). A device host of it is killed by the last of them."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from hfl.common import topology
from hfl.testbed import Testbed

from .conftest import SMALL

ROUNDS = 300  # never reached: the module stops the run when its tests are done
# paper 000 with the paper's calibration: the page shows the accountant's epsilon and the paper's claim, labelled
PRIVATE = ["run.algorithm=h2fdp", "train.tau=4", "train.gamma=2", "privacy.clip=1.0", 'privacy.trust_table={"edge-000" = "trusted"}',
           "privacy.calibration=paper", "privacy.epsilon=1e6"]
# devices-001-0 serves dev-00003 alone (host_slice), so that one device can be killed; a lost one is given up on soon
HOSTS = ["topology.host_layout=per_edge", "topology.hosts_per_edge=2", "net.rejoin_grace_s=2"]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("live") / "run"
    tb = Testbed(None, [*SMALL, *PRIVATE, *HOSTS, f"run.rounds={ROUNDS}", "observe.listen=127.0.0.1:0",
                        "observe.refresh_s=0.5"], run_dir=run_dir)
    try:
        yield tb.start()
    finally:
        tb.close()


def get(url: str, method: str = "GET", data: bytes | None = None, timeout: float = 10) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, dict(res.headers), res.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def state(url: str, since: int = 0) -> dict:
    status, _, body = get(f"{url}api/state?since={since}")
    assert status == 200, body
    return json.loads(body)


def scrape(url: str) -> dict[str, float]:
    """Prometheus text -> {sample name with labels: value}."""
    status, headers, body = get(url)
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), body[:200]
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_rows(bed: Testbed, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(bed.metrics()) < n:
        bed.check()
        assert time.monotonic() < deadline, f"fewer than {n} rounds within {timeout}s"
        time.sleep(0.1)


def test_page_and_metrics_follow_the_run(bed):
    url = bed.live_url()
    assert url.startswith("http://127.0.0.1:")
    assert (bed.run_dir / "live_url").read_text().strip() == url
    status, headers, page = get(url)
    assert status == 200 and b"/static/uPlot.iife.min.js" in page and headers["Content-Type"].startswith("text/html")
    assert get(url + "static/uPlot.iife.min.js")[2].startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32)")
    edge_url = bed.edge_metrics_url("edge-000")

    seen_rounds, seen_completed, seen_counter = [], [], []
    rows: list[dict] = []
    edge_before = scrape(edge_url)
    wait_rows(bed, 1)
    deadline = time.monotonic() + 300
    while len(set(seen_completed)) < 3:  # three different round counts: the page and the counters advance
        assert time.monotonic() < deadline, f"the page did not advance: completed {seen_completed}"
        before = len(bed.metrics())
        s = state(url, since=len(rows))
        m = scrape(url + "metrics")
        after = len(bed.metrics())
        rows.extend(s["rows"])
        assert before <= s["progress"]["completed"] <= after
        assert before <= m["hfl_rounds_completed_total"] <= after
        assert s["progress"]["round"] >= s["progress"]["completed"] - 1
        seen_rounds.append(s["progress"]["round"])
        seen_completed.append(s["progress"]["completed"])
        seen_counter.append(m["hfl_rounds_completed_total"])
        time.sleep(0.3)
    assert seen_rounds == sorted(seen_rounds) and seen_counter == sorted(seen_counter)

    # what the page showed is what metrics.jsonl holds, row by row
    on_disk = bed.metrics()[:len(rows)]
    assert [(r["round"], r["accuracy"], r["loss"], r["bytes_up"], r["bytes_down"]) for r in rows] == \
        [(r["round"], r["accuracy"], r["loss"], r["bytes_up"], r["bytes_down"]) for r in on_disk]
    # the counters are sums over the same rows (a scrape and a read of the file around it)
    m = scrape(url + "metrics")
    n = int(m["hfl_rounds_completed_total"])
    file_rows = bed.metrics()[:n]
    assert m['hfl_bytes_total{direction="up"}'] == sum(r["bytes_up"] for r in file_rows)
    assert m['hfl_bytes_total{direction="down"}'] == sum(r["bytes_down"] for r in file_rows)
    assert m["hfl_round_duration_seconds_count"] == n
    assert m["hfl_round_duration_seconds_sum"] == pytest.approx(sum(r["round_seconds"] for r in file_rows))
    assert m['hfl_members{state="live"}'] == 2 and m['hfl_members{state="lost"}'] == 0
    assert m['hfl_link_bytes_total{direction="up",link="edge_cloud"}'] > 0
    assert m['hfl_link_bytes_total{direction="up",link="device_edge"}'] > 0
    assert 0 < m['hfl_epsilon{stat="max"}'] and m["hfl_epsilon_budget"] == 1e6
    assert m["hfl_accuracy_ratio"] == [r for r in file_rows if r["accuracy"] is not None][-1]["accuracy"]

    s = state(url)
    assert s["run"]["rounds"] == ROUNDS and s["progress"]["phase"].startswith("round")
    assert [n["id"] for n in s["nodes"]] == ["edge-000", "edge-001"]
    assert {n["state"] for n in s["nodes"]} == {"live"} and all(n["devices"] == 3 for n in s["nodes"])
    assert s["privacy"]["epsilon_max"] > 0 and s["privacy"]["epsilon_budget"] == 1e6
    assert s["privacy"]["trust"] == {"edge-000": "trusted", "edge-001": "untrusted"}
    assert s["privacy"]["claimed"]["values"] and "claim" in s["privacy"]["claimed"]["label"]
    assert [len(e["devices"]) for e in s["topology"]["edges"]] == [3, 3]
    # every device of the run, as its edge reported it with its last submit
    assert [g["edge"] for g in s["devices"]] == ["edge-000", "edge-001"]
    for g in s["devices"]:
        assert [d["id"] for d in g["devices"]] == topology.edge_members(bed.cfg, topology.edge_index(g["edge"]))
        assert g["round"] is not None and {d["state"] for d in g["devices"]} == {"live"}
        assert all(d["round_s"] > 0 and d["refused"] == 0 and d["rejoins"] == 0 and d["last_seen_s"] >= 0
                   for d in g["devices"])
    devices = scrape(url + "metrics")
    assert devices['hfl_devices{state="live"}'] == 6 and devices['hfl_devices{state="lost"}'] == 0
    # the run goes on between the reads: the devices' largest epsilon lies between the page's before and after
    before = state(url)["privacy"]["epsilon_max"]
    status, _, body = get(url + "api/privacy/devices")
    devices = json.loads(body)["devices"]
    after = state(url)["privacy"]["epsilon_max"]
    assert status == 200 and len(devices) == 6
    assert before * (1 - 1e-9) <= max(devices.values()) <= after * (1 + 1e-9)

    # Prometheus conventions: the hfl_ prefix, and every counter's sample ends in _total
    for target in (url + "metrics", edge_url):
        text = get(target)[2].decode()
        types = dict(re.findall(r"^# TYPE (hfl_\w+) (\w+)$", text, re.M))
        assert len(types) >= 12 and types["hfl_rounds_completed_total"] == "counter"
        for name, kind in types.items():
            samples = set(re.findall(rf"^({name}\w*)[{{ ]", text, re.M))  # none for a reason never seen
            if kind == "counter":
                assert name.endswith("_total") and samples <= {name}, (name, samples)
    edge_after = scrape(edge_url)  # the edge's own counters advanced too
    assert edge_after["hfl_rounds_completed_total"] > edge_before["hfl_rounds_completed_total"]
    assert edge_after['hfl_link_bytes_total{direction="up",link="device_edge"}'] > \
        edge_before['hfl_link_bytes_total{direction="up",link="device_edge"}']
    assert edge_after['hfl_members{state="live"}'] == 3


def raw(url: str, request: bytes) -> bytes:
    host, port = re.match(r"https?://([^:/]+):(\d+)/", url).groups()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_bad_requests_get_a_clear_4xx_and_change_nothing(bed):
    url = bed.live_url()
    wait_rows(bed, 1)
    before = scrape(url + "metrics")
    refused_before = before.get('hfl_refusals_total{reason="malformed"}', 0)
    cases = [
        (get(url + "nope"), 404, b"no such page"),
        (get(url + "api/state?since=" + "9" * 300), 414, b"query longer"),
        (get(url + "api/state?token=x"), 400, b"unknown query parameter"),
        (get(url + "api/state?since=-1"), 400, b"non-negative integer"),
        (get(url + "metrics?x=1"), 400, b"takes none"),
        (get(url + "api/state", method="POST", data=b"{}"), 405, b"GET only"),
        (get(url + "api/state", method="DELETE"), 405, b"GET only"),
        (get(url + "x" * 1500), 414, b"longer than"),
    ]
    for (status, headers, body), want, text in cases:
        assert status == want and text in body, (status, body)
        assert body.startswith(str(want).encode())
    assert cases[5][0][1]["Allow"] == "GET"
    assert raw(url, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    # a page of another site whose name was rebound to 127.0.0.1 (DNS rebinding) names its own host: refused
    rebound = raw(url, b"GET /api/state HTTP/1.1\r\nHost: evil.example:8780\r\n\r\n")
    assert rebound.startswith(b"HTTP/1.1 400 ") and b"epsilon" not in rebound
    assert raw(url, b"GET /api/state HTTP/1.1\r\nHost: localhost\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    # two Host headers (a proxy may have checked the first): refused whichever comes last
    for hosts in (b"Host: localhost\r\nHost: evil.example\r\n", b"Host: evil.example\r\nHost: localhost\r\n"):
        twice = raw(url, b"GET /api/state HTTP/1.1\r\n" + hosts + b"\r\n")
        assert twice.startswith(b"HTTP/1.1 400 ") and b"more than one Host header" in twice
    assert raw(url, b"GET / HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505 ")
    assert raw(url, b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 100 + b"\r\n").startswith(b"HTTP/1.1 431 ")
    assert raw(url, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 414 ")
    # nothing changed: the cloud counts no refusal, still serves, and the run goes on
    after = scrape(url + "metrics")
    assert after.get('hfl_refusals_total{reason="malformed"}', 0) == refused_before
    assert after["hfl_rounds_completed_total"] >= before["hfl_rounds_completed_total"]
    assert state(url)["progress"]["finished"] is False


def test_page_exposes_no_secret(bed):
    url = bed.live_url()
    wait_rows(bed, 2)
    bodies = b"".join(get(url + path)[2] for path in ("", "api/state", "api/privacy/devices", "metrics"))
    for secret in (bed._join_secret, bed._relay_secret):
        assert secret.encode() not in bodies
    tokens = re.findall(rb"[0-9a-f]{32,}", bodies)
    assert not tokens, tokens[:3]  # no session token, key or secret-looking hex anywhere
    s = json.loads(get(url + "api/state")[2])
    assert "seed" not in s["run"]  # under seeded DP noise the run seed keys the noise
    for row in s["rows"]:  # numbers only: no upload, no tensor
        assert all(v is None or isinstance(v, (int, float, bool)) for v in row.values())


def test_hfl_watch_shows_the_progress_table(bed):
    url = bed.live_url()
    wait_rows(bed, 2)
    for target in (url, str(bed.run_dir)):
        out = subprocess.run([sys.executable, "-m", "hfl.cli", "watch", target, "--once"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "hfl watch: h2fdp, 2 edges x 3 devices" in out.stdout
        assert re.search(rf"\b\d+/{ROUNDS}\b", out.stdout) and "live page http://127.0.0.1:" in out.stdout
    out = subprocess.run([sys.executable, "-m", "hfl.cli", "watch", "http://127.0.0.1:9/", "--once"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "hfl watch: http://127.0.0.1:9/" in out.stderr


def chromium() -> str:
    """Debian's chromium, installed with apt-get if missing (as tests/e2e installs the Docker engine)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("no chromium and no apt-get to install Debian's chromium package")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            pytest.skip(f"apt-get could not install chromium: {result.stderr.strip()[-300:]}")
    return shutil.which("chromium")


def test_browser_shows_the_accuracy_chart_and_round(bed, tmp_path):
    browser = chromium()
    url = bed.live_url()
    wait_rows(bed, 3)
    out_dir = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "live-page"
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1750", "--virtual-time-budget=8000"]
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    shown = re.search(r'id="round"[^>]*data-completed="(\d+)"[^>]*>(\d+) / (\d+)<', html)
    assert shown, html[:3000]
    round_ = int(shown.group(1))  # rounds done: the rows written, as the charts show them
    assert int(shown.group(3)) == ROUNDS and int(shown.group(2)) == round_ >= 3
    assert re.search(r'<body[^>]*data-clipped=""', html), "a panel is cut at 1280 px: " + \
        str(re.findall(r'data-clipped="([^"]*)"', html))
    assert "u-legend" in html and ">--<" not in html  # legends name the series; no "--" value cells
    assert "against its edge" in html and "inf (no guarantee)" in html  # epsilon per party (edge-000 trusted)
    points = re.search(r'id="chart-accuracy"[^>]*data-points="(\d+)"', html)
    assert points and int(points.group(1)) >= 3, "the accuracy chart has no points"
    assert 'class="uplot' in html and "<canvas" in html
    assert "accuracy (%)" in html and "state-live" in html
    assert 'id="devices" data-devices="6"' in html
    assert len(re.findall(r'data-device="dev-\d+" data-state="live"', html)) == 6

    shot = out_dir / "live-page.png"
    result = subprocess.run(flags + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    assert pixels[..., :3].std() > 0.05  # not a blank page
    # the chart's line colour (#2563eb, the accuracy series) is drawn
    blue = ((abs(pixels[..., 0] - 0x25 / 255) < 0.05) & (abs(pixels[..., 1] - 0x63 / 255) < 0.05)
            & (abs(pixels[..., 2] - 0xeb / 255) < 0.05)).sum()
    assert blue > 200, f"only {blue} pixels of the accuracy line"
    print(f"screenshot: {shot} ({round_} of {ROUNDS} rounds done)")


def test_a_device_killed_mid_run_shows_as_lost(bed):
    url = bed.live_url()
    wait_rows(bed, 1)
    bed.kill("devices-001-0")  # dev-00003, the only device of that host
    deadline, lost_in = time.monotonic() + 120, None
    while True:  # until a report of a whole round without it (the round it was lost in may hold an upload of it)
        group = {g["edge"]: g for g in state(url)["devices"]}["edge-001"]
        states = {d["id"]: d["state"] for d in group["devices"]}
        if states["dev-00003"] == "lost":
            lost_in = group["round"] if lost_in is None else lost_in
            if group["round"] > lost_in:
                break
        assert time.monotonic() < deadline, f"dev-00003 not shown lost: {states}"
        bed.check()
        time.sleep(0.3)
    assert states == {"dev-00003": "lost", "dev-00004": "live", "dev-00005": "live"}
    lost = next(d for d in group["devices"] if d["id"] == "dev-00003")
    assert lost["last_seen_s"] >= 1 and lost["round_s"] is None  # seen before the kill (its grace is 2 s); no upload
    assert {d["state"] for g in state(url)["devices"] if g["edge"] == "edge-000" for d in g["devices"]} == {"live"}
    m = scrape(url + "metrics")
    assert m['hfl_devices{state="lost"}'] == 1 and m['hfl_devices{state="live"}'] == 5
    assert scrape(bed.edge_metrics_url("edge-001"))['hfl_members{state="lost"}'] == 1  # the edge's own view


AIR = ["topology.edges=3", "topology.devices_per_edge=4", "channel.model=ota", "run.algorithm=multiairfed",
       "train.lr=0.01", "train.tau=4", "train.gamma=2", "net.phase_timeout_s=60", "net.join_timeout_s=120",
       "data.max_test_samples=500", "observe.listen=127.0.0.1:0", "observe.refresh_s=0.5"]
AIR_ROUNDS = 6


def snapshot_state(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="hfl-snapshot">(.*?)</script>', html, re.S)
    assert found, html[:2000]
    return json.loads(found.group(1))


def test_air_mode_page_draws_the_plane_and_its_snapshot_outlives_the_cloud(hfl_testbed, tmp_path):
    tb = hfl_testbed(overrides=AIR + [f"run.rounds={AIR_ROUNDS}"])
    url = tb.live_url()
    wait_rows(tb, 1)
    status, _, body = get(url + "api/plane")
    plane = json.loads(body)["plane"]
    assert status == 200 and [e["id"] for e in plane["edges"]] == topology.edge_ids(tb.cfg)
    assert [d["id"] for d in plane["devices"]] == [topology.device_id(k) for k in range(12)]
    assert plane["interferer_devices_total"] > 0 and plane["interferer_edges"]
    s = state(url)
    assert s["run"]["medium"] is True and [len(g["devices"]) for g in s["devices"]] == [4, 4, 4]

    # a page polling to the end (every refresh_s) sees the run end before its cloud goes; it polls from now, while
    # the run goes on (a headless browser on a loaded machine may take longer than the rest of the run)
    seen: list[dict] = [s["progress"]]

    def follow():
        while True:
            try:
                seen.append(state(url)["progress"])
            except (OSError, AssertionError):
                return
            time.sleep(0.5)

    poller = threading.Thread(target=follow, daemon=True)
    poller.start()

    browser = chromium()
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2200", "--virtual-time-budget=6000"]
    live_dom = None
    if len(tb.metrics()) < AIR_ROUNDS - 1:  # the page while the run goes on (its cloud serves it)
        live_dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    print(f"the live page's plane checked during the run: {live_dom is not None}")
    summary = tb.wait(timeout=600)
    poller.join(timeout=30)
    rows = tb.metrics()
    assert summary["rounds"] == AIR_ROUNDS and summary["stop_reason"] is None
    assert seen[-1]["finished"] is True and seen[-1]["ended"] == f"all {AIR_ROUNDS} rounds done", seen[-3:]
    snapshot = tb.run_dir / "live.html"
    assert snapshot.is_file()
    html = snapshot.read_text()
    assert "/static/" not in html and "<link" not in html  # self-contained: no server, no other file
    final = snapshot_state(html)
    assert final["progress"]["finished"] is True and final["progress"]["ended"] == f"all {AIR_ROUNDS} rounds done"
    assert [(r["round"], r["accuracy"]) for r in final["rows"]] == [(r["round"], r["accuracy"]) for r in rows]
    assert final["rows"][-1]["round"] == AIR_ROUNDS - 1 and final["progress"]["completed"] == AIR_ROUNDS
    assert final["plane"] == plane and final["snapshot"]["file"] == "live.html"
    assert [g["round"] for g in final["devices"]] == [AIR_ROUNDS - 1] * 3
    assert {n["state"] for n in final["nodes"]} == {"done"}  # every edge collected the final task and left
    assert {d["state"] for g in final["devices"] for d in g["devices"]} == {"done"}  # and its devices with it

    # the snapshot renders with no server: the final round, the ended banner, the plane with the run's 12 devices
    dom = subprocess.run(flags + ["--dump-dom", snapshot.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for page in filter(None, (live_dom, dom)):
        assert len(re.findall(r'class="plane-device"', page)) == 2 * 12, page[:3000]  # clusters and window views
        assert len(re.findall(r'class="plane-edge"', page)) == 2 * 3
        assert 'data-view="clusters"' in page and 'data-view="window"' in page and 'class="interferer-devices"' in page
    assert 'data-state="snapshot"' in dom and f">{AIR_ROUNDS} / {AIR_ROUNDS}<" in dom
    assert re.search(r'id="ended" class="ended">This run has ended: all \d+ rounds done\.', dom)
    shots = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "live-page"
    shots.mkdir(parents=True, exist_ok=True)
    subprocess.run(flags + [f"--screenshot={shots / 'live-air-snapshot.png'}", snapshot.as_uri()], capture_output=True,
                   timeout=120)

    # hfl watch on the finished run: its table, the end, and where its page's snapshot is
    out = subprocess.run([sys.executable, "-m", "hfl.cli", "watch", str(tb.run_dir), "--once"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    said = " ".join(out.stdout.split())
    assert out.returncode == 0 and f"{AIR_ROUNDS}/{AIR_ROUNDS} rounds done" in said, out.stdout
    assert "done, " in said and f"live page snapshot {snapshot}" in said


def test_under_mutual_tls_the_page_asks_for_a_certificate_of_the_run(hfl_testbed, tmp_path):
    import ssl

    pki = tmp_path / "pki"
    tb = hfl_testbed(overrides=SMALL + ["run.rounds=30", "observe.listen=127.0.0.1:0"], certs=pki)
    url, edge_url = tb.live_url(), tb.edge_metrics_url("edge-000")
    assert url.startswith("https://127.0.0.1:") and edge_url.startswith("https://127.0.0.1:")
    wait_rows(tb, 1)
    trusted = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    client = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    client.load_cert_chain(str(pki / "nodes" / "edge-001.pem"), str(pki / "nodes" / "edge-001.key"))
    for target in (url + "api/state", url + "metrics", edge_url):
        with urllib.request.urlopen(target, context=client, timeout=10) as res:
            assert res.status == 200
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):  # no client certificate
            urllib.request.urlopen(target, context=trusted, timeout=10).read()
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plaintext
            urllib.request.urlopen(target.replace("https://", "http://"), timeout=10).read()
    out = subprocess.run([sys.executable, "-m", "hfl.cli", "watch", url, "--once", "--ca", str(pki / "ca.pem"),
                          "--cert", str(pki / "nodes" / "cloud.pem"), "--key", str(pki / "nodes" / "cloud.key")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "hfl watch: hierfavg" in out.stdout, out.stderr
