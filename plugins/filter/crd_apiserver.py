"""Filters of roles/crd_apiserver: kube-apiserver's etcd flags as k0s derives them from a
controller's k0s.yaml, systemd quoting, and what a node must hold (checksum, mode, owner).

Mirrors k0s v1.36 pkg/component/controller/apiserver.go: with storage type etcd, k0s gives
kube-apiserver ``--etcd-servers`` (endpoints joined by ","), ``--etcd-prefix`` (etcdPrefix,
verbatim) and, when the three TLS files are set, ``--etcd-cafile/--etcd-certfile/
--etcd-keyfile``; it adds them after ``spec.api.extraArgs`` (apiserver.go:140-145,
218-238): for a single-value flag k0s's value wins, and ``--etcd-servers`` is a list flag, so
an extraArgs value there would be appended to k0s's endpoints (roles/k0s_controller refuses
it). Flags k0s does not set (``etcd-compaction-interval``, ...) come from extraArgs.
"""

from __future__ import annotations

from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - outside Ansible (unit tests import the module)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

# extraArgs this API server also understands (kube-apiserver's generic etcd storage flags).
PASSED_EXTRA_ARGS = ("etcd-compaction-interval", "etcd-count-metric-poll-period",
                     "etcd-db-metric-poll-interval", "etcd-healthcheck-timeout",
                     "etcd-readycheck-timeout")
SET_BY_K0S = ("etcd-servers", "etcd-prefix", "etcd-cafile", "etcd-certfile", "etcd-keyfile")


def crd_apiserver_etcd_args(config: dict[str, Any]) -> dict[str, str]:
    """The etcd flags (name -> value) k0s would give kube-apiserver for this k0s.yaml."""
    spec = (config or {}).get("spec") or {}
    storage = spec.get("storage") or {}
    if storage.get("type", "etcd") != "etcd":
        raise AnsibleFilterError(
            f"k0s.yaml spec.storage.type is '{storage.get('type')}': the stand-in API server "
            "only runs against an external etcd (spec.storage.etcd.externalCluster)")
    ext = (storage.get("etcd") or {}).get("externalCluster") or {}
    endpoints = ext.get("endpoints") or []
    if not endpoints:
        raise AnsibleFilterError("k0s.yaml has no spec.storage.etcd.externalCluster.endpoints: "
                                 "run playbooks/k0s.yml first")
    extra = (spec.get("api") or {}).get("extraArgs") or {}
    args = {k: str(v) for k, v in extra.items() if k in PASSED_EXTRA_ARGS}
    args["etcd-servers"] = ",".join(str(e) for e in endpoints)
    if ext.get("caFile") and ext.get("clientCertFile") and ext.get("clientKeyFile"):
        args.update({"etcd-cafile": ext["caFile"], "etcd-certfile": ext["clientCertFile"],
                     "etcd-keyfile": ext["clientKeyFile"]})
    args["etcd-prefix"] = str(ext.get("etcdPrefix") or "")
    return args


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "ns": 1e-9}


def _go_duration(value: str) -> float | None:
    """Seconds of a Go duration ("1m30s", "500ms", "20s"); None where Go would not parse it."""
    import re

    text = str(value).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def crd_apiserver_shutdown(config: dict[str, Any]) -> dict[str, Any]:
    """How k0s stops kube-apiserver, for this k0s.yaml (k0s pkg/component/controller/
    apiserver.go:179-216, commit dff90ce): the supervisor's stop timeout is the request
    timeout (extraArgs request-timeout, default 1m) or the watch termination grace period if
    longer, plus 2 s, clamped to 5-20 s; unless extraArgs set
    ``shutdown-watch-termination-grace-period``, k0s sets it to that timeout minus 2 s, so open
    watches are drained instead of holding the stop for the whole request timeout.
    Returns ``{"args": {flag: value}, "timeout_stop_sec": seconds}``."""
    extra = (((config or {}).get("spec") or {}).get("api") or {}).get("extraArgs") or {}
    request = _go_duration(extra["request-timeout"]) if "request-timeout" in extra else None
    grace = (_go_duration(extra["shutdown-watch-termination-grace-period"])
             if "shutdown-watch-termination-grace-period" in extra else None)
    stop = max(request if request is not None else 60.0, grace or 0.0) + 2.0
    stop = max(5.0, min(stop, 20.0))
    args: dict[str, str] = {}
    if "request-timeout" in extra:
        args["request-timeout"] = str(extra["request-timeout"])
    if "shutdown-watch-termination-grace-period" in extra:
        args["shutdown-watch-termination-grace-period"] = str(
            extra["shutdown-watch-termination-grace-period"])
    elif stop - 2.0 > 0:
        args["shutdown-watch-termination-grace-period"] = f"{stop - 2.0:g}s"
    return {"args": args, "timeout_stop_sec": int(stop) if stop == int(stop) else stop}


def crd_apiserver_sans(config: dict[str, Any], extra: list[str]) -> list[str]:
    """SANs of the serving certificate: api.address, api.sans and api.externalAddress of
    k0s.yaml (what k0s puts in kube-apiserver's certificate), then ``extra``; "IP:"/"DNS:"."""
    import ipaddress

    api = ((config or {}).get("spec") or {}).get("api") or {}
    names = [api.get("address"), *(api.get("sans") or []), api.get("externalAddress"), *extra]
    out: list[str] = []
    for name in names:
        if not name:
            continue
        try:
            entry = f"IP:{ipaddress.ip_address(str(name))}"
        except ValueError:
            entry = f"DNS:{name}"
        if entry not in out:
            out.append(entry)
    return out


def crd_apiserver_certificates(hosts: list[dict[str, Any]], ca_cn: str) -> list[dict[str, Any]]:
    """What the stand-in's PKI issues, per tenant served by ``hosts`` (hostvars of the
    controllers that run it): a Kubernetes CA of the tenant's own (never the etcd CA), an admin
    client certificate in group system:masters (kubectl), and one serving certificate per
    controller with the SANs of its k0s.yaml plus every address it is reached by."""
    certs: list[dict[str, Any]] = []
    tenants: list[str] = []
    for hv in hosts:
        tenant = str(hv["k0s_tenant"])
        if tenant not in tenants:
            tenants.append(tenant)
            certs.append({"tenant": tenant, "name": "ca", "ca": True,
                          "cn": f"{ca_cn} ({tenant})", "o": [], "sans": [], "eku": []})
            certs.append({"tenant": tenant, "name": "admin", "ca": False, "cn": "sandbox-admin",
                          "o": ["system:masters"], "sans": [], "eku": ["clientAuth"]})
        host = str(hv["inventory_hostname"])
        extra = [str(hv.get("node_address") or ""), str(hv.get("ansible_host") or ""), host,
                 "localhost", "127.0.0.1", "kubernetes", "kubernetes.default"]
        certs.append({"tenant": tenant, "name": f"serving-{host}", "ca": False,
                      "cn": "kube-apiserver", "o": [],
                      "sans": crd_apiserver_sans(hv.get("crd_apiserver_k0s_yaml") or {}, extra),
                      "eku": ["serverAuth"]})
    return certs


def crd_apiserver_systemd_quote(value: str) -> str:
    """One ExecStart argument, double-quoted for systemd (``%`` doubled: no specifiers)."""
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"crd_apiserver_etcd_args": crd_apiserver_etcd_args,
                "crd_apiserver_shutdown": crd_apiserver_shutdown,
                "crd_apiserver_sans": crd_apiserver_sans,
                "crd_apiserver_certificates": crd_apiserver_certificates,
                "crd_apiserver_systemd_quote": crd_apiserver_systemd_quote}
