"""Shared pytest helpers: scripts/ and the collection on sys.path, topology files, the CLI."""

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
# The collection's plugins import its plugin_utils as ansible_collections.k0sbox.external_etcd
# (.collections/ links it to the root, as ansible.cfg's collections_path does for Ansible).
COLLECTIONS = REPO_ROOT / ".collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

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


def load_plugin(relative: str) -> Any:
    """A plugin file of the repository (``plugins/filter/sandbox_probe.py``), imported as a
    module of its own name, as Ansible loads it."""
    import importlib.util

    path = REPO_ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_module(module: str, args: dict[str, Any], *extra: str) -> tuple[dict[str, Any], str]:
    """One of the collection's modules (plugins/modules/, by its FQCN) run by Ansible on this
    host, as a role runs it: its result, and Ansible's whole output (JSON)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    res = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local",
                          "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                          "-m", f"k0sbox.external_etcd.{module}", "-a", json.dumps(args), *extra],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    return json.loads(res.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"], res.stdout


def load_k0s_filter(name: str) -> Any:
    """A filter plugin module of roles/k0s_controller (plugins/filter/<name>.py), imported."""
    return load_plugin(f"plugins/filter/{name}.py")


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


def podman_usable() -> str | None:
    """Why podman cannot run the whole-sandbox tests here, or None when it can."""
    podman = shutil.which("podman")
    if podman is None:
        return "podman is not installed"
    res = subprocess.run([podman, "info"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return f"podman does not work here: {' '.join(res.stderr.split())[:200]}"
    return None


def explain(res: subprocess.CompletedProcess[str]) -> str:
    """The exit code, the end of stdout, and stderr's beginning and end: an uncaught
    exception (Ruby's, in vagrant) names itself in its first line, its trace follows."""
    err = res.stderr if len(res.stderr) <= 3000 else \
        f"{res.stderr[:1500]}\n[... {len(res.stderr) - 3000} characters ...]\n{res.stderr[-1500:]}"
    return f"exit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n{err}"


# The shipped topologies the whole-sandbox tests run, each with a podman subnet of its own.
E2E_SUBNETS = {"default": "10.213.71.0/24", "no-tls": "10.213.72.0/24",
               "multi-tenant": "10.213.73.0/24", "ha": "10.213.74.0/24"}


def shipped_copy(name: str, where: Path, *,
                 release_fails: bool = False) -> tuple[str, Path, dict[str, Any]]:
    """A shipped topology renamed e2e-<name> on its own subnet, offline: Debian's etcd
    package instead of the release tarball, the k0s download pointed at a closed loopback
    port (no k0s binary here: k0s is prepared, its preflight runs, its runtime checks SKIP).
    ``release_fails``: the install method stays the default (release), its download pointed at
    a closed loopback port too, so it fails as it does without a route to github.com (on any
    host) and falls back to the package as `up` and every day-2 command let it."""
    data = yaml.safe_load((REPO_ROOT / "inventories" / f"{name}.yml").read_text())
    data["name"] = f"e2e-{name}"
    data["networks"] = {"podman": E2E_SUBNETS[name]}
    data.setdefault("vars", {}).update({
        "k0s_download_base_url": "http://127.0.0.1:9/k0s-releases",
        **({"etcd_release_base_url": "http://127.0.0.1:9/etcd-releases"} if release_fails
           else {"etcd_install_method": "package"}),
    })
    path = where / f"e2e-{name}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return data["name"], path, data


def check_verify_report(report: dict[str, Any], data: dict[str, Any], with_api: bool) -> None:
    """What every whole-sandbox test asserts on verify's report for topology ``data``."""
    assert report["passed"] is True, [c for c in report["checks"] if not c["ok"]]
    names = [c["name"] for c in report["checks"]]
    assert "hashkv equal on all members" in names
    tenants = data.get("tenants", [])
    etcd_count = sum("etcd" in n["groups"] for n in data["nodes"])
    preflights = [n for n in names if n.endswith("preflight as kube-apiserver")]
    assert len(preflights) == sum(len(t["controllers"]) for t in tenants), names
    # Every tenant's Kubernetes API (the CRD API server stand-in here: no k0s binary) did
    # the round trip, and its objects are under its prefix only, not seen by the others.
    passed = {c["name"] for c in report["checks"] if c["ok"] and not c.get("skipped")}
    skipped = {c["name"] for c in report["checks"] if c.get("skipped")}
    for t in tenants:
        for check in ("a watch sees the change (ADDED, then MODIFIED)",
                      "the API server sees its own check objects and no other tenant's"):
            assert (f"{t['name']}: {check}" in passed) == with_api, names
        assert any(n.startswith(f"{t['name']}: its API server's objects are only under")
                   for n in passed) == with_api, names
        if not with_api:
            assert any(n.endswith(f"({t['name']}): Kubernetes API") for n in skipped), names
    # Compaction: the members' own (passed, or skipped while none is due yet), no API
    # server's compaction error (they do not compact: etcd-compaction-interval 0).
    members_compact = [c for c in report["checks"]
                       if c["name"] == "etcd compacts the shared keyspace itself (auto-compaction)"]
    assert len(members_compact) == 1 and members_compact[0]["ok"], members_compact
    api_compact = [c for c in report["checks"] if c["name"].endswith(
        "its API server logs no compaction error (compaction left to etcd)")]
    assert len(api_compact) == sum(len(t["controllers"]) for t in tenants), names
    assert all(c["ok"] and (c.get("skipped") is not None) != with_api for c in api_compact), \
        api_compact
    # Every member serves /metrics and /health without a certificate (etcd_metrics_port).
    for what in ("/metrics", "/health"):
        assert sum(f"{what} served without a certificate" in n for n in passed) == etcd_count, names
    if data.get("tls", True):
        assert sum("client with another CA's certificate refused" in n for n in names) == etcd_count
        # The TLS floor: TLS 1.1 refused on both ports, a suite outside etcd_cipher_suites too.
        for what in ("TLS 1.1 refused on the client port", "TLS 1.1 refused on the peer port",
                     "TLS 1.2 with a cipher outside etcd_cipher_suites refused"):
            assert sum(what in n for n in passed) == etcd_count, names
        # Every node's private keys 0600/0640 (members: /etc/etcd/pki; controllers: the etcd
        # client key, the stand-in's keys), nothing writable by others.
        nodes = etcd_count + sum(len(t["controllers"]) for t in tenants)
        for what in ("private keys 0600/0640, unreadable by others",
                     "no certificate, key or directory writable by others"):
            assert sum(what in n for n in passed) == nodes, names
        assert sum("CIS 2.5 peer-client-cert-auth=true" in n for n in names) == etcd_count
        assert all(c["days_left"] > 300 for c in report["certificates"])
    else:
        assert not any("CIS 2." in n for n in names)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end test that creates podman nodes")


@pytest.fixture(autouse=True)
def _localhost_runs_on_ansibles_linear_strategy(request: pytest.FixtureRequest,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that are not whole-sandbox tests (no ``e2e`` mark) run their playbooks and
    modules on this host, in runs of a few seconds: there Mitogen's start (its connection
    multiplexer and a child Python per run, about 0.5 s each) costs more than it saves, and
    the pytest stage took 582 s under Mitogen against 500 s under Ansible's linear strategy
    (docs/performance.md). They run on linear (AnsiballZ, as Ansible itself runs a module);
    the modules under Mitogen, as users run them, are the Molecule scenarios' and the e2e
    tests'. A strategy given by the caller's environment is kept."""
    if request.node.get_closest_marker("e2e") is None and "ANSIBLE_STRATEGY" not in os.environ:
        monkeypatch.setenv("ANSIBLE_STRATEGY", "linear")


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on loopback now (for etcd members the tests start)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
