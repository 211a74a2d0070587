"""The no-op check of `up` (scripts/sandboxlib/fingerprint.py, plugins/modules/
sandbox_fingerprint.py) without nodes: the module records through Ansible and its check finds
each kind of change on real files; the control node's digests change with each kind of input
(a topology field, a role default, a template, --set, a PKI file) and `up`'s check then names
it and converges. The drift on real nodes is tests/test_cli_e2e.py's (drift_then_up)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, base_topology, load_plugin, run_module
from sandboxlib import fingerprint, record
from sandboxlib.topology import load

module = load_plugin("plugins/modules/sandbox_fingerprint.py")


def node_check(record: Path) -> dict[str, Any]:
    """The check as `up` runs it on a node: the module's source on python3's stdin."""
    done = subprocess.run([sys.executable, "-", "--sandbox-check", str(record)],
                          input=(REPO_ROOT / "plugins/modules/sandbox_fingerprint.py").read_text(),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_record_through_ansible_then_each_change_is_found(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "app.conf"
    conf.parent.mkdir()
    conf.write_text("a=1\n")
    conf.chmod(0o640)
    key = tmp_path / "etc" / "app.key"
    key.write_text("secret\n")
    key.chmod(0o600)
    record = tmp_path / "state" / "converged.json"
    me = os.getuid()
    manages = [{"paths": [str(conf.parent), str(conf)]},
               {"paths": [str(key)], "users": ["root"], "packages": ["no-such-package-x"],
                "scripts": {"listing": f"ls {conf.parent}"}}]
    result, out = run_module("sandbox_fingerprint", {"path": str(record), "inputs": {"code": "1"},
                                                     "manages": manages})
    assert result.get("changed") is True, out
    assert result["counts"] == {"files": 3, "services": 0, "users": 1, "packages": 1,
                                "scripts": 1}, out
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert oct(record.parent.stat().st_mode & 0o777) == "0o700"
    again, out = run_module("sandbox_fingerprint", {"path": str(record),
                                                    "inputs": {"code": "1"}, "manages": manages})
    assert again.get("changed") is False, out          # a second converge changes nothing

    unchanged = node_check(record)
    assert unchanged["record"] and unchanged["differs"] == [] and unchanged["inputs"] == {"code": "1"}

    conf.write_text("a=2\n")                            # content
    key.chmod(0o644)                                    # mode
    (conf.parent / "new").write_text("x")               # the listing script's output
    found = node_check(record)["differs"]
    assert f"file {conf}: content changed" in found, found
    assert f"file {key}: mode 600 -> 644" in found, found
    assert "listing: its output changed" in found, found
    key.unlink()                                        # removed
    assert f"file {key}: removed" in node_check(record)["differs"]
    assert me == os.getuid()


def test_owner_user_service_and_package_changes_are_named() -> None:
    recorded = {"files": {"/x": "ab" * 32 + " 600:etcd:etcd"},
                "users": {"kube-apiserver": "999:996:/var/lib/k0s:/usr/sbin/nologin"},
                "services": {"etcd": "active/enabled"}, "packages": {"etcd-server": "3.5.30-2"}}
    now = {"files": {"/x": "ab" * 32 + " 600:root:root"}, "users": {"kube-apiserver": "absent"},
           "services": {"etcd": "inactive/enabled"}, "packages": {"etcd-server": "absent"}}
    assert module.differences(recorded, now) == [
        "user kube-apiserver: removed", "service etcd: active/enabled -> inactive/enabled",
        "package etcd-server: 3.5.30-2 -> absent", "file /x: owner etcd:etcd -> root:root"]
    assert module.users_state(["root", "no-such-user-x"]) == {
        "root": module.users_state(["root"])["root"], "no-such-user-x": "absent"}


def test_no_record_is_a_reason(tmp_path: Path) -> None:
    answer = node_check(tmp_path / "missing.json")
    assert answer["record"] is False and "no record" in answer["reason"]


@pytest.fixture
def sandbox_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path]:
    """A topology with its state dir, and the code trees copied to a root of their own."""
    root = tmp_path / "repo"
    for part in fingerprint.CODE:
        src = REPO_ROOT / part
        if src.is_dir():
            shutil.copytree(src, root / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copy2(src, root / part)
    monkeypatch.setattr(fingerprint, "REPO_ROOT", root)
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("K0S_BINARY", raising=False)
    data = base_topology()
    path = tmp_path / "topology.yml"
    path.write_text(json.dumps(data))
    topo = load(str(path))
    (topo.state_dir / "pki").mkdir(parents=True)
    (topo.state_dir / "pki" / "ca.key").write_text("key\n")
    return topo, root


def sealed_check(topo: Any, extra: dict[str, Any]) -> list[str]:
    """`up`'s check against the record of a converge with ``extra`` (before any node)."""
    given = fingerprint.inputs(topo, "podman", extra)
    fingerprint.seal(topo, given, extra)
    return fingerprint.check(topo, "podman", given, extra).reasons


@pytest.mark.parametrize("change, reason", [
    ("topology", "the topology"), ("role default", "roles/, playbooks/, plugins/"),
    ("template", "roles/, playbooks/, plugins/"), ("--set", "the variables"),
    ("pki", "the control node's PKI")])
def test_each_kind_of_input_makes_up_converge(sandbox_copy: tuple[Any, Path], change: str,
                                              reason: str) -> None:
    topo, root = sandbox_copy
    extra = {"k0s_binary_missing": "warn"}
    given = fingerprint.inputs(topo, "podman", extra)
    fingerprint.seal(topo, given, extra)
    if change == "topology":
        data = json.loads(topo.path.read_text())
        data["tenants"][0]["prefix"] = "ta-2"
        topo.path.write_text(json.dumps(data))
        topo = load(str(topo.path))
    elif change == "role default":
        defaults = root / "roles" / "etcd" / "defaults" / "main.yml"
        defaults.write_text(defaults.read_text().replace("etcd_user: etcd", "etcd_user: etcd2"))
    elif change == "template":
        template = next((root / "roles").glob("*/templates/*.j2"))
        template.write_text(template.read_text() + "# changed\n")
    elif change == "--set":
        extra = {**extra, "pki_renew_before_days": 31}
    else:
        (topo.state_dir / "pki" / "ca.key").write_text("another key\n")
    res = fingerprint.check(topo, "podman", fingerprint.inputs(topo, "podman", extra), extra)
    # the input first, then the nodes (this test made no containers)
    assert reason in res.reasons[0], res.reasons
    assert res.reasons[1:] == [f"{n.name}: container missing" for n in topo.nodes], res.reasons


def test_no_record_and_due_renewal_converge(sandbox_copy: tuple[Any, Path]) -> None:
    topo, _ = sandbox_copy
    given = fingerprint.inputs(topo, "podman", {})
    assert "no record of a finished converge" in fingerprint.check(topo, "podman", given,
                                                                   {}).reasons[0]
    fingerprint.seal(topo, given, {})
    sealed = json.loads(record.path(topo).read_text())
    sealed["renew_after"], sealed["renew_file"] = 0, "pki/members/e1.crt"
    record.path(topo).write_text(json.dumps(sealed))
    reasons = fingerprint.check(topo, "podman", given, {}).reasons
    assert reasons[0] == ("certificate pki/members/e1.crt is within pki_renew_before_days (30) "
                          "of its expiry: it is re-issued"), reasons
    record.forget(topo)
    assert not record.path(topo).exists()
    # the same inputs: on to the nodes, whose containers this test never made
    assert sealed_check(topo, {"x": 1}) == [f"{n.name}: container missing" for n in topo.nodes]


def test_a_vagrant_only_field_is_no_input(sandbox_copy: tuple[Any, Path]) -> None:
    topo, _ = sandbox_copy
    given = fingerprint.inputs(topo, "podman", {})
    data = json.loads(topo.path.read_text())
    data["nodes"][0]["memory"] = 1024      # Vagrant's VM size: nothing a podman node has
    topo.path.write_text(json.dumps(data))
    assert fingerprint.inputs(load(str(topo.path)), "podman", {}) == given


def test_a_service_is_compared_with_what_its_unit_gives_it(tmp_path: Path) -> None:
    """Issue 38: a drop-in no role wrote, or a process started with another environment or
    command line than its unit's, is named; the role's own drop-in, a package's, systemd's
    own variables and $VAR expansion (as in haproxy's ExecStart) are not drift."""
    env_file = tmp_path / "app.env"
    env_file.write_text("# settings\nAPP_A=1\nAPP_B=\"two\"\n")
    ours, theirs = tmp_path / "10-sandbox.conf", tmp_path / "x.conf"
    ours.write_text("[Service]\nBindReadOnlyPaths=\n")
    theirs.write_text("[Service]\n# by hand\nEnvironment=APP_PPROF=true\n")
    proc = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ["PATH"], "APP_A": "1",
                                                  "APP_B": "two", "DUR": "30",
                                                  "INVOCATION_ID": "x"})
    # Until the child has exec'ed sleep, its /proc environ is still this process's (a loaded
    # host showed it); a service's MainPID, which the module reads, has long since.
    deadline = time.monotonic() + 10
    while (Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep"
           and time.monotonic() < deadline):
        time.sleep(0.01)
    try:
        props = {"MainPID": [str(proc.pid)], "Environment": ['"DUR=30"'],
                 "EnvironmentFiles": [f"{env_file} (ignore_errors=no)"],
                 "ExecStart": ["{ path=/bin/sleep ; argv[]=sleep $DUR ; ignore_errors=no ; pid=1 }"],
                 "DropInPaths": [f"{ours} /usr/lib/systemd/system/app.service.d/pkg.conf"]}
        assert module.unit_drift("app", props, {str(ours)}, {"LANG": "C"}) == ([], [])

        props["DropInPaths"] = [f"{ours} {theirs}"]
        problems, foreign = module.unit_drift("app", props, {str(ours)}, {})
        assert foreign == [str(theirs)]
        assert problems == [(f"app.service: drop-in {theirs} is not the roles' "
                            "(Environment=APP_PPROF=true)")]

        env_file.write_text("APP_A=2\n")            # the unit changed, the process did not
        problems, _ = module.unit_drift("app", {**props, "DropInPaths": [""]}, set(), {})
        assert problems == [
            (f"app.service: its process {proc.pid} runs with APP_B=two, which its unit does not "
            "give (restart it)"),
            f"app.service: its process {proc.pid} runs with APP_A=1, its unit gives 2 (restart it)"]

        env_file.write_text("APP_A=1\nAPP_B=two\n")
        props.update(DropInPaths=[""], Environment=['"DUR=40"'])
        problems, _ = module.unit_drift("app", props, set(), {})
        assert problems == [
            f"app.service: its process {proc.pid} runs with DUR=30, its unit gives 40 (restart it)",
            f"app.service: its process {proc.pid} runs sleep 30, its unit starts sleep 40 (restart it)"]
        assert module._expand("haproxy -Ws -f $CONFIG $EXTRAOPTS -x ${SOCK}/m $NONE",
                              {"CONFIG": "/c", "EXTRAOPTS": "-S /s", "SOCK": "/run"}) == \
            ["haproxy", "-Ws", "-f", "/c", "-S", "/s", "-x", "/run/m"]
    finally:
        proc.kill()
        proc.wait()


def test_a_script_run_through_its_interpreter_is_what_its_unit_starts(tmp_path: Path) -> None:
    """A service whose ExecStart is a script (the k0s test double is a Python script) runs as
    `<interpreter> <script> args` (the kernel puts the #! interpreter first): not drift; other
    arguments are, and a binary's command line is still compared from its start."""
    script = tmp_path / "app"
    script.write_text("#!/bin/sh\nsleep \"$1\"\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "30"])
    try:
        props = {"MainPID": [str(proc.pid)], "DropInPaths": [""],
                 "ExecStart": [f"{{ path={script} ; argv[]={script} 30 ; ignore_errors=no ; pid=1 }}"]}
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1:2] != [str(script).encode()]:
            assert time.monotonic() < deadline, "the script never started"
            time.sleep(0.05)
        env = module.process_environ(proc.pid) or {}   # the environment is not what this test is about
        assert module.unit_drift("app", props, set(), env) == ([], [])
        props["ExecStart"] = [f"{{ path={script} ; argv[]={script} 40 ; ignore_errors=no ; pid=1 }}"]
        problems, _ = module.unit_drift("app", props, set(), env)
        assert [p for p in problems if "its unit starts" in p] == [
            f"app.service: its process {proc.pid} runs /bin/sh {script} 30, its unit starts {script} 40 (restart it)"]
        assert not module._started_as(["wrapper", "/bin/sleep", "30"], ["/bin/sleep", "30"])
    finally:
        proc.kill()
        proc.wait()
