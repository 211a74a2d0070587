"""Hostile files the CLI reads or writes over, each tried for real (docs/hostile-files.md).

- A topology whose ``vars`` name another sandbox (``sandbox_name``, ``sandbox_state_dir``,
  ``sandbox_nodes``, a node's ``sandbox_container``), another tenant (a node's ``k0s_tenant``),
  a connection (``ansible_*``) or a day-2 command's consent (``etcd_restore_foreign``,
  ``k0s_restore_force``): before, ``down`` with such a topology removed another sandbox's
  podman node (tried below on a real podman container); now the file is refused on load.
- A tenant's kubeconfig replaced by a symbolic link (to another cluster's kubeconfig): before,
  ``kubeconfig`` printed the link's target and ``kubectl`` ran against it; now both refuse.
- A state directory whose path holds a space and ``$(...)``: before, ``eval "$(kubeconfig
  --export)"`` ran the command in the path; now the path is quoted.

The tenant copy (playbooks/tenant-restore.yml) is tried in tests/test_tenant_backup_checks.py
and tests/test_sandbox_etcd_prefix.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT, base_topology, podman_usable, run_sandbox
from sandboxlib import day2, inventory, specs, topology


def _with(level: str, key: str, value: Any) -> dict[str, Any]:
    doc = base_topology()
    doc["name"] = "t-hf-evil"
    target = doc if level == "topology" else doc["nodes"][1]
    target["vars"] = {key: value}
    return doc


REFUSED = [
    ("topology", "sandbox_name", "t-hf-victim", "vars.sandbox_name: the topology sets it from the topology's name"),
    ("topology", "sandbox_state_dir", "/tmp/elsewhere", "vars.sandbox_state_dir: the topology sets it"),
    ("topology", "sandbox_nodes", [{"name": "e1", "container": "k0sbox-other-e1"}], "vars.sandbox_nodes:"),
    ("topology", "k0s_tenants", [{"name": "root", "prefix": "/", "controllers": ["c1"]}],
     "vars.k0s_tenants: the topology sets it from tenants"),
    ("topology", "pki_dir", "/root/.ssh", "vars.pki_dir:"),
    ("node", "sandbox_container", "k0sbox-other-e1", "nodes[1] (c1).vars.sandbox_container:"),
    ("node", "k0s_tenant", "tb", "nodes[1] (c1).vars.k0s_tenant: the topology sets it from the controllers of tenants"),
    ("node", "node_address", "10.213.10.11", "nodes[1] (c1).vars.node_address:"),
    ("node", "ansible_connection", "local", "nodes[1] (c1).vars.ansible_connection: how Ansible reaches the nodes"),
    ("node", "ansible_host", "10.213.10.11", "nodes[1] (c1).vars.ansible_host:"),
    ("topology", "etcd_restore_foreign", True, "vars.etcd_restore_foreign: an input of a day-2 command"),
    ("topology", "k0s_restore_force", True, "vars.k0s_restore_force: an input of a day-2 command"),
    ("node", "sandbox_nodes_state", "absent", "vars.sandbox_nodes_state: an input of a day-2 command"),
]


@pytest.mark.parametrize(("level", "key", "value", "expected"), REFUSED, ids=[r[1] for r in REFUSED])
def test_a_topology_cannot_set_what_it_derives_or_a_commands_consent(
        write_topology: Callable[..., Path], level: str, key: str, value: Any, expected: str) -> None:
    with pytest.raises(topology.TopologyError) as err:
        topology.load(write_topology(_with(level, key, value)))
    assert expected in str(err.value), err.value


def test_a_topology_still_sets_role_variables(write_topology: Callable[..., Path]) -> None:
    doc = _with("topology", "etcd_rbac", False)
    doc["vars"]["etcd_metrics_port"] = 12381
    doc["nodes"][0]["vars"] = {"etcd_data_dir": "/var/lib/etcd-x"}
    built = inventory.build(topology.load(write_topology(doc)), "podman")
    assert built["vars"]["etcd_rbac"] is False and built["vars"]["sandbox_name"] == "t-hf-evil"
    assert built["hosts"]["e1"]["etcd_data_dir"] == "/var/lib/etcd-x"


def test_the_reserved_lists_follow_the_inventory_and_the_commands(
        write_topology: Callable[..., Path]) -> None:
    """Every variable the inventory derives is refused in vars (but etcd_rbac, a documented
    knob), and command_inputs() is every option of the day-2 commands' entry points."""
    built = inventory.build(topology.load(write_topology(base_topology())), "podman")
    derived = set(built["vars"]) | {k for hv in built["hosts"].values() for k in hv}
    missing = {k for k in derived - {"etcd_rbac"} if not k.startswith("ansible_")} - set(topology.DERIVED_VARS)
    assert not missing, f"inventory.build sets {missing}: add them to topology.DERIVED_VARS"
    refs = day2.entry_points()
    inputs = {k for ref in refs for k in (specs.entry(ref).get("options") or {})}
    assert topology.command_inputs() == inputs | {"sandbox_nodes_state"}
    # every entry point but a role's main is a row's (so a new command's inputs are refused
    # in a topology without a list to extend)
    specs_on_disk = {f"{p.parent.parent.name}/{name}"
                     for p in (REPO_ROOT / "roles").glob("*/meta/argument_specs.yml")
                     for name in yaml.safe_load(p.read_text())["argument_specs"] if name != "main"}
    assert specs_on_disk == refs


@pytest.mark.skipif(podman_usable() is not None, reason=str(podman_usable()))
def test_down_with_a_topology_naming_another_sandbox_removes_nothing(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    """The victim: a podman container labelled as sandbox t-hf-victim's node (as nodes.yml
    labels them). Before, `down` with this topology removed it."""
    victim_state = tmp_path / "victim" / "t-hf-victim"
    victim_state.mkdir(parents=True)
    (tmp_path / "rootfs").mkdir()
    name = "k0sbox-t-hf-victim-e1"
    subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, check=False)
    subprocess.run(["podman", "create", "--name", name, "--label", "k0s-etcd-sandbox=t-hf-victim",
                    "--label", f"k0s-etcd-sandbox.state={victim_state}", "--rootfs",
                    str(tmp_path / "rootfs"), "/true"], capture_output=True, check=True)
    try:
        doc = _with("topology", "sandbox_name", "t-hf-victim")
        doc["vars"]["sandbox_state_dir"] = str(victim_state)
        res = run_sandbox(["down", "-t", str(write_topology(doc))], tmp_path / "evil", timeout=300)
        assert res.returncode == 2, (res.stdout, res.stderr)
        assert "vars.sandbox_name: the topology sets it from the topology's name" in res.stderr
        exists = subprocess.run(["podman", "container", "exists", name], check=False)
        assert exists.returncode == 0, "down removed another sandbox's node"
    finally:
        subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, check=False)


def _kubeconfig_setup(tmp_path: Path, state: Path, write_topology: Callable[..., Path]) -> str:
    doc = base_topology()
    doc["name"] = "t-hf-kc"
    (state / "t-hf-kc" / "kubeconfig").mkdir(parents=True)
    return str(write_topology(doc))


def test_a_kubeconfig_replaced_by_a_link_is_not_followed(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    state = tmp_path / "state"
    topo = _kubeconfig_setup(tmp_path, state, write_topology)
    other = tmp_path / "production-kubeconfig"
    other.write_text("apiVersion: v1\nkind: Config\n")
    (state / "t-hf-kc" / "kubeconfig" / "ta.yaml").symlink_to(other)
    shown = run_sandbox(["kubeconfig", "-t", topo, "--tenant", "ta"], state)
    assert shown.returncode == 1 and str(other) not in shown.stdout, (shown.stdout, shown.stderr)
    assert f"is a symbolic link to {other}, not the kubeconfig scripts/sandbox up writes" in shown.stderr
    ran = run_sandbox(["kubectl", "-t", topo, "--tenant", "ta", "get", "pods"], state,
                      env={"SANDBOX_KUBECTL": shutil.which("echo") or "/bin/echo"})
    assert ran.returncode == 1 and ran.stdout == "", (ran.stdout, ran.stderr)


def test_the_export_line_is_quoted_for_the_shell_that_evaluates_it(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    proof = tmp_path / "ran"
    state = tmp_path / f"my state $(touch {proof})"
    topo = _kubeconfig_setup(tmp_path, state, write_topology)
    conf = state / "t-hf-kc" / "kubeconfig" / "ta.yaml"
    conf.write_text("apiVersion: v1\n")
    line = run_sandbox(["kubeconfig", "-t", topo, "--export"], state)
    assert line.returncode == 0, line.stderr
    shell = subprocess.run(["bash", "-c", line.stdout + '\nprintf %s "$KUBECONFIG"'],
                           capture_output=True, text=True, check=True)
    assert shell.stdout == str(conf) and not proof.exists(), (line.stdout, shell.stdout)
