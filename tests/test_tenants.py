"""THE tenant rules (plugins/plugin_utils/sandbox_tenants.py): one module, imported by the topology
(the CLI, the inventory plugin) and by the playbooks' filter (plugins/filter/sandbox_tenants.py),
so a topology file and a hand-written inventory are held to the same rules; the inventory
hands the roles each tenant's normalised prefix once, as ``key_prefix``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import base_topology, load_plugin
from sandboxlib import inventory, topology
from sandboxlib import sandbox_tenants as tenants

flt = load_plugin("plugins/filter/sandbox_tenants.py")


def tenant(name: str, prefix: str, controller: str = "c1") -> dict[str, Any]:
    """A tenant as the inventory plugin hands it to the roles (key_prefix included)."""
    return tenants.with_key_prefix({"name": name, "prefix": prefix, "controllers": [controller]})


def test_the_filter_applies_the_topology_s_module() -> None:
    """One file: the collection's plugin_utils, which scripts/sandboxlib links to."""
    assert Path(flt.tenants.__file__).resolve() == Path(tenants.__file__).resolve()
    assert Path(tenants.__file__).resolve() == (
        Path(__file__).resolve().parents[1] / "plugins/plugin_utils/sandbox_tenants.py")
    assert topology.tenant_rules is tenants


@pytest.mark.parametrize(("prefix", "key_prefix"), [
    ("k0s", "/k0s/"), ("/k0s", "/k0s/"), ("/k0s/", "/k0s/"), ("k0s/", "/k0s/"),
    ("//a/b//", "/a/b/"), ("registry", "/registry/"),
])
def test_key_prefix_is_the_prefix_as_kube_apiserver_uses_it(prefix: str, key_prefix: str) -> None:
    assert tenants.normalize_prefix(prefix) == key_prefix
    assert tenant("t", prefix)["key_prefix"] == key_prefix


@pytest.mark.parametrize(("a", "b", "overlap"), [
    ("k0s-tenant", "/k0s-tenant", True), ("a", "a/b", True), ("/a/b/", "a", True),
    ("a", "ab", False), ("tenant-a", "tenant-b", False), ("registry", "/registry/", True),
])
def test_prefixes_overlap(a: str, b: str, overlap: bool) -> None:
    assert tenants.prefixes_overlap(a, b) is overlap
    assert tenants.prefixes_overlap(b, a) is overlap


@pytest.mark.parametrize(("prefixes", "fragment"), [
    (["k0s-tenant", "/k0s-tenant"], "overlap as /k0s-tenant/ and /k0s-tenant/"),
    (["a", "a/b"], "overlap as /a/ and /a/b/"),
    (["/a/b/", "a"], "overlap as /a/b/ and /a/"),
    (["same", "same"], "overlap"),
    (["x", ""], "(t1).prefix: spec.storage.etcd.externalCluster.etcdPrefix cannot be empty"),
    (["t4", "../t4"], "prefix: '../t4' has a '.', '..' or empty segment"),
    (["z/..", "x"], "prefix: 'z/..' has a '.', '..' or empty segment"),
    (["a/./b", "x"], "prefix: 'a/./b' has a '.', '..' or empty segment"),
    (["a//b", "x"], "prefix: 'a//b' has a '.', '..' or empty segment"),
    (["ténant-ß", "x"], "prefix: 'ténant-ß' is not written as Kubernetes names are"),
    (["x", "UPPER/case"], "prefix: 'UPPER/case' is not written as Kubernetes names are ('UPPER')"),
])
def test_tenant_prefixes_unique_and_not_nested(prefixes: list[str], fragment: str) -> None:
    listed = [tenant(f"t{i}", p, f"c{i}") for i, p in enumerate(prefixes)]
    errors = flt.sandbox_tenant_errors(listed)
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize(("name", "fragment"), [
    ("admin", "'admin' is reserved (the PKI writes the sandbox's admin certificate"),
    ("root", "'root' is reserved (etcd's root user"),
    ("etcd-member", "'etcd-member' is reserved (the CN of every etcd member certificate"),
    ("etcd-2", "'etcd-2' is also an etcd member's name"),
    ("ténant", "(ténant).name: 'ténant' is not written as Kubernetes names are"),
])
def test_tenant_names_that_share_an_identity_are_refused(name: str, fragment: str) -> None:
    errors = flt.sandbox_tenant_errors([tenant(name, "p")], ["etcd-1", "etcd-2", "etcd-3"])
    assert any(fragment in e and e.endswith(("rename the tenant", "e.g. tenant-a"))
               for e in errors), errors
    assert flt.sandbox_tenant_errors([tenant("tenant-x", "p")], ["etcd-1"]) == []


def test_distinct_prefixes_pass_and_ab_vs_abc_do_not_overlap() -> None:
    assert flt.sandbox_tenant_errors([tenant("a", "ab", "c1"), tenant("b", "abc", "c2")]) == []


def test_a_hand_written_inventory_states_key_prefix() -> None:
    """The roles read key_prefix; an inventory without it (or with another) is refused, naming
    the value to give."""
    missing = {"name": "ta", "prefix": "ta", "controllers": ["c1"]}
    assert flt.sandbox_tenant_errors([missing]) == [
        ("k0s_tenants (ta).key_prefix: '' is not the prefix as kube-apiserver uses it; give "
        "key_prefix: /ta/ (the sandbox_topology inventory plugin writes it itself)")]
    wrong = {**missing, "key_prefix": "ta"}
    assert "give key_prefix: /ta/" in flt.sandbox_tenant_errors([wrong])[0]


def test_registry_prefix_warns() -> None:
    warnings = flt.sandbox_tenant_warnings([{"name": "old", "prefix": "/registry"}])
    assert len(warnings) == 1 and "kube-apiserver's default" in warnings[0]
    assert flt.sandbox_tenant_warnings([{"name": "new", "prefix": "k0s"}]) == []


@pytest.mark.parametrize("prefix", ["k0s", "/k0s/x.y", "t\u00e9nant", "A", "a_b", "-a", "a-",
                                    "k0s-tenant", "a b", ""])
def test_one_rule_for_topology_files_and_inventories(prefix: str) -> None:
    """A prefix a topology file may have is one a hand-written inventory may have."""
    doc = base_topology()
    doc["tenants"][0]["prefix"] = prefix
    try:
        topology.parse(doc, Path("t-prefix.yml"))
        cli_ok = True
    except topology.TopologyError:
        cli_ok = False
    role_ok = flt.sandbox_tenant_errors([tenant("ta", prefix)]) == []
    assert cli_ok == role_ok, (prefix, cli_ok, role_ok)
    assert cli_ok == (prefix in ("k0s", "/k0s/x.y", "k0s-tenant"))


def test_the_inventory_hands_the_roles_the_normalised_prefix(tmp_path: Path) -> None:
    doc = base_topology()
    doc["tenants"][0]["prefix"] = "/ta"
    topo = topology.parse(doc, tmp_path / "t.yml")
    listed = inventory.build(topo, "podman")["vars"]["k0s_tenants"]
    assert listed == [{"name": "ta", "prefix": "/ta", "controllers": ["c1"], "key_prefix": "/ta/"}]
    assert flt.sandbox_tenant_errors(listed, ["e1"]) == []


# max_bytes: the tenant's write budget (sandbox_budgets.py). Only an int:
# YAML's "100" (a string), 1e6 or 100.0 (floats), true (a bool) and 0 or less are refused.
BAD_MAX_BYTES = ["100", 1.5, 100.0, 0, -1, True, None, [100]]


@pytest.mark.parametrize("value", BAD_MAX_BYTES, ids=repr)
def test_max_bytes_must_be_a_positive_int_in_a_topology(value: Any, tmp_path: Path) -> None:
    doc = base_topology()
    doc["tenants"][0]["max_bytes"] = value
    path = tmp_path / "t.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    assert str(err.value) == (
        f"tenants[0] (ta).max_bytes: {value!r} is not a positive integer; give the tenant's write "
        "budget, the most bytes its prefix and leases may take in etcd, e.g. max_bytes: "
        "104857600, or leave it out")


@pytest.mark.parametrize("value", BAD_MAX_BYTES, ids=repr)
def test_max_bytes_must_be_a_positive_int_in_an_inventory(value: Any) -> None:
    """The same rule for a hand-written inventory or ``-e k0s_tenants=...`` (the roles'
    validate.yml runs the filter)."""
    errors = flt.sandbox_tenant_errors([{**tenant("ta", "ta"), "max_bytes": value}])
    assert errors == [f"k0s_tenants (ta).max_bytes: {tenants.max_bytes_error(value)}"]
    assert "is not a positive integer" in errors[0]


def test_max_bytes_goes_to_the_inventory_only_when_given(tmp_path: Path) -> None:
    doc = base_topology()
    doc["tenants"][0]["max_bytes"] = 1
    topo = topology.parse(doc, tmp_path / "t.yml")
    assert topo.tenants[0].max_bytes == 1
    listed = inventory.build(topo, "podman")["vars"]["k0s_tenants"]
    assert listed[0]["max_bytes"] == 1
    assert flt.sandbox_tenant_errors(listed, ["e1"]) == []
    del doc["tenants"][0]["max_bytes"]
    topo = topology.parse(doc, tmp_path / "t.yml")
    assert topo.tenants[0].max_bytes is None
    assert "max_bytes" not in inventory.build(topo, "podman")["vars"]["k0s_tenants"][0]
