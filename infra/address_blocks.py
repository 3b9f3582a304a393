"""When a list of address blocks is open to (nearly) every address (docs/network-policies.md, "Address
lists"): one definition for the stack config (components/network.py `cidr_list`, and infra/config.py for
the registry's lists), the checks of the rendered graph (cloudstation_tools/checks.py
`open_peer_violations`) and the policy pack (policy/rules.py). Standard library only, so the pack can
import it without the program's dependencies.

A list is the CIDRs of one config key, or the ipBlocks of one NetworkPolicy rule. Rejecting only
0.0.0.0/0 let `[0.0.0.0/1, 128.0.0.0/1]` through, which is the same thing in two halves. So, per
address family, after merging the blocks (`ipaddress.collapse_addresses`), a list is open when

- a merged block is wider than /8 for IPv4 or /32 for IPv6 (a union that covers everything
  included), or
- the blocks hold more public addresses (outside the non-public blocks of infra/public_egress.py)
  than one such block: scattered /8s never merge, and still reach a large part of the internet.

/32 for IPv6: the smallest block a regional registry allocates to an ISP, and about what a /8 is to
IPv4, one large organisation's whole space. Any IPv6 node, pod or office network fits in it
(a site gets a /48, a subnet is a /64). IPv6 blocks that carry IPv4 addresses count as the IPv4 blocks
they carry: `::ffff:0:0/96` (IPv4-mapped: Go's net.IPNet, so CNIs written in Go, reads it as
0.0.0.0/0 for an IPv4 destination) and `64:ff9b::/96` (NAT64: a gateway forwards it to IPv4).

The named opt-ins (`allowAnyAddress`, `allowAnySource`, `platform.builds.publicEgress`) are how a stack
opens a flow on purpose; an `except` list only narrows a rule, so it is never checked here.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Iterable, Optional

from infra.public_egress import NON_PUBLIC_IPV4, NON_PUBLIC_IPV6

WIDEST_PREFIX = {4: 8, 6: 32}
"""The widest block a list may hold, per IP version, after merging."""
ALLOWED = ("allowed: per address family, after merging adjacent blocks, none wider than /8 (IPv6: /32) and "
           "together at most a /8's (IPv6: a /32's) worth of public addresses")
"""What is allowed, as errors say it."""
EMBEDDED_IPV4 = ("::ffff:0:0/96", "64:ff9b::/96")
"""IPv6 prefixes whose last 32 bits are an IPv4 address that the flow reaches."""

_NON_PUBLIC = {4: [ipaddress.ip_network(b) for b in NON_PUBLIC_IPV4],
               6: [ipaddress.ip_network(b) for b in NON_PUBLIC_IPV6]}
_EMBEDDED = [ipaddress.ip_network(p) for p in EMBEDDED_IPV4]


def _networks(blocks: Iterable[Any]) -> list:
    """The blocks as networks (host bits ignored: the API server keeps them in an ipBlock);
    text that is not a CIDR is left to the caller's own validation."""
    found = []
    for block in blocks:
        try:
            found.append(ipaddress.ip_network(str(block), strict=False))
        except ValueError:
            continue
    return found


def _embedded_ipv4(block: ipaddress.IPv6Network) -> list:
    """The IPv4 blocks an IPv6 block carries (through EMBEDDED_IPV4)."""
    found = []
    for prefix in _EMBEDDED:
        if prefix.subnet_of(block):
            found.append(ipaddress.IPv4Network("0.0.0.0/0"))
        elif block.subnet_of(prefix):
            low = int(block.network_address) & 0xFFFFFFFF
            found.append(ipaddress.IPv4Network((low, block.prefixlen - 96)))
    return found


def _public_addresses(merged: list, version: int) -> int:
    # Merged blocks are disjoint, and so are the non-public ones; two CIDR blocks either nest or are disjoint.
    total = 0
    for block in merged:
        private = sum(min(block.num_addresses, n.num_addresses) for n in _NON_PUBLIC[version]
                      if n.subnet_of(block) or block.subnet_of(n))
        total += block.num_addresses - private
    return total


def open_reason(blocks: Iterable[Any]) -> Optional[str]:
    """Why `blocks` (CIDR text or ipaddress networks) together are open, or None when they are not."""
    networks = _networks(blocks)
    ipv4 = [n for n in networks if n.version == 4]
    ipv6 = [n for n in networks if n.version == 6]
    embedded = [v4 for n in ipv6 for v4 in _embedded_ipv4(n)]
    # Each family as written first (the clearer reason), then IPv4 with what IPv6 blocks carry.
    for version, members in ((4, ipv4), (6, ipv6), (4, ipv4 + embedded if embedded else [])):
        if not members:
            continue
        merged = list(ipaddress.collapse_addresses(members))
        widest = min(merged, key=lambda n: n.prefixlen)
        limit = WIDEST_PREFIX[version]
        if widest.prefixlen == 0:
            return f"they match every IPv{version} address (merged: {widest})"
        if widest.prefixlen < limit:
            return f"merged, they hold {widest}, wider than /{limit}"
        public = _public_addresses(merged, version)
        if public > 2 ** (widest.max_prefixlen - limit):
            return (f"together they hold {public} public IPv{version} addresses, more than a /{limit} "
                    f"({2 ** (widest.max_prefixlen - limit)})")
    return None
