"""What roles/etcd/tasks/rbac.yml changes on one tenant's etcd role: the grants it adds and
the ones it takes back, read from ``etcdctl role get <role> -w json``.

A tenant's role ends with exactly two grants: readwrite on its prefix as kube-apiserver uses
it (the range ``[/<prefix>/, /<prefix>0)``, etcdctl's ``--prefix``) and, on the single key
``compact_rev_key``, what ``etcd_rbac_compact_rev_key`` says (read or readwrite). Every other
grant goes, whatever its form: another prefix, a key range that is no prefix (``[a, z)``), a
single key, an open-ended range (range end ``"\\x00"``: ``--from-key``, or the whole keyspace
``[\\x00, <open ended>``, which ``role get`` prints as ``[, <open ended>``).

The JSON form is read, not ``role get``'s text: it gives each grant's key and range end as
base64 bytes and its type as a number (0 read, 1 write, 2 readwrite; 0 is left out), where the
text prints raw bytes (a key may hold a newline, ``|`` or ``)``). etcd revokes a grant only by
its exact key and range end (server/auth/store.go RoleRevokePermission), so each revocation
names both as etcdctl spells them (etcdctl 3.5 role_command.go permRange): the key ``"\\x00"``
as ``""``, the range end ``"\\x00"`` as ``--from-key``, and ``--`` before the arguments (a key
may start with ``-``). A key or range end that no command line can carry (a NUL byte inside,
bytes that are not UTF-8: grants made through etcd's gRPC API, not etcdctl) makes the plan
``rebuild`` the role instead.
"""

from __future__ import annotations

import base64
import json
from typing import Any

# etcd's authpb.Permission_Type, as etcdctl's JSON prints it (a number; names accepted too).
PERM_TYPES = {0: "read", 1: "write", 2: "readwrite"}
PERM_NAMES = {"READ": 0, "WRITE": 1, "READWRITE": 2}
COMPACT_REV_KEY = b"compact_rev_key"


def prefix_range_end(prefix: bytes) -> bytes:
    """The range end of ``prefix`` as etcd computes it (clientv3 GetPrefixRangeEnd): the last
    byte below 0xff incremented and what follows it cut; ``"\\x00"`` (open ended) if none."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


def _arg(value: bytes) -> str | None:
    """``value`` as a command-line argument, None where none can carry it."""
    if not value or b"\x00" in value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def revoke_args(role: str, key: bytes, range_end: bytes) -> list[str] | None:
    """``etcdctl role revoke-permission`` arguments that name exactly this grant, or None
    when etcdctl cannot name it."""
    flags: list[str] = []
    if range_end == b"\x00":
        flags, ends = ["--from-key"], []
    elif range_end:
        end = _arg(range_end)
        # etcdctl drops the range end given with an empty key (it stands for "\x00")
        if end is None or key == b"\x00":
            return None
        ends = [end]
    else:
        ends = []
    name = "" if key == b"\x00" else _arg(key)
    if name is None:
        return None
    return [*flags, "--", role, name, *ends]


def _show(value: bytes) -> str:
    """``value`` as text, a byte that is not UTF-8 or a character that is not printable escaped."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1]
                   for ch in value.decode("utf-8", "backslashreplace"))


def describe(perm_type: int, key: bytes, range_end: bytes) -> str:
    """A grant as ``role get`` prints it, non-printable bytes escaped: ``read [a, z)``."""
    what = PERM_TYPES.get(perm_type, str(perm_type))
    if not range_end:
        return f"{what} {_show(key)}"
    if range_end == b"\x00":
        return f"{what} [{_show(key)}, <open ended>"
    return f"{what} [{_show(key)}, {_show(range_end)})"


def etcd_rbac_role_plan(role_json: str, role: str, prefix: str, compact_rev_key: str) -> dict[str, Any]:
    """What the reconcile does to ``role`` (its ``role get -w json`` output, ``""`` when the
    role does not exist) so that it grants exactly readwrite on ``prefix`` (``/<prefix>/``) and
    ``compact_rev_key`` (``read`` or ``readwrite``) on the key compact_rev_key:

    ``grant_prefix`` / ``grant_compact_rev_key``: whether that grant is missing or of another
    type (etcd replaces the grant of the same key and range end: no gap); ``revoke``: one
    ``{argv, grant}`` per other grant (the arguments after ``role revoke-permission``);
    ``rebuild``: some other grant cannot be named on etcdctl's command line (then ``revoke``
    is empty: the role is made anew); ``unwanted``: every other grant, described."""
    if compact_rev_key not in ("read", "readwrite"):
        raise ValueError(f"etcd_rbac_compact_rev_key is {compact_rev_key!r}: set it to read or readwrite")
    if not prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"{role}: the key prefix {prefix!r} is not /<prefix>/ (k0s_tenants' key_prefix)")
    want_prefix = (prefix.encode(), prefix_range_end(prefix.encode()))
    want_compact = (COMPACT_REV_KEY, b"")
    have: dict[tuple[bytes, bytes], int] = {}
    revoke: list[dict[str, Any]] = []
    unwanted: list[str] = []
    rebuild = False
    for perm in (json.loads(role_json).get("perm") or []) if role_json.strip() else []:
        key = base64.b64decode(perm.get("key") or "")
        range_end = base64.b64decode(perm.get("range_end") or "")
        raw_type = perm.get("permType") or 0
        perm_type = PERM_NAMES[raw_type] if isinstance(raw_type, str) else int(raw_type)
        if (key, range_end) in (want_prefix, want_compact):
            have[(key, range_end)] = perm_type
            continue
        described = describe(perm_type, key, range_end)
        unwanted.append(described)
        argv = revoke_args(role, key, range_end)
        if argv is None:
            rebuild = True
        else:
            revoke.append({"argv": argv, "grant": described})
    return {"grant_prefix": have.get(want_prefix) != 2,
            "grant_compact_rev_key": have.get(want_compact) != {"read": 0, "readwrite": 2}[compact_rev_key],
            "revoke": [] if rebuild else revoke, "rebuild": rebuild, "unwanted": unwanted}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"etcd_rbac_role_plan": etcd_rbac_role_plan}
