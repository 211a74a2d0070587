#!/usr/bin/python
# ruff: noqa: EXE001 -- an Ansible module: the shebang names its interpreter, the file is not executable
"""Read a node once: what a role needs to know about it, in ONE module run, in ONE format.

Every role probes its nodes with this module (its tasks/probe.yml, roles/pki's
distribute.yml): the checksum, mode and owner of each file and directory it manages, as
``file:<path>`` -> ``<sha256> <mode>:<owner>:<group>`` (a directory: ``dir <mode>:<owner>:
<group>``; a missing path: no key; a symlink is followed and also gives ``link:<path>`` ->
its target), plus the role's own facts, the ``key=value`` lines a
short script prints (package versions, users, service states). The comparison with what
the role wants is plugins/filter/sandbox_probe.py's (``probe | probe_differs(entry)``,
``entries | probe_stale(probe)``), so a task only runs where something differs.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sandbox_probe
author: k0s-etcd-sandbox project (!UNKNOWN)
short_description: A node's managed files (checksum, mode, owner) and facts in one run
description:
  - Returns C(probe), a mapping of C(file:<path>) to C(<sha256> <mode>:<owner>:<group>) (a
    directory C(dir <mode>:<owner>:<group>)) for every path of O(paths) that exists, plus the
    C(key=value) lines O(script) prints (bash; C(key) may itself contain C(:)).
  - A path that is a symlink is followed (checksum, mode and owner of its target) and also
    gives C(link:<path>) -> the link's target; a file reached twice (a link and its target)
    is read once.
  - The mode is octal without leading zeros (C(600), C(2750)), as C(stat -c %a) prints it.
options:
  paths:
    description: Files and directories to read (absolute paths).
    type: list
    elements: str
    default: []
  script:
    description: A bash script whose C(key=value) output lines are added to the probe.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Read a node's files and facts in one round trip
  k0sbox.external_etcd.sandbox_probe:
    paths: [/etc/etcd/pki/ca.crt, /var/lib/etcd]
    script: |
      echo "version=$(etcd --version 2>/dev/null | sed -n 's/^etcd Version: //p')"
  register: probe
"""

RETURN = r"""
probe:
  description: What was found (see the description).
  type: dict
  returned: always
"""

import grp
import os
import pwd
import stat
import subprocess

from ansible.module_utils.basic import AnsibleModule


def _name(lookup: object, ident: int) -> str:
    try:
        return lookup(ident)[0]  # type: ignore[operator,index]
    except KeyError:
        return str(ident)


def path_line(module: AnsibleModule, path: str,
              digests: dict[tuple[int, int, int, int], str] | None = None) -> str | None:
    """``<sha256> <mode>:<owner>:<group>`` of a file, ``dir ...`` of a directory, None when
    the path does not exist (a symlink is followed, as sha256sum and stat -L would).
    ``digests``: checksums already read in this run, by file identity (a link and its target
    are read once: the binaries a role links to a read-only mount are large)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    attrs = (f"{stat.S_IMODE(st.st_mode):o}:{_name(pwd.getpwuid, st.st_uid)}:"
             f"{_name(grp.getgrgid, st.st_gid)}")
    if stat.S_ISDIR(st.st_mode):
        return f"dir {attrs}"
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    digest = (digests or {}).get(key) or module.sha256(path)
    if digests is not None and digest:
        digests[key] = digest
    return f"{digest} {attrs}" if digest else None


def script_facts(output: str) -> dict[str, str]:
    """The ``key=value`` lines of a script's output (split at the first '=')."""
    facts: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key:
            facts[key] = value
    return facts


def main() -> None:
    module = AnsibleModule(
        argument_spec={"paths": {"type": "list", "elements": "str", "default": []},
                       "script": {"type": "str", "default": ""}},
        supports_check_mode=True,
    )
    probe: dict[str, str] = {}
    if module.params["script"]:
        done = subprocess.run(["/bin/bash", "-c", module.params["script"]], capture_output=True,
                              text=True, check=False)
        probe.update(script_facts(done.stdout))
    digests: dict[tuple[int, int, int, int], str] = {}
    for path in module.params["paths"]:
        line = path_line(module, path, digests)
        if line is not None:
            probe[f"file:{path}"] = line
        if os.path.islink(path):
            probe[f"link:{path}"] = os.readlink(path)
    module.exit_json(changed=False, probe=probe)


if __name__ == "__main__":
    main()
