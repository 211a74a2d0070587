"""What the checker finds in a history (history.py): anomalies, each with the smallest
sub-history that shows it.

- **Linearizability, per key** (P-compositionality: a history is linearizable when each
  key's is): every etcd key and every custom resource through the API is searched on its own
  (linearizability.py). Serializable reads are left out of that search -- etcd may answer them
  from a member that is behind, by design -- and checked apart: each must return a value that
  was written (by an operation invoked before the read returned) with that write's revision.
- **Lost acknowledged writes**: a write the server acknowledged that no later operation could
  have overwritten, yet the key's final read (after the faults were healed) does not show.
- **Watches** (watches.py, as etcd's robustness tests check theirs): each stream ordered,
  unique, atomic per revision, resumed where it broke, true to its progress notifications,
  none outside the tenant's prefix, every value one a client wrote (not one that certainly
  failed) with its revision, none missing compared with the writes the history proves
  committed up to the end marker (a gap that etcd or the API server reported -- compaction,
  410 Expired -- is counted, not an anomaly), and the end marker reached. A watch event of a
  write of unknown outcome is evidence that it committed at that revision (the revision
  order below holds later reads to it); a DELETE event, of the revision of a delete that was
  told none (an API delete: revisions.delete_windows), which every watch then owes.
- **The global revision order** of each tenant's etcd clients and API clients' writes, across
  keys (revisions.py):
  writes in real-time order get increasing revisions, no two share one, header revisions
  never go back, a read shows the last write at or below its header revision, a write of
  unknown outcome a read saw took a free revision.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import linearizability, revisions, watches, witness
from .history import History, Op, Watch, WatchEvent

# Each search gives up (an "inconclusive" key, which fails the run as an anomaly would)
# beyond this many states or seconds.
MAX_STATES = 2_000_000
MAX_SECONDS = 60.0
# The search for a smallest failing sub-history stops after this many trials or seconds.
MINIMIZE_TRIALS = 400
MINIMIZE_SECONDS = 60.0


@dataclass
class Anomaly:
    type: str                     # stale-read / non-linearizable / lost-write / watch-gap ...
    where: str                    # "tenant-a etcd /tenant-a/chaos/r1/k3"
    message: str
    ops: list[dict[str, Any]] = field(default_factory=list)      # the smallest sub-history
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    anomalies: list[Anomaly] = field(default_factory=list)
    keys: int = 0
    ops_checked: int = 0
    states: int = 0
    seconds: float = 0.0
    lost_writes: int = 0
    serializable_reads: int = 0
    watch_events: int = 0
    reported_gaps: int = 0
    inconclusive: int = 0
    revision_ops: int = 0         # operations checked against the global revision order
    pinned_deletes: int = 0       # deletes told no revision, pinned to their DELETE event
    unpinned_deletes: int = 0     # ... and those no single event could be given to
    total_seconds: float = 0.0

    @property
    def ops_per_second(self) -> float:
        return self.ops_checked / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ops_per_second"] = round(self.ops_per_second)
        return out


def key_of(op: Op) -> tuple[str, str, str]:
    return (op.tenant, op.iface, op.key)


def by_key(ops: Sequence[Op]) -> dict[tuple[str, str, str], list[Op]]:
    groups: dict[tuple[str, str, str], list[Op]] = defaultdict(list)
    for op in ops:
        groups[key_of(op)].append(op)
    return groups


def _where(k: tuple[str, str, str]) -> str:
    return f"{k[0]} {k[1]} {k[2]}"


# -- the smallest sub-history ------------------------------------------------------------
def _observed(op: Op) -> tuple[bool, str | None, int | None] | None:
    """What ``op`` saw of the key: (found, value, rev), or None when it saw nothing."""
    r = op.result
    if op.outcome != "ok":
        return None
    if op.kind == "read" or (op.kind == "cas" and not r.get("succeeded") and "found" in r):
        return bool(r.get("found")), r.get("value"), r.get("rev")
    return None


def explained(sub: Sequence[Op], full: Sequence[Op]) -> bool:
    """Whether every value and revision an operation of ``sub`` depends on comes from an
    operation of ``sub`` whenever ``full`` has one: a sub-history that drops the write a
    read saw would fail for another reason than the one it is meant to show."""
    writers = {op.value: op for op in full if op.value is not None and op.kind != "read"}
    revs = {op.result.get("rev"): op for op in full
            if op.is_write and op.outcome == "ok" and op.result.get("rev") is not None}
    ids = {op.id for op in sub}
    deletes = sorted((op for op in full if op.kind == "delete" and op.outcome != "fail"),
                     key=lambda o: o.invoke)
    for op in sub:
        seen = _observed(op)
        if seen is not None and seen[0]:
            w = writers.get(str(seen[1]))
            if w is not None and w.id not in ids:
                return False
        elif seen is not None or (op.kind == "delete" and op.outcome == "ok"
                                  and not op.result.get("deleted")) or (
                op.kind == "cas" and op.expected == 0 and op.outcome == "ok"
                and op.result.get("succeeded")):
            # An absent key (seen, deleted nothing, or created only if absent: a
            # compare-and-swap on mod revision 0): the last delete invoked before it
            # answered explains it.
            before = [d for d in deletes if d.invoke < (op.complete or op.invoke)]
            if before and before[-1].id not in ids:
                return False
        if op.kind == "cas" and op.expected:
            w = revs.get(op.expected)
            if w is not None and w.id not in ids:
                return False
        if op.kind == "delete" and op.outcome == "ok" and op.result.get("deleted"):
            # It deleted a value: the last write invoked before it answered put it there.
            before = sorted((w for w in revs.values() if w.kind != "delete"
                             and w.invoke < (op.complete or op.invoke)), key=lambda w: w.invoke)
            if before and before[-1].id not in ids:
                return False
    return True


def minimal(ops: Sequence[Op], fails: Callable[[Sequence[Op]], bool],
            trials: int = MINIMIZE_TRIALS) -> list[Op]:
    """A 1-minimal sub-history of ``ops`` (by delta debugging) for which ``fails`` holds and
    whose dependencies are all in it (``explained``); ``ops`` itself must fail."""
    full = list(ops)
    budget = [trials]
    deadline = time.monotonic() + MINIMIZE_SECONDS

    def test(sub: Sequence[Op]) -> bool:
        if budget[0] <= 0 or time.monotonic() > deadline:
            return False
        budget[0] -= 1
        return explained(sub, full) and fails(sub)

    cur = sorted(full, key=lambda o: o.invoke)
    # The shortest failing prefix first (by invocation), found by bisection.
    lo, hi = 1, len(cur)
    while lo < hi:
        mid = (lo + hi) // 2
        if test(cur[:mid]):
            hi = mid
        else:
            lo = mid + 1
    if hi < len(cur) and test(cur[:hi]):
        cur = cur[:hi]
    n = 2
    while len(cur) >= 2 and budget[0] > 0:
        size = max(1, len(cur) // n)
        chunks = [cur[i:i + size] for i in range(0, len(cur), size)]
        reduced = False
        for i in range(len(chunks)):
            rest = [o for j, c in enumerate(chunks) if j != i for o in c]
            if rest and test(rest):
                cur, n, reduced = rest, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(cur):
                break
            n = min(len(cur), n * 2)
    return cur


def _op_json(op: Op) -> dict[str, Any]:
    d = asdict(op)
    d["invoke"] = round(op.invoke, 3)
    d["complete"] = None if op.complete is None else round(op.complete, 3)
    return d


# -- the checks ----------------------------------------------------------------------------
def _classify(sub: Sequence[Op]) -> str:
    """A name for what the smallest sub-history shows: a read of a value nobody wrote, else
    by its last answered operation (the one no order can satisfy after the others)."""
    values = {o.value for o in sub if o.value is not None}
    for o in sub:
        seen = _observed(o)
        if seen is not None and seen[0] and seen[1] not in values:
            return "read-of-unwritten-value"
    answered = [o for o in sub if o.outcome == "ok" and o.complete is not None]
    last = max(answered, key=lambda o: o.complete or 0.0) if answered else None
    if last is not None and last.kind == "read":
        return "stale-read"
    if last is not None and last.kind == "cas" and last.result.get("succeeded"):
        return "cas-on-old-revision"
    return "non-linearizable"


def check_linearizable(hist: History, report: Report,
                       delivered: dict[int, WatchEvent] | None = None) -> None:
    """Each key's search; a write of unknown outcome a watch delivered (``delivered``:
    watches.delivered_unknown) is taken as applied at the event's revision, before it."""
    delivered = delivered or {}
    for k, ops in sorted(by_key(hist.ops).items()):
        ops = [watches.pinned(o, delivered[o.id]) if o.id in delivered else o for o in ops]
        sub = linearizability.checkable(ops)
        if not sub:
            continue
        report.keys += 1
        report.ops_checked += len(sub)
        # A violation the key's revisions prove (witness.py), confirmed by the search on its
        # own few operations, decides the key without searching all of them.
        found = witness.find(sub)
        if found is not None and linearizability.check(found.ops, 200_000, 5.0).ok is False:
            report.anomalies.append(Anomaly(
                found.type, _where(k),
                f"not linearizable: {found.message} (these {len(found.ops)} operations of "
                f"{len(sub)} on this key)", ops=[_op_json(o) for o in found.ops]))
            continue
        res = linearizability.check(sub, MAX_STATES, MAX_SECONDS)
        report.states += res.states
        report.seconds += res.seconds
        if res.ok:
            continue
        if res.ok is None:
            report.inconclusive += 1
            report.anomalies.append(Anomaly(
                "inconclusive", _where(k),
                f"the search gave up after {res.states} states ({res.seconds:.0f}s) on "
                f"{len(sub)} operations: neither proved nor refuted"))
            continue
        small = minimal(sub, lambda s: linearizability.check(s, 200_000, 5.0).ok is False)
        report.anomalies.append(Anomaly(
            _classify(small), _where(k),
            f"not linearizable: no order of these {len(small)} operations (of {len(sub)} on "
            "this key) agrees with their real-time order and a register with revisions",
            ops=[_op_json(o) for o in small]))


def check_serializable(hist: History, report: Report) -> None:
    writes: dict[tuple[str, str, str], dict[str, Op]] = defaultdict(dict)
    for op in hist.ops:
        if op.value is not None and op.kind != "read":
            writes[key_of(op)][op.value] = op
    for op in hist.ops:
        if op.kind != "read" or op.consistency != "s" or op.outcome != "ok":
            continue
        report.serializable_reads += 1
        if not op.result.get("found"):
            continue
        w = writes[key_of(op)].get(str(op.result.get("value")))
        bad = ""
        if w is None or w.outcome == "fail":
            bad = "a value no client wrote (or one whose write certainly failed)"
        elif w.invoke > (op.complete or op.invoke):
            bad = "a value written only after the read returned"
        elif (w.outcome == "ok" and w.result.get("rev") is not None
              and w.result.get("rev") != op.result.get("rev")):
            bad = f"mod revision {op.result.get('rev')}, not its write's {w.result.get('rev')}"
        if bad:
            report.anomalies.append(Anomaly(
                "serializable-read", _where(key_of(op)), f"a serializable read returned {bad}",
                ops=[_op_json(o) for o in ([w] if w is not None else []) + [op]]))


def check_lost_writes(hist: History, report: Report, final: str = "final") -> None:
    """Acknowledged writes that nothing could have overwritten, missing from the final read."""
    for k, ops in by_key(hist.ops).items():
        finals = [o for o in ops if o.process.endswith(final) and o.kind == "read"
                  and o.outcome == "ok"]
        if not finals:
            continue
        last = max(finals, key=lambda o: o.invoke)
        writes = [o for o in ops if o.is_write and o.outcome != "fail"]
        # When each write may have taken effect at the latest (an unknown one: any time).
        ends = sorted((float("inf") if x.outcome == "unknown" or x.complete is None
                       else x.complete, x.id) for x in writes)
        for w in writes:
            if not w.acknowledged:
                continue
            latest = next((e for e, i in reversed(ends) if i != w.id), float("-inf"))
            if latest > w.invoke:          # another write may have come after it
                continue
            found = bool(last.result.get("found"))
            shows = (not found) if w.kind == "delete" else (
                found and last.result.get("value") == w.value)
            if not shows:
                report.lost_writes += 1
                report.anomalies.append(Anomaly(
                    "lost-write", _where(k),
                    "an acknowledged write that no other operation could have overwritten is "
                    "not what the final read shows", ops=[_op_json(w), _op_json(last)]))


def check_watch(hist: History, w: Watch, report: Report, foreign: Callable[[str], bool],
                api_keys: dict[str, str], seen: dict[int, int],
                windows: Sequence[revisions.DeleteWindow] = ()) -> None:
    report.watch_events += len(w.events)
    report.reported_gaps += len(w.reported_gaps)
    where = f"{w.tenant} {w.iface} watch {w.name}"
    for f in watches.WatchCheck(hist, w, foreign, api_keys, seen, windows).run():
        report.anomalies.append(Anomaly(f.type, where, f.message,
                                        ops=[_op_json(o) for o in f.ops],
                                        events=[asdict(e) for e in f.events]))


def check_revisions(hist: History, report: Report, seen: dict[int, int]) -> None:
    findings, report.revision_ops = revisions.check(hist, seen)
    report.anomalies += [Anomaly(f.type, f.where, f.message, ops=[_op_json(o) for o in f.ops])
                         for f in findings]


def check(hist: History) -> Report:
    """Every check on ``hist``; ``hist.meta`` gives each tenant's etcd prefix ("prefixes")
    and the etcd key prefix its API server stores the run's custom resources under
    ("api_keys")."""
    report = Report()
    t0 = time.monotonic()
    delivered = watches.delivered_unknown(hist)
    seen = {i: e.rev for i, e in delivered.items()}
    # Deletes told no revision, pinned to the DELETE event of their window (revisions.py).
    windows = revisions.delete_windows(hist, seen)
    for i, win in windows.items():
        if win.rev is not None:
            seen[i] = win.rev
            delivered[i] = WatchEvent(win.op.key, win.rev, "DELETE", None, win.t)
    report.pinned_deletes = sum(1 for win in windows.values() if win.rev is not None)
    report.unpinned_deletes = len(windows) - report.pinned_deletes
    check_linearizable(hist, report, delivered)
    check_serializable(hist, report)
    check_lost_writes(hist, report)
    check_revisions(hist, report, seen)
    prefixes: dict[str, str] = hist.meta.get("prefixes", {})
    api_keys: dict[str, str] = hist.meta.get("api_keys", {})
    names: dict[str, str] = hist.meta.get("api_names", {})
    for w in hist.watches:
        if w.iface == "etcd":
            def foreign(key: str, w: Watch = w) -> bool:
                return not key.startswith(prefixes.get(w.tenant, w.prefix))
        else:
            def foreign(key: str, w: Watch = w) -> bool:
                mine = names.get(w.tenant)
                return bool(mine) and not key.startswith(str(mine))
        check_watch(hist, w, report, foreign, api_keys, seen, list(windows.values()))
    report.seconds = max(report.seconds, 1e-9)
    report.total_seconds = time.monotonic() - t0
    return report
