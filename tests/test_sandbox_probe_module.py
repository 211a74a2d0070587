"""plugins/modules/sandbox_probe.py, run by Ansible on this host: the one probe of a node's
files and facts, in the format plugins/filter/sandbox_probe.py compares with what a role
wants (a file as the role describes it is not stale; one changed in content, mode or owner is)."""

from __future__ import annotations

import grp
import os
import pwd
import sys
from pathlib import Path
from typing import Any

from conftest import load_plugin, run_module

REPO = Path(__file__).resolve().parents[1]
ANSIBLE = Path(sys.executable).parent / "ansible"
want = load_plugin("plugins/filter/sandbox_probe.py")


def probe(**args: Any) -> dict[str, str]:
    host = run_module("sandbox_probe", args)[0]
    assert not host.get("failed") and host["changed"] is False, host
    return host["probe"]


def test_files_directories_and_facts_in_the_filters_format(tmp_path: Path) -> None:
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    d = tmp_path / "pki"
    d.mkdir(mode=0o750)
    d.chmod(0o750)
    key = d / "client.key"
    key.write_text("KEY\n")
    key.chmod(0o600)
    entries = [{"dest": str(d), "state": "directory", "mode": "0750", "owner": user, "group": group},
               {"dest": str(key), "content": "KEY\n", "mode": "0600", "owner": user, "group": group}]
    found = probe(paths=[str(d), str(key), str(tmp_path / "missing")],
                  script="echo user=yes; echo 'service:etcd=active/enabled'; echo noise")
    assert found == {"user": "yes", "service:etcd": "active/enabled",
                     f"file:{d}": f"dir 750:{user}:{group}",
                     f"file:{key}": f"{want.probe_want(entries[1]).split()[0]} 600:{user}:{group}"}
    assert want.probe_stale(entries, found) == []
    key.chmod(0o640)
    assert want.probe_stale(entries, probe(paths=[str(d), str(key)])) == [entries[1]]
    key.write_text("OTHER\n")
    key.chmod(0o600)
    stale = want.probe_stale(entries + [{**entries[1], "dest": str(tmp_path / "missing")}],
                             probe(paths=[str(d), str(key)]))
    assert [e["dest"] for e in stale] == [str(key), str(tmp_path / "missing")]
