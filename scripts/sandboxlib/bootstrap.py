"""Two-command bootstrap shared by ``scripts/sandbox`` and ``scripts/test`` (stdlib only).

On a fresh Debian 12 host with nothing but Python this module:

1. installs the system packages the sandbox needs where it can (Debian + root: only the
   missing ones, checked with ``dpkg-query``); elsewhere it prints one message listing them;
2. creates ``.venv`` when it is missing (installing ``python3-venv`` first when Python's
   ``venv``/``ensurepip`` is absent on a Debian host and we are root);
3. installs ``requirements.txt`` into ``.venv`` when the hash stored in the venv differs;
4. re-executes the calling script with the venv's Python.

It never deletes or recreates an existing ``.venv``. Everything it prints goes to stderr,
so commands like ``scripts/sandbox inventory --json`` keep stdout clean.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def is_debian() -> bool:
    return Path("/etc/debian_version").is_file() and shutil.which("dpkg-query") is not None


def is_root() -> bool:
    return os.geteuid() == 0


def missing_debian_packages(packages: tuple[str, ...]) -> list[str]:
    """The packages of ``packages`` that dpkg does not list as installed."""
    missing = []
    for pkg in packages:
        res = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0 or "install ok installed" not in res.stdout:
            missing.append(pkg)
    return missing


def apt_install(packages: list[str]) -> None:
    """``apt-get install -y``; on failure refresh the package lists once and retry."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    log(f"installing {' '.join(packages)} (apt-get)")
    if subprocess.run(cmd, env=env, stdout=sys.stderr, check=False).returncode == 0:
        return
    log("apt-get install failed; running apt-get update and retrying")
    subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr, check=False)
    if subprocess.run(cmd, env=env, stdout=sys.stderr, check=False).returncode != 0:
        raise BootstrapError(f"apt-get install {' '.join(packages)} failed; "
                             "see the apt-get output above")


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
    log(f"creating the virtualenv {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=sys.stderr, check=True)
    return python


def requirements_hash(requirements: Path = REQUIREMENTS) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def ensure_requirements(venv: Path = VENV, requirements: Path = REQUIREMENTS) -> None:
    """pip install ``requirements`` when the hash stored in the venv differs."""
    stamp = venv / STAMP_NAME
    want = requirements_hash(requirements)
    if stamp.is_file() and stamp.read_text().strip() == want:
        return
    log(f"installing {requirements.name} into {venv.name} (pip)")
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install",
                          "--disable-pip-version-check", "-q", "-r", str(requirements)],
                         stdout=sys.stderr, check=False)
    if res.returncode != 0:
        raise BootstrapError(f"pip install -r {requirements.name} failed (exit "
                             f"{res.returncode}); see the output above (no network to PyPI?)")
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
