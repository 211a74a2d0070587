"""A command's child processes end with the command: each runs in a session of its own, and an
interrupted wait ends that session and every process it started.

Why not the terminal's Ctrl-C alone: ansible-playbook's workers each call ``setsid()``
(ansible-core's WorkerProcess._detach) and its SSH connections start with
``start_new_session``, so a signal to the CLI's process group never reaches them; when
ansible-playbook is killed, or its own SIGINT handler fails (ansible-core 2.19: "process
object is closed"), they are left running. So the run's processes are found as the kernel
knows them (``/proc``): the session started here, and every process any of them started,
whatever session it moved to; each is ended (SIGTERM, then SIGKILL after a short deadline),
and the wait polls until none is left. Daemons a playbook starts on purpose (podman's conmon,
the node containers, ssh's ControlPersist master) leave the tree when they detach, so they
stay, as after a finished run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TERM_SECONDS = 3.0   # after SIGTERM, before SIGKILL
KILL_SECONDS = 5.0   # after SIGKILL, before giving up on a process (uninterruptible sleep)
POLL = 0.05
PROC = Path("/proc")


class Interrupted(KeyboardInterrupt):
    """The command was interrupted (SIGINT, Ctrl-C, or SIGTERM) while it waited for a child;
    ``ended`` says which runs were ended and how many processes each had."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum
        self.ended: list[str] = []
        self.left: list[int] = []   # processes that survived SIGKILL (should stay empty)
        self.log: str = ""

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        what = f"ended {'; '.join(self.ended)}" if self.ended else "no playbook was running"
        left = (f"; still running after SIGKILL: {' '.join(map(str, self.left))}"
                if self.left else "")
        log = f" (log: {self.log})" if self.log else ""
        return (f"interrupted ({name}{', Ctrl-C' if self.signum == signal.SIGINT else ''}): "
                f"{what}{left}; what it had done stays done: run the command again to carry "
                f"on{log}")


def terminated(signum: int, _frame: Any) -> None:
    """A SIGTERM handler (cli.main installs it): the command ends as after Ctrl-C, its
    children with it."""
    raise Interrupted(signum)


def start(cmd: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``cmd`` in a session of its own (its process group too: not the terminal's)."""
    return subprocess.Popen(cmd, start_new_session=True, **popen)


@dataclass
class _Proc:
    pid: int
    ppid: int
    sid: int
    start: str      # start time in clock ticks since boot: tells a reused pid apart
    zombie: bool


def _table() -> dict[int, _Proc]:
    """Every process the kernel lists now (Linux' /proc/<pid>/stat)."""
    procs: dict[int, _Proc] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (PROC / entry.name / "stat").read_text()
        except OSError:
            continue   # ended meanwhile
        # pid (comm) state ppid pgrp session ... starttime (field 22); comm may hold ') '
        fields = stat.rsplit(")", 1)[1].split()
        procs[int(entry.name)] = _Proc(int(entry.name), int(fields[1]), int(fields[3]),
                                       fields[19], fields[0] == "Z")
    return procs


@dataclass
class _Run:
    """The processes of one run: its session and all they started, as found so far."""

    leader: int
    known: dict[int, str] = field(default_factory=dict)   # pid -> start time

    def alive(self) -> list[int]:
        """Find what is new (the session's, and children of what is known) and return the
        known processes still running."""
        table = _table()
        changed = True
        while changed:
            changed = False
            for p in table.values():
                if p.pid in self.known or p.zombie or p.pid == os.getpid():
                    continue
                parent = table.get(p.ppid)
                if p.sid == self.leader or (parent is not None and p.ppid in self.known
                                            and parent.start == self.known[p.ppid]):
                    self.known[p.pid] = p.start
                    changed = True
        return [pid for pid, start in self.known.items()
                if pid in table and table[pid].start == start and not table[pid].zombie]


def _signal(pids: list[int], leader: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)   # the session's process group, the way a shell would
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """A second Ctrl-C (or SIGTERM) while the run is being ended does not cut that short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def end(proc: subprocess.Popen[Any]) -> tuple[int, list[int]]:
    """End ``proc``'s session and everything it started: SIGTERM, then SIGKILL to what is
    left after TERM_SECONDS; polled until none is left. (How many processes there were,
    those still there after SIGKILL.)"""
    if not PROC.is_dir():   # no /proc (not Linux): the session's process group only
        _signal([], proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=TERM_SECONDS)
        except subprocess.TimeoutExpired:
            _signal([], proc.pid, signal.SIGKILL)
            proc.wait()
        return 1, []
    run = _Run(proc.pid)
    with _signals_held():
        alive = run.alive()
        for sig, seconds in ((signal.SIGTERM, TERM_SECONDS), (signal.SIGKILL, KILL_SECONDS)):
            deadline = time.monotonic() + seconds
            signalled: set[int] = set()
            while alive and time.monotonic() < deadline:
                new = [pid for pid in alive if pid not in signalled]
                if new:   # and what started meanwhile (a worker forking)
                    _signal(new, proc.pid, sig)
                    signalled.update(new)
                proc.poll()   # reap our own child: a zombie is gone
                time.sleep(POLL)
                alive = run.alive()
            if not alive:
                break
        proc.poll()
    return len(run.known), alive


def interrupted(exc: KeyboardInterrupt, proc: subprocess.Popen[Any], what: str) -> Interrupted:
    """``exc`` (Ctrl-C, SIGTERM) after ``proc``'s run was ended, as Interrupted, saying so."""
    count, left = end(proc)
    intr = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
    intr.ended.append(f"{what} ({count} processes)")
    intr.left += left
    return intr


def wait(proc: subprocess.Popen[Any], what: str) -> int:
    """``proc``'s exit code. When the wait ends otherwise (Ctrl-C, SIGTERM, any exception),
    its session and all it started are ended first; an interrupt comes out as Interrupted."""
    try:
        return proc.wait()
    except KeyboardInterrupt as exc:
        raise interrupted(exc, proc, what) from None
    except BaseException:
        end(proc)
        raise


def run(cmd: list[str], what: str, **popen: Any) -> int:
    """``cmd`` in a session of its own, waited for (see wait): its exit code."""
    return wait(start(cmd, **popen), what)
