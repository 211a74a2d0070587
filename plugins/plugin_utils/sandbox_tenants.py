"""THE tenant rules, once: which names a tenant may have, how its etcd prefix is written and
normalised, and which prefixes may live side by side.

Imported by the topology (``topology.py``: the CLI, the inventory plugin, the Vagrantfile)
and by the playbooks' filters (``plugins/filter/sandbox_tenants.py``: hand-written
inventories and ``-e k0s_tenants=...``), so the two never disagree. The inventory hands the
roles each tenant's normalised prefix as ``key_prefix`` (``with_key_prefix``): no task
normalises a prefix again.

Each rule returns its complaint without the field's location; the caller says where
(``tenants[0] (ta).prefix: ...`` in a topology file, ``k0s_tenants (ta).prefix: ...`` in
an inventory).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# k0s's own message for an empty etcdPrefix (k0s v1.36 `k0s config validate`).
PREFIX_EMPTY = "spec.storage.etcd.externalCluster.etcdPrefix cannot be empty"

# Tenant names that would share an identity: the tenant's client certificate has CN <name>
# (its etcd user under RBAC) and is written to clients/<name>.{crt,key} by the PKI.
RESERVED_TENANT_NAMES = {
    "root": "etcd's root user, the CN of the sandbox's admin certificate: RBAC would not apply",
    "admin": "the PKI writes the sandbox's admin certificate (etcd user root) to clients/admin.*",
    "etcd-member": "the CN of every etcd member certificate, the only one the peer port admits",
}

# Tenant names and prefix segments as Kubernetes writes resource names (RFC 1123, lower-case
# ASCII): the name is a certificate's CN and an etcd user; the prefix an etcd RBAC key range
# and a path kube-apiserver joins.
TENANT_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
PREFIX_SEGMENT_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
PREFIX_MAX = 253


def normalize_prefix(prefix: str) -> str:
    """The prefix as kube-apiserver uses it: ``x``, ``/x`` and ``/x/`` are ``/x/``."""
    return "/" + str(prefix or "").strip("/") + "/"


def prefixes_overlap(a: str, b: str) -> bool:
    """True when two etcd prefixes, normalised as kube-apiserver does, share keys."""
    na, nb = normalize_prefix(a), normalize_prefix(b)
    return na.startswith(nb) or nb.startswith(na)


def name_error(name: str, members: Sequence[str] = (),
               reserved: Mapping[str, str] | None = None) -> str:
    """What is wrong with a tenant name ('' when nothing): written as Kubernetes names are,
    not reserved (RESERVED_TENANT_NAMES and ``reserved``: name -> why, e.g. a certificate CN
    the PKI is configured with), not an etcd member's name (``members``)."""
    taken = {**RESERVED_TENANT_NAMES, **(reserved or {})}
    if not TENANT_NAME_RE.match(name):
        return (f"'{name}' is not written as Kubernetes names are (the certificate's CN and "
                "etcd user): use lower-case ASCII letters, digits and '-' (at most 63), "
                "e.g. tenant-a")
    if name in taken:
        return f"'{name}' is reserved ({taken[name]}); rename the tenant"
    if name in members:
        return (f"'{name}' is also an etcd member's name (the member's certificate has that CN "
                "and would act as the tenant's etcd user); rename the tenant")
    return ""


def prefix_error(prefix: str) -> str:
    """What is wrong with a tenant prefix ('' when nothing): not empty, no '.', '..' or empty
    segment, every segment written as Kubernetes names are."""
    inner = str(prefix).strip("/")
    if not inner:
        return f"{PREFIX_EMPTY}; give the tenant a prefix such as 'k0s-tenant'"
    segments = inner.split("/")
    if {".", ".."} & set(segments) or "" in segments:
        return (f"'{prefix}' has a '.', '..' or empty segment; kube-apiserver joins the prefix "
                "as a path ('../t4' is '/t4/', 'z/..' the whole keyspace); write the prefix "
                "without them")
    bad = [seg for seg in segments if not PREFIX_SEGMENT_RE.match(seg)]
    if bad or len(str(prefix)) > PREFIX_MAX:
        shown = f" ({', '.join(repr(b) for b in bad)})" if bad else ""
        return (f"'{prefix}' is not written as Kubernetes names are{shown}: use lower-case "
                "ASCII letters, digits, '-' and '.' between the '/' (at most "
                f"{PREFIX_MAX} characters), e.g. 'tenant-a'")
    return ""


def max_bytes_error(value: Any) -> str:
    """What is wrong with a tenant's ``max_bytes`` ('' when nothing): a positive integer
    (its write budget: what its prefix and leases may take in the backend, enforced by the
    sandbox's etcd build; verify also compares its keys and values with it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return ""
    return (f"{value!r} is not a positive integer; give the tenant's write budget, the most bytes "
            "its prefix and leases may take in etcd, e.g. max_bytes: 104857600, or leave it out")


def tenant_errors(tenants: Sequence[Mapping[str, Any]], members: Sequence[str] = (),
                  where: str = "k0s_tenants", key_prefix: bool = True,
                  reserved: Mapping[str, str] | None = None) -> list[str]:
    """Every rule over a list of tenants ({name, prefix, controllers[, key_prefix,
    max_bytes]}): unique names of their own (name_error), prefixes written as Kubernetes names
    are that neither repeat nor nest, a controller each, ``max_bytes`` (when given) a positive
    integer and, with ``key_prefix``, the normalised prefix handed to the roles. ``where``
    names the list in the messages."""
    errors: list[str] = []
    seen: list[tuple[str, str, str]] = []
    for t in tenants or []:
        name, prefix = str(t.get("name") or ""), str(t.get("prefix") or "")
        if not name:
            errors.append(f"{where}: every tenant needs a name")
            continue
        if problem := name_error(name, members, reserved):
            errors.append(f"{where} ({name}).name: {problem}")
        if "max_bytes" in t and (problem := max_bytes_error(t["max_bytes"])):
            errors.append(f"{where} ({name}).max_bytes: {problem}")
        if problem := prefix_error(prefix):
            errors.append(f"{where} ({name}).prefix: {problem}")
            continue
        norm = normalize_prefix(prefix)
        if key_prefix and t.get("key_prefix") != norm:
            errors.append(f"{where} ({name}).key_prefix: '{t.get('key_prefix', '')}' is not the "
                          f"prefix as kube-apiserver uses it; give key_prefix: {norm} (the "
                          "sandbox_topology inventory plugin writes it itself)")
        for other_name, other_prefix, other in seen:
            if other_name == name:
                errors.append(f"{where}: duplicate tenant name '{name}'")
            elif prefixes_overlap(prefix, other_prefix):
                errors.append(
                    f"{where} ({other_name}, {name}): prefixes '{other_prefix}' and '{prefix}' "
                    f"overlap as {other} and {norm} (kube-apiserver normalises 'x' and '/x' to "
                    "'/x/'; 'a' and 'a/b' nest); give every tenant a prefix of its own")
        seen.append((name, prefix, norm))
        if not t.get("controllers"):
            errors.append(f"{where} ({name}).controllers: none; list at least one controller")
    return errors


def tenant_warnings(tenants: Sequence[Mapping[str, Any]], where: str = "k0s_tenants") -> list[str]:
    """The prefix ``registry`` is right only when taking over an embedded cluster's data."""
    return [f"{where} ({t.get('name')}): prefix 'registry' is kube-apiserver's default, the one "
            "k0s's embedded etcd uses; right only when taking over an embedded cluster's data"
            for t in tenants or [] if str(t.get("prefix") or "").strip("/") == "registry"]


def with_key_prefix(tenant: Mapping[str, Any]) -> dict[str, Any]:
    """The tenant as the inventory hands it to the roles: with ``key_prefix``, its prefix
    normalised once."""
    return {**tenant, "key_prefix": normalize_prefix(str(tenant.get("prefix") or ""))}
