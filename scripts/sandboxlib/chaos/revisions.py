"""The global revision order of a tenant's etcd clients and API clients: what etcd promises
across keys, checked beside the per-key search (linearizability.py).

etcd's API guarantees (etcd.io/docs/v3.5/learning/api_guarantees, "Revision" and "Strict
serializability"): every operation that modifies the store gets ONE new cluster-wide revision,
increasing in commit order (a transaction's writes share one); operations occur in a total order
consistent with real time; a read is served at a header revision and sees the store as of it.
etcd's own robustness tests model it the same way (tests/robustness/model/deterministic.go:
one ``Revision`` for all keys, a transaction that writes increases it by one and answers with
it, a range answers with the current one; tests/robustness/validate/operations.go checks a
serializable read against the state replayed at its revision). From that, for two answered
operations a, b of a tenant's etcd clients (a write's revision: its response header; a read's,
a failed compare-and-swap's, a delete's of nothing: the header it was served at):

- ``write-order``: a write acknowledged before another write was invoked has the lower revision;
- ``revision-shared``: two writes (two operations: the workload's writes are single ones)
  never share a revision;
- ``revision-backwards``: an operation invoked after another was answered is served at a
  revision at least as high (a write: higher) -- one client's header revisions never go back;
- ``stale-by-revision``: a read of key K at header H shows the last write of K with a revision
  <= H (any read, serializable ones too: a member serves a consistent snapshot, stale or not);
  ``read-beyond-header``: never a mod revision above H;
- ``unknown-write-no-gap``: a write of unknown outcome that a read saw (or a watch delivered:
  watches.py) committed at a revision
  no other write has, above every revision answered before it was invoked; when no such
  revision is left, it cannot have committed.

The API clients' writes are in the same order: kube-apiserver's etcd3 store answers a create
or an update with the object's resourceVersion taken from the etcd transaction's response
header (k8s.io/apiserver/pkg/storage/etcd3/store.go), and a tenant's API servers write to the
same etcd as its etcd clients. So an API write has its etcd revision and takes part in
``write-order``, ``revision-shared`` and ``revision-backwards`` with the etcd clients'
operations (an API read has no header revision: it is held only by the per-key search). An
API delete is answered without a revision (a Status), so ``delete_windows`` pins it to the
DELETE event a watch delivered in its window; the watches then owe it (watches.py). The
recorded real run (tests/fixtures) passes with them: 306 acknowledged API creates and
updates among 1,658 operations with a revision, and its 67 API deletes each pinned to a
DELETE event.

Serializable reads may be behind (served by the member asked), so they are not held to the
real-time order. Writes of unknown outcome nobody saw may have committed at any free revision,
or not at all, so they only make the checks more permissive. Revisions of writes outside the
tenant's etcd clients (other tenants, the API servers) are not known here: every revision not
known to be taken counts as free, which can only make the checks more permissive.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .history import History, Op

# Findings of one type kept per tenant; the last one kept says how many more there were.
MAX_PER_TYPE = 20


@dataclass
class Finding:
    type: str
    where: str
    message: str
    ops: list[Op]


def write_rev(op: Op) -> int | None:
    """The revision an acknowledged write was given (its response header), when told."""
    rev = op.result.get("rev") if op.acknowledged else None
    return int(rev) if rev else None


def point(op: Op) -> int | None:
    """The revision at which an answered operation took effect: a write's new revision; a
    read's, a failed compare-and-swap's or a delete's of nothing: its header revision."""
    if op.outcome != "ok":
        return None
    if op.acknowledged:
        return write_rev(op)
    header = op.result.get("header")
    return int(header) if header else None


def _desc(op: Op) -> str:
    rev = point(op)
    at = "" if rev is None else (f" at revision {rev}" if op.acknowledged
                                 else f" at header revision {rev}")
    times = f"{op.invoke:.3f}-" + ("?" if op.complete is None else f"{op.complete:.3f}")
    return f"op {op.id} ({op.process} {op.kind} {op.key}{at}, {times})"


class Revisions:
    """One tenant's etcd and API operations and what their revisions say."""

    def __init__(self, ops: Iterable[Op], where: str,
                 watched: dict[int, int] | None = None, observed: bool = True) -> None:
        self.ops = list(ops)
        self.where = where
        self.findings: list[Finding] = []
        self.pt = {o.id: point(o) or 0 for o in self.ops}     # 0: no revision told
        self.acked = {o.id for o in self.ops if o.acknowledged}
        # The operations held to real-time order (answered, with a revision, not serializable).
        self.timed = [o for o in self.ops if o.complete is not None and self.pt[o.id]
                      and not (o.kind == "read" and o.consistency == "s")]
        done = sorted(self.timed, key=lambda o: o.complete or 0.0)
        self._completes = [o.complete or 0.0 for o in done]
        self._floor: list[int] = []
        high = 0
        for o in done:
            high = max(high, self.pt[o.id])
            self._floor.append(high)
        # Unknown writes a read saw, else a watch delivered (watches.seen_at).
        ids = {o.id for o in self.ops}
        self.unknown_at = {**{i: r for i, r in (watched or {}).items() if i in ids},
                           **(self._observed_unknown_writes() if observed else {})}
        # Every write's revision known: acknowledged ones, unknown ones a read or watch saw.
        self.by_rev: dict[int, list[Op]] = defaultdict(list)
        for o in self.ops:
            rev = write_rev(o) or self.unknown_at.get(o.id)
            if rev:
                self.by_rev[rev].append(o)
        self.taken = sorted(self.by_rev)

    def add(self, kind: str, message: str, ops: list[Op]) -> None:
        self.findings.append(Finding(kind, self.where, message, ops))

    def floor(self, t: float) -> int:
        """The highest revision of an operation answered before ``t`` (0: none)."""
        i = bisect.bisect_left(self._completes, t)
        return self._floor[i - 1] if i else 0

    def free_in(self, lo: int, hi: int) -> bool:
        """Whether some revision in (lo, hi] is not known to be taken by a write."""
        if hi <= lo:
            return False
        taken = bisect.bisect_right(self.taken, hi) - bisect.bisect_right(self.taken, lo)
        return taken < hi - lo

    def _observed_unknown_writes(self) -> dict[int, int]:
        """op id -> the mod revision a read saw a write of unknown outcome's value at."""
        writers: dict[tuple[str, str, str], list[Op]] = defaultdict(list)
        for o in self.ops:
            if o.value is not None and o.kind != "read":
                writers[(o.iface, o.key, o.value)].append(o)
        out: dict[int, int] = {}
        for o in self.ops:
            seen = _seen(o)
            if seen is None or seen[1] is None or seen[2] is None:
                continue
            ws = writers.get((o.iface, o.key, seen[1]), [])
            if len(ws) == 1 and ws[0].outcome == "unknown":
                out.setdefault(ws[0].id, seen[2])
        return out

    # -- the checks --------------------------------------------------------------------------
    def check_real_time(self) -> None:
        """write-order and revision-backwards: one sweep in invocation order, holding the
        operation with the highest revision among those answered before (writes apart)."""
        done = sorted(self.timed, key=lambda o: o.complete or 0.0)
        pt, acked = self.pt, self.acked
        i = 0
        top: Op | None = None           # the highest revision answered so far
        top_write: Op | None = None     # the highest write revision answered so far
        for b in sorted(self.timed, key=lambda o: o.invoke):
            while i < len(done) and (done[i].complete or 0.0) < b.invoke:
                a = done[i]
                if top is None or pt[a.id] > pt[top.id]:
                    top = a
                if a.id in acked and (top_write is None or pt[a.id] > pt[top_write.id]):
                    top_write = a
                i += 1
            pb, write = pt[b.id], b.id in acked
            if write and top_write is not None and pt[top_write.id] > pb:
                self.add("write-order", f"{_desc(top_write)} was acknowledged before "
                         f"{_desc(b)} was invoked, yet has the higher revision: etcd gives "
                         "writes increasing revisions in commit order", [top_write, b])
            elif top is not None and (pt[top.id] > pb or (
                    write and top.id not in acked and pt[top.id] == pb)):
                who = "the same client: its" if top.process == b.process else "a"
                self.add("revision-backwards", f"{_desc(b)} was invoked after {_desc(top)} "
                         f"was answered, so {who} revision may not go back"
                         + (" (a write's must be higher)" if write else ""), [top, b])

    def check_shared(self) -> None:
        for rev, all_ws in sorted(self.by_rev.items()):
            ws = [w for w in all_ws if w.acknowledged]   # an unknown one: check_unknown
            for w in ws[1:]:
                self.add("revision-shared", f"{_desc(ws[0])} and {_desc(w)} have one revision "
                         f"{rev}: etcd gives each write operation a revision of its own",
                         [ws[0], w])

    def check_reads(self) -> None:
        """stale-by-revision and read-beyond-header, for every read with a header."""
        known: dict[tuple[str, str], list[tuple[int, Op]]] = defaultdict(list)
        for rev, ws in self.by_rev.items():
            for w in ws:
                known[(w.iface, w.key)].append((rev, w))
        revs: dict[tuple[str, str], list[int]] = {}
        for key, writes in known.items():
            writes.sort(key=lambda x: x[0])
            revs[key] = [x[0] for x in writes]
        deletes = [o for o in self.ops if o.kind == "delete" and o.outcome == "unknown"]
        for r in self.ops:
            seen, header = _seen(r), r.result.get("header")
            if seen is None or not header or r.acknowledged:
                continue
            found, value, mod = seen
            writes = known.get((r.iface, r.key), [])
            i = bisect.bisect_right(revs.get((r.iface, r.key), []), header) - 1
            last = writes[i] if i >= 0 else None
            owners = self.by_rev.get(mod or 0, [])
            if found and mod is not None and mod > header:
                self.add("read-beyond-header", f"{_desc(r)} returned {r.key} with mod revision "
                         f"{mod}, above the revision it was served at", [r])
            elif found and owners and not any(w.key == r.key and w.iface == r.iface
                                              and w.value == value
                                              for w in owners):
                self.add("revision-shared", f"{_desc(r)} returned {r.key}={value!r} at mod "
                         f"revision {mod}, which is {_desc(owners[0])}'s: no write of that "
                         "value can have it too", [owners[0], r])
            elif last is None:
                continue
            elif found and mod is not None and (mod < last[0] or (
                    mod == last[0] and (last[1].kind == "delete" or last[1].value != value))):
                self.add("stale-by-revision", f"{_desc(r)} returned {value!r} (mod revision "
                         f"{mod}), but {_desc(last[1])} wrote {r.key} at revision {last[0]} "
                         f"<= {header}: a read sees the last write at or below its revision",
                         [last[1], r])
            elif not found and last[1].kind != "delete" and not any(
                    d.key == r.key and d.iface == r.iface and d.invoke < (r.complete or r.invoke)
                    and self.free_in(max(last[0], self.floor(d.invoke)), header)
                    for d in deletes):
                self.add("stale-by-revision", f"{_desc(r)} found {r.key} absent, but "
                         f"{_desc(last[1])} wrote it at revision {last[0]} <= {header} and "
                         "no delete can have come between", [last[1], r])

    def check_unknown(self) -> None:
        """A write of unknown outcome a read saw (or a watch delivered) took a revision of its
        own, above what was answered before it was invoked (and at most the reader's
        header)."""
        for u in self.ops:
            rev = self.unknown_at.get(u.id)
            if rev is None or u.acknowledged:       # (an acknowledged delete: its window's)
                continue
            floor = self.floor(u.invoke)
            others = [w for w in self.by_rev.get(rev, []) if w.id != u.id]
            if others:
                self.add("unknown-write-no-gap", f"{_desc(u)} (unknown outcome) was seen at "
                         f"revision {rev}, which {_desc(others[0])} has", [others[0], u])
            elif rev <= floor:
                self.add("unknown-write-no-gap", f"{_desc(u)} (unknown outcome) was seen at "
                         f"revision {rev}, but revision {floor} was answered before it was "
                         "invoked: it cannot have committed there", [u])

    def run(self) -> list[Finding]:
        self.check_real_time()
        self.check_shared()
        self.check_reads()
        self.check_unknown()
        kept: list[Finding] = []
        count: dict[str, int] = defaultdict(int)
        for f in self.findings:
            count[f.type] += 1
            if count[f.type] <= MAX_PER_TYPE:
                kept.append(f)
        for f in kept:
            extra = count[f.type] - MAX_PER_TYPE
            if extra > 0 and f is [k for k in kept if k.type == f.type][-1]:
                f.message += f" (and {extra} more of this kind)"
        return kept


def _seen(op: Op) -> tuple[bool, str | None, int | None] | None:
    """What an answered read, failed compare-and-swap or delete of nothing saw of its key:
    (found, value, mod revision)."""
    r = op.result
    if op.outcome != "ok":
        return None
    if op.kind == "read" or (op.kind == "cas" and not r.get("succeeded") and "found" in r):
        return bool(r.get("found")), r.get("value"), r.get("rev")
    if op.kind == "delete" and not r.get("deleted"):
        return False, None, None
    return None


@dataclass
class DeleteWindow:
    """Where a delete that was told no revision can have committed: at a revision above
    ``lo`` (the highest answered before it was invoked) and, when it was acknowledged, at
    most ``hi`` (what operations invoked after its answer were served at; None: no bound).
    ``rev``: the one DELETE event of its key the watches delivered in that window, when
    exactly one is left to it (then ``t``: when that event first arrived)."""

    op: Op
    lo: int
    hi: int | None
    candidates: set[int]
    rev: int | None = None
    t: float = 0.0


def delete_events(hist: History, tenant: str) -> dict[tuple[str, str], dict[int, float]]:
    """(interface, key) -> {revision: first arrival} of the DELETE events every watch of the
    tenant delivered; an etcd watch's event of an API object's key counts for the API."""
    api_key = str(hist.meta.get("api_keys", {}).get(tenant) or "\x00")
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for w in hist.watches:
        if w.tenant != tenant:
            continue
        for e in w.events:
            if e.type not in ("DELETE", "DELETED"):
                continue
            where = (("api", e.key[len(api_key):]) if w.iface == "etcd"
                     and e.key.startswith(api_key) else (w.iface, e.key))
            first = out[where].get(e.rev)
            out[where][e.rev] = e.t if first is None else min(first, e.t)
    return out


def delete_windows(hist: History, seen: dict[int, int] | None = None) -> dict[int, DeleteWindow]:
    """op id -> the window of every delete that was told no revision: an API delete
    (kube-apiserver answers a custom resource's DELETE with a Status, without the
    resourceVersion of the delete -- measured on the stand-in, Kubernetes 1.36) or one of
    unknown outcome. A DELETE event a watch delivered is evidence of the delete's revision
    (as a watch event is of an unknown write's, watches.py): a delete is pinned to the one
    event of its key in its window that arrived after it was invoked, that no known write
    has and that no other delete can take (acknowledged deletes first: they certainly
    committed)."""
    seen = seen or {}
    by_tenant: dict[str, list[Op]] = defaultdict(list)
    for o in hist.ops:
        by_tenant[o.tenant].append(o)
    out: dict[int, DeleteWindow] = {}
    for tenant, ops in by_tenant.items():
        rv = Revisions(ops, tenant, observed=False)
        events = delete_events(hist, tenant)
        ordered = {k: sorted(v) for k, v in events.items()}
        claimed = set(rv.by_rev) | {seen[o.id] for o in ops if o.id in seen}
        late = sorted(rv.timed, key=lambda o: o.invoke)
        invokes = [o.invoke for o in late]
        # the lowest revision a delete answered before t may have: from each operation
        # invoked after t, its revision (a write's: less one)
        ceil: list[int] = [0] * len(late)
        low = 1 << 62
        for i in range(len(late) - 1, -1, -1):
            o = late[i]
            low = min(low, rv.pt[o.id] - (1 if o.id in rv.acked else 0))
            ceil[i] = low
        mine: list[DeleteWindow] = []
        for d in ops:
            if d.kind != "delete" or d.id in seen or not (
                    (d.acknowledged and write_rev(d) is None) or d.outcome == "unknown"):
                continue
            lo = rv.floor(d.invoke)
            hi = None
            if d.acknowledged and d.complete is not None:
                i = bisect.bisect_right(invokes, d.complete)
                hi = ceil[i] if i < len(late) else None
            arrived = events.get((d.iface, d.key), {})
            revs = ordered.get((d.iface, d.key), [])
            window = revs[bisect.bisect_right(revs, lo):
                          len(revs) if hi is None else bisect.bisect_right(revs, hi)]
            cands = {r for r in window if arrived[r] >= d.invoke and r not in claimed}
            mine.append(DeleteWindow(d, lo, hi, cands))
        groups: dict[tuple[str, str], list[DeleteWindow]] = defaultdict(list)
        for w in mine:
            groups[(w.op.iface, w.op.key)].append(w)
        for key, group in groups.items():
            _pin(group, events[key])
        out.update({w.op.id: w for w in mine})
    return out


def _pin(group: list[DeleteWindow], arrived: dict[int, float]) -> None:
    """Pin the deletes of one key whose window holds one event no other delete can take."""
    for phase in (True, False):                   # acknowledged, then unknown
        changed = True
        while changed:
            changed = False
            taken = {w.rev for w in group if w.rev is not None}
            for w in group:
                if w.rev is not None or w.op.acknowledged != phase:
                    continue
                left = w.candidates - taken
                rivals = set().union(*(v.candidates for v in group if v is not w
                                       and v.rev is None
                                       and (not phase or v.op.acknowledged)))
                if len(left) == 1 and not left & rivals:
                    w.rev = left.pop()
                    w.t = arrived[w.rev]
                    taken.add(w.rev)
                    changed = True


def check(hist: History, watched: dict[int, int] | None = None) -> tuple[list[Finding], int]:
    """Every tenant's etcd and API operations against the global revision order: the
    findings and how many operations carried a revision. ``watched``: op id -> the revision a watch
    delivered a write of unknown outcome at (watches.seen_at), taken like a read's."""
    tenants: dict[str, list[Op]] = defaultdict(list)
    for op in hist.ops:
        tenants[op.tenant].append(op)
    findings: list[Finding] = []
    counted = 0
    for tenant, ops in sorted(tenants.items()):
        ifaces = " and API" if any(o.iface == "api" for o in ops) else ""
        rv = Revisions(ops, f"{tenant} etcd{ifaces} (all keys)", watched)
        counted += sum(1 for rev in rv.pt.values() if rev)
        findings += rv.run()
    return findings, counted
