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


# `k0s install controller` flags that break what the sandbox is (k0s v1.36.3+k0s.2).
REFUSED_INSTALL_FLAGS = {
    "--single": ("a single-node cluster: k0s defaults storage to kine unless k0s.yaml sets it, "
                 "runs a worker beside the controller and no other controller joins; the "
                 "sandbox's tenants share an external etcd and grow by joining (for a worker on "
                 "the controller set k0s_enable_worker: true)"),
    "--enable-dynamic-config": ("k0s.yaml changes (all but spec.storage) would then come from "
                                "the ClusterConfig object in the cluster, so every change the "
                                "role writes to k0s.yaml would be ignored"),
    "--status-socket": ("the role's readiness waits run `k0s status`, which asks the default "
                        "socket: with another one every wait would time out"),
    # The unit: RestartSec=10 and Restart= kardianos/service's default, always
    # (pkg/install/systemd_linux.go:22,42), so an exit with 0 is restarted too.
    "--init-only": ("`k0s controller --init-only` initialises its components and exits "
                    "(cmd/controller/controller.go:133-135, 444-446) without starting them, and "
                    "the unit restarts it every 10 s forever: no API server, no readiness"),
}

# Components `--disable-components` must leave running (k0s v1.36.3+k0s.2), with the reason.
_NO_KUBE_DNS = ("so the Service kube-system/kube-dns is never made and the role's checks "
                "(tasks/checks.yml, as k0s's inttest/externaletcd) wait in vain for its key "
                "<prefix>services/specs/kube-system/kube-dns in etcd, failing the run after 2 min")
REFUSED_DISABLED_COMPONENTS = {
    "control-api": ("which serves the controller join API (9443): no controller could join the "
                    "tenant"),
    "coredns": ("which writes CoreDNS's manifests for the applier manager to apply "
                f"(pkg/component/controller/coredns.go:317,442), {_NO_KUBE_DNS}"),
    "applier-manager": ("which applies the manifests under /var/lib/k0s/manifests, CoreDNS's "
                        "among them (cmd/controller/controller.go:372; pkg/component/controller/"
                        f"coredns.go:317,442), {_NO_KUBE_DNS}"),
}


def _flag_value(flags: list[str], i: int) -> str:
    """The value of flags[i]: after '=', else the next list element."""
    _name, eq, value = flags[i].partition("=")
    return value if eq else (flags[i + 1] if i + 1 < len(flags) else "")


def k0s_install_flag_errors(flags: Any) -> list[str]:
    """Flags in k0s_install_extra_flags that the role manages itself, and those that break
    the sandbox (REFUSED_INSTALL_FLAGS; `--disable-components` naming one of
    REFUSED_DISABLED_COMPONENTS: a list flag, each occurrence adds to it)."""
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        return ["k0s_install_extra_flags: must be a list of strings, e.g. ['--debug']"]
    errors = []
    for i, flag in enumerate(flags):
        name = flag.split("=", 1)[0]
        if name.startswith("-c") and not name.startswith("--"):
            name = "-c"
        if name in MANAGED_INSTALL_FLAGS:
            errors.append(f"k0s_install_extra_flags: '{flag}' is managed by the role "
                          f"({MANAGED_INSTALL_FLAGS[name]}); remove it")
        elif name in REFUSED_INSTALL_FLAGS:
            errors.append(f"k0s_install_extra_flags: '{flag}' is refused: "
                          f"{REFUSED_INSTALL_FLAGS[name]}; remove it")
        elif name == "--disable-components":
            errors += [f"k0s_install_extra_flags: '{flag}' disables {c}, "
                       f"{REFUSED_DISABLED_COMPONENTS[c]}; leave {c} out of --disable-components"
                       for c in dict.fromkeys(c.strip() for c in _flag_value(flags, i).split(","))
                       if c in REFUSED_DISABLED_COMPONENTS]
    return errors


def _as_bool(what: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("yes", "true"):
        return True
    if str(value).lower() in ("no", "false"):
        return False
    raise ValueError(f"k0s install plan: {what} is unknown ({value!r}); probe it first")


def k0s_bootstrap_controller(controllers: list[str], cas: dict[str, Any]) -> str:
    """The controller a tenant's other controllers join: the first (in the tenant's order)
    that holds the tenant's CA (/var/lib/k0s/pki/ca.crt); the first of the list only while
    none does. Having k0s installed is not enough: a controller whose join failed has the
    unit but no CA, and started without a token it would make a second CA on the live prefix
    (cmd/controller/controller.go:751-762)."""
    if not controllers:
        raise ValueError("k0s install plan: the tenant has no controllers")
    for c in controllers:
        if _as_bool(f"whether '{c}' holds the tenant's CA", cas.get(c)):
            return c
    return controllers[0]


def k0s_join_token_id(token: str) -> str:
    """The id of a k0s join token (what `k0s token invalidate` takes): the token is a
    kubeconfig, gzipped and base64-encoded (pkg/token/joinencode.go:14-29), whose user's
    bearer token is `<id>.<secret>` (a bootstrap token)."""
    import base64
    import binascii
    import gzip

    import yaml

    try:
        kubeconfig = yaml.safe_load(gzip.decompress(base64.b64decode(str(token).strip())))
        bearer = kubeconfig["users"][0]["user"]["token"]
    except (binascii.Error, OSError, EOFError, ValueError, yaml.YAMLError, KeyError,
            IndexError, TypeError) as err:
        raise ValueError(f"not a k0s join token ({type(err).__name__}); "
                         "`k0s token create` printed something else") from None
    token_id, dot, _secret = str(bearer).partition(".")
    if not dot or not token_id:
        raise ValueError("not a k0s join token: its bearer token is not <id>.<secret>")
    return token_id


def k0s_controller_states(controllers: list[str], probed: list[Any], stats: list[Any],
                          path: str) -> dict[str, Any]:
    """Per controller of a tenant, in its order: what this play's probe found (``probed``, a
    value per controller: true/false, or "unknown" where the play did not probe it), else
    whether the stat of ``path`` on it found the file (``stats``: the results of a looped
    stat over (controller, path) pairs, as tasks/plan.yml registers it), else "unknown"."""
    states: dict[str, Any] = dict(zip(controllers, probed))
    for result in stats or []:
        host, stat_path = result["item"]
        if stat_path == path and "stat" in result:
            states[host] = bool(result["stat"].get("exists"))
    return states


def k0s_install_plan(controllers: list[str], installed: dict[str, Any], host: str,
                     flags_current: Any, cas: dict[str, Any]) -> dict[str, Any]:
    """What `host` does: its tenant's bootstrap controller (k0s_bootstrap_controller: the
    first that holds the tenant's CA), and an action:

    - bootstrap: no controller of the tenant holds a CA and this is the first one: start
      without a token (k0s makes a new CA; tasks/first_start.yml refuses that over a prefix
      holding data unless it is a takeover). `--force` where a unit is there already (a
      controller whose join never worked).
    - join: no k0s here; install with a token made on the bootstrap controller.
    - rejoin: k0s is installed here but this controller holds no CA (its join failed, e.g.
      on an expired token, and k0s exits at every start): `k0s install controller --force`
      with a fresh token, then a restart. Never started without a token.
    - reinstall: k0s is here, with its CA, but was installed with other flags (or the unit
      was changed since, or the install was never recorded: the role records it once the
      controller is ready): `k0s install controller --force`, then a rolling restart.
    - none.

    ``token``: the install uses a join token; ``force``: `--force` (a unit is there).
    """
    if host not in controllers:
        raise ValueError(f"k0s install plan: '{host}' is not among its tenant's controllers "
                         f"({', '.join(controllers)}); list it under the tenant's controllers")
    bootstrap = k0s_bootstrap_controller(controllers, cas)
    here = _as_bool(f"whether k0s is installed on '{host}'", installed.get(host))
    has_ca = _as_bool(f"whether '{host}' holds the tenant's CA", cas.get(host))
    if host == bootstrap and not has_ca:
        action = "bootstrap"
    elif not here:
        action = "join"
    elif not has_ca:
        action = "rejoin"
    elif not _as_bool(f"whether '{host}' was installed with these flags", flags_current):
        action = "reinstall"
    else:
        action = "none"
    return {"bootstrap": bootstrap, "action": action, "token": action in ("join", "rejoin"),
            "force": here and action != "none"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "k0s_install_flag_errors": k0s_install_flag_errors,
            "k0s_bootstrap_controller": k0s_bootstrap_controller,
            "k0s_controller_states": k0s_controller_states,
            "k0s_install_plan": k0s_install_plan,
            "k0s_join_token_id": k0s_join_token_id,
        }
