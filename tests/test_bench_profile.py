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


def _row(case: str, members: int, seconds: float, **extra: object) -> dict[str, object]:
    return {"case": case, "members": members, "rep": 1, "seconds": seconds, "load1": 0.5,
            **extra}


def test_targets_say_met_or_missed_with_the_figure_and_the_reason() -> None:
    rows = [_row("cold-up", 3, 34.0, nodes=10, pki=3, etcd=5, apiserver=8, k0s=3,
                 slowest="pki : Generate the keys=2.7s; nodes : Start=2.5s; x=1.0s; y=0.5s"),
            _row("cold-up", 3, 36.0, nodes=10, pki=3, etcd=5, apiserver=8, k0s=3),
            _row("floor", 3, 1.0), _row("noop-up", 3, 0.6), _row("down", 3, 3.4),
            _row("cold-up", 7, 44.0, nodes=15, pki=3, etcd=9, apiserver=8, k0s=3)]
    found = {t["target"]: t for t in bench.targets(rows, cores=2)}
    cold = found["cold up of the default topology <= 25 s"]
    assert (cold["figure"], cold["met"]) == ("35 s", False)
    assert cold["reason"].startswith("largest phases: nodes 10 s, apiserver 8 s, etcd 5 s; "
                                     "slowest tasks: pki : Generate the keys=2.7s;"), cold
    assert "y=0.5s" not in cold["reason"]     # the three slowest only
    ratio = found["cold up <= 20 x floor"]
    assert (ratio["figure"], ratio["met"]) == ("35.0 x (1 s)", False)
    assert "14 s of the up are phases it does not have (apiserver 8 s" in ratio["reason"]
    noop = found["no-op up <= 1 s"]
    assert (noop["figure"], noop["met"], noop["reason"]) == ("0.6 s", True, "")
    assert found["down <= 3 s"]["met"] is False
    seven = found["cold up, 7 members <= 1.3 x 3 members"]
    assert seven["figure"] == "1.26 x (44 s / 35 s)" and seven["met"] is True


def test_targets_leave_out_what_did_not_run_and_a_slower_seven_names_its_growth() -> None:
    rows = [_row("cold-up", 3, 25.0, nodes=10, etcd=5), _row("cold-up", 7, 45.0, nodes=16,
                                                              etcd=12)]
    found = bench.targets(rows, cores=2)
    assert [t["target"] for t in found] == ["cold up of the default topology <= 25 s",
                                            "cold up, 7 members <= 1.3 x 3 members"]
    assert found[0]["met"] is True
    assert found[1]["reason"] == ("4 more nodes' tasks run on the control node's 2 core(s): "
                                  "etcd 7 s more, nodes 6 s more")


def test_print_targets_says_whether_the_machine_was_idle(capsys: pytest.CaptureFixture[str]) -> None:
    found = bench.targets([_row("noop-up", 3, 4.0), _row("down", 3, 1.0)], cores=2)
    bench.print_targets(found, 3.5, 2)
    out = capsys.readouterr().out
    assert "NOT idle: the targets are for an idle machine" in out
    assert "MISSED no-op up <= 1 s: 4 s -- the check:" in out
    assert "met    down <= 3 s: 1 s\n" in out
    assert "(not measured here) clean-clone .ci/run <= 25 min and scripts/test --quick <= 3 min" in out
    bench.print_targets(found, 0.2, 2)
    assert "before the bench: idle)" in capsys.readouterr().out
