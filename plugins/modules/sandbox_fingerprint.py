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
  op:
    description:
      - C(record) writes the record. C(units) checks each managed service against what its
        role gives it (drop-ins no role wrote, its process's environment and command line
        against its unit's) and returns C(units), C(removed) and C(restart).
    type: str
    choices: [record, units]
    default: record
  inputs:
    description: The digests of the converge's inputs (the CLI's), kept as they are (O(op=record)).
    type: dict
  fix:
    description: With O(op=units), remove the drop-ins no role wrote (then daemon-reload).
    type: bool
    default: false
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
  returned: O(op=record)
units:
  description: Managed service -> what differs from what its role gives it (empty when nothing).
  type: dict
  returned: O(op=units)
removed:
  description: The drop-ins removed (O(fix)).
  type: list
  returned: O(op=units)
restart:
  description: The services whose unit or process differed (to restart the role's way).
  type: list
  returned: O(op=units)
sandbox_warnings:
  description: One line per drop-in removed (scripts/sandbox up prints them as warnings).
  type: list
  returned: O(op=units)
"""

import grp
import hashlib
import json
import os
import pwd
import re
import shlex
import stat
import subprocess
import sys
from typing import Any

KINDS = ("paths", "services", "users", "packages")
UNIT_PROPERTIES = ("ActiveState", "UnitFileState", "LoadState", "MainPID", "DropInPaths",
                   "Environment", "EnvironmentFiles", "ExecStart")


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


def _show(units: list[str]) -> dict[str, dict[str, list[str]]]:
    """unit -> property -> values (EnvironmentFiles may repeat), in one systemctl call."""
    if not units:
        return {}
    out = _run(["systemctl", "show", f"--property={','.join(UNIT_PROPERTIES)}", "--", *units])
    blocks = out.strip("\n").split("\n\n")
    shown: dict[str, dict[str, list[str]]] = {}
    for unit, block in zip(units, blocks + [""] * len(units)):
        props: dict[str, list[str]] = {}
        for line in block.splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                props.setdefault(key, []).append(value)
        shown[unit] = props
    return shown


def services_state(units: list[str], shown: dict[str, dict[str, list[str]]] | None = None
                   ) -> dict[str, str]:
    """unit -> ``<ActiveState>/<UnitFileState>``."""
    shown = _show(units) if shown is None else shown
    states = {}
    for unit in units:
        props = {k: v[-1] for k, v in shown.get(unit, {}).items() if v}
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


# What systemd itself gives every service (systemd.exec(5), "Environment Variables in Spawned
# Processes"), besides its manager's environment (systemctl show-environment).
SYSTEMD_ENV = frozenset((
    "PATH", "LANG", "USER", "LOGNAME", "HOME", "SHELL", "INVOCATION_ID", "JOURNAL_STREAM",
    "NOTIFY_SOCKET", "MAINPID", "MANAGERPID", "SYSTEMD_EXEC_PID", "LISTEN_FDS", "LISTEN_PID",
    "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC", "TERM", "RUNTIME_DIRECTORY",
    "STATE_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY",
    "CREDENTIALS_DIRECTORY", "PIDFILE", "MEMORY_PRESSURE_WATCH", "MEMORY_PRESSURE_WRITE"))
# What a service sets for itself before it re-executes: HAProxy's master on a reload
# (haproxy.c, mworker_reexec: HAPROXY_MWORKER_REEXEC, HAPROXY_LOCALPEER, ...).
SELF_SET = ("HAPROXY_",)
# Read only at bootstrap (an empty data directory), rewritten without a restart when members
# are added (roles/etcd: etcd-initial-cluster.env, etcd-state.env): a running member keeps
# the values it started with, which is no drift.
BOOTSTRAP_ONLY = frozenset(("ETCD_INITIAL_CLUSTER", "ETCD_INITIAL_CLUSTER_STATE"))
# Drop-ins there come with a package (the roles install the package): not the admin's.
VENDOR_DIRS = ("/usr/lib/systemd/", "/lib/systemd/")


def _env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile (comments, blank lines and quotes as systemd)."""
    env = {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return {}
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def unit_environment(props: dict[str, list[str]]) -> dict[str, str]:
    """What the unit gives the process: Environment=, then each EnvironmentFile= (which wins)."""
    env = dict(x.split("=", 1) for v in props.get("Environment", []) for x in shlex.split(v)
               if "=" in x)
    for entry in props.get("EnvironmentFiles", []):
        path = entry.split(" (", 1)[0]
        env.update(_env_file(path.removeprefix("-")))
    return env


def _expand(argv: str, env: dict[str, str]) -> list[str]:
    """ExecStart's argv[] with $NAME (split into words) and ${NAME} as systemd expands them."""
    words: list[str] = []
    for word in argv.split():
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                                lambda m: env.get(m.group(1), ""), word))
    return words


def process_environ(pid: int) -> dict[str, str] | None:
    """/proc/<pid>/environ, read as the process's owner when root may not (no CAP_SYS_PTRACE
    in a container)."""
    path = f"/proc/{pid}/environ"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except PermissionError:
        try:
            st = os.stat(f"/proc/{pid}")
            done = subprocess.run(["cat", path], user=st.st_uid, group=st.st_gid,
                                  extra_groups=[], capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        data = done.stdout
    except OSError:
        return None
    return dict(x.split("=", 1) for x in data.decode(errors="replace").split("\0") if "=" in x)


def _dropin_summary(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [x.strip() for x in fh if x.strip() and x.strip()[0] not in "#;["]
    except OSError:
        return "unreadable"
    text = "; ".join(lines)
    return text if len(text) <= 120 else text[:117] + "..."


def unit_drift(unit: str, props: dict[str, list[str]], managed: set[str],
               manager_env: dict[str, str]) -> tuple[list[str], list[str]]:
    """(problems, foreign drop-ins) of a managed service: drop-ins no role wrote, a running
    process whose environment or command line is not what its unit gives it now."""
    name = unit if "." in unit else f"{unit}.service"
    dropins = [p for v in props.get("DropInPaths", []) for p in v.split()]
    foreign = [p for p in dropins if p not in managed and not p.startswith(VENDOR_DIRS)]
    problems = [f"{name}: drop-in {p} is not the roles' ({_dropin_summary(p)})" for p in foreign]
    pid = int((props.get("MainPID") or ["0"])[-1] or 0)
    if pid <= 0:
        return problems, foreign
    given = unit_environment(props)
    running = process_environ(pid)
    if running is None:
        problems.append(f"{name}: the environment of its process {pid} could not be read")
    else:
        extra = sorted(k for k in running if k not in given and k not in manager_env
                       and k not in SYSTEMD_ENV and not k.startswith(SELF_SET))
        other = sorted(k for k in given if running.get(k) != given[k] and k not in BOOTSTRAP_ONLY)
        problems += [f"{name}: its process {pid} runs with {k}={running[k]}, which its unit "
                     "does not give (restart it)" for k in extra]
        problems += [f"{name}: its process {pid} runs with {k}="
                     f"{running.get(k, '(unset)')}, its unit gives {given[k]} (restart it)"
                     for k in other]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = [x.decode(errors="replace") for x in fh.read().split(b"\0") if x]
    except OSError:
        cmdline = []
    starts = [_expand(a, {**manager_env, **given})
              for a in re.findall(r"argv\[\]=(.*?) ; ", " ".join(props.get("ExecStart", [])))]
    if cmdline and starts and not any(_started_as(cmdline, a) for a in starts):
        problems.append(f"{name}: its process {pid} runs {' '.join(cmdline)[:160]}, its unit "
                        f"starts {' '.join(starts[0])[:160]} (restart it)")
    return problems, foreign


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def _started_as(cmdline: list[str], argv: list[str]) -> bool:
    """The process runs ``argv``: its command line begins with it or, where argv[0] is a
    script, holds it after the interpreter the kernel put first (binfmt_script: the
    interpreter and its one optional argument, then the script's path; `#!/usr/bin/env X`
    leaves X and the path)."""
    if cmdline[:len(argv)] == argv:
        return True
    return bool(argv) and _is_script(argv[0]) and any(
        cmdline[i:i + len(argv)] == argv for i in (1, 2))


def units_drift(merged: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    """unit_drift of every managed service (one systemctl call for all)."""
    shown = _show(merged["services"])
    manager_env = dict(x.split("=", 1) for x in _run(["systemctl", "show-environment"]).split("\n")
                       if "=" in x)
    managed = set(merged["paths"])
    # A service listed only to be kept off (k0s's conflicting services) runs nothing here.
    return {u: unit_drift(u, shown[u], managed, manager_env) for u in merged["services"]
            if u in shown and _runs(shown[u])}


def _runs(props: dict[str, list[str]]) -> bool:
    last = {k: v[-1] for k, v in props.items() if v}
    return last.get("LoadState") == "loaded" and (
        last.get("ActiveState") not in ("inactive", "failed", None)
        or last.get("UnitFileState") == "enabled")


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
    merged = record.get("manages") or merge([])
    now = live_state(merged)
    drift = [p for problems, _foreign in units_drift(merged).values() for p in problems]
    return {"record": True, "inputs": record.get("inputs") or {},
            "differs": differences(record.get("state") or {}, now) + drift, "counts": counts(now)}


def units(path: str, manages: list[dict[str, Any]], fix: bool) -> dict[str, Any]:
    """op=units: each managed service's drift (``manages``, else the record's); with ``fix``
    its foreign drop-ins removed (then daemon-reload) and the services to restart named."""
    merged = merge(manages)
    if not manages:
        try:
            with open(path, encoding="utf-8") as fh:
                merged = json.load(fh).get("manages") or merged
        except (OSError, ValueError):
            pass
    drift = units_drift(merged)
    removed = [p for _problems, foreign in drift.values() for p in foreign] if fix else []
    notes = [f"removed {p}, a drop-in no role wrote ({_dropin_summary(p)}): the service "
             "restarts as its role restarts it" for p in removed]
    for dropin in removed:
        os.remove(dropin)
    if removed:
        _run(["systemctl", "daemon-reload"])
    return {"changed": bool(removed), "removed": removed, "sandbox_warnings": notes,
            "units": {u: problems for u, (problems, _foreign) in drift.items()},
            "restart": sorted(u for u, (problems, _foreign) in drift.items() if problems)}


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
                       "op": {"type": "str", "default": "record", "choices": ["record", "units"]},
                       "inputs": {"type": "dict"},
                       "manages": {"type": "list", "elements": "dict", "default": []},
                       "fix": {"type": "bool", "default": False}},
        required_if=[("op", "record", ["inputs"])],
        supports_check_mode=True,
    )
    if module.params["op"] == "units":
        try:
            result = units(module.params["path"], module.params["manages"],
                           module.params["fix"] and not module.check_mode)
        except OSError as exc:
            module.fail_json(msg=f"removing a drop-in: {exc}")
        for note in result["sandbox_warnings"]:
            module.warn(note)
        module.exit_json(**result)
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
