#!/usr/bin/python
# ruff: noqa: EXE001 -- an Ansible module: the shebang names its interpreter, the file is not executable
"""Write several small text files (and their directories) in ONE module run.

The roles probe a node once and copy only what differs (plugins/filter/sandbox_probe.py);
on a cold node everything differs, and ``ansible.builtin.copy`` costs two module runs and a
file transfer per file (remote stat, put, copy): measured about 1 s per file on a 2-core
host, 5-10 files per node. This module takes the files' contents in its arguments and
writes them all in one run, with the same helpers ``copy`` uses for owners and modes
(``AnsibleModule.set_fs_attributes_if_different``). Each file is written to a temporary
file beside it, given its owner, group and mode, then renamed over the old one: a reader
(etcd re-reads its certificate on each connection) sees the old file or the new, never a
partial one, and a key is never readable by others, not even for a moment.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sandbox_files
author: k0s-etcd-sandbox project (!UNKNOWN)
short_description: Write several small text files and directories in one module run
description:
  - Each entry is a directory (O(files[].state=directory)) or a text file with its
    O(files[].content), owner, group and mode. A file is replaced atomically (temporary
    file with the final owner and mode, then renamed) only when its content differs;
    owner, group and mode are corrected in place.
  - The contents are never logged (they may be private keys).
options:
  files:
    description: The files and directories, in order (a directory before its files).
    type: list
    elements: dict
    required: true
    suboptions:
      dest: {description: Absolute path., type: path, required: true}
      content: {description: Text of the file., type: str, default: ""}
      state: {description: file or directory., type: str, choices: [file, directory], default: file}
      owner: {description: Owner name (unset - the running user's for a new file; left as it is otherwise)., type: str}
      group: {description: Group name (unset - as owner)., type: str}
      mode: {description: Octal mode as a string., type: str, required: true}
      force:
        description: Replace a file whose content differs; false writes it only when missing.
        type: bool
        default: true
"""

EXAMPLES = r"""
- name: Write a directory and a file in one module run
  k0sbox.external_etcd.sandbox_files:
    files:
      - {dest: /etc/etcd, state: directory, owner: root, group: root, mode: "0755"}
      - {dest: /etc/etcd/etcdctl.env, content: "ETCDCTL_API=3\n", owner: root, group: root, mode: "0644"}
"""

RETURN = r"""
changed_files:
  description: The paths written or whose owner, group or mode was corrected.
  type: list
  elements: str
  returned: always
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _attrs(module: AnsibleModule, path: str, entry: dict) -> dict:
    return module.load_file_common_arguments(
        {"path": path, "owner": entry["owner"], "group": entry["group"], "mode": entry["mode"]})


def _write(module: AnsibleModule, entry: dict) -> bool:
    dest = entry["dest"]
    if entry["state"] == "directory":
        changed = False
        if not os.path.isdir(dest):
            changed = True
            if not module.check_mode:
                os.makedirs(dest, mode=0o700)
        if module.check_mode and changed:
            return True
        return module.set_fs_attributes_if_different(_attrs(module, dest, entry), changed)
    data = entry["content"].encode("utf-8")
    exists = os.path.lexists(dest)
    differs = not exists
    if exists and entry["force"]:
        with open(dest, "rb") as fh:
            differs = fh.read() != data
    if differs:
        if module.check_mode:
            return True
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".sandbox_files.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            module.set_fs_attributes_if_different(_attrs(module, tmp, entry), True)
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return True
    return module.set_fs_attributes_if_different(_attrs(module, dest, entry), False)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True, "options": {
            "dest": {"type": "path", "required": True},
            "content": {"type": "str", "default": "", "no_log": True},
            "state": {"type": "str", "choices": ["file", "directory"], "default": "file"},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "mode": {"type": "str", "required": True},
            "force": {"type": "bool", "default": True},
        }}},
        supports_check_mode=True,
    )
    changed_files = []
    for entry in module.params["files"]:
        try:
            if _write(module, entry):
                changed_files.append(entry["dest"])
        except OSError as exc:
            module.fail_json(msg=f"{entry['dest']}: {exc}", changed_files=changed_files)
    module.exit_json(changed=bool(changed_files), changed_files=changed_files)


if __name__ == "__main__":
    main()
