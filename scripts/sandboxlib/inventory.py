"""Turn a :class:`~sandboxlib.topology.Topology` into Ansible inventory data.

Used by the inventory plugin (``scripts/ansible_plugins/inventory/sandbox_topology.py``), by the CLI and,
through ``scripts/sandbox inventory --json``, by the Vagrantfile, so that every entry point
sees the same hosts, groups and variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .sandbox_tenants import with_key_prefix
from .topology import BACKENDS, REPO_ROOT, Tenant, Topology, TopologyError

SSH_OPTS = ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o LogLevel=ERROR -o ConnectTimeout=10")


def selected_backend(explicit: str | None = None) -> str:
    backend = explicit or os.environ.get("SANDBOX_BACKEND") or "podman"
    if backend not in BACKENDS:
        raise TopologyError(f"backend: unknown backend '{backend}'; use "
                            f"{' or '.join(BACKENDS)} (SANDBOX_BACKEND or --backend)")
    return backend


def vagrant_key(topo: Topology, node: str) -> str:
    """The per-machine key Vagrant made, else Vagrant's insecure key.

    Vagrant's state dir is VAGRANT_DOTFILE_PATH (relative to the Vagrantfile's directory,
    the repository root), else .vagrant there, whatever directory the topology file is in.
    """
    root = REPO_ROOT / os.environ.get("VAGRANT_DOTFILE_PATH", ".vagrant")
    for provider in ("libvirt", "virtualbox"):
        key = root / "machines" / node / provider / "private_key"
        if key.is_file():
            return str(key)
    return str(Path.home() / ".vagrant.d" / "insecure_private_key")


VAGRANT_SSH_TIMEOUT = 30


def cluster_group(cluster: str) -> str:
    """The inventory group of one etcd cluster's members (every view of a topology with
    several has each): etcd_cluster_<name>, '-' as '_' (Ansible's group names)."""
    return "etcd_cluster_" + cluster.replace("-", "_")


def _tenant_var(t: Tenant) -> dict[str, Any]:
    """A tenant as the roles take it (k0s_tenants), key_prefix normalised here once."""
    return with_key_prefix({"name": t.name, "prefix": t.prefix,
                            "controllers": list(t.controllers),
                            **({"vars": t.vars} if t.vars else {}),
                            **({"max_bytes": t.max_bytes} if t.max_bytes is not None else {})})


def build(topo: Topology, backend: str | None = None) -> dict[str, Any]:
    """Inventory as {'hosts': {name: vars}, 'groups': {group: [names]}, 'vars': {...}}."""
    backend = selected_backend(backend)
    if backend not in topo.networks:
        raise TopologyError(f"networks.{backend}: topology '{topo.name}' has no {backend} "
                            f"network; add one under networks")
    state = topo.state_dir
    hosts: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {"etcd": [], "k0s_controller": [], "lb": []}
    tenant_of = {c: t.name for t in topo.all_tenants for c in t.controllers}
    in_view = {n.name for n in topo.nodes}
    # A topology with several etcd clusters converges one cluster's view at a time
    # (SANDBOX_CLUSTER; Topology.view): its members, tenants, controllers and load balancers in
    # the groups; every node a host (the PKI's certificates name them all). The whole file
    # (no cluster chosen) puts no node in a group: it serves nodes.yml (create, remove) only.
    whole_multi = topo.multi_cluster and not topo.cluster
    for node in topo.all_nodes:
        hv: dict[str, Any] = {
            "ansible_host": node.address(backend),
            "node_address": node.address(backend),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": SSH_OPTS,
            # The same as SSH_OPTS says, for Mitogen's SSH (ansible.cfg's strategy), which puts
            # its own StrictHostKeyChecking first: the nodes are the sandbox's own, new keys each.
            "ansible_host_key_checking": False,
        }
        if backend == "podman":
            hv.update(ansible_user="root",
                      ansible_ssh_private_key_file=str(state / "ssh" / "id_ed25519"),
                      sandbox_container=topo.container_name(node))
        else:
            # The connection timeout Vagrant's ansible provisioner gives `vagrant up`
            # (--timeout=30), for every later run too: Ansible's default 10 s let a verify of
            # VMs under TCG on a loaded host call a member unreachable.
            hv.update(ansible_user="vagrant", ansible_become=True,
                      ansible_ssh_private_key_file=vagrant_key(topo, node.name),
                      ansible_ssh_timeout=VAGRANT_SSH_TIMEOUT)
        if node.name in tenant_of:
            hv["k0s_tenant"] = tenant_of[node.name]
        hv.update(node.vars)
        if topo.multi_cluster and node.cluster:
            hv["etcd_cluster"] = node.cluster
        hosts[node.name] = hv
        if node.name in in_view and not whole_multi:
            for g in node.groups:
                groups[g].append(node.name)
    if not whole_multi:
        for t in topo.tenants:
            groups[f"tenant_{t.name.replace('-', '_')}"] = list(t.controllers)
    net = topo.networks[backend]
    allvars: dict[str, Any] = {
        "sandbox_name": topo.name,
        "sandbox_backend": backend,
        "sandbox_state_dir": str(state),
        "sandbox_topology_file": str(topo.path),
        "sandbox_network": {"name": topo.network_name(), "subnet": str(net),
                            "gateway": str(net.network_address + 1)},
        "sandbox_nodes": [{"name": n.name, "container": topo.container_name(n),
                           "address": n.address(backend), "groups": list(n.groups)}
                          for n in topo.all_nodes],
        "etcd_tls": topo.tls,
        "etcd_allow_even": topo.allow_even_etcd,
        # key_prefix: the prefix as kube-apiserver uses it, normalised here once for the roles.
        "k0s_tenants": [_tenant_var(t) for t in topo.tenants],
        "pki_dir": str(state / "pki"),
        # Tenants sharing a TLS cluster are confined to their prefixes by etcd RBAC unless the
        # topology says etcd_rbac: false (one tenant, or plain HTTP: off; RBAC needs TLS).
        # With several etcd clusters on every one (topology._multi_cluster_rules says why).
        "etcd_rbac": topo.tls and (len(topo.tenants) > 1 or topo.multi_cluster),
    }
    if topo.multi_cluster:
        members = [n.name for n in topo.all_nodes if "etcd" in n.groups]
        groups["sandbox_etcd_all"] = members
        # each cluster's members, in every view: what a tenant's move points it at
        for c in topo.clusters:
            groups[cluster_group(c)] = [n.name for n in topo.all_nodes
                                        if "etcd" in n.groups and n.cluster == c]
        allvars.update({
            "sandbox_clusters": list(topo.clusters),
            "sandbox_cluster": topo.cluster,
            # The PKI (one CA for the sandbox) issues every cluster's member and tenant
            # certificates in each view's run: the same inputs, so it stays current.
            "pki_etcd_group": "sandbox_etcd_all",
            "pki_tenants": [_tenant_var(t) for t in topo.all_tenants],
        })
        if topo.cluster:
            allvars["etcd_initial_cluster_token"] = f"{topo.name}-{topo.cluster}-etcd"
    allvars.update(topo.vars)
    return {"hosts": hosts, "groups": groups, "vars": allvars}
