"""Day-2 commands on the external etcd: backup, restore, reset, replace-member, rotate-certs,
rotate-ca, add-members, remove-member, defrag, upgrade-etcd, takeover.

Each runs one playbook (``playbooks/<name>.yml``) against the sandbox's topology with the
same progress output and log as ``up``. k0s refuses ``k0s backup`` and ``k0s etcd ...``
with an external cluster, so these are the operator's tools.

A command is one :class:`Row` of :data:`DAY2` (k0sctl's model: a phase is one file that says
what it runs, registered with one line): its name, its operation's argument-spec entry point
(roles/<role>/meta/argument_specs.yml: the command's help, and its options' help, types and
checks, through ``specs.py``, so a day-2 input is described once), its arguments, its
playbook, its guards (checks before anything runs, the opening line, inputs beyond the
options), its closing line. A ``--tenant`` variant (one tenant's backup, restore, reset) is a
row of its command's ``variants``, selected by that option. :func:`add_commands` builds
every row's parser and :func:`run` runs any row: neither knows a command by name.
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
from .context import Sandbox, UsageError, check_owner, need_tool, run_vars
from .row import Arg, Call, Row, selected, tenant_named

# What acts on the sandbox's one CA, shared by every etcd cluster of a topology.
SHARED_CA_COMMANDS = frozenset({"rotate-ca"})


def run(command: Row, args: argparse.Namespace) -> int:
    """Run the command's row (or its selected variant): guards, the inputs checked against
    the entry point, the playbooks, the closing line."""
    row = selected(command, args)
    call = Call(args, specs.values(args, row.entry))
    topo = call.sb.topo
    if command.name in SHARED_CA_COMMANDS and topo.multi_cluster:
        raise UsageError(f"{command.name}: topology '{topo.name}' has several etcd clusters, "
                         "which share the sandbox's CA; rotating it one cluster at a time would "
                         "leave the others trusting only the old one: not supported yet "
                         "(docs/day2.md, \"Several etcd clusters in one topology\")")
    if row.selector and topo.multi_cluster and not topo.cluster:
        # One tenant's: on the etcd cluster holding it.
        tenant = tenant_named(call, command.name, getattr(args, row.selector))
        call.sb = Sandbox(topo.view(tenant.cluster), call.sb.backend)
    elif topo.multi_cluster and not topo.cluster:
        raise UsageError(f"{command.name}: topology '{topo.name}' has several etcd clusters "
                         f"({', '.join(topo.clusters)}); name the one to act on with "
                         f"--cluster, e.g. --cluster {topo.clusters[0]}")
    if row.selector:
        tenant_named(call, command.name, getattr(args, row.selector))
    if row.guard:
        row.guard(call)
    options = specs.entry(row.entry).get("options") or {}
    specs.check(row.entry, {k: v for k, v in call.extra.items() if k in options})
    need_tool(call.sb.backend)
    check_owner(call.sb)
    t0 = time.time()
    with runner.run_context(call.sb.topo, command.name) as ctx:
        print(f"    full log: {report.display_path(ctx.log_path)}", flush=True)
        for playbook in row.before:
            runner.run_playbook(ctx, call.sb.topo, call.sb.backend, playbook)
        runner.run_playbook(ctx, call.sb.topo, call.sb.backend, row.playbook,
                            run_vars(call.extra))
    print(row.done(call, time.time() - t0))
    return 0


def add_commands(add: Callable[[str, str, Any], argparse.ArgumentParser]) -> None:
    """Register every row with cli.build_parser's ``add``: its help from its entry point,
    its arguments (its variants' too) from their entry points' options."""
    for row in DAY2:
        parser = add(row.name, specs.summary(row.entry),
                     lambda args, row=row: run(row, args))
        for arg in row.arguments:
            arg.add_to(parser, row.entry)


# Entry points of commands that are no row (their own modules): scripts/sandbox migrate's
# playbook runs k0s_controller's tenant_migrate and crd_apiserver's stage (migrate.py).
OTHER_ENTRY_POINTS = frozenset({"k0s_controller/tenant_migrate", "crd_apiserver/stage"})


def entry_points() -> set[str]:
    """Every entry point whose options are a day-2 command's inputs."""
    rows = [*DAY2, *(v for row in DAY2 for v in row.variants)]
    return ({row.entry for row in rows} | {a.entry for row in DAY2 for a in row.arguments if a.entry}
            | OTHER_ENTRY_POINTS)


# -- guards and closing lines, row by row -------------------------------------------------
def stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def backup_guard(call: Call) -> None:
    call.extra["etcd_backup_stamp"] = stamp()
    if call.args.etcd_backup_dir:
        call.extra["etcd_backup_dir"] = str(Path(call.args.etcd_backup_dir).resolve())


def backup_done(call: Call, took: float) -> str:
    out_dir = Path(call.extra.get("etcd_backup_dir") or call.sb.topo.state_dir / "backups")
    snap = out_dir / f"etcd-{call.extra['etcd_backup_stamp']}.db"
    manifest = snap.with_name(snap.name + snapshot.MANIFEST_SUFFIX)
    return (f"sandbox: backup written in {took:.0f}s: {report.display_path(snap)} "
            f"(sha256 {snapshot.sha256_of(snap)}; {snap.stat().st_size} bytes), the manifest "
            f"(which cluster it is of) in {manifest.name}\n"
            f"    restore it with: scripts/sandbox restore {report.display_path(snap)}")


def tenant_backup_guard(call: Call) -> None:
    call.extra["k0s_backup_stamp"] = stamp()
    if call.args.etcd_backup_dir:   # --dir: one option for both variants
        call.extra["k0s_backup_dir"] = str(Path(call.args.etcd_backup_dir).resolve())


def tenant_backup_done(call: Call, took: float) -> str:
    name = call.extra["k0s_backup_tenant"]
    copy = Path(call.extra.get("k0s_backup_dir") or call.sb.topo.state_dir / "backups") / \
        f"{name}-{call.extra['k0s_backup_stamp']}.tenant"
    manifest = json.loads(copy.with_name(copy.name + snapshot.MANIFEST_SUFFIX).read_text())
    return (f"sandbox: tenant {name} copied in {took:.0f}s: "
            f"{report.display_path(copy)} ({manifest['key_count']} keys, {manifest['bytes']} bytes "
            f"under {manifest['prefix']} at revision {manifest['revision']}; sha256 "
            f"{manifest['sha256'][:12]}...), the manifest in {copy.name}{snapshot.MANIFEST_SUFFIX}\n"
            f"    restore it with: scripts/sandbox restore --tenant {name} "
            f"{report.display_path(copy)}")


def restore_guard(call: Call) -> None:
    args, topo = call.args, call.sb.topo
    path = Path(args.etcd_restore_file).resolve()
    digest = snapshot.check_snapshot(path)
    manifest = snapshot.check_origin(path, digest, topo, args.etcd_restore_foreign, "restore")
    snapshot.confirm_rollback(topo, args.yes, "restore",
                              foreign=args.etcd_restore_foreign and snapshot.foreign_reason(
                                  manifest, path, topo) != "")
    print(f"sandbox: restoring {report.display_path(path)} (sha256 {digest[:12]}...): "
          "k0s controllers and every etcd member stop, the snapshot replaces the data, "
          "etcd RBAC is set as the topology says before the API servers start",
          flush=True)
    call.extra["etcd_restore_file"] = str(path)


def tenant_restore_guard(call: Call) -> None:
    args, topo = call.args, call.sb.topo
    target = args.k0s_restore_as or args.k0s_restore_tenant
    others = [t.name for t in topo.tenants if t.name != args.k0s_restore_tenant]
    if args.k0s_restore_as and args.k0s_restore_as not in others:
        raise UsageError(f"restore --as: '{args.k0s_restore_as}' is not another tenant of topology "
                         f"'{topo.name}'; other tenants: {', '.join(others) or 'none'}")
    path = Path(args.etcd_restore_file).resolve()
    if not path.is_file():
        raise UsageError(f"restore --tenant: '{args.etcd_restore_file}' not found; give a copy "
                         "made by scripts/sandbox backup --tenant")
    into = f" into tenant {target}" if args.k0s_restore_as else ""
    print(f"sandbox: restoring tenant {args.k0s_restore_tenant}'s copy {report.display_path(path)}"
          f"{into}: only tenant {target}'s API servers stop, its prefix is replaced in "
          "transactions with its own certificate; other tenants are not touched", flush=True)
    call.extra["k0s_restore_file"] = str(path)


def reset_tenant_guard(call: Call) -> None:
    name = call.args.reset_tenant
    tenant = tenant_named(call, "reset", name)
    members = {n.name for n in call.sb.topo.group("etcd")}
    both = [c for c in tenant.controllers if c in members]
    if both:
        # The same refusal as playbooks/reset.yml's, before any playbook runs.
        raise UsageError(
            f"reset --tenant {name}: {', '.join(both)} "
            f"{'is' if len(both) == 1 else 'are'} also in the etcd group, and `k0s reset` "
            "deletes the system user `etcd` the etcd member there runs as; with --tenant "
            "etcd keeps running. Nothing was changed. Reset everything (scripts/sandbox "
            "reset), or put the tenant's controllers on nodes that are not etcd members")


def reset_done(call: Call, took: float) -> str:
    what = (f"tenant {call.args.reset_tenant} removed (k0s reset and its API server off its "
            "controllers, its keys deleted from etcd, its etcd user and role and its client "
            "certificate removed; other tenants untouched)"
            if call.args.reset_tenant else "k0s, etcd and the certificates removed from the nodes"
            + ("; the control node's PKI removed" if call.args.reset_pki else "; PKI kept"))
    return f"sandbox: {what} in {took:.0f}s (scripts/sandbox down removes the nodes)"


def replace_guard(call: Call) -> None:
    topo, member = call.sb.topo, call.args.etcd_replace_member
    members = [n.name for n in topo.group("etcd")]
    if member not in members:
        raise UsageError(f"replace-member: '{member}' is not an etcd member of "
                         f"'{topo.name}'; members: {', '.join(members)}")
    if len(members) < 3:
        raise UsageError(f"replace-member: '{topo.name}' has {len(members)} member(s); "
                         "replacing one needs the others' quorum (3 or more): restore a "
                         "backup instead")


def add_members_guard(call: Call) -> None:
    sb = call.sb
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


def remove_guard(call: Call) -> None:
    topo, removed = call.sb.topo, call.args.etcd_remove_members
    members = [n.name for n in topo.group("etcd")]
    unknown = [m for m in removed if m not in members]
    if unknown:
        raise UsageError(f"remove-member: '{', '.join(unknown)}' is not an etcd member of "
                         f"topology '{topo.name}' ({', '.join(members)}); nothing was changed")
    if not [m for m in members if m not in removed]:
        raise UsageError(f"remove-member: removing {', '.join(removed)} would leave no "
                         "etcd member (scripts/sandbox down removes everything)")
    call.extra["etcd_remove_members"] = list(dict.fromkeys(removed))


def remove_done(call: Call, took: float) -> str:
    removed = call.args.etcd_remove_members
    left = [n.name for n in call.sb.topo.group("etcd") if n.name not in removed]
    names = ", ".join(removed)
    return (f"sandbox: {names} left the etcd cluster in {took:.0f}s; the controllers use "
            f"{', '.join(left)}. Now take {names} out of the topology's nodes (the next `up` "
            "would add them back as new members); the nodes keep running until `down`.")


ETCD_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def upgrade_guard(call: Call) -> None:
    to = call.args.etcd_upgrade_to
    if not ETCD_VERSION.match(to):
        raise UsageError(f"upgrade-etcd: --to '{to}' is not an etcd version such as "
                         "3.5.30 (no leading v, no package revision); nothing was changed")
    print(f"sandbox: upgrade-etcd '{call.sb.topo.name}' to {to}: guards first (health, one "
          "minor version per step, no downgrade), a snapshot, then one member at a time, "
          "the leader last", flush=True)


def check_takeover(call: Call) -> Path:
    """The snapshot path when the takeover's input is sound; else a UsageError."""
    args, topo = call.args, call.sb.topo
    tenant = tenant_named(call, "takeover", args.etcd_takeover_tenant)
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


def takeover_guard(call: Call) -> None:
    path = check_takeover(call)
    print(f"sandbox: taking over {report.display_path(path)} for tenant "
          f"{call.args.etcd_takeover_tenant}: k0s controllers and every etcd member stop, the "
          "snapshot replaces the data", flush=True)
    call.extra["etcd_takeover_file"] = str(path)
    if call.args.etcd_restore_foreign:   # restore's input (takeover.yml restores through restore.yml)
        call.extra["etcd_restore_foreign"] = True


def line(text: str) -> Callable[[Call, float], str]:
    """A closing line that names no input: ``text`` with ``{took}``, the seconds."""
    return lambda call, took: text.format(took=f"{took:.0f}")


# -- the rows: one per command, in --help's order ----------------------------------------
DAY2: tuple[Row, ...] = (
    Row("backup", "etcd/backup/snapshot", "backup.yml", backup_done, guard=backup_guard, arguments=(
        Arg("etcd_backup_dir", ("--dir",), "DIR"), Arg("etcd_backup_member", ("--member",), "NODE"),
        Arg("k0s_backup_tenant", ("--tenant",), "T", "k0s_controller/tenant_backup", False)),
        variants=(Row("backup", "k0s_controller/tenant_backup", "tenant-backup.yml",
                      tenant_backup_done, guard=tenant_backup_guard,
                      selector="k0s_backup_tenant", alone=("--member",)),)),
    Row("restore", "etcd/backup/restore_check", "restore.yml", line(
        "sandbox: restore finished in {took}s; cluster healthy, hashkv equal on every "
        "member, etcd RBAC as the topology says (each tenant denied outside its prefix "
        "where it is on) (scripts/sandbox etcdctl endpoint status --cluster -w table)"),
        guard=restore_guard, arguments=(
            Arg("etcd_restore_file", (), "FILE"), Arg("etcd_restore_keep_old", ("--keep-old",)),
            Arg("etcd_restore_foreign", ("--foreign",)),
            Arg("k0s_restore_tenant", ("--tenant",), "T", "k0s_controller/tenant_restore_check", False),
            Arg("k0s_restore_as", ("--as",), "T2", "k0s_controller/tenant_restore_check"),
            Arg("k0s_restore_force", ("--force",), entry="k0s_controller/tenant_restore_check"),
            Arg("yes", ("--yes",), plain=True, help="with several tenants: go on without asking "
                                                    "(every tenant rolls back)")),
        variants=(Row("restore", "k0s_controller/tenant_restore_check", "tenant-restore.yml",
                      lambda call, took: (
                          f"sandbox: tenant {call.args.k0s_restore_as or call.args.k0s_restore_tenant} "
                          f"restored in {took:.0f}s and its API servers serve again (scripts/sandbox "
                          f"kubectl --tenant {call.args.k0s_restore_as or call.args.k0s_restore_tenant} ...)"),
                      guard=tenant_restore_guard, selector="k0s_restore_tenant",
                      alone=("--keep-old", "--foreign", "--yes"), what="one tenant's copy"),)),
    Row("reset", "k0s_controller/reset_check", "reset.yml", reset_done, arguments=(
        Arg("reset_tenant", ("--tenant",), "T"), Arg("reset_pki", ("--pki",))),
        variants=(Row("reset", "k0s_controller/reset_check", "reset.yml", reset_done,
                      guard=reset_tenant_guard, selector="reset_tenant", alone=("--pki",)),)),
    Row("replace-member", "etcd/members/replace_check", "replace-member.yml", lambda call, took: (
        f"sandbox: {call.args.etcd_replace_member} removed, added again and synced in "
        f"{took:.0f}s"), guard=replace_guard, arguments=(
            Arg("etcd_replace_member", (), "MEMBER"), Arg("etcd_replace_force", ("--force",)))),
    Row("rotate-certs", "pki/rotate_aside", "rotate-certs.yml", line(
        "sandbox: member and client certificates re-issued and in use in {took}s "
        "(no restart; scripts/sandbox verify shows their expiry)")),
    Row("rotate-ca", "pki/ca_next", "rotate-ca.yml", line(
        "sandbox: new etcd CA in use in {took}s: both CAs trusted while every "
        "certificate was re-issued, then the old CA dropped (members restarted one at a "
        "time, twice; the old CA is kept in .sandbox/<name>/pki/pre-ca-rotate-<time>/)")),
    Row("add-members", "etcd/members/grow_check", "add-members.yml", lambda call, took: (
        f"sandbox: {len(call.sb.topo.group('etcd'))} members started, healthy, hashkv equal, "
        f"k0s.yaml endpoints updated in {took:.0f}s"), guard=add_members_guard,
        before=("nodes.yml",)),
    Row("remove-member", "etcd/members/remove_check", "remove-member.yml", remove_done,
        guard=remove_guard, arguments=(Arg("etcd_remove_members", (), "MEMBER"),)),
    Row("defrag", "etcd/defrag/cluster", "defrag.yml", line(
        "sandbox: defrag finished in {took}s (scripts/sandbox etcdctl endpoint status "
        "--cluster -w table shows each member's database size)"),
        arguments=(Arg("etcd_defrag_compact", ("--compact",)),)),
    Row("upgrade-etcd", "etcd/upgrade/check", "upgrade-etcd.yml", line(
        "sandbox: upgrade-etcd finished in {took}s (scripts/sandbox etcdctl endpoint "
        "status -w table shows each member's version)"), guard=upgrade_guard,
        arguments=(Arg("etcd_upgrade_to", ("--to",), "VERSION"),)),
    Row("takeover", "etcd/takeover/check", "takeover.yml", lambda call, took: (
        f"sandbox: takeover finished in {took:.0f}s; /registry/ is readable with tenant "
        f"{call.args.etcd_takeover_tenant}'s certificate (scripts/sandbox kubectl --tenant "
        f"{call.args.etcd_takeover_tenant} get nodes, where k0s runs)"), guard=takeover_guard,
        arguments=(
            Arg("etcd_takeover_file", (), "SNAPSHOT"),
            Arg("etcd_takeover_tenant", ("--tenant",), "T"),
            Arg("etcd_takeover_replace_all", ("--replace-all",)),
            Arg("etcd_restore_foreign", ("--foreign",), entry="etcd/backup/restore_check",
                help="the snapshot is another cluster's (k0s's embedded etcd: it has no "
                     "manifest of this sandbox's backups); required for such a snapshot"))),
)
# name -> row: the commands by name (tests list them)
COMMANDS: dict[str, Row] = {row.name: row for row in DAY2}
