#!/usr/bin/python
# ruff: noqa: EXE001 -- an Ansible module: the shebang names its interpreter, the file is not executable
"""What a node was converged to, recorded at the end of a converge and compared before one.

At the end of a successful ``scripts/sandbox up`` (the last play of playbooks/site.yml) every
node records, in one module run, the inputs it was converged with (digests the CLI computed:
the roles, playbooks and plugins, the resolved topology, the variables, the versions) and
the live state of everything the roles manage on it: each managed file's checksum, mode and
owner, each service's ActiveState and enablement, each user, each package's version, and
the output of each role's state script (etcd RBAC). What is managed comes from the roles
themselves: each role's probe sets a ``sandbox_manages_<role>`` fact (paths, services, users,
packages, scripts), the same paths it probes to decide what to change.

Before converging, ``scripts/sandbox up`` runs THIS file on every node at once over SSH
(``python3 - --sandbox-check PATH``, no Ansible: one round trip per node): it reads the
record again, reads the live state of what it lists, and prints JSON with the recorded
inputs and every difference. The core below uses the standard library only; Ansible's
module machinery is imported only when Ansible runs it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sandbox_fingerprint
author: k0s-etcd-sandbox project (!UNKNOWN)
short_description: Record what a node was converged to (inputs and live state)
description:
  - Writes O(path) (JSON, root 0600, its directory 0700) with O(inputs) and the live state of
    everything O(manages) lists; only when its content differs.
  - The same file, run as C(python3 - --sandbox-check PATH) on the node, compares the live
    state with the record and prints the differences as JSON (scripts/sandbox up).
options:
  path:
    description: Where the record is kept on the node.
    type: path
    default: /var/lib/k0sbox/converged.json
  inputs:
    description: The digests of the converge's inputs (the CLI's), kept as they are.
    type: dict
    required: true
  manages:
    description: >-
      What the roles manage here, one entry per role with C(paths), C(services), C(users),
      C(packages) (lists of names) and C(scripts) (name -> bash script whose output is kept
      as its sha256).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Record what this node was converged to
  k0sbox.external_etcd.sandbox_fingerprint:
    path: /var/lib/k0sbox/converged.json
    inputs: {roles: "sha256 of the roles"}
    manages:
      - {paths: [/etc/etcd/etcd.env], services: [etcd], users: [etcd], packages: [], scripts: {}}
"""

RETURN = r"""
counts:
  description: How many files, services, users, packages and scripts were recorded.
  type: dict
  returned: always
"""

import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys
from typing import Any

KINDS = ("paths", "services", "users", "packages")


def merge(manages: list[dict[str, Any]]) -> dict[str, Any]:
    """The roles' entries as one: sorted unique names per kind, scripts by name."""
    out: dict[str, Any] = {kind: sorted({str(x) for m in manages for x in m.get(kind) or []})
                           for kind in KINDS}
    out["scripts"] = {str(k): str(v) for m in manages for k, v in (m.get("scripts") or {}).items()}
    return out


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def path_state(path: str) -> str:
    """``<sha256> <mode>:<owner>:<group>`` of a file (sandbox_probe's format), ``dir ...`` of a
    directory, ``link <target>`` of a symlink, ``absent``."""
    try:
        st = os.lstat(path)
    except OSError:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return f"link {os.readlink(path)}"
    attrs = (f"{stat.S_IMODE(st.st_mode):o}:{_name(pwd.getpwuid, st.st_uid)}:"
             f"{_name(grp.getgrgid, st.st_gid)}")
    if stat.S_ISDIR(st.st_mode):
        return f"dir {attrs}"
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        return f"unreadable ({exc.strerror}) {attrs}"
    return f"{digest.hexdigest()} {attrs}"


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


def services_state(units: list[str]) -> dict[str, str]:
    """unit -> ``<ActiveState>/<UnitFileState>`` (one systemctl call)."""
    if not units:
        return {}
    out = _run(["systemctl", "show", "--property=ActiveState,UnitFileState", "--", *units])
    blocks = out.strip("\n").split("\n\n")
    states = {}
    for unit, block in zip(units, blocks + [""] * len(units)):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[unit] = f"{props.get('ActiveState', '?')}/{props.get('UnitFileState') or '-'}"
    return states


def users_state(names: list[str]) -> dict[str, str]:
    """user -> ``uid:gid:home:shell``, or ``absent``."""
    states = {}
    for name in names:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            states[name] = "absent"
            continue
        states[name] = f"{pw.pw_uid}:{pw.pw_gid}:{pw.pw_dir}:{pw.pw_shell}"
    return states


def packages_state(names: list[str]) -> dict[str, str]:
    """package -> installed version, or ``absent`` (one dpkg-query call)."""
    if not names:
        return {}
    out = _run(["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Status} ${Version}\n",
                "--", *names])
    found = {}
    for line in out.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[1] == "installed":
            found[parts[0]] = parts[2]
    return {name: found.get(name, "absent") for name in names}


def scripts_state(scripts: dict[str, str]) -> dict[str, str]:
    """name -> sha256 of the script's output and its exit code."""
    states = {}
    for name, script in scripts.items():
        try:
            done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, check=False)
        except OSError as exc:
            states[name] = f"not run ({exc.strerror})"
            continue
        states[name] = f"{hashlib.sha256(done.stdout).hexdigest()} rc={done.returncode}"
    return states


def live_state(merged: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {"files": {p: path_state(p) for p in merged["paths"]},
            "services": services_state(merged["services"]),
            "users": users_state(merged["users"]),
            "packages": packages_state(merged["packages"]),
            "scripts": scripts_state(merged["scripts"])}


def counts(state: dict[str, dict[str, str]]) -> dict[str, int]:
    return {kind: len(values) for kind, values in state.items()}


def _file_change(path: str, was: str, now: str) -> str:
    if now == "absent":
        return f"file {path}: removed"
    if was == "absent":
        return f"file {path}: exists (it did not)"
    w, n = was.split(" ", 1), now.split(" ", 1)
    what = []
    if w[0] != n[0]:
        what.append("content changed" if len(w[0]) == len(n[0]) == 64 else f"{w[0]} -> {n[0]}")
    if len(w) == 2 and len(n) == 2 and w[1] != n[1]:
        wm, wo = w[1].split(":", 1)
        nm, no = n[1].split(":", 1)
        if wm != nm:
            what.append(f"mode {wm} -> {nm}")
        if wo != no:
            what.append(f"owner {wo} -> {no}")
    return f"file {path}: {', '.join(what) or f'{was} -> {now}'}"


def differences(recorded: dict[str, dict[str, str]], now: dict[str, dict[str, str]]) -> list[str]:
    """One line per thing whose live state is not the recorded one."""
    out = []
    for kind in ("users", "services", "packages", "scripts", "files"):   # causes first
        was_all, now_all = recorded.get(kind) or {}, now.get(kind) or {}
        for name in sorted(was_all):
            was, cur = was_all[name], now_all.get(name, "absent")
            if was == cur:
                continue
            if kind == "files":
                out.append(_file_change(name, was, cur))
            elif kind == "users":
                out.append(f"user {name}: {'removed' if cur == 'absent' else f'{was} -> {cur}'}")
            elif kind == "scripts":
                out.append(f"{name}: its output changed")
            else:
                out.append(f"{kind[:-1]} {name}: {was} -> {cur}")
    return out


def check(path: str) -> dict[str, Any]:
    """The record at ``path`` against the live state now (what ``--sandbox-check`` prints)."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"record": False, "reason": f"no record of a finished converge ({exc.__class__.__name__})"}
    now = live_state(record.get("manages") or merge([]))
    return {"record": True, "inputs": record.get("inputs") or {},
            "differs": differences(record.get("state") or {}, now), "counts": counts(now)}


def write_record(path: str, content: str) -> bool:
    """``content`` at ``path`` (root 0600 in a 0700 directory) unless it is there already."""
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == content:
                return False
    except OSError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(content)
    os.replace(tmp, path)
    return True


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "default": "/var/lib/k0sbox/converged.json"},
                       "inputs": {"type": "dict", "required": True},
                       "manages": {"type": "list", "elements": "dict", "default": []}},
        supports_check_mode=True,
    )
    merged = merge(module.params["manages"])
    state = live_state(merged)
    content = json.dumps({"inputs": module.params["inputs"], "manages": merged, "state": state},
                         indent=1, sort_keys=True) + "\n"
    changed = False
    if not module.check_mode:
        try:
            changed = write_record(module.params["path"], content)
        except OSError as exc:
            module.fail_json(msg=f"{module.params['path']}: {exc}")
    module.exit_json(changed=changed, counts=counts(state))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sandbox-check"]:
        print(json.dumps(check(sys.argv[2] if len(sys.argv) > 2 else
                               "/var/lib/k0sbox/converged.json")))
    else:
        main()
