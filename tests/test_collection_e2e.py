"""The collection k0sbox.external_etcd used as a user uses it (docs/collection.md): the tarball
`ansible-galaxy collection build` makes, installed with `ansible-galaxy collection install`
into an empty collections path; a playbook of a handful of lines written outside the
repository, calling the roles by their FQCNs; inventories/example/ copied, with the nodes'
addresses, the SSH user and key and the offline knobs put in; ansible-playbook with a
configuration of its own (not the repository's ansible.cfg) against nodes reached over SSH as
ordinary hosts -- no topology plugin, no podman connection.

The nodes are the sandbox's own podman system containers (playbooks/nodes.yml: systemd,
sshd with the sandbox's key): one etcd member with mTLS and one controller of one tenant,
running Kubernetes' CRD API server as the stand-in for k0s's kube-apiserver (NOT k0s: no k0s
binary here; k0s is prepared and its runtime checks SKIP). The collection's verify must pass
and write its report; a second run must report changed=0 on every host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    REPO_ROOT,
    check_verify_report,
    explain,
    podman_objects,
    podman_usable,
)

NAME = "h30-collection"
SUBNET = "10.213.231.0/24"
ADDRESSES = {"etcd-1": "10.213.231.11", "k0s-1": "10.213.231.21"}
BIN = REPO_ROOT / ".venv" / "bin"
TIMEOUT = 1800

# What the user writes: the roles by FQCN, the collection's validate and verify playbooks.
PLAYBOOK = """\
- name: Check the inventory before any node changes
  ansible.builtin.import_playbook: k0sbox.external_etcd.validate
- name: Certificates (the CA and its key stay on this machine)
  hosts: etcd:k0s_controller
  gather_facts: false
  roles: [k0sbox.external_etcd.pki]
- name: Etcd with mTLS
  hosts: etcd
  gather_facts: false
  roles: [k0sbox.external_etcd.etcd]
- name: K0s controllers, and Kubernetes' CRD API server where k0s does not run (a stand-in, not k0s)
  hosts: k0s_controller
  gather_facts: false
  roles: [k0sbox.external_etcd.k0s_controller, k0sbox.external_etcd.crd_apiserver]
- name: Verify
  ansible.builtin.import_playbook: k0sbox.external_etcd.verify
"""


def run(cmd: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False, stdin=subprocess.DEVNULL)


def sandbox_nodes(topology: Path, state: Path, present: bool) -> subprocess.CompletedProcess[str]:
    """The nodes, made (or removed) by the sandbox's own node lifecycle."""
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state), ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1")
    extra = [] if present else ["-e", "sandbox_nodes_state=absent"]
    return run([str(BIN / "ansible-playbook"), "-i", str(topology), "playbooks/nodes.yml", *extra],
               cwd=REPO_ROOT, env=env)


def user_inventory(dest: Path, key: Path, state: Path, apiserver_dir: str, etcd_dir: str) -> None:
    """inventories/example/ copied, with what differs on these hosts put in."""
    shutil.copytree(REPO_ROOT / "inventories" / "example", dest)
    hosts_file = dest / "hosts.yml"
    hosts = yaml.safe_load(hosts_file.read_text())
    groups: dict[str, Any] = {}
    for group, body in hosts["all"]["children"].items():
        kept = {h: v for h, v in (body.get("hosts") or {}).items() if h in ADDRESSES}
        for h, hv in kept.items():
            if hv:
                hv.update(ansible_host=ADDRESSES[h], node_address=ADDRESSES[h])
        if kept:
            groups[group] = {"hosts": kept}
    assert set(groups) >= {"etcd", "k0s_controller"}, groups
    hosts["all"]["children"] = groups
    hosts_file.write_text(yaml.safe_dump(hosts, sort_keys=False))

    vars_file = dest / "group_vars" / "all.yml"
    shared = yaml.safe_load(vars_file.read_text())
    assert shared["etcd_tls"] is True
    shared.update(
        # the node image's login: root with the sandbox's key (a real host: a sudo user)
        ansible_user="root", ansible_ssh_private_key_file=str(key),
        ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        sandbox_name=NAME, sandbox_state_dir=str(state),
        # offline: the etcd package method (the sandbox's patched build of Debian's etcd, its
        # .deb files from scripts/build-etcd, given as a collection user gives them), no k0s
        # download (refused at once), the stand-in's binaries from scripts/build-apiserver
        etcd_install_method="package", etcd_package_dir=etcd_dir,
        k0s_download_base_url="http://127.0.0.1:9/k0s-releases",
        k0s_binary_missing="warn", crd_apiserver_dir=apiserver_dir)
    for tenant in shared["k0s_tenants"]:
        tenant["controllers"] = [c for c in tenant["controllers"] if c in ADDRESSES]
    vars_file.write_text(yaml.safe_dump(shared, sort_keys=False))


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP's counts per host."""
    found = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.MULTILINE):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return found


@pytest.mark.e2e
def test_the_installed_collection_converges_hosts_over_ssh(tmp_path: Path) -> None:
    reason = podman_usable()
    if reason:
        pytest.skip(f"the collection's end-to-end test needs podman nodes: {reason}")
    built = subprocess.run([str(REPO_ROOT / "scripts" / "build-apiserver"), "--print-dir"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(built) / "apiextensions-apiserver").is_file():
        pytest.skip(f"Kubernetes' CRD API server (the stand-in) is not built in {built}: "
                    "run scripts/build-apiserver")
    etcd_dir = subprocess.run([str(REPO_ROOT / "scripts" / "build-etcd"), "--print-dir"],
                              capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(etcd_dir) / "SHA256SUMS").is_file():
        pytest.skip(f"the sandbox's etcd packages are not built in {etcd_dir}: run scripts/build-etcd")
    assert podman_objects(NAME) == [], f"left over from an earlier run: {podman_objects(NAME)}"

    topology = tmp_path / "nodes.yml"
    data = yaml.safe_load((REPO_ROOT / "inventories" / "single.yml").read_text())
    data.update(name=NAME, networks={"podman": SUBNET})
    assert {n["name"]: f"10.213.231.{n['host']}" for n in data["nodes"]} == ADDRESSES
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    nodes_state = tmp_path / "nodes-state"

    user = tmp_path / "user"           # outside the repository
    user.mkdir()
    (user / "ansible.cfg").write_text("[defaults]\nforks = 10\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SANDBOX_"))}
    env.update(ANSIBLE_CONFIG=str(user / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=str(user / "collections"))
    try:
        res = sandbox_nodes(topology, nodes_state, present=True)
        assert res.returncode == 0, explain(res)

        res = run([str(REPO_ROOT / "scripts" / "collection"), "build", str(tmp_path / "dist")],
                  cwd=REPO_ROOT, env=env)
        assert res.returncode == 0, explain(res)
        tarball = Path(res.stdout.strip())
        assert tarball.is_file() and re.fullmatch(r"k0sbox-external_etcd-\d+\.\d+\.\d+\.tar\.gz", tarball.name)
        # --no-deps: community.crypto, community.general and containers.podman come with the
        # pinned ansible package (Galaxy is not reachable here)
        res = run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps",
                   "-p", str(user / "collections"), str(tarball)], cwd=user, env=env)
        assert res.returncode == 0, explain(res)
        installed = user / "collections" / "ansible_collections" / "k0sbox" / "external_etcd"
        assert (installed / "roles" / "etcd" / "tasks" / "main.yml").is_file()
        assert not (installed / "scripts").exists() and not (installed / "molecule").exists()

        state = user / "state"
        user_inventory(user / "inventory", nodes_state / NAME / "ssh" / "id_ed25519", state, built,
                       etcd_dir)
        (user / "site.yml").write_text(PLAYBOOK)
        play = [str(BIN / "ansible-playbook"), "-i", "inventory", "site.yml"]

        first = run(play, cwd=user, env=env)
        assert first.returncode == 0, explain(first)
        counts = recap(first.stdout)
        assert set(counts) >= {"etcd-1", "k0s-1", "localhost"}, first.stdout[-3000:]
        assert all(c["failed"] == 0 and c["unreachable"] == 0 for c in counts.values()), counts
        assert counts["etcd-1"]["changed"] > 0          # it did the work
        # the roles came from the installed tarball, not from the repository
        assert str(REPO_ROOT) not in first.stdout, "a path of the repository in the output"
        # verify's report: every check passed, the tenant's Kubernetes API (the CRD API
        # server stand-in, not k0s) did its round trip, as in the whole-sandbox tests
        check_verify_report(json.loads((state / "verify.json").read_text()), data, with_api=True)
        assert (state / "pki" / "ca.key").is_file()     # the CA key stays on the control node

        second = run(play, cwd=user, env=env)
        assert second.returncode == 0, explain(second)
        again = recap(second.stdout)
        assert {h: c["changed"] for h, c in again.items() if c["changed"]} == {}, \
            second.stdout[-4000:]
    finally:
        gone = sandbox_nodes(topology, nodes_state, present=False)
        assert gone.returncode == 0, explain(gone)
        assert podman_objects(NAME) == []
