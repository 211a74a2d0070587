"""The hostile-tenant suite (roles/sandbox_verify/files/hostile_tenant.py and hostile_admin.py)
against a real etcd on loopback, as a tenant of the sandbox reaches it: mTLS with the tenant's
certificate (its CN its etcd user), RBAC as roles/etcd sets it (readwrite on its prefix, read
on compact_rev_key), --peer-cert-allowed-cn, an 8 MiB backend quota that the tenant fills
through its own prefix.

Two builds, both real: the sandbox's patched etcd (scripts/build-etcd, what roles/etcd
installs) must refuse everything, NOSPACE raised or not; Debian's unpatched 3.5.30-2 must be
caught by the suite (the NOSPACE bypass of etcd-io/etcd#22386 and the watch of
GHSA-xg4h-6gfc-h4m8), so the suite is shown to fail where isolation fails.
"""

from __future__ import annotations

import base64
import datetime
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_ports

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "roles" / "sandbox_verify" / "files"
QUOTA = 8 * 1024 * 1024
TENANTS = {"tenant-a": "/tenant-a/", "tenant-b": "/tenant-b/", "tenant-c": "/tenant-c/"}
# Each tenant's write budget (roles/etcd writes k0sbox/budget/<tenant> so; together well under
# the quota): the patched build stops a tenant's own fill at it, before NOSPACE.
BUDGET = 2 * 1024 * 1024
# The nodes' python3 with python3-etcd3 (gRPC), for the suite's gRPC attempts; without it they
# are n/a.
SYSTEM_PYTHON = "/usr/bin/python3"


def _pki(d: Path) -> None:
    """A CA, the member certificate (CN etcd-member, as roles/pki makes it) and client
    certificates whose CN is the etcd user: root and the two tenants."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def key() -> Any:
        return ec.generate_private_key(ec.SECP256R1())

    def write(name: str, k: Any, cert: Any) -> None:
        (d / f"{name}.key").write_bytes(k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hostile-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    write("ca", ca_key, ca)
    import ipaddress

    for i, (name, cn) in enumerate([("member", "etcd-member"), ("root", "root"),
                                    ("tenant-a", "tenant-a"), ("tenant-b", "tenant-b"),
                                    ("tenant-c", "tenant-c")], start=2):
        k = key()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                .issuer_name(ca_name).public_key(k.public_key()).serial_number(i)
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                    critical=False)
                .add_extension(x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(name, k, cert)


def _binaries(tmp: Path, version: str | None) -> Path:
    if not shutil.which("dpkg-deb"):
        pytest.skip("dpkg-deb not available: the etcd .deb files cannot be unpacked here")
    args = [str(REPO / "scripts" / "fetch-etcd-debs")] + (["--version", version] if version else [])
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"the etcd packages ({version or 'the patched build'}) cannot be had: "
                    f"{res.stderr.strip()[-300:]}")
    root = tmp / "root"
    for deb in res.stdout.split():
        subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    return root / "usr" / "bin"


class Member:
    """One etcd member on loopback with the sandbox's TLS and RBAC."""

    def __init__(self, tmp: Path, bindir: Path) -> None:
        self.tmp, self.bindir = tmp, bindir
        client, peer, metrics = free_ports(3)
        self.client = f"https://127.0.0.1:{client}"
        self.peer = f"https://127.0.0.1:{peer}"
        self.metrics = f"http://127.0.0.1:{metrics}"
        p = str(tmp)
        self.proc = subprocess.Popen(
            [str(bindir / "etcd"), "--name", "m1", "--data-dir", f"{p}/data",
             "--listen-client-urls", self.client, "--advertise-client-urls", self.client,
             "--listen-peer-urls", self.peer, "--initial-advertise-peer-urls", self.peer,
             "--initial-cluster", f"m1={self.peer}", "--logger", "zap", "--log-level", "error",
             "--cert-file", f"{p}/member.crt", "--key-file", f"{p}/member.key",
             "--trusted-ca-file", f"{p}/ca.crt", "--client-cert-auth",
             "--peer-cert-file", f"{p}/member.crt", "--peer-key-file", f"{p}/member.key",
             "--peer-trusted-ca-file", f"{p}/ca.crt", "--peer-client-cert-auth",
             "--peer-cert-allowed-cn", "etcd-member", "--listen-metrics-urls", self.metrics,
             "--quota-backend-bytes", str(QUOTA)],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "etcd.log", "w"))  # noqa: SIM115
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.metrics + "/health", timeout=1) as resp:
                    if b'"true"' in resp.read():
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("etcd did not turn healthy: "
                                   + (tmp / "etcd.log").read_text()[-500:])
            time.sleep(0.1)
        for args in (["user", "add", "root", "--no-password"], ["user", "grant-role", "root", "root"]):
            self.admin(*args)
        for name, prefix in TENANTS.items():
            for args in (["role", "add", name],
                         ["role", "grant-permission", name, "readwrite", prefix, "--prefix=true"],
                         ["role", "grant-permission", name, "read", "compact_rev_key"],
                         ["user", "add", name, "--no-password"], ["user", "grant-role", name, name]):
                self.admin(*args)
        self.admin("auth", "enable")
        for name, prefix in TENANTS.items():
            for i in range(3):
                self.admin("put", f"{prefix}object-{i}", f"{name}'s value {i}")
            self.admin("put", f"k0sbox/budget/{name}", json.dumps({"prefix": prefix, "bytes": BUDGET}))

    def as_tenant(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.ctl(name) + list(args), capture_output=True, text=True,
                              check=False, timeout=30)

    def bait(self, name: str) -> str:
        """A lease with no key that the tenant grants itself, with its own certificate (its
        API server's, a moment before it attaches keys)."""
        res = self.as_tenant(name, "lease", "grant", "900", "-w", "json")
        assert res.returncode == 0, res.stderr
        return format(int(json.loads(res.stdout)["ID"]), "x")

    def ctl(self, who: str) -> list[str]:
        return [str(self.bindir / "etcdctl"), f"--endpoints={self.client}",
                f"--cacert={self.tmp}/ca.crt", f"--cert={self.tmp}/{who}.crt",
                f"--key={self.tmp}/{who}.key"]

    def admin(self, *args: str) -> str:
        res = subprocess.run(self.ctl("root") + list(args), capture_output=True, text=True,
                             check=False, timeout=30)
        assert res.returncode == 0, f"etcdctl {args}: {res.stderr}"
        return res.stdout

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def _python() -> str:
    ok = Path(SYSTEM_PYTHON).is_file() and subprocess.run(
        [SYSTEM_PYTHON, "-c", "import etcd3.etcdrpc, grpc"], capture_output=True, check=False).returncode == 0
    return SYSTEM_PYTHON if ok else sys.executable


def _script(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    res = subprocess.run([_python(), str(FILES / name),
                          base64.b64encode(json.dumps(spec).encode()).decode()],
                         capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _attack(m: Member, mode: str, nospace: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """prepare (admin), tenant-a's attempts, finish (admin): as playbooks/attack.yml runs them.
    With nospace: tenant-a's own fill, which its write budget stops (the patched build); then
    the admin fills the quota until NOSPACE and tenant-a tries everything again."""
    tenants = [{"name": n, "prefix": p} for n, p in TENANTS.items()]
    # each tenant's keys kept in a root-only file on the member, as attack_prepare.yml keeps
    # them: a tenant of thousands of objects is more than a command line holds
    keys_file = Path(m.tmp) / "k0sbox" / "attack-keys.json"
    prep = _script("hostile_admin.py", {"op": "prepare", "etcdctl": m.ctl("root"), "tenants": tenants,
                                        "keys_file": str(keys_file)})
    assert "keys" not in prep and prep["key_counts"]["tenant-b"] >= 1
    assert keys_file.stat().st_mode & 0o777 == 0o600
    # tenant-b's own lease with no key (attack.yml: each tenant grants its bait itself)
    prep["targets"]["tenant-b"]["bait"] = m.bait("tenant-b")
    spec = {"etcdctl": m.ctl("tenant-a"), "tenant": "tenant-a", "prefix": TENANTS["tenant-a"],
            "ca": f"{m.tmp}/ca.crt", "cert": f"{m.tmp}/tenant-a.crt", "key": f"{m.tmp}/tenant-a.key",
            "victims": [prep["targets"]["tenant-b"]],
            "members": [{"name": "m1", "client_url": m.client, "peer_url": m.peer}],
            "metrics": [m.metrics], "compact_rev_key": "read", "mode": mode, "nospace": nospace,
            "fill_prefix": "/tenant-a/k0sbox-attack/fill/", "fill_value_bytes": 1000000}
    attack = _script("hostile_tenant.py", spec)
    if nospace and (attack.get("fill") or {}).get("stopped_by") == "budget":
        attack["admin_fill"] = _script("hostile_admin.py", {"op": "fill", "etcdctl": m.ctl("root")})
        if attack["admin_fill"]["raised"]:
            again = _script("hostile_tenant.py", {**spec, "phase": "nospace"})
            attack["phases"] += again["phases"]
    # What sandbox_verify's attack_finish.yml does before the finish: the fills deleted, and
    # NOSPACE undone as roles/etcd/tasks/defrag/cluster.yml does (compaction, defrag, alarm disarm).
    m.admin("del", "--prefix", spec["fill_prefix"])
    m.admin("del", "--prefix", "k0sbox-attack-fill/")
    recovered = []
    if "NOSPACE" in m.admin("alarm", "list"):
        rev = json.loads(m.admin("endpoint", "status", "-w", "json"))[0]["Status"]["header"]["revision"]
        m.admin("compaction", str(rev), "--physical")
        m.admin("defrag")
        m.admin("alarm", "disarm")
        recovered.append("NOSPACE undone")
    done = _script("hostile_admin.py", {"op": "finish", "etcdctl": m.ctl("root"),
                                        "targets": prep["targets"], "keys_file": prep["keys_file"],
                                        "recovered": recovered})
    assert not keys_file.exists() and done["kept"] == prep["key_counts"]
    return attack, done


def _outcomes(attack: dict[str, Any], phase: str) -> dict[str, str]:
    return {a["name"]: a["outcome"] for p in attack["phases"] if p["phase"] == phase
            for a in p["attempts"]}


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Member]:
    tmp = tmp_path_factory.mktemp("patched")
    _pki(tmp)
    m = Member(tmp, _binaries(tmp, None))
    yield m
    m.stop()


def test_the_patched_build_refuses_every_attempt_nospace_or_not(patched: Member) -> None:
    attack, done = _attack(patched, "full", nospace=True)
    # tenant-a's own fill is stopped by its write budget, without an alarm; the admin then
    # raises NOSPACE for the attempts under it
    assert attack["fill"]["ok"] and attack["fill"]["stopped_by"] == "budget", attack["fill"]
    assert attack["fill"]["bytes"] <= BUDGET and attack["fill"]["alarms"] == ""
    assert attack["admin_fill"]["raised"], attack["admin_fill"]
    phases = [p["phase"] for p in attack["phases"]]
    assert phases == ["normal", "over its budget", "nospace"]
    for phase in phases:
        out = _outcomes(attack, phase)
        assert [n for n, o in out.items() if o == "succeeded"] == [], phase
        assert [n for n, o in out.items() if o == "error"] == [], (phase, attack)
    for phase in ("normal", "nospace"):
        out = _outcomes(attack, phase)
        # the attempts that etcd 3.5.30 lets through without the patches, refused here
        for name in ("delete another tenant's key", "delete another tenant's whole prefix",
                     "revoke another tenant's lease (a key attached)", "grant itself root",
                     "grant its role the whole keyspace", "disable auth", "add a user",
                     "watch every key from its own key on (GHSA-xg4h-6gfc-h4m8)",
                     # a lease belongs to its granter (0006)
                     "revoke another tenant's lease with no key attached",
                     "attach its key to another tenant's own lease with no key",
                     "keep another tenant's own lease with no key alive",
                     "read the TTL of another tenant's own lease",
                     "revoke another tenant's own lease with no key"):
            assert out[name] == "refused", (phase, name, out[name])
        assert out["its certificate on a member's peer port"] == "refused"
        assert out["write kube-apiserver's compaction key"] == "refused"
        if _python() == SYSTEM_PYTHON:   # the gRPC attempts need python3-etcd3
            assert out["grant a lease with the ID the server gives another tenant next (its own choice)"] == "refused"
    nested = "a put into its own prefix nested in a transaction (etcd-io/etcd#22167: it cost nothing against the quota)"
    if _python() == SYSTEM_PYTHON:
        assert _outcomes(attack, "normal")[nested] == "allowed"     # its own prefix, within budget
        assert _outcomes(attack, "nospace")[nested] == "refused"    # NOSPACE refuses it as any put
    over = _outcomes(attack, "over its budget")
    assert over["a put into its own prefix"] == over["grant a lease"] == "refused", over
    assert over["delete one of its own keys"] == "allowed", over
    if _python() == SYSTEM_PYTHON:
        assert over["a put nested in a transaction"] == "refused", over
        assert over["puts that store its big keys again (ignore_value)"] == "refused", over
    assert _outcomes(attack, "nospace")["disarm the alarms"] == "refused"
    assert done["auth"] == "on" and done["changed"] == {}, done
    assert done["kept"] == {"tenant-a": 3, "tenant-b": 3, "tenant-c": 3}
    assert done["healthy"] and done["alarms"] == "", done
    # NOSPACE was raised, and is gone after the recovery (the finish reads health and alarms)
    assert done["recovered"] == ["NOSPACE undone"], done


def test_quick_mode_harms_nothing_and_tries_no_fill(patched: Member) -> None:
    attack, done = _attack(patched, "quick", nospace=True)
    assert [p["phase"] for p in attack["phases"]] == ["normal"] and "fill" not in attack
    out = _outcomes(attack, "normal")
    assert "delete another tenant's whole prefix" not in out
    assert out["disarm the alarms"] == "n/a"
    assert sum(o == "refused" for o in out.values()) > 40, out
    assert done["changed"] == {} and done["auth"] == "on"


def test_debian_unpatched_3_5_30_is_caught(tmp_path: Path) -> None:
    """The suite fails where isolation fails: Debian's 3.5.30-2 lets tenant-a watch past its
    prefix, use and revoke tenant-b's own lease, no budget stops its fill, and once it filled
    the quota, a nested put still writes, and it deletes tenant-b's keys, grants itself root
    and turns auth off."""
    _pki(tmp_path)
    m = Member(tmp_path, _binaries(tmp_path, "3.5.30-2"))
    try:
        attack, done = _attack(m, "full", nospace=True)
    finally:
        m.stop()
    assert attack["fill"]["stopped_by"] == "nospace", attack["fill"]   # no budget stopped it
    normal, nospace = _outcomes(attack, "normal"), _outcomes(attack, "nospace")
    assert normal["watch every key from its own key on (GHSA-xg4h-6gfc-h4m8)"] == "succeeded"
    assert normal["delete another tenant's key"] == "refused"
    for name in ("attach its key to another tenant's own lease with no key",
                 "keep another tenant's own lease with no key alive",
                 "revoke another tenant's lease with no key attached"):
        assert normal[name] == "succeeded", (name, normal[name])
    if _python() == SYSTEM_PYTHON:
        assert normal["grant a lease with the ID the server gives another tenant next (its own choice)"] == "succeeded"
        assert nospace["a put into its own prefix nested in a transaction (etcd-io/etcd#22167: it cost "
                       "nothing against the quota)"] == "succeeded"
    for name in ("delete another tenant's key", "delete another tenant's whole prefix",
                 "revoke another tenant's lease (a key attached)", "grant itself root",
                 "add a user", "disable auth"):
        assert nospace[name] == "succeeded", (name, nospace[name])
    assert done["auth"] == "off"
    assert any("deleted" in c for c in done["changed"]["tenant-b"]), done["changed"]


def test_an_etcdctl_without_a_command_sends_nothing_and_says_so(patched: Member,
                                                                tmp_path: Path) -> None:
    """Debian 12's etcdctl 3.4.23 (a controller whose etcd-client stayed there after
    upgrade-etcd) has no `auth status`: it prints the `auth` command's help and exits 0. That
    is no answer from etcd: n/a, never "succeeded"."""
    res = subprocess.run(["apt-get", "download", "etcd-client=3.4.23-4+b4"], cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    debs = list(tmp_path.glob("etcd-client_3.4.23*.deb"))
    if res.returncode != 0 or not debs:
        pytest.skip(f"Debian 12's etcd-client 3.4.23 cannot be had here: {res.stderr.strip()[-200:]}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tmp_path / "old")], check=True)
    old = tmp_path / "old" / "usr" / "bin" / "etcdctl"
    tenants = [{"name": n, "prefix": p} for n, p in TENANTS.items()]
    prep = _script("hostile_admin.py", {"op": "prepare", "etcdctl": patched.ctl("root"),
                                        "tenants": tenants})
    spec = {"etcdctl": [str(old), *patched.ctl("tenant-a")[1:]], "tenant": "tenant-a",
            "prefix": TENANTS["tenant-a"], "ca": f"{patched.tmp}/ca.crt",
            "cert": f"{patched.tmp}/tenant-a.crt", "key": f"{patched.tmp}/tenant-a.key",
            "victims": [prep["targets"]["tenant-b"]], "members": [], "metrics": [],
            "compact_rev_key": "read", "mode": "quick"}
    attack = _script("hostile_tenant.py", spec)
    _script("hostile_admin.py", {"op": "finish", "etcdctl": patched.ctl("root"),
                                 "targets": prep["targets"], "keys": prep["keys"]})
    out = _outcomes(attack, "normal")
    assert "3.4.23" in attack["client"]
    assert out["read the auth status"] == "n/a"
    assert [n for n, o in out.items() if o == "succeeded"] == []
    assert out["disable auth"] == "refused"


def test_every_tenant_at_once_as_verify_runs_them(patched: Member) -> None:
    """verify makes every tenant's attempts at the same time, each against all the others:
    none may find a target another tenant's attempt used up (each revokes a lease with no key
    of its own), none is let through, nothing changes."""
    from concurrent.futures import ThreadPoolExecutor

    tenants = [{"name": n, "prefix": p} for n, p in TENANTS.items()]
    prep = _script("hostile_admin.py", {"op": "prepare", "etcdctl": patched.ctl("root"),
                                        "tenants": tenants})

    def one(name: str) -> dict[str, Any]:
        return _script("hostile_tenant.py", {
            "etcdctl": patched.ctl(name), "tenant": name, "prefix": TENANTS[name],
            "ca": f"{patched.tmp}/ca.crt", "cert": f"{patched.tmp}/{name}.crt",
            "key": f"{patched.tmp}/{name}.key",
            "victims": [t for n, t in prep["targets"].items() if n != name],
            "members": [{"name": "m1", "client_url": patched.client, "peer_url": patched.peer}],
            "metrics": [patched.metrics], "compact_rev_key": "read", "mode": "quick"})

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, TENANTS))
    done = _script("hostile_admin.py", {"op": "finish", "etcdctl": patched.ctl("root"),
                                        "targets": prep["targets"], "keys": prep["keys"]})
    for result in results:
        out = _outcomes(result, "normal")
        assert [n for n, o in out.items() if o in ("succeeded", "error")] == [], result
        assert out["revoke another tenant's lease with no key attached"] == "refused"
    assert done["changed"] == {} and done["auth"] == "on", done
