"""Certificates of a local testbed (`hfl run --certs DIR`, hfl.testbed.Testbed(certs=DIR)): every process gets its
own, from a CA in DIR (created when missing).

The cloud and each edge get a certificate in DIR/nodes. Device hosts follow the layout: per-core hosts (devices
of several edges) present a certificate per device, issued once into DIR/devices and kept there for later runs,
found through the manifest DIR/devices/edges-ExM.json; per-edge hosts present one certificate naming their
range of devices (DIR/nodes/devices-EEE-H.pem), as an edge site's host does.
"""
from __future__ import annotations

import os
import pathlib

from hfl.common import certs, device_certs, topology


def testbed_tls_args(directory: str | os.PathLike, cfg) -> dict[str, list[str]]:
    """The TLS arguments of every process, keyed by the Testbed's node names (cloud, edge-NNN, devices-EEE-H) or,
    for per-core hosts and processes of several edges, by their role (devices, edge)."""
    d = pathlib.Path(directory)
    certs.init_ca(d)
    nodes = d / "nodes"
    ca = ["--ca", str(d / certs.CA_CERT)]

    def flags(name: str) -> list[str]:
        return ca + ["--cert", str(nodes / f"{name}.pem"), "--key", str(nodes / f"{name}.key")]

    certs.issue(d, "cloud", "cloud", out_dir=nodes)
    args = {"cloud": flags("cloud")}
    for e in range(cfg.topology.edges):
        edge = topology.edge_id(e)
        certs.issue(d, "edge", edge, out_dir=nodes)
        args[edge] = flags(edge)
    args["edge"] = flags("{id}")  # a process of several edges (topology.edge_processes): each edge its own
    if cfg.topology.host_layout != "per_edge":
        manifest, _ = device_certs.issue_topology(d, cfg.topology.edges, cfg.topology.devices_per_edge, d / "devices")
        args["devices"] = ca + ["--device-certs", str(manifest)]
        return args
    hosts = cfg.topology.hosts_per_edge
    for e in range(cfg.topology.edges):
        members = topology.edge_members(cfg, e)
        for h in range(hosts):
            ids = topology.host_slice(members, h, hosts) or members  # a host without devices only says hello
            name = f"devices-{e:03d}-{h}"
            certs.issue(d, "device", certs.device_range(topology.device_index(ids[0]), len(ids)), name=name, out_dir=nodes)
            args[name] = flags(name)
    return args
