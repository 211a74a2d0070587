"""The Vagrantfile, as Vagrant itself reads it: `vagrant validate` for every shipped
topology, and the machines Vagrant defines (`vagrant status --machine-readable` plus the
SANDBOX_DUMP lines the Vagrantfile prints from Vagrant's config objects) are exactly the
topology's nodes with the same addresses. No VM is created: neither command starts one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandboxlib import topology as sandbox_topology

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (REPO_ROOT / "inventories").glob("*.yml"))
VAGRANT = shutil.which("vagrant")

if VAGRANT is None:
    pytest.skip("SKIPPED LOUDLY: 'vagrant' is not installed, so the Vagrantfile is not "
                "tested (apt-get install vagrant vagrant-libvirt)", allow_module_level=True)


def _has_libvirt_plugin() -> bool:
    res = subprocess.run([str(VAGRANT), "plugin", "list"], capture_output=True, text=True,
                         check=False, env=_base_env())
    return "vagrant-libvirt" in res.stdout


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("SANDBOX_TOPOLOGY", "SANDBOX_BOX", "SANDBOX_DUMP", "SANDBOX_BACKEND",
                "VAGRANT_DOTFILE_PATH", "SANDBOX_LIBVIRT_DRIVER"):
        env.pop(key, None)
    env.update(VAGRANT_CHECKPOINT_DISABLE="1", VAGRANT_BOX_UPDATE_CHECK_DISABLE="1",
               VAGRANT_NO_COLOR="1")
    return env


@pytest.fixture(scope="module")
def provider() -> str:
    """libvirt when the plugin is installed (validate needs no libvirtd), else virtualbox."""
    return "libvirt" if _has_libvirt_plugin() else "virtualbox"


def vagrant(args: list[str], tmp_path: Path, provider: str,
            **extra: str) -> subprocess.CompletedProcess[str]:
    env = _base_env()
    # A dotfile dir of the test's own: the repository's .vagrant is never touched.
    env.update(VAGRANT_DEFAULT_PROVIDER=provider, VAGRANT_DOTFILE_PATH=str(tmp_path / "dot"))
    env.update(extra)
    return subprocess.run([str(VAGRANT), *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, check=False, timeout=120)


def machines_seen(tmp_path: Path, provider: str, **extra: str
                  ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """({machine: state} from `vagrant status`, {machine: dump} for the active provider)."""
    res = vagrant(["status", "--machine-readable"], tmp_path, provider,
                  SANDBOX_DUMP="1", **extra)
    if res.returncode != 0 and provider == "virtualbox":
        pytest.skip(f"vagrant status needs a usable provider: {res.stderr.strip()[:200]}")
    assert res.returncode == 0, res.stderr
    states: dict[str, str] = {}
    providers: dict[str, str] = {}
    for line in res.stdout.splitlines():
        parts = line.split(",", 4)
        if len(parts) >= 4 and parts[1]:
            if parts[2] == "state":
                states[parts[1]] = parts[3]
            elif parts[2] == "provider-name":
                providers[parts[1]] = parts[3]
    assert set(providers.values()) <= {provider}, providers
    dumps: dict[str, dict[str, Any]] = {}
    for line in res.stderr.splitlines():
        if line.startswith("SANDBOX_DUMP "):
            item = json.loads(line.split(" ", 1)[1])
            if item["provider"] == provider:
                dumps[item["name"]] = item
    return states, dumps


@pytest.mark.parametrize("name", SHIPPED)
def test_vagrant_validate(name: str, tmp_path: Path, provider: str) -> None:
    args = ["validate"] + (["--ignore-provider"] if provider == "virtualbox" else [])
    res = vagrant(args, tmp_path, provider, SANDBOX_TOPOLOGY=name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validated successfully" in res.stdout


@pytest.mark.parametrize("name", SHIPPED)
def test_machines_are_the_topology_nodes(name: str, tmp_path: Path, provider: str) -> None:
    topo = sandbox_topology.load(name)
    states, dumps = machines_seen(tmp_path, provider, SANDBOX_TOPOLOGY=name,
                                  SANDBOX_STATE_DIR=str(tmp_path / "state"))
    names = [n.name for n in topo.nodes]
    assert list(states) == names  # same machines, in the topology's order
    assert set(states.values()) == {"not_created"}  # nothing was started
    assert set(dumps) == set(names)
    for node in topo.nodes:
        seen = dumps[node.name]
        assert seen["ips"] == [node.address("vagrant")]
        assert seen["hostname"] == node.name
        assert seen["box"] == (topo.vagrant.get("box") or "debian/bookworm64")
        if node.memory:
            assert seen["memory"] == node.memory
        assert isinstance(seen["memory"], int) and seen["memory"] >= 256
        assert isinstance(seen["cpus"], int) and seen["cpus"] >= 1
    # site.yml runs once, from the last VM, for all VMs, with the topology as inventory.
    last = names[-1]
    for node_name in names[:-1]:
        assert dumps[node_name]["provisioners"] == []
    assert dumps[last]["provisioners"][-1] == "ansible"
    site = {"playbook": str(REPO_ROOT / "playbooks" / "site.yml"), "limit": "all,localhost",
            "config_file": str(REPO_ROOT / "ansible.cfg")}
    if not topo.multi_cluster:
        assert dumps[last]["ansible"] == [{**site, "name": "site", "inventory_path": str(topo.path)}]
        return
    # several etcd clusters: one run per cluster's view, in the topology's order
    views = tmp_path / "state" / topo.name / "vagrant-views"
    assert dumps[last]["ansible"] == [{**site, "name": f"site-{c}",
                                       "inventory_path": str(views / f"{c}.yml")}
                                      for c in topo.clusters]


def _inventory(source: Path, state: Path, **env: str) -> dict[str, Any]:
    """What Ansible's own ansible-inventory makes of an inventory source, vagrant backend."""
    run_env = {k: v for k, v in _base_env().items() if k != "SANDBOX_CLUSTER"}
    run_env.update(SANDBOX_BACKEND="vagrant", SANDBOX_STATE_DIR=str(state), **env)
    exe = REPO_ROOT / ".venv" / "bin" / "ansible-inventory"
    res = subprocess.run([str(exe) if exe.exists() else "ansible-inventory", "-i", str(source),
                          "--list"], cwd=REPO_ROOT, env=run_env, capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def test_each_clusters_provisioner_sees_that_clusters_view(tmp_path: Path, provider: str) -> None:
    """Vagrant's ansible provisioner takes an inventory path and no environment: the view
    file the Vagrantfile writes for each etcd cluster gives Ansible exactly what the topology
    file gives with SANDBOX_CLUSTER=<cluster> (what `scripts/sandbox up` converges on podman),
    and a second reading of the Vagrantfile leaves the files as they were."""
    topo = sandbox_topology.load("two-clusters")
    state = tmp_path / "state"
    _, dumps = machines_seen(tmp_path, provider, SANDBOX_TOPOLOGY=topo.name,
                             SANDBOX_STATE_DIR=str(state))
    entries = dumps[topo.nodes[-1].name]["ansible"]
    assert [e["name"] for e in entries] == [f"site-{c}" for c in topo.clusters]
    stamps = {e["inventory_path"]: Path(e["inventory_path"]).stat().st_mtime_ns for e in entries}
    for entry, cluster in zip(entries, topo.clusters, strict=True):
        via_view = _inventory(Path(entry["inventory_path"]), state)
        via_env = _inventory(topo.path, state, SANDBOX_CLUSTER=cluster)
        assert via_view == via_env
        members = sorted(n.name for n in topo.nodes if "etcd" in n.groups and n.cluster == cluster)
        assert sorted(via_view["etcd"]["hosts"]) == members
    machines_seen(tmp_path, provider, SANDBOX_TOPOLOGY=topo.name, SANDBOX_STATE_DIR=str(state))
    assert {p: Path(p).stat().st_mtime_ns for p in stamps} == stamps


def test_group_defaults_and_topology_settings(tmp_path: Path, provider: str) -> None:
    data = {
        "plugin": "sandbox_topology", "name": "t-vagrant", "tls": True,
        "networks": {"podman": "10.213.52.0/24", "vagrant": "192.168.61.0/24"},
        "vagrant": {"box": "local/debian12", "memory": {"etcd": 768}},
        "nodes": [
            {"name": "e1", "groups": ["etcd"], "host": 11},
            {"name": "c1", "groups": ["k0s_controller"], "host": 21, "cpus": 3},
            {"name": "c2", "groups": ["k0s_controller"], "host": 22, "memory": 2048},
            {"name": "lb", "groups": ["lb"], "host": 30},
        ],
        "tenants": [{"name": "ta", "prefix": "ta", "controllers": ["c1", "c2"]}],
    }
    path = tmp_path / "t-vagrant.yml"
    path.write_text(yaml.safe_dump(data))
    _, dumps = machines_seen(tmp_path, provider, SANDBOX_TOPOLOGY=str(path))
    assert {n: d["memory"] for n, d in dumps.items()} == {
        "e1": 768, "c1": 1536, "c2": 2048, "lb": 256}
    assert dumps["c1"]["cpus"] == 3 and dumps["e1"]["cpus"] == 1
    assert {d["box"] for d in dumps.values()} == {"local/debian12"}
    assert dumps["lb"]["ansible"][0]["inventory_path"] == str(path)
    _, dumps = machines_seen(tmp_path, provider, SANDBOX_TOPOLOGY=str(path),
                             SANDBOX_BOX="other/box")
    assert {d["box"] for d in dumps.values()} == {"other/box"}


def test_unknown_topology_is_one_clear_line(tmp_path: Path, provider: str) -> None:
    res = vagrant(["status"], tmp_path, provider, SANDBOX_TOPOLOGY="no-such-topology")
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "unknown topology 'no-such-topology'" in lines[0]
    assert "default" in lines[0]  # lists the shipped ones
    assert not (tmp_path / "dot" / "machines").exists()


def test_invalid_topology_names_the_field(tmp_path: Path, provider: str) -> None:
    data = yaml.safe_load((REPO_ROOT / "inventories" / "single.yml").read_text())
    data["name"] = "t-bad"
    data["nodes"][1]["host"] = data["nodes"][0]["host"]  # duplicate address
    path = tmp_path / "t-bad.yml"
    path.write_text(yaml.safe_dump(data))
    res = vagrant(["validate"], tmp_path, provider, SANDBOX_TOPOLOGY=str(path))
    assert res.returncode != 0
    assert "duplicate podman address" in res.stderr or "duplicate vagrant address" in res.stderr
    assert "give each node its own" in res.stderr


def test_topology_without_vagrant_network(tmp_path: Path, provider: str) -> None:
    data = yaml.safe_load((REPO_ROOT / "inventories" / "single.yml").read_text())
    data["name"] = "t-novagrant"
    del data["networks"]["vagrant"]
    path = tmp_path / "t-novagrant.yml"
    path.write_text(yaml.safe_dump(data))
    res = vagrant(["validate"], tmp_path, provider, SANDBOX_TOPOLOGY=str(path))
    assert res.returncode != 0
    assert "networks.vagrant" in res.stderr
