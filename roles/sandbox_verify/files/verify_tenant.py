#!/usr/bin/env python3
"""What playbooks/verify.yml checks through a tenant's Kubernetes API server, on its controller.

usage: verify_tenant.py SPEC   (SPEC = base64 of a JSON object)
  phase:    "roundtrip" | "cross" | "cleanup" | "ready" (playbooks/ready.yml: up's quick check)
  tenant:   the tenant's name; its check objects use the API group <tenant>.verify.sandbox
  others:   the other tenants' names (phase cross)
  kubectl:  argv of kubectl as the tenant's admin (the stand-in's kubectl and kubeconfig, or
            "k0s kubectl" where k0s runs)
  etcdctl:  argv of etcdctl with exactly the endpoints and client files of k0s.yaml
  prefix:   the tenant's prefix as kube-apiserver uses it ("/<prefix>/")
  unit:     the systemd unit serving the API (for its start time)
  compaction_interval: the API server's --etcd-compaction-interval (a Go duration, "" = 5m)
  k0s_kubectl, standin_kubectl: (phase ready) kubectl's argv where k0s runs, where the stand-in does
Prints {"checks": [{name, ok, detail, skipped?}]}; every wait has a deadline, no sleeps where
a condition can be polled.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

PLURAL = "probes"


def run(argv: list[str], stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f}s")


def short(res: subprocess.CompletedProcess[str]) -> str:
    text = (res.stderr.strip() or res.stdout.strip()).replace("\n", " | ")
    return text[:400]


def check(name: str, ok: bool, detail: str, skipped: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "ok": ok, "detail": detail}
    if skipped:
        out["skipped"] = True
    return out


def group_of(tenant: str) -> str:
    return f"{tenant}.verify.sandbox"


def crd(tenant: str) -> dict[str, Any]:
    group = group_of(tenant)
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{group}"},
        "spec": {
            "group": group, "scope": "Cluster",
            "names": {"plural": PLURAL, "singular": "probe", "kind": "Probe"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                    "type": "object", "properties": {"value": {"type": "string"}}}}}}}],
        },
    }


def wait_for(predicate: Any, deadline_s: float, step: float = 0.2) -> bool:
    end = time.monotonic() + deadline_s
    while True:
        if predicate():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(step)


ESTABLISHED = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'


def established(k: list[str], resource: str, deadline_s: float) -> tuple[
        subprocess.CompletedProcess[str], bool]:
    """Poll the CRD's Established condition until it is True or the deadline passes.

    Not ``kubectl wait --for=condition=Established``: right after the create the CRD's
    .status.conditions is still null, and kubectl wait then fails at once ("accessor error:
    <nil> is of the type <nil>") instead of waiting (FACTS.md, Kubernetes clients)."""
    last: list[subprocess.CompletedProcess[str]] = []

    def done() -> bool:
        last[:] = [run(k + ["get", f"crd/{resource}", "-o", ESTABLISHED], timeout=10)]
        return last[0].returncode == 0 and last[0].stdout.strip() == "True"

    ok = wait_for(done, deadline_s, step=0.3)
    res = last[0]
    if not ok and res.returncode == 0:
        res = subprocess.CompletedProcess(res.args, 1, res.stdout, "not Established after "
                                          f"{deadline_s:.0f}s (condition: '{res.stdout.strip()}')")
    return res, ok


def watch_sees_change(k: list[str], resource: str, name: str, value: str) -> tuple[bool, str, bool]:
    """A watch on ``resource`` sees ``name`` ADDED (its list) and then MODIFIED to ``value``
    by a patch made after the ADDED: (seen, detail, ended with an ERROR event)."""
    fd, events_path = tempfile.mkstemp(prefix="verify-watch-")

    def events() -> str:
        with open(events_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    with os.fdopen(fd, "w") as sink:
        watch = subprocess.Popen(k + ["get", resource, "--watch", "--output-watch-events", "-o",
                                      "jsonpath={.type} {.object.metadata.name} {.object.spec.value}{\"\\n\"}"],
                                 stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        seen_added = wait_for(lambda: f"ADDED {name} " in events(), 20)
        res = run(k + ["patch", resource, name, "--type=merge", "-p",
                       json.dumps({"spec": {"value": value}})])
        seen_modified = wait_for(lambda: f"MODIFIED {name} {value}" in events()
                                 or "ERROR" in events(), 20) and f"MODIFIED {name} {value}" in events()
        tail = " / ".join(ln for ln in events().splitlines()[-3:] if ln)
        return (seen_added and seen_modified and res.returncode == 0, f"events: {tail}",
                "ERROR" in events() and not seen_modified)
    finally:
        watch.terminate()
        watch.wait(timeout=10)
        os.unlink(events_path)


def roundtrip(spec: dict[str, Any]) -> list[dict[str, Any]]:
    k, e, tenant = spec["kubectl"], spec["etcdctl"], spec["tenant"]
    group = group_of(tenant)
    resource = f"{PLURAL}.{group}"
    name = f"check-{int(time.time())}"
    checks: list[dict[str, Any]] = []
    prefix = spec["prefix"]

    res = run(k + ["apply", "-f", "-"], json.dumps(crd(tenant)))
    ok = res.returncode == 0
    if ok:
        res, ok = established(k, resource, 30)
    checks.append(check(f"{tenant}: CustomResourceDefinition {resource} created and established",
                        ok, short(res)))
    if not ok:
        return checks

    # A watch started before the change must see it (ADDED, then MODIFIED). kubectl lists
    # first (the object shows as ADDED either way), then watches from that list's revision;
    # behind a load balancer the watch may reach another API server whose watch cache of the
    # new resource starts later and answers 410 Expired (an ERROR event, kubectl exits). A
    # reflector relists then; so does this check: a new watch, a new change (3 tries).
    obj = {"apiVersion": f"{group}/v1", "kind": "Probe", "metadata": {"name": name},
           "spec": {"value": "written"}}
    res = run(k + ["create", "-f", "-"], json.dumps(obj))
    got = run(k + ["get", resource, name, "-o", "jsonpath={.spec.value}"])
    checks.append(check(f"{tenant}: custom resource {name} written and read back",
                        res.returncode == 0 and got.stdout == "written",
                        short(res) + f"; read back '{got.stdout}'"))
    seen, detail, expired = False, "", 0
    for attempt in range(3):
        seen, detail, relist = watch_sees_change(k, resource, name, f"changed-{attempt}")
        expired += relist
        if seen or not relist:
            break
    if expired:
        detail += f" ({expired} watch(es) answered ERROR/410 first and were started again, as a reflector relists)"
    checks.append(check(f"{tenant}: a watch sees the change (ADDED, then MODIFIED)", seen, detail))

    # In etcd, read with exactly k0s.yaml's endpoints and client files.
    res = run(e + ["get", "--prefix", "--keys-only", prefix])
    keys = [ln for ln in res.stdout.splitlines() if ln]
    want = [f"{prefix}apiextensions.k8s.io/customresourcedefinitions/{resource}",
            f"{prefix}{group}/{PLURAL}/{name}"]
    missing = [w for w in want if w not in keys]
    checks.append(check(f"{tenant}: the objects are stored under {prefix} in etcd",
                        res.returncode == 0 and not missing,
                        short(res) if res.returncode else
                        (f"missing {missing}" if missing else f"{len(keys)} keys under {prefix}, incl. {want[1]}")))

    # The API server's compactor (k8s.io/apiserver storage/etcd3/compact.go): every
    # --etcd-compaction-interval a transaction on compact_rev_key (outside every prefix)
    # bumps its version and stores the revision to compact; from the second round on it
    # compacts the whole keyspace at the revision stored. So version >= 2: etcd was compacted.
    interval = go_duration_s(spec.get("compaction_interval") or "5m")
    name_c = f"{tenant}: etcd compacted by an API server's compactor (compact_rev_key)"
    if interval == 0:
        return checks + [check(name_c, True, "SKIPPED: --etcd-compaction-interval is 0 (the API "
                                             "server does not compact; etcd's auto-compaction does)",
                               skipped=True)]
    res = run(e + ["get", "compact_rev_key", "-w", "json"])
    try:
        kvs = json.loads(res.stdout).get("kvs") or []
    except ValueError:
        kvs = []
    started = unit_started(spec.get("unit", ""))
    up_s = time.time() - started if started else 0.0
    rounds = int(kvs[0].get("version", 0)) if kvs else 0
    value = base64.b64decode(kvs[0]["value"]).decode(errors="replace") if kvs else ""
    if res.returncode != 0:
        checks.append(check(name_c, False, short(res)))
    elif rounds >= 2:
        checks.append(check(name_c, True, f"{rounds} compactor rounds; last compaction at revision {value}"))
    elif up_s < 2 * interval + 30:
        checks.append(check(name_c, True, f"SKIPPED: {rounds} compactor round(s) so far; the API "
                                          f"server is up {up_s:.0f}s and compacts from its second "
                                          f"round (--etcd-compaction-interval {interval:.0f}s)",
                            skipped=True))
    else:
        checks.append(check(name_c, False, f"{rounds} compactor round(s) after {up_s:.0f}s "
                                           f"(--etcd-compaction-interval {interval:.0f}s)"))
    return checks


def go_duration_s(text: str) -> float:
    """Seconds of a Go duration such as "5m", "1m30s", "500ms" ("0" = 0)."""
    import re

    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", text)
    return sum(float(n) * units[u] for n, u in parts) if parts else float(text or 0)


def unit_started(unit: str) -> float:
    if not unit:
        return 0.0
    res = run(["systemctl", "show", "-p", "ActiveEnterTimestampMonotonic", "--value", unit])
    try:
        mono_us = int(res.stdout.strip())
    except ValueError:
        return 0.0
    if mono_us == 0:
        return 0.0
    return time.time() - (time.monotonic() - mono_us / 1e6)


def cross(spec: dict[str, Any]) -> list[dict[str, Any]]:
    k, tenant = spec["kubectl"], spec["tenant"]
    res = run(k + ["get", "crd", "-o", "name"])
    names = res.stdout.split()
    foreign = [n for n in names for o in spec.get("others", [])
               if n == f"customresourcedefinition.apiextensions.k8s.io/{PLURAL}.{group_of(o)}"]
    own = f"customresourcedefinition.apiextensions.k8s.io/{PLURAL}.{group_of(tenant)}" in names
    return [check(f"{tenant}: the API server sees its own check objects and no other tenant's",
                  res.returncode == 0 and own and not foreign,
                  short(res) if res.returncode else
                  (f"sees {foreign}" if foreign else
                   f"{len(names)} CRD(s), own present: {own}; other tenants checked: "
                   f"{', '.join(spec.get('others', [])) or 'none'}"))]


def cleanup(spec: dict[str, Any]) -> list[dict[str, Any]]:
    k, tenant = spec["kubectl"], spec["tenant"]
    res = run(k + ["delete", "crd", f"{PLURAL}.{group_of(tenant)}", "--ignore-not-found",
                   "--wait=true", "--timeout=60s"], timeout=70)
    return [check(f"{tenant}: check objects deleted through the API", res.returncode == 0,
                  short(res) or "deleted")]


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def ready(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """up's quick check of one tenant: its API server (k0s's kube-apiserver, else the CRD API
    server stand-in) answers /readyz (polled, 30 s at most), and one object is written, read
    back and deleted through it: a CustomResourceDefinition (the one kind both serve), raw
    requests, no discovery. The full round trip (custom resources, a watch, the keys in etcd,
    compaction) is verify's."""
    tenant = spec["tenant"]
    if run(["systemctl", "is-active", "k0scontroller"]).stdout.strip() == "active":
        k, readyz, what = spec["k0s_kubectl"], "/readyz", "k0s's kube-apiserver"
    elif run(["systemctl", "is-active", "crd-apiserver"]).stdout.strip() == "active":
        k, readyz = spec["standin_kubectl"], "/readyz?exclude=informer-sync"
        what = "the CRD API server (stand-in, not k0s)"
    else:
        return [check(f"{tenant}: Kubernetes API", True, "SKIPPED: neither k0s nor the CRD API "
                      "server stand-in runs here (no k0s binary: set K0S_BINARY; the stand-in: "
                      "up --apiserver auto)", skipped=True)]
    last: list[subprocess.CompletedProcess[str]] = []

    def answers() -> bool:
        last[:] = [run(k + ["get", "--raw", readyz], timeout=10)]
        return last[0].returncode == 0 and last[0].stdout.strip() == "ok"

    ok = wait_for(answers, 30, step=0.5)
    checks = [check(f"{tenant}: {what} ready ({readyz})", ok, short(last[0]))]
    if not ok:
        return checks
    group = f"{tenant}.ready.sandbox"
    name, token = f"writes.{group}", str(time.time_ns())
    obj = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": name, "annotations": {"ready.sandbox/written": token}},
           "spec": {"group": group, "scope": "Cluster",
                    "names": {"plural": "writes", "singular": "write", "kind": "Write"},
                    "versions": [{"name": "v1", "served": False, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object"}}}]}}
    wrote = run(k + ["create", "--raw", CRDS, "-f", "-"], json.dumps(obj))
    if "AlreadyExists" in wrote.stderr:  # left by an interrupted check: removed, then again
        run(k + ["delete", "--raw", f"{CRDS}/{name}"])
        wait_for(lambda: run(k + ["get", "--raw", f"{CRDS}/{name}"]).returncode != 0, 30)
        wrote = run(k + ["create", "--raw", CRDS, "-f", "-"], json.dumps(obj))
    got = run(k + ["get", "--raw", f"{CRDS}/{name}"])
    try:
        read = (json.loads(got.stdout).get("metadata") or {}).get("annotations", {})
    except ValueError:
        read = {}
    gone = run(k + ["delete", "--raw", f"{CRDS}/{name}"])
    ok = (wrote.returncode == 0 and read.get("ready.sandbox/written") == token
          and gone.returncode == 0)
    detail = (f"CRD {name} created, read back with its annotation, deleted" if ok else
              "; ".join(f"{step}: {short(res) or 'no output'}" for step, res in
                        (("create", wrote), ("read", got), ("delete", gone))))
    return checks + [check(f"{tenant}: a write and a read through its API", ok, detail)]


def main() -> int:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    phase = spec["phase"]
    checks = {"roundtrip": roundtrip, "cross": cross, "cleanup": cleanup,
              "ready": ready}[phase](spec)
    print(json.dumps({"checks": checks}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
