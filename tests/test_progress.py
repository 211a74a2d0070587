"""What a person sees while a command works (scripts/sandboxlib/progress.py): one line per
phase, a live line on a terminal, plain lines elsewhere, every task with -v."""

from __future__ import annotations

import io
import re

import pytest
from sandboxlib.progress import PlaybookView, Screen, elapsed, is_terminal, step

SITE = [
    {"ev": "playbook", "line": None, "name": "site", "phases": ["validate", "pki", "etcd"]},
    {"ev": "play", "line": "==> [1/3] validate: Validate (+0s)", "phase": "validate",
     "name": "Validate", "t": "+0s"},
    {"ev": "task_start", "line": None, "name": "Check"},
    {"ev": "task", "line": None, "name": "Check", "counts": {"skipped": 4}},
    {"ev": "play", "line": "==> [2/3] pki: PKI (+1s)", "phase": "pki", "name": "PKI", "t": "+1s"},
    {"ev": "task", "line": "      changed       pki : CA (1.0s)", "name": "pki : CA",
     "counts": {"changed": 1}},
    {"ev": "play", "line": "==> [3/3] etcd: Etcd cluster (+2s)", "phase": "etcd",
     "name": "Etcd cluster", "t": "+2s"},
    {"ev": "task", "line": "      ok      3/3   etcd : Probe (0.3s)", "name": "etcd : Probe",
     "counts": {"ok": 3}},
    {"ev": "warning", "line": None, "msg": "WARNING: etcd v3.6.14 could not be downloaded",
     "host": "etcd-1"},
    {"ev": "warning", "line": None, "msg": "WARNING: etcd v3.6.14 could not be\n downloaded",
     "host": "etcd-2"},
    {"ev": "play", "line": "==> [4/4] etcd: Etcd members (+3s)", "phase": "etcd",
     "name": "Etcd members", "t": "+3s"},
    {"ev": "task", "line": "      changed 2/3   etcd : Start (2.0s)", "name": "etcd : Start",
     "counts": {"changed": 2, "ok": 1}},
    {"ev": "stats", "line": "    site done (+5s): ok=4 changed=3 failed=0 unreachable=0",
     "totals": {}, "t": "+5s"},
]


def render(events: list[dict[str, object]], *, tty: bool, verbose: bool = False) -> str:
    out = io.StringIO()
    screen = Screen(out, tty=tty)
    view = PlaybookView(screen, verbose=verbose)
    for ev in events:
        view.handle(ev)
    view.close()
    screen.close()
    return out.getvalue()


def test_plain_output_is_a_start_and_an_end_line_per_phase() -> None:
    text = render(SITE, tty=False)
    lines = text.splitlines()
    assert lines == [
        "==> [1/3] validate: Validate (+0s)",
        "    [1/3] validate done in 0s: nothing to do here",
        "==> [2/3] pki: PKI (+1s)",
        "    [2/3] pki done in 0s: ok=0 changed=1",
        "==> [3/3] etcd: Etcd cluster (+2s)",
        "  ! WARNING: etcd v3.6.14 could not be downloaded",
        "    [3/3] etcd done in 0s: ok=4 changed=2",   # two plays of etcd.yml: one phase
    ]
    assert "\x1b" not in text and "\r" not in text


def test_terminal_output_ends_with_one_line_per_phase() -> None:
    text = render(SITE, tty=True)
    # what stays on the screen: the text after the last carriage return of each line
    shown = [ln.split("\r")[-1].replace("\x1b[K", "") for ln in text.split("\n")]
    shown = [ln for ln in shown if ln]
    assert len(shown) == 4, shown
    assert re.match(r"^  ok \[1/3\] validate\s+0s  nothing to do here$", shown[0]), shown
    assert "WARNING: etcd v3.6.14" in shown[2]
    assert re.match(r"^  ok \[3/3\] etcd\s+0s  ok=4 changed=2$", shown[3]), shown
    assert "\r\x1b[K" in text   # the live line was redrawn in place


def test_verbose_shows_every_play_and_task_line_as_ansible_ran_them() -> None:
    lines = render(SITE, tty=False, verbose=True).splitlines()
    assert lines[0] == "==> [1/3] validate: Validate (+0s)"
    assert "      changed       pki : CA (1.0s)" in lines
    assert "==> [4/4] etcd: Etcd members (+3s)" in lines
    assert lines[-1] == "    site done (+5s): ok=4 changed=3 failed=0 unreachable=0"
    assert sum("WARNING" in ln for ln in lines) == 1


def test_a_failed_phase_names_the_task_and_host() -> None:
    events = SITE[:5] + [
        {"ev": "task_start", "line": None, "name": "pki : CA"},
        {"ev": "failed", "line": None, "host": "etcd-2", "task": "pki : CA", "msg": "boom"},
        {"ev": "task", "line": None, "name": "pki : CA", "counts": {"failed": 1, "ok": 2}},
        {"ev": "stats", "line": None, "totals": {}, "t": "+2s"},
    ]
    lines = render(events, tty=False).splitlines()
    assert lines[-1] == "    [2/3] pki FAILED after 0s: ok=2 changed=0 failed=1 (pki : CA on etcd-2)"


def test_a_playbook_that_dies_mid_phase_is_not_shown_as_done() -> None:
    lines = render(SITE[:6], tty=False).splitlines()
    assert lines[-1].startswith("    [2/3] pki FAILED after"), lines


def test_step_reports_its_detail_or_its_failure() -> None:
    out = io.StringIO()
    screen = Screen(out, tty=False)
    with step(screen, "bootstrap: Python packages", "pip install") as result:
        result["detail"] = "12 packages"
    with pytest.raises(RuntimeError), step(screen, "build", "go build"):
        raise RuntimeError("no mirror")
    assert out.getvalue().splitlines() == [
        "==> bootstrap: Python packages",
        "    bootstrap: Python packages done in 0s: 12 packages",
        "==> build",
        "    build FAILED after 0s: failed",
    ]


def test_a_phase_cut_short_says_why() -> None:
    """A playbook that ends inside a phase: the CLI says why (the run was interrupted)."""
    for why, shown in (("interrupted", "(interrupted)"),
                       ("the playbook ended", "(the playbook ended)")):
        out = io.StringIO()
        screen = Screen(out, tty=False)
        view = PlaybookView(screen)
        for ev in SITE[:2]:   # the playbook, its first phase started
            view.handle(ev)
        view.close(*([why] if why != "the playbook ended" else []))
        screen.close()
        assert out.getvalue().splitlines()[-1].endswith(f"failed=1 {shown}"), out.getvalue()


def test_live_line_fits_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    screen = Screen(out, tty=True)
    screen.start("[3/8] etcd", "etcd : " + "a very long task name " * 5)
    screen.close()
    drawn = out.getvalue().split("\r")[0]
    assert 0 < len(drawn) <= 39, drawn


def test_pipes_and_dumb_terminals_get_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeTty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    assert is_terminal(FakeTty())
    assert not is_terminal(io.StringIO())
    monkeypatch.setenv("TERM", "dumb")
    assert not is_terminal(FakeTty())


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (61, "1m01s"),
                                               (600, "10m00s")])
def test_elapsed(seconds: float, text: str) -> None:
    assert elapsed(seconds) == text
