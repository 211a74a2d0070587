"""Guards of roles/k0s_controller: what the inventory asks against what runs on the nodes.

Facts from k0s v1.36.3+k0s.2: k0s reads k0s.yaml once, when `k0s controller` starts
(cmd/controller/controller.go:463-477), and passes etcdPrefix to kube-apiserver verbatim
(pkg/component/controller/apiserver.go:347-349): a prefix or endpoint change rolled one
controller at a time leaves a tenant's controllers on two storages meanwhile, and a new
prefix is an empty cluster that keeps the old CA. A controller without a CA and without a
join token bootstraps a new CA and service-account key (controller.go:751-762,
pkg/certificate/manager.go:56-62), even over a prefix that holds an older cluster's data.
"""

from __future__ import annotations

from typing import Any

# THE prefix rule (kube-apiserver's normalisation) is plugins/plugin_utils/sandbox_tenants.py's.
from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils.sandbox_tenants import (
    normalize_prefix,
)

# The k0s test double (tests/k0s-test-double) says this in its first lines.
TEST_DOUBLE_MARKER = "k0s test double (not k0s)"
TAKEOVER_PKI_FILES = ("ca.crt", "ca.key", "sa.key", "sa.pub")


def k0s_binary_is_test_double(path: Any) -> bool:
    """Whether the file at ``path`` is the project's k0s test double (its first 4 KiB)."""
    try:
        with open(str(path), "rb") as fh:
            return TEST_DOUBLE_MARKER.encode() in fh.read(4096)
    except OSError:
        return False


def _ext(config: Any) -> dict[str, Any]:
    spec = (config or {}).get("spec") or {} if isinstance(config, dict) else {}
    return ((spec.get("storage") or {}).get("etcd") or {}).get("externalCluster") or {}


def k0s_storage_change_errors(old: Any, new: Any, host: str, tenant: str,
                              endpoints_allowed: Any = False) -> list[str]:
    """Refusals for a controller where k0s is installed (``old``: its k0s.yaml, ``new``:
    the one the role would write): another prefix, or other endpoints unless the playbook
    changes them one controller at a time (add-members.yml, remove-member.yml)."""
    before, after = _ext(old), _ext(new)
    if not before:
        return []
    errors = []
    if normalize_prefix(before.get("etcdPrefix")) != normalize_prefix(after.get("etcdPrefix")):
        errors.append(
            f"{host}: k0s_tenants ({tenant}).prefix: k0s runs here on "
            f"{normalize_prefix(before.get('etcdPrefix'))} and the inventory now says "
            f"{normalize_prefix(after.get('etcdPrefix'))}. k0s reads k0s.yaml only when a controller starts, "
            "so the tenant's controllers would serve two prefixes while they restart one at a "
            "time, and the new prefix is an empty cluster that keeps the old CA. Nothing was "
            "changed. To move the tenant: set its prefix back, reset it (scripts/sandbox reset "
            f"--tenant {tenant}, or playbooks/reset.yml -e reset_tenant={tenant}: its k0s and its "
            "keys go), then set the new prefix and run scripts/sandbox up (playbooks/site.yml)")
    old_eps = sorted(str(e) for e in before.get("endpoints") or [])
    new_eps = sorted(str(e) for e in after.get("endpoints") or [])
    if old_eps != new_eps and not _truthy(endpoints_allowed):
        errors.append(
            f"{host}: the etcd endpoints of k0s.yaml would change from {', '.join(old_eps)} to "
            f"{', '.join(new_eps)} while k0s is installed here (tenant {tenant}). Nothing was "
            "changed. The endpoints follow the etcd cluster's members: grow or shrink it with "
            "scripts/sandbox add-members / remove-member (playbooks/add-members.yml, "
            "remove-member.yml), which roll the controllers one at a time; to point the tenant "
            f"at another etcd cluster, reset it first (scripts/sandbox reset --tenant {tenant})")
    return errors


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "yes", "1")


def k0s_first_start_errors(keys: Any, tenant: str, key_prefix: str, takeover: Any) -> list[str]:
    """The refusal of a tenant's first start over a prefix (``key_prefix``: as kube-apiserver
    uses it) that already holds ``keys`` keys, unless the user says it is a takeover."""
    count = int(keys or 0)
    if count == 0 or _truthy(takeover):
        return []
    return [
        (f"k0s_tenants ({tenant}): etcd already holds {count} key(s) under {key_prefix} and no "
         "controller of the tenant has k0s: its first controller would start a NEW cluster (a "
         "new CA and service-account key) over that data, and everything the old cluster issued "
         "(kubeconfigs, service-account and join tokens, node certificates) would be rejected. "
         "Nothing was changed. Either delete that data (scripts/sandbox reset --tenant "
         f"{tenant}), or take the cluster over: set k0s_takeover: true, and k0s_takeover_pki_dir "
         "to a control-node directory with its ca.crt, ca.key, sa.key and sa.pub (the old "
         "controller's /var/lib/k0s/pki) to keep its credentials")]


def k0s_takeover_pki_errors(directory: Any, present: Any) -> list[str]:
    """k0s_takeover_pki_dir must hold the four files (``present``: the names found there)."""
    if not directory:
        return []
    missing = [f for f in TAKEOVER_PKI_FILES if f not in (present or [])]
    if not missing:
        return []
    return [(f"k0s_takeover_pki_dir: {directory} lacks {', '.join(missing)}; copy ca.crt, ca.key, "
            "sa.key and sa.pub from the old controller's /var/lib/k0s/pki there (or unset it)")]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "k0s_binary_is_test_double": k0s_binary_is_test_double,
            "k0s_storage_change_errors": k0s_storage_change_errors,
            "k0s_first_start_errors": k0s_first_start_errors,
            "k0s_takeover_pki_errors": k0s_takeover_pki_errors,
        }
