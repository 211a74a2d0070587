"""Ansible callback plugin: the sandbox's progress, as events for the CLI's screen.

``scripts/sandbox`` enables it with ``ANSIBLE_CALLBACKS_ENABLED=sandbox_progress`` while
ansible's own output goes to a log file. It sends one JSON object per line: ``playbook``
(its phases: the playbook files its plays come from), ``play``, ``task_start``, ``task``
(the end of a task: counts of ok/changed/failed/skipped hosts), ``warning`` (a debug
message starting with ``WARNING:``, or a line of a module result's ``sandbox_warnings``),
``failed`` and ``stats``; each event that a verbose screen shows carries its ``line`` (one
line per play and per task, with elapsed seconds).
scripts/sandboxlib/progress.py turns them into one line per phase. Environment:

- ``SANDBOX_PROGRESS_FILE``: where the events are written (a FIFO the CLI reads); without
  it the lines go to ansible's display.
- ``SANDBOX_PROGRESS_T0``: epoch seconds the elapsed times count from (default: start).
- ``SANDBOX_RESULT_FILE``: a JSON file written at the end: totals and the failed tasks
  (host, task, msg), which the CLI turns into its one-line reason.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

DOCUMENTATION = r"""
name: sandbox_progress
type: notification
short_description: progress events for scripts/sandbox
description:
  - Sends one JSON event per line (play, task start and end, warnings, failures, stats) to
    the file in C(SANDBOX_PROGRESS_FILE); without it, prints one line per play and per task
    with elapsed seconds and a final ok/changed/failed count.
  - Failures are written as JSON to C(SANDBOX_RESULT_FILE).
requirements:
  - enable with C(ANSIBLE_CALLBACKS_ENABLED=sandbox_progress)
"""

from ansible.plugins.callback import CallbackBase


def _one_line(text: Any, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failure_message(result: dict[str, Any]) -> str:
    """The most useful single line of a failed task's result (of a loop: its first failed
    item's, which names what failed, not "One or more items failed")."""
    items = [r for r in result.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if items:
        return failure_message(items[0])
    msg = str(result.get("msg") or "").strip()
    stderr = str(result.get("stderr") or "").strip()
    stdout = str(result.get("stdout") or "").strip()
    detail = stderr.splitlines()[-1] if stderr else (stdout.splitlines()[-1] if stdout else "")
    if not msg:
        msg = detail or "failed"
    elif detail and msg in ("non-zero return code", "MODULE FAILURE"):
        msg = f"{msg}: {detail}"
    if "rc" in result and "rc " not in msg:
        msg = f"{msg} (rc {result['rc']})"
    return _one_line(msg)


def in_rescued_block(task: Any) -> bool:
    """Whether a failure of ``task`` goes to a ``rescue:`` of a block around it."""
    parent = getattr(task, "_parent", None)
    while parent is not None:
        if getattr(parent, "rescue", None):
            return True
        parent = getattr(parent, "_parent", None)
    return False


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "sandbox_progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._t0 = float(os.environ.get("SANDBOX_PROGRESS_T0") or time.time())
        self._out = None
        path = os.environ.get("SANDBOX_PROGRESS_FILE")
        if path:
            try:
                self._out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            except OSError:
                self._out = None
        self._phase = "play"
        self._plays_total = 0
        self._play_index = 0
        self._task: str | None = None
        self._task_t0 = 0.0
        self._counts: dict[str, int] = {}
        self._failures: list[dict[str, str]] = []

    # -- output -------------------------------------------------------------------------
    def _send(self, ev: str, line: str | None = None, **fields: Any) -> None:
        """One event to the CLI (a JSON line), or its line to ansible's display."""
        if self._out is not None:
            try:
                self._out.write(json.dumps({"ev": ev, "line": line, **fields}) + "\n")
                return
            except OSError:
                self._out = None
        if line is not None:
            self._display.display(line)

    def _elapsed(self) -> str:
        return f"+{time.time() - self._t0:.0f}s"

    def _flush_task(self) -> None:
        if self._task is None:
            return
        c = self._counts
        hosts = sum(c.values())
        line = None
        if hosts and c.get("skipped", 0) < hosts:
            if c.get("failed") or c.get("unreachable"):
                status = "FAILED"
                n = c.get("failed", 0) + c.get("unreachable", 0)
            elif c.get("rescued"):
                status, n = "rescued", c["rescued"]
            elif c.get("changed"):
                status, n = "changed", c["changed"]
            else:
                status, n = "ok", c.get("ok", 0)
            count = f"{n}/{hosts}" if hosts > 1 else ""
            took = time.time() - self._task_t0
            line = f"      {status:<7} {count:<5} {self._task} ({took:.1f}s)"
        self._send("task", line, name=self._task, counts=c)
        self._task = None
        self._counts = {}

    def _count(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    # -- playbook and play --------------------------------------------------------------
    def v2_playbook_on_start(self, playbook: Any) -> None:
        name = getattr(playbook, "_file_name", None) or "playbook"
        self._phase = Path(str(name)).stem
        try:
            plays = playbook.get_plays()
        except Exception:  # noqa: BLE001 - the count is only cosmetic
            plays = []
        self._plays_total = len(plays)
        self._play_index = 0
        phases: list[str] = []
        for play in plays:
            phase = self._phase_of(play)
            if not phases or phases[-1] != phase:
                phases.append(phase)
        self._send("playbook", None, name=self._phase, phases=phases)

    def _phase_of(self, play: Any) -> str:
        """The playbook file a play comes from (site.yml imports etcd.yml, ...)."""
        path = play.get_path() if hasattr(play, "get_path") else ""
        return Path(path.rsplit(":", 1)[0]).stem if path else self._phase

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._flush_task()
        self._play_index += 1
        phase = self._phase_of(play)
        total = self._plays_total or "?"
        name = play.get_name().strip()
        line = f"==> [{self._play_index}/{total}] {phase}: {name} ({self._elapsed()})"
        self._send("play", line, phase=phase, name=name, t=self._elapsed())

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._flush_task()
        self._task = task.get_name().strip()
        self._task_t0 = time.time()
        self._send("task_start", None, name=self._task)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    # -- results ------------------------------------------------------------------------
    def v2_runner_on_ok(self, result: Any) -> None:
        self._count("changed" if result._result.get("changed") else "ok")
        msg = result._result.get("msg")
        if result._task.action in ("debug", "ansible.builtin.debug") and isinstance(msg, str) \
                and msg.startswith("WARNING:"):
            self._send("warning", None, msg=msg, host=result._host.get_name())
        for note in result._result.get("sandbox_warnings") or []:   # e.g. a drop-in removed
            self._send("warning", None, msg=f"WARNING: {result._host.get_name()}: {note}",
                       host=result._host.get_name())

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._count("skipped")

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if ignore_errors:
            self._count("ok")
            return
        self._failures.append({"host": result._host.get_name(),
                               "task": result._task.get_name().strip(),
                               "msg": failure_message(result._result)})
        if in_rescued_block(result._task):   # e.g. a failed download and its fallback
            self._count("rescued")
            return
        self._count("failed")
        self._send("failed", None, **self._failures[-1])

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._count("unreachable")
        self._failures.append({"host": result._host.get_name(),
                               "task": result._task.get_name().strip(),
                               "msg": "unreachable: "
                                      + failure_message(result._result)})
        self._send("failed", None, **self._failures[-1])

    # -- end ----------------------------------------------------------------------------
    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._flush_task()
        totals = {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0}
        failed_hosts = set()
        for host in sorted(stats.processed):
            s = stats.summarize(host)
            totals["ok"] += s["ok"]
            totals["changed"] += s["changed"]
            totals["failed"] += s["failures"]
            totals["unreachable"] += s["unreachable"]
            if s["failures"] or s["unreachable"]:
                failed_hosts.add(host)
        self._send("stats", f"    {self._phase} done ({self._elapsed()}): "
                   + " ".join(f"{k}={v}" for k, v in totals.items()), totals=totals,
                   t=self._elapsed())
        result_file = os.environ.get("SANDBOX_RESULT_FILE")
        if result_file:
            failures = [f for f in self._failures if f["host"] in failed_hosts]
            Path(result_file).write_text(json.dumps(
                {"playbook": self._phase, "totals": totals, "failures": failures}),
                encoding="utf-8")
        if self._out is not None:
            self._out.close()
            self._out = None
