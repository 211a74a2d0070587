"""A hostile tenant on a whole sandbox, as issues 41 and 55 type it (docs/security.md):

    scripts/sandbox up -t multi-tenant --set etcd_quota_backend_bytes=33554432
    scripts/sandbox attack --tenant tenant-a --nospace
    scripts/sandbox attack --tenant tenant-a --flood
    scripts/sandbox status; scripts/sandbox verify; scripts/sandbox defrag --compact

on a copy of the multi-tenant topology with its own name and subnet (podman nodes, the etcd the
sandbox installs: its patched build of Debian's 3.5.30; the CRD API server stand-in, not k0s, on
both tenants; etcd's own compaction hourly, so that only the operator's compacts here). tenant-b
first gets a CRD and an object through its own API. Then tenant-a, with only its own
certificate on its controller, tries every attempt of the suite, fills its own prefix until its
write budget (a quarter of the 32 MiB quota shared by the two tenants) stops it -- no alarm --,
tries every way of writing once more (each refused, deletes allowed), and, once the admin raised
NOSPACE, everything again: none may succeed; auth stays on; tenant-b keeps every key and
revision; after the recovery the cluster is healthy with no alarm. Then tenant-a floods its
prefix by every means for 45 s while tenant-b writes in etcd and through its API server: every
one of tenant-b's writes succeeds, the database stays under the quota with no alarm, tenant-a is
stopped by its budget alone; `status` and `verify` say so and tenant-a's own API refuses its
writes naming the budget; `defrag --compact` (its flood deleted by the attack's finish) lets it
write again, and `verify` passes. `status` names the build and `verify` every member's build
free of known advisories.

The same suite on Debian's unpatched 3.5.30-2 is caught (tests/test_hostile_tenant.py, on a
real etcd on loopback); the flood on loopback: tests/test_flood.py.
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
        up = run_sandbox(["up", *topo, "--set", "etcd_quota_backend_bytes=33554432",
                          "--set", "etcd_auto_compaction_retention=1h"], state, timeout=UP_TIMEOUT)
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
        assert result["fill"]["stopped_by"] == "budget" and result["admin_fill"]["raised"], result
        phases = {p["phase"]: p["attempts"] for p in result["phases"]}
        assert sorted(phases) == ["normal", "nospace", "over its budget"]
        over = {a["name"]: a["outcome"] for a in phases.pop("over its budget")}
        assert over["a put nested in a transaction"] == over["grant a lease"] == "refused", over
        assert over["delete one of its own keys"] == "allowed", over
        for phase, attempts in phases.items():
            outcomes = {a["name"]: a["outcome"] for a in attempts}
            assert [n for n, o in outcomes.items() if o in ("succeeded", "error")] == [], phase
            for attempt in ("delete another tenant's whole prefix", "grant itself root",
                            "disable auth", "revoke another tenant's lease (a key attached)",
                            "watch every key from its own key on (GHSA-xg4h-6gfc-h4m8)",
                            "its certificate on a member's peer port",
                            "attach its key to another tenant's own lease with no key",
                            "keep another tenant's own lease with no key alive",
                            "revoke another tenant's own lease with no key",
                            "grant a lease with the ID the server gives another tenant next (its own choice)"):
                assert outcomes[attempt] == "refused", (phase, attempt, outcomes[attempt])
        assert phases["nospace"] and {a["name"]: a["outcome"] for a in phases["nospace"]}[
            "disarm the alarms"] == "refused"
        finish = report["finish"]
        assert finish["auth"] == "on" and finish["changed"] == {}, finish
        assert finish["kept"]["tenant-b"] >= 2, finish   # its CRD and its object, unchanged
        assert finish["healthy"] and finish["alarms"] == "", finish
        assert any("defragmented" in r for r in finish["recovered"]), finish

        # the flood: tenant-a by every means, tenant-b writing in etcd and through its API
        flood = run_sandbox(["attack", *topo, "--tenant", "tenant-a", "--flood",
                             "--flood-seconds", "45"], state, timeout=900)
        assert flood.returncode == 0, explain(flood)
        report = json.loads((state / name / "attack.json").read_text())
        checks = {c["name"]: c for c in report["checks"]}
        flood_checks = [c for n, c in checks.items() if n.startswith("the flood")]
        assert len(flood_checks) == 3 and all(c["ok"] for c in flood_checks), flood_checks
        print("\n".join(f"{c['name']}: {c['detail']}" for c in flood_checks))   # the closing note's figures
        victims = [p for p in report["flood"] if p["op"] == "victim"]
        writers = {w["writer"]: w for v in victims for w in v["writers"]}
        assert set(writers) == {"etcd, with its certificate", "its Kubernetes API server"}, victims
        assert all(w["failed"] == 0 and w["during_flood"]["writes"] > 10 for w in writers.values()), writers

        # tenant-a stays over its budget: status and verify say so, its API names the budget
        status = run_sandbox(["status", *topo], state, timeout=120)
        assert status.returncode == 0, explain(status)
        assert ("etcd build: 3.5.30 (the sandbox's build, patched: etcd-io/etcd#22386, "
                "GHSA-xg4h-6gfc-h4m8, GHSA-6vch-q96h-7gc3, etcd-io/etcd#22167, etcd-io/etcd#22128, "
                "k0sbox-lease-owners, etcd-io/etcd#10084): no known advisory") in status.stdout, \
            status.stdout
        assert "OVER: WRITES REFUSED" in status.stdout and "tenant-a: OVER its write budget" in status.stdout, \
            status.stdout
        refused = run_sandbox(["kubectl", *topo, "--tenant", "tenant-a", "apply", "-f",
                               "docs/examples/crd.yaml"], state, timeout=120)
        assert refused.returncode != 0 and "tenant write budget exceeded" in refused.stdout + refused.stderr, \
            explain(refused)
        verify = run_sandbox(["verify", "--json", *topo], state, timeout=UP_TIMEOUT)
        assert verify.returncode != 0, explain(verify)
        failed = [c for c in json.loads(verify.stdout)["checks"] if not c["ok"]]
        assert failed and all("tenant-a" in c["name"] for c in failed), failed
        assert any("is OVER its write budget" in c["detail"] for c in failed), failed

        # one operator command: compaction (and defragmentation) gives tenant-a its budget back
        defrag = run_sandbox(["defrag", *topo, "--compact"], state, timeout=600)
        assert defrag.returncode == 0, explain(defrag)
        again = run_sandbox(["kubectl", *topo, "--tenant", "tenant-a", "apply", "-f",
                             "docs/examples/crd.yaml"], state, timeout=120)
        assert again.returncode == 0, explain(again)

        verify = run_sandbox(["verify", "--json", *topo], state, timeout=UP_TIMEOUT)
        assert verify.returncode == 0, explain(verify)
        checks = json.loads(verify.stdout)["checks"]
        budgets = [c for c in checks if "write budget" in c["name"]]
        assert len(budgets) == 2 and all(c["ok"] for c in budgets), budgets
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
