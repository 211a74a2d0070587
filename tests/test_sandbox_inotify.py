"""plugins/modules/sandbox_inotify.py: the instances root holds are counted, the new nodes'
share planned, the limit raised (or the command to run given) -- on a procfs-shaped tree
(the real /proc's count is checked against the same function), run by Ansible as the role
runs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import load_plugin, run_module

REPO = Path(__file__).resolve().parents[1]
ANSIBLE = Path(sys.executable).parent / "ansible"


def _module() -> ModuleType:
    return load_plugin("plugins/modules/sandbox_inotify.py")


def fake_proc(root: Path, limit: int, fds: dict[str, list[str]]) -> Path:
    """/proc-shaped: sys/fs/inotify/max_user_instances and <pid>/fd/<n> links."""
    (root / "sys/fs/inotify").mkdir(parents=True)
    (root / "sys/fs/inotify/max_user_instances").write_text(f"{limit}\n")
    for pid, links in fds.items():
        (root / pid / "fd").mkdir(parents=True)
        for i, target in enumerate(links):
            (root / pid / "fd" / str(i)).symlink_to(target)
    (root / "self").mkdir()
    return root


def run(args: dict[str, Any]) -> dict[str, Any]:
    return run_module("sandbox_inotify", args)[0]


def test_count_sees_only_inotify_descriptors(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 128, {"1": ["anon_inode:inotify"] * 3 + ["/dev/null"],
                                     "42": ["anon_inode:inotify", "anon_inode:[eventfd]"]})
    assert _module().count_instances(proc, os.geteuid()) == 4
    assert _module().count_instances(proc, os.geteuid() + 12345) == 0


def test_count_of_the_real_proc_matches_a_plain_reading() -> None:
    plain = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                continue
            plain += sum(os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
                         for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    got = _module().count_instances(Path("/proc"), os.geteuid())
    assert abs(got - plain) <= 4   # processes come and go between the two readings


@pytest.mark.parametrize(("limit", "used", "nodes", "want"), [
    (128, 10, 5, 0),            # 10 + 40 + 64 = 114: fits
    (128, 122, 5, 512),         # what was seen here: 122 in use, 5 nodes
    (128, 500, 7, 1024),        # 500 + 56 + 64 = 620 -> 1024
    (8192, 122, 5, 0),
])
def test_plan(limit: int, used: int, nodes: int, want: int) -> None:
    assert _module().plan(limit, used, nodes, 8, 64) == want


@pytest.mark.skipif(os.geteuid() != 0, reason="raising the limit is root's (the module refuses otherwise)")
def test_raised_through_ansible_when_the_nodes_do_not_fit(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 128, {})
    limit_file = proc / "sys/fs/inotify/max_user_instances"
    ok = run({"nodes": 3, "proc": str(proc)})
    assert ok["changed"] is False and ok["limit"] == 128 and ok["used"] == 0, ok
    raised = run({"nodes": 10, "proc": str(proc)})          # 0 + 80 + 64 > 128
    assert raised["changed"] is True and raised["limit"] == 512, raised
    assert "raised to 512" in raised["msg"] and "/etc/sysctl.d/" in raised["msg"]
    assert limit_file.read_text() == "512\n"
    limit_file.write_text("128\n")
    refused = run({"nodes": 10, "raise_limit": False, "proc": str(proc)})
    assert refused.get("failed") is True, refused
    assert "sysctl -w fs.inotify.max_user_instances=512" in refused["msg"]
    assert limit_file.read_text() == "128\n"
