"""The live page's pieces that need no testbed: the self-contained snapshot (RUN_DIR/live.html) and the wireless
medium's plane as the page draws it."""
import json
import re

import numpy as np

from hfl.common import topology
from hfl.common.config import load
from hfl.common.observe import live


def test_the_snapshot_inlines_every_file_and_embeds_the_state_safely():
    hostile = "</script><script>alert(1)</script><!--"
    state = {"rows": [{"round": 0, "accuracy": 0.5}], "run": {"run_id": hostile}, "progress": {"ended": "all done"}}
    page = live.snapshot_html(state)
    assert "/static/" not in page and 'src="' not in page and "<link" not in page  # no file or server needed
    embedded = re.search(r'<script type="application/json" id="hfl-snapshot">(.*?)</script>', page, re.S)
    assert json.loads(embedded.group(1)) == state  # the hostile string stays inside the JSON block
    assert hostile not in page
    assert (live.STATIC / "uPlot.iife.min.js").read_text()[:200] in page
    scripts = re.findall(r"<script\b", page)
    assert len(scripts) == 3  # the state, uPlot, live.js: each closed once, nothing else opened
    assert page.count("</script>") == 3


def test_the_plane_places_the_runs_devices_at_their_edges(tmp_path):
    from hfl.cloud_server.medium import Medium

    cfg = load(None, ["topology.edges=3", "topology.devices_per_edge=4", "channel.model=ota",
                      "run.algorithm=multiairfed"])
    medium = Medium(cfg, tmp_path, 10)  # draws topology.png there
    plane = medium.positions(max_interferers=50)
    assert [e["id"] for e in plane["edges"]] == topology.edge_ids(cfg)
    assert [d["id"] for d in plane["devices"]] == [topology.device_id(k) for k in range(cfg.num_devices)]
    for d in plane["devices"]:  # each device is within its cluster's ring r0 <= |y| <= R around its own edge
        edge = plane["edges"][topology.edge_index(d["edge"])]
        assert d["id"] in topology.edge_members(cfg, topology.edge_index(d["edge"]))
        assert cfg.channel.r0 - 0.1 <= np.hypot(d["x"] - edge["x"], d["y"] - edge["y"]) <= cfg.channel.R + 0.1
    assert len(plane["interferer_devices"]) == 50 < plane["interferer_devices_total"]
    top = medium.plane.topology
    assert len(plane["interferer_edges"]) == top.n_edges - top.collaborating
    assert plane["interferer_devices_total"] == top.n_devices - cfg.num_devices
    assert all(np.hypot(x, y) <= plane["window_radius"] + 0.1 for x, y in plane["interferer_devices"])
