"""Whole-sandbox test of the shipped topologies other than default (tests/test_cli_e2e.py):
up -> verify's report passes -> up again changes nothing (and ends with its quick check) ->
down leaves no container or network.

no-tls is brought up with the README's own block (the one marked `doc-test: sandbox no-tls`),
as typed without the CLI from the repository root with .venv/bin on PATH, on a copy of the
topology file with its own name and subnet (the only change to the typed lines: the path of
the inventory): `ansible-playbook -i <topology> playbooks/nodes.yml`, then `... site.yml -e
k0s_binary_missing=warn -e etcd_release_fallback=package` (no k0s binary and no github.com
here: k0s prepared, Debian's etcd, the CRD API server stand-in from the build cache). Then
the report of the verify that ends site.yml must pass as the CLI's `verify` report does on
every shipped topology (every tenant's API round trip too, over plain HTTP to etcd; read from
the file it wrote, not run again) and the CLI's `up` must change nothing but its own records
(a plain run makes none, so this first `up` converges): both entry points converge to the
same sandbox; then `up` again finds nothing to change after one check per node.

The ha and multi-tenant topologies have no run of their own (the suite's time,
docs/testing.md): the crd_apiserver scenario converges playbooks/site.yml's three parts
(converge.yml, verify.yml -- failing on any failed check -- and record.yml) on a topology that holds both
(a tenant of two controllers behind a load balancer, and a second tenant, each reached from
the host with `scripts/sandbox kubeconfig`), and k0s_tenants runs two tenants without RBAC
as multi-tenant does; the shipped files themselves are checked by
test_shipped_inventories.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    REPO_ROOT,
    check_verify_report,
    explain,
    podman_objects,
    podman_usable,
    run_sandbox,
    shipped_copy,
)
from doc_commands import collect, with_topology

SHIPPED = ("no-tls",)
UP_TIMEOUT = 1800


def ansible_playbook_line(line: str, state: Path) -> subprocess.CompletedProcess[str]:
    """A typed ansible-playbook line in the repository root (.venv/bin on PATH, as after
    `. .venv/bin/activate`; the repository's ansible.cfg found in the working directory),
    with the test's state dir."""
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state),
               PATH=f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    for var in ("ANSIBLE_CONFIG", "SANDBOX_BACKEND", "SANDBOX_TOPOLOGY"):
        env.pop(var, None)
    return subprocess.run(["bash", "-c", line], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=UP_TIMEOUT, check=False, stdin=subprocess.DEVNULL)


def down_and_gone(name: str, topo: list[str], state: Path) -> None:
    """`down --purge`, then no container and no network of the sandbox left."""
    down = run_sandbox(["down", "--purge", *topo], state, timeout=600)
    assert down.returncode == 0, explain(down)
    assert podman_objects(name) == []
    networks = subprocess.run(["podman", "network", "exists", f"k0sbox-{name}"], check=False)
    assert networks.returncode != 0, f"network k0sbox-{name} left behind"


@pytest.mark.e2e
@pytest.mark.parametrize("shipped", SHIPPED)
def test_shipped_topology_end_to_end(shipped: str, tmp_path: Path) -> None:
    reason = podman_usable()
    if reason:
        pytest.skip(f"whole-sandbox test needs podman: {reason}")
    block = [c for c in collect() if c.sandbox == shipped]
    assert block, f"README.md has no block marked doc-test: sandbox {shipped}"
    name, path, data = shipped_copy(shipped, tmp_path, release_fails=True)
    state = tmp_path / "state"
    topo = ["--topology", str(path)]
    try:
        for cmd in block:
            line = with_topology(cmd.line, shipped, path)
            assert line != cmd.line, f"{cmd.source}: no inventories/{shipped}.yml to replace"
            res = ansible_playbook_line(line, state)
            assert res.returncode == 0, f"{cmd.source}: {line}\n{explain(res)}"
            assert re.search(r"failed=[1-9]|unreachable=[1-9]", res.stdout) is None, res.stdout
        # site.yml ends in verify.yml, which wrote its report into the sandbox's state dir (the
        # file `scripts/sandbox verify` prints with --json; the CLI's own verify lines are
        # tests/test_cli_e2e.py's): not run a second time on the same sandbox
        report = json.loads((state / name / "verify.json").read_text())
        check_verify_report(report, data, with_api=True)

        again = run_sandbox(["up", *topo], state, timeout=UP_TIMEOUT)
        assert again.returncode == 0, explain(again)
        etcd_count = sum("etcd" in n["groups"] for n in data["nodes"])
        assert f"etcd: {etcd_count}/{etcd_count} members healthy (/health on port 2381)" \
            in again.stdout, again.stdout
        done = re.findall(r"^\s+\[\d+/\d+\] ([\w-]+) done in \S+: (.*)$", again.stdout,
                          re.MULTILINE)
        # up ends with its quick check (ready.yml), then record; the full verify ran above
        assert "nodes" in [p for p, _ in done] and "ready" in [p for p, _ in done], again.stdout
        assert "verify" not in [p for p, _ in done], again.stdout
        # Nothing changed but the nodes' records of this converge (the last phase, `record`:
        # what the CLI's `up` compares first; a plain ansible-playbook run writes none).
        assert [(p, d) for p, d in done if p != "record"
                and d != "nothing to do here" and not d.endswith(" changed=0")] == [], again.stdout
        assert done[-1][0] == "record", again.stdout
        noop = run_sandbox(["up", *topo], state, timeout=UP_TIMEOUT)
        assert noop.returncode == 0 and "nothing to change" in noop.stdout, explain(noop)
    finally:
        down_and_gone(name, topo, state)


def _cluster_view(data: dict[str, Any], cluster: str) -> dict[str, Any]:
    """The topology document as one etcd cluster's view shows it (Topology.view)."""
    tenants = [t for t in data["tenants"] if t["cluster"] == cluster]
    ctrls = {c for t in tenants for c in t["controllers"]}
    nodes = [n for n in data["nodes"] if n.get("cluster") == cluster or n["name"] in ctrls]
    return {**data, "nodes": nodes, "tenants": tenants}


@pytest.mark.e2e
def test_two_etcd_clusters_end_to_end(tmp_path: Path) -> None:
    """inventories/two-clusters.yml (issue 40, part 1): two etcd clusters, three tenants.
    A plain ansible-playbook run without SANDBOX_CLUSTER is refused before any node exists;
    `up` converges each cluster; each cluster's verify passes with its own members and
    tenants only, and every tenant of the other cluster is refused on it with its own
    certificate (one CA for both: etcd RBAC is what keeps it out); each cluster's RBAC has
    its own tenants' users only; the clusters are two (different cluster IDs); a second
    `up` changes nothing; etcdctl without --cluster names the clusters."""
    reason = podman_usable()
    if reason:
        pytest.skip(f"whole-sandbox test needs podman: {reason}")
    name, path, data = shipped_copy("two-clusters", tmp_path, release_fails=True)
    state = tmp_path / "state"
    topo = ["--topology", str(path)]
    clusters = ["main", "second"]
    careless = ansible_playbook_line(f"ansible-playbook -i {path} playbooks/site.yml", state)
    assert careless.returncode != 0, careless.stdout
    assert ("has 2 etcd clusters (main, second)" in careless.stdout
            and "SANDBOX_CLUSTER=main ansible-playbook" in careless.stdout), careless.stdout
    assert podman_objects(name) == []
    try:
        up = run_sandbox(["up", *topo], state, timeout=UP_TIMEOUT)
        assert up.returncode == 0, explain(up)
        for c in clusters:
            assert f"etcd cluster '{c}': quick check passed" in up.stdout, up.stdout
            assert f"etcd cluster {c}: 1/1 members healthy" in up.stdout, up.stdout
        ids = {}
        for c in clusters:
            view = _cluster_view(data, c)
            res = run_sandbox(["verify", "--cluster", c, "--json", *topo], state, timeout=600)
            assert res.returncode == 0, explain(res)
            report = json.loads(res.stdout)
            check_verify_report(report, view, with_api=True)
            others = [t["name"] for t in data["tenants"] if t["cluster"] != c]
            foreign = {ch["name"]: ch for ch in report["checks"]
                       if "(another etcd cluster)" in ch["name"]}
            assert sorted(foreign) == sorted(
                f"{t} (another etcd cluster): refused on etcd cluster {c} with its own certificate"
                for t in others), foreign
            assert all(ch["ok"] and "permission denied" in ch["detail"]
                       for ch in foreign.values()), foreign
            users = run_sandbox(["etcdctl", "--cluster", c, *topo, "user", "list"], state)
            assert users.returncode == 0, explain(users)
            assert users.stdout.split() == sorted(
                ["root", *(t["name"] for t in view["tenants"])]), users.stdout
            status = run_sandbox(["etcdctl", "--cluster", c, *topo, "endpoint", "status",
                                  "-w", "json"], state)
            assert status.returncode == 0, explain(status)
            ids[c] = json.loads(status.stdout)[0]["Status"]["header"]["cluster_id"]
        assert ids["main"] != ids["second"], ids
        which = run_sandbox(["etcdctl", *topo, "member", "list"], state)
        assert which.returncode == 2 and "--cluster main" in which.stderr, explain(which)
        noop = run_sandbox(["up", *topo], state, timeout=UP_TIMEOUT)
        assert noop.returncode == 0 and "nothing to change" in noop.stdout, explain(noop)
    finally:
        down_and_gone(name, topo, state)
