"""roles/k0s_controller's variables that neither k0s.yaml's checks nor the argument spec (it has
no patterns) can hold: ``k0s_version`` and ``k0s_join_token_expiry``. Applied by the role's
tasks/validate.yml (filters of plugins/filter/k0s_config.py) and by ``scripts/sandbox up``
before it uses the version or creates anything (scripts/sandboxlib/apiserver.py, through
scripts/sandboxlib/k0s_inputs.py, a link to this file), so both refuse the same values with
the same one-line message naming the variable and the fix.

- ``k0s_version`` is a k0s release tag exactly as k0s tags its releases (``v1.36.3+k0s.2``,
  pre-releases ``v1.36.3-rc.0+k0s.0``): the role puts it into the download URL
  ``<base>/<tag>/k0s-<tag>-<arch>`` and the control-node cache file ``k0s-<tag>-<arch>``
  (tasks/binary.yml), so anything else (``../../etc``) would name another URL and another file.
- ``k0s_join_token_expiry`` is a lifetime (``1h``, ``30m``, ``1h30m``) greater than zero:
  ``k0s token create`` makes a token that never expires for ``0s``, its default
  (cmd/token/create.go:91), as for any duration of 0 or less (the bootstrap token's TTL,
  pkg/token/manager.go:60-63, gets an expiration only when positive), and a controller token
  hands whoever holds it the cluster's CA key and service-account key through the join API
  (cmd/controller/controller.go:764-774, writeCerts). k0s v1.36.3+k0s.2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

EXAMPLE_VERSION = "v1.36.3+k0s.2"
# v<Kubernetes version>[-<pre-release>]+k0s.<n>: every k0s release tag since v1.22.
K0S_VERSION_RE = re.compile(
    r"v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?\+k0s\.[0-9]+")
# What tasks/validate.yml always took: whole hours, minutes and seconds (Go durations). Both
# patterns are matched whole (fullmatch).
EXPIRY_RE = re.compile(r"([0-9]+(h|m|s))+")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}


def k0s_version_error(value: Any) -> str | None:
    """Why ``value`` is not a k0s release tag, naming the fix; None when it is one."""
    text = value if isinstance(value, str) else ""
    if K0S_VERSION_RE.fullmatch(text):
        return None
    if K0S_VERSION_RE.fullmatch("v" + text):
        hint = f"did you mean 'v{text}'? k0s's tags start with v"
    elif K0S_VERSION_RE.fullmatch(text + "+k0s.0"):
        hint = f"k0s's tags end in +k0s.<n>: did you mean '{text}+k0s.0' (or a later +k0s.<n>)?"
    else:
        hint = (f"give a tag as k0s writes it, v<Kubernetes version>+k0s.<n> (pre-releases "
                f"v<version>-rc.<n>+k0s.<n>), e.g. {EXAMPLE_VERSION}")
    return (f"k0s_version: {value!r} is not a k0s release tag (it names the download URL "
            f".../<tag>/k0s-<tag>-<arch> and the cache file k0s-<tag>-<arch>); {hint} "
            "(https://github.com/k0sproject/k0s/releases)")


def k0s_token_expiry_error(value: Any) -> str | None:
    """Why ``value`` is not a lifetime for a controller join token; None when it is one."""
    text = str(value) if isinstance(value, (str, int)) else ""
    if EXPIRY_RE.fullmatch(text):
        seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"([0-9]+)(h|m|s)", text))
        if seconds > 0:
            return None
    elif not (text.startswith("-") or text in ("0", "+0")):   # Go takes "0" and negatives
        return (f"k0s_join_token_expiry: '{value}' is not a duration like 1h, 30m or 1h30m "
                "(k0s token create --expiry); give one")
    return (f"k0s_join_token_expiry: '{text}' makes a join token that never expires (k0s "
            "token create stores no expiration for a lifetime of 0 or less, its own default "
            "--expiry 0s: cmd/token/create.go:91, pkg/token/manager.go:60-63), and a controller "
            "token hands whoever holds it the cluster's CA key and service-account key through "
            "the join API (cmd/controller/controller.go:764-774); give a lifetime such as 1h "
            "or 30m")


def k0s_input_errors(settings: Mapping[str, Any]) -> list[str]:
    """The errors of the two variables among ``settings`` (those not given are not checked)."""
    checks = {"k0s_version": k0s_version_error, "k0s_join_token_expiry": k0s_token_expiry_error}
    return [e for name, check in checks.items() if name in settings
            for e in [check(settings[name])] if e]
