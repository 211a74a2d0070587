"""The day-2 commands' side that needs no node. Every day-2 command of the CLI gives each
playbook it runs up's offline settings
(context.OFFLINE_VARS: no k0s binary -> a warning, a failed etcd release download -> Debian's
package), from one place (issue 25: `rotate-ca` passed none and stopped at the etcd download on
every sandbox a default `up` made). Without nodes: the CLI runs in this process with
runner.run_playbook replaced by a recorder (which writes what backup.yml and
tenant-backup.yml would, for the lines the commands print after them). And rotate-ca's
switch to the next CA on the control node (roles/pki/tasks/ca_switch.yml, run by Ansible on a
PKI directory of this test) keeps the old CA where rotate-ca's last line says.

What those settings do on nodes is the CLI e2e's (tests/test_cli_e2e.py: the cold `up`, whose
etcd download fails and falls back to the package, and the drift `up`, the etcd role again on
a running cluster, as rotate-ca and add-members run it); each playbook's own behaviour is its
Molecule scenario's (docs/testing.md, "One home per behaviour")."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, base_topology
from sandboxlib import cli, context, day2, runner

SNAPSHOT = b"snapshot bytes"


def topology(write_topology: Callable[..., Path]) -> Path:
    """Three members (replace-member needs a quorum without the one replaced) and a tenant on
    /registry/ (takeover's prefix)."""
    doc = base_topology()
    doc["name"] = "t-day2-offline"
    doc["nodes"] = [{"name": f"e{i}", "groups": ["etcd"], "host": 10 + i} for i in (1, 2, 3)] + \
        [{"name": "c1", "groups": ["k0s_controller"], "host": 21}]
    doc["tenants"] = [{"name": "ta", "prefix": "registry", "controllers": ["c1"]}]
    return write_topology(doc)


def fake_playbook(state: Path, ran: list[tuple[str, dict[str, Any]]]) -> Callable[..., None]:
    def run_playbook(ctx: Any, topo: Any, backend: str, playbook: str,
                     extra_vars: dict[str, Any] | None = None, limit: str = "") -> None:
        extra = dict(extra_vars or {})
        ran.append((playbook, extra))
        backups = state / topo.name / "backups"
        backups.mkdir(parents=True, exist_ok=True)
        if playbook == "backup.yml":
            snap = backups / f"etcd-{extra['etcd_backup_stamp']}.db"
            snap.write_bytes(SNAPSHOT)
            snap.with_name(snap.name + ".manifest.json").write_text("{}")
        if playbook == "tenant-backup.yml":
            copy = backups / f"{extra['k0s_backup_tenant']}-{extra['k0s_backup_stamp']}.tenant"
            copy.write_bytes(SNAPSHOT)
            copy.with_name(copy.name + ".manifest.json").write_text(json.dumps(
                {"key_count": 2, "bytes": 14, "prefix": "/registry/", "revision": 7,
                 "sha256": hashlib.sha256(SNAPSHOT).hexdigest()}))
    return run_playbook


def snapshot_file(where: Path) -> Path:
    snap = where / "other.db"
    snap.write_bytes(SNAPSHOT)
    (where / "other.db.sha256").write_text(f"{hashlib.sha256(SNAPSHOT).hexdigest()}  other.db\n")
    return snap


# The day-2 commands whose guards need this test's data (a snapshot, a tenant, a member), with
# the arguments their own checks take without nodes, and the playbooks they run.
NEEDS_DATA: list[tuple[list[str], list[str]]] = [
    (["backup"], ["backup.yml"]),
    (["backup", "--tenant", "ta"], ["tenant-backup.yml"]),
    (["restore", "{snap}", "--foreign"], ["restore.yml"]),
    (["restore", "--tenant", "ta", "{snap}"], ["tenant-restore.yml"]),
    (["reset"], ["reset.yml"]),
    (["reset", "--tenant", "ta"], ["reset.yml"]),
    (["replace-member", "e2", "--force"], ["replace-member.yml"]),
    (["add-members"], ["nodes.yml", "add-members.yml"]),
    (["remove-member", "e3"], ["remove-member.yml"]),
    (["defrag", "--compact"], ["defrag.yml"]),
    (["upgrade-etcd", "--to", "3.5.30"], ["upgrade-etcd.yml"]),
    (["takeover", "{snap}", "--tenant", "ta", "--foreign"], ["takeover.yml"]),
]


def plain_line(row: day2.Row) -> tuple[list[str], list[str]] | None:
    """A row with no guard, no variant and no positional argument runs as its bare name:
    its playbooks are its own (a new such command needs no line here)."""
    if row.guard or row.variants or any(not a.flags for a in row.arguments):
        return None
    return [row.name], [*row.before, row.playbook]


LINES = NEEDS_DATA + [line for row in day2.DAY2 if row.name not in {a[0] for a, _ in NEEDS_DATA}
                      and (line := plain_line(row))]


def test_every_day2_command_is_listed() -> None:
    assert sorted({argv[0] for argv, _ in LINES}) == sorted(day2.COMMANDS)


@pytest.mark.parametrize(("argv", "playbooks"), LINES, ids=[" ".join(a) for a, _ in LINES])
def test_day2_playbooks_get_ups_offline_settings(
        argv: list[str], playbooks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        write_topology: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = topology(write_topology)
    state = tmp_path / "state"
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(state))
    monkeypatch.delenv("SANDBOX_BACKEND", raising=False)
    # no podman needed: the recorder runs instead of ansible-playbook
    monkeypatch.setattr(day2, "need_tool", lambda backend: None)
    monkeypatch.setattr(day2, "check_owner", lambda sb: None)
    ran: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(runner, "run_playbook", fake_playbook(state, ran))
    snap = str(snapshot_file(tmp_path))
    line = [a.replace("{snap}", snap) for a in argv] + ["-t", str(path)]
    assert cli.main(line) == 0, line
    assert [p for p, _ in ran] == playbooks
    for playbook, extra in ran:
        if playbook == "nodes.yml":   # the nodes only: no role runs
            continue
        assert extra.items() >= context.OFFLINE_VARS.items(), (playbook, extra)
    if argv == ["rotate-ca"]:   # where it says the old CA is kept (the test below)
        assert "the old CA is kept in .sandbox/<name>/pki/pre-ca-rotate-<time>/" in \
            capsys.readouterr().out


SWITCH = """\
- name: The CA switch of playbooks/rotate-ca.yml, on the control node only
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Phase pki/ca_switch
      ansible.builtin.include_role: {name: k0sbox.external_etcd.pki, tasks_from: ca_switch}
"""


def test_rotate_ca_keeps_the_old_ca_where_it_says(tmp_path: Path) -> None:
    """ca_switch.yml moves the old CA and every certificate it issued into
    pki/pre-ca-rotate-<UTC time>/ (0700) and makes the next CA the issuing one."""
    pki = tmp_path / "pki"
    old = ["ca.crt", "ca.key", "ca.csr", "members/etcd-1.crt", "clients/admin.crt"]
    for f in [*old, "members/etcd-1.key", "ca-next.crt", "ca-next.key", "ca-next.csr"]:
        (pki / f).parent.mkdir(parents=True, exist_ok=True)
        (pki / f).write_text(f)
    (tmp_path / "switch.yml").write_text(SWITCH)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                          "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                          "-e", f"pki_dir={pki}", str(tmp_path / "switch.yml")],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    archives = list(pki.glob("pre-ca-rotate-*"))
    assert len(archives) == 1 and re.fullmatch(r"pre-ca-rotate-\d{8}T\d{6}Z", archives[0].name)
    assert oct(archives[0].stat().st_mode & 0o777) == "0o700"
    kept = {f.name: f.read_text() for f in archives[0].iterdir()}
    assert kept == {f.replace("/", "-"): f for f in old}, kept
    assert {f: (pki / f).read_text() for f in ("ca.crt", "ca.key", "ca.csr")} == {
        "ca.crt": "ca-next.crt", "ca.key": "ca-next.key", "ca.csr": "ca-next.csr"}
    assert (pki / "members" / "etcd-1.key").is_file()   # keys stay: re-issued under the new CA
