"""More addresses the service listens on besides its URL's: ``extra_listen_ips``.

The hub gives the service one URL (``JUPYTERHUB_SERVICE_URL``, ``127.0.0.1:<port>``
under ``gpulab up``). Servers that cannot reach this machine's loopback need another
address of it on the same port: the Slurm sandbox's nodes are network namespaces
whose loopback is their own, and reach this machine at the bridge's address
(``gpulab slurm-sandbox up --spawner`` writes it in ``c.GpuLabService.extra_listen_ips``,
:func:`gpulab.spawner.slurm.sandbox_settings`).

Nothing is trusted more there: every route still needs a hub token (the service's
HubAuth, at the same prefix), and a peer on such an address is never the
platform's own caller (its ``X-Forwarded-For`` counts only from loopback sockets of
the platform's own account, :mod:`gpulab.enforcement.peer_account`; a node's socket
is in another network namespace, so it is not one of this machine's, and its
address is not in ``c.AuditTrail.audit_trusted_proxies`` unless an admin puts it
there).
"""

from __future__ import annotations

import ipaddress
import logging

log = logging.getLogger(__name__)

#: The help of ``c.GpuLabService.extra_listen_ips``.
HELP = """More IP addresses of this machine the service listens on, with the port of
its own URL (the hub's services entry). For servers that cannot reach that URL's
address: the Slurm sandbox's nodes reach this machine at the bridge's address
(`gpulab slurm-sandbox up --spawner` sets it). Every route still needs a hub
token there. Not a wildcard (0.0.0.0, ::): name each address. An address this
machine does not have (the sandbox is down) is skipped with a warning.

c.GpuLabService.extra_listen_ips = ["10.77.0.1"]
"""


def check_addresses(values) -> list[str]:
    """The addresses as written, once each; ValueError naming the first that is not
    an IP address of one interface."""
    out: list[str] = []
    for value in values:
        try:
            ip = ipaddress.ip_address(str(value).strip("[]"))
        except ValueError:
            raise ValueError(
                f"c.GpuLabService.extra_listen_ips: {value!r} is not an IP address "
                f"(write it like 10.77.0.1)"
            ) from None
        if ip.is_unspecified:
            raise ValueError(
                f"c.GpuLabService.extra_listen_ips: {value!r} is every address of this "
                f"machine; name the one the servers reach it at (the bridge's)"
            )
        if str(ip) not in out:
            out.append(str(ip))
    return out


def extra_addresses(ips: list[str], main_host: str | None = None) -> list[str]:
    """``ips`` (c.GpuLabService.extra_listen_ips), checked, without the URL's own address."""
    addresses = check_addresses(ips)
    return [a for a in addresses if a != main_host]


def listen_extra(server, port: int, ips: list[str], main_host: str | None = None) -> list[str]:
    """``server.listen(port, ip)`` on each extra address; those this machine does not
    have now (the sandbox's bridge is down) are skipped with a warning, since the
    service's own URL must not fail with them. Returns the addresses listened on."""
    done = []
    for ip in extra_addresses(ips, main_host):
        try:
            server.listen(port, ip)
        except OSError as e:
            log.warning(
                "Not listening on %s:%d too (c.GpuLabService.extra_listen_ips): %s", ip, port, e
            )
            continue
        done.append(ip)
        log.info("gpulab service also on %s:%d (c.GpuLabService.extra_listen_ips)", ip, port)
    return done
