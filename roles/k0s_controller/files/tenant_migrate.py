#!/usr/bin/env python3
"""tenant_migrate.py: one tenant's prefix moved from one etcd cluster to another while the
tenant's API servers keep serving, its writes frozen only for the last changes (issue 40's
engine; `scripts/sandbox migrate` and playbooks/tenant-migrate.yml run it).

Run on a node that holds the tenant's client certificate of both clusters, with the nodes'
python3 and Debian's python3-etcd3 (etcd's generated v3 stubs over grpc; the chaos agent uses
the same). Three steps, each a run of this script; sync and final resumable:

  sync   copy the prefix at one revision R of the source (paged reads, all at R) into the
         empty prefix of the target, then apply every later change of the source's prefix
         (its watch from the revision applied last) in revision order, until a fence written
         to the source under the prefix comes back through the watch: everything before the
         fence is on the target. Run while the tenant serves, as often as wanted: each run
         starts where the last one stopped (the target's in-progress marker says where).
         Before its first write to the target, the room check: the copy and the revision
         raise must fit in 90 % of the target's quota.
  final  the same catch-up once the caller has stopped the tenant's API servers (the freeze),
         then the marker removed and final's receipt put, in one transaction: the target's
         prefix is the tenant's. With ``resume`` (the command's rerun of an interrupted move),
         a receipt of this source makes sync and final do nothing: the move's final step ran
         and the tenant's API servers may already write there.
  abort  an unfinished move dropped: this migration's copy removed from the target (its
         marker says it is this migration's), refused once final's receipt is there.

Changes the source compacted before a run read them (kube-apiserver compacts every 5
minutes: a resumed move often finds them gone): the copy is made afresh over this migration's
own, then the catch-up from it.

Order and atomicity: etcd's watch never splits the events of one revision over two
responses (etcd API guarantees, Watch APIs, "Atomic": "a list of events is guaranteed to
encompass complete revisions"; server/mvcc/watcher_group.go eventBatch.add cuts batches only
between revisions). Each target transaction holds whole source revisions, in order, merged per
key (etcd refuses a key twice in one transaction), and puts the marker with the last source
revision it holds, guarded by the marker's own mod revision: two runs at once, or a writer of
the marker, make the transaction fail instead of interleaving.

Revisions: a client of the tenant has seen resourceVersions up to the source's revision. The
target's revision is raised (puts of a key of the protocol, many in flight) above the source revision
of every change before that change is written there, and above the fence's revision before
the marker goes. So every object's resourceVersion on the target is higher than any the
client saw for it and every list's is higher than any it saw at all: a watch resumed from an
old version gets 410 from the API server's watch cache and relists, as after a restore. The
raise costs one put per revision: refused over ``max_bump`` with the figure.

Keys of the protocol, under the prefix (kube-apiserver reads only <prefix><resource>/... and
never sees them): ``<prefix>k0sbox-migrate-in-progress`` on the target (JSON: source, copy
revision, the source revision applied last, phase), ``<prefix>k0sbox-migrate-bump`` on the
target (the revision raise's writes), ``<prefix>k0sbox-migrate-fence`` on the source (a
counter), ``<prefix>k0sbox-migrate-done`` on the target (final's receipt: source, fence
revision, time; the command's cleanup removes it); none copied, marker and bump removed by
``final``. Each source lease of the keys moved gets a lease on the
target with the time the source lease has left (LeaseTimeToLive): a key expires on the target
when it would have on the source (kube-apiserver's leases: events after an hour, its endpoint
leases after seconds); ``lease_ttl`` where the source no longer knows the lease (the keys
then go with their delete events). The tenant's API servers make their own leases once they
run on the target.

Input: one JSON object on standard input (source, target: {endpoints, cacert, cert, key};
prefix; step; force: replace keys already under the target's prefix; restart: copy afresh
over this migration's own copy; resume: an interrupted move run again (final's receipt counts);
target_quota_bytes, target_db_size: the target members' backend quota and largest backend file
(etcdctl endpoint status as root: etcd 3.5.28+ denies a tenant the member's status; without
it the engine asks etcd), for the room check before the copy;
max_bump; lease_ttl; timeout). Output: one JSON object (figures) on
standard output; exit 1 with {"error": one line saying what to do} on failure.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MARKER = b"k0sbox-migrate-in-progress"
FENCE = b"k0sbox-migrate-fence"
BUMP = b"k0sbox-migrate-bump"     # the revision raise writes this key on the target
DONE = b"k0sbox-migrate-done"     # final's receipt on the target (the CLI's cleanup removes it)
RESTORE_MARKER = b"k0sbox-restore-in-progress"
MAX_TXN_OPS = 128          # etcd's --max-txn-ops default
MAX_TXN_BYTES = 1 << 20    # below etcd's --max-request-bytes default (1.5 MiB)
PAGE = 1000
# The target's room (issue 40's guard "enough quota"): a key costs about its key and value
# plus this much in the target's bbolt file (its revision key, the KeyValue's other fields,
# bbolt's element header); the move may fill the target to ROOM of its quota at most, the rest
# left to its own tenants. etcd's default quota when the target's members set none.
PER_KEY = 64
ROOM = 0.9
DEFAULT_QUOTA = 2 << 30
IN_FLIGHT = 64             # the revision raise: puts in flight on the target's channel


# One source revision's changes of the prefix: (revision, [(kind "put"/"del", key, value, lease)]).
Change = tuple[str, bytes, bytes, int]
Revision = tuple[int, list[Change]]


class MigrateError(Exception):
    """What went wrong, in one line that says what to do."""


class Denied(MigrateError):
    """etcd refused the tenant's certificate on one side (no user for it there)."""

    def __init__(self, side: str, text: str) -> None:
        super().__init__(text)
        self.side = side


class Compacted(MigrateError):
    """The source compacted changes of the prefix this migration had not read yet."""


# -- plain functions ---------------------------------------------------------------------------


def range_end(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix`` (etcd's GetPrefixRangeEnd; the
    same as sandbox_etcd_prefix's, which this file, run alone on a node, cannot import: a test
    holds the two equal)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


def own_keys(prefix: bytes) -> set[bytes]:
    """The protocol's keys under the prefix: never copied, never applied."""
    return {prefix + MARKER, prefix + FENCE, prefix + BUMP, prefix + DONE}


def merge(revisions: list[Revision]) -> dict[bytes, tuple[str, bytes, int]]:
    """Whole source revisions (revision, [(kind, key, value, lease)]) in order, as one set of
    operations: the last operation per key wins (the transaction holding them is atomic, so
    no reader sees the ones it replaced)."""
    out: dict[bytes, tuple[str, bytes, int]] = {}
    for _rev, events in revisions:
        for kind, key, value, lease in events:
            out.pop(key, None)          # keep the order of the last write
            out[key] = (kind, value, lease)
    return out


def chunks(revisions: list[Revision], max_ops: int, max_bytes: int) -> Iterator[list[Revision]]:
    """The revisions in groups of whole revisions, each group's merged operations within
    ``max_ops`` and ``max_bytes`` (a single revision larger than that is one group: etcd took
    it in one transaction, so the target can too)."""
    group: list[Revision] = []
    keys: set[bytes] = set()
    size = 0
    for rev, events in revisions:
        new = {e[1] for e in events} - keys
        grow = sum(len(e[1]) + len(e[2]) for e in events)
        if group and (len(keys) + len(new) > max_ops or size + grow > max_bytes):
            yield group
            group, keys, size = [], set(), 0
            new = {e[1] for e in events}
        group.append((rev, events))
        keys |= new
        size += grow
    if group:
        yield group


# -- etcd over grpc ------------------------------------------------------------------------------


class Side:
    """One cluster: a kept grpc channel to its first endpoint that answers, the tenant's TLS
    identity (under etcd RBAC etcd takes the user from the certificate's CN)."""

    def __init__(self, name: str, conn: dict[str, Any], prefix: bytes, timeout: float) -> None:
        import grpc  # type: ignore[import-untyped]
        from etcd3 import etcdrpc  # type: ignore[import-not-found]
        from etcd3.etcdrpc import rpc_pb2_grpc  # type: ignore[import-not-found]
        self.name, self.rpc, self.timeout, self.prefix = name, etcdrpc, timeout, prefix
        why = []
        for url in conn["endpoints"]:
            u = urlsplit(url)
            target = f"{u.hostname}:{u.port or 2379}"
            if conn.get("cacert"):
                creds = grpc.ssl_channel_credentials(
                    *(Path(conn[f]).read_bytes() if conn.get(f) else None for f in ("cacert", "key", "cert")))
                channel = grpc.secure_channel(target, creds)
            else:
                channel = grpc.insecure_channel(target)
            self.kv = rpc_pb2_grpc.KVStub(channel)
            self.watch_stub = rpc_pb2_grpc.WatchStub(channel)
            self.lease_stub = rpc_pb2_grpc.LeaseStub(channel)
            self.maintenance = rpc_pb2_grpc.MaintenanceStub(channel)
            try:
                self.cluster_id = self.header().cluster_id
                self.channel = channel
                return
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                    channel.close()
                    raise Denied(
                        name,
                        f"{name}: etcd at {url} denied a read of {prefix.decode(errors='replace')} "
                        f"({exc.code().name}: {exc.details()}): give the client certificate of the "
                        "tenant that owns the prefix (etcd RBAC: its CN is the user)") from None
                why.append(f"{url}: {exc.code().name} {exc.details()}")
                channel.close()
        raise MigrateError(f"{name}: no endpoint answered ({'; '.join(why)})")

    def range(self, key: bytes, end: bytes, revision: int = 0, limit: int = 0,
              count_only: bool = False) -> Any:
        return self.kv.Range(self.rpc.RangeRequest(key=key, range_end=end, revision=revision,
                                                   limit=limit, count_only=count_only),
                             timeout=self.timeout)

    def header(self) -> Any:
        """A response header (cluster ID, revision), read where the tenant may read: under
        etcd RBAC a read of the whole keyspace is denied to it."""
        return self.range(self.prefix, range_end(self.prefix), count_only=True).header

    def revision(self) -> int:
        return int(self.header().revision)

    def db_size(self) -> int | None:
        """The member's backend file size in bytes (Maintenance.Status), None where etcd
        denies it: 3.5.28 made the Maintenance RPCs root-only under auth (GHSA-q8m4-xhhv-38mg;
        Debian's 3.5.30 refuses a tenant's certificate)."""
        import grpc
        try:
            return int(self.maintenance.Status(self.rpc.StatusRequest(), timeout=self.timeout).dbSize)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                return None
            raise

    def get(self, key: bytes) -> Any:
        kvs = self.range(key, b"").kvs
        return kvs[0] if kvs else None

    def read(self) -> tuple[int, list[Any]]:
        """Every key under the prefix at one revision (the first page's)."""
        end, start, out, revision = range_end(self.prefix), self.prefix, [], 0
        while True:
            resp = self.range(start, end, revision=revision, limit=PAGE)
            revision = revision or int(resp.header.revision)
            out += list(resp.kvs)
            if not resp.more:
                return revision, out
            start = resp.kvs[-1].key + b"\x00"

    def txn(self, compare: list[Any], success: list[Any]) -> Any:
        return self.kv.Txn(self.rpc.TxnRequest(compare=compare, success=success),
                           timeout=self.timeout)

    def put_op(self, key: bytes, value: bytes, lease: int = 0) -> Any:
        return self.rpc.RequestOp(request_put=self.rpc.PutRequest(key=key, value=value, lease=lease))

    def del_op(self, key: bytes, end: bytes = b"") -> Any:
        return self.rpc.RequestOp(request_delete_range=self.rpc.DeleteRangeRequest(key=key, range_end=end))

    def mod_is(self, key: bytes, mod: int) -> Any:
        return self.rpc.Compare(result=self.rpc.Compare.EQUAL, target=self.rpc.Compare.MOD,
                                key=key, mod_revision=mod)

    def grant(self, ttl: int) -> int:
        return int(self.lease_stub.LeaseGrant(self.rpc.LeaseGrantRequest(TTL=ttl),
                                              timeout=self.timeout).ID)

    def watch(self, start: int) -> Any:
        """The prefix's events from revision ``start``: an iterator of watch responses (the
        call, which cancel() ends). The request stream stays open until then: a client that
        closes its side is a client that has gone."""
        import threading
        req = self.rpc.WatchRequest(create_request=self.rpc.WatchCreateRequest(
            key=self.prefix, range_end=range_end(self.prefix), start_revision=start))
        stop = threading.Event()

        def requests() -> Iterator[Any]:
            yield req
            stop.wait()

        call = self.watch_stub.Watch(requests())
        call.add_callback(stop.set)
        return call

    def close(self) -> None:
        self.channel.close()


# -- the migration ---------------------------------------------------------------------------------


class Migration:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.prefix = cfg["prefix"].encode()
        if not cfg["prefix"].startswith("/") or not cfg["prefix"].endswith("/"):
            raise MigrateError(f"prefix: '{cfg['prefix']}' is not a prefix as kube-apiserver uses "
                               "it (/<prefix>/); give the tenant's key_prefix")
        timeout = float(cfg.get("timeout", 30))
        self.src = Side("source", cfg["source"], self.prefix, timeout)
        self.dst = Side("target", cfg["target"], self.prefix, timeout)
        if self.src.cluster_id == self.dst.cluster_id:
            raise MigrateError(f"source and target are the same etcd cluster ({self.src.cluster_id:x}); "
                               "a tenant moves between two clusters")
        self.marker_key = self.prefix + MARKER
        self.fence_key = self.prefix + FENCE
        self.skip = own_keys(self.prefix)
        self.max_bump = int(cfg.get("max_bump", 10_000_000))
        self.lease_ttl = int(cfg.get("lease_ttl", 3600))
        self.leases: dict[int, int] = {}    # source lease ID -> target lease ID
        self.marker_mod = 0        # the marker's mod revision on the target, as last written
        self.target_rev = 0        # the target's revision, as last seen
        self.meta: dict[str, Any] = {}   # the marker's phase, copy revision, start
        self.applied = 0           # the source revision applied last, as the marker says
        self.figures: dict[str, Any] = {"copied": 0, "applied_revisions": 0, "applied_ops": 0,
                                        "transactions": 0, "bumped": 0}

    # the marker ------------------------------------------------------------------------------

    def marker(self) -> dict[str, Any]:
        """The marker on the target ({} when there is none), which must be of this source;
        its mod revision kept for the next guard."""
        kv = self.dst.get(self.marker_key)
        if kv is None:
            return {}
        self.marker_mod = int(kv.mod_revision)
        try:
            found = json.loads(kv.value)
        except ValueError:
            found = {}
        if not isinstance(found, dict) or found.get("source_cluster_id") != f"{self.src.cluster_id:x}":
            raise MigrateError(f"target: {self.marker_key.decode()} is there but not of a migration "
                               f"from this source ({kv.value[:120]!r}); remove it or migrate from the "
                               "cluster it names")
        return found

    def guarded(self, ops: list[Any]) -> int:
        """One target transaction of ``ops``, guarded by the marker's mod revision as this run
        last wrote or read it (0: no marker yet); returns its revision."""
        resp = self.dst.txn([self.dst.mod_is(self.marker_key, self.marker_mod)], ops)
        if not resp.succeeded:
            raise MigrateError(f"target: {self.marker_key.decode()} changed under this run (another "
                               "migration of the tenant at once?); run it again when that one ended")
        self.target_rev = int(resp.header.revision)
        self.figures["transactions"] += 1
        return self.target_rev

    def commit(self, ops: list[Any], applied: int) -> None:
        """``ops`` and the marker saying ``applied``, in one guarded transaction."""
        value = json.dumps({"source_cluster_id": f"{self.src.cluster_id:x}", "prefix": self.cfg["prefix"],
                            **self.meta, "applied": applied}, sort_keys=True).encode()
        self.marker_mod = self.guarded([*ops, self.dst.put_op(self.marker_key, value)])
        self.applied = applied

    # the revision raise ----------------------------------------------------------------------

    def raise_above(self, revision: int) -> None:
        """The target's revision above ``revision``: puts of a key of its own under the prefix
        (``<prefix>k0sbox-migrate-bump``), IN_FLIGHT at a time. Not the marker: its guard must
        still see a write that is not this run's."""
        self.target_rev = max(self.target_rev, self.dst.revision())
        need = revision - self.target_rev + 1
        if need <= 0:
            return
        if need > self.max_bump:
            raise MigrateError(
                f"the target's revision ({self.target_rev}) is {need} below the source's "
                f"({revision}); raising it costs one write per revision, more than max_bump "
                f"({self.max_bump}). Give a larger max_bump, or a target made from the source's "
                "snapshot with etcdutl --bump-revision")
        put = self.dst.rpc.PutRequest(key=self.prefix + BUMP, value=b"")
        pending: list[Any] = []
        for _put in range(need):
            pending.append(self.dst.kv.Put.future(put, timeout=self.dst.timeout))
            if len(pending) >= IN_FLIGHT:
                pending.pop(0).result()
        for f in pending:
            f.result()
        self.figures["bumped"] += need
        self.target_rev = self.dst.revision()

    # copy ------------------------------------------------------------------------------------

    def copy(self) -> None:
        """The source's prefix at one revision into the target's; the marker then says that
        revision is applied."""
        rev, kvs = self.src.read()
        if any(kv.key == self.prefix + RESTORE_MARKER for kv in kvs):
            raise MigrateError(f"source: a restore into {self.cfg['prefix']} was interrupted (its "
                               "marker is there): finish it (restore --tenant) before moving the tenant")
        kvs = [kv for kv in kvs if kv.key not in self.skip]
        there = [kv for kv in self.dst.read()[1] if kv.key not in self.skip]
        self.check_room(rev, kvs)
        if there and not self.marker_mod and not self.cfg.get("force"):
            raise MigrateError(f"target: {len(there)} key(s) under {self.cfg['prefix']} already "
                               f"(first {there[0].key[:80]!r}); the tenant's prefix must be empty "
                               "there, or force to replace them")
        if there or self.marker_mod:
            # what force replaces, or a copy cut short: gone first, marker and all (etcd takes
            # no put inside a range deleted in the same transaction)
            self.guarded([self.dst.del_op(self.prefix, range_end(self.prefix))])
            self.marker_mod = 0
            self.figures["replaced"] = len(there)
        self.meta = {"phase": "copy", "copy_revision": rev,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # every copied key gets a target revision above the source's at the copy
        self.raise_above(rev)
        batch: list[Any] = []
        size = 0
        for kv in kvs:
            if len(batch) >= MAX_TXN_OPS - 1 or size + len(kv.key) + len(kv.value) > MAX_TXN_BYTES:
                self.commit(batch, 0)
                batch, size = [], 0
            batch.append(self.dst.put_op(kv.key, kv.value, self.target_lease(int(kv.lease))))
            size += len(kv.key) + len(kv.value)
        self.meta["phase"] = "follow"
        self.commit(batch, rev)
        self.figures["copied"] = len(kvs)
        self.figures["copy_revision"] = rev

    def check_room(self, rev: int, kvs: list[Any]) -> None:
        """Before the target's first write: the copy and the revision raise must fit in the
        target's quota with room left for its own tenants (a NOSPACE alarm would stop every
        tenant's writes there). The file's size is the member's whole file, free pages
        included (Debian's etcd3 stubs have no dbSizeInUse): the guard errs on the safe side."""
        quota = int(self.cfg.get("target_quota_bytes") or 0) or DEFAULT_QUOTA
        given = self.cfg.get("target_db_size")
        size = int(given) if given is not None else self.dst.db_size()
        keys = sum(len(kv.key) + len(kv.value) + PER_KEY for kv in kvs)
        bumps = max(0, rev - self.dst.revision()) * (len(self.prefix + BUMP) + PER_KEY)
        self.figures["target_room"] = {"db_size": size, "quota": quota, "copy_bytes": keys,
                                       "raise_bytes": bumps}
        if size is None:
            # etcd denies the tenant the member's status and the caller gave none: the
            # caller's sync checked (the playbook reads the size as root for it); a copy in
            # the freeze (after a compaction) goes on rather than leave the tenant stopped
            if self.cfg.get("step") != "final":
                raise MigrateError("target: etcd denies this certificate the member's status "
                                   "(root only since etcd 3.5.28): give target_db_size (the "
                                   "largest member's dbSize, etcdctl endpoint status as root)")
            self.figures["target_room"]["checked"] = False
            return
        if size + keys + bumps > quota * ROOM:
            mib = 1 << 20
            raise MigrateError(
                f"target: not enough room: its backend file is {size / mib:.1f} MiB of a "
                f"{quota / mib:.0f} MiB quota; the copy needs about {keys / mib:.1f} MiB and the "
                f"revision raise {bumps / mib:.1f} MiB, over {ROOM:.0%} of the quota (its own "
                "tenants keep the rest). Defragment the target, or raise its members' "
                "etcd_quota_backend_bytes and up, then migrate again. Nothing was written to it")

    def target_lease(self, source: int) -> int:
        """The target's lease for source lease ``source`` (0: none), granted on first use
        with the time the source lease has left."""
        if not source:
            return 0
        if source not in self.leases:
            import grpc
            try:
                left = int(self.src.lease_stub.LeaseTimeToLive(
                    self.src.rpc.LeaseTimeToLiveRequest(ID=source), timeout=self.src.timeout).TTL)
            except grpc.RpcError as exc:   # expired meanwhile: its keys' delete events follow
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                left = -1
            self.leases[source] = self.dst.grant(left if left > 0 else self.lease_ttl)
            self.figures["leases"] = len(self.leases)
        return self.leases[source]

    # catch-up --------------------------------------------------------------------------------

    def fence(self) -> int:
        """A write to the source under the prefix: its revision is at or above every change
        of the prefix made before it; when its event comes back, all of those have come."""
        kv = self.src.get(self.fence_key)
        n = int(kv.value) + 1 if kv is not None and kv.value.isdigit() else 1
        resp = self.src.kv.Put(self.src.rpc.PutRequest(key=self.fence_key, value=str(n).encode()),
                               timeout=self.src.timeout)
        return int(resp.header.revision)

    def catch_up(self) -> int:
        """Every change of the source's prefix after the revision applied last, up to a
        fence, applied in revision order, whole revisions per transaction; returns the
        fence's revision."""
        fence = self.fence()
        applied = self.applied
        call = self.src.watch(applied + 1)
        pending: list[Revision] = []
        try:
            for resp in call:
                if resp.compact_revision:
                    raise Compacted(
                        f"source: the changes after revision {applied} were compacted away "
                        f"(compacted to {resp.compact_revision}) before this run read them; "
                        "run it again (it copies the prefix afresh)")
                if resp.canceled:
                    raise MigrateError(f"source: the watch was canceled: {resp.cancel_reason}")
                done = False
                for rev, events in self.revisions(resp.events):
                    done = done or rev >= fence
                    events = [e for e in events if e[1] not in self.skip]
                    if events:
                        pending.append((rev, events))
                    applied = rev
                if done or len(pending) >= MAX_TXN_OPS:
                    self.apply(pending, applied)
                    pending = []
                if done:
                    return fence
        finally:
            call.cancel()
        raise MigrateError("source: the watch ended before the fence came back; run it again")

    @staticmethod
    def revisions(events: Any) -> Iterator[Revision]:
        """A watch response's events as (revision, [(kind, key, value, lease)]) in order."""
        rev, group = 0, []   # type: tuple[int, list[Change]]
        for e in events:
            r = int(e.kv.mod_revision)
            if group and r != rev:
                yield rev, group
                group = []
            rev = r
            group.append(("del" if e.type == 1 else "put", e.kv.key, e.kv.value, int(e.kv.lease)))
        if group:
            yield rev, group

    def apply(self, pending: list[Revision], applied: int) -> None:
        """The pending revisions on the target, each transaction whole revisions, the
        target's revision first raised above the newest of them; the marker says ``applied``
        after the last one (the revisions without a change of the prefix count too)."""
        groups = list(chunks(pending, MAX_TXN_OPS - 1, MAX_TXN_BYTES))
        for i, group in enumerate(groups):
            self.raise_above(group[-1][0])
            ops = [self.dst.del_op(key) if kind == "del"
                   else self.dst.put_op(key, value, self.target_lease(lease))
                   for key, (kind, value, lease) in merge(group).items()]
            self.commit(ops, applied if i == len(groups) - 1 else group[-1][0])
            self.figures["applied_revisions"] += len(group)
            self.figures["applied_ops"] += len(ops)
        if not groups:
            self.commit([], applied)

    # the steps -------------------------------------------------------------------------------

    def receipt(self) -> dict[str, Any]:
        """final's receipt on the target, when it is of this source ({} otherwise)."""
        kv = self.dst.get(self.prefix + DONE)
        try:
            found = json.loads(kv.value) if kv is not None else {}
        except ValueError:
            found = {}
        ours = isinstance(found, dict) and found.get("source_cluster_id") == f"{self.src.cluster_id:x}"
        return found if ours else {}

    def run(self, step: str) -> dict[str, Any]:
        t0 = time.monotonic()
        if step == "abort":
            return self.abort(t0)
        done = self.receipt() if self.cfg.get("resume") and not self.cfg.get("force") else {}
        if done:
            # an interrupted move's final step ran (the receipt): the target's prefix is the
            # tenant's, its API servers may already write it; a copy again would undo that
            return {**self.figures, "step": step, "done_already": done,
                    "fence_revision": done.get("fence_revision"), "seconds": 0.0,
                    "target_revision": self.dst.revision(), "applied": done.get("applied"),
                    "source_cluster_id": f"{self.src.cluster_id:x}",
                    "target_cluster_id": f"{self.dst.cluster_id:x}"}
        found = self.marker()
        if found.get("phase") == "follow" and not self.cfg.get("restart"):
            self.applied = int(found["applied"])
            self.meta = {k: found[k] for k in ("phase", "copy_revision", "started") if k in found}
            self.figures["resumed_from"] = self.applied
        else:   # none yet, a copy cut short or restart: the copy (again) from the start,
            # over this migration's own keys (the marker says they are)
            self.copy()
        try:
            fence = self.catch_up()
        except Compacted:
            # kube-apiserver compacts every 5 minutes: the changes not read yet are gone from
            # the source; the copy afresh over this migration's own (the marker says it is
            # ours), then the catch-up from it. In the freeze too: longer, but the tenant
            # is not left stopped.
            self.figures["copied_again_after_compaction"] = True
            self.copy()
            fence = self.catch_up()
        if step == "final":
            # no client of the tenant has seen a revision above the fence's (its API servers
            # are stopped): the target above it, then the marker gone and the receipt there,
            # in one more write
            self.raise_above(fence)
            receipt = json.dumps({"source_cluster_id": f"{self.src.cluster_id:x}",
                                  "prefix": self.cfg["prefix"], "fence_revision": fence,
                                  "applied": self.applied,
                                  "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                 sort_keys=True).encode()
            self.guarded([self.dst.del_op(self.marker_key), self.dst.del_op(self.prefix + BUMP),
                          self.dst.put_op(self.prefix + DONE, receipt)])
        return {**self.figures, "step": step, "fence_revision": fence,
                "target_revision": self.target_rev, "applied": self.applied,
                "seconds": round(time.monotonic() - t0, 3),
                "source_cluster_id": f"{self.src.cluster_id:x}",
                "target_cluster_id": f"{self.dst.cluster_id:x}"}

    def abort(self, t0: float) -> dict[str, Any]:
        """An unfinished move dropped: this migration's copy removed from the target (only
        when the marker says it is ours: keys there without it are somebody else's). Refused
        once final ran (its receipt): the tenant's API servers may have written there."""
        if done := self.receipt():
            raise MigrateError(
                f"target: the move's final step ran ({done.get('finished', '?')}, "
                f"{(self.prefix + DONE).decode()}): the tenant's current keys are there and its "
                "API servers may have written them; finish the move instead")
        self.marker()
        removed = 0
        if self.marker_mod:
            removed = len([kv for kv in self.dst.read()[1] if kv.key not in self.skip])
            self.guarded([self.dst.del_op(self.prefix, range_end(self.prefix))])
        return {"step": "abort", "removed": removed, "had_copy": bool(self.marker_mod),
                "seconds": round(time.monotonic() - t0, 3),
                "source_cluster_id": f"{self.src.cluster_id:x}",
                "target_cluster_id": f"{self.dst.cluster_id:x}"}


def main() -> int:
    try:
        cfg = json.load(sys.stdin)
        step = cfg.get("step", "sync")
        if step not in ("sync", "final", "abort"):
            raise MigrateError(f"step: '{step}' is not one of sync, final, abort")
        try:
            m = Migration(cfg)
        except Denied as exc:
            if step != "abort" or exc.side != "target":
                raise
            # no user of the tenant on the target (a move cut short before its etcd RBAC
            # step there ended): the copy, which needs that user, never began
            print(json.dumps({"step": "abort", "removed": 0, "had_copy": False,
                              "target_denied": str(exc)}, sort_keys=True))
            return 0
        try:
            out = m.run(step)
        finally:
            m.src.close()
            m.dst.close()
    except MigrateError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    except ImportError as exc:
        print(json.dumps({"error": f"{exc}: this needs python3-etcd3 (apt-get install python3-etcd3)"}))
        return 1
    except Exception as exc:   # grpc's errors: the call and what etcd said, one line
        code = getattr(exc, "code", None)
        if code is None or not callable(code):
            raise
        print(json.dumps({"error": f"etcd: {code().name}: {exc.details()}"}))  # type: ignore[attr-defined]
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
