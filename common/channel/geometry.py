"""Matern cluster process with holes (MCP-H): edge servers on a PPP, devices in rings around them.

Paper 003, sec. II-A (digest 3.1 and 10.3). Positions are in metres. Edge 0 is the reference cluster at
the origin, edges 1..C-1 are its C-1 nearest neighbours (the collaborating group, digest 10.8), the
rest are non-collaborating interferer clusters. Devices are numbered edge by edge.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

_MAX_RESAMPLES = 10_000


@dataclass(frozen=True)
class Topology:
    edges: np.ndarray  # [E, 2] server positions
    devices: np.ndarray  # [N, 2] absolute device positions
    device_edge: np.ndarray  # [N] index of the serving edge
    collaborating: int  # C: edges 0..C-1 form the group
    r0: float
    R: float
    lambda_p: float  # servers per m^2
    window_radius: float

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def offsets(self) -> np.ndarray:
        return self.devices - self.edges[self.device_edge]

    @property
    def collaborating_devices(self) -> np.ndarray:
        return np.flatnonzero(self.device_edge < self.collaborating)

    @property
    def interferer_devices(self) -> np.ndarray:
        return np.flatnonzero(self.device_edge >= self.collaborating)

    def distances(self, tx_pos: np.ndarray, rx_pos: np.ndarray) -> np.ndarray:
        """[n_rx, n_tx] Euclidean distances."""
        return np.linalg.norm(rx_pos[:, None, :] - tx_pos[None, :, :], axis=-1)

    def to_json(self) -> dict:
        return {
            "units": "metres",
            "r0": self.r0, "R": self.R, "lambda_p_per_m2": self.lambda_p, "window_radius": self.window_radius,
            "collaborating": self.collaborating,
            "edges": [{"id": i, "x": float(x), "y": float(y), "collaborating": bool(i < self.collaborating)}
                      for i, (x, y) in enumerate(self.edges)],
            "devices": [{"id": i, "edge": int(e), "x": float(x), "y": float(y)}
                        for i, ((x, y), e) in enumerate(zip(self.devices, self.device_edge))],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Topology":
        return cls(edges=np.array([[e["x"], e["y"]] for e in data["edges"]], dtype=np.float64).reshape(-1, 2),
                   devices=np.array([[d["x"], d["y"]] for d in data["devices"]], dtype=np.float64).reshape(-1, 2),
                   device_edge=np.array([d["edge"] for d in data["devices"]], dtype=np.int64),
                   collaborating=int(data["collaborating"]), r0=float(data["r0"]), R=float(data["R"]),
                   lambda_p=float(data["lambda_p_per_m2"]), window_radius=float(data["window_radius"]))


def _uniform_disk(n: int, radius: float, rng: np.random.Generator) -> np.ndarray:
    r = radius * np.sqrt(rng.random(n))
    phi = 2 * np.pi * rng.random(n)
    return np.stack([r * np.cos(phi), r * np.sin(phi)], axis=1)


def ring_offsets(n: int, r0: float, R: float, rng: np.random.Generator) -> np.ndarray:
    """n offsets uniform in the ring r0 <= |y| <= R: |y| = sqrt(r0^2 + u (R^2 - r0^2)) (digest 3.1)."""
    if not 0 <= r0 < R:
        raise ValueError(f"need 0 <= r0 < R, got r0={r0}, R={R}")
    radius = np.sqrt(r0 ** 2 + rng.random(n) * (R ** 2 - r0 ** 2))
    phi = 2 * np.pi * rng.random(n)
    return np.stack([radius * np.cos(phi), radius * np.sin(phi)], axis=1)


def draw_edges(lambda_p: float, window_radius: float, r0: float, rng: np.random.Generator) -> np.ndarray:
    """Reference server at the origin plus a PPP of density lambda_p (per m^2) in the disk, no two servers
    closer than 2 r0 (paper 003, eq. 20's lower limit). A server that breaks the distance is redrawn
    uniformly in the disk (digest 10.3) rather than thinned, so the count stays Poisson."""
    if lambda_p <= 0:
        raise ValueError(f"lambda_p must be > 0, got {lambda_p}")
    if window_radius <= 2 * r0:
        raise ValueError(f"window_radius must exceed 2 r0 = {2 * r0}, got {window_radius}")
    if lambda_p * np.pi * r0 ** 2 > 0.5:  # random sequential packing of r0-disks jams at ~0.547 coverage
        raise ValueError(f"lambda_p={lambda_p} is too dense for servers 2 r0 = {2 * r0} m apart")
    n = rng.poisson(lambda_p * np.pi * window_radius ** 2)
    pts = np.vstack([np.zeros((1, 2)), _uniform_disk(n, window_radius, rng)])
    for _ in range(_MAX_RESAMPLES):
        pairs = cKDTree(pts).query_pairs(2 * r0, output_type="ndarray")
        if len(pairs) == 0:
            return pts
        bad = np.unique(pairs.max(axis=1))  # index 0 (the origin) is never the larger index
        pts[bad] = _uniform_disk(len(bad), window_radius, rng)
    raise ValueError(f"lambda_p={lambda_p} is too dense for servers 2 r0 = {2 * r0} m apart in this window")


def draw_devices(edges: np.ndarray, per_edge: np.ndarray, r0: float, R: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Devices uniform in each server's ring [r0, R]; an offset that lands within r0 of ANY server is
    redrawn (digest 10.3: the protective zone holds for every server, not only the own one)."""
    per_edge = np.asarray(per_edge, dtype=np.int64)
    owner = np.repeat(np.arange(len(edges)), per_edge)
    pos = edges[owner] + ring_offsets(len(owner), r0, R, rng)
    tree = cKDTree(edges)
    for _ in range(_MAX_RESAMPLES):
        nearest, _ = tree.query(pos)
        bad = np.flatnonzero(nearest < r0)
        if len(bad) == 0:
            return pos, owner
        pos[bad] = edges[owner[bad]] + ring_offsets(len(bad), r0, R, rng)
    raise ValueError("could not place devices outside every server's protective zone; lower lambda_p or R")


def matern_cluster(lambda_p: float, devices_per_cluster: int, r0: float, R: float, window_radius: float,
                   collaborating: int, rng: np.random.Generator, interferer_devices: int | None = None) -> Topology:
    """MCP-H topology (paper 003, sec. II-A). lambda_p in servers per m^2 (20 per km^2 = 2e-5).

    The C collaborating clusters (reference + C-1 nearest) have `devices_per_cluster` devices each; the
    other clusters `interferer_devices` (M_n, default M). Edges are sorted by distance from the origin.
    """
    if devices_per_cluster < 1:
        raise ValueError(f"devices_per_cluster must be >= 1, got {devices_per_cluster}")
    if collaborating < 1:
        raise ValueError(f"collaborating must be >= 1, got {collaborating}")
    m_n = devices_per_cluster if interferer_devices is None else interferer_devices
    if m_n < 0:
        raise ValueError(f"interferer_devices must be >= 0, got {m_n}")
    edges = draw_edges(lambda_p, window_radius, r0, rng)
    edges = edges[np.argsort(np.linalg.norm(edges, axis=1), kind="stable")]
    if len(edges) < collaborating:
        raise ValueError(f"collaborating={collaborating} exceeds the {len(edges)} servers drawn in the window; "
                         "enlarge window_radius or lambda_p")
    per_edge = np.where(np.arange(len(edges)) < collaborating, devices_per_cluster, m_n)
    devices, owner = draw_devices(edges, per_edge, r0, R, rng)
    return Topology(edges=edges, devices=devices, device_edge=owner, collaborating=collaborating,
                    r0=float(r0), R=float(R), lambda_p=float(lambda_p), window_radius=float(window_radius))
