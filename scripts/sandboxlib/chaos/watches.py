"""Each recorded watch stream checked as etcd's own robustness tests check theirs
(etcd-io/etcd tests/robustness/validate/watch.go, after the "Watch APIs" section of
etcd.io/docs/v3.5/learning/api_guarantees), on what the history holds (history.py: a watch's
events in arrival order, each with the response it came in when recorded, its restarts with
the revision it was resumed from, its progress notifications, its reported gaps and its end
marker). A watch is one or more streams: the first from its start revision, one more after
each restart.

- ``watch-order`` (validateOrdered, watch.go:139-153): within a stream no event has a lower
  revision than the one before it;
- ``watch-duplicate`` (validateUnique, watch.go:155-178, keyed by revision and key as with
  ``ExpectRevisionUnique`` off: a transaction may write several keys): no (key, revision)
  twice in the watch, streams included (the agent resumes after the last revision it got);
- ``watch-split-revision`` (validateAtomic, watch.go:180-194): a response never starts with
  the revision the previous response ended with (needs the response numbers the agent
  records; a revision cut by a restart shows as a ``watch-gap``: the agent resumes after it);
- ``watch-progress`` (validateBookmarkable, watch.go:111-137): after a progress notification
  at R no event at or below R; notifications never go back, nor below an event delivered;
- ``watch-resume`` (validateResumable, watch.go:231-252): a stream resumed from R (the first
  from the start revision + 1) delivers nothing below R; that its first event is the first
  committed one from R on is the next check's;
- ``watch-gap`` (validateReliable, watch.go:196-229, with lastRevision, watch.go:334-346): every
  write the history proves committed (acknowledged with its revision, or of unknown outcome
  and delivered by a watch) in the watched range, above the start revision and up to the last
  revision the watch vouches for (the end marker when it was reached, else its last event or
  progress notification), was delivered, except in a gap the server reported;
- ``watch-failed-write``: an event with the value of a write that certainly had no effect;
  ``watch-unwritten-value``: of no write; ``watch-revision``: at another revision than its
  write's (acknowledged, or seen by a read); ``watch-foreign`` (validateFilter,
  watch.go:97-109): outside the tenant's prefix or resources;
- ``watch-stalled``: the end marker never arrived, or its revision is not known (its write
  failed or stayed unknown), so the watch cannot be shown to have delivered everything.

A watch event is evidence of a commit: ``seen_at`` gives each write of unknown outcome a watch
delivered the event's revision, which the revision order (revisions.py) then holds later reads
to, and ``pinned`` makes it, for the per-key search (linearizability.py), a write applied at
that revision before the event arrived. Not checked: prevKV and IsCreate (watch.go:254-316; the agent does not ask for prevKV and
the register model does not replay creates), events of keys no client of the history writes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .history import History, Op, Watch, WatchEvent
from .revisions import DeleteWindow

# Events of one kind kept per watch, and missing writes listed.
MAX_PER_TYPE = 20


@dataclass
class Finding:
    type: str
    message: str
    events: list[WatchEvent] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)


def definitely_failed(op: Op) -> bool:
    """A write that certainly had no effect: refused, or answered without applying (a failed
    compare, a create of an existing resource)."""
    return op.is_write and (op.outcome == "fail" or (op.outcome == "ok" and not op.acknowledged))


def writers(hist: History) -> dict[tuple[str, str, str], list[Op]]:
    """(tenant, interface, value) -> the writes that wrote that value."""
    out: dict[tuple[str, str, str], list[Op]] = defaultdict(list)
    for op in hist.ops:
        if op.value is not None and op.is_write:
            out[(op.tenant, op.iface, op.value)].append(op)
    return out


def delivered_unknown(hist: History) -> dict[int, WatchEvent]:
    """op id -> the first event a watch delivered the value of a write of unknown outcome in
    (the only write of that value that may have committed): evidence that it committed at
    the event's revision, before the event arrived."""
    ws = writers(hist)
    out: dict[int, WatchEvent] = {}
    for w in hist.watches:
        for e in w.events:
            if e.value is None:
                continue
            ops = [o for o in ws.get((w.tenant, w.iface, e.value), []) if not definitely_failed(o)]
            if len(ops) == 1 and ops[0].outcome == "unknown":
                first = out.setdefault(ops[0].id, e)
                if e.t < first.t:
                    out[ops[0].id] = e
    return out


def seen_at(hist: History) -> dict[int, int]:
    """op id -> the revision a watch delivered a write of unknown outcome at."""
    return {i: e.rev for i, e in delivered_unknown(hist).items()}


def pinned(op: Op, e: WatchEvent) -> Op:
    """A write of unknown outcome a watch delivered, as the per-key search takes it: applied
    at the event's revision, between its invocation and the event's arrival. An
    acknowledged delete that was told no revision (revisions.delete_windows) keeps its
    answer and takes the event's revision."""
    if op.acknowledged:
        return replace(op, result={**op.result, "rev": e.rev},
                       error=f"no revision in its answer; a watch delivered its DELETE at "
                             f"revision {e.rev}")
    result: dict[str, Any] = {"rev": e.rev, **({"succeeded": True} if op.kind == "cas" else
                                              {"deleted": 1} if op.kind == "delete" else {})}
    return replace(op, outcome="ok", complete=max(e.t, op.invoke), result=result,
                   error=f"unknown outcome; a watch delivered it at revision {e.rev} "
                         f"(at {e.t:.3f}): taken as applied then")


def streams(w: Watch) -> list[tuple[int, list[tuple[int, WatchEvent]], list[dict[str, Any]]]]:
    """The watch's streams: (the revision it starts from, its (index, event)s, its progress
    notifications). A restart or notification without ``after`` is placed by its time."""
    def position(mark: dict[str, Any]) -> int:
        if mark.get("after") is not None:
            return int(mark["after"])
        return sum(1 for e in w.events if e.t <= float(mark.get("t", 0.0)))

    cuts = [(position(r), int(r["from"])) for r in w.restarts]
    out: list[tuple[int, list[tuple[int, WatchEvent]], list[dict[str, Any]]]] = []
    bounds = [(0, w.start_rev + 1), *cuts]
    for j, (at, frm) in enumerate(bounds):
        end = bounds[j + 1][0] if j + 1 < len(bounds) else len(w.events)
        events = [(i, w.events[i]) for i in range(at, max(at, end))]
        notes = [{**p, "after": position(p)} for p in w.progress
                 if at <= position(p) and (position(p) < end or j + 1 == len(bounds))]
        out.append((frm, events, notes))
    return out


def last_vouched(w: Watch) -> int:
    """The highest revision up to which the watch says it delivered everything."""
    if w.reached_end and w.end_rev is not None:
        return w.end_rev
    return max([e.rev for e in w.events] + [int(p["rev"]) for p in w.progress] + [w.start_rev])


def watched_key(w: Watch, op: Op, api_keys: dict[str, str]) -> str | None:
    """The key under which ``w`` delivers ``op``'s key (None: ``w`` does not watch it): an
    API watch its own resources; an etcd watch its prefix, the API's objects included under
    the key prefix their API server stores them at."""
    if w.iface == "api":
        return op.key if op.iface == "api" else None
    key = op.key if op.iface == "etcd" else api_keys.get(op.tenant, "?") + op.key
    return key if key.startswith(w.prefix) else None


def committed(hist: History, w: Watch, api_keys: dict[str, str],
              seen: dict[int, int]) -> dict[tuple[str, int], Op]:
    """(key, revision) of every write the history proves committed that ``w`` must deliver:
    acknowledged with a revision, or of unknown outcome and delivered by some watch."""
    top = last_vouched(w)
    out: dict[tuple[str, int], Op] = {}
    for op in hist.ops:
        if op.tenant != w.tenant or not op.is_write:
            continue
        rev = (op.result.get("rev") if op.acknowledged else None) or seen.get(op.id)
        if rev is None or rev <= w.start_rev or rev > top:
            continue
        key = watched_key(w, op, api_keys)
        if key is None or any(g["from"] <= rev <= g["to"] for g in w.reported_gaps):
            continue
        out[(key, int(rev))] = op
    return out


class WatchCheck:
    """One watch's findings."""

    def __init__(self, hist: History, w: Watch, foreign: Callable[[str], bool],
                 api_keys: dict[str, str], seen: dict[int, int],
                 windows: Sequence[DeleteWindow] = ()) -> None:
        self.hist, self.w, self.foreign = hist, w, foreign
        self.api_keys, self.seen, self.windows = api_keys, seen, windows
        self.findings: list[Finding] = []
        self.count: dict[str, int] = defaultdict(int)

    def add(self, kind: str, message: str, events: Sequence[WatchEvent],
            ops: Sequence[Op] = ()) -> None:
        self.count[kind] += 1
        if self.count[kind] <= MAX_PER_TYPE:
            self.findings.append(Finding(kind, message, list(events), list(ops)))

    def streams(self) -> None:
        """order, duplicate, resume and progress, stream by stream."""
        delivered: set[tuple[str, int]] = set()
        for n, (frm, events, notes) in enumerate(streams(self.w)):
            prev: WatchEvent | None = None
            notes_at = sorted(notes, key=lambda p: int(p["after"]))
            progress = 0
            k = 0
            for i, e in events:
                while k < len(notes_at) and int(notes_at[k]["after"]) <= i:
                    self.progress(notes_at[k], progress, prev)
                    progress = max(progress, int(notes_at[k]["rev"]))
                    k += 1
                if (e.key, e.rev) in delivered:
                    self.add("watch-duplicate", f"{e.key} at revision {e.rev} delivered twice: "
                             "an event never appears on a watch twice", [e])
                elif e.rev < frm:
                    self.add("watch-resume", f"revision {e.rev} on a stream "
                             f"{'resumed' if n else 'started'} from revision {frm}: a watch "
                             "delivers from the revision it asked for", [e])
                elif prev is not None and e.rev < prev.rev:
                    self.add("watch-order", f"revision {e.rev} after {prev.rev}: events are "
                             "ordered by revision", [prev, e])
                elif e.rev <= progress:
                    self.add("watch-progress", f"revision {e.rev} after a progress "
                             f"notification at {progress}: every event up to it had been "
                             "delivered", [e])
                delivered.add((e.key, e.rev))
                prev = e
            for note in notes_at[k:]:
                self.progress(note, progress, prev)
                progress = max(progress, int(note["rev"]))

    def progress(self, note: dict[str, Any], last: int, prev: WatchEvent | None) -> None:
        rev = int(note["rev"])
        before = last if rev < last else prev.rev if prev is not None and rev < prev.rev else 0
        if before:
            self.add("watch-progress", f"a progress notification at revision {rev} after "
                     f"revision {before} was delivered or notified: every event up to a "
                     "notification has been delivered", [prev] if prev else [])

    def atomic(self) -> None:
        last: WatchEvent | None = None
        for e in self.w.events:
            if (last is not None and e.resp is not None and last.resp is not None
                    and e.resp != last.resp and e.rev == last.rev):
                self.add("watch-split-revision", f"revision {e.rev} split over two responses: "
                         "a revision's events come in one response", [last, e])
            last = e

    def values(self) -> None:
        ws = writers(self.hist)
        reads: dict[str, list[Op]] = defaultdict(list)     # value -> the reads that saw it
        for o in self.hist.ops:
            if (o.kind == "read" and o.outcome == "ok" and o.result.get("found")
                    and o.tenant == self.w.tenant and o.iface == self.w.iface):
                reads[str(o.result.get("value"))].append(o)
        for e in self.w.events:
            if self.foreign(e.key):
                self.add("watch-foreign", f"an event outside the tenant's {self.w.prefix}", [e])
            if e.value is None or not e.value.startswith("chaos-"):
                continue
            ops = ws.get((self.w.tenant, self.w.iface, e.value), [])
            live = [o for o in ops if not definitely_failed(o)]
            acked = [o for o in live if o.acknowledged and o.result.get("rev") is not None]
            if not ops:
                self.add("watch-unwritten-value", "an event with a value no client wrote", [e])
            elif not live:
                self.add("watch-failed-write", f"an event at revision {e.rev} with the value "
                         "of a write that certainly had no effect", [e], ops)
            elif (acked and all(o.result.get("rev") != e.rev for o in acked)
                  and all(o.acknowledged for o in live)):
                # (a retried write of one value: the event may be of one of unknown outcome)
                self.add("watch-revision", f"the event has revision {e.rev}, its write "
                         f"{acked[0].result.get('rev')}", [e], acked[:1])
            elif len(live) == 1 and live[0].outcome == "unknown":
                other = next((r for r in reads.get(e.value, [])
                              if r.result.get("rev") not in (None, e.rev)), None)
                if other is not None:
                    self.add("watch-revision", f"the event delivers a write of unknown outcome "
                             f"at revision {e.rev}, a read saw it at {other.result.get('rev')}",
                             [e], [live[0], other])

    def missing(self) -> None:
        w = self.w
        delivered = {(e.key, e.rev) for e in w.events}
        for (key, rev), op in sorted(committed(self.hist, w, self.api_keys, self.seen).items(),
                                     key=lambda x: x[0][1]):
            if (key, rev) in delivered:
                continue
            how = "acknowledged" if op.acknowledged else "unknown-outcome (seen committed)"
            what = "delete" if op.kind == "delete" else "write"
            around = [e for e in w.events if abs(e.rev - rev) <= 3]
            self.add("watch-gap", f"the {how} {what} of {key} at revision {rev} never came",
                     around, [op])
        # An acknowledged delete no event could be pinned to: this watch owes a DELETE of
        # its key somewhere in its window when it vouches for all of it.
        top = last_vouched(w)
        for win in self.windows:
            d = win.op
            if (win.rev is not None or not d.acknowledged or win.hi is None
                    or d.tenant != w.tenant or win.lo < w.start_rev or win.hi > top
                    or any(g["from"] <= win.hi and win.lo < g["to"] for g in w.reported_gaps)):
                continue
            name = watched_key(w, d, self.api_keys)
            if name is None or any(e.key == name and e.type in ("DELETE", "DELETED")
                                   and win.lo < e.rev <= win.hi for e in w.events):
                continue
            self.add("watch-gap", f"the acknowledged delete of {name} (between revisions "
                     f"{win.lo + 1} and {win.hi}) never came", [], [d])

    def stalled(self) -> None:
        w = self.w
        if w.reached_end:
            return
        last = f"its last event at revision {w.events[-1].rev}" if w.events else "no event"
        if w.end_rev is None:
            why = w.end_reason or "the end marker's write never got a revision"
            self.add("watch-stalled", f"no end marker revision is known ({why}), so the watch "
                     f"cannot be shown to have delivered everything ({last}, "
                     f"{len(w.restarts)} restarts)", w.events[-3:])
        else:
            self.add("watch-stalled", f"the watch never delivered the end marker (revision "
                     f"{w.end_rev}; {last}, {len(w.restarts)} restarts)", w.events[-3:])

    def run(self) -> list[Finding]:
        self.streams()
        self.atomic()
        self.values()
        self.missing()
        self.stalled()
        for f in self.findings:
            extra = self.count[f.type] - MAX_PER_TYPE
            if extra > 0 and f is [k for k in self.findings if k.type == f.type][-1]:
                f.message += f" (and {extra} more of this kind)"
        return self.findings
