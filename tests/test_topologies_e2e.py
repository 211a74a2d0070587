"""Whole-sandbox test of every shipped topology that can run here, through the CLI:
up -> verify passes -> up again changes nothing -> down leaves no container or network.

Each shipped topology is copied with its own name and podman subnet (so a sandbox the user
has up is never touched) and run offline: Debian's etcd package instead of the release
tarball, and the k0s download pointed at a closed loopback port (no k0s binary here: k0s is
prepared and its preflight runs; the k0s runtime checks report SKIP).

The Kubernetes API stand-in (Kubernetes' CRD API server, not k0s) runs on the two topologies
with several tenants or controllers (multi-tenant, ha), where isolation and the load balancer
matter; default and no-tls run with `up --apiserver off`, as before it existed (their API
paths are covered by tests/test_cli_e2e.py, the k0s_tenants_plain and crd_apiserver
scenarios). `scripts/sandbox verify --json` runs on multi-tenant; the others read the report
their `up` wrote (site.yml ends with the same verify.yml).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, podman_objects, run_sandbox
from test_cli_e2e import _explain, _podman_usable

SHIPPED = {"default": "10.213.71.0/24", "no-tls": "10.213.72.0/24",
           "multi-tenant": "10.213.73.0/24", "ha": "10.213.74.0/24"}
WITH_API = ("multi-tenant", "ha")
UP_TIMEOUT = 1800


def _copy(name: str, subnet: str, where: Path) -> tuple[str, Path, dict]:
    data = yaml.safe_load((REPO_ROOT / "inventories" / f"{name}.yml").read_text())
    data["name"] = f"e2e-{name}"
    data["networks"] = {"podman": subnet}
    data.setdefault("vars", {}).update({
        "etcd_install_method": "package",
        "k0s_download_base_url": "http://127.0.0.1:9/k0s-releases",
    })
    path = where / f"e2e-{name}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return data["name"], path, data


@pytest.mark.e2e
@pytest.mark.parametrize("shipped", list(SHIPPED))
def test_shipped_topology_end_to_end(shipped: str, tmp_path: Path) -> None:
    reason = _podman_usable()
    if reason:
        pytest.skip(f"whole-sandbox test needs podman: {reason}")
    name, path, data = _copy(shipped, SHIPPED[shipped], tmp_path)
    state = tmp_path / "state"
    topo = ["--topology", str(path)]
    try:
        api = [] if shipped in WITH_API else ["--apiserver", "off"]
        up = run_sandbox(["up", *topo, *api], state, timeout=UP_TIMEOUT)
        assert up.returncode == 0, _explain(up)
        etcd_count = sum("etcd" in n["groups"] for n in data["nodes"])
        assert f"etcd: {etcd_count}/{etcd_count} members healthy" in up.stdout, up.stdout

        if shipped == "multi-tenant":
            verify = run_sandbox(["verify", "--json", *topo], state, timeout=UP_TIMEOUT)
            assert verify.returncode == 0, _explain(verify)
            report = json.loads(verify.stdout)
        else:
            report = json.loads((state / name / "verify.json").read_text())
        assert report["passed"] is True
        names = [c["name"] for c in report["checks"]]
        assert "hashkv equal on all members" in names
        tenants = data.get("tenants", [])
        preflights = [n for n in names if n.endswith("preflight as kube-apiserver")]
        assert len(preflights) == sum(len(t["controllers"]) for t in tenants), names
        # Every tenant's Kubernetes API (the CRD API server stand-in here: no k0s binary) did
        # the round trip, and its objects are under its prefix only, not seen by the others.
        passed = {c["name"] for c in report["checks"] if c["ok"] and not c.get("skipped")}
        for t in tenants if shipped in WITH_API else []:
            for check in ("a watch sees the change (ADDED, then MODIFIED)",
                          "the API server sees its own check objects and no other tenant's"):
                assert f"{t['name']}: {check}" in passed, names
            assert any(n.startswith(f"{t['name']}: its API server's objects are only under")
                       for n in passed), names
        if data.get("tls", True):
            assert sum("client with another CA's certificate refused" in n for n in names) == etcd_count
            assert sum("CIS 2.5 peer-client-cert-auth=true" in n for n in names) == etcd_count
            assert all(c["days_left"] > 300 for c in report["certificates"])
        else:
            assert not any("CIS 2." in n for n in names)

        again = run_sandbox(["up", *topo, *api], state, timeout=UP_TIMEOUT)
        assert again.returncode == 0, _explain(again)
        done = re.findall(r"^\s+(\w+) done .*changed=(\d+) failed=(\d+)", again.stdout, re.MULTILINE)
        assert [p for p, _, _ in done] == ["nodes", "site"], again.stdout
        assert [(p, c) for p, c, _ in done if c != "0"] == [], again.stdout
    finally:
        down = run_sandbox(["down", "--purge", *topo], state, timeout=600)
    assert down.returncode == 0, _explain(down)
    assert podman_objects(name) == []
    networks = subprocess.run(["podman", "network", "exists", f"k0sbox-{name}"], check=False)
    assert networks.returncode != 0, f"network k0sbox-{name} left behind"
