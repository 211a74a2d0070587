"""THE tenant write budgets, once: what each tenant may add to the etcd it shares, how the
budgets are checked against the backend quota, and how the members' own figures read.

etcd has one space quota for the whole cluster and none per prefix (etcd-io/etcd#10084): one
tenant that fills it (NOSPACE) stops every tenant's writes. The sandbox's etcd build enforces
a budget per tenant where requests are applied (scripts/etcd-patches/0007: a tenant's writes
are refused alone, ``etcdserver: tenant write budget exceeded``, once what its prefix and its
leases take in the backend would pass its budget). The etcd role writes each budget as
``k0sbox/budget/<tenant>`` = ``{"prefix": "/<prefix>/", "bytes": N}`` (as root); each member
exports ``etcd_k0sbox_tenant_{budget,used}_bytes``, ``etcd_k0sbox_tenant_over_budget`` and
``etcd_k0sbox_tenant_refused_total`` on its metrics listener.

A tenant's budget is its ``max_bytes`` (tenants[].max_bytes) or, without one, an equal part of
``share`` x the backend quota less the others' ``max_bytes``. The budgets together may take
at most ``share`` of the quota: the rest is headroom for what no budget counts (bbolt's pages
and free space, keys outside the prefixes, the members' own), measured in docs/security.md.

Imported by the topology (``topology.py``: the CLI, the inventory plugin), by the filters
(plugins/filter/sandbox_budgets.py: roles/etcd and verify) and by ``scripts/sandbox status``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .sandbox_tenants import normalize_prefix

CONFIG_PREFIX = "k0sbox/budget/"
# etcd_tenant_budget_share's default (roles/etcd/defaults/main.yml says why)
DEFAULT_SHARE = 0.25
# The least budget a tenant gets from the share: a Kubernetes API server's own objects.
MIN_BUDGET = 1024 * 1024
METRIC_RE = re.compile(
    r'^etcd_k0sbox_tenant_(budget_bytes|used_bytes|over_budget|refused_total)\{([^}]*)\}\s+(\S+)')


def share_error(share: Any) -> str:
    """What is wrong with etcd_tenant_budget_share ('' when nothing): a number in (0, 1]."""
    try:
        value = float(share)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(share, bool) or not 0 < value <= 1:
        return (f"{share!r} is not a share of the backend quota in (0, 1]; give e.g. "
                f"etcd_tenant_budget_share: {DEFAULT_SHARE}")
    return ""


def budgets(tenants: Sequence[Mapping[str, Any]], quota: int,
            share: Any = DEFAULT_SHARE) -> list[dict[str, Any]]:
    """Each tenant's budget: {name, prefix, bytes, source} ("max_bytes": its own; "share": an
    equal part of what ``share`` x ``quota`` leaves after the others' max_bytes). The prefix
    is the tenant's ``key_prefix`` (normalised: "/p/") or its ``prefix`` normalised."""
    total = int(float(share) * int(quota)) if not share_error(share) else 0
    given = sum(int(t["max_bytes"]) for t in tenants if _has_max(t))
    rest = [t for t in tenants if not _has_max(t)]
    each = max(0, (total - given) // len(rest)) if rest else 0
    out = []
    for t in tenants:
        prefix = str(t.get("key_prefix") or normalize_prefix(str(t.get("prefix") or "")))
        if _has_max(t):
            out.append({"name": str(t["name"]), "prefix": prefix, "bytes": int(t["max_bytes"]),
                        "source": "max_bytes"})
        else:
            out.append({"name": str(t["name"]), "prefix": prefix, "bytes": each, "source": "share"})
    return out


def _has_max(t: Mapping[str, Any]) -> bool:
    v = t.get("max_bytes")
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def budget_errors(tenants: Sequence[Mapping[str, Any]], quota: int, share: Any = DEFAULT_SHARE,
                  where: str = "k0s_tenants") -> list[str]:
    """Budgets that cannot hold: the share not a share, the tenants' max_bytes adding up past
    ``share`` x ``quota``, or what is left too small (< MIN_BUDGET) for the tenants without
    one. Each message names the fields and the fix."""
    if problem := share_error(share):
        return [f"etcd_tenant_budget_share: {problem}"]
    if not tenants:
        return []
    total = int(float(share) * int(quota))
    given = [t for t in tenants if _has_max(t)]
    given_sum = sum(int(t["max_bytes"]) for t in given)
    fix = ("lower the tenants' max_bytes, raise etcd_quota_backend_bytes (the backend quota, "
           f"{int(quota)} bytes) or etcd_tenant_budget_share ({float(share):g})")
    if given_sum > total:
        names = ", ".join(f"{t['name']} {int(t['max_bytes'])}" for t in given)
        return [(f"{where}: the tenants' max_bytes add up to {given_sum} bytes ({names}), past "
                 f"the {total} bytes their write budgets may take together "
                 f"(etcd_tenant_budget_share {float(share):g} of the backend quota, the rest "
                 f"kept free for what no budget counts): {fix}")]
    rest = [t for t in tenants if not _has_max(t)]
    if rest and (total - given_sum) // len(rest) < MIN_BUDGET:
        each = (total - given_sum) // len(rest)
        return [(f"{where}: the tenants without max_bytes ({', '.join(str(t['name']) for t in rest)}) "
                 f"would get a write budget of {each} bytes each, less than {MIN_BUDGET} "
                 f"(a Kubernetes API server's own objects): give them max_bytes or {fix}")]
    return []


def config_value(budget: Mapping[str, Any]) -> str:
    """The value of the budget's key k0sbox/budget/<tenant>, as the etcd build reads it."""
    return json.dumps({"prefix": budget["prefix"], "bytes": int(budget["bytes"])},
                      separators=(",", ":"))


def parse_metrics(text: str) -> dict[str, dict[str, Any]]:
    """A member's budget figures from its /metrics: user -> {prefix, budget, used, over,
    refused}; {} when the build exports none (it does not enforce budgets)."""
    out: dict[str, dict[str, Any]] = {}
    for line in (text or "").splitlines():
        m = METRIC_RE.match(line.strip())
        if not m:
            continue
        kind, labels, value = m.groups()
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        user = lab.get("user", "")
        e = out.setdefault(user, {"prefix": lab.get("prefix", ""), "budget": None, "used": None,
                                  "over": False, "refused": 0})
        if lab.get("prefix"):
            e["prefix"] = lab["prefix"]
        try:
            number = float(value)
        except ValueError:
            continue
        if kind == "budget_bytes":
            e["budget"] = int(number)
        elif kind == "used_bytes":
            e["used"] = int(number)
        elif kind == "over_budget":
            e["over"] = number >= 1
        else:
            e["refused"] = int(number)
    return out


ADVISORY = "etcd-io/etcd#10084"


def member_checks(wanted: Sequence[Mapping[str, Any]],
                  members: Mapping[str, Mapping[str, Mapping[str, Any]]],
                  accepted: Iterable[str] = ()) -> list[dict[str, Any]]:
    """verify's budget checks, one per tenant, from every member's parsed metrics (member ->
    :func:`parse_metrics`): PASS when every member enforces the tenant's budget as the
    topology gives it and the tenant is under it; FAIL when a member does not (another build,
    or the budget not written), or when the tenant is over its budget: its writes are refused
    (the detail says what brings them back). A build that enforces none, where the operator
    accepted etcd-io/etcd#10084 (etcd_accepted_advisories), is a SKIP saying so."""
    checks = []
    waived = ADVISORY in set(accepted or ())
    for b in wanted:
        name = f"{b['name']}: write budget {size(int(b['bytes']))} ({b['source']}) enforced by every member"
        missing = [m for m, got in members.items()
                   if (got.get(b["name"]) or {}).get("budget") != int(b["bytes"])
                   or (got.get(b["name"]) or {}).get("prefix") != b["prefix"]]
        if members and missing and waived and all(not members[m] for m in missing):
            checks.append({"name": name, "ok": True, "skipped": True, "detail": (
                f"not enforced on {', '.join(missing)}: their etcd build enforces no budget, and "
                f"the operator accepted {ADVISORY} (etcd_accepted_advisories): one tenant can "
                "fill the quota for all")})
            continue
        if missing or not members:
            seen = {m: (members[m].get(b["name"]) or {}).get("budget") for m in missing}
            checks.append({"name": name, "ok": False, "detail": (
                "no member answered" if not members else
                f"not enforced on {', '.join(missing)} (budget there: "
                + ", ".join(f"{m} {v if v is not None else 'none'}" for m, v in seen.items())
                + "): the member's etcd build exports no budget (only the sandbox's build, "
                "scripts/build-etcd, enforces one: etcd-io/etcd#10084) or the budget key "
                f"{CONFIG_PREFIX}{b['name']} was not written (scripts/sandbox up writes it)")})
            continue
        used = max(int((got.get(b["name"]) or {}).get("used") or 0) for got in members.values())
        over = [m for m, got in members.items() if (got.get(b["name"]) or {}).get("over")]
        refused = max(int((got.get(b["name"]) or {}).get("refused") or 0) for got in members.values())
        if over:
            checks.append({"name": name, "ok": False, "detail": (
                f"tenant {b['name']} is OVER its write budget: {size(used)} of {size(int(b['bytes']))} "
                f"used under {b['prefix']} and its leases; its writes are refused "
                f"('etcdserver: tenant write budget exceeded', {refused} so far) while every other "
                "tenant writes on. They come back by themselves once a compaction or its own "
                "deletes bring it under (scripts/sandbox defrag --compact compacts now), or with "
                f"a higher max_bytes for {b['name']} and scripts/sandbox up")})
            continue
        checks.append({"name": name, "ok": True, "detail": (
            f"{size(used)} of {size(int(b['bytes']))} used ({100 * used / max(1, int(b['bytes'])):.2g}%)"
            + (f"; {refused} writes refused earlier" if refused else ""))})
    return checks


def usage_fields(wanted: Iterable[Mapping[str, Any]],
                 members: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per tenant what ``status`` shows: {budget, used, over, refused, enforced}."""
    out = {}
    for b in wanted:
        seen = [got.get(b["name"]) or {} for got in members.values()]
        enforced = bool(seen) and all(s.get("budget") == int(b["bytes"]) for s in seen)
        out[str(b["name"])] = {
            "budget": int(b["bytes"]), "enforced": enforced,
            "used": max((int(s.get("used") or 0) for s in seen), default=0),
            "over": any(s.get("over") for s in seen),
            "refused": max((int(s.get("refused") or 0) for s in seen), default=0)}
    return out
