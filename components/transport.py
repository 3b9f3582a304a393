"""What the components' HTTP clients share (components/registry_api.py, components/armada/queue_api.py
and jobs_api.py, components/kube_tunnel.py): whether a host is this machine, decided by its address.

Standard library only: it runs inside Pulumi's dynamic-provider process too.
"""
from __future__ import annotations

import ipaddress
from typing import Optional


def is_loopback(hostname: Optional[str]) -> bool:
    """Whether `hostname` (a URL's hostname: no port, IPv6 with or without brackets) is this machine:
    `localhost`, or an IP address in a loopback block (127.0.0.0/8, ::1). Decided by the address,
    never by how the name starts: `127.attacker.example` is a DNS name like any other, resolved to
    wherever its owner points it."""
    if not hostname:
        return False
    if hostname.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname.strip("[]")).is_loopback
    except ValueError:
        return False
