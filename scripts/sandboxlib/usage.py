"""Each tenant's usage of the shared etcd: the keys under its prefix and their bytes (keys and
values), read in one pass at one revision with the tenant's own certificate
(roles/k0s_controller/tasks/tenant_usage.yml: the module sandbox_etcd_prefix, op usage), its
share of the backend quota (etcd's ``--quota-backend-bytes``) and, where the topology gives
``tenants[].max_bytes``, whether it is over.

``max_bytes`` is also the tenant's write budget, which the sandbox's etcd build enforces
(sandbox_budgets.py; ``status`` shows it as WRITE BUDGET).

``scripts/sandbox status`` runs playbooks/tenant-usage.yml (:func:`read`); verify's usage
phase and that playbook build their entries and checks through the filter
plugins/filter/sandbox_usage.py; both apply plugins/plugin_utils/sandbox_usage.py (linked
here as sandbox_usage.py), so both say the same.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from . import runner
from .progress import Screen
from .sandbox_usage import (
    ETCD_OWN_DEFAULT,
    NOT_A_LIMIT,
    check,
    entries,
    finish_command,
    interrupted,
    line,
    quota,
    role_quota,
    share,
)
from .topology import Topology

__all__ = ["ETCD_OWN_DEFAULT", "NOT_A_LIMIT", "check", "entries", "finish_command", "from_report",
           "interrupted", "line", "quota", "read", "role_quota", "share"]


def from_report(path: Path, since: float) -> tuple[list[dict[str, Any]], str]:
    """Every tenant's usage as a report of the checks written since ``since`` holds it
    (``up`` shows what its quick check, or verify, read instead of reading again):
    (entries, '') or ([], why not)."""
    try:
        if path.stat().st_mtime >= since:
            return list(json.loads(path.read_text()).get("tenants") or []), ""
    except (OSError, ValueError, AttributeError):
        pass
    return [], "no report of this run's checks: scripts/sandbox status reads it"


def read(topo: Topology, backend: str, controllers: list[str]) -> tuple[list[dict[str, Any]], str]:
    """Every tenant's usage through playbooks/tenant-usage.yml on ``controllers`` (the running
    ones), quietly: (entries, '') or ([], why not)."""
    if not controllers:
        return [], "no controller is running"
    with tempfile.TemporaryDirectory(prefix="sandbox-usage-") as tmp:
        out = Path(tmp) / "usage.json"
        ctx = runner.RunContext(log_path=Path(tmp) / "usage.log", progress_file=Path(os.devnull),
                                t0=time.time(), screen=Screen(io.StringIO()))
        extra = {"k0s_usage_report": str(out)}
        try:
            runner.run_playbook(ctx, topo, backend, "tenant-usage.yml", extra,
                                limit=",".join(["localhost", *controllers]))
        except runner.CommandFailed as exc:
            return [], str(exc).split(" (log: ")[0][:160]
        try:
            return list(json.loads(out.read_text())), ""
        except (OSError, ValueError) as exc:
            return [], f"no usage written ({exc})"
