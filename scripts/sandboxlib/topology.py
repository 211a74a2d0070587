"""The sandbox topology: one YAML file describing nodes, groups, addresses and tenants.

A topology file is also an Ansible inventory source (``plugin: sandbox_topology``), so
``ansible-playbook -i inventories/default.yml`` reads it directly through the inventory
plugin in ``scripts/ansible_plugins/inventory``; the CLI and the Vagrantfile read the same file.
Every error is a :class:`TopologyError` whose message names the field and the fix.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import argspecs
from . import sandbox_tenants as tenant_rules
from .sandbox_budgets import DEFAULT_SHARE, budget_errors
from .sandbox_tenants import normalize_prefix
from .sandbox_usage import role_quota

PLUGIN_NAME = "sandbox_topology"
BACKENDS = ("podman", "vagrant")
KNOWN_GROUPS = ("etcd", "k0s_controller", "lb")
REPO_ROOT = Path(__file__).resolve().parents[2]
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
TOP_KEYS = {"plugin", "name", "description", "tls", "allow_even_etcd", "networks",
            "nodes", "tenants", "vars", "vagrant"}
NODE_KEYS = {"name", "groups", "host", "addresses", "memory", "cpus", "vars", "cluster"}
TENANT_KEYS = {"name", "prefix", "controllers", "vars", "max_bytes", "cluster"}
# The etcd cluster of members and tenants that name none (issue 40: several in one topology).
DEFAULT_CLUSTER = "main"
CLUSTER_RE = re.compile(r"^[a-z]([a-z0-9-]{0,14}[a-z0-9])?$")
# The environment variable (inventory plugin) that picks one cluster's view of a topology
# with several etcd clusters: its members, its tenants and their controllers and load balancers.
CLUSTER_ENV = "SANDBOX_CLUSTER"

# Variables a topology's ``vars`` (its own or a node's) may not set, each with where its
# value comes from. inventory.build derives these from the topology's own fields: set in vars
# they pointed the sandbox at another one (``sandbox_name``/``sandbox_state_dir`` of another
# sandbox made ``down`` remove its nodes; ``k0s_tenant`` on a node took another tenant's
# certificate; ``k0s_tenants`` skipped the tenant rules of this file).
DERIVED_VARS = {
    "sandbox_name": "the topology's name", "sandbox_backend": "--backend or SANDBOX_BACKEND",
    "sandbox_state_dir": "SANDBOX_STATE_DIR (or .sandbox/) and the topology's name",
    "pki_dir": "the state directory (<state>/pki)",
    "sandbox_topology_file": "the topology file's path", "sandbox_network": "networks",
    "sandbox_nodes": "nodes", "etcd_tls": "tls", "etcd_allow_even": "allow_even_etcd",
    "k0s_tenants": "tenants", "node_address": "the node's host or addresses",
    "sandbox_container": "the topology's and the node's names",
    "k0s_tenant": "the controllers of tenants",
}
# A day-2 command's inputs (argspecs.command_inputs(): the options of its argument-spec entry
# point; and down's sandbox_nodes_state): given on its command line for one run, never
# standing in a topology, where etcd_restore_foreign or k0s_restore_force gave every later
# restore that consent.
COMMAND_VARS = frozenset({"sandbox_nodes_state"})


def command_inputs() -> frozenset[str]:
    return argspecs.command_inputs() | COMMAND_VARS


class TopologyError(ValueError):
    """A topology file is invalid; the message names the field and how to fix it."""


@dataclass(frozen=True)
class Node:
    name: str
    groups: tuple[str, ...]
    addresses: dict[str, str]
    memory: int | None = None
    cpus: int | None = None
    vars: dict[str, Any] = field(default_factory=dict)
    # The etcd cluster an etcd member belongs to; "" for a node of no etcd group.
    cluster: str = ""

    def address(self, backend: str) -> str:
        return self.addresses[backend]


@dataclass(frozen=True)
class Tenant:
    name: str
    prefix: str
    controllers: tuple[str, ...]
    vars: dict[str, Any] = field(default_factory=dict)
    # Its write budget: the bytes its prefix and leases may take in the backend, enforced by
    # the sandbox's etcd build (sandbox_budgets.py); None: an equal part of the share.
    max_bytes: int | None = None
    # The etcd cluster holding its prefix.
    cluster: str = DEFAULT_CLUSTER

    @property
    def normalized_prefix(self) -> str:
        """The prefix as kube-apiserver uses it: ``/<prefix>/`` (``k0s`` == ``/k0s``)."""
        return normalize_prefix(self.prefix)


@dataclass(frozen=True)
class Topology:
    name: str
    path: Path
    tls: bool
    networks: dict[str, ipaddress.IPv4Network]
    nodes: tuple[Node, ...]
    tenants: tuple[Tenant, ...]
    vars: dict[str, Any]
    vagrant: dict[str, Any]
    description: str = ""
    warnings: tuple[str, ...] = ()
    allow_even_etcd: bool = False
    # Every etcd cluster of the topology file, in order of first member.
    clusters: tuple[str, ...] = (DEFAULT_CLUSTER,)
    # The cluster this view shows (view()); "" = the whole file.
    cluster: str = ""
    # A view's whole topology: every node and tenant of the file (what view() left out).
    every_node: tuple[Node, ...] = ()
    every_tenant: tuple[Tenant, ...] = ()

    @property
    def multi_cluster(self) -> bool:
        return len(self.clusters) > 1

    def view(self, cluster: str) -> Topology:
        """One etcd cluster's part of the topology: its members, its tenants, their
        controllers and load balancers; the same name, network and state directory (the
        sandbox's nodes, SSH key and PKI are shared). What site.yml converges in one run."""
        if cluster not in self.clusters:
            raise TopologyError(f"cluster: topology '{self.name}' has no etcd cluster "
                                f"'{cluster}'; its clusters: {', '.join(self.clusters)}")
        tenants = tuple(t for t in self.tenants if t.cluster == cluster)
        names = {t.name for t in tenants}
        ctrls = {c for t in tenants for c in t.controllers}
        nodes = tuple(n for n in self.nodes
                      if ("etcd" in n.groups and n.cluster == cluster) or n.name in ctrls
                      or ("lb" in n.groups and (n.vars or {}).get("lb_tenant") in names))
        return dataclasses.replace(self, nodes=nodes, tenants=tenants, cluster=cluster,
                                   every_node=self.nodes, every_tenant=self.tenants)

    def views(self) -> list[Topology]:
        """What site.yml converges, one run each: the topology itself when it has one etcd
        cluster or is a view already, else each cluster's view."""
        if self.cluster or not self.multi_cluster:
            return [self]
        return [self.view(c) for c in self.clusters]

    @property
    def all_nodes(self) -> tuple[Node, ...]:
        return self.every_node or self.nodes

    @property
    def all_tenants(self) -> tuple[Tenant, ...]:
        return self.every_tenant or self.tenants

    def group(self, group: str) -> list[Node]:
        return [n for n in self.nodes if group in n.groups]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise TopologyError(f"nodes: no node named '{name}' in topology '{self.name}'")

    @property
    def state_dir(self) -> Path:
        """Where this sandbox keeps its SSH key, PKI and kubeconfigs on the control node."""
        base = os.environ.get("SANDBOX_STATE_DIR")
        return Path(base) / self.name if base else REPO_ROOT / ".sandbox" / self.name

    def network_name(self) -> str:
        return f"k0sbox-{self.name}"

    def container_name(self, node: Node) -> str:
        return f"k0sbox-{self.name}-{node.name}"


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise TopologyError(msg)


def _own_vars(where: str, variables: dict[str, Any]) -> None:
    """Refuse a variable of DERIVED_VARS, command_inputs() or Ansible's connection (ansible_*)
    in a topology's or a node's ``vars``, naming it and what to change instead."""
    for key in sorted(map(str, variables)):
        if key in DERIVED_VARS:
            raise TopologyError(f"{where}.{key}: the topology sets it from "
                                f"{DERIVED_VARS[key]}; change that instead (in vars it would "
                                "point this sandbox at another sandbox's nodes or files)")
        if key in command_inputs():
            raise TopologyError(f"{where}.{key}: an input of a day-2 command, given on its "
                                "command line for one run (scripts/sandbox <command> --help), "
                                "not in a topology; remove it from vars")
        if key.startswith("ansible_"):
            raise TopologyError(f"{where}.{key}: how Ansible reaches the nodes is the "
                                "backend's (SSH with the sandbox's own key); remove it, or for "
                                "your own hosts write a plain inventory (inventories/example/)")


def _unknown_keys(where: str, data: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    _require(not extra, f"{where}: unknown key(s) {', '.join(extra)}; "
                        f"allowed: {', '.join(sorted(allowed))}")


def _parse_networks(raw: Any) -> dict[str, ipaddress.IPv4Network]:
    _require(isinstance(raw, dict) and bool(raw), "networks: give a subnet per backend, "
             "e.g. networks: {podman: 10.213.10.0/24, vagrant: 192.168.56.0/24}")
    nets: dict[str, ipaddress.IPv4Network] = {}
    for backend, subnet in raw.items():
        _require(backend in BACKENDS, f"networks.{backend}: unknown backend; "
                                      f"use one of {', '.join(BACKENDS)}")
        try:
            nets[backend] = ipaddress.IPv4Network(str(subnet), strict=True)
        except ValueError as exc:
            raise TopologyError(f"networks.{backend}: '{subnet}' is not an IPv4 subnet "
                                f"such as 10.213.10.0/24 ({exc})") from None
    return nets


def _parse_node(i: int, raw: Any, nets: dict[str, ipaddress.IPv4Network]) -> Node:
    where = f"nodes[{i}]"
    _require(isinstance(raw, dict), f"{where}: each node is a mapping with name, groups, host")
    _unknown_keys(where, raw, NODE_KEYS)
    name = raw.get("name")
    _require(isinstance(name, str) and bool(NAME_RE.match(name)),
             f"{where}.name: '{name}' is not a valid node name "
             "(lower-case letters, digits and '-', at most 42 characters)")
    where = f"nodes[{i}] ({name})"
    groups = raw.get("groups")
    _require(isinstance(groups, list) and bool(groups),
             f"{where}.groups: every node needs at least one group of "
             f"{', '.join(KNOWN_GROUPS)}")
    for g in groups:
        _require(g in KNOWN_GROUPS, f"{where}.groups: unknown group '{g}'; "
                                    f"use {', '.join(KNOWN_GROUPS)}")
    explicit = raw.get("addresses") or {}
    _require(isinstance(explicit, dict), f"{where}.addresses: a mapping backend -> IP")
    host = raw.get("host")
    addresses: dict[str, str] = {}
    for backend, net in nets.items():
        if backend in explicit:
            try:
                ip = ipaddress.IPv4Address(str(explicit[backend]))
            except ValueError:
                raise TopologyError(f"{where}.addresses.{backend}: "
                                    f"'{explicit[backend]}' is not an IPv4 address") from None
        else:
            _require(isinstance(host, int) and not isinstance(host, bool),
                     f"{where}: give 'host' (the host number in each network, e.g. 11) "
                     f"or addresses.{backend}")
            ip = net.network_address + int(host)
        _require(ip in net and ip not in (net.network_address, net.broadcast_address),
                 f"{where}: address {ip} is outside the {backend} network {net}; "
                 f"choose a host number between 2 and {net.num_addresses - 2}")
        _require(ip != net.network_address + 1,
                 f"{where}: address {ip} is the {backend} network's gateway; use another host")
        addresses[backend] = str(ip)
    for backend in explicit:
        _require(backend in nets, f"{where}.addresses.{backend}: no network for backend "
                                  f"'{backend}' under networks")
    for key in ("memory", "cpus"):
        val = raw.get(key)
        _require(val is None or (isinstance(val, int) and val > 0),
                 f"{where}.{key}: a positive integer")
    nvars = raw.get("vars") or {}
    _require(isinstance(nvars, dict), f"{where}.vars: a mapping of variables")
    _own_vars(f"{where}.vars", nvars)
    cluster = raw.get("cluster", DEFAULT_CLUSTER if "etcd" in groups else "")
    if "cluster" in raw:
        _require("etcd" in groups, f"{where}.cluster: only an etcd member belongs to an etcd "
                                   "cluster (a controller's is its tenant's); remove it")
        _require(isinstance(cluster, str) and bool(CLUSTER_RE.match(cluster)),
                 f"{where}.cluster: '{cluster}' is not a cluster name (lower-case letters, "
                 f"digits and '-', at most 16, e.g. {DEFAULT_CLUSTER} or second)")
    return Node(name=name, groups=tuple(groups), addresses=addresses,
                memory=raw.get("memory"), cpus=raw.get("cpus"), vars=nvars, cluster=cluster)


def _parse_tenant(i: int, raw: Any, nodes: dict[str, Node], clusters: list[str]) -> Tenant:
    where = f"tenants[{i}]"
    _require(isinstance(raw, dict), f"{where}: each tenant is a mapping with name, "
                                    "prefix, controllers")
    _unknown_keys(where, raw, TENANT_KEYS)
    name = raw.get("name")
    _require(isinstance(name, str) and bool(name),
             f"{where}.name: every tenant needs a name, e.g. tenant-a")
    where = f"tenants[{i}] ({name})"
    prefix = raw.get("prefix", name)
    _require(isinstance(prefix, str), f"{where}.prefix: a string such as 'k0s-tenant'")
    ctrls = raw.get("controllers")
    _require(isinstance(ctrls, list) and bool(ctrls),
             f"{where}.controllers: a tenant needs at least one controller node "
             "(a node in group k0s_controller)")
    for c in ctrls:
        _require(c in nodes, f"{where}.controllers: '{c}' is not a node of this topology")
        _require("k0s_controller" in nodes[c].groups,
                 f"{where}.controllers: node '{c}' is not in group k0s_controller; "
                 "add the group to the node")
    tvars = raw.get("vars") or {}
    _require(isinstance(tvars, dict), f"{where}.vars: a mapping of variables")
    max_bytes = raw.get("max_bytes")
    if "max_bytes" in raw:
        problem = tenant_rules.max_bytes_error(max_bytes)
        _require(not problem, f"{where}.max_bytes: {problem}")
    if "cluster" in raw:
        cluster = raw["cluster"]
        _require(cluster in clusters, f"{where}.cluster: '{cluster}' is no etcd cluster of this "
                                      f"topology; its clusters: {', '.join(clusters)} (a "
                                      "member's cluster: key names one)")
    else:
        _require(len(clusters) == 1, f"{where}.cluster: this topology has {len(clusters)} etcd "
                                     f"clusters ({', '.join(clusters)}); say which holds the "
                                     f"tenant, e.g. cluster: {clusters[0]}")
        cluster = clusters[0]
    return Tenant(name=name, prefix=prefix, controllers=tuple(ctrls), vars=tvars,
                  max_bytes=max_bytes, cluster=cluster)


def parse(data: Any, path: Path) -> Topology:
    """Validate a loaded topology document and return the :class:`Topology`."""
    _require(isinstance(data, dict), f"{path}: a topology file is a YAML mapping")
    _unknown_keys(str(path.name), data, TOP_KEYS)
    _require(data.get("plugin") == PLUGIN_NAME,
             f"plugin: a topology file starts with 'plugin: {PLUGIN_NAME}'")
    name = data.get("name", path.stem)
    _require(isinstance(name, str) and bool(NAME_RE.match(name)) and len(name) <= 20,
             f"name: '{name}' must be lower-case letters, digits and '-' (at most 20)")
    tls = data.get("tls", True)
    _require(isinstance(tls, bool), "tls: true (mTLS on client and peer) or false (plain HTTP)")
    nets = _parse_networks(data.get("networks"))
    raw_nodes = data.get("nodes")
    _require(isinstance(raw_nodes, list) and bool(raw_nodes),
             "nodes: give at least one node (a list of {name, groups, host})")
    nodes = [_parse_node(i, n, nets) for i, n in enumerate(raw_nodes)]
    seen: dict[str, str] = {}
    for n in nodes:
        _require(n.name not in seen, f"nodes: duplicate node name '{n.name}'; names are unique")
        seen[n.name] = n.name
    for backend in nets:
        owner: dict[str, str] = {}
        for n in nodes:
            ip = n.addresses[backend]
            _require(ip not in owner, f"nodes: duplicate {backend} address {ip} "
                                      f"({owner.get(ip)} and {n.name}); give each node its own")
            owner[ip] = n.name
    by_name = {n.name: n for n in nodes}
    etcd = [n for n in nodes if "etcd" in n.groups]
    _require(bool(etcd), "nodes: no node is in group 'etcd'; the sandbox needs at least one")
    allow_even = data.get("allow_even_etcd", False)
    _require(isinstance(allow_even, bool), "allow_even_etcd: true or false")
    clusters = list(dict.fromkeys(n.cluster for n in etcd))
    for c in clusters:
        count = sum(1 for n in etcd if n.cluster == c)
        where = "nodes" if len(clusters) == 1 else f"nodes (cluster {c})"
        _require(count % 2 == 1 or allow_even,
                 f"{where}: {count} etcd members is an even count (no better fault tolerance "
                 f"than {count - 1}); use an odd count or set allow_even_etcd: true")
    raw_tenants = data.get("tenants") or []
    _require(isinstance(raw_tenants, list), "tenants: a list of {name, prefix, controllers}")
    tenants = [_parse_tenant(i, t, by_name, clusters) for i, t in enumerate(raw_tenants)]
    # The tenant rules (tenants.py): names, prefixes, neither repeated nor nested.
    errors = tenant_rules.tenant_errors(
        [{"name": t.name, "prefix": t.prefix, "controllers": t.controllers} for t in tenants],
        [n.name for n in etcd], where="tenants", key_prefix=False)
    _require(not errors, errors[0] if errors else "")
    for i, a in enumerate(tenants):
        for b in tenants[:i]:
            shared = set(a.controllers) & set(b.controllers)
            _require(not shared, f"tenants ({b.name}, {a.name}): controller(s) "
                                 f"{', '.join(sorted(shared))} belong to both; a controller "
                                 "serves one tenant")
    warnings = tenant_rules.tenant_warnings(
        [{"name": t.name, "prefix": t.prefix} for t in tenants], where="tenants")
    for n in nodes:
        if "k0s_controller" in n.groups:
            _require(any(n.name in t.controllers for t in tenants),
                     f"nodes ({n.name}): controller belongs to no tenant; list it under "
                     "some tenant's controllers")
    lbs = [n for n in nodes if "lb" in n.groups]
    for t in tenants:
        if len(t.controllers) > 1:
            # Its own (vars: lb_tenant: <tenant>) or one serving every controller (no lb_tenant),
            # as roles/k0s_controller picks spec.api.externalAddress (filter k0s_tenant_lb).
            serving = [n for n in lbs if (n.vars or {}).get("lb_tenant", "") in ("", t.name)]
            _require(bool(serving), f"tenants ({t.name}): {len(t.controllers)} controllers need a "
                                    f"load balancer; add a node in group 'lb' with vars "
                                    f"{{lb_tenant: {t.name}}} (or one without lb_tenant)")
    tvars = data.get("vars") or {}
    _require(isinstance(tvars, dict), "vars: a mapping of variables for every node")
    _own_vars("vars", tvars)
    if len(clusters) > 1:
        _multi_cluster_rules(nodes, tenants, tvars, tls)
    _budget_rules(tenants, clusters, tvars, tls)
    vagrant = data.get("vagrant") or {}
    _require(isinstance(vagrant, dict), "vagrant: a mapping (box, memory, cpus)")
    return Topology(name=name, path=path, tls=tls, networks=nets, nodes=tuple(nodes),
                    tenants=tuple(tenants), vars=tvars, vagrant=vagrant,
                    description=str(data.get("description", "")), warnings=tuple(warnings),
                    allow_even_etcd=allow_even, clusters=tuple(clusters))


def _budget_rules(tenants: list[Tenant], clusters: list[str], tvars: dict[str, Any],
                  tls: bool) -> None:
    """The tenants' write budgets (sandbox_budgets.py) must fit each etcd cluster's backend
    quota: refused here, before ``up`` changes any node (roles/etcd's validate.yml says the
    same to a hand-written inventory). They apply where etcd RBAC does (TLS and two tenants,
    or several clusters, unless vars.etcd_rbac is false). Values the CLI cannot evaluate (a
    Jinja2 template) are left to the role's check."""
    rbac = tvars.get("etcd_rbac", tls and (len(tenants) > 1 or len(clusters) > 1))
    if not (tls and rbac is True):
        return
    quota = tvars.get("etcd_quota_backend_bytes")
    extra = tvars.get("etcd_extra_settings")
    if isinstance(extra, dict) and extra.get("quota-backend-bytes") is not None:
        quota = extra["quota-backend-bytes"]
    share = tvars.get("etcd_tenant_budget_share", DEFAULT_SHARE)
    if any(isinstance(v, str) and "{" in v for v in (quota, share)):
        return
    for c in clusters:
        mine = [{"name": t.name, "prefix": t.prefix,
                 **({"max_bytes": t.max_bytes} if t.max_bytes is not None else {})}
                for t in tenants if len(clusters) == 1 or t.cluster == c]
        errors = budget_errors(mine, role_quota(quota), share,
                               where="tenants" if len(clusters) == 1 else f"tenants (cluster {c})")
        _require(not errors, errors[0] if errors else "")


def _multi_cluster_rules(nodes: list[Node], tenants: list[Tenant], tvars: dict[str, Any],
                         tls: bool) -> None:
    """What several etcd clusters in one topology need (docs/day2.md, "Several etcd
    clusters"): each converged as a view of its own (Topology.view), so a load balancer
    serves one tenant; and, their members and tenants sharing the sandbox's one CA, etcd
    RBAC on every TLS cluster: a tenant's certificate is then refused wherever the tenant
    has no user, instead of reading the whole keyspace of a cluster with auth off."""
    for n in nodes:
        if "lb" in n.groups:
            _require(bool((n.vars or {}).get("lb_tenant")),
                     f"nodes ({n.name}): with several etcd clusters a load balancer serves one "
                     "tenant; give it vars {lb_tenant: <tenant>}")
    for n in nodes:
        if n.vars and "etcd_rbac" in n.vars:
            raise TopologyError(f"nodes ({n.name}).vars.etcd_rbac: set per topology, not "
                                "per node")
    if tls and "etcd_rbac" in tvars and not tvars["etcd_rbac"]:
        raise TopologyError(
            "vars.etcd_rbac: false is refused with several etcd clusters over TLS: they share "
            "the sandbox's CA, so without RBAC any tenant's certificate could read and write "
            "the whole keyspace of every cluster; remove it (RBAC confines each tenant to its "
            "prefix on its own cluster and refuses it on the others)")


def resolve_path(name_or_path: str) -> Path:
    """A topology given by name (``default``) or path; unknown names list the shipped ones."""
    p = Path(name_or_path)
    if p.suffix in (".yml", ".yaml") or os.sep in name_or_path:
        if not p.is_file():
            raise TopologyError(f"topology: file '{name_or_path}' not found")
        return p.resolve()
    candidate = REPO_ROOT / "inventories" / f"{name_or_path}.yml"
    if candidate.is_file():
        return candidate
    shipped = sorted(q.stem for q in (REPO_ROOT / "inventories").glob("*.yml"))
    raise TopologyError(f"topology: unknown topology '{name_or_path}'; shipped ones: "
                        f"{', '.join(shipped)} (or give a path to a .yml file)")


def load(name_or_path: str | Path) -> Topology:
    path = resolve_path(str(name_or_path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path.name}: not valid YAML ({exc})") from None
    return parse(data, path)


VIEW_KEYS = {"plugin", "view_of", "cluster"}


def load_inventory_source(path: Path, env_cluster: str = "") -> Topology:
    """What the inventory plugin reads from ``path``: a topology file (the view of
    ``env_cluster``, SANDBOX_CLUSTER, when given) or a view file, one etcd cluster's view of a
    topology file for tools that take an inventory path but no environment (the
    Vagrantfile's ansible provisioners: ``plugin: sandbox_topology``, ``view_of: <topology
    file>``, ``cluster: <name>``), whose cluster SANDBOX_CLUSTER may repeat but not
    contradict."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path.name}: not valid YAML ({exc})") from None
    if not (isinstance(data, dict) and "view_of" in data):
        topo = parse(data, path)
        return topo.view(env_cluster) if env_cluster else topo
    unknown = sorted(set(data) - VIEW_KEYS)
    if unknown:
        raise TopologyError(f"{path.name}: a view file has only {', '.join(sorted(VIEW_KEYS))}; "
                            f"unknown: {', '.join(map(str, unknown))}")
    cluster = data.get("cluster")
    if not isinstance(cluster, str) or not cluster:
        raise TopologyError(f"{path.name}: cluster: name the etcd cluster this file is a view of")
    if env_cluster and env_cluster != cluster:
        raise TopologyError(f"{path.name}: a view of etcd cluster '{cluster}', but "
                            f"{CLUSTER_ENV}={env_cluster}; unset it or use that cluster's view")
    target = Path(str(data["view_of"]))
    if not target.is_absolute():
        target = path.parent / target
    if not target.is_file():
        raise TopologyError(f"{path.name}: view_of: topology file '{target}' not found")
    return load(target.resolve()).view(cluster)
