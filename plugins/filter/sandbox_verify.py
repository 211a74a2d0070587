"""Filters for playbooks/verify.yml: turn etcdctl/probe/process output into checks.

A check is {"name": str, "ok": bool, "detail": str}; the report is the list of them.
"""

from __future__ import annotations

import json
from typing import Any

Check = dict[str, Any]
ON = ("true", "1")


def _check(name: str, ok: bool, detail: str = "") -> Check:
    return {"name": name, "ok": bool(ok), "detail": detail}


def _loads(text: str, default: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


def sandbox_file_checks(lines: list[str], host: str) -> list[Check]:
    """From verify_member.py's files: every private key (*.key) 0600 or 0640 (never readable
    or writable by others, never group-writable), no file or directory writable by others.
    Lines: '<d|f> <path> <mode> <owner>:<group>'."""
    entries = [line.split() for line in lines or [] if len(line.split()) == 4]
    keys = [e for e in entries if e[0] == "f" and e[1].endswith(".key")]
    bad_keys = [e for e in keys if int(e[2], 8) & 0o7177 not in (0o0000, 0o0040)
                or int(e[2], 8) & 0o0400 == 0]
    writable = [e for e in entries if int(e[2], 8) & 0o002]
    if not entries:
        return []
    return ([
        _check(f"{host}: private keys 0600/0640, unreadable by others", not bad_keys,
               "; ".join(f"{p} {m} {o}" for _kind, p, m, o in (bad_keys or keys)))] if keys else []) + [
        _check(f"{host}: no certificate, key or directory writable by others", not writable,
               "; ".join(f"{p} {m}" for _kind, p, m, _owner in writable) or f"{len(entries)} entries"),
    ]


def sandbox_cluster_checks(outputs: list[str], members: list[str]) -> list[Check]:
    """outputs: etcdctl -w json of endpoint health --cluster, member list, endpoint status
    --cluster, endpoint hashkv (at one revision: sandbox_etcd data_equal) and (optional) alarm
    list (in that order)."""
    health = _loads(outputs[0], [])
    listed = _loads(outputs[1], {}).get("members", [])
    status = _loads(outputs[2], [])
    hashkv = _loads(outputs[3], [])
    leaders = {s.get("Status", {}).get("leader") for s in status}
    hashes = {h.get("HashKV", {}).get("hash") for h in hashkv}
    names = sorted(m.get("name", "") for m in listed)
    return [
        _check("every member healthy",
               len(health) == len(members) and all(h.get("health") for h in health),
               ", ".join(f"{h.get('endpoint')}={h.get('health')}" for h in health)),
        _check("member list has every member started", names == sorted(members),
               ", ".join(n or "(unstarted)" for n in names)),
        _check("a leader is present", len(leaders) == 1 and 0 not in leaders and None not in leaders,
               f"leader ids {sorted(f'{x:x}' for x in leaders if isinstance(x, int))}"),
        _check("hashkv equal on all members", len(hashkv) == len(members) and len(hashes) == 1,
               f"{len(hashes)} distinct hash(es) over {len(hashkv)} endpoint(s)"),
    ] + ([_alarm_check(_loads(outputs[4], {}), status)] if len(outputs) > 4 else [])


ALARMS = {1: "NOSPACE", 2: "CORRUPT"}


def _size(n: Any) -> str:
    value = float(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return ""


def _alarm_check(alarms: dict[str, Any], status: list[dict[str, Any]]) -> Check:
    """etcd's alarms (NOSPACE: the backend quota is full and every write is refused until
    space is freed and the alarm disarmed; CORRUPT) and each member's database size."""
    raised = [f"{ALARMS.get(a.get('alarm'), a.get('alarm'))} on {int(a.get('memberID', 0)):x}"
              for a in alarms.get("alarms") or []]
    sizes = ", ".join(f"{str(s.get('Endpoint', '')).rsplit('//', maxsplit=1)[-1]} {_size(s.get('Status', {}).get('dbSize'))}"
                      for s in status)
    return _check("no alarm raised (NOSPACE, CORRUPT)", not raised,
                  ("; ".join(raised) + "; " if raised else "") + f"database sizes: {sizes}")


def sandbox_peer_probes(members: dict[str, str], port: int, ca: str, cert: str,
                        key: str) -> list[dict[str, Any]]:
    """verify_member.py probes offering a client certificate to each member's peer port
    (``members``: name -> address), each expected to be refused in the handshake."""
    return [{"name": f"its etcd certificate refused on {name}'s peer port",
             "url": f"https://{address}:{int(port)}", "expect": False,
             "refusal": "BAD_CERTIFICATE", "ca": ca, "cert": cert, "key": key}
            for name, address in members.items()]


def sandbox_probe_checks(probes: list[dict[str, Any]], host: str) -> list[Check]:
    """Probes from verify_member.py: name, expect (True = must work, False = the server must
    refuse it), ok (True answered, False refused by the server, None neither), detail."""
    return [_check(f"{host}: {p['name']}", p.get("ok") == p["expect"], p.get("detail", ""))
            for p in probes]


def sandbox_cis_checks(lines: list[str], host: str, tls: bool) -> list[Check]:
    """CIS etcd 2.1-2.6 from the running process's ETCD_* environment and command line,
    plus its data dir (line 'DATADIR <mode> <owner>')."""
    env = dict(line.split("=", 1) for line in lines if line.startswith("ETCD_") and "=" in line)
    cmdline = " ".join(line for line in lines if not line.startswith(("ETCD_", "DATADIR")))
    datadir = next((line for line in lines if line.startswith("DATADIR")), "DATADIR missing")
    checks = [_check(f"{host}: data dir 0700 owned by etcd", datadir == "DATADIR 700 etcd", datadir)]
    if not tls:
        return checks

    def on(key: str) -> bool:
        return env.get(key, "").lower() in ON
    return checks + [
        _check(f"{host}: CIS 2.1 cert-file and key-file set",
               bool(env.get("ETCD_CERT_FILE")) and bool(env.get("ETCD_KEY_FILE"))),
        _check(f"{host}: CIS 2.2 client-cert-auth=true", on("ETCD_CLIENT_CERT_AUTH")),
        _check(f"{host}: CIS 2.3 auto-tls not true",
               not on("ETCD_AUTO_TLS") and "--auto-tls" not in cmdline),
        _check(f"{host}: CIS 2.4 peer-cert-file and peer-key-file set",
               bool(env.get("ETCD_PEER_CERT_FILE")) and bool(env.get("ETCD_PEER_KEY_FILE"))),
        _check(f"{host}: CIS 2.5 peer-client-cert-auth=true", on("ETCD_PEER_CLIENT_CERT_AUTH")),
        _check(f"{host}: CIS 2.6 peer-auto-tls not true",
               not on("ETCD_PEER_AUTO_TLS") and "--peer-auto-tls" not in cmdline),
    ]


def sandbox_prefix_checks(keys: list[str], tenants: list[str],
                          prefixes: dict[str, str]) -> list[Check]:
    """Per tested tenant: the keys its API server wrote for verify (API group
    ``<tenant>.verify.sandbox``) are all under its own prefix, and they are there."""
    checks = []
    for tenant in tenants:
        group = f"{tenant}.verify.sandbox"
        mine = [k for k in keys if f"/{group}/" in k or k.endswith(f"/probes.{group}")]
        outside = [k for k in mine if not k.startswith(prefixes[tenant])]
        checks.append(_check(
            f"{tenant}: its API server's objects are only under {prefixes[tenant]} in etcd (admin view)",
            len(mine) >= 2 and not outside,
            f"outside: {outside[:3]}" if outside
            else f"{len(mine)} key(s) of {group}, all under {prefixes[tenant]}"))
    return checks


def sandbox_unit_checks(units: dict[str, list[str]], host: str) -> list[Check]:
    """From sandbox_fingerprint op=units: one check per managed service on ``host``, failing
    with what differs from what its role gives it (a drop-in no role wrote, a process started
    with another environment or command line than its unit's)."""
    return [_check(f"{host}: {unit} runs as its role gives it (no drop-in of another's; its "
                   "process's environment and command line its unit's)", not problems,
                   "; ".join(problems)) for unit, problems in sorted((units or {}).items())]


def sandbox_check_lines(checks: list[Check]) -> list[str]:
    """One line per check: PASS / FAIL / SKIP, name and detail."""
    lines = []
    for c in checks:
        word = "SKIP" if c.get("skipped") else ("PASS" if c.get("ok") else "FAIL")
        detail = f" ({c['detail']})" if c.get("detail") and (word != "PASS") else ""
        lines.append(f"{word}  {c['name']}{detail}")
    return lines


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "sandbox_cluster_checks": sandbox_cluster_checks,
            "sandbox_file_checks": sandbox_file_checks,
            "sandbox_probe_checks": sandbox_probe_checks,
            "sandbox_peer_probes": sandbox_peer_probes,
            "sandbox_cis_checks": sandbox_cis_checks,
            "sandbox_prefix_checks": sandbox_prefix_checks,
            "sandbox_check_lines": sandbox_check_lines,
            "sandbox_unit_checks": sandbox_unit_checks,
        }
