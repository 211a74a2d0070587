"""What the sandbox looks like now: nodes, etcd health, TLS, tenants and k0s state.

Used by ``scripts/sandbox status`` and at the end of ``scripts/sandbox up``. Everything here
is read-only and quick; it works when nothing is up (every node "not created").

etcd's health is asked of every member directly, on its plain-HTTP metrics listener
(``GET http://<member>:2381/health``, roles/etcd's ``etcd_metrics_port``, etcdhttp.py: no
certificate, no SSH, and a stopped member shows as such while the others still answer). Where no member
answers there (the listener switched off with ``etcd_metrics_port: 0``, or the control node
cannot reach the nodes' addresses) it falls back to ``etcdctl endpoint health --cluster`` on
one member over SSH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import etcdbuild, etcdhttp, remote, usage
from . import sandbox_budgets as budget_rules
from .apiserver import API_PROBE
from .topology import REPO_ROOT, Topology

HEALTH_RE = re.compile(r"^(\S+) is (healthy|unhealthy)", re.MULTILINE)
ETCD_PROBE = ("command -v etcdctl >/dev/null 2>&1 || { echo 'etcdctl: not installed'; exit 3; }; "
              "etcdctl endpoint health --cluster 2>&1")


@dataclass
class Status:
    topo: Topology
    backend: str
    node_state: dict[str, str] = field(default_factory=dict)   # node -> running/exited/...
    network: str = ""                                          # podman network state
    etcd_health: dict[str, str] = field(default_factory=dict)  # node -> healthy/unhealthy
    etcd_note: str = ""                                        # why health is unknown
    etcd_source: str = ""                                      # where health was read
    api_state: dict[str, str] = field(default_factory=dict)    # controller -> Kubernetes API
    etcd_db: dict[str, str] = field(default_factory=dict)      # member -> "size of quota"
    quota: int = 0                                             # backend quota (/metrics)
    usage: list[dict[str, Any]] = field(default_factory=list)  # per tenant (usage.entries)
    usage_note: str = ""                                       # why usage is unknown
    etcd_build: str = ""                                       # version, patches, advisories

    @property
    def running(self) -> list[str]:
        return [n for n, s in self.node_state.items() if s == "running"]


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        try:
            return str(path.resolve().relative_to(REPO_ROOT))
        except ValueError:
            return str(path)


def _podman_states(topo: Topology) -> tuple[dict[str, str], str]:
    podman = shutil.which("podman")
    if podman is None:
        return {n.name: "podman missing" for n in topo.nodes}, "podman missing"
    res = subprocess.run([podman, "ps", "-a", "--format", "json", "--filter",
                          f"label=k0s-etcd-sandbox={topo.name}"],
                         capture_output=True, text=True, check=False)
    by_container: dict[str, str] = {}
    if res.returncode == 0 and res.stdout.strip():
        for c in json.loads(res.stdout):
            for name in c.get("Names") or []:
                by_container[name] = str(c.get("State", "?"))
    states = {n.name: by_container.get(topo.container_name(n), "not created")
              for n in topo.nodes}
    net = subprocess.run([podman, "network", "exists", topo.network_name()],
                         capture_output=True, check=False)
    return states, "present" if net.returncode == 0 else "absent"


def _vagrant_states(topo: Topology) -> dict[str, str]:
    if shutil.which("vagrant") is None:
        return {n.name: "vagrant missing" for n in topo.nodes}
    import vagrant  # python-vagrant, needed only for this backend

    env = dict(os.environ, SANDBOX_TOPOLOGY=str(topo.path))
    try:
        found = {s.name: s.state for s in vagrant.Vagrant(root=str(REPO_ROOT), env=env,
                                                          quiet_stderr=True).status()}
    except subprocess.CalledProcessError:
        found = {}
    return {n.name: ("running" if found.get(n.name) == "running"
                     else str(found.get(n.name, "unknown"))) for n in topo.nodes}


def report_name(kind: str, cluster: str = "") -> str:
    """ready.json or verify.json; one etcd cluster's of several: ready-<cluster>.json
    (roles/sandbox_verify/vars/report.yml)."""
    return f"{kind}-{cluster}.json" if cluster else f"{kind}.json"


def run_report(state_dir: Path, since: float, cluster: str = "") -> Path:
    """The checks' report ``up`` wrote since ``since``: its quick check's (ready.json, podman)
    or, through Vagrant's site.yml, verify's (verify.json); ready.json when neither is new."""
    for kind in ("ready", "verify"):
        path = state_dir / report_name(kind, cluster)
        if path.is_file() and path.stat().st_mtime >= since:
            return path
    return state_dir / report_name("ready", cluster)


def checked_line(path: Path) -> str:
    """What ``up``'s checks found, in one line, and where the full report is."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"sandbox: no report of this run's checks ({display_path(path)})"
    checks = data.get("checks") or []
    passed = sum(1 for c in checks if c.get("ok") and not c.get("skipped"))
    skipped = [c.get("detail", "") for c in checks if c.get("skipped")]
    also = f"; {len(skipped)} skipped: {skipped[0]}" if skipped else ""
    if data.get("scope") != "ready":
        return f"sandbox: verify passed ({passed} checks{also}); again: scripts/sandbox verify"
    return (f"sandbox: quick check passed ({passed} checks: every etcd member healthy, each "
            f"tenant's Kubernetes API ready, a write and a read through it{also}); the full "
            "report (TLS refusals, CIS, key modes, watches, compaction): scripts/sandbox verify")


def collect(topo: Topology, backend: str, verified_since: float | None = None) -> Status:
    """What the sandbox looks like now. ``verified_since`` (``up``): each tenant's usage as the
    report of the run's checks written since then holds it (up's quick check, or verify
    through Vagrant's site.yml, read it), not read again."""
    st = Status(topo=topo, backend=backend)
    if backend == "podman":
        st.node_state, st.network = _podman_states(topo)
    else:
        st.node_state = _vagrant_states(topo)
    targets = remote.targets(topo, backend)
    members = [n.name for n in topo.group("etcd") if n.name in st.running]
    ctrls = [n.name for n in topo.group("k0s_controller") if n.name in st.running]
    by_http = etcdhttp.metrics_health(topo, backend, members)
    figures = etcdhttp.ask_members(etcdhttp.http_metrics, topo, backend, members)
    st.etcd_db = {m: db_text(v) for m, v in figures.items() if db_text(v)}
    st.quota = int(max((v.get(etcdhttp.DB_METRICS[1], 0) for v in figures.values()), default=0))
    if any(by_http.values()):
        st.etcd_health = {m: h or "unhealthy (no answer)" for m, h in by_http.items()}
        ports = sorted({etcdhttp.metrics_port(topo, topo.node(m)) for m in members})
        st.etcd_source = f"/health on port {','.join(map(str, ports))}"
        members_ssh: list[str] = []
    else:
        members_ssh = members[:1]
    jobs = [(targets[m], ETCD_PROBE) for m in members_ssh]
    jobs += [(targets[c], API_PROBE) for c in ctrls]
    jobs += [(targets[m], etcdbuild.VERSION_PROBE) for m in members[:1]]
    results = remote.run_many(jobs, timeout=25)
    if members:
        st.etcd_build = etcdbuild.build_summary(results.pop().stdout, topo)
    if not members:
        st.etcd_note = "no etcd member is running"
    elif members_ssh:
        st.etcd_source = f"etcdctl endpoint health --cluster on {members[0]}"
        res = results[0]
        addr_to_node = {targets[n.name].host: n.name for n in topo.group("etcd")}
        for endpoint, health in HEALTH_RE.findall(res.stdout + res.stderr):
            host = re.sub(r"^\w+://", "", endpoint).rsplit(":", 1)[0]
            st.etcd_health[addr_to_node.get(host, host)] = health
        if not st.etcd_health:
            out = " ".join((res.stdout + res.stderr).split())
            st.etcd_note = (out[:160] if res.returncode != 255
                            else f"{members[0]} not reachable over SSH")
    for ctrl, res in zip(ctrls, results[len(members_ssh):], strict=True):
        out = res.stdout.strip() or res.stderr.strip()
        st.api_state[ctrl] = out if res.returncode == 0 else f"unknown ({out[:80]})"
    if topo.tenants and members:
        # Each etcd cluster's tenants through its view (one view: the topology itself).
        st.usage, st.usage_note = [], ""
        for view in topo.views():
            in_view = {n.name for n in view.nodes}
            mine = [c for c in ctrls if c in in_view]
            got, note = (usage.from_report(run_report(topo.state_dir, verified_since,
                                                      view.cluster), verified_since)
                         if verified_since else usage.read(view, backend, mine))
            st.usage += got
            st.usage_note = st.usage_note or note
        for e in st.usage:   # the quota etcd reports, else the one the entry has (usage.quota)
            e["quota_backend_bytes"] = usage.quota(metric=st.quota, configured=e["quota_backend_bytes"])
            if "bytes" in e:
                e["quota_share"] = e["bytes"] / e["quota_backend_bytes"]
        _budgets(st, members)
    return st


def _budgets(st: Status, members: list[str]) -> None:
    """Each tenant's write budget as every running member of its cluster enforces it (their
    /metrics), on its usage entry as ``write_budget`` (sandbox_budgets.usage_fields); nothing
    without etcd RBAC, where no budget applies."""
    topo = st.topo
    if not (topo.tls and topo.vars.get("etcd_rbac", len(topo.tenants) > 1 or topo.multi_cluster)):
        return
    for view in topo.views():
        mine = [m for m in members if m in {n.name for n in view.nodes}]
        got = etcdhttp.ask_members(etcdhttp.http_budgets, topo, st.backend, mine)
        answered = {m: v for m, v in got.items() if v is not None}
        quota: Any = st.quota or topo.vars.get("etcd_quota_backend_bytes")   # what they run with
        extra = topo.vars.get("etcd_extra_settings")
        if not st.quota and isinstance(extra, dict) and extra.get("quota-backend-bytes") is not None:
            quota = extra["quota-backend-bytes"]
        wanted = budget_rules.budgets(
            [{"name": t.name, "key_prefix": t.normalized_prefix,
              **({"max_bytes": t.max_bytes} if t.max_bytes is not None else {})}
             for t in view.tenants],
            usage.role_quota(quota),
            topo.vars.get("etcd_tenant_budget_share", budget_rules.DEFAULT_SHARE))
        fields = budget_rules.usage_fields(wanted, answered) if answered else {}
        for e in st.usage:
            if e.get("name") in fields:
                e["write_budget"] = fields[e["name"]]


def size(n: float) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def db_text(values: dict[str, float]) -> str:
    """"1.2 MB of 2.1 GB" (database size of quota), '' without the size."""
    if etcdhttp.DB_METRICS[0] not in values:
        return ""
    quota = values.get(etcdhttp.DB_METRICS[1])
    return size(values[etcdhttp.DB_METRICS[0]]) + (f" of {size(quota)}" if quota else "")


def http_db(host: str, port: int, timeout: float = 3.0) -> str:
    """The member's database size and backend quota ("1.2 MB of 2.1 GB"), '' when nothing
    answers."""
    return db_text(etcdhttp.http_metrics(host, port, timeout))


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    lines = [indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False))
             for r in [headers, *rows]]
    return "\n".join(line.rstrip() for line in lines)


def verify_table(report_path: Path) -> str:
    """The PASS/FAIL/SKIP table of a verify report (verify.json)."""
    try:
        data = json.loads(report_path.read_text())
    except (OSError, ValueError):
        return f"(no readable report at {display_path(report_path)})"
    rows = []
    for c in data.get("checks", []):
        word = "SKIP" if c.get("skipped") else ("PASS" if c.get("ok") else "FAIL")
        detail = str(c.get("detail", ""))
        if word == "PASS" and len(detail) > 70:
            detail = detail[:67] + "..."
        rows.append([word, str(c.get("name", "")), detail])
    counts = {w: sum(1 for r in rows if r[0] == w) for w in ("PASS", "FAIL", "SKIP")}
    certs = data.get("certificates", [])
    lines = [table(["RESULT", "CHECK", "DETAIL"], rows),
             f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"]
    lines += [f"usage: {usage.line(e)}" for e in data.get("tenants", [])]
    if certs:
        soonest = min(certs, key=lambda c: c.get("days_left", 0))
        lines.append(f"certificates: {len(certs)}, the first expires in "
                     f"{soonest.get('days_left')} days ({Path(str(soonest.get('file'))).name})")
    return "\n".join(lines)


def render(st: Status) -> str:
    topo = st.topo
    targets = remote.targets(topo, st.backend)
    out = [f"Sandbox '{topo.name}' ({st.backend}; topology {display_path(topo.path)})"]
    if st.backend == "podman":
        out[0] += f"; network {topo.network_name()}: {st.network}"
    node_col = "CONTAINER" if st.backend == "podman" else "VM"
    rows = []
    for n in topo.nodes:
        etcd = st.etcd_health.get(n.name, "?" if st.etcd_health else "-") \
            if "etcd" in n.groups else ""
        groups = ",".join(n.groups) + (f" ({n.cluster})" if topo.multi_cluster and n.cluster
                                       else "")
        rows.append([n.name, groups, targets[n.name].host,
                     st.node_state.get(n.name, "?"), etcd, st.etcd_db.get(n.name, "")])
    out.append(table(["NODE", "GROUPS", "ADDRESS", node_col, "ETCD", "ETCD DB"], rows))
    members = topo.group("etcd")
    healthy = sum(1 for v in st.etcd_health.values() if v == "healthy")
    if st.etcd_health and topo.multi_cluster:
        for c in topo.clusters:
            mine = [n.name for n in members if n.cluster == c]
            ok = sum(1 for m in mine if st.etcd_health.get(m) == "healthy")
            out.append(f"etcd cluster {c}: {ok}/{len(mine)} members healthy ({st.etcd_source})")
    elif st.etcd_health:
        out.append(f"etcd: {healthy}/{len(members)} members healthy ({st.etcd_source})")
    else:
        out.append(f"etcd: health unknown ({st.etcd_note})")
    if st.etcd_build:
        out.append(f"etcd build: {st.etcd_build.removeprefix('etcd ')}")
    pki = topo.state_dir / "pki"
    if topo.tls:
        out.append(f"TLS: on (mTLS, client and peer); certificates in {display_path(pki)} "
                   "(ca.crt, members/, clients/; the CA key stays here)")
    else:
        out.append("TLS: off (plain HTTP; use only in a sandbox)")
    if topo.tenants:
        rows = [[t.name, t.normalized_prefix, ",".join(t.controllers),
                 "; ".join(f"{c}: {st.api_state.get(c, 'node not running')}"
                           for c in t.controllers), kubeconfig_of(topo, t.name)]
                for t in topo.tenants]
        head = ["TENANT", "PREFIX", "CONTROLLERS", "KUBERNETES API", "KUBECONFIG"]
        if topo.multi_cluster:   # the etcd cluster holding each tenant, after its prefix
            head.insert(2, "ETCD CLUSTER")
            for row, t in zip(rows, topo.tenants, strict=True):
                row.insert(2, t.cluster)
        out.append(table(head, rows))
        out += usage_lines(st)
    out.append("Next:")
    out += [f"  {c}" for c in next_commands(topo)]
    return "\n".join(out)


def usage_lines(st: Status) -> list[str]:
    """Each tenant's keys and bytes under its prefix, its share of the backend quota and its
    max_bytes (tenants[].max_bytes), or why they are unknown."""
    if not st.usage:
        return [f"usage: unknown ({st.usage_note or 'no etcd member is running'})"]
    rows = []
    for e in st.usage:
        most = "-" if e.get("max_bytes") is None else (
            f"{e['max_bytes']!r} (not a positive int)" if "max_bytes_error" in e
            else size(e["max_bytes"]) + (" (OVER)" if e.get("over_max_bytes") else ""))
        budget = budget_cell(e)
        if "error" in e:
            rows.append([e["name"], "?", "?", "?", most, budget])
        elif e.get("restore"):
            rows.append([e["name"] + " (RESTORE INTERRUPTED)", str(e["key_count"]), size(e["bytes"]),
                         usage.share(e), most, budget])
        else:
            rows.append([e["name"], str(e["key_count"]), size(e["bytes"]), usage.share(e), most, budget])
    quota = size(st.usage[0]["quota_backend_bytes"])
    lines = [table(["TENANT", "KEYS", "BYTES", f"OF QUOTA ({quota})", "MAX_BYTES", "WRITE BUDGET"], rows)]
    lines += [f"usage: {e['name']}: unknown ({e['error']})" for e in st.usage if "error" in e]
    lines += [f"usage: {e['name']}: {usage.interrupted(e)}" for e in st.usage if e.get("restore")]
    lines += [f"usage: {e['name']}: OVER its write budget: its writes are refused ('etcdserver: "
              f"tenant write budget exceeded', {e['write_budget']['refused']} so far) while the "
              "other tenants write on; they come back once a compaction or its deletes bring it "
              "under (scripts/sandbox defrag --compact compacts now), or with a higher max_bytes "
              "and scripts/sandbox up"
              for e in st.usage if (e.get("write_budget") or {}).get("over")]
    lines.append("usage: keys and values under each prefix at one revision, read with the "
                 "tenant's own certificate; WRITE BUDGET: what its prefix and leases take in the "
                 "backend, every revision not yet compacted, as every member counts it (the "
                 "sandbox's etcd build refuses the tenant's writes alone past it)")
    return lines


def budget_cell(e: dict[str, Any]) -> str:
    """A tenant's write budget in the usage table: used of budget, OVER, or why none."""
    b = e.get("write_budget")
    if not b:
        return "-"
    if not b["enforced"]:
        return f"{size(b['budget'])} NOT ENFORCED"
    return f"{size(b['used'])} of {size(b['budget'])}" + (" OVER: WRITES REFUSED" if b["over"] else "")


def kubeconfig_of(topo: Topology, tenant: str) -> str:
    """The tenant's kubeconfig on the control node (what ``scripts/sandbox kubeconfig``
    prints), '-' before ``up`` wrote it."""
    path = topo.state_dir / "kubeconfig" / f"{tenant}.yaml"
    return display_path(path) if path.is_file() else "-"


def next_commands(topo: Topology) -> list[str]:
    """What to try next, as typed from the repository root (the README test runs them)."""
    members = topo.group("etcd")
    nxt = [f"scripts/sandbox etcdctl --cluster {c} member list -w table"
           for c in topo.clusters] if topo.multi_cluster else [
        "scripts/sandbox etcdctl member list -w table"]
    for i, t in enumerate(topo.tenants[:2]):
        if i == 0:
            nxt.append(f"scripts/sandbox kubectl --tenant {t.name} apply -f docs/examples/crd.yaml")
        nxt.append(f"scripts/sandbox kubectl --tenant {t.name} get crd")
    if topo.tenants:
        nxt.append(f"scripts/sandbox kubeconfig --tenant {topo.tenants[0].name}"
                   "   # its path, for your own kubectl, helm, k9s")
    nxt += [f"scripts/sandbox ssh {members[0].name if members else topo.nodes[0].name}",
            "scripts/sandbox verify", "scripts/sandbox down"]
    return nxt
