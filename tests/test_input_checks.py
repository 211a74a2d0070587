"""plugins/filter/sandbox_inputs.py: the shape, path and range checks playbooks/validate.yml
makes before any node changes, where the roles' argument specs would convert instead (the
CLI cases, `up --set`, are in test_cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]


inputs = load_plugin("plugins/filter/sandbox_inputs.py")


def _options() -> dict[str, Any]:
    options: dict[str, Any] = {}
    for spec in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            options.update(entry.get("options") or {})
    return options


OPTIONS = _options()


@pytest.mark.parametrize(("values", "fragment"), [
    ({"etcd_data_dir": ["a", "b"]}, "etcd_data_dir: a list (['a', 'b']) where one path value"),
    ({"etcd_version": {"v": 1}}, "etcd_version: a mapping ({'v': 1}) where one str value"),
    ({"etcd_client_port": [2379]}, "etcd_client_port: a list ([2379]) where one int value"),
    ({"etcd_tls": [True]}, "etcd_tls: a list ([True]) where one bool value"),
    ({"etcd_extra_settings": "x=1"}, "etcd_extra_settings: a str value ('x=1') where a mapping"),
    ({"etcd_packages": {"a": 1}}, "etcd_packages: a mapping ({'a': 1}) where a list is expected"),
    ({"etcd_config_dir": "etc/etcd"}, "etcd_config_dir: 'etc/etcd' is not an absolute path"),
    ({"k0s_config_path": "k0s.yaml"}, "k0s_config_path: 'k0s.yaml' is not an absolute path"),
    ({"etcd_quota_backend_bytes": 0}, "etcd_quota_backend_bytes: 0 is out of range"),
    ({"etcd_quota_backend_bytes": -5}, "etcd_quota_backend_bytes: -5 is out of range"),
    ({"etcd_quota_backend_bytes": 8 * 2**30 + 1}, "give a value from 1 to 8589934592 (etcd's"),
    ({"etcd_peer_port": 0}, "etcd_peer_port: 0 is out of range; give a value from 1 to 65535"),
    ({"etcd_metrics_port": -1}, "etcd_metrics_port: -1 is out of range; give a value from 0"),
    ({"etcd_health_timeout": 0}, "etcd_health_timeout: 0 is out of range; give a value 1 or more"),
    ({"etcd_limit_nofile": 100}, "etcd_limit_nofile: 100 is out of range; give a value 1024 or more"),
    ({"pki_renew_before_days": -1}, "pki_renew_before_days: -1 is out of range; give a value 0 or more"),
], ids=["list-for-path", "mapping-for-str", "list-for-int", "list-for-bool", "str-for-dict",
        "mapping-for-list", "relative-node-dir", "relative-node-file", "quota-zero",
        "quota-negative", "quota-above-8gib", "port-zero", "metrics-port-negative",
        "timeout-zero", "nofile-low", "days-negative"])
def test_bad_values_are_refused_naming_the_variable(values: dict[str, Any], fragment: str) -> None:
    errors = inputs.sandbox_input_errors(OPTIONS, values)
    assert len(errors) == 1 and fragment in errors[0], errors


def test_good_values_pass() -> None:
    good = {"etcd_data_dir": "/srv/etcd", "etcd_archive_path": "", "etcd_client_port": "2379",
            "etcd_quota_backend_bytes": 8 * 2**30, "etcd_metrics_port": 0, "etcd_tls": True,
            "etcd_packages": ["etcd-server"], "etcd_extra_settings": {"a": 1},
            "k0s_spec_extra": {}, "pki_renew_before_days": 0, "not_a_role_variable": [1]}
    assert inputs.sandbox_input_errors(OPTIONS, good) == []


def test_every_range_names_a_declared_integer() -> None:
    """A range for a variable no role declares as an int would never be checked."""
    assert [n for n in inputs.RANGES if OPTIONS.get(n, {}).get("type") != "int"] == []
