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
             victims' entries may also name a "bait": a lease with no key that the victim
             granted itself, with its own certificate (its owner: the sandbox's etcd build
             refuses every other tenant its use)
  mode:      "quick": refusals only, nothing that would harm another tenant if it were let
             through (verify); "full": also the real attack (delete another tenant's whole
             prefix)
  phase:     "normal" (default) or "nospace": the same attempts while NOSPACE is raised (by
             the tenant's own fill on a build without budgets, else by the admin: the caller
             raises it between the two runs)
  fill:      (full mode, phase normal) after the attempts, write 1 MB values under its own
             prefix (fill_prefix) until etcd refuses: its write budget (the sandbox's build:
             "tenant write budget exceeded", no alarm) or NOSPACE; stopped by its budget, it
             then tries every way of writing once more (phase "over its budget": each refused)
  fill_prefix, fill_value_bytes, fill_max_bytes
Each attempt is recorded as refused, succeeded, allowed (what etcd or the sandbox grants every
tenant on purpose, with the reason), n/a (with the reason) or error (no answer that says
either). Prints {"tenant", "phases": [{"phase", "attempts": [{name, target, outcome,
detail}]}], "fill": {...}}. A few attempts speak gRPC (a lease ID of its own choosing, a put
nested in a transaction): through python3-etcd3's stubs where the node has them (the sandbox's
nodes do), else n/a. Order within a phase: data, leases, maintenance, membership, users
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
from pathlib import Path
from typing import Any

TIMEOUT = 10.0
WATCH_WINDOW = 1.5
# What etcd answers when it refuses for lack of permission (gRPC and the maintenance API).
DENIED = ("permission denied", "authentication failed", "invalid auth token",
          "user name is empty")
NOSPACE = "database space exceeded"
BUDGET = "tenant write budget exceeded"
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


# A lease an earlier attempt let through already revoked (a build without lease owners): the
# attempts on it in the later phase have no target.
GONE = ("requested lease not found", "lease not found")


def judge(a: Attempt, rc: int, out: str) -> tuple[str, str]:
    low = out.lower()
    if any(n in low for n in NOT_SENT) and (not a.run or low.startswith("usage: not sent")):
        return "n/a", ("this etcdctl has no such command or flag: nothing was sent" if not a.run
                       else out.split(": ", 2)[-1])
    if a.target.startswith("lease ") and rc != 0 and any(g in low for g in GONE):
        return "n/a", f"the lease is gone (revoked by an earlier attempt let through): {short(out)}"
    # its write budget refuses a tenant's own writes too (the sandbox's build): a refusal
    if any(d in low for d in DENIED) or BUDGET in low or any(r in low for r in a.refused_also):
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

    # -- attempts in gRPC (etcdctl has no nested transaction, no lease ID of one's choosing) ----
    def grpc(self) -> Any:
        """(KV stub, Lease stub, etcdrpc) with the tenant's certificate, or the reason why not."""
        if getattr(self, "_grpc", None) is None:
            try:
                import grpc  # type: ignore[import-not-found]
                from etcd3 import etcdrpc  # type: ignore[import-not-found]
                from etcd3.etcdrpc import rpc_pb2_grpc  # type: ignore[import-not-found]
            except ImportError as exc:
                self._grpc: Any = f"python3-etcd3 is not on this node ({exc})"
                return self._grpc
            first = next((a.split("=", 1)[1].split(",")[0] for a in self.ctl
                          if a.startswith("--endpoints=")), "")
            creds = grpc.ssl_channel_credentials(*(Path(self.spec[f]).read_bytes()
                                                   for f in ("ca", "key", "cert")))
            channel = grpc.secure_channel(first.split("://", 1)[-1], creds)
            self._grpc = (rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel), etcdrpc)
        return self._grpc

    def rpc(self, fn: Callable[[Any, Any, Any], Any]) -> tuple[int, str]:
        got = self.grpc()
        if isinstance(got, str):
            return 127, f"usage: not sent: {got}"
        try:
            return 0, str(fn(*got)).strip()[:200] or "accepted"
        except Exception as exc:   # an RpcError's details are etcd's answer
            details = getattr(exc, "details", None)
            return 1, str(details() if callable(details) else exc)

    def chosen_lease_id(self) -> tuple[int, str]:
        """Its own lease, then one with the ID the server would give next (server-chosen IDs
        count up): the ID another tenant's next grant on that member would get."""
        def go(kv: Any, lease: Any, rpc: Any) -> str:
            own = int(lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=60), timeout=TIMEOUT).ID)
            try:
                got = lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=60, ID=own + 1), timeout=TIMEOUT)
                lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=int(got.ID)), timeout=TIMEOUT)
                return f"granted lease {own + 1:x}, the ID it chose (revoked again)"
            finally:
                lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=own), timeout=TIMEOUT)
        return self.rpc(go)

    def nested_put(self, key: str, size: int = 1000) -> tuple[int, str]:
        def go(kv: Any, lease: Any, rpc: Any) -> str:
            inner = rpc.TxnRequest(success=[rpc.RequestOp(request_put=rpc.PutRequest(
                key=key.encode(), value=os.urandom(size)))])
            kv.Txn(rpc.TxnRequest(success=[rpc.RequestOp(request_txn=inner)]), timeout=TIMEOUT)
            return f"a {size}-byte put nested in a transaction applied"
        return self.rpc(go)

    def keep_values(self, keys: list[str]) -> tuple[int, str]:
        def go(kv: Any, lease: Any, rpc: Any) -> str:
            kv.Txn(rpc.TxnRequest(success=[rpc.RequestOp(request_put=rpc.PutRequest(
                key=k.encode(), ignore_value=True)) for k in keys]), timeout=TIMEOUT)
            return f"{len(keys)} puts keeping their values applied"
        return self.rpc(go)

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
            tls = err if isinstance(err, ssl.SSLError) else getattr(err, "reason", None)
            # only the server's own refusal counts: a TLS alert it sent (a bad or unknown
            # certificate, one whose CN the port does not admit); nothing listening, a timeout
            # or a port that speaks no TLS is no answer (the attempt is then an error)
            if isinstance(tls, ssl.SSLError) and "ALERT" in str(tls.reason or "").upper():
                return 1, f"refused at the TLS handshake: the server's alert {tls.reason}"
            return 1, f"no refusal from the server: {getattr(err, 'reason', err)}"

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
                        self.e("lease", "revoke", empty)),
            ]
            bait = v.get("bait")
            if bait:
                # the victim's own lease with no key yet, as its API server's is a moment
                # after the grant: etcd checks a lease only against the keys attached to it
                out += [
                    Attempt("attach its key to another tenant's own lease with no key", f"lease {bait}",
                            self.e("put", work + "on-bait", "x", f"--lease={bait}"), refused_also=also),
                    Attempt("keep another tenant's own lease with no key alive", f"lease {bait}",
                            self.e("lease", "keep-alive", "--once", bait)),
                    Attempt("read the TTL of another tenant's own lease", f"lease {bait}",
                            self.e("lease", "timetolive", bait)),
                    Attempt("revoke another tenant's own lease with no key", f"lease {bait}",
                            self.e("lease", "revoke", bait)),
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
            Attempt("a put into its own prefix nested in a transaction (etcd-io/etcd#22167: it cost "
                    "nothing against the quota)", own + WORK, run=lambda: self.nested_put(work + "nested"),
                    allowed="" if nospace else "its own prefix, within its budget", refused_also=also),
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
            Attempt("grant a lease with the ID the server gives another tenant next (its own choice)",
                    "lease ID", run=self.chosen_lease_id, refused_also=also),
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

    def top_up(self) -> int:
        """After its fill: what room its budget still has taken with smaller puts and leases,
        as a flood takes it, so that no write of any size fits (the attempts then show each
        way refused). Returns the bytes written."""
        n = written = 0
        for size in (100000, 10000, 1000, 100, 1):
            for _attempt in range(200):
                rc = sh(self.e("put", f"{self.spec['fill_prefix']}top-{n:06d}"), stdin="x" * size)[0]
                n += 1
                if rc != 0:
                    break
                written += size
        for _attempt in range(50):
            if sh(self.e("lease", "grant", "600"))[0] != 0:
                break
        return written

    def over_budget(self, kept: list[str]) -> list[Attempt]:
        """Every way of writing, once the tenant's own fill was stopped by its write budget:
        each refused ("tenant write budget exceeded") but deletes, which free space."""
        work = self.spec["fill_prefix"] + "over-"   # keys as long as the top-up's
        over = (BUDGET,)
        return [
            Attempt("a put into its own prefix", work + "put", self.e("put", work + "put000", "x"),
                    refused_also=over),
            Attempt("a put nested in a transaction", work + "nested",
                    run=lambda: self.nested_put(work + "nested", 1), refused_also=over),
            Attempt("puts that store its big keys again (ignore_value)", work,
                    run=lambda: self.keep_values(kept[:16]), refused_also=over,
                    na="" if kept else "its fill wrote no key"),
            Attempt("grant a lease", "lease", self.e("lease", "grant", "60"), refused_also=over),
            Attempt("delete one of its own keys", kept[0] if kept else work, self.e("del", kept[0] if kept else work + "x"),
                    allowed="deletes pass a write budget: a tenant over it may free space",
                    refused_also=over),
        ]

    def attempt(self, a: Attempt) -> dict[str, Any]:
        if a.na:
            return {"name": a.name, "target": a.target, "outcome": "n/a", "detail": a.na}
        rc, out = a.run() if a.run else sh(a.argv, a.stdin)
        outcome, detail = judge(a, rc, out)
        return {"name": a.name, "target": a.target, "outcome": outcome, "detail": detail}

    def fill(self) -> dict[str, Any]:
        """Write under the tenant's own prefix until etcd refuses: its write budget (the
        sandbox's build, no alarm) or NOSPACE (the whole cluster's quota)."""
        size = int(self.spec.get("fill_value_bytes", 1000000))
        limit = int(self.spec.get("fill_max_bytes", 64 * 1024 * 1024))
        value = base64.b64encode(os.urandom(size))[:size].decode()
        written, n, t0, stopped = 0, 0, time.monotonic(), ""
        keys: list[str] = []
        while written < limit:
            key = f"{self.spec['fill_prefix']}{n}"
            rc, out = sh(self.e("put", key), stdin=value, timeout=30)
            if NOSPACE in out or BUDGET in out:
                stopped = "budget" if BUDGET in out else "nospace"
                break
            if rc != 0:
                return {"ok": False, "detail": f"put {n} failed: {short(out)}", "bytes": written,
                        "keys": keys}
            keys.append(key)
            written += size
            n += 1
        rc, alarms = sh(self.e("alarm", "list"))
        raised = "NOSPACE" in alarms
        seconds = round(time.monotonic() - t0, 1)
        if stopped == "budget":
            return {"ok": not raised, "stopped_by": "budget", "bytes": written, "puts": n,
                    "seconds": seconds, "keys": keys, "alarms": alarms.strip(),
                    "detail": (f"stopped by its write budget after {n} puts of {size} bytes under its "
                               "own prefix ('tenant write budget exceeded'), no alarm"
                               if not raised else f"stopped by its budget, but an alarm is raised: {short(alarms)}")}
        return {"ok": raised, "stopped_by": "nospace" if raised else "", "bytes": written, "puts": n,
                "seconds": seconds, "keys": keys,
                "detail": (f"NOSPACE raised after {n} puts of {size} bytes under its own prefix: no "
                           "write budget stopped it" if raised else f"no NOSPACE after {written} bytes: {short(alarms)}")}


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
    phase = spec.get("phase", "normal")
    result["phases"].append({"phase": phase, "attempts": [suite.attempt(a) for a in suite.attempts(phase)]})
    if suite.full and phase == "normal" and (spec.get("fill") or spec.get("nospace")):
        fill = suite.fill()
        result["fill"] = fill
        if fill.get("stopped_by") == "budget":
            fill["topped_up_bytes"] = suite.top_up()
            result["phases"].append({"phase": "over its budget", "attempts": [
                suite.attempt(a) for a in suite.over_budget(fill.get("keys") or [])]})
        elif fill.get("stopped_by") == "nospace" and spec.get("nospace"):
            # no budget stopped it (a build without them): it raised NOSPACE itself
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
