"""playbooks/verify.yml's filters (plugins/filter/sandbox_verify.py) on the lines the check
scripts print: each check passes on what the roles write and fails on what it must catch."""

from __future__ import annotations

import pytest
from conftest import load_plugin

verify = load_plugin("plugins/filter/sandbox_verify.py")

GOOD = ["d /etc/k0s/etcd 0750 kube-apiserver:root",
        "f /etc/k0s/etcd/ca.crt 0644 root:root",
        "f /etc/k0s/etcd/client.crt 0640 kube-apiserver:root",
        "f /etc/k0s/etcd/client.key 0600 kube-apiserver:root",
        "f /var/lib/k0s/pki/sa.key 0640 root:root"]


def _ok(lines: list[str]) -> dict[str, bool]:
    return {c["name"].split(": ", 1)[1]: c["ok"] for c in verify.sandbox_file_checks(lines, "n")}


def test_the_roles_modes_pass() -> None:
    assert _ok(GOOD) == {"private keys 0600/0640, unreadable by others": True,
                         "no certificate, key or directory writable by others": True}


@pytest.mark.parametrize(("line", "check"), [
    ("f /etc/k0s/etcd/client.key 0644 kube-apiserver:root", "private keys 0600/0640, unreadable by others"),
    ("f /etc/k0s/etcd/client.key 0660 kube-apiserver:root", "private keys 0600/0640, unreadable by others"),
    ("f /etc/k0s/etcd/client.key 0200 kube-apiserver:root", "private keys 0600/0640, unreadable by others"),
    ("f /etc/k0s/etcd/ca.crt 0646 root:root", "no certificate, key or directory writable by others"),
    ("d /etc/k0s/etcd 0777 root:root", "no certificate, key or directory writable by others"),
])
def test_what_it_must_catch_fails(line: str, check: str) -> None:
    path = line.split()[1]
    lines = [g for g in GOOD if g.split()[1] != path] + [line]
    assert _ok(lines)[check] is False


def test_no_files_no_checks_and_no_key_no_key_check() -> None:
    assert verify.sandbox_file_checks([], "n") == []
    assert _ok(GOOD[:3]) == {"no certificate, key or directory writable by others": True}


def test_cluster_checks_report_an_alarm_with_the_database_sizes() -> None:
    """etcdctl -w json output as etcd 3.5.30 prints it (alarm 1 = NOSPACE)."""
    health = '[{"endpoint":"https://10.0.0.11:2379","health":true}]'
    members = '{"members":[{"ID":17,"name":"e1"}]}'
    status = ('[{"Endpoint":"https://10.0.0.11:2379","Status":{"header":{"member_id":17},'
              '"leader":17,"dbSize":16084992}}]')
    hashkv = '[{"Endpoint":"https://10.0.0.11:2379","HashKV":{"hash":5}}]'
    raised = '{"header":{},"alarms":[{"memberID":17,"alarm":1}]}'
    checks = verify.sandbox_cluster_checks([health, members, status, hashkv, raised], ["e1"])
    alarm = checks[-1]
    assert alarm["name"] == "no alarm raised (NOSPACE, CORRUPT)"
    assert not alarm["ok"]
    assert alarm["detail"] == "NOSPACE on 11; database sizes: 10.0.0.11:2379 16.1 MB"
    calm = verify.sandbox_cluster_checks([health, members, status, hashkv, '{"header":{}}'], ["e1"])
    assert calm[-1]["ok"] and calm[-1]["detail"] == "database sizes: 10.0.0.11:2379 16.1 MB"
    assert len(verify.sandbox_cluster_checks([health, members, status, hashkv], ["e1"])) == 4


def test_a_service_with_a_drop_in_of_anothers_fails_naming_it() -> None:
    checks = verify.sandbox_unit_checks(
        {"etcd": [("etcd.service: drop-in /etc/systemd/system/etcd.service.d/x.conf is not the "
                  "roles' (Environment=ETCD_ENABLE_PPROF=true)")], "haproxy": []}, "etcd-1")
    assert [(c["name"].split(" runs")[0], c["ok"]) for c in checks] == [
        ("etcd-1: etcd", False), ("etcd-1: haproxy", True)]
    assert "etcd.service.d/x.conf" in checks[0]["detail"] and checks[1]["detail"] == ""
