"""Test certificates: a throwaway CA and certificates it issues, as PEM files.

Tests of TLS need a CA a client is told to trust and a server certificate for the
address it dials (``127.0.0.1``, ``localhost``). Made fresh per test with the
``cryptography`` package, so nothing is shared with the system's trust store::

    ca = make_ca(tmp_path)                      # (ca_cert_path, ca_key_path)
    cert, key = issue_cert(tmp_path, ca)        # for 127.0.0.1 and localhost
    other = issue_cert(tmp_path, ca, ["svc.ns.svc"], stem="svc")

EC P-256 keys: quick to make on a loaded machine, and accepted by OpenSSL,
Python's ``ssl`` and curl alike.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


def make_ca(directory, name: str = "gpulab test CA") -> tuple[str, str]:
    """A self-signed CA in ``directory``: returns ``(ca_cert_path, ca_key_path)``
    (``ca.pem``, ``ca-key.pem``; the key mode 0600)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(directory, "ca", cert, key)


def issue_cert(
    directory,
    ca: tuple[str, str],
    names=("127.0.0.1", "localhost"),
    stem: str | None = None,
) -> tuple[str, str]:
    """A certificate signed by ``ca`` (``make_ca``'s pair) for ``names`` (IP addresses
    become IP entries, the rest DNS names), usable by servers and clients. Returns
    ``(cert_path, key_path)``: ``<stem>.pem`` and ``<stem>-key.pem`` in ``directory``;
    ``stem`` defaults to the first name, so certificates for other names do not
    overwrite each other."""
    names = list(names)
    if not names:
        raise ValueError("issue_cert needs at least one name (an IP address or DNS name)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(Path(ca[0]).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(ca[1]).read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _write(directory, stem or re.sub(r"[^A-Za-z0-9_.-]", "-", names[0]), cert, key)


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(directory: Path, stem: str, cert, key) -> tuple[str, str]:
    cert_path = directory / f"{stem}.pem"
    key_path = directory / f"{stem}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return str(cert_path), str(key_path)
