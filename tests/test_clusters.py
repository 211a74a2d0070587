"""Several etcd clusters in one topology (issue 40, part 1): the topology rules, each
cluster's view (Topology.view), and the inventory each view and the whole file give the
playbooks (scripts/sandboxlib/inventory.py). The whole sandbox: the tenant_migrate Molecule
scenario (two clusters up, verified, a tenant moved under load)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT, base_topology, explain, podman_objects, run_sandbox
from sandboxlib import inventory, migrate, runner, topology
from sandboxlib.topology import TopologyError
from test_topologies_e2e import ansible_playbook_line


def two_clusters() -> dict[str, Any]:
    """main: e1, tenants ta and tb; second: e2, tenant tc behind its own load balancer."""
    doc = base_topology()
    doc["nodes"] += [
        {"name": "e2", "groups": ["etcd"], "host": 12, "cluster": "second"},
        {"name": "c2", "groups": ["k0s_controller"], "host": 22},
        {"name": "c3", "groups": ["k0s_controller"], "host": 23},
        {"name": "c4", "groups": ["k0s_controller"], "host": 24},
        {"name": "lb3", "groups": ["lb"], "host": 33, "vars": {"lb_tenant": "tc"}},
    ]
    doc["tenants"] = [{"name": "ta", "controllers": ["c1"], "cluster": "main"},
                      {"name": "tb", "controllers": ["c2"], "cluster": "main"},
                      {"name": "tc", "controllers": ["c3", "c4"], "cluster": "second"}]
    return doc


def test_one_cluster_topology_is_unchanged(write_topology: Callable[..., Path]) -> None:
    """A topology without cluster keys: one cluster, main; no view, no new variable."""
    topo = topology.load(write_topology(base_topology()))
    assert topo.clusters == ("main",) and not topo.multi_cluster
    assert topo.views() == [topo] and topo.tenants[0].cluster == "main"
    data = inventory.build(topo, "podman")
    assert "sandbox_clusters" not in data["vars"] and "sandbox_etcd_all" not in data["groups"]
    assert "etcd_cluster" not in data["hosts"]["e1"]
    assert "pki_tenants" not in data["vars"] and data["vars"]["etcd_rbac"] is False


def test_each_cluster_view_has_its_members_tenants_controllers_and_lb(
        write_topology: Callable[..., Path]) -> None:
    topo = topology.load(write_topology(two_clusters()))
    assert topo.clusters == ("main", "second") and topo.multi_cluster
    main, second = topo.views()
    assert [n.name for n in main.nodes] == ["e1", "c1", "c2"]
    assert [t.name for t in main.tenants] == ["ta", "tb"]
    assert [n.name for n in second.nodes] == ["e2", "c3", "c4", "lb3"]
    assert second.views() == [second] and second.cluster == "second"
    assert second.state_dir == topo.state_dir and second.network_name() == topo.network_name()
    assert {t.name: t.cluster for t in topo.tenants}["tc"] == "second"
    with pytest.raises(TopologyError, match="no etcd cluster 'third'; its clusters: main, second"):
        topo.view("third")


def test_view_inventory_groups_one_cluster_and_the_pki_every_one(
        write_topology: Callable[..., Path]) -> None:
    topo = topology.load(write_topology(two_clusters()))
    data = inventory.build(topo.view("second"), "podman")
    groups, hvars = data["groups"], data["vars"]
    assert groups["etcd"] == ["e2"] and groups["k0s_controller"] == ["c3", "c4"]
    assert groups["lb"] == ["lb3"] and groups["tenant_tc"] == ["c3", "c4"]
    assert "tenant_ta" not in groups
    # every node a host (the PKI names them all), every member in the PKI's group
    assert sorted(data["hosts"]) == sorted(n.name for n in topo.nodes)
    assert groups["sandbox_etcd_all"] == ["e1", "e2"] and hvars["pki_etcd_group"] == "sandbox_etcd_all"
    # each cluster's members, for a tenant's move (k0s_migrate_target_group)
    assert groups["etcd_cluster_main"] == ["e1"] and groups["etcd_cluster_second"] == ["e2"]
    assert [t["name"] for t in hvars["k0s_tenants"]] == ["tc"]
    assert [t["name"] for t in hvars["pki_tenants"]] == ["ta", "tb", "tc"]
    assert hvars["pki_tenants"][2]["key_prefix"] == "/tc/"
    assert hvars["sandbox_cluster"] == "second" and hvars["sandbox_clusters"] == ["main", "second"]
    assert hvars["etcd_initial_cluster_token"] == "t-unit-second-etcd"
    # one tenant on this cluster, RBAC still on: the CA is shared
    assert hvars["etcd_rbac"] is True
    assert data["hosts"]["e2"]["etcd_cluster"] == "second"
    assert [n["name"] for n in hvars["sandbox_nodes"]] == [n.name for n in topo.nodes]


def test_whole_file_of_several_clusters_groups_no_node(write_topology: Callable[..., Path]) -> None:
    """Without SANDBOX_CLUSTER no play finds a host (validate.yml names the clusters); the
    nodes are all there for nodes.yml."""
    topo = topology.load(write_topology(two_clusters()))
    data = inventory.build(topo, "podman")
    assert all(data["groups"][g] == [] for g in ("etcd", "k0s_controller", "lb"))
    assert not [g for g in data["groups"] if g.startswith("tenant_")]
    assert len(data["vars"]["sandbox_nodes"]) == len(topo.nodes)
    assert data["vars"]["sandbox_cluster"] == ""


def test_playbooks_other_than_nodes_refuse_the_whole_file(write_topology: Callable[..., Path]) -> None:
    topo = topology.load(write_topology(two_clusters()))
    with pytest.raises(runner.CommandFailed, match="several etcd clusters .main, second.: name "
                                                   "one with --cluster"):
        runner._command(topo, "backup.yml", None)
    assert runner._command(topo, "nodes.yml", None)
    assert runner._command(topo.view("main"), "backup.yml", None)
    assert runner.cluster_env(topo.view("main")) == {"SANDBOX_CLUSTER": "main"}
    assert runner.cluster_env(topo) == {}


def test_a_view_file_is_its_clusters_view(write_topology: Callable[..., Path],
                                          tmp_path: Path) -> None:
    """The inventory source the Vagrantfile writes per etcd cluster (its provisioners take a
    path and no environment): the topology file's view of that cluster, with the inventory
    that view gives; SANDBOX_CLUSTER may repeat its cluster, not name another."""
    path = write_topology(two_clusters())
    view = tmp_path / "views" / "second.yml"
    view.parent.mkdir()
    view.write_text(yaml.safe_dump({"plugin": "sandbox_topology", "view_of": str(path),
                                    "cluster": "second"}))
    got = topology.load_inventory_source(view)
    want = topology.load(path).view("second")
    assert got.cluster == "second"
    assert inventory.build(got) == inventory.build(want)
    assert topology.load_inventory_source(view, "second").cluster == "second"
    # the topology file itself, as before: whole, or SANDBOX_CLUSTER's view
    assert topology.load_inventory_source(path).cluster in ("", None)
    assert inventory.build(topology.load_inventory_source(path, "main")) == \
        inventory.build(topology.load(path).view("main"))


@pytest.mark.parametrize(("doc", "env", "message"), [
    ({"view_of": "t.yml", "cluster": "second", "hosts": []}, "",
     "a view file has only cluster, plugin, view_of; unknown: hosts"),
    ({"view_of": "t.yml"}, "", "cluster: name the etcd cluster this file is a view of"),
    ({"view_of": "t.yml", "cluster": "second"}, "main",
     "a view of etcd cluster 'second', but SANDBOX_CLUSTER=main"),
    ({"view_of": "missing.yml", "cluster": "second"}, "", "view_of: topology file"),
    ({"view_of": "t.yml", "cluster": "third"}, "", "no etcd cluster 'third'; its clusters: main, second"),
], ids=["unknown-key", "no-cluster", "env-contradicts", "no-topology", "unknown-cluster"])
def test_a_bad_view_file_names_the_field(doc: dict[str, Any], env: str, message: str,
                                         write_topology: Callable[..., Path]) -> None:
    path = write_topology(two_clusters())
    view = path.parent / "view.yml"
    doc = {"plugin": "sandbox_topology", **doc}
    if doc["view_of"] == "t.yml":
        doc["view_of"] = path.name   # relative: to the view file's directory
    view.write_text(yaml.safe_dump(doc))
    with pytest.raises(TopologyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        topology.load_inventory_source(view, env)


def test_site_yml_on_the_whole_file_is_refused_before_any_node(tmp_path: Path) -> None:
    """The careless operator: `ansible-playbook -i two-clusters.yml playbooks/site.yml` as
    typed, without SANDBOX_CLUSTER: validate.yml stops it, naming the clusters and the line
    to type, and no container or network of the sandbox exists."""
    doc = yaml.safe_load((REPO_ROOT / "inventories" / "two-clusters.yml").read_text())
    doc["name"] = "t-careless"
    doc["networks"] = {"podman": "10.213.58.0/24"}
    path = tmp_path / "t-careless.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    careless = ansible_playbook_line(f"ansible-playbook -i {path} playbooks/site.yml",
                                     tmp_path / "state")
    assert careless.returncode != 0, careless.stdout
    assert ("has 2 etcd clusters (main, second)" in careless.stdout
            and "SANDBOX_CLUSTER=main ansible-playbook" in careless.stdout), careless.stdout
    assert podman_objects("t-careless") == []


def _mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = two_clusters()
    change(doc)
    return doc


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("tenant names no cluster", _mutated(lambda d: d["tenants"][0].pop("cluster")),
     ("tenants[0] (ta).cluster: this topology has 2 etcd clusters (main, second); say which "
     "holds the tenant, e.g. cluster: main")),
    ("tenant names an unknown cluster", _mutated(lambda d: d["tenants"][0].update(cluster="third")),
     ("tenants[0] (ta).cluster: 'third' is no etcd cluster of this topology; its clusters: "
     "main, second")),
    ("controller names a cluster", _mutated(lambda d: d["nodes"][1].update(cluster="main")),
     "nodes[1] (c1).cluster: only an etcd member belongs to an etcd cluster"),
    ("bad cluster name", _mutated(lambda d: d["nodes"][2].update(cluster="Second_1")),
     "nodes[2] (e2).cluster: 'Second_1' is not a cluster name"),
    ("even count in one cluster",
     _mutated(lambda d: d["nodes"].append({"name": "e3", "groups": ["etcd"], "host": 13,
                                           "cluster": "second"})),
     "nodes (cluster second): 2 etcd members is an even count"),
    ("load balancer of no tenant", _mutated(lambda d: d["nodes"][-1].pop("vars")),
     "nodes (lb3): with several etcd clusters a load balancer serves one tenant"),
    ("rbac off over TLS", _mutated(lambda d: d.update(vars={"etcd_rbac": False})),
     ("vars.etcd_rbac: false is refused with several etcd clusters over TLS: they share the "
     "sandbox's CA")),
]


@pytest.mark.parametrize(("case", "doc", "message"), BAD, ids=[c[0] for c in BAD])
def test_bad_cluster_input_is_refused_naming_the_field(
        case: str, doc: dict[str, Any], message: str, write_topology: Callable[..., Path]) -> None:
    with pytest.raises(TopologyError) as err:
        topology.load(write_topology(doc))
    assert message in str(err.value), f"{case}: got {err.value}"


def test_plain_http_clusters_may_run_without_rbac(write_topology: Callable[..., Path]) -> None:
    """RBAC needs TLS: over plain HTTP there is no certificate to refuse (docs/security.md)."""
    doc = two_clusters()
    doc["tls"] = False
    topo = topology.load(write_topology(doc))
    assert inventory.build(topo.view("main"), "podman")["vars"]["etcd_rbac"] is False


@pytest.mark.parametrize(("argv", "message"), [
    (["rotate-ca"], ("rotate-ca: topology 't-unit' has several etcd clusters, which share the "
                    "sandbox's CA")),
    (["backup"], ("backup: topology 't-unit' has several etcd clusters (main, second); name the "
                 "one to act on with --cluster, e.g. --cluster main")),
    (["etcdctl", "member", "list"], "name one: scripts/sandbox etcdctl --cluster main ..."),
    (["verify", "--json"], ("verify --json: topology 't-unit' has several etcd clusters (main, "
                           "second), a report each; name one with --cluster")),
    (["up", "--cluster", "main"], "up --cluster: up converges every etcd cluster"),
    (["status", "--cluster", "third"], "no etcd cluster 'third'; its clusters: main, second"),
], ids=["rotate-ca", "backup", "etcdctl", "verify-json", "up-cluster", "unknown-cluster"])
def test_cli_names_the_clusters_before_anything_runs(
        argv: list[str], message: str, write_topology: Callable[..., Path],
        tmp_path: Path) -> None:
    """What a command of several etcd clusters needs, said before any node or file changes."""
    path = write_topology(two_clusters())
    res = run_sandbox([*argv[:1], "--topology", str(path), *argv[1:]], tmp_path / "state")
    assert res.returncode == 2, explain(res)
    assert message in res.stderr, res.stderr
    assert not (tmp_path / "state").exists()


# -- migrate: what the command decides before any node changes ------------------------------
@pytest.mark.parametrize(("text", "want"), [
    ("  - {name: ta, controllers: [c1], cluster: main}  # keep me\n",
     "  - {name: ta, controllers: [c1], cluster: second}  # keep me\n"),
    ("  - {name: 'ta', cluster: \"main\", controllers: [c1]}\n",
     "  - {name: 'ta', cluster: \"second\", controllers: [c1]}\n"),
], ids=["flow", "quoted"])
def test_migrate_edits_the_tenants_own_line_only(text: str, want: str, tmp_path: Path) -> None:
    path = tmp_path / "t.yml"
    other = "  - {name: tb, controllers: [c2], cluster: main}\n"
    path.write_text("tenants:\n" + other + text)
    assert migrate.edit_topology(path, "ta", "main", "second")
    assert path.read_text() == "tenants:\n" + other + want


@pytest.mark.parametrize("item", [
    "- name: ta\n  controllers:\n  - c1\n  cluster: main  # here\n",
    "- controllers: [c1]\n  cluster: main\n  name: ta\n",
], ids=["name-first", "name-last"])
def test_migrate_edits_a_block_style_tenant(item: str, tmp_path: Path) -> None:
    """As yaml.safe_dump writes a topology: the tenant's own cluster key only."""
    path = tmp_path / "t.yml"
    other = "- name: tb\n  controllers:\n  - c2\n  cluster: main\n"
    path.write_text("tenants:\n" + other + item + other.replace("tb", "tc"))
    assert migrate.edit_topology(path, "ta", "main", "second")
    data = yaml.safe_load(path.read_text())
    assert [t["cluster"] for t in data["tenants"]] == ["main", "second", "main"]
    assert path.read_text().count("second") == 1


def test_migrate_leaves_an_unclear_tenant_to_the_user(tmp_path: Path) -> None:
    """The tenant's cluster nowhere the command can tell: nothing written, it says the line."""
    path = tmp_path / "t.yml"
    text = "tenants:\n  - {name: ta,\n     cluster: main}\n  - {name: tab, cluster: main}\n"
    path.write_text(text)
    assert not migrate.edit_topology(path, "ta", "main", "second")
    assert path.read_text() == text


def test_an_unfinished_move_stops_up_and_other_moves(write_topology: Callable[..., Path],
                                                     tmp_path: Path) -> None:
    path = write_topology(two_clusters())
    state = tmp_path / "state"
    (state / "t-unit").mkdir(parents=True)
    (state / "t-unit" / "migrate-ta.json").write_text(json.dumps(
        {"tenant": "ta", "from": "main", "to": "second", "step": "switched"}))
    for argv, message in (
            (["up"], ("up: tenant ta's move from etcd cluster main to second is unfinished; "
                     "finish it first: scripts/sandbox migrate --tenant ta --to second")),
            (["migrate", "--tenant", "ta", "--to", "main"],
             "migrate: tenant ta's move from main to second is unfinished; finish it first"),
            (["migrate", "--tenant", "tb", "--to", "second"],
             "migrate: tenant ta's move from etcd cluster main to second is unfinished")):
        res = run_sandbox([argv[0], "--topology", str(path), *argv[1:]], state)
        assert res.returncode == 2 and message in res.stderr, explain(res)
    # switched: the tenant runs on the target, nothing to drop
    for flag, message in (("--abort", ("migrate --abort: tenant ta was switched to etcd cluster "
                                       "second already and runs there; finish the move")),
                          ("--copy-only", "migrate --copy-only: tenant ta was switched")):
        res = run_sandbox(["migrate", "--topology", str(path), "--tenant", "ta", "--to",
                           "second", flag], state)
        assert res.returncode == 2 and message in res.stderr, explain(res)
    # a copy alone (--copy-only, or a move cut short before its switch): up names both ways
    (state / "t-unit" / "migrate-ta.json").write_text(json.dumps(
        {"tenant": "ta", "from": "main", "to": "second", "step": "copy"}))
    res = run_sandbox(["up", "--topology", str(path)], state)
    assert res.returncode == 2 and (
        "finish it first: scripts/sandbox migrate --tenant ta --to second, or drop it: "
        "scripts/sandbox migrate --tenant ta --to second --abort") in res.stderr, explain(res)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tenant", "ta", "--to", "main"], "migrate: tenant ta is on etcd cluster main already"),
    (["--tenant", "ta", "--to", "third"],
     "migrate --to: topology 't-unit' has no etcd cluster 'third'; its clusters: main, second"),
    (["--tenant", "tz", "--to", "second"], "migrate --tenant: no tenant 'tz' in topology"),
    (["--tenant", "ta", "--to", "second", "--cluster", "main"], "leave --cluster out"),
    (["--tenant", "ta", "--to", "second", "--abort"],
     "migrate --abort: tenant ta has no unfinished move"),
    (["--tenant", "ta", "--to", "second", "--abort", "--copy-only"],
     "--abort drops an unfinished move, --copy-only begins one"),
], ids=["same-cluster", "unknown-cluster", "unknown-tenant", "with-cluster", "abort-nothing",
        "abort-and-copy"])
def test_migrate_refuses_bad_input_before_anything_runs(
        argv: list[str], message: str, write_topology: Callable[..., Path],
        tmp_path: Path) -> None:
    path = write_topology(two_clusters())
    res = run_sandbox(["migrate", "--topology", str(path), *argv], tmp_path / "state")
    assert res.returncode == 2 and message in res.stderr, explain(res)
    assert not (tmp_path / "state").exists()


def test_migrate_needs_a_second_cluster(write_topology: Callable[..., Path],
                                        tmp_path: Path) -> None:
    path = write_topology(base_topology())
    res = run_sandbox(["migrate", "--topology", str(path), "--tenant", "ta", "--to", "main"],
                      tmp_path / "state")
    assert res.returncode == 2, explain(res)
    assert "has one etcd cluster (main); add another" in res.stderr


def test_the_summary_of_a_move_resumed_after_its_final_step() -> None:
    """A move resumed after an interrupted freeze whose final step ran: the engine keeps the
    target as it is (its receipt) and says so; the summary says it instead of a copy of 0 keys
    at revision '?' (what it printed, tried on the sandbox)."""
    done = {"done_already": {"fence_revision": 72}, "fence_revision": 72, "target_revision": 75}
    text = migrate.summary("tenant-a", "main", "second",
                           {"sync": done, "final": done, "freeze_seconds": 2.6}, False, 25.0)
    assert "made by the interrupted run (resumed; the target kept as it was, fence revision 72)" in text
    assert "(nothing left to apply, k0s.yaml switched" in text
    assert "0 keys" not in text and "revision ?" not in text
    fresh = migrate.summary("tenant-a", "main", "second", {
        "sync": {"copied": 670, "copy_revision": 713, "applied_revisions": 11, "seconds": 0.41},
        "final": {"applied_revisions": 48, "seconds": 0.09, "target_revision": 776},
        "freeze_seconds": 3.5}, False, 39.0)
    assert "670 keys at source revision 713, then 11 revisions of changes (0.41s)" in fresh
    assert "the last 48 revisions in 0.09s" in fresh
