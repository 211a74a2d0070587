"""Validation of k0s's external-etcd settings, with k0s's own messages.

k0s (v1.36) rejects a config at ``k0s install controller`` / ``k0s config validate`` with
the messages below; the sandbox adds its own checks on top (https:// endpoints need the TLS
files). Running them before any node changes gives the same answer k0s would, earlier. The
tenant rules (names, prefixes) are plugins/plugin_utils/sandbox_tenants.py's (plugins/filter/sandbox_tenants.py).

The field lists below are taken from k0s v1.36.3+k0s.2's Go types (json tags of
pkg/apis/k0s/v1beta1 ClusterSpec, APISpec, StorageSpec, EtcdConfig, ExternalCluster);
tests/test_k0s_validation.py compares them with k0s's ClusterConfig CRD. How k0s reads
k0s.yaml: strictly at the top of spec (an unknown key stops `k0s install` / `k0s controller`
with `unknown field "KEY"`; only "interval" and "podSecurityPolicy" are let through,
internal/pkg/strictyaml), but spec.api and spec.storage have their own UnmarshalJSON with a
plain json.Unmarshal, which drops unknown keys silently (golang/go#41144): a misspelt
`externalAdress` would simply have no effect. The sandbox rejects both.

``k0s_input_errors`` checks the role's ``k0s_version`` and ``k0s_join_token_expiry`` by the
rules of plugins/plugin_utils/k0s_inputs.py, which ``scripts/sandbox up`` applies too.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Any

from ansible_collections.k0sbox.external_etcd.plugins.plugin_utils.k0s_inputs import (
    k0s_input_errors,
)

K0S_ENDPOINTS_EMPTY = "spec.storage.etcd.externalCluster.endpoints cannot be null or empty"
K0S_ENDPOINTS_EMPTY_STRING = (
    "spec.storage.etcd.externalCluster.endpoints cannot contain empty strings")
K0S_PREFIX_EMPTY = "spec.storage.etcd.externalCluster.etcdPrefix cannot be empty"
K0S_TLS_ALL_OR_NONE = (
    "spec.storage.etcd.externalCluster is invalid: all TLS properties "
    "[caFile,clientCertFile,clientKeyFile] must be defined or none of those")
TLS_KEYS = ("caFile", "clientCertFile", "clientKeyFile")

# Known keys, from k0s v1.36.3+k0s.2's json tags (pkg/apis/k0s/v1beta1).
CLUSTER_SPEC_KEYS = ("api", "controllerManager", "scheduler", "storage", "network",
                     "workerProfiles", "telemetry", "installConfig", "images", "extensions",
                     "konnectivity", "featureGates", "metricsServer")
# Unknown-field errors naming these are discarded by k0s (strictyaml's ignore list).
CLUSTER_SPEC_IGNORED = ("interval", "podSecurityPolicy")
API_SPEC_KEYS = ("address", "onlyBindToAddress", "externalAddress", "extraArgs", "rawArgs",
                 "k0sApiPort", "port", "sans", "ca")
STORAGE_SPEC_KEYS = ("type", "etcd", "kine")
ETCD_CONFIG_KEYS = ("externalCluster", "peerAddress", "extraArgs", "rawArgs", "ca")
EXTERNAL_CLUSTER_KEYS = ("endpoints", "etcdPrefix", *TLS_KEYS)


# kube-apiserver flags k0s derives from spec.storage itself (apiserver.go getEtcdArgs,
# 329-355): name -> (what k0s passes, where the sandbox's value comes from). Refused in
# spec.api.extraArgs and spec.api.rawArgs.
_TLS_FROM = ("the TLS files come from the PKI (externalCluster caFile, clientCertFile, "
             "clientKeyFile; etcd_tls)")
K0S_ETCD_FLAGS = {
    "etcd-servers": ("the external cluster's endpoints",
                     "the endpoints come from the etcd group (or k0s_etcd_endpoints_override)"),
    "etcd-prefix": ("the external cluster's etcdPrefix",
                    "the prefix is the tenant's (k0s_tenants prefix)"),
    "etcd-cafile": ("externalCluster.caFile", _TLS_FROM),
    "etcd-certfile": ("externalCluster.clientCertFile", _TLS_FROM),
    "etcd-keyfile": ("externalCluster.clientKeyFile", _TLS_FROM),
}


def k0s_external_cluster_errors(config: dict[str, Any]) -> list[str]:
    """Errors k0s (and the sandbox) find in a ClusterConfig's external etcd settings."""
    storage = ((config or {}).get("spec") or {}).get("storage") or {}
    if storage.get("type", "etcd") != "etcd":
        return []
    ext = (storage.get("etcd") or {}).get("externalCluster")
    if ext is None:
        return []
    errors: list[str] = []
    endpoints = ext.get("endpoints")
    if not endpoints:
        errors.append(K0S_ENDPOINTS_EMPTY)
    elif any(not isinstance(e, str) or e.strip() == "" for e in endpoints):
        errors.append(K0S_ENDPOINTS_EMPTY_STRING)
    if not str(ext.get("etcdPrefix") or "").strip():
        errors.append(K0S_PREFIX_EMPTY)
    tls_set = [k for k in TLS_KEYS if str(ext.get(k) or "").strip()]
    if tls_set and len(tls_set) != len(TLS_KEYS):
        errors.append(K0S_TLS_ALL_OR_NONE)
    if not tls_set and any(isinstance(e, str) and e.startswith("https://")
                           for e in endpoints or []):
        errors.append(
            "spec.storage.etcd.externalCluster: https:// endpoints need caFile, clientCertFile "
            "and clientKeyFile (k0s passes no TLS flags without them and kube-apiserver fails "
            "at run time); set the three files or use http:// endpoints (etcd_tls: false)")
    for e in endpoints or []:
        if isinstance(e, str) and e and not e.startswith(("http://", "https://")):
            errors.append(f"spec.storage.etcd.externalCluster.endpoints: '{e}' needs a scheme "
                          "(https://host:2379 or http://host:2379)")
    return errors


def _is_ip(value: str) -> bool:
    """An IP address as Go's net.ParseIP accepts it (no zone, no brackets)."""
    if "%" in value:
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


# A DNS name by the rule k0s applies (govalidator.IsDNSName): labels of letters, digits,
# '_' and '-' (not starting with '-'), at most 63 characters each, dot-separated, at most
# 255 characters without the dots, and not an IP address.
_DNS_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_DNS_NAME_RE = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*[._]?$")


def _is_dns_name(value: str) -> bool:
    return (bool(value) and len(value.replace(".", "")) <= 255 and not _is_ip(value)
            and bool(_DNS_NAME_RE.match(value)))


def _host_of(address: str) -> str:
    """The host part of 'host', 'host:port' or '[v6]:port' (k0s's APISpec.ExternalHost)."""
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        return host if sep and rest.startswith(":") else address
    if address.count(":") == 1:
        return address.split(":", 1)[0]
    return address


def _closest(key: str, known: tuple[str, ...]) -> str | None:
    """The known field a misspelt key most likely meant: same letters in another case, a
    known field the key starts with (apiServer -> api), else the closest spelling."""
    lower = {k.lower(): k for k in known}
    if key.lower() in lower:
        return lower[key.lower()]
    prefixes = [k for k in known if key.lower().startswith(k.lower())]
    if prefixes:
        return max(prefixes, key=len)
    close = difflib.get_close_matches(key.lower(), list(lower), n=1)
    return lower[close[0]] if close else None


_STRICT = 'k0s refuses k0s.yaml with: unknown field "{key}"'
_SILENT = "k0s drops unknown keys under {path} without a word: it would have no effect"


def _unknown(path: str, keys: Any, known: tuple[str, ...], consequence: str) -> list[str]:
    """One error per key of `keys` not in `known`, naming the closest known one."""
    errors = []
    for key in keys:
        if key in known:
            continue
        close = _closest(str(key), known)
        hint = f"did you mean '{close}'? " if close else ""
        errors.append(
            f"{path}.{key}: unknown field ({consequence.format(key=key, path=path)}); {hint}"
            f"remove or rename it in k0s_spec_extra (known fields of {path}: {', '.join(known)})")
    return errors


def _port_errors(path: str, value: Any) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return [(f"{path}: '{value}' is not a port number; give an integer from 1 to 65535 "
                 "in k0s_spec_extra or leave it out for k0s's default")]
    return []


def k0s_spec_errors(config: dict[str, Any]) -> list[str]:
    """Errors k0s would report (or silently act on) in spec, spec.api and spec.storage.

    Unknown keys, spec.api.address (an IP, not INADDR_ANY), externalAddress and sans (IP
    addresses or DNS names), extraArgs (a map of strings: k0s's map[string]string), rawArgs
    and sans (lists of strings), ports.
    """
    spec = (config or {}).get("spec")
    if spec is None:
        return []
    if not isinstance(spec, dict):
        return ["spec: must be a mapping; give k0s_spec_extra as a mapping of ClusterConfig spec fields"]
    errors = _unknown("spec", [k for k in spec if k not in CLUSTER_SPEC_IGNORED],
                      CLUSTER_SPEC_KEYS, _STRICT)
    api = spec.get("api")
    if api is not None:
        errors += _api_errors(api)
    storage = spec.get("storage")
    if storage is not None:
        errors += _storage_errors(storage)
    return errors


def _api_errors(api: Any) -> list[str]:
    if not isinstance(api, dict):
        return ["spec.api: must be a mapping (address, externalAddress, sans, extraArgs, ...)"]
    errors = _unknown("spec.api", api, API_SPEC_KEYS, _SILENT)
    address = api.get("address")
    if not isinstance(address, str) or not _is_ip(address):
        errors.append(
            f"spec.api.address: '{address}' is not an IP address (k0s: invalid IP address); "
            "k0s needs the controller's own IP: set node_address (or k0s_spec_extra "
            "api.address) to an IP address of the controller")
    elif ipaddress.ip_address(address).is_unspecified:
        errors.append(
            f"spec.api.address: '{address}' is INADDR_ANY (k0s: invalid INADDR_ANY); set "
            "node_address (or k0s_spec_extra api.address) to an IP address of the controller")
    external = api.get("externalAddress")
    if external not in (None, ""):
        host = _host_of(str(external)) if isinstance(external, str) else ""
        if not (_is_ip(host) or _is_dns_name(host)):
            errors.append(
                f"spec.api.externalAddress: '{external}' is neither an IP address nor a DNS "
                "name (k0s: invalid IP address / DNS name); give the load balancer's address "
                "(node_address of the lb node, or k0s_spec_extra api.externalAddress)")
        elif _is_ip(host) and ipaddress.ip_address(host).is_unspecified:
            errors.append(
                f"spec.api.externalAddress: '{external}' is INADDR_ANY, which no client can "
                "connect to (k0s refuses 0.0.0.0 and :: here: invalid INADDR_ANY); give the "
                "address clients reach the load balancer at")
    sans = api.get("sans")
    if sans is not None:
        if not isinstance(sans, list):
            errors.append("spec.api.sans: must be a list of IP addresses and DNS names")
        else:
            for i, san in enumerate(sans):
                if not (isinstance(san, str) and (_is_ip(san) or _is_dns_name(san))):
                    errors.append(
                        f"spec.api.sans[{i}]: '{san}' is neither an IP address nor a DNS name "
                        "(k0s: invalid IP address / DNS name); fix or remove it in k0s_spec_extra")
    errors += _string_map("spec.api.extraArgs", api.get("extraArgs"), "kube-apiserver")
    if isinstance(api.get("extraArgs"), dict):
        errors += [_k0s_etcd_flag_error(f"spec.api.extraArgs.{k}", _flag_name(str(k)))
                   for k in api["extraArgs"] if _flag_name(str(k)) in K0S_ETCD_FLAGS]
    errors += _string_list("spec.api.rawArgs", api.get("rawArgs"))
    for i, arg in enumerate(api.get("rawArgs") if isinstance(api.get("rawArgs"), list) else []):
        if isinstance(arg, str) and _flag_name(arg, raw=True) in K0S_ETCD_FLAGS:
            value = "" if "=" in arg else " and the value after it"
            errors.append(_k0s_etcd_flag_error(f"spec.api.rawArgs[{i}] ('{arg}'{value})",
                                               _flag_name(arg, raw=True)))
    if "onlyBindToAddress" in api and not isinstance(api["onlyBindToAddress"], bool):
        errors.append(f"spec.api.onlyBindToAddress: '{api['onlyBindToAddress']}' is not a "
                      "boolean; give true or false")
    for port in ("port", "k0sApiPort"):
        if port in api:
            errors += _port_errors(f"spec.api.{port}", api[port])
    return errors


def _flag_name(arg: str, raw: bool = False) -> str:
    """The flag an extraArgs key ("etcd_prefix") or a rawArgs element (``raw``: "--etcd-prefix=/x"
    or "--etcd-prefix" before its value; an element without "--" names none) names, as
    kube-apiserver reads it: '_' as '-' (component-base's WordSepNormalizeFunc)."""
    if raw:
        if not arg.startswith("--"):
            return ""
        arg = arg[2:]
    return arg.split("=", 1)[0].replace("_", "-")


def _k0s_etcd_flag_error(where: str, name: str) -> str:
    """The refusal of a kube-apiserver etcd flag k0s sets itself, given in extraArgs or rawArgs:
    k0s puts extraArgs into kube-apiserver's flags, appends rawArgs (a list of strings, one
    argument each) after them, then appends its own etcd flags (k0s v1.36
    pkg/component/controller/apiserver.go:140-145, 218-238; getEtcdArgs: 329-355)."""
    if name == "etcd-servers":
        effect = ("--etcd-servers is a list flag, so this value would be APPENDED to k0s's "
                  "endpoints, not override them")
    elif name == "etcd-prefix":
        effect = ("a single-value flag takes its last value, k0s's, so this one would silently "
                  "have no effect")
    else:
        effect = ("a single-value flag takes its last value, k0s's (passed when the external "
                  "cluster has TLS files), so this one would have no effect; without TLS files "
                  "it would point kube-apiserver at a file the sandbox neither places nor checks")
    return (f"{where}: k0s adds its own --{name} ({K0S_ETCD_FLAGS[name][0]}) after extraArgs "
            f"and rawArgs, and {effect} (k0s v1.36 pkg/component/controller/apiserver.go:"
            f"140-145, 218-238); remove it: {K0S_ETCD_FLAGS[name][1]}")


def _storage_errors(storage: Any) -> list[str]:
    if not isinstance(storage, dict):
        return ["spec.storage: must be a mapping (type, etcd)"]
    errors = _unknown("spec.storage", storage, STORAGE_SPEC_KEYS, _SILENT)
    etcd = storage.get("etcd")
    if isinstance(etcd, dict):
        errors += _unknown("spec.storage.etcd", etcd, ETCD_CONFIG_KEYS, _SILENT)
        errors += _string_map("spec.storage.etcd.extraArgs", etcd.get("extraArgs"), "etcd")
        ext = etcd.get("externalCluster")
        if isinstance(ext, dict):
            errors += _unknown("spec.storage.etcd.externalCluster", ext, EXTERNAL_CLUSTER_KEYS,
                               _SILENT)
    return errors


def _string_map(path: str, value: Any, component: str) -> list[str]:
    """k0s's map[string]string: a YAML number or boolean there makes k0s refuse k0s.yaml."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return [(f"{path}: must be a mapping of flag names to string values (k0s: "
                 'map[string]string), e.g. {etcd-compaction-interval: "5m"}')]
    errors = []
    for k, v in value.items():
        if isinstance(k, str) and isinstance(v, str):
            continue
        shown = str(v).lower() if isinstance(v, bool) else str(v)
        errors.append(
            f"{path}.{k}: {type(v).__name__} value {v!r}, but k0s takes only strings here "
            f'(map[string]string) and refuses k0s.yaml otherwise; quote it: {k}: "{shown}" '
            f"(passed to {component} as --{k}={shown})")
    return errors


def _string_list(path: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return [f"{path}: must be a list of strings, e.g. [\"--flag=value\"]"]
    return []


def k0s_spec_warnings(config: dict[str, Any]) -> list[str]:
    spec = (config or {}).get("spec") or {}
    return [
        f"spec.{key}: k0s ignores this field (it discards unknown-field errors naming it); "
        "remove it from k0s_spec_extra"
        for key in (spec if isinstance(spec, dict) else {}) if key in CLUSTER_SPEC_IGNORED
    ]


def k0s_tenant_lb(lbs: list[Any], tenant: str) -> str:
    """node_address of the load balancer that serves ``tenant`` (HA: spec.api.externalAddress):
    the first with ``lb_tenant`` equal to the tenant, else the first without ``lb_tenant`` (it
    serves every controller); '' when none does. ``lbs``: the lb hosts' variables."""
    own = [h for h in lbs or [] if str(h.get("lb_tenant") or "") == tenant]
    shared = [h for h in lbs or [] if not h.get("lb_tenant")]
    pick = (own or shared or [{}])[0]
    return str(pick.get("node_address") or "")


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "k0s_external_cluster_errors": k0s_external_cluster_errors,
            "k0s_spec_errors": k0s_spec_errors,
            "k0s_spec_warnings": k0s_spec_warnings,
            "k0s_tenant_lb": k0s_tenant_lb,
            "k0s_input_errors": k0s_input_errors,
        }
