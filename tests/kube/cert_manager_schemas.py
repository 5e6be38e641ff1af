"""JSON schemas of the cert-manager resources the chart renders with tls.internal, written
from cert-manager's ``cert-manager.io/v1`` API reference (https://cert-manager.io/docs/reference/api-docs/)
and its CRDs (``deploy/crds/cert-manager.io_certificates.yaml``, ``..._issuers.yaml``).

kubernetes-validate ships schemas for built-in kinds only. These cover the fields the
chart sets and reject any other (a typo fails); :func:`check_cert_manager` adds the
rules the API server enforces beyond the schema (a name for the certificate, the
64-character limit on a common name, ``renewBefore`` under ``duration``).
"""

from __future__ import annotations

import re

import jsonschema

_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _NAME, "namespace": _NAME, "labels": _STR_MAP, "annotations": _STR_MAP},
}
#: Go's time.ParseDuration, as cert-manager reads duration and renewBefore.
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
#: cert-manager's KeyUsage values.
USAGES = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
]
_ISSUER_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "kind": {"type": "string"},
        "group": {"type": "string"},
    },
}
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}

CERTIFICATE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["secretName", "issuerRef"],
            "additionalProperties": False,
            "properties": {
                "secretName": _NAME,
                "issuerRef": _ISSUER_REF,
                "commonName": {"type": "string"},
                "dnsNames": _STRINGS,
                "ipAddresses": _STRINGS,
                "uris": _STRINGS,
                "emailAddresses": _STRINGS,
                "duration": _DURATION,
                "renewBefore": _DURATION,
                "isCA": {"type": "boolean"},
                "usages": {"type": "array", "items": {"enum": USAGES}},
                "privateKey": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "size": {"type": "integer"},
                        "encoding": {"enum": ["PKCS1", "PKCS8"]},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    },
                },
                "secretTemplate": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"labels": _STR_MAP, "annotations": _STR_MAP},
                },
            },
        },
    },
}

ISSUER = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            # An issuer is exactly one kind; the chart makes only these two.
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "selfSigned": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"crlDistributionPoints": _STRINGS},
                },
                "ca": {
                    "type": "object",
                    "required": ["secretName"],
                    "additionalProperties": False,
                    "properties": {
                        "secretName": _NAME,
                        "crlDistributionPoints": _STRINGS,
                        "ocspServers": _STRINGS,
                    },
                },
            },
        },
    },
}

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def seconds(duration: str) -> float:
    """A Go duration string (``2160h``, ``1h30m``) in seconds."""
    return sum(
        float(n) * _UNIT_S[u] for n, u in re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", duration)
    )


def check_cert_manager(obj: dict) -> None:
    """Validate a cert-manager ``Certificate`` or ``Issuer`` the way the API server and
    cert-manager's webhook would; AssertionError naming the object otherwise."""
    key = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    schema = CERTIFICATE if obj.get("kind") == "Certificate" else ISSUER
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError as e:
        where = ".".join(map(str, e.absolute_path))
        raise AssertionError(f"{key}: {e.message} at {where}") from None
    if obj["kind"] != "Certificate":
        return
    spec = obj["spec"]
    names = ("commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses")
    assert any(spec.get(n) for n in names), f"{key}: names nothing (commonName, dnsNames...)"
    assert len(spec.get("commonName", "")) <= 64, f"{key}: commonName over 64 characters"
    if "renewBefore" in spec:
        assert seconds(spec["renewBefore"]) < seconds(spec.get("duration", "2160h")), (
            f"{key}: renewBefore must be shorter than duration"
        )
