"""roles/podman_nodes' choice of what podman does to each node (filter podman_nodes_plan),
on podman inspect's own fields, in every case the scenarios and users meet: a cold `up`, a
warm one, a node cut off its network (the etcd scenario's fault b and its repair), a node
reattached without its address, a stopped node (podman stop, a host reboot), a new node image
(the etcd scenario's case f: running nodes kept, a stopped one started as it is), a changed
privilege (CAP_NET_ADMIN included), a node added to the topology (add-members) and a container of a removed node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import load_plugin

plan_of = load_plugin("plugins/filter/podman_nodes.py").podman_nodes_plan

IMAGE = "localhost/k0s-etcd-sandbox-node:abc123"
OTHER = "localhost/k0s-etcd-sandbox-node:molecule-other-recipe"
NET = "k0sbox-t"
NODES = [{"name": n, "container": f"k0sbox-t-{n}", "address": f"10.213.230.{11 + i}",
          "groups": ["k0s_controller"] if n == "k0s-1" else ["etcd"]}
         for i, n in enumerate(["etcd-1", "etcd-2", "etcd-3", "k0s-1"])]


def container(node: dict[str, Any], running: bool = True, image: str = IMAGE,
              address: str | None = None, privileged: bool | None = None,
              network: str = NET, caps: list[str] | None = None) -> dict[str, Any]:
    """What podman inspect says of a node's container (the fields the plan reads); an etcd
    node is made with NET_ADMIN (podman 4.3 lists it as CAP_NET_ADMIN in CapAdd)."""
    networks = {} if address == "" else {network: {"IPAddress": address or node["address"]}}
    priv = (node["name"] == "k0s-1") if privileged is None else privileged
    added = caps if caps is not None else ([] if priv else ["CAP_NET_ADMIN"])
    return {"Name": node["container"], "ImageName": image,
            "HostConfig": {"Privileged": priv, "CapAdd": added},
            "State": {"Running": running, "Status": "running" if running else "exited"},
            "NetworkSettings": {"Networks": networks}}


def plan(containers: list[dict[str, Any]]) -> dict[str, list[str]]:
    out = plan_of(containers, NODES, IMAGE, ["k0s_controller"], NET, ["etcd"])
    return {k: [n["name"] for n in v] for k, v in out.items() if v}


def test_cold_up_creates_every_node() -> None:
    assert plan([]) == {"create": ["etcd-1", "etcd-2", "etcd-3", "k0s-1"]}


def test_warm_up_touches_nothing() -> None:
    assert plan([container(n) for n in NODES]) == {}


@pytest.mark.parametrize("address", ["", "10.213.230.99"], ids=["cut-off", "wrong-address"])
def test_a_running_node_without_its_address_is_reattached(address: str) -> None:
    cs = [container(n) for n in NODES]
    cs[1] = container(NODES[1], address=address)
    assert plan(cs) == {"reattach": ["etcd-2"]}


def test_an_address_on_another_network_does_not_count() -> None:
    cs = [container(n) for n in NODES]
    cs[0] = container(NODES[0], network="podman")
    assert plan(cs) == {"reattach": ["etcd-1"]}


def test_a_stopped_node_is_started_as_it_is() -> None:
    cs = [container(n) for n in NODES]
    cs[2] = container(NODES[2], running=False, address="")
    assert plan(cs) == {"start": ["etcd-3"]}


def test_a_new_image_keeps_running_nodes_and_starts_a_stopped_one() -> None:
    """The etcd scenario's case (f): every container from the image now called another
    recipe's, the last member stopped."""
    cs = [container(n, image=OTHER) for n in NODES[:3]]
    cs[2] = container(NODES[2], image=OTHER, running=False)
    assert plan(cs) == {"create": ["k0s-1"], "start": ["etcd-3"],
                        "start_other_image": ["etcd-3"], "other_image": ["etcd-1", "etcd-2"]}


def test_another_image_is_kept_even_without_its_address() -> None:
    cs = [container(n) for n in NODES]
    cs[1] = container(NODES[1], image=OTHER, address="")
    assert plan(cs) == {"other_image": ["etcd-2"]}


def test_a_changed_privilege_counts_as_another_image() -> None:
    cs = [container(n) for n in NODES]
    cs[3] = container(NODES[3], privileged=False)
    cs[0] = container(NODES[0], running=False, privileged=True)
    assert plan(cs) == {"other_image": ["k0s-1"], "start": ["etcd-1"],
                        "start_other_image": ["etcd-1"]}


def test_an_etcd_node_made_without_net_admin_counts_as_another_privilege() -> None:
    """A node made before the sandbox gave its etcd nodes NET_ADMIN (roles/etcd's nftables
    limit on the metrics port) is kept as it is, with the warning; a new one gets it."""
    cs = [container(n) for n in NODES]
    cs[0] = container(NODES[0], caps=[])
    cs[1] = container(NODES[1], running=False, caps=[])
    assert plan(cs) == {"other_image": ["etcd-1"], "start": ["etcd-2"],
                        "start_other_image": ["etcd-2"]}
    # without net_admin_groups (the filter's default) nobody wants it
    out = plan_of([container(n, caps=[]) for n in NODES], NODES, IMAGE, ["k0s_controller"], NET)
    assert not any(out.values())


def test_new_nodes_get_net_admin_unless_privileged() -> None:
    caps = load_plugin("plugins/filter/podman_nodes.py").podman_node_capabilities
    assert caps(["etcd"], ["k0s_controller"], ["etcd"]) == ["NET_ADMIN"]
    assert caps(["etcd", "k0s_controller"], ["k0s_controller"], ["etcd"]) == []   # has every one
    assert caps(["lb"], ["k0s_controller"], ["etcd"]) == []
    assert caps(["etcd"], ["k0s_controller"], []) == []


def test_add_members_creates_only_the_new_nodes_and_ignores_removed_ones() -> None:
    removed = {"name": "etcd-9", "container": "k0sbox-t-etcd-9", "address": "10.213.230.99",
               "groups": ["etcd"]}
    cs = [container(n) for n in NODES[:2]] + [container(removed), container(NODES[3])]
    assert plan(cs) == {"create": ["etcd-3"]}


volumes_of = load_plugin("plugins/filter/podman_nodes.py").podman_node_volumes
missing_of = load_plugin(
    "plugins/filter/podman_nodes.py").podman_missing_mount_sources
MOUNTS = [{"src": "/var/cache/sandbox/kube-1", "dest": "/opt/crd-apiserver",
           "groups": ["k0s_controller"]}]


def test_read_only_mounts_go_to_nodes_of_their_groups() -> None:
    assert volumes_of(MOUNTS, ["k0s_controller"]) == [
        "/var/cache/sandbox/kube-1:/opt/crd-apiserver:ro"]
    assert volumes_of(MOUNTS, ["etcd"]) == []
    assert volumes_of([], ["k0s_controller"]) == []


def test_a_stopped_node_whose_mount_source_has_gone_gets_it_made_again(tmp_path: Path) -> None:
    """podman refuses to start a container whose bind-mount source is missing; the stopped
    node is started as it is (never recreated: its etcd data), with its source made again."""
    gone, there = tmp_path / "kube-old", tmp_path / "kube-new"
    there.mkdir()
    mounts = [{"src": str(there), "dest": "/opt/crd-apiserver", "groups": ["k0s_controller"]}]

    def made_with(node: dict[str, Any], source: Path) -> dict[str, Any]:
        c = container(node, running=False)
        c["Mounts"] = [{"Type": "bind", "Source": "/state/ssh/id_ed25519.pub",
                        "Destination": "/etc/ssh/sandbox_authorized_keys"},
                       {"Type": "bind", "Source": str(source), "Destination": "/opt/crd-apiserver"}]
        return c

    cs = [made_with(NODES[3], gone), container(NODES[0], running=False)]
    assert missing_of(cs, ["k0sbox-t-k0s-1", "k0sbox-t-etcd-1"], mounts) == [str(gone)]
    assert missing_of(cs, ["k0sbox-t-etcd-1"], mounts) == []  # only the nodes to start
    assert missing_of([made_with(NODES[3], there)], ["k0sbox-t-k0s-1"], mounts) == []
