"""The stdlib bootstrap of scripts/sandbox and scripts/test (no venv is created here)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from sandboxlib import bootstrap


@pytest.fixture(autouse=True)
def _own_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap's log (apt's and pip's output) in the test's directory."""
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(tmp_path / "state"))


def _no_subprocess(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"unexpected subprocess {args}")


def _fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    req = tmp_path / "requirements.txt"
    req.write_text("PyYAML==6.0.4\n")
    return venv, req


def test_existing_venv_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, _ = _fake_venv(tmp_path)
    monkeypatch.setattr(bootstrap.subprocess, "run", _no_subprocess)
    assert bootstrap.ensure_venv(venv) == venv / "bin" / "python"


def test_broken_venv_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    with pytest.raises(bootstrap.BootstrapError, match="has no bin/python; move it away"):
        bootstrap.ensure_venv(tmp_path / "venv")
    assert list((tmp_path / "venv").iterdir()) == []


def test_requirements_installed_when_the_stamp_differs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, req = _fake_venv(tmp_path)
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bootstrap.subprocess, "run", fake_run)
    bootstrap.ensure_requirements(venv, req)
    assert calls and calls[0][:4] == [str(venv / "bin" / "python"), "-m", "pip", "install"]
    assert calls[0][-2:] == ["-r", str(req)]
    assert (venv / bootstrap.STAMP_NAME).read_text().strip() == bootstrap.requirements_hash(req)
    # same requirements: nothing runs
    monkeypatch.setattr(bootstrap.subprocess, "run", _no_subprocess)
    bootstrap.ensure_requirements(venv, req)
    # changed requirements: pip again
    req.write_text("PyYAML==6.0.4\nJinja2==3.1.6\n")
    calls.clear()
    monkeypatch.setattr(bootstrap.subprocess, "run", fake_run)
    bootstrap.ensure_requirements(venv, req)
    assert len(calls) == 1


def test_pip_failure_keeps_the_old_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, req = _fake_venv(tmp_path)
    monkeypatch.setattr(bootstrap.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(bootstrap.BootstrapError, match="pip install -r requirements.txt failed"):
        bootstrap.ensure_requirements(venv, req)
    assert not (venv / bootstrap.STAMP_NAME).exists()


def test_non_root_debian_gets_one_message(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bootstrap, "is_debian", lambda: True)
    monkeypatch.setattr(bootstrap, "is_root", lambda: False)
    monkeypatch.setattr(bootstrap, "missing_debian_packages", lambda pkgs: ["podman", "runc"])
    monkeypatch.setattr(bootstrap, "apt_install", _no_subprocess)
    assert bootstrap.ensure_system_packages() == ["podman", "runc"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [("bootstrap: missing system packages: podman runc; install them as root: "
                    "sudo apt-get install -y podman runc")]


def test_non_debian_host_lists_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bootstrap, "is_debian", lambda: False)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda cmd: None)
    assert bootstrap.ensure_system_packages() == list(bootstrap.SYSTEM_COMMANDS)
    err = capsys.readouterr().err
    assert "not a Debian host" in err and "podman" in err and "mmdebstrap" in err


def test_root_debian_installs_only_the_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [["uidmap"], []]
    installed: list[list[str]] = []
    monkeypatch.setattr(bootstrap, "is_debian", lambda: True)
    monkeypatch.setattr(bootstrap, "is_root", lambda: True)
    monkeypatch.setattr(bootstrap, "missing_debian_packages", lambda pkgs: missing.pop(0))
    monkeypatch.setattr(bootstrap, "apt_install", installed.append)
    assert bootstrap.ensure_system_packages() == []
    assert installed == [["uidmap"]]


@pytest.mark.skipif(not bootstrap.is_debian(), reason="needs dpkg (Debian host)")
def test_dpkg_query_sees_installed_and_absent_packages() -> None:
    assert bootstrap.missing_debian_packages(("dpkg", "t-no-such-package")) == [
        "t-no-such-package"]


def test_pip_output_goes_to_the_log_and_its_tail_is_shown_on_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    venv, req = _fake_venv(tmp_path)

    def noisy_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        out = kwargs["stdout"]
        for i in range(40):
            out.write(f"WARNING: Location 'file:///x/{i}/' is ignored\n")
        out.write("ERROR: No matching distribution found for PyYAML==6.0.4\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(bootstrap.subprocess, "run", noisy_pip)
    with pytest.raises(bootstrap.BootstrapError):
        bootstrap.ensure_requirements(venv, req)
    err = capsys.readouterr().err
    log = tmp_path / "state" / "bootstrap.log"
    assert log.read_text().count("is ignored") == 40
    # the terminal gets the step and the last lines of the log, not the whole output
    assert "bootstrap: Python packages" in err
    assert "ERROR: No matching distribution found" in err
    assert err.count("is ignored") < 15
    assert str(log) in err


def test_a_quiet_install_prints_one_line_per_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    venv, req = _fake_venv(tmp_path)

    def pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        kwargs["stdout"].write("Collecting PyYAML\n" * 30)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bootstrap.subprocess, "run", pip)
    bootstrap.ensure_requirements(venv, req)
    lines = capsys.readouterr().err.splitlines()
    # not a terminal: a start line and an end line, no control characters
    assert len(lines) == 2, lines
    assert lines[0].startswith("==> bootstrap: Python packages")
    assert lines[1].startswith("    bootstrap: Python packages done in")
    assert not any("\x1b" in ln or "\r" in ln for ln in lines)
