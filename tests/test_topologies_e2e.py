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
test_shipped_inventories.py. The two-clusters topology (two etcd clusters, a tenant moved
between them under load) is the tenant_migrate Molecule scenario's (molecule/tenant_migrate).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

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
