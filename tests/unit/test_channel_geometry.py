"""MCP-H geometry (paper 003 sec. II-A, digest 3.1 and 10.3): exclusion zones, ring law, PPP count, JSON, PNG."""
import json

import numpy as np
import pytest
from scipy import stats
from scipy.spatial.distance import pdist

from hfl.common.channel.geometry import Topology, draw_edges, matern_cluster, ring_offsets
from hfl.common.channel.topology_plot import draw_topology

LAMBDA = 20e-6  # 20 per km^2


def _topology(seed, **kw):
    args = dict(lambda_p=LAMBDA, devices_per_cluster=15, r0=4.0, R=30.0, window_radius=1000.0, collaborating=3)
    args.update(kw)
    return matern_cluster(rng=np.random.default_rng(seed), **args)


@pytest.mark.parametrize("seed", range(5))
def test_every_exclusion_zone_holds(seed):
    # a dense plane (200 per km^2, 8 m hard core, 30 m rings) makes violations likely if the resampling is wrong
    top = _topology(seed, lambda_p=200e-6, window_radius=400.0, interferer_devices=15)
    assert pdist(top.edges).min() >= 2 * top.r0
    to_every_edge = top.distances(top.edges, top.devices)  # [devices, edges]
    assert to_every_edge.min() >= top.r0
    own = np.linalg.norm(top.offsets, axis=1)
    assert own.min() >= top.r0 and own.max() <= top.R + 1e-9
    assert np.allclose(top.edges[0], 0)  # reference cluster at the origin
    dist = np.linalg.norm(top.edges, axis=1)
    assert np.all(np.diff(dist) >= 0)  # collaborators are the C-1 nearest centres
    assert np.array_equal(np.bincount(top.device_edge), np.full(top.n_edges, 15))


def test_the_dense_plane_would_break_the_hard_core_without_resampling():
    # control for the test above: 300 uniform servers in the 400 m disk do come closer than 2 r0 = 8 m
    rng = np.random.default_rng(0)
    r, phi = 400 * np.sqrt(rng.random(300)), 2 * np.pi * rng.random(300)  # ~18 close pairs expected
    assert pdist(np.stack([r * np.cos(phi), r * np.sin(phi)], axis=1)).min() < 8.0


def test_ring_radius_follows_the_ring_law():
    r = np.linalg.norm(ring_offsets(20000, 4.0, 30.0, np.random.default_rng(1)), axis=1)
    cdf = lambda x: (x ** 2 - 16.0) / (900.0 - 16.0)  # noqa: E731 - F(r) of the density 2r/(R^2 - r0^2)
    assert stats.kstest(r, cdf).pvalue > 1e-3
    assert stats.kstest(r, lambda x: (x - 4.0) / 26.0).pvalue < 1e-6  # control: uniform radius is rejected
    # E||y||^4 = 274,885 m^4 (digest 3.1); SE of the mean of r^4 over 20k draws is ~1.7e3
    assert abs(np.mean(r ** 4) - 274885.33) < 5 * np.std(r ** 4) / np.sqrt(r.size)


def test_server_count_is_poisson_with_mean_lambda_area():
    counts = [len(draw_edges(LAMBDA, 1000.0, 4.0, np.random.default_rng(s))) - 1 for s in range(300)]
    mean = LAMBDA * np.pi * 1000.0 ** 2  # 62.8
    assert abs(np.mean(counts) - mean) < 5 * np.sqrt(mean / len(counts))  # Poisson: var = mean
    assert abs(np.var(counts) / mean - 1) < 0.3  # 300 draws: var ratio SE ~ 0.08


def test_same_seed_same_topology_and_json_round_trip(tmp_path):
    a, b = _topology(3), _topology(3)
    assert np.array_equal(a.devices, b.devices) and np.array_equal(a.edges, b.edges)
    assert not np.array_equal(a.edges[1:4], _topology(4).edges[1:4])
    back = Topology.from_json(json.loads(json.dumps(a.to_json())))
    assert np.array_equal(back.devices, a.devices) and np.array_equal(back.device_edge, a.device_edge)
    assert back.collaborating == 3 and len(a.collaborating_devices) == 45
    assert set(a.device_edge[a.interferer_devices]) == set(range(3, a.n_edges))
    png = draw_topology(a, tmp_path / "topology.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_bad_geometry_parameters_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="r0"):
        ring_offsets(3, 30.0, 4.0, rng)
    with pytest.raises(ValueError, match="lambda_p"):
        draw_edges(0.0, 1000.0, 4.0, rng)
    with pytest.raises(ValueError, match="window_radius"):
        draw_edges(LAMBDA, 5.0, 4.0, rng)
    with pytest.raises(ValueError, match="collaborating"):
        _topology(0, window_radius=20.0, collaborating=50)
    with pytest.raises(ValueError, match="too dense"):
        draw_edges(5e-2, 100.0, 4.0, rng)
