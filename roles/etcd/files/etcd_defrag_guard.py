#!/usr/bin/python3
"""k0sbox-etcd-defrag-guard: defragment THIS etcd member when its file is fragmented.

roles/etcd installs it on every member (etcd_defrag_guard_ratio above 0) and runs it every
minute with k0sbox-etcd-defrag-guard.timer, as root, through the role's etcdctl wrapper (the
admin certificate, CN root: with etcd RBAC only root may read a member's status on 3.5.28+ and
3.6, defragment, move the leader and disarm alarms).

Why: etcd's backend quota counts the bbolt file's PHYSICAL size, free pages included
(server/etcdserver/quota.go, ``Backend().Size() + cost < maxBackendBytes``). Tenants that
write, overwrite and delete within their write budgets while etcd compacts leave free pages
the file keeps until a defragmentation, and when the file reaches the quota etcd raises
NOSPACE and refuses every tenant's writes.

One run (``--help`` for the options):

1. this member's status (``endpoint status -w json --endpoints=<its URL>``). When its file
   is below RATIO of the quota, or less than FREE_SHARE of it is free, and no alarm is
   raised, that is all (one etcdctl call a minute);
2. it acts in its own minute only: the members that have started, sorted by name (``member
   list``), take turns, the member at index i when the minute (minutes since the epoch)
   modulo their count is i. So no two guards defragment at once (a member answers no read
   while it defragments), with no lock to take (a lock in etcd would need a lease, which
   etcd refuses under NOSPACE, when the guard is needed most) and no inventory to agree on
   (every member reads the same member list, members added or removed included);
3. before a defragmentation every other member must answer a serializable read within
   PROBE_TIMEOUT (a member down, or still defragmenting past its minute, answers none: then
   the cluster has no member to spare and nothing is done); when this member leads,
   leadership is handed to another voting member first (``move-leader``; the one whose
   minute came last before this one's, so it is the last to need its own again): a long
   defragmentation blocks the member's applies and loads its disk, and a leader's late
   heartbeats cost an election; when the hand-over fails nothing is done this minute;
4. ``defrag --endpoints=<its URL>`` with a command timeout, then its status again: the
   sizes before and after are printed (the journal keeps them);
5. alarms, in its own minute: a defragmentation does not disarm NOSPACE. The guard disarms
   it when only NOSPACE alarms are raised (a CORRUPT alarm is an operator's), every member
   answers and every member's file is below the RATIO line, the line it keeps them under:
   then no member is near the quota and writes will not raise it again at once. When a
   member's data alone is above the line, the alarm stays for an operator.

etcd 3.4, 3.5 and 3.6 give the same JSON for these commands (``dbSizeInUse`` since 3.4;
3.6 also ``dbSizeQuota``, used when present). Exit status: 0 when it ran (whether it acted
or not), 1 when its member's status could not be read or an action failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# etcd's backend quota when none is set (storage.DefaultQuotaBytes, 2 GiB).
DEFAULT_QUOTA = 2 * 1024 * 1024 * 1024
# A key no one writes: the serializable read that shows another member answers.
PROBE_KEY = "k0sbox/defrag-guard/probe"
ALARM_NAMES = {1: "NOSPACE", 2: "CORRUPT"}


class GuardError(Exception):
    """etcdctl failed where the guard needs an answer; the message says which call and why."""


@dataclass(frozen=True)
class Status:
    """One member's ``endpoint status`` entry."""

    endpoint: str
    member_id: int
    leader: int
    db_size: int
    in_use: int | None
    quota: int
    version: str
    errors: tuple[str, ...]

    @classmethod
    def of(cls, entry: dict[str, Any]) -> Status:
        st = entry.get("Status") or {}
        in_use = st.get("dbSizeInUse")
        return cls(endpoint=str(entry.get("Endpoint") or ""),
                   member_id=int((st.get("header") or {}).get("member_id") or 0),
                   leader=int(st.get("leader") or 0), db_size=int(st.get("dbSize") or 0),
                   in_use=None if in_use is None else int(in_use),
                   quota=int(st.get("dbSizeQuota") or 0), version=str(st.get("version") or ""),
                   errors=tuple(str(e) for e in st.get("errors") or ()))


@dataclass(frozen=True)
class Member:
    """One ``member list`` entry."""

    id: int
    name: str
    client_urls: tuple[str, ...]
    learner: bool

    @classmethod
    def of(cls, entry: dict[str, Any]) -> Member:
        return cls(id=int(entry.get("ID") or 0), name=str(entry.get("name") or ""),
                   client_urls=tuple(entry.get("clientURLs") or ()),
                   learner=bool(entry.get("isLearner")))


@dataclass
class Report:
    """What one run saw and did (``--json`` prints it)."""

    member: str = ""
    endpoint: str = ""
    version: str = ""
    minute: int = 0
    slot: int = -1
    count: int = 0
    db_size: int = 0
    in_use: int | None = None
    quota: int = 0
    line: int = 0
    fragmented: bool = False
    action: str = "none"       # none | waits | skipped | dry-run | defragmented | failed
    reason: str = ""
    leader_moved_to: str = ""
    after_db_size: int = 0
    after_in_use: int | None = None
    seconds: float = 0.0
    alarms: list[str] = field(default_factory=list)
    disarmed: bool = False
    alarm_reason: str = ""
    lines: list[str] = field(default_factory=list)


def mb(n: int | None) -> str:
    """Bytes as `status` shows a database size (decimal MB; kB under 0.1 MB)."""
    if n is None:
        return "?"
    return f"{n / 1e3:.0f} kB" if n < 100_000 else f"{n / 1e6:.1f} MB"


def is_fragmented(db_size: int, in_use: int | None, quota: int, ratio: float,
                  free_share: float) -> bool:
    """The file is at or past ``ratio`` of the quota and at least ``free_share`` of it is
    free pages (what a defragmentation gives back). Unknown use (no dbSizeInUse) is never."""
    if in_use is None or quota <= 0:
        return False
    return db_size >= ratio * quota and db_size - in_use >= free_share * db_size


def slot_of(members: list[Member], own_id: int) -> tuple[int, int]:
    """(index, count) of this member among the started members sorted by name (then ID);
    (-1, count) when it is not among them."""
    started = sorted((m for m in members if m.client_urls), key=lambda m: (m.name, m.id))
    ids = [m.id for m in started]
    return (ids.index(own_id) if own_id in ids else -1), len(ids)


def alarm_names(listing: dict[str, Any]) -> list[str]:
    """``alarm list -w json`` -> ["NOSPACE", ...] (etcdctl prints the type as its number)."""
    out = []
    for a in listing.get("alarms") or ():
        kind = a.get("alarm", 0)
        out.append(ALARM_NAMES.get(kind, str(kind)) if isinstance(kind, int) else str(kind))
    return out


class Etcdctl:
    """The member's etcdctl wrapper, one endpoint per call, each call with a deadline."""

    def __init__(self, binary: str, dial_timeout: float) -> None:
        self.binary, self.dial_timeout = binary, dial_timeout

    def run(self, endpoints: str, timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [self.binary, f"--endpoints={endpoints}", f"--dial-timeout={self.dial_timeout:g}s",
                f"--command-timeout={timeout:g}s", *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=timeout + self.dial_timeout + 10)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"no answer in {timeout:g} s")
        except OSError as exc:
            raise GuardError(f"{self.binary}: {exc.strerror}") from exc

    def json(self, endpoints: str, timeout: float, *args: str) -> Any:
        done = self.run(endpoints, timeout, *args, "-w", "json")
        try:
            parsed = json.loads(done.stdout) if done.stdout.strip() else None
        except ValueError:
            parsed = None
        if done.returncode != 0 and not parsed:
            last = (done.stderr.strip().splitlines() or [f"rc {done.returncode}"])[-1]
            raise GuardError(f"etcdctl {' '.join(args)} --endpoints={endpoints}: {last}")
        return parsed

    def statuses(self, endpoints: list[str], timeout: float) -> tuple[list[Status], str]:
        """The statuses of those that answered (etcdctl prints them and exits 1 when one did
        not), and etcdctl's last line of error ("" when all answered)."""
        done = self.run(",".join(endpoints), timeout, "endpoint", "status", "-w", "json")
        try:
            entries = json.loads(done.stdout) if done.stdout.strip() else []
        except ValueError:
            entries = []
        error = "" if done.returncode == 0 else (
            done.stderr.strip().splitlines() or [f"rc {done.returncode}"])[-1]
        return [Status.of(e) for e in entries or ()], error


def say(report: Report, text: str) -> None:
    report.lines.append(f"{report.member or report.endpoint}: {text}")


def run(opts: argparse.Namespace) -> tuple[Report, int]:
    ctl = Etcdctl(opts.etcdctl, opts.dial_timeout)
    report = Report(member=opts.name, endpoint=opts.endpoint,
                    minute=int(opts.minute if opts.minute is not None else time.time() // 60))
    own, error = ctl.statuses([opts.endpoint], opts.timeout)
    if not own:
        report.action, report.reason = "failed", f"its status could not be read: {error}"
        say(report, report.reason)
        return report, 1
    me = own[0]
    quota = me.quota or opts.quota or DEFAULT_QUOTA
    report.version, report.db_size, report.in_use, report.quota = me.version, me.db_size, me.in_use, quota
    report.line = int(opts.ratio * quota)
    report.fragmented = is_fragmented(me.db_size, me.in_use, quota, opts.ratio, opts.free_share)
    free = None if me.in_use is None else me.db_size - me.in_use
    shown = (f"file {mb(me.db_size)} ({mb(me.in_use)} in use, {mb(free)} free) of the "
             f"{mb(quota)} quota")
    raised = [e for e in me.errors if "alarm" in e.lower()]
    if not report.fragmented and not raised:
        report.reason = (
            f"{shown}: no dbSizeInUse from etcd {me.version}, the free space is unknown"
            if me.in_use is None else
            f"{shown}: below the {mb(report.line)} line, nothing to do"
            if me.db_size < report.line else
            f"{shown}: past the {mb(report.line)} line but less than {opts.free_share:.0%} of it "
            "free (data, not free pages), nothing to do")
        say(report, report.reason)
        return report, 0

    members = [Member.of(m) for m in (ctl.json(opts.endpoint, opts.timeout, "member", "list")
                                      or {}).get("members") or ()]
    by_id = {m.id: m for m in members}
    report.member = by_id[me.member_id].name if me.member_id in by_id else report.member
    report.slot, report.count = slot_of(members, me.member_id)
    if report.slot < 0:
        report.action, report.reason = "skipped", f"{shown}: not in the cluster's member list"
        say(report, report.reason)
        return report, 0
    if report.minute % report.count != report.slot:
        report.action = "waits"
        report.reason = (f"{shown}{', fragmented' if report.fragmented else ''}"
                         f"{', alarm raised' if raised else ''}: waits for its minute (slot "
                         f"{report.slot} of {report.count}, minute {report.minute} is slot "
                         f"{report.minute % report.count}'s)")
        say(report, report.reason)
        return report, 0

    rc = 0
    if report.fragmented:
        rc = defragment(ctl, opts, report, me, members, shown)
    if raised:
        rc = max(rc, alarms(ctl, opts, report, members))
    return report, rc


def defragment(ctl: Etcdctl, opts: argparse.Namespace, report: Report, me: Status,
               members: list[Member], shown: str) -> int:
    head = (f"{shown}, past the {mb(report.line)} line with at least {opts.free_share:.0%} "
            f"free (slot {report.slot} of {report.count}, minute {report.minute})")
    others = [m for m in members if m.client_urls and m.id != me.member_id]
    silent = []
    for m in others:
        done = ctl.run(m.client_urls[0], opts.probe_timeout, "get", "--consistency=s", PROBE_KEY)
        if done.returncode != 0:
            silent.append(m.name or f"{m.id:x}")
    if silent:
        report.action = "skipped"
        report.reason = (f"{head}: not defragmented, {', '.join(silent)} does not answer within "
                         f"{opts.probe_timeout:g} s (down, or defragmenting): no member to spare")
        say(report, report.reason)
        return 0
    if opts.dry_run:
        report.action, report.reason = "dry-run", f"{head}: would defragment (--dry-run)"
        say(report, report.reason)
        return 0
    if me.leader == me.member_id and others:
        # to the member whose minute came last before this one's: its file is the one most
        # recently seen to, and it is the last to need its own minute again
        order = sorted((m for m in members if m.client_urls), key=lambda m: (m.name, m.id))
        back = [order[(report.slot - k) % len(order)] for k in range(1, len(order))]
        voters = [m for m in back if not m.learner]
        if not voters:
            report.action, report.reason = "skipped", f"{head}: leads, and no voting member to hand over to"
            say(report, report.reason)
            return 0
        target = voters[0]
        done = ctl.run(opts.endpoint, opts.timeout, "move-leader", f"{target.id:x}")
        after = ctl.statuses([opts.endpoint], opts.timeout)[0]
        if done.returncode != 0 or not after or after[0].leader == me.member_id:
            last = (done.stderr.strip().splitlines() or ["it still leads"])[-1]
            report.action = "skipped"
            report.reason = f"{head}: leads, and leadership could not be handed to {target.name}: {last}"
            say(report, report.reason)
            return 0
        report.leader_moved_to = target.name
        say(report, f"leadership moved to {target.name} before defragmenting")
    started = time.monotonic()
    done = ctl.run(opts.endpoint, opts.defrag_timeout, "defrag")
    report.seconds = round(time.monotonic() - started, 2)
    after = ctl.statuses([opts.endpoint], opts.timeout)[0]
    if after:
        report.after_db_size, report.after_in_use = after[0].db_size, after[0].in_use
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"rc {done.returncode}"])[-1]
        report.action = "failed"
        report.reason = (f"{head}: defrag failed after {report.seconds:g} s (etcd may still be "
                         f"defragmenting; the next minute's guards wait for it): {last}")
        say(report, report.reason)
        return 1
    report.action = "defragmented"
    report.reason = (f"defragmented: file {report.db_size} -> {report.after_db_size} bytes "
                     f"({mb(report.db_size)} -> {mb(report.after_db_size)}, "
                     f"{mb(report.after_in_use)} in use, quota {mb(report.quota)}) in "
                     f"{report.seconds:g} s; slot {report.slot} of {report.count}, minute {report.minute}")
    say(report, report.reason)
    return 0


def alarms(ctl: Etcdctl, opts: argparse.Namespace, report: Report, members: list[Member]) -> int:
    report.alarms = alarm_names(ctl.json(opts.endpoint, opts.timeout, "alarm", "list") or {})
    if not report.alarms:
        return 0
    if any(a != "NOSPACE" for a in report.alarms):
        report.alarm_reason = (f"alarms {', '.join(report.alarms)} raised: not disarmed (only "
                               "NOSPACE is the guard's; an operator must look at the others)")
        say(report, report.alarm_reason)
        return 0
    urls = [m.client_urls[0] for m in members if m.client_urls]
    seen = ctl.statuses(urls, opts.timeout)[0]
    names = {m.id: m.name for m in members}
    over = [f"{names.get(s.member_id, s.endpoint)} {mb(s.db_size)}" for s in seen if s.db_size >= report.line]
    if len(seen) < len(urls) or over:
        missing = len(urls) - len(seen)
        report.alarm_reason = ("NOSPACE stays: " + "; ".join(
            ([f"{missing} member(s) did not answer"] if missing else [])
            + ([f"at or above the {mb(report.line)} line: {', '.join(over)}"] if over else [])))
        say(report, report.alarm_reason)
        return 0
    sizes = ", ".join(mb(s.db_size) for s in seen)
    if opts.dry_run:
        report.alarm_reason = f"would disarm NOSPACE: every file below the {mb(report.line)} line ({sizes})"
        say(report, report.alarm_reason)
        return 0
    done = ctl.run(opts.endpoint, opts.timeout, "alarm", "disarm")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"rc {done.returncode}"])[-1]
        report.alarm_reason = f"alarm disarm failed: {last}"
        say(report, report.alarm_reason)
        return 1
    report.disarmed = True
    report.alarm_reason = f"disarmed NOSPACE: every member's file is below the {mb(report.line)} line ({sizes})"
    say(report, report.alarm_reason)
    return 0


def share(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1 (excluded)")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="k0sbox-etcd-defrag-guard", description=(
        "Defragment this etcd member when its file is past RATIO of the quota and at least "
        "FREE_SHARE of it is free, in its own minute only; disarm NOSPACE when every member's "
        "file is back below the line."))
    p.add_argument("--etcdctl", default="/usr/local/bin/etcdctl",
                   help="etcdctl with this member's certificates (roles/etcd's wrapper)")
    p.add_argument("--endpoint", required=True, help="this member's client URL")
    p.add_argument("--name", default="", help="this member's name, for the log (else its URL)")
    p.add_argument("--quota", type=int, default=0,
                   help="the backend quota in bytes (etcd 3.6 reports its own; 0 = etcd's 2 GiB)")
    p.add_argument("--ratio", type=share, default=0.5, help="the line: a share of the quota")
    p.add_argument("--free-share", type=share, default=0.25,
                   help="the share of the file that must be free pages")
    p.add_argument("--timeout", type=float, default=10, help="seconds for a status or a list")
    p.add_argument("--probe-timeout", type=float, default=5,
                   help="seconds another member has to answer a read")
    p.add_argument("--defrag-timeout", type=float, default=300, help="seconds for the defrag")
    p.add_argument("--dial-timeout", type=float, default=3, help="etcdctl's --dial-timeout")
    p.add_argument("--minute", type=int, help="act as in this minute since the epoch (tests)")
    p.add_argument("--dry-run", action="store_true", help="say what it would do, do nothing")
    p.add_argument("--json", action="store_true", help="print the run's report as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    try:
        report, rc = run(opts)
    except GuardError as exc:
        report, rc = Report(member=opts.name, endpoint=opts.endpoint, action="failed",
                            reason=str(exc)), 1
        say(report, str(exc))
    if opts.json:
        print(json.dumps(asdict(report), sort_keys=True))
    else:
        print("\n".join(report.lines), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
