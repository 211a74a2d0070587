"""Shared parts of the k0s test double (not k0s): constants, flags, k0s.yaml, etcd access,
the status record and the join tokens' storage. See the `k0s` script beside this file."""

import os
import pwd
import subprocess
import sys
from pathlib import Path

LABEL = "k0s test double (not k0s)"
MIMICS = "v1.36.3+k0s.2"
ALLOW = "K0S_TEST_DOUBLE_ALLOWED"
TOOLS = Path(os.environ.get("K0S_TEST_DOUBLE_TOOLS", "/usr/local/lib/k0s-test-double"))
# K0S_TEST_DOUBLE_ROOT: for the project's pytest only, which runs the double's commands on the
# test host under a temporary directory instead of /; never set on the nodes.
_ROOT = os.environ.get("K0S_TEST_DOUBLE_ROOT", "")
DATA = Path(f"{_ROOT}/var/lib/k0s")
PKI = DATA / "pki"
RUN = Path(f"{_ROOT}/run/k0s")
UNIT = Path(f"{_ROOT}/etc/systemd/system/k0scontroller.service")
DEFAULT_CONFIG = f"{_ROOT}/etc/k0s/k0s.yaml"
APISERVER_USER = "kube-apiserver"
# pkg/cleanup/users_linux.go: `k0s reset` deletes these users (reference facts).
RESET_USERS = ("etcd", "kube-apiserver", "konnectivity-server", "kube-scheduler")
# What the CRD API server needs besides k0s's flags (it has no core API to talk to).
DISABLED_ADMISSION = ("NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
                      "ValidatingAdmissionPolicy,MutatingAdmissionPolicy")
NOWHERE = {"apiVersion": "v1", "kind": "Config", "current-context": "none",
           "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
           "users": [{"name": "none", "user": {}}],
           "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}


def say(msg: str) -> None:
    print(f"{LABEL}: {msg}", file=sys.stderr, flush=True)


def die(msg: str, code: int = 1) -> "None":
    print(f"Error: {LABEL}: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def flags(argv: list[str], values: set[str], bools: set[str], short: dict[str, str]) -> dict:
    """cobra-style flags: --name=value, --name value, -c value, --bool[=true|false]."""
    out: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.lstrip("-").partition("=")
        name = short.get(name, name) if not arg.startswith("--") else name
        if not arg.startswith("-") or (name not in values and name not in bools):
            die(f"unknown flag or argument: {arg} (k0s test double implements what "
                "roles/k0s_controller runs)")
        if name in bools:
            out[name] = value.lower() != "false" if eq else True
        elif eq:
            out[name] = value
        else:
            i += 1
            if i >= len(argv):
                die(f"flag needs an argument: {arg}")
            out[name] = argv[i]
        i += 1
    return out


def load_config(path: str) -> dict:
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as err:
        die(f"cannot read {path}: {err}")
    return config


def yaml_load(text: str) -> dict:
    import yaml

    return yaml.safe_load(text) or {}


def yaml_dump(data: dict, sort: bool = False) -> str:
    """sort=True: as Go's sigs.k8s.io/yaml writes (via JSON: keys in sorted order)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=sort)


def external_cluster(config: dict) -> dict:
    return (((config.get("spec") or {}).get("storage") or {}).get("etcd") or {}).get(
        "externalCluster") or {}


def config_errors(config: dict) -> list[str]:
    """k0s's messages at `k0s install controller` (reference facts)."""
    ext, errors = external_cluster(config), []
    if not ext:
        return ["k0s test double implements spec.storage.etcd.externalCluster only"]
    if not ext.get("endpoints"):
        errors.append("spec.storage.etcd.externalCluster.endpoints cannot be null or empty")
    elif any(not str(e).strip() for e in ext["endpoints"]):
        errors.append("spec.storage.etcd.externalCluster.endpoints cannot contain empty strings")
    if not str(ext.get("etcdPrefix") or "").strip():
        errors.append("spec.storage.etcd.externalCluster.etcdPrefix cannot be empty")
    tls = [k for k in ("caFile", "clientCertFile", "clientKeyFile") if ext.get(k)]
    if tls and len(tls) != 3:
        errors.append("spec.storage.etcd.externalCluster is invalid: all TLS properties "
                      "[caFile,clientCertFile,clientKeyFile] must be defined or none of those")
    return errors


def api(config: dict) -> dict:
    return (config.get("spec") or {}).get("api") or {}


def prefix(config: dict) -> str:
    return "/" + str(external_cluster(config)["etcdPrefix"]).strip("/") + "/"


def etcdctl(config: dict, *args: str) -> subprocess.CompletedProcess:
    """etcd with exactly k0s.yaml's endpoints and client files (k0s itself never talks to
    the external etcd, reference facts: the double does, for the objects it stands in for)."""
    ext = external_cluster(config)
    cmd = ["etcdctl", "--endpoints=" + ",".join(ext["endpoints"]), "--dial-timeout=5s",
           "--command-timeout=10s"]
    if ext.get("caFile"):
        cmd += ["--cacert", ext["caFile"], "--cert", ext["clientCertFile"],
                "--key", ext["clientKeyFile"]]
    return subprocess.run(cmd + list(args), env={**os.environ, "ETCDCTL_API": "3"},
                          capture_output=True, text=True, check=False)


def system_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", str(DATA),
                        "--shell", "/usr/sbin/nologin", name], check=True)


