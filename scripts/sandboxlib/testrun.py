"""``scripts/test``: every check the project has, collecting failures.

Serial first: yamllint -> ruff -> mypy -> build-etcd and build-apiserver (cached, both started
in the background at once) -> build-image (the node image every podman test uses, built once before
anything runs beside anything else). Then the heavy stages -- ansible-lint (production
profile), pytest, the Vagrant end-to-end test and every Molecule scenario -- run ``--jobs`` at
a time (default 2), longest first. Each scenario and test has its own sandbox
name, podman network and state directory, so they do not meet; a parallel stage's output is
kept and printed whole when it ends. Exits non-zero when any stage failed.

Why parallel on a 2-core host: a scenario keeps the CPU about 75 % busy (container start,
systemd boot, etcd elections and ``until`` waits leave the rest idle); two at a time fill
those gaps (measured in docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .topology import REPO_ROOT

BUILD_STAGE = "build-apiserver"
ETCD_BUILD_STAGE = "build-etcd"
# Started in the background with the first stage; their stages wait for them.
EARLY_STAGES = (ETCD_BUILD_STAGE, BUILD_STAGE)
ANSIBLE_LINT = "ansible-lint"
SANITY = "ansible-test sanity"
VAGRANT_E2E = "tests/test_vagrant_e2e.py"
COLLECTION_E2E = "tests/test_collection_e2e.py"
ATTACK_E2E = "tests/test_attack_e2e.py"
CLI_E2E = "tests/test_cli_e2e.py"

LINT_STAGES: list[tuple[str, list[str]]] = [
    ("yamllint", ["yamllint", "."]),
    (ANSIBLE_LINT, ["ansible-lint", "--profile", "production"]),
    ("ruff", ["ruff", "check", "scripts", "plugins", "tests", "molecule", "scripts/sandbox",
              "scripts/test"]),
    ("mypy", ["mypy", "scripts/sandboxlib"]),
    # The collection: `ansible-galaxy collection build`, then ansible-test sanity on the
    # tarball installed (scripts/collection; its test environments cached).
    (SANITY, ["scripts/collection", "sanity"]),
    # Kubernetes' CRD API server and kubectl (the stand-in where k0s cannot run): built once
    # from Debian's packages, then reused from the cache by pytest and every scenario. It
    # starts in the background with the first stage (its download overlaps the linters);
    # this stage waits for it.
    # The etcd the sandbox installs: Debian's 3.5.30 with the project's patches
    # (scripts/etcd-patches/, each with its Go test), built once, cached like the API server,
    # started in the background at once too.
    (ETCD_BUILD_STAGE, ["scripts/build-etcd"]),
    (BUILD_STAGE, ["scripts/build-apiserver"]),
    # The node image, before podman stages run side by side (two would build it twice).
    ("build-image", ["scripts/build-image"]),
]

# The test files that are stages of their own (below), left out of the two pytest stages.
OWN_STAGES = [f"--ignore={f}" for f in (VAGRANT_E2E, COLLECTION_E2E, ATTACK_E2E, CLI_E2E)]

PYTEST_STAGES: list[tuple[str, list[str]]] = [
    ("pytest", ["pytest", "tests", "-m", "not e2e", *OWN_STAGES, "--durations=10"]),
    # The other whole-sandbox tests (a shipped topology as README types it, an interrupted
    # `up`): a stage of their own, so that no stage passes 8 minutes (issue 38).
    ("pytest e2e", ["pytest", "tests", "-m", "e2e", *OWN_STAGES, "--durations=5"]),
    # The CLI end to end on one sandbox (the documents' lines, drift, day-2, power loss): a
    # stage of its own, so that the pool runs it beside the rest of pytest, not after it.
    ("pytest cli-e2e", ["pytest", CLI_E2E, "--durations=5"]),
    ("pytest vagrant-e2e", ["pytest", VAGRANT_E2E]),
    ("pytest collection-e2e", ["pytest", COLLECTION_E2E]),
    # A hostile tenant on a whole sandbox (docs/security.md): a stage of its own, so that it
    # runs beside the longest stages instead of after them.
    ("pytest attack-e2e", ["pytest", ATTACK_E2E]),
]

# --quick's pytest: every test that makes no podman node (no e2e mark), on two workers.
QUICK_PYTEST = ("pytest", ["pytest", "tests", "-m", "not e2e", f"--ignore={VAGRANT_E2E}",
                           "-n", "2", "--durations=10"])

# Seconds each heavy stage took in a clean-clone run of .ci/run with two at a time (b800c1f,
# 2026-12-06, docs/performance.md; pytest then held what "pytest e2e" runs now): the pool
# starts the longest first so that the two lanes end close together. Unknown stages count 300.
EXPECTED_SECONDS: dict[str, int] = {
    "pytest": 440, "pytest e2e": 145, "molecule crd_apiserver": 485, "pytest cli-e2e": 425,
    "molecule k0s_controller": 415, "pytest vagrant-e2e": 390,
    "molecule etcd_rbac_rotation": 350, "molecule k0s_tenants": 315,
    "molecule etcd_grow_takeover": 295, "molecule etcd_backup_restore": 230,
    # etcd: 317 s alone on 2026-12-07 with the fragmentation guard's part (about 135 s: three
    # members' minutes to wait for), 215 s before; the per-client limits add about 23 s.
    # attack-e2e: issue 55 added the flood (45 s and its start), status, two verifies and a
    # defrag: 237 s alone on 2026-12-07 (up included, the node image built before)
    "molecule etcd": 355, "ansible-lint": 130, "pytest attack-e2e": 240,
    # the two-cluster move (issue 40): 608 s in the clean-clone run of f00fdea, whose host
    # took 1.2-1.9x the other stages' times above; 351 s alone
    "molecule tenant_migrate": 430,
    "molecule k0s_tenants_plain": 105, "pytest collection-e2e": 105, "molecule pki": 70,
    "molecule etcd_release": 70, "molecule lb": 55,
    # 15-20 s with its test environments cached, 2-15 min on a host that has none: counted
    # at 2 min, so it does not start last
    "ansible-test sanity": 120,
}


# Lines of a stage's output that say why it failed: Ansible's failed tasks and Molecule's
# verdict, pytest's failures. The last WHY_LINES of them are repeated after the summary (CI
# shows the end of the output; a failed stage's own output may be far above it).
WHY_MARKERS = ("fatal: [", "failed: [", "FAILED!", "CRITICAL ", "FAILED tests/", "ERROR tests/",
               "AssertionError", "Error: ")
WHY_LINES = 12
WHY_WIDTH = 600


def why_failed(text: str) -> list[str]:
    """The lines of ``text`` that say why it failed (an Ansible failure with its task, an
    ignored one left out), the last WHY_LINES of them, each cut to WHY_WIDTH characters."""
    lines = text.splitlines()
    found: list[str] = []
    task = ""
    for i, line in enumerate(lines):
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.rstrip(" *")
            continue
        if not any(m in line for m in WHY_MARKERS):
            continue
        if i + 1 < len(lines) and lines[i + 1].strip() == "...ignoring":
            continue
        if line.startswith(("fatal: [", "failed: [")) and task:
            found.append(task)
            task = ""
        found.append(line if len(line) <= WHY_WIDTH else line[:WHY_WIDTH] + " [...]")
    return found[-WHY_LINES:]


class Background:
    """A stage's command started early in the background; its stage waits for it."""

    def __init__(self, cmd: list[str]) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed in wait()
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)

    def wait(self) -> tuple[int, str]:
        rc = self.proc.wait()
        self.log.seek(0)
        text = self.log.read()
        sys.stdout.write(text)
        self.log.close()
        return rc, text


@dataclass
class Outcome:
    name: str
    ok: bool
    seconds: float
    detail: str = ""
    why: list[str] = field(default_factory=list)


def _ended(name: str, rc: int, seconds: float, text: str = "") -> Outcome:
    print(_result_line(name, rc, seconds), flush=True)
    return Outcome(name, rc == 0, seconds, "" if rc == 0 else f"exit {rc}",
                   [] if rc == 0 else why_failed(text))


def _streamed(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` with its output streamed as it comes, and kept."""
    kept: list[str] = []
    with subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            kept.append(line)
    return proc.returncode, "".join(kept)


def _cannot_start(cmd: list[str]) -> str:
    """Why a stage must not start ('' when it may)."""
    return "not a git checkout" if cmd[0] == "molecule" and not is_git_checkout() else ""


@dataclass
class Running:
    """A heavy stage running in the pool, its output kept in a temporary file."""

    name: str
    proc: subprocess.Popen[str]
    log: IO[str]
    t0: float = field(default_factory=time.time)


def scenarios() -> list[str]:
    return sorted(p.parent.name for p in (REPO_ROOT / "molecule").glob("*/molecule.yml"))


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def is_git_checkout() -> bool:
    res = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=False)
    return res.returncode == 0 and Path(res.stdout.strip()).resolve() == REPO_ROOT.resolve()


def _result_line(name: str, rc: int, seconds: float) -> str:
    status = "passed" if rc == 0 else f"FAILED (exit {rc})"
    return f"=== {name}: {status} in {seconds:.0f}s"


def run_stage(index: int, total: int, name: str, cmd: list[str],
              started: Background | None = None) -> Outcome:
    """One stage in the foreground, its output streamed."""
    print(f"\n=== [{index}/{total}] {name}: {' '.join(cmd)}", flush=True)
    if why := _cannot_start(cmd):
        return Outcome(name, False, 0.0, why)
    t0 = time.time()
    if started is not None:
        print(f"(started {t0 - started.t0:.0f}s ago, in the background)", flush=True)
        rc, text = started.wait()
        print(f"({time.time() - started.t0:.0f}s since it started)", flush=True)
        return _ended(name, rc, time.time() - t0, text)
    try:
        rc, text = _streamed([_tool(cmd[0]), *cmd[1:]])
    except FileNotFoundError:
        return Outcome(name, False, 0.0, f"{cmd[0]} not found")
    return _ended(name, rc, time.time() - t0, text)


def longest_first(stages: Sequence[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The pool's order: expected duration, longest first (stable for equal estimates)."""
    return sorted(stages, key=lambda s: -EXPECTED_SECONDS.get(s[0], 300))


def run_pool(stages: Sequence[tuple[str, list[str]]], jobs: int, first_index: int,
             total: int) -> list[Outcome]:
    """Run the stages ``jobs`` at a time; each one's output is printed whole when it ends."""
    pending = list(stages)
    running: list[Running] = []
    outcomes: list[Outcome] = []
    index = first_index
    while pending or running:
        while pending and len(running) < jobs:
            name, cmd = pending.pop(0)
            print(f"\n=== [{index}/{total}] {name}: {' '.join(cmd)} (started; "
                  f"{len(running) + 1} running)", flush=True)
            index += 1
            if why := _cannot_start(cmd):
                outcomes.append(Outcome(name, False, 0.0, why))
                continue
            log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed below
            try:
                proc = subprocess.Popen([_tool(cmd[0]), *cmd[1:]], cwd=REPO_ROOT, stdout=log,
                                        stderr=subprocess.STDOUT, text=True)
            except FileNotFoundError:
                log.close()
                outcomes.append(Outcome(name, False, 0.0, f"{cmd[0]} not found"))
                continue
            running.append(Running(name, proc, log))
        done = _wait_any(running)
        running.remove(done)
        done.log.seek(0)
        text = done.log.read()
        print(f"\n=== {done.name}: output", flush=True)
        sys.stdout.write(text)
        done.log.close()
        outcomes.append(_ended(done.name, done.proc.returncode, time.time() - done.t0, text))
    return outcomes


def _wait_any(running: list[Running]) -> Running:
    """The first of the running stages to end (os.wait: no polling interval)."""
    by_pid = {r.proc.pid: r for r in running}
    while True:
        pid, status = os.wait()
        if pid in by_pid:
            r = by_pid[pid]
            r.proc.returncode = os.waitstatus_to_exitcode(status)
            return r


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/test",
        description="Lint, type-check, pytest and every Molecule scenario of the sandbox.")
    p.add_argument("--quick", action="store_true",
                   help="lint and the tests that make no node: no Molecule scenario, no e2e test")
    p.add_argument("-s", "--scenario", action="append", metavar="NAME", default=[],
                   help="run only this Molecule scenario (repeatable; no pytest)")
    p.add_argument("-j", "--jobs", type=int,
                   default=int(os.environ.get("SANDBOX_TEST_JOBS", "2")),
                   help="heavy stages (pytest, Vagrant e2e, scenarios) run at a time "
                        "(default 2, or SANDBOX_TEST_JOBS); 1 streams each stage's output")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs: must be 1 or more, not {args.jobs}")
    return args


def plan(args: argparse.Namespace, known: list[str]) -> tuple[list[tuple[str, list[str]]],
                                                              list[tuple[str, list[str]]]]:
    """The serial stages and the heavy ones (pool order)."""
    serial = list(LINT_STAGES)
    heavy: list[tuple[str, list[str]]] = []
    if args.scenario:
        serial = [s for s in serial if s[0] == "build-image"]
    elif args.quick:
        # No podman node: pytest's tests without the e2e mark, on two workers (pytest-xdist),
        # with ansible-lint and ansible-test beside them in the pool.
        heavy.extend(s for s in serial if s[0] in (ANSIBLE_LINT, SANITY))
        heavy.append(QUICK_PYTEST)
        serial = [s for s in serial if s[0] not in (ANSIBLE_LINT, SANITY, "build-image")]
        return serial, longest_first(heavy)
    else:
        # ansible-lint and ansible-test keep one core busy for minutes: in the pool they
        # overlap other work.
        heavy.extend(s for s in serial if s[0] in (ANSIBLE_LINT, SANITY))
        serial = [s for s in serial if s[0] not in (ANSIBLE_LINT, SANITY)]
        heavy.extend(PYTEST_STAGES)
    for name in args.scenario or known:
        heavy.append((f"molecule {name}", ["molecule", "test", "-s", name]))
    return serial, longest_first(heavy)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    known = scenarios()
    unknown = [s for s in args.scenario if s not in known]
    if unknown:
        print(f"test: error: unknown scenario(s) {', '.join(unknown)}; scenarios: "
              f"{', '.join(known)}", file=sys.stderr)
        return 2
    serial, heavy = plan(args, known)
    if heavy and not is_git_checkout():
        print("test: warning: not a git checkout: Molecule finds .config/molecule/config.yml "
              "from the git root and would run the scenarios without their nodes; the "
              "Molecule stages will be reported as failed", file=sys.stderr)
    os.environ.setdefault("PY_COLORS", "1" if sys.stdout.isatty() else "0")
    t0 = time.time()
    total = len(serial) + len(heavy)
    early = {name: Background(cmd) for name, cmd in serial if name in EARLY_STAGES}
    outcomes = [run_stage(i, total, name, cmd, early.get(name))
                for i, (name, cmd) in enumerate(serial, 1)]
    if heavy:
        print(f"\n=== {len(heavy)} heavy stages, {args.jobs} at a time, longest first: "
              f"{', '.join(n for n, _ in heavy)}", flush=True)
        if args.jobs == 1:
            outcomes += [run_stage(i, total, name, cmd)
                         for i, (name, cmd) in enumerate(heavy, len(serial) + 1)]
        else:
            outcomes += run_pool(heavy, args.jobs, len(serial) + 1, total)
    return summary(outcomes, time.time() - t0, args.jobs)


def summary(outcomes: list[Outcome], wall: float, jobs: int) -> int:
    """The stages slowest first, why the failed ones failed, the counts; the exit code."""
    print("\n=== summary (slowest first)")
    for o in sorted(outcomes, key=lambda o: -o.seconds):
        status = "passed" if o.ok else f"FAILED ({o.detail})"
        print(f"  {o.name:<26} {status:<18} {o.seconds:6.0f}s")
    for o in outcomes:
        if not o.ok and o.why:
            print(f"\n=== why {o.name} failed (its last lines saying so; its whole output is "
                  "above)")
            print("\n".join(f"  {line}" for line in o.why))
    passed = sum(o.ok for o in outcomes)
    failed = len(outcomes) - passed
    busy = sum(o.seconds for o in outcomes)
    print(f"{passed} passed, {failed} failed in {wall:.0f}s "
          f"(stages add up to {busy:.0f}s; --jobs {jobs})")
    return 0 if failed == 0 else 1
