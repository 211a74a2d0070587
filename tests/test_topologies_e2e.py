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

import base64
import itertools
import json
import os
import re
import ssl
import subprocess
import tempfile
import time
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
    run_sandbox,
    shipped_copy,
)
from doc_commands import collect, with_topology
from test_tenant_migrate_api import Client, https_call, widget

SHIPPED = ("no-tls",)
# Objects tenant-a holds before its move (two-clusters); more by hand with MOVE_OBJECTS.
MOVE_OBJECTS = int(os.environ.get("MOVE_OBJECTS", "200"))
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
        move_tenant_a_under_load(topo, path, state)
    finally:
        down_and_gone(name, topo, state)


class KubeconfigApi:
    """A tenant's Kubernetes API (the CRD API server stand-in, not k0s) through the
    kubeconfig `up` wrote; the cluster-scoped widgets of docs/examples/crd.yaml."""

    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        conf = yaml.safe_load(kubeconfig.read_text())
        user, cluster = conf["users"][0]["user"], conf["clusters"][0]["cluster"]
        for field, file in (("client-certificate-data", "c.crt"), ("client-key-data", "c.key"),
                            ("certificate-authority-data", "ca.crt")):
            data = user.get(field) or cluster.get(field)
            (tmp / file).write_bytes(base64.b64decode(data))
        self.url = cluster["server"]
        self.ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        self.ctx.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        return https_call(self.url, self.ctx, method, path, body, timeout)

    @staticmethod
    def widgets() -> str:
        return "/apis/example.sandbox/v1/widgets"


def prefix_revisions(topo: list[str], state: Path, cluster: str, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` on ``cluster`` with its mod revision (admin, etcdctl)."""
    res = run_sandbox(["etcdctl", "--cluster", cluster, *topo, "get", prefix, "--prefix",
                       "-w", "json"], state)
    assert res.returncode == 0, explain(res)
    return {base64.b64decode(kv["key"]).decode(): int(kv["mod_revision"])
            for kv in json.loads(res.stdout).get("kvs", [])}


def move_tenant_a_under_load(topo: list[str], path: Path, state: Path) -> None:
    """`migrate --tenant tenant-a --to second` as typed, while a client creates objects
    through tenant-a's API server (issue 40's done-when): every acknowledged object there
    after, with its uid; no resourceVersion going back (each object's above the one
    acknowledged, the list's above any seen); the freeze printed and seen by the client;
    tenant-b's keys on main and tenant-c's on second untouched (keys and mod revisions);
    tenant-a's keys, user and role gone from main; the topology file says second; each
    cluster's verify passes (tenant-a refused on main with its own certificate)."""
    name = path.stem
    kubectl = ["kubectl", *topo, "--tenant", "tenant-a"]
    crd = run_sandbox([*kubectl, "apply", "-f", "docs/examples/crd.yaml"], state)
    assert crd.returncode == 0, explain(crd)
    with tempfile.TemporaryDirectory() as tmp:
        api = KubeconfigApi(state / name / "kubeconfig" / "tenant-a.yaml", Path(tmp))
        deadline = time.monotonic() + 60
        while api.call("GET", api.widgets())[0] != 200:
            assert time.monotonic() < deadline, "the CRD was not served in 60 s"
            time.sleep(0.2)
        for i in range(MOVE_OBJECTS):
            assert api.call("POST", api.widgets(), widget(f"pre-{i:04d}", i))[0] == 201
        code, before = api.call("GET", api.widgets())
        assert code == 200 and len(before["items"]) == MOVE_OBJECTS
        neighbours = {c: prefix_revisions(topo, state, c, p)
                      for c, p in (("main", "/tenant-b/"), ("second", "/tenant-c/"))}
        client = Client(api)
        client.start()
        try:
            while len(client.acked) < 10:
                time.sleep(0.05)
            t_move = time.monotonic()
            moved = run_sandbox(["migrate", *topo, "--tenant", "tenant-a", "--to", "second"],
                                state, timeout=900)
            t_done = time.monotonic()
            deadline = time.monotonic() + 60
            while not [a for a in client.acked if a[0] > t_done] and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            client.stop.set()
            client.join()
        assert moved.returncode == 0, explain(moved)
        assert "sandbox: tenant tenant-a moved from etcd cluster main to second" in moved.stdout
        freeze = re.search(r"freeze: its API servers stopped for ([\d.]+)s", moved.stdout)
        assert freeze, moved.stdout
        acked = sorted(client.acked, key=lambda a: a[4])
        gap = max(b[4] - a[4] for a, b in itertools.pairwise(acked)
                  if t_move <= b[4] <= t_done + 60)
        print(f"\nmigrate tenant-a ({MOVE_OBJECTS} objects + {len(acked)} written during the "
              f"move): {moved.stdout.strip()}\nthe client's longest wait between two "
              f"acknowledged writes: {gap:.1f}s ({client.failed} failed attempts)")
        code, after = api.call("GET", api.widgets(), timeout=30)
        assert code == 200
        now = {o["metadata"]["name"]: o for o in after["items"]}
        assert [n for _, n, uid, _, _ in acked
                if now.get(n, {}).get("metadata", {}).get("uid") != uid] == []
        assert {o["metadata"]["name"]: o["metadata"]["uid"] for o in before["items"]}.items() \
            <= {n: o["metadata"]["uid"] for n, o in now.items()}.items()
        # no version goes back: every object at or above the version acknowledged for it,
        # strictly above for each written on the source (before the move, and the first ones)
        def rv(n: str) -> int:
            return int(now[n]["metadata"]["resourceVersion"])
        assert [n for _, n, _, v, _ in acked if rv(n) < v] == []
        on_source = {o["metadata"]["name"]: int(o["metadata"]["resourceVersion"])
                     for o in before["items"]}
        on_source.update({n: v for sent, n, _, v, _ in acked if sent < t_move})
        assert [n for n, v in on_source.items() if rv(n) <= v] == []
        seen = [v for *_, v, _ in acked] + list(on_source.values())
        assert int(after["metadata"]["resourceVersion"]) >= max(seen)
    for c, p in (("main", "/tenant-b/"), ("second", "/tenant-c/")):
        assert prefix_revisions(topo, state, c, p) == neighbours[c], f"{p} on {c} changed"
    assert prefix_revisions(topo, state, "main", "/tenant-a/") == {}
    for c, users in (("main", ["root", "tenant-b"]),
                     ("second", ["root", "tenant-a", "tenant-c"])):
        res = run_sandbox(["etcdctl", "--cluster", c, *topo, "user", "list"], state)
        assert res.stdout.split() == users, res.stdout
    assert [t["cluster"] for t in yaml.safe_load(path.read_text())["tenants"]] == \
        ["second", "main", "second"], path.read_text()
    assert not list((state / name).glob("migrate-*.json"))
    for c in ("main", "second"):
        res = run_sandbox(["verify", "--cluster", c, "--json", *topo], state, timeout=600)
        assert res.returncode == 0, explain(res)
        names = {ch["name"] for ch in json.loads(res.stdout)["checks"] if ch["ok"]}
        if c == "main":
            assert ("tenant-a (another etcd cluster): refused on etcd cluster main with its own "
                    "certificate") in names
