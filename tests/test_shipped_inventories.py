"""The shipped topologies (inventories/*.yml) and the real-host example (inventories/example/)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sandboxlib import inventory as sandbox_inventory
from sandboxlib import topology as sandbox_topology

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (REPO_ROOT / "inventories").glob("*.yml"))
# VirtualBox (>= 6.1.28) allows host-only networks in 192.168.56.0/21 without configuration.
VIRTUALBOX_RANGE = ipaddress.IPv4Network("192.168.56.0/21")
DOCUMENTATION_NETS = [ipaddress.IPv4Network(n) for n in
                      ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]


def test_the_issue_topologies_are_shipped() -> None:
    assert {"default", "no-tls", "multi-tenant", "ha", "single"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_topology_loads_for_both_backends(name: str) -> None:
    topo = sandbox_topology.load(name)
    assert topo.name == name
    assert topo.path == REPO_ROOT / "inventories" / f"{name}.yml"
    for backend in ("podman", "vagrant"):
        data = sandbox_inventory.build(topo, backend)
        assert set(data["hosts"]) == {n.name for n in topo.nodes}
    assert topo.path.read_text().startswith("#"), "a comment header says what it is"


def test_shipped_topologies_use_their_own_networks() -> None:
    topos = [sandbox_topology.load(n) for n in SHIPPED]
    podman = [t.networks["podman"] for t in topos]
    vagrant = [t.networks["vagrant"] for t in topos]
    assert len(set(podman)) == len(podman)
    assert len(set(vagrant)) == len(vagrant)
    assert all(net.subnet_of(VIRTUALBOX_RANGE) for net in vagrant)


def test_shipped_topologies_shapes() -> None:
    def shape(name: str) -> tuple[int, list[int], int, bool]:
        t = sandbox_topology.load(name)
        return (len(t.group("etcd")), [len(x.controllers) for x in t.tenants],
                len(t.group("lb")), t.tls)

    assert shape("default") == (3, [1], 0, True)
    assert shape("no-tls") == (3, [1], 0, False)
    assert shape("multi-tenant") == (3, [1, 1], 0, True)
    assert shape("ha") == (3, [2], 1, True)
    assert shape("single") == (1, [1], 0, True)
    prefixes = [t.prefix for t in sandbox_topology.load("multi-tenant").tenants]
    assert len(set(prefixes)) == 2


def _example() -> dict[str, Any]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
    res = subprocess.run(["ansible-inventory", "-i", "inventories/example", "--list"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "WARNING" not in res.stderr, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_example_inventory_has_what_the_roles_need() -> None:
    data = _example()
    hostvars = data["_meta"]["hostvars"]
    etcd = data["etcd"]["hosts"]
    controllers = data["k0s_controller"]["hosts"]
    assert len(etcd) % 2 == 1 and controllers and data["lb"]["hosts"]
    tenants = {t["name"]: t for t in hostvars[etcd[0]]["k0s_tenants"]}
    for host, hv in hostvars.items():
        for key in ("ansible_host", "node_address"):
            addr = ipaddress.IPv4Address(hv[key])
            assert any(addr in net for net in DOCUMENTATION_NETS), (host, key, addr)
        assert hv["ansible_user"] and hv["ansible_become"] is True
        assert hv["etcd_tls"] is True and "pki_dir" in hv and "sandbox_name" in hv
    for host in controllers:
        tenant = hostvars[host]["k0s_tenant"]
        assert host in tenants[tenant]["controllers"]
        group = "tenant_" + tenant.replace("-", "_")
        assert host in data[group]["hosts"]
    assert {c for t in tenants.values() for c in t["controllers"]} == set(controllers)
