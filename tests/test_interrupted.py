"""An interrupted ansible-playbook is reported as interrupted (scripts/sandboxlib/runner.py),
not as the first error its log holds: a run of `up` here logs the etcd release download it
ignores (it falls back to the package) long before a Ctrl-C. The logs below are as
ansible-core 2.19 writes them; a Ctrl-C to the whole CLI path is
tests/test_interrupted_e2e.py's (which ends the playbooks itself, sessions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandboxlib import runner

IGNORED = ("[ERROR]: Task failed: Module failed: Request failed: <urlopen error [Errno 111] "
           "Connection refused>\n...ignoring\n")


@pytest.mark.parametrize(("rc", "tail"), [
    (99, "[ERROR]: User interrupted execution\n"),
    (250, ('  File ".../ansible/executor/task_queue_manager.py", line 213, in _signal_handler\n'
           '    if worker is None or not worker.is_alive():\nValueError: process object is closed\n'
           "[ERROR]: Unexpected Exception, this is probably a bug: process object is closed\n")),
    (-2, ""),
], ids=["user-interrupted", "ansible-signal-handler-bug", "killed-by-sigint"])
def test_an_interrupted_run_says_so(tmp_path: Path, rc: int, tail: str) -> None:
    log = tmp_path / "up.log"
    log.write_text("TASK [etcd : Download the tarball]\n" + IGNORED + "TASK [k0s ...]\n" + tail)
    msg = runner._reason(tmp_path / "none.json", "playbooks/site.yml", rc, log)
    assert msg.startswith("playbooks/site.yml was interrupted (SIGINT, Ctrl-C) before it "
                          "finished; what it had done stays done: run the command again"), msg
    assert "Request failed" not in msg


def test_a_failed_run_still_names_its_error(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    log.write_text(IGNORED + "[ERROR]: Task failed: Module failed: the real failure\n")
    msg = runner._reason(tmp_path / "none.json", "playbooks/site.yml", 2, log)
    assert "failed with exit code 2" in msg and "interrupted" not in msg, msg
