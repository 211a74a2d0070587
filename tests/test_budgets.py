"""plugins/plugin_utils/sandbox_budgets.py: each tenant's write budget from its max_bytes and
etcd_tenant_budget_share of the backend quota, the rule that they fit (the topology refuses
them before any node changes; playbooks/validate.yml says the same to a hand-written
inventory), and verify's check on what the members' etcd exports on /metrics (the lines below
are what the sandbox's build, scripts/etcd-patches/0007, prints)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandboxlib import sandbox_budgets as b
from sandboxlib import topology

REPO = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
TENANTS = [{"name": "tenant-a", "key_prefix": "/tenant-a/"},
           {"name": "tenant-b", "key_prefix": "/tenant-b/"}]

METRICS = """# HELP etcd_k0sbox_tenant_budget_bytes Write budget of a tenant.
# TYPE etcd_k0sbox_tenant_budget_bytes gauge
etcd_k0sbox_tenant_budget_bytes{prefix="/tenant-a/",user="tenant-a"} 4.194304e+06
etcd_k0sbox_tenant_budget_bytes{prefix="/tenant-b/",user="tenant-b"} 4.194304e+06
etcd_k0sbox_tenant_over_budget{prefix="/tenant-a/",user="tenant-a"} 1
etcd_k0sbox_tenant_over_budget{prefix="/tenant-b/",user="tenant-b"} 0
etcd_k0sbox_tenant_refused_total{user="tenant-a"} 4301
etcd_k0sbox_tenant_used_bytes{prefix="/tenant-a/",user="tenant-a"} 4.123456e+06
etcd_k0sbox_tenant_used_bytes{prefix="/tenant-b/",user="tenant-b"} 52100
etcd_mvcc_db_total_size_in_bytes 5.763072e+06
"""


def test_a_share_of_the_quota_split_after_the_max_bytes() -> None:
    got = b.budgets([*TENANTS, {"name": "c", "prefix": "c", "max_bytes": 2 * MiB}], 32 * MiB, 0.25)
    assert got == [
        {"name": "tenant-a", "prefix": "/tenant-a/", "bytes": 3 * MiB, "source": "share"},
        {"name": "tenant-b", "prefix": "/tenant-b/", "bytes": 3 * MiB, "source": "share"},
        {"name": "c", "prefix": "/c/", "bytes": 2 * MiB, "source": "max_bytes"}]
    assert sum(x["bytes"] for x in got) <= 0.25 * 32 * MiB
    assert b.config_value(got[0]) == '{"prefix":"/tenant-a/","bytes":3145728}'


@pytest.mark.parametrize(("tenants", "share", "says"), [
    ([{"name": "a", "key_prefix": "/a/", "max_bytes": 6 * MiB},
      {"name": "b", "key_prefix": "/b/", "max_bytes": 3 * MiB}], 0.25,
     "the tenants' max_bytes add up to 9437184 bytes (a 6291456, b 3145728), past the 8388608 bytes"),
    ([{"name": "a", "key_prefix": "/a/", "max_bytes": 7 * MiB + MiB // 2},
      {"name": "b", "key_prefix": "/b/"}], 0.25,
     "the tenants without max_bytes (b) would get a write budget of 524288 bytes each"),
    (TENANTS, 0, "etcd_tenant_budget_share: 0 is not a share of the backend quota in (0, 1]"),
    (TENANTS, "most", "etcd_tenant_budget_share: 'most' is not a share"),
    (TENANTS, 1.5, "is not a share of the backend quota in (0, 1]"),
])
def test_budgets_that_cannot_hold_are_named_with_the_fix(tenants: list[dict[str, Any]],
                                                        share: Any, says: str) -> None:
    errors = b.budget_errors(tenants, 32 * MiB, share)
    assert len(errors) == 1 and says in errors[0], errors
    if "max_bytes" in says:
        assert "raise etcd_quota_backend_bytes" in errors[0] and "etcd_tenant_budget_share" in errors[0]
    assert b.budget_errors(TENANTS, 32 * MiB, 0.25) == []


def test_a_members_figures_are_read_from_its_metrics() -> None:
    got = b.parse_metrics(METRICS)
    assert got == {"tenant-a": {"prefix": "/tenant-a/", "budget": 4194304, "used": 4123456,
                                "over": True, "refused": 4301},
                   "tenant-b": {"prefix": "/tenant-b/", "budget": 4194304, "used": 52100,
                                "over": False, "refused": 0}}
    assert b.parse_metrics("etcd_mvcc_db_total_size_in_bytes 20480\n") == {}   # another build


def test_verify_fails_a_tenant_over_its_budget_or_a_member_that_does_not_enforce_it() -> None:
    wanted = b.budgets(TENANTS, 32 * MiB, 0.25)
    wanted = [{**w, "bytes": 4194304} for w in wanted]
    members = {"etcd-1": b.parse_metrics(METRICS), "etcd-2": b.parse_metrics(METRICS)}
    a, bb = b.member_checks(wanted, members)
    assert not a["ok"] and "tenant tenant-a is OVER its write budget" in a["detail"]
    assert "4301 so far" in a["detail"] and "scripts/sandbox defrag --compact" in a["detail"]
    assert bb["ok"] and bb["detail"].startswith("50.9 KiB of 4.0 MiB used")
    stock = {"etcd-1": b.parse_metrics(METRICS), "etcd-2": {}}
    _, bb = b.member_checks(wanted, stock)
    assert not bb["ok"] and "not enforced on etcd-2 (budget there: etcd-2 none)" in bb["detail"]
    assert "etcd-io/etcd#10084" in bb["detail"]
    moved = [{**wanted[1], "bytes": 5 * MiB}]   # the topology changed, the key was not rewritten
    assert not b.member_checks(moved, members)[0]["ok"]
    assert not b.member_checks(wanted, {})[0]["ok"]
    fields = b.usage_fields(wanted, members)
    assert fields["tenant-a"]["over"] and fields["tenant-a"]["enforced"]
    assert fields["tenant-b"] == {"budget": 4194304, "enforced": True, "used": 52100,
                                  "over": False, "refused": 0}


def _topology(tmp_path: Path, tenants: list[dict[str, Any]], tvars: dict[str, Any]) -> Path:
    data = {"plugin": "sandbox_topology", "name": "budgets", "tls": True,
            "networks": {"podman": "10.213.97.0/24"},
            "nodes": [{"name": "etcd-1", "groups": ["etcd"], "host": 11},
                      *[{"name": f"c{i}", "groups": ["k0s_controller"], "host": 21 + i}
                        for i in range(len(tenants))]],
            "tenants": [{**t, "controllers": [f"c{i}"]} for i, t in enumerate(tenants)],
            "vars": tvars}
    path = tmp_path / "budgets.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_topology_refuses_budgets_that_cannot_hold(tmp_path: Path) -> None:
    tenants = [{"name": "a", "prefix": "a", "max_bytes": 20 * MiB}, {"name": "b", "prefix": "b"}]
    with pytest.raises(topology.TopologyError, match="tenants: the tenants' max_bytes add up to 20971520"):
        topology.load(_topology(tmp_path, tenants, {"etcd_quota_backend_bytes": 32 * MiB}))
    # a bigger share, or a bigger quota, holds them
    topology.load(_topology(tmp_path, tenants, {"etcd_quota_backend_bytes": 32 * MiB,
                                                "etcd_tenant_budget_share": 0.7}))
    topology.load(_topology(tmp_path, tenants, {"etcd_extra_settings": {"quota-backend-bytes": 256 * MiB}}))
    # no RBAC, no budget: nothing to refuse
    topology.load(_topology(tmp_path, tenants, {"etcd_quota_backend_bytes": 32 * MiB, "etcd_rbac": False}))


def test_validate_refuses_them_before_any_node_is_contacted(tmp_path: Path) -> None:
    """A hand-written inventory: playbooks/validate.yml (site.yml's first phase) refuses,
    naming the fields, with the hosts pointing at a closed port on loopback."""
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    tenants = [{"name": "a", "prefix": "a", "controllers": ["c1"], "key_prefix": "/a/",
                "max_bytes": 600 * MiB},
               {"name": "b", "prefix": "b", "controllers": ["c2"], "key_prefix": "/b/"}]
    inv = {"all": {"vars": {"etcd_tls": True, "etcd_rbac": True, "k0s_tenants": tenants},
                   "children": {
                       "etcd": {"hosts": {"e1": {**unreachable, "node_address": "10.213.97.11"}}},
                       "k0s_controller": {"hosts": {
                           "c1": {**unreachable, "k0s_tenant": "a", "node_address": "10.213.97.21"},
                           "c2": {**unreachable, "k0s_tenant": "b", "node_address": "10.213.97.22"}}}}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(path),
                          str(REPO / "playbooks" / "validate.yml"),
                          "-e", json.dumps({"pki_dir": str(tmp_path / "pki")})],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0, out
    assert "k0s_tenants: the tenants' max_bytes add up to 629145600 bytes (a 629145600)" in out, out
    assert "UNREACHABLE" not in out


def test_a_build_without_budgets_is_a_skip_where_the_operator_accepted_it() -> None:
    """etcd_accepted_advisories: [etcd-io/etcd#10084] (e.g. the crd_apiserver scenario's
    Debian 12 3.4.23 before its upgrade): verify says so instead of failing; not where a
    member of the sandbox's build disagrees with the topology."""
    wanted = [{"name": "tenant-a", "prefix": "/tenant-a/", "bytes": 4194304, "source": "share"}]
    stock = {"etcd-1": {}, "etcd-2": {}}
    [c] = b.member_checks(wanted, stock, ["etcd-io/etcd#10084"])
    assert c["ok"] and c["skipped"] and "the operator accepted etcd-io/etcd#10084" in c["detail"]
    assert not b.member_checks(wanted, stock)[0]["ok"]
    other = {"etcd-1": b.parse_metrics(METRICS)}   # enforces another budget: a finding still
    assert not b.member_checks([{**wanted[0], "bytes": 1}], other, ["etcd-io/etcd#10084"])[0]["ok"]
