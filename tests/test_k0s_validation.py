"""k0s.yaml validation: each bad external-etcd config is rejected with k0s's own message
(or the sandbox's, for the checks k0s does not make), and good configs pass."""

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


k0s = load_k0s_filter("k0s_config")
k0s_install = load_k0s_filter("k0s_install")
TLS = {"caFile": "/etc/k0s/etcd/ca.crt", "clientCertFile": "/etc/k0s/etcd/client.crt",
       "clientKeyFile": "/etc/k0s/etcd/client.key"}


def cfg(**ext: Any) -> dict[str, Any]:
    return {"apiVersion": "k0s.k0sproject.io/v1beta1", "kind": "ClusterConfig",
            "spec": {"storage": {"type": "etcd", "etcd": {"externalCluster": ext}}}}


def test_good_tls_config_passes() -> None:
    assert k0s.k0s_external_cluster_errors(
        cfg(endpoints=["https://10.0.0.11:2379"], etcdPrefix="k0s-tenant", **TLS)) == []


def test_good_plain_config_passes() -> None:
    assert k0s.k0s_external_cluster_errors(
        cfg(endpoints=["http://10.0.0.11:2379"], etcdPrefix="k0s-tenant")) == []


@pytest.mark.parametrize(
    ("ext", "message"),
    [
        ({"endpoints": [], "etcdPrefix": "p", **TLS},
         "spec.storage.etcd.externalCluster.endpoints cannot be null or empty"),
        ({"endpoints": None, "etcdPrefix": "p", **TLS},
         "spec.storage.etcd.externalCluster.endpoints cannot be null or empty"),
        ({"endpoints": ["https://10.0.0.11:2379", ""], "etcdPrefix": "p", **TLS},
         "spec.storage.etcd.externalCluster.endpoints cannot contain empty strings"),
        ({"endpoints": ["https://10.0.0.11:2379"], "etcdPrefix": "", **TLS},
         "spec.storage.etcd.externalCluster.etcdPrefix cannot be empty"),
        ({"endpoints": ["https://10.0.0.11:2379"], "etcdPrefix": "p", "caFile": "/ca.crt"},
         ("spec.storage.etcd.externalCluster is invalid: all TLS properties "
          "[caFile,clientCertFile,clientKeyFile] must be defined or none of those")),
        ({"endpoints": ["https://10.0.0.11:2379"], "etcdPrefix": "p"},
         "https:// endpoints need caFile, clientCertFile and clientKeyFile"),
        ({"endpoints": ["10.0.0.11:2379"], "etcdPrefix": "p"},
         "'10.0.0.11:2379' needs a scheme"),
    ],
    ids=["endpoints-empty", "endpoints-null", "endpoint-empty-string", "prefix-empty",
         "tls-partial", "https-without-tls", "no-scheme"],
)
def test_bad_config_rejected_with_message(ext: dict[str, Any], message: str) -> None:
    errors = k0s.k0s_external_cluster_errors(cfg(**ext))
    assert any(message in e for e in errors), errors


# --- spec, spec.api, spec.storage: k0s's fields and rules --------------------------------

CRD = REPO / "tests" / "fixtures" / "k0s-v1.36.3-clusterconfig-crd.yaml"  # k0s's own, see its header


def spec(**extra: Any) -> dict[str, Any]:
    """A ClusterConfig as the role builds it, with `extra` merged into spec.api."""
    api = {"address": "10.0.0.21", "sans": ["10.0.0.21"], **extra}
    return {"spec": {"api": api, "storage": cfg(endpoints=["https://10.0.0.11:2379"],
                                                 etcdPrefix="t", **TLS)["spec"]["storage"]}}


def test_role_shaped_spec_passes() -> None:
    good = spec(externalAddress="10.0.0.30", sans=["10.0.0.21", "k0s.example.com", "fd00::1"],
                extraArgs={"etcd-compaction-interval": "0"}, rawArgs=["--v=2"], port=6443,
                k0sApiPort=9443, onlyBindToAddress=False)
    assert k0s.k0s_spec_errors(good) == []
    assert k0s.k0s_spec_errors(spec(externalAddress="lb.example.com:6443")) == []
    assert k0s.k0s_spec_errors(spec(externalAddress="[fd00::30]:6443")) == []


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"spec": {**spec()["spec"], "apiserver": {}}},
         ["spec.apiserver: unknown field", 'unknown field "apiserver"', "did you mean 'api'?",
          "k0s_spec_extra"]),
        (spec(externalAdress="10.0.0.30"),
         ["spec.api.externalAdress: unknown field", "without a word",
          "did you mean 'externalAddress'?"]),
        ({"spec": {**spec()["spec"], "storage": {**spec()["spec"]["storage"], "etcdd": {}}}},
         ["spec.storage.etcdd: unknown field", "did you mean 'etcd'?"]),
        (spec(address="0.0.0.0"), ["spec.api.address: '0.0.0.0' is INADDR_ANY", "invalid INADDR_ANY",
                                   "node_address"]),
        (spec(address="::"), ["spec.api.address: '::' is INADDR_ANY"]),
        (spec(address="k0s-1.example.com"),
         ["spec.api.address: 'k0s-1.example.com' is not an IP address", "invalid IP address"]),
        (spec(address="10.0.0.21:6443"), ["spec.api.address: '10.0.0.21:6443' is not an IP address"]),
        (spec(externalAddress="lb example"),
         ["spec.api.externalAddress: 'lb example' is neither an IP address nor a DNS name"]),
        (spec(externalAddress="0.0.0.0"), ["spec.api.externalAddress: '0.0.0.0' is INADDR_ANY"]),
        (spec(sans=["10.0.0.21", "https://lb"]),
         ["spec.api.sans[1]: 'https://lb' is neither an IP address nor a DNS name"]),
        (spec(sans="10.0.0.21"), ["spec.api.sans: must be a list"]),
        (spec(extraArgs={"etcd-compaction-interval": 0}),
         ["spec.api.extraArgs.etcd-compaction-interval: int value 0", "map[string]string",
          'quote it: etcd-compaction-interval: "0"']),
        (spec(extraArgs={"anonymous-auth": False}),
         ["spec.api.extraArgs.anonymous-auth: bool value False", 'anonymous-auth: "false"']),
        (spec(extraArgs=["--v=2"]), ["spec.api.extraArgs: must be a mapping"]),
        (spec(rawArgs="--v=2"), ["spec.api.rawArgs: must be a list of strings"]),
        (spec(port=0), ["spec.api.port: '0' is not a port number"]),
        (spec(k0sApiPort="9443"), ["spec.api.k0sApiPort: '9443' is not a port number"]),
    ],
    ids=["unknown-spec-key", "unknown-api-key", "unknown-storage-key", "address-any-v4",
         "address-any-v6", "address-dns-name", "address-with-port", "external-bad",
         "external-any", "san-url", "sans-not-list", "extra-arg-int", "extra-arg-bool",
         "extra-args-list", "raw-args-string", "port-zero", "port-string"],
)
def test_bad_spec_rejected_naming_field_and_fix(config: dict[str, Any], fragments: list[str]) -> None:
    errors = k0s.k0s_spec_errors(config)
    assert len(errors) == 1, errors
    for fragment in fragments:
        assert fragment in errors[0], errors


def test_fields_k0s_ignores_warn_and_do_not_fail() -> None:
    config = {"spec": {**spec()["spec"], "podSecurityPolicy": {"defaultPolicy": "x"}}}
    assert k0s.k0s_spec_errors(config) == []
    assert ["spec.podSecurityPolicy: k0s ignores this field"] == [
        w.split(" (")[0] for w in k0s.k0s_spec_warnings(config)]


def test_known_fields_match_k0s_crd() -> None:
    """The field lists in the filter plugin are those of k0s's ClusterConfig CRD."""
    crd = yaml.safe_load(CRD.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
    props = schema["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    storage = props["storage"]["properties"]
    assert sorted(k0s.CLUSTER_SPEC_KEYS) == sorted(props)
    assert sorted(k0s.API_SPEC_KEYS) == sorted(props["api"]["properties"])
    assert sorted(k0s.STORAGE_SPEC_KEYS) == sorted(storage)
    assert sorted(k0s.ETCD_CONFIG_KEYS) == sorted(storage["etcd"]["properties"])
    assert sorted(k0s.EXTERNAL_CLUSTER_KEYS) == sorted(
        storage["etcd"]["properties"]["externalCluster"]["properties"])
    # extraArgs is k0s's map[string]string.
    assert props["api"]["properties"]["extraArgs"]["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--enable-worker"], "'--enable-worker' is managed by the role (set k0s_enable_worker: true)"),
        (["--token-file=/tmp/t"], "'--token-file=/tmp/t' is managed by the role"),
        (["-c", "/etc/other.yaml"], "'-c' is managed by the role"),
        (["--force"], "'--force' is managed by the role"),
        (["--data-dir=/srv/k0s"], "'--data-dir=/srv/k0s' is managed by the role"),
        ("--debug", "must be a list of strings"),
    ],
)
def test_install_flags_the_role_manages_are_refused(flags: Any, fragment: str) -> None:
    errors = k0s_install.k0s_install_flag_errors(flags)
    assert any(fragment in e for e in errors), errors


def test_other_install_flags_pass() -> None:
    assert k0s_install.k0s_install_flag_errors(["--debug", "--labels=a=b", "--cri-socket", "x"]) == []


def _inventory(tmp_path: Path, tenants: list[dict[str, Any]], extra_vars: dict[str, Any]) -> Path:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    controllers = {c: {**unreachable, "node_address": f"10.213.98.{21 + i}", "k0s_tenant": t["name"]}
                   for i, t in enumerate(tenants) for c in t["controllers"]}
    # as the inventory plugin hands them over (a hand-written inventory states key_prefix)
    tenants = [{**t, "key_prefix": "/" + t["prefix"].strip("/") + "/"} for t in tenants]
    inv = {"all": {"vars": {"etcd_tls": True, "k0s_tenants": tenants, **extra_vars},
                   "children": {"etcd": {"hosts": {"e1": {**unreachable, "node_address": "10.213.98.11"}}},
                                "k0s_controller": {"hosts": controllers}}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


@pytest.mark.parametrize(
    ("tenants", "extra", "message"),
    [
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]},
          {"name": "b", "prefix": "/k0s", "controllers": ["c2"]}], {}, "overlap as /k0s/ and /k0s/"),
        ([{"name": "a", "prefix": "", "controllers": ["c1"]}], {}, "etcdPrefix cannot be empty"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_etcd_ca_file": ""}, "all TLS properties"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_etcd_endpoints_override": ["https://10.213.98.11:2379", ""]}, "cannot contain empty strings"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1", "c2"]}], {}, "need a TCP load balancer"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_binary": "/nonexistent/k0s"}, "K0S_BINARY / k0s_binary"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_spec_extra": {"api": {"address": "0.0.0.0"}}},
         "c1: spec.api.address: '0.0.0.0' is INADDR_ANY"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_spec_extra": {"apiServer": {"extraArgs": {"v": "2"}}}},
         "c1: spec.apiServer: unknown field"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_spec_extra": {"api": {"sans": ["k0s.example.com", "bad name"]}}},
         "spec.api.sans[1]: 'bad name' is neither an IP address nor a DNS name"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_spec_extra": {"api": {"extraArgs": {"etcd-compaction-interval": 0}}}},
         'quote it: etcd-compaction-interval: "0"'),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_install_extra_flags": ["--token-file=/tmp/t"]},
         "k0s_install_extra_flags: '--token-file=/tmp/t' is managed by the role"),
        ([{"name": "admin", "prefix": "k0s", "controllers": ["c1"]}], {},
         ("k0s_tenants (admin).name: 'admin' is reserved (the PKI writes the sandbox's admin "
          "certificate (etcd user root) to clients/admin.*); rename the tenant")),
        ([{"name": "e1", "prefix": "k0s", "controllers": ["c1"]}], {}, "k0s_tenants (e1).name: 'e1' is also an etcd member's name"),
        ([{"name": "a", "prefix": "z/..", "controllers": ["c1"]}], {},
         "k0s_tenants (a).prefix: 'z/..' has a '.', '..' or empty segment"),
    ],
    ids=["nested-prefix", "empty-prefix", "partial-tls", "empty-endpoint", "ha-without-lb",
         "missing-binary-path", "api-address-any", "unknown-spec-key", "bad-san",
         "extra-arg-not-string", "managed-install-flag", "tenant-admin", "tenant-member-name",
         "prefix-dotdot"],
)
def test_site_validation_stops_before_any_node(tmp_path: Path, tenants: list[dict[str, Any]],
                                               extra: dict[str, Any], message: str) -> None:
    """playbooks/validate.yml rejects the bad config without contacting a node."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i",
           str(_inventory(tmp_path, tenants, extra)), str(REPO / "playbooks" / "validate.yml"),
           "-e", json.dumps({"pki_dir": str(tmp_path / "pki")})]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output
    assert message in output, output
    assert "UNREACHABLE" not in output


def test_role_variables_in_sync_with_argument_spec_and_readme() -> None:
    """defaults/main.yml, meta/argument_specs.yml and the README's table name the same
    variables."""
    role = REPO / "roles" / "k0s_controller"
    defaults = set(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    spec_doc = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    spec_options = set(spec_doc["argument_specs"]["main"]["options"])
    readme = {line.split("`")[1] for line in (role / "README.md").read_text().splitlines()
              if line.startswith("| `k0s_")}
    assert defaults == spec_options == readme, (defaults ^ spec_options, defaults ^ readme)
    assert not any("apiserver_user" in name for name in defaults | spec_options | readme)


def test_tenant_lb_picks_its_own_then_a_shared_one() -> None:
    lbs = [{"node_address": "10.0.0.31", "lb_tenant": "tb"}, {"node_address": "10.0.0.32"},
           {"node_address": "10.0.0.30", "lb_tenant": "ta"}]
    assert k0s.k0s_tenant_lb(lbs, "ta") == "10.0.0.30"
    assert k0s.k0s_tenant_lb(lbs, "tb") == "10.0.0.31"
    assert k0s.k0s_tenant_lb(lbs, "tz") == "10.0.0.32"  # the one serving every controller
    assert k0s.k0s_tenant_lb(lbs[:1], "ta") == ""


def test_each_ha_tenant_gets_its_own_load_balancer_as_external_address(tmp_path: Path) -> None:
    """k0s.yaml's spec.api as the role builds it, for two HA tenants each with its own load
    balancer (listed in the other order) and a single-controller tenant."""
    ctrls = {"a1": "ta", "a2": "ta", "b1": "tb", "b2": "tb", "c1": "tc"}
    inv = {"all": {
        "vars": {"etcd_tls": True, "k0s_tenants": [
            {"name": "ta", "prefix": "ta", "controllers": ["a1", "a2"]},
            {"name": "tb", "prefix": "tb", "controllers": ["b1", "b2"]},
            {"name": "tc", "prefix": "tc", "controllers": ["c1"]}]},
        "children": {
            "etcd": {"hosts": {"e1": {"node_address": "10.213.98.11"}}},
            "k0s_controller": {"hosts": {c: {"node_address": f"10.213.98.{21 + i}", "k0s_tenant": t}
                                         for i, (c, t) in enumerate(ctrls.items())}},
            "lb": {"hosts": {"lb-b": {"node_address": "10.213.98.31", "lb_tenant": "tb"},
                             "lb-a": {"node_address": "10.213.98.30", "lb_tenant": "ta"}}}}}}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))
    role = REPO / "roles" / "k0s_controller"
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "k0s_controller", "connection": "local", "gather_facts": False,
        "vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")],
        "tasks": [{"ansible.builtin.debug": {"msg": "{{ k0s_config.spec.api | to_json }}"}}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_STDOUT_CALLBACK": "json"}
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(tmp_path / "inv.yml"), str(tmp_path / "play.yml")],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # The json callback lists the task once per host under a strategy it does not know as
    # lockstep (ansible.posix's LOCKSTEP_CALLBACKS: linear, debug; ansible.cfg's is Mitogen's
    # mitogen_linear): every entry of the one task is read.
    api = {h: json.loads(r["msg"]) for t in json.loads(res.stdout)["plays"][0]["tasks"]
           for h, r in t["hosts"].items()}
    want = {"ta": "10.213.98.30", "tb": "10.213.98.31"}
    for host, tenant in ctrls.items():
        assert api[host].get("externalAddress") == want.get(tenant), (host, api[host])
        # k0s puts api.address and externalAddress into its certificates itself
        # (cmd/controller/certificates.go:241-244): the role does not repeat them in sans
        assert "sans" not in api[host], (host, api[host])
