"""k0s.yaml validation: each bad external-etcd config is rejected with k0s's own message
(or the sandbox's, for the checks k0s does not make), and good configs pass."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    path = REPO / "roles" / "k0s_controller" / "filter_plugins" / "k0s_config.py"
    spec = importlib.util.spec_from_file_location("k0s_config", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


k0s = _load()
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


@pytest.mark.parametrize(
    ("prefixes", "fragment"),
    [
        (["k0s-tenant", "/k0s-tenant"], "overlap as /k0s-tenant/ and /k0s-tenant/"),
        (["a", "a/b"], "overlap as /a/ and /a/b/"),
        (["/a/b/", "a"], "overlap as /a/b/ and /a/"),
        (["same", "same"], "overlap"),
        (["x", ""], "etcdPrefix cannot be empty"),
    ],
)
def test_tenant_prefixes_unique_and_not_nested(prefixes: list[str], fragment: str) -> None:
    tenants = [{"name": f"t{i}", "prefix": p, "controllers": [f"c{i}"]}
               for i, p in enumerate(prefixes)]
    errors = k0s.k0s_tenant_errors(tenants)
    assert any(fragment in e for e in errors), errors


def test_distinct_prefixes_pass_and_ab_vs_abc_do_not_overlap() -> None:
    tenants = [{"name": "a", "prefix": "ab", "controllers": ["c1"]},
               {"name": "b", "prefix": "abc", "controllers": ["c2"]}]
    assert k0s.k0s_tenant_errors(tenants) == []


def test_registry_prefix_warns() -> None:
    warnings = k0s.k0s_tenant_warnings([{"name": "old", "prefix": "/registry"}])
    assert len(warnings) == 1 and "kube-apiserver's default" in warnings[0]
    assert k0s.k0s_tenant_warnings([{"name": "new", "prefix": "k0s"}]) == []


def test_normalize_prefix() -> None:
    assert k0s.k0s_normalize_prefix("k0s-tenant") == "/k0s-tenant/"
    assert k0s.k0s_normalize_prefix("/k0s-tenant/") == "/k0s-tenant/"


def _inventory(tmp_path: Path, tenants: list[dict[str, Any]], extra_vars: dict[str, Any]) -> Path:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    controllers = {c: {**unreachable, "node_address": f"10.213.98.{21 + i}", "k0s_tenant": t["name"]}
                   for i, t in enumerate(tenants) for c in t["controllers"]}
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
          {"name": "b", "prefix": "/k0s", "controllers": ["c2"]}], {}, "prefixes overlap"),
        ([{"name": "a", "prefix": "", "controllers": ["c1"]}], {}, "etcdPrefix cannot be empty"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_etcd_ca_file": ""}, "all TLS properties"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_etcd_endpoints_override": ["https://10.213.98.11:2379", ""]}, "cannot contain empty strings"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1", "c2"]}], {}, "need a TCP load balancer"),
        ([{"name": "a", "prefix": "k0s", "controllers": ["c1"]}],
         {"k0s_binary": "/nonexistent/k0s"}, "K0S_BINARY / k0s_binary"),
    ],
    ids=["nested-prefix", "empty-prefix", "partial-tls", "empty-endpoint", "ha-without-lb",
         "missing-binary-path"],
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
