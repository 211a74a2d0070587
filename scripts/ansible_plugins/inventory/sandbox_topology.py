"""Ansible inventory plugin: reads a sandbox topology file (``plugin: sandbox_topology``).

The backend (podman containers or Vagrant VMs) is taken from ``SANDBOX_BACKEND``
(default ``podman``). The parsing and validation live in ``scripts/sandboxlib`` so the CLI
and the Vagrantfile see exactly the same hosts and variables.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCUMENTATION = r"""
name: sandbox_topology
short_description: k0s external-etcd sandbox topology files
description:
  - Reads C(inventories/*.yml) topology files of the k0s external-etcd sandbox.
  - Hosts get C(ansible_host) and C(node_address) for the backend in C(SANDBOX_BACKEND).
  - A topology with several etcd clusters is read one cluster at a time, the one named in
    C(SANDBOX_CLUSTER) (its members, tenants, controllers and load balancers in the groups);
    without it no node is in a group (playbooks/validate.yml says which to name). A view file
    (C(plugin), C(view_of) the topology file, C(cluster)) is that cluster's view without the
    environment variable (the Vagrantfile's provisioners use them).
options:
  plugin:
    description: Marks the file as a sandbox topology.
    required: true
    choices: [sandbox_topology]
"""

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

_SCRIPTS = Path(__file__).resolve().parents[2]
if str(_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(_SCRIPTS))

from sandboxlib import inventory as sandbox_inventory
from sandboxlib import topology as sandbox_topology


class InventoryModule(BaseInventoryPlugin):
    NAME = "sandbox_topology"

    def verify_file(self, path: str) -> bool:
        if not super().verify_file(path):
            return False
        try:
            with open(path, encoding="utf-8") as fh:
                head = fh.read(4096)
        except OSError:
            return False
        return any(line.strip() == f"plugin: {self.NAME}" for line in head.splitlines())

    def parse(self, inventory, loader, path, cache=True):  # type: ignore[no-untyped-def]
        super().parse(inventory, loader, path, cache)
        try:
            topo = sandbox_topology.load_inventory_source(
                Path(path).resolve(), os.environ.get(sandbox_topology.CLUSTER_ENV, ""))
            data = sandbox_inventory.build(topo)
        except sandbox_topology.TopologyError as exc:
            raise AnsibleParserError(f"{path}: {exc}") from None
        for group, members in data["groups"].items():
            self.inventory.add_group(group)
            for host in members:
                self.inventory.add_host(host, group=group)
        for host, hostvars in data["hosts"].items():
            self.inventory.add_host(host)
            for key, value in hostvars.items():
                self.inventory.set_variable(host, key, value)
        for key, value in data["vars"].items():
            self.inventory.set_variable("all", key, value)
