"""The global revision order of a tenant's etcd interface and its API clients' writes
(scripts/sandboxlib/chaos/revisions.py): a table of hand-written histories, one per violation class, that must be
REJECTED with their anomaly, and valid reorderings that must be ACCEPTED. Most violations
involve two keys (or a read concurrent with the write it misses), so the per-key search
alone accepts them: the test asserts which check names each one.

The recorded history (tests/fixtures/chaos-history-kill-leader-partition-leader.json.gz) is
a real `scripts/sandbox chaos` run of CI's short form (60 s, kill-leader and
partition-leader, two tenants, etcd 3.5 under the etcd agent and the CRD API server
stand-in; history.json as written, compacted and gzipped): it must pass with every check,
and with one read's header revision moved below a write answered before it, must not."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from conftest import REPO_ROOT
from sandboxlib.chaos import checker, revisions
from sandboxlib.chaos.history import History, Op

RECORDED = REPO_ROOT / "tests" / "fixtures" / "chaos-history-kill-leader-partition-leader.json.gz"


def op(i: int, kind: str, key: str, a: float, b: float | None, outcome: str = "ok",
       process: str = "", **kw: Any) -> Op:
    return Op(id=i, process=process or f"t/etcd-{i}", tenant="t", iface="etcd", kind=kind,
              key=f"/t/{key}", invoke=a, complete=b, outcome=outcome, **kw)


def put(i: int, key: str, a: float, b: float | None, value: str, rev: int | None,
        process: str = "") -> Op:
    if b is None:
        return op(i, "put", key, a, None, "unknown", process, value=value)
    return op(i, "put", key, a, b, value=value, result={"rev": rev}, process=process)


def read(i: int, key: str, a: float, b: float, header: int, value: str | None = None,
         rev: int | None = None, consistency: str = "l", process: str = "") -> Op:
    seen = {"found": True, "value": value, "rev": rev} if value else {"found": False}
    return op(i, "read", key, a, b, consistency=consistency, process=process,
              result={"header": header, **seen})


def unknown_delete(i: int, key: str, a: float) -> Op:
    return op(i, "delete", key, a, None, "unknown")


def found(*ops: Op) -> list[checker.Anomaly]:
    return checker.check(History(ops=list(ops), meta={"prefixes": {"t": "/t/"}})).anomalies


REJECTED: dict[str, tuple[str, list[Op], set[int]]] = {
    # name: (anomaly, history, the operations the anomaly must name)
    "writes in real-time order, decreasing revisions": (
        "write-order", [put(0, "k1", 0, 1, "chaos-a", 20), put(1, "k2", 2, 3, "chaos-b", 15)],
        {0, 1}),
    "two concurrent writes, one revision": (
        "revision-shared", [put(0, "k1", 0, 2, "chaos-a", 20), put(1, "k2", 1, 3, "chaos-b", 20)],
        {0, 1}),
    "one client's header revision going back": (
        "revision-backwards", [read(0, "k1", 0, 1, 30, process="t/etcd-0"),
                               read(1, "k2", 2, 3, 25, process="t/etcd-0")], {0, 1}),
    "a read after another client's write, served below it": (
        "revision-backwards", [put(0, "k1", 0, 1, "chaos-a", 30), read(1, "k2", 2, 3, 29)],
        {0, 1}),
    "a write after a read, at the read's header revision": (
        "revision-backwards", [read(0, "k1", 0, 1, 30), put(1, "k2", 2, 3, "chaos-b", 30)],
        {0, 1}),
    "a read concurrent with a write it misses, though served above it": (
        "stale-by-revision", [put(0, "k2", 0, 1, "chaos-b1", 10),
                              put(1, "k2", 2, 6, "chaos-b2", 12),
                              read(2, "k2", 3, 5, 14, "chaos-b1", 10)], {1, 2}),
    "a read finding a key absent at a header above its only write": (
        "stale-by-revision", [put(0, "k2", 0, 3, "chaos-b", 10), read(1, "k2", 1, 2, 11)],
        {0, 1}),
    "an unknown delete with no free revision to take": (
        "stale-by-revision", [put(0, "k2", 0, 3, "chaos-b", 10), unknown_delete(1, "k2", 0.5),
                              put(2, "k3", 0.6, 2.5, "chaos-c", 11), read(3, "k2", 1, 2, 11)],
        {0, 3}),
    "a serializable read stale against its own header": (
        "stale-by-revision", [put(0, "k1", 0, 1, "chaos-a1", 10),
                              put(1, "k1", 2, 3, "chaos-a2", 12),
                              read(2, "k1", 4, 5, 13, "chaos-a1", 10, consistency="s")], {1, 2}),
    "a read of a mod revision above its header": (
        "read-beyond-header", [put(0, "k1", 0, 3, "chaos-a", 15),
                               read(1, "k1", 1, 2, 12, "chaos-a", 15)], {1}),
    "an unknown write read at another write's revision": (
        "unknown-write-no-gap", [put(0, "k1", 0, None, "chaos-u", None),
                                 put(1, "k2", 0, 1, "chaos-x", 20),
                                 read(2, "k1", 2, 3, 21, "chaos-u", 20)], {0, 1}),
    "an unknown write read below what was answered before it was invoked": (
        "unknown-write-no-gap", [put(0, "k2", 0, 1, "chaos-x", 20),
                                 put(1, "k1", 2, None, "chaos-u", None),
                                 read(2, "k1", 3, 4, 21, "chaos-u", 19)], {1}),
}

ACCEPTED: dict[str, list[Op]] = {
    "concurrent writes, revisions against invocation order": [
        put(0, "k1", 0, 3, "chaos-a", 12), put(1, "k2", 1, 2, "chaos-b", 11)],
    "concurrent reads, headers against invocation order": [
        read(0, "k1", 0, 3, 12), read(1, "k2", 1, 2, 11)],
    "a read concurrent with a write, served below it": [
        put(0, "k2", 0, 3, "chaos-b", 12), read(1, "k1", 1, 2, 11)],
    "answered and invoked at the same instant: they overlap": [
        put(0, "k1", 0, 1, "chaos-a", 10), read(1, "k2", 1, 2, 9)],
    "a serializable read at an older header, consistent with it": [
        put(0, "k1", 0, 1, "chaos-a1", 10), put(1, "k1", 2, 3, "chaos-a2", 12),
        read(2, "k1", 4, 5, 11, "chaos-a1", 10, consistency="s")],
    "a read at a header between two writes of its key": [
        put(0, "k1", 0, 1, "chaos-a1", 10), put(1, "k1", 2, 6, "chaos-a2", 12),
        read(2, "k1", 3, 5, 11, "chaos-a1", 10)],
    "an unknown write that never committed": [
        put(0, "k1", 0, None, "chaos-u", None), put(1, "k2", 1, 2, "chaos-b", 11),
        read(2, "k1", 3, 4, 11)],
    "an unknown write committed in a gap": [
        put(0, "k2", 0, 1, "chaos-x", 20), put(1, "k1", 2, None, "chaos-u", None),
        put(2, "k3", 2.5, 2.8, "chaos-c", 21), read(3, "k1", 3, 4, 23, "chaos-u", 22)],
    "an unknown delete in a free revision explains an absence": [
        put(0, "k2", 0, 3, "chaos-b", 10), unknown_delete(1, "k2", 0.5), read(2, "k2", 1, 2, 11)],
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_violation_is_rejected(name: str) -> None:
    kind, ops, named = REJECTED[name]
    anomalies = found(*ops)
    assert [a.type for a in anomalies] == [kind], anomalies
    assert {o["id"] for o in anomalies[0].ops} == named
    for i in named:
        assert f"op {i} " in anomalies[0].message
    assert anomalies[0].where == "t etcd (all keys)"


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_valid_reordering_is_accepted(name: str) -> None:
    ops = ACCEPTED[name]
    assert found(*ops) == []
    # and the revision check did look at them: every answered operation carried one
    _, counted = revisions.check(History(ops=ops))
    assert counted == sum(o.outcome == "ok" for o in ops)


def test_the_revision_checks_see_what_the_key_search_cannot() -> None:
    # Two keys, each history linearizable on its own: only the global order refutes it.
    ops = REJECTED["writes in real-time order, decreasing revisions"][1]
    rep = checker.check(History(ops=ops, meta={"prefixes": {"t": "/t/"}}))
    assert rep.keys == 2 and [a.type for a in rep.anomalies] == ["write-order"]


def test_the_same_client_is_named() -> None:
    ops = REJECTED["one client's header revision going back"][1]
    assert "the same client" in found(*ops)[0].message


def test_findings_of_one_kind_are_capped() -> None:
    ops = [put(i, f"k{i}", 2 * i, 2 * i + 1, f"chaos-{i}", 100 - i) for i in range(30)]
    anomalies = found(*ops)
    assert len(anomalies) == revisions.MAX_PER_TYPE
    assert anomalies[-1].message.endswith(f"(and {29 - revisions.MAX_PER_TYPE} more of this kind)")


def _recorded() -> History:
    return History.from_json(json.loads(gzip.decompress(RECORDED.read_bytes())))


def test_recorded_real_history_passes() -> None:
    hist = _recorded()
    rep = checker.check(hist)
    assert rep.anomalies == []
    assert rep.revision_ops > 1000      # both tenants' etcd operations carried a revision


def test_recorded_real_history_with_a_header_moved_back_fails() -> None:
    hist = _recorded()
    acked = [o for o in hist.ops if o.iface == "etcd" and o.acknowledged]
    target = next(r for r in hist.ops if r.kind == "read" and r.iface == "etcd"
                  and r.consistency == "l" and r.outcome == "ok" and r.result.get("header")
                  and any(w.tenant == r.tenant and w.key != r.key and w.complete is not None
                          and w.complete < r.invoke and w.result["rev"] >= r.result["header"]
                          for w in acked))
    write = max((w for w in acked if w.tenant == target.tenant and w.complete is not None
                 and w.complete < target.invoke), key=lambda w: w.result["rev"])
    target.result["header"] = write.result["rev"] - 1
    kinds = {a.type for a in checker.check(hist).anomalies}
    assert kinds & {"revision-backwards", "read-beyond-header", "stale-by-revision"}, kinds


# -- the API clients' writes in the same order (kube-apiserver's resourceVersion is the etcd
# transaction's revision) -------------------------------------------------------------------
def api_write(i: int, name: str, a: float, b: float, value: str, rv: int) -> Op:
    return Op(id=i, process=f"t/api-{i}", tenant="t", iface="api", kind="create", key=name, invoke=a,
              complete=b, outcome="ok", value=value, result={"rev": rv})


@pytest.mark.parametrize(("name", "kind", "ops"), [
    ("an API write acknowledged before an etcd write, at a higher revision", "write-order",
     [api_write(0, "t-k0", 0, 1, "chaos-a", 20), put(1, "k1", 2, 3, "chaos-b", 15)]),
    ("an etcd read after an API write was answered, served below it", "revision-backwards",
     [api_write(0, "t-k0", 0, 1, "chaos-a", 30), read(1, "k1", 2, 3, 29)]),
    ("two API writes in real-time order, decreasing resourceVersions", "write-order",
     [api_write(0, "t-k0", 0, 1, "chaos-a", 30),
      api_write(1, "t-k1", 2, 3, "chaos-b", 25)]),
    ("an API write and an etcd write with one revision", "revision-shared",
     [api_write(0, "t-k0", 0, 2, "chaos-a", 20), put(1, "k1", 1, 3, "chaos-b", 20)]),
])
def test_api_writes_are_in_the_tenants_revision_order(name: str, kind: str, ops: list[Op]) -> None:
    anomalies = found(*ops)
    assert [a.type for a in anomalies] == [kind], (name, anomalies)
    assert {o["id"] for o in anomalies[0].ops} == {0, 1}
    assert anomalies[0].where == "t etcd and API (all keys)"


def test_api_and_etcd_writes_interleaved_in_revision_order_are_accepted() -> None:
    ops = [put(0, "k1", 0, 1, "chaos-a", 10), api_write(1, "t-k0", 2, 3, "chaos-b", 11),
           read(2, "k1", 4, 5, 11, "chaos-a", 10),
           # concurrent: either order of revisions
           api_write(3, "t-k1", 6, 9, "chaos-c", 13), put(4, "k2", 7, 8, "chaos-d", 12)]
    assert found(*ops) == []
    _, counted = revisions.check(History(ops=ops))
    assert counted == 5


def test_recorded_real_history_pins_every_api_delete() -> None:
    rep = checker.check(_recorded())
    deletes = sum(1 for o in _recorded().ops if o.iface == "api" and o.kind == "delete"
                  and o.acknowledged)
    assert deletes > 50 and rep.pinned_deletes >= deletes, (deletes, rep.pinned_deletes)


def test_recorded_real_history_with_a_deleted_event_dropped_fails() -> None:
    hist = _recorded()
    wins = revisions.delete_windows(hist)
    win = next(w for w in wins.values() if w.op.iface == "api" and w.rev is not None)
    name = win.op.key
    api = [w for w in hist.watches if w.tenant == win.op.tenant and w.iface == "api"]
    # one API server's watch loses the DELETED event: that watch, and only it, owes it
    api[0].events = [e for e in api[0].events if not (e.key == name and e.rev == win.rev)]
    found = checker.check(hist).anomalies
    assert [(a.type, a.where) for a in found] == [
        ("watch-gap", f"{win.op.tenant} api watch {api[0].name}")], found
    assert f"acknowledged delete of {name} at revision {win.rev} never came" in found[0].message
    # every watch loses it: no event to pin the delete to, and each watch that vouches for
    # its window owes a DELETE of the key in it
    for w in hist.watches:
        w.events = [e for e in w.events if not (e.rev == win.rev and e.type.startswith("DELETE"))]
    found = checker.check(hist).anomalies
    owing = [w.name for w in hist.watches if w.tenant == win.op.tenant]
    assert sorted(a.where.split()[-1] for a in found) == sorted(owing), found
    assert all(a.type == "watch-gap" and "(between revisions" in a.message for a in found)
