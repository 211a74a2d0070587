"""Which task files of one role ran, over all the ansible-playbook runs of a Molecule scenario.

A task file counts as run when one of its tasks returned ok, changed or failed on some host
(skipped only: not run), or when include_tasks included it (a file of static imports only,
such as roles/k0s_controller/tasks/k0s.yml, has no task of its own). The names seen are merged into the JSON file
``$ROLE_TASK_FILES_RECORD`` as soon as a new one is seen (so a later task of the same run
can read the record), and each run ends with a line saying ``<n>/<total>`` and which are
missing. ``$ROLE_TASK_FILES_ROLE`` names the role (its ``roles/<name>/tasks/*.yml``). Used by
the k0s scenario: its verify asserts that every task file of roles/k0s_controller ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: role_task_files
type: aggregate
short_description: record which task files of a role ran
description: Merges the task files of $ROLE_TASK_FILES_ROLE that ran into $ROLE_TASK_FILES_RECORD.
requirements: [enable in the callbacks_enabled setting]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "role_task_files"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._record = os.environ.get("ROLE_TASK_FILES_RECORD", "")
        role = os.environ.get("ROLE_TASK_FILES_ROLE", "")
        self._marker = f"/roles/{role}/tasks/" if role else ""
        self._seen: set[str] = set()

    def _task_file(self, task: Any) -> str:
        path = (task.get_path() or "").rsplit(":", 1)[0]
        return path.split(self._marker, 1)[1] if self._marker and self._marker in path else ""

    def _ran(self, result: Any) -> None:
        self._add(self._task_file(result._task))

    def _add(self, name: str) -> None:
        if not name or name in self._seen or not self._record:
            return
        self._seen.add(name)
        record = Path(self._record)
        done = set(json.loads(record.read_text())) if record.is_file() else set()
        record.write_text(json.dumps(sorted(done | {name})))

    def v2_runner_on_ok(self, result: Any) -> None:
        self._ran(result)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._ran(result)

    def v2_playbook_on_include(self, included_file: Any) -> None:
        path = str(included_file._filename)
        if self._marker and self._marker in path:
            self._add(path.split(self._marker, 1)[1])

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if not self._record or not self._marker:
            return
        tasks_dir = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", ".")) / self._marker.strip("/")
        every = sorted(p.name for p in tasks_dir.glob("*.yml"))
        record = Path(self._record)
        done = set(json.loads(record.read_text())) if record.is_file() else set()
        missing = [f for f in every if f not in done]
        self._display.display(
            f"task files of {self._marker.strip('/')} run in this scenario so far: "
            f"{len(every) - len(missing)}/{len(every)}"
            + (f" (not yet: {', '.join(missing)})" if missing else " (all)"))
