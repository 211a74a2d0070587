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
through etcdctl. Callers: roles/k0s_controller tasks tenant_backup.yml and tenant_restore.yml
(scripts/sandbox backup/restore --tenant). The logic is in plain functions below;
tests/test_sandbox_etcd_prefix.py runs them and the module on a real etcd.

The copy's format (docs/day2.md, "Tenant operations"): JSON lines; the first is the header
``{"format": FORMAT, "prefix", "revision", "cluster_id", "key_count", "bytes"}``, then one
line per key in key order ``{"key", "value" (base64 of the bytes as stored), "create_revision",
"mod_revision", "version", "lease"}``.

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
options:
  op: {description: "The operation.", type: str, required: true, choices: [dump, replace, usage]}
  prefix: {description: "The prefix, as kube-apiserver uses it (C(/tenant-a/)).", type: str, required: true}
  etcdctl: {description: "etcdctl (looked up on PATH).", type: str, default: etcdctl}
  run_as: {description: "Argv run before etcdctl, e.g. C(setpriv --reuid=kube-apiserver --regid=0 --clear-groups).", type: list, elements: str, default: []}
  endpoints: {description: "Client URLs.", type: list, elements: str, required: true}
  cacert: {description: "CA file (TLS).", type: str, default: ""}
  cert: {description: "Client certificate (TLS), the tenant's.", type: str, default: ""}
  key: {description: "Client key (TLS).", type: str, default: ""}
  dest: {description: "dump, the file to write.", type: str}
  src: {description: "replace, the copy to write back.", type: str}
  sha256: {description: "replace, the copy's sha256 (its manifest's).", type: str, default: ""}
  source_prefix: {description: "replace, the copy's own prefix when it differs from O(prefix).", type: str, default: ""}
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
"""

import base64
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from ansible.module_utils.basic import AnsibleModule

FORMAT = "k0s-etcd-sandbox tenant backup 1"
MARKER = b"k0sbox-restore-in-progress"   # under the prefix: <prefix>k0sbox-restore-in-progress


class PrefixError(Exception):
    """What went wrong, in one line that says what to do."""


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


def read_copy(path: str, sha256: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The copy's header and records (raw bytes), after checking its sha256 and format."""
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 and digest != sha256:
        raise PrefixError(f"{os.path.basename(path)} has sha256 {digest}, its manifest says "
                          f"{sha256}: the copy is damaged or not that one; nothing was changed")
    lines = data.decode("ascii").splitlines()
    header = json.loads(lines[0]) if lines else {}
    if header.get("format") != FORMAT:
        raise PrefixError(f"{os.path.basename(path)} is not a tenant backup ({FORMAT!r} expected "
                          "on its first line); nothing was changed")
    records = [json.loads(line) for line in lines[1:]]
    if len(records) != header.get("key_count"):
        raise PrefixError(f"{os.path.basename(path)} holds {len(records)} keys, its header says "
                          f"{header.get('key_count')}: the copy is truncated; nothing was changed")
    return header, [{**r, "key": raw(r["key"]), "value": raw(r["value"])} for r in records]


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
                          f"(first {bad[0][:80]!r}); nothing was changed")
    return [{**r, "key": dst + r["key"][len(src):]} for r in records]


# -- etcdctl -----------------------------------------------------------------------------------


class Etcdctl:
    def __init__(self, p: dict[str, Any], binary: str) -> None:
        tls = [f"--{k}={p[k]}" for k in ("cacert", "cert", "key") if p[k]]
        self.argv = [*p["run_as"], binary, f"--endpoints={','.join(p['endpoints'])}", *tls,
                     "--dial-timeout=5s", "--command-timeout=60s"]

    def run(self, args: list[str | bytes], stdin: str = "") -> dict[str, Any]:
        done = subprocess.run([*self.argv, *args, "-w", "json"], input=stdin.encode(),
                              capture_output=True, timeout=120, check=False,
                              env={**os.environ, "ETCDCTL_API": "3"})
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()
            raise PrefixError(f"etcdctl {args[0]!r}: {err[-1] if err else f'rc {done.returncode}'}")
        return json.loads(done.stdout or b"{}")

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


def op_dump(etcd: Etcdctl, p: dict[str, Any], check: bool) -> dict[str, Any]:
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


def op_usage(etcd: Etcdctl, p: dict[str, Any], check: bool) -> dict[str, Any]:
    header, records = etcd.read(p["prefix"], p["page"])
    records, restore = marker_of(records, p["prefix"])
    count, size = totals(records)
    return {"changed": False, "revision": header["revision"], "key_count": count, "bytes": size,
            "cluster_id": cluster_id(header), "restore": restore}


def current(etcd: Etcdctl, p: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The prefix now: header, records (raw bytes) without the in-progress marker, the marker."""
    header, records = etcd.read(p["prefix"], p["page"])
    rest, restore = marker_of([{**r, "key": raw(r["key"]), "value": raw(r["value"])}
                               for r in records], p["prefix"])
    return header, rest, restore


def op_replace(etcd: Etcdctl, p: dict[str, Any], check: bool) -> dict[str, Any]:
    head, copy = read_copy(p["src"], p["sha256"])
    source = p["source_prefix"] or head["prefix"]
    if source != head["prefix"]:
        raise PrefixError(f"the copy is of prefix {head['prefix']}, not {source}; nothing was changed")
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
            except PrefixError as exc:
                resp = {"error": str(exc)}
            if not resp.get("succeeded"):
                why = resp.get("error") or (f"a key under {p['prefix']} changed since it was "
                                            "read (is a client still writing there?)")
                raise PrefixError(
                    f"transaction {i + 1} of {len(todo)} failed: {why}; {done['transactions']} "
                    f"transaction(s) were committed ({done['deleted']} deleted, {done['put']} "
                    "put), so the prefix is partly restored. Stop what writes there and run "
                    "the restore again with the same file to finish it")
            done["transactions"] += 1
            done["deleted"] += sum(op["op"] == "del" and op["key"] != marker for op in batch)
            done["put"] += sum(op["op"] == "put" and op["key"] != marker for op in batch)
    header, after, still = current(etcd, p)
    if not check and still:
        raise PrefixError(f"after {done['transactions']} transaction(s) the in-progress marker "
                          f"is still there: {interrupted(p['prefix'], still)}")
    if not check and plan(copy, after):
        raise PrefixError(f"after {done['transactions']} transaction(s) {p['prefix']} still "
                          f"differs from the copy in {len(plan(copy, after))} key(s): a client "
                          "writes there; stop it and run the restore again")
    count, size = len(after), sum(len(r["key"]) + len(r["value"]) for r in after)
    return {"changed": bool(todo), "revision": header["revision"], "key_count": count,
            "bytes": size, "cluster_id": cluster_id(header), **done,
            "planned": {"deleted": sum(o["op"] == "del" for o in ops),
                        "put": sum(o["op"] == "put" for o in ops), "transactions": len(todo)},
            "resumed": left}


OPS: dict[str, Callable[[Etcdctl, dict[str, Any], bool], dict[str, Any]]] = {
    "dump": op_dump, "replace": op_replace, "usage": op_usage}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "op": {"type": "str", "required": True, "choices": list(OPS)},
            "prefix": {"type": "str", "required": True},
            "etcdctl": {"type": "str", "default": "etcdctl"},
            "run_as": {"type": "list", "elements": "str", "default": []},
            "endpoints": {"type": "list", "elements": "str", "required": True},
            "cacert": {"type": "str", "default": ""},
            "cert": {"type": "str", "default": ""},
            "key": {"type": "str", "default": "", "no_log": False},
            "dest": {"type": "str"},
            "src": {"type": "str"},
            "sha256": {"type": "str", "default": ""},
            "source_prefix": {"type": "str", "default": ""},
            "page": {"type": "int", "default": 500},
            "max_txn_ops": {"type": "int", "default": 128},
            "max_txn_bytes": {"type": "int", "default": 1048576},
            "lease_ttl": {"type": "int", "default": 3600},
            "restore_note": {"type": "dict", "default": {}},
        },
        required_if=[("op", "dump", ["dest"]), ("op", "replace", ["src"])],
        supports_check_mode=True,
    )
    p = module.params
    if not p["prefix"].startswith("/") or not p["prefix"].endswith("/"):
        module.fail_json(msg=f"prefix: '{p['prefix']}' is not a prefix as kube-apiserver uses it "
                             "(/<prefix>/); give the tenant's key_prefix")
    if p["max_txn_ops"] < 2:
        module.fail_json(msg=f"max_txn_ops: {p['max_txn_ops']} leaves no room for the data; give at "
                             "least 2 (one operation is the in-progress marker; etcd's limit is 128)")
    etcd = Etcdctl(p, module.get_bin_path(p["etcdctl"], required=True, opt_dirs=["/usr/local/bin"]))
    try:
        result = OPS[p["op"]](etcd, p, module.check_mode)
    except (PrefixError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        module.fail_json(msg=f"{p['op']} {p['prefix']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
