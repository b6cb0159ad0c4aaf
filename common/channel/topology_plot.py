"""Draw a Topology to a PNG (topology.png of the run directory); matplotlib with the Agg backend."""
from __future__ import annotations

import pathlib

import numpy as np

from .geometry import Topology


def draw_topology(topology: Topology, path: str | pathlib.Path, title: str = "") -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Circle

    path = pathlib.Path(path)
    collab_edge = np.arange(topology.n_edges) < topology.collaborating
    collab_dev = topology.device_edge < topology.collaborating
    fig, ax = plt.subplots(figsize=(7, 7), dpi=200)  # readable at print size
    ax.add_patch(Circle((0, 0), topology.window_radius, fill=False, ls=":", lw=0.8, color="grey"))
    ax.scatter(*topology.devices[~collab_dev].T, s=2, c="#bbbbbb", label="interferer devices")
    ax.scatter(*topology.devices[collab_dev].T, s=4, c="tab:blue", label="collaborating devices")
    ax.scatter(*topology.edges[~collab_edge].T, s=14, marker="^", c="grey", label="other edges")
    ax.scatter(*topology.edges[collab_edge].T, s=40, marker="^", c="tab:red", label="collaborating edges")
    for x, y in topology.edges[collab_edge]:
        ax.add_patch(Circle((x, y), topology.R, fill=False, lw=0.6, color="tab:red"))
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title or f"MCP-H: {topology.n_edges} edges, {topology.n_devices} devices, C = {topology.collaborating}")
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
