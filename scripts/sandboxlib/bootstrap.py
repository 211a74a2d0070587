"""Two-command bootstrap shared by ``scripts/sandbox`` and ``scripts/test`` (stdlib only).

On a fresh Debian 12 host with nothing but Python this module:

1. installs the system packages the sandbox needs where it can (Debian + root: only the
   missing ones, checked with ``dpkg-query``); elsewhere it prints one message listing them;
2. creates ``.venv`` when it is missing (installing ``python3-venv`` first when Python's
   ``venv``/``ensurepip`` is absent on a Debian host and we are root);
3. installs ``requirements.txt`` into ``.venv`` when the hash stored in the venv differs;
4. re-executes the calling script with the venv's Python.

It never deletes or recreates an existing ``.venv``. Everything it prints goes to stderr,
so commands like ``scripts/sandbox inventory --json`` keep stdout clean: one line per step
(a live line with a spinner on a terminal); apt's, venv's and pip's own output goes to
``.sandbox/bootstrap.log`` (``$SANDBOX_STATE_DIR/bootstrap.log``), whose last lines are shown
when a step fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .progress import Screen, step

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV = REPO_ROOT / ".venv"
REQUIREMENTS = REPO_ROOT / "requirements.txt"
STAMP_NAME = ".sandbox-requirements.sha256"
# Set in the environment of the re-executed process, so the bootstrap runs once.
BOOTSTRAPPED_ENV = "SANDBOX_BOOTSTRAPPED"
# Debian packages the podman backend needs on the control node.
SYSTEM_PACKAGES = ("podman", "runc", "mmdebstrap", "iptables", "uidmap", "aardvark-dns",
                   "netavark", "slirp4netns", "openssh-client")
# Commands that show those packages are there on a host without dpkg.
SYSTEM_COMMANDS = ("podman", "runc", "mmdebstrap", "ssh", "ssh-keygen")


class BootstrapError(RuntimeError):
    """The bootstrap cannot continue; the message says what to install or run."""


def log(msg: str) -> None:
    print(f"bootstrap: {msg}", file=sys.stderr, flush=True)


def log_path() -> Path:
    """Where apt's, venv's and pip's output goes (beside the sandboxes' state)."""
    base = os.environ.get("SANDBOX_STATE_DIR")
    return (Path(base) if base else REPO_ROOT / ".sandbox") / "bootstrap.log"


@contextlib.contextmanager
def quiet_step(label: str, note: str) -> Iterator[IO[str]]:
    """One line for a bootstrap step; the yielded file takes the commands' output. On a
    failure the log's last lines are printed, with its path."""
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    screen = Screen(sys.stderr)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"\n# bootstrap: {label}: {note}\n")
        fh.flush()
        try:
            with step(screen, f"bootstrap: {label}", note):
                yield fh
        except BaseException:
            fh.flush()
            tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            print("\n".join(f"    | {line}" for line in tail), file=sys.stderr)
            print(f"    (whole output: {path})", file=sys.stderr, flush=True)
            raise
        finally:
            screen.close()


def is_debian() -> bool:
    return Path("/etc/debian_version").is_file() and shutil.which("dpkg-query") is not None


def is_root() -> bool:
    return os.geteuid() == 0


def missing_debian_packages(packages: tuple[str, ...]) -> list[str]:
    """The packages of ``packages`` that dpkg does not list as installed (one dpkg-query:
    every command runs this, a no-op ``up`` too)."""
    res = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", "--", *packages],
                         capture_output=True, text=True, check=False)
    installed = {line.split(" ", 1)[0] for line in res.stdout.splitlines()
                 if line.endswith(" install ok installed")}
    return [pkg for pkg in packages if pkg not in installed]


def apt_install(packages: list[str]) -> None:
    """``apt-get install -y``; on failure refresh the package lists once and retry."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    with quiet_step("system packages", f"apt-get install {' '.join(packages)}") as out:
        if subprocess.run(cmd, env=env, stdout=out, stderr=out, check=False).returncode == 0:
            return
        out.write("# apt-get install failed; running apt-get update and retrying\n")
        out.flush()
        subprocess.run(["apt-get", "update"], env=env, stdout=out, stderr=out, check=False)
        if subprocess.run(cmd, env=env, stdout=out, stderr=out, check=False).returncode != 0:
            raise BootstrapError(f"apt-get install {' '.join(packages)} failed (output above "
                                 f"and in {log_path()})")


def ensure_system_packages(packages: tuple[str, ...] = SYSTEM_PACKAGES) -> list[str]:
    """Install what is missing where we can; return what is still missing (with a message)."""
    if is_debian():
        missing = missing_debian_packages(packages)
        if not missing:
            return []
        if is_root():
            apt_install(missing)
            return missing_debian_packages(packages)
        log(f"missing system packages: {' '.join(missing)}; "
            f"install them as root: sudo apt-get install -y {' '.join(missing)}")
        return missing
    missing = [cmd for cmd in SYSTEM_COMMANDS if shutil.which(cmd) is None]
    if missing:
        log(f"missing commands: {' '.join(missing)}; this is not a Debian host, install "
            f"the equivalents of the Debian packages {' '.join(packages)} "
            "(podman with runc or crun, netavark/aardvark-dns, mmdebstrap, openssh client)")
    return missing


def _venv_available() -> bool:
    res = subprocess.run([sys.executable, "-c", "import venv, ensurepip"],
                         capture_output=True, check=False)
    return res.returncode == 0


def ensure_venv(venv: Path = VENV) -> Path:
    """Create ``venv`` when missing (never touch an existing one); return its python."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    if venv.exists() or venv.is_symlink():
        raise BootstrapError(f"{venv} exists but has no bin/python; move it away "
                             "and re-run to create a fresh virtualenv")
    if not _venv_available():
        if is_debian() and is_root():
            apt_install(["python3-venv"])
        if not _venv_available():
            raise BootstrapError("Python's venv module is missing: install it "
                                 "(Debian/Ubuntu: apt-get install python3-venv) and re-run")
    with quiet_step("virtualenv", f"python3 -m venv {venv.name}") as out:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=out, stderr=out,
                       check=True)
    return python


def requirements_hash(requirements: Path = REQUIREMENTS) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def ensure_requirements(venv: Path = VENV, requirements: Path = REQUIREMENTS) -> None:
    """pip install ``requirements`` when the hash stored in the venv differs."""
    stamp = venv / STAMP_NAME
    want = requirements_hash(requirements)
    if stamp.is_file() and stamp.read_text().strip() == want:
        return
    with quiet_step("Python packages", f"pip install -r {requirements.name} into "
                    f"{venv.name}") as out:
        res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install",
                              "--disable-pip-version-check", "-q", "-r", str(requirements)],
                             stdout=out, stderr=out, check=False)
        if res.returncode != 0:
            raise BootstrapError(f"pip install -r {requirements.name} failed (exit "
                                 f"{res.returncode}); see its output above (no network to "
                                 "PyPI?)")
    stamp.write_text(want + "\n")


def in_venv(venv: Path = VENV) -> bool:
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


def bootstrap(script: str, argv: list[str], *, system_packages: bool = True) -> None:
    """Prepare the host and the venv, then re-exec ``script`` with the venv's Python.

    Returns (without re-executing) when already running inside the bootstrapped venv.
    """
    if os.environ.get(BOOTSTRAPPED_ENV) == "1" and in_venv():
        return
    try:
        if system_packages:
            ensure_system_packages()
        python = ensure_venv()
        ensure_requirements()
    except (BootstrapError, subprocess.CalledProcessError) as exc:
        print(f"{Path(script).name}: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    env = dict(os.environ)
    env[BOOTSTRAPPED_ENV] = "1"
    env["VIRTUAL_ENV"] = str(VENV)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    os.execve(str(python), [str(python), script, *argv], env)
