"""Whole-sandbox test of the shipped topologies through the CLI:
up -> verify passes -> up again changes nothing -> down leaves no container or network.

Each shipped topology is copied with its own name and podman subnet (so a sandbox the user
has up is never touched) and run offline (conftest.shipped_copy). The default topology runs
in tests/test_cli_e2e.py, together with the CLI's other commands (one sandbox, one cycle).

no-tls runs here with `up --apiserver off`, which checks that verify then reports the API as
SKIPPED (its plain-HTTP API path is covered by the k0s_tenants_plain scenario).

The ha and multi-tenant topologies have no run of their own any more (the suite's time,
docs/testing.md): the crd_apiserver scenario converges the same playbooks/site.yml -- which
ends in the same verify.yml, failing on any failed check -- on a topology that holds both
(a tenant of two controllers behind a load balancer, and a second tenant), and k0s_tenants
runs two tenants without RBAC as multi-tenant does; the report's shape is asserted on
default; the shipped files themselves are checked by test_shipped_inventories.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import (
    check_verify_report,
    explain,
    podman_objects,
    podman_usable,
    run_sandbox,
    shipped_copy,
)

SHIPPED = ("no-tls",)
WITH_API: tuple[str, ...] = ()
UP_TIMEOUT = 1800


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
        up = run_sandbox(["up", *topo, *api], state, timeout=UP_TIMEOUT)
        assert up.returncode == 0, explain(up)
        etcd_count = sum("etcd" in n["groups"] for n in data["nodes"])
        assert f"etcd: {etcd_count}/{etcd_count} members healthy (/health on port 2381)" \
            in up.stdout, up.stdout

        report = json.loads((state / name / "verify.json").read_text())
        check_verify_report(report, data, with_api=shipped in WITH_API)

        again = run_sandbox(["up", *topo, *api], state, timeout=UP_TIMEOUT)
        assert again.returncode == 0, explain(again)
        done = re.findall(r"^\s+(\w+) done .*changed=(\d+) failed=(\d+)", again.stdout, re.MULTILINE)
        assert [p for p, _, _ in done] == ["nodes", "site"], again.stdout
        assert [(p, c) for p, c, _ in done if c != "0"] == [], again.stdout
    finally:
        down = run_sandbox(["down", "--purge", *topo], state, timeout=600)
    assert down.returncode == 0, explain(down)
    assert podman_objects(name) == []
    networks = subprocess.run(["podman", "network", "exists", f"k0sbox-{name}"], check=False)
    assert networks.returncode != 0, f"network k0sbox-{name} left behind"
