"""A no-op ``up`` costs one probe per node: what a converge was given and left, compared first.

After a successful converge (site.yml, verify included) two records say what the sandbox was
converged to:

- on each node, ``/var/lib/k0sbox/converged.json`` (root 0600; playbooks/record.yml with
  plugins/modules/sandbox_fingerprint.py): the inputs below and the live state of everything
  the roles manage there (files' checksums, modes and owners; services; users; packages;
  with etcd RBAC, its users and roles);
- on the control node, ``<state dir>/converged.json`` (record.py): the same inputs, plus the
  digest of the control node's own files (PKI, the stand-in's PKI, kubeconfigs, the SSH key)
  and when the first certificate comes within ``pki_renew_before_days`` of its expiry.

``up`` (podman, without ``--force``) first computes the inputs again, then in parallel runs
the module's check on every node over SSH (one round trip each) and asks every member's
``/health``. Everything equal: nothing to change. Anything else: the full converge, with the
reasons. Every command that changes the sandbox removes the control node's record first
(runner.run_context), and so does pki.yml at the start of every converge, so a converge that
did not finish, a day-2 operation or a plain ansible-playbook run makes the next ``up``
converge.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import apiserver, etcdbuild, etcdhttp, inventory, record, remote
from .topology import REPO_ROOT, Topology

NO_RECORD = ("no record of a finished converge on the control node (a first up, --force, or a "
             "converge or day-2 command since)")
NODE_RECORD = "/var/lib/k0sbox/converged.json"
MODULE = REPO_ROOT / "plugins" / "modules" / "sandbox_fingerprint.py"
# What decides a node's state, besides the topology and the variables.
CODE = ("roles", "playbooks", "plugins", "ansible.cfg", "requirements.txt")
# The control node's files a converge reads or writes (certificates, keys, kubeconfigs).
LOCAL_FILES = ("pki", "kube", "kubeconfig", "ssh")
CACHES = (".cache/k0s", ".cache/etcd")   # downloads the roles use when they are there
# Variables of the run that are not inputs: how the CLI drives the run.
NOT_INPUTS = ("sandbox_validated", "sandbox_converge_inputs")
LABELS = {"code": "roles/, playbooks/, plugins/ (or ansible.cfg, requirements.txt)",
          "topology": "the topology (its resolved hosts, groups and variables)",
          "variables": "the variables (--set, --etcd-install, --apiserver, K0S_BINARY)",
          "versions": "the versions (the API server build, cached k0s or etcd downloads)",
          "local files": "the control node's PKI, kubeconfigs or SSH key"}


def _files(paths: Iterable[Path]) -> Iterable[Path]:
    for top in paths:
        if top.is_file():
            yield top
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".pyc"):
                    yield Path(d) / name


def tree_digest(paths: Iterable[Path], base: Path, contents: bool = True) -> str:
    """sha256 over each file's path (relative to ``base``), mode and content (or, with
    ``contents`` false, size and modification time: large cached downloads)."""
    digest = hashlib.sha256()
    for path in _files(paths):
        try:
            st = path.stat()
            digest.update(f"{os.path.relpath(path, base)}\0{st.st_mode:o}\0".encode())
            if contents:
                digest.update(path.read_bytes())
            else:
                digest.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            digest.update(f"{path}\0unreadable".encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _json_digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def inputs(topo: Topology, backend: str, extra: dict[str, Any]) -> dict[str, str]:
    """The digests of what decides the nodes' state, known before the converge."""
    variables = {k: v for k, v in extra.items() if k not in NOT_INPUTS}
    binary = os.environ.get("K0S_BINARY", "")
    versions = [tree_digest([REPO_ROOT / c for c in CACHES], REPO_ROOT, contents=False)]
    if binary:
        versions.append(tree_digest([Path(binary)], Path("/"), contents=False))
    for key in ("crd_apiserver_dir", "etcd_package_dir"):   # the builds' caches
        build = extra.get(key)
        if build:
            versions.append(tree_digest([Path(build)], Path(build).parent, contents=False))
    return {"code": tree_digest([REPO_ROOT / p for p in CODE], REPO_ROOT),
            "topology": _json_digest(inventory.build(topo, backend)),
            "variables": _json_digest({"vars": variables, "K0S_BINARY": binary}),
            "versions": _json_digest(versions)}


def local_files(topo: Topology) -> str:
    return tree_digest([topo.state_dir / p for p in LOCAL_FILES], topo.state_dir)


def renew_window_days(topo: Topology, extra: dict[str, Any]) -> float:
    """pki_renew_before_days as the converge sees it: --set, the topology, the role default."""
    for source in (extra, topo.vars):
        if "pki_renew_before_days" in source:
            return float(source["pki_renew_before_days"])
    defaults = yaml.safe_load((REPO_ROOT / "roles/pki/defaults/main.yml").read_text()) or {}
    return float(defaults.get("pki_renew_before_days", 30))


def first_expiry(topo: Topology) -> tuple[float, str] | None:
    """(time, file) of the control node's certificate that expires first."""
    from cryptography import x509

    first: tuple[float, str] | None = None
    for path in _files([topo.state_dir / "pki", topo.state_dir / "kube"]):
        if path.suffix != ".crt" or "pre-ca-rotate" in str(path):
            continue
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError):
            continue
        ends = cert.not_valid_after_utc.timestamp()
        if first is None or ends < first[0]:
            first = (ends, str(path.relative_to(topo.state_dir)))
    return first


def seal(topo: Topology, given: dict[str, str], extra: dict[str, Any]) -> None:
    """After a successful converge: the control node's record."""
    expiry = first_expiry(topo)
    window = renew_window_days(topo, extra) * 86400
    data = {"inputs": {**given, "local files": local_files(topo)},
            "nodes": [n.name for n in topo.nodes],
            "renew_after": expiry[0] - window if expiry else None,
            "renew_file": expiry[1] if expiry else "", "sealed_at": time.time()}
    path = record.path(topo)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    path.chmod(0o600)


@dataclass
class Result:
    reasons: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    took: float = 0.0

    @property
    def unchanged(self) -> bool:
        return not self.reasons


def _node_check(target: remote.Target) -> dict[str, Any]:
    """The module's check on the node (its source through SSH's stdin)."""
    command = f"python3 - --sandbox-check {shlex.quote(NODE_RECORD)}"
    try:
        done = subprocess.run(remote.ssh_argv(target, command, connect_timeout=5),
                              input=MODULE.read_text(), capture_output=True, text=True,
                              timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "no answer within 60s"}
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")
        return {"error": f"unreachable or failed ({lines.splitlines()[-1]})"}
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        return {"error": f"unexpected answer ({done.stdout.strip()[:80]})"}
    return answer if isinstance(answer, dict) else {"error": "unexpected answer"}


def _containers(topo: Topology) -> dict[str, str]:
    """node -> podman state, for this sandbox's containers."""
    from .context import podman_json

    found = podman_json("ps", "-a", "--format", "json", "--filter",
                        f"label=k0s-etcd-sandbox={topo.name}")
    names = {topo.container_name(n): n.name for n in topo.nodes}
    return {names[c["Names"][0]]: str(c.get("State", "?")) for c in found
            if (c.get("Names") or [None])[0] in names}


def check(topo: Topology, backend: str, given: dict[str, str],
          extra: dict[str, Any]) -> Result:
    """Whether a converge with ``given`` inputs would find anything to change, and why."""
    res = Result()
    try:
        sealed = json.loads(record.path(topo).read_text())
    except (OSError, ValueError):
        res.reasons.append(NO_RECORD)
        return res
    now = {**given, "local files": local_files(topo)}
    was = sealed.get("inputs") or {}
    res.reasons += [f"changed since the last converge: {LABELS.get(k, k)}"
                    for k in now if now[k] != was.get(k)]
    renew_after = sealed.get("renew_after")
    if renew_after is not None and time.time() >= renew_after:
        days = renew_window_days(topo, extra)
        res.reasons.append(f"certificate {sealed.get('renew_file')} is within "
                           f"pki_renew_before_days ({days:g}) of its expiry: it is re-issued")
    # The nodes too when the inputs changed: the converge then says all it will correct.
    states = _containers(topo)
    down = [f"{n.name}: container {states.get(n.name, 'missing')}"
            for n in topo.nodes if states.get(n.name) != "running"]
    if down:
        res.reasons += down
        return res
    targets = remote.targets(topo, backend)
    members = [n for n in topo.nodes if "etcd" in n.groups and etcdhttp.metrics_port(topo, n)]
    with ThreadPoolExecutor(max_workers=len(targets) + len(members)) as pool:
        answers = dict(zip(targets, pool.map(_node_check, targets.values())))
        health = dict(zip([m.name for m in members], pool.map(
            lambda m: etcdhttp.http_health(m.address(backend), etcdhttp.metrics_port(topo, m)),
            members)))
    for node, answer in answers.items():
        if "error" in answer:
            res.reasons.append(f"{node}: {answer['error']}")
        elif not answer.get("record"):
            res.reasons.append(f"{node}: {answer.get('reason', 'no record')}")
        else:
            if answer.get("inputs") != {k: v for k, v in was.items() if k != "local files"}:
                res.reasons.append(f"{node}: its record is of another converge than the "
                                   "control node's")
            res.reasons += [f"{node}: {d}" for d in answer.get("differs") or []]
            for kind, count in (answer.get("counts") or {}).items():
                res.checked[kind] = res.checked.get(kind, 0) + int(count)
    res.reasons += [f"{m}: etcd {state or 'does not answer on /health'}"
                    for m, state in health.items() if state != "healthy"]
    res.checked["nodes"] = len(answers)
    res.checked["members"] = len(members)
    return res


SHOWN = 12   # reasons printed; the log has them all


def why_converge(topo: Topology, backend: str, extra: dict[str, Any], mode: str) -> Result:
    """``up``'s check before it converges. Nothing to change (the sandbox is as the last
    converge left it, the inputs are the same): says so with what it checked. Else the
    reasons, which say_why prints once the input is known to be valid."""
    t0 = time.time()
    planned = apiserver.planned_vars(topo, extra, mode)
    etcd_planned = etcdbuild.planned_vars(topo, extra)
    if planned is None:
        res = Result(reasons=["the Kubernetes API stand-in is not built yet"])
    elif etcd_planned is None:
        res = Result(reasons=["the patched etcd packages are not built yet"])
    else:
        res = check(topo, backend, inputs(topo, backend, {**extra, **etcd_planned, **planned}),
                    extra)
    res.took = time.time() - t0
    if res.unchanged:
        c = res.checked
        print(f"sandbox: up '{topo.name}': nothing to change ({res.took:.1f}s): the inputs are "
              "the last converge's (roles, playbooks, plugins, topology, variables, versions, "
              f"PKI) and its {c.get('nodes', 0)} nodes are as it left them ({c.get('files', 0)} "
              f"files, {c.get('services', 0)} services, {c.get('users', 0)} users, "
              f"{c.get('packages', 0)} packages{', etcd RBAC' if c.get('scripts') else ''}; "
              f"{c.get('members', 0)} etcd members healthy)\n"
              "    scripts/sandbox status shows it, verify checks everything, up --force "
              "converges anyway")
    return res


def say_why(topo: Topology, res: Result) -> None:
    """why_converge's reasons (the first SHOWN; the log has them all), unless the only one is
    that there is no record (a first up, or one after --force or a day-2 command)."""
    if res.reasons in ([], [NO_RECORD]):
        return
    more = len(res.reasons) - SHOWN
    print(f"sandbox: up '{topo.name}': converging ({res.took:.1f}s to find out):\n"
          + "".join(f"    {r}\n" for r in res.reasons[:SHOWN])
          + (f"    ... and {more} more (in the log)\n" if more > 0 else ""), end="", flush=True)
