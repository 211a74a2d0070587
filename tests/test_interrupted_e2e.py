"""An interrupted `up` ends every process it started (scripts/sandboxlib/sessions.py), then
`down` removes what it had made.

The real CLI on a one-member topology of its own (sandbox h37-interrupt, podman subnet
10.213.101.0/24), run in a process group of its own as a shell runs a command in the
foreground; once its nodes phase has made the podman network and ansible-playbook has a
worker (which calls setsid(), so a signal to the command's process group never reaches it:
issue 37), SIGINT goes to that process group, as Ctrl-C in a terminal sends it. Then no
process of this sandbox may be left: none whose environment names its state dir
(SANDBOX_STATE_DIR, which every child inherits) or whose command line names the state dir
or the topology file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import (
    REPO_ROOT,
    SCRIPTS,
    explain,
    podman_objects,
    podman_usable,
    run_sandbox,
)

NAME = "h37-interrupt"
SUBNET = "10.213.101.0/24"
TOPOLOGY = {
    "plugin": "sandbox_topology", "name": NAME, "tls": True,
    "networks": {"podman": SUBNET},
    "nodes": [{"name": "etcd-1", "groups": ["etcd"], "host": 11}],
    # offline, as the other whole-sandbox tests: Debian's package, no k0s download
    "vars": {"etcd_install_method": "package",
             "k0s_download_base_url": "http://127.0.0.1:9/k0s-releases"},
}
BUSY_DEADLINE = 180   # seconds for up to reach its nodes phase with a worker running


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    start: str
    cmdline: str


def sandbox_processes(state: Path, topology: Path) -> list[Proc]:
    """Every process (but this one) of the sandbox: its environment names the state dir, or
    its command line the state dir or the topology."""
    marker = f"SANDBOX_STATE_DIR={state}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        base = Path("/proc", entry.name)
        try:
            environ = (base / "environ").read_bytes().split(b"\0")
            cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
            fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue   # ended meanwhile
        if fields[0] == "Z":
            continue   # a zombie has ended; only its parent's wait is missing
        if marker in environ or str(state) in cmdline or str(topology) in cmdline:
            found.append(Proc(int(entry.name), int(fields[1]), int(fields[3]), fields[19],
                              cmdline))
    return found


def network_exists() -> bool:
    return subprocess.run(["podman", "network", "exists", f"k0sbox-{NAME}"],
                          check=False).returncode == 0


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The topology and a state dir; whatever the test leaves, `down --purge` removes."""
    if reason := podman_usable():
        pytest.skip(reason)
    path = tmp_path / f"{NAME}.yml"
    path.write_text(yaml.safe_dump(TOPOLOGY, sort_keys=False))
    state = tmp_path / "state"
    assert podman_objects(NAME) == [], f"{NAME} exists already: scripts/sandbox down it first"
    yield path, state
    if podman_objects(NAME):
        res = run_sandbox(["down", "--purge", "--topology", str(path)], state, timeout=300)
        assert res.returncode == 0, explain(res)


@pytest.mark.e2e
def test_an_interrupted_up_leaves_no_process_and_down_cleans_up(
        sandbox: tuple[Path, Path], tmp_path: Path) -> None:
    path, state = sandbox
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state))
    env.pop("SANDBOX_BACKEND", None)
    env.pop("SANDBOX_TOPOLOGY", None)
    out_path, err_path = tmp_path / "up.out", tmp_path / "up.err"
    # Ctrl-C's default in the command, as in a terminal, even when this run was started with
    # SIGINT ignored (`cmd &` in a script, nohup): an ignored signal stays ignored across
    # exec, a handled one is reset to the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with open(out_path, "w") as out, open(err_path, "w") as err:
            up = subprocess.Popen([str(SCRIPTS / "sandbox"), "up", "--topology", str(path)],
                                  cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=err, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        # Await: the nodes phase made the network, and a worker of ansible-playbook runs.
        deadline = time.monotonic() + BUSY_DEADLINE
        workers: list[Proc] = []
        while time.monotonic() < deadline and up.poll() is None:
            procs = sandbox_processes(state, path)
            players = {p.pid: p for p in procs if "ansible-playbook" in p.cmdline}
            workers = [p for p in players.values() if p.ppid in players]
            if any("nodes.yml" in w.cmdline for w in workers) and network_exists():
                break
            time.sleep(0.1)
        assert workers and up.poll() is None, (
            f"up did not reach a running playbook in {BUSY_DEADLINE}s:\n"
            f"{out_path.read_text()}\n{err_path.read_text()}")
        # Why killing the group is not enough: the workers are sessions of their own.
        assert any(w.sid == w.pid for w in workers), workers
        seen = sandbox_processes(state, path)
        os.killpg(up.pid, signal.SIGINT)   # Ctrl-C: the terminal signals the process group
        rc = up.wait(timeout=60)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert rc == 130, f"exit {rc}\n{stdout}\n{stderr}"
    assert "sandbox: interrupted (SIGINT, Ctrl-C): ended playbooks/nodes.yml (" in stderr, stderr
    assert "run the command again to carry on" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert "nodes FAILED" in stdout and "(interrupted)" in stdout, stdout
    left = sandbox_processes(state, path)
    assert left == [], "\n".join(f"{p.pid} {p.cmdline[:200]}" for p in left)
    # and each process seen just before the interrupt has ended (whatever it ran since)
    for p in seen:
        try:
            fields = Path("/proc", str(p.pid), "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue   # gone
        assert fields[19] != p.start or fields[0] == "Z", \
            f"still running ({fields[0]}): {p.pid} {p.cmdline[:200]}\n{stderr}"
    log = (state / NAME / "logs" / "up.log").read_text()
    assert "# scripts/sandbox: interrupted (SIGINT, Ctrl-C): ended playbooks/nodes.yml" in log

    made = podman_objects(NAME)
    assert f"network k0sbox-{NAME}" in made, made
    res = run_sandbox(["down", "--topology", str(path)], state, timeout=300)
    assert res.returncode == 0, explain(res)
    assert podman_objects(NAME) == []
