"""plugins/filter/sandbox_certs.py: certificate expiry read one way for roles/pki (renewal),
roles/crd_apiserver (renewal) and verify's report, on real certificates."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from conftest import load_plugin
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

certs = load_plugin("plugins/filter/sandbox_certs.py")


def write_cert(path: Path, cn: str, days: int) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=days)).sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_expiring_within_the_window_unreadable_and_missing(tmp_path: Path) -> None:
    soon = str(write_cert(tmp_path / "soon.crt", "soon", 10))
    later = str(write_cert(tmp_path / "later.crt", "later", 400))
    broken = tmp_path / "broken.crt"
    broken.write_text("not a certificate")
    missing = str(tmp_path / "missing.crt")
    paths = [soon, later, str(broken), missing]
    assert certs.sandbox_cert_expiring(paths, 30) == [soon, str(broken), missing]
    assert certs.sandbox_cert_expiring(paths, 5) == [str(broken), missing]
    assert certs.sandbox_cert_expiring([later], 500) == [later]


def test_days_left_of_every_certificate_under_a_directory(tmp_path: Path) -> None:
    write_cert(tmp_path / "ca.crt", "sandbox-ca", 3650)
    (tmp_path / "clients").mkdir()
    write_cert(tmp_path / "clients" / "ta.crt", "ta", 30)
    now = dt.datetime.now(dt.UTC).timestamp()
    days = certs.sandbox_cert_days(str(tmp_path), now)
    assert [(d["subject"], d["days_left"]) for d in days] == [("sandbox-ca", 3649), ("ta", 29)]
    assert days[1]["file"] == str(tmp_path / "clients" / "ta.crt")
