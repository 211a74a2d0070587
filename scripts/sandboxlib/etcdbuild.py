"""The etcd the sandbox installs offline: Debian's etcd 3.5.30 with the project's patches.

``scripts/build-etcd`` builds etcd-server and etcd-client ``3.5.30-2+k0sbox2`` from Debian's
own source and ``scripts/etcd-patches/`` (etcd 3.5 lets a tenant past RBAC while NOSPACE is
raised, and through a watch from one of its keys on; docs/security.md), once, cached outside
the checkout. ``up`` builds it (or reuses the cache) when the sandbox installs that version
(roles/etcd's default for the package method, and what the node image and the Vagrant box
carry), and passes its directory to the roles as ``etcd_package_dir``.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .apiserver import build, role_setting
from .progress import Screen, step
from .topology import REPO_ROOT, Topology

BUILD = REPO_ROOT / "scripts" / "build-etcd"
ETCD_DEFAULTS = REPO_ROOT / "roles" / "etcd" / "defaults" / "main.yml"
# Debian's unpatched build of the same version, the one a user may choose instead.
STOCK_HINT = ("--set etcd_package_version=3.5.30-2 (Debian's unpatched etcd: a tenant can "
              "then get past etcd RBAC, docs/security.md)")


@functools.cache
def etcd_defaults() -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(ETCD_DEFAULTS.read_text(), Loader=loader) or {}


def setting(topo: Topology, extra: dict[str, Any], name: str) -> str:
    """An etcd role variable as the run sees it: --set, the topology, the role's default."""
    return role_setting(topo, extra, name, etcd_defaults())


@functools.cache
def patched_version() -> str:
    """The package version scripts/build-etcd builds (3.5.30-2+k0sbox2)."""
    res = subprocess.run([str(BUILD), "--print-version"], capture_output=True, text=True,
                         check=False)
    return res.stdout.strip()


def wanted(topo: Topology, extra: dict[str, Any]) -> bool:
    """Whether this run installs the patched build: its package version is the one wanted
    (the node image and the Vagrant box carry it whatever the method)."""
    if "etcd_package_dir" in extra or "etcd_package_dir" in topo.vars:
        return False   # the user gives the packages
    return setting(topo, extra, "etcd_package_version") == patched_version()


def up_vars(topo: Topology, extra: dict[str, Any], screen: Screen,
            log: Path | None = None) -> dict[str, Any]:
    """Build (or reuse) the patched packages when this run installs them: {etcd_package_dir}."""
    if not wanted(topo, extra):
        return {}
    version = patched_version()
    with step(screen, "etcd packages", f"etcd {version}: Debian's 3.5.30 with the sandbox's "
              "patches (about 4 min the first time)") as result:
        out, built = build(log, screen, script=BUILD, name="build-etcd")
        result["detail"] = (f"etcd {version} (Debian's 3.5.30, patched: "
                            f"{', '.join(fixes(out))}): "
                            + ("built, cached for next time" if built else "from the cache"))
    return {"etcd_package_dir": str(out)}


def planned_vars(topo: Topology, extra: dict[str, Any]) -> dict[str, Any] | None:
    """The variables up_vars would give, without building: None when it would build."""
    if not wanted(topo, extra):
        return {}
    done = subprocess.run([str(BUILD), "--print-dir"], capture_output=True, text=True,
                          check=False)
    out = Path(done.stdout.strip())
    complete = done.returncode == 0 and (out / "SHA256SUMS").is_file() and (
        out / "BUILDINFO").is_file()
    return {"etcd_package_dir": str(out)} if complete else None


def fixes(out: Path) -> list[str]:
    """What the build's patches fix (its BUILDINFO's git_sha line names them)."""
    try:
        info = (out / "BUILDINFO").read_text()
    except OSError:
        return []
    for line in info.splitlines():
        if line.startswith("git_sha=") and "patched: " in line:
            return [f.strip(" )") for f in line.split("patched: ", 1)[1].split(",")]
    return []


# What `status` runs on one member: the etcd binary its unit starts, asked for its version
# (the Git SHA line names the sandbox's patches).
VERSION_PROBE = ("p=$(systemctl show etcd --property=ExecStart --value 2>/dev/null "
                 "| sed -n 's/.*path=\\([^ ;]*\\).*/\\1/p'); \"${p:-etcd}\" --version 2>&1")


def build_summary(version_text: str, topo: Topology) -> str:
    """status's line on the etcd build: the version, the sandbox's patches, what is known
    against it (plugins/plugin_utils/sandbox_advisories.py, as verify says it)."""
    from . import sandbox_advisories as adv

    version, sha = adv.parse_version(version_text)
    accepted = topo.vars.get("etcd_accepted_advisories") or []
    return adv.summary(version, sha, accepted if isinstance(accepted, list) else [])
