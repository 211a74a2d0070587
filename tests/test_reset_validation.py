"""playbooks/reset.yml refuses, before any node is contacted, what it cannot do safely."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def _reset(tmp_path: Path, extra: dict[str, Any]) -> str:
    """playbooks/reset.yml on a topology whose controller c1 is also an etcd member."""
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    tenants = [{"name": "a", "prefix": "a", "controllers": ["c1"]},
               {"name": "b", "prefix": "b", "controllers": ["c2"]}]
    inv = {"all": {"vars": {"k0s_tenants": tenants},
                   "children": {"etcd": {"hosts": {"c1": {**unreachable, "k0s_tenant": "a"},
                                                   "e2": unreachable, "e3": unreachable}},
                                "k0s_controller": {"hosts": {"c1": {}, "c2": {**unreachable, "k0s_tenant": "b"}}}}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(path),
           str(REPO / "playbooks" / "reset.yml"), "-e", json.dumps(extra)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode != 0
    return " ".join((result.stdout + result.stderr).split())


def test_reset_tenant_refuses_a_controller_that_is_an_etcd_member(tmp_path: Path) -> None:
    """`k0s reset` deletes the system user etcd: with reset_tenant (etcd keeps running) the
    play stops before any node is contacted, naming the node and the fix."""
    output = _reset(tmp_path, {"reset_tenant": "a"})
    assert "reset_tenant=a: c1 is also in the etcd group" in output, output
    assert "deletes the system user `etcd`" in output and "Nothing was changed" in output
    assert "reset everything (playbooks/reset.yml without reset_tenant" in output
    assert "UNREACHABLE" not in output


def test_reset_of_another_tenant_or_everything_is_not_refused(tmp_path: Path) -> None:
    """Tenant b's controller is no etcd member; a full reset removes etcd from c1 as well.
    Neither is refused: the play goes on to the nodes (unreachable here)."""
    for extra in ({"reset_tenant": "b"}, {}):
        output = _reset(tmp_path, extra)
        assert "also in the etcd group" not in output, output
        assert "UNREACHABLE" in output, output

