"""roles/k0s_controller's k0s_version and k0s_join_token_expiry (fault 3 of issue 36):
plugins/plugin_utils/k0s_inputs.py's rules, applied by the role's validate.yml (the filter
``k0s_input_errors``; through playbooks/validate.yml in tests/test_k0s_faults.py) and by
``scripts/sandbox up`` before it uses the version or creates anything (here, as the user
types it: no node, no network, no state directory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import base_topology, load_k0s_filter, podman_objects, run_sandbox
from sandboxlib import apiserver, context, k0s_inputs
from sandboxlib.topology import load

config = load_k0s_filter("k0s_config")


@pytest.mark.parametrize("version", ["v1.36.3+k0s.2", "v1.36.3+k0s.0", "v1.35.7+k0s.0",
                                     "v1.36.3-rc.0+k0s.1", "v1.37.0-alpha.1+k0s.0",
                                     "v1.34.0-beta.0-rc.0+k0s.0"])
def test_k0s_release_tags_pass(version: str) -> None:
    """Tags as k0s writes them (git tags of k0sproject/k0s, v1.22 and later)."""
    assert k0s_inputs.k0s_version_error(version) is None


@pytest.mark.parametrize(("version", "fragment"), [
    ("../../etc", ("k0s_version: '../../etc' is not a k0s release tag (it names the download "
                  "URL .../<tag>/k0s-<tag>-<arch> and the cache file k0s-<tag>-<arch>); give a "
                  "tag as k0s writes it")),
    ("v1.36.3+k0s.2/../../x", "is not a k0s release tag"),
    ("v1.36.3+k0s.2\n", "is not a k0s release tag"),
    ("1.36.3+k0s.2", "did you mean 'v1.36.3+k0s.2'?"),
    ("v1.36.3", "did you mean 'v1.36.3+k0s.0' (or a later +k0s.<n>)?"),
    ("latest", "e.g. v1.36.3+k0s.2"),
    ("", "k0s_version: '' is not a k0s release tag"),
    (1.36, "k0s_version: 1.36 is not a k0s release tag"),
], ids=["traversal", "tag-then-path", "newline", "no-v", "no-k0s-suffix", "latest", "empty",
        "yaml-number"])
def test_other_versions_are_refused_naming_the_fix(version: Any, fragment: str) -> None:
    error = k0s_inputs.k0s_version_error(version)
    assert error is not None and fragment in error, error


@pytest.mark.parametrize("expiry", ["1h", "30m", "1h30m", "90s", "0h0m1s"])
def test_lifetimes_pass(expiry: str) -> None:
    assert k0s_inputs.k0s_token_expiry_error(expiry) is None


@pytest.mark.parametrize("expiry", ["0s", "0", "0m0s", "0h", "00m", "-1h", 0])
def test_a_token_that_never_expires_is_refused(expiry: Any) -> None:
    """k0s token create's default --expiry is 0s (cmd/token/create.go:91): no expiration."""
    error = k0s_inputs.k0s_token_expiry_error(expiry)
    assert error is not None, expiry
    assert error.startswith(f"k0s_join_token_expiry: '{expiry}' makes a join token that never "
                            "expires"), error
    assert "cmd/token/create.go:91" in error and "CA key" in error
    assert error.endswith("give a lifetime such as 1h or 30m")


@pytest.mark.parametrize("expiry", ["soon", "3600", 3600, "1.5h", "1h ", "1d"])
def test_what_is_no_duration_is_refused(expiry: Any) -> None:
    error = k0s_inputs.k0s_token_expiry_error(expiry)
    assert error is not None and "is not a duration like 1h, 30m or 1h30m" in error, error


def test_the_filter_checks_only_what_it_is_given() -> None:
    assert config.k0s_input_errors({"k0s_version": "v1.36.3+k0s.2",
                                    "k0s_join_token_expiry": "1h"}) == []
    assert config.k0s_input_errors({}) == []
    errors = config.k0s_input_errors({"k0s_version": "x", "k0s_join_token_expiry": "0s"})
    assert [e.split(":")[0] for e in errors] == ["k0s_version", "k0s_join_token_expiry"]


def test_the_role_defaults_pass() -> None:
    defaults = apiserver.k0s_defaults()
    assert config.k0s_input_errors({n: defaults[n] for n in ("k0s_version",
                                                             "k0s_join_token_expiry")}) == []


# --- scripts/sandbox up ----------------------------------------------------------------------

def test_up_checks_the_set_and_the_topology_s_values() -> None:
    topo = load("default")
    apiserver.refuse_bad_k0s_inputs(topo, {})
    with pytest.raises(context.UsageError, match=r"k0s_version: '\.\./\.\./etc' is not a k0s "
                                                 r"release tag.*; nothing was changed$"):
        apiserver.refuse_bad_k0s_inputs(topo, {"k0s_version": "../../etc"})
    topo = dataclasses.replace(topo, vars={**topo.vars, "k0s_join_token_expiry": "0s"})
    with pytest.raises(context.UsageError, match="'0s' makes a join token that never expires"):
        apiserver.refuse_bad_k0s_inputs(topo, {})
    apiserver.refuse_bad_k0s_inputs(topo, {"k0s_join_token_expiry": "30m"})   # --set wins


@pytest.mark.parametrize(("setting", "message"), [
    ("k0s_version=../../etc", "k0s_version: '../../etc' is not a k0s release tag"),
    ("k0s_join_token_expiry=0s", ("k0s_join_token_expiry: '0s' makes a join token that never "
                                 "expires")),
], ids=["k0s-version", "token-expiry"])
def test_up_refuses_before_anything_exists(tmp_path: Path, write_topology: Callable[..., Path],
                                           setting: str, message: str) -> None:
    name = "t-cli-k0s-input"
    doc = base_topology()
    doc["name"] = name
    res = run_sandbox(["up", "--topology", str(write_topology(doc)), "--apiserver", "off",
                       "--set", setting], tmp_path, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr and "nothing was changed" in res.stderr, res.stderr
    assert not (tmp_path / name).exists()
    assert podman_objects(name) == []
    assert not list((apiserver.K0S_CACHE).glob("k0s-..*"))
