"""Violations of one key that its revisions prove without a search (issue 39, item 1).

etcd gives every write of the cluster one revision, and a key's mod revision only grows
while the key exists (etcd's ``mvcc``: a put or a transaction's put sets it to the new
revision; a compare on ``mod_revision`` holds only if nothing wrote the key since). The
Kubernetes API's resourceVersion of an object is that mod revision. So, for the operations
the server acknowledged with their revision, three violations need no order to be searched:

- **read-of-unwritten-value**: a linearizable read returned a value that no operation wrote
  (a write that certainly failed does not count);
- **stale-read**: a linearizable read returned the key at mod revision R, after (in real
  time) a write of that key had been acknowledged at a revision above R: the read is served
  at a revision at least that write's, where the key's mod revision is at least it too or the
  key is gone;
- **cas-on-old-revision**: a compare-and-swap on mod revision E > 0 acknowledged at revision
  Rc, while another acknowledged write of the key took a revision between E and Rc: at Rc
  the key's mod revision was not E (two compare-and-swaps from one revision, a lost update,
  are this case too).

These are what the per-key search (linearizability.py) would have to refute by exhausting
every order, which on a busy key with many writes of unknown outcome exceeds its budget (a
history of 20,000 operations, 64 clients on 5 keys, 10 % unknown: "inconclusive" after 27-41
s for each of these violations). checker.py takes the witness when the search refutes it on
its own few operations, and then skips the key's search.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from .history import Op


@dataclass
class Witness:
    type: str
    message: str
    ops: list[Op]


def _rev(op: Op) -> int | None:
    rev = op.result.get("rev")
    return rev if isinstance(rev, int) else None


def find(ops: Sequence[Op]) -> Witness | None:
    """The first violation of one key's operations (all of one tenant, interface and key)
    that their revisions prove, with the operations that show it; None when there is none."""
    acked = [o for o in ops if o.acknowledged and _rev(o) is not None]
    by_rev = {_rev(o) or 0: o for o in acked}
    written = {o.value for o in ops if o.is_write and o.outcome != "fail" and o.value is not None}
    reads = sorted((o for o in ops if o.kind == "read" and o.outcome == "ok"
                    and o.consistency == "l" and o.result.get("found")), key=lambda o: o.invoke)

    for r in reads:
        value = r.result.get("value")
        if value not in written:
            return Witness("read-of-unwritten-value",
                           f"a linearizable read returned {value!r}, a value no operation wrote",
                           [r])

    # Acknowledged writes by completion time, with the highest revision acknowledged so far.
    done = sorted((o for o in acked if o.complete is not None), key=lambda o: o.complete or 0.0)
    ends = [o.complete or 0.0 for o in done]
    best: list[Op] = []
    for o in done:
        best.append(o if not best or (_rev(o) or 0) > (_rev(best[-1]) or 0) else best[-1])
    writers = {o.value: o for o in ops if o.is_write and o.outcome != "fail"}
    for r in reads:
        seen = _rev(r)
        i = bisect.bisect_left(ends, r.invoke)
        if seen is None or i == 0:
            continue
        w = best[i - 1]
        if (_rev(w) or 0) > seen:
            source = writers.get(r.result.get("value"))
            return Witness("stale-read",
                           f"a linearizable read returned mod revision {seen} after a write of "
                           f"this key had been acknowledged at revision {_rev(w)}",
                           [x for x in (source, w, r) if x is not None])

    revs = sorted(by_rev)
    for c in sorted((o for o in acked if o.kind == "cas"), key=lambda o: o.invoke):
        expected, rc = c.expected or 0, _rev(c) or 0
        if expected <= 0:
            continue
        i = bisect.bisect_right(revs, expected)
        if i < len(revs) and revs[i] < rc:
            w = by_rev[revs[i]]
            base = by_rev.get(expected)
            return Witness("cas-on-old-revision",
                           f"a compare-and-swap on mod revision {expected} was acknowledged at "
                           f"revision {rc}, yet another acknowledged write of this key took "
                           f"revision {revs[i]} between them",
                           [x for x in (base, w, c) if x is not None])
    return None
