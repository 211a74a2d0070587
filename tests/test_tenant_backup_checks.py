"""backup/restore --tenant: bad input is refused before any node changes. The CLI's own
checks (one line, exit 2, no playbook run), then playbooks/tenant-restore.yml's check of the
copy on the control node (a copy of another tenant, of another prefix, damaged, without its
manifest; and hostile copies whose manifest's sha256 was recomputed after the edit: a key of
another tenant's prefix, a manifest naming a path, a header or counts that disagree with the
manifest), which stops the run before any node is contacted. The operations themselves run
on real etcd in tests/test_sandbox_etcd_prefix.py and the Molecule scenario k0s_tenants."""

from __future__ import annotations

import base64
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


def _restore(tmp_path: Path, copy: Path, **more: str) -> str:
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
    extra = {"k0s_restore_tenant": "a", "k0s_restore_file": str(copy), **more}
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


def _record(key: bytes, value: bytes, mod: int = 5) -> dict[str, Any]:
    return {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode(),
            "create_revision": 3, "mod_revision": mod, "version": 1, "lease": 0}


def _copy(where: Path, records: list[dict[str, Any]], header: dict[str, Any] | None = None,
          **manifest: Any) -> Path:
    """A copy of tenant a as backup --tenant writes it (header, records, the manifest
    beside it), edited by ``header`` and ``manifest``; the manifest's sha256 is the copy's
    unless given: a hostile edit recomputes it."""
    size = sum(len(base64.b64decode(r["key"])) + len(base64.b64decode(r["value"]))
               for r in records if isinstance(r.get("key"), str))
    head = {"format": "k0s-etcd-sandbox tenant backup 1", "prefix": "/a/", "revision": 7,
            "cluster_id": "c0ffee", "key_count": len(records), "bytes": size, **(header or {})}
    copy = where / "a-x.tenant"
    copy.write_bytes("".join(json.dumps(x, sort_keys=True) + "\n" for x in [head, *records]).encode())
    fields = {"key_count": len(records), "bytes": size, "cluster_id": "c0ffee",
              "sha256": hashlib.sha256(copy.read_bytes()).hexdigest(), **manifest}
    (where / "a-x.tenant.manifest.json").write_text(json.dumps(_manifest(**fields)))
    return copy


GOOD = [_record(b"/a/crd/widgets", b"w"), _record(b"/a/example.sandbox/widgets/one", b"1")]


def test_the_playbook_goes_on_to_the_nodes_with_the_tenants_own_copy(tmp_path: Path) -> None:
    output = _restore(tmp_path, _copy(tmp_path, GOOD))
    assert "UNREACHABLE" in output and "Nothing was changed" not in output, output


# Each edited by hand with the manifest's sha256 recomputed: before, every one passed the
# control node's check and the restore went on to stop the tenant's API servers.
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("another-tenants-key", {"records": [*GOOD, _record(b"/b/secret", b"s")]},
     "the copy holds a key outside its prefix /a/ (a-x.tenant line 4: b'/b/secret')"),
    ("prefix-sibling", {"records": [*GOOD, _record(b"/a0/x", b"s")]}, "outside its prefix /a/"),
    ("manifest-file-path", {"manifest": {"file": "../../etc/k0s/k0s.yaml"}},
     "its manifest's file '../../etc/k0s/k0s.yaml' is not a file name"),
    ("header-prefix", {"header": {"prefix": "/b/"}},
     "holds a key outside its prefix /b/"),
    ("header-revision", {"header": {"revision": 99}},
     "its header says revision 99, its manifest 7: the copy or its manifest was edited"),
    ("manifest-counts", {"manifest": {"key_count": 5}},
     "its header says key_count 2, its manifest 5"),
    ("header-counts", {"header": {"key_count": 1}},
     "a-x.tenant holds 2 keys of 46 bytes, its header says 1 keys of 46 bytes"),
    ("repeated-key", {"records": [*GOOD, GOOD[1]]}, "is out of order or repeated"),
    ("marker-key", {"records": [*GOOD, _record(b"/a/k0sbox-restore-in-progress", b"{}")]},
     "the copy holds a key the in-progress marker"),
    ("changed-after-revision", {"records": [_record(b"/a/x", b"1", mod=8)]},
     "was changed at revision 8, after the copy's revision 7"),
    ("not-base64", {"records": [{**GOOD[0], "value": "%%%"}]}, "its key or value is not base64"),
    ("not-a-record", {"records": [{"key": 5}]}, "a-x.tenant line 2 is not a key of a tenant backup"),
]


@pytest.mark.parametrize(("edit", "expected"), [(e, x) for _, e, x in HOSTILE],
                         ids=[name for name, _, _ in HOSTILE])
def test_a_hostile_copy_is_refused_on_the_control_node_before_anything_stops(
        tmp_path: Path, edit: dict[str, Any], expected: str) -> None:
    copy = _copy(tmp_path, edit.get("records", GOOD), edit.get("header"), **edit.get("manifest", {}))
    output = _restore(tmp_path, copy)
    assert not output.startswith("rc=0") and expected in output, output
    assert "Nothing was changed" in output and "UNREACHABLE" not in output, output


def test_a_copy_restored_into_another_tenant_holds_only_its_own_keys(tmp_path: Path) -> None:
    """--as b: the copy of a may hold only keys of a's prefix (which move to b's); a copy
    edited to hold a key of b's prefix is refused too, before b's API servers stop."""
    copy = _copy(tmp_path, [*GOOD, _record(b"/b/x", b"b's own")])
    output = _restore(tmp_path, copy, k0s_restore_as="b")
    assert "outside its prefix /a/" in output and "UNREACHABLE" not in output, output
    output = _restore(tmp_path, _copy(tmp_path, GOOD), k0s_restore_as="b")
    assert "UNREACHABLE" in output and "Nothing was changed" not in output, output


def test_a_manifest_that_is_not_a_tenant_manifest_is_refused(tmp_path: Path) -> None:
    copy = _copy(tmp_path, GOOD)
    manifest = tmp_path / "a-x.tenant.manifest.json"
    for text, expected in [("{not json", "is not JSON"), ("[1, 2]", "not a tenant backup (manifest none)")]:
        manifest.write_text(text)
        output = _restore(tmp_path, copy)
        assert expected in output and "Nothing was changed" in output, output
        assert "UNREACHABLE" not in output, output


def test_templates_in_a_manifest_are_never_run(tmp_path: Path) -> None:
    """Ansible reads the manifest's fields as data: a template in one is printed, not run."""
    proof = tmp_path / "ran"
    copy = _copy(tmp_path, GOOD, tenant="{{ lookup('pipe', 'touch " + str(proof) + "') }}")
    output = _restore(tmp_path, copy)
    assert "a copy of tenant {{ lookup(" in output and "Nothing was changed" in output, output
    assert not proof.exists()
