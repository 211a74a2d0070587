"""The tenant rules for the playbooks and roles: plugins/plugin_utils/sandbox_tenants.py, the one
module the topology (CLI, inventory plugin) applies too, so hand-written inventories and
``-e k0s_tenants=...`` are held to exactly the same rules.

- ``k0s_tenants | sandbox_tenant_errors(members[, reserved])``: every broken rule, one line each naming
  the field and the fix (names, prefixes, overlaps, controllers, ``key_prefix``);
- ``k0s_tenants | sandbox_tenant_warnings``: the prefix ``registry``.

The roles read each tenant's normalised prefix from ``key_prefix`` (the inventory plugin
writes it; a hand-written inventory states it, and sandbox_tenant_errors checks it).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils import (
    sandbox_tenants as tenants,
)


def sandbox_tenant_errors(tenant_list: list[dict[str, Any]], members: list[str] | None = None,
                          reserved: dict[str, str] | None = None) -> list[str]:
    """``members``: the etcd members' names; ``reserved``: more names no tenant may have
    (name -> why: the certificate CNs the PKI is configured with)."""
    return tenants.tenant_errors(tenant_list or [], members or [], reserved=reserved)


def sandbox_tenant_warnings(tenant_list: list[dict[str, Any]]) -> list[str]:
    return tenants.tenant_warnings(tenant_list or [])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_tenant_errors": sandbox_tenant_errors,
                "sandbox_tenant_warnings": sandbox_tenant_warnings}
