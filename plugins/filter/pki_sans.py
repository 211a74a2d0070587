"""Filters for the pki role: classify Subject Alternative Names as IP or DNS."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

_DNS_RE = re.compile(
    r"^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def _classify(value: Any) -> str | None:
    text = str(value).strip()
    for prefix in ("IP:", "DNS:"):
        text = text.removeprefix(prefix)
    try:
        return f"IP:{ipaddress.ip_address(text)}"
    except ValueError:
        pass
    if _DNS_RE.match(text) and not re.match(r"^[0-9.]+$", text) and len(text) <= 253:
        return f"DNS:{text.rstrip('.').lower()}"
    return None


def pki_invalid_sans(values: list[Any]) -> list[str]:
    """The values that are neither an IP address nor a DNS name."""
    return [str(v) for v in values if _classify(v) is None]


def pki_sans(values: list[Any]) -> list[str]:
    """SANs as 'IP:x' / 'DNS:x', deduplicated, in first-seen order."""
    out: list[str] = []
    for v in values:
        san = _classify(v)
        if san is None:
            raise ValueError(f"'{v}' is neither an IP address nor a DNS name")
        if san not in out:
            out.append(san)
    return out


def pki_certificates(
    members: dict[str, list[Any]],
    tenants: list[dict[str, Any]],
    admin_cn: str,
    extra_sans: list[Any],
    extra_by_host: dict[str, list[Any]],
    dns_domain: str = "",
    member_cn: str = "etcd-member",
) -> list[dict[str, Any]]:
    """Every certificate the PKI issues below the CA.

    ``members`` maps a member name to the addresses it is reached by. A member certificate
    serves as server and peer certificate (EKU serverAuth + clientAuth) with every name and
    address of the member as SANs and the CN ``member_cn`` that all members share (etcd's
    --peer-cert-allowed-cn admits only that CN on the peer port); client certificates carry
    clientAuth only, CN = the tenant's name (its etcd user) or ``admin_cn``.
    """
    certs: list[dict[str, Any]] = []
    for name, addresses in members.items():
        names: list[Any] = [a for a in addresses if a]
        names.append(name)
        if dns_domain:
            names.append(f"{name}.{dns_domain.strip('.')}")
        names += ["localhost", "127.0.0.1", "::1"]
        names += list(extra_sans) + list(extra_by_host.get(name, []))
        certs.append({"name": name, "kind": "members", "cn": member_cn, "sans": pki_sans(names),
                      "eku": ["serverAuth", "clientAuth"]})
    for tenant in tenants:
        certs.append({"name": tenant["name"], "kind": "clients", "cn": tenant["name"],
                      "sans": [], "eku": ["clientAuth"]})
    certs.append({"name": "admin", "kind": "clients", "cn": admin_cn, "sans": [],
                  "eku": ["clientAuth"]})
    return certs


def pki_member_cn_changes(members: list[str], pki_dir: str, member_cn: str) -> dict[str, str]:
    """Members whose certificate on the control node has a CN other than ``member_cn`` and
    other than the member's own name (what certificates had before the CN was shared):
    {member: its CN}. Missing or unreadable files are left out (they are simply issued)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    changed: dict[str, str] = {}
    for name in members:
        try:
            with open(f"{pki_dir}/members/{name}.crt", "rb") as fh:
                cert = x509.load_pem_x509_certificate(fh.read())
        except (OSError, ValueError):
            continue
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        cn = str(cns[0].value) if cns else ""
        if cn not in (member_cn, name):
            changed[name] = cn
    return changed


def pki_cert_id(cert: dict[str, Any]) -> str:
    """'members/etcd-1' style identifier of a certificate entry."""
    return f"{cert['kind']}/{cert['name']}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"pki_sans": pki_sans, "pki_invalid_sans": pki_invalid_sans,
                "pki_certificates": pki_certificates, "pki_cert_id": pki_cert_id,
                "pki_member_cn_changes": pki_member_cn_changes}
