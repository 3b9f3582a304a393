"""NetworkPolicies, checked by simulating them on the rendered graph.

Both stack files are rendered into one cluster model (they share a cluster: prod pulls from the
test stack's registry, and the test stack's Armada is the cluster's only one), with the pods their
workloads and the CloudState operator create, the cluster DNS and the API server. Prod on a cluster
of its own (tests/stacks/, with its external Pulsar) is a second cluster model. A flow is allowed when the client's
policies allow it as egress and the server's as ingress (Kubernetes semantics: a pod selected
by no policy of a direction is open in that direction; policies add up). Every required flow of
docs/network-policies.md must be allowed, and some that nothing needs must be denied. No rule is
open to every peer unless the stack opts in by a key named for it, the Kubernetes API is reached
only at `platform.kubernetesApi`, and entity pods reach exactly what they need.
"""
from __future__ import annotations

import functools
import ipaddress
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from components import network
from components.project_environment import MANAGEMENT_PORT, PROXY_PORT, REMOTING_PORT, SERVICE_LABEL
from infra import config as stack_config
from cloudstation_tools import render
from cloudstation_tools import checks
from cloudstation_tools.checks import pod_spec, selects
from infra import public_egress
from tests import stacks
from tests.stacks import OWN_CLUSTER, config_of, stack_file, rendered as variant
from tests.conftest import objects

API_SERVER = "172.18.0.2"
"""kind's control-plane node: the `kubernetes` Service's endpoint (port 6443), outside every pod network."""
SERVICE_IP = "10.96.0.1"
"""kind's `kubernetes` Service ClusterIP: policies never see it (kube-proxy's DNAT comes first)."""
USER = "203.0.113.7"
"""A user's machine outside the cluster."""
INTERNET = "198.51.100.1"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job", "CronJob")
INGRESS_CONTROLLER = ("ingress-nginx", "controller")
"""The Ingress controller's pod that docs/armada.md's own-cluster example admits (`userAccess`)."""
USER_FACING = {("armada-server", 50051), ("armada-server", 8080), ("armada-lookout", 10000)}
"""The Armada API and Lookout: closed to the network unless `platform.armada.userAccess` opens them."""


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    labels: dict = field(hash=False)
    ports: dict = field(hash=False, default_factory=dict)
    """Named container ports -> numbers (to resolve named ports in rules)."""


@dataclass(frozen=True)
class Address:
    """Something that is not a pod: the API server, a node, a user."""

    ip: str


@dataclass
class Cluster:
    namespaces: dict[str, dict]
    """name -> labels (with kubernetes.io/metadata.name, as the API server sets it)."""
    pods: list[Pod]
    policies: list[dict]

    def pod(self, namespace: str, name: str) -> Pod:
        found = [p for p in self.pods if p.namespace == namespace and p.name == name]
        assert len(found) == 1, f"expected one pod {namespace}/{name}, found {len(found)}"
        return found[0]

    def egress_allowed(self, source: "Pod", destination, port: int, protocol: str = "TCP") -> bool:
        """The source's own policies alone (the destination's ingress aside)."""
        return self._admits(source, "Egress", destination, port, protocol)

    def allowed(self, source, destination, port: int, protocol: str = "TCP") -> bool:
        egress_ok = not isinstance(source, Pod) or self._admits(source, "Egress", destination, port, protocol)
        ingress_ok = not isinstance(destination, Pod) or self._admits(destination, "Ingress", source, port, protocol, destination)
        return egress_ok and ingress_ok

    def _admits(self, pod: Pod, direction: str, peer, port: int, protocol: str, port_owner: Optional[Pod] = None) -> bool:
        target = peer if direction == "Egress" else pod
        applicable = [p for p in self.policies if self._selects(p, pod) and direction in policy_types(p)]
        if not applicable:
            return True
        key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
        for policy in applicable:
            for rule in policy["spec"].get(key) or []:
                peers = rule.get(peers_key)
                if peers and not any(self._peer_matches(p, policy["metadata"]["namespace"], peer) for p in peers):
                    continue
                if port_matches(rule.get("ports"), port, protocol, target if isinstance(target, Pod) else None):
                    return True
        return False

    def _selects(self, policy: dict, pod: Pod) -> bool:
        return policy["metadata"]["namespace"] == pod.namespace and selects(policy["spec"]["podSelector"], pod.labels)

    def _peer_matches(self, peer: dict, policy_namespace: str, other) -> bool:
        if "ipBlock" in peer:
            # Pod IPs in ipBlocks are implementation-defined; only non-pod addresses count here.
            if isinstance(other, Pod):
                return False
            block = peer["ipBlock"]
            ip = ipaddress.ip_address(other.ip)
            return ip in ipaddress.ip_network(block["cidr"]) and not any(
                ip in ipaddress.ip_network(c) for c in block.get("except", [])
            )
        if not isinstance(other, Pod):
            return False
        if "namespaceSelector" in peer:
            if not selects(peer["namespaceSelector"], self.namespaces.get(other.namespace, {})):
                return False
        elif other.namespace != policy_namespace:
            return False
        return selects(peer.get("podSelector", {}), other.labels)


def policy_types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])


def port_matches(ports: Optional[list], port: int, protocol: str, target: Optional[Pod]) -> bool:
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, str):
            wanted = (target.ports if target else {}).get(wanted)
        if wanted is not None and wanted <= port <= entry.get("endPort", wanted):
            return True
    return False


# --- the cluster model -----------------------------------------------------------------------


def workload_pods(manifests: list[dict]) -> list[Pod]:
    pods = []
    for o in manifests:
        if o["kind"] not in WORKLOAD_KINDS:
            continue
        template = o["spec"]["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else o["spec"]["template"]
        named = {p["name"]: p["containerPort"] for c in pod_spec(o)["containers"] for p in c.get("ports", []) if "name" in p}
        pods.append(Pod(o["metadata"]["namespace"], o["metadata"]["name"], template["metadata"]["labels"], named))
    return pods


def entity_pods(manifests: list[dict]) -> list[Pod]:
    """The pods the CloudState operator makes of each StatefulService (docs/cloudstate.md)."""
    pods = []
    for o in manifests:
        if o["kind"] != "StatefulService":
            continue
        name = o["metadata"]["name"]
        labels = {**o["metadata"].get("labels", {}), SERVICE_LABEL: name, "cloudstate.io/statefulServiceUID": "0", "app": name}
        if o["spec"].get("datastore"):
            labels["cloudstate.io/statefulStore"] = o["spec"]["datastore"]["name"]
        ports = {"grpc-proxy": PROXY_PORT, "metrics": 9090, "user-port": 8080}
        pods.append(Pod(o["metadata"]["namespace"], name, labels, ports))
    return pods


def cluster_of(stacks: dict[str, render.Rendered]) -> Cluster:
    manifests = [o for rendered in stacks.values() for o in rendered.manifests()]
    namespaces = {
        o["metadata"]["name"]: {**o["metadata"].get("labels", {}), network.NAMESPACE_LABEL: o["metadata"]["name"]}
        for o in manifests
        if o["kind"] == "Namespace"
    }
    for name in ("kube-system", "default", "pulsar", INGRESS_CONTROLLER[0]):
        namespaces.setdefault(name, {network.NAMESPACE_LABEL: name})
    pods = workload_pods(manifests) + entity_pods(manifests) + [
        Pod("kube-system", "coredns", {"k8s-app": "kube-dns"}, {"dns": 53}),
        # the external Pulsar of prod on its own cluster (pulsar://pulsar-broker.pulsar.svc.cluster.local:6650)
        Pod("pulsar", "pulsar-broker", {"app": "pulsar"}, {}),
        Pod(*INGRESS_CONTROLLER, {"app.kubernetes.io/name": "ingress-nginx"}, {}),
        Pod("default", "stranger", {"app": "stranger"}, {}),
    ]
    policies = [o for o in manifests if o["kind"] == "NetworkPolicy"]
    return Cluster(namespaces, pods, policies)


@pytest.fixture(scope="module")
def cluster(rendered_stacks) -> Cluster:
    """The stack files' shared cluster."""
    return cluster_of(rendered_stacks)


@functools.lru_cache(maxsize=None)
def own_cluster(name: str) -> Cluster:
    """The cluster of a stack variant alone on it."""
    return cluster_of({name: variant(name)})


@pytest.fixture
def armada_cluster(armada_rendered, rendered_stacks, cluster) -> Cluster:
    """The cluster model `armada_rendered`'s Armada runs in: the shared one, or prod's own."""
    return cluster if armada_rendered is rendered_stacks.get(armada_rendered.stack) else own_cluster(OWN_CLUSTER)


@pytest.fixture(params=["test", "prod", OWN_CLUSTER])
def stack_in_cluster(request, rendered_stacks, cluster) -> tuple[render.Rendered, Cluster]:
    """Each stack file in the shared cluster, and prod on a cluster of its own."""
    if request.param in rendered_stacks:
        return rendered_stacks[request.param], cluster
    return variant(request.param), own_cluster(request.param)


def created_namespaces(rendered) -> list[str]:
    return [o["metadata"]["name"] for o in objects(rendered, "Namespace")]


def entities(cluster: Cluster, namespace: str) -> list[Pod]:
    return [p for p in cluster.pods if p.namespace == namespace and SERVICE_LABEL in p.labels]


def kubernetes_api(rendered) -> network.KubernetesApi:
    """The stack's `platform.kubernetesApi` (its stack file's, or its variant's)."""
    return config_of(rendered).platform.kubernetes_api


def api_addresses(api: network.KubernetesApi) -> list[Address]:
    """One address in each configured CIDR (kind: its control-plane node's)."""
    return [Address(API_SERVER if ipaddress.ip_address(API_SERVER) in c else str(next(iter(c.hosts())))) for c in api.cidrs]


def every_rule(policies: list[dict]):
    """(policy name, direction, rule) of every rule of every policy."""
    for policy in policies:
        for direction, peers_key in (("ingress", "from"), ("egress", "to")):
            for rule in policy["spec"].get(direction) or []:
                yield policy["metadata"]["name"], peers_key, rule


def opens_every_address(peer: dict) -> bool:
    """A peer matching every address (0.0.0.0/0, ::/0) or every pod of every namespace."""
    if "ipBlock" in peer:
        return ipaddress.ip_network(peer["ipBlock"]["cidr"]).prefixlen == 0
    return peer.get("namespaceSelector") == {} and not peer.get("podSelector")


# --- every namespace: default deny, then DNS -------------------------------------------------


def test_every_created_namespace_denies_by_default_and_allows_dns(stack_in_cluster):
    rendered, _ = stack_in_cluster
    policies = objects(rendered, "NetworkPolicy")
    assert created_namespaces(rendered)
    for namespace in created_namespaces(rendered):
        deny = [p for p in policies if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == "default-deny"]
        assert [p["spec"] for p in deny] == [{"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}], namespace


def test_every_pod_resolves_names_and_reaches_nothing_unlisted(stack_in_cluster):
    rendered, cluster = stack_in_cluster
    dns = cluster.pod("kube-system", "coredns")
    namespaces = created_namespaces(rendered)
    pods = [p for p in cluster.pods if p.namespace in namespaces]
    assert pods
    for pod in pods:
        assert cluster.allowed(pod, dns, 53, "UDP") and cluster.allowed(pod, dns, 53, "TCP"), pod.name
        assert not cluster.allowed(pod, dns, 80), pod.name
        assert not cluster.allowed(pod, Address(INTERNET), 80), pod.name
        assert not cluster.allowed(pod, Address(INTERNET), 443), pod.name
        # From a pod of another namespace (and from outside), nothing is open: the stacks admit
        # users only through a port-forward or, on prod's own cluster, the Ingress controller.
        for port in {*pod.ports.values(), PROXY_PORT, 5432, 6379, 6650, 50052}:
            assert not cluster.allowed(cluster.pod("default", "stranger"), pod, port), (pod.name, port)
            assert not cluster.allowed(Address(USER), pod, port), (pod.name, port)


# --- CloudState ------------------------------------------------------------------------------


def project_namespaces(rendered) -> list[str]:
    return [rendered.outputs["projectStateNamespace"], *rendered.outputs["projectNamespaces"].values()]


def store_port(pod: Pod) -> Optional[int]:
    return {"postgres": 5432, "cassandra": 9042}.get(pod.labels.get("cloudstate.io/statefulStore", "").rsplit("-", 1)[-1])


def test_entity_proxies_form_their_cluster_and_reach_the_api_and_their_store(rendered, cluster):
    found = 0
    for namespace in project_namespaces(rendered):
        for pod in entities(cluster, namespace):
            found += 1
            for port in (REMOTING_PORT, MANAGEMENT_PORT):
                assert cluster.allowed(pod, pod, port), (pod.name, port)
            for port in kubernetes_api(rendered).ports:
                assert cluster.allowed(pod, Address(API_SERVER), port), pod.name
            store = pod.labels.get("cloudstate.io/statefulStore")
            if store:
                server = cluster.pod(namespace, store)
                assert cluster.allowed(pod, server, store_port(pod)), pod.name
            # Clients of the entity: the other entities of its namespace (add-item calls the cart).
            for client in entities(cluster, namespace):
                assert cluster.allowed(client, pod, PROXY_PORT), (client.name, pod.name)
    assert found >= 4


def test_an_entity_reaches_no_other_entitys_cluster_ports_nor_the_metrics(rendered, cluster):
    namespace = rendered.outputs["projectNamespaces"]["shop"]
    cart, likes = cluster.pod(namespace, "shop-cart"), cluster.pod(namespace, "shop-likes")
    assert not cluster.allowed(cart, likes, REMOTING_PORT)
    assert not cluster.allowed(cart, likes, MANAGEMENT_PORT)
    assert not cluster.allowed(cart, likes, 9090)
    assert not cluster.allowed(cart, likes, 8080)  # the user container only answers its own proxy


def test_entities_do_not_cross_environments_or_reach_armada(rendered_stacks, cluster):
    test, prod = (rendered_stacks[s].outputs for s in ("test", "prod"))
    shop_test, shop_prod = test["projectNamespaces"]["shop"], prod["projectNamespaces"]["shop"]
    test_cart, prod_cart = cluster.pod(shop_test, "shop-cart"), cluster.pod(shop_prod, "shop-cart")
    assert cluster.allowed(test_cart, cluster.pod(shop_test, "shop-postgres"), 5432)
    assert not cluster.allowed(test_cart, cluster.pod(shop_prod, "shop-postgres"), 5432)
    assert not cluster.allowed(prod_cart, cluster.pod(shop_test, "shop-postgres"), 5432)
    assert not cluster.allowed(test_cart, prod_cart, PROXY_PORT)
    assert not cluster.allowed(test_cart, cluster.pod(test["armadaNamespace"], "armada-postgres"), 5432)
    assert not cluster.allowed(test_cart, cluster.pod(test["armadaNamespace"], "armada-server"), 50051)
    project_state = cluster.pod(test["projectStateNamespace"], "project-state")
    assert not cluster.allowed(test_cart, project_state, PROXY_PORT)
    assert not cluster.allowed(project_state, cluster.pod(shop_test, "shop-postgres"), 5432)


@pytest.mark.parametrize("which", ["shared", OWN_CLUSTER])
def test_store_setup_jobs_reach_their_database(which, cluster):
    cluster = cluster if which == "shared" else own_cluster(which)  # every stack's jobs, in its cluster
    jobs = [p for p in cluster.pods if p.labels.get("app.kubernetes.io/component") == "database-setup"]
    assert jobs
    for job in jobs:
        server_name = job.name.rsplit("-", 1)[0]  # <server>-databases / <server>-auth
        server = cluster.pod(job.namespace, server_name)
        port = 9042 if "cassandra" in server_name else 5432
        assert cluster.allowed(job, server, port), job.name
        assert not cluster.allowed(job, Address(API_SERVER), 443), job.name


def test_the_operator_reaches_only_the_api_server(rendered_stacks, cluster):
    outputs = rendered_stacks["test"].outputs  # the stack that owns the cluster resources
    operator = cluster.pod(outputs["platformNamespace"], "cloudstate-operator")
    cart = cluster.pod(outputs["projectNamespaces"]["shop"], "shop-cart")
    assert cluster.allowed(operator, Address(API_SERVER), 6443)
    # The Service's ClusterIP and port are translated before the policy sees them.
    assert not cluster.allowed(operator, Address(API_SERVER), 443)
    assert not cluster.allowed(operator, Address(SERVICE_IP), 443)
    assert not cluster.allowed(operator, Address(INTERNET), 6443)
    assert not cluster.allowed(operator, cart, PROXY_PORT)
    assert not cluster.allowed(cart, operator, 8080)


# --- registry ----------------------------------------------------------------------------------


def test_registry_admits_the_nodes_and_calls_nothing(rendered_stacks, cluster):
    registry = cluster.pod(rendered_stacks["test"].outputs["platformNamespace"], "registry")
    config = stacks.validate_config("test").platform.registry
    node = str(next(config.node_cidrs[0].hosts()))
    assert cluster.allowed(Address(node), registry, 5000)
    assert not cluster.allowed(Address(USER), registry, 5000)
    assert not cluster.allowed(registry, Address(API_SERVER), 443)
    # No pod pulls (the kubelet does) and pushes come through a port-forward, which enters the
    # pod's network namespace directly and so is not subject to NetworkPolicy.
    for pod in cluster.pods:
        if pod is not registry:
            assert not cluster.allowed(pod, registry, 5000), pod.name


# --- Armada ------------------------------------------------------------------------------------

ARMADA_FLOWS = {
    # client -> [(server, port)]; "postgres"/"redis"/"pulsar"/"pulsar-admin"/"api" are resolved per stack
    "armada-server": ["postgres", "redis", "pulsar", ("armada-scheduler", 50052)],
    "armada-scheduler": ["postgres", "pulsar", ("armada-server", 50051)],
    "armada-scheduler-ingester": ["postgres", "pulsar", "pulsar-admin"],
    "armada-lookout-ingester": ["postgres", "pulsar", "pulsar-admin"],
    "armada-event-ingester": ["redis", "pulsar", "pulsar-admin"],
    "armada-lookout": ["postgres"],
    "armada-lookout-migration": ["postgres"],
    "armada-lookout-pruner": ["postgres"],
    "armada-scheduler-migration": ["postgres"],
    "armada-scheduler-pruner": ["postgres"],
    "armada-postgres-databases": ["postgres"],
}


def armada_target(cluster: Cluster, namespace: str, wanted) -> tuple[object, int]:
    names = {n for n in (p.name for p in cluster.pods if p.namespace == namespace)}
    if wanted == "postgres":
        return cluster.pod(namespace, "armada-postgres"), 5432
    if wanted == "redis":
        return cluster.pod(namespace, "armada-redis"), 6379
    if wanted in ("pulsar", "pulsar-admin"):
        broker = cluster.pod(namespace, "armada-pulsar") if "armada-pulsar" in names else cluster.pod("pulsar", "pulsar-broker")
        return broker, 6650 if wanted == "pulsar" else 8080
    return cluster.pod(namespace, wanted[0]), wanted[1]


def test_armada_services_reach_their_dependencies_and_each_other(armada_rendered, armada_cluster):
    rendered, cluster = armada_rendered, armada_cluster  # each stack that runs an Armada, in its cluster
    namespace = rendered.outputs["armadaNamespace"]
    for client_name, wanted in ARMADA_FLOWS.items():
        client = cluster.pod(namespace, client_name)
        for target in wanted:
            server, port = armada_target(cluster, namespace, target)
            assert cluster.allowed(client, server, port), (client_name, server.name, port)
    executors = [p for p in cluster.pods if p.namespace == namespace and p.name.startswith("armada-executor-")]
    assert executors
    for executor in executors:
        assert cluster.allowed(executor, cluster.pod(namespace, "armada-scheduler"), 50052)
        assert cluster.allowed(executor, Address(API_SERVER), 6443)


def test_armada_flows_nothing_needs_are_denied(armada_rendered, armada_cluster):
    rendered, cluster = armada_rendered, armada_cluster  # each stack that runs an Armada, in its cluster
    namespace = rendered.outputs["armadaNamespace"]
    pod = lambda name: cluster.pod(namespace, name)  # noqa: E731
    pulsar, _ = armada_target(cluster, namespace, "pulsar")
    assert not cluster.allowed(pod("armada-lookout"), pod("armada-redis"), 6379)
    assert not cluster.allowed(pod("armada-lookout"), pulsar, 6650)
    assert not cluster.allowed(pod("armada-scheduler-migration"), pulsar, 6650)
    assert not cluster.allowed(pod("armada-lookout-ingester"), pod("armada-scheduler"), 50052)
    assert not cluster.allowed(pod("armada-server"), Address(API_SERVER), 443)
    assert not cluster.allowed(pod("armada-server"), pod("armada-server"), 9000)
    stranger = cluster.pod("default", "stranger")
    for target, port in [("armada-scheduler", 50052), ("armada-postgres", 5432), ("armada-redis", 6379), ("armada-server", 9000)]:
        assert not cluster.allowed(stranger, pod(target), port), target
    for project in project_namespaces(rendered):
        for entity in entities(cluster, project):
            assert not cluster.allowed(entity, pod("armada-postgres"), 5432)


def test_users_reach_the_armada_api_and_lookout_only_through_configured_sources(armada_rendered, armada_cluster):
    """`platform.armada.userAccess` admits sources to the user-facing ports; nothing else does (a
    port-forward needs no rule). docs/armada.md's own-cluster example admits its Ingress controller."""
    rendered, cluster = armada_rendered, armada_cluster  # each stack that runs an Armada, in its cluster
    namespace = rendered.outputs["armadaNamespace"]
    access = config_of(rendered).platform.armada.user_access
    controller = cluster.pod(*INGRESS_CONTROLLER)
    for name, port in USER_FACING:
        server = cluster.pod(namespace, name)
        assert cluster.allowed(controller, server, port) == (INGRESS_CONTROLLER[0] in access.namespaces), (name, port)
        assert not cluster.allowed(Address(USER), server, port), (name, port)
        assert not cluster.allowed(cluster.pod("default", "stranger"), server, port), (name, port)
    # The scheduler still calls the server's gRPC API.
    assert cluster.allowed(cluster.pod(namespace, "armada-scheduler"), cluster.pod(namespace, "armada-server"), 50051)
    # The positive case is exercised: docs/armada.md's example admits the Ingress controller.
    assert access.namespaces == ([INGRESS_CONTROLLER[0]] if rendered is variant(OWN_CLUSTER) else [])


def test_job_namespaces_are_closed_until_users_open_them(armada_rendered, armada_cluster):
    rendered, cluster = armada_rendered, armada_cluster  # each stack that runs an Armada, in its cluster
    config = config_of(rendered).platform.armada
    job = Pod(config.job_namespaces[0], "job", {"armada_job_id": "1"})
    cluster = Cluster(cluster.namespaces, [*cluster.pods, job], cluster.policies)
    dns = cluster.pod("kube-system", "coredns")
    assert cluster.allowed(job, dns, 53, "UDP")
    assert not cluster.allowed(job, Address(API_SERVER), 443)
    assert not cluster.allowed(job, cluster.pod(config.namespace, "armada-server"), 50051)
    assert not cluster.allowed(cluster.pod(config.namespace, "armada-executor-" + config.executors[0].name), job, 8080)


# --- the builders ------------------------------------------------------------------------------


def test_hosts_in_the_cluster_become_their_namespace_and_others_their_cidrs():
    assert network.url_endpoint("pulsar://pulsar-broker.pulsar.svc.cluster.local:6650", 1) == network.Endpoint(
        ports=(6650,), peers=({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pulsar"}}},)
    )
    assert network.url_endpoint("http://admin.pulsar.svc", 8080).ports == (8080,)
    assert network.host_endpoint("db.example.com", 5432, ["10.1.2.0/24"]) == network.Endpoint(
        ports=(5432,), peers=({"ipBlock": {"cidr": "10.1.2.0/24"}},)
    )
    assert network.host_endpoint("a.x.svc,b.y.svc", 9042).peers == (network.namespace_peer("x"), network.namespace_peer("y"))
    assert network.host_endpoint("a.x.svc,10.0.0.5", 9042, ["10.0.0.5/32"]).peers == (
        network.namespace_peer("x"), {"ipBlock": {"cidr": "10.0.0.5/32"}},
    )
    # Any address only by the named opt-in; a host outside the cluster without CIDRs is an error.
    assert network.host_endpoint("db.example.com", 5432, allow_any_address=True).peers == tuple(network.any_address())
    with pytest.raises(ValueError, match="outside the cluster"):
        network.host_endpoint("a.x.svc,10.0.0.5", 9042)
    with pytest.raises(ValueError, match="not a URL"):
        network.url_endpoint("pulsar-broker:6650", 6650)


OUTSIDE_LOOKING_IN = ["minio.backup.svc.attacker.example.com", "pg.db.svc.cluster.local.attacker.example",
                      "minio.backup.svc\n", "minio.backup.svc.cluster.local\n"]
"""Hosts that merely contain `<svc>.<namespace>.svc`: names in someone else's DNS zone (or not names at all)."""


@pytest.mark.parametrize("host", OUTSIDE_LOOKING_IN[:2])
def test_a_host_that_merely_contains_svc_is_outside_the_cluster(host):
    """Only a whole `<service>.<namespace>.svc[.cluster.local][.]` is in the cluster (issue 20 finding 11):
    a longer name is resolved outside it, so it needs CIDRs, and the backups may not reach it over plain
    http (docs/backups.md)."""
    assert network.outside_hosts(host) == [host]
    with pytest.raises(ValueError, match="outside the cluster"):
        network.host_endpoint(host, 9000)
    backups = {"target": "s3", "s3": {"endpoint": f"http://{host}:9000", "bucket": "backups",
                                      "credentialsSecret": {"namespace": "ops", "name": "s3"}}}
    stack_file = stacks.edited("test", platform=lambda p: {**p, "stores": {**p.get("stores", {}), "backups": backups}})
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(stack_file.values)
    assert "cloudstation:platform.stores.backups.s3" in str(error.value), str(error.value)


def test_the_service_host_pattern_matches_whole_names_only():
    assert network.SERVICE_HOST.match("minio.backup.svc")["namespace"] == "backup"
    assert network.SERVICE_HOST.match("minio.backup.svc.cluster.local.")["namespace"] == "backup"
    # `$` would also match before a final newline; the pattern ends at the end of the text.
    assert [h for h in OUTSIDE_LOOKING_IN if network.SERVICE_HOST.match(h)] == []


def test_no_rule_without_peers_or_ports():
    """An empty or missing `from`/`to` (or `ports`) means every peer (or port): never written."""
    for build in (network.ingress, network.egress):
        with pytest.raises(ValueError, match="at least one peer"):
            build([], [80])
        with pytest.raises(ValueError, match="at least one peer"):
            build(None, [80])
        with pytest.raises(ValueError, match="ports"):
            build([network.pods()], [])


def test_policy_directions_are_enforced_only_when_given():
    only_egress = network.spec({}, egress_rules=[])
    assert only_egress == {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}
    peer = network.pods({"app": "a"})
    both = network.spec({"matchLabels": {"a": "b"}}, ingress_rules=[network.ingress([peer], [80])], egress_rules=[])
    assert both["policyTypes"] == ["Ingress", "Egress"] and both["ingress"] == [{"from": [peer], "ports": [{"port": 80, "protocol": "TCP"}]}]
    dns = network.allow_dns("ns")["spec"]["egress"][0]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}


def test_the_simulator_denies_what_no_rule_allows():
    """The model itself: a selected pod is closed, an unselected one open, rules add up."""
    a = Pod("n", "a", {"app": "a"}, {"http": 8080})
    b = Pod("n", "b", {"app": "b"}, {"http": 8080})
    deny = {"metadata": {"namespace": "n"}, **network.default_deny("n")}
    allow = {"metadata": {"namespace": "n"}, "spec": network.spec(
        {"matchLabels": {"app": "b"}}, ingress_rules=[{"from": [network.pods({"app": "a"})], "ports": [{"port": "http"}]}])}
    open_cluster = Cluster({"n": {}}, [a, b], [])
    assert open_cluster.allowed(a, b, 8080)
    closed = Cluster({"n": {}}, [a, b], [deny, allow])
    assert not closed.allowed(a, b, 8080)  # a's egress is denied
    egress = {"metadata": {"namespace": "n"}, "spec": network.spec(
        {"matchLabels": {"app": "a"}}, egress_rules=[network.egress([network.pods({"app": "b"})], [8080])])}
    opened = Cluster({"n": {}}, [a, b], [deny, allow, egress])
    assert opened.allowed(a, b, 8080) and not opened.allowed(b, a, 8080) and not opened.allowed(a, b, 8081)


def test_cassandra_and_external_stores_on_variants():
    """A managed Cassandra (nodes gossip, the auth Job logs in, entities journal) and external
    servers (their configured CIDRs only, on their own port only)."""
    non_owner = stacks.rendered("non-owner")  # shop on a managed Cassandra, project-state on external PostgreSQL
    cluster = cluster_of({"test": non_owner})
    shop, platform = non_owner.outputs["projectNamespaces"]["shop"], non_owner.outputs["projectStateNamespace"]
    node = cluster.pod(shop, "shop-cassandra")
    assert cluster.allowed(node, node, node.ports["intra-node"])
    assert cluster.allowed(cluster.pod(shop, "shop-cassandra-auth"), node, 9042)
    assert cluster.allowed(cluster.pod(shop, "shop-cart"), node, 9042)
    assert not cluster.allowed(cluster.pod(shop, "shop-cart"), node, 7000)
    assert not cluster.allowed(cluster.pod("default", "stranger"), node, 9042)
    external_postgres = Address("10.20.30.40")  # cidrs: [10.20.30.40/32]
    for client in (cluster.pod(platform, "project-state"), cluster.pod(platform, "project-state-postgres-databases")):
        assert cluster.allowed(client, external_postgres, 6432), client.name
        assert not cluster.allowed(client, external_postgres, 5432), client.name
        assert not cluster.allowed(client, Address("10.20.30.41"), 6432), client.name
        assert not cluster.allowed(client, Address(INTERNET), 6432), client.name

    external = stacks.rendered("owner-external-cassandra")  # cidrs: [10.20.30.0/24, fd00:20:30::/64]
    cluster = cluster_of({"prod": external})
    cart = cluster.pod(external.outputs["projectNamespaces"]["shop"], "shop-cart")
    assert cluster.allowed(cart, Address("10.20.30.41"), 9042)
    assert cluster.allowed(cart, Address("fd00:20:30::7"), 9042)
    assert not cluster.allowed(cart, Address("10.20.30.41"), 7000)
    assert not cluster.allowed(cart, Address("10.20.31.1"), 9042)


def test_armada_egress_follows_each_services_config():
    """The services' egress is read from their config keys and reaches each dependency at its
    endpoint only; binoculars only calls the API server. A dependency without an endpoint is an
    error, never any address."""
    from dataclasses import replace

    from components.armada.workload import service_network_policy
    from tests.test_armada_config import args, specs

    def at(port: int) -> network.Endpoint:
        return network.Endpoint(ports=(port,), peers=(network.pods({"app": str(port)}),))

    endpoints = replace(
        args().endpoints, postgres_endpoint=at(5432), redis_endpoint=at(6379), pulsar_endpoint=at(6650),
        pulsar_admin_endpoint=at(8080), kubernetes_api=network.KubernetesApi(),
    )
    policies = {name: service_network_policy(spec, endpoints)["spec"] for name, spec in specs().items()}
    egress = {name: sorted(p["port"] for rule in spec["egress"] for p in rule["ports"]) for name, spec in policies.items()}
    assert egress["binoculars"] == [network.KUBERNETES_API_PORT]
    assert egress["server"] == [5432, 6379, 6650, 50052]
    assert egress["lookout"] == [5432]
    assert egress["eventingester"] == [6379, 6650, 8080]
    assert policies["binoculars"]["egress"] == [network.kubernetes_api(network.KubernetesApi())]
    # userAccess admits nobody by default: binoculars' user-facing ports get no rule.
    assert policies["binoculars"]["ingress"] == []
    with pytest.raises(ValueError, match="no network endpoint"):
        service_network_policy(specs()["server"], replace(endpoints, redis_endpoint=None))
    with pytest.raises(ValueError, match="platform.kubernetesApi"):
        service_network_policy(specs()["binoculars"], replace(endpoints, kubernetes_api=None))


# --- no rule open to every peer; the Kubernetes API; entity pods' exact egress ---------------------


def all_renders(rendered_stacks) -> dict[str, render.Rendered]:
    """Both stack files, prod on its own cluster, and the CloudState variants (external stores)."""
    return {
        **rendered_stacks,
        OWN_CLUSTER: variant(OWN_CLUSTER),
        **{name: stacks.rendered(name) for name in ("non-owner", "owner-external-cassandra")},
    }


def stack_values(name: str) -> dict[str, str]:
    """The config (as the engine passes it) a render of `all_renders` was made from: a stack file's,
    or for a CloudState variant the stack file it edits (which keeps its `builds` settings)."""
    base = {"non-owner": "test", "owner-external-cassandra": "prod"}.get(name, name)
    return stack_file(OWN_CLUSTER).values if base == OWN_CLUSTER else stacks.read(base).values


def public_egress_opt_in(name: str, rendered) -> Optional[public_egress.OptIn]:
    values = stack_values(name)
    return public_egress.opt_in(values, values.get("cloudstation:environment", rendered.stack))


def test_no_rule_is_open_to_every_peer(rendered_stacks):
    """Every rule of every policy names its peers and ports; none matches every address
    (0.0.0.0/0, ::/0) or every pod of every namespace, except the one rule a stack opts in to by name:
    the builds' public egress (`platform.builds.publicEgress`, infra/public_egress.py), in its builds
    namespace's `build-egress` policy only and exactly as defined there. The checks the policy pack runs
    agree, and refuse that rule anywhere else or without the opt-in."""
    checked, opened = 0, {}
    for name, rendered in all_renders(rendered_stacks).items():
        opt_in = public_egress_opt_in(name, rendered)
        for policy in objects(rendered, "NetworkPolicy"):
            meta = policy["metadata"]
            ours = opt_in is not None and opt_in.covers(meta["namespace"], meta["name"])
            for direction, peers_key in (("ingress", "from"), ("egress", "to")):
                for rule in policy["spec"].get(direction) or []:
                    checked += 1
                    where = (name, meta["namespace"], meta["name"], rule)
                    assert rule.get(peers_key), where
                    assert rule.get("ports"), where
                    assert all(p.get("port") is not None for p in rule["ports"]), where
                    if any(opens_every_address(peer) for peer in rule[peers_key]):
                        assert ours and direction == "egress", where
                        assert public_egress.rule_problems(rule, opt_in.ports) == [], where
                        opened.setdefault(name, []).append((meta["namespace"], meta["name"]))
            ports = opt_in.ports if ours else None
            assert checks.open_peer_violations(meta["name"], policy["spec"], False, ports) == [], (name, meta)
            if ours:
                # Without the opt-in the same policy is refused.
                assert checks.open_peer_violations(meta["name"], policy["spec"]) != [], (name, meta)
    assert checked > 50
    # The test stack file opts in and builds in the cluster: exactly its builds namespace's policy opens.
    test_opt_in = public_egress_opt_in("test", rendered_stacks["test"])
    assert test_opt_in is not None
    assert opened == {"test": [(test_opt_in.namespace, public_egress.POLICY)]}


@functools.lru_cache(maxsize=None)
def custom_api_render() -> render.Rendered:
    """The test stack with a control plane of its own addresses and port, and Armada's user-facing
    ports opened to any source by the named opt-in."""
    stack_file = stacks.edited(
        "test",
        platform=lambda platform: {
            **platform,
            "kubernetesApi": {"cidrs": ["10.0.0.10/32", "fd00:10::/120"], "ports": [443]},
            "armada": {**platform.get("armada", {}), "userAccess": {"allowAnySource": True}},
        },
    )
    return stacks.render("test", stack_file=stack_file)


def api_clients(cluster: Cluster, namespaces: list[str]) -> list[Pod]:
    """The pods that call the API: the operator, the entity pods (their proxies' Akka discovery),
    Armada's executors and binoculars."""
    return [
        p for p in cluster.pods if p.namespace in namespaces and (
            p.name in ("cloudstate-operator", "armada-binoculars") or p.name.startswith("armada-executor-")
            or SERVICE_LABEL in p.labels
        )
    ]


@pytest.mark.parametrize("which", ["test", "prod", OWN_CLUSTER, "custom-api"])
def test_api_egress_only_to_the_configured_cidrs_and_ports(which, rendered_stacks, cluster):
    if which == "custom-api":
        rendered = custom_api_render()
        cluster = cluster_of({"test": rendered})
        api = network.KubernetesApi(cidrs=["10.0.0.10/32", "fd00:10::/120"], ports=[443])
    elif which == OWN_CLUSTER:
        rendered, cluster = variant(OWN_CLUSTER), own_cluster(OWN_CLUSTER)
        api = kubernetes_api(rendered)
    else:
        rendered = rendered_stacks[which]
        api = kubernetes_api(rendered)
    namespaces = created_namespaces(rendered)
    clients = api_clients(cluster, namespaces)
    assert {p.name for p in clients} >= {"cloudstate-operator", "shop-cart"} or which == "prod"
    assert clients
    inside = api_addresses(api)
    for pod in (p for p in cluster.pods if p.namespace in namespaces):
        for address in inside:
            for port in api.ports:
                assert cluster.allowed(pod, address, port) == (pod in clients), (pod.name, address, port)
            for port in {443, 6443, 1 + max(api.ports)} - set(api.ports):
                assert not cluster.allowed(pod, address, port), (pod.name, address, port)
        for address in (SERVICE_IP, INTERNET, API_SERVER if which == "custom-api" else "192.0.2.1"):
            for port in (443, 6443):
                assert not cluster.allowed(pod, Address(address), port), (pod.name, address, port)
    # The only address blocks in any egress rule are the API's (these stacks name no external server),
    # besides the builds' public-egress rule where the stack opts in (test_build_egress.py checks it).
    opt_in = public_egress_opt_in("test" if which == "custom-api" else which, rendered)
    blocks = {peer["ipBlock"]["cidr"] for policy in objects(rendered, "NetworkPolicy")
              for rule in policy["spec"].get("egress") or []
              if not (opt_in and opt_in.covers(policy["metadata"]["namespace"], policy["metadata"]["name"])
                      and public_egress.rule_problems(rule, opt_in.ports) == [])
              for peer in rule["to"] if "ipBlock" in peer}
    assert blocks == {str(c) for c in api.cidrs}


def test_any_source_or_address_only_where_the_stack_opts_in():
    """`userAccess.allowAnySource` opens exactly the user-facing ports; `allowAnyAddress` renders
    0.0.0.0/0 and ::/0 for the API rule only."""
    rendered = custom_api_render()
    opened = {(policy, rule["ports"][0]["port"]) for policy, key, rule in every_rule(objects(rendered, "NetworkPolicy"))
              if any(opens_every_address(peer) for peer in rule[key])}
    # Besides the test stack file's own opt-in: the builds' public egress on its ports.
    builds = public_egress_opt_in("test", rendered)
    assert opened == USER_FACING | {(public_egress.POLICY, port) for port in builds.ports[:1]}
    cluster = cluster_of({"test": rendered})
    for name, port in USER_FACING:
        assert cluster.allowed(Address(USER), cluster.pod(rendered.outputs["armadaNamespace"], name), port)
    assert network.kubernetes_api(network.KubernetesApi(allowAnyAddress=True)) == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
        "ports": [{"port": 6443, "protocol": "TCP"}],
    }


# Every port any rendered policy names, plus the usual suspects: the candidates an entity pod's
# egress is checked against.
PROBE_PORTS = {53, 80, 443, 2552, 5432, 6379, 6443, 6650, 7000, 8013, 8080, 8558, 9042, 9090, 10000, 50051, 50052}


def test_entity_pods_egress_is_exactly_dns_store_api_own_cluster_and_entity_proxies(rendered_stacks, cluster):
    """NetworkPolicy selects pods, not containers: the user container gets its proxy's egress.
    So the entity pod's egress is exactly what the proxy needs (DNS, its store, the API at the
    configured CIDRs, its own entity's pods on the Akka ports) plus the entity proxies of its
    namespace, which the user code calls (add-item calls the cart's Service)."""
    policies = [o for r in rendered_stacks.values() for o in objects(r, "NetworkPolicy")]
    ports = PROBE_PORTS | {p["port"] for _, _, rule in every_rule(policies) for p in rule["ports"]}
    checked = 0
    for name, rendered in rendered_stacks.items():
        api = kubernetes_api(rendered)
        addresses = [*api_addresses(api), Address(SERVICE_IP), Address(INTERNET), Address(USER)]
        for namespace in project_namespaces(rendered):
            for pod in entities(cluster, namespace):
                checked += 1
                allowed = {
                    (target, port, protocol)
                    for target in [*cluster.pods, *addresses]
                    for port in ports
                    for protocol in (("TCP", "UDP") if port == 53 else ("TCP",))
                    if cluster.egress_allowed(pod, target, port, protocol)
                }
                dns = cluster.pod("kube-system", "coredns")
                expected = {(dns, 53, "TCP"), (dns, 53, "UDP")}
                expected |= {(a, port, "TCP") for a in api_addresses(api) for port in api.ports}
                same = [p for p in entities(cluster, namespace) if p.labels[SERVICE_LABEL] == pod.labels[SERVICE_LABEL]]
                expected |= {(p, port, "TCP") for p in same for port in (REMOTING_PORT, MANAGEMENT_PORT)}
                expected |= {(p, PROXY_PORT, "TCP") for p in entities(cluster, namespace)}
                store = pod.labels.get("cloudstate.io/statefulStore")
                if store:
                    expected.add((cluster.pod(namespace, store), store_port(pod), "TCP"))
                assert allowed == expected, (name, pod.name, allowed ^ expected)
    assert checked >= 4


@pytest.mark.parametrize(
    "platform, message",
    [
        ({"kubernetesApi": {"cidrs": ["172.18.0.300/16"]}},
         "cloudstation:platform.kubernetesApi.cidrs[0]: '172.18.0.300/16' — must be a network in CIDR notation"),
        ({"kubernetesApi": {"cidrs": ["172.18.0.2/16"]}},
         "cloudstation:platform.kubernetesApi.cidrs[0]: '172.18.0.2/16' — must be a network in CIDR notation with its host bits zero"),
        ({"kubernetesApi": {"cidrs": ["0.0.0.0/0"]}},
         "cloudstation:platform.kubernetesApi.cidrs[0]: '0.0.0.0/0' — matches every address; list the networks you mean, or set allowAnyAddress: true"),
        ({"kubernetesApi": {"cidrs": []}},
         "cloudstation:platform.kubernetesApi.cidrs: [] — at least one CIDR"),
        ({"kubernetesApi": {"ports": [0]}}, "cloudstation:platform.kubernetesApi.ports[0]: 0 — "),
        ({"kubernetesApi": {"allowAnyAddress": True, "cidrs": ["10.0.0.0/8"]}},
         "cloudstation:platform.kubernetesApi.cidrs: [\"10.0.0.0/8\"] — allowAnyAddress: true already allows every address"),
        ({"stores": {"postgres": {"mode": "external", "host": "db.example.com",
                                  "credentialsSecret": {"namespace": "ops", "name": "pg"}}}},
         "cloudstation:platform.stores.postgres.cidrs: [] — required for a server outside the cluster (db.example.com)"),
        ({"stores": {"cassandra": {"mode": "external", "host": "a.db.svc,10.0.0.9",
                                   "credentialsSecret": {"namespace": "ops", "name": "c"}}}},
         "cloudstation:platform.stores.cassandra.cidrs: [] — required for a server outside the cluster (10.0.0.9)"),
        ({"stores": {"postgres": {"mode": "external", "host": "db.example.com", "cidrs": ["::/0"],
                                  "credentialsSecret": {"namespace": "ops", "name": "pg"}}}},
         "cloudstation:platform.stores.postgres.cidrs[0]: '::/0' — matches every address"),
        ({"armada": {"redis": {"mode": "external", "host": "redis.example.com", "existingSecret": "redis"}}},
         "cloudstation:platform.armada.redis.cidrs: [] — required for a server outside the cluster (redis.example.com)"),
        ({"armada": {"pulsar": {"mode": "external", "url": "pulsar://pulsar.example.com:6650",
                                "adminUrl": "http://pulsar.example.com:8080"}}},
         "cloudstation:platform.armada.pulsar.cidrs: [] — required for a server outside the cluster (pulsar.example.com, pulsar.example.com)"),
        ({"armada": {"userAccess": {"cidrs": ["0.0.0.0/0"]}}},
         "cloudstation:platform.armada.userAccess.cidrs[0]: '0.0.0.0/0' — matches every address"),
        ({"armada": {"userAccess": {"allowAnySource": True, "namespaces": ["ingress-nginx"]}}},
         "cloudstation:platform.armada.userAccess.allowAnySource: true — allowAnySource: true already admits every source"),
    ],
    ids=lambda value: "" if isinstance(value, str) else next(iter(value)),
)
def test_bad_addresses_are_clear_errors_naming_the_key(platform, message):
    stack_file = stacks.edited(
        "test",
        platform=lambda old: {
            **old, **platform,
            "armada": {**old.get("armada", {}), **platform.get("armada", {})},
            "stores": {**old.get("stores", {}), **platform.get("stores", {})},
        },
    )
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(stack_file.values)
    assert message in str(error.value), str(error.value)
    assert len(error.value.problems) == 1, error.value.problems


def test_the_config_examples_of_the_network_policies_page_validate():
    """docs/network-policies.md's `cloudstation:platform` examples, merged into the test stack file,
    validate and say what the page says they do."""
    import re

    import yaml

    page = (Path(__file__).resolve().parent.parent / "docs" / "network-policies.md").read_text(encoding="utf-8")
    blocks = [textwrap.dedent(b) for b in re.findall(r"^ *```yaml\n(.*?)^ *```", page, flags=re.S | re.M)]
    examples = [yaml.safe_load(b)["cloudstation:platform"] for b in blocks if b.startswith("cloudstation:platform:")]
    assert len(examples) >= 2
    for example in examples:
        stack_file = stacks.edited(
            "test",
            platform=lambda old, example=example: {
                **old, **example, "armada": {**old.get("armada", {}), **example.get("armada", {})},
            },
        )
        platform = stack_config.load(stack_file.values).platform
        if "kubernetesApi" in example:
            assert platform.kubernetes_api == network.KubernetesApi(), "the page shows the default"
        if "armada" in example:
            peers = platform.armada.user_access.peers()
            assert network.namespace_peer("ingress-nginx") in peers and {"ipBlock": {"cidr": "203.0.113.0/24"}} in peers
