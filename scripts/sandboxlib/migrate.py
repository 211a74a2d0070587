"""``scripts/sandbox migrate --tenant T --to CLUSTER``: one tenant moved to another etcd cluster
of the topology with its writes frozen only for the last changes (issue 40; docs/day2.md,
"Move a tenant to another etcd cluster").

The steps, each a playbook run on one cluster's view (Topology.view):

1. the target's etcd RBAC gets the tenant's user and role (etcd-rbac.yml on the target's view,
   its tenants and this one): the engine then works with the tenant's own certificate there;
2. ``sync`` (tenant-migrate.yml on the source's view): the prefix copied at one revision while
   the tenant serves, then every later change, until the copy is current;
3. ``switch``, the freeze: the tenant's API servers stopped, the last changes (``final``, the
   target's revision raised above any the tenant's clients saw), k0s.yaml pointed at the
   target's members, the API servers started and awaited;
4. the topology file names the target (the tenant's ``cluster:``), or the command says the
   line to change;
5. ``cleanup`` (tenant-migrate.yml on the source's view, which no longer lists the tenant):
   its keys (unless ``--keep-source``), user and role removed from the source.

A record in the state directory (``migrate-<tenant>.json``: from, to, the step reached) names an
interrupted move: ``migrate`` again with the same ``--to`` resumes it (the engine's own marker
resumes a copy, its receipt keeps a target whose final step ran), ``--abort`` drops it while
the tenant has not been switched (the copy, the target's user and role removed, its API
servers started where an interrupted freeze stopped them); ``up`` refuses to run meanwhile (it
would point the tenant back at the cluster the topology still names). ``--copy-only`` makes
steps 1-2 alone and keeps the record: the freeze later has only the changes since.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import inventory, report, runner
from .context import UsageError, check_owner, need_tool, resolve, run_vars
from .topology import Tenant, Topology, load

STEPS = ("copy", "switched", "edited")


def record_path(topo: Topology, tenant: str) -> Path:
    return topo.state_dir / f"migrate-{tenant}.json"


def unfinished(topo: Topology) -> list[dict[str, Any]]:
    """Every interrupted move of this sandbox (its records)."""
    out = []
    for path in sorted(topo.state_dir.glob("migrate-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            out.append({"tenant": path.stem.removeprefix("migrate-"), "from": "?", "to": "?"})
    return out


def refuse_if_unfinished(topo: Topology, command: str) -> None:
    """``up`` (and the like) while a move is unfinished would point the tenant back at the
    cluster the topology still names."""
    for rec in unfinished(topo):
        line = f"scripts/sandbox migrate --tenant {rec['tenant']} --to {rec['to']}"
        drop = f", or drop it: {line} --abort" if rec.get("step") == "copy" else ""
        raise UsageError(f"{command}: tenant {rec['tenant']}'s move from etcd cluster "
                         f"{rec['from']} to {rec['to']} is unfinished; finish it first: "
                         f"{line}{drop}")


def edit_topology(path: Path, tenant: str, old: str, new: str) -> bool:
    """The tenant's ``cluster: old`` in the topology file set to ``new``, comments and layout
    kept: in its one-line mapping (``- {name: T, ..., cluster: old}``) or among its block
    mapping's keys. False when the file writes it otherwise (the caller says the line to
    change)."""
    lines = path.read_text().splitlines(keepends=True)
    q = r"['\"]?"
    flow_name = re.compile(r"\bname:\s*" + q + re.escape(tenant) + q + r"\s*[,}]")
    flow = re.compile(r"(\bcluster:\s*)(['\"]?)" + re.escape(old) + r"\2(\s*[,}])")
    hits = [i for i, line in enumerate(lines) if flow_name.search(line) and flow.search(line)]
    if len(hits) == 1:
        lines[hits[0]] = flow.sub(lambda m: m.group(1) + m.group(2) + new + m.group(2)
                                  + m.group(3), lines[hits[0]], count=1)
        path.write_text("".join(lines))
        return True
    spot = _block_cluster_line(lines, tenant, old)
    if spot is None:
        return False
    lines[spot] = re.sub(r"(cluster:\s*)(['\"]?)" + re.escape(old) + r"\2",
                         lambda m: m.group(1) + m.group(2) + new + m.group(2), lines[spot],
                         count=1)
    path.write_text("".join(lines))
    return True


def _block_cluster_line(lines: list[str], tenant: str, old: str) -> int | None:
    """The line of ``cluster: old`` among the keys of the block mapping whose ``name:`` is
    the tenant (``- name: T`` then ``  cluster: old`` at the same indentation)."""
    q = r"['\"]?"
    name = re.compile(r"^(\s*)(- +)?name:\s*" + q + re.escape(tenant) + q + r"\s*(#.*)?$")
    found = []
    for i, line in enumerate(lines):
        m = name.match(line)
        if not m:
            continue
        keys = len(m.group(1)) + len(m.group(2) or "")
        start = i
        if not m.group(2):   # name is not the item's first key: find the item's "- "
            while start > 0 and not re.match(rf"^\s{{{keys - 2}}}- ", lines[start]):
                start -= 1
        item = [start]
        for j in range(start + 1, len(lines)):
            text = lines[j]
            if text.strip() and not text.strip().startswith("#") \
                    and len(text) - len(text.lstrip()) < keys:
                break
            item.append(j)
        cluster = re.compile(rf"^(\s{{{keys}}}|\s*- )cluster:\s*" + q + re.escape(old) + q
                             + r"\s*(#.*)?$")
        found += [j for j in item if cluster.match(lines[j])]
    return found[0] if len(found) == 1 else None


def _tenant(topo: Topology, name: str) -> Tenant:
    for t in topo.tenants:
        if t.name == name:
            return t
    raise UsageError(f"migrate --tenant: no tenant '{name}' in topology '{topo.name}'; "
                     f"tenants: {', '.join(t.name for t in topo.tenants) or 'none'}")


def cmd_migrate(args: argparse.Namespace) -> int:
    sb = resolve(args)
    topo = sb.topo
    if topo.cluster:
        raise UsageError("migrate --cluster: the tenant's cluster is the source and --to the "
                         "target; leave --cluster out")
    if not topo.multi_cluster:
        raise UsageError(f"migrate: topology '{topo.name}' has one etcd cluster "
                         f"({topo.clusters[0]}); add another (members with cluster: <name>, "
                         "docs/day2.md \"Several etcd clusters in one topology\") and up")
    tenant = _tenant(topo, args.tenant)
    if args.to not in topo.clusters:
        raise UsageError(f"migrate --to: topology '{topo.name}' has no etcd cluster "
                         f"'{args.to}'; its clusters: {', '.join(topo.clusters)}")
    path = record_path(topo, tenant.name)
    rec: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    if args.abort and args.copy_only:
        raise UsageError("migrate: --abort drops an unfinished move, --copy-only begins one; "
                         "give one of them")
    if args.abort and not rec:
        raise UsageError(f"migrate --abort: tenant {tenant.name} has no unfinished move "
                         f"(no {report.display_path(path)})")
    if args.abort and rec.get("step") != "copy":
        raise UsageError(f"migrate --abort: tenant {tenant.name} was switched to etcd cluster "
                         f"{rec['to']} already and runs there; finish the move: scripts/sandbox "
                         f"migrate --tenant {tenant.name} --to {rec['to']} (then move it back "
                         f"with --to {rec['from']} if wanted)")
    if args.copy_only and rec.get("step", "copy") != "copy":
        raise UsageError(f"migrate --copy-only: tenant {tenant.name} was switched to etcd "
                         f"cluster {rec['to']} already; finish the move: scripts/sandbox "
                         f"migrate --tenant {tenant.name} --to {rec['to']}")
    if rec and rec["to"] != args.to:
        raise UsageError(f"migrate: tenant {tenant.name}'s move from {rec['from']} to "
                         f"{rec['to']} is unfinished; finish it first: scripts/sandbox migrate "
                         f"--tenant {tenant.name} --to {rec['to']}")
    if not rec and tenant.cluster == args.to:
        raise UsageError(f"migrate: tenant {tenant.name} is on etcd cluster {args.to} already "
                         f"(the topology's tenants[].cluster)")
    for other in unfinished(topo):
        if other["tenant"] != tenant.name:
            refuse_if_unfinished(topo, "migrate")
    need_tool(sb.backend)
    check_owner(sb)
    source = rec.get("from") or tenant.cluster
    rec = rec or {"tenant": tenant.name, "from": source, "to": args.to, "step": "copy",
                  "prefix": tenant.normalized_prefix, "started": time.time()}
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    resuming = bool(rec.get("resumed"))
    what = "drop the unfinished move of" if args.abort else "migrate"
    print(f"sandbox: {what} tenant {tenant.name} ({tenant.normalized_prefix}) from etcd "
          f"cluster {source} to {args.to}"
          + (" (its copy alone)" if args.copy_only else "")
          + (f" (resuming: {rec['step']})" if resuming and not args.abort else ""), flush=True)
    rec["resumed"] = True
    figures: dict[str, Any] = {}
    with runner.run_context(topo, "migrate") as ctx:
        print(f"    full log: {report.display_path(ctx.log_path)}", flush=True)

        def step(view: Topology, playbook: str, extra: dict[str, Any]) -> dict[str, Any]:
            with tempfile.TemporaryDirectory(prefix="sandbox-migrate-") as tmp:
                out = Path(tmp) / "report.json"
                runner.run_playbook(ctx, view, sb.backend, playbook,
                                    run_vars({**extra, "k0s_migrate_report": str(out)}))
                return json.loads(out.read_text()) if out.is_file() else {}

        def save(step_name: str) -> None:
            rec["step"] = step_name
            path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")

        save(rec["step"])
        moving = {"k0s_migrate_tenant": tenant.name,
                  "k0s_migrate_target_group": inventory.cluster_group(args.to),
                  "k0s_migrate_force": bool(args.force), "k0s_migrate_resume": resuming}
        if args.abort:
            got = step(topo.view(source), "tenant-migrate.yml",
                       {**moving, "k0s_migrate_phase": "abort"})
            path.unlink()
            removed = (got.get("engine") or {}).get("removed", "?")
            print(f"sandbox: tenant {tenant.name}'s move to etcd cluster {args.to} dropped: it "
                  f"runs on {source} as before; on {args.to}: its copy ({removed} keys), etcd "
                  f"user and role removed ({time.time() - t0:.0f}s)")
            return 0
        if rec["step"] == "copy":
            target = topo.view(args.to)
            if topo.tls:
                # the tenant's user and role on the target, beside its own tenants'
                step(target, "etcd-rbac.yml", {"etcd_rbac_tenants": [
                    [t.name, t.normalized_prefix] for t in (*target.tenants, tenant)]})
            # sync while it serves, then the freeze, in one run (its connections warm); the
            # sync alone with --copy-only
            got = step(topo.view(source), "tenant-migrate.yml",
                       {**moving, "k0s_migrate_phase": "sync" if args.copy_only else "move"})
            if args.copy_only:
                sync = got.get("engine") or {}
                print(f"sandbox: tenant {tenant.name} copied to etcd cluster {args.to} while it "
                      f"serves: {sync.get('copied', '?')} keys at source revision "
                      f"{sync.get('copy_revision', '?')}, then {sync.get('applied_revisions', 0)} "
                      f"revisions of changes ({time.time() - t0:.0f}s); it still runs on "
                      f"{source}.\n    the freeze, when wanted (only the changes since): "
                      f"scripts/sandbox migrate --tenant {tenant.name} --to {args.to}\n"
                      f"    or drop the copy: scripts/sandbox migrate --tenant {tenant.name} "
                      f"--to {args.to} --abort")
                return 0
            figures.update(sync=got.get("sync", {}), final=got.get("engine", {}),
                           freeze_seconds=got.get("freeze_seconds"))
            save("switched")
        if rec["step"] == "switched":
            if not edit_topology(topo.path, tenant.name, source, args.to):
                raise UsageError(
                    f"migrate: tenant {tenant.name} now runs on etcd cluster {args.to}, but "
                    f"{report.display_path(topo.path)} does not write its cluster on its own "
                    f"line; set cluster: {args.to} in tenant {tenant.name}'s entry, then run "
                    f"scripts/sandbox migrate --tenant {tenant.name} --to {args.to} again to "
                    "finish (its keys, user and role leave the source)")
            save("edited")
        moved = load(topo.path)
        step(moved.view(source), "tenant-migrate.yml",
             {**moving, "k0s_migrate_phase": "cleanup", "k0s_migrate_prefix": rec["prefix"],
              "k0s_migrate_keep_source": bool(args.keep_source)})
        if topo.tls:
            # each cluster's RBAC and write budgets as the moved topology has them (the
            # budgets split each cluster's quota among its own tenants): the next up finds
            # them so, the moved tenant with its budget on the target from now on
            for cluster in (source, args.to):
                step(moved.view(cluster), "etcd-rbac.yml", {})
        # up's quick check on the target's view, the tenant in it: every member healthy, each
        # tenant's API ready, a write and a read through it
        step(moved.view(args.to), "ready.yml", {})
        path.unlink()
    print(summary(tenant.name, source, args.to, figures, bool(args.keep_source),
                  time.time() - t0))
    return 0


def summary(tenant: str, source: str, target: str, figures: dict[str, Any], kept: bool,
            took: float) -> str:
    """The closing lines: where the tenant is, what the freeze cost, what the source keeps."""
    lines = [(f"sandbox: tenant {tenant} moved from etcd cluster {source} to {target} in "
             f"{took:.0f}s")]
    sync, final = figures.get("sync") or {}, figures.get("final") or {}
    if sync.get("done_already"):
        # a resumed move whose final step had run: the engine kept the target as it was
        lines.append(f"    copy and final step: made by the interrupted run (resumed; the "
                     f"target kept as it was, fence revision {sync.get('fence_revision', '?')})")
    elif sync:
        lines.append(f"    copy while it served: {sync.get('copied', '?')} keys at source "
                     f"revision {sync.get('copy_revision', '?')}, then "
                     f"{sync.get('applied_revisions', 0)} revisions of changes "
                     f"({sync.get('seconds', 0):.2f}s)")
    if figures.get("freeze_seconds") is not None:
        last = ("nothing left to apply" if final.get("done_already") else
                f"the last {final.get('applied_revisions', 0)} revisions in "
                f"{final.get('seconds', 0):.2f}s")
        lines.append(f"    freeze: its API servers stopped for {figures['freeze_seconds']:.1f}s "
                     f"({last}, k0s.yaml switched, started and ready); "
                     f"its revisions raised to {final.get('target_revision', '?')} on {target}")
    lines.append(f"    source {source}: " + ("its keys kept (a copy nothing writes: its etcd "
                                              "user and role removed)" if kept else
                                              "its keys, etcd user and role removed"))
    return "\n".join(lines)


def add_commands(add: Callable[[str, str, Any], argparse.ArgumentParser]) -> None:
    p = add("migrate", "move one tenant to another etcd cluster of the topology, its writes "
            "frozen only for the last changes", cmd_migrate)
    p.add_argument("--tenant", required=True, metavar="T", help="the tenant to move")
    p.add_argument("--to", required=True, metavar="CLUSTER",
                   help="the etcd cluster to move it to (a member's cluster: in the topology)")
    p.add_argument("--force", action="store_true",
                   help="replace keys already under the tenant's prefix on the target")
    p.add_argument("--keep-source", action="store_true",
                   help="keep the tenant's keys on the source (its user and role go: nothing "
                        "writes them)")
    p.add_argument("--copy-only", action="store_true",
                   help="copy the tenant to the target while it serves and stop there: a later "
                        "migrate freezes it for the changes since, --abort drops the copy")
    p.add_argument("--abort", action="store_true",
                   help="drop an unfinished move that has not switched the tenant: its copy, "
                        "user and role leave the target, its API servers run on the source")
