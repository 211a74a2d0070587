"""A linearizability checker for one key's history: Wing and Gong's search with Lowe's
just-in-time linearization and memoisation, against a register with revision-based
compare-and-swap. The project's own (no linearizability checker exists on PyPI).

**The model.** A key (an etcd key, or a custom resource through a tenant's API) is a register
whose state is ``(value, rev, floor)``: ``value`` (None: absent), ``rev`` the mod revision
(etcd) or resourceVersion (API) of that value -- None when it was written by an operation of
unknown outcome, whose revision nobody was told -- and ``floor`` the highest revision known
to have been assigned to a write of the key. Every write gets a revision above ``floor``
(etcd's revisions grow with every write; resourceVersions are those revisions). A read
returns the value with its revision; ``cas(expected)`` applies only when the current mod
revision (0 when absent, as etcd's ``mod("k") = "0"``) equals ``expected``; ``create`` only
when absent; ``delete`` answers how many it deleted. An unknown revision is fixed by the first
operation that observes it.

**The search.** Each operation becomes a call entry at its invocation and, when it was
answered, a return entry at its completion, in time order (a call before a return at equal
times: they overlap). Walking the entries, a call is linearized when the model accepts it in
the current state (it is lifted out of the list and the walk restarts); reaching a return
entry whose operation is not linearized yet means the current prefix cannot be extended, so
the last choice is undone (backtracking). A set of (linearized operations, state) seen before
is not explored again (memoisation): the search is exponential only in the operations that
overlap. An operation of unknown outcome has no return entry: it may be linearized anywhere
after its invocation, or never (it did not take effect). The history is linearizable when
every answered operation is linearized.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .history import Op

State = tuple[str | None, int | None, int]
INITIAL: State = (None, 0, 0)
# The value of a write of unknown outcome that no operation saw (see interchangeable).
HIDDEN = "\x00a value nobody saw"


def _match(s: State, value: str | None, rev: int | None) -> State | None:
    """The state after observing ``value`` (None: absent) with mod revision ``rev``
    (None: not told), or None when the state cannot show that."""
    cur, crev, floor = s
    if value is None:
        return s if cur is None else None
    if cur != value:
        return None
    if rev is None or crev == rev:
        return s
    if crev is None and rev > floor:      # the first observation of an unknown revision
        return (cur, rev, rev)
    return None


def _mod(s: State, expected: int) -> tuple[State, bool] | None:
    """Whether the current mod revision is ``expected``: (state, equal); an unknown revision
    equals ``expected`` when it can (it is then fixed to it) -- or differs, which is also
    possible, so the caller asks for the outcome it needs."""
    cur, crev, _ = s
    if cur is None:
        return s, expected == 0
    if crev is None:
        return None
    return s, crev == expected


def step(s: State, op: Op) -> State | None:
    """The state after ``op`` takes effect in state ``s`` with the result it reported, or
    None when that result is impossible there."""
    cur, crev, floor = s
    r = op.result
    unknown = op.outcome == "unknown"
    kind = op.kind
    if kind == "read":
        return _match(s, r.get("value") if r.get("found") else None, r.get("rev"))
    if kind == "put":
        if unknown:
            return (op.value, None, floor)
        rev = r.get("rev")
        if rev is None:
            return (op.value, None, floor)
        return (op.value, rev, rev) if rev > floor else None
    if kind == "create":
        if not unknown and r.get("exists"):
            return s if cur is not None else None
        if cur is not None:
            return None
        rev = None if unknown else r.get("rev")
        if rev is None:
            return (op.value, None, floor)
        return (op.value, rev, rev) if rev > floor else None
    if kind == "cas":
        expected = int(op.expected or 0)
        if unknown or r.get("succeeded"):
            if cur is not None and crev is None:
                if expected <= floor:
                    return None
                s = (cur, expected, expected)      # the unknown revision was this one
                floor = expected
            got = _mod(s, expected)
            if got is None or not got[1]:
                return None
            rev = None if unknown else r.get("rev")
            if rev is None:
                return (op.value, None, floor)
            return (op.value, rev, rev) if rev > floor else None
        # The compare failed: what it saw instead (etcd's else-branch get), if told.
        if "found" in r:
            seen = _match(s, r.get("value") if r.get("found") else None, r.get("rev"))
            if seen is None:
                return None
            s = seen
        got = _mod(s, expected)
        if got is None:                          # an unknown revision: it may differ
            return s
        return s if not got[1] else None
    if kind == "delete":
        if unknown or int(r.get("deleted", 0)) > 0:
            if cur is None:
                return None
            rev = None if unknown else r.get("rev")
            if rev is None:
                return (None, 0, floor)
            return (None, 0, rev) if rev > floor else None
        return s if cur is None else None
    raise ValueError(f"op {op.id}: unknown kind {kind!r}")


@dataclass
class Result:
    ok: bool | None          # None: gave up (budget), neither proved nor refuted
    states: int              # (linearized set, state) pairs explored
    seconds: float
    longest: int = 0         # most operations linearized at once (where it got stuck)


def checkable(ops: Sequence[Op]) -> list[Op]:
    """The operations the search takes: answered or unknown, never certain failures (no
    effect, nothing seen), unknown reads (nothing seen) or serializable reads (which may be
    stale by design; checker.py checks them apart)."""
    out = []
    for op in ops:
        if op.outcome == "fail":
            continue
        if op.kind == "read" and (op.outcome != "ok" or op.consistency == "s"):
            continue
        out.append(op)
    return out


def interchangeable(ops: Sequence[Op]) -> tuple[list[Op], list[tuple[str, int] | None]]:
    """The operations as the search sees them, and each one's class of interchangeable ones.

    Writes of unknown outcome whose value no operation saw (and deletes of unknown outcome)
    differ only in when they were invoked: each leaves the key holding a value nobody saw
    (HIDDEN, revision unknown) or absent. Once invoked they stay available to the end (no
    return entry), so at any point of the search the first one of a class that is available
    is as good as any other: trying the others again would only explore the same futures.
    That keeps the search from trying every subset of them -- exponential in their number --
    when it must prove that no order exists."""
    seen = {str(o.result.get("value")) for o in ops
            if o.outcome == "ok" and o.result.get("found")}
    out: list[Op] = []
    classes: list[tuple[str, int] | None] = []
    for op in ops:
        if op.outcome == "unknown" and (op.kind == "delete" or op.value not in seen):
            classes.append((op.kind, int(op.expected or 0)))
            out.append(op if op.kind == "delete" else dataclasses.replace(op, value=HIDDEN))
        else:
            classes.append(None)
            out.append(op)
    return out, classes


def check(ops: Sequence[Op], max_states: int = 2_000_000, max_seconds: float = 60.0,
          initial: State = INITIAL) -> Result:
    """Whether ``ops`` (one key's, see checkable) is linearizable from ``initial``."""
    t0 = time.monotonic()
    ops, eq = interchangeable(ops)
    n = len(ops)
    entries: list[tuple[float, int, int]] = []       # (time, 0 call / 1 return, op index)
    for i, op in enumerate(ops):
        entries.append((op.invoke, 0, i))
        if op.outcome == "ok":
            entries.append((op.complete if op.complete is not None else op.invoke, 1, i))
    entries.sort()
    m = len(entries)
    # A doubly linked list over the entries; index m is the head sentinel, -1 the end.
    head = m
    nxt = [i + 1 for i in range(m)] + [0 if m else -1]
    if m:
        nxt[m - 1] = -1
    prv = ([head] + list(range(m - 1)) if m else []) + [-1]
    is_call = [e[1] == 0 for e in entries]
    op_of = [e[2] for e in entries]
    ret_of = [-1] * n
    for idx, e in enumerate(entries):
        if e[1] == 1:
            ret_of[e[2]] = idx

    def unlink(idx: int) -> None:
        p, q = prv[idx], nxt[idx]
        nxt[p] = q
        if q != -1:
            prv[q] = p

    def relink(idx: int) -> None:
        p, q = prv[idx], nxt[idx]
        nxt[p] = idx
        if q != -1:
            prv[q] = idx

    remaining = sum(1 for op in ops if op.outcome == "ok")
    state = initial
    linearized = 0
    cache: set[tuple[int, State]] = set()
    stack: list[tuple[int, State, frozenset[tuple[str, int]]]] = []
    tried: frozenset[tuple[str, int]] = frozenset()   # classes tried in this walk
    entry = nxt[head]
    states = 0
    longest = 0
    while True:
        if remaining == 0:
            return Result(True, states, time.monotonic() - t0, n)
        if entry != -1 and is_call[entry]:
            i = op_of[entry]
            cls = eq[i]
            if cls is not None:
                if cls in tried:
                    entry = nxt[entry]
                    continue
                tried = tried | {cls}
            new = step(state, ops[i])
            if new is not None:
                key = (linearized | (1 << i), new)
                if key not in cache:
                    cache.add(key)
                    states += 1
                    if states > max_states or (states & 0xFFF == 0
                                               and time.monotonic() - t0 > max_seconds):
                        return Result(None, states, time.monotonic() - t0, longest)
                    stack.append((entry, state, tried))
                    tried = frozenset()
                    state = new
                    linearized |= 1 << i
                    unlink(entry)
                    if ret_of[i] != -1:
                        unlink(ret_of[i])
                        remaining -= 1
                    longest = max(longest, len(stack))
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
            continue
        # A return entry of an operation not linearized (or the end): undo the last choice.
        if not stack:
            return Result(False, states, time.monotonic() - t0, longest)
        entry, state, tried = stack.pop()
        i = op_of[entry]
        linearized &= ~(1 << i)
        if ret_of[i] != -1:
            relink(ret_of[i])
            remaining += 1
        relink(entry)
        entry = nxt[entry]
