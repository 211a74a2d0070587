"""``scripts/sandbox``: bring the k0s external-etcd sandbox up, inspect it, take it down.

Every command takes ``--topology`` (a name from inventories/ or a path) and ``--backend``;
without them: ``SANDBOX_TOPOLOGY``, else the sandbox ``up`` remembered in
``.sandbox/current``, else ``default`` on podman. Errors print one line ``sandbox: error: ...`` and exit non-zero: 2 for bad
input (nothing changed), 1 when a step failed.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import yaml

from . import (
    apiserver,
    attack,
    chaos,
    day2,
    etcdbuild,
    fingerprint,
    inventory,
    kube,
    migrate,
    progress,
    remote,
    report,
    runner,
    sessions,
    specs,
)
from .context import (
    Failure,
    UsageError,
    check_owner,
    current_file,
    need_tool,
    podman_subnet_free,
    read_current,
    remember,
    resolve,
    run_vars,
    target,
)
from .topology import BACKENDS, REPO_ROOT, Topology, TopologyError

PASSTHROUGH = ("ssh", "etcdctl", "kubectl")
EXAMPLES = """examples:
  scripts/sandbox up                          # inventories/default.yml on podman
  scripts/sandbox up -t multi-tenant          # another shipped topology (or a path)
  scripts/sandbox etcdctl member list -w table
  scripts/sandbox kubectl --tenant k0s-tenant get crd
  scripts/sandbox down --purge

docs/cli.md has the details."""
DEFAULT_UNITS = {"etcd": "etcd", "k0s_controller": "k0scontroller", "lb": "haproxy"}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see scripts/sandbox {self._sub_name()}--help)")

    def _sub_name(self) -> str:
        parts = self.prog.split()[1:]
        return " ".join(parts) + " " if parts else ""


# -- commands ----------------------------------------------------------------------------
# Variables of the playbooks (not of a role) that ``up --set`` takes, with their YAML type.
PLAYBOOK_VARIABLES: dict[str, type] = {"etcd_rbac": bool, "etcd_rbac_keep_users": list,
                                       "etcd_rbac_keep_roles": list}


def role_variables() -> set[str]:
    """Every variable a role's main entry point declares in its meta/argument_specs.yml (what
    --set may set; a day-2 operation's inputs are its command's options)."""
    return specs.main_variables()


def up_extra_vars(args: argparse.Namespace) -> dict[str, Any]:
    """Variables ``up`` passes to site.yml: context.run_vars (shared with every day-2
    command: no k0s binary needed, etcd's package when its release cannot be downloaded),
    then ``--etcd-install`` and ``--set``. ``--set`` takes the
    roles' variables (their types and values are checked by playbooks/validate.yml) and
    PLAYBOOK_VARIABLES; ``--set-unchecked`` any name."""
    extra = run_vars()
    if args.etcd_install:
        extra["etcd_install_method"] = args.etcd_install
    known = role_variables() | set(PLAYBOOK_VARIABLES)
    items = [(i, True) for i in args.set or []] + [(i, False) for i in args.set_unchecked or []]
    for item, checked in items:
        flag = "--set" if checked else "--set-unchecked"
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"{flag} {item}: use {flag} VARIABLE=VALUE (VALUE is YAML)")
        try:
            extra[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UsageError(f"{flag} {item}: VALUE is not valid YAML ({exc})") from None
        if not checked:
            continue
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"--set {item}: no role or playbook takes '{key}'; {hint}the "
                             "variables are listed in roles/*/README.md (or pass it with "
                             "--set-unchecked)")
        want = PLAYBOOK_VARIABLES.get(key)
        if want is not None and not isinstance(extra[key], want):
            raise UsageError(f"--set {item}: {key} must be a {want.__name__} "
                             f"({'true or false' if want is bool else 'YAML list, e.g. [a, b]'}), "
                             f"not {value!r}")
    return extra


def pki_beside_nodes(ctx: runner.RunContext, topo: Topology, backend: str,
                     extra: dict[str, Any]) -> Any:
    """A first ``up`` of a TLS sandbox makes its PKI on the control node (playbooks/pki.yml
    without copying, the same variables as site.yml) while the nodes are created and boot:
    the two overlap instead of adding up. site.yml then finds the PKI current and only
    copies. Later runs (PKI there) make or renew certificates in site.yml as before.
    Podman only: a VM's SSH address (a certificate SAN) is known only once it has booted."""
    if not topo.tls or (topo.state_dir / "pki" / ".inputs.sha256").exists():
        return contextlib.nullcontext()
    return runner.beside(ctx, topo, backend, "pki.yml", {**extra, "pki_distribute": False},
                         "PKI on the control node")


def cmd_up(args: argparse.Namespace) -> int:
    sb = resolve(args)
    if sb.topo.cluster:
        raise UsageError("up --cluster: up converges every etcd cluster of the topology; "
                         "leave --cluster out")
    migrate.refuse_if_unfinished(sb.topo, "up")
    need_tool(sb.backend)
    check_owner(sb)
    extra = up_extra_vars(args)
    apiserver.refuse_bad_k0s_inputs(sb.topo, extra)   # before the version names a file or URL
    if sb.backend == "podman":
        podman_subnet_free(sb.topo)
    apiserver.refuse_test_double(sb.topo, extra)
    why = fingerprint.Result()   # why the converge runs (fingerprint.py)
    if sb.backend == "podman" and not args.force:
        why = fingerprint.why_converge(sb.topo, sb.backend, extra, args.apiserver)
        if why.unchanged:
            return 0
    # Every check that needs no node, before anything is created or written (.sandbox/ too):
    # with several etcd clusters, of each cluster's view (what site.yml converges, one run each).
    views = sb.topo.views()
    for view in views:
        runner.validate(view, sb.backend, extra)
    fingerprint.say_why(sb.topo, why)
    extra["sandbox_validated"] = True  # site.yml skips its own validate phase
    remember(sb)
    t0 = time.time()
    print(f"sandbox: up '{sb.topo.name}' ({sb.backend}; {len(sb.topo.nodes)} nodes)",
          flush=True)
    with runner.run_context(sb.topo, "up") as ctx:
        ctx.screen.line(f"    full log: {report.display_path(ctx.log_path)}")
        with open(ctx.log_path, "a", encoding="utf-8") as log:
            log.writelines(f"# converging: {reason}\n" for reason in why.reasons)
        try:
            extra.update(etcdbuild.up_vars(sb.topo, extra, ctx.screen, ctx.log_path))
        except RuntimeError as exc:
            raise Failure(f"the patched etcd packages could not be built: {exc} (log: "
                          f"{report.display_path(ctx.log_path)}; or {etcdbuild.STOCK_HINT})"
                          ) from None
        if sb.topo.tenants:
            try:
                extra.update(apiserver.up_vars(sb.topo, extra, args.apiserver, ctx.screen,
                                               ctx.log_path))
            except RuntimeError as exc:
                raise Failure(f"the Kubernetes API stand-in could not be built: {exc} "
                              f"(log: {report.display_path(ctx.log_path)}; or run up with "
                              "--apiserver off)") from None
        if sb.backend == "podman":
            given = fingerprint.inputs(sb.topo, sb.backend, extra)
            extra["sandbox_converge_inputs"] = given   # each node records them at the end
            with pki_beside_nodes(ctx, views[0], sb.backend, extra):
                # the stand-in's binaries, mounted read-only into new controllers
                runner.run_playbook(ctx, sb.topo, sb.backend, "nodes.yml",
                                    {k: v for k, v in extra.items() if k == "crd_apiserver_dir"})
            # site.yml's converge, then the quick check (ready.yml) instead of verify.yml;
            # several etcd clusters one after the other (each a view: Topology.view)
            for view in views:
                if view.cluster:
                    ctx.screen.line(f"==> etcd cluster '{view.cluster}': "
                                    f"{len(view.group('etcd'))} member(s), tenants "
                                    f"{', '.join(t.name for t in view.tenants) or 'none'}")
                runner.run_playbook(ctx, view, sb.backend, "up.yml", extra)
            fingerprint.seal(sb.topo, given, extra)
        else:
            runner.vagrant_up(ctx, sb.topo, extra)
    print(f"sandbox: up finished in {time.time() - t0:.0f}s")
    for view in views:
        prefix = f"etcd cluster '{view.cluster}': " if view.cluster else ""
        line = report.checked_line(report.run_report(sb.topo.state_dir, t0, view.cluster))
        print(line.replace("sandbox: ", f"sandbox: {prefix}", 1))
    print()
    print(report.render(report.collect(sb.topo, sb.backend, verified_since=t0)))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    sb = resolve(args)
    need_tool(sb.backend)
    check_owner(sb)
    t0 = time.time()
    with runner.run_context(sb.topo, "down") as ctx:
        if sb.backend == "podman":
            runner.run_playbook(ctx, sb.topo, sb.backend, "nodes.yml",
                                {"sandbox_nodes_state": "absent"})
        else:
            runner.vagrant_run(ctx, sb.topo, "destroy")
    msg = f"sandbox: '{sb.topo.name}' is down ({time.time() - t0:.0f}s)"
    if args.purge:
        state = sb.topo.state_dir
        if state.is_dir() and state.name == sb.topo.name:
            shutil.rmtree(state)
        if read_current().get("topology") == str(sb.topo.path):
            current_file().unlink(missing_ok=True)
        msg += f"; removed {report.display_path(state)}"
    print(msg)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    sb = resolve(args)
    print(report.render(report.collect(sb.topo, sb.backend)))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    sb = resolve(args)
    if not (REPO_ROOT / "playbooks" / "verify.yml").is_file():
        raise Failure("playbooks/verify.yml does not exist yet in this checkout: "
                      "nothing to verify with (see scripts/sandbox status)")
    need_tool(sb.backend)
    check_owner(sb)
    if args.json and sb.topo.multi_cluster and not sb.topo.cluster:
        raise UsageError(f"verify --json: topology '{sb.topo.name}' has several etcd clusters "
                         f"({', '.join(sb.topo.clusters)}), a report each; name one with "
                         "--cluster")
    out = sys.stderr if args.json else sys.stdout
    # Several etcd clusters: each cluster's view in turn (--cluster: that one), a report each.
    for view in sb.topo.views():
        verify_view(args, view, sb.backend, out)
    return 0


def verify_view(args: argparse.Namespace, topo: Topology, backend: str, out: Any) -> None:
    report_path = topo.state_dir / report.report_name("verify", topo.cluster)
    report_path.unlink(missing_ok=True)
    if topo.cluster and not args.json:
        print(f"sandbox: verify etcd cluster '{topo.cluster}' (members "
              f"{', '.join(n.name for n in topo.group('etcd'))}; tenants "
              f"{', '.join(t.name for t in topo.tenants) or 'none'})", flush=True)
    with runner.run_context(topo, "verify", out=out) as ctx:
        try:
            runner.run_playbook(ctx, topo, backend, "verify.yml",
                                {"sandbox_verify_report": str(report_path)})
        finally:
            if args.json and report_path.is_file():
                print(report_path.read_text().strip())
            elif not args.json and report_path.is_file() and sys.exc_info()[0] is not None:
                print(report.verify_table(report_path))
    if args.json and not report_path.is_file():
        print(json.dumps({"passed": True, "report": None}))
    elif not args.json:
        print(report.verify_table(report_path))
        where = f" for etcd cluster '{topo.cluster}'" if topo.cluster else ""
        print(f"sandbox: verify passed{where} (log: {report.display_path(ctx.log_path)})")


def cmd_ssh(args: argparse.Namespace) -> int:
    sb = resolve(args)
    remote.exec_ssh(target(sb, args.node), " ".join(args.args) if args.args else None)


def cmd_etcdctl(args: argparse.Namespace) -> int:
    sb = resolve(args)
    if sb.topo.multi_cluster and not sb.topo.cluster:
        raise UsageError(f"etcdctl: topology '{sb.topo.name}' has several etcd clusters "
                         f"({', '.join(sb.topo.clusters)}); name one: scripts/sandbox etcdctl "
                         f"--cluster {sb.topo.clusters[0]} ...")
    targets = remote.targets(sb.topo, sb.backend)
    members = [n.name for n in sb.topo.group("etcd")]
    probe = ("command -v etcdctl >/dev/null 2>&1 || { echo 'etcdctl not installed'; exit 0; }; "
             "systemctl is-active etcd 2>&1")
    seen: list[str] = []
    for m in members:
        res = remote.run(targets[m], probe, timeout=15)
        state = (res.stdout.strip() or res.stderr.strip() or "?").splitlines()[-1]
        if res.returncode == 0 and state == "active":
            remote.exec_ssh(targets[m], "etcdctl " + shlex.join(args.args))
        seen.append(f"{m}: {'unreachable' if res.returncode == 255 else state}")
    raise Failure(f"no healthy etcd member to run etcdctl on ({'; '.join(seen)}); "
                  "is the sandbox up? (scripts/sandbox status)")


def cmd_logs(args: argparse.Namespace) -> int:
    sb = resolve(args)
    node = target(sb, args.node)
    unit = args.unit
    if unit is None:
        groups = sb.topo.node(args.node).groups
        unit = next((DEFAULT_UNITS[g] for g in groups if g in DEFAULT_UNITS), "etcd")
    cmd = ["journalctl", "--no-pager", "-u", unit, "-n", str(args.lines)]
    if args.follow:
        cmd.append("-f")
    remote.exec_ssh(node, shlex.join(cmd))


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    try:
        counts = sorted({int(x) for x in args.members.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--members {args.members}: give member counts like 1,3,5,7") from None
    if not counts or min(counts) < 1 or max(counts) > 7 or args.reps < 1:
        raise UsageError("--members takes counts from 1 to 7 and --reps at least 1")
    need_tool("podman")
    try:
        return bench.run(args.reps, counts, Path(args.out).resolve(), not args.no_floor)
    except RuntimeError as exc:
        raise Failure(str(exc).splitlines()[0] + " (see the output above)") from None


def cmd_inventory(args: argparse.Namespace) -> int:
    sb = resolve(args)
    data: dict[str, Any] = inventory.build(sb.topo, sb.backend)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), end="")
    return 0


# -- parser ------------------------------------------------------------------------------
def build_parser() -> Parser:
    common = Parser(add_help=False)
    common.add_argument("--topology", "-t", metavar="T",
                        help="topology name from inventories/ or a path to a topology file "
                             "(default: the one last brought up, else 'default')")
    common.add_argument("--backend", "-b", choices=BACKENDS,
                        help="podman (system containers, default) or vagrant (VMs)")
    common.add_argument("--cluster", metavar="C",
                        help="with several etcd clusters in the topology: the one to act on "
                             "(its members, tenants and their controllers; default: each "
                             "for up and verify, the tenant's with --tenant)")
    common.add_argument("--verbose", "-v", action="store_true",
                        help="show every Ansible task, not only one line per phase")
    p = Parser(prog="scripts/sandbox",
               description="k0s on an external etcd cluster: a sandbox on podman or Vagrant.",
               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    def add(name: str, help_: str, func: Any) -> Parser:
        sp: Parser = sub.add_parser(name, parents=[common], help=help_, description=help_)
        sp.set_defaults(func=func)
        return sp

    u = add("up", "create the nodes, converge them (playbooks/up.yml: site.yml's converge, "
            "then a quick check; the full one: verify)", cmd_up)
    u.add_argument("--etcd-install", choices=("release", "package", "archive"),
                   help="how etcd gets onto the members (default: the topology's, else "
                        "release, falling back to the distribution package when the "
                        "release cannot be downloaded)")
    u.add_argument("--apiserver", choices=("auto", "on", "off"), default="auto",
                   help="Kubernetes' CRD API server as a stand-in for k0s's kube-apiserver "
                        "(not k0s): auto = build and run it when no k0s binary can be had "
                        "(default), on = always build it, off = never")
    u.add_argument("--force", action="store_true",
                   help="converge even when the sandbox is as the last converge left it and "
                        "nothing it was made from changed (without it such an up says "
                        "'nothing to change' after one check per node)")
    u.add_argument("--set", action="append", metavar="VAR=VALUE",
                   help="a role variable for this run (VALUE is YAML; repeatable), e.g. "
                        "--set etcd_version=3.5.21 --set k0s_enable_worker=true")
    u.add_argument("--set-unchecked", action="append", metavar="VAR=VALUE",
                   help="like --set, for a variable no role declares (passed to Ansible "
                        "as it is)")
    d = add("down", "remove the sandbox's nodes and network", cmd_down)
    d.add_argument("--purge", action="store_true",
                   help="also remove the sandbox's state dir (SSH key, PKI, logs)")
    add("status", "nodes, etcd health, tenants and k0s state", cmd_status)
    v = add("verify", "run playbooks/verify.yml (the sandbox's checks)", cmd_verify)
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    s = add("ssh", "ssh to a node (as root), optionally running a command", cmd_ssh)
    s.add_argument("node", metavar="NODE")
    s.add_argument("args", nargs="*", metavar="CMD", help=argparse.SUPPRESS)
    e = add("etcdctl", "run etcdctl on the first healthy etcd member (certs preset)",
            cmd_etcdctl)
    e.add_argument("args", nargs="*", metavar="ARGS", help=argparse.SUPPRESS)
    kube.add_commands(add)
    lg = add("logs", "journal of a node's service (etcd / k0scontroller by default)",
             cmd_logs)
    lg.add_argument("node", metavar="NODE")
    lg.add_argument("unit", metavar="UNIT", nargs="?")
    lg.add_argument("-f", "--follow", action="store_true", help="follow the journal")
    lg.add_argument("-n", "--lines", type=int, default=200, help="lines to show (200)")
    bn = sub.add_parser("bench", help="measure up/down against the floor (podman)",
                        description="measure cold/warm up, down and member counts against "
                                    "the floor (podman; takes a while)")
    bn.set_defaults(func=cmd_bench)
    bn.add_argument("--reps", type=int, default=3, help="repetitions per case (3)")
    bn.add_argument("--members", default="1,3,5,7", help="etcd member counts (1,3,5,7)")
    bn.add_argument("--out", default=str(REPO_ROOT / "bench"), help="results directory (bench/)")
    bn.add_argument("--no-floor", action="store_true", help="skip the no-Ansible floor")
    i = add("inventory", "the hosts, groups and variables Ansible gets", cmd_inventory)
    i.add_argument("--json", action="store_true", help="JSON (for the Vagrantfile)")
    day2.add_commands(add)
    chaos.add_commands(add)
    attack.add_commands(add)
    migrate.add_commands(add)
    return p


OWN_OPTIONS = {"--topology", "-t", "--backend", "-b", "--tenant", "--cluster"}


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``etcdctl -w table ...`` style argv: our options first, the rest verbatim."""
    if not argv or argv[0] not in PASSTHROUGH:
        return argv, []
    ours, i = [argv[0]], 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return ours, argv[i + 1:]
        if tok in ("-h", "--help"):
            ours.append(tok)
            i += 1
        elif tok in OWN_OPTIONS and i + 1 < len(argv):
            ours += argv[i:i + 2]
            i += 2
        elif tok.split("=", 1)[0] in OWN_OPTIONS and "=" in tok:
            ours.append(tok)
            i += 1
        else:
            break
    if argv[0] in ("ssh",) and i < len(argv):  # the node name is ours too
        ours.append(argv[i])
        i += 1
    return ours, argv[i:]


def main(argv: list[str] | None = None) -> int:
    """Run one command; a reader that went away (``status | head``) ends it quietly with
    141 (128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe). SIGTERM
    ends it as Ctrl-C does: the playbook it waits for ends with it (sessions.py)."""
    old_handler = signal.signal(signal.SIGTERM, sessions.terminated)
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()
            signal.signal(signal.SIGTERM, old_handler)
    except BrokenPipeError:
        # Python would report the unflushed rest again at exit: point stdout at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        ours, rest = split_passthrough(argv)
        args = build_parser().parse_args(ours)
        if rest:
            args.args = rest
        progress.VERBOSE = bool(getattr(args, "verbose", False))
        return int(args.func(args))
    except (UsageError, TopologyError, runner.InvalidInput) as exc:
        print(f"sandbox: error: {exc}", file=sys.stderr)
        return 2
    except (Failure, runner.CommandFailed, remote.RemoteError) as exc:
        print(f"sandbox: error: {exc}", file=sys.stderr)
        return 1
    except sessions.Interrupted as exc:   # while a child ran: it ended too, the message says
        print(f"sandbox: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("sandbox: interrupted", file=sys.stderr)
        return 130
