"""The k0s install plan (roles/k0s_controller tasks/plan.yml and filter k0s_install_plan):
which controller bootstraps a tenant, which join it with a token, which get their unit
rewritten (`k0s install controller --force`) because the install flags or the unit changed.

k0s itself cannot run here, so the install/start/join commands are not executed: the plan
runs as the role runs it (set_fact and filters only, no node contacted) on probe answers
given as host variables, and the test checks the decisions and the exact argv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import load_k0s_filter

REPO = Path(__file__).resolve().parents[1]
k0s = load_k0s_filter("k0s_install")
UNIT = "/etc/systemd/system/k0scontroller.service"
STATE = "/etc/k0s/install-state.json"
BASE_ARGV = ["/usr/local/bin/k0s", "install", "controller", "-c", "/etc/k0s/k0s.yaml"]
TOKEN = ["--token-file", "/etc/k0s/join-token"]


# --- the filter ----------------------------------------------------------------------------

def test_bootstrap_is_the_first_controller_while_none_holds_a_ca() -> None:
    assert k0s.k0s_bootstrap_controller(["a", "b"], {"a": False, "b": False}) == "a"


def test_bootstrap_is_the_first_controller_that_holds_the_ca() -> None:
    assert k0s.k0s_bootstrap_controller(["a", "b", "c"], {"a": False, "b": "no", "c": True}) == "c"


def test_first_controller_without_k0s_joins_the_one_that_has_it() -> None:
    """Reinstalling controllers[0] while another controller of the tenant runs must not
    bootstrap a second cluster (a new Kubernetes CA) on the same prefix."""
    installed, cas = {"a": False, "b": True}, {"a": False, "b": True}
    assert k0s.k0s_install_plan(["a", "b"], installed, "a", True, cas) == {
        "bootstrap": "b", "action": "join", "token": True, "force": False}
    assert k0s.k0s_install_plan(["a", "b"], installed, "b", True, cas) == {
        "bootstrap": "b", "action": "none", "token": False, "force": False}


def test_failed_first_joiner_never_bootstraps_a_second_ca() -> None:
    """Fault 1 of issue 36: the first controller lost k0s and its join to another
    controller failed (its unit is there, written with --token-file; no CA). The plan used
    to make it the bootstrap ("its unit exists") with action reinstall and no token: k0s
    would have started without a CA and without a token and minted a second CA on the live
    prefix. It rejoins the controller that holds the CA, with a fresh token and --force."""
    installed, cas = {"a": True, "b": True, "c": True}, {"a": False, "b": True, "c": True}
    for flags_current in (True, False):
        assert k0s.k0s_install_plan(["a", "b", "c"], installed, "a", flags_current, cas) == {
            "bootstrap": "b", "action": "rejoin", "token": True, "force": True}
    assert k0s.k0s_install_plan(["a", "b", "c"], installed, "b", True, cas)["action"] == "none"


def test_a_unit_without_a_ca_anywhere_bootstraps_with_force_never_reinstall() -> None:
    """No controller holds a CA but the first has a unit (its first start never got as
    far as the CA): it is the tenant's first start again (`--force`, no token), so
    tasks/first_start.yml checks the prefix; never `reinstall`/`none`."""
    installed, cas = {"a": True, "b": False}, {"a": False, "b": False}
    for flags_current in (True, False):
        assert k0s.k0s_install_plan(["a", "b"], installed, "a", flags_current, cas) == {
            "bootstrap": "a", "action": "bootstrap", "token": False, "force": True}
    assert k0s.k0s_install_plan(["a", "b"], installed, "b", True, cas) == {
        "bootstrap": "a", "action": "join", "token": True, "force": False}


@pytest.mark.parametrize("host", ["a", "b", "c"])
@pytest.mark.parametrize("installed", [
    {"a": i, "b": j, "c": k} for i in (True, False) for j in (True, False) for k in (True, False)])
@pytest.mark.parametrize("cas", [
    {"a": i, "b": j, "c": k} for i in (True, False) for j in (True, False) for k in (True, False)])
def test_no_controller_starts_without_a_ca_and_a_token_while_another_holds_the_ca(
        host: str, installed: dict[str, bool], cas: dict[str, bool]) -> None:
    """Every state of a three-controller tenant: a controller without a CA gets a token
    whenever another controller holds the CA; only the first start of the tenant (no CA
    anywhere) goes without one, and only on the first controller."""
    cas = {c: has and installed[c] for c, has in cas.items()}  # a CA comes with k0s
    plan = k0s.k0s_install_plan(["a", "b", "c"], installed, host, True, cas)
    if not cas[host]:
        if any(cas.values()):
            assert plan["token"], plan
        else:
            assert plan["token"] == (host != "a") and plan["action"] in ("bootstrap", "join", "rejoin"), plan
    else:
        assert not plan["token"] and plan["action"] == "none", plan
    assert plan["force"] == (installed[host] and plan["action"] != "none"), plan


def test_changed_flags_reinstall_without_a_token_where_the_controller_joined() -> None:
    """A joined controller keeps its CA: a token in its rewritten unit would only outlive
    its expiry (fault a of issue 26)."""
    installed = cas = {"a": True, "b": True}
    assert k0s.k0s_install_plan(["a", "b"], installed, "a", False, cas) == {
        "bootstrap": "a", "action": "reinstall", "token": False, "force": True}
    assert k0s.k0s_install_plan(["a", "b"], installed, "b", False, cas) == {
        "bootstrap": "a", "action": "reinstall", "token": False, "force": True}


def test_a_controller_that_never_joined_rejoins_with_a_fresh_token() -> None:
    """Fault a of issue 26: a unit installed with a token whose join failed (no CA here),
    recorded or not, gets `--force` with a fresh token, never `none`; the bootstrap
    controller never gets a token (it makes its own CA)."""
    installed, cas = {"a": True, "b": True}, {"a": True, "b": False}
    for flags_current in (True, False):
        assert k0s.k0s_install_plan(["a", "b"], installed, "b", flags_current, cas) == {
            "bootstrap": "a", "action": "rejoin", "token": True, "force": True}
    assert k0s.k0s_install_plan(["a", "b"], installed, "a", True, cas) == {
        "bootstrap": "a", "action": "none", "token": False, "force": False}


def test_unknown_state_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="whether 'b' holds the tenant's CA is unknown"):
        k0s.k0s_install_plan(["a", "b"], {"a": False, "b": "unknown"}, "a", True,
                             {"a": False, "b": "unknown"})


def test_host_outside_its_tenant_is_refused() -> None:
    with pytest.raises(ValueError, match="'x' is not among its tenant's controllers"):
        k0s.k0s_install_plan(["a"], {"a": True, "x": True}, "x", True, {"a": True, "x": True})


def _token(bearer: str) -> str:
    import base64
    import gzip

    kubeconfig = {"apiVersion": "v1", "kind": "Config",
                  "users": [{"name": "controller-bootstrap", "user": {"token": bearer}}]}
    return base64.b64encode(gzip.compress(yaml.safe_dump(kubeconfig).encode())).decode()


def test_controller_states_take_the_probe_then_the_stat_of_that_path() -> None:
    ca = "/var/lib/k0s/pki/ca.crt"
    stats = [{"item": ["b", UNIT], "stat": {"exists": True}},
             {"item": ["b", ca], "stat": {"exists": False}},
             {"item": ["c", ca], "skipped": True}]
    probed = [True, "unknown", "unknown"]
    assert k0s.k0s_controller_states(["a", "b", "c"], probed, stats, UNIT) == \
        {"a": True, "b": True, "c": "unknown"}
    assert k0s.k0s_controller_states(["a", "b", "c"], probed, stats, ca) == \
        {"a": True, "b": False, "c": "unknown"}
    assert k0s.k0s_controller_states(["a"], [False], [], "") == {"a": False}


def test_join_token_id_is_what_k0s_token_invalidate_takes() -> None:
    """Fault 4 of issue 36: the role invalidates each join token after its use by id."""
    assert k0s.k0s_join_token_id(_token("abc123.0123456789abcdef") + "\n") == "abc123"
    with pytest.raises(ValueError, match="not a k0s join token"):
        k0s.k0s_join_token_id("Error: k0s is not running")
    with pytest.raises(ValueError, match="not <id>.<secret>"):
        k0s.k0s_join_token_id(_token("nodot"))


# --- the role's plan.yml, on probe answers -------------------------------------------------

# Tenants, each controller: has the unit?, has a record from the first run? (A controller with
# the unit holds the cluster CA, except in "stuck": see NOT_JOINED.)
TENANTS: dict[str, dict[str, tuple[bool, bool]]] = {
    "stuck": {"k1": (True, True), "k2": (True, True)},
    "fresh": {"f1": (False, False), "f2": (False, False)},
    "lost": {"l1": (False, False), "l2": (True, True), "l3": (True, True)},
    "same": {"s1": (True, True), "s2": (True, True)},
    "worker": {"w1": (True, True), "w2": (True, True)},
    "extra": {"x1": (True, True)},
    "unit": {"u1": (True, True)},
    "legacy": {"g1": (True, False)},
    "failedfirst": {"ff1": (True, True), "ff2": (True, True)},
}
UNIT_SHA = "a" * 64
CA = "/var/lib/k0s/pki/ca.crt"
# its join failed (an expired token): unit and record, no CA; ff1 is the tenant's FIRST
# controller (fault 1 of issue 36: it lost k0s and its join to ff2 failed)
NOT_JOINED = {"k2", "ff1"}


def _inventory(path: Path, records: dict[str, str], changes: dict[str, dict[str, Any]],
               unit_sha: str, limit_tenant: bool) -> Path:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    hosts: dict[str, Any] = {}
    tenants = [{"name": t, "prefix": t, "controllers": list(cs), "key_prefix": f"/{t}/"}
               for t, cs in TENANTS.items()]
    for tenant, controllers in TENANTS.items():
        for name, (has_unit, recorded) in controllers.items():
            probe = {"unit": "yes" if has_unit else "no"}
            joined = has_unit and name not in NOT_JOINED
            if has_unit:
                probe[f"file:{UNIT}"] = f"{unit_sha} 644:root:root"
            if joined:
                probe[f"file:{CA}"] = f"{'d' * 64} 644:root:root"
            if recorded and name in records:
                probe[f"file:{STATE}"] = f"{records[name]} 600:root:root"
            hosts[name] = {**unreachable, "node_address": "10.213.98.21", "k0s_tenant": tenant,
                           "k0s_probe": probe, "k0s_unit_installed": has_unit,
                           "k0s_joined": joined, **changes.get(name, {})}
    if limit_tenant:
        tenants.append({"name": "limited", "prefix": "limited", "controllers": ["m1", "m2"],
                        "key_prefix": "/limited/"})
        hosts["m1"] = {**unreachable, "node_address": "10.213.98.31", "k0s_tenant": "limited",
                       "k0s_probe": {"unit": "no"}, "k0s_unit_installed": False,
                       "k0s_joined": False}
        hosts["m2"] = {**unreachable, "node_address": "10.213.98.32", "k0s_tenant": "limited"}
    inv = {"all": {"vars": {"k0s_tenants": tenants},
                   "children": {"k0s_controller": {"hosts": hosts}}}}
    path.write_text(yaml.safe_dump(inv))
    return path


PLAYBOOK = """
- name: The install plan as roles/k0s_controller makes it
  hosts: k0s_controller
  gather_facts: false
  tasks:
    - name: Plan
      ansible.builtin.include_role:
        name: {role}
        tasks_from: plan
        public: true
    - name: Keep the plan
      ansible.builtin.set_fact:
        _test_plan:
          bootstrap: "{{{{ k0s_bootstrap_controller }}}}"
          action: "{{{{ k0s_install_action }}}}"
          command: "{{{{ k0s_install_command }}}}"
          token: "{{{{ k0s_install_uses_token }}}}"
          state: "{{{{ _k0s_install_record | from_json }}}}"
          state_sha256: "{{{{ _k0s_install_record | hash('sha256') }}}}"
    - name: Keep the record as install.yml writes it after an install (the new unit's checksum)
      ansible.builtin.set_fact:
        _test_record: "{{{{ _k0s_install_record | from_json }}}}"
      vars:
        _k0s_unit_sha256: "{{{{ 'c' * 64 }}}}"
    - name: Write every host's plan on the control node, in one file
      ansible.builtin.copy:
        content: >-
          {{{{ dict(ansible_play_hosts | zip(ansible_play_hosts
               | map('extract', hostvars) | map('dict2items')
               | map('selectattr', 'key', 'in', ['_test_plan', '_test_record'])
               | map('items2dict'))) | to_json }}}}
        dest: "{out}/plans.json"
        mode: "0600"
      run_once: true
      delegate_to: localhost
"""


def _plan(tmp_path: Path, name: str, records: dict[str, str],
          changes: dict[str, dict[str, Any]], *, unit_sha: str = UNIT_SHA,
          limit: str | None = None,
          limit_tenant: bool = False) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / name
    out.mkdir()
    playbook = tmp_path / f"{name}.yml"
    playbook.write_text(PLAYBOOK.format(role="k0sbox.external_etcd.k0s_controller", out=out))
    inventory = _inventory(tmp_path / f"{name}-inventory.yml", records, changes, unit_sha,
                           limit_tenant)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if limit:
        cmd += ["--limit", limit]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    written = out / "plans.json"
    plans = {host: {**kept["_test_plan"], "record": kept["_test_record"]}
             for host, kept in (json.loads(written.read_text()) if written.exists() else {}).items()}
    return result, plans


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A first run records what each installed controller was installed with; the second run
    has those records on the nodes and some changes: flags, extra flags, the unit."""
    tmp = tmp_path_factory.mktemp("plan")
    first, recorded = _plan(tmp, "first", {}, {})
    assert first.returncode == 0, first.stdout + first.stderr
    records = {host: plan["state_sha256"] for host, plan in recorded.items()}
    changes: dict[str, dict[str, Any]] = {
        "w1": {"k0s_enable_worker": True}, "w2": {"k0s_enable_worker": True},
        "x1": {"k0s_install_extra_flags": ["--debug"]},
    }
    second, result = _plan(tmp, "second", records, changes)
    assert second.returncode == 0, second.stdout + second.stderr
    # u1's unit changed since the record (as after a `k0s install controller --force` by hand).
    third, unit_changed = _plan(tmp, "unit-changed", records, {}, unit_sha="b" * 64, limit="u1")
    assert third.returncode == 0, third.stdout + third.stderr
    result["u1"] = unit_changed["u1"]
    assert set(result) == {h for cs in TENANTS.values() for h in cs}, result.keys()
    return {"first": recorded, "second": result}


def test_fresh_tenant_first_controller_bootstraps_others_join(plans: dict[str, Any]) -> None:
    f1, f2 = plans["second"]["f1"], plans["second"]["f2"]
    assert (f1["bootstrap"], f1["action"], f1["command"]) == ("f1", "bootstrap", BASE_ARGV)
    assert (f2["bootstrap"], f2["action"], f2["command"]) == ("f1", "join", BASE_ARGV + TOKEN)


def test_lost_first_controller_joins_a_controller_that_has_k0s(plans: dict[str, Any]) -> None:
    p = plans["second"]
    assert p["l1"]["bootstrap"] == p["l2"]["bootstrap"] == p["l3"]["bootstrap"] == "l2"
    assert (p["l1"]["action"], p["l1"]["command"]) == ("join", BASE_ARGV + TOKEN)
    assert p["l2"]["action"] == p["l3"]["action"] == "none"


def test_unchanged_flags_and_unit_change_nothing(plans: dict[str, Any]) -> None:
    """Idempotence: the record written after an install matches the next run's plan."""
    p = plans["second"]
    assert [p["s1"]["action"], p["s2"]["action"]] == ["none", "none"]
    assert plans["first"]["s1"]["state"] == {"argv": BASE_ARGV, "unit_sha256": UNIT_SHA}


def test_record_after_install_holds_the_argv_and_the_new_units_checksum(
        plans: dict[str, Any]) -> None:
    """install.yml records the unit k0s just wrote (task variable over the probed checksum)."""
    w1 = plans["second"]["w1"]
    assert w1["record"] == {"argv": BASE_ARGV + ["--enable-worker", "--no-taints"],
                            "unit_sha256": "c" * 64}


def test_changed_k0s_enable_worker_reinstalls_with_force(plans: dict[str, Any]) -> None:
    w1, w2 = plans["second"]["w1"], plans["second"]["w2"]
    flags = ["--enable-worker", "--no-taints"]
    assert (w1["action"], w1["command"]) == ("reinstall", BASE_ARGV + flags + ["--force"])
    assert (w2["action"], w2["command"]) == ("reinstall", BASE_ARGV + flags + ["--force"])


def test_changed_extra_flags_reinstall(plans: dict[str, Any]) -> None:
    x1 = plans["second"]["x1"]
    assert (x1["action"], x1["command"]) == ("reinstall", BASE_ARGV + ["--debug", "--force"])


def test_unit_changed_since_the_record_reinstalls(plans: dict[str, Any]) -> None:
    assert plans["second"]["u1"]["action"] == "reinstall"


def test_stuck_join_rejoins_with_a_fresh_token_and_force(plans: dict[str, Any]) -> None:
    """Fault a of issue 26, as the role plans it: k2's unit and record match (the role used
    to record the install before the first start), but k2 never got the CA."""
    k1, k2 = plans["second"]["k1"], plans["second"]["k2"]
    assert (k1["bootstrap"], k1["action"]) == ("k1", "none")
    assert (k2["bootstrap"], k2["action"], k2["command"], k2["token"]) == (
        "k1", "rejoin", BASE_ARGV + TOKEN + ["--force"], True)


def test_failed_first_joiner_rejoins_the_controller_that_holds_the_ca(
        plans: dict[str, Any]) -> None:
    """Fault 1 of issue 36 through the role's plan.yml: the first controller's unit is there
    but its CA is not; before the fix it became the bootstrap (reinstall, no token) and k0s
    would have made a second CA on the live prefix."""
    ff1, ff2 = plans["second"]["ff1"], plans["second"]["ff2"]
    assert (ff2["bootstrap"], ff2["action"]) == ("ff2", "none")
    assert (ff1["bootstrap"], ff1["action"], ff1["command"], ff1["token"]) == (
        "ff2", "rejoin", BASE_ARGV + TOKEN + ["--force"], True)


def test_unit_without_a_record_is_reinstalled_once(plans: dict[str, Any]) -> None:
    """A unit the role did not record (installed before the record existed, or by hand)."""
    g1 = plans["second"]["g1"]
    assert (g1["action"], g1["command"]) == ("reinstall", BASE_ARGV + ["--force"])


def test_controllers_outside_the_play_are_asked_not_guessed(tmp_path: Path) -> None:
    """--limit m1: m2's state is unknown to the play, so the plan stats m2 (unreachable here)
    and fails rather than letting m1 bootstrap a new cluster beside a running one."""
    result, plans = _plan(tmp_path, "limited", {}, {}, limit="m1", limit_tenant=True)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output
    assert "Look for k0s and its CA on the tenant's controllers this play has not probed" in output
    assert "m2" in output and "UNREACHABLE" in output, output
    assert "m1" not in plans
