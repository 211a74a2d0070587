"""Faults a-e of issue 26 where they are input checks (roles/k0s_controller's filters and
validate.yml, before any node changes). Their end-to-end tests, on running controllers, are in
molecule/k0s_controller (verify-changes.yml: a, b; verify-takeover.yml: c, d).

a) a joined controller's unit never keeps a join token: tests/test_k0s_install_plan.py.
b) a prefix or endpoint change where k0s runs is refused, naming the way forward.
c) a tenant's first start over a prefix holding data is refused unless it is a takeover.
d) a takeover's old CA and service-account keys must all be there.
e) install flags that break the sandbox, and extraArgs etcd-servers, are refused.

Fault 3 of issue 36 widens e: spec.api.rawArgs naming an etcd flag k0s sets itself (and
extraArgs naming etcd-prefix or a TLS file flag), `--init-only`, and `--disable-components`
naming coredns or applier-manager are refused too. The role's k0s_version and
k0s_join_token_expiry rules are tests/test_k0s_input_rules.py's.
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
DOUBLE = REPO / "tests" / "k0s-test-double" / "k0s"


guard = load_k0s_filter("k0s_guard")
install = load_k0s_filter("k0s_install")
config = load_k0s_filter("k0s_config")


def _cfg(prefix: str, endpoints: list[str]) -> dict[str, Any]:
    return {"spec": {"storage": {"type": "etcd", "etcd": {"externalCluster": {
        "endpoints": endpoints, "etcdPrefix": prefix}}}}}


EPS = ["https://10.0.0.11:2379", "https://10.0.0.12:2379", "https://10.0.0.13:2379"]


# --- b ---------------------------------------------------------------------------------------

def test_b_prefix_change_where_k0s_runs_is_refused_naming_the_reset() -> None:
    errors = guard.k0s_storage_change_errors(_cfg("t", EPS), _cfg("t2", EPS), "c1", "t")
    assert len(errors) == 1, errors
    assert errors[0].startswith("c1: k0s_tenants (t).prefix: k0s runs here on /t/ and the "
                                "inventory now says /t2/.")
    assert "Nothing was changed" in errors[0]
    assert "scripts/sandbox reset --tenant t" in errors[0]


def test_b_endpoint_change_is_refused_unless_add_or_remove_member_changes_them() -> None:
    errors = guard.k0s_storage_change_errors(_cfg("t", EPS), _cfg("t", EPS[:1]), "c1", "t")
    assert len(errors) == 1 and "scripts/sandbox add-members / remove-member" in errors[0], errors
    assert guard.k0s_storage_change_errors(_cfg("t", EPS), _cfg("t", EPS[:1]), "c1", "t",
                                           True) == []


@pytest.mark.parametrize(("old", "new"), [
    (_cfg("t", EPS), _cfg("/t/", EPS)),              # one prefix to kube-apiserver
    (_cfg("t", EPS), _cfg("t", EPS[::-1])),          # the same endpoints, another order
    ({}, _cfg("other", EPS[:1])),                   # k0s not installed: nothing to compare
])
def test_b_what_is_no_change(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert guard.k0s_storage_change_errors(old, new, "c1", "t") == []


# --- c, d ------------------------------------------------------------------------------------

def test_c_first_start_over_data_is_refused_unless_takeover() -> None:
    errors = guard.k0s_first_start_errors(7, "t", "/t/", False)
    assert len(errors) == 1, errors
    assert errors[0].startswith("k0s_tenants (t): etcd already holds 7 key(s) under /t/ and no "
                                "controller of the tenant has k0s")
    assert "set k0s_takeover: true" in errors[0] and "k0s_takeover_pki_dir" in errors[0]
    assert guard.k0s_first_start_errors(7, "t", "t", True) == []
    assert guard.k0s_first_start_errors(0, "t", "t", False) == []


def test_d_takeover_keys_must_all_be_there() -> None:
    assert guard.k0s_takeover_pki_errors("/old", ["ca.crt", "ca.key", "sa.key", "sa.pub"]) == []
    errors = guard.k0s_takeover_pki_errors("/old", ["ca.crt", "sa.pub"])
    assert errors == [("k0s_takeover_pki_dir: /old lacks ca.key, sa.key; copy ca.crt, ca.key, "
                      "sa.key and sa.pub from the old controller's /var/lib/k0s/pki there (or "
                      "unset it)")]
    assert guard.k0s_takeover_pki_errors("", []) == []


# --- e ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "fragment"), [
    (["--single"], "'--single' is refused: a single-node cluster"),
    (["--enable-dynamic-config"],
     ("'--enable-dynamic-config' is refused: k0s.yaml changes (all but spec.storage) would then "
     "come from the ClusterConfig object")),
    (["--status-socket=/run/x.sock"], ("'--status-socket=/run/x.sock' is refused: the role's "
                                      "readiness waits run `k0s status`")),
    (["--status-socket", "/run/x.sock"], "'--status-socket' is refused"),
    (["--disable-components=control-api"], ("disables control-api, which serves the controller "
                                           "join API (9443)")),
    (["--disable-components", "konnectivity-server,control-api"], "disables control-api"),
    (["--init-only"], ("'--init-only' is refused: `k0s controller --init-only` initialises its "
                       "components and exits (cmd/controller/controller.go:133-135, 444-446)")),
    (["--debug", "--init-only=true"], "'--init-only=true' is refused"),
    (["--disable-components=coredns"], ("disables coredns, which writes CoreDNS's manifests for "
                                        "the applier manager to apply")),
    (["--disable-components", "metrics-server, coredns"], "disables coredns"),
    (["--disable-components=applier-manager"], ("disables applier-manager, which applies the "
                                                "manifests under /var/lib/k0s/manifests")),
], ids=["single", "dynamic-config", "status-socket=", "status-socket", "control-api",
        "control-api-listed", "init-only", "init-only=true", "coredns", "coredns-listed",
        "applier-manager"])
def test_e_install_flags_that_break_the_sandbox_are_refused(flags: list[str],
                                                            fragment: str) -> None:
    errors = install.k0s_install_flag_errors(flags)
    assert len(errors) == 1 and fragment in errors[0], errors
    assert errors[0].endswith("remove it") or "out of --disable-components" in errors[0]


def test_e_without_coredns_the_role_s_check_could_never_pass() -> None:
    """The reason names the key tasks/checks.yml waits for, which never appears."""
    errors = install.k0s_install_flag_errors(["--disable-components=applier-manager,coredns"])
    assert len(errors) == 2, errors
    assert all("services/specs/kube-system/kube-dns" in e and "tasks/checks.yml" in e
               for e in errors), errors
    checks = (REPO / "roles" / "k0s_controller" / "tasks" / "checks.yml").read_text()
    assert "'services/specs/kube-system/kube-dns'" in checks


def test_e_other_disabled_components_pass() -> None:
    assert install.k0s_install_flag_errors(["--disable-components=konnectivity-server"]) == []
    assert install.k0s_install_flag_errors(["--disable-components", "metrics-server"]) == []


def test_e_extra_args_etcd_servers_is_refused_as_appended_not_overriding() -> None:
    cfg = {"spec": {"api": {"address": "10.0.0.21", "extraArgs": {
        "etcd-servers": "https://10.9.9.9:2379", "etcd-compaction-interval": "0"}}}}
    errors = config.k0s_spec_errors(cfg)
    assert len(errors) == 1, errors
    assert errors[0].startswith("spec.api.extraArgs.etcd-servers: k0s adds its own "
                                "--etcd-servers")
    assert "APPENDED to k0s's endpoints, not override them" in errors[0]


@pytest.mark.parametrize(("raw", "fragment"), [
    (["--etcd-servers=https://10.9.9.9:2379"],
     ("spec.api.rawArgs[0] ('--etcd-servers=https://10.9.9.9:2379'): k0s adds its own "
     "--etcd-servers")),
    (["--v=2", "--etcd-servers", "https://10.9.9.9:2379"],
     "spec.api.rawArgs[1] ('--etcd-servers' and the value after it): k0s adds its own"),
    (["--etcd-prefix=/other"], ("rawArgs[0] ('--etcd-prefix=/other'): k0s adds its own "
                               "--etcd-prefix (the external cluster's etcdPrefix)")),
    (["--etcd_prefix=/other"], "k0s adds its own --etcd-prefix"),
    (["--etcd-cafile=/tmp/ca.crt"], "k0s adds its own --etcd-cafile (externalCluster.caFile)"),
    (["--etcd-certfile=/tmp/c.crt"], "--etcd-certfile (externalCluster.clientCertFile)"),
    (["--etcd-keyfile=/tmp/c.key"], "--etcd-keyfile (externalCluster.clientKeyFile)"),
], ids=["servers=", "servers-value-after", "prefix", "prefix-underscore", "cafile", "certfile",
        "keyfile"])
def test_e_raw_args_etcd_flags_k0s_sets_are_refused(raw: list[str], fragment: str) -> None:
    """k0s appends rawArgs (a list of strings) after extraArgs and its own etcd flags after
    both (apiserver.go:218-238): a list flag gets appended to, a single-value one is k0s's."""
    errors = config.k0s_spec_errors({"spec": {"api": {"address": "10.0.0.21", "rawArgs": raw}}})
    assert len(errors) == 1 and fragment in errors[0], errors
    assert "apiserver.go:140-145, 218-238); remove it" in errors[0]


@pytest.mark.parametrize("flag", ["etcd-prefix", "etcd-cafile", "etcd-certfile", "etcd-keyfile"])
def test_e_extra_args_single_value_etcd_flags_are_refused_as_having_no_effect(flag: str) -> None:
    cfg = {"spec": {"api": {"address": "10.0.0.21", "extraArgs": {flag: "/x"}}}}
    errors = config.k0s_spec_errors(cfg)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"spec.api.extraArgs.{flag}: k0s adds its own --{flag}")
    assert "a single-value flag takes its last value, k0s's" in errors[0]


def test_e_raw_args_k0s_does_not_set_pass() -> None:
    raw = ["--etcd-compaction-interval=0", "--etcd-healthcheck-timeout", "3s", "--v=2",
           "etcd-servers"]   # an element without "--" names no flag (a value)
    assert config.k0s_spec_errors({"spec": {"api": {"address": "10.0.0.21", "rawArgs": raw}}}) == []


# --- the same refusals through playbooks/validate.yml, before any node ----------------------

def _validate(tmp_path: Path, extra: dict[str, Any],
              env: dict[str, str] | None = None) -> tuple[int, str]:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    inv = {"all": {"vars": {"etcd_tls": True, "k0s_tenants": [
        {"name": "a", "prefix": "a", "controllers": ["c1"], "key_prefix": "/a/"}], **extra},
        "children": {"etcd": {"hosts": {"e1": {**unreachable, "node_address": "10.213.98.11"}}},
                     "k0s_controller": {"hosts": {"c1": {**unreachable, "node_address": "10.213.98.21",
                                                         "k0s_tenant": "a"}}}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inv))
    full_env = {k: v for k, v in os.environ.items() if k != "K0S_TEST_DOUBLE_ALLOWED"}
    full_env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **(env or {}))
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(tmp_path / "inventory.yml"), str(REPO / "playbooks" / "validate.yml"),
                          "-e", json.dumps({"pki_dir": str(tmp_path / "pki")})],
                         capture_output=True, text=True, env=full_env, timeout=300, check=False)
    output = " ".join((res.stdout + res.stderr).split())
    assert "UNREACHABLE" not in output
    return res.returncode, output


@pytest.mark.parametrize(("extra", "message"), [
    ({"k0s_install_extra_flags": ["--single"]}, "k0s_install_extra_flags: '--single' is refused"),
    ({"k0s_install_extra_flags": ["--disable-components=control-api"]}, "disables control-api"),
    ({"k0s_spec_extra": {"api": {"extraArgs": {"etcd-servers": "https://10.9.9.9:2379"}}}},
     "c1: spec.api.extraArgs.etcd-servers: k0s adds its own --etcd-servers"),
    ({"k0s_join_token_expiry": "soon"}, "k0s_join_token_expiry: 'soon' is not a duration"),
    ({"k0s_join_token_expiry": "0m0s"},
     "k0s_join_token_expiry: '0m0s' makes a join token that never expires"),
    ({"k0s_version": "../../etc"}, "k0s_version: '../../etc' is not a k0s release tag"),
    ({"k0s_spec_extra": {"api": {"rawArgs": ["--etcd-prefix=/other"]}}},
     "c1: spec.api.rawArgs[0] ('--etcd-prefix=/other'): k0s adds its own --etcd-prefix"),
    ({"k0s_install_extra_flags": ["--init-only"]}, "'--init-only' is refused"),
    ({"k0s_install_extra_flags": ["--disable-components=coredns"]}, "disables coredns"),
    ({"k0s_takeover_pki_dir": "/nonexistent/old-pki"},
     "k0s_takeover_pki_dir: /nonexistent/old-pki lacks ca.crt, ca.key, sa.key, sa.pub"),
    ({"k0s_binary": str(DOUBLE)}, (f"K0S_BINARY / k0s_binary: '{DOUBLE}' is the project's k0s "
                                  "test double (not k0s)")),
], ids=["single", "control-api", "etcd-servers", "token-expiry", "token-never-expires",
        "k0s-version", "raw-args-etcd-prefix", "init-only", "disable-coredns", "takeover-pki",
        "test-double"])
def test_refused_by_validate_before_any_node(tmp_path: Path, extra: dict[str, Any],
                                             message: str) -> None:
    rc, output = _validate(tmp_path, extra)
    assert rc != 0 and message in output, output


def test_the_tests_own_variable_lets_the_double_through_validate(tmp_path: Path) -> None:
    rc, output = _validate(tmp_path, {"k0s_binary": str(DOUBLE)}, {"K0S_TEST_DOUBLE_ALLOWED": "1"})
    assert rc == 0, output
