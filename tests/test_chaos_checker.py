"""The chaos checker (scripts/sandboxlib/chaos): hand-made histories, linearizable ones and
the classic violations; random histories from the sequential model (must pass) and the same
with one mutation (must fail); watch gaps; lost acknowledged writes; each in bounded time."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from sandboxlib.chaos import checker, linearizability, selftest, witness
from sandboxlib.chaos.history import History, Op, Watch, WatchEvent


def op(i: int, kind: str, invoke: float, complete: float | None, outcome: str = "ok",
       key: str = "/t/k", process: str = "", **kw: Any) -> Op:
    return Op(id=i, process=process or f"t/etcd-{i % 3}", tenant="t", iface="etcd", kind=kind,
              key=key, invoke=invoke, complete=complete, outcome=outcome, **kw)


def put(i: int, a: float, b: float | None, value: str, rev: int | None,
        outcome: str = "ok") -> Op:
    return op(i, "put", a, b, outcome, value=value,
              result={} if outcome != "ok" else {"rev": rev})


def read(i: int, a: float, b: float, value: str | None, rev: int | None = None,
         consistency: str = "l", process: str = "") -> Op:
    res = {"found": True, "value": value, "rev": rev} if value is not None else {"found": False}
    return op(i, "read", a, b, consistency=consistency, result=res, process=process)


def cas(i: int, a: float, b: float | None, expected: int, value: str, rev: int | None = None,
        succeeded: bool = True, outcome: str = "ok", seen: dict[str, Any] | None = None) -> Op:
    res: dict[str, Any] = {} if outcome != "ok" else (
        {"succeeded": True, "rev": rev} if succeeded else {"succeeded": False, **(seen or {})})
    return op(i, "cas", a, b, outcome, value=value, expected=expected, result=res)


def hist(*ops: Op, watches: list[Watch] | None = None) -> History:
    return History(ops=list(ops), watches=watches or [],
                   meta={"prefixes": {"t": "/t/"}, "api_names": {"t": "t-"}})


def types(h: History) -> list[str]:
    return [a.type for a in checker.check(h).anomalies]


# -- linearizable histories ------------------------------------------------------------------
def test_sequential_history_passes() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10), read(1, 2, 3, "chaos-a", 10),
             cas(2, 4, 5, 10, "chaos-b", 12), read(3, 6, 7, "chaos-b", 12),
             op(4, "delete", 8, 9, result={"deleted": 1, "rev": 13}), read(5, 10, 11, None))
    assert types(h) == []


def test_concurrent_read_may_see_either_value() -> None:
    # The read overlaps the second put: the old and the new value are both correct.
    for seen, rev in (("chaos-a", 10), ("chaos-b", 11)):
        h = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 5, "chaos-b", 11),
                 read(2, 3, 4, seen, rev))
        assert types(h) == []


def test_unknown_write_may_or_may_not_take_effect() -> None:
    # A put whose answer was lost: later reads may see it (with the revision they are told)
    # or not, but never first see it and then the older value again.
    took = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", None, "unknown"),
                read(2, 4, 5, "chaos-b", 14), read(3, 6, 7, "chaos-b", 14))
    lost = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", None, "unknown"),
                read(2, 4, 5, "chaos-a", 10))
    flip = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", None, "unknown"),
                read(2, 4, 5, "chaos-b", 14), read(3, 6, 7, "chaos-a", 10))
    assert types(took) == [] and types(lost) == []
    assert types(flip) == ["stale-read"]


def test_failed_compare_shows_what_it_saw() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10),
             cas(1, 2, 3, 9, "chaos-b", succeeded=False,
                 seen={"found": True, "value": "chaos-a", "rev": 10}))
    assert types(h) == []
    bad = hist(put(0, 0, 1, "chaos-a", 10),
               cas(1, 2, 3, 10, "chaos-b", succeeded=False,
                   seen={"found": True, "value": "chaos-a", "rev": 10}))
    assert types(bad) != []


def test_serializable_read_may_be_stale_but_not_invented() -> None:
    stale = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
                 read(2, 4, 5, "chaos-a", 10, consistency="s"))
    invented = hist(put(0, 0, 1, "chaos-a", 10),
                    read(1, 4, 5, "chaos-zz", 10, consistency="s"))
    wrong_rev = hist(put(0, 0, 1, "chaos-a", 10), read(1, 4, 5, "chaos-a", 12, consistency="s"))
    assert types(stale) == []
    assert types(invented) == ["serializable-read"]
    assert types(wrong_rev) == ["serializable-read"]


# -- the classic violations ---------------------------------------------------------------------
def test_stale_read() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
             read(2, 4, 5, "chaos-a", 10))
    rep = checker.check(h)
    assert [a.type for a in rep.anomalies] == ["stale-read"]
    # the smallest sub-history: both writes and the read, nothing else
    assert sorted(o["id"] for o in rep.anomalies[0].ops) == [0, 1, 2]


def test_lost_update_two_cas_from_one_revision() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10), cas(1, 2, 3, 10, "chaos-b", 11),
             cas(2, 4, 5, 10, "chaos-c", 12))
    assert types(h) == ["cas-on-old-revision"]


def test_read_of_a_value_never_written() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10), read(1, 2, 3, "chaos-never", 10))
    rep = checker.check(h)
    assert [a.type for a in rep.anomalies] == ["read-of-unwritten-value"]
    assert [o["id"] for o in rep.anomalies[0].ops] == [1]


def test_cas_succeeding_on_an_old_revision() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
             read(2, 3.5, 3.8, "chaos-b", 11), cas(3, 4, 5, 10, "chaos-c", 12))
    rep = checker.check(h)
    assert [a.type for a in rep.anomalies] == ["cas-on-old-revision"]
    assert 2 not in {o["id"] for o in rep.anomalies[0].ops}   # the read is not needed


def test_revision_going_backwards() -> None:
    # The key's search refutes it, and the global revision order names the pair.
    h = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 9))
    assert types(h) == ["non-linearizable", "write-order"]


def test_lost_acknowledged_write() -> None:
    h = hist(put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
             read(2, 9, 10, "chaos-a", 10, process="t/final"))
    rep = checker.check(h)
    assert rep.lost_writes == 1
    assert sorted(a.type for a in rep.anomalies) == ["lost-write", "stale-read"]


def _watch(events: list[tuple[str, int, str | None]], start: int = 9, end: int = 12) -> Watch:
    return Watch(name="t/etcd-watch", tenant="t", iface="etcd", prefix="/t/", start_rev=start,
                 events=[WatchEvent(k, r, "PUT" if v else "DELETE", v, float(r)) for k, r, v
                         in events], end_rev=end, reached_end=True)


def test_watch_gap_order_foreign_and_stall() -> None:
    ops = [put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
           put(2, 4, 5, "chaos-c", 12)]
    full = [("/t/k", 10, "chaos-a"), ("/t/k", 11, "chaos-b"), ("/t/k", 12, "chaos-c")]
    assert types(hist(*ops, watches=[_watch(full)])) == []
    assert types(hist(*ops, watches=[_watch([full[0], full[2]])])) == ["watch-gap"]
    assert types(hist(*ops, watches=[_watch([full[1], full[0], full[2]])])) == ["watch-order"]
    assert types(hist(*ops, watches=[_watch([*full, ("/u/k", 13, None)], end=13)])) == [
        "watch-foreign"]
    stalled = _watch(full[:2])
    stalled.reached_end = False
    assert "watch-stalled" in types(hist(*ops, watches=[stalled]))
    # A gap etcd reported (compaction) is counted, not an anomaly.
    reported = _watch([full[0], full[2]])
    reported.reported_gaps = [{"from": 11, "to": 11, "why": "compacted at 12"}]
    rep = checker.check(hist(*ops, watches=[reported]))
    assert rep.anomalies == [] and rep.reported_gaps == 1


def test_watch_event_with_an_unwritten_value() -> None:
    ops = [put(0, 0, 1, "chaos-a", 10)]
    w = _watch([("/t/k", 10, "chaos-a"), ("/t/k", 11, "chaos-zz")], end=10)
    assert types(hist(*ops, watches=[w])) == ["watch-unwritten-value"]


# -- generated histories ------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_generated_histories_pass_and_each_mutation_fails(seed: int) -> None:
    rng = random.Random(seed)
    h = selftest.generate(rng, 300, n_keys=4, n_procs=4, p_unknown=0.05,
                          iface="api" if seed % 2 else "etcd")
    t0 = time.monotonic()
    assert checker.check(h).anomalies == []
    data = h.to_json()
    tried = 0
    for kind in (*selftest.MUTATIONS, *selftest.WATCH_MUTATIONS):
        m = History.from_json(data)
        changed = (selftest.mutate_watch(rng, m, kind) if kind in selftest.WATCH_MUTATIONS
                   else selftest.mutate(rng, m, kind))
        if changed is None:
            continue
        tried += 1
        found = checker.check(m).anomalies
        assert found, f"{kind} not caught: {changed}"
        if kind in selftest.WATCH_MUTATIONS:      # each named by the anomaly it makes
            assert kind in {a.type for a in found}, (kind, found)
    assert tried >= 6
    assert time.monotonic() - t0 < 20


def test_selftest_run_catches_every_mutation() -> None:
    st = selftest.run(seed=3, histories=4, n_ops=300)
    assert st.ok and st.mutations >= 28, st.to_json()


def test_speed_on_10000_operations(capsys: pytest.CaptureFixture[str]) -> None:
    h = selftest.generate(random.Random(42), 10_000, n_keys=10, n_procs=8, p_unknown=0.03)
    t0 = time.monotonic()
    rep = checker.check(h)
    took = time.monotonic() - t0
    assert rep.anomalies == [] and rep.ops_checked > 9000
    with capsys.disabled():
        print(f"\nchecker: {len(h.ops)} ops in {took:.2f}s ({len(h.ops) / took:.0f} ops/s "
              f"all checks; linearizability search {rep.ops_per_second:.0f} ops/s)")
    assert took < 30


def test_search_gives_up_within_its_budget() -> None:
    # Many overlapping writes of unknown outcome, each seen by a read, and a read nothing
    # explains: the search must stop at its budget, not run away.
    ops = [put(i, 0, None, f"chaos-u{i}", None, "unknown") for i in range(40)]
    ops += [read(40 + i, 1, 2, f"chaos-u{i}", 1000 + i) for i in range(40)]
    ops.append(read(80, 1, 2, "chaos-none", 5))
    t0 = time.monotonic()
    res = linearizability.check(linearizability.checkable(ops), max_states=20_000,
                                max_seconds=5)
    assert res.ok is None and res.states <= 20_001
    assert time.monotonic() - t0 < 10


def test_unseen_unknown_writes_do_not_explode_the_search() -> None:
    # 40 writes of unknown outcome nobody saw are interchangeable: refuting a stale read
    # after them takes a handful of states, not 2^40.
    ops = [put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11)]
    ops += [put(2 + i, 0, None, f"chaos-u{i}", None, "unknown") for i in range(40)]
    ops.append(read(50, 4, 5, "chaos-a", 10))
    res = linearizability.check(linearizability.checkable(ops), max_states=20_000)
    assert res.ok is False and res.states < 1000


def test_minimal_keeps_what_a_read_depends_on() -> None:
    ops = [put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
           put(2, 3.1, 3.2, "chaos-x", 12), put(3, 3.3, 3.4, "chaos-b2", 13),
           read(4, 5, 6, "chaos-b", 11)]
    small = checker.minimal(ops, lambda s: linearizability.check(s).ok is False)
    assert checker.explained(small, ops)
    assert 1 in {o.id for o in small} and len(small) <= 3


def test_minimal_keeps_the_delete_a_create_if_absent_depends_on() -> None:
    # Seen in CI: a history made non-linearizable by one stale read was "minimized" to a put
    # and a later compare-and-swap on mod revision 0 (create if absent) without the delete
    # between them, which fails for another reason (cas-on-old-revision) and hides the read.
    ops = [put(0, 0, 1, "chaos-a", 10), op(1, "delete", 2, 3, result={"deleted": 1, "rev": 11}),
           cas(2, 4, 5, 0, "chaos-b", 12), put(3, 6, 7, "chaos-c", 13),
           read(4, 8, 9, "chaos-b", 12)]
    assert not checker.explained([ops[0], ops[2]], ops)
    assert checker.explained(ops[:3], ops)
    small = checker.minimal(ops, lambda s: linearizability.check(s).ok is False)
    assert 4 in {o.id for o in small} and checker.explained(small, ops)
    assert [a.type for a in checker.check(hist(*ops)).anomalies] == ["stale-read"]


def test_watch_values_are_matched_within_their_interface() -> None:
    # The same value written through etcd and through the API (two registers): each watch
    # compares its events with the writes of its own interface.
    etcd_put = put(0, 0, 1, "chaos-end", 10)
    api_create = Op(id=1, process="t/api-0", tenant="t", iface="api", kind="create",
                    key="t-end", invoke=2, complete=3, outcome="ok", value="chaos-end",
                    result={"rev": 11})
    w_etcd = _watch([("/t/k", 10, "chaos-end")], end=10)
    w_api = Watch(name="t/api-watch", tenant="t", iface="api", prefix="registers", start_rev=9,
                  events=[WatchEvent("t-end", 11, "ADDED", "chaos-end", 3.0)], end_rev=11,
                  reached_end=True)
    assert types(hist(etcd_put, api_create, watches=[w_etcd, w_api])) == []


# -- what the revisions prove without a search (witness.py) ------------------------------------
def test_witness_of_each_kind_and_none_where_the_revisions_allow_an_order() -> None:
    assert witness.find([put(0, 0, 1, "chaos-a", 10), read(1, 2, 3, "chaos-x", 10)]).type == \
        "read-of-unwritten-value"
    stale = witness.find([put(0, 0, 1, "chaos-a", 10), put(1, 2, 3, "chaos-b", 11),
                          read(2, 4, 5, "chaos-a", 10)])
    assert stale.type == "stale-read" and [o.id for o in stale.ops] == [0, 1, 2]
    lost = witness.find([put(0, 0, 1, "chaos-a", 10), cas(1, 2, 3, 10, "chaos-b", 11),
                         cas(2, 2.5, 5, 10, "chaos-c", 12)])
    assert lost.type == "cas-on-old-revision" and [o.id for o in lost.ops] == [0, 1, 2]
    # The write acknowledged at 11 had not completed when the read began: either order holds.
    assert witness.find([put(0, 0, 1, "chaos-a", 10), put(1, 2, 5, "chaos-b", 11),
                         read(2, 4, 6, "chaos-a", 10)]) is None
    # A write of unknown outcome between the compared revision and the swap proves nothing
    # (it took no revision that the history knows), nor does a create (compare on 0).
    assert witness.find([put(0, 0, 1, "chaos-a", 10), put(1, 2, None, "chaos-b", None, "unknown"),
                         cas(2, 4, 5, 10, "chaos-c", 12), cas(3, 6, 7, 0, "chaos-d", 13)]) is None
    # A value a write of unknown outcome wrote may be read.
    assert witness.find([put(0, 0, None, "chaos-a", None, "unknown"),
                         read(1, 2, 3, "chaos-a", 10)]) is None


def test_scale_64_clients_on_5_keys_with_10_percent_unknown_is_decided(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39's scale test: 100,000 operations of 64 clients on 5 keys, 10 % of unknown
    outcome, decided (no "inconclusive": the checker's own budget per key, MAX_STATES and
    MAX_SECONDS, would make a search too long inconclusive); each violation in a history of
    that shape is decided too (before the witnesses, each was "inconclusive" after 27-41 s).
    The time is printed, not asserted: the suite's timings are measured, not tested (it took
    13 s alone and 64 s beside three other processes on 2 cores)."""
    h = selftest.generate(random.Random(7), 100_000, n_keys=5, n_procs=64, p_unknown=0.10,
                          rate=200)
    t0 = time.monotonic()
    rep = checker.check(h)
    took = time.monotonic() - t0
    assert rep.anomalies == [] and rep.inconclusive == 0 and rep.ops_checked > 90_000
    with capsys.disabled():
        print(f"\nchecker: 100,000 ops, 64 clients, 5 keys, 10 % unknown: {took:.1f}s")
    names = {"stale-read": "stale-read", "unwritten-value": "read-of-unwritten-value",
             "cas-old-revision": "cas-on-old-revision", "lost-update": "cas-on-old-revision"}
    for kind, anomaly in names.items():
        m = selftest.generate(random.Random(8), 20_000, n_keys=5, n_procs=64, p_unknown=0.10,
                              rate=200)
        assert selftest.mutate(random.Random(9), m, kind) is not None
        found = checker.check(m)
        assert [a.type for a in found.anomalies] == [anomaly] and found.inconclusive == 0, kind
