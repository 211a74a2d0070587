"""What a person sees while a command works: one line per step or phase.

On a terminal each step has a live line (a spinner, its elapsed time and what it is doing
now) that becomes one line when it ends: ``  ✓ [3/7] etcd  21s  ok=42 changed=12``. Not on a
terminal (CI, pipes, ``TERM=dumb``): plain lines without control characters, one when a
step starts (``==> ...``) and one when it ends. ``-v`` shows every Ansible task as well.
Standard library only: the bootstrap uses it before the virtualenv exists.

The Ansible side is scripts/ansible_plugins/callback/sandbox_progress.py: it sends one JSON event per line
(playbook, play, task start and end, warning, failure, stats) that :class:`PlaybookView`
turns into phases (consecutive plays from the same playbook file: nodes, validate, pki,
etcd, lb, k0s, apiserver, verify).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

VERBOSE = False   # set by the CLI's -v: every task line too


def is_terminal(out: TextIO) -> bool:
    """A terminal that can take a redrawn line (not a pipe, a file or TERM=dumb)."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") not in ("", "dumb")


def elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


class Screen:
    """Lines for a person: permanent ones, and on a terminal one live line redrawn in place."""

    def __init__(self, out: TextIO | None = None, tty: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = is_terminal(self.out) if tty is None else tty
        enc = (getattr(self.out, "encoding", "") or "").lower()
        fancy = self.tty and "utf" in enc
        self.frames = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" if fancy else "|/-\\"
        self.ok_mark, self.fail_mark = ("✓", "✗") if fancy else ("ok", "!!")
        self._lock = threading.RLock()
        self._live: list[Any] | None = None   # [label, t0, note]
        self._tick = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- permanent lines -----------------------------------------------------------------
    def line(self, text: str) -> None:
        with self._lock:
            self._clear()
            self.out.write(text + "\n")
            self._draw()
            self.out.flush()

    # -- the live line -------------------------------------------------------------------
    def start(self, label: str, note: str = "", plain: str | None = None) -> None:
        """A step begins: the live line on a terminal, else ``plain`` (or ``==> label``)."""
        with self._lock:
            if not self.tty:
                self.out.write((plain if plain is not None else f"==> {label}") + "\n")
                self.out.flush()
                return
            self._clear()
            self._live = [label, time.monotonic(), note]
            self._draw()
            self.out.flush()
            if self._ticker is None:
                self._ticker = threading.Thread(target=self._run, daemon=True)
                self._ticker.start()

    def note(self, note: str) -> None:
        """What the running step does now (shown on the live line only)."""
        with self._lock:
            if self._live is not None:
                self._live[2] = note

    def end(self, label: str, took: float, detail: str, ok: bool = True) -> None:
        """The step's one line: ``  ✓ label  21s  detail`` (plain: ``    label done in...``)."""
        with self._lock:
            self._clear()
            self._live = None
            if self.tty:
                mark = self.ok_mark if ok else self.fail_mark
                text = f"  {mark} {label:<26} {elapsed(took):>6}  {detail}".rstrip()
            else:
                word = "done in" if ok else "FAILED after"
                text = f"    {label} {word} {elapsed(took)}" + (f": {detail}" if detail else "")
            self.out.write(text + "\n")
            self.out.flush()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._clear()
            self._live = None
            self.out.flush()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                if self._live is not None:
                    self._tick += 1
                    self._clear()
                    self._draw()
                    self.out.flush()

    def _clear(self) -> None:
        if self.tty and self._live is not None:
            self.out.write("\r\x1b[K")

    def _draw(self) -> None:
        if not self.tty or self._live is None:
            return
        label, t0, note = self._live
        frame = self.frames[self._tick % len(self.frames)]
        text = f"  {frame} {label:<26} {elapsed(time.monotonic() - t0):>6}  {note}"
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self.out.write(text[:width].rstrip())


@contextlib.contextmanager
def step(screen: Screen, label: str, note: str = "") -> Iterator[dict[str, str]]:
    """A step that is not Ansible's (bootstrap, the API server build): its live line, then
    one line; the caller puts the detail for that line in the yielded dict's "detail"."""
    t0 = time.monotonic()
    result = {"detail": ""}
    screen.start(label, note)
    try:
        yield result
    except BaseException:
        screen.end(label, time.monotonic() - t0, result["detail"] or "failed", ok=False)
        raise
    screen.end(label, time.monotonic() - t0, result["detail"])


class PlaybookView:
    """Ansible's events (scripts/ansible_plugins/callback/sandbox_progress.py) as phases on a Screen."""

    def __init__(self, screen: Screen, verbose: bool | None = None) -> None:
        self.screen = screen
        self.verbose = VERBOSE if verbose is None else verbose
        self.phases: list[str] = []
        self.phase = ""
        self.index = 0
        self.t0 = 0.0
        self.counts: dict[str, int] = {}
        self.failure: dict[str, str] | None = None
        self.warned: set[str] = set()

    def handle(self, ev: dict[str, Any]) -> None:
        kind = ev.get("ev")
        if kind == "warning":
            msg = " ".join(str(ev.get("msg", "")).split())
            if msg not in self.warned:
                self.warned.add(msg)
                self.screen.line(f"  ! {msg}")
            return
        if self.verbose:
            if ev.get("line"):
                self.screen.line(str(ev["line"]))
            return
        if kind == "playbook":
            self.phases = [str(p) for p in ev.get("phases") or []]
        elif kind == "play":
            if ev.get("phase") != self.phase or not self.t0:
                self._end_phase()
                self._start_phase(str(ev.get("phase", "play")), str(ev.get("name", "")),
                                  str(ev.get("t", "")))
        elif kind == "task_start":
            self.screen.note(str(ev.get("name", "")))
        elif kind == "task":
            for key, n in (ev.get("counts") or {}).items():
                self.counts[key] = self.counts.get(key, 0) + int(n)
        elif kind == "failed" and self.failure is None:
            self.failure = {k: str(ev.get(k, "")) for k in ("host", "task", "msg")}
        elif kind == "stats":
            self._end_phase()

    def _label(self) -> str:
        total = len(self.phases) or "?"
        return f"[{self.index}/{total}] {self.phase}"

    def _start_phase(self, phase: str, play: str, at: str) -> None:
        self.phase = phase
        self.index = (self.phases.index(phase) + 1 if phase in self.phases
                      else self.index + 1)
        self.t0 = time.monotonic()
        self.counts = {}
        self.failure = None
        self.screen.start(self._label(), play, plain=f"==> {self._label()}: {play} ({at})")

    def _end_phase(self) -> None:
        if not self.t0:
            return
        c = self.counts
        bad = c.get("failed", 0) + c.get("unreachable", 0)
        ran = c.get("ok", 0) + c.get("changed", 0) + bad
        detail = (f"ok={c.get('ok', 0)} changed={c.get('changed', 0)}" if ran
                  else "nothing to do here")
        if bad:
            f = self.failure or {}
            where = f" on {f['host']}" if f.get("host") else ""
            detail += f" failed={bad}" + (f" ({f.get('task')}{where})" if f else "")
        self.screen.end(self._label(), time.monotonic() - self.t0, detail, ok=not bad)
        self.t0 = 0.0

    def close(self, why: str = "the playbook ended") -> None:
        """The stream ended (the playbook finished, died or was ended: ``why``): close a phase
        left open."""
        if self.t0:
            self.failure = self.failure or {"task": why}
            self.counts["failed"] = self.counts.get("failed", 0) + 1
            self._end_phase()
