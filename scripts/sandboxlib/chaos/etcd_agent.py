"""The etcd side of the chaos workload, run ON a tenant's controller (python3; ``scripts/sandbox
chaos`` copies this file there and starts it over SSH).

It reaches etcd with exactly what kube-apiserver uses there (k0s.yaml's endpoints and the
tenant's CA, certificate and key; under etcd RBAC the tenant's user, confined to its
prefix): clients put, get (linearizable and serializable), compare-and-swap on mod_revision
(a transaction) and delete keys under the run's prefix (and, apart, write two keys in one
transaction now and then, for the watch's atomicity), and one ``etcdctl watch`` follows
the tenant's whole prefix from a known revision.

The clients' requests go in-process over gRPC where the node has Debian's python3-etcd3 (the
node image does): its generated etcd v3 stubs on one kept grpc channel per endpoint per
client, the tenant's certificate on the TLS connection (etcd takes the user from its CN), so
an operation's window is the request itself. Elsewhere (``"client": "etcdctl"``, or no
python3-etcd3) each operation is one ``etcdctl`` process, whose window also holds the
process's start (about 30-50 ms). ``ready`` says which, and why. One JSON object per line on stdout: ``ready``
(the start revision), ``op`` (an operation, invoked and answered), ``event`` / ``restart`` /
``gap`` / ``progress`` (the watch; each event names the response it came in), ``stopped``,
``done`` (the end marker's revision, whether the watch delivered it, why not). Commands on stdin: ``stop`` (clients finish
what they are doing and stop), ``final`` (read every key once more, write the end marker,
wait until the watch delivered it, exit). Every loop is bounded in count and time; stdin
closing (the host went away) stops everything.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

OP_TIMEOUT = 12.0          # an etcdctl that has not answered by then is killed (unknown)
GRPC_TIMEOUT = 5.0         # a gRPC request's deadline (etcdctl's --command-timeout=5s)
# grpc's reconnect backoff (1 s, x1.6, up to 120 s) capped at 1 s, as the clients' own back-off
# after a failure (0.5-1 s): tried on loopback, a client waiting for ready got its first answer
# 11.6 s after etcd came back with grpc's backoff, 1.9 s with this one.
GRPC_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.min_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]
CALL: dict[str, Any] = {"timeout": GRPC_TIMEOUT, "wait_for_ready": True}
PROGRESS_EVERY = 1.0       # seconds between the watch's progress requests
PAIR_EVERY = 0.5           # seconds between two-key transactions (Agent.pairs)
DEFINITE = ("permission denied", "authentication failed", "user name not found",
            "invalid auth token")


class EtcdctlOps:
    """One etcdctl process per operation (its JSON output is what ``Agent.result`` reads)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def request(self, kind: str, key: str, value: str | None, expected: int | None,
                consistency: str) -> tuple[int, dict[str, Any], str]:
        a = self.agent
        if kind == "put":
            return a.etcdctl(["put", key, str(value)])
        if kind == "read":
            return a.etcdctl(["get", key] + (["--consistency=s"] if consistency == "s" else []))
        if kind == "delete":
            return a.etcdctl(["del", key])
        if kind == "pair":
            return a.etcdctl(["txn"], stdin=f"\nput {key}a {value}\nput {key}b {value}\n\n\n")
        # cas: the Kubernetes pattern, an update guarded by the mod revision
        return a.etcdctl(["txn"], stdin=f'mod("{key}") = "{expected}"\n\nput {key} {value}\n\n'
                                        f"get {key}\n\n")


class GrpcOps:
    """The same requests in-process: Debian's python3-etcd3 (etcd's generated v3 stubs; its
    KV calls are used bare, so every response keeps its header revision) on one kept grpc
    channel per endpoint, the tenant's CA, certificate and key on the TLS connection. Every
    request waits for its channel to be ready, up to its deadline, as clientv3's do
    (client/v3/options.go: defaultWaitForReady = grpc.WaitForReady(true)); failing fast
    instead, a channel whose member had been down never connected again (grpc python drives
    a reconnect only while a call waits on it). After a request that found no member
    (UNAVAILABLE, DEADLINE_EXCEEDED) the next request goes to the next endpoint, as
    clientv3's balancer moves on. Responses become the dicts etcdctl
    -w json prints (protobuf's own json_format), so one ``Agent.result`` reads both."""

    def __init__(self, cfg: dict[str, Any], index: int) -> None:
        import etcd3  # type: ignore[import-not-found]
        from etcd3 import etcdrpc  # type: ignore[import-not-found]
        self.rpc = etcdrpc
        self.clients = []
        for url in cfg["endpoints"]:
            u = urlsplit(url)
            tls = {"ca_cert": cfg["cacert"], "cert_key": cfg["key"],
                   "cert_cert": cfg["cert"]} if cfg.get("cacert") else {}
            self.clients.append(etcd3.client(u.hostname, u.port or 2379, timeout=GRPC_TIMEOUT,
                                             grpc_options=GRPC_OPTIONS, **tls))
        self.at = index % len(self.clients)

    def request(self, kind: str, key: str, value: str | None, expected: int | None,
                consistency: str) -> tuple[int, dict[str, Any], str]:
        import grpc  # type: ignore[import-untyped]
        from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
        rpc, c = self.rpc, self.clients[self.at]
        k, v = key.encode(), str(value).encode()
        try:
            if kind == "put":
                resp = c.kvstub.Put(rpc.PutRequest(key=k, value=v), **CALL)
            elif kind == "read":
                resp = c.kvstub.Range(rpc.RangeRequest(key=k, serializable=consistency == "s"),
                                      **CALL)
            elif kind == "delete":
                resp = c.kvstub.DeleteRange(rpc.DeleteRangeRequest(key=k), **CALL)
            elif kind == "pair":
                resp = c.kvstub.Txn(rpc.TxnRequest(success=[
                    rpc.RequestOp(request_put=rpc.PutRequest(key=k + b"a", value=v)),
                    rpc.RequestOp(request_put=rpc.PutRequest(key=k + b"b", value=v))]),
                    **CALL)
            else:
                get = rpc.RequestOp(request_range=rpc.RangeRequest(key=k))
                resp = c.kvstub.Txn(rpc.TxnRequest(
                    compare=[rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                                         key=k, mod_revision=int(expected or 0))],
                    success=[rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=v)), get],
                    failure=[get]), **CALL)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.at = (self.at + 1) % len(self.clients)
            return 1, {}, f"{code.name}: {exc.details()}"[-300:]
        return 0, MessageToDict(resp, preserving_proto_field_name=True), ""


def pick_ops(agent: Agent, index: int) -> EtcdctlOps | GrpcOps:
    """The client's transport: gRPC unless the run asked for etcdctl or this node cannot."""
    if agent.client_kind == "grpc":
        return GrpcOps(agent.cfg, index)
    return EtcdctlOps(agent)


def grpc_why_not(cfg: dict[str, Any]) -> str:
    """"" when this node can send the run's requests over gRPC, else why not."""
    if cfg.get("client") == "etcdctl":
        return "the run asked for etcdctl"
    os.environ.setdefault("GRPC_DNS_RESOLVER", "native")   # /etc/hosts, as etcdctl resolves
    try:
        import etcd3  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        return f"no python3-etcd3 on this node ({exc})"
    return ""


class Agent:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.t0 = float(cfg["t0"])
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.final = threading.Event()
        self.watch_stop = threading.Event()
        self.seq = 0
        self.watch_last = 0
        self.responses = 0          # watch responses so far: an event names the one it came in
        self.end_rev = 0
        self.end_seen = threading.Event()
        self.canceled = False       # the watch's last response was its cancellation
        base = [cfg.get("etcdctl", "etcdctl"), "--endpoints=" + ",".join(cfg["endpoints"])]
        if cfg.get("cacert"):
            base += [f"--cacert={cfg['cacert']}", f"--cert={cfg['cert']}", f"--key={cfg['key']}"]
        self.base = base
        self.deadline = time.time() + float(cfg["max_seconds"])
        self.client_why = grpc_why_not(cfg)
        self.client_kind = "etcdctl" if self.client_why else "grpc"

    def now(self) -> float:
        return time.monotonic() - self.t0

    def same_clock(self) -> str:
        """Why this host's monotonic clock is not the control node's, or "" when it is: the
        history puts both on one time line (a podman container of the control node's host
        shares its kernel's CLOCK_MONOTONIC; a VM or another host does not). ``sent`` is the
        control node's clock when it started this agent, a second or so ago."""
        sent = self.cfg.get("sent")
        if sent is None:
            return ""
        lag = time.monotonic() - float(sent)
        if -1.0 <= lag <= 120.0:
            return ""
        return (f"this node's monotonic clock is {lag:+.0f} s from the control node's: the "
                "chaos history needs one clock (podman nodes on the control node's host)")

    def emit(self, obj: dict[str, Any]) -> None:
        with self.lock:
            sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
            sys.stdout.flush()

    def etcdctl(self, args: list[str], stdin: str | None = None,
                timeout: float = OP_TIMEOUT) -> tuple[int, dict[str, Any], str]:
        cmd = [*self.base, "--dial-timeout=2s", "--command-timeout=5s", "-w", "json", *args]
        try:
            res = subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                                 timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return 124, {}, f"etcdctl did not answer within {timeout:.0f}s"
        try:
            out = json.loads(res.stdout) if res.returncode == 0 else {}
        except ValueError:
            return 1, {}, "unparsable output: " + res.stdout[:200]
        return res.returncode, out if isinstance(out, dict) else {}, res.stderr.strip()[-300:]

    # -- operations ---------------------------------------------------------------------
    def run_op(self, ops: EtcdctlOps | GrpcOps, process: str, kind: str, key: str,
               value: str | None = None, expected: int | None = None,
               consistency: str = "l") -> dict[str, Any]:
        with self.lock:
            self.seq += 1
            seq = self.seq
        op: dict[str, Any] = {"type": "op", "seq": seq, "process": process, "kind": kind,
                              "key": key, "value": value, "expected": expected,
                              "consistency": consistency, "invoke": self.now()}
        rc, out, err = ops.request(kind, key, value, expected, consistency)
        op["complete"] = self.now()
        if rc != 0:
            definite = any(d in err for d in DEFINITE)
            op["outcome"] = "fail" if kind == "read" or definite else "unknown"
            op["error"] = err
            op["result"] = {}
        else:
            op["outcome"] = "ok"
            op["result"] = self.result(kind, out)
        self.emit(op)
        return op

    @staticmethod
    def kv_of(out: Any) -> dict[str, Any]:
        """found/value/rev from the first ``kvs`` anywhere in etcdctl's JSON."""
        if isinstance(out, dict):
            if "kvs" in out:
                kvs = out.get("kvs") or []
                if not kvs:
                    return {"found": False}
                kv = kvs[0]
                return {"found": True, "rev": int(kv.get("mod_revision", 0)),
                        "value": base64.b64decode(kv.get("value", "")).decode()}
            for v in out.values():
                got = Agent.kv_of(v)
                if got:
                    return got
        elif isinstance(out, list):
            for v in out:
                got = Agent.kv_of(v)
                if got:
                    return got
        return {}

    def result(self, kind: str, out: dict[str, Any]) -> dict[str, Any]:
        header = int((out.get("header") or {}).get("revision", 0))
        if kind == "put":
            return {"rev": header}
        if kind == "read":
            return {"header": header, **(self.kv_of(out) or {"found": False})}
        if kind == "delete":
            deleted = int(out.get("deleted", 0))
            # deleted nothing: no new revision, the header is the one it was served at
            return {"deleted": deleted, **({"rev": header} if deleted else {"header": header})}
        if out.get("succeeded"):
            return {"succeeded": True, "rev": header}
        return {"succeeded": False, "header": header,
                **(self.kv_of(out.get("responses")) or {"found": False})}

    def client(self, index: int) -> None:
        rng = random.Random(f"{self.cfg['seed']}-{index}")
        process = f"{self.cfg['tenant']}/etcd-{index}"
        keys = [f"{self.cfg['prefix']}k{i}" for i in range(int(self.cfg["keys"]))]
        seen: dict[str, int] = {}
        ops = pick_ops(self, index)
        n = 0
        while not self.stop.is_set() and time.time() < self.deadline:
            n += 1
            key = rng.choice(keys)
            roll = rng.random()
            value = f"chaos-{self.cfg['run']}-{self.cfg['tenant']}-e{index}-{n}"
            if roll < 0.25:
                op = self.run_op(ops, process, "put", key, value)
            elif roll < 0.50:
                op = self.run_op(ops, process, "read", key)
            elif roll < 0.60:
                op = self.run_op(ops, process, "read", key, consistency="s")
            elif roll < 0.90:
                op = self.run_op(ops, process, "cas", key, value, expected=seen.get(key, 0))
            else:
                op = self.run_op(ops, process, "delete", key)
            res = op["result"]
            if op["outcome"] == "ok":
                if op["kind"] == "delete" and res.get("deleted") or res.get("found") is False:
                    seen[key] = 0
                elif res.get("rev") and op["kind"] != "delete":
                    seen[key] = int(res["rev"])
            else:
                self.stop.wait(rng.uniform(0.5, 1.0))    # a client backs off after a failure
            self.stop.wait(float(self.cfg["pace"]))

    def pairs(self) -> None:
        """Two keys in one transaction (one revision) every PAIR_EVERY seconds, under
        ``<prefix>pairs/``: no client operation of the history (its values are not the
        run's), so only the watch checks see them -- a revision of two keys must come in
        one watch response (watch-split-revision), which the single-key workload never
        puts to the test."""
        base = f"{self.cfg['prefix']}pairs/"
        ops = pick_ops(self, int(self.cfg["clients"]))
        n = 0
        while not self.stop.is_set() and time.time() < self.deadline:
            n += 1
            ops.request("pair", base, f"pair-{n}", None, "l")
            self.stop.wait(PAIR_EVERY)

    # -- the watch ------------------------------------------------------------------------
    def watch(self, start: int) -> None:
        """One etcdctl watch on the tenant's prefix, restarted from the next revision when it
        ends. Where etcdctl is 3.5 (it knows ``--progress-notify``) the watch is interactive
        (``watch -i``) and asks for a progress notification every PROGRESS_EVERY seconds
        (``progress``: clientv3's RequestProgress, etcdctl/ctlv3/command/watch_command.go's
        interactive loop), so that the checks of notifications (watches.py) meet live ones:
        etcd sends them unasked only every 10 minutes."""
        prefix = self.cfg["watch_prefix"]
        rev = start
        restarts = 0
        progress = self.progress_flag()
        while not self.watch_stop.is_set() and time.time() < self.deadline and restarts < 200:
            request = ["--prefix", *progress, f"--rev={rev}", prefix]
            interactive = bool(progress)
            cmd = [*self.base, "--dial-timeout=2s", "-w", "json", "watch",
                   *(["-i"] if interactive else request)]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if interactive else None,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            stopper = threading.Thread(target=self._kill_on_stop, args=(proc,), daemon=True)
            stopper.start()
            if interactive:
                threading.Thread(target=self._ask_progress, args=(proc, " ".join(request)),
                                 daemon=True).start()
            assert proc.stdout is not None
            self.canceled = False
            for line in proc.stdout:
                rev = self.watch_line(line, rev)
                if self.canceled:         # an interactive etcdctl outlives its watch
                    proc.kill()
            proc.wait()
            err = (proc.stderr.read() if proc.stderr else "").strip()[-200:]
            if self.watch_stop.is_set():
                break
            restarts += 1
            self.emit({"type": "restart", "t": self.now(), "from": rev, "reason": err})
            self.watch_stop.wait(1.0)

    def progress_flag(self) -> list[str]:
        """``--progress-notify`` where this etcdctl knows it (3.5 does; Debian bookworm's
        etcd-client 3.4.23 does not and exits with "unknown flag", so every watch would
        restart without delivering anything)."""
        res = subprocess.run([*self.base, "watch", "--help"], capture_output=True, text=True,
                             check=False)
        return ["--progress-notify"] if "--progress-notify" in res.stdout + res.stderr else []

    def _ask_progress(self, proc: subprocess.Popen[str], request: str) -> None:
        """Start the interactive watch, then ask for progress until the process ends."""
        assert proc.stdin is not None
        try:
            proc.stdin.write(f"watch {request}\n")
            proc.stdin.flush()
            while proc.poll() is None and not self.watch_stop.wait(PROGRESS_EVERY):
                proc.stdin.write("progress\n")
                proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return

    def _kill_on_stop(self, proc: subprocess.Popen[str]) -> None:
        while proc.poll() is None:
            if self.watch_stop.wait(0.5) or time.time() > self.deadline:
                proc.kill()
                return

    def watch_line(self, line: str, rev: int) -> int:
        """One line of ``etcdctl watch -w json [--progress-notify]``: a response (JSON), or a
        progress notification, which etcdctl prints as text (watch_command.go:171-172)."""
        if line.startswith("progress notify: "):
            tail = line.split(":", 1)[1].strip()
            if tail.isdigit():
                self.emit({"type": "progress", "t": self.now(), "rev": int(tail)})
            return rev
        try:
            resp = json.loads(line)
        except ValueError:
            return rev
        return self.watch_response(resp, rev) if isinstance(resp, dict) else rev

    def watch_response(self, resp: dict[str, Any], rev: int) -> int:
        """Emit the response's events; the revision to resume from."""
        self.canceled = bool(resp.get("Canceled"))
        compact = int(resp.get("CompactRevision") or 0)
        if compact and compact > rev:
            self.emit({"type": "gap", "from": rev, "to": compact - 1,
                       "why": f"compacted at {compact}"})
            rev = compact
        self.responses += 1
        for ev in resp.get("Events") or []:
            kv = ev.get("kv") or {}
            key = base64.b64decode(kv.get("key", "")).decode(errors="replace")
            mod = int(kv.get("mod_revision", 0))
            deleted = ev.get("type") in (1, "DELETE")
            value = None
            if not deleted and key.startswith(self.cfg["prefix"]):
                value = base64.b64decode(kv.get("value", "")).decode(errors="replace")
            self.emit({"type": "event", "key": key, "rev": mod, "t": self.now(),
                       "event": "DELETE" if deleted else "PUT", "value": value,
                       "resp": self.responses})
            self.watch_last = max(self.watch_last, mod)
            if self.end_rev and mod >= self.end_rev:
                self.end_seen.set()
            rev = max(rev, mod + 1)
        return rev

    # -- the phases ------------------------------------------------------------------------
    def start_revision(self) -> int:
        for _ in range(30):
            rc, out, _ = self.etcdctl(["get", self.cfg["prefix"], "--prefix", "--limit=1"])
            if rc == 0:
                return int((out.get("header") or {}).get("revision", 0))
            time.sleep(1)
        raise SystemExit("no etcd endpoint answered for 30 tries")

    def finish(self) -> None:
        keys = [f"{self.cfg['prefix']}k{i}" for i in range(int(self.cfg["keys"]))]
        process = f"{self.cfg['tenant']}/final"
        ops = pick_ops(self, 0)
        for key in keys:
            for _ in range(20):
                if self.run_op(ops, process, "read", key)["outcome"] == "ok":
                    break
                time.sleep(1)
        why = ""
        for _ in range(20):
            op = self.run_op(ops, process, "put", f"{self.cfg['prefix']}end",
                             f"chaos-{self.cfg['run']}-{self.cfg['tenant']}-end-etcd")
            why = f"the end marker's put: {op['outcome']} 20 times, last {op.get('error', '')}"
            if op["outcome"] == "ok":
                why = ""
                self.end_rev = int(op["result"]["rev"])
                if self.watch_last >= self.end_rev:
                    self.end_seen.set()
                break
            time.sleep(1)
        if self.end_rev and not self.end_seen.wait(30):
            why = f"not delivered within 30 s (last event at revision {self.watch_last})"
        self.emit({"type": "done", "end_rev": self.end_rev, "reached_end": self.end_seen.is_set(),
                   "why": why})

    def commands(self) -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "stop":
                self.stop.set()
            elif cmd == "final":
                self.final.set()
        self.stop.set()          # the host went away
        self.final.set()

    def main(self) -> None:
        why = self.same_clock()
        if why:
            print(f"etcd agent: {why}", file=sys.stderr)
            sys.exit(2)
        start = self.start_revision()
        self.emit({"type": "ready", "start_rev": start, "t": self.now(),
                   "client": self.client_kind, "client_why": self.client_why})
        threading.Thread(target=self.commands, daemon=True).start()
        watcher = threading.Thread(target=self.watch, args=(start + 1,), daemon=True)
        watcher.start()
        clients = [threading.Thread(target=self.client, args=(i,), daemon=True)
                   for i in range(int(self.cfg["clients"]))]
        clients.append(threading.Thread(target=self.pairs, daemon=True))
        for c in clients:
            c.start()
        for c in clients:
            c.join(timeout=max(1.0, self.deadline - time.time()))
        self.emit({"type": "stopped", "t": self.now()})
        self.final.wait(max(1.0, self.deadline - time.time()))
        self.finish()
        self.watch_stop.set()
        watcher.join(timeout=5)


if __name__ == "__main__":
    Agent(json.loads(sys.argv[1])).main()
