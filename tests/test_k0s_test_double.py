"""The k0s test double (not k0s), tests/k0s-test-double: it says what it is, its
controller refuses to run outside the tests, and nothing but the Molecule scenarios uses it:
`scripts/sandbox up` (apiserver.k0s_source, the CLI's environment) and roles/k0s_controller
refuse it wherever it comes from (K0S_BINARY, the cache, a download)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO_ROOT, base_topology, podman_objects, run_sandbox
from sandboxlib import apiserver, context, runner
from sandboxlib.progress import Screen
from sandboxlib.topology import load

DOUBLE = REPO_ROOT / "tests" / "k0s-test-double" / "k0s"
LABEL = "k0s test double (not k0s)"


def _double(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "K0S_TEST_DOUBLE_ALLOWED"}
    return subprocess.run([sys.executable, str(DOUBLE), *args], capture_output=True, text=True,
                          env={**full, **(env or {})}, timeout=30, check=False)


def test_version_says_it_is_the_double() -> None:
    res = _double("version")
    assert res.returncode == 0 and LABEL in res.stdout and "v1.36.3+k0s.2" in res.stdout


def test_controller_refuses_to_run_without_the_tests_variable() -> None:
    res = _double("controller", "--config=/nonexistent/k0s.yaml")
    assert res.returncode == 2
    assert res.stderr.startswith(f"Error: {LABEL}: refusing to run a controller: "
                                 "K0S_TEST_DOUBLE_ALLOWED=1 is not set"), res.stderr
    res = _double("controller", "--config=/nonexistent/k0s.yaml",
                  env={"K0S_TEST_DOUBLE_ALLOWED": "yes"})
    assert res.returncode == 2, "only the exact value 1 grants it"


def test_unknown_flags_and_commands_are_refused() -> None:
    assert _double("install", "controller", "--no-such-flag").returncode == 1
    res = _double("no-such-command")
    assert res.returncode == 1 and "unknown command" in res.stderr


def test_every_behaviour_cites_k0s_or_the_reference_facts() -> None:
    """Each command and controller step of the double says where in k0s it comes from."""
    sources = [DOUBLE, *DOUBLE.parent.glob("*.py")]
    text = "\n".join(p.read_text() for p in sources)
    for citation in ("cmd/controller/controller.go:463-477", "controller.go:751-762",
                     "pkg/certificate/manager.go:56-62", "controller.go:227-237, 784-811",
                     "cmd/install/util.go:184-214", "apiserver.go:140-145, 218-238",
                     "apiserver.go:329-355", "pkg/supervisor/detachattr_unix.go",
                     "pkg/cleanup/users_linux.go", "pkg/apis/k0s/v1beta1/api.go:70-78",
                     "cmd/token/create.go:23-96", "pkg/config/cli.go:324-333",
                     "pkg/token/manager.go:145-151", "cmd/token/list.go:20-95",
                     "cmd/kubeconfig/admin.go:20-84", "pkg/config/runtime.go:93-138",
                     "cmd/install/controller.go:48-55", "cmd/config/validate.go:20-71",
                     "pkg/install/users_linux.go:19-43", "pkg/cleanup/users_linux.go:22-29",
                     "apiserver.go:140-145, 218-222", "controller.go:793-805",
                     "retry.go:84-91", "pkg/supervisor/supervisor.go:206-207"):
        assert citation in text, citation
    assert all(LABEL in p.read_text() for p in sources)


# --- never used by scripts/sandbox up ---------------------------------------------------------

def test_k0s_source_never_picks_the_double_given_as_k0s_binary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K0S_BINARY", str(DOUBLE))
    monkeypatch.setenv("K0S_TEST_DOUBLE_ALLOWED", "1")  # the tests' variable changes nothing here
    with pytest.raises(context.UsageError, match=r"is the project's k0s test double \(not k0s\)"):
        apiserver.k0s_source(load("default"), {})
    with pytest.raises(context.UsageError, match="test double"):
        apiserver.k0s_source(load("default"), {"k0s_binary": str(DOUBLE)})


def test_k0s_source_never_picks_the_double_from_the_cache(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("K0S_BINARY", raising=False)
    shutil.copy(DOUBLE, tmp_path / "k0s-v1.36.3+k0s.2-amd64")
    monkeypatch.setattr(apiserver, "K0S_CACHE", tmp_path)
    with pytest.raises(context.UsageError, match="remove it"):
        apiserver.k0s_source(load("default"), {})
    (tmp_path / "k0s-v1.36.3+k0s.2-amd64").write_bytes(b"\x7fELF a k0s binary")
    assert apiserver.k0s_source(load("default"), {}).startswith("cached k0s ")


def test_the_cli_never_passes_the_tests_variable_to_ansible(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("K0S_TEST_DOUBLE_ALLOWED", "1")
    ctx = runner.RunContext(log_path=tmp_path / "log", progress_file=tmp_path / "p", t0=0.0,
                            screen=Screen(io.StringIO(), tty=False))
    assert "K0S_TEST_DOUBLE_ALLOWED" not in ctx.env("podman")


def test_up_refuses_the_double_before_anything_exists(
        tmp_path: Path, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["name"] = "t-cli-double"
    res = run_sandbox(["up", "--topology", str(write_topology(doc)), "--apiserver", "off"],
                      tmp_path, timeout=120,
                      env={"K0S_BINARY": str(DOUBLE), "K0S_TEST_DOUBLE_ALLOWED": "1"})
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"K0S_BINARY / k0s_binary: {DOUBLE} is the project's k0s test double" in res.stderr
    assert not (tmp_path / "t-cli-double").exists()
    assert podman_objects("t-cli-double") == []


# --- the role refuses it wherever it comes from, and labels it where the tests allow it -----

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: k0sbox.external_etcd.k0s_controller
        tasks_from: binary
      vars:
        k0s_probe: {arch: x86_64}
        k0s_binary: ""
        k0s_cache_dir: CACHE
    - ansible.builtin.debug:
        msg: "label={{ k0s_binary_label }}"
"""


@pytest.mark.parametrize("allowed", [False, True])
def test_role_refuses_a_cached_double_unless_the_tests_allow_it(tmp_path: Path,
                                                                allowed: bool) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(DOUBLE, cache / "k0s-v1.36.3+k0s.2-amd64")
    (tmp_path / "play.yml").write_text(PLAY.replace("CACHE", str(cache)))
    env = {k: v for k, v in os.environ.items() if k != "K0S_TEST_DOUBLE_ALLOWED"}
    env.update(ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    if allowed:
        env["K0S_TEST_DOUBLE_ALLOWED"] = "1"
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                          "localhost,", str(tmp_path / "play.yml")],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    output = " ".join((res.stdout + res.stderr).split())
    if allowed:
        assert res.returncode == 0, output
        assert f"label={LABEL}" in output
        assert f"{LABEL}: {cache / 'k0s-v1.36.3+k0s.2-amd64'} is installed as" in output
    else:
        assert res.returncode != 0
        assert f"{cache / 'k0s-v1.36.3+k0s.2-amd64'} is the project's k0s test double (not k0s)" \
            in output, output
