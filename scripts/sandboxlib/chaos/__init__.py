"""``scripts/sandbox chaos``: consistency under faults, checked.

A bounded workload through the tenants' own etcd certificates (etcd_agent.py) and their
Kubernetes API servers (api.py), recorded as a history (history.py); faults injected on the
sandbox's own etcd members and healed (nemesis.py); the history checked for linearizability
per key, etcd's global revision order (revisions.py), each watch as etcd's robustness tests
check theirs (watches.py) and lost acknowledged writes (checker.py, linearizability.py, after the
checker's self-test on generated histories, selftest.py); a report as text, JSON and a
timeline picture (report.py). docs/reliability.md describes all of it.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import report as sandbox_report
from .. import runner
from ..context import Failure, UsageError, check_owner, need_tool, resolve, run_vars
from . import api, checker, nemesis, report, selftest, workload
from .history import History

QUIET = 8.0          # seconds of undisturbed workload before the first fault and after each
HOLD = 8.0           # how long a partition or disconnection lasts


def parse_faults(raw: str) -> list[str]:
    """The faults of --faults, in order; ``all`` stands for every fault (``all,all``: twice)."""
    names = [n for f in raw.split(",") if f.strip()
             for n in (nemesis.FAULTS if f.strip() == "all" else (f.strip(),))]
    bad = [f for f in names if f not in nemesis.FAULTS]
    if bad or not names:
        raise UsageError(f"chaos --faults {raw}: unknown fault(s) {', '.join(bad) or '(none)'}; "
                         f"give a comma-separated list of {', '.join(nemesis.FAULTS)} or 'all'")
    return names


def check_args(args: argparse.Namespace) -> list[str]:
    if not 10 <= args.duration <= 3600:
        raise UsageError(f"chaos --duration {args.duration}: give 10 to 3600 seconds")
    if not 1 <= args.clients <= 8:
        raise UsageError(f"chaos --clients {args.clients}: give 1 to 8 etcd clients per tenant")
    return parse_faults(args.faults)


def schedule(faults: list[str], duration: float, start: float, inject: Callable[[str], Any],
             say: Callable[[str], None]) -> None:
    """Quiet, the first fault, quiet, the next ...: each listed fault once, in order (name one
    twice to repeat it), then the workload without faults until ``duration`` (``start``: the
    workload's t0 on the monotonic clock). A fault under
    way when ``duration`` ends is healed first; the later ones are skipped, and said so."""
    time.sleep(min(QUIET, duration / 6))
    for i, fault in enumerate(faults):
        if time.monotonic() - start > duration - QUIET / 2:
            say(f"    skipped (no time left in --duration): {', '.join(faults[i:])}")
            break
        inject(fault)
        time.sleep(max(0.0, min(QUIET, duration - (time.monotonic() - start))))
    left = duration - (time.monotonic() - start)
    if left > 0:
        say(f"    workload goes on for {left:.0f}s without faults")
        time.sleep(left)


def cmd_chaos(args: argparse.Namespace) -> int:
    try:
        return run(args)
    except (api.ApiError, nemesis.NemesisError, workload.WorkloadError) as exc:
        raise Failure(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    faults = check_args(args)
    sb = resolve(args)
    if sb.backend != "podman":
        raise UsageError("chaos: the faults act on podman containers and networks: run it on "
                         "a podman sandbox (--backend podman)")
    if not sb.topo.tenants or len(sb.topo.group("etcd")) < 3:
        raise UsageError(f"chaos: topology '{sb.topo.name}' needs tenants and 3 or more etcd "
                         "members (a fault must leave a quorum), e.g. -t multi-tenant")
    need_tool(sb.backend)
    check_owner(sb)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    st = selftest.run(seed, histories=6, n_ops=300)
    if not st.ok:
        raise Failure(f"chaos: the checker's self-test failed ({st.to_json()}); nothing was "
                      "injected")
    run_id = secrets.token_hex(3)
    out = sb.topo.state_dir / "chaos" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    print(f"sandbox: chaos on '{sb.topo.name}' (run {run_id}, seed {seed}): {args.duration}s "
          f"of workload, faults {', '.join(faults)}; {args.clients} etcd clients and "
          f"{max(1, args.clients // 2)} API clients per tenant; checker self-test "
          f"{st.passed}/{st.histories} linearizable, {st.caught}/{st.mutations} mutations "
          "caught", flush=True)
    hist = History(meta={"run": run_id, "seed": seed, "topology": sb.topo.name,
                         "duration": args.duration, "faults": faults,
                         "clients": args.clients,
                         "prefixes": {t.name: t.normalized_prefix for t in sb.topo.tenants},
                         "api_keys": {t.name: f"{t.normalized_prefix}{api.GROUP}/{api.PLURAL}/"
                                      for t in sb.topo.tenants},
                         "api_names": {t.name: f"chaos-{run_id}-{t.name}-"
                                       for t in sb.topo.tenants}})
    health = "not checked"
    with runner.run_context(sb.topo, "chaos") as ctx, api.tls_workdir() as tmp:
        ctx.screen.line(f"    full log: {sandbox_report.display_path(ctx.log_path)}")

        def replace(member: str) -> None:
            runner.run_playbook(ctx, sb.topo, sb.backend, "replace-member.yml", run_vars(
                {"etcd_replace_member": member, "etcd_replace_force": True}))

        nem = nemesis.Nemesis(sb.topo, sb.backend, random.Random(seed), lambda: 0.0,
                              ctx.screen.line, replace)
        why = nem.healthy(60)
        if why:
            raise Failure(f"chaos: the cluster is not healthy before the run ({why}); "
                          "nothing was injected (scripts/sandbox status)")
        wl = workload.Workload(sb.topo, sb.backend, hist, run_id, seed, args.clients, 5,
                               args.duration + 900, Path(tmp))
        nem.now = wl.now
        try:
            wl.start()
            ctx.screen.line(f"    workload started: {len(wl.runs)} tenants")
            schedule(faults, args.duration, wl.t0,
                     lambda f: hist.faults.append(nem.inject(f, HOLD)), ctx.screen.line)
        except BaseException:
            wl.abort()
            why = nem.heal_all()
            ctx.screen.line(f"    faults healed: {why or 'cluster healthy, hashkv equal'}")
            raise
        wl.stop()
        health = nem.heal_all()
        ctx.screen.line(f"    faults healed: {health or 'cluster healthy, hashkv equal'}")
        wl.finish()
        wl.cleanup()
    rep = checker.check(hist)
    hist.meta["workload_seconds"] = round(max((o.complete or o.invoke) for o in hist.ops), 1)
    data = report.build(hist, rep, st.to_json(), health)
    hist.save(out / "history.json")
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    report.timeline(hist, out / "timeline.png",
                    f"scripts/sandbox chaos on {sb.topo.name}, run {run_id}: "
                    f"{len(hist.ops)} operations, {len(hist.faults)} faults, "
                    f"{data['anomaly_count']} anomalies (API servers: CRD API server stand-in "
                    "where k0s does not run)")
    text = report.text(data)
    (out / "report.txt").write_text(text + "\n")
    print(text)
    print(f"sandbox: chaos report in {sandbox_report.display_path(out)} (report.txt, "
          "report.json, timeline.png, history.json)")
    why = verdict(rep, health, data["silent_clients"])
    if why:
        raise Failure(f"{why} (see {sandbox_report.display_path(out / 'report.txt')})")
    return 0


def verdict(rep: checker.Report, health: str, silent: Sequence[str] = ()) -> str:
    """Why the run fails (its exit status), or "" when it passes: any anomaly (a watch that
    never reached its end marker is one, named here with its reason), a lost acknowledged
    write, an unhealthy cluster at the end, clients that never came back after the faults
    (``report.silent_clients``)."""
    if not (rep.anomalies or rep.lost_writes or health or silent):
        return ""
    stalled = "".join(f"; {a.where} stalled: {a.message}" for a in rep.anomalies
                      if a.type == "watch-stalled")
    quiet = "".join(f"; silent: {why}" for why in silent)
    return (f"chaos: {len(rep.anomalies)} anomalies, {rep.lost_writes} lost acknowledged "
            f"writes, health at the end: {health or 'ok'}{stalled}{quiet}")


def add_commands(add: Callable[[str, str, Any], argparse.ArgumentParser]) -> None:
    """Register ``chaos`` with cli.build_parser's ``add``."""
    c = add("chaos", "a workload through the tenants' certificates and API servers under "
            "injected etcd faults, checked for linearizability (docs/reliability.md)", cmd_chaos)
    c.add_argument("--duration", type=int, default=60, metavar="S",
                   help="seconds of workload (default 60); a fault under way is healed first")
    c.add_argument("--faults", default="all", metavar="LIST",
                   help=f"comma-separated faults, injected in order, each once (name one "
                        f"twice to repeat it; all: every fault, all,all: twice): "
                        f"{', '.join(nemesis.FAULTS)} (default: all)")
    c.add_argument("--clients", type=int, default=2, metavar="N",
                   help="etcd clients per tenant (default 2; API clients: half as many, at "
                        "least 1)")
    c.add_argument("--seed", type=int, metavar="N",
                   help="seed of the clients' and the nemesis' choices (default: random, "
                        "printed)")
