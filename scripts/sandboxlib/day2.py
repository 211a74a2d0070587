"""Day-2 commands on the external etcd: backup, restore, reset, replace-member, rotate-certs,
add-members, remove-member, takeover, rotate-ca, upgrade-etcd, defrag.

Each runs one playbook (``playbooks/<name>.yml``) against the sandbox's topology with the
same progress output and log as ``up``. k0s refuses ``k0s backup`` and ``k0s etcd ...``
with an external cluster, so these are the operator's tools. Wired into ``cli.py`` by
:func:`add_commands`. A command's help and its options' help, types and checks come from the
operation's argument-spec entry point (``specs.py``): its inputs are described once, in
roles/<role>/meta/argument_specs.yml.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import report, runner, snapshot, specs
from .context import UsageError, check_owner, need_tool, resolve, run_vars


def _run(args: argparse.Namespace, command: str, playbook: str,
         extra: dict[str, Any], ref: str = "") -> tuple[Any, float]:
    """Run the command's playbook with ``extra`` (its inputs, checked against the entry point
    ``ref``, by default the command's of ENTRY_POINTS, first)."""
    ref = ref or ENTRY_POINTS[command]
    specs.check(ref, {k: v for k, v in extra.items() if k in (specs.entry(ref).get("options") or {})})
    sb = resolve(args)
    need_tool(sb.backend)
    check_owner(sb)
    t0 = time.time()
    with runner.run_context(sb.topo, command) as ctx:
        print(f"    full log: {report.display_path(ctx.log_path)}", flush=True)
        runner.run_playbook(ctx, sb.topo, sb.backend, playbook, run_vars(extra))
    return sb, time.time() - t0


def _tenant(args: argparse.Namespace, command: str, name: str, alone: dict[str, Any]) -> Any:
    """The sandbox, after checking ``name`` is one of its tenants and no option of the
    cluster-wide variant (``alone``: flag -> value given) goes with --tenant."""
    given = [flag for flag, value in alone.items() if value]
    if given:
        raise UsageError(f"{command} --tenant: {', '.join(given)} goes with a cluster-wide "
                         f"{command}, not with one tenant's; nothing was changed")
    sb = resolve(args)
    names = [t.name for t in sb.topo.tenants]
    if name not in names:
        raise UsageError(f"{command} --tenant: no tenant '{name}' in topology '{sb.topo.name}'; "
                         f"tenants: {', '.join(names) or 'none'}")
    return sb


def backup_tenant(args: argparse.Namespace, stamp: str) -> int:
    sb = _tenant(args, "backup", args.k0s_backup_tenant, {"--member": args.etcd_backup_member})
    extra: dict[str, Any] = {"k0s_backup_tenant": args.k0s_backup_tenant, "k0s_backup_stamp": stamp}
    if args.etcd_backup_dir:
        extra["k0s_backup_dir"] = str(Path(args.etcd_backup_dir).resolve())
    _, took = _run(args, "backup", "tenant-backup.yml", extra, TENANT_BACKUP)
    copy = Path(extra.get("k0s_backup_dir") or sb.topo.state_dir / "backups") / \
        f"{args.k0s_backup_tenant}-{stamp}.tenant"
    manifest = json.loads(copy.with_name(copy.name + snapshot.MANIFEST_SUFFIX).read_text())
    print(f"sandbox: tenant {args.k0s_backup_tenant} copied in {took:.0f}s: "
          f"{report.display_path(copy)} ({manifest['key_count']} keys, {manifest['bytes']} bytes "
          f"under {manifest['prefix']} at revision {manifest['revision']}; sha256 "
          f"{manifest['sha256'][:12]}...), the manifest in {copy.name}{snapshot.MANIFEST_SUFFIX}\n"
          f"    restore it with: scripts/sandbox restore --tenant {args.k0s_backup_tenant} "
          f"{report.display_path(copy)}")
    return 0


def restore_tenant(args: argparse.Namespace) -> int:
    sb = _tenant(args, "restore", args.k0s_restore_tenant,
                 {"--keep-old": args.etcd_restore_keep_old, "--foreign": args.etcd_restore_foreign,
                  "--yes": args.yes})
    target = args.k0s_restore_as or args.k0s_restore_tenant
    others = [t.name for t in sb.topo.tenants if t.name != args.k0s_restore_tenant]
    if args.k0s_restore_as and args.k0s_restore_as not in others:
        raise UsageError(f"restore --as: '{args.k0s_restore_as}' is not another tenant of topology "
                         f"'{sb.topo.name}'; other tenants: {', '.join(others) or 'none'}")
    path = Path(args.etcd_restore_file).resolve()
    if not path.is_file():
        raise UsageError(f"restore --tenant: '{args.etcd_restore_file}' not found; give a copy "
                         "made by scripts/sandbox backup --tenant")
    into = f" into tenant {target}" if args.k0s_restore_as else ""
    print(f"sandbox: restoring tenant {args.k0s_restore_tenant}'s copy {report.display_path(path)}"
          f"{into}: only tenant {target}'s API servers stop, its prefix is replaced in "
          "transactions with its own certificate; other tenants are not touched", flush=True)
    extra = {**specs.values(args, TENANT_RESTORE), "k0s_restore_file": str(path)}
    _, took = _run(args, "restore", "tenant-restore.yml", extra, TENANT_RESTORE)
    print(f"sandbox: tenant {target} restored in {took:.0f}s and its API servers serve again "
          f"(scripts/sandbox kubectl --tenant {target} ...)")
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    if args.k0s_backup_tenant:
        return backup_tenant(args, stamp)
    extra: dict[str, Any] = {"etcd_backup_stamp": stamp, **specs.values(args, ENTRY_POINTS["backup"])}
    if args.etcd_backup_dir:
        extra["etcd_backup_dir"] = str(Path(args.etcd_backup_dir).resolve())
    sb, took = _run(args, "backup", "backup.yml", extra)
    out_dir = Path(extra.get("etcd_backup_dir") or sb.topo.state_dir / "backups")
    snap = out_dir / f"etcd-{stamp}.db"
    manifest = snap.with_name(snap.name + snapshot.MANIFEST_SUFFIX)
    print(f"sandbox: backup written in {took:.0f}s: {report.display_path(snap)} "
          f"(sha256 {snapshot.sha256_of(snap)}; {snap.stat().st_size} bytes), the manifest "
          f"(which cluster it is of) in {manifest.name}\n"
          f"    restore it with: scripts/sandbox restore {report.display_path(snap)}")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    if args.k0s_restore_tenant:
        return restore_tenant(args)
    if args.k0s_restore_as or args.k0s_restore_force:
        raise UsageError("restore: --as and --force go with --tenant T (one tenant's copy); "
                         "nothing was changed")
    sb = resolve(args)
    path = Path(args.etcd_restore_file).resolve()
    digest = snapshot.check_snapshot(path)
    manifest = snapshot.check_origin(path, digest, sb.topo, args.etcd_restore_foreign, "restore")
    snapshot.confirm_rollback(sb.topo, args.yes, "restore",
                              foreign=args.etcd_restore_foreign and snapshot.foreign_reason(
                                  manifest, path, sb.topo) != "")
    print(f"sandbox: restoring {report.display_path(path)} (sha256 {digest[:12]}...): "
          "k0s controllers and every etcd member stop, the snapshot replaces the data, "
          "etcd RBAC is set as the topology says before the API servers start",
          flush=True)
    extra = {**specs.values(args, ENTRY_POINTS["restore"]), "etcd_restore_file": str(path)}
    _, took = _run(args, "restore", "restore.yml", extra)
    print(f"sandbox: restore finished in {took:.0f}s; cluster healthy, hashkv equal on every "
          "member, etcd RBAC as the topology says (each tenant denied outside its prefix "
          "where it is on) (scripts/sandbox etcdctl endpoint status --cluster -w table)")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    extra = specs.values(args, ENTRY_POINTS["reset"])
    if args.reset_tenant:
        sb = _tenant(args, "reset", args.reset_tenant, {"--pki": args.reset_pki})
        tenant = next(t for t in sb.topo.tenants if t.name == args.reset_tenant)
        members = {n.name for n in sb.topo.group("etcd")}
        both = [c for c in tenant.controllers if c in members]
        if both:
            # The same refusal as playbooks/reset.yml's, before any playbook runs.
            raise UsageError(
                f"reset --tenant {args.reset_tenant}: {', '.join(both)} "
                f"{'is' if len(both) == 1 else 'are'} also in the etcd group, and `k0s reset` "
                "deletes the system user `etcd` the etcd member there runs as; with --tenant "
                "etcd keeps running. Nothing was changed. Reset everything (scripts/sandbox "
                "reset), or put the tenant's controllers on nodes that are not etcd members")
    _, took = _run(args, "reset", "reset.yml", extra)
    what = (f"tenant {args.reset_tenant} removed (k0s reset and its API server off its "
            "controllers, its keys deleted from etcd, its etcd user and role and its client "
            "certificate removed; other tenants untouched)"
            if args.reset_tenant else "k0s, etcd and the certificates removed from the nodes"
            + ("; the control node's PKI removed" if args.reset_pki else "; PKI kept"))
    print(f"sandbox: {what} in {took:.0f}s (scripts/sandbox down removes the nodes)")
    return 0


def cmd_rotate_certs(args: argparse.Namespace) -> int:
    _, took = _run(args, "rotate-certs", "rotate-certs.yml", {})
    print(f"sandbox: member and client certificates re-issued and in use in {took:.0f}s "
          "(no restart; scripts/sandbox verify shows their expiry)")
    return 0


def cmd_rotate_ca(args: argparse.Namespace) -> int:
    _, took = _run(args, "rotate-ca", "rotate-ca.yml", {})
    print(f"sandbox: new etcd CA in use in {took:.0f}s: both CAs trusted while every "
          "certificate was re-issued, then the old CA dropped (members restarted one at a "
          "time, twice; the old CA is kept in .sandbox/<name>/pki/pre-ca-rotate-<time>/)")
    return 0


def cmd_replace_member(args: argparse.Namespace) -> int:
    sb = resolve(args)
    members = [n.name for n in sb.topo.group("etcd")]
    if args.etcd_replace_member not in members:
        raise UsageError(f"replace-member: '{args.etcd_replace_member}' is not an etcd member of "
                             f"'{sb.topo.name}'; members: {', '.join(members)}")
    if len(members) < 3:
        raise UsageError(f"replace-member: '{sb.topo.name}' has {len(members)} member(s); "
                             "replacing one needs the others' quorum (3 or more): restore a "
                             "backup instead")
    _, took = _run(args, "replace-member", "replace-member.yml",
                   specs.values(args, ENTRY_POINTS["replace-member"]))
    print(f"sandbox: {args.etcd_replace_member} removed, added again and synced in {took:.0f}s")
    return 0


def cmd_add_members(args: argparse.Namespace) -> int:
    sb = resolve(args)
    need_tool(sb.backend)
    check_owner(sb)
    if sb.backend != "podman":
        raise UsageError("add-members: with --backend vagrant bring the new VMs up with "
                             "'vagrant up NODE...', then run ansible-playbook -i TOPOLOGY "
                             "playbooks/add-members.yml")
    members = [n.name for n in sb.topo.group("etcd")]
    print(f"sandbox: add-members '{sb.topo.name}': the topology lists {len(members)} etcd "
          f"members ({', '.join(members)}); the ones without data join one at a time",
          flush=True)
    t0 = time.time()
    with runner.run_context(sb.topo, "add-members") as ctx:
        print(f"    full log: {report.display_path(ctx.log_path)}", flush=True)
        runner.run_playbook(ctx, sb.topo, sb.backend, "nodes.yml")
        runner.run_playbook(ctx, sb.topo, sb.backend, "add-members.yml", run_vars())
    print(f"sandbox: {len(members)} members started, healthy, hashkv equal, k0s.yaml "
          f"endpoints updated in {time.time() - t0:.0f}s")
    return 0


def check_takeover(args: argparse.Namespace, topo: Any) -> Path:
    """The snapshot path when the takeover's input is sound; else a UsageError."""
    tenants = {t.name: t for t in topo.tenants}
    if args.etcd_takeover_tenant not in tenants:
        raise UsageError(f"takeover --tenant: no tenant '{args.etcd_takeover_tenant}' in topology "
                             f"'{topo.name}'; tenants: {', '.join(tenants) or 'none'}")
    tenant = tenants[args.etcd_takeover_tenant]
    if tenant.normalized_prefix != "/registry/":
        raise UsageError(
            f"takeover: tenants ({tenant.name}).prefix is '{tenant.prefix}' (kube-apiserver "
            f"uses {tenant.normalized_prefix}) but k0s with its embedded etcd keeps the cluster "
            "under /registry/ (k0s#5718): the taken-over cluster would look empty; set "
            f"prefix: registry for tenant {tenant.name} in {topo.path.name} and run "
            "scripts/sandbox up first; nothing was changed")
    path = Path(args.etcd_takeover_file).resolve()
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        raise UsageError(f"takeover: '{path.name}' is an archive (k0s backup?): extract "
                             "the etcd snapshot (the .db file inside) and give that")
    if not path.is_file():
        raise UsageError(f"takeover: snapshot '{args.etcd_takeover_file}' not found; give an etcd "
                             "snapshot of the embedded cluster (etcdctl snapshot save)")
    sums = path.with_name(path.name + ".sha256")
    digest = snapshot.sha256_of(path)
    if sums.is_file() and sums.read_text().split()[:1] != [digest]:
        raise UsageError(f"takeover: {path.name} has sha256 {digest} but {sums.name} says "
                         "otherwise: the snapshot is corrupt or not that one; nothing was changed")
    snapshot.check_origin(path, digest, topo, args.etcd_restore_foreign, "takeover")
    return path


def cmd_takeover(args: argparse.Namespace) -> int:
    sb = resolve(args)
    path = check_takeover(args, sb.topo)
    print(f"sandbox: taking over {report.display_path(path)} for tenant {args.etcd_takeover_tenant}: "
          "k0s controllers and every etcd member stop, the snapshot replaces the data",
          flush=True)
    extra = {**specs.values(args, ENTRY_POINTS["takeover"]), "etcd_takeover_file": str(path)}
    # --foreign is restore's input (takeover.yml restores through restore.yml)
    if args.etcd_restore_foreign:
        extra["etcd_restore_foreign"] = True
    _, took = _run(args, "takeover", "takeover.yml", extra)
    print(f"sandbox: takeover finished in {took:.0f}s; /registry/ is readable with tenant "
          f"{args.etcd_takeover_tenant}'s certificate (scripts/sandbox kubectl --tenant "
          f"{args.etcd_takeover_tenant} "
          "get nodes, where k0s runs)")
    return 0


def cmd_remove_member(args: argparse.Namespace) -> int:
    sb = resolve(args)
    members = [n.name for n in sb.topo.group("etcd")]
    unknown = [m for m in args.etcd_remove_members if m not in members]
    if unknown:
        raise UsageError(f"remove-member: '{', '.join(unknown)}' is not an etcd member of "
                         f"topology '{sb.topo.name}' ({', '.join(members)}); nothing was changed")
    left = [m for m in members if m not in args.etcd_remove_members]
    if not left:
        raise UsageError(f"remove-member: removing {', '.join(args.etcd_remove_members)} would leave no "
                         "etcd member (scripts/sandbox down removes everything)")
    _, took = _run(args, "remove-member", "remove-member.yml",
                   {"etcd_remove_members": list(dict.fromkeys(args.etcd_remove_members))})
    names = ", ".join(args.etcd_remove_members)
    print(f"sandbox: {names} left the etcd cluster in {took:.0f}s; the controllers use "
          f"{', '.join(left)}. Now take {names} out of the topology's nodes (the next `up` "
          "would add them back as new members); the nodes keep running until `down`.")
    return 0


def cmd_defrag(args: argparse.Namespace) -> int:
    _, took = _run(args, "defrag", "defrag.yml", specs.values(args, ENTRY_POINTS["defrag"]))
    print(f"sandbox: defrag finished in {took:.0f}s (scripts/sandbox etcdctl endpoint status "
          "--cluster -w table shows each member's database size)")
    return 0


ETCD_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def cmd_upgrade_etcd(args: argparse.Namespace) -> int:
    if not ETCD_VERSION.match(args.etcd_upgrade_to):
        raise UsageError(f"upgrade-etcd: --to '{args.etcd_upgrade_to}' is not an etcd version such as "
                         "3.5.30 (no leading v, no package revision); nothing was changed")
    sb = resolve(args)
    print(f"sandbox: upgrade-etcd '{sb.topo.name}' to {args.etcd_upgrade_to}: guards first (health, one "
          "minor version per step, no downgrade), a snapshot, then one member at a time, "
          "the leader last", flush=True)
    _, took = _run(args, "upgrade-etcd", "upgrade-etcd.yml",
                   specs.values(args, ENTRY_POINTS["upgrade-etcd"]))
    print(f"sandbox: upgrade-etcd finished in {took:.0f}s (scripts/sandbox etcdctl endpoint "
          "status -w table shows each member's version)")
    return 0


# One tenant's backup and restore (backup/restore --tenant): their entry points.
TENANT_BACKUP, TENANT_RESTORE = "k0s_controller/tenant_backup", "k0s_controller/tenant_restore_check"
# command -> the argument-spec entry point (role/entry) declaring its inputs and help.
ENTRY_POINTS = {
    "backup": "etcd/backup", "restore": "etcd/restore_check", "reset": "k0s_controller/reset_check",
    "replace-member": "etcd/replace_check", "rotate-certs": "pki/rotate_aside",
    "rotate-ca": "pki/ca_next", "add-members": "etcd/grow_check",
    "remove-member": "etcd/remove_check", "defrag": "etcd/defrag",
    "upgrade-etcd": "etcd/upgrade_check", "takeover": "etcd/takeover_check",
}
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "backup": cmd_backup, "restore": cmd_restore, "reset": cmd_reset,
    "replace-member": cmd_replace_member, "rotate-certs": cmd_rotate_certs,
    "rotate-ca": cmd_rotate_ca, "add-members": cmd_add_members,
    "remove-member": cmd_remove_member, "defrag": cmd_defrag, "upgrade-etcd": cmd_upgrade_etcd,
    "takeover": cmd_takeover,
}
# command -> its arguments: (input variable, command-line flags; none: positional, argparse
# extras); each argument's help, type and check come from the command's entry point.
ARGUMENTS: dict[str, list[tuple[str, tuple[str, ...], dict[str, Any]]]] = {
    "backup": [("etcd_backup_dir", ("--dir",), {"metavar": "DIR"}),
               ("etcd_backup_member", ("--member",), {"metavar": "NODE"})],
    "restore": [("etcd_restore_file", (), {"metavar": "FILE"}),
                ("etcd_restore_keep_old", ("--keep-old",), {}),
                ("etcd_restore_foreign", ("--foreign",), {})],
    "reset": [("reset_tenant", ("--tenant",), {"metavar": "T"}), ("reset_pki", ("--pki",), {})],
    "replace-member": [("etcd_replace_member", (), {"metavar": "MEMBER"}),
                       ("etcd_replace_force", ("--force",), {})],
    "remove-member": [("etcd_remove_members", (), {"metavar": "MEMBER"})],
    "defrag": [("etcd_defrag_compact", ("--compact",), {})],
    "upgrade-etcd": [("etcd_upgrade_to", ("--to",), {"metavar": "VERSION"})],
    "takeover": [("etcd_takeover_file", (), {"metavar": "SNAPSHOT"}),
                 ("etcd_takeover_tenant", ("--tenant",), {"metavar": "T"}),
                 ("etcd_takeover_replace_all", ("--replace-all",), {})],
}


def add_commands(add: Callable[[str, str, Any], argparse.ArgumentParser]) -> None:
    """Register the day-2 subcommands with cli.build_parser's ``add``: each one's help from
    its entry point, its arguments from the entry point's options."""
    for command, func in COMMANDS.items():
        parser = add(command, specs.summary(ENTRY_POINTS[command]), func)
        for variable, flags, extra in ARGUMENTS.get(command, []):
            specs.argument(parser, ENTRY_POINTS[command], variable, *flags, **extra)
        if command == "backup":
            specs.argument(parser, TENANT_BACKUP, "k0s_backup_tenant", "--tenant", metavar="T",
                           required=False)
        if command == "restore":
            specs.argument(parser, TENANT_RESTORE, "k0s_restore_tenant", "--tenant", metavar="T",
                           required=False)
            specs.argument(parser, TENANT_RESTORE, "k0s_restore_as", "--as", metavar="T2")
            specs.argument(parser, TENANT_RESTORE, "k0s_restore_force", "--force")
            parser.add_argument("--yes", action="store_true",
                                help="with several tenants: go on without asking (every tenant "
                                     "rolls back)")
        if command == "takeover":
            specs.argument(parser, "etcd/restore_check", "etcd_restore_foreign", "--foreign",
                           help="the snapshot is another cluster's (k0s's embedded etcd: it has "
                                "no manifest of this sandbox's backups); required for such a "
                                "snapshot")
