"""scripts/sandbox end to end on podman, on the shipped default topology (a copy named
e2e-default on its own subnet, offline: conftest.shipped_copy): up -> verify's report ->
status, ssh, etcdctl, kubectl -> up again (no change) -> down -> down --purge.

Also the default topology's whole-sandbox test (tests/test_topologies_e2e.py runs the other
shipped topologies the same way): one sandbox, one cycle. Where no k0s binary is available the
tenant's Kubernetes API is the CRD API server stand-in (Kubernetes' code, not k0s). Skips (with
the reason) where podman cannot run containers.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    REPO_ROOT,
    check_verify_report,
    explain,
    podman_objects,
    podman_usable,
    run_sandbox,
    shipped_copy,
)

UP_TIMEOUT = 1800


def _phase(name: str) -> bool:
    return (REPO_ROOT / "playbooks" / f"{name}.yml").is_file() and f"{name}.yml" in (
        REPO_ROOT / "playbooks" / "site.yml").read_text()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict]]:
    reason = podman_usable()
    if reason:
        pytest.skip(f"CLI end-to-end test needs podman: {reason}")
    base = tmp_path_factory.mktemp("cli-e2e")
    state = base / "state"
    name, path, data = shipped_copy("default", base)
    if podman_objects(name):  # left over from an interrupted run: start clean
        run_sandbox(["down", "--topology", str(path)], state, timeout=300)
    yield path, state, data
    res = run_sandbox(["down", "--purge", "--topology", str(path)], state, timeout=300)
    assert res.returncode == 0, explain(res)
    assert podman_objects(name) == []
    net = subprocess.run(["podman", "network", "exists", f"k0sbox-{name}"], check=False)
    assert net.returncode != 0, f"network k0sbox-{name} left behind"


@pytest.mark.e2e
def test_up_status_down(sandbox: tuple[Path, Path, dict]) -> None:
    path, state, data = sandbox
    name = data["name"]

    up = run_sandbox(["up", "--topology", str(path)], state, timeout=UP_TIMEOUT)
    assert up.returncode == 0, explain(up)
    out = up.stdout
    phases = re.findall(r"^==> \[\d+/\d+\] (\w+): ", out, re.MULTILINE)
    assert phases[0] == "nodes", out
    assert [p for p in phases if p != "nodes"], f"no play of site.yml reported:\n{out}"
    if _phase("pki"):
        assert "pki" in phases
    log = re.search(r"full log: (\S+)", out)
    assert log, out
    assert Path(log.group(1)).parent == state / name / "logs"
    log_text = Path(log.group(1)).read_text()
    # nodes.yml, site.yml and, on a first up of a TLS sandbox, pki.yml beside nodes.yml: the
    # PKI is made once, while the nodes boot, and site.yml finds it current.
    tls = data.get("tls", True)
    assert log_text.count("PLAY RECAP") == (3 if tls else 2), log_text[-2000:]
    assert ("PKI made on the control node, beside the nodes" in out) == tls, out
    if tls:
        assert log_text.count("TASK [pki : Generate the CA key]") == 1, log_text[-2000:]
    assert (state / name / "logs" / "up.log").resolve() == Path(log.group(1))
    # the summary table
    assert f"Sandbox '{name}' (podman;" in out
    for node, ip in (("etcd-1", 11), ("etcd-2", 12), ("etcd-3", 13)):
        assert re.search(rf"{node}\s+etcd\s+10\.213\.71\.{ip}\s+running", out), out
    assert re.search(r"k0s-1\s+k0s_controller\s+10\.213\.71\.21\s+running", out), out
    assert "TLS: on" in out
    assert re.search(r"k0s-tenant\s+/k0s-tenant/\s+k0s-1", out), out
    assert "scripts/sandbox etcdctl member list -w table" in out
    if _phase("pki"):
        assert (state / name / "pki" / "ca.crt").is_file()
    if _phase("etcd"):
        assert "etcd: 3/3 members healthy (/health on port 2381)" in out, out
        # verify.yml ran at the end of site.yml: its report, as for every shipped topology
        check_verify_report(json.loads((state / name / "verify.json").read_text()), data,
                            with_api=_phase("apiserver"))

    # later commands need no flags: the sandbox is remembered in <state>/current
    status = run_sandbox(["status"], state)
    assert status.returncode == 0, explain(status)
    assert status.stdout.count("running") >= 4
    assert f"network k0sbox-{name}: present" in status.stdout

    ssh = run_sandbox(["ssh", "etcd-2", "hostname"], state)
    assert ssh.returncode == 0 and ssh.stdout.strip() == "etcd-2", explain(ssh)
    if _phase("etcd"):
        members = run_sandbox(["etcdctl", "member", "list", "-w", "table"], state)
        assert members.returncode == 0, explain(members)
        assert all(f"etcd-{i}" in members.stdout for i in (1, 2, 3)), members.stdout

    if _phase("apiserver"):
        # Where no k0s binary is available, the tenant's API is the CRD API server stand-in.
        assert re.search(r"k0s-tenant\s+/k0s-tenant/\s+k0s-1\s+k0s-1: CRD API server "
                         r"\(stand-in, not k0s\): ready", out), out
        examples = REPO_ROOT / "docs" / "examples"
        crd = run_sandbox(["kubectl", "apply", "-f", "-"], state,
                          stdin=(examples / "crd.yaml").read_text())
        assert crd.returncode == 0, explain(crd)
        made = run_sandbox(["kubectl", "create", "-f", "-"], state,
                           stdin=(examples / "widget.yaml").read_text())
        assert made.returncode == 0 and "widget.example.sandbox/first created" in made.stdout, \
            explain(made)
        got = run_sandbox(["kubectl", "--tenant", "k0s-tenant", "get", "widget", "first", "-o",
                           "jsonpath={.spec.color}"], state)
        assert got.returncode == 0 and got.stdout == "blue", explain(got)
        keys = run_sandbox(["etcdctl", "get", "--prefix", "--keys-only", "/k0s-tenant/"], state)
        assert "/k0s-tenant/example.sandbox/widgets/first" in keys.stdout.split(), explain(keys)
        gone = run_sandbox(["kubectl", "delete", "crd", "widgets.example.sandbox"], state,
                           timeout=120)
        assert gone.returncode == 0, explain(gone)

    # verify on demand, as JSON: the same report (moved here from the multi-tenant e2e)
    verify = run_sandbox(["verify", "--json"], state, timeout=UP_TIMEOUT)
    assert verify.returncode == 0, explain(verify)
    if _phase("etcd"):
        check_verify_report(json.loads(verify.stdout), data, with_api=_phase("apiserver"))

    # up again: nothing changes
    again = run_sandbox(["up"], state, timeout=UP_TIMEOUT)
    assert again.returncode == 0, explain(again)
    done = re.findall(r"^\s+(\w+) done .*changed=(\d+) failed=(\d+)", again.stdout, re.MULTILINE)
    assert [p for p, _, _ in done] == ["nodes", "site"], again.stdout
    assert [(p, c) for p, c, _ in done if c != "0"] == [], again.stdout
    assert "beside the nodes" not in again.stdout, again.stdout

    down = run_sandbox(["down"], state, timeout=300)
    assert down.returncode == 0, explain(down)
    assert podman_objects(name) == []
    status = run_sandbox(["status"], state)
    assert status.returncode == 0 and status.stdout.count("not created") == 4
