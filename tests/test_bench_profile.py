"""scripts/sandbox bench with SANDBOX_PROFILE=1: the runner adds profile_tasks to every
playbook run of a command (its recap lands in the command's log), and bench lists an up's
slowest tasks across all its playbooks (nodes.yml, pki.yml beside it, up.yml)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sandboxlib import bench, runner
from sandboxlib.progress import Screen

# Two playbooks' recaps as profile_tasks writes them (ansible.posix), with task output between.
LOG = """
TASK [podman_nodes : Wait for SSH] *****
ok: [etcd-1]
TASKS RECAP ********************************************************************
Thursday 03 December 2026  07:31:20 +0000 (0:00:02.001)       0:00:07.894 *****
===============================================================================
podman_nodes : Wait for SSH --------------------------------------------- 3.12s
podman_nodes : Read the sandbox's nodes, running or stopped, in one podman call --- 0.97s

PLAY RECAP *********************************************************************
localhost                  : ok=20   changed=0

$ ansible-playbook ... playbooks/up.yml
TASK [etcd : Enable and start etcd] ***
changed: [etcd-1] => {"msg": "not a recap line --- 9.99s"}
TASKS RECAP ********************************************************************
===============================================================================
sandbox_verify : Write the report --------------------------------------- 5.81s
etcd : Enable and start etcd -------------------------------------------- 2.65s
Phase podman_nodes/wait ------------------------------------------------- 0.15s
"""


def test_the_slowest_tasks_of_every_playbook_of_a_run() -> None:
    assert bench.slowest(LOG, 3) == [("sandbox_verify : Write the report", 5.81),
                                     ("podman_nodes : Wait for SSH", 3.12),
                                     ("etcd : Enable and start etcd", 2.65)]
    assert len(bench.slowest(LOG)) == 5
    assert bench.slowest("no recap") == []


@pytest.mark.parametrize("profile", ["1", ""])
def test_sandbox_profile_adds_profile_tasks(profile: str, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("SANDBOX_PROFILE", profile)
    monkeypatch.delenv("PROFILE_TASKS_TASK_OUTPUT_LIMIT", raising=False)
    ctx = runner.RunContext(log_path=tmp_path / "log", progress_file=tmp_path / "fifo", t0=0.0,
                            screen=Screen(io.StringIO()))
    env = ctx.env("podman")
    enabled = env["ANSIBLE_CALLBACKS_ENABLED"].split(",")
    assert ("ansible.posix.profile_tasks" in enabled) == (profile == "1")
    assert "sandbox_progress" in enabled
    assert env.get("PROFILE_TASKS_TASK_OUTPUT_LIMIT") == ("all" if profile == "1" else None)
