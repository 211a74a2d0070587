"""roles/etcd's bounds on what one client may take from a member (issue 55): etcd's
per-connection HTTP/2 stream limit (etcd_max_concurrent_streams -> --max-concurrent-streams)
and the nftables connection limits on the certificate-free metrics port
(etcd_metrics_conn_limit_per_source / _total -> templates/etcd-metrics-limit.nft.j2, loaded by
templates/etcd-metrics-limit.service.j2).

The role's own templates and variables rendered by Ansible for members with different
settings; the range check validate.yml makes; then a real etcd on loopback (the pinned Debian
package's binary, as tests/test_sandbox_etcd.py runs it) started with the rendered setting,
asked by molecule/etcd/limits_probe.py over one HTTP/2 connection: it advertises the limit and
refuses the streams beyond it. The nftables rules themselves are loaded and hit with real
connections in the Molecule scenario etcd (molecule/etcd/metrics_limit.yml): they need
CAP_NET_ADMIN in a network namespace, which the podman nodes have and this test does not ask
for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT, free_ports, load_plugin
from test_sandbox_etcd import _etcd_binaries

ROLE = REPO_ROOT / "roles" / "etcd"
probe = load_plugin("molecule/etcd/limits_probe.py")
inputs = load_plugin("plugins/filter/sandbox_inputs.py")

# member -> the role variables it is rendered with (over the role's defaults).
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "per-source-only": {"etcd_metrics_conn_limit_total": 0, "etcd_metrics_port": 12381,
                        "etcd_max_concurrent_streams": 4294967295},
    "total-only": {"etcd_metrics_conn_limit_per_source": 0},
    "no-limits": {"etcd_metrics_conn_limit_per_source": 0, "etcd_metrics_conn_limit_total": 0},
    "no-metrics-port": {"etcd_metrics_port": 0},
    "extra-drops-streams": {"etcd_extra_settings": {"max-concurrent-streams": None}},
}

PLAYBOOK = """
- hosts: etcd
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars: {file: "%(role)s/defaults/main.yml"}
    - ansible.builtin.include_vars: {file: "%(role)s/vars/main.yml"}
    - ansible.builtin.set_fact: {"{{ item.key }}": "{{ item.value }}"}
      loop: "{{ case | dict2items }}"
    - ansible.builtin.template: {src: "%(role)s/templates/{{ item }}.j2", dest: "%(out)s/{{ inventory_hostname }}.{{ item }}", mode: "0644"}
      loop: [etcd.env, etcd-metrics-limit.nft, etcd-metrics-limit.service]
    - ansible.builtin.copy:
        dest: "%(out)s/{{ inventory_hostname }}.json"
        content: "{{ {'wanted': etcd_metrics_limit_wanted | bool, 'paths': etcd_managed_paths} | to_json }}"
        mode: "0644"
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each case's etcd.env, rules, unit and computed values, as the role renders them."""
    tmp = tmp_path_factory.mktemp("etcd-limits")
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "node_address": f"10.213.59.{10 + i}", "case": case}
             for i, (name, case) in enumerate(CASES.items())}
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"etcd": {"hosts": hosts}}))
    (tmp / "render.yml").write_text(PLAYBOOK % {"role": ROLE, "out": tmp})
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env.setdefault("ANSIBLE_STRATEGY", "linear")
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(tmp / "inventory.yml"), str(tmp / "render.yml")],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    out: dict[str, dict[str, Any]] = {}
    for name in CASES:
        files = {kind: (tmp / f"{name}.{kind}").read_text()
                 for kind in ("etcd.env", "etcd-metrics-limit.nft", "etcd-metrics-limit.service")}
        out[name] = {**files, **json.loads((tmp / f"{name}.json").read_text())}
    return out


def _env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def _rules(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_defaults_bound_the_streams_and_the_metrics_port(rendered: dict[str, dict[str, Any]]) -> None:
    member = rendered["defaults"]
    assert _env(member["etcd.env"])["ETCD_MAX_CONCURRENT_STREAMS"] == "1000"
    rules = _rules(member["etcd-metrics-limit.nft"])
    # the table replaced whole in one transaction, new connections to 2381 only, loopback exempt
    assert rules[:3] == ["table inet etcd_metrics_limit", "delete table inet etcd_metrics_limit",
                         "table inet etcd_metrics_limit {"]
    assert 'tcp dport 2381 ct state new iif != "lo" jump metrics_port' in rules
    assert "add @per_source_ipv4 { ip saddr ct count over 16 } counter reject with tcp reset" in rules
    assert "add @per_source_ipv6 { ip6 saddr ct count over 16 } counter reject with tcp reset" in rules
    assert "ct count over 256 counter reject with tcp reset" in rules
    assert member["wanted"] is True
    unit = member["etcd-metrics-limit.service"]
    for line in ("Before=etcd.service", "After=nftables.service", "PartOf=nftables.service",
                 "ReloadPropagatedFrom=nftables.service", "Type=oneshot", "RemainAfterExit=yes",
                 "ExecStart=/usr/sbin/nft -f /etc/etcd/metrics-limit.nft",
                 "ExecReload=/usr/sbin/nft -f /etc/etcd/metrics-limit.nft",
                 "ExecStop=-/usr/sbin/nft delete table inet etcd_metrics_limit",
                 "WantedBy=multi-user.target nftables.service"):
        assert line in unit.splitlines(), line
    # the probe reads both files (a warm run changes nothing; up's drift check sees them)
    assert {"/etc/etcd/metrics-limit.nft", "/etc/systemd/system/etcd-metrics-limit.service"} <= set(member["paths"])


def test_each_connection_limit_alone(rendered: dict[str, dict[str, Any]]) -> None:
    per_source = _rules(rendered["per-source-only"]["etcd-metrics-limit.nft"])
    assert 'tcp dport 12381 ct state new iif != "lo" jump metrics_port' in per_source
    assert any("ip saddr ct count over 16" in r for r in per_source)
    assert not any(r.startswith("ct count over") for r in per_source)
    total = _rules(rendered["total-only"]["etcd-metrics-limit.nft"])
    assert "ct count over 256 counter reject with tcp reset" in total
    assert not any("saddr" in r or "set per_source" in r for r in total)
    assert rendered["per-source-only"]["wanted"] and rendered["total-only"]["wanted"]
    assert _env(rendered["per-source-only"]["etcd.env"])["ETCD_MAX_CONCURRENT_STREAMS"] == "4294967295"


def test_no_port_or_no_limit_means_no_rules(rendered: dict[str, dict[str, Any]]) -> None:
    """metrics_limit.yml then stops and removes the unit and the rules (when they are there)."""
    assert rendered["no-limits"]["wanted"] is False
    assert rendered["no-metrics-port"]["wanted"] is False
    assert "ETCD_LISTEN_METRICS_URLS" not in _env(rendered["no-metrics-port"]["etcd.env"])


def test_extra_settings_can_drop_the_stream_limit(rendered: dict[str, dict[str, Any]]) -> None:
    assert "ETCD_MAX_CONCURRENT_STREAMS" not in _env(rendered["extra-drops-streams"]["etcd.env"])


def test_the_stream_limit_is_range_checked_before_any_node() -> None:
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"]["main"]["options"]
    for bad in (0, 99, 2**32):
        errors = inputs.sandbox_input_errors(options, {"etcd_max_concurrent_streams": bad})
        assert len(errors) == 1 and f"etcd_max_concurrent_streams: {bad} is out of range" in errors[0], errors
    for good in (100, 1000, 2**32 - 1):
        assert inputs.sandbox_input_errors(options, {"etcd_max_concurrent_streams": good}) == []
    errors = inputs.sandbox_input_errors(options, {"etcd_metrics_conn_limit_total": -1})
    assert len(errors) == 1 and "etcd_metrics_conn_limit_total: -1 is out of range" in errors[0], errors


# -- a real etcd -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _etcd_binaries(tmp_path_factory.mktemp("etcd-bin")) / "etcd"


@pytest.fixture
def start_etcd(etcd_bin: Path, tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> int:
        client, peer = free_ports(2)
        name = f"m{len(procs)}"
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(
            [str(etcd_bin), "--name", name, "--data-dir", str(tmp_path / name),
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"{name}=http://127.0.0.1:{peer}", "--log-level", "error"],
            env={"PATH": os.environ.get("PATH", ""), **env}, stdout=log, stderr=log))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                probe.streams("127.0.0.1", client, 1, wait=1)
                return client
            except OSError:
                time.sleep(0.2)
        raise AssertionError((tmp_path / f"{name}.log").read_text()[-2000:])

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=20)


def test_etcd_advertises_and_enforces_the_rendered_stream_limit(
        rendered: dict[str, dict[str, Any]], start_etcd: Any) -> None:
    """One connection opening 1010 Watch streams, each with a watch-create request: with the
    role's setting etcd creates 1000 watches and refuses the other 10 (REFUSED_STREAM, 7);
    without it (etcd's default, 2^32-1) it creates all 1010. This is the gRPC server's path
    (h2c); the TLS path (Go's HTTP/2 server, same setting) is the etcd scenario's."""
    setting = _env(rendered["defaults"]["etcd.env"])["ETCD_MAX_CONCURRENT_STREAMS"]
    limited = start_etcd({"ETCD_MAX_CONCURRENT_STREAMS": setting})
    seen = probe.streams("127.0.0.1", limited, 1010)
    assert (seen["advertised"], seen["answered"], seen["refused"], seen["refused_codes"]) == \
        (1000, 1000, 10, [7]), seen
    unlimited = start_etcd({})
    seen = probe.streams("127.0.0.1", unlimited, 1010)
    assert (seen["answered"], seen["refused"]) == (1010, 0), seen
