"""Where the pods of users' work may connect: the egress rules of their NetworkPolicies.

A job's pods (:func:`.isolation.make_job_network_policy`) may reach DNS, each other
(the rendezvous store, gloo and NCCL: every port) and every IPv4 address but the
blocked ranges (by default only the cloud metadata server, which hands out the
node's cloud credentials on most clouds); sites add their private ranges, as z2jh's
``singleuser.networkPolicy.egressAllowRules`` leaves them out for notebooks. An
endpoint's replicas (:func:`.isolation.make_endpoint_network_policy`) load their
model from their volume and call nothing: DNS only, unless the site names more.

DNS is allowed on port 53 to any address rather than to a ``kube-dns`` pod: the
cluster's DNS may be a pod, a node-local cache (169.254.20.10) or a process on the
node itself, and a blocked private range would otherwise take the cluster's DNS
Service with it. IPv6 destinations are not opened (as z2jh's rules).
"""

from __future__ import annotations

import ipaddress

from ..spec import SpecError

#: Where a job's pods may not connect by default: the cloud metadata server.
METADATA_CIDRS = ("169.254.169.254/32",)
DNS_PORT = 53


def ipv4_networks(cidrs, what: str) -> list[str]:
    """``cidrs`` as normalised IPv4 networks (``"10.0.0.0/8"``); SpecError naming
    ``what`` (the setting) for anything else."""
    if isinstance(cidrs, str):
        raise SpecError(f"{what} is a list of CIDRs, got the string {cidrs!r}")
    out = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except (TypeError, ValueError):
            raise SpecError(f"{what}: {cidr!r} is not a CIDR (e.g. 10.0.0.0/8)") from None
        if net.version != 4:
            raise SpecError(
                f"{what}: {cidr!r} is IPv6; the egress rules open IPv4 destinations only "
                "(IPv6 ones are closed already)"
            )
        out.append(str(net))
    return out


def dns_rule() -> dict:
    """DNS (UDP and TCP 53) to any address."""
    return {
        "ports": [
            {"protocol": "UDP", "port": DNS_PORT},
            {"protocol": "TCP", "port": DNS_PORT},
        ]
    }


def outside_rules(blocked, what: str = "egress_blocked_cidrs") -> list[dict]:
    """Every IPv4 address but ``blocked``: one rule, or none when ``blocked`` holds
    0.0.0.0/0 (NetworkPolicy's ``except`` must lie inside the block, never be it)."""
    nets = ipv4_networks(blocked, what)
    if any(ipaddress.ip_network(n).prefixlen == 0 for n in nets):
        return []
    block: dict = {"cidr": "0.0.0.0/0"}
    if nets:
        block["except"] = nets
    return [{"to": [{"ipBlock": block}]}]


def cidr_rules(allowed, what: str) -> list[dict]:
    """Rules reaching only ``allowed`` (IPv4 CIDRs), any port: none for none."""
    nets = ipv4_networks(allowed, what)
    return [{"to": [{"ipBlock": {"cidr": n}} for n in nets]}] if nets else []
