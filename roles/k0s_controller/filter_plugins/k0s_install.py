"""The k0s install plan of roles/k0s_controller (tasks/plan.yml) and the install flags.

Which controller bootstraps a tenant, which join it with a controller token, which get their
unit rewritten with `k0s install controller --force`, and which `k0s install controller`
flags the role sets itself. Facts from k0s v1.36.3+k0s.2: the unit's ExecStart carries the
install flags and is written only when missing or with --force (cmd/install, pkg/install);
with an external etcd a controller joins only while it has no ca.crt/ca.key
(cmd/controller needToJoin), so a controller installed without a token next to running ones
starts a second cluster with its own CA.
"""

from __future__ import annotations

from typing import Any

# `k0s install controller` flags the role sets itself (or that would break what it reads).
MANAGED_INSTALL_FLAGS = {
    "--config": "the role passes -c with k0s_config_path",
    "-c": "the role passes -c with k0s_config_path",
    "--token-file": "the role makes a join token on the tenant's bootstrap controller",
    "--force": "the role adds --force itself when the install flags change",
    "--start": "the role starts k0s and waits for it to be ready",
    "--enable-worker": "set k0s_enable_worker: true",
    "--no-taints": "set k0s_enable_worker: true (it adds --enable-worker --no-taints)",
    "--data-dir": "the role reads /var/lib/k0s (admin kubeconfig, k0s kubectl)",
}


def k0s_install_flag_errors(flags: Any) -> list[str]:
    """Flags in k0s_install_extra_flags that the role manages itself."""
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        return ["k0s_install_extra_flags: must be a list of strings, e.g. ['--debug']"]
    errors = []
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name.startswith("-c") and not name.startswith("--"):
            name = "-c"
        if name in MANAGED_INSTALL_FLAGS:
            errors.append(f"k0s_install_extra_flags: '{flag}' is managed by the role "
                          f"({MANAGED_INSTALL_FLAGS[name]}); remove it")
    return errors


def _as_bool(what: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("yes", "true"):
        return True
    if str(value).lower() in ("no", "false"):
        return False
    raise ValueError(f"k0s install plan: {what} is unknown ({value!r}); probe it first")


def k0s_bootstrap_controller(controllers: list[str], installed: dict[str, Any]) -> str:
    """The controller a tenant's other controllers join: the first (in the tenant's order)
    that has k0s installed; the first of the list only while none has. So a tenant whose
    first controller lost k0s while another still runs it never gets a second cluster
    (a new Kubernetes CA) from that first controller."""
    if not controllers:
        raise ValueError("k0s install plan: the tenant has no controllers")
    for c in controllers:
        if _as_bool(f"whether k0s is installed on '{c}'", installed.get(c)):
            return c
    return controllers[0]


def k0s_install_plan(controllers: list[str], installed: dict[str, Any], host: str,
                     flags_current: Any) -> dict[str, Any]:
    """What `host` does: its tenant's bootstrap controller, and an action:

    - bootstrap: k0s is nowhere in the tenant; install without a token (a new cluster).
    - join: no k0s here but the bootstrap has it; install with a token made there.
    - reinstall: k0s is here but was installed with other flags (or the unit was changed
      since): `k0s install controller --force`, then a rolling restart. A controller other
      than the bootstrap gets a fresh token as well, so a unit that never joined joins
      instead of starting a new cluster.
    - none.
    """
    if host not in controllers:
        raise ValueError(f"k0s install plan: '{host}' is not among its tenant's controllers "
                         f"({', '.join(controllers)}); list it under the tenant's controllers")
    bootstrap = k0s_bootstrap_controller(controllers, installed)
    if not _as_bool(f"whether k0s is installed on '{host}'", installed.get(host)):
        action = "bootstrap" if host == bootstrap else "join"
    elif not _as_bool(f"whether '{host}' was installed with these flags", flags_current):
        action = "reinstall"
    else:
        action = "none"
    return {"bootstrap": bootstrap, "action": action,
            "token": action == "join" or (action == "reinstall" and host != bootstrap)}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "k0s_install_flag_errors": k0s_install_flag_errors,
            "k0s_bootstrap_controller": k0s_bootstrap_controller,
            "k0s_install_plan": k0s_install_plan,
        }
