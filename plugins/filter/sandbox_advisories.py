"""What is known against the etcd a member runs (plugins/plugin_utils/sandbox_advisories.py,
which ``scripts/sandbox status`` applies too, so both say the same):

- ``etcd --version output | sandbox_etcd_advisory_check(host, shared, accepted)``: verify's
  check (FAIL when tenants share the cluster and the build is affected by an advisory the
  operator did not accept in ``etcd_accepted_advisories``);
- ``etcd --version output | sandbox_etcd_advisories(accepted)``: the advisories it is affected
  by (id, cve, what, why, accepted), for up's warning;
- ``etcd --version output | sandbox_etcd_build_summary(accepted)``: one line.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils import (
    sandbox_advisories as adv,
)


def sandbox_etcd_advisory_check(version_text: str, host: str, shared: Any = False,
                                accepted: Any = None) -> dict[str, Any]:
    return adv.check(version_text or "", host, bool(shared), accepted or [])


def sandbox_etcd_advisories(version_text: str, accepted: Any = None) -> list[dict[str, Any]]:
    version, sha = adv.parse_version(version_text or "")
    return adv.affecting(version, sha, accepted or [])


def sandbox_etcd_build_summary(version_text: str, accepted: Any = None) -> str:
    version, sha = adv.parse_version(version_text or "")
    return adv.summary(version, sha, accepted or [])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_etcd_advisory_check": sandbox_etcd_advisory_check,
                "sandbox_etcd_advisories": sandbox_etcd_advisories,
                "sandbox_etcd_build_summary": sandbox_etcd_build_summary}
