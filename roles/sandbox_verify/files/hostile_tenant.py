#!/usr/bin/env python3
"""A hostile tenant's attempts on the etcd it shares, run ON its controller with only what its
API server has there: etcdctl with k0s.yaml's endpoints and the tenant's CA, certificate and
key (its etcd user, confined by etcd RBAC to its prefix), and the network.

usage: hostile_tenant.py SPEC   (SPEC = base64 of a JSON object; stdlib only)
  etcdctl:   argv of etcdctl as the tenant (endpoints and its files)
  tenant:    its name (= its etcd user and role); prefix: "/<prefix>/"
  victims:   [{tenant, prefix, key, lease, empty_leases}]: the other tenants, each with a key
             under its prefix and a lease with that key attached (made by the admin as the
             tenant's API server makes its own), and per attacking tenant a lease with no key
             attached (empty_leases[tenant])
  members:   [{name, client_url, peer_url}] (the member list is read by the suite too)
  ca, cert, key: the tenant's files (for the attempts made without etcdctl)
  metrics:   ["http://<member>:2381", ...] the members' metrics listeners ("" = none)
  compact_rev_key: "read" | "readwrite": what the tenant's role grants on kube-apiserver's
             compaction key (readwrite only where the tenants' API servers compact)
  mode:      "quick": refusals only, nothing that would harm another tenant if it were let
             through (verify); "full": also the real attack (delete another tenant's whole
             prefix) and, with nospace, everything again while NOSPACE is raised
  nospace:   fill the backend quota through the tenant's own prefix (fill_prefix) until etcd
             raises NOSPACE, then try everything again (full mode)
  fill_prefix, fill_value_bytes, fill_max_bytes
Each attempt is recorded as refused, succeeded, allowed (what etcd or the sandbox grants every
tenant on purpose, with the reason), n/a (with the reason) or error (no answer that says
either). Prints {"tenant", "phases": [{"phase", "attempts": [{name, target, outcome,
detail}]}], "fill": {...}}. Order within a phase: data, leases, maintenance, membership, users
and roles, auth disable last, so that an escalation let through does not make the attempts
after it look like bypasses of their own.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TIMEOUT = 10.0
WATCH_WINDOW = 1.5
# What etcd answers when it refuses for lack of permission (gRPC and the maintenance API).
DENIED = ("permission denied", "authentication failed", "invalid auth token",
          "user name is empty")
NOSPACE = "database space exceeded"
WORK = "k0sbox-attack/"


@dataclass
class Attempt:
    name: str
    target: str
    argv: list[str] = field(default_factory=list)
    stdin: str | None = None
    # allowed: the reason etcd or the sandbox lets every tenant do this (not counted as a
    # bypass); informational attempts whose answer depends on the etcd version say "either".
    allowed: str = ""
    either: str = ""
    # a refusal that is not etcd's permission check but still a refusal (e.g. NOSPACE)
    refused_also: tuple[str, ...] = ()
    # text that proves the request passed the permission check although etcdctl failed
    passed_if: tuple[str, ...] = ()
    run: Callable[[], tuple[int, str]] | None = None
    na: str = ""


def sh(argv: list[str], stdin: str | None = None, timeout: float = TIMEOUT) -> tuple[int, str]:
    try:
        res = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                             timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"no answer after {timeout:.0f}s"
    except OSError as err:
        return 127, str(err)
    text = "\n".join(ln for ln in (res.stderr + "\n" + res.stdout).splitlines()
                     if ln.strip() and "retry_interceptor" not in ln)
    return res.returncode, text.strip()


def short(text: str) -> str:
    return " | ".join(text.splitlines()[-2:])[:300]


# What etcdctl prints when it does not have the command or flag (etcdctl 3.4 has no `auth
# status`, and prints the `auth` command's help with exit 0): no request was sent.
NOT_SENT = ("usage:", "unknown command", "unknown flag", "unknown shorthand flag")


def judge(a: Attempt, rc: int, out: str) -> tuple[str, str]:
    low = out.lower()
    if not a.run and any(n in low for n in NOT_SENT):
        return "n/a", "this etcdctl has no such command or flag: nothing was sent"
    if any(d in low for d in DENIED) or any(r in low for r in a.refused_also):
        outcome = "refused"
    elif rc == 0 or any(p in low for p in a.passed_if):
        outcome = "succeeded"
    else:
        return "error", short(out) or f"exit {rc}"
    if a.either:
        return ("allowed" if outcome == "succeeded" else "refused"), f"{a.either}: {short(out)}"
    if a.allowed:
        if outcome == "succeeded":
            return "allowed", f"{a.allowed}: {short(out)}"
        return "refused", short(out)
    return outcome, short(out)


class Suite:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.ctl = list(spec["etcdctl"]) + ["--dial-timeout=3s", "--command-timeout=8s"]
        self.tenant = spec["tenant"]
        self.prefix = spec["prefix"]
        self.victims = spec.get("victims", [])
        self.full = spec.get("mode") == "full"
        self.tmp = tempfile.mkdtemp(prefix="k0sbox-attack-")

    def e(self, *args: str) -> list[str]:
        return [*self.ctl, *args]

    # -- attempts that need more than one etcdctl call ------------------------------------
    def watch(self, key: str, range_end: str) -> tuple[int, str]:
        """etcdctl watch -i (a NUL byte can be sent as a range end, every key >= key, only on
        stdin; stdin stays open, or etcdctl stops). etcd cancels a refused watch at once;
        one still open when the window ends was let through."""
        proc = subprocess.Popen(self.e("watch", "-i"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        proc.stdin.write(f"watch {key} {range_end}\n".encode())
        proc.stdin.flush()
        text, end = b"", time.monotonic() + WATCH_WINDOW
        try:
            while time.monotonic() < end and b"canceled" not in text and proc.poll() is None:
                select.select([proc.stdout], [], [], max(0.0, end - time.monotonic()))
                text += proc.stdout.read() or b""
        finally:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            text += proc.stdout.read() or b""
            proc.stdout.close()
        out = text.decode(errors="replace")
        if "canceled" in out or "Error" in out:
            return 1, out
        return 0, f"watch open after {WATCH_WINDOW}s: {out}"

    def snapshot(self) -> tuple[int, str]:
        """etcdctl asks one member for a snapshot: the first of the tenant's endpoints."""
        path = os.path.join(self.tmp, "snapshot.db")
        ctl = [a for a in self.ctl if not a.startswith("--endpoints=")]
        first = next((a.split("=", 1)[1].split(",")[0] for a in self.ctl
                      if a.startswith("--endpoints=")), "")
        try:
            return sh([*ctl, *([f"--endpoints={first}"] if first else []),
                       "snapshot", "save", path], timeout=30)
        finally:
            for p in (path, path + ".part"):
                if os.path.exists(p):
                    os.unlink(p)

    def https(self, url: str, body: bytes | None = None, proof: str = "") -> tuple[int, str]:
        """A request with the tenant's certificate over HTTP/1.1 (etcd's peer listener
        answers HTTP/2 over TLS 1.3 with a closed connection, FACTS.md): 0 only when the
        answer holds ``proof`` (or is any 2xx when proof is empty)."""
        ctx = ssl.create_default_context(cafile=self.spec["ca"])
        ctx.load_cert_chain(self.spec["cert"], self.spec["key"])
        ctx.set_alpn_protocols(["http/1.1"])
        req = urllib.request.Request(url, data=body, method="POST" if body else "GET")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=TIMEOUT) as resp:
                text = resp.read(400).decode(errors="replace")
                ok = proof in text if proof else True
                return (0 if ok else 1), f"HTTP {resp.status}: {text}"
        except urllib.error.HTTPError as err:
            return 1, f"HTTP {err.code} {err.read(200).decode(errors='replace')}"
        except (urllib.error.URLError, ssl.SSLError, OSError) as err:
            return 1, f"refused at the TLS handshake or connection: {getattr(err, 'reason', err)}"

    def http(self, url: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
                return 0, f"HTTP {resp.status}, {len(resp.read())} bytes"
        except (urllib.error.URLError, OSError) as err:
            return 1, f"not served: {getattr(err, 'reason', err)}"

    def members(self) -> list[dict[str, Any]]:
        rc, out = sh(self.e("member", "list", "-w", "json"))
        try:
            return json.loads(out[out.index("{"):]).get("members", []) if rc == 0 else []
        except ValueError:
            return []

    # -- the list --------------------------------------------------------------------------
    def attempts(self, phase: str) -> list[Attempt]:
        nospace = phase == "nospace"
        own = self.prefix
        stem = own.rstrip("/")
        work = own + WORK
        full = self.full
        out: list[Attempt] = []
        roles: list[Attempt] = []   # user and role changes: after everything else
        also = (NOSPACE,) if nospace else ()
        for v in self.victims:
            vp, vk, vt = v["prefix"], v["key"], v["tenant"]
            empty = (v.get("empty_leases") or {}).get(self.tenant) or v.get("empty_lease", "0")
            out += [
                Attempt("read another tenant's key", vk, self.e("get", vk)),
                Attempt("list another tenant's prefix", vp, self.e("get", "--prefix", "--keys-only", vp)),
                Attempt("write into another tenant's prefix", vp + WORK,
                        self.e("put", vp + WORK + "x", "x"), refused_also=also),
                Attempt("delete another tenant's key", vk, self.e("del", vk)),
            ]
            if full:
                out.append(Attempt("delete another tenant's whole prefix", vp,
                                   self.e("del", "--prefix", vp)))
            out += [
                Attempt("watch another tenant's prefix", vp, run=lambda vp=vp: self.watch(vp, vp[:-1] + "0")),
                Attempt("txn comparing another tenant's key", vk,
                        self.e("txn"), stdin=f'mod("{vk}") > "0"\n\nput {work}txn x\n\n\n', refused_also=also),
                Attempt("txn reading another tenant's key", vk, self.e("txn"), stdin=f"\nget {vk}\n\n\n"),
                Attempt("txn deleting another tenant's key", vk, self.e("txn"), stdin=f"\ndel {vk}\n\n\n"),
                Attempt("put on another tenant's lease", f"lease {v['lease']}",
                        self.e("put", work + "on-lease", "x", f"--lease={v['lease']}"), refused_also=also),
                Attempt("revoke another tenant's lease (a key attached)", f"lease {v['lease']}",
                        self.e("lease", "revoke", v["lease"])),
                Attempt("read the keys of another tenant's lease", f"lease {v['lease']}",
                        self.e("lease", "timetolive", v["lease"], "--keys")),
                Attempt("keep another tenant's lease alive", f"lease {v['lease']}",
                        self.e("lease", "keep-alive", "--once", v["lease"])),
                Attempt("the TTL of another tenant's lease", f"lease {v['lease']}",
                        self.e("lease", "timetolive", v["lease"]),
                        either="etcd answers a lease's TTL (not its keys) to any user"),
                Attempt("revoke another tenant's lease with no key attached", f"lease {empty}",
                        self.e("lease", "revoke", empty),
                        allowed="etcd checks a revoke against the keys attached to the lease: "
                                "one with none is anyone's to revoke",
                        na="revoked in the first phase already" if nospace else ""),
            ]
            roles += [
                Attempt("grant itself another tenant's role", vt,
                        self.e("user", "grant-role", self.tenant, vt)),
                Attempt("grant itself another tenant's prefix", vp,
                        self.e("role", "grant-permission", self.tenant, "readwrite", vp, "--prefix=true")),
                Attempt("take another tenant's prefix from its role", vp,
                        self.e("role", "revoke-permission", vt, vp, "--prefix=true")),
                Attempt("take another tenant's role from its user", vt,
                        self.e("user", "revoke-role", vt, vt)),
            ]
        out += [
            Attempt("watch every key from its own key on (GHSA-xg4h-6gfc-h4m8)", own + "~ ..",
                    run=lambda: self.watch(own + "~", "\x00")),
            Attempt("read the whole keyspace", "\\x00 ..", self.e("get", "", "--from-key", "--keys-only", "--limit=1")),
            Attempt("write the bare key of its prefix", stem, self.e("put", stem, "x"), refused_also=also),
            Attempt("write into a neighbour prefix", stem + "a/", self.e("put", stem + "a/" + WORK, "x"),
                    refused_also=also),
            Attempt("read the end of its range", stem + "0", self.e("get", stem + "0")),
            Attempt("list every key its prefix's stem starts", stem, self.e("get", "--prefix", "--keys-only", stem)),
            Attempt("read kube-apiserver's compaction key", "compact_rev_key",
                    self.e("get", "compact_rev_key"),
                    allowed="every tenant's API server reads and watches it (its compaction revision)"),
        ]
        write_crk = Attempt("write kube-apiserver's compaction key", "compact_rev_key",
                            self.e("put", "compact_rev_key", "0"), refused_also=also)
        if self.spec.get("compact_rev_key") == "readwrite":
            write_crk.allowed = ("the tenants' API servers compact (k0s_etcd_compaction_interval is "
                                 "not \"0\"): each must write it")
        out.append(write_crk)
        out += [
            Attempt("list every lease", "leases", self.e("lease", "list")),
            Attempt("grant a lease of its own", "lease", self.e("lease", "grant", "60"),
                    allowed="kube-apiserver grants leases (events, endpoints)", refused_also=also),
            Attempt("list the alarms", "alarms", self.e("alarm", "list"),
                    allowed="etcd answers AlarmList to any user (3.5.29+, etcd-io/etcd#21550)"),
            Attempt("disarm the alarms", "alarms", self.e("alarm", "disarm"),
                    na="" if nospace else "no alarm is raised: etcdctl sends no disarm"),
            Attempt("defragment", "members", self.e("defrag"), refused_also=()),
            Attempt("snapshot the whole keyspace", "members", run=self.snapshot),
            Attempt("compact the keyspace", "revision 1", self.e("compaction", "1"),
                    passed_if=("compacted",)),
            Attempt("hash the keyspace", "members", self.e("endpoint", "hashkv")),
            Attempt("read a member's status", "members", self.e("endpoint", "status"),
                    either="etcd 3.5.32+/3.6.12+ answers Status to any user; 3.5.28-3.5.31 to root only"),
            Attempt("list the members", "members", self.e("member", "list"),
                    allowed="clients find the members so (etcd 3.5.29+, etcd-io/etcd#21550)"),
        ]
        members = self.members()
        other = next((format(m["ID"], "x") for m in members if not m.get("isLearner")), "1")
        out += [
            Attempt("move the leadership", f"member {other}", self.e("move-leader", other)),
            Attempt("add a member", "learner https://192.0.2.1:2380",
                    self.e("member", "add", "k0sbox-attack", "--peer-urls=https://192.0.2.1:2380", "--learner")),
            Attempt("remove a member", "member 1234abcd", self.e("member", "remove", "1234abcd")),
            Attempt("promote a member", "member 1234abcd", self.e("member", "promote", "1234abcd")),
            Attempt("change a member's peer URL", "member 1234abcd",
                    self.e("member", "update", "1234abcd", "--peer-urls=https://192.0.2.1:2380")),
        ]
        handshake = ("refused at the tls handshake",)
        for m in self.spec.get("members", []):
            out.append(Attempt("its certificate on a member's peer port", m["peer_url"],
                               run=lambda u=m["peer_url"]: self.https(u + "/members", proof="peerURLs"),
                               refused_also=handshake))
        for m in self.spec.get("members", [])[:1]:
            k = base64.b64encode((self.victims[0]["key"] if self.victims else own).encode()).decode()
            out += [
                # etcd answers a client certificate on its JSON gateway with a refusal (the
                # gateway would act as the member itself): tried, not assumed.
                Attempt("the JSON gateway with its certificate", m["client_url"] + "/v3/kv/range",
                        run=lambda u=m["client_url"], k=k: self.https(
                            u + "/v3/kv/range", json.dumps({"key": k}).encode(), proof='"header"'),
                        refused_also=("will be ignored", "http 4") + handshake),
                Attempt("the v2 API", m["client_url"] + "/v2/keys/",
                        run=lambda u=m["client_url"]: self.https(u + "/v2/keys/", proof='"node"'),
                        refused_also=("http 404",) + handshake),
                Attempt("the member's /debug/vars with its certificate", m["client_url"] + "/debug/vars",
                        run=lambda u=m["client_url"]: self.https(u + "/debug/vars", proof='"cmdline"'),
                        refused_also=("http 404",) + handshake,
                        allowed="etcd serves its runtime counters and command line to any client "
                                "certificate (roles/etcd passes the settings in the environment: "
                                "the command line is the binary's path); no key or value"),
            ]
        for url in [u for u in self.spec.get("metrics", []) if u][:1]:
            out.append(Attempt("the metrics listener without a certificate", url + "/metrics",
                               run=lambda u=url: self.http(u + "/metrics"),
                               allowed="plain-HTTP /metrics and /health for monitoring "
                                       "(etcd_metrics_port): sizes and counters, no key or value"))
        out += [
            Attempt("log in as root with a password", "root",
                    self.e("--user", "root", "--password", "k0sbox-attack", "get", own)),
            Attempt("read the auth status", "auth", self.e("auth", "status")),
            Attempt("list the users", "users", self.e("user", "list")),
            Attempt("list the roles", "roles", self.e("role", "list")),
            *roles,
            Attempt("add a user", "k0sbox-attack-user", self.e("user", "add", "k0sbox-attack-user", "--no-password")),
            Attempt("add a role", "k0sbox-attack-role", self.e("role", "add", "k0sbox-attack-role")),
            Attempt("set a user's password", "k0sbox-attack-nobody",
                    self.e("user", "passwd", "k0sbox-attack-nobody", "--interactive=false"),
                    stdin="k0sbox-attack\n", passed_if=("user name not found",)),
            Attempt("grant its role the whole keyspace", "/",
                    self.e("role", "grant-permission", self.tenant, "readwrite", "/", "--prefix=true")),
            Attempt("grant itself root", "root", self.e("user", "grant-role", self.tenant, "root")),
            Attempt("enable auth", "auth", self.e("auth", "enable")),
            Attempt("disable auth", "auth", self.e("auth", "disable")),
        ]
        return out

    def attempt(self, a: Attempt) -> dict[str, Any]:
        if a.na:
            return {"name": a.name, "target": a.target, "outcome": "n/a", "detail": a.na}
        rc, out = a.run() if a.run else sh(a.argv, a.stdin)
        outcome, detail = judge(a, rc, out)
        return {"name": a.name, "target": a.target, "outcome": outcome, "detail": detail}

    def fill(self) -> dict[str, Any]:
        """Write under the tenant's own prefix until etcd raises NOSPACE."""
        size = int(self.spec.get("fill_value_bytes", 1000000))
        limit = int(self.spec.get("fill_max_bytes", 64 * 1024 * 1024))
        value = base64.b64encode(os.urandom(size))[:size].decode()
        written, n, t0 = 0, 0, time.monotonic()
        while written < limit:
            rc, out = sh(self.e("put", f"{self.spec['fill_prefix']}{n}"), stdin=value, timeout=30)
            if NOSPACE in out:
                break
            if rc != 0:
                return {"ok": False, "detail": f"put {n} failed: {short(out)}", "bytes": written}
            written += size
            n += 1
        rc, alarms = sh(self.e("alarm", "list"))
        ok = "NOSPACE" in alarms
        return {"ok": ok, "bytes": written, "puts": n, "seconds": round(time.monotonic() - t0, 1),
                "detail": (f"NOSPACE raised after {n} puts of {size} bytes under its own prefix"
                           if ok else f"no NOSPACE after {written} bytes: {short(alarms)}")}


def run_phases(spec: dict[str, Any]) -> dict[str, Any]:
    """Normal attempts first, then (full mode with nospace) the fill and the same again."""
    suite = Suite(spec)
    try:
        return _phases(suite, spec)
    finally:
        os.rmdir(suite.tmp)


def _phases(suite: Suite, spec: dict[str, Any]) -> dict[str, Any]:
    client = sh([suite.ctl[0], "version"])[1]
    result: dict[str, Any] = {"tenant": suite.tenant, "client": " ".join(client.split()),
                              "phases": []}
    result["phases"].append({"phase": "normal", "attempts": [suite.attempt(a) for a in suite.attempts("normal")]})
    if suite.full and spec.get("nospace"):
        fill = suite.fill()
        result["fill"] = fill
        if fill["ok"]:
            result["phases"].append({"phase": "nospace",
                                     "attempts": [suite.attempt(a) for a in suite.attempts("nospace")]})
    return result


def main() -> int:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    socket.setdefaulttimeout(TIMEOUT)
    print(json.dumps(run_phases(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
