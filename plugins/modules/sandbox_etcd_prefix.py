#!/usr/bin/python
# ruff: noqa: EXE001 -- an Ansible module: the shebang names its interpreter, the file is not executable
"""One tenant's data in etcd, with the tenant's own certificate: a consistent copy of its
prefix (a paged range read at ONE revision) and the prefix replaced by such a copy in
transactions (what the copy lacks deleted, what differs put, etcd's per-transaction limits
respected).

etcd has no selective snapshot, but a range read at a fixed revision is a consistent copy of
a prefix, and a tenant's certificate (read/write on its prefix only, etcd RBAC) is enough to
take it and to write it back. Written back, the keys get new, higher revisions: no other
tenant's key or revision moves.

Run where the tenant's certificate is (its controller: the endpoints and files of k0s.yaml),
through etcdctl; ``check`` needs no etcd and runs on the control node before anything stops.
Callers: roles/k0s_controller tasks tenant_backup.yml, tenant_restore_check.yml and
tenant_restore.yml (scripts/sandbox backup/restore --tenant). The logic is in plain functions below;
tests/test_sandbox_etcd_prefix.py runs them and the module on a real etcd.

The copy's format (docs/day2.md, "Tenant operations"): JSON lines; the first is the header
``{"format": FORMAT, "prefix", "revision", "cluster_id", "key_count", "bytes"}``, then one
line per key in key order ``{"key", "value" (base64 of the bytes as stored), "create_revision",
"mod_revision", "version", "lease"}``. A copy is read only whole and as a dump writes it
(:func:`parse_copy`): every key under the header's prefix, once, in order, none changed after
the header's revision, the counts the header's; ``check`` also holds the header against the
manifest beside it (docs/hostile-files.md).

A replace of more than one transaction is not atomic: its first transaction also writes the
key ``<prefix>k0sbox-restore-in-progress`` (what is restored, from which copy, how many
transactions of how many are committed; each later transaction updates it) and its last one
deletes it, atomically with the data. So the prefix is the old one (no marker), the new one
(no marker) or a mix that says so: ``usage`` returns the marker (``restore``; status and
verify report it with the command that finishes the job), ``dump`` refuses a mixed prefix,
and a replace run again finishes it. kube-apiserver reads only ``<prefix><resource>/...`` and
``<prefix>compact_rev_key``: it never sees the marker.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sandbox_etcd_prefix
author: k0s-etcd-sandbox project (!UNKNOWN)
short_description: A consistent copy of one etcd prefix, or the prefix replaced by one
description:
  - O(op=dump) reads every key under O(prefix) in pages of O(page) keys, all at the revision of
    the first page, and writes them to O(dest) (JSON lines, a header first), mode 0600.
  - O(op=replace) makes the keys under O(prefix) those of the copy O(src) (checked against
    O(sha256)); keys the copy lacks deleted, keys missing or different put, in transactions of
    at most O(max_txn_ops) operations and O(max_txn_bytes) bytes, each guarded by the mod
    revision of every key it touches as read before (a writer meanwhile makes it fail). Keys
    that had a lease get one new lease of O(lease_ttl) seconds. O(source_prefix) replaces the
    copy's prefix (a copy of one tenant written into another's prefix). A second run changes
    nothing.
  - O(op=usage) counts the keys under O(prefix) and their bytes (keys and values) at one revision.
  - O(op=check) reads the copy O(src) and its O(manifest) without etcd (on the control node, before
    anything stops) and fails unless the manifest is of O(tenant) and O(source_prefix) with the
    copy's sha256, the copy's header agrees with it (prefix, revision, cluster ID, keys, bytes),
    and every key of the copy lies under its prefix, so under O(prefix) once moved there.
options:
  op: {description: "The operation.", type: str, required: true, choices: [check, dump, replace, usage]}
  prefix: {description: "The prefix, as kube-apiserver uses it (C(/tenant-a/)).", type: str, required: true}
  etcdctl: {description: "etcdctl (looked up on PATH).", type: str, default: etcdctl}
  run_as: {description: "Argv run before etcdctl, e.g. C(setpriv --reuid=kube-apiserver --regid=0 --clear-groups).", type: list, elements: str, default: []}
  endpoints: {description: "Client URLs (required but for O(op=check)).", type: list, elements: str}
  cacert: {description: "CA file (TLS).", type: str, default: ""}
  cert: {description: "Client certificate (TLS), the tenant's.", type: str, default: ""}
  key: {description: "Client key (TLS).", type: str, default: ""}
  client:
    description:
      - The whole connection in one value (what roles/k0s_controller computes once from the
        tenant's k0s.yaml as C(_k0s_etcd_client)); each of its keys given replaces the option of
        the same name.
    type: dict
    suboptions:
      etcdctl: {description: "As O(etcdctl).", type: str}
      run_as: {description: "As O(run_as).", type: list, elements: str}
      endpoints: {description: "As O(endpoints).", type: list, elements: str}
      cacert: {description: "As O(cacert).", type: str}
      cert: {description: "As O(cert).", type: str}
      key: {description: "As O(key).", type: str}
  dest: {description: "dump, the file to write.", type: str}
  src: {description: "replace and check, the copy to write back.", type: str}
  sha256: {description: "replace, the copy's sha256 (its manifest's).", type: str, default: ""}
  source_prefix: {description: "replace, the copy's own prefix when it differs from O(prefix); check, the prefix of O(tenant).", type: str, default: ""}
  manifest: {description: "check, the copy's manifest (written beside it by the backup).", type: str}
  tenant: {description: "check, the tenant the copy must be of.", type: str}
  page: {description: "Keys per range read.", type: int, default: 500}
  max_txn_ops: {description: "Operations per transaction (etcd's --max-txn-ops, 128 by default).", type: int, default: 128}
  max_txn_bytes: {description: "Bytes of keys and values per transaction (below etcd's --max-request-bytes, 1.5 MiB by default).", type: int, default: 1048576}
  lease_ttl: {description: "replace, the TTL of the new lease for keys that had one (kube-apiserver's events).", type: int, default: 3600}
  restore_note:
    description: "replace, kept in the in-progress marker of a replace of several transactions
      (e.g. the tenant and the copy's path on the control node)."
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Count the keys and bytes under a tenant's prefix with its own certificate
  k0sbox.external_etcd.sandbox_etcd_prefix:
    op: usage
    prefix: /k0s-tenant/
    etcdctl: /usr/bin/etcdctl
    endpoints: [https://10.0.0.11:2379]
    cacert: /etc/k0s/etcd/ca.crt
    cert: /etc/k0s/etcd/client.crt
    key: /etc/k0s/etcd/client.key
  register: usage

- name: The same, with the connection in one value (as roles/k0s_controller passes it)
  k0sbox.external_etcd.sandbox_etcd_prefix:
    op: usage
    prefix: /k0s-tenant/
    client: "{{ tenant_etcd_client }}"   # {etcdctl, run_as, endpoints, cacert, cert, key}
  register: usage
"""

RETURN = r"""
revision: {description: "The revision read at (dump, usage; replace: the final read).", type: int, returned: always}
key_count: {description: Keys under the prefix (the copy's for dump; after replace)., type: int, returned: always}
bytes: {description: Bytes of keys and values under the prefix., type: int, returned: always}
sha256: {description: "dump: the file's sha256.", type: str, returned: dump}
cluster_id: {description: The etcd cluster's ID (hex)., type: str, returned: always}
deleted: {description: "replace: keys deleted.", type: int, returned: replace}
put: {description: "replace: keys written.", type: int, returned: replace}
transactions: {description: "replace: transactions committed.", type: int, returned: replace}
resumed: {description: "replace: the marker of the interrupted replace this one finished ({} when none).", type: dict, returned: replace}
restore: {description: "usage: the in-progress marker of an interrupted replace ({} when there is none).", type: dict, returned: usage}
manifest: {description: "check: the copy's manifest, as checked.", type: dict, returned: check}
committed: {description: "replace, when it fails: the transactions it had committed.", type: int, returned: failure}
untouched: {description: "replace, when it fails: true when it failed before it sent a transaction (no key was changed).", type: bool, returned: failure}
"""

import base64
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.k0sbox.external_etcd.plugins.module_utils.etcdctl import (
    Connection,
    Etcdctl,
    EtcdctlError,
)

FORMAT = "k0s-etcd-sandbox tenant backup 1"
MARKER = b"k0sbox-restore-in-progress"   # under the prefix: <prefix>k0sbox-restore-in-progress


class PrefixError(Exception):
    """What went wrong, in one line that says what to do; ``committed``: the transactions a
    failed replace had committed (None: it failed before it sent any, no key was changed)."""

    def __init__(self, msg: str, committed: int | None = None) -> None:
        super().__init__(msg)
        self.committed = committed


# -- plain functions ---------------------------------------------------------------------------


def range_end(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix`` (etcd's GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


def decode_kv(kv: dict[str, Any]) -> dict[str, Any]:
    """etcdctl -w json's key-value (base64, zero fields left out) as a record of the copy."""
    return {"key": kv["key"], "value": kv.get("value", ""),
            "create_revision": int(kv.get("create_revision", 0)),
            "mod_revision": int(kv.get("mod_revision", 0)),
            "version": int(kv.get("version", 0)), "lease": int(kv.get("lease", 0))}


def raw(b64: str) -> bytes:
    return base64.b64decode(b64)


def go_quote(data: bytes) -> str:
    """``data`` as a Go double-quoted string (etcdctl txn reads its arguments with %q): every
    byte outside printable ASCII escaped, so any value fits on one line."""
    out = []
    for byte in data:
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\x{byte:02x}")
    return '"' + "".join(out) + '"'


def plan(copy: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operations that make ``current`` equal ``copy`` (records with raw ``key`` and
    ``value`` bytes): a delete for each key the copy lacks, a put for each key missing or
    different (value, or having a lease or not); each with the mod revision it was read at."""
    now = {r["key"]: r for r in current}
    wanted = {r["key"]: r for r in copy}
    ops = [{"op": "del", "key": k, "mod_revision": r["mod_revision"]}
           for k, r in sorted(now.items()) if k not in wanted]
    for k, r in sorted(wanted.items()):
        seen = now.get(k)
        if seen and seen["value"] == r["value"] and bool(seen["lease"]) == bool(r["lease"]):
            continue
        ops.append({"op": "put", "key": k, "value": r["value"], "lease": bool(r["lease"]),
                    "mod_revision": seen["mod_revision"] if seen else 0})
    return ops


def batches(ops: list[dict[str, Any]], max_ops: int, max_bytes: int) -> list[list[dict[str, Any]]]:
    """``ops`` in transactions of at most ``max_ops`` operations and ``max_bytes`` bytes."""
    out: list[list[dict[str, Any]]] = []
    size = 0
    for op in ops:
        n = len(op["key"]) + len(op.get("value", b""))
        if n > max_bytes:
            raise PrefixError(f"the key {op['key'][:80]!r} with its value is {n} bytes, more than "
                              f"max_txn_bytes ({max_bytes}); raise it (below etcd's "
                              "--max-request-bytes)")
        if not out or len(out[-1]) >= max_ops or size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(op)
        size += n
    return out


def txn_input(batch: list[dict[str, Any]], lease: str) -> str:
    """etcdctl txn's standard input: a guard per key (its mod revision as read; none for the
    in-progress marker, which only this replace writes), the operations, no failure
    operations."""
    compares = [f"mod({go_quote(op['key'])}) = \"{op['mod_revision']}\"" for op in batch
                if "mod_revision" in op]
    ops = []
    for op in batch:
        if op["op"] == "del":
            ops.append(f"del -- {go_quote(op['key'])}")
        else:
            flag = f"--lease={lease} " if op["lease"] else ""
            ops.append(f"put {flag}-- {go_quote(op['key'])} {go_quote(op['value'])}")
    return "\n".join(compares) + "\n\n" + "\n".join(ops) + "\n\n\n"


COUNTERS = ("create_revision", "mod_revision", "version", "lease")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_copy(data: bytes, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The copy's header and records (raw ``key`` and ``value`` bytes), when it is whole and
    as a dump writes it: JSON lines of ASCII, the header first, then every key under the
    header's prefix once, in key order, not the in-progress marker, none created or changed
    after the header's revision; as many keys and bytes as the header says."""
    try:
        docs = [json.loads(line) for line in data.decode("ascii").splitlines()]
    except ValueError as exc:
        raise PrefixError(f"{name} is not a tenant backup (JSON lines of ASCII expected: {exc})") from None
    header = docs[0] if docs else None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PrefixError(f"{name} is not a tenant backup ({FORMAT!r} expected on its first line)")
    prefix, revision = header.get("prefix"), header.get("revision")
    if not isinstance(prefix, str) or len(prefix) < 3 or prefix[0] != "/" or prefix[-1] != "/":
        raise PrefixError(f"{name}: its header's prefix {prefix!r} is not a prefix as "
                          "kube-apiserver uses it (/<prefix>/)")
    if not _whole(revision) or not revision:
        raise PrefixError(f"{name}: its header's revision {revision!r} is not a revision")
    src, records, last = prefix.encode(), [], b""
    for line, r in enumerate(docs[1:], start=2):
        where = f"{name} line {line}"
        if not (isinstance(r, dict) and isinstance(r.get("key"), str)
                and isinstance(r.get("value"), str) and all(_whole(r.get(f)) for f in COUNTERS)):
            raise PrefixError(f"{where} is not a key of a tenant backup (key and value in base64; "
                              f"{', '.join(COUNTERS)} whole numbers)")
        try:
            key, value = (base64.b64decode(r[f], validate=True) for f in ("key", "value"))
        except ValueError:
            raise PrefixError(f"{where}: its key or value is not base64") from None
        if not key.startswith(src) or key == src + MARKER:
            what = "the in-progress marker, which no copy holds" if key.startswith(src) else \
                f"outside its prefix {prefix}"
            raise PrefixError(f"the copy holds a key {what} ({where}: {key[:80]!r}); a backup "
                              "copies only its tenant's keys")
        if key <= last:
            raise PrefixError(f"{where}: the key {key[:80]!r} is out of order or repeated; a "
                              "backup writes each key once, in key order")
        if r["mod_revision"] > revision or r["create_revision"] > r["mod_revision"]:
            raise PrefixError(f"{where}: the key {key[:80]!r} was changed at revision "
                              f"{r['mod_revision']}, after the copy's revision {revision}")
        last = key
        records.append({**r, "key": key, "value": value})
    count, size = len(records), sum(len(r["key"]) + len(r["value"]) for r in records)
    if (header.get("key_count"), header.get("bytes")) != (count, size):
        raise PrefixError(f"{name} holds {count} keys of {size} bytes, its header says "
                          f"{header.get('key_count')} keys of {header.get('bytes')} bytes: the "
                          "copy is truncated or was edited")
    return header, records


def read_copy(path: str, sha256: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The copy's header and records (raw bytes), after checking its sha256 and that it is
    whole (parse_copy)."""
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 and digest != sha256:
        raise PrefixError(f"{os.path.basename(path)} has sha256 {digest}, its manifest says "
                          f"{sha256}: the copy is damaged or not that one")
    return parse_copy(data, os.path.basename(path))


def _same(a: Any, b: Any) -> bool:
    """Equal, a whole number also when written as a string (a manifest's fields)."""
    return str(a) == str(b) if _whole(a) or _whole(b) else a == b


def check_copy(src: str, manifest_path: str, tenant: str, source_prefix: str, prefix: str,
               max_bytes: int) -> dict[str, Any]:
    """Everything about a copy that can be known without etcd (op ``check``): its manifest
    is of ``tenant`` and ``source_prefix``, has the copy's sha256 and names a plain file; the
    copy is whole (parse_copy) and its header says what the manifest says; every key fits one
    transaction of ``max_bytes`` and lies under ``prefix`` once moved there. A PrefixError
    names what is wrong."""
    if not os.path.isfile(src):
        raise PrefixError("not found")
    try:
        with open(manifest_path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise PrefixError(f"no manifest beside it ({manifest_path}); give a copy made by "
                          "backup --tenant") from None
    except ValueError as exc:
        raise PrefixError(f"its manifest {os.path.basename(manifest_path)} is not JSON ({exc})") from None
    kind = manifest.get("manifest") if isinstance(manifest, dict) else None
    if kind != FORMAT:
        raise PrefixError(f"not a tenant backup (manifest {kind or 'none'})")
    if manifest.get("tenant") != tenant:
        raise PrefixError(f"a copy of tenant {manifest.get('tenant')}, not of {tenant}")
    if manifest.get("prefix") != source_prefix:
        raise PrefixError(f"a copy of prefix {manifest.get('prefix')} but tenant {tenant} uses "
                          f"{source_prefix}")
    with open(src, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if manifest.get("sha256") != digest:
        raise PrefixError(f"sha256 {digest}, its manifest says {manifest.get('sha256')}: "
                          "damaged or not that copy")
    name = manifest.get("file")
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise PrefixError(f"its manifest's file {name!r} is not a file name; a backup writes "
                          "the copy's own name there")
    header, records = parse_copy(data, os.path.basename(src))
    for field in ("prefix", "revision", "cluster_id", "key_count", "bytes"):
        if not _same(header.get(field), manifest.get(field)):
            raise PrefixError(f"its header says {field} {header.get(field)!r}, its manifest "
                              f"{manifest.get(field)!r}: the copy or its manifest was edited")
    big = [r["key"] for r in records if len(r["key"]) + len(r["value"]) > max_bytes]
    if big:
        raise PrefixError(f"the key {big[0][:80]!r} with its value is more than max_txn_bytes "
                          f"({max_bytes}) and cannot be written back in one transaction")
    moved(records, header["prefix"], prefix)
    return {"changed": False, "manifest": manifest, "sha256": digest, "revision": header["revision"],
            "key_count": len(records), "bytes": header["bytes"], "cluster_id": header.get("cluster_id", "")}


def with_marker(todo: list[list[dict[str, Any]]], marker: bytes, note: dict[str, Any],
                present: bool) -> list[list[dict[str, Any]]]:
    """The transactions with the in-progress marker: put (with how many are committed) in
    every transaction but the last, deleted in the last one when there is more than one or
    when one is ``present`` (left by an interrupted run). ``todo`` leaves room for it: one
    operation fewer than the limit."""
    out = []
    for i, batch in enumerate(todo):
        last = i == len(todo) - 1
        if not last:
            value = json.dumps({**note, "transactions": len(todo), "committed": i + 1},
                               sort_keys=True).encode()
            batch = [*batch, {"op": "put", "key": marker, "value": value, "lease": False}]
        elif len(todo) > 1 or present:
            batch = [*batch, {"op": "del", "key": marker}]
        out.append(batch)
    if not todo and present:
        out.append([{"op": "del", "key": marker}])
    return out


def marker_of(records: list[dict[str, Any]], prefix: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records without the in-progress marker (raw or base64 keys), and the marker's
    value ({} when there is none)."""
    key = prefix.encode() + MARKER
    rest, found = [], {}
    for r in records:
        k = r["key"] if isinstance(r["key"], bytes) else raw(r["key"])
        if k == key:
            v = r["value"] if isinstance(r["value"], bytes) else raw(r["value"])
            try:
                found = json.loads(v) if v else {}
            except ValueError:
                found = {"unreadable": v[:200].decode(errors="replace")}
            found = found if isinstance(found, dict) and found else {"marker": True}
        else:
            rest.append(r)
    return rest, found


def interrupted(prefix: str, restore: dict[str, Any]) -> str:
    """One line about an interrupted replace, from its marker."""
    done = f"{restore.get('committed', '?')} of {restore.get('transactions', '?')} transactions"
    copy = restore.get("file") or restore.get("copy") or "a copy"
    return (f"a restore of {copy} into {prefix} was interrupted after {done} (started "
            f"{restore.get('started', '?')}): the prefix mixes old and restored keys; run the "
            "restore again with the same copy to finish it")


def moved(records: list[dict[str, Any]], source: str, target: str) -> list[dict[str, Any]]:
    """The records with their keys moved from prefix ``source`` to ``target``."""
    src, dst = source.encode(), target.encode()
    bad = [r["key"] for r in records if not r["key"].startswith(src)]
    if bad:
        raise PrefixError(f"the copy holds {len(bad)} key(s) outside its prefix {source} "
                          f"(first {bad[0][:80]!r})")
    return [{**r, "key": dst + r["key"][len(src):]} for r in records]


# -- etcdctl -----------------------------------------------------------------------------------


class TenantEtcd(Etcdctl):
    """The prefix's reads and transactions in etcdctl's JSON, over the tenant's connection
    (the collection's one etcdctl runner: module_utils/etcdctl.py)."""

    def __init__(self, p: dict[str, Any], binary: str) -> None:
        super().__init__(binary, Connection.of(p), run_as=p["run_as"],
                         extra=["--dial-timeout=5s", "--command-timeout=60s"], timeout=120)

    def run(self, args: list[str | bytes], stdin: str = "") -> dict[str, Any]:
        try:
            return self.json(*args, stdin=stdin.encode())  # type: ignore[no-any-return]
        except EtcdctlError as exc:
            raise PrefixError(str(exc)) from None

    def pages(self, prefix: bytes, page: int) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """(header, records) per page, every page at the first page's revision. A page after
        the first starts at the last key read (argv cannot carry the NUL byte that would follow
        it) and leaves that key out."""
        end, start, rev, last = range_end(prefix), prefix, 0, b""
        while True:
            args: list[str | bytes] = ["get", start, end, f"--limit={page + (1 if rev else 0)}"]
            if rev:
                args.append(f"--rev={rev}")
            resp = self.run(args)
            rev = rev or int(resp["header"]["revision"])
            kvs = [decode_kv(kv) for kv in resp.get("kvs", [])]
            kvs = [kv for kv in kvs if raw(kv["key"]) != last]
            yield {**resp["header"], "revision": rev}, kvs
            if not resp.get("more") or not kvs:
                return
            last = raw(kvs[-1]["key"])
            if b"\x00" in last:
                raise PrefixError(f"the key {last[:80]!r} holds a NUL byte, which etcdctl cannot "
                                  "be given; such keys cannot be copied this way")
            start = last

    def read(self, prefix: str, page: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Every key under the prefix at one revision: (header, records in key order). When
        that revision is compacted away between two pages, the read starts again (3 times)."""
        for attempt in range(3):
            header: dict[str, Any] = {}
            records: list[dict[str, Any]] = []
            try:
                for header, kvs in self.pages(prefix.encode(), page):
                    records += kvs
            except PrefixError as exc:
                if "compacted" in str(exc) and attempt < 2:
                    continue
                raise
            return header, records
        raise AssertionError("unreachable")


def totals(records: list[dict[str, Any]]) -> tuple[int, int]:
    return len(records), sum(len(raw(r["key"])) + len(raw(r["value"])) for r in records)


def cluster_id(header: dict[str, Any]) -> str:
    return f"{int(header.get('cluster_id', 0)):x}"


# -- operations --------------------------------------------------------------------------------


def op_check(etcd: TenantEtcd | None, p: dict[str, Any], check: bool) -> dict[str, Any]:
    """Everything about the copy that can be known without etcd (check_copy)."""
    return check_copy(p["src"], p["manifest"], p["tenant"], p["source_prefix"], p["prefix"],
                      p["max_txn_bytes"])


def op_dump(etcd: TenantEtcd, p: dict[str, Any], check: bool) -> dict[str, Any]:
    header, records = etcd.read(p["prefix"], p["page"])
    records, restore = marker_of(records, p["prefix"])
    if restore:
        raise PrefixError(f"{interrupted(p['prefix'], restore)}; a copy of it now would copy "
                          "the mix, so none was made")
    count, size = totals(records)
    head = {"format": FORMAT, "prefix": p["prefix"], "revision": header["revision"],
            "cluster_id": cluster_id(header), "key_count": count, "bytes": size}
    body = "".join(json.dumps(x, sort_keys=True) + "\n" for x in [head, *records]).encode()
    if not check:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p["dest"]) or ".", prefix=".tenant-")
        with os.fdopen(fd, "wb") as f:   # mkstemp: mode 0600
            f.write(body)
        os.replace(tmp, p["dest"])
    return {"changed": True, "revision": header["revision"], "key_count": count, "bytes": size,
            "sha256": hashlib.sha256(body).hexdigest(), "cluster_id": cluster_id(header)}


def op_usage(etcd: TenantEtcd, p: dict[str, Any], check: bool) -> dict[str, Any]:
    header, records = etcd.read(p["prefix"], p["page"])
    records, restore = marker_of(records, p["prefix"])
    count, size = totals(records)
    return {"changed": False, "revision": header["revision"], "key_count": count, "bytes": size,
            "cluster_id": cluster_id(header), "restore": restore}


def current(etcd: TenantEtcd, p: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The prefix now: header, records (raw bytes) without the in-progress marker, the marker."""
    header, records = etcd.read(p["prefix"], p["page"])
    rest, restore = marker_of([{**r, "key": raw(r["key"]), "value": raw(r["value"])}
                               for r in records], p["prefix"])
    return header, rest, restore


def op_replace(etcd: TenantEtcd, p: dict[str, Any], check: bool) -> dict[str, Any]:
    head, copy = read_copy(p["src"], p["sha256"])
    source = p["source_prefix"] or head["prefix"]
    if source != head["prefix"]:
        raise PrefixError(f"the copy is of prefix {head['prefix']}, not {source}")
    copy = moved(copy, source, p["prefix"])
    copy, _marker = marker_of(copy, p["prefix"])
    _header, now, left = current(etcd, p)
    ops = plan(copy, now)
    note = {**p["restore_note"], "copy": os.path.basename(p["src"]), "copy_revision": head["revision"],
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    marker = p["prefix"].encode() + MARKER
    todo = with_marker(batches(ops, p["max_txn_ops"] - 1, p["max_txn_bytes"]), marker, note,
                       bool(left))
    done = {"deleted": 0, "put": 0, "transactions": 0}
    if todo and not check:
        lease = ""
        if any(op.get("lease") for op in ops):
            lease = f"{int(etcd.run(['lease', 'grant', str(p['lease_ttl'])])['ID']):x}"
        for i, batch in enumerate(todo):
            try:
                resp = etcd.run(["txn"], txn_input(batch, lease))
            except (PrefixError, OSError, ValueError) as exc:
                resp = {"error": str(exc) or type(exc).__name__}
            if not resp.get("succeeded"):
                why = resp.get("error") or (f"a key under {p['prefix']} changed since it was "
                                            "read (is a client still writing there?)")
                raise PrefixError(
                    f"transaction {i + 1} of {len(todo)} failed: {why}; {done['transactions']} "
                    f"transaction(s) were committed ({done['deleted']} deleted, {done['put']} "
                    "put), so the prefix is partly restored. Stop what writes there and run "
                    "the restore again with the same file to finish it", done["transactions"])
            done["transactions"] += 1
            done["deleted"] += sum(op["op"] == "del" and op["key"] != marker for op in batch)
            done["put"] += sum(op["op"] == "put" and op["key"] != marker for op in batch)
    header, after, still = current(etcd, p)
    if not check and still:
        raise PrefixError(f"after {done['transactions']} transaction(s) the in-progress marker "
                          f"is still there: {interrupted(p['prefix'], still)}", done["transactions"])
    if not check and plan(copy, after):
        raise PrefixError(f"after {done['transactions']} transaction(s) {p['prefix']} still "
                          f"differs from the copy in {len(plan(copy, after))} key(s): a client "
                          "writes there; stop it and run the restore again", done["transactions"])
    count, size = len(after), sum(len(r["key"]) + len(r["value"]) for r in after)
    return {"changed": bool(todo), "revision": header["revision"], "key_count": count,
            "bytes": size, "cluster_id": cluster_id(header), **done,
            "planned": {"deleted": sum(o["op"] == "del" for o in ops),
                        "put": sum(o["op"] == "put" for o in ops), "transactions": len(todo)},
            "resumed": left}


OPS: dict[str, Callable[[Any, dict[str, Any], bool], dict[str, Any]]] = {
    "check": op_check, "dump": op_dump, "replace": op_replace, "usage": op_usage}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "op": {"type": "str", "required": True, "choices": list(OPS)},
            "prefix": {"type": "str", "required": True},
            "etcdctl": {"type": "str", "default": "etcdctl"},
            "run_as": {"type": "list", "elements": "str", "default": []},
            "endpoints": {"type": "list", "elements": "str"},
            "cacert": {"type": "str", "default": ""},
            "cert": {"type": "str", "default": ""},
            "key": {"type": "str", "default": "", "no_log": False},
            "client": {"type": "dict", "options": {
                "etcdctl": {"type": "str"}, "run_as": {"type": "list", "elements": "str"},
                "endpoints": {"type": "list", "elements": "str"}, "cacert": {"type": "str"},
                "cert": {"type": "str"}, "key": {"type": "str", "no_log": False}}},
            "dest": {"type": "str"},
            "src": {"type": "str"},
            "sha256": {"type": "str", "default": ""},
            "source_prefix": {"type": "str", "default": ""},
            "manifest": {"type": "str"},
            "tenant": {"type": "str"},
            "page": {"type": "int", "default": 500},
            "max_txn_ops": {"type": "int", "default": 128},
            "max_txn_bytes": {"type": "int", "default": 1048576},
            "lease_ttl": {"type": "int", "default": 3600},
            "restore_note": {"type": "dict", "default": {}},
        },
        required_if=[("op", "dump", ["dest"]), ("op", "replace", ["src"]),
                     ("op", "check", ["src", "manifest", "tenant", "source_prefix"])],
        supports_check_mode=True,
    )
    p = module.params
    p.update({k: v for k, v in (p.pop("client") or {}).items() if v is not None})
    if p["op"] != "check" and not p["endpoints"]:
        module.fail_json(msg=f"{p['op']}: endpoints (or client.endpoints) is required")
    if not p["prefix"].startswith("/") or not p["prefix"].endswith("/"):
        module.fail_json(msg=f"prefix: '{p['prefix']}' is not a prefix as kube-apiserver uses it "
                             "(/<prefix>/); give the tenant's key_prefix")
    if p["max_txn_ops"] < 2:
        module.fail_json(msg=f"max_txn_ops: {p['max_txn_ops']} leaves no room for the data; give at "
                             "least 2 (one operation is the in-progress marker; etcd's limit is 128)")
    etcd = None if p["op"] == "check" else \
        TenantEtcd(p, module.get_bin_path(p["etcdctl"], required=True, opt_dirs=["/usr/local/bin"]))
    try:
        result = OPS[p["op"]](etcd, p, module.check_mode)
    except (PrefixError, OSError, ValueError, KeyError) as exc:
        # check: the reason alone (the caller names the file); replace: whether keys changed
        committed = getattr(exc, "committed", None)
        untouched = "; no key was changed" if p["op"] == "replace" and committed is None else ""
        module.fail_json(msg=str(exc) if p["op"] == "check" else f"{p['op']} {p['prefix']}: {exc}{untouched}",
                         committed=committed or 0, untouched=committed is None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
