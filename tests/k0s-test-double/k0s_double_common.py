"""Shared parts of the k0s test double (not k0s): constants, flags, k0s.yaml checks, etcd
access, the controller users. See the `k0s` script beside this file."""

import os
import pwd
import re
import shutil
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
# SystemUser's defaults (pkg/apis/k0s/v1beta1/system.go:9-26, pkg/constant/constant.go:52-61;
# kine's user is kube-apiserver): the keys of spec.install.systemUsers and their users.
SYSTEM_USERS = {"etcdUser": "etcd", "kineUser": "kube-apiserver",
                "konnectivityUser": "konnectivity-server", "kubeAPIserverUser": "kube-apiserver",
                "kubeSchedulerUser": "kube-scheduler"}
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
    return errors + api_errors(api(config))


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def api_errors(spec: dict) -> list[str]:
    """APISpec.Validate (pkg/apis/k0s/v1beta1/api.go:143-186), each error prefixed "api: "
    (clusterconfig_types.go:440-453) in field.Invalid's text."""
    errors, address = [], str(spec.get("address", ""))
    if not _is_ip(address):
        errors.append(f'api: address: Invalid value: "{address}": invalid IP address')
    if address in ("0.0.0.0", "::"):
        errors.append(f'api: address: Invalid value: "{address}": invalid INADDR_ANY')
    external = str(spec.get("externalAddress") or "")
    host = external.rsplit(":", 1)[0].strip("[]") if external.count(":") == 1 or \
        external.startswith("[") else external
    dns = re.fullmatch(r"(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.?", host or "-")
    if external and not (_is_ip(host) or dns):
        errors.append(f'api: externalAddress: Invalid value: "{host}": invalid IP address / DNS name')
    for name in ("k0sApiPort", "port"):
        value = spec.get(name)
        if isinstance(value, int) and not 0 < value < 65536:
            errors.append(f"api: {name}: Invalid value: {value}: must be between 1 and 65535, "
                          "inclusive")
    for idx, san in enumerate(spec.get("sans") or []):
        if not (_is_ip(str(san)) or re.fullmatch(r"[A-Za-z0-9_.-]+", str(san))):
            errors.append(f'api: sans[{idx}]: Invalid value: "{san}": invalid IP address / DNS name')
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


def controller_users(config: dict) -> list[str]:
    """getControllerUserNames (pkg/install/users_linux.go:91-103): every controller user,
    etcd's too even with an external etcd, sorted, duplicates dropped."""
    chosen = ((config.get("spec") or {}).get("install") or {}).get("systemUsers") or {}
    return sorted({chosen.get(key) or name for key, name in SYSTEM_USERS.items()})


def ensure_controller_users(config: dict) -> list[str]:
    """EnsureControllerUsers (pkg/install/users_linux.go:19-43, called by
    cmd/install/controller.go:62-66): each missing user made with `useradd --home <data dir>
    --shell <nologin> --system --no-create-home NAME` (users_linux.go:73-80); the errors
    joined, not stopping at the first."""
    shell = shutil.which("nologin") or shutil.which("false")
    errors = []
    for name in controller_users(config):
        try:
            pwd.getpwnam(name)
            continue
        except KeyError:
            pass
        if shell is None:
            return ["failed to locate a nologin shell for creating users"]
        say(f'Creating user "{name}"')
        res = subprocess.run(["useradd", "--home", str(DATA), "--shell", shell, "--system",
                              "--no-create-home", name], capture_output=True, text=True,
                             check=False)
        if res.returncode != 0:
            errors.append(f"exit status {res.returncode}")
    return errors


def delete_controller_users(config: dict) -> tuple[list[str], list[str]]:
    """DeleteControllerUsers (pkg/install/users_linux.go:45-61): `userdel NAME` for each
    controller user that exists; (errors, deleted users), nothing raised."""
    errors, deleted = [], []
    for name in controller_users(config):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        res = subprocess.run(["userdel", name], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            errors.append(f"exit status {res.returncode}")
        else:
            deleted.append(name)
    return errors, deleted
