"""roles/etcd/tasks/rbac.yml, the etcd RBAC reconcile, run as `up` runs it (ansible-playbook
playbooks/etcd-rbac.yml on the first member, etcdctl through roles/etcd's wrapper with the
admin certificate) against a real etcd on loopback: the sandbox's patched 3.5.30 build with
mTLS and RBAC as tests/test_hostile_tenant.py's Member starts it (tenant-a, -b, -c with
readwrite on their prefix and read on compact_rev_key, root by its certificate, auth on).

What the reconcile must take back is planted as root first: every form of grant etcd has
(another prefix, a key range, a single key, open ended, the whole keyspace, a key starting
with "-", bytes no command line carries through etcd's gRPC gateway), compact_rev_key
writable, the prefix read-only, a password on root and on tenant users, auth off. After a run
each tenant's role grants exactly its prefix and compact_rev_key (read), no user has a
password (etcd answers a login "password was given for no password user"), and a second run
reports changed=0. A tenant reads its prefix all through the reconcile of its grants.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_hostile_tenant import TENANTS, Member, _binaries, _pki
from test_verify_scripts import _etcdctl_wrapper

REPO = Path(__file__).resolve().parents[1]
NO_PASSWORD = "password was given for no password user"
WANTED = [  # what `role get -w json` lists for a tenant after the reconcile (read on compact_rev_key)
    {"permType": 2, "key": "/{t}/", "range_end": "/{t}0"},
    {"key": "compact_rev_key"},
]


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _binaries(tmp_path_factory.mktemp("etcd-bin"), None)


@pytest.fixture
def member(tmp_path: Path, bindir: Path) -> Iterator[Member]:
    d = tmp_path / "member"
    d.mkdir()
    _pki(d)
    m = Member(d, bindir)
    yield m
    m.stop()


@pytest.fixture
def wrapper(member: Member, bindir: Path, tmp_path: Path) -> Path:
    """roles/etcd's /usr/local/bin/etcdctl with the member's admin connection (etcdctl.env)."""
    return _etcdctl_wrapper(tmp_path / "bin", bindir, {
        "ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": member.client,
        "ETCDCTL_CACERT": f"{member.tmp}/ca.crt", "ETCDCTL_CERT": f"{member.tmp}/root.crt",
        "ETCDCTL_KEY": f"{member.tmp}/root.key"})


def reconcile(wrapper: Path, tmp: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """playbooks/etcd-rbac.yml on one member (this host) with the three tenants: Ansible's
    stats for it and its task results (the json callback)."""
    tenants = [{"name": n, "prefix": p.strip("/"), "key_prefix": p, "controllers": []}
               for n, p in TENANTS.items()]
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"etcd_rbac": True, "etcd_tls": True, "k0s_tenants": tenants},
        "children": {"etcd": {"hosts": {"m1": {"ansible_connection": "local",
                                               "ansible_python_interpreter": sys.executable}}}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
           "PATH": f"{wrapper}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                          str(REPO / "playbooks" / "etcd-rbac.yml")],
                         cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    out = json.loads(res.stdout)
    # a role's task is named "<role> : <name>"
    tasks = [{"name": t["task"]["name"].split(" : ", 1)[-1], **t["hosts"].get("m1", {})}
             for play in out["plays"] for t in play["tasks"]]
    return out["stats"]["m1"], tasks


def changed(tasks: list[dict[str, Any]]) -> list[str]:
    """The names of the tasks that changed something (a loop: each item that did)."""
    names = []
    for t in tasks:
        items = t.get("results")
        if items is not None:
            names += [f"{t['name']}: {r.get('_ansible_item_label', r.get('item'))}"
                      for r in items if r.get("changed")]
        elif t.get("changed"):
            names.append(t["name"])
    return names


def perms(m: Member, role: str) -> list[dict[str, Any]]:
    """``role get -w json``'s grants with their keys decoded (bytes as latin-1 text)."""
    got = json.loads(m.admin("role", "get", role, "-w", "json"))
    return [{k: base64.b64decode(v).decode("latin-1") if k in ("key", "range_end") else v
             for k, v in p.items()} for p in got.get("perm", [])]


def wanted(tenant: str) -> list[dict[str, Any]]:
    return [{k: v.format(t=tenant) if isinstance(v, str) else v for k, v in p.items()} for p in WANTED]


def login(m: Member, user: str, password: str) -> subprocess.CompletedProcess[str]:
    """A password login (etcd's Authenticate) as ``user``, then a read of its prefix."""
    return subprocess.run(m.ctl("root") + ["--user", user, "--password", password, "get",
                                           TENANTS.get(user, "/"), "--prefix", "--keys-only"],
                          capture_output=True, text=True, check=False, timeout=30)


class Gateway:
    """etcd's gRPC gateway (/v3/... as JSON, keys as base64) on the member's client port: the
    way to make a grant whose key holds a NUL byte, which no etcdctl argument can carry. etcd
    refuses a gateway client certificate with a Common Name ("CommonName of client sending a
    request against gateway will be ignored and not used as expected"), so one without a CN
    of the member's CA, and a password user with the root role for the token."""

    def __init__(self, m: Member) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        ca_key = serialization.load_pem_private_key((m.tmp / "ca.key").read_bytes(), None)
        ca = x509.load_pem_x509_certificate((m.tmp / "ca.crt").read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gateway")]))
                .issuer_name(ca.subject).public_key(key.public_key()).serial_number(99)
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
        (m.tmp / "gateway.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (m.tmp / "gateway.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.url = m.client
        self.ctx = ssl.create_default_context(cafile=str(m.tmp / "ca.crt"))
        self.ctx.load_cert_chain(str(m.tmp / "gateway.crt"), str(m.tmp / "gateway.key"))
        m.admin("user", "add", "gateway-admin:gateway-pw")
        m.admin("user", "grant-role", "gateway-admin", "root")
        self.token = self.post("/v3/auth/authenticate", {"name": "gateway-admin",
                                                         "password": "gateway-pw"})["token"]

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": self.token} if hasattr(self, "token") else {}
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        assert "code" not in answer, answer
        return answer

    def grant(self, role: str, perm_type: str, key: bytes, range_end: bytes = b"") -> None:
        self.post("/v3/auth/role/grant", {"name": role, "perm": {
            "permType": perm_type, "key": base64.b64encode(key).decode(),
            "range_end": base64.b64encode(range_end).decode()}})


class Reader:
    """tenant-b reading its own prefix with its certificate, one etcdctl after another, until
    stopped: every answer that is not its keys is kept."""

    def __init__(self, m: Member) -> None:
        self.m, self.reads, self.failures = m, 0, []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopping.is_set():
            res = subprocess.run(self.m.ctl("tenant-b") + ["get", "/tenant-b/", "--prefix", "--keys-only"],
                                 capture_output=True, text=True, check=False, timeout=30)
            self.reads += 1
            if res.returncode != 0 or "/tenant-b/object-0" not in res.stdout:
                self.failures.append(res.stderr.strip().splitlines()[-1:] or res.stdout)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)


def test_every_other_grant_is_taken_back_whatever_its_form(member: Member, wrapper: Path,
                                                           tmp_path: Path) -> None:
    m = member
    planted = {
        "tenant-a": [
            ["read", "a", "z"],                                  # a key range, not a prefix
            ["write", "/single"],                                # a single key
            ["readwrite", "/x/", "--from-key"],                  # open ended
            ["read", "", "--prefix=true"],                       # the whole keyspace
            ["readwrite", "/tenant-b/", "--prefix=true"],        # another tenant's prefix
            ["read", "--", "-x"],                                # a key like a flag
            ["read", "weird key|x)\n", "zz"],                    # what role get's text mangles
            ["read", "/tenant-a/", "--prefix=true"],             # its prefix, read only
        ],
        "tenant-c": [["readwrite", "compact_rev_key"]],          # the shared key writable
    }
    for role, grants in planted.items():
        for args in grants:
            m.admin("role", "grant-permission", role, *args)
    # grants etcdctl cannot name, through the gateway: a NUL byte in the key, and a range
    # from "\x00" that is not open ended (etcdctl takes "" as "\x00" and drops the range end)
    gateway = Gateway(m)
    gateway.grant("tenant-b", "READ", b"a\x00b", b"\xff\xfe")
    gateway.grant("tenant-b", "READWRITE", b"\x00", b"z")
    assert len(perms(m, "tenant-a")) == 2 + 7 and len(perms(m, "tenant-b")) == 4

    reader = Reader(m)
    try:
        _stats, tasks = reconcile(wrapper, tmp_path)
    finally:
        reader.stop()
    for tenant in TENANTS:
        assert perms(m, tenant) == wanted(tenant), tenant
    did = changed(tasks)
    revoked = [n for n in did if n.startswith("Revoke")]
    assert len(revoked) == 7 and all(n.startswith("Revoke what a tenant's role grants besides its "
                                                  "prefix and compact_rev_key: tenant-a: ") for n in revoked), did
    assert "Revoke what a tenant's role grants besides its prefix and compact_rev_key: tenant-a: " \
           "read [\\x00, <open ended>" in did
    assert [n for n in did if n.startswith("Make a role again")] == [
        ("Make a role again that grants what etcdctl cannot name: tenant-b: "
         "readwrite [\\x00, z), read [a\\x00b, \\xff\\xfe)")], did
    # the two replaced in place: tenant-a's prefix readwrite again, tenant-c's key read only
    assert any(n.startswith("Grant readwrite on /<prefix>/ (prefix): tenant-a") for n in did), did
    assert any(n.startswith("Grant compact_rev_key") and n.endswith(": tenant-c") for n in did), did
    # tenant-b kept its prefix while its role was made again (a stand-in role held it)
    assert reader.reads >= 5 and reader.failures == [], (reader.reads, reader.failures)
    assert m.admin("role", "list").split() == ["tenant-a", "tenant-b", "tenant-c"]  # root is built in
    assert json.loads(m.admin("user", "get", "tenant-b", "-w", "json"))["roles"] == ["tenant-b"]
    # the tenants still work: tenant-a writes its prefix, not tenant-b's nor the key range
    ok = subprocess.run(m.ctl("tenant-a") + ["put", "/tenant-a/after", "x"], capture_output=True,
                        text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    for key in ("/tenant-b/object-0", "m", "/x/y"):
        denied = subprocess.run(m.ctl("tenant-a") + ["get", key], capture_output=True, text=True, check=False)
        assert "permission denied" in denied.stderr, (key, denied)

    stats, tasks = reconcile(wrapper, tmp_path)
    assert stats["changed"] == 0, changed(tasks)


def test_passwords_are_taken_off_root_and_the_tenant_users(member: Member, wrapper: Path,
                                                           tmp_path: Path) -> None:
    m = member
    # root with a password: etcd deletes root only while auth is off
    assert "invalid auth management" in subprocess.run(
        m.ctl("root") + ["user", "delete", "root"], capture_output=True, text=True, check=False).stderr
    for args in (["auth", "disable"], ["user", "delete", "root"], ["user", "add", "root:root-pw"],
                 ["user", "grant-role", "root", "root"], ["auth", "enable"],
                 # tenant-a with a password (and an extra role), made as a user with one
                 ["user", "delete", "tenant-a"], ["user", "add", "tenant-a:a-pw"],
                 ["user", "grant-role", "tenant-a", "tenant-a"], ["user", "grant-role", "tenant-a", "tenant-c"]):
        m.admin(*args)
    # `user passwd` on a user made with --no-password stores a password etcd never accepts
    subprocess.run(m.ctl("root") + ["user", "passwd", "tenant-b", "--interactive=false"],
                   input="b-pw\n", capture_output=True, text=True, check=True)
    assert NO_PASSWORD in login(m, "tenant-b", "b-pw").stderr
    assert login(m, "root", "root-pw").returncode == 0
    assert login(m, "tenant-a", "a-pw").stdout.split() == ["/tenant-a/object-0", "/tenant-a/object-1",
                                                           "/tenant-a/object-2"]
    for user in ("root", "tenant-a"):
        assert "invalid user ID or password" in login(m, user, "wrong").stderr

    _stats, tasks = reconcile(wrapper, tmp_path)
    did = changed(tasks)
    assert did[:1] == ["Take a password off root (made again with --no-password)"], did
    assert "Make a tenant user with a password (or any, while auth is off) again without one: tenant-a" in did
    assert not any(n.endswith((": tenant-b", ": tenant-c")) for n in did), did
    for user, password in (("root", "root-pw"), ("tenant-a", "a-pw"), ("tenant-b", "b-pw")):
        res = login(m, user, password)
        assert res.returncode != 0 and NO_PASSWORD in res.stderr, (user, res.stderr)
    assert m.admin("auth", "status").split()[:3] == ["Authentication", "Status:", "true"]
    assert json.loads(m.admin("user", "get", "tenant-a", "-w", "json"))["roles"] == ["tenant-a"]
    assert json.loads(m.admin("user", "get", "root", "-w", "json"))["roles"] == ["root"]
    # the certificates still name the users: tenant-a reads its prefix, not tenant-c's
    assert subprocess.run(m.ctl("tenant-a") + ["get", "/tenant-a/object-0", "--print-value-only"],
                          capture_output=True, text=True, check=True).stdout.strip() == "tenant-a's value 0"
    assert "permission denied" in subprocess.run(m.ctl("tenant-a") + ["get", "/tenant-c/object-0"],
                                                 capture_output=True, text=True, check=False).stderr

    stats, tasks = reconcile(wrapper, tmp_path)
    assert stats["changed"] == 0, changed(tasks)


def test_with_auth_off_the_users_are_made_again_before_it_is_enabled(member: Member, wrapper: Path,
                                                                      tmp_path: Path) -> None:
    """While auth is off etcd answers every login "authentication is not enabled": whether a
    user has a password cannot be asked, so root and the tenant users are made again."""
    m = member
    for args in (["auth", "disable"], ["user", "delete", "root"], ["user", "add", "root:root-pw"],
                 ["user", "grant-role", "root", "root"], ["user", "delete", "tenant-c"],
                 ["user", "add", "tenant-c:c-pw"]):
        m.admin(*args)
    assert "authentication is not enabled" in login(m, "root", "root-pw").stderr

    _stats, tasks = reconcile(wrapper, tmp_path)
    did = changed(tasks)
    assert "Make root again without a password (auth is off, so etcd cannot say whether it has one)" in did
    assert [n for n in did if n.startswith("Make a tenant user")] == [
        f"Make a tenant user with a password (or any, while auth is off) again without one: {t}"
        for t in TENANTS], did
    # the RBAC reconcile ends with auth on; the write budgets (tasks/budgets.yml) follow it
    rbac = [n for n in did if not n.startswith("Write each budget")]
    assert rbac[-1] == "Enable authentication", did
    assert len([n for n in did if n.startswith("Write each budget")]) == len(TENANTS), did
    for user, password in (("root", "root-pw"), ("tenant-c", "c-pw")):
        res = login(m, user, password)
        assert res.returncode != 0 and NO_PASSWORD in res.stderr, (user, res.stderr)
    for tenant in TENANTS:
        assert json.loads(m.admin("user", "get", tenant, "-w", "json"))["roles"] == [tenant]
        assert perms(m, tenant) == wanted(tenant), tenant

    stats, tasks = reconcile(wrapper, tmp_path)
    assert stats["changed"] == 0, changed(tasks)
