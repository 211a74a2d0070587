"""What the hostile-tenant suite found (plugins/plugin_utils/sandbox_attacks.py, which
``scripts/sandbox attack`` applies too, so both say the same):

- ``hostile_tenant.py's result | sandbox_attack_check``: the attacking tenant's check (FAIL
  when an attempt succeeded or got no answer that says either);
- ``hostile_admin.py's finish result | sandbox_attack_finish_check``: auth as the attempts
  left it, every tenant's keys as before, the cluster healthy, no alarm left;
- ``hostile_flood.py's results | sandbox_flood_checks``: the flood's three checks.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils import (
    sandbox_attacks as attacks,
)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_attack_check": attacks.check,
                "sandbox_attack_finish_check": attacks.finish_check,
                "sandbox_flood_checks": attacks.flood_checks}
