"""scripts/sandbox end to end on podman, on the shipped default topology (a copy named
e2e-default on its own subnet; nothing else changed: `up` itself falls back offline), and
the documents' commands as typed: up -> its output and verify's report -> every shell line
of README.md and docs/cli.md and every line `up` printed under "Next:", in order, from the
repository root (tests/doc_commands.py; the lines that end the sandbox last) -> down.

The typed lines get the sandbox through the environment a user may set too
(SANDBOX_TOPOLOGY, SANDBOX_STATE_DIR), and a kubectl 1.36 on PATH (the one
scripts/build-apiserver builds) for the lines that call plain `kubectl`. README's second
`up` is the idempotence check: it must change nothing.

Also the default topology's whole-sandbox test (tests/test_topologies_e2e.py runs no-tls);
where no k0s binary is available the tenant's Kubernetes API is the CRD API server stand-in
(Kubernetes' code, not k0s). Skips (with the reason) where podman cannot run containers.
"""

from __future__ import annotations

import json
import os
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
from doc_commands import Command, collect, in_order, next_lines

UP_TIMEOUT = 1800
DONE_RE = re.compile(r"^\s+\[\d+/\d+\] ([\w-]+) (?:done in \S+: (.*)|FAILED after .*)$",
                     re.MULTILINE)


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
    name, path, data = shipped_copy("default", base, offline=False)
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
    assert phases[0] == "nodes" and "verify" in phases, out
    done = phase_results(out)
    assert sorted(done) == sorted(phases), out
    assert "FAILED" not in done.values(), out
    assert "apt-get" not in out and "WARNING: Location" not in out
    log = re.search(r"full log: (\S+)", out)
    assert log, out
    assert Path(log.group(1)).parent == state / name / "logs"
    log_text = Path(log.group(1)).read_text()
    # nodes.yml, site.yml and, on a first up of a TLS sandbox, pki.yml beside nodes.yml: the
    # PKI is made once, while the nodes boot, and site.yml finds it current.
    assert log_text.count("PLAY RECAP") == 3, log_text[-2000:]
    assert "PKI on the control node done in" in out, out
    assert log_text.count("TASK [pki : Generate the CA key]") == 1, log_text[-2000:]
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
    # verify.yml ran at the end of site.yml: its report, as for every shipped topology
    check_verify_report(json.loads((state / name / "verify.json").read_text()), data,
                        with_api=True)

    # The documents' commands and up's "Next:" lines, as typed, in order.
    env = dict(os.environ, SANDBOX_STATE_DIR=str(state), SANDBOX_TOPOLOGY=str(path),
               PATH=f"{host_kubectl(path.parent)}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("SANDBOX_BACKEND", None)
    typed = [c for c in collect() if not c.sandbox] + next_lines(out)
    assert len(next_lines(out)) >= 5, out
    ran: list[str] = []
    for cmd in in_order(typed):
        if cmd.skip:
            continue
        res = run_typed(cmd, env)
        assert res.returncode == cmd.exit_code, f"{cmd.source}: {cmd.line}\n{explain(res)}"
        ran.append(cmd.line)
        if cmd.line.startswith("scripts/sandbox up "):   # the second up changes nothing
            again = phase_results(res.stdout)
            assert again and all(d in ("nothing to do here", "FAILED") or
                                 d.endswith(" changed=0") for d in again.values()), res.stdout
            assert "FAILED" not in again.values(), res.stdout
            assert "beside the nodes" not in res.stdout, res.stdout
        if "etcdctl get --prefix --keys-only /k0s-tenant/" in cmd.line:
            assert "/k0s-tenant/example.sandbox/widgets/first" in res.stdout.split(), res.stdout
        if cmd.line.startswith("kubectl --kubeconfig"):
            assert "first" in res.stdout, explain(res)
        if cmd.exit_code:
            assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, explain(res)
    assert any(line.startswith("scripts/sandbox up ") for line in ran)
    assert ran[-1].startswith("scripts/sandbox down"), ran

    assert podman_objects(name) == []
    status = run_sandbox(["status"], state)
    assert status.returncode == 0 and status.stdout.count("not created") == 4
