"""The entity pods' NetworkPolicies: one policy per namespace holds what every entity pod shares (the
entity proxies' port among them, the Kubernetes API), each entity's own policy only its Akka cluster
ports and its store (issue 12 item 12: the render's per-entity cost).

Both checks run against the rules as they were before the split, rebuilt here by
`old_entity_network_policy_spec` (the per-entity spec until commit af740c6, unchanged but for its
name; its store endpoint is derived from the stack's config, not from the new policies):

- the same traffic: every flow to or from any pod of an entity namespace (not only entity pods),
  with labelled impostors (an unknown service in the namespace, entity names in `default`) as pods
  and peers, that the simulator of tests/test_network_policies.py allows is allowed before and
  after, and nothing else is: the shared policy selects this environment's entities by name;
- an upgrade without a window: on the engine model (cloudstation_tools/engine.py) the old graph
  becomes the new one by in-place updates of the entity policies and the creation of the shared one,
  which every entity policy waits for, so no flow is closed while `pulumi up` runs; adding an entity
  updates the shared policy in place before the entity's own policy is created.
"""
from __future__ import annotations

import copy
import ipaddress
import re
from typing import Optional

import pytest

from cloudstation_tools import engine, render
from components import cassandra, network, postgres
from components.project_environment import (
    ENTITIES_POLICY, MANAGEMENT_PORT, PROXY_PORT, REMOTING_PORT, SERVICE_LABEL, entities_network_policy_spec,
)
from infra import config as stack_config
from tests import stacks
from tests.stacks import config_of as stack_file_config
from tests.conftest import ROOT, objects
from tests.test_monitoring import MONITORED, stack as monitored_stack
from tests.test_network_policies import (
    INTERNET, PROBE_PORTS, SERVICE_IP, USER, Address, Cluster, Pod, cluster_of, every_rule,
)

POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
VARIANTS = ("non-owner", "owner-external-cassandra")
"""CloudState variants with a managed Cassandra and external stores (tests/stacks/)."""


def old_entity_network_policy_spec(
    service_name: str, store: Optional[network.Endpoint], kubernetes_api: network.KubernetesApi
) -> dict:
    """components/project_environment.py `entity_network_policy_spec` at commit af740c6, before the
    shared policy: everything an entity pod needs, in each entity's policy."""
    own = network.pods({SERVICE_LABEL: service_name})
    entities = network.pods(expressions=[network.label_exists(SERVICE_LABEL)])
    cluster_ports = [REMOTING_PORT, MANAGEMENT_PORT]
    egress = [network.egress([own], cluster_ports), network.egress([entities], [PROXY_PORT])]
    if store is not None:
        egress.append(network.to(store))
    egress.append(network.kubernetes_api(kubernetes_api))
    return network.spec(
        {"matchLabels": {SERVICE_LABEL: service_name}},
        ingress_rules=[network.ingress([entities], [PROXY_PORT]), network.ingress([own], cluster_ports)],
        egress_rules=egress,
    )


# --- the stacks, and their policies as they were -----------------------------------------------


def variant_render(name: str) -> render.Rendered:
    return stacks.rendered(name)


def config_of(rendered: render.Rendered) -> stack_config.StackConfig:
    return stack_file_config(rendered)


def renders(rendered_stacks) -> dict[str, dict[str, render.Rendered]]:
    """Cluster name -> the stacks in it: both stack files share one cluster; each variant its own."""
    return {"shared": dict(rendered_stacks), **{name: {"test": variant_render(name)} for name in VARIANTS}}


def store_endpoint(rendered: render.Rendered, statefulservice: dict) -> Optional[network.Endpoint]:
    """The endpoint of the entity's store, from the stack's config: the StatefulStore the entity names
    (`<environment>-<kind>`) and the platform's settings of that kind (as CloudStateStore builds it)."""
    datastore = statefulservice["spec"].get("datastore")
    if not datastore:
        return None
    name = datastore["name"]
    kind = name.rsplit("-", 1)[-1]
    settings = getattr(config_of(rendered).platform.stores, kind)
    return {"postgres": postgres.server_endpoint, "cassandra": cassandra.server_endpoint}[kind](name, settings)


def old_policies(rendered: render.Rendered) -> dict[tuple[str, str], dict]:
    """(namespace, name) -> each entity's NetworkPolicy as the previous version rendered it."""
    api = config_of(rendered).platform.kubernetes_api
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": o["metadata"]["namespace"], "name": o["metadata"]["name"]},
            "spec": old_entity_network_policy_spec(o["metadata"]["name"], store_endpoint(rendered, o), api),
        }
        for o in objects(rendered, "StatefulService")
    }


def entity_namespaces(rendered: render.Rendered) -> set[str]:
    return {o["metadata"]["namespace"] for o in objects(rendered, "StatefulService")}


def shared_policies(rendered: render.Rendered) -> list[dict]:
    return [p for p in objects(rendered, "NetworkPolicy") if p["metadata"]["name"] == ENTITIES_POLICY]


def as_before(stacks: dict[str, render.Rendered], cluster: Cluster) -> Cluster:
    """The same cluster with the entity policies of the previous version: each entity's policy as it
    was, no shared policy."""
    old = {key: policy for rendered in stacks.values() for key, policy in old_policies(rendered).items()}
    shared = {(ns, ENTITIES_POLICY) for rendered in stacks.values() for ns in entity_namespaces(rendered)}
    kept = [p for p in cluster.policies if (p["metadata"]["namespace"], p["metadata"]["name"]) not in {*old, *shared}]
    assert len(kept) == len(cluster.policies) - len(old) - len(shared), "every entity has a policy, every namespace one shared"
    return Cluster(cluster.namespaces, cluster.pods, kept + list(old.values()))


IMPOSTOR_SERVICE = "not-an-entity"
"""The label value of a pod that claims to be an entity this environment does not have (a
StatefulService outside the stack, a deleted entity's pods still terminating, a new entity's pods
before its policies exist): the previous policies gave it nothing but DNS."""


def with_impostors(cluster: Cluster, stacks: dict[str, render.Rendered]) -> Cluster:
    """The cluster plus pods the operator's label alone does not make entities of this stack: in each
    entity namespace one labelled with an unknown service, and in `default` one labelled with each
    entity's service (a same-named pod of another namespace)."""
    namespaces = sorted({ns for rendered in stacks.values() for ns in entity_namespaces(rendered)})
    services = sorted({o["metadata"]["name"] for rendered in stacks.values() for o in objects(rendered, "StatefulService")})
    assert "default" in cluster.namespaces and "default" not in namespaces
    impostors = [Pod(ns, "impostor", {SERVICE_LABEL: IMPOSTOR_SERVICE}, {"grpc-proxy": PROXY_PORT}) for ns in namespaces]
    impostors += [Pod("default", f"impostor-{s}", {SERVICE_LABEL: s}, {"grpc-proxy": PROXY_PORT}) for s in services]
    return Cluster(cluster.namespaces, [*cluster.pods, *impostors], cluster.policies)


def entity_flows(cluster: Cluster, stacks: dict[str, render.Rendered]) -> set[tuple]:
    """Every (source, destination, port, protocol) the cluster allows where the source or the
    destination is any pod of an entity namespace (entities, stores, setup Jobs, backups, impostors:
    a policy there may select more than entity pods); peers are every pod (with the impostors of
    `with_impostors`) and an address in each block any policy names (plus the Service IP, the
    internet and a user), ports every port any policy names and the usual."""
    policies = cluster.policies
    ports = PROBE_PORTS | {p["port"] for _, _, rule in every_rule(policies) for p in rule["ports"] if isinstance(p["port"], int)}
    blocks = {peer["ipBlock"]["cidr"] for _, key, rule in every_rule(policies) for peer in rule[key] if "ipBlock" in peer}
    networks = [ipaddress.ip_network(b) for b in sorted(blocks)]
    addresses = [Address(str(next(iter(n.hosts()), n.network_address))) for n in networks if n.prefixlen]
    addresses += [Address(SERVICE_IP), Address(INTERNET), Address(USER)]
    peers: list[Pod | Address] = [*cluster.pods, *addresses]
    namespaces = {ns for rendered in stacks.values() for ns in entity_namespaces(rendered)}
    local_pods = [p for p in cluster.pods if p.namespace in namespaces]
    assert {p.labels.get(SERVICE_LABEL) for p in local_pods} >= {IMPOSTOR_SERVICE}, "the impostors are modelled"
    assert any(p.labels.get(SERVICE_LABEL) is None for p in local_pods), "pods other than entities are compared"
    found = set()
    for pod in local_pods:
        for peer in peers:
            for port in ports:
                for protocol in (("TCP", "UDP") if port == 53 else ("TCP",)):
                    if cluster.allowed(pod, peer, port, protocol):
                        found.add((pod, peer, port, protocol))
                    if cluster.allowed(peer, pod, port, protocol):
                        found.add((peer, pod, port, protocol))
    return found


def show(flows: set[tuple]) -> list[str]:
    def name(end) -> str:
        return f"{end.namespace}/{end.name}" if isinstance(end, Pod) else end.ip
    return sorted(f"{name(a)} -> {name(b)}:{port}/{protocol}" for a, b, port, protocol in flows)


# --- the same traffic ----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["shared", *VARIANTS])
def test_entity_pods_have_exactly_the_flows_the_per_entity_policies_allowed(which, rendered_stacks):
    """Both stack files in their shared cluster, and the variants with a managed Cassandra and
    external PostgreSQL/Cassandra: the flows to and from every pod of an entity namespace (entity
    pods, stores, Jobs, labelled impostors) are the same set."""
    stacks = renders(rendered_stacks)[which]
    after = with_impostors(cluster_of(stacks), stacks)
    before = as_before(stacks, after)
    old, new = entity_flows(before, stacks), entity_flows(after, stacks)
    assert old, "the old policies allow something (the check sees flows)"
    assert new == old, {"lost": show(old - new), "gained": show(new - old)}


def test_one_shared_policy_per_entity_namespace(rendered_stacks):
    """Each namespace with entities has the shared policy once: it selects that namespace's entities
    by name (every StatefulService there, not every labelled pod), admits and reaches every labelled
    pod of the namespace on the proxy port, and reaches the API at the stack file's
    `platform.kubernetesApi`; each entity's own policy keeps only its Akka cluster ports (both ways,
    with its own pods) and its store. Spelled out from the constants, not from the builder."""
    for rendered in renders(rendered_stacks)["shared"].values():
        api = config_of(rendered).platform.kubernetes_api
        assert not api.allow_any_address and api.cidrs and api.ports
        shared = shared_policies(rendered)
        assert sorted(p["metadata"]["namespace"] for p in shared) == sorted(entity_namespaces(rendered))
        labelled = {"podSelector": {"matchExpressions": [{"key": SERVICE_LABEL, "operator": "Exists"}]}}
        proxy = [{"port": PROXY_PORT, "protocol": "TCP"}]
        for policy in shared:
            namespace = policy["metadata"]["namespace"]
            services = sorted(o["metadata"]["name"] for o in objects(rendered, "StatefulService")
                              if o["metadata"]["namespace"] == namespace)
            assert policy["spec"] == {
                "podSelector": {"matchExpressions": [{"key": SERVICE_LABEL, "operator": "In", "values": services}]},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [labelled], "ports": proxy}],
                "egress": [
                    {"to": [labelled], "ports": proxy},
                    {"to": [{"ipBlock": {"cidr": str(c)}} for c in api.cidrs],
                     "ports": [{"port": p, "protocol": "TCP"} for p in api.ports]},
                ],
            }, namespace
        policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in objects(rendered, "NetworkPolicy")}
        for o in objects(rendered, "StatefulService"):
            spec = policies[(o["metadata"]["namespace"], o["metadata"]["name"])]["spec"]
            assert spec["policyTypes"] == ["Ingress", "Egress"]
            own = network.pods({SERVICE_LABEL: o["metadata"]["name"]})
            assert spec["ingress"] == [network.ingress([own], [REMOTING_PORT, MANAGEMENT_PORT])]
            store = store_endpoint(rendered, o)
            assert spec["egress"] == [network.egress([own], [REMOTING_PORT, MANAGEMENT_PORT]),
                                      *([network.to(store)] if store else [])]


def test_the_shared_spec_refuses_an_environment_without_entities():
    """`In` needs values (the API server refuses an empty list), and no entity means no shared policy."""
    with pytest.raises(ValueError, match="at least one entity"):
        entities_network_policy_spec([], None)


def test_the_shared_policy_name_is_no_entitys():
    """Entity policies are named after their Service (`<project>-<entity>`, or project-state's name):
    the config refuses either name with a dot, and the shared policy's has one (a NetworkPolicy name
    is a DNS subdomain, so it may)."""
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+", ENTITIES_POLICY)
    state = stacks.edited("test", platform=lambda p: {**p, "projectState": {"name": ENTITIES_POLICY}})
    with pytest.raises(stack_config.ConfigError, match=re.escape(f"platform.projectState.name: '{ENTITIES_POLICY}'")):
        stack_config.load(state.values)
    entity = stacks.edited(
        "test", projects=lambda projects: [{**projects[0], "entities": [{**projects[0]["entities"][0], "name": "a.b"}]}])
    with pytest.raises(stack_config.ConfigError, match=re.escape("projects[0].entities[0].name: 'a.b'")):
        stack_config.load(entity.values)


def test_the_docs_name_every_policy_that_selects_entity_pods():
    """docs/network-policies.md and docs/cloudstate.md name each NetworkPolicy that selects an entity
    pod (the stack with `platform.monitoring.enabled`, so the scrape policy is among them), but the
    entities' own, which are named after their Services."""
    rendered = monitored_stack(MONITORED)
    cluster = cluster_of({"test": rendered})
    services = {o["metadata"]["name"] for o in objects(rendered, "StatefulService")}
    entity_pods = [p for p in cluster.pods if p.labels.get(SERVICE_LABEL) in services]
    names = {p["metadata"]["name"] for p in cluster.policies
             if p["metadata"]["name"] not in services and any(cluster._selects(p, pod) for pod in entity_pods)}
    assert {ENTITIES_POLICY, network.DEFAULT_DENY, network.ALLOW_DNS} < names, names
    for doc in ("network-policies.md", "cloudstate.md"):
        text = (ROOT / "docs" / doc).read_text()
        missing = sorted(n for n in names - {network.DEFAULT_DENY, network.ALLOW_DNS} if f"`{n}`" not in text)
        assert not missing, (doc, missing)


# --- the upgrade -----------------------------------------------------------------------------------


def graph_before(rendered: render.Rendered) -> engine.Graph:
    """The registrations the previous version made: no shared policy, each entity's policy with its
    old spec and no dependency on the shared one; everything else as now."""
    old = old_policies(rendered)
    shared = {r.urn for r in rendered_graph(rendered).objects
              if r.kind == "NetworkPolicy" and r.object_name == ENTITIES_POLICY}
    entries = []
    for entry in rendered.resources():
        if entry["urn"] in shared:
            continue
        entry = copy.deepcopy(entry)
        meta = (entry.get("inputs") or {}).get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        if entry["type"] == POLICY and key in old:
            entry["inputs"]["spec"] = old[key]["spec"]
        entry["dependsOn"] = [u for u in entry.get("dependsOn") or () if u not in shared]
        entries.append(entry)
    return engine.Graph(entries)


def rendered_graph(rendered: render.Rendered) -> engine.Graph:
    return engine.Graph(rendered.resources())


def upgrade_problems(before: engine.Graph, after: engine.Graph) -> list[str]:
    """What goes wrong when `pulumi up` turns `before` into `after` for the entity policies: one
    replaced (deleted, then created: a window) or refused, a shared policy missing, or an entity
    policy that the engine may narrow before the shared one exists (it does not wait for it)."""
    problems = []
    created = [r for r in after.objects if r.urn not in before.by_urn]
    shared = [r for r in created if r.kind == "NetworkPolicy" and r.object_name == ENTITIES_POLICY]
    for change in engine.changes(before, after):
        label = change.new.label()
        if change.new.kind != "NetworkPolicy":
            problems.append(f"{label}: changed, though only NetworkPolicies should")
            continue
        if change.replaced or change.problems():
            problems.append(f"{label}: not an in-place update ({change.problems() or 'replaced'})")
        ours = [s for s in shared if s.namespace == change.new.namespace]
        if not ours:
            problems.append(f"{label}: narrowed, but no shared policy is created in its namespace")
        elif not all(s.urn in after.waits_for(change.new.urn) for s in ours):
            problems.append(f"{label}: may be narrowed before {ours[0].label()} exists")
    return problems


@pytest.mark.parametrize("which", ["test", "prod", *VARIANTS])
def test_an_upgrade_creates_the_shared_policy_before_it_narrows_any_entitys(which, rendered_stacks):
    """From the previous version: each entity's policy is updated in place (same name, fewer rules;
    NetworkPolicy `.spec` is in no forceNew list), the shared policy is created, and each updated
    policy depends on it, so the engine creates it first (the SDK registers a resource only once its
    dependencies' registrations have completed: components/project_environment.py cites the source)."""
    rendered = rendered_stacks[which] if which in rendered_stacks else variant_render(which)
    before, after = graph_before(rendered), rendered_graph(rendered)
    changed = engine.changes(before, after)
    assert sorted(c.new.label() for c in changed) == sorted(
        r.label() for r in after.objects
        if r.kind == "NetworkPolicy" and (r.namespace, r.object_name) in old_policies(rendered)
    )
    created = [r for r in after.objects if r.urn not in before.by_urn]
    assert sorted(r.namespace for r in created) == sorted(entity_namespaces(rendered))
    assert all(r.object_name == ENTITIES_POLICY for r in created)
    assert upgrade_problems(before, after) == []


def graph_without(rendered: render.Rendered, namespace: str, service: str) -> engine.Graph:
    """The registrations before `service` was added to its environment: none of its objects (named
    after it in its namespace), and the shared policy selecting the others only."""
    entries = []
    for entry in rendered.resources():
        resource = engine.Resource.of(entry)
        if resource.is_object and (resource.namespace, resource.object_name) == (namespace, service):
            continue
        if resource.is_object and resource.kind == "NetworkPolicy" and \
                (resource.namespace, resource.object_name) == (namespace, ENTITIES_POLICY):
            entry = copy.deepcopy(entry)
            [selected] = entry["inputs"]["spec"]["podSelector"]["matchExpressions"]
            assert service in selected["values"]
            selected["values"] = [v for v in selected["values"] if v != service]
        entries.append(entry)
    return engine.Graph(entries)


def addition_problems(before: engine.Graph, after: engine.Graph, namespace: str, service: str) -> list[str]:
    """What goes wrong when `pulumi up` adds `service`: its policy is not created, the shared
    policy is not updated in place to select it (only its pod selector changing), or its own
    policy may be created before that update is done (it does not wait for the shared policy)."""
    shared = after.find("NetworkPolicy", ENTITIES_POLICY, namespace)
    own = after.find("NetworkPolicy", service, namespace)
    if shared is None or own is None or own.urn in before.by_urn:
        return [f"{namespace}/{service}: no shared policy, or its own policy is not created"]
    problems = []
    [change] = [c for c in engine.changes(before, after) if c.new.urn == shared.urn] or [None]
    if change is None:
        problems.append(f"{shared.label()}: not updated to select {service}")
    elif change.replaced or change.problems() or any(p[:2] != ("spec", "podSelector") for p in change.paths):
        problems.append(f"{shared.label()}: not an in-place update of its pod selector "
                        f"({change.problems() or change.paths})")
    if shared.urn not in after.waits_for(own.urn):
        problems.append(f"{own.label()}: may be created before {shared.label()} selects {service}")
    return problems


def added_entities(rendered: render.Rendered) -> list[tuple[str, str]]:
    """(namespace, service) of the last entity of each namespace with several: adding it updates
    a shared policy that exists already."""
    by_namespace: dict[str, list[str]] = {}
    for o in objects(rendered, "StatefulService"):
        by_namespace.setdefault(o["metadata"]["namespace"], []).append(o["metadata"]["name"])
    return [(ns, sorted(names)[-1]) for ns, names in sorted(by_namespace.items()) if len(names) > 1]


@pytest.mark.parametrize("which", ["test", "prod"])
def test_a_new_entity_is_added_to_the_shared_policy_before_its_own_is_created(which, rendered_stacks):
    """Adding an entity updates the shared policy in place (its selector gains the name; a
    NetworkPolicy's spec is mutable and in no forceNew list) and creates the entity's own policy
    after that update: the own policy depends on the shared one (components/project_environment.py
    cites the SDK and engine source). Until the shared policy selects them, the new pods have DNS only."""
    rendered = rendered_stacks[which]
    after = rendered_graph(rendered)
    added = added_entities(rendered)
    assert added, "a namespace with several entities"
    for namespace, service in added:
        assert addition_problems(graph_without(rendered, namespace, service), after, namespace, service) == []
    # The check sees the order: without the dependency the own policy may come first.
    namespace, service = added[0]
    shared = after.find("NetworkPolicy", ENTITIES_POLICY, namespace).urn
    unordered = engine.Graph([
        {**entry, "dependsOn": [u for u in entry.get("dependsOn") or () if u != shared]}
        for entry in rendered.resources()
    ])
    problems = addition_problems(graph_without(rendered, namespace, service), unordered, namespace, service)
    assert len(problems) == 1 and "may be created before" in problems[0], problems


def test_the_upgrade_check_fails_when_an_entity_policy_does_not_wait(rendered_stacks):
    """The check sees the order: without the dependency an entity's policy may be narrowed first."""
    rendered = rendered_stacks["test"]
    before, after = graph_before(rendered), rendered_graph(rendered)
    shared = {r.urn for r in after.objects if r.object_name == ENTITIES_POLICY}
    unordered = engine.Graph([
        {**entry, "dependsOn": [u for u in entry.get("dependsOn") or () if u not in shared]}
        for entry in rendered.resources()
    ])
    problems = upgrade_problems(before, unordered)
    assert len(problems) == len(old_policies(rendered)), problems
    assert all("may be narrowed before" in p for p in problems)
    # And without the shared policy at all (the rules simply dropped), every narrowing is a problem.
    dropped = engine.Graph([e for e in rendered.resources() if e["urn"] not in shared])
    assert len(upgrade_problems(before, dropped)) == len(old_policies(rendered))
