"""``scripts/sandbox attack``: a hostile tenant's attempts on the etcd it shares.

One tenant (``--tenant``) tries, with only what its API server has on its controller (k0s.yaml's
endpoints, its own certificate), everything roles/sandbox_verify/files/hostile_tenant.py knows
on the other tenants and the cluster -- including deleting another tenant's whole prefix; with
``--nospace`` it first fills the backend quota through its own prefix until etcd raises NOSPACE
and tries everything again (etcd 3.5 without the sandbox's patch lets it past RBAC then).
playbooks/attack.yml runs it, undoes NOSPACE and the attempts' traces as the admin, compares
every tenant's keys with before and reconciles etcd RBAC; this prints the report (a table of
what was not refused, the counts) and fails when an attempt got through. docs/security.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from . import report, runner
from . import sandbox_attacks as attacks
from .context import Failure, UsageError, check_owner, need_tool, resolve, run_vars


def check_topology(args: argparse.Namespace) -> Any:
    """The sandbox, after checking the tenant and that tenants share it under etcd RBAC."""
    sb = resolve(args)
    names = [t.name for t in sb.topo.tenants]
    tenant = args.tenant or (names[0] if names else "")
    if tenant not in names:
        raise UsageError(f"attack --tenant: no tenant '{tenant}' in topology '{sb.topo.name}'; "
                         f"tenants: {', '.join(names) or 'none'}")
    rbac = sb.topo.vars.get("etcd_rbac", sb.topo.tls and len(names) > 1)
    if not (sb.topo.tls and len(names) > 1 and rbac):
        raise UsageError(f"attack: topology '{sb.topo.name}' has "
                         + ("plain HTTP" if not sb.topo.tls else "one tenant" if len(names) < 2
                            else "etcd RBAC off (etcd_rbac: false)")
                         + ": nothing confines a tenant, so there is nothing to attack "
                           "(try -t multi-tenant); nothing was changed")
    args.tenant = tenant
    return sb


def render(data: dict[str, Any]) -> str:
    out = []
    for result in data.get("attacks") or []:
        rows = [r for r in attacks.rows(result) if r[1] != "refused"]
        if rows:
            out.append(report.table(["PHASE", "OUTCOME", "ATTEMPT", "TARGET", "DETAIL"], rows))
        for phase in result.get("phases") or []:
            out.append(f"    {result.get('tenant')}, {attacks.phase_line(phase)}")
        if result.get("fill"):
            out.append(f"    {result.get('tenant')}, its own fill: {result['fill'].get('detail', '')}")
        if result.get("admin_fill"):
            out.append(f"    then {result['admin_fill'].get('detail', '')}")
    for c in data.get("checks") or []:
        out.append(f"{'PASS' if c.get('ok') else 'FAIL'} {c.get('name')}: {c.get('detail')}")
    return "\n".join(out)


def cmd_attack(args: argparse.Namespace) -> int:
    sb = check_topology(args)
    need_tool(sb.backend)
    check_owner(sb)
    path = sb.topo.state_dir / "attack.json"
    path.unlink(missing_ok=True)
    if args.flood and args.nospace:
        raise UsageError("attack: --flood and --nospace are two runs (NOSPACE is undone before "
                         "a flood can tell anything): run `attack --nospace`, then `attack --flood`")
    if args.flood_seconds is not None and not args.flood:
        raise UsageError("attack --flood-seconds: give --flood too")
    seconds = args.flood_seconds if args.flood_seconds is not None else 60
    if args.flood and not 5 <= seconds <= 3600:
        raise UsageError(f"attack --flood-seconds: {seconds} is not between 5 and 3600")
    print(f"sandbox: tenant {args.tenant} attacks the shared etcd with its own certificate"
          + (" (then it fills its own prefix until etcd refuses: its write budget, or NOSPACE;"
             " then everything again under NOSPACE)" if args.nospace else "")
          + (f" (then it floods its own prefix by every means for {seconds} s while the other "
             "tenants write)" if args.flood else "")
          + ": if isolation fails, other tenants' keys are deleted -- a sandbox's work only",
          flush=True)
    extra = {"sandbox_attack_tenant": args.tenant, "sandbox_attack_nospace": bool(args.nospace),
             "sandbox_attack_flood": bool(args.flood), "sandbox_attack_report": str(path),
             **({"sandbox_attack_flood_seconds": seconds} if args.flood else {})}
    t0 = time.time()
    failed: Exception | None = None
    with runner.run_context(sb.topo, "attack") as ctx:
        print(f"    full log: {report.display_path(ctx.log_path)}", flush=True)
        try:
            runner.run_playbook(ctx, sb.topo, sb.backend, "attack.yml", run_vars(extra))
        except runner.CommandFailed as exc:
            failed = exc
    if not path.is_file():
        if failed:
            raise failed
        raise Failure(f"attack: no report was written ({report.display_path(path)})")
    data = json.loads(path.read_text())
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(render(data))
    verdict = "every attempt refused" if data.get("passed") else "ISOLATION FAILED"
    print(f"sandbox: attack by {args.tenant} done in {time.time() - t0:.0f}s: {verdict} "
          f"(report: {report.display_path(path)})")
    if not data.get("passed"):
        raise Failure(f"tenant {args.tenant} got past its confinement or changed another "
                      f"tenant's keys (see above; {report.display_path(path)})")
    if failed:   # the report passed, a later step did not (the RBAC reconcile, say)
        raise failed
    return 0


def add_commands(add: Callable[[str, str, Any], argparse.ArgumentParser]) -> None:
    a = add("attack", "a hostile tenant's attempts on the etcd it shares, with its own "
                      "certificate (playbooks/attack.yml; docs/security.md)", cmd_attack)
    a.add_argument("--tenant", metavar="T", help="the attacking tenant (default: the first)")
    a.add_argument("--nospace", action="store_true",
                   help="fill the tenant's own prefix until etcd refuses (its write budget; the "
                        "admin then raises NOSPACE), then try everything again under NOSPACE "
                        "(undone afterwards)")
    a.add_argument("--flood", action="store_true",
                   help="flood the tenant's own prefix by every means while the other tenants "
                        "write, and check they all succeed, the database stays under the quota "
                        "and the tenant is stopped by its budget alone (it stays over it: "
                        "`defrag --compact` after deleting, or the next compaction, brings it back)")
    a.add_argument("--flood-seconds", type=int, metavar="S",
                   help="how long the flood lasts (default 60)")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
