"""plugins/modules/sandbox_files.py, run by Ansible on this host (a temporary directory):
several files in one module run, owner and mode set before a file appears, idempotent,
force: false, check mode, and contents never printed (they may be private keys)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conftest import run_module

REPO = Path(__file__).resolve().parents[1]
ANSIBLE = Path(sys.executable).parent / "ansible"


def run(files: list[dict[str, Any]], *extra: str) -> tuple[dict[str, Any], str]:
    return run_module("sandbox_files", {"files": files}, *extra)


def mode(path: Path) -> str:
    return f"{path.stat().st_mode & 0o7777:04o}"


def test_writes_files_and_directories_once(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    files = [{"dest": str(d), "state": "directory", "owner": "root", "group": "root", "mode": "0750"},
             {"dest": str(d / "member.key"), "content": "PRIVATE-KEY-TEXT\n", "owner": "root",
              "group": "root", "mode": "0600"},
             {"dest": str(d / "ca.crt"), "content": "CA\n", "owner": "root", "group": "root", "mode": "0644"}]
    first, stdout = run(files)
    assert first["changed"] is True, first
    assert first["changed_files"] == [str(d), str(d / "member.key"), str(d / "ca.crt")]
    assert "PRIVATE-KEY-TEXT" not in stdout
    assert (d / "member.key").read_text() == "PRIVATE-KEY-TEXT\n"
    assert (mode(d), mode(d / "member.key"), mode(d / "ca.crt")) == ("0750", "0600", "0644")
    assert not list(d.glob(".sandbox_files.*"))
    second, _ = run(files)
    assert second["changed"] is False and second["changed_files"] == [], second


def test_replaces_content_and_corrects_mode_in_place(tmp_path: Path) -> None:
    f = tmp_path / "etcd.env"
    f.write_text("OLD\n")
    f.chmod(0o644)
    inode = f.stat().st_ino
    res, _ = run([{"dest": str(f), "content": "OLD\n", "owner": "root", "group": "root", "mode": "0640"}])
    assert res["changed_files"] == [str(f)] and mode(f) == "0640" and f.stat().st_ino == inode
    res, _ = run([{"dest": str(f), "content": "NEW\n", "owner": "root", "group": "root", "mode": "0640"}])
    assert res["changed_files"] == [str(f)] and f.read_text() == "NEW\n"
    assert f.stat().st_ino != inode  # renamed over the old file, not rewritten in place


def test_force_false_and_check_mode(tmp_path: Path) -> None:
    kept = tmp_path / "etcd-state.env"
    kept.write_text("ETCD_INITIAL_CLUSTER_STATE=new\n")
    kept.chmod(0o644)
    res, _ = run([{"dest": str(kept), "content": "ETCD_INITIAL_CLUSTER_STATE=existing\n", "force": False,
                   "owner": "root", "group": "root", "mode": "0644"}])
    assert res["changed"] is False and kept.read_text() == "ETCD_INITIAL_CLUSTER_STATE=new\n"
    new = tmp_path / "new"
    res, _ = run([{"dest": str(new), "content": "x", "owner": "root", "group": "root", "mode": "0600"}], "--check")
    assert res["changed"] is True and not new.exists()


def test_unknown_owner_fails_naming_the_file(tmp_path: Path) -> None:
    f = tmp_path / "k"
    res, _ = run([{"dest": str(f), "content": "x", "owner": "no-such-user-here", "group": "root", "mode": "0600"}])
    assert res.get("failed") is True, res
    assert "no-such-user-here" in res["msg"], res
    assert not f.exists() and not list(tmp_path.glob(".sandbox_files.*"))


def test_without_owner_a_file_is_the_running_users(tmp_path: Path) -> None:
    """verify's report on the control node: no owner or group given, the file is the running
    user's and an existing one keeps its owner; the mode is still set."""
    import os

    f = tmp_path / "verify.json"
    res, _ = run([{"dest": str(f), "content": "{}\n", "mode": "0644"}])
    assert res["changed_files"] == [str(f)] and f.read_text() == "{}\n" and mode(f) == "0644"
    assert (f.stat().st_uid, f.stat().st_gid) == (os.getuid(), os.getgid())
    res, _ = run([{"dest": str(f), "content": "{}\n", "mode": "0644"}])
    assert res["changed"] is False, res
