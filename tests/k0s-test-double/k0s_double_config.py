"""k0s.yaml as k0s v1.36.3+k0s.2 reads it, for the k0s test double (not k0s): the node config
from disk with k0s's API defaults, the runtime config /run/k0s/k0s.yaml a running controller
holds, and the addresses k0s derives from spec.api. See the `k0s` script beside this file."""

import datetime as dt
import fcntl
import json
import os
import re
import secrets
import subprocess
from pathlib import Path
from typing import IO

from k0s_double_common import (
    DATA,
    DEFAULT_CONFIG,
    LABEL,
    PKI,
    RUN,
    die,
    yaml_dump,
    yaml_load,
)

RUNTIME_CONFIG = RUN / "k0s.yaml"
STATUS_SOCKET = RUN / "status.sock"
API_VERSION = "k0s.k0sproject.io/v1beta1"


class ConfigError(Exception):
    """k0s's error text for a k0s.yaml it cannot read."""


def first_public_address() -> str:
    """internal/pkg/iface/iface.go:16-60 (FirstPublicAddress): the first non-loopback IPv4
    address in interface order, skipping CNI and CPLB interfaces; else the first IPv6 one;
    else 127.0.0.1."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                         check=False).stdout
    ipv6 = ""
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[1] in ("vxlan.calico", "kube-bridge", "dummyvip0") \
                or fields[1].startswith(("veth", "cali")):
            continue
        address = fields[3].split("/")[0]
        if address == "::1" or address.startswith("127."):
            continue
        if fields[2] == "inet":
            return address
        ipv6 = ipv6 or address
    return ipv6 or "127.0.0.1"


def with_api_defaults(config: dict) -> dict:
    """APISpec.setDefaults, run by its UnmarshalJSON (pkg/apis/k0s/v1beta1/api.go:188-214):
    address = the first public address, k0sApiPort 9443, port 6443; a missing spec.api is
    DefaultAPISpec() (clusterconfig_types.go:382-384)."""
    config = dict(config)
    config.setdefault("apiVersion", API_VERSION)
    config.setdefault("kind", "ClusterConfig")
    spec = dict(config.get("spec") or {})
    api = dict(spec.get("api") or {})
    api["address"] = api.get("address") or first_public_address()
    api["k0sApiPort"] = api.get("k0sApiPort") or 9443
    api["port"] = api.get("port") or 6443
    spec["api"] = api
    config["spec"] = spec
    return config


def node_config(path: str) -> dict:
    """CfgVars.NodeConfig (pkg/config/cfgvars.go:201-251): the file at the startup config path,
    read from disk now, merged over the defaults; only the default path may be missing
    (then the defaults alone, 235-238). Raises ConfigError with k0s's text."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError as err:
        if path == DEFAULT_CONFIG:
            return with_api_defaults({})
        raise ConfigError(f"open {path}: no such file or directory") from err
    except OSError as err:
        raise ConfigError(f"open {path}: {err.strerror.lower()}") from err
    from k0s_double_schema import parse_strict

    return with_api_defaults(parse_strict(text))


def k0s_vars(startup_config_path: str) -> dict:
    """CfgVars as NewCfgVars fills it for root with the default data dir
    (pkg/config/cfgvars.go:100-197); serialised with Go's field names (no json tags)."""
    data, certs, helm = str(DATA), str(PKI), str(DATA / "helmhome")
    return {
        "InvocationID": secrets.token_hex(16), "AdminKubeConfigPath": f"{certs}/admin.conf",
        "BinDir": f"{data}/bin", "CertRootDir": certs, "DataDir": data,
        "KubeletRootDir": f"{data}/kubelet", "EtcdCertDir": f"{certs}/etcd",
        "EtcdDataDir": f"{data}/etcd", "KineSocketPath": f"{RUN}/kine/kine.sock:2379",
        "KonnectivitySocketDir": f"{RUN}/konnectivity-server",
        "KubeletAuthConfigPath": f"{data}/kubelet.conf", "ManifestsDir": f"{data}/manifests",
        "RunDir": str(RUN), "KonnectivityKubeConfigPath": f"{certs}/konnectivity.conf",
        "OCIBundleDir": f"{data}/images", "DefaultStorageType": "etcd",
        "RuntimeConfigPath": str(RUNTIME_CONFIG), "StatusSocketPath": str(STATUS_SOCKET),
        "StartupConfigPath": startup_config_path, "HelmHome": helm,
        "HelmRepositoryCache": f"{helm}/cache", "HelmRepositoryConfig": f"{helm}/repositories.yaml",
    }


def runtime_config_locked() -> bool:
    """RuntimeConfigLocked / isLocked (pkg/config/runtime.go:88-91, 169-180): a shared flock
    on k0s.yaml.lock that cannot be taken means a controller holds it."""
    try:
        with open(f"{RUNTIME_CONFIG}.lock", "r+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
    except FileNotFoundError:
        return False


def runtime_config() -> dict:
    """LoadRuntimeConfig (pkg/config/runtime.go:46-86): the running controller's spec
    (nodeConfig, k0sVars), or {} when no controller holds the lock."""
    if not runtime_config_locked():
        return {}
    try:
        doc = yaml_load(RUNTIME_CONFIG.read_text())
    except OSError:
        return {}
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != "RuntimeConfig":
        return {}
    return doc.get("spec") or {}


def startup_config_path(config_flag: str = "") -> str:
    """GetCmdOpts (pkg/config/cli.go:324-333): the --config flag or the default path
    (cfgvars.go:78-80, 182), replaced by the running controller's k0sVars when a runtime
    config can be loaded: commands then read the file the controller was started with."""
    running = runtime_config().get("k0sVars") or {}
    return running.get("StartupConfigPath") or config_flag or DEFAULT_CONFIG


def write_runtime_config(node_vars: dict, config: dict) -> IO[str]:
    """NewRuntimeConfig (pkg/config/runtime.go:93-138): takes the flock on k0s.yaml.lock (a
    second controller fails: 'another k0s process is still running'), then writes
    /run/k0s/k0s.yaml, mode 0600: kind RuntimeConfig, spec.nodeConfig and spec.k0sVars.
    The double's nodeConfig is the file with k0s's API defaults, not every k0s default; an
    annotation says so. Returns the lock file, kept open while the controller runs."""
    lock = open(f"{RUNTIME_CONFIG}.lock", "a+")  # noqa: SIM115 (held for the process's life)
    os.chmod(lock.name, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        die("failed to initialize runtime config: another k0s process is still running")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {"apiVersion": API_VERSION, "kind": "RuntimeConfig",
           "metadata": {"creationTimestamp": now, "annotations": {
               "k0s-test-double": f"written by the {LABEL}: nodeConfig holds k0s.yaml with "
                                  "k0s's spec.api defaults only"}},
           "spec": {"nodeConfig": config, "k0sVars": node_vars}}
    fd = os.open(RUNTIME_CONFIG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(yaml_dump(doc, sort=True))
    os.chmod(RUNTIME_CONFIG, 0o600)
    return lock


def cleanup_runtime_config(lock: IO[str]) -> None:
    """RuntimeConfigSpec.Cleanup (pkg/config/runtime.go:140-154), deferred at controller exit
    (cmd/controller/controller.go:127-131): the file removed, the lock released."""
    RUNTIME_CONFIG.unlink(missing_ok=True)
    lock.close()


# --- addresses from spec.api (pkg/apis/k0s/v1beta1/api.go) ---------------------------------

def _split_host_port(text: str) -> tuple[str, str] | None:
    """net.SplitHostPort's accepted shapes: host:port, [v6]:port (None otherwise)."""
    m = re.fullmatch(r"\[([^\]]*)\]:([^:]*)", text) or re.fullmatch(r"([^:\[\]]*):([^:\[\]]*)", text)
    return (m[1], m[2]) if m else None


def _join_host_port(host: str, port: int | str) -> str:
    """net.JoinHostPort: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def external_host(api: dict) -> str:
    """APISpec.ExternalHost (api.go:96-104)."""
    external = str(api.get("externalAddress") or "")
    split = _split_host_port(external) if external else None
    return split[0] if split and split[0] else external


def external_uri(api: dict, port: int) -> str:
    """getExternalURIForPort (api.go:126-137): externalAddress given as host:port is used as
    it is; a bare externalAddress gets the port; without one, address with the port."""
    addr, external = str(api.get("address") or ""), str(api.get("externalAddress") or "")
    if external:
        if external_host(api) != external:
            return f"https://{external}"
        addr = external
    return "https://" + _join_host_port(addr, port)


def api_address_url(api: dict) -> str:
    """APIAddressURL (api.go:116-119): kube-apiserver's external URL, spec.api.port."""
    return external_uri(api, int(api.get("port") or 6443))


def join_api_url(api: dict) -> str:
    """K0sControlPlaneAPIAddress (api.go:121-124): the controller join API, k0sApiPort."""
    return external_uri(api, int(api.get("k0sApiPort") or 9443))


def status_json(info: dict) -> str:
    """json.MarshalIndent(status, "", "   ") (cmd/status/status.go:107-110)."""
    return json.dumps(info, indent=3)
