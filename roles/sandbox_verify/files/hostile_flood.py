#!/usr/bin/env python3
"""A flood of one tenant's writes and what it does to the others (docs/security.md, "The
flood"). Three parts run at once, from one start time, each where its credentials are:

usage: hostile_flood.py SPEC   (SPEC = base64 of a JSON object)
  op: "flood"  -- ON the flooding tenant's controller, with its own certificate: it writes
                  under <prefix>k0sbox-attack/flood/ as fast as it can, by every means it has,
                  one thread each: new keys of 1.4 MB, overwrites of one key, transactions
                  nested in transactions, transactions of puts that store a big key's value
                  again (ignore_value), lease grants with a key each, and puts of every size from
                  1 MB down to 1 byte, the largest that still fits (its last room). Then, the
                  flood over, one more write by each means (still refused when it is stopped).
      "victim" -- ON another tenant's controller, with its certificate: it writes under
                  <prefix>k0sbox-attack/victim/ in etcd, and (kubeconfig given) creates objects
                  through its Kubernetes API server, the whole time and `tail` seconds after;
                  then removes what it wrote.
      "watch"  -- ON an etcd member, as the admin: every member's database size, the alarms,
                  and each tenant's budget figures on the members' metrics listeners, polled.
  endpoints, cacert, cert, key: the etcd connection (watch: the admin's)
  prefix: "/<prefix>/"; start: epoch seconds to start at; seconds: how long the flood lasts;
  tail: seconds the victim and the watch go on after it; kubeconfig (victim, optional);
  metrics: ["http://member:2381", ...] (watch); quota: the backend quota (watch)
Prints one JSON object. gRPC through python3-etcd3's stubs (the nodes have it), the rest stdlib.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIG = 1_400_000          # under etcd's 1.5 MiB request limit
BUDGET = "tenant write budget exceeded"
NOSPACE = "database space exceeded"
WORK = "k0sbox-attack/"


def grpc_client(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(KV stub, Lease stub, etcdrpc) over mTLS to the first endpoint that connects."""
    import grpc  # type: ignore[import-not-found]
    from etcd3 import etcdrpc  # type: ignore[import-not-found]
    from etcd3.etcdrpc import rpc_pb2_grpc  # type: ignore[import-not-found]

    creds = grpc.ssl_channel_credentials(*(Path(spec[f]).read_bytes() for f in ("cacert", "key", "cert")))
    last: Exception | None = None
    for url in spec["endpoints"]:
        target = re.sub(r"^\w+://", "", url)
        channel = grpc.secure_channel(target, creds, options=[
            ("grpc.max_send_message_length", 4 << 20), ("grpc.max_receive_message_length", 4 << 20)])
        try:
            grpc.channel_ready_future(channel).result(timeout=5)
            return rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel), etcdrpc
        except grpc.FutureTimeoutError as exc:
            last = exc
    raise RuntimeError(f"no endpoint of {spec['endpoints']} answered: {last}")


def why(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    text = details() if callable(details) else str(exc)
    return " ".join(str(text).split())[:200]


class Means:
    """One way of writing, its counts and its first refusal."""

    def __init__(self, name: str) -> None:
        self.name, self.lock = name, threading.Lock()
        self.attempts = self.accepted = self.budget = self.nospace = self.other = 0
        self.bytes = 0
        self.first_refusal: float | None = None
        self.errors: list[str] = []
        self.after = ""

    def record(self, t0: float, size: int, exc: Exception | None) -> None:
        with self.lock:
            self.attempts += 1
            if exc is None:
                self.accepted += 1
                self.bytes += size
                return
            text = why(exc)
            if BUDGET in text:
                self.budget += 1
                if self.first_refusal is None:
                    self.first_refusal = time.time() - t0
            elif NOSPACE in text:
                self.nospace += 1
            else:
                self.other += 1
                if len(self.errors) < 3:
                    self.errors.append(text)

    def result(self) -> dict[str, Any]:
        return {"means": self.name, "attempts": self.attempts, "accepted": self.accepted,
                "accepted_bytes": self.bytes, "refused_budget": self.budget,
                "refused_nospace": self.nospace, "other_errors": self.other,
                "errors": self.errors,
                "first_budget_refusal_s": None if self.first_refusal is None else round(self.first_refusal, 2),
                "after": self.after}


def flood(spec: dict[str, Any]) -> dict[str, Any]:
    kv, lease, rpc = grpc_client(spec)
    base = (spec["prefix"] + WORK + "flood/").encode()
    big = os.urandom(BIG)
    stop = threading.Event()
    names: list[bytes] = []          # big keys written, for the ignore_value transactions
    timeout = 10.0

    def put(key: bytes, value: bytes, lease_id: int = 0, ignore: bool = False) -> Any:
        return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease_id,
                                                        ignore_value=ignore))

    def new_keys(i: int) -> int:
        key = base + b"new-%d" % i
        kv.Put(rpc.PutRequest(key=key, value=big), timeout=timeout)
        names.append(key)
        return BIG

    def overwrite(i: int) -> int:
        kv.Put(rpc.PutRequest(key=base + b"one", value=big), timeout=timeout)
        return BIG

    def nested(i: int) -> int:
        inner = rpc.TxnRequest(success=[put(base + b"nested-%d" % i, big)])
        kv.Txn(rpc.TxnRequest(success=[rpc.RequestOp(request_txn=inner)]), timeout=timeout)
        return BIG

    def keep_value(i: int) -> int:
        mine = [k for k in [seed, *names[:63]] if k]
        if not mine:   # no big key of its own to store again (the seed was refused)
            raise RuntimeError("no big key of its own to store again")
        kv.Txn(rpc.TxnRequest(success=[put(k, b"", ignore=True) for k in mine]), timeout=timeout)
        return BIG * len(mine)

    def leases(i: int) -> int:
        lid = int(lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=3600), timeout=timeout).ID)
        kv.Put(rpc.PutRequest(key=base + b"leased-%d" % i, value=b"x" * 100, lease=lid), timeout=timeout)
        return 100

    sizes = [1_000_000, 100_000, 10_000, 1000, 100, 1]

    def what_fits(i: int) -> int:
        """Puts of the largest size still taken, a smaller one after each refusal: the last
        room of the budget taken whatever the write rate."""
        try:
            kv.Put(rpc.PutRequest(key=base + b"fit-%d" % i, value=b"x" * sizes[0]), timeout=timeout)
        except Exception:
            if len(sizes) > 1:
                sizes.pop(0)
            raise
        return sizes[0]

    ways: dict[str, Callable[[int], int]] = {
        "new keys of 1.4 MB": new_keys, "overwrites of one key": overwrite,
        "transactions nested in transactions": nested,
        "puts that store a big key's value again (ignore_value)": keep_value,
        "lease grants, a key each": leases, "puts of every size that still fits": what_fits}
    means = {n: Means(n) for n in ways}
    wait_until(spec["start"])
    t0 = time.time()
    # one big key first: what the ignore_value transactions store again
    seed: bytes | None = base + b"seed"
    try:
        kv.Put(rpc.PutRequest(key=seed, value=big), timeout=timeout)
    except Exception as exc:
        seed_note = why(exc)
        seed = None
    else:
        seed_note = "accepted"

    def loop(name: str) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                size = ways[name](i)
                means[name].record(t0, size, None)
            except Exception as exc:   # a refusal is the finding, recorded
                means[name].record(t0, 0, exc)
                if BUDGET in why(exc) or NOSPACE in why(exc):
                    time.sleep(0.02)   # refused at once: no need to spin
    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in ways]
    for t in threads:
        t.start()
    stop.wait(float(spec["seconds"]))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    for name, fn in ways.items():   # the flood over: once more by each means
        try:
            fn(10**9)
            means[name].after = "accepted"
        except Exception as exc:
            means[name].after = why(exc)
    return {"op": "flood", "prefix": spec["prefix"], "seconds": round(time.time() - t0, 1),
            "seed": seed_note, "means": [m.result() for m in means.values()]}


def kube(kubeconfig: str) -> tuple[str, ssl.SSLContext]:
    """The API server's URL and an SSL context with the kubeconfig's CA and client credentials
    (inline data or files)."""
    text = Path(kubeconfig).read_text()

    def field(name: str) -> str | None:   # the first cluster's and user's (no PyYAML on the nodes)
        m = re.search(rf"^\s*{re.escape(name)}:\s*['\"]?([^'\"\s]+)", text, re.MULTILINE)
        return m.group(1) if m else None
    keys = ("server", "certificate-authority-data", "certificate-authority", "client-certificate-data",
            "client-certificate", "client-key-data", "client-key")
    cluster = user = {k: v for k in keys if (v := field(k))}
    tmp = tempfile.mkdtemp(prefix="k0sbox-flood-")

    def material(data_key: str, file_key: str, src: dict[str, Any], name: str) -> str | None:
        if src.get(data_key):
            p = os.path.join(tmp, name)
            with open(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(base64.b64decode(src[data_key]))
            return p
        return src.get(file_key)
    ctx = ssl.create_default_context(cafile=material("certificate-authority-data", "certificate-authority", cluster, "ca"))
    cert = material("client-certificate-data", "client-certificate", user, "crt")
    key = material("client-key-data", "client-key", user, "key")
    if cert:
        ctx.load_cert_chain(cert, key)
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    return cluster["server"].rstrip("/"), ctx


CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "floodwitnesses.k0sbox.sandbox"},
       "spec": {"group": "k0sbox.sandbox", "scope": "Namespaced",
                "names": {"plural": "floodwitnesses", "singular": "floodwitness", "kind": "FloodWitness"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def request(server: str, ctx: ssl.SSLContext, method: str, path: str, body: Any = None,
            timeout: float = 10) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"{}")
        except ValueError:
            return err.code, {}


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(values)
    return {"p50_ms": round(1000 * s[len(s) // 2], 1), "p99_ms": round(1000 * s[min(len(s) - 1, int(len(s) * 0.99))], 1),
            "max_ms": round(1000 * s[-1], 1)}


class Writer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ok = self.failed = 0
        self.during: list[float] = []
        self.after: list[float] = []
        self.errors: list[str] = []

    def result(self) -> dict[str, Any]:
        return {"writer": self.name, "acknowledged": self.ok, "failed": self.failed,
                "errors": self.errors, "during_flood": {"writes": len(self.during), **percentiles(self.during)},
                "after_flood": {"writes": len(self.after), **percentiles(self.after)}}


def victim(spec: dict[str, Any]) -> dict[str, Any]:
    kv, _lease, rpc = grpc_client(spec)
    base = (spec["prefix"] + WORK + "victim/").encode()
    start, flood_end = float(spec["start"]), float(spec["start"]) + float(spec["seconds"])
    end = flood_end + float(spec.get("tail", 10))
    etcd_w, api_w = Writer("etcd, with its certificate"), Writer("its Kubernetes API server")
    api: tuple[str, ssl.SSLContext] | None = None
    created_crd = False
    notes: list[str] = []
    if spec.get("kubeconfig"):
        api = kube(spec["kubeconfig"])
        code = request(*api, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD["metadata"]["name"])[0]
        if code == 404:
            code, body = request(*api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
            created_crd = code in (200, 201)
            if not created_crd:
                notes.append(f"the witness CRD was not created: HTTP {code} {str(body)[:160]}")
        deadline = time.time() + 60
        while created_crd or code == 200:
            code, body = request(*api, "GET", "/apis/k0sbox.sandbox/v1/namespaces/default/floodwitnesses")
            if code == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        if code != 200:
            notes.append(f"the witness kind is not served: HTTP {code}")
            api = None

    def etcd_loop() -> None:
        i = 0
        while time.time() < end:
            i += 1
            t = time.time()
            try:
                kv.Put(rpc.PutRequest(key=base + b"%d" % (i % 200), value=os.urandom(200)), timeout=10)
                etcd_w.ok += 1
            except Exception as exc:
                etcd_w.failed += 1
                if len(etcd_w.errors) < 3:
                    etcd_w.errors.append(why(exc))
            (etcd_w.during if t < flood_end else etcd_w.after).append(time.time() - t)
            time.sleep(0.05)

    def api_loop() -> None:
        assert api is not None
        i = 0
        while time.time() < end:
            i += 1
            t = time.time()
            code, body = request(*api, "POST", "/apis/k0sbox.sandbox/v1/namespaces/default/floodwitnesses",
                                 {"apiVersion": "k0sbox.sandbox/v1", "kind": "FloodWitness",
                                  "metadata": {"name": f"w-{i}"}, "spec": {"n": i}})
            if code in (200, 201):
                api_w.ok += 1
            else:
                api_w.failed += 1
                if len(api_w.errors) < 3:
                    api_w.errors.append(f"HTTP {code}: {str(body.get('message', body))[:200]}")
            (api_w.during if t < flood_end else api_w.after).append(time.time() - t)
            time.sleep(0.1)

    wait_until(start)
    threads = [threading.Thread(target=etcd_loop)] + ([threading.Thread(target=api_loop)] if api else [])
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # what the victim wrote goes again: its keys, its objects, the CRD it made
    cleanup = []
    try:
        kv.DeleteRange(rpc.DeleteRangeRequest(key=base, range_end=base[:-1] + b"0"), timeout=30)
    except Exception as exc:
        cleanup.append(f"its etcd keys not deleted: {why(exc)}")
    if api:
        # its objects, then the CRD it made, each awaited (a deadline, no sleep beyond a poll)
        objects = "/apis/k0sbox.sandbox/v1/namespaces/default/floodwitnesses"
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD["metadata"]["name"]
        deadline, left = time.time() + 60, -1
        while time.time() < deadline:
            request(*api, "DELETE", objects)
            code, body = request(*api, "GET", objects)
            left = len(body.get("items") or []) if code == 200 else -1
            if left == 0:
                break
            time.sleep(0.5)
        if left != 0:
            cleanup.append(f"its objects not all deleted ({left} left)")
        while created_crd and time.time() < deadline:
            request(*api, "DELETE", crd)
            if request(*api, "GET", crd)[0] == 404:
                break
            time.sleep(0.5)
        else:
            if created_crd:
                cleanup.append("its CRD not deleted")
    return {"op": "victim", "prefix": spec["prefix"], "writers": [etcd_w.result()]
            + ([api_w.result()] if api else []), "notes": notes + cleanup}


def watch(spec: dict[str, Any]) -> dict[str, Any]:
    ctl = list(spec["etcdctl"])
    start, end = float(spec["start"]), float(spec["start"]) + float(spec["seconds"]) + float(spec.get("tail", 10))
    max_db: dict[str, int] = {}
    alarms: set[str] = set()
    used_max: dict[str, int] = {}
    over_first: dict[str, float] = {}
    budgets: dict[str, int] = {}
    samples = 0
    wait_until(start)
    while True:
        now = time.time()
        res = subprocess.run([*ctl, "endpoint", "status", "--cluster", "-w", "json"],
                             capture_output=True, text=True, timeout=30, check=False)
        try:
            for st in json.loads(res.stdout):
                ep = st["Endpoint"]
                max_db[ep] = max(max_db.get(ep, 0), int(st["Status"]["dbSize"]))
        except (ValueError, KeyError, TypeError):
            pass
        res = subprocess.run([*ctl, "alarm", "list"], capture_output=True, text=True, timeout=30, check=False)
        alarms.update(line.strip() for line in res.stdout.splitlines() if line.strip())
        for url in spec.get("metrics", []):
            try:
                with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
                    text = resp.read().decode(errors="replace")
            except OSError:
                continue
            for m in re.finditer(r'^etcd_k0sbox_tenant_(used_bytes|over_budget|budget_bytes)\{prefix="[^"]*",user="([^"]*)"\} (\S+)',
                                 text, re.MULTILINE):
                kind, user, value = m.group(1), m.group(2), float(m.group(3))
                if kind == "budget_bytes":
                    budgets[user] = int(value)
                elif kind == "used_bytes":
                    used_max[user] = max(used_max.get(user, 0), int(value))
                elif value >= 1 and user not in over_first:
                    over_first[user] = round(now - start, 2)
        samples += 1
        if now >= end:
            break
        time.sleep(max(0.0, 0.5 - (time.time() - now)))
    quota = int(spec.get("quota") or 0)
    return {"op": "watch", "samples": samples, "max_db_bytes": max_db, "quota": quota,
            "alarms": sorted(alarms), "used_max": used_max, "budgets": budgets,
            "over_budget_seen_at_s": over_first}


def wait_until(at: float) -> None:
    delay = float(at) - time.time()
    if delay > 0:
        time.sleep(delay)


def main() -> int:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    ops = {"flood": flood, "victim": victim, "watch": watch}
    print(json.dumps(ops[spec["op"]](spec)))
    sys.stdout.flush()
    os._exit(0)   # gRPC's threads do not keep the process


if __name__ == "__main__":
    sys.exit(main())
