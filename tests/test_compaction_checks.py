"""verify's compaction checks (plugins/filter/sandbox_compaction.py) on what
roles/sandbox_verify/files/verify_compaction.py reads on the nodes: each outcome, from the
members' and the API servers' reports. Run on real nodes by the crd_apiserver scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]


compaction = load_plugin("plugins/filter/sandbox_compaction.py")


def member(up_s: int, completed: list[int] | None = None, failed: int = 0,
           mode: str = "periodic", retention: str = "5m") -> dict[str, Any]:
    return {"mode": mode, "retention": retention, "active": True, "up_s": up_s,
            "completed": completed or [], "failed": ["failed auto periodic compaction ..."] * failed,
            "failed_count": failed, "compact_revision": 90 if completed else -1,
            "current_revision": 120}


@pytest.mark.parametrize(("retention", "seconds"), [("5m", 300), ("1h", 3600), ("1", 3600),
                                                    ("10s", 10), ("1m30s", 90), ("", 0)])
def test_retention_as_etcd_reads_it(retention: str, seconds: float) -> None:
    assert compaction.etcd_retention_s("periodic", retention) == seconds


@pytest.mark.parametrize(("reports", "ok", "skipped", "fragment"), [
    ({"e1": member(400, [90]), "e2": member(400), "e3": member(400)}, True, False,
     ("1 auto compaction(s) since the members started (periodic, retention 5m), the last at "
     "revision 90")),
    ({"e1": member(60), "e2": member(400)}, True, True,
     "SKIPPED: no auto compaction due yet (periodic, retention 5m): a member started 60s ago"),
    ({"e1": member(900), "e2": member(900)}, False, False,
     "no auto compaction in 900s (periodic, retention 5m"),
    ({"e1": member(900, [90], failed=2)}, False, False, "2 failed auto compaction(s)"),
    ({"e1": member(900, mode="", retention="")}, True, True,
     "SKIPPED: etcd's auto-compaction is off"),
    ({"e1": {**member(900), "active": False}}, False, False, "no member's etcd is running"),
], ids=["compacted", "too-young", "none-when-due", "failed", "off", "down"])
def test_members_compaction_check(reports: dict[str, Any], ok: bool, skipped: bool,
                                  fragment: str) -> None:
    check = compaction.sandbox_compaction_check(reports)
    assert check["name"] == "etcd compacts the shared keyspace itself (auto-compaction)"
    assert (check["ok"], bool(check.get("skipped"))) == (ok, skipped), check
    assert fragment in check["detail"], check


def test_api_server_compaction_check() -> None:
    quiet = {"unit": "crd-apiserver", "interval": "0", "up_s": 30, "errors": [], "error_count": 0}
    check = compaction.sandbox_apiserver_compaction_check(quiet, "c1", "ta")
    assert check["ok"] and "skipped" not in check
    assert "--etcd-compaction-interval=0: it does not compact" in check["detail"]
    failing = {**quiet, "interval": "", "error_count": 3,
               "errors": ["compact failed: etcdserver: permission denied"]}
    check = compaction.sandbox_apiserver_compaction_check(failing, "c1", "ta")
    assert not check["ok"]
    assert "3 compaction error(s) in the journal of crd-apiserver" in check["detail"]
    assert "permission denied" in check["detail"]
    none = compaction.sandbox_apiserver_compaction_check({"unit": ""}, "c1", "ta")
    assert none["ok"] and none["skipped"]
