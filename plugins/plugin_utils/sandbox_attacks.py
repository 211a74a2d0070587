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
PHASE_NAMES = {"normal": "normally", "nospace": "while NOSPACE is raised"}


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
        parts.insert(1 if parts else 0, f"filled the quota through its own prefix: {fill.get('detail', '')}")
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
