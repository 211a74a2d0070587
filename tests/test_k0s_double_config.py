"""The k0s test double (not k0s): k0s.yaml parsed and validated as k0s does (install
controller, config validate), the controller users, kube-apiserver's user flags, the join's
retry schedule and the readiness check's exclusion. Paths under K0S_TEST_DOUBLE_ROOT; useradd
is a stand-in on PATH that only logs (no user is made on the test host)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_k0s_double_commands import DIR, Node, k0s_yaml


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    n.config.write_text(k0s_yaml({"address": "10.0.0.1"}))
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    for tool in ("useradd", "userdel"):
        (tmp_path / "bin" / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >>{tmp_path}/users.log\n")
        (tmp_path / "bin" / tool).chmod(0o755)
    yield n


def edit(node: Node, change: dict) -> Path:
    doc = yaml.safe_load(node.config.read_text())
    for dotted, value in change.items():
        *parents, last = dotted.split(".")
        cur = doc
        for part in parents:
            cur = cur.setdefault(part, {})
        cur[last] = value
    node.config.write_text(yaml.safe_dump(doc))
    return node.config


def test_config_validate_accepts_a_good_file_silently(node: Node) -> None:
    res = node.k0s("config", "validate", "--config", str(node.config))
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


@pytest.mark.parametrize(("change", "message"), [
    ({"spec.nosuch": 1}, 'json: unknown field "nosuch"'),
    ({"spec.controllerManager.bogus": "x"}, 'json: unknown field "bogus"'),
    ({"spec.api.port": "six"}, ("cannot unmarshal string into Go struct field "
                               "ClusterConfig.spec.api.port of type integer")),
    ({"spec.api.sans": "not-a-list"}, "cannot unmarshal string"),
    ({"spec.api.address": "0.0.0.0"}, 'api: address: Invalid value: "0.0.0.0": invalid INADDR_ANY'),
    ({"spec.api.address": "node-1"}, 'api: address: Invalid value: "node-1": invalid IP address'),
])
def test_config_validate_and_install_refuse_what_k0s_refuses(node: Node, change: dict,
                                                             message: str) -> None:
    path = edit(node, change)
    res = node.k0s("config", "validate", "--config", str(path))
    assert res.returncode == 1 and message in res.stderr, res.stderr
    res = node.k0s("install", "controller", "--config", str(path))
    assert res.returncode == 1 and message in res.stderr, res.stderr
    assert not (node.root / "etc/systemd/system/k0scontroller.service").exists()
    assert not (node.root / "users.log").exists()


def test_unknown_fields_under_api_storage_network_are_ignored_as_k0s_ignores_them(
        node: Node) -> None:
    path = edit(node, {"spec.api.nosuch": 1, "spec.storage.etcd.externalCluster.typo": "x",
                       "spec.network.whatever": True, "spec.telemetry.interval": "10m"})
    res = node.k0s("config", "validate", "-c", str(path))
    assert res.returncode == 0, res.stderr
    assert "k0s ignores the unknown field spec.api.nosuch" in res.stderr
    assert "spec.storage.etcd.externalCluster.typo" in res.stderr


def test_config_validate_needs_config_and_a_readable_file(node: Node) -> None:
    assert 'required flag(s) "config" not set' in node.k0s("config", "validate").stderr
    res = node.k0s("config", "validate", "--config", "/nonexistent.yaml")
    assert res.returncode == 1
    assert "failed to read configuration file: open /nonexistent.yaml: no such file" in res.stderr


def test_install_creates_every_controller_user_k0s_creates(node: Node) -> None:
    res = node.k0s("install", "controller", "--config", str(node.config))
    assert res.returncode == 0, res.stderr
    made = [line.split()[-1] for line in (node.root / "users.log").read_text().splitlines()]
    expected = [u for u in ("etcd", "konnectivity-server", "kube-apiserver", "kube-scheduler")
                if subprocess.run(["id", u], capture_output=True, check=False).returncode != 0]
    assert made == expected
    assert "--system --no-create-home" in (node.root / "users.log").read_text()


HELPER = textwrap.dedent('''\
    import json, sys, threading
    sys.path.insert(0, sys.argv[1])
    import k0s_double_controller as c
    what = sys.argv[2]
    if what == "delays":
        print(json.dumps([c.retry_delays() for _ in range(20)]))
    elif what == "args":
        config = {"spec": {"api": {"extraArgs": {"audit-log-path": "/x",
                                                 "service-cluster-ip-range": "10.96.0.0/12"},
                                   "rawArgs": ["--no-such-flag=1", "--audit-log-maxage=3"]}}}
        print(json.dumps(c.user_args(config, {"audit-log-path", "audit-log-maxage"})))
    elif what == "join":
        c.retry_delays = lambda: [0.0] * 9
        c.join(sys.argv[3], threading.Event())
    ''')


def helper(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HELPER, str(DIR), *args], capture_output=True,
                          text=True, env=node.env, timeout=60, check=False)


def test_join_retry_schedule_is_retry_gos_default(node: Node) -> None:
    import json

    for delays in json.loads(helper(node, "delays").stdout):
        assert len(delays) == 9
        for n, delay in enumerate(delays):
            assert 0.1 * (1 << n) <= delay < 0.1 * (1 << n) + 0.1
        assert 51.1 <= sum(delays) < 52.0
    # Scaled only where a Molecule step asks (not k0s: labelled in the double)
    node.env["K0S_TEST_DOUBLE_RETRY_SCALE"] = "0.05"
    try:
        for delays in json.loads(helper(node, "delays").stdout):
            assert 0.05 * 51.1 <= sum(delays) < 0.05 * 52.0
    finally:
        del node.env["K0S_TEST_DOUBLE_RETRY_SCALE"]


def test_a_join_that_keeps_failing_tries_ten_times_then_exits_non_zero(node: Node) -> None:
    import base64
    import gzip

    key, crt = node.root / "ca.key", node.root / "ca.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-subj", "/CN=test-ca", "-days", "1"], capture_output=True, check=True)
    token = {"apiVersion": "v1", "kind": "Config", "clusters": [{"name": "k0s", "cluster": {
        "server": "https://127.0.0.1:1",
        "certificate-authority-data": base64.b64encode(crt.read_bytes()).decode()}}],
        "users": [{"name": "controller-bootstrap", "user": {"token": "abcdef.0123456789abcdef"}}]}
    path = node.root / "token"
    path.write_text(base64.b64encode(gzip.compress(yaml.safe_dump(token).encode())).decode())
    res = helper(node, "join", str(path))
    assert res.returncode == 1
    assert res.stderr.count("Failed to join in attempt #") == 9, res.stderr
    assert "failed to join controller: failed to join existing cluster via https://127.0.0.1:1: " \
        in res.stderr
    assert not (node.pki / "ca.key").exists()


def test_user_flags_known_passed_unknown_extra_args_held_back_raw_args_passed(node: Node) -> None:
    import json

    res = helper(node, "args")
    assert json.loads(res.stdout) == ["--audit-log-path=/x", "--no-such-flag=1",
                                      "--audit-log-maxage=3"]
    assert "extraArgs service-cluster-ip-range: not passed" in res.stderr
    assert "rawArgs --no-such-flag=1: passed; the CRD API server does not know it" in res.stderr


def test_readyz_says_why_informer_sync_is_excluded(node: Node) -> None:
    res = node.k0s("kubectl", "get", "--raw=/readyz")
    assert "asking /readyz?exclude=informer-sync, not /readyz" in res.stderr
    assert "informer-sync check never passes" in res.stderr
