"""The live cluster's private PKI: one CA, a serving certificate per server, a client
certificate per identity (the API server maps CN to the user and O to its groups).

EC P-256 keys (fast to make; Kubernetes takes them everywhere, service-account
signing included). Everything is written under one folder, 0600, for one run.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=2)


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    path.chmod(0o600)
    return str(path)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class Pair:
    cert: str
    key: str


class Pki:
    """``Pki(folder)`` makes the CA; :meth:`server` and :meth:`client` sign leaves."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpulab-test-kube-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = _write(folder / "ca.crt", self._ca_cert.public_bytes(serialization.Encoding.PEM))
        self.ca_pem = self._ca_cert.public_bytes(serialization.Encoding.PEM)

    def _leaf(self, stem: str, cn: str, orgs=(), sans=(), server=False, client=False) -> Pair:
        key = _key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        now = datetime.datetime.now(datetime.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if sans:
            names = []
            for s in sans:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(s)))
                except ValueError:
                    names.append(x509.DNSName(s))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return Pair(
            _write(self.folder / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            _write(self.folder / f"{stem}.key", _key_pem(key)),
        )

    def server(self, stem: str, cn: str, sans: list[str]) -> Pair:
        return self._leaf(stem, cn, sans=sans, server=True)

    def client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> Pair:
        return self._leaf(stem, user, orgs=groups, client=True)

    def service_account_keys(self) -> Pair:
        """The key pair that signs (private) and checks (public) service-account tokens."""
        key = _key()
        pub = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return Pair(
            _write(self.folder / "sa.pub", pub), _write(self.folder / "sa.key", _key_pem(key))
        )

    def kubeconfig(self, path: Path, server: str, pair: Pair, user: str) -> str:
        """A kubeconfig for ``user`` (its client certificate) at ``server``, trusting the CA."""
        import json

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpulab-test",
                    "cluster": {"server": server, "certificate-authority": self.ca},
                }
            ],
            "users": [
                {"name": user, "user": {"client-certificate": pair.cert, "client-key": pair.key}}
            ],
            "contexts": [{"name": user, "context": {"cluster": "gpulab-test", "user": user}}],
            "current-context": user,
        }
        return _write(path, json.dumps(config, indent=1).encode())
