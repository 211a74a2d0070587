"""Topology validation: every bad input fails with a message naming the field and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, base_topology
from sandboxlib import topology
from sandboxlib.topology import TopologyError

Mutator = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutator:
    """A mutation setting a dotted path (list indexes allowed) in the topology document."""

    def mutate(doc: dict[str, Any]) -> None:
        keys = path.split(".")
        cur: Any = doc
        for k in keys[:-1]:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        last = keys[-1]
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value

    return mutate


def _add_node(node: dict[str, Any]) -> Mutator:
    return lambda doc: doc["nodes"].append(node)


def _tenants(*tenants: dict[str, Any]) -> Mutator:
    """Tenants over controllers c1, c2 (c2 added to the nodes)."""

    def mutate(doc: dict[str, Any]) -> None:
        doc["nodes"].append({"name": "c2", "groups": ["k0s_controller"], "host": 32})
        doc["tenants"] = list(tenants)

    return mutate


BAD: list[tuple[str, Mutator, str]] = [
    ("unknown top-level key", _set("colour", "blue"), "unknown key(s) colour"),
    ("unknown node key", _set("nodes.0.ram", 5), "nodes[0]: unknown key(s) ram"),
    ("unknown tenant key", _set("tenants.0.etcd", "x"), "tenants[0]: unknown key(s) etcd"),
    ("missing plugin line", _set("plugin", "yaml"), "plugin: a topology file starts with"),
    ("tls not a bool", _set("tls", "yes"), "tls: true"),
    ("duplicate node names", _add_node({"name": "e1", "groups": ["etcd"], "host": 12}),
     "duplicate node name 'e1'"),
    ("duplicate addresses", _add_node({"name": "e2", "groups": ["lb"], "host": 11}),
     "duplicate podman address 10.213.51.11 (e1 and e2)"),
    ("node in no group", _set("nodes.0.groups", []), "nodes[0] (e1).groups: every node needs"),
    ("node without groups key", _add_node({"name": "x1", "host": 40}),
     "nodes[2] (x1).groups: every node needs at least one group"),
    ("unknown group", _set("nodes.0.groups", ["worker"]), "unknown group 'worker'"),
    ("address outside the network", _set("nodes.0.addresses", {"podman": "10.9.9.9"}),
     "address 10.9.9.9 is outside the podman network 10.213.51.0/24"),
    ("host number past the network", _set("nodes.0.host", 300), "is outside the podman network"),
    ("gateway address", _set("nodes.0.host", 1),
     "address 10.213.51.1 is the podman network's gateway"),
    ("not an address", _set("nodes.0.addresses", {"podman": "ten"}),
     "nodes[0] (e1).addresses.podman: 'ten' is not an IPv4 address"),
    ("bad subnet", _set("networks", {"podman": "10.213.51.5/24"}),
     "networks.podman: '10.213.51.5/24' is not an IPv4 subnet"),
    ("unknown backend network", _set("networks", {"docker": "10.213.51.0/24"}),
     "networks.docker: unknown backend"),
    ("bad node name", _set("nodes.0.name", "Etcd_1"), "nodes[0].name: 'Etcd_1' is not a valid"),
    ("no etcd node", _set("nodes.0.groups", ["lb"]), "no node is in group 'etcd'"),
    ("even etcd count", _add_node({"name": "e2", "groups": ["etcd"], "host": 12}),
     "2 etcd members is an even count"),
    ("tenant without controllers", _set("tenants.0.controllers", []),
     "tenants[0] (ta).controllers: a tenant needs at least one controller"),
    ("tenant controller not a node", _set("tenants.0.controllers", ["nope"]),
     "tenants[0] (ta).controllers: 'nope' is not a node"),
    ("tenant controller not in k0s_controller", _set("tenants.0.controllers", ["e1"]),
     "node 'e1' is not in group k0s_controller"),
    ("controller in no tenant", _set("tenants", []),
     "nodes (c1): controller belongs to no tenant"),
    ("empty prefix", _set("tenants.0.prefix", ""),
     "tenants (ta).prefix: spec.storage.etcd.externalCluster.etcdPrefix cannot be empty"),
    ("slash-only prefix", _set("tenants.0.prefix", "/"), "etcdPrefix cannot be empty"),
    ("prefix with a space", _set("tenants.0.prefix", "a b"),
     "tenants (ta).prefix: 'a b' is not written as Kubernetes names are ('a b')"),
    ("prefix with an empty segment", _set("tenants.0.prefix", "a//b"),
     "tenants (ta).prefix: 'a//b' has a '.', '..' or empty segment"),
    ("unicode prefix", _set("tenants.0.prefix", "ténant-ß"),
     ("tenants (ta).prefix: 'ténant-ß' is not written as Kubernetes names are ('ténant-ß'): "
     "use lower-case ASCII letters, digits, '-' and '.'")),
    ("upper-case prefix segment", _set("tenants.0.prefix", "/k0s/Tenant_A/"),
     ("tenants (ta).prefix: '/k0s/Tenant_A/' is not written as Kubernetes names are "
     "('Tenant_A')")),
    ("unicode tenant name", _set("tenants.0.name", "ténant"),
     ("tenants (ténant).name: 'ténant' is not written as Kubernetes names are (the certificate's "
      "CN and etcd user): use lower-case ASCII letters, digits and '-' (at most 63)")),
    ("same prefix with and without slash",
     _tenants({"name": "ta", "prefix": "k0s-tenant", "controllers": ["c1"]},
              {"name": "tb", "prefix": "/k0s-tenant", "controllers": ["c2"]}),
     "prefixes 'k0s-tenant' and '/k0s-tenant' overlap as /k0s-tenant/ and /k0s-tenant/"),
    ("nested prefixes",
     _tenants({"name": "ta", "prefix": "a", "controllers": ["c1"]},
              {"name": "tb", "prefix": "a/b", "controllers": ["c2"]}),
     "prefixes 'a' and 'a/b' overlap as /a/ and /a/b/"),
    ("duplicate prefixes",
     _tenants({"name": "ta", "prefix": "x", "controllers": ["c1"]},
              {"name": "tb", "prefix": "x", "controllers": ["c2"]}),
     "prefixes 'x' and 'x' overlap"),
    ("duplicate tenant names",
     _tenants({"name": "ta", "prefix": "x", "controllers": ["c1"]},
              {"name": "ta", "prefix": "y", "controllers": ["c2"]}),
     "duplicate tenant name 'ta'"),
    ("controller shared by two tenants",
     _tenants({"name": "ta", "prefix": "x", "controllers": ["c1"]},
              {"name": "tb", "prefix": "y", "controllers": ["c1", "c2"]}),
     "controller(s) c1 belong to both"),
    ("HA tenant without a load balancer",
     _tenants({"name": "ta", "prefix": "x", "controllers": ["c1", "c2"]}),
     "tenants (ta): 2 controllers need a load balancer; add a node in group 'lb'"),
    ("HA tenant whose only load balancer serves another tenant",
     lambda doc: (_tenants({"name": "ta", "prefix": "x", "controllers": ["c1", "c2"]})(doc),
                  doc["nodes"].append({"name": "lb1", "groups": ["lb"], "host": 5,
                                       "vars": {"lb_tenant": "tz"}})),
     ("tenants (ta): 2 controllers need a load balancer; add a node in group 'lb' with vars "
     "{lb_tenant: ta} (or one without lb_tenant)")),
]


@pytest.mark.parametrize(("case", "mutate", "message"), BAD, ids=[c[0] for c in BAD])
def test_bad_topology_is_refused_with_its_message(
        case: str, mutate: Mutator, message: str, write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    mutate(doc)
    with pytest.raises(TopologyError) as err:
        topology.load(write_topology(doc))
    assert message in str(err.value), f"{case}: got {err.value}"
    assert "\n" not in str(err.value)


def test_base_topology_is_valid(write_topology: Callable[..., Path]) -> None:
    topo = topology.load(write_topology(base_topology()))
    assert [n.name for n in topo.nodes] == ["e1", "c1"]
    assert topo.node("e1").address("podman") == "10.213.51.11"
    assert topo.tenants[0].normalized_prefix == "/ta/"
    assert topo.warnings == ()


def test_even_etcd_count_allowed_when_asked(write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["nodes"].append({"name": "e2", "groups": ["etcd"], "host": 12})
    doc["allow_even_etcd"] = True
    assert len(topology.load(write_topology(doc)).group("etcd")) == 2


def test_ha_with_load_balancer_is_valid(write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["nodes"] += [{"name": "c2", "groups": ["k0s_controller"], "host": 22},
                     {"name": "lb1", "groups": ["lb"], "host": 5}]
    doc["tenants"][0]["controllers"] = ["c1", "c2"]
    assert topology.load(write_topology(doc)).group("lb")[0].name == "lb1"


def test_registry_prefix_gives_a_warning(write_topology: Callable[..., Path]) -> None:
    doc = base_topology()
    doc["tenants"][0]["prefix"] = "/registry"
    topo = topology.load(write_topology(doc))
    assert len(topo.warnings) == 1
    assert "prefix 'registry' is kube-apiserver's default" in topo.warnings[0]


def test_unknown_topology_name_lists_shipped_ones() -> None:
    with pytest.raises(TopologyError) as err:
        topology.load("t-no-such-topology")
    shipped = sorted(p.stem for p in (REPO_ROOT / "inventories").glob("*.yml"))
    assert "unknown topology 't-no-such-topology'" in str(err.value)
    assert f"shipped ones: {', '.join(shipped)}" in str(err.value)


def test_missing_topology_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="not found"):
        topology.load(tmp_path / "absent.yml")


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text("plugin: sandbox_topology\nnodes: [\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        topology.load(path)


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "inventories").glob("*.yml")),
                         ids=lambda p: p.stem)
def test_shipped_topologies_are_valid(path: Path) -> None:
    topo = topology.load(path)
    assert topo.group("etcd"), "every shipped topology has etcd members"
    for c in topo.clusters:   # each etcd cluster an odd count
        assert len([n for n in topo.group("etcd") if n.cluster == c]) % 2 == 1
    for t in topo.tenants:
        assert t.controllers
