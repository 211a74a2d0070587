"""Which nodes need podman, from ONE ``podman inspect`` of the sandbox's containers.

``containers | podman_nodes_plan(nodes, image, privileged_groups, network[, net_admin_groups])``
sorts the topology's nodes (``sandbox_nodes``: name, container, address, groups) into:

- ``create``: no container at all -> created (tasks/start.yml);
- ``start``: a stopped container -> ``podman start`` as it is (same container, its data, its
  address), whatever image it was made from; ``start_other_image``: those of them made from
  another image (or privilege) than new nodes get -> a warning;
- ``reattach``: running from the right image with the right privilege, without its address
  on the sandbox's network (cut off, or reattached without ``--ip``) -> reattached with it;
- ``other_image``: running from another image (an older recipe of scripts/build-image after
  a ``git pull``, another sandbox_node_image) or privilege -> kept as it is, with a warning:
  recreating it would lose its etcd data.

A node running from the right image, with its privilege and address, is in none of them.
"Privilege" includes CAP_NET_ADMIN: a node of ``net_admin_groups`` that is not privileged is
made with it (``--cap-add NET_ADMIN``: roles/etcd loads nftables rules in the node's own network
namespace), and a container made without it (before the sandbox gave it) counts as made with
another privilege.

``mounts | podman_node_volumes(groups)``: the read-only volumes (``src:dest:ro``) of
``sandbox_node_mounts`` that a new node of these groups gets. ``containers |
podman_missing_mount_sources(names, mounts)``: the sources of those mounts that the named
(stopped) containers were made with and that no longer exist on the control node: podman
would refuse to start them, so they are made again, empty (the role that uses the mount then
finds nothing there and falls back to copying).
"""

from __future__ import annotations

import os
from typing import Any


def _privileged(node: dict[str, Any], privileged_groups: list[str]) -> bool:
    return bool(set(node.get("groups") or []) & set(privileged_groups or []))


def podman_node_capabilities(groups: list[str], privileged_groups: list[str],
                             net_admin_groups: list[str] | None) -> list[str]:
    """What ``--cap-add`` a new node of these groups gets (none for a privileged one: it has
    every capability)."""
    if set(groups or []) & set(privileged_groups or []):
        return []
    return ["NET_ADMIN"] if set(groups or []) & set(net_admin_groups or []) else []


def _capabilities(container: dict[str, Any]) -> list[str]:
    """The capabilities podman added to a container (inspect's HostConfig.CapAdd, CAP_ dropped)."""
    added = (container.get("HostConfig") or {}).get("CapAdd") or []
    return sorted(c.upper().removeprefix("CAP_") for c in added)


def podman_nodes_plan(containers: list[dict[str, Any]], nodes: list[dict[str, Any]], image: str,
                      privileged_groups: list[str], network: str,
                      net_admin_groups: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The plan (see the module's docstring); ``containers``: podman inspect's list."""
    by_name = {c.get("Name"): c for c in containers or []}
    plan: dict[str, list[dict[str, Any]]] = {
        "create": [], "start": [], "start_other_image": [], "reattach": [], "other_image": []}
    for node in nodes or []:
        c = by_name.get(node["container"])
        if c is None:
            plan["create"].append(node)
            continue
        privileged = _privileged(node, privileged_groups)
        same = (c.get("ImageName") == image
                and bool((c.get("HostConfig") or {}).get("Privileged")) == privileged
                and (privileged or _capabilities(c) == podman_node_capabilities(
                    node.get("groups") or [], privileged_groups, net_admin_groups)))
        if not (c.get("State") or {}).get("Running"):
            plan["start"].append(node)
            if not same:
                plan["start_other_image"].append(node)
            continue
        networks = (c.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(network) or {}).get("IPAddress") or ""
        if not same:
            plan["other_image"].append(node)
        elif address != node["address"]:
            plan["reattach"].append(node)
    return plan


def podman_node_volumes(mounts: list[dict[str, Any]], groups: list[str]) -> list[str]:
    """``src:dest:ro`` of each mount whose groups meet the node's ``groups``."""
    return [f"{m['src']}:{m['dest']}:ro" for m in mounts or []
            if set(m.get("groups") or []) & set(groups or [])]


def podman_missing_mount_sources(containers: list[dict[str, Any]], names: list[str],
                                 mounts: list[dict[str, Any]]) -> list[str]:
    """Control-node sources, now missing, of the ``mounts`` destinations the containers
    ``names`` were made with (podman inspect's ``Mounts``)."""
    dests = {m["dest"] for m in mounts or []}
    wanted = set(names or [])
    missing: list[str] = []
    for c in containers or []:
        if c.get("Name") not in wanted:
            continue
        for mount in c.get("Mounts") or []:
            source = mount.get("Source") or ""
            if (mount.get("Type") == "bind" and mount.get("Destination") in dests and source
                    and not os.path.exists(source) and source not in missing):
                missing.append(source)
    return missing


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"podman_nodes_plan": podman_nodes_plan, "podman_node_volumes": podman_node_volumes,
                "podman_missing_mount_sources": podman_missing_mount_sources,
                "podman_node_capabilities": podman_node_capabilities}
