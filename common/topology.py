"""Node identities: which edge a device belongs to, and the id strings every tier uses."""
from __future__ import annotations

import re

EDGE_RE = re.compile(r"^edge-(\d{3,})$")
DEVICE_RE = re.compile(r"^dev-(\d{5,})$")


def edge_id(index: int) -> str:
    return f"edge-{index:03d}"


def device_id(index: int) -> str:
    return f"dev-{index:05d}"


def edge_ids(cfg) -> list[str]:
    return [edge_id(e) for e in range(cfg.topology.edges)]


def edge_members(cfg, edge_index: int) -> list[str]:
    return members_of(edge_index, cfg.topology.devices_per_edge)


def members_of(edge_index: int, devices_per_edge: int) -> list[str]:
    """The devices of one edge: `devices_per_edge` consecutive ids."""
    m = devices_per_edge
    return [device_id(g) for g in range(edge_index * m, (edge_index + 1) * m)]


def parse_index(node_id: str, pattern: re.Pattern) -> int | None:
    match = pattern.match(node_id)
    return int(match.group(1)) if match else None


def edge_index(node_id: str) -> int:
    """Accept 'edge-003' or '3'."""
    if node_id.isdigit():
        return int(node_id)
    index = parse_index(node_id, EDGE_RE)
    if index is None:
        raise ValueError(f"bad edge id {node_id!r}: expected edge-NNN or an integer")
    return index


def device_index(node_id: str) -> int:
    index = parse_index(node_id, DEVICE_RE)
    if index is None:
        raise ValueError(f"bad device id {node_id!r}: expected dev-NNNNN")
    return index


def host_slice(members: list[str], host_index: int, hosts: int) -> list[str]:
    """Contiguous share of a cluster's devices for one of `hosts` device-host processes."""
    if not 0 <= host_index < hosts:
        raise ValueError(f"host index {host_index} outside [0, {hosts})")
    n = len(members)
    return members[host_index * n // hosts:(host_index + 1) * n // hosts]


def edge_groups(cfg) -> list[list[str]]:
    """The edges of a local testbed per edge server process: one each (topology.edge_processes = 0), else
    `edge_processes` contiguous, balanced groups (never more groups than edges)."""
    edges = [edge_id(e) for e in range(cfg.topology.edges)]
    groups = cfg.topology.edge_processes or len(edges)
    groups = min(groups, len(edges))
    return [host_slice(edges, g, groups) for g in range(groups)]


def union_slice(member_lists: list[list[str]], host_index: int, hosts: int) -> list[str]:
    """One of `hosts` device-host processes' share of the devices of several edges: the union of their
    members in device-index order, cut into `hosts` contiguous, balanced pieces (sizes differ by at most
    one). Every host computes the same cut from the same edges; a contiguous share is one certificate
    range (dev-A..dev-B). With a single edge this is `host_slice`."""
    union = sorted({m for members in member_lists for m in members}, key=device_index)
    return host_slice(union, host_index, hosts)


def host_count(cfg, cpus: int | None = None) -> int:
    """Device host processes of a local testbed: per_edge = hosts_per_edge per edge; per_core =
    `device_hosts`, or one per core when 0, never more than there are devices."""
    import os

    if cfg.topology.host_layout == "per_edge":
        return cfg.topology.edges * cfg.topology.hosts_per_edge
    wanted = cfg.topology.device_hosts or cpus or os.cpu_count() or 1
    return max(1, min(wanted, cfg.topology.edges * cfg.topology.devices_per_edge))
