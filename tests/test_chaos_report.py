"""The chaos report (scripts/sandboxlib/chaos/report.py) on a generated history with faults:
counts by kind and outcome, unavailability per fault and tenant, the text, the JSON and the
timeline picture; and the CLI's refusals of bad input (exit 2, before anything runs)."""

from __future__ import annotations

import json
import random
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import base_topology, run_sandbox
from sandboxlib.chaos import checker, report, selftest
from sandboxlib.chaos.history import Fault, History


def _history() -> History:
    h = selftest.generate(random.Random(9), 400, n_keys=4, n_procs=3)
    h.faults = [Fault("kill-leader", "etcd-2", start=10.0, healed=10.5, end=14.0, note="x"),
                Fault("partition-leader", "etcd-1", start=40.0, healed=48.0, end=None)]
    return h


def test_report_counts_unavailability_and_text() -> None:
    h = _history()
    data = report.build(h, checker.check(h), {"ok": True}, "")
    assert data["anomaly_count"] == 0 and data["lost_acknowledged_writes"] == 0
    assert sum(sum(c.values()) for c in data["operations"].values()) == len(h.ops)
    assert "etcd read (serializable)" in data["operations"]
    first = data["unavailability_seconds"][0]
    acked_after = [o.complete for o in h.ops if o.acknowledged and o.invoke >= 10.0
                   and not o.process.endswith("/final") and o.complete is not None]
    assert first["t etcd"] == round(min(acked_after) - 10.0, 2)
    assert first["t api"] is None          # no API operation in this history
    text = report.text(data)
    assert "kill-leader" in text and "anomalies: 0; lost acknowledged writes: 0" in text
    assert "healthy -  |" in text           # the second fault never became healthy
    json.dumps(data)                        # JSON as it is written beside the picture
    assert "stand-in, not k0s" in data["note"]


def test_windows_per_tenant_and_interface_name_the_etcd_client() -> None:
    h = _history()
    h.meta["etcd_clients"] = {"t": {"client": "etcdctl", "why": "no python3-etcd3 on this node"}}
    acked = sorted(o.complete - o.invoke for o in h.ops if o.acknowledged
                   and o.complete is not None and not o.process.endswith("/final"))
    w = report.windows(h)
    assert list(w) == ["t etcd"]           # only etcd operations in this history
    assert w["t etcd"]["operations"] == len(acked)
    assert w["t etcd"]["median_ms"] == round(1000 * acked[len(acked) // 2], 1)
    assert w["t etcd"]["p95_ms"] == round(1000 * acked[int(0.95 * (len(acked) - 1))], 1)
    assert w["t etcd"]["median_ms"] <= w["t etcd"]["p95_ms"]
    text = report.text(report.build(h, checker.check(h), {"ok": True}, ""))
    assert (f"  t etcd                 median {w['t etcd']['median_ms']:g} ms, 95th percentile "
            f"{w['t etcd']['p95_ms']:g} ms; one etcdctl process each (no python3-etcd3 on this "
            "node)") in text, text


def test_timeline_png(tmp_path: Path) -> None:
    path = tmp_path / "timeline.png"
    report.timeline(_history(), path, "test")
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 1000 and height > 150


def test_history_json_round_trip(tmp_path: Path) -> None:
    h = _history()
    h.save(tmp_path / "h.json")
    back = History.load(tmp_path / "h.json")
    assert back.to_json() == h.to_json()


def _one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    err = res.stderr
    assert res.returncode == 2, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("bootstrap:")]
    assert len(lines) == 1 and lines[0].startswith("sandbox: error: chaos"), err
    return lines[0]


def test_fault_lists() -> None:
    from sandboxlib.chaos import nemesis, parse_faults

    assert parse_faults("all") == list(nemesis.FAULTS)
    assert parse_faults("all,all") == list(nemesis.FAULTS) * 2
    assert parse_faults("kill-leader, kill-all,kill-leader") == [
        "kill-leader", "kill-all", "kill-leader"]


def test_cli_refuses_bad_input(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-chaos"
    topo = str(write_topology(doc))
    cases = {
        ("--faults", "kill-leader,nap"): "unknown fault(s) nap",
        ("--duration", "5"): "--duration 5: give 10 to 3600 seconds",
        ("--clients", "0"): "--clients 0: give 1 to 8",
        (): "needs tenants and 3 or more etcd members",
    }
    for extra, want in cases.items():
        res = run_sandbox(["chaos", "-t", topo, *extra], tmp_path)
        assert want in _one_line_error(res)
    assert not (tmp_path / "t-chaos").exists()     # nothing written, no log


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_schedule_injects_in_order_and_says_what_it_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxlib import chaos

    clock = _Clock()
    monkeypatch.setattr(chaos.time, "monotonic", clock.time)
    monkeypatch.setattr(chaos.time, "sleep", clock.sleep)
    done: list[tuple[str, float]] = []
    said: list[str] = []

    def inject(fault: str) -> None:
        done.append((fault, clock.now - 1000.0))
        clock.now += 15          # a fault with its healing takes 15 s here

    chaos.schedule(["kill-leader", "partition-leader"], 60, 1000.0, inject, said.append)
    assert done == [("kill-leader", 8.0), ("partition-leader", 31.0)]
    assert clock.now - 1000.0 == 60 and "without faults" in said[-1]
    done.clear()
    said.clear()
    clock.now = 1000.0
    chaos.schedule(["kill-leader", "kill-all", "pause-leader"], 30, 1000.0, inject, said.append)
    assert done == [("kill-leader", 5.0)]      # the first after duration/6 when that is less
    assert said == ["    skipped (no time left in --duration): kill-all, pause-leader",
                    "    workload goes on for 2s without faults"]


def test_clients_that_never_come_back_fail_the_run() -> None:
    """Seen in a real run (2026-12-06, before the agent's gRPC calls waited for ready): after
    kill-all no etcd client of either tenant had an answer for the 80 s left, and the run
    passed with 0 anomalies, having checked nothing of them after the fault."""
    from sandboxlib.chaos import verdict
    h = _history()
    h.faults[1].end = 50.0
    stop = max(o.invoke for o in h.ops if not o.process.endswith("/final"))
    assert stop > 50.0 + report.QUIET_GRACE, stop        # the history goes on long enough
    assert report.silent_clients(h) == []
    ok = checker.check(h)
    assert verdict(ok, "", report.silent_clients(h)) == ""
    for o in h.ops:                                       # every request after it fails
        if o.invoke >= 50.0 and not o.process.endswith("/final"):
            o.outcome, o.complete, o.result = "unknown", None, {}
    silent = report.silent_clients(h)
    assert silent == [(f"t etcd: no acknowledged write in the {stop - 50.0:.0f} s of workload "
                       "after the cluster was healthy again at 50.0 s (its clients did not come "
                       "back; nothing of it was checked from there)")], silent
    why = verdict(checker.check(h), "", silent)
    assert why.startswith("chaos: 0 anomalies") and "; silent: t etcd: no acknowledged" in why
    assert "silent: t etcd" in report.text(report.build(h, checker.check(h), {"ok": True}, ""))
    # a workload that ends within the grace after the last fault is not held to it
    h.faults[1].end = stop - report.QUIET_GRACE + 1
    assert report.silent_clients(h) == []
