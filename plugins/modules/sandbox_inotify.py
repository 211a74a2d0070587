#!/usr/bin/python
# ruff: noqa: EXE001 -- an Ansible module: the shebang names its interpreter, the file is not executable
"""Make room for new nodes' inotify instances on the podman host, or say why there is none.

Every node is a system container whose systemd, logind and dbus each open inotify
instances (about 6 per node, more where an API server runs), and all of them count against
ONE limit: ``fs.inotify.max_user_instances`` of the host's root user (rootful podman has no
user namespace). The default, 128, is used up by about 19 running nodes; a node started past
it boots without sshd ("Connection refused" or "No route to host" for 90 s while the others
come up: seen here with several sandboxes and Molecule scenarios at once). kind documents the
same limit for its nodes. This module counts the instances root has open, and when the new
nodes would not fit raises the limit at run time (``raise_limit``; not persisted: the next
boot has the distribution's value again) or fails with the command to run.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sandbox_inotify
author: k0s-etcd-sandbox project (!UNKNOWN)
short_description: Check (and raise) the host's inotify instance limit before new nodes start
description:
  - Counts the inotify instances open by processes of the user running the module and
    compares them plus O(nodes) times O(per_node) with C(fs.inotify.max_user_instances).
  - When they do not fit, raises the limit at run time (O(raise_limit)) to the next multiple
    of 512 with O(headroom) to spare, or fails with the sysctl command to run.
options:
  nodes: {description: How many nodes are about to start., type: int, required: true}
  per_node: {description: Instances one node uses., type: int, default: 8}
  headroom: {description: Instances left free after the new nodes., type: int, default: 64}
  raise_limit: {description: Raise the limit when needed (root only)., type: bool, default: true}
  proc: {description: Where procfs is mounted (tests)., type: path, default: /proc}
"""

EXAMPLES = r"""
- name: Make room for three new nodes' inotify instances
  k0sbox.external_etcd.sandbox_inotify:
    nodes: 3
"""

RETURN = r"""
limit: {description: The limit after the run., type: int, returned: always}
used: {description: Instances open by this user before the new nodes., type: int, returned: always}
needed: {description: Instances the new nodes and the headroom need., type: int, returned: always}
previous_limit: {description: The limit before the run., type: int, returned: always}
"""

import os
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

SYSCTL = "sys/fs/inotify/max_user_instances"


def count_instances(proc: Path, uid: int) -> int:
    """inotify instances open by processes of ``uid`` (one per fd whose link is
    anon_inode:inotify; a process that ends while it is read counts what was read)."""
    total = 0
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            if pid.stat().st_uid != uid:
                continue
            for fd in (pid / "fd").iterdir():
                try:
                    if os.readlink(fd) == "anon_inode:inotify":
                        total += 1
                except OSError:
                    continue
        except OSError:
            continue
    return total


def plan(limit: int, used: int, nodes: int, per_node: int, headroom: int) -> int:
    """The limit needed (0 when the current one is enough)."""
    want = used + nodes * per_node + headroom
    if want <= limit:
        return 0
    return -(-want // 512) * 512


def main() -> None:
    module = AnsibleModule(argument_spec={
        "nodes": {"type": "int", "required": True},
        "per_node": {"type": "int", "default": 8},
        "headroom": {"type": "int", "default": 64},
        "raise_limit": {"type": "bool", "default": True},
        "proc": {"type": "path", "default": "/proc"},
    }, supports_check_mode=True)
    p = module.params
    proc = Path(p["proc"])
    limit = int((proc / SYSCTL).read_text().strip())
    used = count_instances(proc, os.geteuid())
    new_limit = plan(limit, used, p["nodes"], p["per_node"], p["headroom"])
    result = {"changed": False, "limit": limit, "previous_limit": limit, "used": used,
              "needed": used + p["nodes"] * p["per_node"] + p["headroom"]}
    if not new_limit:
        module.exit_json(**result)
    why = (f"fs.inotify.max_user_instances is {limit} and {used} are in use: {p['nodes']} new "
           f"node(s) need about {p['per_node']} each, so their systemd would start without sshd")
    if not p["raise_limit"] or os.geteuid() != 0:
        module.fail_json(msg=f"{why}; raise it: sysctl -w fs.inotify.max_user_instances="
                             f"{new_limit} (to keep it: a file in /etc/sysctl.d/), or remove "
                             "other sandboxes' nodes first", **result)
    if not module.check_mode:
        (proc / SYSCTL).write_text(f"{new_limit}\n")
    result.update(changed=True, limit=new_limit,
                  msg=f"{why}; raised to {new_limit} for this boot (to keep it: "
                      f"fs.inotify.max_user_instances = {new_limit} in /etc/sysctl.d/)")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
