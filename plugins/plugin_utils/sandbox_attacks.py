"""What the hostile-tenant suite found, as verify reports it and ``scripts/sandbox attack``
prints it (roles/sandbox_verify/files/hostile_tenant.py makes the attempts, hostile_admin.py
prepares and finishes them). Applied by the filter plugins/filter/sandbox_attacks.py and by
scripts/sandboxlib (through scripts/sandboxlib/sandbox_attacks.py, a link to this file).

An attempt is refused, succeeded (a way past the tenant's confinement: the check FAILs),
allowed (what etcd or the sandbox grants every tenant on purpose, with the reason), n/a (with
the reason) or error (no answer that says either: the check FAILs, the suite could not tell).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

OUTCOMES = ("refused", "succeeded", "allowed", "n/a", "error")
PHASE_NAMES = {"normal": "normally", "nospace": "while NOSPACE is raised",
               "over its budget": "over its write budget"}


def counts(attempts: Iterable[dict[str, Any]]) -> dict[str, int]:
    out = dict.fromkeys(OUTCOMES, 0)
    for a in attempts:
        out[a.get("outcome", "error")] = out.get(a.get("outcome", "error"), 0) + 1
    return out


def phase_line(phase: dict[str, Any]) -> str:
    """"normally: 52 refused, 0 succeeded; 7 allowed (...)"."""
    c = counts(phase.get("attempts") or [])
    line = (f"{PHASE_NAMES.get(phase.get('phase', ''), phase.get('phase', ''))}: "
            f"{c['refused']} attacks refused, {c['succeeded']} succeeded")
    bad = [a["name"] for a in phase.get("attempts") or [] if a.get("outcome") == "succeeded"]
    if bad:
        line += f" ({', '.join(bad)})"
    if c["error"]:
        errors = [a["name"] for a in phase.get("attempts") or [] if a.get("outcome") == "error"]
        line += f"; {c['error']} without an answer ({', '.join(errors)})"
    if c["allowed"]:
        line += f"; {c['allowed']} allowed by design"
    return line


def check(result: dict[str, Any]) -> dict[str, Any]:
    """verify's (and attack's) check for one attacking tenant."""
    phases = result.get("phases") or []
    attempts = [a for p in phases for a in p.get("attempts") or []]
    c = counts(attempts)
    fill = result.get("fill")
    parts = [phase_line(p) for p in phases]
    if fill is not None:
        parts.insert(1 if parts else 0, f"its own fill: {fill.get('detail', '')}")
    if result.get("admin_fill"):
        parts.insert(2 if len(parts) > 1 else len(parts), f"then {result['admin_fill'].get('detail', '')}")
    ok = bool(attempts) and c["succeeded"] == 0 and c["error"] == 0 and (
        fill is None or bool(fill.get("ok")))
    return {"name": f"{result.get('tenant', '?')}: a hostile tenant's attempts on the shared etcd "
                    "(its own certificate)",
            "ok": ok, "detail": "; ".join(parts) or "no attempt was made"}


def finish_check(done: dict[str, Any]) -> dict[str, Any]:
    """After the attempts: auth on (as they left it), every other tenant's keys as before
    (key, revisions, value), the cluster healthy and no alarm left."""
    changed = done.get("changed") or {}
    kept = done.get("kept") or {}
    ok = done.get("auth") == "on" and not changed and bool(done.get("healthy")) and not done.get("alarms")
    detail = [f"auth {done.get('auth', '?')} after the attempts",
              ("every tenant's keys as before (key, revisions, value: "
               + ", ".join(f"{t} {n}" for t, n in sorted(kept.items())) + ")") if not changed else
              "CHANGED: " + "; ".join(f"{t}: {', '.join(d[:5])}{' ...' if len(d) > 5 else ''}"
                                      for t, d in sorted(changed.items())),
              "cluster healthy" if done.get("healthy") else f"cluster NOT healthy: {done.get('health', '')}",
              "no alarm" if not done.get("alarms") else f"alarms: {done.get('alarms')}"]
    if done.get("recovered"):
        detail.append("recovered: " + ", ".join(done["recovered"]))
    return {"name": "after the hostile tenants' attempts: auth, every tenant's keys, health",
            "ok": ok, "detail": "; ".join(detail)}


def rows(result: dict[str, Any]) -> list[list[str]]:
    """The CLI's table: PHASE, OUTCOME, ATTEMPT, TARGET, DETAIL (what etcd answered)."""
    out = []
    for p in result.get("phases") or []:
        for a in p.get("attempts") or []:
            out.append([p.get("phase", ""), a.get("outcome", ""), a.get("name", ""),
                        a.get("target", ""), " ".join(str(a.get("detail", "")).split())[:90]])
    return out


BUDGET = "tenant write budget exceeded"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _means_line(m: dict[str, Any]) -> str:
    line = f"{m['means']}: {m['accepted']} accepted, {m['refused_budget']} refused by its budget"
    if m.get("other_errors"):
        line += f", {m['other_errors']} other errors ({'; '.join(m.get('errors') or [])})"
    if m.get("refused_nospace"):
        line += f", {m['refused_nospace']} NOSPACE"
    return line


def flood_checks(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flood's three checks (files/hostile_flood.py's results: one "flood", the
    "victim"s, one "watch"): the flooding tenant stopped by its write budget alone, by every
    means, and still stopped after; every other tenant's writes acknowledged during and
    after (with their latencies); the shared database under the quota, no alarm."""
    flood = next((p for p in parts if p.get("op") == "flood"), None)
    watch = next((p for p in parts if p.get("op") == "watch"), None)
    victims = [p for p in parts if p.get("op") == "victim"]
    if flood is None or watch is None:
        return [{"name": "the flood", "ok": False,
                 "detail": "no result of the " + ("flooding tenant" if flood is None else "admin's watch")}]
    means = flood.get("means") or []
    stopped = [m for m in means if BUDGET in str(m.get("after", ""))]
    other = [m for m in means if m.get("other_errors") or m.get("refused_nospace")]
    accepted = sum(int(m.get("accepted_bytes") or 0) for m in means)
    first = [m["first_budget_refusal_s"] for m in means if m.get("first_budget_refusal_s") is not None]
    flooder = {"name": f"the flood ({flood.get('prefix')}): stopped by its write budget alone, by every means",
               "ok": bool(means) and len(stopped) == len(means) and not other,
               "detail": (f"{flood.get('seconds')} s of writes by {len(means)} means ("
                          + "; ".join(_means_line(m) for m in means)
                          + f"); {_mb(accepted)} accepted in all"
                          + (f", the first refusal after {min(first):.2f} s" if first else "")
                          + "; after the flood every means "
                          + ("still refused ('tenant write budget exceeded')" if len(stopped) == len(means)
                             else "NOT refused: " + ", ".join(m["means"] for m in means if m not in stopped)))}
    writers = [(v.get("prefix"), w) for v in victims for w in v.get("writers") or []]
    bad = [(p, w) for p, w in writers if w.get("failed") or not (w.get("during_flood") or {}).get("writes")]
    others = {"name": "the flood: every other tenant's writes acknowledged, during it and after",
              "ok": bool(writers) and not bad,
              "detail": "; ".join(
                  f"{p} {w['writer']}: {w['acknowledged']} acknowledged, {w['failed']} failed"
                  + (f" ({'; '.join(w.get('errors') or [])})" if w.get("failed") else "")
                  + f", during p50 {w['during_flood']['p50_ms']} ms p99 {w['during_flood']['p99_ms']} ms "
                  f"max {w['during_flood']['max_ms']} ms, after p99 {w['after_flood']['p99_ms']} ms"
                  for p, w in writers) or "no other tenant wrote"}
    quota = int(watch.get("quota") or 0)
    most = max((int(v) for v in (watch.get("max_db_bytes") or {}).values()), default=0)
    alarms = watch.get("alarms") or []
    budgets = watch.get("budgets") or {}
    past = [u for u, n in (watch.get("used_max") or {}).items() if budgets.get(u) and n > budgets[u]]
    db = {"name": "the flood: the shared database stayed under the backend quota, no alarm, no tenant past its budget",
          "ok": bool(watch.get("samples")) and not alarms and (quota == 0 or most < quota) and most > 0 and not past,
          "detail": (f"{watch.get('samples')} samples: the largest member database {_mb(most)}"
                     + (f" of a {_mb(quota)} quota ({100 * most / quota:.0f}%)" if quota else "")
                     + ("; no alarm" if not alarms else f"; ALARMS: {', '.join(alarms)}")
                     + "; tenants' usage at most: " + ", ".join(
                         f"{u} {_mb(n)}" + (f" of {_mb(budgets[u])}" if budgets.get(u) else "")
                         for u, n in sorted((watch.get("used_max") or {}).items()))
                     + (f"; PAST ITS BUDGET: {', '.join(past)}" if past else "")
                     + ("; over its budget: " + ", ".join(f"{u} after {t} s" for u, t in sorted(
                         (watch.get("over_budget_seen_at_s") or {}).items()))
                        if watch.get("over_budget_seen_at_s") else ""))}
    return [flooder, others, db]
