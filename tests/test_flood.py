"""A tenant's flood of writes and what it does to the others, on a real three-member etcd on
loopback with the sandbox's patched build (scripts/build-etcd), mTLS, etcd RBAC and the
tenants' write budgets as roles/etcd sets them (plugins/plugin_utils/sandbox_budgets.py), a
32 MiB backend quota: roles/sandbox_verify/files/hostile_flood.py's three parts at once, as
`scripts/sandbox attack --flood` runs them on the nodes -- tenant-a floods its own prefix by
every means it has through its own certificate, tenant-b writes the whole time and after, the
admin watches every member's database, the alarms and the budget figures.

What must hold (issue 55): the database never grows past the quota, etcd never raises
NOSPACE, every one of tenant-b's writes succeeds, tenant-a is stopped by its budget alone
('etcdserver: tenant write budget exceeded', no alarm) by every means, every member counts
its usage alike, and once it deleted its flood and the keyspace was compacted it writes again.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_ports
from sandboxlib import sandbox_budgets
from test_hostile_tenant import _binaries, _pki

REPO = Path(__file__).resolve().parents[1]
FLOOD = REPO / "roles" / "sandbox_verify" / "files" / "hostile_flood.py"
QUOTA = 32 * 1024 * 1024
TENANTS = {"tenant-a": "/tenant-a/", "tenant-b": "/tenant-b/", "tenant-c": "/tenant-c/"}
SYSTEM_PYTHON = "/usr/bin/python3"   # the nodes' python3 with python3-etcd3 (gRPC)


class Cluster:
    """Three members on loopback with the sandbox's TLS on the client port, RBAC and budgets."""

    def __init__(self, tmp: Path, bindir: Path) -> None:
        self.tmp, self.bindir = tmp, bindir
        names = ["m1", "m2", "m3"]
        ports = free_ports(3 * len(names))
        self.client = {n: f"https://127.0.0.1:{ports[3 * i]}" for i, n in enumerate(names)}
        peer = {n: f"http://127.0.0.1:{ports[3 * i + 1]}" for i, n in enumerate(names)}
        self.metrics = {n: f"http://127.0.0.1:{ports[3 * i + 2]}" for i, n in enumerate(names)}
        initial = ",".join(f"{n}={peer[n]}" for n in names)
        p = str(tmp)
        self.procs = [subprocess.Popen(
            [str(bindir / "etcd"), "--name", n, "--data-dir", f"{p}/{n}",
             "--listen-client-urls", self.client[n], "--advertise-client-urls", self.client[n],
             "--listen-peer-urls", peer[n], "--initial-advertise-peer-urls", peer[n],
             "--initial-cluster", initial, "--initial-cluster-token", "flood",
             "--cert-file", f"{p}/member.crt", "--key-file", f"{p}/member.key",
             "--trusted-ca-file", f"{p}/ca.crt", "--client-cert-auth",
             "--listen-metrics-urls", self.metrics[n], "--quota-backend-bytes", str(QUOTA),
             "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1h",
             "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / f"{n}.log", "w"))  # noqa: SIM115
            for n in names]
        deadline = time.monotonic() + 30
        while not all(self.healthy(n) for n in names):
            if time.monotonic() > deadline:
                raise RuntimeError("the members did not turn healthy: "
                                   + (tmp / "m1.log").read_text()[-500:])
            time.sleep(0.2)
        for args in (["user", "add", "root", "--no-password"], ["user", "grant-role", "root", "root"]):
            self.ctl("root", *args)
        for name, prefix in TENANTS.items():
            for args in (["role", "add", name],
                         ["role", "grant-permission", name, "readwrite", prefix, "--prefix=true"],
                         ["user", "add", name, "--no-password"], ["user", "grant-role", name, name]):
                self.ctl("root", *args)
        self.ctl("root", "auth", "enable")
        # the budgets as roles/etcd's budgets.yml writes them
        self.budgets = sandbox_budgets.budgets(
            [{"name": n, "key_prefix": p} for n, p in TENANTS.items()], QUOTA, sandbox_budgets.DEFAULT_SHARE)
        for b in self.budgets:
            self.ctl("root", "put", sandbox_budgets.CONFIG_PREFIX + b["name"], sandbox_budgets.config_value(b))

    def healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(self.metrics[name] + "/health", timeout=1) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    def ctl_argv(self, who: str) -> list[str]:
        return [str(self.bindir / "etcdctl"), f"--endpoints={','.join(self.client.values())}",
                f"--cacert={self.tmp}/ca.crt", f"--cert={self.tmp}/{who}.crt", f"--key={self.tmp}/{who}.key"]

    def ctl(self, who: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(self.ctl_argv(who) + list(args), capture_output=True, text=True,
                             check=False, timeout=60)
        if check:
            assert res.returncode == 0, f"etcdctl {args} as {who}: {res.stderr}"
        return res

    def conn(self, who: str) -> dict[str, Any]:
        return {"endpoints": list(self.client.values()), "cacert": f"{self.tmp}/ca.crt",
                "cert": f"{self.tmp}/{who}.crt", "key": f"{self.tmp}/{who}.key"}

    def figures(self) -> dict[str, dict[str, dict[str, Any]]]:
        out = {}
        for n, url in self.metrics.items():
            with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
                out[n] = sandbox_budgets.parse_metrics(resp.read().decode())
        return out

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not Path(SYSTEM_PYTHON).is_file() or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import etcd3.etcdrpc, grpc"], capture_output=True, check=False).returncode:
        pytest.skip("python3-etcd3 (the nodes' gRPC client) is not installed on this host: "
                    "apt-get install python3-etcd3 (.ci/run installs it)")
    tmp = tmp_path_factory.mktemp("flood")
    _pki(tmp)
    c = Cluster(tmp, _binaries(tmp, None))
    yield c
    c.stop()


def _run(parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every part at once, each its own process, as the playbook's one task on three hosts."""
    procs = {name: subprocess.Popen([SYSTEM_PYTHON, str(FLOOD), base64.b64encode(json.dumps(spec).encode()).decode()],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, spec in parts.items()}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"{name}: {stderr[-2000:]}"
        out[name] = json.loads(stdout)
    return out


def test_a_flood_stops_its_tenant_alone(cluster: Cluster) -> None:
    seconds, tail = 20, 5
    start = time.time() + 3
    common = {"start": start, "seconds": seconds, "tail": tail}
    got = _run({
        "flood": {"op": "flood", "prefix": TENANTS["tenant-a"], **cluster.conn("tenant-a"), **common},
        "victim": {"op": "victim", "prefix": TENANTS["tenant-b"], **cluster.conn("tenant-b"), **common},
        "watch": {"op": "watch", "etcdctl": cluster.ctl_argv("root"), "metrics": list(cluster.metrics.values()),
                  "quota": QUOTA, **common}})
    flood, victim, watch = got["flood"], got["victim"], got["watch"]
    budget = next(b["bytes"] for b in cluster.budgets if b["name"] == "tenant-a")
    print(json.dumps({"budget": budget, **got}, indent=1))

    # the shared database: never past the quota, no alarm, on any member
    assert watch["samples"] >= seconds, watch
    assert watch["alarms"] == [], watch
    assert len(watch["max_db_bytes"]) == 3 and max(watch["max_db_bytes"].values()) < QUOTA, watch
    # tenant-b: every write acknowledged, during and after
    etcd_writer = victim["writers"][0]
    assert etcd_writer["failed"] == 0 and etcd_writer["errors"] == [], victim
    assert etcd_writer["during_flood"]["writes"] > 20 and etcd_writer["after_flood"]["writes"] > 5, victim
    # tenant-a: stopped by its budget by every means, nothing else refused it, still stopped after
    means = {m["means"]: m for m in flood["means"]}
    assert len(means) == 6
    for name, m in means.items():
        assert m["other_errors"] == 0 and m["refused_nospace"] == 0, (name, m)
        assert "tenant write budget exceeded" in m["after"], (name, m)
    assert means["new keys of 1.4 MB"]["refused_budget"] > 0
    assert means["transactions nested in transactions"]["refused_budget"] > 0
    assert means["puts that store a big key's value again (ignore_value)"]["refused_budget"] > 0
    assert flood["seed"] == "accepted", flood   # one big key the ignore_value transactions store again
    assert sum(m["accepted_bytes"] for m in means.values()) + 1_400_000 <= budget
    assert 0 < watch["used_max"]["tenant-a"] <= budget, watch
    assert watch["over_budget_seen_at_s"].get("tenant-a") is not None, watch
    assert "tenant-b" not in watch["over_budget_seen_at_s"], watch
    # every member counts tenant-a's usage alike (the same writes applied in the same order);
    # "over" is each member's own (a refusal before the proposal reaches no other member)
    figures = cluster.figures()
    used = {n: f["tenant-a"]["used"] for n, f in figures.items()}
    assert len(set(used.values())) == 1 and any(f["tenant-a"]["over"] for f in figures.values()), figures
    assert not any(f["tenant-b"]["over"] for f in figures.values()), figures

    # tenant-b and tenant-c write on; tenant-a frees its flood (deletes pass), a compaction
    # gives it back, and it writes again
    cluster.ctl("tenant-c", "put", "/tenant-c/after-the-flood", "x")
    refused = cluster.ctl("tenant-a", "put", "/tenant-a/still", "x", check=False)
    assert refused.returncode != 0 and "tenant write budget exceeded" in refused.stderr
    cluster.ctl("tenant-a", "del", "--prefix", TENANTS["tenant-a"] + "k0sbox-attack/")
    rev = json.loads(cluster.ctl("root", "endpoint", "status", "-w", "json").stdout)[0]["Status"]["header"]["revision"]
    cluster.ctl("root", "compaction", str(rev), "--physical")
    cluster.ctl("tenant-a", "put", "/tenant-a/writes-again", "x")
    figures = cluster.figures()
    assert all(not f["tenant-a"]["over"] and f["tenant-a"]["used"] < budget // 10 for f in figures.values()), figures
