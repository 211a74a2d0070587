"""Shared pytest helpers: the repo root on sys.path (scripts/), topology files, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

# Test topologies use names starting with t- and podman subnets 10.213.50-59.0/24.
BASE_TOPOLOGY: dict[str, Any] = {
    "plugin": "sandbox_topology",
    "name": "t-unit",
    "tls": True,
    "networks": {"podman": "10.213.51.0/24", "vagrant": "192.168.213.0/24"},
    "nodes": [
        {"name": "e1", "groups": ["etcd"], "host": 11},
        {"name": "c1", "groups": ["k0s_controller"], "host": 21},
    ],
    "tenants": [{"name": "ta", "prefix": "ta", "controllers": ["c1"]}],
}


def base_topology() -> dict[str, Any]:
    return json.loads(json.dumps(BASE_TOPOLOGY))


@pytest.fixture
def write_topology(tmp_path: Path) -> Callable[..., Path]:
    """Write a topology document to a file under tmp_path and return its path."""

    def write(data: Any, name: str = "topology.yml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


def run_sandbox(args: list[str], state_dir: Path, *, timeout: float = 60,
                env: dict[str, str] | None = None,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run scripts/sandbox as a user would, with its own state dir (and ``stdin``)."""
    full_env = dict(os.environ, SANDBOX_STATE_DIR=str(state_dir))
    full_env.pop("SANDBOX_BACKEND", None)
    full_env.pop("SANDBOX_TOPOLOGY", None)
    if env:
        full_env.update(env)
    return subprocess.run([str(SCRIPTS / "sandbox"), *args], cwd=REPO_ROOT, env=full_env,
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)


def podman_objects(topology_name: str) -> list[str]:
    """Containers (by label or name) and the network a sandbox of this name would own."""
    podman = shutil.which("podman")
    if podman is None:
        return []
    found: list[str] = []
    ps = subprocess.run([podman, "ps", "-a", "--format", "{{.Names}}", "--filter",
                         f"name=^k0sbox-{topology_name}-"], capture_output=True, text=True,
                        check=False)
    found += [f"container {n}" for n in ps.stdout.split()]
    ps = subprocess.run([podman, "ps", "-a", "--format", "{{.Names}}", "--filter",
                         f"label=k0s-etcd-sandbox={topology_name}"], capture_output=True,
                        text=True, check=False)
    found += [f"container {n}" for n in ps.stdout.split() if f"container {n}" not in found]
    net = subprocess.run([podman, "network", "exists", f"k0sbox-{topology_name}"],
                         capture_output=True, check=False)
    if net.returncode == 0:
        found.append(f"network k0sbox-{topology_name}")
    return found


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end test that creates podman nodes")
