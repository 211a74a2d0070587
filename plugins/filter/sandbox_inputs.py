"""Checks of the roles' variables that their argument specs cannot make, run by
playbooks/validate.yml before any node changes (the same for ``scripts/sandbox up --set``,
a topology's ``vars`` and ``ansible-playbook -e``).

Ansible's ``validate_argument_spec`` converts where it should refuse: a YAML list given for a
``str`` option passes as ``"a,b"`` (``--set 'etcd_data_dir=[a, b]'`` was written as
``ETCD_DATA_DIR=a,b`` and broke a member), it takes any string as a ``path``, and it has no
ranges (a negative ``etcd_quota_backend_bytes`` switches etcd's quota off). So:

- an option of a scalar type (str, path, int, float, bool) must not be given a list or a
  mapping, a dict option takes a mapping only, a list option no mapping;
- an option of type ``path`` must be absolute (or empty, where empty means "none");
- integers must be in range: RANGES below with the reason, ports 1-65535, any other
  integer 0 or more.

Every error names the variable and the fix in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GIB = 1 << 30
SCALAR_TYPES = ("str", "path", "int", "float", "bool")
# name -> (minimum, maximum or None, why); checked after the type (ints only).
RANGES: dict[str, tuple[int, int | None, str]] = {
    "etcd_quota_backend_bytes": (
        1, 8 * GIB,
        ("etcd's backend quota: more than 8 GiB, etcd's suggested maximum, makes a member's "
         "start-up, snapshots and defragmentation slow; 0 would mean etcd's default and a "
         "negative value switches the quota off: state the size (etcd's default is 2147483648, "
         "2 GiB)")),
    "etcd_metrics_port": (0, 65535, "a TCP port, or 0 for no metrics listener"),
    "etcd_max_concurrent_streams": (
        100, 2**32 - 1,
        ("HTTP/2 streams per client connection: kube-apiserver multiplexes its requests and "
         "watches on few connections (a gRPC client waits, without an error, while a connection "
         "is at the limit) and 0 means something else to etcd's gRPC and HTTP/2 servers; "
         "4294967295 is etcd's default, no limit")),
    "etcd_health_timeout": (1, None, "seconds to wait for a healthy cluster"),
    "etcd_limit_nofile": (1024, None, ("etcd holds a file per client connection, WAL and "
                                       "snapshot: fewer than 1024 open files starve it")),
    "k0s_download_timeout": (1, None, "seconds to wait for the k0s download"),
    "k0s_ready_timeout": (1, None, "seconds to wait for a controller"),
    "crd_apiserver_ready_timeout": (1, None, "seconds to wait for /readyz"),
    "crd_apiserver_ca_validity_days": (1, None, "days a certificate is valid"),
    "crd_apiserver_cert_validity_days": (1, None, "days a certificate is valid"),
    "pki_ca_validity_days": (1, None, "days a certificate is valid"),
    "pki_cert_validity_days": (1, None, "days a certificate is valid"),
    "lb_check_fall": (1, None, "failed health checks before HAProxy takes a controller out"),
    "lb_check_rise": (1, None, "passed health checks before HAProxy puts a controller back"),
    "lb_listen_timeout": (1, None, "seconds"),
    "sandbox_nofile_cap": (1024, None, "open files of a node container"),
    "sandbox_nproc_cap": (1, None, "processes of a node container"),
}
PORT_RANGE = (1, 65535, "a TCP port")


def _shape(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__} value"


def _range(name: str) -> tuple[int, int | None, str] | None:
    if name in RANGES:
        return RANGES[name]
    if name.endswith("_port"):
        return PORT_RANGE
    return None


def _int_error(name: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return None  # validate_argument_spec refuses it as not an int
    try:
        number = int(str(value).strip())
    except ValueError:
        return None  # not a number: validate_argument_spec says so
    low, high, why = _range(name) or (0, None, "a count or a size")
    if number < low or (high is not None and number > high):
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        return f"{name}: {number} is out of range; give a value {span} ({why})"
    return None


def sandbox_input_errors(options: Mapping[str, Any], values: Mapping[str, Any]) -> list[str]:
    """Errors for the given ``values`` (variable -> value, only those set) against the
    argument-spec ``options`` (variable -> {type, ...}); [] when all are fine."""
    errors: list[str] = []
    for name in sorted(values):
        spec = options.get(name)
        if not isinstance(spec, Mapping):
            continue
        value = values[name]
        kind = str(spec.get("type") or "str")
        if kind in SCALAR_TYPES and isinstance(value, (list, tuple, Mapping)):
            errors.append(
                f"{name}: {_shape(value)} ({value!r}) where one {kind} value is expected (it "
                f"would be used as {','.join(str(v) for v in value)!r}); give a single value")
            continue
        if kind == "dict" and not isinstance(value, Mapping):
            errors.append(f"{name}: {_shape(value)} ({value!r}) where a mapping is expected; "
                          "give {key: value, ...} (YAML)")
            continue
        if kind == "list" and isinstance(value, Mapping):
            errors.append(f"{name}: a mapping ({value!r}) where a list is expected; give "
                          "[a, b, ...] (YAML)")
            continue
        if kind == "path" and isinstance(value, str) and value and not value.startswith("/"):
            errors.append(f"{name}: '{value}' is not an absolute path; give one that starts "
                          "with / (a relative path means whatever directory the service or "
                          "task happens to run in)")
        if kind == "int" and value is not None:
            error = _int_error(name, value)
            if error:
                errors.append(error)
    return errors


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_input_errors": sandbox_input_errors}
