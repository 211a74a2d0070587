"""scripts/sandboxlib/sessions.py on real processes shaped as ansible-playbook's: a leader in
a session of its own, a worker that calls setsid() (ansible-core's WorkerProcess._detach)
with a child in yet another session (ssh: start_new_session), and a child that ignores
SIGTERM. A SIGINT to this process while it waits ends them all; the whole CLI path is
tests/test_interrupted_e2e.py's."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from sandboxlib import sessions

TREE = r'''
import os, signal, subprocess, sys, time
out = sys.argv[1]
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').close(); time.sleep(600)", out + ".ready"])
worker = os.fork()
if worker == 0:   # a worker: a session of its own, and its ssh in another one
    os.setsid()
    ssh = subprocess.Popen(sleeper, start_new_session=True)
    with open(out + ".worker", "w") as fh:
        fh.write(f"{os.getpid()} {ssh.pid}")
    time.sleep(600)
    os._exit(0)
while not (os.path.exists(out + ".ready") and os.path.exists(out + ".worker")):
    time.sleep(0.01)
with open(out + ".worker") as fh:
    pids = [os.getpid(), stubborn.pid, *map(int, fh.read().split())]
with open(out, "w") as fh:
    fh.write(" ".join(map(str, pids)))
os.kill(os.getppid(), signal.SIGINT)   # Ctrl-C, once the tree is up
time.sleep(600)
'''


def running(pid: int) -> bool:
    try:
        state = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux' /proc")
def test_an_interrupted_wait_ends_the_session_and_all_it_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    monkeypatch.setattr(sessions, "TERM_SECONDS", 0.5)   # the stubborn child: SIGKILL sooner
    # Python's own Ctrl-C handler, as in a terminal: a run started in the background by a
    # shell without job control (`cmd &` in a script, nohup) inherits SIGINT ignored, and the
    # tree's Ctrl-C would then never arrive.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    script, pids_file = tmp_path / "tree.py", tmp_path / "pids"
    script.write_text(TREE)
    with pytest.raises(sessions.Interrupted) as info:
        sessions.run([sys.executable, str(script), str(pids_file)], "the tree")
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 4
    assert [p for p in pids if running(p)] == []
    exc = info.value
    assert exc.signum == signal.SIGINT and exc.left == []
    assert len(exc.ended) == 1 and exc.ended[0].startswith("the tree ("), exc.ended
    assert int(exc.ended[0].split("(")[1].split()[0]) >= 4, exc.ended
    assert str(exc).startswith("interrupted (SIGINT, Ctrl-C): ended the tree ("), str(exc)


def test_a_finished_run_gives_its_exit_code() -> None:
    own_session = "import os, sys; sys.exit(0 if os.getsid(0) == os.getpid() else 3)"
    assert sessions.run([sys.executable, "-c", own_session], "x") == 0
    assert sessions.run([sys.executable, "-c", "raise SystemExit(7)"], "x") == 7


def test_sigterm_reads_as_an_interrupt() -> None:
    with pytest.raises(sessions.Interrupted) as info:
        sessions.terminated(signal.SIGTERM, None)
    assert str(info.value).startswith("interrupted (SIGTERM): no playbook was running;")
