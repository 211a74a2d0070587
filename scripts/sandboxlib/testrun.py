"""``scripts/test``: every check the project has, in order, collecting failures.

yamllint -> ansible-lint (production profile) -> ruff -> mypy -> build-apiserver (cached) ->
pytest -> every Molecule scenario, one by one with its time. Exits non-zero when any stage failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .topology import REPO_ROOT

BUILD_STAGE = "build-apiserver"

LINT_STAGES: list[tuple[str, list[str]]] = [
    ("yamllint", ["yamllint", "."]),
    ("ansible-lint", ["ansible-lint", "--profile", "production"]),
    ("ruff", ["ruff", "check", "scripts", "plugins", "tests", "scripts/sandbox", "scripts/test"]),
    ("mypy", ["mypy", "scripts/sandboxlib"]),
    # Kubernetes' CRD API server and kubectl (the stand-in where k0s cannot run): built once
    # from Debian's packages, then reused from the cache by pytest and every scenario. It
    # starts in the background with the first stage (its download overlaps the linters);
    # this stage waits for it.
    (BUILD_STAGE, ["scripts/build-apiserver"]),
    ("pytest", ["pytest", "tests"]),
]


class Background:
    """A stage's command started early in the background; its stage waits for it."""

    def __init__(self, cmd: list[str]) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed in wait()
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)

    def wait(self) -> int:
        rc = self.proc.wait()
        self.log.seek(0)
        sys.stdout.write(self.log.read())
        self.log.close()
        return rc


@dataclass
class Outcome:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


def scenarios() -> list[str]:
    return sorted(p.parent.name for p in (REPO_ROOT / "molecule").glob("*/molecule.yml"))


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def is_git_checkout() -> bool:
    res = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=False)
    return res.returncode == 0 and Path(res.stdout.strip()).resolve() == REPO_ROOT.resolve()


def run_stage(index: int, total: int, name: str, cmd: list[str],
              started: Background | None = None) -> Outcome:
    print(f"\n=== [{index}/{total}] {name}: {' '.join(cmd)}", flush=True)
    if cmd[0] == "molecule" and not is_git_checkout():
        return Outcome(name, False, 0.0, "not a git checkout")
    t0 = time.time()
    if started is not None:
        print(f"(started {t0 - started.t0:.0f}s ago, in the background)", flush=True)
        rc = started.wait()
        print(f"=== {name}: {'passed' if rc == 0 else 'FAILED (exit ' + str(rc) + ')'} "
              f"in {time.time() - started.t0:.0f}s ({time.time() - t0:.0f}s waited for)",
              flush=True)
        return Outcome(name, rc == 0, time.time() - t0, "" if rc == 0 else f"exit {rc}")
    try:
        rc = subprocess.run([_tool(cmd[0]), *cmd[1:]], cwd=REPO_ROOT, check=False).returncode
    except FileNotFoundError:
        return Outcome(name, False, 0.0, f"{cmd[0]} not found")
    seconds = time.time() - t0
    detail = "" if rc == 0 else f"exit {rc}"
    print(f"=== {name}: {'passed' if rc == 0 else 'FAILED (' + detail + ')'} "
          f"in {seconds:.0f}s", flush=True)
    return Outcome(name, rc == 0, seconds, detail)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/test",
        description="Lint, type-check, pytest and every Molecule scenario of the sandbox.")
    p.add_argument("--quick", action="store_true", help="skip the Molecule scenarios")
    p.add_argument("-s", "--scenario", action="append", metavar="NAME", default=[],
                   help="run only this Molecule scenario (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    known = scenarios()
    unknown = [s for s in args.scenario if s not in known]
    if unknown:
        print(f"test: error: unknown scenario(s) {', '.join(unknown)}; scenarios: "
              f"{', '.join(known)}", file=sys.stderr)
        return 2
    stages = list(LINT_STAGES)
    if not args.quick:
        for name in args.scenario or known:
            stages.append((f"molecule {name}", ["molecule", "test", "-s", name]))
    if not args.quick and not is_git_checkout():
        print("test: warning: not a git checkout: Molecule finds .config/molecule/config.yml "
              "from the git root and would run the scenarios without their nodes; the "
              "Molecule stages will be reported as failed", file=sys.stderr)
    os.environ.setdefault("PY_COLORS", "1" if sys.stdout.isatty() else "0")
    t0 = time.time()
    build = dict(stages).get(BUILD_STAGE)
    early = Background(build) if build else None
    outcomes = [run_stage(i, len(stages), name, cmd, early if name == BUILD_STAGE else None)
                for i, (name, cmd) in enumerate(stages, 1)]
    print("\n=== summary")
    for o in outcomes:
        status = "passed" if o.ok else f"FAILED ({o.detail})"
        print(f"  {o.name:<24} {status:<18} {o.seconds:6.0f}s")
    passed = sum(o.ok for o in outcomes)
    failed = len(outcomes) - passed
    print(f"{passed} passed, {failed} failed in {time.time() - t0:.0f}s")
    return 0 if failed == 0 else 1
