"""Histories made from the sequential model, for the checker's own tests and speed.

``generate`` runs clients against a sequential etcd-like store (one global revision counter,
per-key mod revisions): each operation takes effect at a linearization point inside its
[invoke, complete] interval (``rate`` of them per second: the higher, the more operations of
the ``n_procs`` clients overlap), so the history it returns is linearizable by construction --
with operations of unknown outcome (applied or not, their answer lost), serializable reads, and
a final read of every key. ``mutate`` then changes ONE operation so that the history cannot
be linearizable any more (a stale read, a read of a value never written, a compare-and-swap
that succeeds on an old revision, a lost update, a read served below the revision of a write
to another key answered before it: a header revision going back), and says which;
``mutate_watch`` breaks the watch (an event dropped, delivered twice, two swapped, the end
marker never reached: ``WATCH_MUTATIONS``, each its anomaly's name). ``run`` checks some of
each and measures the checker's speed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from . import checker
from .history import History, Op, Watch, WatchEvent

MUTATIONS = ("stale-read", "unwritten-value", "cas-old-revision", "lost-update",
             "header-backwards")
WATCH_MUTATIONS = ("watch-gap", "watch-duplicate", "watch-order", "watch-stalled")


def generate(rng: random.Random, n_ops: int, n_keys: int = 8, n_procs: int = 4,
             p_unknown: float = 0.03, iface: str = "etcd", tenant: str = "t",
             rate: float = 4.0) -> History:
    rev = 100
    names = [f"/{tenant}/k{i}" if iface == "etcd" else f"{tenant}-k{i}" for i in range(n_keys)]
    state: dict[str, tuple[str, int] | None] = {k: None for k in names}
    free_at = [0.0] * n_procs
    hist = History(meta={"prefixes": {tenant: f"/{tenant}/"}, "api_names": {tenant: f"{tenant}-"},
                         "generated": True})
    lin = 0.0
    events: list[WatchEvent] = []
    for i in range(n_ops):
        lin += rng.expovariate(rate)
        candidates = [p for p in range(n_procs) if free_at[p] < lin]
        if not candidates:
            lin = min(free_at) + 0.001
            candidates = [p for p in range(n_procs) if free_at[p] < lin]
        p = rng.choice(candidates)
        invoke = rng.uniform(max(free_at[p], lin - 0.5), lin)
        complete = lin + rng.expovariate(8.0)
        key = rng.choice(list(state))
        cur = state[key]
        roll = rng.random()
        value = f"chaos-g-{i}"
        op = Op(id=i, process=f"{tenant}/{iface}-{p}", tenant=tenant, iface=iface, kind="read",
                key=key, invoke=invoke, complete=complete, outcome="ok")
        applied = True
        if roll < 0.30 or roll >= 0.95:
            op.consistency = "s" if roll >= 0.95 else "l"
            op.result = ({"found": True, "value": cur[0], "rev": cur[1]} if cur
                         else {"found": False})
            if iface == "etcd":
                op.result["header"] = rev  # served at the current revision
        else:
            unknown = rng.random() < p_unknown
            applied = not unknown or rng.random() < 0.5
            if roll < 0.55:
                op.kind, op.value = "put", value
                ok = True
            elif roll < 0.80:
                op.kind, op.value = "cas", value
                cur_rev = cur[1] if cur else 0
                op.expected = cur_rev if rng.random() < 0.6 else rng.choice([0, max(cur_rev - 3, 0)])
                ok = op.expected == cur_rev
                if not ok and not unknown:
                    op.result = {"succeeded": False}
                    if iface == "etcd":
                        op.result.update(header=rev)
                        op.result.update({"found": True, "value": cur[0], "rev": cur[1]}
                                         if cur else {"found": False})
            elif roll < 0.85:
                op.kind, op.value = "create", value
                ok = cur is None
                if not ok and not unknown:
                    op.result = {"exists": True}
            else:
                op.kind = "delete"
                ok = cur is not None
                if not ok and not unknown:
                    op.result = {"deleted": 0, **({"header": rev} if iface == "etcd" else {})}
            if unknown:
                op.outcome, op.complete = "unknown", None
                op.result = {}
            if ok and applied:
                rev += 1
                if op.kind == "delete":
                    state[key] = None
                    events.append(WatchEvent(key, rev, "DELETE", None, lin))
                else:
                    state[key] = (value, rev)
                    events.append(WatchEvent(key, rev, "PUT", value, lin))
                if not unknown:
                    op.result = {"rev": rev}
                    op.result.update({"succeeded": True} if op.kind == "cas" else
                                     {"deleted": 1} if op.kind == "delete" else {})
        free_at[p] = complete if op.complete is not None else lin + 5.0
        hist.ops.append(op)
    end = max(free_at) + 1
    for j, (key, cur) in enumerate(sorted(state.items())):
        hist.ops.append(Op(id=n_ops + j, process=f"{tenant}/final", tenant=tenant, iface=iface,
                           kind="read", key=key, invoke=end + j, complete=end + j + 0.1,
                           outcome="ok", result={
                               **({"header": rev} if iface == "etcd" else {}),
                               **({"found": True, "value": cur[0], "rev": cur[1]} if cur
                                  else {"found": False})}))
    hist.watches.append(Watch(name=f"{tenant}/{iface}-watch", tenant=tenant, iface=iface,
                              prefix=f"/{tenant}/" if iface == "etcd" else "registers",
                              start_rev=100,
                              events=events, end_rev=rev, reached_end=True))
    return hist


def _lin_reads(hist: History) -> list[Op]:
    return [o for o in hist.ops if o.kind == "read" and o.consistency == "l"
            and o.outcome == "ok" and o.result.get("found")]


def _before(a: Op, b: Op) -> bool:
    return a.complete is not None and a.complete < b.invoke


def mutate(rng: random.Random, hist: History, kind: str) -> Op | None:
    """Change one operation of ``hist`` (in place) so that it is no longer linearizable;
    the operation changed, or None when the history has no place for this mutation."""
    ops = hist.ops
    acked = [o for o in ops if o.acknowledged and o.kind != "delete"
             and o.result.get("rev") is not None]
    by_key: dict[str, list[Op]] = {}
    for o in acked:
        by_key.setdefault(o.key, []).append(o)
    if kind == "unwritten-value":
        reads = _lin_reads(hist)
        if not reads:
            return None
        r = rng.choice(reads)
        r.result = {"found": True, "value": "chaos-never-written", "rev": r.result.get("rev")}
        return r
    if kind == "stale-read":
        for r in rng.sample(_lin_reads(hist), len(_lin_reads(hist))):
            writes = by_key.get(r.key, [])
            pairs = [(w, w2) for w in writes for w2 in writes
                     if _before(w, w2) and _before(w2, r) and w.value != r.result.get("value")]
            if pairs:
                w, _ = rng.choice(pairs)
                r.result = {"found": True, "value": w.value, "rev": w.result["rev"]}
                return r
        return None
    if kind == "cas-old-revision":
        cas = [o for o in acked if o.kind == "cas"]
        for c in rng.sample(cas, len(cas)):
            writes = by_key.get(c.key, [])
            pairs = [(w, w2) for w in writes for w2 in writes
                     if _before(w, w2) and _before(w2, c)]
            if pairs:
                w, _ = rng.choice(pairs)
                c.expected = w.result["rev"]
                return c
        return None
    if kind == "header-backwards":
        # A read served below the revision of a write answered before it was invoked: only
        # the global revision order (revisions.py) sees it, the key's own search does not.
        reads = [o for o in ops if o.kind == "read" and o.consistency == "l"
                 and o.iface == "etcd" and o.outcome == "ok" and o.result.get("header")]
        for r in rng.sample(reads, len(reads)):
            before = [o.result["rev"] for o in acked if _before(o, r) and o.key != r.key]
            if before and max(before) > 1:
                r.result["header"] = max(before) - 1
                return r
        return None
    if kind == "lost-update":
        cas = [o for o in acked if o.kind == "cas"]
        # Two compare-and-swaps from the same revision (not 0: absence recurs after a delete).
        pairs = [(a, b) for a in cas for b in cas
                 if a.key == b.key and _before(a, b) and a.expected]
        if not pairs:
            return None
        a, b = rng.choice(pairs)
        b.expected = a.expected
        return b
    raise ValueError(kind)


def drop_watch_event(rng: random.Random, hist: History) -> WatchEvent | None:
    """Remove one event of an acknowledged write from the first watch (a watch gap)."""
    w = hist.watches[0]
    acked = {(o.key, o.result.get("rev")) for o in hist.ops if o.acknowledged}
    cands = [e for e in w.events if (e.key, e.rev) in acked]
    if not cands:
        return None
    e = rng.choice(cands)
    w.events.remove(e)
    return e


def mutate_watch(rng: random.Random, hist: History, kind: str) -> WatchEvent | None:
    """Break the first watch as ``kind`` (one of WATCH_MUTATIONS) names: the event changed,
    or None when the watch has none to change."""
    if kind == "watch-gap":
        return drop_watch_event(rng, hist)
    w = hist.watches[0]
    if not w.events:
        return None
    i = rng.randrange(len(w.events))
    if kind == "watch-duplicate":
        w.events.insert(i + 1, w.events[i])
    elif kind == "watch-order":
        pairs = [j for j in range(len(w.events) - 1) if w.events[j].rev < w.events[j + 1].rev]
        if not pairs:
            return None
        i = rng.choice(pairs)
        w.events[i], w.events[i + 1] = w.events[i + 1], w.events[i]
    elif kind == "watch-stalled":
        w.reached_end = False
    else:
        raise ValueError(kind)
    return w.events[i]


@dataclass
class SelfTest:
    histories: int
    passed: int
    mutations: int
    caught: int
    ops: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.passed == self.histories and self.caught == self.mutations

    def to_json(self) -> dict[str, Any]:
        return {"histories": self.histories, "passed": self.passed, "mutations": self.mutations,
                "caught": self.caught, "ops": self.ops, "seconds": round(self.seconds, 3),
                "ok": self.ok}


def run(seed: int = 1, histories: int = 8, n_ops: int = 400) -> SelfTest:
    """Random histories (must pass), each with one mutation of every kind (must fail)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    st = SelfTest(0, 0, 0, 0, 0, 0.0)
    for _ in range(histories):
        h = generate(rng, n_ops)
        st.histories += 1
        st.ops += len(h.ops)
        st.passed += not checker.check(h).anomalies
        data = h.to_json()
        for kind in (*MUTATIONS, *WATCH_MUTATIONS):
            m = History.from_json(data)
            changed = (mutate_watch(rng, m, kind) if kind in WATCH_MUTATIONS
                       else mutate(rng, m, kind))
            if changed is None:
                continue
            st.mutations += 1
            found = {a.type for a in checker.check(m).anomalies}
            st.caught += bool(found) and (kind not in WATCH_MUTATIONS or kind in found)
    st.seconds = time.monotonic() - t0
    return st
