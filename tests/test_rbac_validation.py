"""etcd_rbac: true with tls: false is rejected by playbooks/validate.yml (site.yml's first
phase) with a message naming the field and the fix, before any node is contacted: the hosts
point at a closed port on loopback, so a play that went on would report them unreachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _validate(tmp_path: Path, tls: bool, extra: dict[str, Any]) -> tuple[int, str]:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    tenants = [{"name": "a", "prefix": "k0s", "controllers": ["c1"], "key_prefix": "/k0s/"}]
    inv = {"all": {"vars": {"etcd_tls": tls, "k0s_tenants": tenants},
                   "children": {
                       "etcd": {"hosts": {"e1": {**unreachable, "node_address": "10.213.97.11"}}},
                       "k0s_controller": {"hosts": {"c1": {**unreachable, "k0s_tenant": "a",
                                                           "node_address": "10.213.97.21"}}}}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(path),
           str(REPO / "playbooks" / "validate.yml"),
           "-e", json.dumps({"pki_dir": str(tmp_path / "pki"), **extra})]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


@pytest.mark.parametrize("value", [True, "true"], ids=["bool", "string-from-set"])
def test_rbac_without_tls_is_rejected(tmp_path: Path, value: Any) -> None:
    rc, output = _validate(tmp_path, tls=False, extra={"etcd_rbac": value})
    assert rc != 0, output
    assert "etcd_rbac: true needs TLS" in output, output
    assert "Set tls: true in the topology, or etcd_rbac: false" in output, output
    assert "UNREACHABLE" not in output


@pytest.mark.parametrize(("tls", "rbac"), [(False, False), (True, True)],
                         ids=["plain-without-rbac", "tls-with-rbac"])
def test_allowed_combinations_pass(tmp_path: Path, tls: bool, rbac: bool) -> None:
    rc, output = _validate(tmp_path, tls=tls, extra={"etcd_rbac": rbac})
    assert rc == 0, output
    assert "etcd_rbac: true needs TLS" not in output
