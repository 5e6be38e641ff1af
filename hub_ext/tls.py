"""TLS for `gpulab up`: the public port's certificate and where the hub's internal CAs live.

Two ways to turn it on:

- ``--tls self-signed``: gpulab keeps a CA of its own in ``<data-dir>/tls/ca.pem``
  (its key beside it, readable by the hub's account only) and issues the public
  port's certificate from it, for this machine's names and addresses. The CA is
  what a user's browser or client trusts; `gpulab up` prints its path and
  fingerprint. It is made once and kept, so a restart keeps every browser's trust.
- ``--ssl-cert F --ssl-key F``: the operator's certificate (a site's CA, Let's
  Encrypt...). Clients trust it the way they trust any site.

Either way JupyterHub's ``internal_ssl`` is on: the hub makes its own CAs in
``<data-dir>/tls/internal`` (its state) and a certificate for each server and
service it starts, so every hop between the proxy, the hub, users' servers and the
gpulab service is TLS with certificates the hub issued.

The folder ``<data-dir>/tls`` is 0711 and ``ca.pem`` 0644: users' kernels read the
CA (``GPULAB_CA_FILE``) to trust the public URL; every key under it (gpulab's and
those JupyterHub's certipy writes in ``internal``) is the hub's account's alone (0600).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SELF_SIGNED = "self-signed"
#: The CA's life; the public certificate's is shorter and renewed at start when near its end.
CA_DAYS = 3650
CERT_DAYS = 397
RENEW_DAYS = 30


class TLSError(ValueError):
    """TLS options or files `gpulab up` cannot run with; the message says the fix."""


@dataclass(frozen=True)
class PublicTLS:
    """The public port's certificate and key, and the CA users trust ("" for the operator's)."""

    cert: Path
    key: Path
    ca: Path | None = None


def tls_dir(data_dir: Path) -> Path:
    return data_dir / "tls"


def internal_certs_dir(data_dir: Path) -> Path:
    """JupyterHub's ``internal_certs_location``: its CAs and the certificates it issues."""
    return tls_dir(data_dir) / "internal"


def internal_trust_bundle(data_dir: Path) -> Path:
    """Every internal CA in one file (certipy's ``hub-ca`` bundle, written at the hub's
    start): what the gpulab service trusts to call the hub and the proxy's API."""
    return internal_certs_dir(data_dir) / "hub-ca_trust.crt"


def check_options(tls: str, ssl_cert: str, ssl_key: str) -> None:
    """Refuse what cannot run, before anything starts."""
    if tls and tls != SELF_SIGNED:
        raise TLSError(f"--tls {tls!r}: the one choice is --tls self-signed")
    if tls and (ssl_cert or ssl_key):
        raise TLSError("--tls self-signed and --ssl-cert/--ssl-key: give one or the other")
    if bool(ssl_cert) != bool(ssl_key):
        given, missing = ("--ssl-cert", "--ssl-key") if ssl_cert else ("--ssl-key", "--ssl-cert")
        raise TLSError(f"{given} needs {missing} too (the certificate and its private key)")
    if ssl_cert:
        for option, path in (("--ssl-cert", ssl_cert), ("--ssl-key", ssl_key)):
            if not os.access(path, os.R_OK):
                raise TLSError(f"{option} {path}: no such file, or not readable by this account")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(ssl_cert, ssl_key)
        except (ssl.SSLError, ValueError) as e:
            raise TLSError(
                f"--ssl-cert {ssl_cert} with --ssl-key {ssl_key}: not a PEM certificate and "
                f"its key ({e.reason if isinstance(e, ssl.SSLError) else e})"
            ) from None


def machine_names(ip: str) -> list[str]:
    """What a browser may call this machine: the address listened on, loopback, its names."""
    names = ["localhost", "127.0.0.1", "::1"]
    for name in (socket.gethostname(), socket.getfqdn()):
        if name and name not in names:
            names.append(name)
    if ip and ip not in ("0.0.0.0", "::"):
        names.append(ip)
    else:  # every address: name the ones this machine has
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None)
        except OSError:
            infos = []
        names += [str(info[4][0]) for info in infos]
    return list(dict.fromkeys(names))


def _subject_alt_names(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``path`` whole or not at all (a crash leaves the old file), with ``mode``."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _make_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpulab CA ({socket.getfqdn()})")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
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
    _write_private(folder / "ca-key.pem", _key_pem(key))
    _write_private(folder / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _load_ca(folder: Path):
    ca_pem, key_pem = folder / "ca.pem", folder / "ca-key.pem"
    if not (ca_pem.exists() and key_pem.exists()):
        return _make_ca(folder)
    cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    key = serialization.load_pem_private_key(key_pem.read_bytes(), password=None)
    return cert, key


def _still_good(cert_path: Path, ca: x509.Certificate, names: list[str]) -> bool:
    """The kept certificate is the CA's, names every name, and is not near its end."""
    if not cert_path.exists():
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    if cert.issuer != ca.subject:
        return False
    if cert.not_valid_after_utc - _now() < dt.timedelta(days=RENEW_DAYS):
        return False
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(v) for v in sans.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    return {str(ipaddress.ip_address(n)) if _is_ip(n) else n for n in names} <= have


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _issue(folder: Path, ca: x509.Certificate, ca_key, names: list[str]) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_subject_alt_names(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(folder / "hub-key.pem", _key_pem(key))
    _write_private(folder / "hub.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def self_signed(data_dir: Path, names: list[str]) -> PublicTLS:
    """The data dir's CA (made on first use) and a certificate from it for ``names``,
    issued again when a name is new or its end is near."""
    folder = tls_dir(data_dir)
    folder.mkdir(mode=0o711, exist_ok=True)
    os.chmod(folder, 0o711)
    ca, ca_key = _load_ca(folder)
    if not _still_good(folder / "hub.pem", ca, names):
        _issue(folder, ca, ca_key, names)
    return PublicTLS(folder / "hub.pem", folder / "hub-key.pem", folder / "ca.pem")


def fingerprint(cert_path: Path) -> str:
    """SHA-256 of the certificate, as browsers show it (AB:CD:...)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def prepare_internal(data_dir: Path) -> Path:
    """The hub's internal CA folder. The folder above stays passable (0711, whatever
    the hub's umask): servers read their certificates in ``tls/servers``."""
    folder = tls_dir(data_dir)
    folder.mkdir(mode=0o711, exist_ok=True)
    os.chmod(folder, 0o711)
    internal = internal_certs_dir(data_dir)
    internal.mkdir(mode=0o700, exist_ok=True)
    os.chmod(internal, 0o700)
    return internal


def public_tls(data_dir: Path, tls: str, ssl_cert: str, ssl_key: str, ip: str) -> PublicTLS | None:
    """The public port's certificate for these options (made where it is gpulab's own);
    None without TLS. :class:`TLSError` for options that cannot run."""
    check_options(tls, ssl_cert, ssl_key)
    if tls == SELF_SIGNED:
        return self_signed(data_dir, machine_names(ip))
    if ssl_cert:
        return PublicTLS(Path(ssl_cert), Path(ssl_key))
    return None


def tls_banner(settings) -> str:
    """`gpulab up`'s lines on TLS (empty without it): which CA to trust, and how."""
    public = public_tls(
        settings.data_dir, settings.tls, settings.ssl_cert, settings.ssl_key, settings.ip
    )
    if public is None:
        return ""
    if public.ca is None:
        return f"  TLS: https with {public.cert}; every hop inside is TLS too\n"
    return (
        f"  TLS: https with gpulab's own CA, {public.ca}\n"
        f"    SHA-256 fingerprint {fingerprint(public.ca)}\n"
        f"    Trust it in your browser (import it as an authority), or in a client:\n"
        f"    curl --cacert {public.ca} ...; GPULAB_CA_FILE={public.ca} for gpulab.client\n"
    )
