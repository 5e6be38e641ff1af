"""The service's TLS: its certificate from the hub (``internal_ssl``), and what it trusts.

Under ``gpulab up --tls`` the hub starts the service with ``JUPYTERHUB_SSL_CERTFILE``
and ``JUPYTERHUB_SSL_KEYFILE`` (a certificate its internal CA issued for it) and an
https ``JUPYTERHUB_SERVICE_URL``. The service and its endpoint router serve TLS with
that certificate: the proxy verifies it against the hub's CAs.

They do not ask callers for a certificate: every route still wants a hub token, and
kernels and Slurm nodes call the service too. Calling the hub's API and the proxy's,
the service shows the same certificate, since those two ask for one (JupyterHub's
internal TLS is mutual there), and trusts the CAs in ``GPULAB_CA_FILE``
(:mod:`gpulab.client.tls`).
"""

from __future__ import annotations

import functools
import os
import ssl

from gpulab.client.tls import client_context

CERT_ENV = "JUPYTERHUB_SSL_CERTFILE"
KEY_ENV = "JUPYTERHUB_SSL_KEYFILE"


def serves_tls(environ=os.environ) -> bool:
    return bool(environ.get(CERT_ENV) and environ.get(KEY_ENV))


def server_context(environ=os.environ) -> ssl.SSLContext | None:
    """The service's own certificate to serve with; None without one (plain HTTP)."""
    if not serves_tls(environ):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(environ[CERT_ENV], environ[KEY_ENV])
    return context


def platform_client_context(environ=os.environ) -> ssl.SSLContext:
    """For the service's calls to the hub and the proxy's API: the CAs it trusts, and its
    own certificate to show."""
    return client_context(certfile=environ.get(CERT_ENV, ""), keyfile=environ.get(KEY_ENV, ""))


def scheme(environ=os.environ) -> str:
    return "https" if serves_tls(environ) else "http"


def reuse_hub_auth_contexts() -> None:
    """One TLS context for all of JupyterHub's HubAuth calls to the hub, not one a call.

    Under internal_ssl HubAuth builds a new ``SSLContext`` for every call to the hub's
    API (``jupyterhub.services.auth.make_ssl_context``, the system's CAs loaded again:
    ~70 ms of CPU on the service's event loop), and aiohttp pools connections by
    context, so none is reused either. When the endpoint router's tokens expire
    together, their lookups stalled every call for seconds (benchmarks/endpoint_overhead.py
    --tls). The same files give the same context: kept by their names.
    """
    from jupyterhub.services import auth

    if not hasattr(auth.make_ssl_context, "cache_info"):
        auth.make_ssl_context = functools.lru_cache(maxsize=8)(auth.make_ssl_context)
