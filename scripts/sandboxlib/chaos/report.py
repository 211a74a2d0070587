"""The chaos run's report: operations by kind and outcome, the faults with their windows,
unavailability per fault and tenant (from the injection to the next acknowledged write), the
anomalies with their smallest sub-histories, the watches; as text, as JSON (report.json) and
as a timeline picture (timeline.png: one row per client and watch, one bar per operation
coloured by outcome, the faults shaded)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from .checker import Report
from .history import History

COLOURS = {"ok": "#2e7d32", "fail": "#c62828", "unknown": "#ef6c00"}


def op_counts(hist: History) -> dict[str, dict[str, int]]:
    """{"etcd put": {"ok": n, ...}, "etcd read (linearizable)": ...}"""
    out: dict[str, Counter[str]] = {}
    for op in hist.ops:
        name = f"{op.iface} {op.kind}"
        if op.kind == "read":
            name += " (serializable)" if op.consistency == "s" else " (linearizable)"
        if op.kind == "cas" and op.outcome == "ok":
            name += " (applied)" if op.result.get("succeeded") else " (compare failed)"
        out.setdefault(name, Counter())[op.outcome] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


def by_tenant(hist: History) -> dict[str, dict[str, dict[str, int]]]:
    """{tenant: {"etcd": {"operations": n, "acknowledged writes": n}, "api": ...}}"""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for op in hist.ops:
        c = out.setdefault(op.tenant, {}).setdefault(op.iface, {"operations": 0,
                                                                 "acknowledged writes": 0})
        c["operations"] += 1
        c["acknowledged writes"] += op.acknowledged
    return out


def windows(hist: History) -> dict[str, dict[str, Any]]:
    """Per tenant and interface, the acknowledged operations' windows (invoke to answer, ms):
    median and 95th percentile, and for etcd the client that sent them (the agent's
    ``ready``: in-process gRPC over kept channels, or one etcdctl process per operation, and
    why). The narrower the window, the less the checker must leave open."""
    spans: dict[str, list[float]] = {}
    for op in hist.ops:
        if op.acknowledged and op.complete is not None and not op.process.endswith("/final"):
            spans.setdefault(f"{op.tenant} {op.iface}", []).append(op.complete - op.invoke)
    clients = hist.meta.get("etcd_clients") or {}
    out: dict[str, dict[str, Any]] = {}
    for name, vals in sorted(spans.items()):
        vals.sort()
        row: dict[str, Any] = {"median_ms": round(1000 * vals[len(vals) // 2], 1),
                               "p95_ms": round(1000 * vals[int(0.95 * (len(vals) - 1))], 1),
                               "operations": len(vals)}
        tenant, iface = name.rsplit(" ", 1)
        if iface == "etcd" and tenant in clients:
            row["client"] = clients[tenant]["client"]
            row["why"] = clients[tenant].get("why", "")
        out[name] = row
    return out


def unavailability(hist: History) -> list[dict[str, Any]]:
    """Per fault, per tenant and interface: seconds from the injection (when its command had
    returned: the signal delivered, the network cut; the start for replace-member) to the
    answer of the first acknowledged write invoked after it (None: none came)."""
    rows = []
    tenants = sorted({op.tenant for op in hist.ops})
    for f in hist.faults:
        at = f.injected if f.injected is not None else f.start
        row: dict[str, Any] = {"fault": f.name, "target": f.target, "start": round(f.start, 2)}
        for t in tenants:
            for iface in ("etcd", "api"):
                after = [op.complete for op in hist.ops
                         if op.tenant == t and op.iface == iface and op.acknowledged
                         and op.invoke >= at and op.complete is not None
                         and not op.process.endswith("/final")]
                row[f"{t} {iface}"] = round(min(after) - at, 2) if after else None
        rows.append(row)
    return rows


QUIET_GRACE = 15.0      # seconds of workload after the last fault's health before silence fails


def silent_clients(hist: History, grace: float = QUIET_GRACE) -> list[str]:
    """The tenants' interfaces that acknowledged no write after the cluster was last healthy
    again, though the workload ran on for more than ``grace`` seconds: their clients never came
    back, so the run checked nothing of them from there (0 anomalies would say nothing). Each
    entry says which, since when and for how long."""
    work = [op for op in hist.ops if not op.process.endswith("/final")]
    if not work:
        return []
    healthy = [f.end for f in hist.faults if f.end is not None]
    since = max(healthy, default=0.0)
    stop = max(op.invoke for op in work)
    if stop - since <= grace:
        return []
    out = []
    for t in sorted({op.tenant for op in work}):
        for iface in ("etcd", "api"):
            mine = [op for op in work if op.tenant == t and op.iface == iface]
            if mine and not any(op.acknowledged and op.kind != "read" and op.invoke >= since
                                for op in mine):
                out.append(f"{t} {iface}: no acknowledged write in the {stop - since:.0f} s of "
                           f"workload after the cluster was healthy again at {since:.1f} s "
                           "(its clients did not come back; nothing of it was checked from there)")
    return out


def build(hist: History, rep: Report, selftest: dict[str, Any],
          health: str) -> dict[str, Any]:
    watches = [{"name": w.name, "start_rev": w.start_rev, "end_rev": w.end_rev,
                "events": len(w.events), "restarts": len(w.restarts),
                "reported_gaps": w.reported_gaps, "reached_end": w.reached_end,
                "end_reason": w.end_reason, "progress": len(w.progress),
                "last_rev": max((e.rev for e in w.events), default=None)}
               for w in hist.watches]
    return {
        "meta": hist.meta,
        "operations": op_counts(hist),
        "total_operations": len(hist.ops),
        "by_tenant": by_tenant(hist),
        "windows": windows(hist),
        "faults": [{"name": f.name, "target": f.target, "start": round(f.start, 2),
                    "injected": None if f.injected is None else round(f.injected, 2),
                    "healed": None if f.healed is None else round(f.healed, 2),
                    "healthy": None if f.end is None else round(f.end, 2), "note": f.note}
                   for f in hist.faults],
        "unavailability_seconds": unavailability(hist),
        "silent_clients": silent_clients(hist),
        "anomalies": [a.__dict__ for a in rep.anomalies],
        "anomaly_count": len(rep.anomalies),
        "lost_acknowledged_writes": rep.lost_writes,
        "checker": rep.to_json(),
        "checker_selftest": selftest,
        "watches": watches,
        "health_at_end": health or "healthy, hashkv equal",
        "note": "The tenants' API servers are Kubernetes' CRD API server (a stand-in, not k0s) "
                "where no k0s binary can be had.",
    }


def _end(w: dict[str, Any]) -> str:
    """Whether a watch delivered the end marker; when not, what is known of why."""
    if w["reached_end"]:
        return "reached"
    why = f"; {w['end_reason']}" if w.get("end_reason") else ""
    return (f"NOT reached (its revision {w['end_rev'] or 'unknown'}, the last event at "
            f"{w.get('last_rev') or '-'}{why})")


def text(data: dict[str, Any]) -> str:
    lines = ["operations (outcome counts):"]
    for name, counts in data["operations"].items():
        lines.append(f"  {name:<34} " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for tenant, ifaces in data["by_tenant"].items():
        lines.append(f"  {tenant}: " + "; ".join(
            f"{i} {c['operations']} operations, {c['acknowledged writes']} acknowledged writes"
            for i, c in sorted(ifaces.items())))
    if data.get("windows"):
        lines.append("operation windows (acknowledged, invoke to answer):")
    for name, w in (data.get("windows") or {}).items():
        how = {"grpc": "; in-process gRPC, kept channels",
               "etcdctl": "; one etcdctl process each"}.get(w.get("client", ""), "")
        why = f" ({w['why']})" if w.get("why") else ""
        lines.append(f"  {name:<22} median {w['median_ms']:g} ms, 95th percentile "
                     f"{w['p95_ms']:g} ms{how}{why}")
    lines.append("faults (seconds since the start; unavailability = from the fault in effect "
                 "to the next acknowledged write):")
    for f, u in zip(data["faults"], data["unavailability_seconds"], strict=True):
        per = "  ".join(f"{k} {'-' if v is None else f'{v:.1f}s'}" for k, v in u.items()
                        if k not in ("fault", "target", "start"))
        lines.append(f"  {f['name']:<18} on {f['target']:<12} at {f['start']:>6.1f}  "
                     f"in effect {_s(f['injected'])}  healed {_s(f['healed'])}  "
                     f"healthy {_s(f['healthy'])}  | {per}")
    for w in data["watches"]:
        lines.append(f"  watch {w['name']}: {w['events']} events from revision "
                     f"{w['start_rev']}, {w['restarts']} restarts, "
                     f"{len(w['reported_gaps'])} reported gaps, end marker {_end(w)}")
    c, st = data["checker"], data["checker_selftest"]
    lines.append(f"checker: {c['keys']} keys, {c['ops_checked']} operations searched in "
                 f"{c['seconds']:.2f}s ({c['ops_per_second']} ops/s), {c['states']} states; "
                 f"self-test: {st.get('passed')}/{st.get('histories')} generated histories "
                 f"linearizable, {st.get('caught')}/{st.get('mutations')} mutations caught")
    lines.append(f"revision order: {c['revision_ops']} operations with a revision; deletes "
                 f"told none: {c.get('pinned_deletes', 0)} pinned to their DELETE event, "
                 f"{c.get('unpinned_deletes', 0)} left to their window")
    lines.append(f"health at the end: {data['health_at_end']}")
    for why in data.get("silent_clients") or []:
        lines.append(f"silent: {why}")
    lines.append(f"anomalies: {data['anomaly_count']}; lost acknowledged writes: "
                 f"{data['lost_acknowledged_writes']}")
    for a in data["anomalies"][:10]:
        lines.append(f"  {a['type']} at {a['where']}: {a['message']}")
        for o in a["ops"][:12]:
            lines.append(f"    {o['process']:<18} {o['kind']:<6} {o['invoke']:>8} -> "
                         f"{o['complete']}  {o['outcome']:<7} value={o['value']} "
                         f"expected={o['expected']} result={o['result']}")
    return "\n".join(lines)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def timeline(hist: History, path: Path, title: str) -> None:
    """timeline.png: clients and watches as rows, operations as bars, faults shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sorted({op.process for op in hist.ops}) + [w.name for w in hist.watches]
    end = max([op.complete or op.invoke for op in hist.ops] + [1.0])
    fig, ax = plt.subplots(figsize=(16, 1.2 + 0.42 * len(rows)))
    for f in hist.faults:
        stop = f.end if f.end is not None else (f.healed or end)
        ax.axvspan(f.start, stop, color="#90a4ae", alpha=0.25, lw=0)
        target = f.target if len(f.target) <= 12 else "every member"
        ax.text(f.start, len(rows) - 0.4, f"{f.name}\n{target}", fontsize=7, va="top")
    index = {r: i for i, r in enumerate(rows)}
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for op in hist.ops:
        stop = op.complete if op.complete is not None else end
        spans.setdefault((index[op.process], op.outcome), []).append(
            (op.invoke, max(stop - op.invoke, end / 4000)))
    for (row, outcome), bars in spans.items():
        ax.broken_barh(bars, (row - 0.35, 0.7), facecolors=COLOURS[outcome], lw=0)
    for w in hist.watches:
        xs = [e.t for e in w.events]
        ax.plot(xs, [index[w.name]] * len(xs), "|", color="#1565c0", ms=8)
        for r in w.restarts:
            ax.plot([r["t"]], [index[w.name]], "x", color="#c62828", ms=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.2)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("seconds since the start of the run")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()]
              + [Patch(color="#90a4ae", alpha=0.4, label="fault (injected -> healthy)"),
                 Patch(color="#1565c0", label="watch event (| ; x restart)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.08 - 1.0 / (3 + len(rows))),
              fontsize=8, ncol=5, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
