"""The policy pack (policy/rules.py), run offline: every rule on the rendered graph of both stack
files and of prod on a cluster of its own (its prod-size Armada, tests/stacks/), as the
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

from components import cloudstate_operator as operator
from infra import config as stack_config, image_pins, versions
from cloudstation_tools import checks, render
from cloudstation_tools.policy_offline import check_resource, check_stack, engine_props, options  # noqa: F401
from policy import rules
from tests import stacks
from tests.conftest import ROOT

DIGEST = "sha256:" + "ab" * 32
RESOURCE_POLICIES = [p for p in rules.POLICIES if not isinstance(p, StackValidationPolicy)]
STACK_POLICIES = [p for p in rules.POLICIES if isinstance(p, StackValidationPolicy)]


# --- calling policies the way the engine does (cloudstation_tools/policy_offline.py, shared with `check`) ----------

@pytest.fixture
def engine_env(monkeypatch):
    """Sets the stack config and name the engine passes to the pack."""

    def set_stack(stack: str, values: dict[str, str]) -> None:
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(values))
        monkeypatch.setenv("PULUMI_STACK", stack)

    return set_stack


@pytest.fixture(params=["test", "prod", stacks.OWN_CLUSTER])
def as_stack(request, rendered_stacks, engine_env):
    """Each stack file, and prod on a cluster of its own, with its config passed as the engine would."""
    name = request.param
    rendered = rendered_stacks[name] if name in rendered_stacks else stacks.rendered(name)
    engine_env(rendered.stack, stacks.stack_file(name).values)
    return rendered


@pytest.fixture
def project_directory(as_stack, rendered_stacks, tmp_path) -> Path:
    """Where the pack finds `as_stack`'s stack file: the fixture pair's (prod promoted) or a variant's, written out."""
    if as_stack is rendered_stacks.get(as_stack.stack):
        stacks.write_pair(tmp_path)
        return tmp_path
    stacks.write_stack_file(stacks.OWN_CLUSTER, tmp_path)
    return tmp_path


# --- our stacks pass ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", RESOURCE_POLICIES, ids=lambda p: p.name)
def test_every_resource_of_both_stacks_passes(as_stack, policy):
    # Platform images without a digest record pass only because each stack names them in
    # platform.images.allowUnpinned (prod on its own cluster: tests/stacks.py).
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
    with_armada = stacks.config_of(rendered).platform.armada.enabled
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
    assert len({p.name for p in rules.POLICIES}) == len(rules.POLICIES) == 14
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
    """A StatefulService whose pods' proxy (its annotation, infra/image_pins.py) is a pin by digest."""
    proxy = f"{versions.TAGS['cloudstate-proxy-postgres']}@{DIGEST}"
    return "kubernetes:cloudstate.io/v1alpha1:StatefulService", {
        "apiVersion": "cloudstate.io/v1alpha1", "kind": "StatefulService",
        "metadata": {"name": "shop-cart", "namespace": "shop-test", "annotations": {image_pins.PROXY_ANNOTATION: proxy}},
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


def test_the_pod_security_levels_differ_as_the_standards_do():
    """checks.pod_security_violations is the policy pack's and `check`'s model of Pod Security admission,
    offline; the end-to-end tier holds it to the real admission (e2e/test_security.py)."""
    def pod(security_context: dict, **spec) -> dict:
        return {"containers": [container(securityContext=security_context)], **spec}

    root_pod = pod({"capabilities": {"add": ["CHOWN", "SETUID"]}, "readOnlyRootFilesystem": False})
    assert checks.pod_security_violations("p", root_pod, "baseline") == []
    restricted = checks.pod_security_violations("p", root_pod, "restricted")
    assert any("runAsNonRoot" in p for p in restricted) and any("CHOWN" in p for p in restricted)
    unconfined = pod({"seccompProfile": {"type": "Unconfined"}})
    assert any("Unconfined" in p for p in checks.pod_security_violations("p", unconfined, "baseline"))
    assert any("NET_RAW" in p for p in checks.pod_security_violations("p", pod({"capabilities": {"add": ["NET_RAW"]}}), "baseline"))
    assert any("hostPID" in p for p in checks.pod_security_violations("p", pod({}, hostPID=True), "baseline"))
    assert checks.pod_security_violations("p", pod({}, hostPID=True), "privileged") == []
    with pytest.raises(ValueError, match="one of"):
        checks.pod_security_violations("p", pod({}), "strict")


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
    assert check_resource(rules.health_probes, *deployment(container("c", versions.image("cloudstate-operator")))) == []
    # The ingesters serve only /metrics, and are probed there (components/armada/workload.py).
    for ingester in ("armada-scheduler-ingester", "armada-lookout-ingester", "armada-event-ingester"):
        assert check_resource(rules.health_probes, *deployment(container("i", versions.image(ingester)))) == [
            "Deployment apps/web container i: needs a readinessProbe (httpGet)",
            "Deployment apps/web container i: needs a livenessProbe",
        ], ingester
        health = container("i", versions.image(ingester), readinessProbe={"httpGet": {"path": "/health", "port": 9000}},
                           livenessProbe={"httpGet": {"path": "/metrics", "port": 9000}})
        assert check_resource(rules.health_probes, *deployment(health)) == [
            "Deployment apps/web container i: readinessProbe must request /metrics, not '/health'"], ingester


def test_every_pinned_image_has_a_health_endpoint_decision():
    """A new platform image must be classified: health endpoint, none, or not a platform workload."""
    not_platform_workloads = ("cloudstate-proxy-", "node-cloudstate", "node-test", "maven", "java-runtime")  # sidecars, build bases
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
    platform = deployment(container(image=versions.image("redis")))
    assert check_resource(rules.digest_pinned_images, *platform) == []
    build = ("docker:index/image:Image", {"imageName": "localhost:32000/shop/cart:1"})
    assert check_resource(rules.digest_pinned_images, *build) == []

    in_cluster = ("pulumi-python:dynamic/builds:EntityBuild", {"repository": "shop/cart", "contentTag": "1"})
    assert check_resource(rules.digest_pinned_images, *in_cluster) == []

    engine_env("prod", {"cloudstation:environment": "prod"})
    assert check_resource(rules.digest_pinned_images, *build)
    assert check_resource(rules.digest_pinned_images, *in_cluster)  # docs/builds.md: prod never builds


@pytest.mark.parametrize("image", [
    f"localhost:32000/shop/cart@{DIGEST}\n",                 # a trailing newline (`$` would accept it)
    f"localhost:32000/shop/cart:v\u0661@{DIGEST}",           # a non-ASCII digit in the tag (`\w` would)
    f"localhost:32000/shop/cart@{DIGEST.upper()}",            # upper-case hex
    f"localhost:32000/shop/cart@{DIGEST}0",                   # 65 hex digits
    f"evil image localhost:32000/shop/cart@{DIGEST}",         # something before the reference
], ids=["newline", "non-ascii-tag", "upper-hex", "long-digest", "prefix"])
def test_digest_references_are_matched_whole_and_in_ascii(image):
    """The digest pattern of infra/image_refs.py (the repository's one), matched whole."""
    assert check_resource(rules.digest_pinned_images, *stateful_service(container(image=image)))
    assert not checks.is_digest_pinned(image)
    assert checks.is_digest_pinned(f"localhost:32000/shop/cart:v1@{DIGEST}")


def platform_pins() -> list[tuple[str, str, str]]:
    """(name, pin, the pin as a tag only) of every infra/versions.py image, read now: the rule
    follows whatever the pins say (with or without digests recorded)."""
    return [(name, pin, pin.split("@", 1)[0]) for name, pin in versions.IMAGES.items()]


def test_platform_images_by_digest_follows_the_pins(engine_env):
    policy = rules.platform_images_by_digest
    for stack in ("prod", "test"):  # the stack that owns the cluster too (issue 20 finding 6)
        engine_env(stack, {"cloudstation:environment": stack})
        for name, pin, tag_only in platform_pins():
            digest = checks.image_digest(pin) or DIGEST
            good = f"{tag_only}@{digest}"
            assert check_resource(policy, *deployment(container(image=good))) == [], name
            mirrored = "mirror.example:5000/hub/" + good.split("/", 1)[1]
            assert check_resource(policy, *deployment(container(image=mirrored))) == [], name
            [violation] = check_resource(policy, *deployment(container(image=tag_only)))
            assert "is not pinned by digest" in violation and pin in violation, name
            assert "`python -m infra pin-images --missing`" in violation and f"list {name} in" in violation
            if checks.image_digest(pin):  # another digest than the pin's is not the pinned image
                other = f"{tag_only}@sha256:{'0' * 64}"
                assert "is not the digest" in check_resource(policy, *deployment(container(image=other)))[0]
        # Entities and images the pins do not name are other rules' business.
        assert check_resource(policy, *stateful_service(container(image="localhost:32000/shop/cart:1"))) == []


def test_platform_images_by_digest_accepts_a_tag_only_for_the_pins_the_stack_names(engine_env):
    """platform.images.allowUnpinned (a lab cluster's opt-out, validated by the config) lets exactly
    the named pins run by their tag, and only while they have no digest record."""
    policy = rules.platform_images_by_digest
    unrecorded = [n for n in versions.TAGS if not versions.has_digest(n)]
    recorded = [n for n in versions.TAGS if versions.has_digest(n)]
    assert unrecorded and recorded
    first, *others = unrecorded
    engine_env("test", {"cloudstation:environment": "test",
                        "cloudstation:platform": json.dumps({"images": {"allowUnpinned": [first, recorded[0]]}})})
    assert check_resource(policy, *deployment(container(image=versions.TAGS[first]))) == []
    for name in [*others, recorded[0]]:
        assert check_resource(policy, *deployment(container(image=versions.TAGS[name]))), name


def proxy_service(proxy: Optional[str]) -> tuple[str, dict]:
    """A StatefulService whose pods' proxy is `proxy` (its annotation; None: not annotated)."""
    type_, props = stateful_service(container(image=f"localhost:32000/shop/cart@{DIGEST}"))
    props["metadata"].pop("annotations", None)
    if proxy is not None:
        props["metadata"]["annotations"] = {image_pins.PROXY_ANNOTATION: proxy}
    return type_, props


def test_platform_images_by_digest_sees_the_proxies_and_the_build_pods(engine_env):
    """What the program's pods run without a rendered pod: the proxies the operator's ConfigMap names
    and each StatefulService's pods run (its annotation), and the in-cluster build pods (each
    EntityBuild's Armada job item)."""
    policy = rules.platform_images_by_digest
    engine_env("prod", {"cloudstation:environment": "prod"})
    tag_only = versions.TAGS["cloudstate-proxy-postgres"]
    [violation] = check_resource(policy, *proxy_service(tag_only))
    assert violation.startswith("StatefulService shop-test/shop-cart pods' akka-sidecar: platform image")
    assert "is not pinned by digest" in violation
    assert check_resource(policy, *proxy_service(f"{tag_only}@{DIGEST}")) == []
    [violation] = check_resource(policy, *proxy_service(None))
    assert f"names no proxy image (annotation {image_pins.PROXY_ANNOTATION})" in violation
    config_map = "kubernetes:core/v1:ConfigMap", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": image_pins.OPERATOR_CONFIG_MAP, "namespace": "cs"},
        "data": {"config": operator.operator_config(["shop-test"], {k: versions.TAGS[n] for k, n in operator.PROXY_IMAGES.items()})}}
    violations = check_resource(policy, *config_map)
    assert sorted(v.split(": ", 1)[0] for v in violations) == [
        f"ConfigMap cs/{image_pins.OPERATOR_CONFIG_MAP} proxy.image.{k}" for k in sorted(operator.PROXY_IMAGES)]
    config_map[1]["data"]["config"] = operator.operator_config(["shop-test"], {k: f"{versions.TAGS[n]}@{DIGEST}" for k, n in operator.PROXY_IMAGES.items()})
    assert check_resource(policy, *config_map) == []
    job_item = {"namespace": "cloudstation-build", "podSpec": {
        "initContainers": [container("fetch", versions.image("build-fetch"))],
        "containers": [container("build", versions.TAGS["kaniko"])]}}
    build = "pulumi-python:dynamic/builds:EntityBuild", {"jobItem": json.dumps(job_item), "contentTag": "x"}
    [violation] = check_resource(policy, *build, name="shop-cart")
    assert violation.startswith("EntityBuild shop-cart (Armada job) container build: platform image") and "kaniko" in violation
    engine_env("test", {"cloudstation:environment": "test",
                        "cloudstation:platform": json.dumps({"images": {"allowUnpinned": ["kaniko"]}})})
    assert check_resource(policy, *build, name="shop-cart") == []


def test_prods_rule_sees_the_proxies_its_entity_pods_run(rendered_stacks, engine_env):
    """Prod runs no operator: its entity pods' proxies are the owner's, which each StatefulService
    names. Without its opt-out the rule reports exactly those (before, prod's render held no proxy
    image, so the rule could not fail)."""
    prod = rendered_stacks["prod"]
    values = dict(stacks.read("prod").values)
    platform = json.loads(values["cloudstation:platform"])
    del platform["images"]
    engine_env("prod", {**values, "cloudstation:platform": json.dumps(platform)})
    policy = rules.platform_images_by_digest
    violations = [v for r in prod.registrations for v in check_resource(policy, r.type, r.inputs, name=r.name)]
    services = [r for r in prod.registrations if r.type == "kubernetes:cloudstate.io/v1alpha1:StatefulService"]
    config = stacks.validate_config("prod")
    assert len(violations) == len(services) == 1 + sum(len(p.entities) for p in config.projects)  # project-state too
    for service, violation in zip(services, violations):
        meta = service.inputs["metadata"]
        assert violation.startswith(f"StatefulService {meta['namespace']}/{meta['name']} pods' akka-sidecar: platform "
                                    "image 'docker.io/cloudstateio/cloudstate-proxy-")


def test_the_prod_stack_runs_every_platform_image_by_digest(rendered_stacks, engine_env):
    """Guards the pass of both stacks against a rule that matches nothing: prod has platform images."""
    prod = rendered_stacks["prod"]
    engine_env("prod", {"cloudstation:environment": "prod"})
    images = [c["image"] for r in prod.registrations for _, _, spec in rules.pod_specs(r.type, r.inputs)
              for c in checks.all_containers(spec) if checks.platform_image(c["image"], versions.IMAGES)]
    assert images and all(checks.is_digest_pinned(i) for i in images)


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


NODE_PULL_SERVICE = {"type": "NodePort", "externalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 5000, "nodePort": 32000}]}
"""The registry Service as components/registry.py renders it (the documented node-pull NodePort)."""


def registry_graph(service_type: str = "NodePort", **service_spec) -> list[tuple[str, dict]]:
    """A registry Deployment and an unlabelled Service selecting it (by default the node-pull NodePort)."""
    labels = {"app": "images"}
    spec = {**NODE_PULL_SERVICE, "type": service_type, "selector": labels, **service_spec}
    return [
        deployment(container("registry", versions.image("registry")), name="images", namespace="ops", labels=labels),
        ("kubernetes:core/v1:Service", {"metadata": {"name": "images", "namespace": "ops"}, "spec": spec}),
    ]


def ingress(service: str) -> tuple[str, dict]:
    return "kubernetes:networking.k8s.io/v1:Ingress", {
        "metadata": {"name": "images", "namespace": "ops"},
        "spec": {"rules": [{"host": "images.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 5000}}}}]}}]},
    }


def route(kind: str, service: str, mirror: bool = False) -> tuple[str, dict]:
    """A Gateway API route sending (or, with `mirror`, mirroring) traffic to `service`."""
    ref = {"name": service, "port": 5000}
    rule = {"backendRefs": [{"name": "other", "port": 80}], "filters": [
        {"type": "RequestMirror", "requestMirror": {"backendRef": ref}}]} if mirror else {"backendRefs": [ref]}
    return f"kubernetes:gateway.networking.k8s.io/v1:{kind}", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
        "metadata": {"name": "images", "namespace": "ops"}, "spec": {"parentRefs": [{"name": "gw"}], "rules": [rule]},
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


@pytest.mark.parametrize("kind", checks.ROUTE_KINDS)
def test_registry_not_exposed_rejects_gateway_routes(kind):
    policy = rules.registry_not_exposed
    for exposing in (route(kind, "images"), route(kind, "images", mirror=True)):
        [violation] = check_stack(policy, registry_graph() + [exposing])
        assert violation.startswith(f"{kind} ops/images exposes the image registry")
        assert check_stack(policy, registry_graph() + [exposing], {"allowRegistryExposure": True}) == []
    assert check_stack(policy, registry_graph() + [route(kind, "other")]) == []


def test_registry_not_exposed_allows_exactly_the_documented_node_port():
    """The registry's NodePort is on purpose (nodes pull localhost:32000/…, docs/registry.md); any
    other NodePort or externalIPs is exposure, even with allowRegistryExposure."""
    policy = rules.registry_not_exposed
    assert check_stack(policy, registry_graph()) == []
    not_documented = {
        "another node port": {"ports": [{"name": "http", "port": 5000, "nodePort": 31000}]},
        "an allocated node port": {"ports": [{"name": "http", "port": 5000}]},
        "a second port": {"ports": [*NODE_PULL_SERVICE["ports"], {"name": "debug", "port": 5001, "nodePort": 32001}]},
        "cluster traffic policy": {"externalTrafficPolicy": "Cluster"},
    }
    for what, spec in not_documented.items():
        for config in ({}, {"allowRegistryExposure": True}):
            [violation] = check_stack(policy, registry_graph(**spec), config)
            assert "NodePort other than the documented node-pull one" in violation, what
    for service_type in ("ClusterIP", "NodePort"):
        [violation] = check_stack(policy, registry_graph(service_type, externalIPs=["192.0.2.10"]),
                                  {"allowRegistryExposure": True})
        assert "externalIPs" in violation
    # The exception follows the policy config (a stack that sets platform.registry.nodePort).
    moved = registry_graph(ports=[{"name": "http", "port": 5000, "nodePort": 31000}])
    assert check_stack(policy, moved, {"registryNodePort": 31000}) == []
    assert check_stack(policy, registry_graph(), {"registryNodePort": 31000})


def test_registry_not_exposed_catches_the_stacks_own_exposure_keys(engine_env):
    """The test stack with platform.registry.loadBalancer and .ingress set, rendered by the program."""
    stack_file = stacks.read("test")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["registry"].update(loadBalancer=True, loadBalancerSourceRanges=["192.0.2.0/24"],
                                ingress={"host": "registry.example.com", "controllerNamespace": "ingress-nginx"})
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    exposed = stacks.render("test", stack_file=stack_file)
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
               "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                                                         "ports": [{"port": 8080, "protocol": "TCP"}]}]}


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
    types = {"boolean": bool, "string": str, "integer": int}
    for policy, properties in config.items():
        for key, value in properties.items():
            assert isinstance(value, types[schemas[policy][key]["type"]]), f"{policy}.{key}"
    assert config["registry-not-exposed"]["allowRegistryExposure"] is False
    assert config["no-open-network-peers"]["allowAnyAddress"] is False
    # The NodePort exception is the registry's default node port (components/registry.py).
    from components.registry import RegistryConfig
    node_port = RegistryConfig.model_fields["node_port"].default
    assert config["registry-not-exposed"]["registryNodePort"] == rules.REGISTRY_NODE_PORT == node_port


# --- every kind with a pod spec, and failing closed ------------------------------------------------

PRIVILEGED = container("bad", securityContext={"privileged": True})


def with_pod_spec(kind: str, spec: dict) -> tuple[str, dict]:
    """An object of `kind` whose pod spec (where that kind keeps it) is `spec`."""
    template = {"metadata": {"labels": {"app": "x"}}, "spec": spec}
    groups = {"Pod": "core/v1", "PodTemplate": "core/v1", "ReplicationController": "core/v1", "Job": "batch/v1",
              "CronJob": "batch/v1"}
    body: dict = {"metadata": {"name": "x", "namespace": "apps"}}
    if kind == "Pod":
        body["spec"] = spec
    elif kind == "PodTemplate":
        body["template"] = template
    elif kind == "CronJob":
        body["spec"] = {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}
    else:
        body["spec"] = {"selector": {"matchLabels": {"app": "x"}}, "template": template}
    return f"kubernetes:{groups.get(kind, 'apps/v1')}:{kind}", body


@pytest.mark.parametrize("kind", checks.POD_SPEC_KINDS)
def test_every_kind_with_a_pod_spec_is_checked(kind):
    assert check_resource(rules.restricted_pod_security, *with_pod_spec(kind, {"containers": [container()]})) == []
    assert any("privileged" in v for v in check_resource(rules.restricted_pod_security,
                                                         *with_pod_spec(kind, {"containers": [PRIVILEGED]})))
    assert check_resource(rules.inspectable_resources, *with_pod_spec(kind, {"containers": [container()]})) == []
    # A pod spec missing where the kind keeps it is a violation, not a silent pass.
    type_, broken = with_pod_spec(kind, {"containers": [container()]})
    broken.pop("template" if kind == "PodTemplate" else "spec")
    [violation] = check_resource(rules.inspectable_resources, type_, broken)
    assert "no pod spec" in violation


@pytest.mark.parametrize("type_", [
    "kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v3:Chart", "kubernetes:helm.sh/v4:Chart",
    "kubernetes:helm.sh/v2:Chart", "kubernetes:yaml:ConfigFile", "kubernetes:yaml:ConfigGroup",
    "kubernetes:yaml/v2:ConfigFile", "kubernetes:yaml/v2:ConfigGroup", "kubernetes:kustomize:Directory",
    "kubernetes:kustomize/v2:Directory", "kubernetes:apps/v1:DeploymentPatch", "kubernetes:core/v1:PodPatch",
    "kubernetes:apps/v1:DeploymentList",
])
def test_inspectable_resources_fails_closed(type_):
    """Types whose objects the pack cannot see are violations (type tokens of the pinned SDK)."""
    token = type_.encode()
    sdk = Path(__import__("pulumi_kubernetes").__file__).parent
    assert any(token in path.read_bytes() for path in sdk.rglob("*.py")), f"{type_} is not a type of the SDK"
    [violation] = check_resource(rules.inspectable_resources, type_, {"values": {"x": 1}})
    assert violation.startswith(type_)
    # No other rule mistakes them for the objects they name.
    assert rules.kubernetes_object(type_, {"spec": {}}) is None


# --- baseline Pod Security Standard fields -----------------------------------------------------------


def test_restricted_pod_security_checks_the_baseline_fields():
    policy = rules.restricted_pod_security
    allowed = container(securityContext={**container()["securityContext"], "procMount": "Default",
                                         "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
                                         "appArmorProfile": {"type": "RuntimeDefault"},
                                         "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                        ports=[{"containerPort": 8080}])
    type_, good = deployment(allowed, securityContext={"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start",
                                                                    "value": "0"}],
                                                       "appArmorProfile": {"type": "Localhost",
                                                                           "localhostProfile": "p"}})
    good["spec"]["template"]["metadata"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/app": "runtime/default"}
    assert check_resource(policy, type_, good) == []

    context = {**container()["securityContext"], "procMount": "Unmasked",
               "seLinuxOptions": {"type": "spc_t", "user": "root", "role": "sysadm_r"},
               "appArmorProfile": {"type": "Unconfined"}, "windowsOptions": {"hostProcess": True},
               "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    bad = container(securityContext=context, ports=[{"containerPort": 80, "hostPort": 80}],
                    readinessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}})
    debug = container("debug")
    del debug["resources"]  # ephemeral containers take no resources; they are checked all the same
    debug["securityContext"] = {}
    type_, pod = deployment(
        bad, hostPID=True, hostIPC=True, hostNetwork=True, ephemeralContainers=[debug],
        volumes=[{"name": "root", "hostPath": {"path": "/"}}],
        securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}], "seccompProfile": {"type": "Unconfined"},
                         "seLinuxOptions": {"type": "unconfined_t"}})
    pod["spec"]["template"]["metadata"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/app": "unconfined"}
    violations = "\n".join(check_resource(policy, type_, pod))
    for fragment in ("procMount 'Unmasked'", "seLinuxOptions.type 'spc_t'", "seLinuxOptions.user",
                     "seLinuxOptions.role", "pod seLinuxOptions" if False else "web: seLinuxOptions.type 'unconfined_t'",
                     "appArmorProfile.type 'Unconfined'", "apparmor.security.beta.kubernetes.io/app='unconfined'",
                     "sysctl 'kernel.msgmax'", "hostPort 80", "volume root is a hostPath", "hostPID", "hostIPC",
                     "hostNetwork", "adds capabilities ['SYS_ADMIN']", "windowsOptions.hostProcess",
                     "pod seccompProfile 'Unconfined'", "readinessProbe httpGet sets host",
                     "container debug: allowPrivilegeEscalation"):
        assert fragment in violations, fragment


# --- credentials on command lines ------------------------------------------------------------------


@pytest.mark.parametrize("extra", [
    {"args": ["--password=hunter2"]},
    {"args": ["--db-password", "hunter2"]},
    {"command": ["redis-server", "--requirepass", "hunter2"]},
    {"command": ["sh", "-c", "PGPASSWORD=hunter2 psql -h db"]},
    {"command": ["sh", "-c", "export API_TOKEN=abc123 && run"]},
    {"args": ["--url", "postgres://app:hunter2@db:5432/app"]},
    {"args": ["--key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"]},
    {"livenessProbe": {"exec": {"command": ["check", "--token", "abc123"]}}},
    {"lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "curl -u admin:x https://h --password=s3cr3t"]}}}},
], ids=["flag=", "flag value", "requirepass", "shell assignment", "export", "url", "pem", "probe", "hook"])
def test_no_secrets_in_arguments_rejects_literal_credentials(extra):
    violations = check_resource(rules.no_secrets_in_arguments, *deployment(container(**extra)))
    assert violations and all("pass it from a Secret" in v for v in violations)


def test_no_secrets_in_arguments_allows_references_to_credentials():
    good = container(command=["sh", "-c", 'PGPASSWORD="$DB_PASSWORD" psql -h db; redis-cli --pass "${REDIS_PW}"'],
                     args=["--password=$(DB_PASSWORD)", "--password-file", "/run/secrets/pw", "--token-ttl", "5m",
                           "--secret-name", "db", "--no-password", "--verbose", "postgres://db:5432/app"],
                     env=[{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}])
    assert check_resource(rules.no_secrets_in_arguments, *deployment(good)) == []


# --- floating tags -----------------------------------------------------------------------------------


@pytest.mark.parametrize("image, floating", [
    ("docker.io/library/postgres:16", True),              # a major line
    ("docker.io/library/postgres:16-alpine", True),
    ("docker.io/library/postgres:16.6-alpine3.21", False),  # PostgreSQL's releases have two numbers
    ("docker.io/library/redis:7.4", True),
    ("docker.io/library/redis:7.4-alpine", True),
    ("docker.io/library/redis:7.4.11-bookworm", False),
    ("nginx:1.27", True),
    ("nginx:1.27.3", False),
    ("ghcr.io/org/tool:v1.2.3", False),
    ("eclipse-temurin:17.0.20_8-jre-alpine-3.24", False),
    ("localhost:32000/shop/cart:04077a2e", True),          # a content hash is no version: needs its digest
    (f"localhost:32000/shop/cart:04077a2e@{DIGEST}", False),
    (f"docker.io/library/postgres:16@{DIGEST}", False),    # a digest pins whatever the tag says
    ("redis:stable", True),
    ("redis:1.2.3\n", True),                               # matched whole
    ("redis:1.2.\u0663", True),                            # ASCII only
])
def test_no_mutable_image_tags_defines_floating(image, floating):
    assert bool(check_resource(rules.no_mutable_image_tags, *deployment(container(image=image)))) is floating


def test_every_pin_is_an_exact_version():
    assert [name for name, ref in versions.IMAGES.items() if checks.floating_tag_problem(ref.split("@")[0])] == []


# --- NetworkPolicy peers -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [
    {"policyTypes": ["Ingress"], "ingress": [{}]},
    {"policyTypes": ["Ingress"], "ingress": [{"from": [], "ports": [{"port": 80}]}]},
    {"policyTypes": ["Egress"], "egress": [{"ports": [{"port": 443}]}]},
    {"policyTypes": ["Egress"], "egress": [{"to": [{}], "ports": [{"port": 443}]}]},
    {"policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}]},
    {"policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "::/0", "except": ["10.0.0.0/8"]}}]}]},
    {"policyTypes": ["Ingress"], "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": 80}]}]},
    {"policyTypes": ["Ingress"], "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {}}]}]},
], ids=["rule {}", "from []", "no to", "peer {}", "0.0.0.0/0", "::/0", "every namespace", "every pod"])
def test_no_open_network_peers_rejects_rules_open_to_every_peer(spec):
    policy = rules.no_open_network_peers
    assert check_resource(policy, *network_policy("open", {"podSelector": {}, **spec}))


def test_no_open_network_peers_allows_named_peers_and_the_opt_in():
    policy = rules.no_open_network_peers
    for spec in (DEFAULT_DENY, WEB_INGRESS, {**WEB_INGRESS, "ingress": [{"from": [
            {"podSelector": {}}, {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}},
            {"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 8080}]}]}):
        assert check_resource(policy, *network_policy("ok", spec)) == []
    every = {"podSelector": {}, "policyTypes": ["Egress"],
             "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"namespaceSelector": {}}], "ports": [{"port": 443}]}]}
    assert len(check_resource(policy, *network_policy("any", every))) == 2
    assert check_resource(policy, *network_policy("any", every), {"allowAnyAddress": True}) == []
    # The opt-in never admits a rule without peers.
    assert check_resource(policy, *network_policy("open", {"podSelector": {}, "ingress": [{}]}), {"allowAnyAddress": True})


# --- the pack runs in its own virtualenv -----------------------------------------------------------------


def test_the_pack_imports_only_what_its_virtualenv_has():
    """policy/PulumiPolicy.yaml runs the pack in policy/.venv (policy/requirements.txt): rules.py and
    what it imports from infra/ must not need the program's dependencies."""
    import subprocess
    import sys

    allowed = {line.split("==")[0].lower().replace("-", "_")
               for line in (ROOT / "policy" / "requirements.txt").read_text().splitlines()
               if line and not line.startswith("#")}
    assert allowed == {"pulumi", "pulumi_policy", "pyyaml"}
    blocked = ["pydantic", "pulumi_kubernetes", "pulumi_docker", "pulumi_random", "ruamel", "boto3", "components"]
    script = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        f"    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}: raise ImportError('not in policy/.venv: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import policy.rules\n"
        "print(len(policy.rules.POLICIES))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(len(rules.POLICIES))
