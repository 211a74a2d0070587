"""scripts/test's runner: the pool that runs heavy stages side by side, its order, its plan."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from sandboxlib import testrun


def _wait_for(path: Path) -> list[str]:
    """A stage that ends only once `path` exists (deadline 30 s), then says so."""
    return ["timeout", "30", "sh", "-c",
            f"while [ ! -e {path} ]; do sleep 0.05; done; echo saw {path.name}"]


def test_pool_runs_two_stages_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "waits" can only end if "creates" runs while it is still running; it ends once "creates"
    # has ended and been reaped (its PID, written to the flag, gone), so the order is known.
    flag = tmp_path / "flag"
    stages = [("waits", ["timeout", "30", "sh", "-c",
                         (f"while [ ! -s {flag} ] || kill -0 $(cat {flag}) 2>/dev/null; "
                          "do sleep 0.05; done; echo saw flag")]),
              ("creates", ["sh", "-c", f"echo making; echo $$ > {flag}.new; mv {flag}.new {flag}"])]
    outcomes = testrun.run_pool(stages, jobs=2, first_index=1, total=2)
    assert {o.name: o.ok for o in outcomes} == {"waits": True, "creates": True}
    out = capsys.readouterr().out
    # Each stage's output is printed whole under its own header, in the order they ended.
    assert out.index("=== creates: output\nmaking\n") < out.index("=== waits: output\nsaw flag\n")
    assert "=== waits: passed in" in out


def test_pool_of_one_runs_stages_one_after_the_other(tmp_path: Path) -> None:
    # With one lane "waits" runs alone first and cannot see the flag: it times out (exit 124).
    stages = [("waits", ["timeout", "1", "sh", "-c",
                         f"while [ ! -e {tmp_path / 'flag'} ]; do sleep 0.05; done"]),
              ("creates", ["touch", str(tmp_path / "flag")])]
    outcomes = testrun.run_pool(stages, jobs=1, first_index=1, total=2)
    assert [(o.name, o.ok, o.detail) for o in outcomes] == [
        ("waits", False, "exit 124"), ("creates", True, "")]


def test_pool_reports_a_missing_tool_and_a_failure() -> None:
    outcomes = testrun.run_pool([("gone", ["no-such-tool-here"]), ("fails", ["false"])],
                                jobs=2, first_index=1, total=2)
    assert {o.name: o.detail for o in outcomes} == {
        "gone": "no-such-tool-here not found", "fails": "exit 1"}


def test_longest_first_uses_the_measured_times() -> None:
    stages = [(n, ["true"]) for n in ("molecule lb", "unknown", "molecule crd_apiserver")]
    assert [n for n, _ in testrun.longest_first(stages)] == [
        "molecule crd_apiserver", "unknown", "molecule lb"]


def _args(*argv: str) -> argparse.Namespace:
    return testrun.parse_args(list(argv))


def test_plan_full_quick_and_one_scenario() -> None:
    known = ["etcd", "lb"]
    serial, heavy = testrun.plan(_args(), known)
    assert [n for n, _ in serial][-2:] == ["build-apiserver", "build-image"]
    assert "ansible-lint" not in dict(serial)
    assert sorted(n for n, _ in heavy) == ["ansible-lint", "ansible-test sanity", "molecule etcd",
                                           "molecule lb", "pytest", "pytest attack-e2e",
                                           "pytest cli-e2e", "pytest collection-e2e",
                                           "pytest e2e", "pytest vagrant-e2e"]
    # every test in exactly one stage: the pytest stage's and "pytest e2e"'s marks are each
    # other's complement, with the same files left to their own stages
    plain, e2e = dict(heavy)["pytest"], dict(heavy)["pytest e2e"]
    assert plain[plain.index("-m") + 1] == "not e2e" and e2e[e2e.index("-m") + 1] == "e2e"
    assert [a for a in plain if a.startswith("--ignore")] == [a for a in e2e if a.startswith("--ignore")]
    # the collection's and the CLI's e2e are stages of their own, not also in the pytest stage
    assert testrun.COLLECTION_E2E in " ".join(dict(heavy)["pytest"])
    assert f"--ignore={testrun.CLI_E2E}" in dict(heavy)["pytest"]
    assert dict(heavy)["pytest cli-e2e"][1] == testrun.CLI_E2E
    serial, heavy = testrun.plan(_args("--quick"), known)
    assert "build-image" not in dict(serial) and "pytest" not in dict(serial)
    assert sorted(n for n, _ in heavy) == ["ansible-lint", "ansible-test sanity", "pytest"]
    quick = dict(heavy)["pytest"]   # no podman node, on two workers
    assert quick[quick.index("-m") + 1] == "not e2e" and quick[quick.index("-n") + 1] == "2"
    serial, heavy = testrun.plan(_args("-s", "lb"), known)
    assert [n for n, _ in serial] == ["build-image"] and [n for n, _ in heavy] == ["molecule lb"]


def test_jobs_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _args("--jobs", "0")
    assert "--jobs: must be 1 or more, not 0" in capsys.readouterr().err


def test_serial_stages_report_exit_codes_and_wait_for_a_background_start(
        capsys: pytest.CaptureFixture[str]) -> None:
    early = testrun.Background(["sh", "-c", "echo built early"])
    outcomes = [testrun.run_stage(1, 3, "ok", ["true"]),
                testrun.run_stage(2, 3, "bad", ["false"]),
                testrun.run_stage(3, 3, "early", ["unused"], early)]
    assert [(o.name, o.ok, o.detail) for o in outcomes] == [
        ("ok", True, ""), ("bad", False, "exit 1"), ("early", True, "")]
    out = capsys.readouterr().out
    assert "=== bad: FAILED (exit 1) in" in out and "built early\n" in out


ANSIBLE_FAILURE = """\
TASK [etcd : Wait for health] **************************************************
fatal: [m1]: FAILED! => {"changed": false, "msg": "ignored one"}
...ignoring

TASK [Check every acknowledged write is there] *********************************
ok: [m1]

TASK [Check the cluster's version] *********************************************
fatal: [m2]: FAILED! => {"assertion": "v == '3.5.0'", "msg": "Assertion failed"}
PLAY RECAP *********************************************************************
CRITICAL Ansible return code was 2, command was: ansible-playbook verify.yml
"""


def test_why_failed_keeps_the_failed_task_and_the_verdict_not_an_ignored_failure() -> None:
    assert testrun.why_failed(ANSIBLE_FAILURE) == [
        "TASK [Check the cluster's version]",
        'fatal: [m2]: FAILED! => {"assertion": "v == \'3.5.0\'", "msg": "Assertion failed"}',
        "CRITICAL Ansible return code was 2, command was: ansible-playbook verify.yml"]
    long = "fatal: [m]: FAILED! => " + "x" * 2000
    assert testrun.why_failed(long) == [long[:testrun.WHY_WIDTH] + " [...]"]
    many = "\n".join(f"FAILED tests/t.py::test_{i} - AssertionError" for i in range(30))
    assert testrun.why_failed(many)[0] == "FAILED tests/t.py::test_18 - AssertionError"
    assert len(testrun.why_failed(many)) == testrun.WHY_LINES


def test_the_reasons_of_failed_stages_follow_the_summary(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "out.txt"
    log.write_text(ANSIBLE_FAILURE)
    outcomes = testrun.run_pool([("scenario", ["sh", "-c", f"cat {log}; exit 2"]),
                                 ("fine", ["sh", "-c", "echo fatal: [x]: FAILED! but passed"])],
                                jobs=2, first_index=1, total=2)
    assert {o.name: len(o.why) for o in outcomes} == {"scenario": 3, "fine": 0}
    fg = testrun.run_stage(3, 3, "foreground", ["sh", "-c", "echo 'Error: no such thing'; false"])
    assert fg.why == ["Error: no such thing"]
    assert "Error: no such thing\n" in capsys.readouterr().out   # streamed as well
    assert testrun.summary([*outcomes, fg], 9.0, 2) == 1
    out = capsys.readouterr().out
    assert out.index("=== summary") < out.index("=== why scenario failed") < out.index(
        "  TASK [Check the cluster's version]\n") < out.index("=== why foreground failed") < \
        out.index("2 failed in 9s")
    assert "why fine" not in out
