"""The history of a chaos run: every client operation (invoked, then ok / fail / unknown, with
both times), every watch's events, every fault with its window.

One shape for both interfaces. An etcd client's put/get/txn/del and an API client's
create/get/update/delete map onto the five kinds of the register model (checker.py):

========  ===========================================  ====================================
kind      etcd (etcdctl, the tenant's certificate)      Kubernetes API (a custom resource)
========  ===========================================  ====================================
read      get (``consistency`` l: linearizable,         GET (no resourceVersion: from etcd)
          s: serializable, checked apart)
put       put                                           -
cas       txn: if mod_revision == expected then put     PUT with metadata.resourceVersion
          else get                                      (409 Conflict: a definite failure)
create    txn: if mod_revision == 0 then put            POST (409 AlreadyExists: definite)
delete    del                                           DELETE
========  ===========================================  ====================================

``outcome``: ``ok`` (the server answered; ``result`` says what, e.g. a failed compare), ``fail``
(certainly without effect: refused before it was applied) or ``unknown`` (a timeout, a broken
connection: it may or may not have taken effect, and the checker allows both).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("read", "put", "cas", "create", "delete")
OUTCOMES = ("ok", "fail", "unknown")
WRITES = ("put", "cas", "create", "delete")


@dataclass
class Op:
    """One client operation. ``result`` of an ``ok`` op:

    - read: ``found`` (bool), ``value``, ``rev`` (the key's mod revision / resourceVersion)
    - put / create: ``rev`` (the new mod revision) -- create may answer ``exists: true`` instead
    - cas: ``succeeded`` (bool); succeeded: ``rev``; not: optionally ``found``/``value``/``rev``
      of what it saw instead
    - delete: ``deleted`` (0 or 1), ``rev`` when known
    """

    id: int
    process: str                  # the client, e.g. "tenant-a/etcd-0" (a row of the timeline)
    tenant: str
    iface: str                    # "etcd" or "api"
    kind: str                     # one of KINDS
    key: str                      # etcd key, or the custom resource's name
    invoke: float                 # seconds since the run's start
    complete: float | None        # None: never answered (unknown)
    outcome: str                  # one of OUTCOMES
    value: str | None = None      # what a write writes
    expected: int | None = None   # cas: the mod revision / resourceVersion it requires
    consistency: str = "l"        # reads: "l" linearizable, "s" serializable
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def is_write(self) -> bool:
        return self.kind in WRITES

    @property
    def acknowledged(self) -> bool:
        """A write the server acknowledged as applied."""
        if self.outcome != "ok" or not self.is_write:
            return False
        if self.kind == "cas":
            return bool(self.result.get("succeeded"))
        if self.kind == "create":
            return not self.result.get("exists")
        if self.kind == "delete":
            return int(self.result.get("deleted", 0)) > 0
        return True


@dataclass
class WatchEvent:
    key: str
    rev: int
    type: str                     # PUT / DELETE (etcd), ADDED / MODIFIED / DELETED (API)
    value: str | None
    t: float
    resp: int | None = None       # the watch response it came in (events of one share it)


@dataclass
class Watch:
    """A watch started at a known revision: its events, its restarts, and what etcd or the API
    server said it could not deliver (compaction / 410 Expired: a reported gap).

    A restart is ``{t, from, reason, after}``: the stream broke after ``after`` events (when
    recorded) and was resumed from revision ``from``. A progress notification is ``{rev, t,
    after}``: every event up to ``rev`` has been delivered, after ``after`` events."""

    name: str                     # e.g. "tenant-a/etcd-watch", "tenant-a/api-watch@k0s-a1"
    tenant: str
    iface: str
    prefix: str                   # etcd: the key prefix; api: the resource's path
    start_rev: int                # events with revisions above it are expected
    events: list[WatchEvent] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)
    reported_gaps: list[dict[str, Any]] = field(default_factory=list)   # [{from, to, why}]
    end_rev: int | None = None    # the last revision it must have delivered (the end marker)
    reached_end: bool = False
    end_reason: str = ""          # why no end marker revision is known, when none is


@dataclass
class Fault:
    name: str                     # e.g. "kill-leader"
    target: str                   # the node(s)
    start: float                  # the injection began
    healed: float | None = None   # healed (or None: could not be healed)
    end: float | None = None      # the cluster healthy again
    note: str = ""
    injected: float | None = None  # the injection had taken effect (its command returned)


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    watches: list[Watch] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def next_id(self) -> int:
        return len(self.ops)

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "ops": [asdict(o) for o in self.ops],
                "watches": [asdict(w) for w in self.watches],
                "faults": [asdict(f) for f in self.faults]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        watches = []
        for w in data.get("watches", []):
            w = dict(w)
            w["events"] = [WatchEvent(**e) for e in w.get("events", [])]
            watches.append(Watch(**w))
        return cls(ops=[Op(**o) for o in data.get("ops", [])], watches=watches,
                   faults=[Fault(**f) for f in data.get("faults", [])],
                   meta=dict(data.get("meta", {})))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_json(json.loads(path.read_text()))
