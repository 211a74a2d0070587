"""Certificate expiry, read ONE way for every role (in-process with ``cryptography``, what
community.crypto uses, so a run where nothing is due makes no module run):

- ``paths | sandbox_cert_expiring(days)``: the files that are unreadable or expire within
  ``days`` days (roles/pki and roles/crd_apiserver re-issue them);
- ``pki_dir | sandbox_cert_days(now)``: days left of every certificate under a directory
  (verify's report).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any


def cert_not_after(path: str) -> dt.datetime | None:
    """When the PEM certificate at ``path`` expires (UTC); None when it cannot be read."""
    from cryptography import x509

    try:
        with open(path, "rb") as fh:
            return x509.load_pem_x509_certificate(fh.read()).not_valid_after_utc
    except (OSError, ValueError):
        return None


def sandbox_cert_expiring(paths: list[str], days: int) -> list[str]:
    """The certificate files that are unreadable or expire within ``days`` days."""
    limit = dt.datetime.now(dt.UTC) + dt.timedelta(days=int(days))
    due = []
    for path in paths:
        not_after = cert_not_after(path)
        if not_after is None or not_after <= limit:
            due.append(path)
    return due


def sandbox_cert_days(pki_dir: str, now_epoch: float) -> list[dict[str, Any]]:
    """Days until each certificate (*.crt under pki_dir) expires, with its subject's CN."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    out = []
    for path in sorted(Path(pki_dir).rglob("*.crt")):
        not_after = cert_not_after(str(path))
        if not_after is None:
            out.append({"file": str(path), "subject": "", "not_after": "", "days_left": -1})
            continue
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        out.append({"file": str(path), "subject": str(cns[0].value) if cns else "",
                    "not_after": not_after.isoformat(),
                    "days_left": int((not_after.timestamp() - float(now_epoch)) // 86400)})
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sandbox_cert_expiring": sandbox_cert_expiring,
                "sandbox_cert_days": sandbox_cert_days}
