"""Which certificate authorities gpulab's clients trust: the system's, and ``GPULAB_CA_FILE``.

Under ``gpulab up --tls self-signed`` the hub's public URL has a certificate from
gpulab's own CA (``<data-dir>/tls/ca.pem``); servers gpulab starts carry its path in
``GPULAB_CA_FILE``, so the client, the lab's calls and the examples `%deploy` prints
trust it without turning verification off. The platform's own processes list more
than one file there (the hub's internal CAs too), separated by ``os.pathsep``.

Standard library only: the hub, the service and the spawner use it too.
"""

from __future__ import annotations

import os
import ssl

#: The environment variable naming the CA files trusted beside the system's.
CA_FILE_ENV = "GPULAB_CA_FILE"


def ca_files(environ=os.environ) -> list[str]:
    """The files named in ``GPULAB_CA_FILE`` (none when unset)."""
    return [f for f in environ.get(CA_FILE_ENV, "").split(os.pathsep) if f]


def client_context(
    extra_ca_files: list[str] | None = None, certfile: str = "", keyfile: str = ""
) -> ssl.SSLContext:
    """A context that verifies servers against the system's CAs and gpulab's; with
    ``certfile``/``keyfile`` it also shows that certificate (the hub and the proxy's API
    ask the platform's processes for one)."""
    context = ssl.create_default_context()
    for path in [*ca_files(), *(extra_ca_files or [])]:
        try:
            context.load_verify_locations(path)
        except (OSError, ssl.SSLError) as e:
            raise OSError(
                f"{CA_FILE_ENV}: cannot read the CA file {path} ({e}); "
                f"check the path, or unset {CA_FILE_ENV}"
            ) from None
    if certfile:
        context.load_cert_chain(certfile, keyfile or None)
    return context
