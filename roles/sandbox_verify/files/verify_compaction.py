#!/usr/bin/env python3
"""What playbooks/verify.yml reads about compaction on a node (no waiting for a round).

usage: verify_compaction.py SPEC   (SPEC = base64 of a JSON object)
  phase: "member"    an etcd member: its auto-compaction settings (etcd.env), how long etcd
                     has run, the auto compactions its journal logged since it started
                     (completed and failed: only the leader's compactor logs them), its
                     compaction and current revision (/metrics on the plain-HTTP port)
         "apiserver" a controller: the API server's unit (k0s's, else the CRD API server
                     stand-in's), its --etcd-compaction-interval (k0s.yaml spec.api.extraArgs)
                     and the "compact failed" lines its journal holds since it started
  config_dir, metrics_port (member); k0s_config (apiserver)
Prints one JSON object; the playbook makes the checks of it (tasks/compaction.yml).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any


def run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              check=False).stdout
    except subprocess.TimeoutExpired:
        return ""


def unit(name: str) -> dict[str, Any]:
    """Whether the unit runs, for how long (s) and its journal since it started."""
    props = dict(line.split("=", 1) for line in run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "InvocationID", "-p",
         "ActiveEnterTimestampMonotonic", name]).splitlines() if "=" in line)
    if props.get("ActiveState") != "active" or not props.get("InvocationID"):
        return {"active": False, "up_s": 0, "journal": []}
    try:
        up_s = time.monotonic() - int(props.get("ActiveEnterTimestampMonotonic", "0")) / 1e6
    except ValueError:
        up_s = 0.0
    journal = run(["journalctl", "--no-pager", "-o", "cat", "-u", name,
                   f"_SYSTEMD_INVOCATION_ID={props['InvocationID']}"]).splitlines()
    return {"active": True, "up_s": round(up_s), "journal": journal}


def metric(port: int, name: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode(errors="replace")
    except OSError:
        return None
    found = re.search(rf"^{name} (-?[0-9.e+]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else None


def member(spec: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, str] = {}
    try:
        with open(f"{spec.get('config_dir') or '/etc/etcd'}/etcd.env", encoding="utf-8") as fh:
            env = dict(ln.strip().split("=", 1) for ln in fh if re.match(r"^ETCD_[A-Z_]+=", ln))
    except OSError:
        pass
    etcd = unit("etcd")
    completed, failed = [], []
    for line in etcd["journal"]:
        if "completed auto periodic compaction" in line or "completed auto revision compaction" in line:
            rev = re.search(r'"revision":\s*(\d+)', line)
            completed.append(int(rev.group(1)) if rev else 0)
        elif "failed auto periodic compaction" in line or "failed auto revision compaction" in line:
            failed.append(" ".join(line.split())[:300])
    port = int(spec.get("metrics_port") or 0)
    return {"mode": env.get("ETCD_AUTO_COMPACTION_MODE", ""),
            "retention": env.get("ETCD_AUTO_COMPACTION_RETENTION", ""),
            "active": etcd["active"], "up_s": etcd["up_s"],
            "completed": completed, "failed": failed[-3:], "failed_count": len(failed),
            "compact_revision": metric(port, "etcd_debugging_mvcc_compact_revision") if port else None,
            "current_revision": metric(port, "etcd_debugging_mvcc_current_revision") if port else None}


def apiserver(spec: dict[str, Any]) -> dict[str, Any]:
    name = next((u for u in ("k0scontroller", "crd-apiserver") if unit(u)["active"]), "")
    if not name:
        return {"unit": "", "interval": "", "up_s": 0, "errors": []}
    state = unit(name)
    interval = ""
    try:
        with open(spec.get("k0s_config") or "/etc/k0s/k0s.yaml", encoding="utf-8") as fh:
            found = re.search(r"etcd-compaction-interval:\s*['\"]?([^'\"\s]+)", fh.read())
            interval = found.group(1) if found else ""
    except OSError:
        pass
    errors = [" ".join(ln.split())[:300] for ln in state["journal"]
              if "compact failed" in ln or "compaction failed" in ln]
    return {"unit": name, "interval": interval, "up_s": state["up_s"], "errors": errors[-3:],
            "error_count": len(errors)}


def main() -> int:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    print(json.dumps({"member": member, "apiserver": apiserver}[spec["phase"]](spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
