"""Each tenant's usage (scripts/sandboxlib/usage.py, through plugins/filter/sandbox_usage.py
for verify and playbooks/tenant-usage.yml): the entries built from the module's results, the
share of the backend quota, and verify's check, which fails a tenant over its max_bytes naming
the tenant, its bytes and its max_bytes. The reads themselves run on a real etcd in
tests/test_sandbox_etcd_prefix.py and in the k0s_tenants scenario."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT, load_plugin
from sandboxlib import report, usage

flt = load_plugin("plugins/filter/sandbox_usage.py")
QUOTA = 2147483648


def _hosts(**results: dict[str, Any]) -> list[dict[str, Any]]:
    """Controllers' host variables: c-<tenant> read its tenant (the module's result), d-<tenant>
    skipped (not the tenant's first controller)."""
    hosts: list[dict[str, Any]] = []
    for tenant, result in results.items():
        hosts.append({"inventory_hostname": f"c-{tenant}", "k0s_tenant": tenant,
                      "k0s_tenant_usage": result})
        hosts.append({"inventory_hostname": f"d-{tenant}", "k0s_tenant": tenant,
                      "k0s_tenant_usage": {"skipped": True, "changed": False}})
    return hosts


def _tenant(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "prefix": name, "key_prefix": f"/{name}/", "controllers": [f"c-{name}"],
            **more}


READ = {"changed": False, "key_count": 21, "bytes": 11527, "revision": 340, "cluster_id": "1a"}


def test_an_entry_per_tenant_with_its_share_of_the_quota() -> None:
    got = flt.sandbox_tenant_usage(_hosts(ta=READ), [_tenant("ta")], QUOTA)
    assert got == [{"name": "ta", "prefix": "/ta/", "controller": "c-ta", "key_count": 21,
                    "bytes": 11527, "revision": 340, "quota_backend_bytes": QUOTA,
                    "quota_share": 11527 / QUOTA, "max_bytes": None, "over_max_bytes": False}]
    check = flt.FilterModule().filters()["sandbox_usage_check"](got[0])
    assert check == {"name": "ta: usage under /ta/", "ok": True,
                     "detail": ("21 keys, 11527 bytes (keys and values) at revision 340, "
                                "0.00054% of the backend quota (2147483648 bytes); no max_bytes")}


@pytest.mark.parametrize(("max_bytes", "over"), [(11527, False), (11526, True), (1, True)])
def test_over_max_bytes_fails_naming_the_tenant_its_bytes_and_its_max(max_bytes: int,
                                                                      over: bool) -> None:
    entry = usage.entries(_hosts(ta=READ), [_tenant("ta", max_bytes=max_bytes)], QUOTA)[0]
    assert entry["over_max_bytes"] is over
    check = usage.check(entry)
    assert check["name"] == "ta: usage under /ta/ within max_bytes"
    assert check["ok"] is not over
    if over:
        assert check["detail"].startswith(
            f"tenant ta holds 11527 bytes under /ta/ (21 keys), over its max_bytes {max_bytes}; "
            "delete objects or raise max_bytes (its write budget too: the sandbox's etcd build "
            "refuses its writes past it, counting every revision not yet compacted; another "
            "build enforces nothing, etcd-io/etcd#10084)")
        assert usage.line(entry).endswith(f"OVER its max_bytes {max_bytes}")
    else:
        assert check["detail"].endswith("within its max_bytes 11527")


def test_a_max_bytes_that_is_no_positive_int_fails_the_check_naming_the_field() -> None:
    """A hand-written inventory that skipped validate.yml: verify says what is wrong."""
    entry = usage.entries(_hosts(ta=READ), [_tenant("ta", max_bytes="10MB")], QUOTA)[0]
    assert entry["over_max_bytes"] is False
    assert usage.line(entry).endswith("; k0s_tenants (ta).max_bytes: '10MB' is not a positive "
                                      "integer; give the tenant's write budget, the most bytes "
                                      "its prefix and leases may take in etcd, e.g. max_bytes: "
                                      "104857600, or leave it out")
    assert usage.check(entry) == {
        "name": "ta: usage under /ta/ within max_bytes", "ok": False,
        "detail": ("k0s_tenants (ta).max_bytes: '10MB' is not a positive integer; give the "
                   "tenant's write budget, the most bytes its prefix and leases may take in etcd, "
                   "e.g. max_bytes: 104857600, or leave it out")}


def test_a_failed_or_missing_read_is_a_failed_check() -> None:
    failed = {"changed": False, "msg": "usage /tb/: etcdctl 'get': permission denied"}
    got = usage.entries(_hosts(tb=failed), [_tenant("tb"), _tenant("tc")], QUOTA)
    assert [e["error"] for e in got] == [
        "usage /tb/: etcdctl 'get': permission denied",
        "not read: no controller of the tenant answered"]
    checks = [usage.check(e) for e in got]
    assert [c["ok"] for c in checks] == [False, False]
    assert checks[0]["detail"] == "could not be read: usage /tb/: etcdctl 'get': permission denied"
    assert "key_count" not in got[0] and "over_max_bytes" not in got[0]


def test_the_quota_the_members_run_with_else_the_etcd_role_s() -> None:
    role_default = yaml.safe_load(
        (REPO_ROOT / "roles/etcd/defaults/main.yml").read_text())["etcd_quota_backend_bytes"]
    settings = ["ETCD_NAME=e1", "ETCD_QUOTA_BACKEND_BYTES=16777216", "/usr/bin/etcd"]
    assert flt.sandbox_quota_bytes(settings) == 16777216
    assert flt.sandbox_quota_bytes(['ETCD_QUOTA_BACKEND_BYTES="4294967296"']) == 4294967296
    assert flt.sandbox_quota_bytes([], 8589934592) == 8589934592
    assert flt.sandbox_quota_bytes([]) == role_default
    assert flt.sandbox_quota_bytes(["ETCD_QUOTA_BACKEND_BYTES=0"], "{{ x }}") == role_default
    assert usage.entries([], [_tenant("ta")], None)[0]["quota_backend_bytes"] == role_default


def test_the_quota_is_decided_in_one_place_etcd_s_metric_first() -> None:
    """usage.quota: status (etcd's /metrics), verify (the member's settings) and tenant-usage
    (the inventory) all ask it; the best source given wins, a zero or unreadable one is passed."""
    settings = ["ETCD_QUOTA_BACKEND_BYTES=16777216"]
    assert usage.quota(metric=33554432.0, settings=settings, configured=8) == 33554432
    assert usage.quota(metric=0, settings=settings, configured=8) == 16777216
    assert usage.quota(metric="n/a", settings=[], configured=8589934592) == 8589934592
    assert usage.quota(metric=None, settings=["ETCD_QUOTA_BACKEND_BYTES=-1"],
                       configured=None) == usage.role_quota()
    assert flt.sandbox_quota_bytes(settings, 8) == usage.quota(settings=settings, configured=8)


def test_status_shows_a_usage_row_per_tenant(tmp_path: Any) -> None:
    from conftest import base_topology
    from sandboxlib import topology

    topo = topology.parse(base_topology(), tmp_path / "t.yml")
    st = report.Status(topo=topo, backend="podman")
    st.usage = usage.entries(_hosts(ta=READ), [_tenant("ta", max_bytes=10000)], QUOTA)
    lines = "\n".join(report.usage_lines(st)).splitlines()
    assert lines[0].split() == ["TENANT", "KEYS", "BYTES", "OF", "QUOTA", "(2.1", "GB)",
                                "MAX_BYTES", "WRITE", "BUDGET"]
    assert lines[1].split() == ["ta", "21", "11.5", "kB", "0.00054%", "10.0", "kB", "(OVER)", "-"]
    assert "the sandbox's etcd build refuses the tenant's writes alone past it" in lines[-1]
    # the members' figures (etcd_k0sbox_tenant_*): used of budget, or over it, or not enforced
    st.usage[0]["write_budget"] = {"budget": 4194304, "enforced": True, "used": 4123456,
                                   "over": True, "refused": 12}
    lines = "\n".join(report.usage_lines(st)).splitlines()
    assert lines[1].endswith("4.1 MB of 4.2 MB OVER: WRITES REFUSED")
    assert any("ta: OVER its write budget: its writes are refused" in ln and "12 so far" in ln for ln in lines)
    st.usage[0]["write_budget"] = {**st.usage[0]["write_budget"], "enforced": False, "over": False}
    assert "4.2 MB NOT ENFORCED" in "\n".join(report.usage_lines(st))
    st.usage, st.usage_note = [], "no controller is running"
    assert report.usage_lines(st) == ["usage: unknown (no controller is running)"]


def test_up_shows_the_usage_its_checks_read(tmp_path: Any) -> None:
    """``up`` ends with status, which takes each tenant's usage from the report its checks
    wrote in this run (up.yml's quick check; verify through Vagrant's site.yml) instead of
    reading it again; an older report is not used."""
    import json
    import os

    path = tmp_path / "verify.json"
    entries = usage.entries(_hosts(ta=READ), [_tenant("ta")], QUOTA)
    path.write_text(json.dumps({"passed": True, "checks": [], "tenants": entries}))
    written = path.stat().st_mtime
    assert usage.from_report(path, written - 1) == (entries, "")
    os.utime(path, (written - 100, written - 100))
    assert usage.from_report(path, written) == (
        [], "no report of this run's checks: scripts/sandbox status reads it")
    assert usage.from_report(tmp_path / "none.json", 0)[0] == []


def test_an_interrupted_restore_is_shown_by_status_and_fails_verify(tmp_path: Any,
                                                                   monkeypatch: Any) -> None:
    """The in-progress marker an interrupted tenant restore leaves under the prefix (its
    module returns it with usage; the module on a real etcd in tests/test_sandbox_etcd_prefix.py)
    makes the tenant's usage check fail and status name it, each with the command that
    finishes the job, the copy's path as typed from the project root."""
    from conftest import base_topology
    from sandboxlib import topology

    monkeypatch.chdir(REPO_ROOT)
    marker = {"tenant": "ta", "as": "tc", "file": str(REPO_ROOT / ".sandbox/x/backups/ta-1.tenant"),
              "copy": "ta-1.tenant", "copy_revision": 300, "committed": 2, "transactions": 5,
              "started": "2026-12-03T08:00:00Z"}
    entries = usage.entries(_hosts(tc={**READ, "restore": marker}, ta=READ),
                            [_tenant("ta"), _tenant("tc")], QUOTA)
    ta, tc = entries
    assert "restore" not in ta and usage.check(ta)["ok"]
    finish = "scripts/sandbox restore --tenant ta .sandbox/x/backups/ta-1.tenant --as tc"
    check = usage.check(tc)
    assert not check["ok"]
    assert check["detail"] == (
        "tenant tc: RESTORE INTERRUPTED: /tc/ mixes old keys and keys of ta-1.tenant (revision "
        "300), 2 of 5 transactions committed (started 2026-12-03T08:00:00Z); its API servers "
        f"stay stopped; finish it: {finish}")
    assert usage.line(tc).startswith("tc (/tc/): 21 keys; RESTORE INTERRUPTED")

    st = report.Status(topo=topology.parse(base_topology(), tmp_path / "t.yml"), backend="podman")
    st.usage = entries
    lines = "\n".join(report.usage_lines(st)).splitlines()
    assert lines[2].split()[:3] == ["tc", "(RESTORE", "INTERRUPTED)"]
    assert any(x.startswith("usage: tc: RESTORE INTERRUPTED") and x.endswith(finish) for x in lines)
    # a copy outside the project keeps its absolute path
    assert usage.finish_command({"tenant": "ta", "file": "/srv/ta.tenant"}) == \
        "scripts/sandbox restore --tenant ta /srv/ta.tenant"


def test_up_names_its_quick_check_and_where_the_full_report_is(tmp_path: Any) -> None:
    """The report of this run's checks: ready.json (the quick check) before verify.json
    (Vagrant's site.yml), only when written since the run began; its one line says what
    passed, what was skipped and that scripts/sandbox verify gives the full report."""
    import json
    import os

    ready, verify = tmp_path / "ready.json", tmp_path / "verify.json"
    checks = [{"name": "etcd: every member healthy (3)", "ok": True, "detail": "healthy"},
              {"name": "t: the CRD API server (stand-in, not k0s) ready", "ok": True},
              {"name": "t: Kubernetes API", "ok": True, "skipped": True,
               "detail": "SKIPPED: neither k0s nor the CRD API server stand-in runs here"}]
    verify.write_text(json.dumps({"scope": "full", "passed": True, "checks": checks[:2]}))
    since = verify.stat().st_mtime
    assert report.run_report(tmp_path, since) == verify
    assert report.checked_line(verify) == (
        "sandbox: verify passed (2 checks); again: scripts/sandbox verify")
    ready.write_text(json.dumps({"scope": "ready", "passed": True, "checks": checks}))
    assert report.run_report(tmp_path, since) == ready
    line = report.checked_line(ready)
    assert line.startswith("sandbox: quick check passed (2 checks: every etcd member healthy")
    assert "1 skipped: SKIPPED: neither k0s nor" in line
    assert line.endswith("the full report (TLS refusals, CIS, key modes, watches, "
                         "compaction): scripts/sandbox verify")
    os.utime(ready, (since - 100, since - 100))
    os.utime(verify, (since - 100, since - 100))
    assert report.run_report(tmp_path, since) == ready          # neither new: ready.json
    assert "no report of this run's checks" in report.checked_line(tmp_path / "none.json")
