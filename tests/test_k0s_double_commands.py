"""The k0s test double's (not k0s) commands run on the test host: token create | list |
invalidate, kubeconfig admin, status and the runtime config, each as k0s v1.36.3+k0s.2 does it
(the double's docstrings cite the source). The double's paths live under a temporary
directory (K0S_TEST_DOUBLE_ROOT, for these tests only); its etcd is a file-backed etcdctl
stand-in written below (test data: put/get/del only), and its running controller is the
double's own runtime-config and status-socket code started in a helper process."""

from __future__ import annotations

import base64
import gzip
import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

DIR = REPO_ROOT / "tests" / "k0s-test-double"
DOUBLE = DIR / "k0s"

ETCDCTL = textwrap.dedent('''\
    #!/usr/bin/env python3
    # etcdctl stand-in for tests/test_k0s_double_commands.py (test data, not etcd)
    import json, os, sys
    store = os.environ["DBL_ETCD_STORE"]
    data = json.load(open(store)) if os.path.exists(store) else {}
    args = [a for a in sys.argv[1:] if not a.startswith("--") or a in ("--prefix", "--print-value-only")]
    args = [a for a in args if a not in ("--cacert", "--cert", "--key")]
    op, rest = args[0], args[1:]
    if op == "put":
        data[rest[0]] = rest[1]
        print("OK")
    elif op == "del":
        print(int(data.pop(rest[-1], None) is not None))
    elif op == "get":
        key = rest[-1]
        keys = sorted(k for k in data if (k.startswith(key) if "--prefix" in rest else k == key))
        for k in keys:
            if "--print-value-only" not in rest:
                print(k)
            print(data[k])
    json.dump(data, open(store, "w"))
    ''')

CONTROLLER = textwrap.dedent('''\
    import signal, sys, threading
    sys.path.insert(0, sys.argv[1])
    from k0s_double_config import (STATUS_SOCKET, cleanup_runtime_config, k0s_vars, node_config,
                                   write_runtime_config)
    from k0s_double_status import k0s_status, serve_status, stop_status
    config = node_config(sys.argv[2])
    node_vars = k0s_vars(sys.argv[2])
    lock = write_runtime_config(node_vars, config)
    server = serve_status(str(STATUS_SOCKET), k0s_status(config, node_vars, sys.argv))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    stop_status(server, str(STATUS_SOCKET))
    cleanup_runtime_config(lock)
    ''')


def k0s_yaml(api: dict) -> str:
    return yaml.safe_dump({"apiVersion": "k0s.k0sproject.io/v1beta1", "kind": "ClusterConfig",
                           "metadata": {"name": "k0s"},
                           "spec": {"api": api, "storage": {"type": "etcd", "etcd": {
                               "externalCluster": {"endpoints": ["http://10.0.0.9:2379"],
                                                   "etcdPrefix": "tenant-a"}}}}})


class Node:
    """A node's file tree under tmp_path, the etcdctl stand-in and the controller helper."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "etc/k0s/k0s.yaml"
        self.pki = root / "var/lib/k0s/pki"
        self.run = root / "run/k0s"
        for d in (self.config.parent, self.pki, self.run, root / "bin"):
            d.mkdir(parents=True)
        (root / "bin/etcdctl").write_text(ETCDCTL)
        (root / "bin/etcdctl").chmod(0o755)
        for name in ("ca.crt", "admin.crt", "admin.key"):
            (self.pki / name).write_text(f"-----BEGIN {name}-----\n")
        self.env = {**os.environ, "K0S_TEST_DOUBLE_ROOT": str(root),
                    "DBL_ETCD_STORE": str(root / "etcd.json"),
                    "PATH": f"{root / 'bin'}:{os.environ['PATH']}"}
        self.env.pop("K0S_TEST_DOUBLE_ALLOWED", None)
        self.proc: subprocess.Popen[str] | None = None

    def k0s(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(DOUBLE), *args], capture_output=True,
                              text=True, env=self.env, timeout=30, check=False)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(DIR), str(self.config)],
                                     stdout=subprocess.PIPE, text=True, env=self.env)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def store(self) -> dict[str, str]:
        path = self.root / "etcd.json"
        return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    n.config.write_text(k0s_yaml({"address": "10.0.0.1"}))
    yield n
    n.stop()


def decode(token: str) -> dict:
    return yaml.safe_load(gzip.decompress(base64.b64decode(token)))


# --- token create ------------------------------------------------------------------------

def test_token_create_reads_k0s_yaml_from_disk_not_the_running_state(node: Node) -> None:
    node.start()
    first = node.k0s("token", "create", "--role", "controller")
    assert first.returncode == 0, first.stderr
    assert decode(first.stdout)["clusters"][0]["cluster"]["server"] == "https://10.0.0.1:9443"
    # the file changes while the controller runs: the next token names the new address
    node.config.write_text(k0s_yaml({"address": "10.0.0.1", "externalAddress": "lb.example"}))
    res = node.k0s("token", "create", "--role=controller", "--expiry", "1h")
    kubeconfig = decode(res.stdout)
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://lb.example:9443"
    assert kubeconfig["users"][0]["name"] == "controller-bootstrap"
    assert base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]) \
        == (node.pki / "ca.crt").read_bytes()
    node.config.write_text(k0s_yaml({"address": "10.0.0.1", "externalAddress": "lb.example:7443",
                                     "k0sApiPort": 9555}))
    res = node.k0s("token", "create", "--role=controller")
    assert decode(res.stdout)["clusters"][0]["cluster"]["server"] == "https://lb.example:7443"
    node.config.write_text(k0s_yaml({"address": "fd00::1", "k0sApiPort": 9555}))
    res = node.k0s("token", "create", "--role=controller")
    assert decode(res.stdout)["clusters"][0]["cluster"]["server"] == "https://[fd00::1]:9555"


def test_token_expiry_0s_never_expires_and_1h_does(node: Node) -> None:
    node.start()
    never = decode(node.k0s("token", "create", "--role=controller").stdout)
    hour = decode(node.k0s("token", "create", "--role=controller", "--expiry=1h").stdout)
    secrets = {json.loads(v)["metadata"]["name"]: json.loads(v)["data"]
               for v in node.store().values()}
    never_id = never["users"][0]["user"]["token"].split(".")[0]
    hour_id = hour["users"][0]["user"]["token"].split(".")[0]
    assert "expiration" not in secrets[f"bootstrap-token-{never_id}"]
    assert "expiration" in secrets[f"bootstrap-token-{hour_id}"]
    key = next(iter(node.store()))
    assert key.startswith("/tenant-a/secrets/kube-system/bootstrap-token-")


def test_token_create_needs_a_running_controller_and_has_no_config_flag(node: Node) -> None:
    res = node.k0s("token", "create", "--role=controller")
    assert res.returncode == 1
    assert "failed to get k0s status: status: can't get \"status\"" in res.stderr
    assert node.store() == {}
    node.start()
    assert node.k0s("token", "create", "--role=controller", "-c", str(node.config)).returncode == 1
    assert node.k0s("token", "create", "--role=admin").stderr.endswith(
        'unsupported role "admin"; supported roles are "controller" and "worker"\n')
    assert 'time: invalid duration "soon"' in node.k0s(
        "token", "create", "--role=controller", "--expiry=soon").stderr


# --- token list, token invalidate --------------------------------------------------------

def test_token_list_and_invalidate(node: Node) -> None:
    node.start()
    assert node.k0s("token", "list", "--role=controller").stdout == "No k0s join tokens found\n"
    token = decode(node.k0s("token", "create", "--role=controller").stdout)
    token_id = token["users"][0]["user"]["token"].split(".")[0]
    listed = node.k0s("token", "list", "--role=controller")
    assert listed.stdout == f"ID       ROLE         EXPIRES AT\n{token_id}   controller\n"
    assert node.k0s("token", "list", "--role=worker").stdout == ""
    assert node.k0s("token", "list").returncode == 1  # k0s: unsupported role ""
    res = node.k0s("token", "invalidate", token_id, "zzzzzz")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"token {token_id} deleted successfully\ntoken zzzzzz deleted successfully\n"
    assert node.k0s("token", "list", "--role=controller").stdout == "No k0s join tokens found\n"
    assert node.k0s("token", "invalidate").returncode == 1


# --- kubeconfig admin ---------------------------------------------------------------------

@pytest.mark.parametrize(("api", "server"), [
    ({"address": "10.0.0.1"}, "https://10.0.0.1:6443"),
    ({"address": "10.0.0.1", "port": 7443}, "https://10.0.0.1:7443"),
    ({"address": "10.0.0.1", "externalAddress": "lb.example", "port": 7443}, "https://lb.example:7443"),
    ({"address": "10.0.0.1", "externalAddress": "lb.example:443"}, "https://lb.example:443"),
])
def test_kubeconfig_admin_server_and_flattened_files(node: Node, api: dict, server: str) -> None:
    node.config.write_text(k0s_yaml(api))
    res = node.k0s("kubeconfig", "admin")
    assert res.returncode == 0, res.stderr
    conf = yaml.safe_load(res.stdout)
    assert conf["clusters"] == [{"cluster": {
        "certificate-authority-data": base64.b64encode((node.pki / "ca.crt").read_bytes()).decode(),
        "server": server}, "name": "local"}]
    assert conf["current-context"] == "Default"
    assert conf["contexts"] == [{"context": {"cluster": "local", "user": "user"}, "name": "Default"}]
    assert base64.b64decode(conf["users"][0]["user"]["client-key-data"]) == \
        (node.pki / "admin.key").read_bytes()
    assert res.stdout.startswith("apiVersion: v1\nclusters:\n- cluster:\n")


def test_kubeconfig_admin_reads_the_running_controllers_file_and_names_a_missing_pki_file(
        node: Node, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(k0s_yaml({"address": "10.0.0.7"}))
    node.config.rename(tmp_path / "moved.yaml")
    node.config = other
    node.start()
    res = node.k0s("kubeconfig", "admin")
    assert yaml.safe_load(res.stdout)["clusters"][0]["cluster"]["server"] == "https://10.0.0.7:6443"
    (node.pki / "admin.crt").unlink()
    res = node.k0s("kubeconfig", "admin")
    assert res.returncode == 1
    assert f'admin PKI file "{node.pki / "admin.crt"}" not found, check if the control plane ' \
           "is initialized on this node" in res.stderr


# --- the runtime config and status --------------------------------------------------------

def test_runtime_config_is_written_0600_reported_by_status_and_removed_at_stop(node: Node) -> None:
    node.start()
    path = node.run / "k0s.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = yaml.safe_load(path.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("k0s.k0sproject.io/v1beta1", "RuntimeConfig")
    assert doc["spec"]["k0sVars"]["StartupConfigPath"] == str(node.config)
    assert doc["spec"]["nodeConfig"]["spec"]["api"] == {"address": "10.0.0.1",
                                                       "k0sApiPort": 9443, "port": 6443}
    status = node.k0s("status", "-o", "json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["Role"] == "controller" and info["Pid"] == node.proc.pid  # type: ignore[union-attr]
    assert info["ClusterConfig"] == doc["spec"]["nodeConfig"]
    assert status.stdout.startswith('{\n   "Version"')
    assert node.k0s("reset").stderr.endswith(
        "another k0s process is still running, please stop k0s before reset\n")
    node.stop()
    assert not path.exists()
    assert node.k0s("status").returncode == 1
