"""backup/restore --tenant: bad input is refused before any node changes. The CLI's own
checks (one line, exit 2, no playbook run), then playbooks/tenant-restore.yml's check of the
copy on the control node (a copy of another tenant, of another prefix, damaged, without its
manifest), which stops the run before any node is contacted. The operations themselves run
on real etcd in tests/test_sandbox_etcd_prefix.py and the Molecule scenario k0s_tenants."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import base_topology, run_sandbox

REPO = Path(__file__).resolve().parents[1]


def _topology(write_topology: Callable[..., Path]) -> Path:
    doc = base_topology()
    doc["name"] = "t-tenant-data"
    return write_topology(doc)


def _error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("bootstrap:")]
    assert len(lines) == 1 and lines[0].startswith("sandbox: error: "), res.stderr
    return lines[0]


def test_the_cli_refuses_an_unknown_tenant_and_cluster_wide_options(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = str(_topology(write_topology))
    line = _error(run_sandbox(["backup", "-t", topo, "--tenant", "nobody"], tmp_path))
    assert "backup --tenant: no tenant 'nobody' in topology 't-tenant-data'; tenants: ta" in line
    line = _error(run_sandbox(["backup", "-t", topo, "--tenant", "ta", "--member", "e1"], tmp_path))
    assert "--member goes with a cluster-wide backup" in line
    copy = tmp_path / "ta-x.tenant"
    copy.write_text("{}\n")
    line = _error(run_sandbox(["restore", "-t", topo, "--tenant", "ta", "--foreign", str(copy)],
                              tmp_path))
    assert "--foreign goes with a cluster-wide restore" in line and "nothing was changed" in line
    line = _error(run_sandbox(["restore", "-t", topo, "--tenant", "ta", str(tmp_path / "no")],
                              tmp_path))
    assert "'" + str(tmp_path / "no") + "' not found" in line
    line = _error(run_sandbox(["restore", "-t", topo, "--tenant", "ta", "--as", "ta", str(copy)],
                              tmp_path))
    assert "restore --as: 'ta' is not another tenant of topology 't-tenant-data'" in line
    line = _error(run_sandbox(["restore", "-t", topo, "--as", "ta", str(copy)], tmp_path))
    assert "--as and --force go with --tenant T" in line
    assert not (tmp_path / "t-tenant-data" / "logs").exists()


def _restore(tmp_path: Path, copy: Path) -> str:
    """playbooks/tenant-restore.yml on an inventory whose nodes cannot be reached."""
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    tenants = [{"name": "a", "prefix": "a", "key_prefix": "/a/", "controllers": ["c1"]},
               {"name": "b", "prefix": "b", "key_prefix": "/b/", "controllers": ["c2"]}]
    inv = {"all": {"vars": {"k0s_tenants": tenants},
                   "children": {"etcd": {"hosts": {"e1": unreachable}},
                                "k0s_controller": {"hosts": {
                                    "c1": {**unreachable, "k0s_tenant": "a"},
                                    "c2": {**unreachable, "k0s_tenant": "b"}}}}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    extra = {"k0s_restore_tenant": "a", "k0s_restore_file": str(copy)}
    result = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(path),
                             str(REPO / "playbooks" / "tenant-restore.yml"), "-e", json.dumps(extra)],
                            capture_output=True, text=True, env=env, timeout=300, check=False)
    return f"rc={result.returncode} " + " ".join((result.stdout + result.stderr).split())


def _manifest(**changes: Any) -> dict[str, Any]:
    return {"manifest": "k0s-etcd-sandbox tenant backup 1", "file": "a-x.tenant", "tenant": "a",
            "prefix": "/a/", "revision": 7, "key_count": 0, "bytes": 0, **changes}


@pytest.mark.parametrize(("manifest", "expected"), [
    (None, "no manifest beside it"),
    (_manifest(tenant="b"), "a copy of tenant b, not of a"),
    (_manifest(prefix="/b/"), "a copy of prefix /b/ but tenant a uses /a/"),
    (_manifest(sha256="0" * 64), "its manifest says " + "0" * 64 + ": damaged or not that copy"),
], ids=["no-manifest", "other-tenant", "other-prefix", "damaged"])
def test_the_playbook_refuses_a_copy_that_is_not_the_tenants_before_any_node(
        tmp_path: Path, manifest: dict[str, Any] | None, expected: str) -> None:
    copy = tmp_path / "a-x.tenant"
    copy.write_bytes(b'{"format": "k0s-etcd-sandbox tenant backup 1"}\n')
    if manifest is not None:
        manifest.setdefault("sha256", hashlib.sha256(copy.read_bytes()).hexdigest())
        (tmp_path / "a-x.tenant.manifest.json").write_text(json.dumps(manifest))
    output = _restore(tmp_path, copy)
    assert not output.startswith("rc=0") and expected in output, output
    assert "Nothing was changed" in output and "UNREACHABLE" not in output


def test_the_playbook_goes_on_to_the_nodes_with_the_tenants_own_copy(tmp_path: Path) -> None:
    copy = tmp_path / "a-x.tenant"
    copy.write_bytes(b'{"format": "k0s-etcd-sandbox tenant backup 1"}\n')
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    (tmp_path / "a-x.tenant.manifest.json").write_text(json.dumps(_manifest(sha256=digest)))
    output = _restore(tmp_path, copy)
    assert "UNREACHABLE" in output and "Nothing was changed" not in output, output
