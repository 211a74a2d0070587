"""A tenant's Kubernetes API from the host: ``scripts/sandbox kubeconfig`` and ``kubectl``.

``up`` writes each tenant's admin kubeconfig to ``.sandbox/<name>/kubeconfig/<tenant>.yaml``
on the control node (roles/k0s_controller: k0s's ``admin.conf`` with the server rewritten to
the address the host reaches, as k0sctl does; roles/crd_apiserver: the stand-in's admin
certificate where k0s does not run). The server is the tenant's load balancer
(``spec.api.externalAddress``) or its first controller. ``kubeconfig`` prints that path for
the user's own tools; ``kubectl`` runs a kubectl on the host with it, so local files,
``-f dir/``, ``-k``, stdin, plugins and ``--watch`` behave as with any cluster.

Which kubectl: ``SANDBOX_KUBECTL`` when set; else the user's ``kubectl`` on PATH when its
minor version is within one of the server's (Kubernetes' version skew policy); else the
kubectl 1.36.4 that ``scripts/build-apiserver`` builds beside the stand-in; else ``k0s
kubectl`` of the k0s binary the sandbox cached on the control node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from . import apiserver
from .context import Failure, UsageError, resolve
from .topology import Tenant, Topology

KUBECTL_ENV = "SANDBOX_KUBECTL"
# The stand-in's Kubernetes version (scripts/build-apiserver's K8S_VERSION).
STANDIN_MINOR = 36
MINOR_RE = re.compile(r"^v?1\.(\d+)")


def kubeconfig_dir(topo: Topology) -> Path:
    return topo.state_dir / "kubeconfig"


def kubeconfig_path(topo: Topology, tenant: str) -> Path:
    """Where ``up`` writes the tenant's kubeconfig on the control node."""
    return kubeconfig_dir(topo) / f"{tenant}.yaml"


def pick_tenant(topo: Topology, name: str | None, command: str) -> Tenant:
    """The tenant named, or the first; a UsageError listing the tenants otherwise."""
    if not topo.tenants:
        raise UsageError(f"{command}: topology '{topo.name}' has no tenants (no k0s "
                         "controllers), so there is no Kubernetes API")
    if name is None:
        return topo.tenants[0]
    for t in topo.tenants:
        if t.name == name:
            return t
    raise UsageError(f"{command}: no tenant '{name}' in topology '{topo.name}'; tenants: "
                     f"{', '.join(t.name for t in topo.tenants)}")


def existing_kubeconfig(topo: Topology, tenant: Tenant, command: str) -> Path:
    """The tenant's kubeconfig, or a Failure saying how to get one. Never through a symbolic
    link: ``up`` writes a file there (it replaces a link, never writes through one), so a link
    was put there by hand and may name another cluster's kubeconfig, which ``kubectl`` would
    then act on."""
    path = kubeconfig_path(topo, tenant.name)
    if path.is_symlink():
        raise Failure(f"{command}: {_display(path)} is a symbolic link to {os.readlink(path)}, "
                      f"not the kubeconfig scripts/sandbox up writes for tenant {tenant.name}: "
                      "remove the link and run scripts/sandbox up, which writes the file there")
    if path.is_file():
        return path.resolve()
    raise Failure(f"{command}: no kubeconfig for tenant {tenant.name} yet "
                  f"({_display(path)}): scripts/sandbox up writes it once the tenant has a "
                  "Kubernetes API (k0s, or the CRD API server stand-in where no k0s binary "
                  "can be had; not with --apiserver off)")


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def server_minor(topo: Topology) -> int:
    """The minor version of the tenants' API server: k0s's Kubernetes (k0s_version), which
    the stand-in (Kubernetes 1.36) is pinned to match by default."""
    version = apiserver.k0s_setting(topo, {}, "k0s_version")
    m = MINOR_RE.match(version)
    return int(m.group(1)) if m else STANDIN_MINOR


def client_minor(kubectl: str) -> int | None:
    """The minor version of a kubectl binary (``kubectl version --client -o json``)."""
    try:
        res = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                             capture_output=True, text=True, timeout=15, check=False)
        minor = json.loads(res.stdout)["clientVersion"]["minor"]
        return int(re.sub(r"\D.*$", "", str(minor)))
    except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
        return None


def standin_kubectl() -> Path | None:
    """The kubectl that scripts/build-apiserver built (None when not built)."""
    try:
        res = subprocess.run([str(apiserver.BUILD), "--print-dir"], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.strip().splitlines()
    path = Path(lines[-1]) / "kubectl" if res.returncode == 0 and lines else None
    return path if path is not None and os.access(path, os.X_OK) else None


def cached_k0s(topo: Topology) -> Path | None:
    """The k0s binary the sandbox cached on the control node (roles/k0s_controller)."""
    version = apiserver.k0s_setting(topo, {}, "k0s_version")
    path = apiserver.K0S_CACHE / f"k0s-{version}-amd64"
    if apiserver.is_test_double(path):   # the tests' k0s test double (not k0s): never
        return None
    return path if os.access(path, os.X_OK) else None


def choose_kubectl(topo: Topology) -> list[str]:
    """The kubectl command line to run on the host (see the module's docstring)."""
    forced = os.environ.get(KUBECTL_ENV)
    if forced:
        return forced.split()
    want = server_minor(topo)
    own = shutil.which("kubectl")
    seen = ""
    if own:
        minor = client_minor(own)
        if minor is not None and abs(minor - want) <= 1:
            return [own]
        seen = (f" (the kubectl on PATH, {own}, is 1.{minor}: more than one minor version "
                f"from the server's 1.{want})" if minor is not None else
                f" (the kubectl on PATH, {own}, did not tell its version)")
    built = standin_kubectl()
    if built is not None:
        return [str(built)]
    k0s = cached_k0s(topo)
    if k0s is not None:
        return [str(k0s), "kubectl"]
    raise Failure(f"kubectl: no kubectl on this host{seen}: install kubectl 1.{want - 1}-1."
                  f"{want + 1}, set {KUBECTL_ENV}=/path/to/kubectl, or run scripts/build-apiserver "
                  "(it builds kubectl 1.36.4 beside the stand-in)")


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    sb = resolve(args)
    tenant = pick_tenant(sb.topo, args.tenant, "kubeconfig")
    path = existing_kubeconfig(sb.topo, tenant, "kubeconfig")
    # quoted for the shell that evaluates it (a state directory may hold spaces or $(...))
    print(f"export KUBECONFIG={shlex.quote(str(path))}" if args.export else str(path))
    return 0


def cmd_kubectl(args: argparse.Namespace) -> NoReturn:
    sb = resolve(args)
    tenant = pick_tenant(sb.topo, args.tenant, "kubectl")
    path = existing_kubeconfig(sb.topo, tenant, "kubectl")
    argv = [*choose_kubectl(sb.topo), "--kubeconfig", str(path), *args.args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        raise Failure(f"kubectl: cannot run {argv[0]}: {exc.strerror}") from None


def add_commands(add: Callable[[str, str, Any], argparse.ArgumentParser]) -> None:
    """Register ``kubeconfig`` and ``kubectl`` with cli.build_parser's ``add``."""
    kc = add("kubeconfig", "print the path of a tenant's admin kubeconfig (for kubectl, "
             "helm, k9s, client libraries)", cmd_kubeconfig)
    kc.add_argument("--tenant", metavar="T", help="tenant name (default: the first)")
    kc.add_argument("--export", action="store_true",
                    help="print 'export KUBECONFIG=PATH' (eval \"$(... --export)\")")
    k = add("kubectl", "kubectl on this host with the tenant's kubeconfig (k0s's API, or "
            "the CRD API server stand-in where k0s does not run)", cmd_kubectl)
    k.add_argument("--tenant", metavar="T", help="tenant name (default: the first)")
    k.add_argument("args", nargs="*", metavar="ARGS", help=argparse.SUPPRESS)
