"""A hostile tenant on a whole sandbox, as issue 41's "done when" types it (docs/security.md):

    scripts/sandbox up -t multi-tenant --set etcd_quota_backend_bytes=8388608
    scripts/sandbox attack --tenant tenant-a --nospace

on a copy of the multi-tenant topology with its own name and subnet (podman nodes, the etcd the
sandbox installs: its patched build of Debian's 3.5.30; the CRD API server stand-in, not k0s, on
both tenants). tenant-b first gets a CRD and an object through its own API. Then tenant-a,
with only its own certificate on its controller, tries every attempt of the suite, fills the
8 MiB quota through its own prefix until etcd raises NOSPACE and tries everything again: none
may succeed; auth stays on; tenant-b keeps every key and revision; after the recovery the
cluster is healthy with no alarm. `status` names the build, and `verify` passes with each
tenant's attempts ("0 succeeded") and every member's build free of known advisories.

The same suite on Debian's unpatched 3.5.30-2 is caught (tests/test_hostile_tenant.py, on a
real etcd on loopback).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import explain, podman_objects, podman_usable, run_sandbox, shipped_copy

UP_TIMEOUT = 1800


@pytest.mark.e2e
def test_a_hostile_tenant_gets_nowhere(tmp_path: Path) -> None:
    reason = podman_usable()
    if reason:
        pytest.skip(f"whole-sandbox test needs podman: {reason}")
    name, path, _ = shipped_copy("multi-tenant", tmp_path, release_fails=True)
    state = tmp_path / "state"
    topo = ["--topology", str(path)]
    try:
        up = run_sandbox(["up", *topo, "--set", "etcd_quota_backend_bytes=8388608"], state,
                         timeout=UP_TIMEOUT)
        assert up.returncode == 0, explain(up)
        assert "etcd packages done" in up.stdout and "patched: etcd-io/etcd#22386" in up.stdout, \
            up.stdout
        assert "WARNING: etcd 3.5.30" not in up.stdout   # no advisory against the build
        for args in (["apply", "-f", "docs/examples/crd.yaml"],
                     ["wait", "--for=jsonpath={.status.conditions[?(@.type==\"Established\")].status}=True",
                      "crd/widgets.example.sandbox"],
                     ["apply", "-f", "docs/examples/widget.yaml"]):
            res = run_sandbox(["kubectl", *topo, "--tenant", "tenant-b", *args], state, timeout=120)
            assert res.returncode == 0, explain(res)

        attack = run_sandbox(["attack", *topo, "--tenant", "tenant-a", "--nospace"], state,
                             timeout=600)
        assert attack.returncode == 0, explain(attack)
        assert "every attempt refused" in attack.stdout, attack.stdout
        report = json.loads((state / name / "attack.json").read_text())
        assert report["passed"] is True and report["nospace"] is True
        [result] = report["attacks"]
        assert result["tenant"] == "tenant-a" and result["fill"]["ok"], result.get("fill")
        phases = {p["phase"]: p["attempts"] for p in result["phases"]}
        assert sorted(phases) == ["normal", "nospace"]
        for phase, attempts in phases.items():
            outcomes = {a["name"]: a["outcome"] for a in attempts}
            assert [n for n, o in outcomes.items() if o in ("succeeded", "error")] == [], phase
            for attempt in ("delete another tenant's whole prefix", "grant itself root",
                            "disable auth", "revoke another tenant's lease (a key attached)",
                            "watch every key from its own key on (GHSA-xg4h-6gfc-h4m8)",
                            "its certificate on a member's peer port"):
                assert outcomes[attempt] == "refused", (phase, attempt, outcomes[attempt])
        assert phases["nospace"] and {a["name"]: a["outcome"] for a in phases["nospace"]}[
            "disarm the alarms"] == "refused"
        finish = report["finish"]
        assert finish["auth"] == "on" and finish["changed"] == {}, finish
        assert finish["kept"]["tenant-b"] >= 2, finish   # its CRD and its object, unchanged
        assert finish["healthy"] and finish["alarms"] == "", finish
        assert any("defragmented" in r for r in finish["recovered"]), finish

        status = run_sandbox(["status", *topo], state, timeout=120)
        assert status.returncode == 0, explain(status)
        assert ("etcd build: 3.5.30 (the sandbox's build, patched: etcd-io/etcd#22386, "
                "GHSA-xg4h-6gfc-h4m8, GHSA-6vch-q96h-7gc3): no known advisory") in status.stdout, \
            status.stdout

        verify = run_sandbox(["verify", "--json", *topo], state, timeout=UP_TIMEOUT)
        assert verify.returncode == 0, explain(verify)
        checks = json.loads(verify.stdout)["checks"]
        attacks = [c for c in checks if "a hostile tenant's attempts" in c["name"]]
        assert [c["name"].split(":")[0] for c in attacks] == ["tenant-a", "tenant-b"], attacks
        assert all(c["ok"] and not c.get("skipped") and " 0 succeeded" in c["detail"]
                   for c in attacks), attacks
        builds = [c for c in checks if "known advisories" in c["name"]]
        assert len(builds) == 3 and all(c["ok"] and "no known advisory" in c["detail"]
                                        for c in builds), builds
    finally:
        down = run_sandbox(["down", *topo], state, timeout=300)
        assert down.returncode == 0, explain(down)
        assert podman_objects(name) == []
