"""Whole-sandbox test of the shipped topologies:
up -> verify passes -> up again changes nothing -> down leaves no container or network.

Each shipped topology is copied with its own name and podman subnet (so a sandbox the user
has up is never touched) and run offline (conftest.shipped_copy). The default topology runs
in tests/test_cli_e2e.py, together with the CLI's other commands (one sandbox, one cycle).

no-tls is brought up as a user types it without the CLI, from the repository root with
.venv/bin on PATH: `ansible-playbook -i <topology> playbooks/nodes.yml`, then
`ansible-playbook -i <topology> playbooks/site.yml` (k0s prepared without a binary, no API
server stand-in); then the CLI's `verify` must pass (the API reported SKIPPED; its plain-HTTP
API path is covered by the k0s_tenants_plain scenario) and the CLI's `up --apiserver off`
must find nothing to change: both entry points converge to the same sandbox.

The ha and multi-tenant topologies have no run of their own any more (the suite's time,
docs/testing.md): the crd_apiserver scenario converges the same playbooks/site.yml -- which
ends in the same verify.yml, failing on any failed check -- on a topology that holds both
(a tenant of two controllers behind a load balancer, and a second tenant), and k0s_tenants
runs two tenants without RBAC as multi-tenant does; the report's shape is asserted on
default; the shipped files themselves are checked by test_shipped_inventories.py.
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

SHIPPED = ("no-tls",)
WITH_API: tuple[str, ...] = ()
# Brought up with plain ansible-playbook, not with the CLI's up, offline as README says: no
# k0s binary here (k0s prepared only), etcd's release not downloadable (the distribution's
# package instead), no stand-in API server.
AS_TYPED = {"no-tls": ["-e", "k0s_binary_missing=warn", "-e", "etcd_release_fallback=package",
                       "-e", "crd_apiserver_enabled=false"]}
UP_TIMEOUT = 1800


def ansible_playbook(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    """ansible-playbook as a user types it in the repository root (.venv/bin on PATH, the
    repository's ansible.cfg found in the working directory), with the test's state dir."""
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state),
               PATH=f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    for var in ("ANSIBLE_CONFIG", "SANDBOX_BACKEND", "SANDBOX_TOPOLOGY"):
        env.pop(var, None)
    return subprocess.run(["ansible-playbook", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=UP_TIMEOUT, check=False)


@pytest.mark.e2e
@pytest.mark.parametrize("shipped", SHIPPED)
def test_shipped_topology_end_to_end(shipped: str, tmp_path: Path) -> None:
    reason = podman_usable()
    if reason:
        pytest.skip(f"whole-sandbox test needs podman: {reason}")
    name, path, data = shipped_copy(shipped, tmp_path)
    state = tmp_path / "state"
    topo = ["--topology", str(path)]
    try:
        api = [] if shipped in WITH_API else ["--apiserver", "off"]
        if shipped in AS_TYPED:
            for playbook, extra in (("nodes.yml", []), ("site.yml", AS_TYPED[shipped])):
                res = ansible_playbook(["-i", str(path), f"playbooks/{playbook}", *extra], state)
                assert res.returncode == 0, explain(res)
                assert re.search(r"failed=[1-9]|unreachable=[1-9]", res.stdout) is None, res.stdout
            verify = run_sandbox(["verify", "--json", *topo], state, timeout=UP_TIMEOUT)
            assert verify.returncode == 0, explain(verify)
            report = json.loads(verify.stdout)
        else:
            up = run_sandbox(["up", *topo, *api], state, timeout=UP_TIMEOUT)
            assert up.returncode == 0, explain(up)
            report = json.loads((state / name / "verify.json").read_text())
        check_verify_report(report, data, with_api=shipped in WITH_API)

        again = run_sandbox(["up", *topo, *api], state, timeout=UP_TIMEOUT)
        assert again.returncode == 0, explain(again)
        etcd_count = sum("etcd" in n["groups"] for n in data["nodes"])
        assert f"etcd: {etcd_count}/{etcd_count} members healthy (/health on port 2381)" \
            in again.stdout, again.stdout
        done = re.findall(r"^\s+(\w+) done .*changed=(\d+) failed=(\d+)", again.stdout, re.MULTILINE)
        assert [p for p, _, _ in done] == ["nodes", "site"], again.stdout
        assert [(p, c) for p, c, _ in done if c != "0"] == [], again.stdout
    finally:
        down = run_sandbox(["down", "--purge", *topo], state, timeout=600)
    assert down.returncode == 0, explain(down)
    assert podman_objects(name) == []
    networks = subprocess.run(["podman", "network", "exists", f"k0sbox-{name}"], check=False)
    assert networks.returncode != 0, f"network k0sbox-{name} left behind"
