"""Each tenant's usage of the shared etcd as verify and ``scripts/sandbox status`` report it:
its entry (keys, bytes, share of the backend quota, ``max_bytes``), its line and its check.
Applied by the filter plugins/filter/sandbox_usage.py and by scripts/sandboxlib/usage.py
(through scripts/sandboxlib/sandbox_usage.py, a link to this file), so both say the same.

``max_bytes`` is also the tenant's write budget (sandbox_budgets.py), which the sandbox's etcd
build enforces with its own count (every revision not yet compacted, 256 bytes each, its
leases); this check compares what its prefix holds now (keys and values) with it, on any
build.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .sandbox_tenants import max_bytes_error

# The collection's root (plugins/plugin_utils/ -> root), read through the link too.
ETCD_DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "etcd" / "defaults" / "main.yml"
ETCD_OWN_DEFAULT = 2 * 1024**3   # etcd's default quota, where --quota-backend-bytes is unset
NOT_A_LIMIT = ("its write budget too: the sandbox's etcd build refuses its writes past it, "
               "counting every revision not yet compacted; another build enforces nothing, "
               "etcd-io/etcd#10084")


def role_quota(value: Any = None) -> int:
    """etcd's --quota-backend-bytes as the etcd role sets it: ``value``
    (etcd_quota_backend_bytes from the inventory) when it is a positive integer, else the
    role's default (roles/etcd/defaults/main.yml), else etcd's own."""
    for candidate in (value, _role_default()):
        try:
            if int(candidate) > 0:
                return int(candidate)
        except (TypeError, ValueError):
            continue
    return ETCD_OWN_DEFAULT


def _role_default() -> Any:
    try:
        return (yaml.safe_load(ETCD_DEFAULTS.read_text()) or {}).get("etcd_quota_backend_bytes")
    except (OSError, yaml.YAMLError):
        return None


def quota_from_settings(lines: Iterable[str]) -> int:
    """The quota a running member was started with: ETCD_QUOTA_BACKEND_BYTES of its
    environment file (the etcd role writes it from etcd_quota_backend_bytes or
    etcd_extra_settings); 0 when it is not there (then :func:`entries` takes the role's)."""
    for line in lines or []:
        name, _sep, value = str(line).partition("=")
        if name == "ETCD_QUOTA_BACKEND_BYTES":
            try:
                if int(value.strip().strip("'\"")) > 0:
                    return int(value.strip().strip("'\""))
            except ValueError:
                pass
    return 0


def quota(metric: Any = None, settings: Iterable[str] = (), configured: Any = None) -> int:
    """The backend quota the members run with -- the one place that decides it, from the best
    source the caller has: ``metric``, etcd's own ``etcd_server_quota_backend_bytes`` from a
    member's /metrics (``status``), when it is a positive number; else ``settings``, the
    member's environment file, its ETCD_QUOTA_BACKEND_BYTES (verify); else ``configured``
    (etcd_quota_backend_bytes from the inventory), the role's default, etcd's own default,
    as the etcd role sets it (tenant-usage, which reads no member)."""
    try:
        if float(metric) > 0:
            return int(float(metric))
    except (TypeError, ValueError):
        pass
    return quota_from_settings(settings) or role_quota(configured)


def entries(hosts: Iterable[Mapping[str, Any]], tenants: Iterable[Mapping[str, Any]],
            backend_quota: Any) -> list[dict[str, Any]]:
    """One entry per tenant from its controllers' host variables (the one that read has
    ``k0s_tenant_usage``, the module's result): name, prefix, controller, key_count, bytes,
    revision, quota_backend_bytes, quota_share (bytes / quota), max_bytes (None: not given),
    over_max_bytes; ``error`` instead of the figures when the read failed or did not run.
    ``backend_quota``: as :func:`quota` decided it, or the inventory's etcd_quota_backend_bytes."""
    backend_quota = quota(configured=backend_quota)
    results: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for hv in hosts:
        got = hv.get("k0s_tenant_usage")
        if isinstance(got, Mapping) and not got.get("skipped"):
            results[str(hv.get("k0s_tenant"))] = (str(hv.get("inventory_hostname", "")), got)
    out: list[dict[str, Any]] = []
    for t in tenants:
        name = str(t.get("name"))
        controller, got = results.get(name, ("", {}))
        e: dict[str, Any] = {"name": name, "prefix": t.get("key_prefix", ""),
                             "controller": controller, "quota_backend_bytes": backend_quota,
                             "max_bytes": t.get("max_bytes")}
        if "max_bytes" in t and max_bytes_error(t["max_bytes"]):   # an inventory not validated
            e["max_bytes_error"] = f"k0s_tenants ({name}).max_bytes: {max_bytes_error(t['max_bytes'])}"
        if got.get("restore"):
            e["restore"] = dict(got["restore"])
        if "key_count" in got:
            size = int(got["bytes"])
            e.update(key_count=int(got["key_count"]), bytes=size, revision=got.get("revision"),
                     quota_share=size / backend_quota,
                     over_max_bytes=(e["max_bytes"] is not None and "max_bytes_error" not in e
                                     and size > e["max_bytes"]))
        else:
            e["error"] = " ".join(str(got.get("msg") or "not read: no controller of the tenant "
                                  "answered").split())[:300]
        out.append(e)
    return out


def share(e: Mapping[str, Any]) -> str:
    """The share of the backend quota, in per cent with two significant digits."""
    return f"{100 * float(e.get('quota_share', 0)):.2g}%"


def finish_command(restore: Mapping[str, Any]) -> str:
    """The command that finishes an interrupted tenant restore, from its in-progress marker
    (plugins/modules/sandbox_etcd_prefix.py: the tenant, --as and the copy's path)."""
    path = str(restore.get("file") or restore.get("copy") or "FILE")
    try:
        path = os.path.relpath(path) if os.path.isabs(path) and Path(path).resolve().is_relative_to(
            Path.cwd().resolve()) else path
    except (OSError, ValueError):
        pass
    cmd = f"scripts/sandbox restore --tenant {restore.get('tenant') or 'T'} {path}"
    return cmd + (f" --as {restore['as']}" if restore.get("as") else "")


def interrupted(e: Mapping[str, Any]) -> str:
    """What an interrupted restore left in the tenant's prefix, and the command that finishes
    it ('' when none is recorded)."""
    r = e.get("restore")
    if not r:
        return ""
    return (f"RESTORE INTERRUPTED: {e['prefix']} mixes old keys and keys of "
            f"{r.get('copy', 'a copy')} (revision {r.get('copy_revision', '?')}), "
            f"{r.get('committed', '?')} of {r.get('transactions', '?')} transactions committed "
            f"(started {r.get('started', '?')}); its API servers stay stopped; finish it: "
            f"{finish_command(r)}")


def line(e: Mapping[str, Any]) -> str:
    """One line of a tenant's usage, as verify's report and tenant-usage.yml show it."""
    if e.get("restore") and "error" not in e:
        return f"{e['name']} ({e['prefix']}): {e['key_count']} keys; {interrupted(e)}"
    if "error" in e:
        return f"{e['name']} ({e['prefix']}): usage unknown ({e['error']})"
    text = (f"{e['name']} ({e['prefix']}): {e['key_count']} keys, {e['bytes']} bytes (keys "
            f"and values) at revision {e['revision']}, {share(e)} of the backend quota "
            f"({e['quota_backend_bytes']} bytes)")
    if e.get("max_bytes") is None:
        return text + "; no max_bytes"
    if "max_bytes_error" in e:
        return text + f"; {e['max_bytes_error']}"
    word = "OVER" if e.get("over_max_bytes") else "within"
    return text + f"; {word} its max_bytes {e['max_bytes']}"


def check(e: Mapping[str, Any]) -> dict[str, Any]:
    """verify's check of one tenant's usage: FAIL when it could not be read, or when it is
    over its max_bytes (naming the tenant, its bytes and its max_bytes)."""
    name = f"{e['name']}: usage under {e['prefix']}" + (
        "" if e.get("max_bytes") is None else " within max_bytes")
    if "error" in e:
        return {"name": name, "ok": False, "detail": f"could not be read: {e['error']}"}
    if "max_bytes_error" in e:
        return {"name": name, "ok": False, "detail": e["max_bytes_error"]}
    if e.get("restore"):
        return {"name": name, "ok": False, "detail": f"tenant {e['name']}: {interrupted(e)}"}
    if e.get("over_max_bytes"):
        return {"name": name, "ok": False,
                "detail": (f"tenant {e['name']} holds {e['bytes']} bytes under {e['prefix']} "
                           f"({e['key_count']} keys), over its max_bytes {e['max_bytes']}; "
                           f"delete objects or raise max_bytes ({NOT_A_LIMIT})")}
    return {"name": name, "ok": True, "detail": line(e).split(": ", 1)[1]}
