"""scripts/sandbox end to end on podman, on the shipped default topology (a copy named
e2e-default on its own subnet, offline: conftest.shipped_copy; etcd's release download
fails and falls back to the package, as everywhere without github.com): up -> verify's
report -> status, ssh, etcdctl, kubectl -> every day-2 command once, as a user runs it on a
sandbox a default `up` made (backup, restore, rotate-certs, rotate-ca, defrag, add-members:
3 -> 5 members) -> every member's node killed at once, `up` passes -> verify -> an
interrupted up says so -> up again (no change) -> down -> down --purge.

Also the default topology's whole-sandbox test (tests/test_topologies_e2e.py runs the other
shipped topologies the same way): one sandbox, one cycle. Where no k0s binary is available the
tenant's Kubernetes API is the CRD API server stand-in (Kubernetes' code, not k0s). Skips (with
the reason) where podman cannot run containers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
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
    name, path, data = shipped_copy("default", base, release_fails=True)
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

    day2_commands(path, state, data)
    power_loss_then_up(state, data)

    # verify on demand, as JSON: the same report (moved here from the multi-tenant e2e)
    verify = run_sandbox(["verify", "--json"], state, timeout=UP_TIMEOUT)
    assert verify.returncode == 0, explain(verify)
    if _phase("etcd"):
        check_verify_report(json.loads(verify.stdout), data, with_api=_phase("apiserver"))

    interrupted_up_says_so(state)

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
    assert status.returncode == 0 and status.stdout.count("not created") == len(data["nodes"])


def timed(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    """A day-2 command as typed, asserted to pass; its seconds printed (pytest -s, the log)."""
    t0 = time.time()
    res = run_sandbox(args, state, timeout=UP_TIMEOUT)
    print(f"e2e: scripts/sandbox {' '.join(args[:1])} took {time.time() - t0:.0f}s")
    assert res.returncode == 0, explain(res)
    return res


def day2_commands(path: Path, state: Path, data: dict[str, Any]) -> None:
    """Every day-2 command of the CLI once, as a user types it, on the sandbox a default `up`
    made (no variable a scenario would add): they get up's offline settings (a failed etcd
    release download falls back to the package: rotate-ca once stopped there)."""
    name = data["name"]
    widget = ["kubectl", "get", "widget", "first", "-o", "jsonpath={.spec.color}"]
    backup = timed(["backup"], state)
    found = re.search(r"backup written in \d+s: (\S+)", backup.stdout)
    assert found, backup.stdout
    snap = Path(found.group(1))
    manifest = json.loads(snap.with_name(snap.name + ".manifest.json").read_text())
    assert manifest["sandbox"] == name and manifest["members"] == ["etcd-1", "etcd-2", "etcd-3"]
    assert manifest["tenants"][0]["prefix"] == "/k0s-tenant/"
    assert manifest["tenants"][0]["key_count"] >= 2, manifest   # the CRD and the widget

    if _phase("apiserver"):
        gone = run_sandbox(["kubectl", "delete", "crd", "widgets.example.sandbox"], state,
                           timeout=120)
        assert gone.returncode == 0, explain(gone)
        assert run_sandbox(widget, state).returncode != 0
    restored = timed(["restore", str(snap)], state)
    assert "etcd RBAC as the topology says" in restored.stdout, restored.stdout
    if _phase("apiserver"):  # the CRD and the widget are back, through the restarted API
        got = run_sandbox(widget, state, timeout=120)
        assert got.returncode == 0 and got.stdout == "blue", explain(got)
        gone = run_sandbox(["kubectl", "delete", "crd", "widgets.example.sandbox"], state,
                           timeout=120)
        assert gone.returncode == 0, explain(gone)

    timed(["rotate-certs"], state)
    rotated = timed(["rotate-ca"], state)
    assert "new etcd CA in use" in rotated.stdout, rotated.stdout
    assert len(list((state / name / "pki").glob("pre-ca-rotate-*"))) == 1
    timed(["defrag"], state)

    # Two more members in the topology (the same file), then add-members creates and joins them.
    data["nodes"][3:3] = [{"name": "etcd-4", "groups": ["etcd"], "host": 14},
                          {"name": "etcd-5", "groups": ["etcd"], "host": 15}]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    grown = timed(["add-members"], state)
    assert "5 members started, healthy, hashkv equal" in grown.stdout, grown.stdout
    members = run_sandbox(["etcdctl", "member", "list"], state)
    assert sorted(ln.split(", ")[2] for ln in members.stdout.splitlines() if ln) == \
        [f"etcd-{i}" for i in range(1, 6)], explain(members)


def power_loss_then_up(state: Path, data: dict[str, Any]) -> None:
    """Every member's node killed at once (SIGKILL, no shutdown: a power loss), then `up`:
    the nodes start again, etcd's health is awaited before the k0s preflight, it passes."""
    nodes = [f"k0sbox-{data['name']}-{n['name']}" for n in data["nodes"] if "etcd" in n["groups"]]
    killed = subprocess.run(["podman", "kill", *nodes], capture_output=True, text=True, check=False)
    assert killed.returncode == 0, killed.stderr
    up = timed(["up"], state)
    assert "k0s_controller : Wait until every etcd endpoint of k0s.yaml answers healthy" \
        in up.stdout, up.stdout
    assert re.search(r"etcd: 5/5 members healthy", up.stdout), up.stdout


def interrupted_up_says_so(state: Path) -> None:
    """Ctrl-C in an `up` after etcd's release download failed (an error the run ignores: it
    falls back to the package): SIGINT to the command's process group, as a terminal sends
    it, reaches the CLI and ansible-playbook. It says it was interrupted (the CLI, or the
    CLI naming the interrupted playbook), never that download error."""
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state))
    proc = subprocess.Popen([str(REPO_ROOT / "scripts" / "sandbox"), "up"], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "etcd : Keep the download error" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    assert any("etcd : Keep the download error" in ln for ln in seen), "".join(seen) + out
    assert proc.returncode in (1, 130), ("".join(seen) + out, err)
    assert err.strip() == "sandbox: interrupted" or \
        "playbooks/site.yml was interrupted (SIGINT, Ctrl-C) before it finished" in err, err
    assert "Request failed" not in err and "could not be" not in err, err
