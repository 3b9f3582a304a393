"""Public egress of in-cluster builds (`platform.builds.publicEgress`, docs/builds.md "Network access of
builds"): the one NetworkPolicy rule of the program that names every address.

A build pulls its Dockerfile's base images (docker.io), runs `npm ci` (registry.npmjs.org) and the
CloudState SDK's postinstall, which downloads protoc from GitHub. Those services sit behind CDNs whose
addresses change, and NetworkPolicies name addresses, so without mirrors the only rule that works is
"public addresses": `0.0.0.0/0` and `::/0` on the listed ports, EXCEPT every block that is not public
(private, CGNAT, loopback, link-local with the clouds' metadata endpoints, multicast, tunnels embedding
an IPv4 address) and the blocks the stack itself names (its nodes, the API server, external servers).
It is rendered only into the builds namespace's `build-egress` policy, and only when the stack opts in
with `publicEgress.enabled: true`.

The program (components/network.py `public_egress`), the checks (cloudstation_tools/checks.py
`open_peer_violations`) and the policy pack (policy/rules.py) share these definitions. Standard library
only, so the pack can import it without the program's dependencies.
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

KEY = "cloudstation:platform.builds.publicEgress"
"""The opt-in, as errors name it."""
POLICY = "build-egress"
"""The builds namespace's egress policy (components/builds_namespace.py), the only one that may carry the rule."""
DEFAULT_PLATFORM_NAMESPACE = "cloudstation"
"""`platform.namespace`'s default (infra/config.py PlatformConfig; a test keeps them equal)."""
DEFAULT_PORTS = (443,)
"""`publicEgress.ports`' default: HTTPS only (docker.io, registry.npmjs.org, github.com all answer there)."""

EVERY_IPV4 = "0.0.0.0/0"
EVERY_IPV6 = "::/0"

NON_PUBLIC_IPV4 = (
    "0.0.0.0/8",        # "this network"; Linux treats 0.0.0.0 as the local host
    "10.0.0.0/8",       # RFC 1918: usually the pod and Service networks (kind: 10.244.0.0/16, 10.96.0.0/12)
    "100.64.0.0/10",    # RFC 6598 CGNAT, used for pods and nodes by some clouds and CNIs
    "127.0.0.0/8",      # loopback
    "169.254.0.0/16",   # link-local: the clouds' instance metadata (169.254.169.254) and its credentials
    "172.16.0.0/12",    # RFC 1918: kind's node network 172.18.0.0/16 among others
    "192.0.0.0/24",     # IETF protocol assignments (not globally reachable)
    "192.168.0.0/16",   # RFC 1918
    "198.18.0.0/15",    # benchmarking (RFC 2544), used as internal space by some networks
    "224.0.0.0/3",      # multicast, reserved and broadcast
)
"""IPv4 blocks a build never reaches through the public rule."""

NON_PUBLIC_IPV6 = (
    "::/128",           # unspecified
    "::1/128",          # loopback
    "64:ff9b::/96",     # NAT64 well-known prefix: embeds an IPv4 address, private ones included where NAT64 runs
    "64:ff9b:1::/48",   # NAT64 local-use prefix (RFC 8215)
    "100::/64",         # discard-only
    "2001::/32",        # Teredo: embeds an IPv4 address
    "2002::/16",        # 6to4: embeds an IPv4 address
    "fc00::/7",         # unique local: the usual IPv6 pod and Service networks (kind: fd00:10:244::/56, fd00:10:96::/112)
    "fe80::/10",        # link-local
    "ff00::/8",         # multicast
)
"""IPv6 blocks a build never reaches through the public rule. Not `::ffff:0:0/96` (IPv4-mapped): the API
server refuses it as an `except` of `::/0` (kubernetes/kubernetes pkg/apis/networking/validation/validation.go
`ValidateIPBlock`: Go's IPNet.Contains turns the mapped address into 4 bytes, so it is not "a strict subset
of cidr"), and a pod's connection to a mapped address leaves as IPv4, where the IPv4 list applies."""


def _networks(blocks: Iterable[Any]) -> list:
    return [ipaddress.ip_network(str(b)) for b in blocks]


def excepts(version: int, extra: Iterable[Any] = ()) -> list[str]:
    """The `except` list of the rule's block for IP `version`: the non-public blocks, then each extra
    block of that version not already inside one of them (kept in the order given, duplicates once)."""
    chosen = _networks(NON_PUBLIC_IPV4 if version == 4 else NON_PUBLIC_IPV6)
    for block in _networks(extra):
        if block.version == version and block.prefixlen > 0 and not any(block.subnet_of(c) for c in chosen):
            chosen.append(block)
    return [str(c) for c in chosen]


def peers(extra_excepts: Iterable[Any] = ()) -> list[dict]:
    """The rule's peers: every public IPv4 and IPv6 address (both families: a dual-stack cluster's pods
    reach docker.io and GitHub over either)."""
    extra = list(extra_excepts)
    return [{"ipBlock": {"cidr": EVERY_IPV4, "except": excepts(4, extra)}},
            {"ipBlock": {"cidr": EVERY_IPV6, "except": excepts(6, extra)}}]


def named_cidrs(platform: Any, skip: tuple[str, ...] = ("builds",)) -> list[str]:
    """Every address block a stack's `platform` config (camelCase, as plain data) names under a key
    `cidrs` or `…Cidrs`: the API server, the nodes, external servers and admitted clients, which a
    build has no business reaching. The `builds` settings are skipped (their own destinations)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key in skip:
                    continue
                if (key == "cidrs" or key.endswith("Cidrs")) and isinstance(item, list):
                    found.extend(str(c) for c in item if str(c) not in found)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(platform)
    return found


def rule_problems(rule: Mapping, ports: Sequence[int]) -> list[str]:
    """Why an egress `rule` is not a public-egress rule on `ports`: its peers must be ipBlocks of every
    IPv4 and/or IPv6 address and nothing else, each excepting every non-public block of its family, and
    its ports TCP ports among `ports` (no range)."""
    problems = []
    found = rule.get("to") or []
    for peer in found:
        block = peer.get("ipBlock") if isinstance(peer, Mapping) else None
        if not isinstance(block, Mapping) or set(peer) != {"ipBlock"} or block.get("cidr") not in (EVERY_IPV4, EVERY_IPV6):
            problems.append(f"peer {json.dumps(peer, sort_keys=True)} is not {EVERY_IPV4} or {EVERY_IPV6} "
                            "(the public-egress rule names nothing else)")
            continue
        version = 4 if block["cidr"] == EVERY_IPV4 else 6
        try:
            excepted = _networks(block.get("except") or [])
        except ValueError as error:
            problems.append(f"{block['cidr']}: an except entry is not a CIDR ({error})")
            continue
        required = _networks(NON_PUBLIC_IPV4 if version == 4 else NON_PUBLIC_IPV6)
        missing = [str(r) for r in required
                   if not any(e.version == r.version and r.subnet_of(e) for e in excepted)]
        if missing:
            problems.append(f"{block['cidr']} does not except the non-public blocks {', '.join(missing)}")
    if not found:
        problems.append("no `to` peers")
    entries = rule.get("ports") or []
    if not entries:
        problems.append("no ports (that would be every port)")
    for entry in entries:
        port = entry.get("port") if isinstance(entry, Mapping) else None
        if entry.get("protocol", "TCP") != "TCP" or "endPort" in entry or port not in tuple(ports):
            problems.append(f"port {json.dumps(entry, sort_keys=True)} is not one of {KEY}.ports "
                            f"{list(ports)} (TCP, no range)")
    return problems


@dataclass(frozen=True)
class OptIn:
    """A stack's `publicEgress` opt-in: the builds namespace the rule may appear in, and its ports."""

    namespace: str
    ports: tuple[int, ...]

    def covers(self, namespace: Optional[str], name: Optional[str]) -> bool:
        """Whether the NetworkPolicy `namespace`/`name` is the builds egress policy of this opt-in."""
        return namespace == self.namespace and name == POLICY


def builds_namespace(platform_namespace: str) -> str:
    """`<platform namespace>-build` (infra/config.py PlatformConfig.builds_namespace; a test keeps them equal)."""
    return f"{platform_namespace}-build"


def opt_in(config: Mapping[str, Any], environment: str) -> Optional[OptIn]:
    """The opt-in of a stack's config as the engine passes it to a policy pack (full key -> value, an
    object as JSON text), or None: not enabled, or a prod stack (which never builds)."""
    if environment == "prod":
        return None
    platform = config.get("cloudstation:platform")
    if isinstance(platform, str):
        try:
            platform = json.loads(platform)
        except ValueError:
            return None
    if not isinstance(platform, Mapping):
        return None
    builds = platform.get("builds")
    setting = builds.get("publicEgress") if isinstance(builds, Mapping) else None
    if not isinstance(setting, Mapping) or setting.get("enabled") is not True:
        return None
    ports = setting.get("ports", list(DEFAULT_PORTS))
    if not isinstance(ports, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports):
        return None
    namespace = platform.get("namespace", DEFAULT_PLATFORM_NAMESPACE)
    return OptIn(namespace=builds_namespace(str(namespace)), ports=tuple(ports))
