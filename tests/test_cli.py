"""scripts/sandbox: argument errors (one line, exit 2, nothing changed) and inventory --json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, SCRIPTS, base_topology, podman_objects, run_sandbox
from sandboxlib import cli, context, topology


def _bad_input_changed_nothing(res: Any, state_dir: Path, name: str) -> None:
    """Exit 2, exactly one line on stderr, and no state, container or network made."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("bootstrap:")]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("sandbox: error: ")
    assert res.stdout == ""
    assert not (state_dir / "current").exists()
    assert not (state_dir / name).exists()
    assert podman_objects(name) == []


def test_unknown_topology_name(tmp_path: Path) -> None:
    res = run_sandbox(["up", "--topology", "t-no-such"], tmp_path)
    _bad_input_changed_nothing(res, tmp_path, "t-no-such")
    assert "unknown topology 't-no-such'; shipped ones: " in res.stderr
    assert "default" in res.stderr


def test_unknown_topology_file(tmp_path: Path) -> None:
    res = run_sandbox(["up", "--topology", str(tmp_path / "t-absent.yml")], tmp_path)
    _bad_input_changed_nothing(res, tmp_path, "t-absent")
    assert "not found" in res.stderr


def test_unknown_backend(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-backend"
    path = write_topology(doc)
    res = run_sandbox(["up", "--backend", "docker", "--topology", str(path)], tmp_path)
    _bad_input_changed_nothing(res, tmp_path, "t-cli-backend")
    assert "invalid choice: 'docker'" in res.stderr


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["nodes"][0].update(groups=[]), "every node needs at least one group"),
    (lambda d: d["nodes"][1].update(host=11), "duplicate podman address 10.213.51.11"),
    (lambda d: d["tenants"][0].update(controllers=[]), "a tenant needs at least one controller"),
    (lambda d: d["tenants"][0].update(name="admin"), "tenants (admin).name: 'admin' is reserved"),
    (lambda d: d["tenants"][0].update(name="root"), "tenants (root).name: 'root' is reserved"),
    (lambda d: d["tenants"][0].update(name="etcd-member"),
     "tenants (etcd-member).name: 'etcd-member' is reserved (the CN of every etcd member certificate"),
    (lambda d: d["tenants"][0].update(name="e1"), "'e1' is also an etcd member's name"),
    (lambda d: d["tenants"][0].update(prefix="../t4"), "has a '.', '..' or empty segment"),
    (lambda d: d["tenants"][0].update(max_bytes="10MB"),
     "tenants[0] (ta).max_bytes: '10MB' is not a positive integer; give the tenant's write budget"),
], ids=["node in no group", "duplicate address", "tenant with no controller", "tenant admin",
        "tenant root", "tenant etcd-member", "tenant named like a member", "prefix with ..",
        "max_bytes not an int"])
def test_bad_topology_file(mutate: Callable[[dict[str, Any]], None], message: str,
                           tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-bad"
    mutate(doc)
    res = run_sandbox(["up", "--topology", str(write_topology(doc))], tmp_path)
    _bad_input_changed_nothing(res, tmp_path, "t-cli-bad")
    assert message in res.stderr


def test_vagrant_missing_for_vagrant_backend(
        tmp_path: Path, write_topology: Callable[..., Path],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-vag"
    path = write_topology(doc)
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(tmp_path))
    real_which = shutil.which
    monkeypatch.setattr(context.shutil, "which",
                        lambda cmd, *a, **k: None if cmd == "vagrant" else real_which(cmd))
    rc = cli.main(["up", "--topology", str(path), "--backend", "vagrant"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.strip().splitlines() == [f"sandbox: error: {context.VAGRANT_MISSING}"]
    assert out == ""
    assert not (tmp_path / "current").exists()
    assert not (tmp_path / "t-cli-vag").exists()


@pytest.mark.skipif(shutil.which("vagrant") is not None, reason="vagrant is installed here")
def test_vagrant_missing_through_the_script(tmp_path: Path,
                                            write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-vag2"
    res = run_sandbox(["up", "--backend", "vagrant", "--topology", str(write_topology(doc))],
                      tmp_path)
    _bad_input_changed_nothing(res, tmp_path, "t-cli-vag2")
    assert "vagrant is not installed: apt-get install vagrant vagrant-libvirt" in res.stderr


def test_backend_without_network(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-nonet"
    del doc["networks"]["vagrant"]
    res = run_sandbox(["up", "--backend", "vagrant", "--topology", str(write_topology(doc))],
                      tmp_path)
    _bad_input_changed_nothing(res, tmp_path, "t-cli-nonet")
    assert "networks.vagrant: topology 't-cli-nonet' has no vagrant network" in res.stderr


def test_unknown_command_is_one_line(tmp_path: Path) -> None:
    res = run_sandbox(["explode"], tmp_path)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert "invalid choice: 'explode'" in res.stderr


@pytest.mark.parametrize("backend", ["podman", "vagrant"])
def test_inventory_json(backend: str, tmp_path: Path,
                        write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-inv"
    path = write_topology(doc)
    res = run_sandbox(["inventory", "--json", "--backend", backend, "--topology", str(path)],
                      tmp_path)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)  # stdout is nothing but the JSON document
    topo = topology.load(path)
    assert sorted(data) == ["groups", "hosts", "vars"]
    assert data["groups"]["etcd"] == ["e1"]
    assert data["groups"]["tenant_ta"] == ["c1"]
    for node in topo.nodes:
        assert data["hosts"][node.name]["ansible_host"] == node.address(backend)
    assert data["vars"]["sandbox_backend"] == backend
    assert data["vars"]["sandbox_state_dir"] == str(tmp_path / "t-cli-inv")
    assert data["vars"]["k0s_tenants"] == [{"name": "ta", "prefix": "ta",
                                            "controllers": ["c1"], "key_prefix": "/ta/"}]
    assert not (tmp_path / "current").exists(), "inventory must not change the current sandbox"


def test_status_when_nothing_is_up(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-none"
    res = run_sandbox(["status", "--topology", str(write_topology(doc))], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Sandbox 't-cli-none'" in res.stdout
    assert res.stdout.count("not created") == 2
    assert "no etcd member is running" in res.stdout
    assert podman_objects("t-cli-none") == []


def test_ssh_unknown_node(tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-ssh"
    res = run_sandbox(["ssh", "--topology", str(write_topology(doc)), "nope", "true"], tmp_path)
    assert res.returncode == 2
    assert "no node 'nope' in topology 't-cli-ssh'; nodes: e1, c1" in res.stderr


@pytest.mark.parametrize(("argv", "ours", "rest"), [
    (["etcdctl", "member", "list", "-w", "table"], ["etcdctl"],
     ["member", "list", "-w", "table"]),
    (["etcdctl", "-t", "x", "-w", "table", "member", "list"], ["etcdctl", "-t", "x"],
     ["-w", "table", "member", "list"]),
    (["kubectl", "--tenant=a", "get", "pods", "-A"], ["kubectl", "--tenant=a"],
     ["get", "pods", "-A"]),
    (["kubectl", "--tenant", "a", "--", "--tenant", "b"], ["kubectl", "--tenant", "a"],
     ["--tenant", "b"]),
    (["ssh", "etcd-1", "ls", "-l"], ["ssh", "etcd-1"], ["ls", "-l"]),
    (["up", "-t", "x"], ["up", "-t", "x"], []),
])
def test_split_passthrough(argv: list[str], ours: list[str], rest: list[str]) -> None:
    assert cli.split_passthrough(argv) == (ours, rest)


def test_current_sandbox_is_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-cur"
    path = write_topology(doc)
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(tmp_path))
    sb = context.Sandbox(topology.load(path), "vagrant")
    context.remember(sb)
    args = cli.build_parser().parse_args(["status"])
    again = context.resolve(args)
    assert again.topo.path == path.resolve()
    assert again.backend == "vagrant"
    assert context.resolve(cli.build_parser().parse_args(["status", "-b", "podman"])).backend \
        == "podman"


def test_repo_root_matches() -> None:
    assert topology.REPO_ROOT == REPO_ROOT


def test_status_health_port_follows_the_topology(tmp_path: Path) -> None:
    import yaml
    from sandboxlib import etcdhttp

    data = base_topology()
    data["nodes"].append({"name": "e2", "groups": ["etcd"], "host": 12,
                          "vars": {"etcd_metrics_port": 12381}})
    data["nodes"].append({"name": "e3", "groups": ["etcd"], "host": 13,
                          "vars": {"etcd_metrics_port": "{{ some_var }}"}})
    path = tmp_path / "t.yml"
    path.write_text(yaml.safe_dump(data))
    topo = topology.load(str(path))
    assert [etcdhttp.metrics_port(topo, topo.node(n)) for n in ("e1", "e2", "e3")] == [
        etcdhttp.METRICS_PORT, 12381, 0]
    data["vars"] = {"etcd_metrics_port": 0}
    path.write_text(yaml.safe_dump(data))
    assert etcdhttp.metrics_port(topology.load(str(path)), topo.node("e1")) == 0


def test_status_health_of_a_port_nobody_listens_on_is_unknown() -> None:
    import socket

    from sandboxlib import etcdhttp

    with socket.socket() as s:   # a loopback port that was free a moment ago: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert etcdhttp.http_health("127.0.0.1", port, timeout=2) == ""
    assert etcdhttp.http_health("127.0.0.1", 0) == ""


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`scripts/sandbox status | head`: the reader is gone before the table is written; the
    command ends with 141 (a writer's SIGPIPE) and no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run([str(SCRIPTS / "sandbox"), "status"], cwd=REPO_ROOT, stdout=write_end,
                             stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                             env=dict(os.environ, SANDBOX_STATE_DIR=str(tmp_path)))
    finally:
        os.close(write_end)
    assert res.returncode == 141, res.stderr
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr



@pytest.mark.parametrize(("setting", "message"), [
    ("etcd_rbac=maybe", "--set etcd_rbac=maybe: etcd_rbac must be a bool (true or false), not 'maybe'"),
    ("bogus_var=1", ("--set bogus_var=1: no role or playbook takes 'bogus_var'; the variables are "
                    "listed in roles/*/README.md (or pass it with --set-unchecked)")),
    ("etcd_verison=3.5.1", "no role or playbook takes 'etcd_verison'; did you mean etcd_version"),
    ("etcd_rbac_keep_users=x", "etcd_rbac_keep_users must be a list"),
    # checked by playbooks/validate.yml, run before the nodes exist
    ("etcd_version=banana", ("etcd_version: 'banana' is not a release version such as 3.6.14 "
                            "(no leading v); nothing was changed")),
    ("etcd_client_port=abc", ("argument 'etcd_client_port' is of type str and we were unable to "
                             "convert to int")),
    # shapes and ranges (plugins/filter/sandbox_inputs.py), before validate_argument_spec,
    # which would take a list for a str as "a,b"
    ("etcd_data_dir=[a, b]", ("etcd_data_dir: a list (['a', 'b']) where one path value is "
                              "expected (it would be used as 'a,b'); give a single value")),
    ("etcd_package_version=[1,2]", "etcd_package_version: a list ([1, 2]) where one str value"),
    ("etcd_data_dir=var/lib/etcd", "etcd_data_dir: 'var/lib/etcd' is not an absolute path"),
    ("etcd_quota_backend_bytes=-5", ("etcd_quota_backend_bytes: -5 is out of range; give a value "
                                     "from 1 to 8589934592 (etcd's backend quota")),
    ("etcd_quota_backend_bytes=8589934593", ("etcd_quota_backend_bytes: 8589934593 is out of "
                                             "range; give a value from 1 to 8589934592")),
    ("etcd_client_port=70000", "etcd_client_port: 70000 is out of range; give a value from 1 to 65535"),
    ("k0s_spec_extra=[1]", "k0s_spec_extra: a list ([1]) where a mapping is expected"),
], ids=["bool", "unknown", "typo", "list", "version", "int", "list-for-path", "list-for-str",
        "relative-path", "negative-quota", "quota-above-8gib", "port-range", "list-for-dict"])
def test_bad_set_refused_before_anything_exists(
        tmp_path: Path, write_topology: Callable[..., Path], setting: str, message: str) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-set"
    res = run_sandbox(["up", "--topology", str(write_topology(doc)), "--apiserver", "off",
                       "--set", setting], tmp_path, timeout=120)
    _bad_input_changed_nothing(res, tmp_path, "t-cli-set")
    assert message in res.stderr


def test_missing_k0s_binary_refused_before_anything_exists(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    """K0S_BINARY naming no file is refused by the validate phase, before any node."""
    doc = base_topology()
    doc["name"] = "t-cli-k0sbin"
    res = run_sandbox(["up", "--topology", str(write_topology(doc)), "--apiserver", "off"],
                      tmp_path, timeout=120, env={"K0S_BINARY": str(tmp_path / "no-such-k0s")})
    _bad_input_changed_nothing(res, tmp_path, "t-cli-k0sbin")
    assert (f"K0S_BINARY / k0s_binary: '{tmp_path / 'no-such-k0s'}' is not a file on the control "
            "node") in res.stderr


def test_subnet_of_another_podman_network_refused(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    if shutil.which("podman") is None:
        pytest.skip("podman not installed: the subnet check asks podman for its networks")
    other = "k0sbox-t-cli-other-net"
    subprocess.run(["podman", "network", "rm", "-f", other], capture_output=True, check=False)
    subprocess.run(["podman", "network", "create", "--subnet", "10.213.52.0/24", other],
                   capture_output=True, check=True)
    try:
        doc = base_topology()
        doc["name"] = "t-cli-net"
        doc["networks"]["podman"] = "10.213.52.0/24"
        res = run_sandbox(["up", "--topology", str(write_topology(doc))], tmp_path)
    finally:
        subprocess.run(["podman", "network", "rm", "-f", other], capture_output=True, check=False)
    _bad_input_changed_nothing(res, tmp_path, "t-cli-net")
    assert (f"networks.podman: 10.213.52.0/24 overlaps podman network '{other}' (10.213.52.0/24)"
            in res.stderr)


def test_a_same_named_sandbox_of_another_state_dir_is_left_alone(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    """A second checkout (or copy of the topology) with the same name must not take down or
    reconfigure the running sandbox: its nodes carry the state directory that made them."""
    if shutil.which("podman") is None:
        pytest.skip("podman not installed: ownership is read from the nodes' podman labels")
    image = subprocess.run([str(SCRIPTS / "build-image"), "--print-tag"], capture_output=True,
                           text=True, check=True).stdout.strip()
    if subprocess.run(["podman", "image", "exists", image], check=False).returncode != 0:
        pytest.skip(f"node image {image} not built yet: run scripts/build-image")
    doc = base_topology()
    doc["name"] = "t-cli-own"
    path = str(write_topology(doc))
    node = "k0sbox-t-cli-own-e1"
    subprocess.run(["podman", "rm", "-f", node], capture_output=True, check=False)
    subprocess.run(["podman", "create", "--name", node, "--label", "k0s-etcd-sandbox=t-cli-own",
                    "--label", "k0s-etcd-sandbox.state=/elsewhere/t-cli-own", image, "/sbin/init"],
                   capture_output=True, check=True)
    try:
        for command in (["up"], ["down"], ["verify"], ["backup"]):
            res = run_sandbox([*command, "-t", path], tmp_path)
            assert res.returncode == 2, (command, res.stdout, res.stderr)
            assert (f"sandbox 't-cli-own' (node {node}) belongs to the state directory "
                    f"/elsewhere/t-cli-own, not {tmp_path.resolve() / 't-cli-own'}") in res.stderr
            assert not (tmp_path / "t-cli-own").exists()
        assert subprocess.run(["podman", "container", "exists", node], check=False).returncode == 0
    finally:
        subprocess.run(["podman", "rm", "-f", node], capture_output=True, check=False)


def test_a_same_named_network_of_another_state_dir_is_left_alone(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    """The network carries the owner label too: with no node left, another state directory's
    network of the same name still refuses `up` and `down` (which would reuse or remove it)."""
    if shutil.which("podman") is None:
        pytest.skip("podman not installed: ownership is read from the network's podman labels")
    doc = base_topology()
    doc["name"] = "t-cli-ownnet"
    doc["networks"] = {"podman": "10.213.53.0/24"}
    path = str(write_topology(doc))
    net = "k0sbox-t-cli-ownnet"
    subprocess.run(["podman", "network", "rm", "-f", net], capture_output=True, check=False)
    subprocess.run(["podman", "network", "create", "--subnet", "10.213.53.0/24",
                    "--label", "k0s-etcd-sandbox=t-cli-ownnet",
                    "--label", "k0s-etcd-sandbox.state=/elsewhere/t-cli-ownnet", net],
                   capture_output=True, check=True)
    try:
        for command in (["up"], ["down"]):
            res = run_sandbox([*command, "-t", path], tmp_path)
            assert res.returncode == 2, (command, res.stdout, res.stderr)
            assert (f"sandbox 't-cli-ownnet' (network {net}) belongs to the state directory "
                    f"/elsewhere/t-cli-ownnet, not {tmp_path.resolve() / 't-cli-ownnet'}"
                    ) in res.stderr
            assert not (tmp_path / "t-cli-ownnet").exists()
        assert subprocess.run(["podman", "network", "exists", net], check=False).returncode == 0
    finally:
        subprocess.run(["podman", "network", "rm", "-f", net], capture_output=True, check=False)
