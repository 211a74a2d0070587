"""The sandbox_topology inventory plugin, through the real ``ansible-inventory --list``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, base_topology
from sandboxlib import topology

INVENTORIES = sorted((REPO_ROOT / "inventories").glob("*.yml"))


def ansible_inventory(path: Path, backend: str = "podman", state_dir: Path | None = None,
                      cluster: str = "") -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "ansible-inventory"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"),
               SANDBOX_BACKEND=backend)
    env.pop("SANDBOX_CLUSTER", None)
    if cluster:
        env["SANDBOX_CLUSTER"] = cluster
    if state_dir is not None:
        env["SANDBOX_STATE_DIR"] = str(state_dir)
    return subprocess.run([str(exe if exe.exists() else "ansible-inventory"), "-i", str(path),
                           "--list"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _plain(value: Any) -> Any:
    """ansible-inventory (2.19) marks plugin-set strings as {'__ansible_unsafe': ...}."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _hosts_of(data: dict[str, Any], group: str) -> list[str]:
    return list(data.get(group, {}).get("hosts", []))


# A topology of several etcd clusters: each cluster's view (SANDBOX_CLUSTER) as one topology.
VIEWS = [(p, c) for p in INVENTORIES for c in topology.load(p).clusters]


@pytest.mark.parametrize(("path", "cluster"), VIEWS, ids=lambda v: getattr(v, "stem", v))
def test_shipped_topology_through_ansible_inventory(path: Path, cluster: str,
                                                    tmp_path: Path) -> None:
    whole = topology.load(path)
    res = ansible_inventory(path, state_dir=tmp_path,
                            cluster=cluster if whole.multi_cluster else "")
    assert res.returncode == 0, res.stderr
    data = _plain(json.loads(res.stdout))
    topo = whole.view(cluster) if whole.multi_cluster else whole
    hostvars = data["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(n.name for n in whole.nodes)
    for group in ("etcd", "k0s_controller", "lb"):
        assert sorted(_hosts_of(data, group)) == sorted(n.name for n in topo.group(group))
    for tenant in topo.tenants:
        group = "tenant_" + tenant.name.replace("-", "_")
        assert _hosts_of(data, group) == list(tenant.controllers)
        for ctrl in tenant.controllers:
            assert hostvars[ctrl]["k0s_tenant"] == tenant.name
    for node in topo.nodes:
        hv = hostvars[node.name]
        assert hv["ansible_host"] == hv["node_address"] == node.address("podman")
        assert hv["ansible_user"] == "root"
        assert hv["ansible_ssh_private_key_file"] == str(
            tmp_path / topo.name / "ssh" / "id_ed25519")
        assert hv["sandbox_name"] == topo.name
        assert hv["etcd_tls"] is topo.tls
        assert hv["pki_dir"] == str(tmp_path / topo.name / "pki")
        assert hv["sandbox_network"]["name"] == f"k0sbox-{topo.name}"
        assert [t["prefix"] for t in hv["k0s_tenants"]] == [t.prefix for t in topo.tenants]
        # Tenants sharing a TLS cluster are confined by etcd RBAC unless the topology says not.
        assert hv["etcd_rbac"] is (topo.tls and (len(topo.tenants) > 1 or topo.multi_cluster))


@pytest.mark.parametrize("path", [p for p in INVENTORIES if "vagrant" in topology.load(p)
                                  .networks], ids=lambda p: p.stem)
def test_vagrant_backend_addresses(path: Path) -> None:
    res = ansible_inventory(path, backend="vagrant")
    assert res.returncode == 0, res.stderr
    hostvars = _plain(json.loads(res.stdout))["_meta"]["hostvars"]
    topo = topology.load(path)
    for node in topo.nodes:
        assert hostvars[node.name]["ansible_host"] == node.address("vagrant")
        assert hostvars[node.name]["ansible_user"] == "vagrant"
        assert hostvars[node.name]["ansible_become"] is True
        # as Vagrant's ansible provisioner connects (--timeout=30), not Ansible's 10 s
        assert hostvars[node.name]["ansible_ssh_timeout"] == 30


def test_invalid_topology_fails_the_inventory(write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["nodes"].append({"name": "e1", "groups": ["etcd"], "host": 12})
    res = ansible_inventory(write_topology(doc))
    assert res.returncode != 0
    assert "duplicate node name 'e1'" in res.stderr


def test_unknown_backend_fails_the_inventory(write_topology: Callable[..., Path]) -> None:
    res = ansible_inventory(write_topology(base_topology()), backend="docker")
    assert res.returncode != 0
    assert "unknown backend 'docker'" in res.stderr


@pytest.mark.parametrize(("tls", "tenants", "override", "expected"), [
    (True, 2, None, True), (True, 1, None, False), (False, 2, None, False),
    (True, 2, False, False), (True, 1, True, True)])
def test_etcd_rbac_default(write_topology: Callable[..., Path], tls: bool, tenants: int,
                           override: bool | None, expected: bool) -> None:
    doc = base_topology()
    doc["tls"] = tls
    if tenants == 2:
        doc["nodes"].append({"name": "c2", "groups": ["k0s_controller"], "host": 22})
        doc["tenants"].append({"name": "tb", "prefix": "tb", "controllers": ["c2"]})
    if override is not None:
        doc["vars"] = {"etcd_rbac": override}
    res = ansible_inventory(write_topology(doc))
    assert res.returncode == 0, res.stderr
    hostvars = _plain(json.loads(res.stdout))["_meta"]["hostvars"]
    assert {hv["etcd_rbac"] for hv in hostvars.values()} == {expected}
