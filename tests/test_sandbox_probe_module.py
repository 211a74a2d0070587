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


def test_a_binary_is_linked_to_a_mount_holding_it_else_copied(tmp_path: Path) -> None:
    """roles/crd_apiserver's binaries: the probe reads the backend's read-only mount on the
    node; a link where it holds the control node's checksum, a copy where it does not (a node
    made without the mount, a rebuilt cache), nothing where the node is right already."""
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    mount, bin_dir = tmp_path / "mount", tmp_path / "bin"
    mount.mkdir()
    bin_dir.mkdir()
    mounted, dest = mount / "kubectl", bin_dir / "kubectl"
    mounted.write_bytes(b"\x7fELF kubectl")
    mounted.chmod(0o755)
    entry = {"dest": str(dest), "mounted": str(mounted), "src": "/control/kubectl", "mode": "0755",
             "owner": user, "group": group, "sha256": want.probe_want(
                 {"dest": "x", "content": "\x7fELF kubectl", "mode": "0755", "owner": user,
                  "group": group}).split()[0]}

    def plan() -> dict[str, list[str]]:
        found = probe(paths=[str(dest), str(mounted)])
        out = want.probe_link_plan([entry], found)
        return {k: [f"{e['dest']}{' restart' if e.get('restart') else ''}" for e in v]
                for k, v in out.items() if v}

    assert plan() == {"link": [f"{dest} restart"]}           # a new node with the mount
    dest.symlink_to(mounted)
    found = probe(paths=[str(dest), str(mounted)])
    assert found[f"link:{dest}"] == str(mounted)
    assert found[f"file:{dest}"] == found[f"file:{mounted}"]  # the link is followed
    assert plan() == {}                                      # warm: nothing to do
    dest.unlink()
    dest.write_bytes(mounted.read_bytes())
    dest.chmod(0o755)
    assert plan() == {"link": [str(dest)]}                   # same contents: no restart
    mounted.write_bytes(b"\x7fELF another build")
    assert plan() == {}                                      # a right copy is kept
    dest.unlink()
    dest.symlink_to(mounted)
    assert plan() == {"push": [str(dest)]}                   # a link to a stale mount
    mounted.unlink()
    dest.unlink()
    assert plan() == {"push": [str(dest)]}                   # a node made without the mount
