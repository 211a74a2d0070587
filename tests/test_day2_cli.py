"""scripts/sandbox backup/restore/reset/rotate-certs: bad input fails with one line, exit 2,
before any playbook runs (no log, no node contacted): among it a snapshot without its
manifest or of another sandbox (without --foreign), a manifest of another file, a restore
rolling back several tenants without --yes. The operations themselves are tested on real
etcd by the Molecule scenarios etcd_backup_restore and etcd_rbac_rotation, and through the
CLI by tests/test_cli_e2e.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from conftest import base_topology, run_sandbox


def _one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    # The registry-prefix warning of the takeover tests is not an error line.
    lines = [ln for ln in res.stderr.splitlines()
             if not ln.startswith(("bootstrap:", "sandbox: warning: tenants"))]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("sandbox: error: ")
    return lines[0]


def _topology(write_topology: Callable[..., Path], name: str) -> Path:
    doc = base_topology()
    doc["name"] = name
    return write_topology(doc)


def test_restore_missing_file(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-a")
    res = run_sandbox(["restore", "-t", str(topo), str(tmp_path / "none.db")], tmp_path)
    assert "not found" in _one_line_error(res)
    assert not (tmp_path / "t-day2-a" / "logs").exists()


def test_restore_without_checksum(tmp_path: Path,
                                  write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-b")
    snap = tmp_path / "etcd-x.db"
    snap.write_bytes(b"not really a snapshot")
    res = run_sandbox(["restore", "-t", str(topo), str(snap)], tmp_path)
    assert "etcd-x.db.sha256' is missing" in _one_line_error(res)


def test_restore_wrong_checksum(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-c")
    snap = tmp_path / "etcd-x.db"
    snap.write_bytes(b"snapshot bytes")
    (tmp_path / "etcd-x.db.sha256").write_text("0" * 64 + "  etcd-x.db\n")
    res = run_sandbox(["restore", "-t", str(topo), str(snap)], tmp_path)
    line = _one_line_error(res)
    assert hashlib.sha256(b"snapshot bytes").hexdigest() in line
    assert "corrupt" in line and "nothing was changed" in line
    assert not (tmp_path / "t-day2-c" / "logs").exists()


def test_reset_unknown_tenant(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-d")
    res = run_sandbox(["reset", "-t", str(topo), "--tenant", "nope"], tmp_path)
    line = _one_line_error(res)
    assert "reset --tenant: no tenant 'nope'" in line and "tenants: ta" in line
    assert not (tmp_path / "t-day2-d" / "logs").exists()


def test_reset_tenant_refuses_controller_that_is_an_etcd_member(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-day2-k"
    doc["nodes"][1]["groups"] = ["k0s_controller", "etcd"]   # c1 is also an etcd member
    doc["nodes"].append({"name": "e2", "groups": ["etcd"], "host": 12})   # 3 members
    res = run_sandbox(["reset", "-t", str(write_topology(doc)), "--tenant", "ta"], tmp_path)
    line = _one_line_error(res)
    assert "reset --tenant ta: c1 is also in the etcd group" in line, line
    assert "deletes the system user `etcd`" in line and "Nothing was changed" in line
    assert not (tmp_path / "t-day2-k" / "logs").exists()


def test_reset_tenant_with_pki(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-e")
    res = run_sandbox(["reset", "-t", str(topo), "--tenant", "ta", "--pki"], tmp_path)
    line = _one_line_error(res)
    assert "reset --tenant: --pki goes with a cluster-wide reset" in line and "nothing was changed" in line
    assert not (tmp_path / "t-day2-e" / "logs").exists()


def test_replace_member_not_a_member(tmp_path: Path,
                                     write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-f")
    res = run_sandbox(["replace-member", "-t", str(topo), "c1"], tmp_path)
    line = _one_line_error(res)
    assert "'c1' is not an etcd member" in line and "members: e1" in line


def test_replace_member_single(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-g")
    res = run_sandbox(["replace-member", "-t", str(topo), "e1"], tmp_path)
    assert "restore a backup instead" in _one_line_error(res)


def _registry_topology(write_topology: Callable[..., Path], name: str,
                       prefix: str = "registry") -> Path:
    doc = base_topology()
    doc["name"] = name
    doc["tenants"][0]["prefix"] = prefix
    return write_topology(doc)


def test_takeover_wrong_prefix(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _registry_topology(write_topology, "t-day2-h", prefix="k0s")
    snap = tmp_path / "embedded.db"
    snap.write_bytes(b"snapshot bytes")
    res = run_sandbox(["takeover", "-t", str(topo), str(snap), "--tenant", "ta"], tmp_path)
    line = _one_line_error(res)
    assert "tenants (ta).prefix is 'k0s' (kube-apiserver uses /k0s/)" in line
    assert "set prefix: registry for tenant ta" in line and "nothing was changed" in line
    assert not (tmp_path / "t-day2-h" / "logs").exists()


def test_takeover_unknown_tenant(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _registry_topology(write_topology, "t-day2-i")
    res = run_sandbox(["takeover", "-t", str(topo), "x.db", "--tenant", "nope"], tmp_path)
    line = _one_line_error(res)
    assert "no tenant 'nope'" in line and "tenants: ta" in line


def test_takeover_archive_or_missing(tmp_path: Path,
                                     write_topology: Callable[..., Path]) -> None:
    topo = _registry_topology(write_topology, "t-day2-j")
    archive = tmp_path / "k0s_backup_2026.tar.gz"
    archive.write_bytes(b"archive")
    res = run_sandbox(["takeover", "-t", str(topo), str(archive), "--tenant", "ta"], tmp_path)
    assert "extract the etcd snapshot" in _one_line_error(res)
    res = run_sandbox(["takeover", "-t", str(topo), str(tmp_path / "none.db"),
                       "--tenant", "ta"], tmp_path)
    assert "'" + str(tmp_path / "none.db") + "' not found" in _one_line_error(res)


def test_upgrade_etcd_refuses_a_malformed_version(tmp_path: Path,
                                                  write_topology: Callable[..., Path]) -> None:
    """Only the form is the CLI's to check; health, one minor step and no downgrade are
    the playbook's first play (tested in the crd_apiserver scenario)."""
    topo = _topology(write_topology, "t-day2-u")
    for bad in ("3.5", "v3.5.30", "3.5.30-2", "latest"):
        res = run_sandbox(["upgrade-etcd", "-t", str(topo), "--to", bad], tmp_path)
        line = _one_line_error(res)
        assert f"--to '{bad}' is not an etcd version such as 3.5.30" in line
        assert "nothing was changed" in line
    assert not (tmp_path / "t-day2-u" / "logs").exists()


def test_remove_member_refuses_a_non_member_and_the_last_one(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    """Quorum, an even count and an unhealthy cluster are the playbook's first play
    (tested in the etcd_grow_takeover scenario); these two need no node."""
    topo = _topology(write_topology, "t-day2-r")
    line = _one_line_error(run_sandbox(["remove-member", "-t", str(topo), "c1"], tmp_path))
    assert "'c1' is not an etcd member of topology 't-day2-r' (e1)" in line
    line = _one_line_error(run_sandbox(["remove-member", "-t", str(topo), "e1"], tmp_path))
    assert "removing e1 would leave no etcd member" in line
    assert not (tmp_path / "t-day2-r" / "logs").exists()


def _snapshot(tmp_path: Path, name: str = "etcd-x.db", manifest: dict | None = None) -> Path:
    """A file with a matching .sha256 (and a manifest, when given; its sha256 filled in)."""
    snap = tmp_path / name
    snap.write_bytes(b"snapshot bytes")
    digest = hashlib.sha256(b"snapshot bytes").hexdigest()
    (tmp_path / f"{name}.sha256").write_text(f"{digest}  {name}\n")
    if manifest is not None:
        (tmp_path / f"{name}.manifest.json").write_text(
            json.dumps({"sha256": digest, **manifest}))
    return snap


def test_restore_without_manifest_needs_foreign(tmp_path: Path,
                                                write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-m")
    res = run_sandbox(["restore", "-t", str(topo), str(_snapshot(tmp_path))], tmp_path)
    line = _one_line_error(res)
    assert "etcd-x.db has no manifest (etcd-x.db.manifest.json, written by scripts/sandbox " \
           "backup): nothing says which cluster it is of" in line
    assert "it would replace the whole etcd keyspace of sandbox 't-day2-m' (every tenant's " \
           "data: ta (/ta/); users, roles, auth)" in line
    assert "--foreign to replace it anyway; nothing was changed" in line
    assert not (tmp_path / "t-day2-m" / "logs").exists()


def test_restore_of_another_sandbox_needs_foreign(tmp_path: Path,
                                                  write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-n")
    snap = _snapshot(tmp_path, manifest={
        "sandbox": "elsewhere", "cluster_id": "abc123", "members": ["e1", "e2", "e3"],
        "created": "20260101T000000Z", "revision": 42, "key_count": 7,
        "auth": {"enabled": False}, "tenants": [{"name": "t", "prefix": "/t/", "key_count": 5}]})
    line = _one_line_error(run_sandbox(["restore", "-t", str(topo), str(snap)], tmp_path))
    assert ("etcd-x.db is a snapshot of another sandbox: sandbox elsewhere, etcd cluster abc123 "
            "(members e1, e2, e3), taken 20260101T000000Z at revision 42: 7 keys; t 5 keys "
            "under /t/; auth off") in line
    assert "--foreign to replace it anyway; nothing was changed" in line
    assert not (tmp_path / "t-day2-n" / "logs").exists()


def test_restore_refuses_a_manifest_of_another_file(tmp_path: Path,
                                                    write_topology: Callable[..., Path]) -> None:
    topo = _topology(write_topology, "t-day2-o")
    snap = _snapshot(tmp_path, manifest={"sandbox": "t-day2-o"})
    (tmp_path / "etcd-x.db.manifest.json").write_text(json.dumps({"sha256": "0" * 64}))
    for extra in ([], ["--foreign"]):
        line = _one_line_error(run_sandbox(["restore", "-t", str(topo), str(snap), *extra],
                                           tmp_path))
        assert f"etcd-x.db.manifest.json describes a snapshot with sha256 {'0' * 64}" in line


def test_restore_with_several_tenants_asks_for_yes(tmp_path: Path,
                                                   write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-day2-p"
    doc["nodes"].append({"name": "c2", "groups": ["k0s_controller"], "host": 22})
    doc["tenants"].append({"name": "tb", "prefix": "/tb/", "controllers": ["c2"]})
    topo = write_topology(doc)
    snap = _snapshot(tmp_path, manifest={"sandbox": "t-day2-p", "cluster_id": "1"})
    res = run_sandbox(["restore", "-t", str(topo), str(snap)], tmp_path, stdin="")
    line = _one_line_error(res)
    assert "restore is cluster-wide: every tenant rolls back to the snapshot: ta (/ta/), " \
           "tb (/tb/); what they wrote since is lost" in res.stdout
    assert ("topology 't-day2-p' has 2 tenants (ta (/ta/), tb (/tb/)) and the restore rolls "
            "every one of them back; give --yes to go on (not asked: standard input is not a "
            "terminal); nothing was changed") in line
    assert not (tmp_path / "t-day2-p" / "logs").exists()


def test_takeover_of_a_snapshot_without_manifest_needs_foreign(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    topo = _registry_topology(write_topology, "t-day2-q")
    snap = tmp_path / "embedded.db"
    snap.write_bytes(b"snapshot bytes")
    line = _one_line_error(run_sandbox(["takeover", "-t", str(topo), str(snap), "--tenant", "ta"],
                                       tmp_path))
    assert line.startswith("sandbox: error: takeover: embedded.db has no manifest")
    assert "--foreign to replace it anyway; nothing was changed" in line
    assert not (tmp_path / "t-day2-q" / "logs").exists()
