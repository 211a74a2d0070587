"""roles/sandbox_verify/files/verify_member.py and verify_tenant.py run as the role runs them
(ansible.builtin.script: the file with one argument, base64 of the task's JSON spec; Python
as tests/test_hostile_tenant.py runs its scripts), against real components on loopback:

- etcd members of roles/etcd's build (scripts/fetch-etcd-debs) with TLS, RBAC and
  --peer-cert-allowed-cn as tests/test_hostile_tenant.py's Member starts them, one of them with
  roles/etcd's etcd_cipher_suites given as the role gives settings (ETCD_* in etcd's
  environment), the other with etcd's own list; a plain-HTTP member
  (tests/test_sandbox_etcd_prefix.py's fixture); a member of Debian 12's etcd 3.4.23 (Go 1.19:
  other TLS alerts); and, for the refusal probes, loopback ports that are no TLS server (the
  test's own listeners: one speaking something else, one closing at once, one silent);
- for verify_tenant.py, roles/crd_apiserver's stand-in (apiextensions-apiserver and kubectl of
  scripts/build-apiserver) with the flags tasks/configure.yml gives it, its etcd flags from a
  tenant's k0s.yaml through the role's own filter, on the TLS member with the tenant's etcd
  certificate.

The probes are the ones tasks/members.yml writes (its task's vars rendered) and tasks/tenants.yml
makes (sandbox_peer_probes); each outcome is judged as the role judges it (the filters of
plugins/filter/sandbox_verify.py) and by the script's own entry.

Left to the Molecule scenarios: what needs systemd and a node's users (verify_member.py's
settings and version: the unit's EnvironmentFiles, MainPID and ExecStart; the owners in its
files lines, all root here; verify_tenant.py's API server start time), k0s's kube-apiserver
(phase ready's k0s branch, readyz without the stand-in's exclusion) and a readiness that never
comes (its 30 s deadline) and phase ready as a whole: which API it asks is systemd's answer (no
systemd here, and no stand-in for it: the scenarios and the CLI e2e run it on nodes).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import test_sandbox_etcd_prefix
import yaml
from conftest import free_ports, load_plugin
from test_hostile_tenant import Member, _binaries, _pki

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "roles" / "sandbox_verify" / "files"
TASKS = REPO / "roles" / "sandbox_verify" / "tasks"

verify = load_plugin("plugins/filter/sandbox_verify.py")
crd_filters = load_plugin("plugins/filter/crd_apiserver.py")

# The plain-HTTP member (no TLS at all): tests/test_sandbox_etcd_prefix.py's fixture.
etcd = test_sandbox_etcd_prefix.etcd

HOST = "e1"


# -- running the scripts ------------------------------------------------------------------------


def run_script(name: str, spec: Any, env: dict[str, str] | None = None,
               arg: str | None = None) -> subprocess.CompletedProcess[str]:
    """The script with the role's one argument: base64 of the spec's JSON (``arg`` as given)."""
    if arg is None:
        arg = base64.b64encode(json.dumps(spec).encode()).decode()
    return subprocess.run([sys.executable, str(FILES / name), arg], capture_output=True,
                          text=True, check=False, timeout=120,
                          env={**os.environ, **(env or {})})


def report(name: str, spec: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    res = run_script(name, spec, env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def answered_where_refused(probe: dict[str, Any]) -> None:
    """A probe that expected a refusal and got etcd's answer instead."""
    assert (probe["expect"], probe["ok"]) == (False, True), probe
    assert probe["detail"].startswith('HTTP 200 {"etcdserver":"3.5.'), probe


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in entries}


# -- the members --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """etcd and etcdctl of roles/etcd's build, unpacked once for this module's members."""
    tmp = tmp_path_factory.mktemp("etcd-bin")
    return _binaries(tmp, None)


def _role_cipher_suites() -> str:
    defaults = yaml.safe_load((REPO / "roles" / "etcd" / "defaults" / "main.yml").read_text())
    return ",".join(defaults["etcd_cipher_suites"])


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory, bindir: Path) -> Iterator[Member]:
    """A TLS member as roles/etcd configures it, etcd_cipher_suites included: roles/etcd gives
    etcd its settings as ETCD_* variables (etcd.env), so ETCD_CIPHER_SUITES here."""
    tmp = tmp_path_factory.mktemp("member")
    _pki(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ETCD_CIPHER_SUITES", _role_cipher_suites())
        m = Member(tmp, bindir)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def go_ciphers(tmp_path_factory: pytest.TempPathFactory, bindir: Path) -> Iterator[Member]:
    """The same member without etcd_cipher_suites: etcd's (Go's) own list, AES-CBC included."""
    tmp = tmp_path_factory.mktemp("member-go-ciphers")
    _pki(tmp)
    m = Member(tmp, bindir)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another CA and its certificates (verify_other_ca_dir: the client certificate of
    another CA that every member must refuse)."""
    tmp = tmp_path_factory.mktemp("other-ca")
    _pki(tmp)
    return tmp


@pytest.fixture(scope="module")
def node_pki(tmp_path_factory: pytest.TempPathFactory, member: Member) -> Path:
    """The member's /etc/etcd/pki as roles/pki writes it: ca.crt, member.crt/.key and the
    admin client files (the Member's root user), keys 0600, certificates 0644, the dir 0700."""
    d = tmp_path_factory.mktemp("etc-etcd") / "pki"
    d.mkdir()
    for src, dest in (("ca.crt", "ca.crt"), ("member.crt", "member.crt"), ("member.key", "member.key"),
                      ("root.crt", "admin.crt"), ("root.key", "admin.key")):
        shutil.copyfile(member.tmp / src, d / dest)
        (d / dest).chmod(0o600 if dest.endswith(".key") else 0o644)
    d.chmod(0o700)
    return d


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def member_task_probes(pki: Path, client: str, peer: str, metrics: str) -> list[dict[str, Any]]:
    """The probes of tasks/members.yml's verify_member.py task (TLS, peer-cert-allowed-cn and
    a metrics port), its vars rendered for a member on loopback (node_address 127.0.0.1)."""
    tasks = yaml.safe_load((TASKS / "members.yml").read_text())
    task = next(t for t in tasks if str(t.get("ansible.builtin.script", "")).startswith("verify_member.py"))
    ctx = {"_url": client, "_peer_url": peer, "_metrics_url": metrics, "_pki": str(pki),
           "node_address": "127.0.0.1"}

    def render(value: Any) -> Any:
        return jinja2.Template(value).render(**ctx) if isinstance(value, str) else value

    probes = [{k: render(v) for k, v in p.items()}
              for group in ("_probes", "_peer_probes", "_metrics") for p in task["vars"][group]]
    for p in probes:
        # members.yml names etcd's client port, 2379, in the plain-http probe itself; the
        # loopback member listens on a free port.
        p["url"] = p["url"].replace("127.0.0.1:2379", f"127.0.0.1:{_port(client)}")
    return probes


def other_env(other: Path) -> dict[str, str]:
    """The task's environment: the other CA's client certificate and key, as PEM text."""
    return {"VERIFY_OTHER_CERT": (other / "root.crt").read_text(),
            "VERIFY_OTHER_KEY": (other / "root.key").read_text()}


def role_checks(probes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """verify's checks of the probes, as tasks/members.yml records them."""
    return by_name(verify.sandbox_probe_checks(probes, HOST))


# -- verify_member.py ---------------------------------------------------------------------------


def test_member_as_the_role_configures_it_passes_every_probe(member: Member, node_pki: Path,
                                                              other_ca: Path) -> None:
    probes = member_task_probes(node_pki, member.client, member.peer, member.metrics)
    out = report("verify_member.py", {"probes": probes}, other_env(other_ca))
    assert [p["name"] for p in out["probes"]] == [p["name"] for p in probes]
    checks = role_checks(out["probes"])
    assert [n for n, c in checks.items() if not c["ok"]] == [], out["probes"]
    got = by_name(out["probes"])
    # each refusal is the server's own, for the reason the probe is about
    assert got["client without certificate refused"]["detail"] == "refused: TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert got["client with another CA's certificate refused"]["detail"] == "refused: TLSV1_ALERT_UNKNOWN_CA"
    # etcd closes a plain-HTTP connection without a word; the port then completes a TLS
    # handshake with the member's certificate: it is the TLS listener that refused
    assert got["plain http refused"]["detail"] == (
        "refused: RemoteDisconnected: Remote end closed connection without response "
        "(the port speaks TLS only: TLSv1.3, certificate commonName=etcd-member of ca.crt)")
    for name in ("TLS 1.1 refused on the client port", "TLS 1.1 refused on the peer port"):
        assert "TLSV1_ALERT_PROTOCOL_VERSION" in got[name]["detail"], got[name]
    assert "SSLV3_ALERT_HANDSHAKE_FAILURE" in got[
        "TLS 1.2 with a cipher outside etcd_cipher_suites refused"]["detail"]
    assert got["admin certificate refused on the peer port"]["detail"] == "refused: SSLV3_ALERT_BAD_CERTIFICATE"
    for name in ("admin certificate accepted", "member certificate accepted on the peer port"):
        assert got[name]["ok"] and got[name]["detail"].startswith('HTTP 200 {"etcdserver":"3.5.'), got[name]
    assert got["/metrics served without a certificate (metrics port)"]["detail"].endswith(
        "bytes, with etcd_server_has_leader")
    assert got["/health served without a certificate (metrics port)"]["detail"].startswith(
        'HTTP 200 {"health":"true"')
    assert out["cluster"] == [] and out["settings"] == [] and "version" not in out


def test_member_verified_with_another_ca_fails_and_a_client_error_is_no_refusal(
        member: Member, node_pki: Path, other_ca: Path, tmp_path: Path) -> None:
    """verify given a CA that did not sign the member's certificate: the admin's probe fails
    on the client's own verification, and the peer probe that expects the server's
    BAD_CERTIFICATE does not count that client-side failure as a refusal."""
    pki = tmp_path / "pki"
    shutil.copytree(node_pki, pki)
    shutil.copyfile(other_ca / "ca.crt", pki / "ca.crt")
    probes = member_task_probes(pki, member.client, member.peer, member.metrics)
    out = report("verify_member.py", {"probes": probes}, other_env(other_ca))
    checks, got = role_checks(out["probes"]), by_name(out["probes"])

    admin = got["admin certificate accepted"]
    assert (admin["expect"], admin["ok"]) == (True, False)
    assert "CERTIFICATE_VERIFY_FAILED" in admin["detail"], admin
    assert checks[f"{HOST}: admin certificate accepted"]["ok"] is False

    # neither answered nor refused by the server (ok None): the check fails
    peer = got["admin certificate refused on the peer port"]
    assert (peer["expect"], peer["ok"]) == (False, None)
    assert peer["detail"].startswith("not refused by the server as expected (BAD_CERTIFICATE): "
                                     "SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED]"), peer
    assert checks[f"{HOST}: admin certificate refused on the peer port"]["ok"] is False
    assert checks[f"{HOST}: member certificate accepted on the peer port"]["ok"] is False
    # the same for the client port's refusals: a server the client cannot verify refused nothing
    for name in ("client without certificate refused", "client with another CA's certificate refused"):
        assert got[name]["ok"] is None and "CERTIFICATE_VERIFY_FAILED" in got[name]["detail"], got[name]
        assert checks[f"{HOST}: {name}"]["ok"] is False
    # the server refuses TLS 1.1 before any certificate is looked at: still the server's refusal
    assert checks[f"{HOST}: TLS 1.1 refused on the client port"]["ok"] is True


def test_member_serving_plain_http_fails_the_tls_probes(etcd: Any, node_pki: Path,
                                                        other_ca: Path) -> None:
    """The TLS probes against a member that serves plain HTTP on its client port."""
    client = etcd.client["p1"].replace("http://", "https://")
    probes = [p for p in member_task_probes(node_pki, client, client, etcd.client["p1"])
              if "metrics" not in p["name"] and "/health" not in p["name"]]
    out = report("verify_member.py", {"probes": probes}, other_env(other_ca))
    checks, got = role_checks(out["probes"]), by_name(out["probes"])

    answered_where_refused(got["plain http refused"])
    assert checks[f"{HOST}: plain http refused"]["ok"] is False
    assert checks[f"{HOST}: admin certificate accepted"]["ok"] is False
    # no TLS on that port: etcd closes the connection on the ClientHello
    assert got["admin certificate accepted"]["detail"].startswith("refused: SSLEOFError"), got
    # a refusal named in the probe must be the server's: a handshake that fails on the
    # client's side (no TLS at all) is not one
    for name in ("TLS 1.1 refused on the client port",
                 "TLS 1.2 with a cipher outside etcd_cipher_suites refused",
                 "client without certificate refused", "client with another CA's certificate refused"):
        assert checks[f"{HOST}: {name}"]["ok"] is False, got[name]
        assert got[name]["detail"].startswith("not refused by the server as expected"), got[name]
    assert got["client without certificate refused"]["detail"].startswith(
        "not refused by the server as expected (CERTIFICATE_REQUIRED or BAD_CERTIFICATE): SSLEOFError")


class NotEtcd:
    """A TCP listener on loopback that is no etcd, for the refusal probes: "no-tls" reads what
    the client sends and answers a line that is neither TLS nor HTTP; "close" closes every
    connection at once; "silent" reads and never answers (the probe's timeout ends it)."""

    def __init__(self, mode: str) -> None:
        import socket
        import threading

        self.mode, self.conns = mode, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "close":
                conn.close()
                continue
            self.conns.append(conn)
            if self.mode == "no-tls":
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                    conn.sendall(b"220 a service that speaks no TLS\r\n")
                except OSError:
                    pass
                conn.close()

    def stop(self) -> None:
        import socket

        self.sock.shutdown(socket.SHUT_RDWR)   # wakes the accept() (a close alone does not)
        self.sock.close()
        for conn in self.conns:
            conn.close()
        self.thread.join(timeout=10)


REFUSAL_PROBES = ("client without certificate refused", "client with another CA's certificate refused",
                  "plain http refused")


@pytest.mark.parametrize("mode", ["no-tls", "close", "silent", "nothing listening"])
def test_refusal_probes_fail_where_no_tls_server_refuses(mode: str, member: Member, node_pki: Path,
                                                         other_ca: Path) -> None:
    """tasks/members.yml's refusal probes (no certificate, another CA's, plain http) against a
    port that is no TLS server: one that speaks something else, one that closes at once, one
    that never answers, nothing listening. None is the server's refusal: each probe is neither
    answered nor refused (ok None) and its check FAILs (before: any failure passed). Against
    the member (mTLS), the same probes PASS (test_member_as_the_role_configures_it_...)."""
    fake = None if mode == "nothing listening" else NotEtcd(mode)
    url = fake.url if fake else f"https://127.0.0.1:{free_ports(1)[0]}"
    try:
        probes = [p for p in member_task_probes(node_pki, url, url, url.replace("https", "http"))
                  if p["name"] in REFUSAL_PROBES]
        assert [p["name"] for p in probes] == list(REFUSAL_PROBES)
        out = report("verify_member.py", {"probes": probes}, other_env(other_ca))
    finally:
        if fake:
            fake.stop()
    checks, got = role_checks(out["probes"]), by_name(out["probes"])
    for name in REFUSAL_PROBES:
        assert got[name]["ok"] is None, got[name]
        assert got[name]["detail"].startswith("not refused by the server as expected ("), got[name]
        assert checks[f"{HOST}: {name}"]["ok"] is False, checks
    if mode == "close":
        assert got["plain http refused"]["detail"].endswith(
            f"and the port completes no TLS handshake with {node_pki}/ca.crt"), got
    # and the real member's refusals pass, judged by the same script and filter
    real = [p for p in member_task_probes(node_pki, member.client, member.peer, member.metrics)
            if p["name"] in REFUSAL_PROBES]
    passed = role_checks(report("verify_member.py", {"probes": real}, other_env(other_ca))["probes"])
    assert {n: c["ok"] for n, c in passed.items()} == {f"{HOST}: {n}": True for n in REFUSAL_PROBES}


@pytest.fixture(scope="module")
def debian12_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Member]:
    """A member of Debian 12's etcd 3.4.23 (built with Go 1.19), what roles/etcd's package
    method installs from the nodes' apt sources (etcd_package_version ""), with the same TLS
    and RBAC."""
    tmp = tmp_path_factory.mktemp("debian12")
    res = subprocess.run(["apt-get", "download", "etcd-server=3.4.23-4+b4", "etcd-client=3.4.23-4+b4"],
                         cwd=tmp, capture_output=True, text=True, check=False)
    debs = sorted(tmp.glob("etcd-*_3.4.23*.deb"))
    if res.returncode != 0 or len(debs) != 2 or not shutil.which("dpkg-deb"):
        pytest.skip(f"Debian 12's etcd 3.4.23 cannot be had here: {res.stderr.strip()[-200:]}")
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "root")], check=True)
    _pki(tmp)
    m = Member(tmp, tmp / "root" / "usr" / "bin")
    yield m
    m.stop()


def test_refusal_probes_pass_on_debian12_etcd_whose_go_says_bad_certificate(
        debian12_member: Member, other_ca: Path) -> None:
    """etcd 3.4.23's Go 1.19 refuses a client without a certificate, over TLS 1.3 too, with
    BAD_CERTIFICATE (3.5.30's Go 1.27: CERTIFICATE_REQUIRED) and another CA's with
    BAD_CERTIFICATE (UNKNOWN_CA): the alerts the probes accept."""
    m = debian12_member
    probes = [p for p in member_task_probes(m.tmp, m.client, m.peer, m.metrics) if p["name"] in REFUSAL_PROBES]
    out = report("verify_member.py", {"probes": probes}, other_env(other_ca))
    got = by_name(out["probes"])
    assert {n: c["ok"] for n, c in role_checks(out["probes"]).items()} == {
        f"{HOST}: {n}": True for n in REFUSAL_PROBES}, out["probes"]
    for name in REFUSAL_PROBES[:2]:
        assert got[name]["detail"] == "refused: SSLV3_ALERT_BAD_CERTIFICATE", got[name]


def test_member_without_tls_answers_plain_http_and_not_https(etcd: Any, member: Member) -> None:
    """tasks/members.yml without TLS: its one probe, 'plain http member answers'."""
    spec = {"probes": [{"name": "plain http member answers", "url": etcd.client["p1"], "expect": True},
                       {"name": "plain http member answers", "url": member.client.replace("https", "http"),
                        "expect": True}]}
    first, second = report("verify_member.py", spec)["probes"]
    assert first["ok"] and first["detail"].startswith('HTTP 200 {"etcdserver":"3.5.'), first
    # the TLS member closes a plain-HTTP connection without an answer
    assert not second["ok"] and second["detail"] == (
        "refused: RemoteDisconnected: Remote end closed connection without response"), second


def test_member_with_etcds_own_cipher_list_takes_an_aes_cbc_suite(go_ciphers: Member,
                                                                   tmp_path: Path) -> None:
    """etcd without etcd_cipher_suites accepts ECDHE with AES-CBC over TLS 1.2; the probe
    catches it. TLS 1.1 is still refused (etcd's own floor)."""
    probes = [p for p in member_task_probes(go_ciphers.tmp, go_ciphers.client, go_ciphers.peer,
                                            go_ciphers.metrics)
              if p["name"].startswith("TLS ")]
    for p in probes:   # the Member's admin user is root
        p.update(cert=f"{go_ciphers.tmp}/root.crt", key=f"{go_ciphers.tmp}/root.key")
    out = report("verify_member.py", {"probes": probes})
    checks, got = role_checks(out["probes"]), by_name(out["probes"])
    answered_where_refused(got["TLS 1.2 with a cipher outside etcd_cipher_suites refused"])
    assert checks[f"{HOST}: TLS 1.2 with a cipher outside etcd_cipher_suites refused"]["ok"] is False
    assert checks[f"{HOST}: TLS 1.1 refused on the client port"]["ok"] is True
    assert checks[f"{HOST}: TLS 1.1 refused on the peer port"]["ok"] is True


def test_peer_ports_refuse_a_tenants_certificate_but_not_the_member_cn(member: Member) -> None:
    """tasks/tenants.yml's probes (sandbox_peer_probes): a controller's etcd certificate on
    every member's peer port. Refused by --peer-cert-allowed-cn; a client certificate that
    carries the members' CN (etcd-member) gets through, and the check fails."""
    def probes(who: str) -> list[dict[str, Any]]:
        return verify.sandbox_peer_probes({"m1": "127.0.0.1"}, _port(member.peer), f"{member.tmp}/ca.crt",
                                          f"{member.tmp}/{who}.crt", f"{member.tmp}/{who}.key")

    tenant = report("verify_member.py", {"probes": probes("tenant-a")})["probes"]
    assert tenant == [{"name": "its etcd certificate refused on m1's peer port", "expect": False,
                       "ok": False, "detail": "refused: SSLV3_ALERT_BAD_CERTIFICATE"}]
    assert verify.sandbox_probe_checks(tenant, "c1 (tenant-a)")[0]["ok"] is True

    member_cn = report("verify_member.py", {"probes": probes("member")})["probes"]
    assert member_cn[0]["ok"] is True and member_cn[0]["detail"].startswith('HTTP 200 {"etcdserver"')
    check = verify.sandbox_probe_checks(member_cn, "c1 (tenant-a)")[0]
    assert check == {**check, "name": "c1 (tenant-a): its etcd certificate refused on m1's peer port",
                     "ok": False}


def _etcdctl_wrapper(where: Path, bindir: Path, env: dict[str, str]) -> Path:
    """roles/etcd's /usr/local/bin/etcdctl (templates/etcdctl.sh.j2) and its etcdctl.env, as
    the role renders them, in a directory to put first on PATH (the script calls `etcdctl`)."""
    where.mkdir()
    render = {"ansible_managed": "test", "etcd_config_dir": str(where),
              "etcd_etcdctl_binary": str(bindir / "etcdctl"), "etcd_etcdctl_env": env}
    for template, dest in (("etcdctl.sh.j2", "etcdctl"), ("etcdctl.env.j2", "etcdctl.env")):
        text = (REPO / "roles" / "etcd" / "templates" / template).read_text()
        (where / dest).write_text(jinja2.Template(text, keep_trailing_newline=True).render(**render))
    (where / "etcdctl").chmod(0o755)
    return where


CLUSTER = ["endpoint health --cluster", "member list", "endpoint status --cluster", "alarm list"]


def _cluster_checks(out: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """tasks/members.yml's record: the cluster view with sandbox_etcd's hashkv in 4th place
    (here etcdctl's own, through the same wrapper)."""
    hashkv = subprocess.run([str(path / "etcdctl"), "endpoint", "hashkv", "--cluster", "-w", "json"],
                            capture_output=True, text=True, check=False).stdout.strip()
    return by_name(verify.sandbox_cluster_checks(out["cluster"][:3] + [hashkv] + out["cluster"][3:],
                                                 ["m1"]))


def test_cluster_view_through_the_members_etcdctl(member: Member, bindir: Path, node_pki: Path,
                                                  tmp_path: Path) -> None:
    tls = {"ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": member.client, "ETCDCTL_CACERT": f"{node_pki}/ca.crt"}
    admin = _etcdctl_wrapper(tmp_path / "admin", bindir, {
        **tls, "ETCDCTL_CERT": f"{node_pki}/admin.crt", "ETCDCTL_KEY": f"{node_pki}/admin.key"})
    path = {"PATH": f"{admin}{os.pathsep}{os.environ['PATH']}"}
    out = report("verify_member.py", {"cluster": CLUSTER}, path)
    assert len(out["cluster"]) == 4 and json.loads(out["cluster"][0])[0]["health"] is True
    checks = _cluster_checks(out, admin)
    assert {n: c["ok"] for n, c in checks.items()} == {
        "every member healthy": True, "member list has every member started": True,
        "a leader is present": True, "hashkv equal on all members": True,
        "no alarm raised (NOSPACE, CORRUPT)": True}, checks

    # a wrapper left with a tenant's certificate instead of the admin's: etcd refuses it the
    # members' status, so no leader is seen
    tenant = _etcdctl_wrapper(tmp_path / "tenant", bindir, {
        **tls, "ETCDCTL_CERT": f"{member.tmp}/tenant-a.crt", "ETCDCTL_KEY": f"{member.tmp}/tenant-a.key"})
    out = report("verify_member.py", {"cluster": CLUSTER},
                 {"PATH": f"{tenant}{os.pathsep}{os.environ['PATH']}"})
    assert out["cluster"][2] == "[]", out["cluster"]
    checks = _cluster_checks(out, tenant)
    assert checks["a leader is present"] == {"name": "a leader is present", "ok": False,
                                             "detail": "leader ids []"}
    assert checks["hashkv equal on all members"]["ok"] is False


def test_files_keys_readable_by_others_and_writable_files_fail(node_pki: Path, tmp_path: Path) -> None:
    """The files lines and verify's file checks on them. The owners (etcd:etcd on a member,
    kube-apiserver on a controller) are the Molecule scenarios': everything is root's here."""
    pki = tmp_path / "pki"
    shutil.copytree(node_pki, pki)
    out = report("verify_member.py", {"files": [str(pki), str(tmp_path / "absent")]})
    assert out["files"] == [f"d {pki} 0700 root:root"] + [
        f"f {pki}/{n} {'0600' if n.endswith('.key') else '0644'} root:root"
        for n in sorted(["admin.crt", "admin.key", "ca.crt", "member.crt", "member.key"])]
    checks = verify.sandbox_file_checks(out["files"], HOST)
    assert [(c["name"], c["ok"]) for c in checks] == [
        (f"{HOST}: private keys 0600/0640, unreadable by others", True),
        (f"{HOST}: no certificate, key or directory writable by others", True)]

    (pki / "member.key").chmod(0o644)
    (pki / "ca.crt").chmod(0o666)
    out = report("verify_member.py", {"files": [str(pki)]})
    keys, writable = verify.sandbox_file_checks(out["files"], HOST)
    assert (keys["ok"], keys["detail"]) == (False, f"{pki}/member.key 0644 root:root")
    assert (writable["ok"], writable["detail"]) == (False, f"{pki}/ca.crt 0666")


def test_member_missing_client_key_is_named_and_fails_whatever_the_probe_expects(
        member: Member, node_pki: Path) -> None:
    """A missing certificate, key or CA file: the probe is neither answered nor refused, its
    line names the files, the other probes still run (found by this test: the whole report
    was lost to a FileNotFoundError that named no file)."""
    missing = f"{node_pki}/missing.key"
    probe = {"url": member.client, "ca": f"{node_pki}/ca.crt", "cert": f"{node_pki}/admin.crt",
             "key": missing}
    spec = {"probes": [{"name": "admin certificate accepted", "expect": True, **probe},
                       {"name": "a refusal expected", "expect": False, **probe},
                       {"name": "plain http refused", "url": member.client.replace("https", "http"),
                        "expect": False}]}
    res = run_script("verify_member.py", spec)
    assert res.returncode == 0, res
    probes = json.loads(res.stdout)["probes"]
    assert [(p["name"], p["ok"]) for p in probes[:2]] == [("admin certificate accepted", None),
                                                         ("a refusal expected", None)], probes
    assert missing in probes[0]["detail"] and probes[0]["detail"].startswith("not probed"), probes
    assert len(probes) == 3, probes


def test_member_bad_input_is_refused() -> None:
    not_json = run_script("verify_member.py", None, arg=base64.b64encode(b"{probes: [").decode())
    assert not_json.returncode == 1 and not_json.stdout == ""
    assert "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes" in not_json.stderr
    no_url = run_script("verify_member.py", {"probes": [{"name": "x", "expect": True}]})
    assert no_url.returncode == 1 and no_url.stdout == ""
    assert no_url.stderr.rstrip().endswith("KeyError: 'url'"), no_url.stderr


# -- verify_tenant.py: the CRD API server stand-in -----------------------------------------------


@pytest.fixture(scope="module")
def kube() -> Path:
    """apiextensions-apiserver and kubectl of scripts/build-apiserver (what roles/crd_apiserver
    installs)."""
    built = subprocess.run([str(REPO / "scripts" / "build-apiserver"), "--print-dir"],
                           capture_output=True, text=True, check=False).stdout.strip()
    if not built or not all((Path(built) / b).is_file() for b in ("apiextensions-apiserver", "kubectl")):
        pytest.skip(f"the CRD API server stand-in is not built ({built}): run scripts/build-apiserver")
    return Path(built)


def _issue_admin(d: Path) -> None:
    """The stand-in's admin client certificate (crd_apiserver_certificates: CN sandbox-admin,
    group system:masters), signed by the tenant's Kubernetes CA in ``d``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-admin")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(100)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / "admin.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    (d / "admin.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _kubeconfig(path: Path, server: str, ca: str, user: dict[str, str]) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "t", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}], "current-context": "t"}))
    return path


CRD_VARS = yaml.safe_load((REPO / "roles" / "crd_apiserver" / "vars" / "main.yml").read_text())


class ApiServer:
    """roles/crd_apiserver's stand-in for one tenant on loopback: tasks/configure.yml's flags
    (bound to 127.0.0.1 instead of 0.0.0.0), its etcd flags from the tenant's k0s.yaml by the
    role's filter; a Kubernetes CA of its own (``_pki``: "member" is the serving certificate,
    SANs localhost and 127.0.0.1); kubectl as the admin (admin.conf) and as "root", a user of
    that CA in no group (no rights: authorization is delegated to nowhere)."""

    def __init__(self, d: Path, kube: Path, member: Member, etcd_user: str, etcd_prefix: str,
                 compaction_interval: str = "0") -> None:
        d.mkdir()
        _pki(d)
        _issue_admin(d)
        port = free_ports(1)[0]
        self.url = f"https://127.0.0.1:{port}"
        nowhere = _kubeconfig(d / "nowhere.kubeconfig", "https://127.0.0.1:1", str(d / "ca.crt"), {})
        k0s_yaml = {"apiVersion": "k0s.k0sproject.io/v1beta1", "kind": "ClusterConfig", "spec": {
            "api": {"extraArgs": {"etcd-compaction-interval": compaction_interval}},
            "storage": {"type": "etcd", "etcd": {"externalCluster": {
                "endpoints": [member.client], "etcdPrefix": etcd_prefix,
                "caFile": f"{member.tmp}/ca.crt", "clientCertFile": f"{member.tmp}/{etcd_user}.crt",
                "clientKeyFile": f"{member.tmp}/{etcd_user}.key"}}}}}
        flags = {**crd_filters.crd_apiserver_etcd_args(k0s_yaml),
                 **crd_filters.crd_apiserver_shutdown(k0s_yaml)["args"]}
        args = [f"--secure-port={port}", "--bind-address=127.0.0.1",
                f"--tls-cert-file={d}/member.crt", f"--tls-private-key-file={d}/member.key",
                f"--client-ca-file={d}/ca.crt", f"--kubeconfig={nowhere}",
                f"--authentication-kubeconfig={nowhere}", f"--authorization-kubeconfig={nowhere}",
                "--authentication-skip-lookup",
                f"--disable-admission-plugins={CRD_VARS['_crd_disabled_admission']}",
                "--profiling=false", *(f"--{k}={v}" for k, v in sorted(flags.items()))]
        self.log = d / "apiserver.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([str(kube / "apiextensions-apiserver"), *args],
                                         stdout=log, stderr=subprocess.STDOUT)
        ctl = str(kube / "kubectl")
        self.kubectl = [ctl, "--kubeconfig", str(_kubeconfig(
            d / "admin.conf", self.url, str(d / "ca.crt"),
            {"client-certificate": str(d / "admin.crt"), "client-key": str(d / "admin.key")}))]
        self.no_rights = [ctl, "--kubeconfig", str(_kubeconfig(
            d / "user.conf", self.url, str(d / "ca.crt"),
            {"client-certificate": str(d / "root.crt"), "client-key": str(d / "root.key")}))]
        deadline = time.monotonic() + 30
        while True:
            res = subprocess.run(self.kubectl + ["get", "--raw", "/readyz?exclude=informer-sync"],
                                 capture_output=True, text=True, check=False, timeout=15)
            if res.stdout.strip() == "ok":
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the stand-in did not turn ready: " + self.log.read_text()[-800:])
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, kube: Path, member: Member) -> Iterator[ApiServer]:
    """tenant-a's API server: etcd user tenant-a (readwrite on /tenant-a/, read on
    compact_rev_key), k0s.yaml's etcdPrefix tenant-a, compaction left to etcd (interval 0)."""
    a = ApiServer(tmp_path_factory.mktemp("api") / "tenant-a", kube, member, "tenant-a", "tenant-a")
    yield a
    a.stop()


def _roundtrip_spec(api: ApiServer, etcdctl: list[str], prefix: str = "/tenant-a/",
                    interval: str = "0") -> dict[str, Any]:
    """tasks/tenants.yml's roundtrip spec. The unit is left out: its start time is systemd's
    (Molecule); without one the script takes the API server as just started."""
    return {"phase": "roundtrip", "tenant": "tenant-a", "kubectl": api.kubectl, "etcdctl": etcdctl,
            "prefix": prefix, "unit": "", "compaction_interval": interval}


def _cleanup(api: ApiServer) -> dict[str, Any]:
    return report("verify_tenant.py", {"phase": "cleanup", "tenant": "tenant-a", "kubectl": api.kubectl})


CRD = "probes.tenant-a.verify.sandbox"
NAMES = [f"tenant-a: CustomResourceDefinition {CRD} created and established",
         "tenant-a: custom resource {name} written and read back",
         "tenant-a: a watch sees the change (ADDED, then MODIFIED)",
         "tenant-a: the objects are stored under {prefix} in etcd",
         "tenant-a: etcd compacted by an API server's compactor (compact_rev_key)"]


def _names(checks: list[dict[str, Any]], prefix: str = "/tenant-a/") -> list[str]:
    name = checks[1]["name"].split()[3]
    return [n.format(name=name, prefix=prefix) for n in NAMES]


def test_tenant_roundtrip_cross_and_cleanup_as_verify_runs_them(api: ApiServer, member: Member) -> None:
    try:
        checks = report("verify_tenant.py", _roundtrip_spec(api, member.ctl("tenant-a")))["checks"]
        assert [c["name"] for c in checks] == _names(checks), checks
        assert [c["ok"] for c in checks] == [True] * 5, checks
        name = checks[1]["name"].split()[3]
        assert checks[0]["detail"] == "True"
        assert checks[1]["detail"].endswith("created; read back 'written'")
        assert checks[2]["detail"].endswith(f"ADDED {name} written / MODIFIED {name} changed-0"), checks[2]
        assert checks[3]["detail"].endswith(f"keys under /tenant-a/, incl. /tenant-a/tenant-a.verify.sandbox/probes/{name}")
        assert checks[4] == {"name": NAMES[4], "ok": True, "skipped": True, "detail":
                             "SKIPPED: --etcd-compaction-interval is 0 (the API server does not "
                             "compact; etcd's auto-compaction does)"}
        # the keys are where the check says, read as root
        keys = member.admin("get", "--prefix", "--keys-only", "/tenant-a/").split()
        assert f"/tenant-a/apiextensions.k8s.io/customresourcedefinitions/{CRD}" in keys

        cross = report("verify_tenant.py", {"phase": "cross", "tenant": "tenant-a",
                                            "others": ["tenant-b", "tenant-c"], "kubectl": api.kubectl})
        assert cross["checks"] == [{
            "name": "tenant-a: the API server sees its own check objects and no other tenant's", "ok": True,
            "detail": "1 CRD(s), own present: True; other tenants checked: tenant-b, tenant-c"}]
    finally:
        cleanup = _cleanup(api)
    assert cleanup["checks"] == [{"name": "tenant-a: check objects deleted through the API", "ok": True,
                                  "detail": f'customresourcedefinition.apiextensions.k8s.io "{CRD}" deleted'}]
    assert member.admin("get", "--prefix", "--keys-only", "/tenant-a/tenant-a.verify.sandbox/") == ""


def test_tenant_objects_read_with_another_tenants_client_files_fail(api: ApiServer, member: Member) -> None:
    """The keys are read with exactly k0s.yaml's client files: tenant-b's certificate (etcd
    RBAC: /tenant-b/ only) is refused on /tenant-a/, and the check says so."""
    try:
        checks = report("verify_tenant.py", _roundtrip_spec(api, member.ctl("tenant-b")))["checks"]
    finally:
        _cleanup(api)
    stored = by_name(checks)["tenant-a: the objects are stored under /tenant-a/ in etcd"]
    assert stored["ok"] is False and "etcdserver: permission denied" in stored["detail"], stored
    # NOTE: the detail is the first 400 characters of etcdctl's stderr (short()): its zap
    # warning line fills them, and its own last line ("Error: etcdserver: permission denied")
    # is cut off after "Error: ".
    assert [c["ok"] for c in checks[:3]] == [True, True, True], checks


def test_tenant_objects_outside_the_prefix_of_k0s_yaml_fail(api: ApiServer, member: Member) -> None:
    """An API server that stores elsewhere than the tenant's prefix (/tenant-a/ here, while
    the check is told /tenant-c/): read as root, the keys are missing there."""
    try:
        checks = report("verify_tenant.py", _roundtrip_spec(api, member.ctl("root"), "/tenant-c/"))["checks"]
    finally:
        _cleanup(api)
    name = checks[1]["name"].split()[3]
    stored = by_name(checks)["tenant-a: the objects are stored under /tenant-c/ in etcd"]
    assert stored["ok"] is False
    assert stored["detail"] == ("missing ['/tenant-c/apiextensions.k8s.io/customresourcedefinitions/"
                                f"{CRD}', '/tenant-c/tenant-a.verify.sandbox/probes/{name}']"), stored


def test_tenant_api_unreachable_fails_first_and_stops(api: ApiServer, member: Member,
                                                      tmp_path: Path) -> None:
    closed = f"https://127.0.0.1:{free_ports(1)[0]}"
    kubeconfig = api.kubectl[2]
    conf = json.loads(Path(kubeconfig).read_text())
    conf["clusters"][0]["cluster"]["server"] = closed
    (tmp_path / "down.conf").write_text(json.dumps(conf))
    down = [api.kubectl[0], "--kubeconfig", str(tmp_path / "down.conf")]
    spec = {**_roundtrip_spec(api, member.ctl("tenant-a")), "kubectl": down}
    checks = report("verify_tenant.py", spec)["checks"]
    assert len(checks) == 1 and checks[0]["name"] == NAMES[0] and checks[0]["ok"] is False, checks
    assert "connection refused" in checks[0]["detail"], checks
    cleanup = report("verify_tenant.py", {"phase": "cleanup", "tenant": "tenant-a", "kubectl": down})
    assert cleanup["checks"][0]["ok"] is False and "connection refused" in cleanup["checks"][0]["detail"]
    cross = report("verify_tenant.py", {"phase": "cross", "tenant": "tenant-a", "others": [], "kubectl": down})
    assert cross["checks"][0]["ok"] is False and "connection refused" in cross["checks"][0]["detail"]


def test_tenant_sees_another_tenants_objects_fails_cross(api: ApiServer) -> None:
    """tenant-b's check CRD in tenant-a's prefix (what another tenant's API server sharing
    tenant-a's prefix would write: made here through tenant-a's own API)."""
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("verify_tenant", FILES / "verify_tenant.py")
    assert spec and spec.loader
    vt = module_from_spec(spec)
    spec.loader.exec_module(vt)
    other = vt.crd("tenant-b")   # the CRD the script itself makes for tenant-b
    subprocess.run(api.kubectl + ["apply", "-f", "-"], input=json.dumps(other), text=True,
                   capture_output=True, check=True)
    try:
        cross = report("verify_tenant.py", {"phase": "cross", "tenant": "tenant-a",
                                            "others": ["tenant-b"], "kubectl": api.kubectl})
    finally:
        subprocess.run(api.kubectl + ["delete", "crd", "probes.tenant-b.verify.sandbox", "--wait=true"],
                       capture_output=True, check=True)
    assert cross["checks"] == [{
        "name": "tenant-a: the API server sees its own check objects and no other tenant's", "ok": False,
        "detail": "sees ['customresourcedefinition.apiextensions.k8s.io/probes.tenant-b.verify.sandbox']"}]


def test_tenant_compaction_by_a_real_compactor_is_seen(api: ApiServer, member: Member, kube: Path,
                                                       tmp_path: Path) -> None:
    """An API server that compacts (etcd user root, --etcd-compaction-interval 1s) runs until
    compact_rev_key has its second round; then the check reads it through tenant-a's files
    (read on compact_rev_key) and passes, not skipped."""
    compactor = ApiServer(tmp_path / "compactor", kube, member, "root", "compactor", "1s")
    try:
        deadline = time.monotonic() + 8
        while True:
            kvs = json.loads(member.admin("get", "compact_rev_key", "-w", "json")).get("kvs") or []
            if kvs and int(kvs[0]["version"]) >= 2:
                break
            assert time.monotonic() < deadline, f"no second compactor round: {kvs}"
            time.sleep(0.2)
    finally:
        compactor.stop()
    kvs = json.loads(member.admin("get", "compact_rev_key", "-w", "json"))["kvs"]
    try:
        checks = report("verify_tenant.py", _roundtrip_spec(api, member.ctl("tenant-a"), interval="1s"))["checks"]
    finally:
        _cleanup(api)
        member.admin("del", "compact_rev_key")
    assert [c["ok"] for c in checks] == [True] * 5, checks
    assert checks[4] == {"name": NAMES[4], "ok": True, "detail":
                         f"{kvs[0]['version']} compactor rounds; last compaction at revision "
                         f"{base64.b64decode(kvs[0]['value']).decode()}"}, checks[4]


def test_tenant_bad_input_is_refused() -> None:
    no_phase = run_script("verify_tenant.py", {"tenant": "tenant-a"})
    assert no_phase.returncode == 1 and no_phase.stdout == ""
    assert no_phase.stderr.rstrip().endswith("KeyError: 'phase'"), no_phase.stderr
    unknown = run_script("verify_tenant.py", {"phase": "roundtrips", "tenant": "tenant-a"})
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.rstrip().endswith("KeyError: 'roundtrips'"), unknown.stderr
    not_base64 = run_script("verify_tenant.py", None, arg="{\"phase\": \"cross\"}")
    assert not_base64.returncode == 1 and not_base64.stdout == ""
