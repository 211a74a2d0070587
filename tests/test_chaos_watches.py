"""Watches as etcd's robustness tests check them (scripts/sandboxlib/chaos/watches.py, after
etcd-io/etcd tests/robustness/validate/watch.go): a table of hand-written histories, one per
violation class, that must be REJECTED with their anomaly, and valid ones that must be
ACCEPTED; a watch event as evidence of a commit (a write of unknown outcome it delivered is
held against later reads and other watches); a stalled watch failing the run with its reason.

The tenant is ``t`` (etcd prefix ``/t/``); revisions start above 9, the watch's start."""

from __future__ import annotations

from typing import Any

import pytest
from sandboxlib.chaos import checker, report, revisions, watches
from sandboxlib.chaos import verdict as chaos_verdict
from sandboxlib.chaos.history import History, Op, Watch, WatchEvent

META = {"prefixes": {"t": "/t/"}, "api_names": {"t": "chaos-r-t-"}}


def op(i: int, kind: str, key: str, a: float, b: float | None, outcome: str = "ok",
       iface: str = "etcd", **kw: Any) -> Op:
    return Op(id=i, process=f"t/{iface}-{i}", tenant="t", iface=iface, kind=kind,
              key=f"/t/{key}" if iface == "etcd" else key, invoke=a, complete=b,
              outcome=outcome, **kw)


def put(i: int, key: str, rev: int, value: str) -> Op:
    """An acknowledged put answered with ``rev``, invoked at ``rev`` (seconds)."""
    return op(i, "put", key, rev, rev + 0.5, value=value, result={"rev": rev})


def unknown(i: int, key: str, at: float, value: str, iface: str = "etcd") -> Op:
    return op(i, "put" if iface == "etcd" else "create", key, at, None, "unknown", iface,
              value=value)


def ev(key: str, rev: int, value: str | None, resp: int | None = None) -> WatchEvent:
    return WatchEvent(f"/t/{key}", rev, "PUT" if value else "DELETE", value, float(rev), resp)


def watch(*events: WatchEvent, end: int | None = 12, reached: bool = True, **kw: Any) -> Watch:
    return Watch(name="t/etcd-watch", tenant="t", iface="etcd", prefix="/t/", start_rev=9,
                 events=list(events), end_rev=end, reached_end=reached, **kw)


def restart(after: int, frm: int) -> dict[str, Any]:
    return {"t": 0.0, "from": frm, "reason": "stream ended", "after": after}


def check(ops: list[Op], *ws: Watch) -> checker.Report:
    return checker.check(History(ops=ops, watches=list(ws), meta=META))


WRITES = [put(0, "k1", 10, "chaos-a"), put(1, "k2", 11, "chaos-b"), put(2, "k1", 12, "chaos-c")]
A, B, C = ev("k1", 10, "chaos-a"), ev("k2", 11, "chaos-b"), ev("k1", 12, "chaos-c")
# A revision the history has no write of (another writer under the prefix: k0s, say).
OTHER11 = ev("k9", 11, "other")

REJECTED: dict[str, tuple[str, list[Op], Watch, str]] = {
    # name: (anomaly, operations, watch, what its message must say)
    "events out of revision order in one stream": (
        "watch-order", WRITES, watch(A, C, B), "revision 11 after 12"),
    "one event delivered twice in one stream": (
        "watch-duplicate", WRITES, watch(A, B, B, C), "/t/k2 at revision 11 delivered twice"),
    "an event delivered again after a restart": (
        "watch-duplicate", WRITES, watch(A, B, B, C, restarts=[restart(2, 12)]),
        "delivered twice"),
    "one revision split over two responses": (
        "watch-split-revision", [WRITES[0], WRITES[2]],
        watch(ev("k1", 10, "chaos-a", 1), ev("k2", 11, "x", 2), ev("k3", 11, "y", 3),
              ev("k1", 12, "chaos-c", 4)), "revision 11 split over two responses"),
    "an acknowledged write missing": (
        "watch-gap", WRITES, watch(A, C), "acknowledged write of /t/k2 at revision 11"),
    "an event of a write that certainly failed": (
        "watch-failed-write", [*WRITES[:2], op(2, "put", "k1", 11.5, 12, "fail",
                                               value="chaos-c", error="permission denied")],
        watch(A, B, C), "certainly had no effect"),
    "an event of a compare-and-swap whose compare failed": (
        "watch-failed-write", [*WRITES[:2], op(2, "cas", "k1", 11.5, 12, value="chaos-c",
                                               expected=3, result={"succeeded": False,
                                                                   "header": 11})],
        watch(A, B, C), "certainly had no effect"),
    "the end marker never delivered": (
        "watch-stalled", WRITES, watch(A, B, reached=False),
        "never delivered the end marker (revision 12; its last event at revision 11"),
    "no end marker revision known (its write stayed unknown)": (
        "watch-stalled", WRITES, watch(A, B, C, end=None, reached=False,
                                       end_reason="the end marker's put: unknown 20 times"),
        "no end marker revision is known (the end marker's put: unknown 20 times)"),
    "a resumed stream delivering below the revision it resumed from": (
        "watch-resume", [WRITES[0], WRITES[2]],
        watch(A, OTHER11, C, restarts=[restart(1, 12)]), "a stream resumed from revision 12"),
    "an event at or below the watch's start revision": (
        "watch-resume", WRITES, watch(ev("k0", 9, "x"), A, B, C), "a stream started from revision 10"),
    "an event at or below a progress notification": (
        "watch-progress", [WRITES[0], WRITES[2]],
        watch(A, OTHER11, C, progress=[{"t": 0.0, "rev": 11, "after": 1}]),
        "after a progress notification at 11"),
    "a progress notification below an event delivered": (
        "watch-progress", WRITES, watch(A, B, C, progress=[{"t": 0.0, "rev": 11, "after": 3}]),
        "notification at revision 11 after revision 12"),
}

ACCEPTED: dict[str, tuple[list[Op], Watch]] = {
    "every write once, in order, the end marker reached": (WRITES, watch(A, B, C)),
    "a watch resumed after a disconnect without a gap": (
        WRITES, watch(A, B, C, restarts=[restart(2, 12)])),
    "a restart recorded without its position (an older history): placed by time": (
        WRITES, watch(A, B, C, restarts=[{"t": 11.5, "from": 12, "reason": "EOF"}])),
    "a revision of two keys in one response": (
        [WRITES[0], WRITES[2]], watch(ev("k1", 10, "chaos-a", 1), ev("k2", 11, "x", 2),
                                      ev("k3", 11, "y", 2), ev("k1", 12, "chaos-c", 3))),
    "progress notifications between events, up to the last one delivered": (
        WRITES, watch(A, B, C, progress=[{"t": 0.0, "rev": 10, "after": 1},
                                         {"t": 0.0, "rev": 12, "after": 3}])),
    "the end marker's put retried after an unknown outcome: delivered twice, two revisions": (
        [*WRITES, unknown(3, "end", 12.6, "chaos-end"),
         op(4, "put", "end", 13, 14.5, value="chaos-end", result={"rev": 14})],
        watch(A, B, C, ev("end", 13, "chaos-end"), ev("end", 14, "chaos-end"), end=14)),
    "an unknown write made certain by a watch event": (
        [WRITES[0], unknown(1, "k2", 10.6, "chaos-b"), WRITES[2]], watch(A, B, C)),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_watch_violation_is_rejected(name: str) -> None:
    kind, ops, w, says = REJECTED[name]
    anomalies = check(ops, w).anomalies
    assert [a.type for a in anomalies] == [kind], anomalies
    assert says in anomalies[0].message, anomalies[0].message
    assert anomalies[0].where == "t etcd watch t/etcd-watch"
    # and the same operations with a clean watch pass: the watch alone made it fail
    clean = watch(*[e for e in (A, B, C) if any(o.value == e.value and o.outcome != "fail"
                                                  and o.result.get("succeeded") is not False
                                                  for o in ops)])
    assert check(ops, clean).anomalies == []


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_valid_watch_is_accepted(name: str) -> None:
    ops, w = ACCEPTED[name]
    assert check(ops, w).anomalies == []


def test_a_stalled_watch_owes_nothing_beyond_its_last_event() -> None:
    # etcd's validateReliable compares up to the watch's last revision (lastRevision): a
    # stalled watch is reported once, not once more per write it never got to.
    found = check(WRITES, watch(A, B, end=None, reached=False)).anomalies
    assert [a.type for a in found] == ["watch-stalled"]


def test_a_watch_event_is_evidence_of_a_commit() -> None:
    ops, w = ACCEPTED["an unknown write made certain by a watch event"]
    assert watches.seen_at(History(ops=ops, watches=[w])) == {1: 11}
    # A later read at a header above 11 showing k2 absent is stale only because of the
    # watch: without the event the unknown put may never have committed.
    late = op(3, "read", "k2", 13, 13.5, result={"header": 12, "found": False})
    assert check([*ops, late], watch(A, C, end=None, reached=True)).anomalies == []
    found = check([*ops, late], w).anomalies
    # the per-key search (the put applied at 11, before the event arrived) and the revision
    # order (the put at 11 <= the read's header 12) both refuse it
    assert [a.type for a in found] == ["stale-read", "stale-by-revision"], found
    assert [{o["id"] for o in a.ops} for a in found] == [{1, 3}, {1, 3}]
    pinned = next(o for o in found[0].ops if o["id"] == 1)
    assert "a watch delivered it at revision 11" in pinned["error"]


def test_the_key_search_takes_a_delivered_unknown_write_as_applied() -> None:
    # Through the API (no header revisions, so only the per-key search can see it): an
    # unknown create a watch delivered at 11 (arriving at 11.0), a read after it finding the
    # resource absent with no delete.
    ops = [unknown(0, "chaos-r-t-k1", 10.0, "chaos-u", iface="api"),
           op(1, "read", "chaos-r-t-k1", 12, 12.5, iface="api", result={"found": False})]
    w = Watch(name="t/api-watch@c1", tenant="t", iface="api", prefix="registers", start_rev=9,
              events=[WatchEvent("chaos-r-t-k1", 11, "ADDED", "chaos-u", 11.0)], end_rev=11,
              reached_end=True)
    assert [a.type for a in check(ops, w).anomalies] == ["stale-read"]
    # the event arriving after the read: the create may have applied after it
    late = Watch(**{**w.__dict__, "events": [WatchEvent("chaos-r-t-k1", 11, "ADDED", "chaos-u",
                                                          13.0)]})
    assert check(ops, late).anomalies == []
    # without the watch the create may never have applied
    assert check(ops).anomalies == []


def test_an_event_at_another_revision_than_its_acknowledged_write() -> None:
    ops = [*WRITES[:2], put(2, "k1", 12, "chaos-c")]
    found = check(ops, watch(A, B, ev("k1", 13, "chaos-c"), end=13)).anomalies
    assert [a.type for a in found] == ["watch-revision", "watch-gap"], found


def test_a_read_and_a_watch_disagreeing_on_an_unknown_write() -> None:
    ops = [WRITES[0], unknown(1, "k2", 10.6, "chaos-b"), WRITES[2],
           op(3, "read", "k2", 13, 13.5, result={"header": 12, "found": True,
                                                 "value": "chaos-b", "rev": 12})]
    kinds = [a.type for a in check(ops, watch(A, B, C)).anomalies]
    assert "watch-revision" in kinds, kinds


def test_an_unknown_write_one_watch_delivered_is_owed_by_the_others() -> None:
    # Two API servers' watches: one delivered the unknown create (so it committed at 11),
    # the other skipped it between two events it did deliver.
    ops = [op(0, "create", "chaos-r-t-k0", 10, 10.5, iface="api", value="chaos-a",
              result={"rev": 10}),
           unknown(1, "chaos-r-t-k1", 10.6, "chaos-b", iface="api"),
           op(2, "create", "chaos-r-t-k2", 12, 12.5, iface="api", value="chaos-c",
              result={"rev": 12})]

    def api_watch(name: str, *revs: int) -> Watch:
        evs = {10: ("chaos-r-t-k0", "chaos-a"), 11: ("chaos-r-t-k1", "chaos-b"),
               12: ("chaos-r-t-k2", "chaos-c")}
        return Watch(name=f"t/api-watch@{name}", tenant="t", iface="api", prefix="registers",
                     start_rev=9, events=[WatchEvent(evs[r][0], r, "ADDED", evs[r][1], float(r))
                                          for r in revs], end_rev=12, reached_end=True)

    found = check(ops, api_watch("c1", 10, 11, 12), api_watch("c2", 10, 12)).anomalies
    assert [(a.type, a.where) for a in found] == [("watch-gap", "t api watch t/api-watch@c2")]
    assert "unknown-outcome (seen committed) write of chaos-r-t-k1 at revision 11" in (
        found[0].message)
    assert check(ops, api_watch("c2", 10, 12)).anomalies == []    # no evidence: no debt


def test_a_stalled_watch_fails_the_run_with_its_reason() -> None:
    _, ops, w, _ = REJECTED["no end marker revision known (its write stayed unknown)"]
    rep = check(ops, w)
    why = chaos_verdict(rep, "")
    assert why.startswith("chaos: 1 anomalies")
    assert "t etcd watch t/etcd-watch stalled" in why and "unknown 20 times" in why
    data = report.build(History(ops=ops, watches=[w], meta=META), rep, {}, "")
    line = next(x for x in report.text(data).splitlines() if "watch t/etcd-watch" in x)
    assert "NOT reached (its revision unknown, the last event at 12; the end marker's " in line
    # the same run with the marker delivered passes
    assert chaos_verdict(check(ops, watch(A, B, C)), "") == ""


def test_findings_of_one_kind_are_capped() -> None:
    ops = [put(i, f"k{i}", 10 + i, f"chaos-{i}") for i in range(30)]
    found = check(ops, watch(end=39)).anomalies
    assert [a.type for a in found] == ["watch-gap"] * watches.MAX_PER_TYPE
    assert found[-1].message.endswith(f"(and {30 - watches.MAX_PER_TYPE} more of this kind)")


# -- deletes told no revision: kube-apiserver answers a custom resource's DELETE with a Status
# and no resourceVersion (measured on the stand-in), so the DELETE event a watch delivers is
# the only evidence of the delete's revision (revisions.delete_windows) ------------------------
def api_op(i: int, kind: str, a: float, b: float | None, outcome: str = "ok",
           **kw: Any) -> Op:
    return op(i, kind, "chaos-r-t-k1", a, b, outcome, "api", **kw)


API_DELETES = [api_op(0, "create", 10, 10.5, value="chaos-a", result={"rev": 10}),
               api_op(1, "delete", 10.6, 11.5, result={"deleted": 1}),
               api_op(2, "create", 12, 12.5, value="chaos-b", result={"rev": 12})]


def api_watch(name: str, *events: WatchEvent, end: int = 12) -> Watch:
    return Watch(name=f"t/api-watch@{name}", tenant="t", iface="api", prefix="registers",
                 start_rev=9, events=list(events), end_rev=end, reached_end=True)


def api_ev(rev: int, kind: str, value: str | None, t: float | None = None) -> WatchEvent:
    return WatchEvent("chaos-r-t-k1", rev, kind, value, float(rev) if t is None else t)


ADDED_A, DELETED_11, ADDED_B = (api_ev(10, "ADDED", "chaos-a"), api_ev(11, "DELETED", None),
                                api_ev(12, "ADDED", "chaos-b"))


def test_an_api_delete_is_pinned_to_its_deleted_event() -> None:
    hist = History(ops=API_DELETES, watches=[api_watch("c1", ADDED_A, DELETED_11, ADDED_B)],
                   meta=META)
    win = revisions.delete_windows(hist)[1]
    assert (win.lo, win.hi, win.rev) == (10, 11, 11)
    rep = checker.check(hist)
    assert rep.anomalies == [] and (rep.pinned_deletes, rep.unpinned_deletes) == (1, 0)


def test_a_pinned_delete_is_owed_by_every_other_watch() -> None:
    found = check(API_DELETES, api_watch("c1", ADDED_A, DELETED_11, ADDED_B),
                  api_watch("c2", ADDED_A, ADDED_B)).anomalies
    assert [(a.type, a.where) for a in found] == [("watch-gap", "t api watch t/api-watch@c2")]
    assert "acknowledged delete of chaos-r-t-k1 at revision 11 never came" in found[0].message


def test_an_acknowledged_delete_no_watch_delivered_is_a_gap_in_each() -> None:
    found = check(API_DELETES, api_watch("c1", ADDED_A, ADDED_B),
                  api_watch("c2", ADDED_A, ADDED_B)).anomalies
    assert [a.type for a in found] == ["watch-gap", "watch-gap"], found
    assert "acknowledged delete of chaos-r-t-k1 (between revisions 11 and 11)" in (
        found[0].message)
    # a watch that vouches only up to 10 owes nothing
    assert check(API_DELETES, api_watch("c1", ADDED_A, end=10)).anomalies == []


def test_a_deleted_event_that_arrived_before_the_delete_was_invoked_is_not_its() -> None:
    early = api_ev(11, "DELETED", None, t=10.55)
    hist = History(ops=API_DELETES, watches=[api_watch("c1", ADDED_A, early, ADDED_B)],
                   meta=META)
    assert revisions.delete_windows(hist)[1].rev is None


def test_an_etcd_watch_pins_an_api_delete_under_the_api_key_prefix() -> None:
    meta = {**META, "api_keys": {"t": "/t/registry/chaos/"}}
    etcd = watch(WatchEvent("/t/registry/chaos/chaos-r-t-k1", 10, "PUT", "x", 10.0),
                 WatchEvent("/t/registry/chaos/chaos-r-t-k1", 11, "DELETE", None, 11.0),
                 WatchEvent("/t/registry/chaos/chaos-r-t-k1", 12, "PUT", "y", 12.0))
    hist = History(ops=API_DELETES, watches=[etcd], meta=meta)
    assert revisions.delete_windows(hist)[1].rev == 11
    # and the etcd watch owes it like an API watch does
    missing = watch(*etcd.events[::2])
    found = checker.check(History(ops=API_DELETES, watches=[missing, api_watch(
        "c1", ADDED_A, DELETED_11, ADDED_B)], meta=meta)).anomalies
    assert [(a.type, a.where) for a in found] == [("watch-gap", "t etcd watch t/etcd-watch")]


def test_two_deletes_that_could_take_one_event_take_none() -> None:
    ops = [api_op(0, "create", 10, 10.5, value="chaos-a", result={"rev": 10}),
           api_op(1, "delete", 10.6, 13.5, result={"deleted": 1}),
           api_op(2, "create", 10.7, 11.5, value="chaos-b", result={"rev": 12}),
           api_op(3, "delete", 10.8, 13.6, result={"deleted": 1})]
    evs = (ADDED_A, DELETED_11, ADDED_B, api_ev(13, "DELETED", None))
    hist = History(ops=ops, watches=[api_watch("c1", *evs, end=13)], meta=META)
    wins = revisions.delete_windows(hist)
    assert wins[1].candidates == wins[3].candidates == {11, 13}
    assert wins[1].rev is None and wins[3].rev is None
    assert checker.check(hist).anomalies == []


def test_an_unknown_etcd_delete_pinned_holds_later_reads() -> None:
    ops = [put(0, "k1", 10, "chaos-a"), op(1, "delete", "k1", 10.6, None, "unknown"),
           put(2, "k2", 12, "chaos-b"),
           op(3, "read", "k1", 13, 13.5, result={"header": 12, "found": True,
                                                 "value": "chaos-a", "rev": 10})]
    w = watch(A, ev("k1", 11, None), ev("k2", 12, "chaos-b"))
    hist = History(ops=ops, watches=[w], meta=META)
    assert revisions.delete_windows(hist)[1].rev == 11
    kinds = [a.type for a in checker.check(hist).anomalies]
    assert kinds == ["stale-read", "stale-by-revision"], kinds
    # without the DELETE event the delete may never have applied
    assert check(ops, watch(A, ev("k2", 12, "chaos-b"))).anomalies == []
