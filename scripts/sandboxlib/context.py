"""What every ``scripts/sandbox`` command shares: its two error types, the sandbox the command
is about (topology and backend, remembered in ``.sandbox/current``) and the node lookup.
Used by ``cli`` and ``day2`` (neither imports the other)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import inventory, remote
from .topology import REPO_ROOT, Topology, load

VAGRANT_MISSING = ("vagrant is not installed: apt-get install vagrant vagrant-libvirt "
                   "(or use --backend podman)")
PODMAN_MISSING = ("podman is not installed: apt-get install podman runc netavark aardvark-dns "
                  "mmdebstrap (scripts/sandbox does it itself when run as root on Debian)")


# The settings every command that runs the roles passes (``up`` and every day-2 command): the
# sandbox carries on where a download cannot be had, as here (no route to github.com): k0s is
# prepared without a binary (its preflight runs, its start is skipped) and etcd's release
# falls back to the distribution's package. ONE place, so no command runs the roles offline
# with less than ``up`` did (rotate-ca once stopped at etcd's failed release download).
OFFLINE_VARS: dict[str, Any] = {"k0s_binary_missing": "warn", "etcd_release_fallback": "package"}


def run_vars(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The variables of a playbook run: OFFLINE_VARS, then the command's own ``extra``."""
    return {**OFFLINE_VARS, **(extra or {})}


class UsageError(Exception):
    """Bad input: printed as one line, exit 2, nothing changed."""


class Failure(Exception):
    """A step failed: printed as one line, exit 1."""


def state_base() -> Path:
    base = os.environ.get("SANDBOX_STATE_DIR")
    return Path(base) if base else REPO_ROOT / ".sandbox"


def current_file() -> Path:
    return state_base() / "current"


def read_current() -> dict[str, str]:
    try:
        data = json.loads(current_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class Sandbox:
    topo: Topology
    backend: str


def resolve(args: argparse.Namespace) -> Sandbox:
    """The topology and backend from the flags, else SANDBOX_TOPOLOGY (as the Vagrantfile
    reads it), else .sandbox/current, else defaults."""
    current = read_current()
    name = (args.topology or os.environ.get("SANDBOX_TOPOLOGY") or current.get("topology")
            or "default")
    topo = load(name)
    backend = args.backend
    if backend is None and current.get("topology") == str(topo.path):
        backend = current.get("backend")
    backend = inventory.selected_backend(backend)
    inventory.build(topo, backend)  # the backend must have a network in this topology
    cluster = getattr(args, "cluster", None)
    if cluster:
        topo = topo.view(cluster)
    for w in topo.warnings:
        print(f"sandbox: warning: {w}", file=sys.stderr)
    return Sandbox(topo, backend)


def need_tool(backend: str) -> None:
    if backend == "vagrant" and shutil.which("vagrant") is None:
        raise UsageError(VAGRANT_MISSING)
    if backend == "vagrant" and not (REPO_ROOT / "Vagrantfile").is_file():
        raise UsageError("no Vagrantfile in this checkout: the vagrant backend is not "
                         "available (use --backend podman)")
    if backend == "podman" and shutil.which("podman") is None:
        raise UsageError(PODMAN_MISSING)


OWNER_LABEL = "k0s-etcd-sandbox.state"


def podman_json(*args: str) -> list[dict[str, Any]]:
    """A podman command's JSON list; [] when it fails (nothing there) or prints no list."""
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    try:
        out = json.loads(done.stdout or "[]") if done.returncode == 0 else []
    except ValueError:
        return []
    return [x for x in out if isinstance(x, dict)] if isinstance(out, list) else []


def check_owner(sb: Sandbox) -> None:
    """UsageError when podman nodes or the network of this sandbox's name belong to another
    state directory (another checkout, a copy of the topology file, another
    SANDBOX_STATE_DIR): nodes.yml labels every container and the network with the state
    directory that made it (OWNER_LABEL). Those without the label (made before it existed)
    are taken as this sandbox's."""
    if sb.backend != "podman" or shutil.which("podman") is None:
        return
    containers = podman_json("ps", "-a", "--format", "json", "--filter",
                             f"label=k0s-etcd-sandbox={sb.topo.name}")
    networks = podman_json("network", "inspect", sb.topo.network_name())
    ours = str(sb.topo.state_dir.resolve())
    things = [(f"node {(c.get('Names') or ['?'])[0]}", c.get("Labels")) for c in containers]
    things += [(f"network {n.get('name', '?')}", n.get("labels")) for n in networks]
    for what, labels in things:
        owner = (labels or {}).get(OWNER_LABEL)
        if owner and owner != ours:
            raise UsageError(
                f"sandbox '{sb.topo.name}' ({what}) belongs to the state directory "
                f"{owner}, not {ours}: run scripts/sandbox from the checkout (or with the "
                "SANDBOX_STATE_DIR) that made it, or give this topology another name")


def podman_subnet_free(topo: Topology) -> None:
    """UsageError when the topology's podman subnet overlaps another podman network (its own
    network, k0sbox-<name>, is fine): podman would refuse to create it after the state
    directory exists."""
    subnet = topo.networks.get("podman")
    if subnet is None:
        return
    for net in podman_json("network", "ls", "--format", "json"):
        if net.get("name") == topo.network_name():
            continue
        for sub in net.get("subnets") or []:
            try:
                other = ipaddress.ip_network(str(sub.get("subnet")), strict=False)
            except ValueError:
                continue
            if other.version == 4 and other.overlaps(subnet):
                raise UsageError(
                    f"networks.podman: {subnet} overlaps podman network '{net.get('name')}' "
                    f"({other}); give topology '{topo.name}' a subnet of its own "
                    "(networks: {podman: ...}) or remove that network")


def remember(sb: Sandbox) -> None:
    current_file().parent.mkdir(parents=True, exist_ok=True)
    current_file().write_text(json.dumps({"topology": str(sb.topo.path),
                                          "backend": sb.backend}) + "\n")


def target(sb: Sandbox, node: str) -> remote.Target:
    """The SSH target of a node of the sandbox, or a UsageError listing the nodes."""
    targets = remote.targets(sb.topo, sb.backend)
    if node not in targets:
        raise UsageError(f"no node '{node}' in topology '{sb.topo.name}'; nodes: "
                         f"{', '.join(targets)}")
    return targets[node]
