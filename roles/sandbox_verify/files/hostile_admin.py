#!/usr/bin/env python3
"""The admin's side of the hostile-tenant suite (hostile_tenant.py runs the attempts), run ON
the first etcd member with etcdctl as the admin (the member's wrapper: its endpoints and the
admin certificate).

usage: hostile_admin.py SPEC   (SPEC = base64 of a JSON object; stdlib only)
  op: "prepare" | "fill" | "finish"
  etcdctl: argv of etcdctl as the admin
  tenants: [{name, prefix}]  (prefix as kube-apiserver uses it: "/<prefix>/")
prepare: for each tenant a key under its prefix with a lease attached (the other tenants try
  to read, delete and revoke them, as its API server's own), and a lease with no key attached
  for each other tenant to revoke;
  each tenant's keys as they are (key, create and mod revision, version, lease, sha256 of the
  value). Prints {"targets": {tenant: {...}}, "keys": {tenant:
  [[key, create, mod, version, lease, sha256], ...]}}; a target: {tenant, prefix, key, lease,
  empty_leases: {attacking tenant: lease}}. With keys_file (a path on the member): the keys
  written there (0600) instead, and {"targets", "keys_file", "key_counts"} printed.
fill: as the admin, 1 MB values under k0sbox-attack-fill/ (a range no tenant may touch) until
  etcd raises NOSPACE -- where the tenants' write budgets stop a tenant's own fill first, the
  suite's attempts under NOSPACE need the admin to raise it (fill_max_bytes: the most to write).
  Prints {"raised": bool, "bytes", "puts", "detail"}; finish's caller deletes the range.
finish (also: targets, keys or keys_file from prepare (the file removed after); recovered: what the caller undid before, said again
  in the result). The caller deletes the attempts' fill and undoes NOSPACE first, as
  `scripts/sandbox defrag --compact` does (roles/etcd/tasks/defrag/cluster.yml; sandbox_verify's
  tasks/attack_finish.yml); then:
  - auth as the attempts left it (read before anything is repaired);
  - a member the attempts added (k0sbox-attack) removed;
  - the suite's keys and leases removed, then each tenant's keys compared with prepare's;
  - the cluster's health and the alarms after.
  Prints {"auth": "on"|"off", "recovered": [...], "changed": {tenant: [...]}, "healthy": bool,
  "alarms": str, "detail": [...]}. The RBAC repair (a role or user changed by an attempt let
  through) is the etcd role's reconcile (roles/etcd/tasks/rbac.yml), run after this.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORK = "k0sbox-attack/"


class Admin:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.ctl = list(spec["etcdctl"])

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> tuple[int, str]:
        try:
            res = subprocess.run([*self.ctl, *args], input=stdin, capture_output=True,
                                 text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return 124, f"no answer after {timeout:.0f}s"
        return res.returncode, (res.stdout + res.stderr).strip()

    def must(self, *args: str) -> str:
        rc, out = self.run(*args)
        if rc != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {out[-300:]}")
        return out

    def json(self, *args: str) -> Any:
        return json.loads(self.must(*args, "-w", "json"))

    def lease(self, ttl: int = 900) -> str:
        return format(int(self.json("lease", "grant", str(ttl))["ID"]), "x")

    def keys(self, prefix: str) -> list[list[Any]]:
        got = self.json("get", "--prefix", prefix)
        out = []
        for kv in got.get("kvs") or []:
            key = base64.b64decode(kv["key"]).decode(errors="replace")
            if key.startswith(prefix + WORK):
                continue
            value = base64.b64decode(kv.get("value", ""))
            out.append([key, int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                        int(kv.get("version", 0)), format(int(kv.get("lease", 0)), "x"),
                        hashlib.sha256(value).hexdigest()])
        return out


def prepare(a: Admin, spec: dict[str, Any]) -> dict[str, Any]:
    rc, alarms = a.run("alarm", "list")
    if rc != 0 or alarms.strip():
        raise RuntimeError(f"etcd has an alarm raised ({' '.join(alarms.split())}): the attempts "
                           "need a cluster without one; clear it first (scripts/sandbox defrag "
                           "--compact)")
    targets, keys = {}, {}
    for t in spec["tenants"]:
        lease = a.lease()
        key = f"{t['prefix']}{WORK}canary"
        a.must("put", key, "a key of this tenant's, with a lease attached", f"--lease={lease}")
        # one lease with no key per attacking tenant: each tenant's attempts revoke their own
        # (verify runs every tenant's at once)
        empty = {o["name"]: a.lease() for o in spec["tenants"] if o["name"] != t["name"]}
        targets[t["name"]] = {"tenant": t["name"], "prefix": t["prefix"], "key": key,
                              "lease": lease, "empty_leases": empty}
        keys[t["name"]] = a.keys(t["prefix"])
    if spec.get("keys_file"):
        # Kept on the member for finish, not passed back through the command line: a tenant
        # of a few thousand objects is more than one argument may hold (Linux's 128 kB
        # MAX_ARG_STRLEN: "Argument list too long" from a verify after a move of 700 objects).
        path = Path(spec["keys_file"])
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(keys, fh)
        return {"targets": targets, "keys_file": str(path),
                "key_counts": {n: len(k) for n, k in keys.items()}}
    return {"targets": targets, "keys": keys}


ADMIN_FILL = "k0sbox-attack-fill/"


def fill(a: Admin, spec: dict[str, Any]) -> dict[str, Any]:
    """1 MB values under ADMIN_FILL as the admin until etcd raises NOSPACE."""
    size, limit = 1000000, int(spec.get("fill_max_bytes", 256 * 1024 * 1024))
    value = base64.b64encode(os.urandom(size))[:size].decode()
    written = n = 0
    while written < limit:
        rc, out = a.run("put", f"{ADMIN_FILL}{n}", stdin=value, timeout=30)
        if "database space exceeded" in out:
            break
        if rc != 0:
            return {"raised": False, "bytes": written, "puts": n,
                    "detail": f"put {n} failed: {' '.join(out.split())[-200:]}"}
        written += size
        n += 1
    raised = "NOSPACE" in a.run("alarm", "list")[1]
    return {"raised": raised, "bytes": written, "puts": n,
            "detail": (f"the admin raised NOSPACE after {n} puts of {size} bytes under {ADMIN_FILL}"
                       if raised else f"no NOSPACE after {written} bytes")}


def auth_state(a: Admin) -> str:
    rc, out = a.run("auth", "status")
    if rc == 0:
        return "on" if "Status: true" in out else "off"
    return f"unknown ({out[-200:]})"


def finish(a: Admin, spec: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"auth": auth_state(a), "recovered": list(spec.get("recovered") or []),
                              "detail": []}
    if result["auth"] == "off":
        # Everything below needs the admin's rights only; the reconcile turns auth on again.
        result["detail"].append("auth was off after the attempts")
    members = a.json("member", "list").get("members") or []
    for m in members:
        if m.get("name") == "k0sbox-attack" or any("192.0.2.1" in u for u in m.get("peerURLs") or []):
            mid = format(int(m["ID"]), "x")
            rc, out = a.run("member", "remove", mid)
            result["recovered"].append(f"member {mid} added by an attempt removed" if rc == 0
                                       else f"member remove {mid}: {out[-200:]}")
    changed: dict[str, list[str]] = {}
    kept = spec.get("keys")
    if kept is None and spec.get("keys_file"):
        path = Path(spec["keys_file"])
        kept = json.loads(path.read_text())
        path.unlink()
    kept = kept or {}
    for name, target in (spec.get("targets") or {}).items():
        for lease in [target["lease"], *(target.get("empty_leases") or {}).values(),
                      *([target["bait"]] if target.get("bait") else [])]:
            a.run("lease", "revoke", lease)   # gone already when an attempt revoked it
        a.run("del", "--prefix", target["prefix"] + WORK)
        before = {k[0]: k for k in kept.get(name, [])}
        after = {k[0]: k for k in a.keys(target["prefix"])}
        diff = [f"{k} deleted" for k in sorted(before.keys() - after.keys())]
        diff += [f"{k} written (not there before)" for k in sorted(after.keys() - before.keys())]
        diff += [f"{k} changed (mod revision {before[k][2]} -> {after[k][2]})"
                 for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]
        if diff:
            changed[name] = diff
    result["changed"] = changed
    result["kept"] = {name: len(k) for name, k in kept.items()}
    rc, out = a.run("endpoint", "health", "--cluster")
    result["healthy"] = rc == 0 and "unhealthy" not in out
    result["health"] = " | ".join(out.splitlines()[:5])
    rc, alarms = a.run("alarm", "list")
    result["alarms"] = alarms.strip()
    return result


def main() -> int:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    a = Admin(spec)
    try:
        out = {"prepare": prepare, "fill": fill, "finish": finish}[spec["op"]](a, spec)
    except RuntimeError as exc:
        print(f"hostile_admin.py {spec['op']}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
