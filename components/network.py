"""Pure builders of NetworkPolicies: every namespace the program creates denies all traffic
(`default_deny`) and then allows DNS (`allow_dns`); each component adds the flows its own pods
need, on both ends (an egress rule on the client's policy, an ingress rule on the server's).
docs/network-policies.md lists every flow.

No rule is open to every peer: a rule always names its peers (an empty or missing `from`/`to`
means "everyone" in Kubernetes, so `_rule` refuses it), and an address block matching every
address (0.0.0.0/0, ::/0) appears only where a stack sets an opt-in key named for it
(`allowAnyAddress`, `allowAnySource`, and `platform.builds.publicEgress`, whose rule excepts every
non-public block: infra/public_egress.py); nor does a config list of blocks that is open together
(`cidr_list`, infra/address_blocks.py: 0.0.0.0/1 and 128.0.0.0/1 are 0.0.0.0/0). Servers outside the
cluster (the Kubernetes API server, external stores, Redis, Pulsar) are reached at the CIDRs their
config lists.

Peers are camelCase dicts as they appear in the rendered manifests. An `Endpoint` is what a
client needs to reach a server: the peers that select it and its ports.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Mapping, Optional, Sequence

from pydantic import AfterValidator, BeforeValidator, Field, IPvAnyNetwork, model_validator

from components.k8s import metadata
from components.model import ConfigModel, DnsLabel, problem, problems
from infra import address_blocks

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (immutable), so it can select namespaces by name."""
DNS_PORT = 53
KUBE_DNS = {"k8s-app": "kube-dns"}
"""The label of the cluster DNS pods (kube-dns and CoreDNS deployments alike) in kube-system."""
EVERY_ADDRESS = ("0.0.0.0/0", "::/0")
"""The address blocks that match every address; only ever rendered behind an opt-in key."""
KIND_NODE_CIDR = "172.18.0.0/16"
"""The default `kubernetesApi.cidrs`: the IPv4 subnet Docker gives kind's `kind` network when it is
the first network after the default bridge (172.17.0.0/16). kind creates it with IPv4 IPAM left to
Docker (kubernetes-sigs/kind pkg/cluster/internal/providers/docker/network.go, `createNetwork`), so
another Docker network created first moves it (check `docker network inspect kind`)."""
KUBERNETES_API_PORT = 6443
"""The port the API server listens on, on the control-plane nodes (kubeadm and kind default)."""
DEFAULT_DENY = "default-deny"
ALLOW_DNS = "allow-dns"
COMPONENT = "network-policy"
SERVICE_HOST = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\.?\Z")
"""`<service>.<namespace>.svc[.cluster.local]`: a server in another namespace of this cluster. Anchored at
both ends (`\\Z`, not `$`, which also matches before a final newline): `minio.backup.svc.attacker.example.com`
is someone else's host, reached at its CIDRs and never over plain http."""


# --- config: addresses outside the cluster -----------------------------------------------------


def _parse_cidr(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return ipaddress.ip_network(value)  # strict: host bits must be zero
        except ValueError as error:
            raise problem(f"must be a network in CIDR notation with its host bits zero, e.g. 10.0.0.0/16 ({error})")
    return value


def _not_every_address(network: Any) -> Any:
    if network.prefixlen == 0:
        raise problem(
            "matches every address; list the networks you mean, or set allowAnyAddress: true "
            "(allowAnySource: true for sources) beside it to allow any address knowingly"
        )
    return network


Cidr = Annotated[IPvAnyNetwork, BeforeValidator(_parse_cidr), AfterValidator(_not_every_address)]
"""A network in CIDR notation (host bits zero), never one that matches every address."""


def open_problem(networks: Sequence[Any], remedy: str, subpath: str = "") -> Optional[Any]:
    """The config problem of an address list that is open together (infra/address_blocks.py: e.g.
    0.0.0.0/1 and 128.0.0.0/1), naming what is allowed and `remedy`; None when it is not."""
    reason = address_blocks.open_reason(networks)
    if reason is None:
        return None
    return problem(f"{reason}; {address_blocks.ALLOWED}; {remedy}", subpath, [str(n) for n in networks] if subpath else None)


def cidr_list(remedy: str) -> Any:
    """A list of `Cidr`s that together are not open either; `remedy` says what to do instead
    (list the networks meant, or the opt-in beside the key)."""

    def check(networks: list) -> list:
        found = open_problem(networks, remedy)
        if found is not None:
            raise found
        return networks

    return Annotated[list[Cidr], AfterValidator(check)]


LIST_THE_NETWORKS = "list the networks you mean"
Cidrs = cidr_list(f"{LIST_THE_NETWORKS}, or set allowAnyAddress: true beside it to allow any address knowingly")
"""A server's addresses (the opt-in beside them: `allowAnyAddress`)."""
SourceCidrs = cidr_list(f"{LIST_THE_NETWORKS}, or set allowAnySource: true beside it to admit any source knowingly")
"""Clients' addresses (the opt-in beside them: `allowAnySource`)."""

Port = Annotated[int, Field(ge=1, le=65535)]


class KubernetesApi(ConfigModel):
    """Where pods reach the Kubernetes API server (stack key `cloudstation:platform.kubernetesApi`):
    the CloudState operator, the entity pods' proxies (Akka's Kubernetes discovery) and Armada's
    executors and binoculars. Pods dial the `kubernetes` Service (ClusterIP:443), which kube-proxy
    translates to the control-plane nodes' addresses on 6443 before the NetworkPolicy is evaluated
    (docs/network-policies.md), so the policies name those addresses and that port."""

    cidrs: Cidrs = Field(default=[KIND_NODE_CIDR], validate_default=True)
    """The API server's addresses as CIDRs (the endpoints of `kubectl get endpoints kubernetes`).
    The default is kind's node network; set your control plane's addresses on any other cluster."""
    ports: list[Port] = Field(default=[KUBERNETES_API_PORT], min_length=1)
    """The API server's port on those addresses (the endpoints' port, not the Service's 443)."""
    allow_any_address: bool = False
    """Opt-in: let the API clients connect to ANY address on `ports` (for control planes whose
    addresses cannot be listed, e.g. a managed API server behind changing IPs)."""

    @model_validator(mode="after")
    def _addresses(self) -> "KubernetesApi":
        if self.allow_any_address and "cidrs" in self.model_fields_set:
            raise problem("allowAnyAddress: true already allows every address; remove cidrs", ".cidrs",
                          [str(c) for c in self.cidrs])
        if not self.allow_any_address and not self.cidrs:
            raise problem("at least one CIDR of the API server's addresses (or allowAnyAddress: true)", ".cidrs", [])
        return self

    def peers(self) -> list[dict]:
        return any_address() if self.allow_any_address else ip_blocks(self.cidrs)


class Sources(ConfigModel):
    """Who may connect over the network to a user-facing port. Nothing by default: a `kubectl
    port-forward` needs no rule (docs/network-policies.md)."""

    namespaces: list[DnsLabel] = []
    """Namespaces whose pods may connect, e.g. your Ingress controller's."""
    cidrs: SourceCidrs = []
    """Client addresses outside the cluster, e.g. a LoadBalancer's clients (with
    `externalTrafficPolicy: Local`, which keeps their source addresses)."""
    allow_any_source: bool = False
    """Opt-in: admit ANY source, in the cluster or outside it."""

    @model_validator(mode="after")
    def _exclusive(self) -> "Sources":
        if self.allow_any_source and (self.namespaces or self.cidrs):
            raise problem("allowAnySource: true already admits every source; remove namespaces and cidrs",
                          ".allowAnySource", True)
        return self

    def peers(self) -> tuple[dict, ...]:
        """The peers admitted; empty admits none (the caller then writes no rule)."""
        if self.allow_any_source:
            return tuple(any_source())
        return tuple([*(namespace_peer(n) for n in self.namespaces), *ip_blocks(self.cidrs)])


def outside_hosts(hosts: str) -> list[str]:
    """The hosts (comma-separated) that are not in-cluster Service names."""
    return [h for h in (h.strip() for h in hosts.split(",")) if not SERVICE_HOST.match(h)]


def url_host(url: Optional[str]) -> str:
    """The host of `scheme://host[:port]…` ("" when there is none, for validators)."""
    match = re.match(r"^[a-z+]+://(?P<host>[^/:]+)", url or "")
    return match["host"] if match else ""


def server_address_problems(hosts: Sequence[str], cidrs: Sequence[Any], allow_any_address: bool) -> list:
    """For a settings model validator of an external server: a host outside the cluster needs
    its CIDRs (or the named opt-in), since its clients' egress rules name addresses, not hosts.
    A list, so a model reports these with its other problems at once (components/model.py)."""
    outside = [h for host in hosts if host for h in outside_hosts(host)]
    if allow_any_address and cidrs:
        return [problem("allowAnyAddress: true already allows every address; remove cidrs", ".cidrs",
                        [str(c) for c in cidrs])]
    if outside and not cidrs and not allow_any_address:
        return [problem(
            f"required for a server outside the cluster ({', '.join(outside)}): its addresses as CIDRs, "
            "e.g. [10.20.30.0/24]; its clients' NetworkPolicies allow only these "
            "(or set allowAnyAddress: true to allow any address on its port)",
            ".cidrs",
            [],
        )]
    return []


def check_server_addresses(hosts: Sequence[str], cidrs: Sequence[Any], allow_any_address: bool) -> None:
    """`server_address_problems`, raised."""
    found = server_address_problems(hosts, cidrs, allow_any_address)
    if found:
        raise problems(found)


def ip_blocks(cidrs: Sequence[Any]) -> list[dict]:
    return [{"ipBlock": {"cidr": str(ipaddress.ip_network(str(c)))}} for c in cidrs]


def any_address() -> list[dict]:
    """Peers: every address (an opt-in only)."""
    return ip_blocks(EVERY_ADDRESS)


def any_source() -> list[dict]:
    """Peers: every address and every pod of every namespace (an opt-in only; whether ipBlocks
    match pod addresses is implementation-defined, so pods are named separately)."""
    return [*any_address(), {"namespaceSelector": {}}]


# --- rules -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: `peers` select the server (pods, namespaces, address blocks) and `ports`."""

    ports: tuple[int, ...]
    peers: tuple[dict, ...]


def selector(labels: Optional[Mapping[str, str]] = None, expressions: Sequence[dict] = ()) -> dict:
    """A label selector; empty selects every pod."""
    chosen: dict = {}
    if labels:
        chosen["matchLabels"] = dict(labels)
    if expressions:
        chosen["matchExpressions"] = list(expressions)
    return chosen


def label_exists(key: str) -> dict:
    return {"key": key, "operator": "Exists"}


def names_in(names: Sequence[str]) -> dict:
    """Pods whose `app.kubernetes.io/name` is one of `names` (a service and its Jobs' pods)."""
    return {"key": "app.kubernetes.io/name", "operator": "In", "values": sorted(set(names))}


def pods(labels: Optional[Mapping[str, str]] = None, namespace: Optional[str] = None, expressions: Sequence[dict] = ()) -> dict:
    """A peer: pods matching `labels`/`expressions` (all pods when both are empty) in `namespace`
    (None: the policy's own namespace)."""
    peer: dict = {"podSelector": selector(labels, expressions)}
    if namespace is not None:
        peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: namespace}}
    return peer


def namespace_peer(namespace: str) -> dict:
    """A peer: every pod of `namespace`."""
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}}}


def ports(numbers: Sequence[int], protocol: str = "TCP") -> list[dict]:
    return [{"port": number, "protocol": protocol} for number in numbers]


def _rule(peer_key: str, peers: Sequence[dict], port_numbers: Sequence[int]) -> dict:
    # A rule whose `from`/`to` is missing or empty matches every peer (NetworkPolicy API,
    # NetworkPolicyIngressRule.from / NetworkPolicyEgressRule.to), so one is never written.
    if not peers:
        raise ValueError(f"a NetworkPolicy rule needs at least one peer in `{peer_key}` (empty means every peer)")
    if not port_numbers:
        raise ValueError("a NetworkPolicy rule needs its ports (none means every port)")
    return {peer_key: list(peers), "ports": ports(port_numbers)}


def ingress(peers: Sequence[dict], port_numbers: Sequence[int]) -> dict:
    """An ingress rule admitting `peers` (at least one) on `port_numbers`."""
    return _rule("from", peers, port_numbers)


def egress(peers: Sequence[dict], port_numbers: Sequence[int]) -> dict:
    """An egress rule to `peers` (at least one) on `port_numbers`."""
    return _rule("to", peers, port_numbers)


def to(endpoint: Endpoint) -> dict:
    """The egress rule of a client of `endpoint`."""
    return egress(endpoint.peers, endpoint.ports)


def same_namespace_ingress(pod_labels: Mapping[str, str], port_numbers: Sequence[int]) -> dict:
    """NetworkPolicy spec: a server's pods accept `port_numbers` from any pod of their namespace
    (its clients there still need egress rules of their own)."""
    return spec({"matchLabels": dict(pod_labels)}, ingress_rules=[ingress([pods()], port_numbers)])


def scrape_ingress(pod_selector: Mapping[str, Any], port_numbers: Sequence[int], scrapers: Sequence[dict]) -> dict:
    """NetworkPolicy spec: the selected pods accept `scrapers` (Prometheus' pods, in their
    namespace: components/monitoring.py) on their metrics `port_numbers` only. Ingress only: the
    pods' egress stays as their own policies say."""
    for peer in scrapers:
        # Prometheus lives in another namespace: a peer must name it and its pods, never "any".
        if not peer.get("namespaceSelector") or not (peer.get("podSelector") or {}).get("matchLabels"):
            raise ValueError(f"a scrape peer names Prometheus' namespace and pod labels: {peer}")
    return spec(dict(pod_selector), ingress_rules=[ingress(scrapers, port_numbers)])


def kubernetes_api(api: Optional[KubernetesApi]) -> dict:
    """Egress to the Kubernetes API server at the configured addresses and ports
    (`platform.kubernetesApi`). Policies see the control-plane node's address and 6443, not the
    `kubernetes` Service's ClusterIP and 443: kind's kindnet enforces them with
    kube-network-policies, whose nftables chain hooks postrouting at priority srcnat-5, after
    kube-proxy's DNAT (kubernetes-sigs/kube-network-policies pkg/dataplane/controller.go,
    `syncNFTablesRules`); Calico and Cilium likewise match the Service's backend address."""
    if api is None:
        raise ValueError("the Kubernetes API's addresses are required (platform.kubernetesApi)")
    return egress(api.peers(), api.ports)


def host_endpoint(hosts: str, port: int, cidrs: Sequence[Any] = (), allow_any_address: bool = False) -> Endpoint:
    """A server named by host (comma-separated contact points allowed): in-cluster Service names
    `<svc>.<namespace>.svc…` become that namespace's pods; hosts outside the cluster are reached at
    `cidrs` (their config's), or at any address only with the `allow_any_address` opt-in."""
    namespaces = sorted({m["namespace"] for m in (SERVICE_HOST.match(h.strip()) for h in hosts.split(",")) if m})
    peers = [namespace_peer(n) for n in namespaces]
    if allow_any_address:
        peers += any_address()
    elif cidrs:
        peers += ip_blocks(cidrs)
    elif outside_hosts(hosts):
        raise ValueError(f"{hosts} is outside the cluster: its CIDRs (or allowAnyAddress) are required")
    return Endpoint(ports=(port,), peers=tuple(peers))


def url_endpoint(url: str, default_port: int, cidrs: Sequence[Any] = (), allow_any_address: bool = False) -> Endpoint:
    """`host_endpoint` of a URL such as `pulsar://host:6650` or `http://host:8080/path`."""
    match = re.match(r"^[a-z+]+://(?P<host>[^/:]+)(:(?P<port>[0-9]+))?", url)
    if not match:
        raise ValueError(f"not a URL with a host: {url}")
    return host_endpoint(match["host"], int(match["port"] or default_port), cidrs, allow_any_address)


def spec(
    pod_selector: Mapping[str, Any],
    ingress_rules: Optional[Sequence[dict]] = None,
    egress_rules: Optional[Sequence[dict]] = None,
) -> dict:
    """A NetworkPolicy spec selecting pods by `selector` (a label selector). A direction given
    (even empty) is enforced with exactly those rules; a direction left None is not touched."""
    policy: dict = {"podSelector": dict(pod_selector), "policyTypes": []}
    if ingress_rules is not None:
        policy["policyTypes"].append("Ingress")
        policy["ingress"] = list(ingress_rules)
    if egress_rules is not None:
        policy["policyTypes"].append("Egress")
        policy["egress"] = list(egress_rules)
    return policy


def policy(name: str, namespace: Any, component: str, policy_spec: dict) -> dict:
    """A NetworkPolicy's metadata and spec, ready for `k8s.networking.v1.NetworkPolicy(**...)`."""
    return {"metadata": metadata(name, namespace, component), "spec": policy_spec}


def default_deny(namespace: Any) -> dict:
    """Every pod of the namespace: no ingress and no egress unless another policy allows it."""
    return policy(DEFAULT_DENY, namespace, COMPONENT, {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})


def allow_dns(namespace: Any) -> dict:
    """Every pod of the namespace may query the cluster DNS (UDP, and TCP for large answers)."""
    dns = {
        "to": [pods(KUBE_DNS, namespace="kube-system")],
        "ports": [*ports([DNS_PORT], "UDP"), *ports([DNS_PORT], "TCP")],
    }
    return policy(ALLOW_DNS, namespace, COMPONENT, spec({}, egress_rules=[dns]))
