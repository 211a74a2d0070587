"""Reaching the sandbox's nodes over SSH, with the same user, key and address Ansible uses."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NoReturn

from . import inventory
from .topology import Topology

SSH_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes")


class RemoteError(RuntimeError):
    """A node cannot be reached or lacks what a command needs; one-line message."""


@dataclass(frozen=True)
class Target:
    name: str
    host: str
    user: str
    key: str
    become: bool


def targets(topo: Topology, backend: str) -> dict[str, Target]:
    """Every node as an SSH target, from the same inventory data Ansible gets."""
    data = inventory.build(topo, backend)
    return {name: Target(name=name, host=hv["ansible_host"], user=hv["ansible_user"],
                         key=hv["ansible_ssh_private_key_file"],
                         become=bool(hv.get("ansible_become")))
            for name, hv in data["hosts"].items()}


def ssh_argv(t: Target, command: str | None, *, tty: bool = False,
             connect_timeout: int = 10) -> list[str]:
    ssh = shutil.which("ssh")
    if ssh is None:
        raise RemoteError("ssh is not installed: apt-get install openssh-client")
    argv = [ssh, *SSH_OPTIONS, "-o", f"ConnectTimeout={connect_timeout}", "-i", t.key]
    if tty:
        argv.append("-t")
    argv.append(f"{t.user}@{t.host}")
    if command is not None:
        if t.become:
            command = f"sudo -n sh -c {shlex.quote(command)}"
        argv.append(command)
    elif t.become:
        argv += ["sudo", "-i"]
    return argv


def run(t: Target, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on the node; a connection failure is a result with rc 255."""
    try:
        return subprocess.run(ssh_argv(t, command, connect_timeout=5), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", f"timed out after {timeout:.0f}s")


def run_many(targets_and_commands: list[tuple[Target, str]],
             timeout: float = 30) -> list[subprocess.CompletedProcess[str]]:
    if not targets_and_commands:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets_and_commands))) as pool:
        return list(pool.map(lambda tc: run(tc[0], tc[1], timeout), targets_and_commands))


def exec_ssh(t: Target, command: str | None) -> NoReturn:
    """Replace this process with ssh to the node (interactive when no command is given)."""
    tty = sys.stdin.isatty() and (command is None or sys.stdout.isatty())
    argv = ssh_argv(t, command, tty=tty)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
