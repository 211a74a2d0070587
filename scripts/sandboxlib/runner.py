"""Run ansible-playbook (podman backend) or Vagrant with concise progress and a full log.

ansible's own output goes to a log file under ``<state dir>/logs/``; the project's callback
plugin (``scripts/ansible_plugins/callback/sandbox_progress.py``) sends progress events to a FIFO that a
thread here turns into one line per phase (progress.PlaybookView; every task with ``-v``),
and writes a JSON result with the failed tasks from which the CLI makes its one-line reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from . import record, sessions
from .progress import PlaybookView, Screen
from .topology import CLUSTER_ENV, REPO_ROOT, Topology

CALLBACK = "sandbox_progress"
_EOF = "\x04sandbox-progress-end"


class CommandFailed(RuntimeError):
    """A playbook or Vagrant failed; the message is the one-line reason (with the log)."""


@dataclass
class RunContext:
    """One CLI command's run: the log file and the progress channel shared by its steps."""

    log_path: Path
    progress_file: Path
    t0: float
    screen: Screen

    def env(self, backend: str, result_file: Path | None = None) -> dict[str, str]:
        # Never the k0s test double's permission: only the Molecule scenarios grant it.
        env = {k: v for k, v in os.environ.items() if k != "K0S_TEST_DOUBLE_ALLOWED"}
        plugins = str(REPO_ROOT / "scripts" / "ansible_plugins" / "callback")
        enabled = [c for c in env.get("ANSIBLE_CALLBACKS_ENABLED", "").split(",") if c]
        env.update(
            ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"),
            ANSIBLE_CALLBACK_PLUGINS=os.pathsep.join(
                p for p in (plugins, env.get("ANSIBLE_CALLBACK_PLUGINS", "")) if p),
            ANSIBLE_CALLBACKS_ENABLED=",".join(dict.fromkeys([*enabled, CALLBACK])),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            PYTHONUNBUFFERED="1",
            SANDBOX_BACKEND=backend,
            SANDBOX_PROGRESS_FILE=str(self.progress_file),
            SANDBOX_PROGRESS_T0=str(self.t0),
        )
        if result_file is not None:
            env["SANDBOX_RESULT_FILE"] = str(result_file)
        env.pop(CLUSTER_ENV, None)   # a run's view is its topology's (cluster_env), never the shell's
        if env.get("SANDBOX_PROFILE") == "1":  # every task's time in the log (bench.slowest)
            env["ANSIBLE_CALLBACKS_ENABLED"] += ",ansible.posix.profile_tasks"
            env.setdefault("PROFILE_TASKS_TASK_OUTPUT_LIMIT", "all")
        return env


def _read_events(fifo: Path, view: PlaybookView) -> None:
    """The callback's JSON events from the FIFO to the view, until the end marker."""
    # O_RDWR: opening never blocks and we never see EOF while no writer is attached.
    fd = os.open(fifo, os.O_RDWR)
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line == _EOF:
                return
            try:
                ev = json.loads(line)
            except ValueError:
                ev = {"ev": "text", "line": line}
            if isinstance(ev, dict):
                view.handle(ev)


# Commands whose playbooks only read the sandbox: they keep up's record of the last converge.
READ_ONLY = ("verify", "status")


@contextlib.contextmanager
def run_context(topo: Topology, command: str, out: TextIO | None = None) -> Iterator[RunContext]:
    """A log file for ``command`` and a FIFO whose events are shown on ``out`` (stdout)."""
    if command not in READ_ONLY:
        record.forget(topo)   # it may change the sandbox: the next `up` converges
    logs = topo.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = logs / f"{command}-{stamp}.log"
    log_path.write_text(f"# scripts/sandbox {command} (topology {topo.name})\n")
    latest = logs / f"{command}.log"  # the latest run
    with contextlib.suppress(OSError):
        latest.unlink(missing_ok=True)
        latest.symlink_to(log_path.name)
    screen = Screen(out or sys.stdout)
    view = PlaybookView(screen)
    with tempfile.TemporaryDirectory(prefix="sandbox-progress-") as tmp:
        fifo = Path(tmp) / "progress"
        os.mkfifo(fifo, 0o600)
        reader = threading.Thread(target=_read_events, args=(fifo, view), daemon=True)
        reader.start()
        ended = "the playbook ended"
        try:
            yield RunContext(log_path=log_path, progress_file=fifo, t0=time.time(),
                             screen=screen)
        except sessions.Interrupted as exc:   # the message names the log, the log says it
            ended, exc.log = "interrupted", str(log_path)
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"\n# scripts/sandbox: {exc}\n")
            raise
        finally:
            with open(fifo, "w", encoding="utf-8") as fh:
                fh.write(_EOF + "\n")
            reader.join(timeout=10)
            view.close(ended)
            screen.close()


def ansible_playbook_bin() -> str:
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.exists():
        return str(beside)
    found = shutil.which("ansible-playbook")
    if not found:
        raise CommandFailed("ansible-playbook not found: run scripts/sandbox through its "
                            "bootstrap (it installs requirements.txt into .venv)")
    return found


# ansible-playbook's exit code after SIGINT ("User interrupted execution"); a negative code is
# a process killed by that signal; a SIGINT at some moments ends it with 250 ("Unexpected
# Exception": its own SIGINT handler failing, seen with ansible-core 2.19) and the handler or
# KeyboardInterrupt in the log's last lines. Not a failed task: an earlier error the run
# ignored is no reason.
INTERRUPTED = (99, -signal.SIGINT)
INTERRUPTED_SIGNS = ("User interrupted execution", "KeyboardInterrupt", "in _signal_handler")


def _interrupted(rc: int, log_path: Path) -> bool:
    if rc in INTERRUPTED:
        return True
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return False
    return any(sign in tail for sign in INTERRUPTED_SIGNS)


def _reason(result_file: Path, what: str, rc: int, log_path: Path) -> str:
    if _interrupted(rc, log_path):
        return (f"{what} was interrupted (SIGINT, Ctrl-C) before it finished; what it had done "
                f"stays done: run the command again to carry on (log: {log_path})")
    try:
        data: dict[str, Any] = json.loads(result_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    failures = data.get("failures") or []
    if failures:
        first = failures[0]
        hosts = sorted({f["host"] for f in failures})
        more = f" (and {len(hosts) - 1} more host(s))" if len(hosts) > 1 else ""
        return (f"{what}: task '{first['task']}' failed on {first['host']}{more}: "
                f"{first['msg']} (log: {log_path})")
    return f"{what} failed with exit code {rc}{_log_error(log_path)} (log: {log_path})"


def _log_error(log_path: Path) -> str:
    """The first ``[ERROR]:``/``ERROR!`` message in the log (one line), else its last line."""
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for i, line in enumerate(lines):
        if line.startswith(("[ERROR]:", "ERROR!")):
            msg = line.split(":", 1)[1] if line.startswith("[ERROR]") else line[6:]
            for nxt in lines[i + 1:i + 3]:
                if nxt.startswith(("Origin:", "Traceback", "<<<", "[")):
                    break
                msg += " " + nxt
            return ": " + " ".join(msg.split())[:300]
    return ": " + " ".join(lines[-1].split())[:300] if lines else ""


def _command(topo: Topology, playbook: str, extra_vars: dict[str, Any] | None,
             limit: str = "") -> list[str]:
    path = REPO_ROOT / "playbooks" / playbook
    if not path.is_file():
        raise CommandFailed(f"playbooks/{playbook} does not exist yet")
    if topo.multi_cluster and not topo.cluster and playbook not in WHOLE_TOPOLOGY_PLAYBOOKS:
        # Its groups would be empty (inventory.build): every play would match no host.
        raise CommandFailed(f"topology '{topo.name}' has several etcd clusters "
                            f"({', '.join(topo.clusters)}): name one with --cluster")
    cmd = [ansible_playbook_bin(), "-i", str(topo.path), str(path)]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    if limit:
        cmd += ["--limit", limit]
    return cmd


def _result_file() -> Path:
    with tempfile.NamedTemporaryFile(prefix="sandbox-result-", suffix=".json",
                                     delete=False) as tmp:
        return Path(tmp.name)


# What runs on a whole topology of several etcd clusters (the nodes); every other playbook
# on one cluster's view.
WHOLE_TOPOLOGY_PLAYBOOKS = frozenset({"nodes.yml"})


def cluster_env(topo: Topology) -> dict[str, str]:
    """SANDBOX_CLUSTER for the inventory plugin when ``topo`` is one etcd cluster's view of a
    topology with several (Topology.view)."""
    return {CLUSTER_ENV: topo.cluster} if topo.cluster else {}


def run_playbook(ctx: RunContext, topo: Topology, backend: str, playbook: str,
                 extra_vars: dict[str, Any] | None = None, limit: str = "") -> None:
    """ansible-playbook -i <topology> playbooks/<playbook> [--limit limit]; raises
    CommandFailed."""
    cmd = _command(topo, playbook, extra_vars, limit)
    result_file = _result_file()
    try:
        with open(ctx.log_path, "a", encoding="utf-8") as log:
            view = f"{CLUSTER_ENV}={topo.cluster} " if topo.cluster else ""
            log.write(f"\n$ {view}{' '.join(cmd)}\n")
            log.flush()
            rc = sessions.run(cmd, f"playbooks/{playbook}", cwd=REPO_ROOT,
                              env={**ctx.env(backend, result_file), **cluster_env(topo)},
                              stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT)
        if rc != 0:
            raise CommandFailed(_reason(result_file, f"playbooks/{playbook}", rc,
                                        ctx.log_path))
    finally:
        result_file.unlink(missing_ok=True)


@contextlib.contextmanager
def beside(ctx: RunContext, topo: Topology, backend: str, playbook: str,
           extra_vars: dict[str, Any], what: str) -> Iterator[None]:
    """playbooks/<playbook> in the background while the ``with`` block runs (work on the
    control node alone, e.g. the PKI while the nodes boot): its output goes to a log of its
    own, appended to the run's log when it ends; no progress lines. Waited for when the block
    ends, even a failed one; raises CommandFailed when it failed."""
    cmd = _command(topo, playbook, extra_vars)
    result_file = _result_file()
    log_path = ctx.log_path.with_suffix(f".{Path(playbook).stem}.log")
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(cmd)}   # {what}, beside the next step\n")
        log.flush()
        env = {**ctx.env(backend, result_file), "SANDBOX_PROGRESS_FILE": os.devnull,
               **cluster_env(topo)}
        proc = sessions.start(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT)
    label = f"playbooks/{playbook} ({what})"
    try:
        try:
            yield
        except KeyboardInterrupt as exc:   # Ctrl-C or SIGTERM: this run ends with the step
            raise sessions.interrupted(exc, proc, label) from None
        finally:
            rc = sessions.wait(proc, label)
            with open(ctx.log_path, "a", encoding="utf-8") as out:
                out.write(log_path.read_text(encoding="utf-8", errors="replace"))
            log_path.unlink(missing_ok=True)
        if rc != 0:
            raise CommandFailed(_reason(result_file, label, rc, ctx.log_path))
        ctx.screen.end(what, time.time() - t0, "beside the nodes")
    finally:
        result_file.unlink(missing_ok=True)


class InvalidInput(CommandFailed):
    """playbooks/validate.yml refused the input: one line, nothing was changed."""


def validate(topo: Topology, backend: str, extra_vars: dict[str, Any]) -> None:
    """playbooks/validate.yml (every check made from the inventory alone) before any node,
    network or state file exists; its log goes to a temporary file, so a refused run leaves
    nothing behind. Raises InvalidInput with the failed check's message."""
    with tempfile.TemporaryDirectory(prefix="sandbox-validate-") as tmp:
        ctx = RunContext(log_path=Path(tmp) / "validate.log", progress_file=Path(os.devnull),
                         t0=time.time(), screen=Screen(io.StringIO()))
        try:
            run_playbook(ctx, topo, backend, "validate.yml", extra_vars)
        except CommandFailed as exc:
            msg = str(exc).removesuffix(f" (log: {ctx.log_path})")
            raise InvalidInput(f"{msg}; nothing was changed") from None


def vagrant_run(ctx: RunContext, topo: Topology, action: str) -> None:
    """Through python-vagrant, with SANDBOX_TOPOLOGY set: ``vagrant up --no-provision``
    (action ``up``: create and boot the VMs), ``vagrant provision`` (``provision``: the
    Vagrantfile's provisioners, site.yml among them) or ``vagrant destroy -f``
    (``destroy``); raises CommandFailed."""
    import vagrant  # python-vagrant; imported here so the podman path does not need it

    with tempfile.NamedTemporaryFile(prefix="sandbox-result-", suffix=".json",
                                     delete=False) as tmp:
        result_file = Path(tmp.name)
    env = ctx.env("vagrant", result_file)
    env["SANDBOX_TOPOLOGY"] = str(topo.path)
    log_fh = open(ctx.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below

    @contextlib.contextmanager
    def log_cm() -> Iterator[TextIO]:
        yield log_fh

    v = vagrant.Vagrant(root=str(REPO_ROOT), env=env, out_cm=log_cm, err_cm=log_cm)
    try:
        log_fh.write(f"\n$ vagrant {action} (SANDBOX_TOPOLOGY={topo.path})\n")
        log_fh.flush()
        if action == "up":
            v.up(provision=False)
        elif action == "provision":
            v.provision()
        else:
            v.destroy()
    except subprocess.CalledProcessError as exc:
        log_fh.flush()
        raise CommandFailed(_reason(result_file, f"vagrant {action}", exc.returncode,
                                    ctx.log_path)) from None
    finally:
        log_fh.close()
        result_file.unlink(missing_ok=True)


def vagrant_up(ctx: RunContext, topo: Topology, extra: dict[str, Any]) -> None:
    """The VMs (``vagrant up --no-provision``), then the Vagrantfile's provisioners
    (``vagrant provision``: site.yml once for all VMs, or once per etcd cluster's view, with
    ``extra`` as its variables)."""
    os.environ["SANDBOX_EXTRA_VARS"] = json.dumps(extra)
    box = os.environ.get("SANDBOX_BOX") or topo.vagrant.get("box") or "debian/bookworm64"
    provider = os.environ.get("VAGRANT_DEFAULT_PROVIDER") or "Vagrant's default provider"
    t0 = time.time()
    label = f"vms: {len(topo.nodes)} VMs from box {box}"
    ctx.screen.start(label, f"vagrant up --no-provision ({provider})")
    try:
        vagrant_run(ctx, topo, "up")
    except CommandFailed:
        ctx.screen.end(label, time.time() - t0, "vagrant up failed", ok=False)
        raise
    ctx.screen.end(label, time.time() - t0, "booted")
    per = (f"once per etcd cluster: {', '.join(topo.clusters)}" if topo.multi_cluster
           else "on all VMs")
    ctx.screen.line(f"==> provision: vagrant provision (playbooks/site.yml {per})")
    vagrant_run(ctx, topo, "provision")
