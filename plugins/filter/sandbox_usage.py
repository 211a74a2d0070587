"""Each tenant's usage of the shared etcd for the playbooks (verify's usage phase,
playbooks/tenant-usage.yml): plugins/plugin_utils/sandbox_usage.py, which ``scripts/sandbox
status`` applies too, so both say the same.

- ``controllers' hostvars | sandbox_tenant_usage(k0s_tenants, quota)``: one entry per tenant
  (keys, bytes, revision, share of the backend quota, max_bytes, over or not; ``error`` when
  the read failed) from the module results ``k0s_tenant_usage``;
- ``entry | sandbox_usage_line``: one line of it; ``entry | sandbox_usage_check``: verify's
  check (FAIL when over max_bytes, naming the tenant, its bytes and its max_bytes);
- ``member settings | sandbox_quota_bytes(etcd_quota_backend_bytes)``: the quota a member
  runs with (ETCD_QUOTA_BACKEND_BYTES), else as the etcd role sets it.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils import (
    sandbox_usage as usage,
)


def sandbox_tenant_usage(hosts: list[Any], tenants: list[dict[str, Any]],
                         quota: Any = None) -> list[dict[str, Any]]:
    return usage.entries(hosts or [], tenants or [], quota)


def sandbox_quota_bytes(settings: list[str], fallback: Any = None) -> int:
    """The quota of the member's ETCD_QUOTA_BACKEND_BYTES, else as the etcd role sets it
    (``fallback``: etcd_quota_backend_bytes, else the role's default)."""
    return usage.quota(settings=settings or [], configured=fallback)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_tenant_usage": sandbox_tenant_usage,
                "sandbox_usage_line": usage.line,
                "sandbox_usage_check": usage.check,
                "sandbox_quota_bytes": sandbox_quota_bytes}
