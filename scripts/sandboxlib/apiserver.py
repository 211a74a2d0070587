"""A Kubernetes API server on every tenant: k0s's own where k0s runs, else the stand-in.

The stand-in is Kubernetes' CRD API server (``apiextensions-apiserver``, Kubernetes 1.36.4
built from Debian's Go sources by ``scripts/build-apiserver``), run by ``roles/crd_apiserver``
with the etcd flags k0s would give its kube-apiserver. It is NOT k0s. ``up`` builds it (or
reuses the cache) when no k0s binary can be had, so a fresh clone gets a working API.
"""

from __future__ import annotations

import functools
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .context import UsageError
from .k0s_inputs import k0s_input_errors
from .progress import Screen, step
from .topology import REPO_ROOT, Topology

BUILD = REPO_ROOT / "scripts" / "build-apiserver"
K0S_DEFAULTS = REPO_ROOT / "roles" / "k0s_controller" / "defaults" / "main.yml"
K0S_CACHE = REPO_ROOT / ".cache" / "k0s"
# The project's k0s test double (tests/k0s-test-double) says this in its first
# lines; it is for the Molecule scenarios only and never a k0s binary for `up`.
TEST_DOUBLE_MARKER = b"k0s test double (not k0s)"
STANDIN_KUBECTL = "/usr/local/bin/kubectl --kubeconfig /etc/crd-apiserver/admin.conf"
# What `status` shows per controller.
API_PROBE = (
    "if command -v k0s >/dev/null 2>&1; then "
    "  if systemctl is-active --quiet k0scontroller; then "
    "    if k0s kubectl get --raw=/readyz >/dev/null 2>&1; then echo 'k0s: running, API ready'; "
    "    else echo 'k0s: running, API not ready'; fi; "
    "  else echo \"k0s: installed, service $(systemctl is-active k0scontroller 2>/dev/null)\"; fi; "
    "elif systemctl is-active --quiet crd-apiserver; then "
    f"  if {STANDIN_KUBECTL} --request-timeout=5s get --raw='/readyz?exclude=informer-sync' "
    "     >/dev/null 2>&1; then echo 'CRD API server (stand-in, not k0s): ready'; "
    "  else echo 'CRD API server (stand-in, not k0s): not ready'; fi; "
    "else echo 'no API (k0s not installed, stand-in not running)'; fi"
)


@functools.cache
def k0s_defaults() -> dict[str, Any]:
    """roles/k0s_controller's defaults, read once (libyaml's loader where PyYAML has it)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(K0S_DEFAULTS.read_text(), Loader=loader) or {}


def role_setting(topo: Topology, extra: dict[str, Any], name: str,
                 defaults: dict[str, Any]) -> str:
    """A role variable as the run sees it: --set, the topology, the role's ``defaults`` (''
    for a default the CLI cannot evaluate, a template)."""
    if name in extra:
        return str(extra[name] or "")
    if name in topo.vars:
        return str(topo.vars[name] or "")
    value = str(defaults.get(name, "") or "")
    return "" if "{{" in value else value


def k0s_setting(topo: Topology, extra: dict[str, Any], name: str) -> str:
    return role_setting(topo, extra, name, k0s_defaults())


def is_test_double(path: Path) -> bool:
    """Whether ``path`` is the project's k0s test double (its first 4 KiB say so)."""
    try:
        with path.open("rb") as fh:
            return TEST_DOUBLE_MARKER in fh.read(4096)
    except OSError:
        return False


def refuse_bad_k0s_inputs(topo: Topology, extra: dict[str, Any]) -> None:
    """UsageError for a k0s_version that is no k0s release tag or a join token that never
    expires, as given (--set, the topology's vars), by the rules roles/k0s_controller's
    validate.yml applies (k0s_inputs.py): ``up`` checks them before it uses the version (the
    cache file, the release URL) or creates anything."""
    given = {**topo.vars, **extra}
    errors = k0s_input_errors({n: given[n] for n in ("k0s_version", "k0s_join_token_expiry")
                               if n in given})
    if errors:
        raise UsageError("; ".join(errors) + "; nothing was changed")


def refuse_test_double(topo: Topology, extra: dict[str, Any]) -> None:
    """UsageError when K0S_BINARY / k0s_binary or the cached binary is the k0s test double:
    `up` and every day-2 command use k0s, or the CRD API server stand-in, never the double."""
    given = k0s_setting(topo, extra, "k0s_binary") or os.environ.get("K0S_BINARY", "")
    cached = K0S_CACHE / f"k0s-{k0s_setting(topo, extra, 'k0s_version')}-amd64"
    if given and is_test_double(Path(given)):
        raise UsageError(f"K0S_BINARY / k0s_binary: {given} is the project's k0s test double "
                         "(not k0s), for its Molecule scenarios only; give a real k0s binary "
                         "or unset it")
    if not given and is_test_double(cached):
        raise UsageError(f"{cached} is the project's k0s test double (not k0s), for its Molecule "
                         "scenarios only; remove it (or put a real k0s binary there)")


def k0s_source(topo: Topology, extra: dict[str, Any]) -> str:
    """Where a k0s binary would come from ('' = none): K0S_BINARY / k0s_binary, the cache,
    or the release URL when it answers within 5 s (then k0s's role downloads it). The k0s
    test double is never one: UsageError."""
    refuse_test_double(topo, extra)
    given = k0s_setting(topo, extra, "k0s_binary") or os.environ.get("K0S_BINARY", "")
    if given:
        return f"k0s binary {given}"
    version = k0s_setting(topo, extra, "k0s_version")
    cached = K0S_CACHE / f"k0s-{version}-amd64"
    if cached.is_file():
        return f"cached k0s {cached}"
    base = k0s_setting(topo, extra, "k0s_download_base_url")
    url = f"{base}/{version}/k0s-{version}-amd64"
    try:
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=5) as resp:
            if resp.status < 400:
                return f"k0s {version} downloadable from {base}"
    except (urllib.error.URLError, OSError, ValueError):
        pass
    return ""


def build(log: Path | None = None, screen: Screen | None = None,
          script: Path | None = None, name: str = "build-apiserver") -> tuple[Path, bool]:
    """Run a cached build script (scripts/build-apiserver, or ``script`` named ``name`` such
    as scripts/build-etcd: each reuses its cache): its output to ``log``, its steps
    (``<name>: step: ...``) as notes on ``screen``'s live line. Returns its directory and
    whether it built (False: reused); RuntimeError with its last line."""
    proc = subprocess.Popen([str(script or BUILD)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stdout is not None
    last = ""
    built = False
    said, step_said = f"{name}:", f"{name}: step: "
    with open(log or os.devnull, "a", encoding="utf-8") as fh:
        for line in proc.stderr:
            fh.write(line)
            if line.strip():
                last = line.strip()
                built = built or last.startswith(said)
                if last.startswith(step_said) and screen is not None:
                    screen.note(last.removeprefix(step_said))
    stdout = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(last or f"scripts/{name} exit {proc.returncode}")
    return Path(stdout.strip().splitlines()[-1]), built


def up_vars(topo: Topology, extra: dict[str, Any], mode: str, screen: Screen,
            log: Path | None = None) -> dict[str, Any]:
    """Variables for roles/crd_apiserver: build the stand-in when k0s cannot be had (auto),
    always (on), or switch it off (off)."""
    if mode == "off":
        return {"crd_apiserver_enabled": False}
    if mode == "auto":
        source = k0s_source(topo, extra)
        if source:
            screen.line(f"    Kubernetes API: k0s's own ({source}); no stand-in built")
            return {}
    label = "Kubernetes API stand-in"
    with step(screen, label, "no k0s binary here: Kubernetes' CRD API server 1.36.4 from "
              "Debian's sources (not k0s; about 8 min the first time)") as result:
        out, built = build(log, screen)
        result["detail"] = ("Kubernetes' CRD API server 1.36.4, not k0s: "
                            + ("built, cached for next time" if built else "from the cache"))
    return {"crd_apiserver_dir": str(out)}


def planned_vars(topo: Topology, extra: dict[str, Any], mode: str) -> dict[str, Any] | None:
    """The variables up_vars would give, without building: None when it would build (the
    stand-in's cache is not complete), so a no-op check cannot answer for it."""
    if not topo.tenants:
        return {}
    if mode == "off":
        return {"crd_apiserver_enabled": False}
    if mode == "auto" and k0s_source(topo, extra):
        return {}
    done = subprocess.run([str(BUILD), "--print-dir"], capture_output=True, text=True,
                          check=False)
    out = Path(done.stdout.strip())
    complete = all((out / f).is_file() for f in ("apiextensions-apiserver", "kubectl", "BUILDINFO"))
    return {"crd_apiserver_dir": str(out)} if done.returncode == 0 and complete else None
