"""Pure builders of NetworkPolicies: every namespace the program creates denies all traffic
(`default_deny`) and then allows DNS (`allow_dns`); each component adds the flows its own pods
need, on both ends (an egress rule on the client's policy, an ingress rule on the server's).
docs/network-policies.md lists every flow.

Peers are camelCase dicts as they appear in the rendered manifests. An `Endpoint` is what a
client needs to reach a server: the peers that select it (None: any address, for servers outside
the cluster) and its ports.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from components.k8s import metadata

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (immutable), so it can select namespaces by name."""
DNS_PORT = 53
KUBE_DNS = {"k8s-app": "kube-dns"}
"""The label of the cluster DNS pods (kube-dns and CoreDNS deployments alike) in kube-system."""
KUBERNETES_API_PORTS = (443, 6443)
"""The API server's port behind the `kubernetes` Service (443) and on the control-plane nodes (6443)."""
DEFAULT_DENY = "default-deny"
ALLOW_DNS = "allow-dns"
COMPONENT = "network-policy"
SERVICE_HOST = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\.?$")
"""`<service>.<namespace>.svc[.cluster.local]`: a server in another namespace of this cluster."""


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: `peers` select the server (None: any address) and `ports`."""

    ports: tuple[int, ...]
    peers: Optional[tuple[dict, ...]] = None


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


def _rule(peer_key: str, peers: Optional[Sequence[dict]], port_numbers: Sequence[int]) -> dict:
    rule: dict = {} if peers is None else {peer_key: list(peers)}
    rule["ports"] = ports(port_numbers)
    return rule


def ingress(peers: Optional[Sequence[dict]], port_numbers: Sequence[int]) -> dict:
    """An ingress rule; `peers` None admits any source (the port still limits it)."""
    return _rule("from", peers, port_numbers)


def egress(peers: Optional[Sequence[dict]], port_numbers: Sequence[int]) -> dict:
    """An egress rule; `peers` None allows any destination (the port still limits it)."""
    return _rule("to", peers, port_numbers)


def to(endpoint: Endpoint) -> dict:
    """The egress rule of a client of `endpoint`."""
    return egress(endpoint.peers, endpoint.ports)


def same_namespace_ingress(pod_labels: Mapping[str, str], port_numbers: Sequence[int]) -> dict:
    """NetworkPolicy spec: a server's pods accept `port_numbers` from any pod of their namespace
    (its clients there still need egress rules of their own)."""
    return spec({"matchLabels": dict(pod_labels)}, ingress_rules=[ingress([pods()], port_numbers)])


def kubernetes_api() -> dict:
    """Egress to the Kubernetes API server. Its address is cluster-specific (the `kubernetes`
    Service's ClusterIP is translated to the control plane's addresses, which policies see), so
    the rule allows any address on the API server's ports."""
    return egress(None, KUBERNETES_API_PORTS)


def host_endpoint(hosts: str, port: int) -> Endpoint:
    """A server named by host (comma-separated contact points allowed): in-cluster Service names
    `<svc>.<namespace>.svc…` become that namespace's pods; anything else may be any address."""
    namespaces = []
    for host in (h.strip() for h in hosts.split(",")):
        match = SERVICE_HOST.match(host)
        if not match:
            return Endpoint(ports=(port,))
        namespaces.append(match["namespace"])
    return Endpoint(ports=(port,), peers=tuple(namespace_peer(n) for n in sorted(set(namespaces))))


def url_endpoint(url: str, default_port: int) -> Endpoint:
    """`host_endpoint` of a URL such as `pulsar://host:6650` or `http://host:8080/path`."""
    match = re.match(r"^[a-z+]+://(?P<host>[^/:]+)(:(?P<port>[0-9]+))?", url)
    if not match:
        raise ValueError(f"not a URL with a host: {url}")
    return host_endpoint(match["host"], int(match["port"] or default_port))


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
