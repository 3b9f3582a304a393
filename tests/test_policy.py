"""The policy pack (policy/rules.py), run offline: every rule on the rendered graph of both stack
files and of prod on a cluster of its own (its prod-size Armada, tests/armada_variants.py), as the
engine would call it, and every rule against a bad example it must reject.

The engine hands a policy the resource's inputs with secrets decrypted and unknowns as sentinel
strings, behind pulumi_policy's unknown-checking proxy; `engine_props` builds exactly that from the
mock registrations. Stack config reaches the pack as PULUMI_CONFIG and PULUMI_STACK.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from google.protobuf import struct_pb2
from pulumi.runtime import config as pulumi_config, proto
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.policy import _NotApplicableError, _PolicyAnalyzerServicer
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from infra import checks, config as stack_config, render, versions
from infra.mocks import is_wrapped_secret
from policy import rules
from tests import armada_variants
from tests.conftest import ROOT

DIGEST = "sha256:" + "ab" * 32
RESOURCE_POLICIES = [p for p in rules.POLICIES if not isinstance(p, StackValidationPolicy)]
STACK_POLICIES = [p for p in rules.POLICIES if isinstance(p, StackValidationPolicy)]


# --- calling policies the way the engine does ------------------------------------------------------


def engine_props(value: Any) -> Any:
    """Mock inputs as the engine passes them: secrets in plain text, unknowns as sentinels."""
    if is_wrapped_secret(value):
        return engine_props(value["value"])
    if isinstance(value, dict):
        return {k: engine_props(v) for k, v in value.items()}
    if isinstance(value, list):
        return [engine_props(v) for v in value]
    if type(value).__name__ == "Unknown":
        return UNKNOWN_STRING_VALUE
    return value


def options() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def check_resource(policy, type_: str, props: dict, config: Optional[dict] = None, name: str = "r") -> list[str]:
    violations: list[str] = []
    args = ResourceValidationArgs(type_, unknown_checking_proxy(engine_props(props)), f"urn:{type_}::{name}", name,
                                  options(), None, config or {})
    policy.validate(args, lambda message, urn=None: violations.append(message))
    return violations


def check_stack(policy, resources: list[tuple[str, dict]], config: Optional[dict] = None) -> list[str]:
    violations: list[str] = []
    policy_resources = [
        PolicyResource(type_, unknown_checking_proxy(engine_props(props)), f"urn:{type_}::{i}", str(i), options(),
                       None, None, [], {})
        for i, (type_, props) in enumerate(resources)
    ]
    policy.validate(StackValidationArgs(policy_resources, config or {}),
                    lambda message, urn=None: violations.append(message))
    return violations


@pytest.fixture
def engine_env(monkeypatch):
    """Sets the stack config and name the engine passes to the pack."""

    def set_stack(stack: str, values: dict[str, str]) -> None:
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(values))
        monkeypatch.setenv("PULUMI_STACK", stack)

    return set_stack


@pytest.fixture(params=["test", "prod", armada_variants.OWN_CLUSTER])
def as_stack(request, rendered_stacks, engine_env):
    """Each stack file, and prod on a cluster of its own, with its config passed as the engine would."""
    name = request.param
    rendered = rendered_stacks[name] if name in rendered_stacks else armada_variants.variant(name)
    engine_env(rendered.stack, armada_variants.stack_file(name).values)
    return rendered


@pytest.fixture
def project_directory(as_stack, rendered_stacks, tmp_path) -> Path:
    """Where the pack finds `as_stack`'s stack file: the repo, or a variant's written out."""
    if as_stack is rendered_stacks.get(as_stack.stack):
        return ROOT
    armada_variants.write_stack_file(armada_variants.OWN_CLUSTER, tmp_path)
    return tmp_path


# --- our stacks pass ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", RESOURCE_POLICIES, ids=lambda p: p.name)
def test_every_resource_of_both_stacks_passes(as_stack, policy):
    violations = [v for r in as_stack.registrations for v in check_resource(policy, r.type, r.inputs, name=r.name)]
    assert violations == []


@pytest.mark.parametrize("policy", STACK_POLICIES, ids=lambda p: p.name)
def test_both_stacks_pass_the_stack_policies(as_stack, project_directory, policy):
    resources = [(r.type, r.inputs) for r in as_stack.registrations]
    assert check_stack(policy, resources, {"projectDirectory": str(project_directory)}) == []


def wire(value: Any) -> Any:
    """Mock inputs in the engine's wire form (secrets keep their signature, unknowns are sentinels)."""
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [wire(v) for v in value]
    return UNKNOWN_STRING_VALUE if type(value).__name__ == "Unknown" else value


def struct(value: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(wire(value))
    return message


def test_the_pack_passes_both_stacks_over_the_analyzer_protocol(as_stack, project_directory):
    """The path `pulumi preview --policy-pack policy` takes: the servicer PolicyPack serves (a private
    class; PolicyPack itself would start a gRPC server), fed protobuf requests as the engine sends them."""
    saved = dict(pulumi_config.CONFIG.get())  # the servicer copies PULUMI_CONFIG into the global config
    try:
        servicer = _PolicyAnalyzerServicer("cloudstation", "0.1.0", rules.POLICIES, EnforcementLevel.MANDATORY)
        info = servicer.GetAnalyzerInfo(None, None)
        assert sorted(p.name for p in info.policies) == sorted(p.name for p in rules.POLICIES)
        servicer.Configure(proto.ConfigureAnalyzerRequest(policyConfig={
            "no-secrets-in-plain-config": proto.PolicyConfig(properties=struct({"projectDirectory": str(project_directory)})),
        }), None)
        diagnostics = []
        for r in as_stack.registrations:
            request = proto.AnalyzeRequest(urn=r.urn, type=r.type, name=r.name, properties=struct(r.inputs))
            diagnostics += servicer.Analyze(request, None).diagnostics
        resources = [proto.AnalyzerResource(urn=r.urn, type=r.type, name=r.name, properties=struct(r.inputs),
                                            parent=r.parent, dependencies=r.dependencies)
                     for r in as_stack.registrations]
        response = servicer.AnalyzeStack(proto.AnalyzeStackRequest(resources=resources), None)
        assert [d.message for d in [*diagnostics, *response.diagnostics]] == []
        assert list(response.not_applicable) == []
        # The same path reports a violation (the registry's probe removed).
        registry = next(r for r in as_stack.registrations if r.type == "kubernetes:apps/v1:Deployment"
                        and r.inputs["metadata"]["name"] == "registry") if as_stack.stack == "test" else None
        if registry is not None:
            inputs = json.loads(json.dumps(wire(registry.inputs)))
            del inputs["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
            request = proto.AnalyzeRequest(urn=registry.urn, type=registry.type, name=registry.name,
                                           properties=struct(inputs))
            [diagnostic] = servicer.Analyze(request, None).diagnostics
            assert diagnostic.policyName == "health-probes" and "needs a readinessProbe" in diagnostic.message
    finally:
        pulumi_config.CONFIG.get().clear()
        pulumi_config.CONFIG.get().update(saved)


def test_the_rules_see_what_they_check(as_stack):
    """Guards the pass above against rules that silently match nothing."""
    rendered = as_stack
    kinds = {kind for r in rendered.registrations for kind, _, _ in rules.pod_specs(r.type, r.inputs)}
    # Armada brings the Deployments, Jobs and CronJobs; the prod stack file runs none (one per cluster).
    with_armada = armada_variants.config_of(rendered).platform.armada.enabled
    assert kinds >= {"StatefulSet", "StatefulService"} | ({"Deployment", "Job", "CronJob"} if with_armada else set())
    found, unknown = rules.stack_objects(StackValidationArgs([
        PolicyResource(r.type, r.inputs, r.urn, r.name, options(), None, None, [], {}) for r in rendered.registrations
    ]))
    objects = [o for _, o in found]
    assert unknown == 0
    namespaces = [o for o in rendered.manifests() if o["kind"] == "Namespace"]
    assert sum(o["kind"] == "Namespace" for o in objects) == len(namespaces) >= 2  # platform + project at least
    assert any(o["kind"] == "Service" and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "registry"
               for o in objects) == (rendered.stack == "test")


def test_the_policies_are_mandatory_and_uniquely_named():
    assert len({p.name for p in rules.POLICIES}) == len(rules.POLICIES) == 10
    assert {p.enforcement_level for p in rules.POLICIES} == {rules.MANDATORY}
    assert rules.PROJECT == stack_config.PROJECT


# --- bad examples -------------------------------------------------------------------------------


def container(name: str = "app", image: str = "docker.io/library/nginx:1.27.3", **extra) -> dict:
    """A container that meets every rule unless `extra` overrides a part."""
    return {
        "name": name,
        "image": image,
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}},
        **extra,
    }


def deployment(*containers: dict, name: str = "web", namespace: str = "apps", labels: Optional[dict] = None,
               **pod) -> tuple[str, dict]:
    labels = labels or {"app": name}
    return "kubernetes:apps/v1:Deployment", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": list(containers), **pod}}},
    }


def stateful_service(*containers: dict, **spec) -> tuple[str, dict]:
    return "kubernetes:cloudstate.io/v1alpha1:StatefulService", {
        "apiVersion": "cloudstate.io/v1alpha1", "kind": "StatefulService",
        "metadata": {"name": "shop-cart", "namespace": "shop-test"},
        "spec": {"containers": list(containers),
                 "sidecarResources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
                 **spec},
    }


def test_good_examples_pass():
    """The bad examples below differ from these in one part each."""
    for type_, props in [deployment(container()), stateful_service(container(image=f"localhost:32000/shop/cart@{DIGEST}"))]:
        for policy in RESOURCE_POLICIES:
            assert check_resource(policy, type_, props) == [], policy.name


def test_restricted_pod_security_rejects_privileged_pods():
    bad = container(securityContext={"privileged": True, "runAsUser": 0})
    violations = check_resource(rules.restricted_pod_security, *deployment(bad, hostNetwork=True))
    for fragment in ("hostNetwork", "privileged", "allowPrivilegeEscalation", "drop ALL", "runAsNonRoot", "runAsUser 0"):
        assert any(fragment in v for v in violations), fragment
    entity = container(image=f"localhost:32000/shop/cart@{DIGEST}", securityContext={})
    assert check_resource(rules.restricted_pod_security, *stateful_service(entity))


def test_container_resources_rejects_missing_limits_and_sidecar_resources():
    bad = container(resources={"requests": {"cpu": "10m", "memory": "16Mi"}})
    violations = check_resource(rules.container_resources, *deployment(bad))
    assert violations == ["Deployment apps/web container app: no cpu limit", "Deployment apps/web container app: no memory limit"]
    type_, entity = stateful_service(container(image=f"localhost:32000/shop/cart@{DIGEST}"))
    del entity["spec"]["sidecarResources"]
    assert any("cloudstate-sidecar" in v for v in check_resource(rules.container_resources, type_, entity))


def test_health_probes_rejects_known_images_without_their_probes():
    registry = container("registry", versions.image("registry"),
                         readinessProbe={"httpGet": {"path": "/v2/", "port": 5000}})
    assert check_resource(rules.health_probes, *deployment(registry)) == [
        "Deployment apps/web container registry: readinessProbe must request /debug/health, not '/v2/'",
        "Deployment apps/web container registry: needs a livenessProbe",
    ]
    mirrored_server = container("server", versions.image("armada-server", "mirror.example:5000/hub"),
                                readinessProbe={"tcpSocket": {"port": 8080}}, livenessProbe={"tcpSocket": {"port": 8080}})
    assert check_resource(rules.health_probes, *deployment(mirrored_server)) == [
        "Deployment apps/web container server: needs a readinessProbe (httpGet)"]
    type_, postgres = deployment(container("postgres", versions.image("postgres")))
    postgres["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["pg_isready"]}}
    assert check_resource(rules.health_probes, "kubernetes:apps/v1:StatefulSet", {**postgres, "kind": "StatefulSet"}) \
        == ["StatefulSet apps/web container postgres: needs a livenessProbe"]
    # Run-to-completion pods and images without an endpoint need none.
    migration = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate", "namespace": "a"},
                 "spec": {"template": {"spec": {"containers": [container("m", versions.image("armada-lookout"))]}}}}
    assert check_resource(rules.health_probes, "kubernetes:batch/v1:Job", migration) == []
    assert check_resource(rules.health_probes, *deployment(container("i", versions.image("armada-event-ingester")))) == []


def test_every_pinned_image_has_a_health_endpoint_decision():
    """A new platform image must be classified: health endpoint, none, or not a platform workload."""
    not_platform_workloads = ("cloudstate-proxy-", "node-cloudstate", "maven", "java-runtime")  # sidecars, build bases
    undecided = [
        name for name, ref in versions.IMAGES.items()
        if not name.startswith(not_platform_workloads)
        and checks.health_endpoint(ref) is None
        and not checks.image_repository(ref).endswith(tuple("/" + r for r in checks.NO_HEALTH_ENDPOINT))
    ]
    assert undecided == []


def test_no_mutable_image_tags_rejects_latest_floating_and_missing_tags():
    bad = [container("a", "nginx:latest"), container("b", "docker.io/library/redis"), container("c", "redis:alpine"),
           container("d", "localhost:32000/shop/cart")]
    violations = check_resource(rules.no_mutable_image_tags, *deployment(*bad))
    assert [v.split(":", 1)[0] for v in violations] == [f"Deployment apps/web container {n}" for n in "abcd"]
    # An image built during `up` is unknown in preview: checked then, not reported now.
    built = container("e", image=UNKNOWN_STRING_VALUE)
    assert check_resource(rules.no_mutable_image_tags, *stateful_service(built)) == []


def test_digest_pinned_images_rejects_tag_only_entities_and_builds_in_prod(engine_env):
    engine_env("test", {"cloudstation:environment": "test"})
    entity = container(image="localhost:32000/shop/cart:04077a2e")
    assert check_resource(rules.digest_pinned_images, *stateful_service(entity))
    platform = deployment(container(image=versions.TAGS["redis"]))  # a platform pin by tag only
    assert check_resource(rules.digest_pinned_images, *platform, {"requirePlatformDigestsInProd": True}) == []
    build = ("docker:index/image:Image", {"imageName": "localhost:32000/shop/cart:1"})
    assert check_resource(rules.digest_pinned_images, *build) == []

    engine_env("prod", {"cloudstation:environment": "prod"})
    assert check_resource(rules.digest_pinned_images, *build)
    assert check_resource(rules.digest_pinned_images, *platform) == []
    assert check_resource(rules.digest_pinned_images, *platform, {"requirePlatformDigestsInProd": True})


def test_secret_env_from_secrets_rejects_literal_credentials():
    bad = container(env=[{"name": "DB_PASSWORD", "value": "hunter2"}, {"name": "API_TOKEN", "value": "x"},
                         {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}])
    violations = check_resource(rules.secret_env_from_secrets, *stateful_service(bad))
    assert len(violations) == 2 and "DB_PASSWORD" in violations[0] and "API_TOKEN" in violations[1]


def configmap(data: dict) -> tuple[str, dict]:
    return "kubernetes:core/v1:ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "app", "namespace": "apps"}, "data": data}


@pytest.mark.parametrize("data", [
    {"DB_PASSWORD": "hunter2"},
    {"config.yml": "redis:\n  addr: redis:6379\n  password: hunter2\n"},
    {"application.conf": 'db {\n  user = "app"\n  client-secret = "s3cr3t"\n}\n'},
    {"settings.json": '{"apiKey": "abc123", "region": "eu"}'},
    {"tls.pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n"},
    {"DATABASE_URL": "postgres://app:hunter2@db:5432/app"},
    {"users": "cloudstation:$2y$10$" + "a" * 53},
], ids=["key", "yaml", "hocon", "json", "pem", "url", "bcrypt"])
def test_no_secrets_in_configmaps_rejects_credentials(data):
    assert check_resource(rules.no_secrets_in_configmaps, *configmap(data))


def test_no_secrets_in_configmaps_allows_references_to_credentials():
    data = {"config.yml": "auth:\n  htpasswd:\n    path: /auth/htpasswd\n  passwordFile: /run/secrets/pw\n"
                          "password: ${?POSTGRES_PASSWORD}\ntoken:\n",
            "DATABASE_URL": "postgres://db:5432/app"}
    assert check_resource(rules.no_secrets_in_configmaps, *configmap(data)) == []


def write_stack_file(directory: Path, stack: str, config: dict) -> dict[str, str]:
    """A stack file and the config the engine would pass for it (secure values decrypted)."""
    (directory / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    return {k: ("decrypted" if isinstance(v, dict) and "secure" in v else v if isinstance(v, str) else json.dumps(v))
            for k, v in config.items()}


def test_no_secrets_in_plain_config_rejects_plain_credentials(tmp_path, engine_env):
    config = {
        "cloudstation:environment": "test",
        "cloudstation:registryPassword": "hunter2",
        "cloudstation:armadaQueueApiPassword": {"secure": "v1:abc"},
        "cloudstation:platform": {"stores": {"postgres": {"mode": "external", "password": "hunter2",
                                                         "credentialsSecret": {"namespace": "db", "name": "pg"}}},
                                  "armada": {"redis": {"existingSecret": "redis", "passwordKey": "password"}},
                                  "registry": {"url": "https://ci:hunter2@registry.example.com"}},
    }
    engine_env("test", write_stack_file(tmp_path, "test", config))
    violations = check_stack(rules.no_secrets_in_plain_config, [], {"projectDirectory": str(tmp_path)})
    assert sorted(v.split(":", 2)[1].split(" ")[0] for v in violations) == [
        "platform.registry.url", "platform.stores.postgres.password", "registryPassword"]


def test_no_secrets_in_plain_config_covers_the_programs_secure_keys():
    assert all(checks.is_credential_name(key) for key in stack_config.SECRET_KEYS)


def test_no_secrets_in_plain_config_needs_the_stack_file(tmp_path, engine_env):
    engine_env("test", {"cloudstation:registryPassword": "hunter2"})
    with pytest.raises(_NotApplicableError):
        check_stack(rules.no_secrets_in_plain_config, [], {"projectDirectory": str(tmp_path)})


def registry_graph(service_type: str = "NodePort", **service_spec) -> list[tuple[str, dict]]:
    """A registry Deployment, an unlabelled Service selecting it and an Ingress routing to it."""
    labels = {"app": "images"}
    return [
        deployment(container("registry", versions.image("registry")), name="images", namespace="ops", labels=labels),
        ("kubernetes:core/v1:Service", {"metadata": {"name": "images", "namespace": "ops"},
                                        "spec": {"type": service_type, "selector": labels, **service_spec}}),
    ]


def ingress(service: str) -> tuple[str, dict]:
    return "kubernetes:networking.k8s.io/v1:Ingress", {
        "metadata": {"name": "images", "namespace": "ops"},
        "spec": {"rules": [{"host": "images.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 5000}}}}]}}]},
    }


def test_registry_not_exposed_rejects_load_balancers_and_ingresses():
    policy = rules.registry_not_exposed
    assert check_stack(policy, registry_graph()) == []
    assert check_stack(policy, registry_graph() + [ingress("other")]) == []
    assert len(check_stack(policy, registry_graph("LoadBalancer"))) == 1
    assert len(check_stack(policy, registry_graph() + [ingress("images")])) == 1
    allowed = {"allowRegistryExposure": True}
    assert check_stack(policy, registry_graph("LoadBalancer", loadBalancerSourceRanges=["10.0.0.0/8"]), allowed) == []
    assert check_stack(policy, registry_graph() + [ingress("images")], allowed) == []
    assert len(check_stack(policy, registry_graph("LoadBalancer", loadBalancerSourceRanges=["0.0.0.0/0"]), allowed)) == 1


def test_registry_not_exposed_catches_the_stacks_own_exposure_keys(engine_env):
    """The test stack with platform.registry.loadBalancer and .ingress set, rendered by the program."""
    stack_file = render.StackFile.read("test")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["registry"].update(loadBalancer=True, loadBalancerSourceRanges=["192.0.2.0/24"],
                                ingress={"host": "registry.example.com", "controllerNamespace": "ingress-nginx"})
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    exposed = render.render("test", stack_file=stack_file)
    resources = [(r.type, r.inputs) for r in exposed.registrations]
    violations = check_stack(rules.registry_not_exposed, resources)
    assert sorted(v.split(" ", 1)[0] for v in violations) == ["Ingress", "Service"]
    assert check_stack(rules.registry_not_exposed, resources, {"allowRegistryExposure": True}) == []


def namespace(name: str) -> tuple[str, dict]:
    return "kubernetes:core/v1:Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def network_policy(name: str, spec: dict, namespace_: str = "apps") -> tuple[str, dict]:
    return "kubernetes:networking.k8s.io/v1:NetworkPolicy", {
        "metadata": {"name": name, "namespace": namespace_}, "spec": spec}


DEFAULT_DENY = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
DNS = {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}
WEB_INGRESS = {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]},
               "policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": 8080, "protocol": "TCP"}]}]}


def test_namespace_network_policies_reject_namespaces_without_default_deny_or_allows():
    policy = rules.namespace_network_policies
    web = deployment(container())
    assert check_stack(policy, [namespace("apps"), web, network_policy("deny", DEFAULT_DENY),
                                network_policy("dns", DNS), network_policy("web", WEB_INGRESS)]) == []
    assert check_stack(policy, [namespace("apps")]) == [
        "namespace apps: no default-deny NetworkPolicy (podSelector {}, policyTypes [Ingress, Egress], no rules)"]
    # Deny-all for one direction only, or with a rule, is not a default deny.
    for not_deny in ({**DEFAULT_DENY, "policyTypes": ["Ingress"]}, {**DEFAULT_DENY, "egress": [{}]}):
        assert check_stack(policy, [namespace("apps"), network_policy("deny", not_deny)])
    # A default deny elsewhere does not count; DNS alone is no allow of the workload's flows.
    assert len(check_stack(policy, [namespace("apps"), network_policy("deny", DEFAULT_DENY, "other")])) == 1
    assert check_stack(policy, [namespace("apps"), web, network_policy("deny", DEFAULT_DENY),
                                network_policy("dns", DNS)]) == [
        "Deployment apps/web: no NetworkPolicy allows any of its flows beyond DNS"]


def test_values_unknown_in_preview_are_skipped_not_reported():
    """In preview a workload's spec or an object's namespace may be unknown; `up` checks them."""
    type_, unknown_spec = deployment(container())
    unknown_spec["spec"]["template"] = UNKNOWN_STRING_VALUE
    for policy in RESOURCE_POLICIES:
        assert check_resource(policy, type_, unknown_spec) == [], policy.name
    unknown_namespace = network_policy("deny", DEFAULT_DENY, UNKNOWN_STRING_VALUE)
    with pytest.raises(_NotApplicableError):
        check_stack(rules.namespace_network_policies, [namespace("apps"), unknown_namespace])


def test_the_ci_policy_config_matches_the_policies_schemas():
    """policy/config.json (for `--policy-pack-config` / pulumi/actions `policyPackConfigs`) sets
    only properties the policies declare, with their types."""
    config = json.loads((ROOT / "policy" / "config.json").read_text())
    schemas = {p.name: p.config_schema.properties for p in rules.POLICIES if p.config_schema}
    types = {"boolean": bool, "string": str}
    for policy, properties in config.items():
        for key, value in properties.items():
            assert isinstance(value, types[schemas[policy][key]["type"]]), f"{policy}.{key}"
    assert config["registry-not-exposed"]["allowRegistryExposure"] is False
