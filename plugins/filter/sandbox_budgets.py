"""The tenants' write budgets for the playbooks (roles/etcd's budgets phase, the validation
play, verify): plugins/plugin_utils/sandbox_budgets.py, which the topology and ``scripts/sandbox
status`` apply too, so all say the same.

- ``k0s_tenants | sandbox_tenant_budgets(quota, share)``: each tenant's budget
  ({name, prefix, bytes, source});
- ``k0s_tenants | sandbox_budget_errors(quota, share)``: why the budgets cannot hold ([] when
  they can), each naming the fields and the fix;
- ``budget | sandbox_budget_value``: the value of its key ``k0sbox/budget/<tenant>``;
- ``metrics text | sandbox_budget_metrics``: a member's figures per tenant;
- ``budgets | sandbox_budget_checks(members' figures)``: verify's check per tenant.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils import (
    sandbox_budgets as budgets,
)
from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils import (
    sandbox_usage as usage,
)


def sandbox_tenant_budgets(tenants: list[dict[str, Any]], quota: Any = None,
                           share: Any = budgets.DEFAULT_SHARE) -> list[dict[str, Any]]:
    return budgets.budgets(tenants or [], usage.role_quota(quota), share)


def sandbox_budget_errors(tenants: list[dict[str, Any]], quota: Any = None,
                          share: Any = budgets.DEFAULT_SHARE) -> list[str]:
    return budgets.budget_errors(tenants or [], usage.role_quota(quota), share)


def sandbox_budget_checks(wanted: list[dict[str, Any]], members: dict[str, Any],
                          accepted: list[str] | None = None) -> list[dict[str, Any]]:
    return budgets.member_checks(wanted or [], {m: budgets.parse_metrics(t) if isinstance(t, str) else t
                                                for m, t in (members or {}).items()}, accepted or [])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_tenant_budgets": sandbox_tenant_budgets,
                "sandbox_budget_errors": sandbox_budget_errors,
                "sandbox_budget_value": budgets.config_value,
                "sandbox_budget_metrics": budgets.parse_metrics,
                "sandbox_budget_checks": sandbox_budget_checks}
