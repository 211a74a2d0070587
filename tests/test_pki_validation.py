"""Bad PKI input fails before anything is generated or any node is touched.

Runs the real playbooks/pki.yml with inventories whose hosts point at a closed port on
loopback: if validation did not stop the play first, Ansible would report them
unreachable instead of the expected message, and the PKI directory would exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[1]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def _inventory(tmp_path: Path, etcd: dict[str, str], controllers: dict[str, str]) -> Path:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "nobody"}
    inv: dict[str, Any] = {
        "all": {
            "vars": {
                "etcd_tls": True,
                "pki_dir": str(tmp_path / "pki"),
                "k0s_tenants": [{"name": "t1", "prefix": "t1", "controllers": list(controllers),
                                 "key_prefix": "/t1/"}],
            },
            "children": {
                "etcd": {"hosts": {h: {**unreachable, "node_address": a} for h, a in etcd.items()}},
                "k0s_controller": {
                    "hosts": {h: {**unreachable, "node_address": a, "k0s_tenant": "t1"}
                              for h, a in controllers.items()}
                },
            },
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _run_pki(inventory: Path, extra: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(REPO / "playbooks" / "pki.yml")]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


GOOD_ETCD = {"e1": "10.213.99.11", "e2": "10.213.99.12", "e3": "10.213.99.13"}
GOOD_CTRL = {"c1": "10.213.99.21"}


@pytest.mark.parametrize(
    ("etcd", "extra", "message"),
    [
        (GOOD_ETCD, {"pki_key_type": "dsa-1024"}, "pki_key_type"),
        ({}, None, "pki_etcd_group: the inventory has no hosts in group 'etcd'"),
        ({"e1": "10.213.99.11", "e2": "10.213.99.11", "e3": "10.213.99.13"}, None,
         "node_address: members share an address"),
        (GOOD_ETCD, {"pki_extra_sans": ["not a name!"]}, "not a name! is neither an IP address nor a DNS name"),
        (GOOD_ETCD, {"pki_extra_sans_by_host": {"e9": ["etcd.example"]}}, "e9 is not an etcd member"),
        (GOOD_ETCD, {"pki_cert_validity_days": "soon"}, "pki_cert_validity_days"),
        (GOOD_ETCD, {"k0s_tenants": [{"name": "admin", "prefix": "a", "controllers": ["c1"],
                                      "key_prefix": "/a/"}]},
         "k0s_tenants (admin).name: 'admin' is reserved"),
        (GOOD_ETCD, {"k0s_tenants": [{"name": "peers", "prefix": "a", "controllers": ["c1"],
                                      "key_prefix": "/a/"}],
                     "pki_member_common_name": "peers"},
         ("'peers' is reserved (the member certificates' CN (pki_member_common_name), the only one "
         "the peer port admits); rename the tenant")),
        (GOOD_ETCD, {"k0s_tenants": [{"name": "e2", "prefix": "a", "controllers": ["c1"],
                                      "key_prefix": "/a/"}]},
         "k0s_tenants (e2).name: 'e2' is also an etcd member's name"),
    ],
    ids=["unknown-key-type", "no-members", "duplicate-address", "bad-san", "san-for-unknown-member",
         "validity-not-int", "tenant-admin", "tenant-named-like-the-member-cn",
         "tenant-named-like-a-member"],
)
def test_bad_input_fails_before_any_change(tmp_path: Path, etcd: dict[str, str],
                                           extra: dict[str, Any] | None, message: str) -> None:
    result = _run_pki(_inventory(tmp_path, etcd, GOOD_CTRL), extra)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output
    assert message in output, output
    assert "UNREACHABLE" not in output, "validation ran after a node was contacted"
    assert not (tmp_path / "pki").exists(), "PKI files were generated despite bad input"


def test_good_input_reaches_the_nodes(tmp_path: Path) -> None:
    """Control case: valid input passes validation, generates the PKI, then fails only
    because the (closed-port) nodes are unreachable."""
    result = _run_pki(_inventory(tmp_path, GOOD_ETCD, GOOD_CTRL))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "UNREACHABLE" in output, output
    assert (tmp_path / "pki" / "ca.crt").is_file()
    assert oct((tmp_path / "pki" / "ca.key").stat().st_mode & 0o777) == "0o600"
    # Every member certificate has the one CN the peer port admits; its SANs stay its own.
    for member, address in GOOD_ETCD.items():
        cert = x509.load_pem_x509_certificate((tmp_path / "pki" / "members" / f"{member}.crt").read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "etcd-member"
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert member in sans.get_values_for_type(x509.DNSName)
        assert address in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    # The shared CN cannot change under an existing cluster (members restarted one at a time
    # would refuse each other on the peer port): refused before any node is contacted.
    again = _run_pki(_inventory(tmp_path, GOOD_ETCD, GOOD_CTRL), {"pki_member_common_name": "peers"})
    output = " ".join((again.stdout + again.stderr).split())
    assert again.returncode != 0, output
    assert ("pki_member_common_name: the certificates of e1, e2, e3 carry CN 'etcd-member', the one "
            "CN etcd admits on the peer port") in output, output
    assert "UNREACHABLE" not in output
