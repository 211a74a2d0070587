"""Validation of k0s's external-etcd settings, with k0s's own messages.

k0s (v1.36) rejects a config at ``k0s install controller`` / ``k0s config validate`` with
the messages below; the sandbox adds its own checks on top (https:// endpoints need the TLS
files; tenant prefixes must not collide once normalised as kube-apiserver does). Running
them before any node changes gives the same answer k0s would, earlier.
"""

from __future__ import annotations

from typing import Any

K0S_ENDPOINTS_EMPTY = "spec.storage.etcd.externalCluster.endpoints cannot be null or empty"
K0S_ENDPOINTS_EMPTY_STRING = (
    "spec.storage.etcd.externalCluster.endpoints cannot contain empty strings")
K0S_PREFIX_EMPTY = "spec.storage.etcd.externalCluster.etcdPrefix cannot be empty"
K0S_TLS_ALL_OR_NONE = (
    "spec.storage.etcd.externalCluster is invalid: all TLS properties "
    "[caFile,clientCertFile,clientKeyFile] must be defined or none of those")
TLS_KEYS = ("caFile", "clientCertFile", "clientKeyFile")


def k0s_external_cluster_errors(config: dict[str, Any]) -> list[str]:
    """Errors k0s (and the sandbox) find in a ClusterConfig's external etcd settings."""
    storage = ((config or {}).get("spec") or {}).get("storage") or {}
    if storage.get("type", "etcd") != "etcd":
        return []
    ext = (storage.get("etcd") or {}).get("externalCluster")
    if ext is None:
        return []
    errors: list[str] = []
    endpoints = ext.get("endpoints")
    if not endpoints:
        errors.append(K0S_ENDPOINTS_EMPTY)
    elif any(not isinstance(e, str) or e.strip() == "" for e in endpoints):
        errors.append(K0S_ENDPOINTS_EMPTY_STRING)
    if not str(ext.get("etcdPrefix") or "").strip():
        errors.append(K0S_PREFIX_EMPTY)
    tls_set = [k for k in TLS_KEYS if str(ext.get(k) or "").strip()]
    if tls_set and len(tls_set) != len(TLS_KEYS):
        errors.append(K0S_TLS_ALL_OR_NONE)
    if not tls_set and any(isinstance(e, str) and e.startswith("https://")
                           for e in endpoints or []):
        errors.append(
            "spec.storage.etcd.externalCluster: https:// endpoints need caFile, clientCertFile "
            "and clientKeyFile (k0s passes no TLS flags without them and kube-apiserver fails "
            "at run time); set the three files or use http:// endpoints (etcd_tls: false)")
    for e in endpoints or []:
        if isinstance(e, str) and e and not e.startswith(("http://", "https://")):
            errors.append(f"spec.storage.etcd.externalCluster.endpoints: '{e}' needs a scheme "
                          "(https://host:2379 or http://host:2379)")
    return errors


def k0s_normalize_prefix(prefix: str) -> str:
    """The prefix as kube-apiserver uses it: ``k0s-tenant`` and ``/k0s-tenant`` -> ``/k0s-tenant/``."""
    return "/" + str(prefix).strip("/") + "/"


def k0s_tenant_errors(tenants: list[dict[str, Any]]) -> list[str]:
    """Tenants need unique names and prefixes that neither repeat nor nest."""
    errors: list[str] = []
    seen: list[tuple[str, str]] = []
    for t in tenants or []:
        name = str(t.get("name") or "")
        prefix = str(t.get("prefix") or "")
        if not name:
            errors.append("k0s_tenants: every tenant needs a name")
            continue
        if not prefix.strip("/"):
            errors.append(f"k0s_tenants ({name}): {K0S_PREFIX_EMPTY}; give the tenant a prefix")
            continue
        norm = k0s_normalize_prefix(prefix)
        for other_name, other in seen:
            if other_name == name:
                errors.append(f"k0s_tenants: duplicate tenant name '{name}'")
            elif norm.startswith(other) or other.startswith(norm):
                errors.append(
                    f"k0s_tenants ({other_name}, {name}): prefixes overlap as {other} and {norm}"
                    " (kube-apiserver normalises 'x' and '/x' to '/x/'; 'a' and 'a/b' nest); "
                    "give every tenant a prefix of its own")
        seen.append((name, norm))
        if not t.get("controllers"):
            errors.append(f"k0s_tenants ({name}): no controllers; list at least one controller")
    return errors


def k0s_tenant_warnings(tenants: list[dict[str, Any]]) -> list[str]:
    return [
        f"k0s_tenants ({t.get('name')}): prefix 'registry' is kube-apiserver's default, the one "
        "k0s's embedded etcd uses; it is right only when taking over an embedded cluster's data"
        for t in tenants or [] if str(t.get("prefix") or "").strip("/") == "registry"
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "k0s_external_cluster_errors": k0s_external_cluster_errors,
            "k0s_tenant_errors": k0s_tenant_errors,
            "k0s_tenant_warnings": k0s_tenant_warnings,
            "k0s_normalize_prefix": k0s_normalize_prefix,
        }
