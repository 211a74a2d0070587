"""verify's compaction checks, made of what roles/sandbox_verify/files/verify_compaction.py
read on the nodes (roles/sandbox_verify/tasks/compaction.yml).

The etcd keyspace is shared by every tenant. The members compact it themselves (etcd's
--auto-compaction-mode/--auto-compaction-retention); the tenants' API servers do not
(--etcd-compaction-interval=0 through k0s's spec.api.extraArgs): on etcd 3.5+ with RBAC only
root may compact, and a tenant's compactor would log "compact failed: etcdserver:
permission denied" every 5 minutes. Nothing here waits for a round: a cluster too young for
its first compaction is SKIPPED with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# etcd 3.5 compacts by revision every 5 minutes (v3compactor revision.go revInterval).
REVISION_MODE_INTERVAL_S = 300


def etcd_retention_s(mode: str, retention: str) -> float:
    """The periodic retention in seconds (etcd: a bare number is hours, else a Go duration)."""
    text = str(retention).strip()
    if mode != "periodic" or not text:
        return 0.0
    if re.fullmatch(r"[0-9]+", text):
        return float(text) * 3600
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "ns": 1e-9}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", text))


def sandbox_compaction_check(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One check for the cluster from every member's report (host -> report): the leader's
    compactor logs its rounds, so the members are read together."""
    name = "etcd compacts the shared keyspace itself (auto-compaction)"
    running = {h: r for h, r in reports.items() if r.get("active")}
    if not running:
        return {"name": name, "ok": False, "detail": "no member's etcd is running"}
    first = next(iter(running.values()))
    mode, retention = str(first.get("mode") or ""), str(first.get("retention") or "")
    setting = f"{mode or 'off'}, retention {retention or '-'}"
    revisions = {h: r.get("compact_revision") for h, r in running.items()}
    shown = ", ".join(f"{h} {v}" for h, v in sorted(revisions.items()))
    failed = [(h, r) for h, r in running.items() if r.get("failed_count")]
    if not mode:
        return {"name": name, "ok": True, "skipped": True,
                "detail": "SKIPPED: etcd's auto-compaction is off (etcd_auto_compaction_mode: "
                          "\"\"): only a client's Compact shrinks the history"}
    if failed:
        host, rep = failed[0]
        return {"name": name, "ok": False,
                "detail": f"{sum(r['failed_count'] for _host, r in failed)} failed auto compaction(s) "
                          f"({setting}); {host}: {(rep.get('failed') or [''])[-1]}"}
    done = sorted(rev for r in running.values() for rev in r.get("completed") or [])
    if done:
        return {"name": name, "ok": True,
                "detail": f"{len(done)} auto compaction(s) since the members started ({setting}), "
                          f"the last at revision {done[-1]}; compaction revision per member: {shown}"}
    # The leader's compactor starts when it becomes leader: the youngest member bounds it.
    young = min(int(r.get("up_s") or 0) for r in running.values())
    due = (etcd_retention_s(mode, retention) * 1.1 + 15 if mode == "periodic"
           else REVISION_MODE_INTERVAL_S + 15)
    if young < due:
        return {"name": name, "ok": True, "skipped": True,
                "detail": f"SKIPPED: no auto compaction due yet ({setting}): a member started "
                          f"{young}s ago, the first round comes after about {due:.0f}s; "
                          f"compaction revision per member: {shown}"}
    if mode == "revision":
        return {"name": name, "ok": True, "skipped": True,
                "detail": f"SKIPPED: no revision-mode compaction yet ({setting}): the revision "
                          f"has not passed the retention; compaction revision per member: {shown}"}
    return {"name": name, "ok": False,
            "detail": f"no auto compaction in {young}s ({setting}: the first is due after about "
                      f"{due:.0f}s); compaction revision per member: {shown}"}


def sandbox_apiserver_compaction_check(report: Mapping[str, Any], host: str,
                                       tenant: str) -> dict[str, Any]:
    """A controller's API server leaves compaction to etcd and logged no compaction error."""
    name = f"{host} ({tenant}): its API server logs no compaction error (compaction left to etcd)"
    unit = str(report.get("unit") or "")
    if not unit:
        return {"name": name, "ok": True, "skipped": True,
                "detail": "SKIPPED: no API server runs here (neither k0s nor the CRD API server "
                          "stand-in)"}
    interval = str(report.get("interval") or "")
    errors = int(report.get("error_count") or 0)
    what = ("--etcd-compaction-interval=0: it does not compact" if interval == "0" else
            f"--etcd-compaction-interval={interval or '5m (default)'}: it compacts the whole "
            "shared keyspace (on etcd 3.5+ with RBAC only root may)")
    if errors:
        return {"name": name, "ok": False,
                "detail": f"{errors} compaction error(s) in the journal of {unit} since it "
                          f"started ({what}): {(report.get('errors') or [''])[-1]}"}
    return {"name": name, "ok": True,
            "detail": f"{what}; no 'compact failed' in the journal of {unit} "
                      f"(up {report.get('up_s')}s)"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_compaction_check": sandbox_compaction_check,
                "sandbox_apiserver_compaction_check": sandbox_apiserver_compaction_check}
