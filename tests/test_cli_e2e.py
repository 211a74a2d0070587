"""scripts/sandbox end to end on podman, on the shipped default topology (a copy named
e2e-default on its own subnet; its etcd and k0s downloads pointed at a closed loopback port
so that they fail on any host, as without github.com: conftest.shipped_copy), and
the documents' commands as typed: up -> its output and its quick check's report, then
every shell line of README.md and docs/cli.md and every line `up` printed under "Next:", in
order, from the repository root (tests/doc_commands.py; the lines that end the sandbox last).
Before the first typed `scripts/sandbox verify` line: the no-op check's drift test (each kind
of managed thing changed on a node behind the sandbox's back, and a --set value, then `up`
names each and converges them back), the day-2 commands whose output and hints a user
follows, on the sandbox a default `up` made (backup, restore, backup --tenant and restore
--tenant typed as its hint, defrag, add-members: 3 -> 5 members added to the same file),
every member's node killed at once then `up` passes; so the typed verify lines (up no longer
runs the full verify) check the sandbox all of that left, and their report must pass as on
every shipped topology. Then the lines that end the sandbox (`down`, with two members taken
out of the file first).

One home per behaviour (docs/testing.md): rotate-certs and rotate-ca are
etcd_rbac_rotation's (the playbooks under writing clients), the offline settings every day-2
command passes are tests/test_day2_offline.py's, as is rotate-ca's archive of the old CA;
an interrupted `up` is tests/test_interrupted_e2e.py's (Ctrl-C to a real `up`'s process
group: the message names the playbook it ended, no process left) and
tests/test_interrupted.py's (an earlier ignored download error never named instead).

The typed lines get the sandbox through the environment a user may set too
(SANDBOX_TOPOLOGY, SANDBOX_STATE_DIR), and a kubectl 1.36 on PATH (the one
scripts/build-apiserver builds) for the lines that call plain `kubectl`. README's second
`up` finds nothing to change after one check per node (fingerprint.py).

Also the default topology's whole-sandbox test (tests/test_topologies_e2e.py runs no-tls);
where no k0s binary is available the tenant's Kubernetes API is the CRD API server stand-in
(Kubernetes' code, not k0s). Skips (with the reason) where podman cannot run containers.
A stage of its own in scripts/test (`pytest cli-e2e`), beside the rest of pytest.
"""

from __future__ import annotations

import json
import os
import re
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
from doc_commands import Command, collect, in_order, next_lines

UP_TIMEOUT = 1800
DONE_RE = re.compile(r"^\s+\[\d+/\d+\] ([\w-]+) (?:done in \S+: (.*)|FAILED after .*)$",
                     re.MULTILINE)


NOTHING = re.compile(r"^sandbox: up '[\w-]+': nothing to change \(([\d.]+)s\): .* 4 nodes are as "
                     r"it left them \(\d+ files, \d+ services, \d+ users, \d+ packages; "
                     r"3 etcd members healthy\)$", re.MULTILINE)


def phase_results(out: str) -> dict[str, str]:
    """Each phase's end line (plain output: not a terminal) -> its detail."""
    return {m.group(1): m.group(2) or "FAILED" for m in DONE_RE.finditer(out)}


def host_kubectl(where: Path) -> Path:
    """A directory with `kubectl` (the build's 1.36.4) to put on PATH, as a user's own."""
    built = subprocess.run([str(REPO_ROOT / "scripts" / "build-apiserver"), "--print-dir"],
                           capture_output=True, text=True, check=True).stdout.strip()
    kubectl = Path(built) / "kubectl"
    if not kubectl.is_file():
        pytest.skip(f"kubectl not built ({kubectl}): run scripts/build-apiserver")
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "kubectl").unlink(missing_ok=True)
    (bin_dir / "kubectl").symlink_to(kubectl)
    return bin_dir


def run_typed(cmd: Command, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One documented line as a user types it in the repository root (bash, no stdin)."""
    return subprocess.run(["bash", "-c", cmd.line], cwd=REPO_ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=UP_TIMEOUT, check=False)


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
def test_up_then_every_documented_command(sandbox: tuple[Path, Path, dict]) -> None:
    path, state, data = sandbox
    name = data["name"]

    up = run_sandbox(["up", "--topology", str(path)], state, timeout=UP_TIMEOUT)
    assert up.returncode == 0, explain(up)
    out = up.stdout
    # Not a terminal: plain lines, no control characters; one start and one end per phase.
    assert "\x1b" not in out and "\r" not in out
    phases = re.findall(r"^==> \[\d+/\d+\] ([\w-]+): ", out, re.MULTILINE)
    # up ends with the quick check (ready.yml), not the full verify.yml
    assert phases[0] == "nodes" and phases[-2:] == ["ready", "record"], out
    assert "verify" not in phases, out
    done = phase_results(out)
    assert sorted(done) == sorted(phases), out
    assert "FAILED" not in done.values(), out
    assert "apt-get" not in out and "WARNING: Location" not in out
    log = re.search(r"full log: (\S+)", out)
    assert log, out
    assert Path(log.group(1)).parent == state / name / "logs"
    log_text = Path(log.group(1)).read_text()
    # nodes.yml, up.yml and, on a first up of a TLS sandbox, pki.yml beside nodes.yml: the
    # PKI is made once, while the nodes boot, and up.yml finds it current.
    assert log_text.count("PLAY RECAP") == 3, log_text[-2000:]
    assert "PKI on the control node done in" in out, out
    assert log_text.count("TASK [k0sbox.external_etcd.pki : Generate the CA key]") == 1, log_text[-2000:]
    assert (state / name / "logs" / "up.log").resolve() == Path(log.group(1))
    # offline: the etcd release and k0s could not be downloaded, and up said so once each
    assert out.count("! WARNING: etcd v") == 1 and out.count("! WARNING: k0s v") == 1, out
    # the summary table
    assert f"Sandbox '{name}' (podman;" in out
    for node, ip in (("etcd-1", 11), ("etcd-2", 12), ("etcd-3", 13)):
        assert re.search(rf"{node}\s+etcd\s+10\.213\.71\.{ip}\s+running", out), out
    assert re.search(r"k0s-1\s+k0s_controller\s+10\.213\.71\.21\s+running", out), out
    assert "TLS: on" in out
    assert "etcd: 3/3 members healthy (/health on port 2381)" in out, out
    kubeconfig = state / name / "kubeconfig" / "k0s-tenant.yaml"
    assert re.search(r"k0s-tenant\s+/k0s-tenant/\s+k0s-1\s+k0s-1: CRD API server "
                     r"\(stand-in, not k0s\): ready\s+\S+k0s-tenant\.yaml", out), out
    assert oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
    assert (state / name / "pki" / "ca.crt").is_file()
    # The quick check: every member healthy, the tenant's API ready, a write and a read
    # through it; then the line naming the full report, which up did not write.
    ready = json.loads((state / name / "ready.json").read_text())
    assert ready["passed"] is True and ready["scope"] == "ready", ready
    assert [c["name"] for c in ready["checks"]] == [
        "etcd: every member healthy (3)",
        "k0s-tenant: the CRD API server (stand-in, not k0s) ready (/readyz?exclude=informer-sync)",
        "k0s-tenant: a write and a read through its API",
        "k0s-tenant: usage under /k0s-tenant/"], ready
    assert re.search(r"^sandbox: quick check passed \(4 checks: .*\); the full report \(.*\): "
                     r"scripts/sandbox verify$", out, re.MULTILINE), out
    assert not (state / name / "verify.json").exists()

    # The documents' commands and up's "Next:" lines, as typed, in order.
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state), SANDBOX_TOPOLOGY=str(path),
               PATH=f"{host_kubectl(path.parent)}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("SANDBOX_BACKEND", None)
    typed = [c for c in collect() if not c.sandbox] + next_lines(out)
    assert len(next_lines(out)) >= 5, out
    ran: list[str] = []
    verified = 0
    day2_done = shrunk = False
    for cmd in in_order(typed):
        if cmd.skip:
            continue
        if (cmd.line.startswith("scripts/sandbox verify") or cmd.ends_sandbox) and not day2_done:
            # Before the first typed verify: drift, the day-2 commands, a power loss; the
            # typed verify lines then check the sandbox they left (one full verify each).
            drift_then_up(state, name)
            day2_commands(path, state, data)
            power_loss_then_up(state, data)
            day2_done = True
        if cmd.ends_sandbox and not shrunk:
            # etcd-4 and etcd-5 taken out of the file while they run: the documents' `down`
            # still removes them (by the sandbox's labels) and the network
            data["nodes"] = [n for n in data["nodes"] if n["name"] not in ("etcd-4", "etcd-5")]
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            shrunk = True
        res = run_typed(cmd, env)
        assert res.returncode == cmd.exit_code, f"{cmd.source}: {cmd.line}\n{explain(res)}"
        ran.append(cmd.line)
        if cmd.line.startswith("scripts/sandbox up "):   # the second up: nothing to change
            assert NOTHING.search(res.stdout) and phase_results(res.stdout) == {}, res.stdout
            print(f"e2e: a no-op up took {NOTHING.search(res.stdout).group(1)}s to check")
        if "etcdctl get --prefix --keys-only /k0s-tenant/" in cmd.line:
            assert "/k0s-tenant/example.sandbox/widgets/first" in res.stdout.split(), res.stdout
        if cmd.line.startswith("kubectl --kubeconfig"):
            assert "first" in res.stdout, explain(res)
        if cmd.line.startswith("scripts/sandbox verify"):
            # The full verify, as up's last line says, on the sandbox the day-2 commands and
            # the power loss left (5 members): the report the typed line wrote (what `verify
            # --json` prints), as for every shipped topology.
            report = state / name / "verify.json"
            check_verify_report(json.loads(report.read_text()), data, with_api=True)
            report.unlink()
            verified += 1
        if cmd.exit_code:
            assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, explain(res)
    assert any(line.startswith("scripts/sandbox up ") for line in ran)
    # docs/cli.md's `verify -v` and up's `scripts/sandbox verify`, after the day-2 commands
    assert verified >= 2, ran
    assert ran[-1].startswith("scripts/sandbox down") and day2_done and shrunk, ran

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


# Each kind of managed thing changed behind the sandbox's back: node -> (command, the reason
# `up` gives for it).
DRIFT = [
    ("etcd-1", "echo '# drift' >> /etc/etcd/etcd.env",
     "etcd-1: file /etc/etcd/etcd.env: content changed"),
    ("etcd-2", "chmod 0644 /etc/etcd/pki/member.key",
     "etcd-2: file /etc/etcd/pki/member.key: mode 600 -> 644"),
    ("etcd-3", "chown root:root /etc/etcd/pki/member.key",
     "etcd-3: file /etc/etcd/pki/member.key: owner etcd:etcd -> root:root"),
    ("etcd-3", "cp /etc/etcd/pki/admin.crt /etc/etcd/pki/member.crt",   # a certificate replaced
     "etcd-3: file /etc/etcd/pki/member.crt: content changed"),
    ("k0s-1", "systemctl stop crd-apiserver",
     "k0s-1: service crd-apiserver: active/enabled -> inactive/enabled"),
    ("k0s-1", "userdel kube-apiserver", "k0s-1: user kube-apiserver: removed"),
]
# What the drift touches, read before and after (files' checksum, mode, owner; the service;
# the user).
LOOK = {"etcd-1": "sha256sum /etc/etcd/etcd.env",
        "etcd-2": "stat -c '%a %U:%G' /etc/etcd/pki/member.key",
        "etcd-3": "stat -c '%a %U:%G' /etc/etcd/pki/member.key; sha256sum /etc/etcd/pki/member.crt",
        "k0s-1": "systemctl is-active crd-apiserver; getent passwd kube-apiserver | cut -d: -f1,6,7"}
PKI_RENEW = "--set=pki_renew_before_days=31"   # an input that changes no node
# A managed service running with what its role did not give it (issue 38): a systemd drop-in
# added by hand to a member's etcd unit, etcd restarted, so the running process has it.
DROPIN = "/etc/systemd/system/etcd.service.d/x.conf"
BY_HAND = (f"mkdir -p {Path(DROPIN).parent} && printf '[Service]\\nEnvironment=ETCD_ENABLE_PPROF=true\\n'"
           f" > {DROPIN} && systemctl daemon-reload && systemctl restart etcd")
# etcd's environment, read as its user (root in the container has no CAP_SYS_PTRACE)
ENVIRON = ("setpriv --reuid etcd --regid etcd --clear-groups "
           "cat /proc/$(systemctl show -p MainPID --value etcd)/environ | tr '\\0' '\\n'")


def drift_then_up(state: Path, name: str) -> None:
    """The no-op check never hides drift: each kind of managed thing changed on a node (a
    file's content, a mode, an owner, a certificate replaced, a stopped service, a removed
    user, a foreign drop-in in a member's etcd unit) and an input (--set); `verify` fails on
    the drop-in naming the member, the unit and its line; then `up` names every one and
    converges them back (the drop-in removed, with a warning, etcd restarted without it);
    the same `up` again finds nothing to change (the --set value is part of what it
    recorded). (The drop-in had a sandbox of its own before, test_drift_e2e: 100 s.)"""
    def look() -> dict[str, str]:
        out = {}
        for node, cmd in LOOK.items():
            res = run_sandbox(["ssh", node, cmd], state)
            out[node] = res.stdout
        return out

    def environ() -> list[str]:
        res = run_sandbox(["ssh", "etcd-2", ENVIRON], state)
        assert res.returncode == 0, explain(res)
        return res.stdout.split()

    before = look()
    # the drop-in first, alone: verify fails on it and on nothing else
    res = run_sandbox(["ssh", "etcd-2", BY_HAND], state)
    assert res.returncode == 0, explain(res)
    assert "ETCD_ENABLE_PPROF=true" in environ()
    verify = run_sandbox(["verify"], state, timeout=UP_TIMEOUT)
    assert verify.returncode != 0, explain(verify)
    report = state / name / "verify.json"
    failed = [c for c in json.loads(report.read_text())["checks"] if not c["ok"]]
    report.unlink()
    assert [c["name"].split(" runs ")[0] for c in failed] == ["etcd-2: etcd"], failed
    assert f"etcd.service: drop-in {DROPIN} is not the roles' " \
        "(Environment=ETCD_ENABLE_PPROF=true)" in failed[0]["detail"], failed
    # then every other kind of drift at once
    for node, cmd, _ in DRIFT:
        res = run_sandbox(["ssh", node, cmd], state)
        assert res.returncode == 0, explain(res)
    assert look() != before

    up = timed(["up", PKI_RENEW], state)
    assert f"WARNING: etcd-2: removed {DROPIN}, a drop-in no role wrote" in up.stdout, up.stdout
    log = re.search(r"full log: (\S+)", up.stdout)
    assert log, up.stdout
    why = [ln.removeprefix("# converging: ") for ln in Path(log.group(1)).read_text().splitlines()
           if ln.startswith("# converging: ")]
    assert "changed since the last converge: the variables (--set, --etcd-install, --apiserver, " \
        "K0S_BINARY)" in why, why
    assert [r for _, _, r in DRIFT if r not in why] == [], why
    assert [r for r in why if r.startswith(f"etcd-2: etcd.service: drop-in {DROPIN} is not the roles'")], why
    assert "converging" in up.stdout and phase_results(up.stdout), up.stdout
    assert look() == before
    gone = run_sandbox(["ssh", "etcd-2", f"test -e {DROPIN} && echo there || echo gone"], state)
    assert gone.stdout.strip() == "gone", explain(gone)
    assert not [v for v in environ() if v.startswith("ETCD_ENABLE_PPROF")]
    again = timed(["up", PKI_RENEW], state)
    found = NOTHING.search(again.stdout)
    assert found, again.stdout
    print(f"e2e: a no-op up after the drift took {found.group(1)}s to check")


def delete_crd(state: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl delete crd widgets.example.sandbox` as typed (kubectl waits until the API
    server's CRD finalizer has deleted the widgets and the CRD is gone). Once in CI
    (2026-12-04) it did not end in 120 s and never locally since: if it hangs again, the
    failure carries what the CRD's conditions, the API server's log and etcd said."""
    try:
        return run_sandbox(["kubectl", "delete", "crd", "widgets.example.sandbox"], state,
                           timeout=120)
    except subprocess.TimeoutExpired:
        seen = []
        for args in (["kubectl", "get", "crd", "widgets.example.sandbox", "-o", "yaml"],
                     ["kubectl", "get", "widgets", "-A", "-o", "yaml"],
                     ["etcdctl", "endpoint", "status", "--cluster", "-w", "table"],
                     ["ssh", "k0s-1", "journalctl -u crd-apiserver --no-pager -n 150"]):
            res = run_sandbox(args, state, timeout=60)
            seen.append(f"$ scripts/sandbox {' '.join(args)}\n{res.stdout}{res.stderr}")
        raise AssertionError("kubectl delete crd did not end in 120 s:\n" + "\n".join(seen))


def day2_commands(path: Path, state: Path, data: dict[str, Any]) -> None:
    """The day-2 commands whose output and hints a user follows, as typed, on the sandbox a
    default `up` made (no variable a scenario would add): backup's manifest, restore, backup
    --tenant's figures and the restore --tenant line it prints, defrag, add-members after the
    topology file grew. rotate-certs and rotate-ca are not run here: their playbooks are
    etcd_rbac_rotation's (under writing clients), the offline settings every day-2 command
    gives its playbooks (rotate-ca once stopped at the etcd download without them) and
    rotate-ca's archive of the old CA are tests/test_day2_offline.py's; status's usage row
    per tenant is k0s_tenants' (tenant-usage.yml, its key count exactly etcdctl's)."""
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

    gone = delete_crd(state)
    assert gone.returncode == 0, explain(gone)
    assert run_sandbox(widget, state).returncode != 0
    restored = timed(["restore", str(snap)], state)
    assert "etcd RBAC as the topology says" in restored.stdout, restored.stdout
    # the CRD and the widget are back, through the restarted API
    got = run_sandbox(widget, state, timeout=120)
    assert got.returncode == 0 and got.stdout == "blue", explain(got)

    # One tenant's copy, then its restore typed as the hint backup --tenant prints it.
    copied = timed(["backup", "--tenant", "k0s-tenant"], state)
    figures = re.search(r"\((\d+) keys, \d+ bytes under /k0s-tenant/ at revision \d+;",
                        copied.stdout)
    hint = re.search(r"restore it with: (scripts/sandbox restore --tenant k0s-tenant \S+)$",
                     copied.stdout, re.MULTILINE)
    assert figures and int(figures.group(1)) >= 2 and hint, copied.stdout  # the CRD, the widget
    gone = run_sandbox(["kubectl", "delete", "widget", "first"], state, timeout=120)
    assert gone.returncode == 0 and run_sandbox(widget, state).returncode != 0, explain(gone)
    t0 = time.time()
    back = subprocess.run(["bash", "-c", hint.group(1)], cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("SANDBOX_TOPOLOGY", "SANDBOX_BACKEND")}
                          | {"SANDBOX_STATE_DIR": str(state)}, text=True,
                          capture_output=True, timeout=UP_TIMEOUT, check=False)
    print(f"e2e: scripts/sandbox restore --tenant took {time.time() - t0:.0f}s")
    assert back.returncode == 0 and "tenant k0s-tenant restored in" in back.stdout, explain(back)
    got = run_sandbox(widget, state, timeout=120)
    assert got.returncode == 0 and got.stdout == "blue", explain(got)

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
    up = timed(["up", "-v"], state)   # -v: every task, to see the health wait ran
    assert "k0s_controller : Wait until every etcd endpoint of k0s.yaml answers healthy" \
        in up.stdout, up.stdout
    assert re.search(r"etcd: 5/5 members healthy", up.stdout), up.stdout
