"""What ``restore`` and ``takeover`` check on the control node before any playbook runs: the
snapshot's sha256, its manifest (which cluster it is of: ``backup`` writes
``<snapshot>.manifest.json``), and the user's consent where a restore rolls back several
tenants or replaces the data with another cluster's.

The playbooks check the same and more (the running cluster's etcd cluster ID against the
manifest's: roles/etcd/tasks/backup/restore_identity.yml); these checks need no node, so they
refuse with exit 2 before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from .context import UsageError
from .topology import Topology

MANIFEST_SUFFIX = ".manifest.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_snapshot(path: Path) -> str:
    """The snapshot's sha256 when it matches ``<path>.sha256``; else a UsageError."""
    if not path.is_file():
        raise UsageError(f"restore: snapshot '{path}' not found; give a file made by "
                         "scripts/sandbox backup (.sandbox/<name>/backups/etcd-*.db)")
    sums = path.with_name(path.name + ".sha256")
    if not sums.is_file():
        raise UsageError(f"restore: '{sums}' is missing: without the checksum written at "
                         "backup time the snapshot cannot be checked (write it with "
                         f"'sha256sum {path.name} > {sums.name}' if you trust the file)")
    fields = sums.read_text().split()
    actual = sha256_of(path)
    if not fields or fields[0] != actual:
        raise UsageError(f"restore: {path.name} has sha256 {actual} but {sums.name} says "
                         f"'{fields[0] if fields else ''}': the snapshot is corrupt or not "
                         "the one backed up; nothing was changed")
    return actual


def read_manifest(path: Path, digest: str, command: str) -> dict[str, Any] | None:
    """The manifest beside the snapshot (None when there is none); a UsageError when it is
    not JSON or describes another file."""
    manifest = path.with_name(path.name + MANIFEST_SUFFIX)
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text())
    except ValueError as exc:
        raise UsageError(f"{command}: {manifest.name} is not JSON ({exc}); it is written by "
                         "scripts/sandbox backup beside the snapshot; nothing was changed") from None
    if not isinstance(data, dict) or data.get("sha256") != digest:
        other = data.get("sha256") if isinstance(data, dict) else None
        raise UsageError(f"{command}: {manifest.name} describes a snapshot with sha256 {other}, "
                         f"not {path.name} ({digest}): a manifest belongs beside the snapshot "
                         "backup wrote it for; nothing was changed")
    return data


def describe(manifest: dict[str, Any]) -> str:
    """One line about the cluster a manifest describes."""
    tenants = ", ".join(f"{t.get('name')} {t.get('key_count')} keys under {t.get('prefix')}"
                        for t in manifest.get("tenants") or [])
    auth = manifest.get("auth") or {}
    return (f"sandbox {manifest.get('sandbox')}, etcd cluster {manifest.get('cluster_id')} "
            f"(members {', '.join(manifest.get('members') or [])}), taken "
            f"{manifest.get('created')} at revision {manifest.get('revision')}: "
            f"{manifest.get('key_count')} keys{'; ' + tenants if tenants else ''}; auth "
            f"{'on' if auth.get('enabled') else 'off'}")


def foreign_reason(manifest: dict[str, Any] | None, path: Path, topo: Topology) -> str:
    """Why the snapshot is not this sandbox's own, as far as the control node can tell ('' =
    it may be; the playbook compares the etcd cluster IDs)."""
    if manifest is None:
        return (f"{path.name} has no manifest ({path.name}{MANIFEST_SUFFIX}, written by "
                "scripts/sandbox backup): nothing says which cluster it is of")
    if manifest.get("sandbox") != topo.name:
        return f"{path.name} is a snapshot of another sandbox: {describe(manifest)}"
    return ""


def check_origin(path: Path, digest: str, topo: Topology, foreign: bool,
                 command: str, out: TextIO = sys.stdout) -> dict[str, Any] | None:
    """Refuse (UsageError) a snapshot that is not this sandbox's own unless ``foreign``;
    with ``foreign``, say what it replaces. Returns the manifest."""
    manifest = read_manifest(path, digest, command)
    reason = foreign_reason(manifest, path, topo)
    tenants = ", ".join(f"{t.name} ({t.normalized_prefix})" for t in topo.tenants) or "none"
    replaced = (f"the whole etcd keyspace of sandbox '{topo.name}' (every tenant's data: "
                f"{tenants}; users, roles, auth)")
    if reason and not foreign:
        raise UsageError(f"{command}: {reason}; it would replace {replaced}. Give a backup of "
                         f"this sandbox, or --foreign to replace it anyway; nothing was changed")
    if reason:
        print(f"sandbox: WARNING: {reason}. --foreign: it replaces {replaced}; then etcd RBAC "
              "is set as the topology says", file=out, flush=True)
    elif manifest is not None:
        print(f"    snapshot of {describe(manifest)}", file=out, flush=True)
    return manifest


def confirm_rollback(topo: Topology, yes: bool, command: str, foreign: bool = False,
                     stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
    """A restore replaces the whole keyspace: with several tenants each rolls back to the
    snapshot (or loses its data if the snapshot has none). Say which; unless ``yes``, ask
    on a terminal and refuse (UsageError) elsewhere."""
    if len(topo.tenants) < 2:
        return
    names = ", ".join(f"{t.name} ({t.normalized_prefix})" for t in topo.tenants)
    what = ("every tenant's data is replaced by the snapshot's (another cluster's)" if foreign
            else "every tenant rolls back to the snapshot")
    print(f"sandbox: {command} is cluster-wide: {what}: {names}; what they wrote since is "
          "lost", file=out, flush=True)
    if yes:
        return
    if not stdin.isatty():
        raise UsageError(f"{command}: topology '{topo.name}' has {len(topo.tenants)} tenants "
                         f"({names}) and the {command} rolls every one of them back; give --yes "
                         "to go on (not asked: standard input is not a terminal); nothing was "
                         "changed")
    out.write(f"Roll back all {len(topo.tenants)} tenants? [y/N] ")
    out.flush()
    if stdin.readline().strip().lower() not in ("y", "yes"):
        raise UsageError(f"{command}: not confirmed; nothing was changed")
