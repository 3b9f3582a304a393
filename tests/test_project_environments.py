"""Per-project environments and the project-state entity, on the rendered graph of both stacks."""
from __future__ import annotations

import pytest

from components.cloudstate_operator import CloudStateArgs
from components.cloudstate_operator import parse_operator_config
from components.project_environment import (
    SERVICE_ACCOUNT, TOKEN_PATH, USER_PORT, EntityService, namespace_args, replicas_hpa_spec, stateful_service_spec,
    store_key,
)
from cloudstation_tools import checks
from infra.config import DIGEST_REF, ConfigError, load
from infra.delivery import PULL_SECRET_NAME
from tests.stacks import validate_config  # prod as its first promotion writes it
from tests.stacks import edited, rendered as variant
from tests.conftest import find, objects


def entity_namespaces(rendered) -> dict[str, str]:
    """StatefulService name -> namespace."""
    return {s["metadata"]["name"]: s["metadata"]["namespace"] for s in objects(rendered, "StatefulService")}


def test_each_project_gets_its_own_environment_namespace(rendered):
    config = validate_config(rendered.stack)
    for project in config.projects:
        namespace = find(rendered, "Namespace", f"{project.name}-{rendered.stack}")
        labels = namespace["metadata"]["labels"]
        # baseline: the operator's entity pods carry no securityContext (components/project_environment.py)
        assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
        assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
        assert labels["cloudstation.io/environment"] == rendered.stack
    assert rendered.outputs["projectNamespaces"] == {p.name: f"{p.name}-{rendered.stack}" for p in config.projects}


def test_one_stateful_service_per_entity_with_a_datastore_only_where_the_kind_needs_one(rendered):
    config = validate_config(rendered.stack)
    services = {s["metadata"]["name"]: s for s in objects(rendered, "StatefulService")}
    expected = {f"{p.name}-{e.name}": (e, p.store) for p in config.projects for e in p.entities}
    expected["project-state"] = (config.platform.project_state, config.platform.project_state_store)
    assert set(services) == set(expected)
    kinds = set()
    for name, (entity, kind) in expected.items():
        spec = services[name]["spec"]
        namespace = services[name]["metadata"]["namespace"]
        if entity.kind.needs_store:
            store = find(rendered, "StatefulStore", spec["datastore"]["name"], namespace)
            assert store["spec"]["type"] == {"postgres": "Postgres", "cassandra": "Cassandra"}[kind], name
            kinds.add(kind)
        else:
            assert "datastore" not in spec, name
    assert kinds == {"postgres", "cassandra"}  # the base pair has a project on each


def test_entity_images_are_digest_pinned_and_are_the_exported_ones(rendered):
    config = validate_config(rendered.stack)
    images = rendered.outputs["images"]
    for service in objects(rendered, "StatefulService"):
        [user] = service["spec"]["containers"]
        assert DIGEST_REF.match(user["image"]), user["image"]
        name = service["metadata"]["name"]
        key = "platform/project-state" if name == "project-state" else name.replace("-", "/", 1)
        assert user["image"] == images[key]
    if rendered.stack == "prod":  # prod deploys exactly the promoted references
        promoted = {f"{p.name}/{e.name}": e.image for p in config.projects for e in p.entities}
        promoted["platform/project-state"] = config.platform.project_state.image
        assert images == promoted


def test_entity_pods_pull_with_the_registry_secret_and_read_pods_for_akka_bootstrap(rendered):
    for namespace in set(entity_namespaces(rendered).values()):
        secret = find(rendered, "Secret", PULL_SECRET_NAME, namespace)
        assert secret["type"] == "kubernetes.io/dockerconfigjson"
        account = find(rendered, "ServiceAccount", SERVICE_ACCOUNT, namespace)
        assert account["imagePullSecrets"] == [{"name": PULL_SECRET_NAME}]
        role = find(rendered, "Role", "cloudstate-entities-pod-reader", namespace)
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]}]
        binding = find(rendered, "RoleBinding", "cloudstate-entities-pod-reader", namespace)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]
    for service in objects(rendered, "StatefulService"):
        assert service["spec"]["serviceAccountName"] == SERVICE_ACCOUNT


def test_every_entity_has_a_service_and_its_configured_replicas(rendered):
    config = validate_config(rendered.stack)
    replicas = {f"{p.name}-{e.name}": e.replicas for p in config.projects for e in p.entities}
    replicas["project-state"] = config.platform.project_state.replicas
    for name, namespace in entity_namespaces(rendered).items():
        service = find(rendered, "Service", name, namespace)
        assert service["spec"]["selector"] == {"cloudstate.io/statefulService": name}
        assert service["spec"]["ports"][0]["port"] == 80 and service["spec"]["ports"][0]["targetPort"] == 8013
        hpa = find(rendered, "HorizontalPodAutoscaler", name, namespace)
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["minReplicas"] == hpa["spec"]["maxReplicas"] == replicas[name]
        assert hpa["spec"]["scaleTargetRef"]["name"] == f"{name}-deployment"


def test_the_user_container_is_restricted_with_requests_and_limits(rendered):
    for service in objects(rendered, "StatefulService"):
        spec = {"containers": service["spec"]["containers"], "volumes": service["spec"]["volumes"]}
        name = service["metadata"]["name"]
        assert checks.restricted_violations(name, spec) == []
        assert checks.resource_violations(name, spec) == []
        sidecar = service["spec"]["sidecarResources"]
        assert {"cpu", "memory"} <= set(sidecar["requests"]) and {"cpu", "memory"} <= set(sidecar["limits"])


def test_project_state_runs_in_its_own_namespace_with_its_own_store(rendered):
    """Not in the platform namespace, which holds the registry and its credentials and enforces
    "restricted": the operator's entity pods need "baseline" (components/project_environment.py)."""
    platform = validate_config(rendered.stack).platform.namespace
    state = rendered.outputs["projectStateNamespace"]
    assert state == f"{platform}-state"
    service = find(rendered, "StatefulService", "project-state", state)
    store = find(rendered, "StatefulStore", service["spec"]["datastore"]["name"], state)
    find(rendered, "StatefulSet", store["metadata"]["name"], state)
    assert rendered.outputs["projectStateService"] == f"project-state.{state}.svc.cluster.local:80"
    labels = find(rendered, "Namespace", state)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert not [o for o in rendered.manifests() if o["metadata"].get("namespace") == platform
                and o["kind"] in ("StatefulService", "StatefulStore")]


def test_a_cassandra_project_names_its_keyspace_per_project_and_environment():
    rendered = variant("non-owner")  # the test stack's projects on a managed Cassandra
    projects = validate_config("test").projects
    assert any(e.kind.needs_store for p in projects for e in p.entities)
    for project in projects:
        namespace = f"{project.name}-test"
        for entity in project.entities:
            spec = find(rendered, "StatefulService", f"{project.name}-{entity.name}", namespace)["spec"]
            if entity.kind.needs_store:
                keyspace = {"keyspace": store_key(project.name, "test")}
                assert spec["datastore"] == {"name": f"{project.name}-cassandra", "config": keyspace}
            else:
                assert "datastore" not in spec


# --- pure builders ---------------------------------------------------------------------------


def test_stateful_service_spec_only_wires_a_store_for_event_sourced_entities():
    settings = CloudStateArgs()
    stateful = EntityService("p-e", needs_store=True, replicas=1, image="r/p/e@sha256:" + "0" * 64)
    stateless = EntityService("p-f", needs_store=False, replicas=1, image="r/p/f@sha256:" + "0" * 64)
    postgres = stateful_service_spec(stateful, stateful.image, "p-postgres", "postgres", "p_test", settings)
    assert postgres["datastore"] == {"name": "p-postgres"}
    cassandra = stateful_service_spec(stateful, stateful.image, "p-cassandra", "cassandra", "p_test", settings)
    assert cassandra["datastore"] == {"name": "p-cassandra", "config": {"keyspace": "p_test"}}
    assert "datastore" not in stateful_service_spec(stateless, stateless.image, None, "postgres", "p_test", settings)
    # Operator 0.6.0 runs only the first container and takes its first port as the user port (PORT).
    [container] = postgres["containers"]
    assert container["ports"] == [{"name": "user-port", "containerPort": USER_PORT}] and USER_PORT == 8080
    # It pastes sidecarJvmMemory unchecked into the proxy's JAVA_OPTS, so only a plain size passes.
    assert postgres["sidecarJvmMemory"] == settings.sidecar_jvm_memory
    with pytest.raises(ValueError, match="sidecar_jvm_memory|sidecarJvmMemory"):
        CloudStateArgs(sidecar_jvm_memory="256m -Dconfig.resource=dev-mode.conf")
    # -Xms = -Xmx: the heap is committed whole, and the JVM needs as much again beside it.
    with pytest.raises(ValueError, match="at most half of sidecarResources.memoryLimit"):
        CloudStateArgs(sidecar_jvm_memory="257m", sidecar_resources={"memoryLimit": "512Mi"})
    assert CloudStateArgs(sidecar_jvm_memory="1g", sidecar_resources={"memoryLimit": "2Gi"}).sidecar_jvm_memory == "1g"
    assert store_key("my-shop", "prod") == "my_shop_prod"
    assert replicas_hpa_spec("p-e", 3)["minReplicas"] == replicas_hpa_spec("p-e", 3)["maxReplicas"] == 3
    assert namespace_args("p-test", "p", "test").pod_security == "baseline"


# --- config errors ---------------------------------------------------------------------------


def load_problems(**edits) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(edited("test", **edits).values)
    return caught.value.problems


def test_a_service_name_longer_than_a_dns_label_is_rejected_at_config_time():
    long_entity = "e" * 40
    [problem] = load_problems(projects=lambda projects: [
        {**projects[0], "name": "p" * 30, "entities": [{**projects[0]["entities"][0], "name": long_entity}]}])
    assert problem.startswith(f"cloudstation:projects[0].entities[0].name: '{long_entity}' — ")
    assert "has 71 characters; project and entity name together may have at most 62" in problem


def test_a_project_namespace_may_not_be_the_platform_namespace():
    project = validate_config("test").projects[0].name
    [problem] = load_problems(platform=lambda p: {**p, "namespace": f"{project}-test"})
    assert problem == (f"cloudstation:projects[0].name: '{project}' — its namespace '{project}-test' is the platform "
                       "namespace (platform.namespace); rename the project or the platform namespace")


@pytest.mark.parametrize("store, entity", [("postgres", "postgres"), ("postgres", "postgres-headless"),
                                           ("cassandra", "cassandra"), ("cassandra", "cassandra-auth")])
def test_an_entity_may_not_take_the_name_of_its_stores_objects(store, entity):
    """`shop-postgres` would be both the entity's and the database's Service and NetworkPolicy
    (creating the second fails on the cluster), and the entity's pods would carry the database's
    selector labels."""
    first = validate_config("test").projects[0]
    [problem] = load_problems(projects=lambda projects: [
        {**projects[0], "store": store, "entities": [*projects[0]["entities"], {**projects[0]["entities"][0], "name": entity}]}])
    index = len(first.entities)  # the added entity, after the project's own
    assert problem == (f"cloudstation:projects[0].entities[{index}].name: '{entity}' — '{first.name}-{entity}' (the entity's "
                       f"Service and NetworkPolicy name) is already used by the project's {store} store or its "
                       "namespace; rename the entity")


# --- what `pulumi up` waits for ------------------------------------------------------------


def managed_pod_templates(rendered) -> list[tuple[str, dict]]:
    """(namespace, pod labels) of every pod this stack's Pulumi program manages itself."""
    templates = []
    for obj in rendered.manifests():
        if obj["kind"] in checks.WORKLOAD_KINDS:
            meta = obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"] if obj["kind"] == "CronJob" else (
                obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"])
            templates.append((obj["metadata"].get("namespace"), meta.get("labels") or {}))
    return templates


def test_services_over_pods_the_operator_creates_are_not_awaited(rendered):
    """pulumi-kubernetes awaits a Service with a selector until its endpoints are ready (up to 10
    minutes; provider/pkg/await/service.go). Pulumi creates none of the pods behind an entity
    Service (the operator does, from the StatefulService), so each of those carries
    `pulumi.com/skipAwait`, and no Service over Pulumi's own pods does (those stay awaited)."""
    templates = managed_pod_templates(rendered)
    unbacked = set()
    for service in objects(rendered, "Service"):
        selector = service["spec"].get("selector")
        if not selector:
            continue
        namespace = service["metadata"]["namespace"]
        backed = any(ns == namespace and selector.items() <= labels.items() for ns, labels in templates)
        skips = (service["metadata"].get("annotations") or {}).get("pulumi.com/skipAwait") == "true"
        assert skips != backed, f"Service {namespace}/{service['metadata']['name']}: backed={backed} skipAwait={skips}"
        if not backed:
            unbacked.add((namespace, service["metadata"]["name"]))
    assert unbacked == {(ns, name) for name, ns in entity_namespaces(rendered).items()}


# --- service-account tokens, Pod Security and registry credentials (docs/security.md) ----------


def cloudstate_namespaces(rendered) -> set[str]:
    """The platform namespace, project-state's and every project's (Armada's are its own area)."""
    outputs = rendered.outputs
    return {outputs["platformNamespace"], outputs["projectStateNamespace"], *outputs["projectNamespaces"].values()}


def bound_accounts(rendered) -> set[tuple[str, str]]:
    """(namespace, name) of every ServiceAccount some RoleBinding or ClusterRoleBinding grants to."""
    return {(s["namespace"], s["name"]) for o in rendered.manifests() if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
            for s in o["subjects"] if s["kind"] == "ServiceAccount"}


@pytest.mark.parametrize("source", ["test", "prod", "non-owner", "owner-external-cassandra"])
def test_no_api_token_where_the_workload_does_not_call_the_api(source, rendered_stacks):
    """A pod whose ServiceAccount is granted nothing has no use for a token: the stores, their setup
    Jobs and the registry mount none. The entity pods need one for the proxy sidecar (Akka's
    Kubernetes discovery lists the entity's pods), so their ServiceAccount keeps it, but the user
    container mounts an empty directory over the token's path, which makes the ServiceAccount
    admission plugin leave that container alone (kubernetes plugin/pkg/admission/serviceaccount/
    admission.go `mountServiceAccountToken`)."""
    rendered = rendered_stacks[source] if source in rendered_stacks else variant(source)
    scope, bound = cloudstate_namespaces(rendered), bound_accounts(rendered)
    tokenless = 0
    for obj in rendered.manifests():
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] not in checks.WORKLOAD_KINDS or namespace not in scope:
            continue
        spec = checks.pod_spec(obj)
        account = spec.get("serviceAccountName", "default")
        what = f"{source}: {obj['kind']} {namespace}/{obj['metadata']['name']}"
        if (namespace, account) in bound:
            assert spec.get("automountServiceAccountToken") is not False, what  # it calls the API
        else:
            assert spec.get("automountServiceAccountToken") is False, what
            tokenless += 1
    assert tokenless  # at least a store, the registry or a setup Job
    for service in objects(rendered, "StatefulService"):
        namespace, spec = service["metadata"]["namespace"], service["spec"]
        assert (namespace, spec["serviceAccountName"]) in bound  # the proxy's Akka discovery
        [user] = spec["containers"]
        [mount] = [m for m in user["volumeMounts"] if m["mountPath"] == TOKEN_PATH]
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert set(volume) == {"name", "emptyDir"} and mount.get("readOnly") is True, service["metadata"]["name"]
    assert TOKEN_PATH == "/var/run/secrets/kubernetes.io/serviceaccount"  # the plugin's DefaultAPITokenMountPath


def test_the_platform_namespace_is_restricted_and_runs_no_operator_generated_pod(rendered):
    """It holds the registry and its credentials: it enforces "restricted", which the operator's
    entity pods (no securityContext from the operator) could not meet, so none run there."""
    platform = rendered.outputs["platformNamespace"]
    labels = find(rendered, "Namespace", platform)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    inside = [o for o in rendered.manifests() if o["metadata"].get("namespace") == platform]
    assert not [o for o in inside if o["apiVersion"].startswith("cloudstate.io/")]
    for obj in inside:
        if obj["kind"] in checks.WORKLOAD_KINDS:
            assert checks.restricted_violations(obj["metadata"]["name"], checks.pod_spec(obj)) == []
    # The entity namespaces hold no registry credential but the pull Secret of their pods.
    for namespace in cloudstate_namespaces(rendered) - {platform}:
        secrets = [o for o in objects(rendered, "Secret") if o["metadata"]["namespace"] == namespace
                   and o["type"] == "kubernetes.io/dockerconfigjson"]
        assert [s["metadata"]["name"] for s in secrets] == [PULL_SECRET_NAME], namespace
        assert not [o for o in objects(rendered, "Secret") if o["metadata"]["namespace"] == namespace
                    and o["metadata"]["name"].startswith("registry")], namespace


@pytest.mark.parametrize("source", ["test", "prod", "non-owner", "owner-external-cassandra"])
def test_every_image_from_the_stacks_registry_is_pinned_by_digest(source, rendered_stacks):
    """The pull Secret in every entity namespace can push (the registry's htpasswd has no per-user
    rights). It still cannot change what runs: everything this stack pulls from that registry is
    referenced by digest, and a push can only add new digests (docs/security.md)."""
    rendered = rendered_stacks[source] if source in rendered_stacks else variant(source)
    host = rendered.outputs["registry"]["pullHost"]
    images = [c["image"] for _, spec in checks.workloads(rendered.manifests()) for c in checks.containers(spec)]
    images += [c["image"] for s in objects(rendered, "StatefulService") for c in s["spec"]["containers"]]
    for config_map in objects(rendered, "ConfigMap"):
        if config_map["metadata"]["name"] == "cloudstate-operator-config":
            images += list(parse_operator_config(config_map["data"]["config"])["proxy.image"].values())
    from_registry = [image for image in images if image.split("/", 1)[0] == host]
    assert from_registry, source  # the entities
    assert all(DIGEST_REF.match(image) for image in from_registry), from_registry
    assert sorted(set(from_registry)) == sorted(set(rendered.outputs["images"].values()))
