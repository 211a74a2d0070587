"""etcd's plain-HTTP probes: a member's ``/health`` and ``/metrics`` on its metrics listener.

roles/etcd's ``etcd_metrics_port`` (2381 by default, 0 switches it off) serves both without a
certificate, so the control node asks every member directly, no SSH: ``status`` and ``up``'s
table (report.py) and up's no-op check (fingerprint.py) both read health here.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .sandbox_budgets import parse_metrics
from .topology import Node, Topology

T = TypeVar("T")
METRICS_PORT = 2381   # roles/etcd/defaults/main.yml: etcd_metrics_port
# /metrics' database size and backend quota (bytes).
DB_METRICS = ("etcd_mvcc_db_total_size_in_bytes", "etcd_server_quota_backend_bytes")
# The nodes' addresses are local networks: never through an HTTP(S)_PROXY from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def metrics_port(topo: Topology, node: Node) -> int:
    """The member's plain-HTTP metrics port as the etcd role sets it; 0 when it is off or
    set by a template the CLI cannot evaluate."""
    for where in (node.vars, topo.vars):
        if "etcd_metrics_port" in where:
            try:
                return int(where["etcd_metrics_port"] or 0)
            except (TypeError, ValueError):
                return 0
    return METRICS_PORT


def http_health(host: str, port: int, timeout: float = 3.0) -> str:
    """'healthy' or 'unhealthy' as etcd's /health says it ({"health":"true"}; 503 with
    "false" when the member has no leader or cannot serve a read), '' when nothing answers."""
    if not port:
        return ""
    try:
        with _DIRECT.open(f"http://{host}:{port}/health", timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as err:   # 503: etcd answered, unhealthy
        body = err.read()
    except (OSError, ValueError, http.client.HTTPException):
        return ""
    try:
        doc = json.loads(body)
        health, reason = doc.get("health"), doc.get("reason", "")
    except (ValueError, AttributeError):
        return ""
    if str(health).lower() == "true":
        return "healthy"
    return f"unhealthy ({reason})" if reason else "unhealthy"   # 3.5+: "ALARM NOSPACE"


def _metrics_text(host: str, port: int, timeout: float) -> str | None:
    """The member's /metrics, None when nothing answers."""
    if not port:
        return None
    try:
        with _DIRECT.open(f"http://{host}:{port}/metrics", timeout=timeout) as resp:
            return str(resp.read().decode(errors="replace"))
    except (OSError, ValueError, http.client.HTTPException):
        return None


def http_budgets(host: str, port: int, timeout: float = 3.0) -> dict[str, dict[str, Any]] | None:
    """Each tenant's write budget figures the member exports (sandbox_budgets.parse_metrics:
    {} from a build that enforces none), None when nothing answers."""
    text = _metrics_text(host, port, timeout)
    return None if text is None else parse_metrics(text)


def http_metrics(host: str, port: int, timeout: float = 3.0) -> dict[str, float]:
    """The member's database size and backend quota from its /metrics (DB_METRICS -> value),
    {} when nothing answers."""
    text = _metrics_text(host, port, timeout)
    if text is None:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in DB_METRICS:
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


def ask_members(fn: Callable[[str, int], T], topo: Topology, backend: str,
                members: list[str]) -> dict[str, T]:
    """``fn(address, metrics port)`` for every named member at once."""
    if not members:
        return {}
    with ThreadPoolExecutor(max_workers=len(members)) as pool:
        futures = {m: pool.submit(fn, topo.node(m).address(backend),
                                  metrics_port(topo, topo.node(m))) for m in members}
        return {m: f.result() for m, f in futures.items()}


def metrics_health(topo: Topology, backend: str, members: list[str]) -> dict[str, str]:
    """Every named member's /health, asked at once; '' for a member that did not answer."""
    return ask_members(http_health, topo, backend, members)
