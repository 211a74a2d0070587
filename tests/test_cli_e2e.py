"""scripts/sandbox end to end on podman: up -> status -> up again (no change) -> down.

Runs whatever phases playbooks/site.yml has; the checks that need etcd or k0s apply only
when those phases exist. Skips (with the reason) where podman cannot run containers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, podman_objects, run_sandbox

NAME = "t-cli"
TOPOLOGY = {
    "plugin": "sandbox_topology",
    "name": NAME,
    "description": "CLI end-to-end test: 1 etcd member + 1 controller",
    "tls": True,
    "networks": {"podman": "10.213.50.0/24"},
    "nodes": [
        {"name": "cli-etcd-1", "groups": ["etcd"], "host": 11},
        {"name": "cli-k0s-1", "groups": ["k0s_controller"], "host": 21},
    ],
    "tenants": [{"name": "cli-tenant", "prefix": "cli-tenant", "controllers": ["cli-k0s-1"]}],
    # Offline: Debian's etcd, and a closed loopback port for the k0s download.
    "vars": {"etcd_install_method": "package",
             "k0s_download_base_url": "http://127.0.0.1:9/k0s-releases"},
}
UP_TIMEOUT = 1800


def _podman_usable() -> str | None:
    podman = shutil.which("podman")
    if podman is None:
        return "podman is not installed"
    res = subprocess.run([podman, "info"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return f"podman does not work here: {' '.join(res.stderr.split())[:200]}"
    return None


def _phase(name: str) -> bool:
    return (REPO_ROOT / "playbooks" / f"{name}.yml").is_file() and f"{name}.yml" in (
        REPO_ROOT / "playbooks" / "site.yml").read_text()


def _explain(res: subprocess.CompletedProcess[str]) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n{res.stderr[-2000:]}"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    reason = _podman_usable()
    if reason:
        pytest.skip(f"CLI end-to-end test needs podman: {reason}")
    base = tmp_path_factory.mktemp("cli-e2e")
    state = base / "state"
    path = base / f"{NAME}.yml"
    path.write_text(yaml.safe_dump(TOPOLOGY, sort_keys=False))
    if podman_objects(NAME):  # left over from an interrupted run: start clean
        run_sandbox(["down", "--topology", str(path)], state, timeout=300)
    yield path, state
    res = run_sandbox(["down", "--purge", "--topology", str(path)], state, timeout=300)
    assert res.returncode == 0, _explain(res)


@pytest.mark.e2e
def test_up_status_down(sandbox: tuple[Path, Path]) -> None:
    path, state = sandbox

    up = run_sandbox(["up", "--topology", str(path)], state, timeout=UP_TIMEOUT)
    assert up.returncode == 0, _explain(up)
    out = up.stdout
    phases = re.findall(r"^==> \[\d+/\d+\] (\w+): ", out, re.MULTILINE)
    assert phases[0] == "nodes", out
    assert [p for p in phases if p != "nodes"], f"no play of site.yml reported:\n{out}"
    if _phase("pki"):
        assert "pki" in phases
    log = re.search(r"full log: (\S+)", out)
    assert log, out
    assert Path(log.group(1)).parent == state / NAME / "logs"
    assert Path(log.group(1)).read_text().count("PLAY RECAP") == 2  # nodes.yml, site.yml
    assert (state / NAME / "logs" / "up.log").resolve() == Path(log.group(1))
    # the summary table
    assert f"Sandbox '{NAME}' (podman;" in out
    assert re.search(r"cli-etcd-1\s+etcd\s+10\.213\.50\.11\s+running", out), out
    assert re.search(r"cli-k0s-1\s+k0s_controller\s+10\.213\.50\.21\s+running", out), out
    assert "TLS: on" in out
    assert re.search(r"cli-tenant\s+/cli-tenant/\s+cli-k0s-1", out), out
    assert "scripts/sandbox etcdctl member list -w table" in out
    if _phase("pki"):
        assert (state / NAME / "pki" / "ca.crt").is_file()
    if _phase("etcd"):
        assert "etcd: 1/1 members healthy" in out, out

    # later commands need no flags: the sandbox is remembered in <state>/current
    status = run_sandbox(["status"], state)
    assert status.returncode == 0, _explain(status)
    assert status.stdout.count("running") >= 2
    assert f"network k0sbox-{NAME}: present" in status.stdout

    ssh = run_sandbox(["ssh", "cli-etcd-1", "hostname"], state)
    assert ssh.returncode == 0 and ssh.stdout.strip() == "cli-etcd-1", _explain(ssh)
    if _phase("etcd"):
        members = run_sandbox(["etcdctl", "member", "list", "-w", "table"], state)
        assert members.returncode == 0, _explain(members)
        assert "cli-etcd-1" in members.stdout

    if _phase("apiserver"):
        # Where no k0s binary is available, the tenant's API is the CRD API server stand-in.
        assert re.search(r"cli-tenant\s+/cli-tenant/\s+cli-k0s-1\s+cli-k0s-1: CRD API server "
                         r"\(stand-in, not k0s\): ready", out), out
        examples = REPO_ROOT / "docs" / "examples"
        crd = run_sandbox(["kubectl", "apply", "-f", "-"], state,
                          stdin=(examples / "crd.yaml").read_text())
        assert crd.returncode == 0, _explain(crd)
        made = run_sandbox(["kubectl", "create", "-f", "-"], state,
                           stdin=(examples / "widget.yaml").read_text())
        assert made.returncode == 0 and "widget.example.sandbox/first created" in made.stdout, \
            _explain(made)
        got = run_sandbox(["kubectl", "--tenant", "cli-tenant", "get", "widget", "first", "-o",
                           "jsonpath={.spec.color}"], state)
        assert got.returncode == 0 and got.stdout == "blue", _explain(got)
        keys = run_sandbox(["etcdctl", "get", "--prefix", "--keys-only", "/cli-tenant/"], state)
        assert "/cli-tenant/example.sandbox/widgets/first" in keys.stdout.split(), _explain(keys)
        gone = run_sandbox(["kubectl", "delete", "crd", "widgets.example.sandbox"], state,
                           timeout=120)
        assert gone.returncode == 0, _explain(gone)

    # up again: nothing changes
    again = run_sandbox(["up"], state, timeout=UP_TIMEOUT)
    assert again.returncode == 0, _explain(again)
    done = re.findall(r"^\s+(\w+) done .*changed=(\d+) failed=(\d+)", again.stdout, re.MULTILINE)
    assert [p for p, _, _ in done] == ["nodes", "site"], again.stdout
    assert [(p, c) for p, c, _ in done if c != "0"] == [], again.stdout

    down = run_sandbox(["down"], state, timeout=300)
    assert down.returncode == 0, _explain(down)
    assert podman_objects(NAME) == []
    status = run_sandbox(["status"], state)
    assert status.returncode == 0 and status.stdout.count("not created") == 2
