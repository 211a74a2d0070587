"""The sandbox_progress callback plugin: its one-line failure reasons and its events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO_ROOT, load_plugin


def _plugin() -> ModuleType:
    return load_plugin("scripts/ansible_plugins/callback/sandbox_progress.py")


@pytest.mark.parametrize(("result", "message"), [
    ({"msg": "etcd_members: give at least one member"}, "etcd_members: give at least one member"),
    ({"msg": "non-zero return code", "rc": 3, "stderr": "first\nboom"},
     "non-zero return code: boom (rc 3)"),
    ({"stdout": "a\nlast line", "rc": 1}, "last line (rc 1)"),
    ({}, "failed"),
    ({"msg": "x\n  y   z"}, "x y z"),
    ({"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "fine"},
        {"failed": True, "msg": "Validation of arguments failed: etcd_client_port: abc is not an int"}]},
     "Validation of arguments failed: etcd_client_port: abc is not an int"),
])
def test_failure_message(result: dict[str, object], message: str) -> None:
    assert _plugin().failure_message(result) == message


def test_failure_message_is_bounded() -> None:
    assert len(_plugin().failure_message({"msg": "x" * 5000})) == 400


PLAYBOOK = """
- name: First play
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Say hello
      ansible.builtin.debug:
        msg: hello
    - name: Warn
      ansible.builtin.debug:
        msg: "WARNING: something the user should know"
    - name: A module's warnings (sandbox_fingerprint's drop-ins removed), here debug's var
      ansible.builtin.debug:
        var: sandbox_warnings
      vars:
        sandbox_warnings: ["removed /etc/x.conf"]
    - name: A download that fails, and its fallback
      block:
        - name: Download
          ansible.builtin.command: "false"
          changed_when: false
      rescue:
        - name: Fall back
          ansible.builtin.debug:
            msg: fallback
    - name: Skipped
      ansible.builtin.debug:
        msg: never
      when: false
"""


def test_callback_sends_one_json_event_per_line(tmp_path: Path) -> None:
    """A real ansible-playbook run with the callback enabled, as scripts/sandbox runs it."""
    book = tmp_path / "phase.yml"
    book.write_text(PLAYBOOK)
    events_file = tmp_path / "events"
    result = tmp_path / "result.json"
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=str(REPO_ROOT / "scripts" / "ansible_plugins" / "callback"),
               ANSIBLE_CALLBACKS_ENABLED="sandbox_progress", SANDBOX_PROGRESS_FILE=str(events_file),
               SANDBOX_RESULT_FILE=str(result), ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    env.pop("ANSIBLE_CONFIG", None)
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(book)],
                         env=env, capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    kinds = [e["ev"] for e in events]
    assert kinds[0] == "playbook" and events[0]["phases"] == ["phase"]
    assert kinds[1] == "play" and events[1]["line"].startswith("==> [1/1] phase: First play")
    assert kinds[-1] == "stats" and "failed=0" in events[-1]["line"]
    warnings = [e for e in events if e["ev"] == "warning"]
    assert [w["msg"] for w in warnings] == ["WARNING: something the user should know",
                                            "WARNING: localhost: removed /etc/x.conf"]
    # the rescued failure is not a failure of the phase
    assert "failed" not in kinds
    download = next(e for e in events if e["ev"] == "task" and e["name"] == "Download")
    assert download["counts"] == {"rescued": 1}
    skipped = next(e for e in events if e["ev"] == "task" and e["name"] == "Skipped")
    assert skipped["counts"] == {"skipped": 1} and skipped["line"] is None
    assert json.loads(result.read_text())["failures"] == []
