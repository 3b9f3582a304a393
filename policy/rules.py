"""The CloudStation policy pack's rules (CrossGuard, `pulumi_policy`).

Each rule applies a pure check of infra/checks.py (the same checks tests/test_standards.py runs on
the rendered graph) to the engine's view of the resources: `props` are the camelCase inputs, wrapped
in a proxy that raises UnknownValueError on values not known during preview. `plain()` turns them
into ordinary dicts with unknowns marked, so a rule skips only what it cannot see yet; `pulumi up`
runs every rule again with all values known.

Stack config reaches a policy pack as the PULUMI_CONFIG environment variable (decrypted), and the
stack's name as PULUMI_STACK; which keys are `secure:` only the stack file says.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Iterator, Optional

import pulumi.runtime
import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_BOOLEAN_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
    UnknownValueError,
)

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra import checks  # noqa: E402  (the repo root is on the path only from here on)

PROJECT = "cloudstation"
"""The Pulumi project (Pulumi.yaml), the namespace of the program's config keys."""
UNKNOWN = "<unknown during preview>"
SENTINELS = (UNKNOWN_STRING_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_BOOLEAN_VALUE, UNKNOWN_ARRAY_VALUE, UNKNOWN_OBJECT_VALUE)
"""How the engine marks unknown values (the proxy raises on reading one; a bare value may be one)."""
STATEFUL_SERVICE = ("cloudstate.io", "StatefulService")
"""CloudState's entity deployment: a pod-like spec (containers, volumes) the operator runs with a proxy sidecar."""
K8S_TYPE = re.compile(r"^kubernetes:(?P<group>[\w.-]+)/(?P<version>\w+):(?P<kind>\w+)$")


# --- the engine's props as plain data ------------------------------------------------------------


def plain(value: Any) -> Any:
    """Proxies to dicts and lists, unknown values to UNKNOWN."""
    if isinstance(value, str):
        return UNKNOWN if value in SENTINELS else value
    if isinstance(value, Mapping):
        result = {}
        for key in value:
            try:
                result[key] = plain(value[key])
            except UnknownValueError:
                result[key] = UNKNOWN
        return result
    if isinstance(value, Sequence):
        items = []
        for index in range(len(value)):
            try:
                items.append(plain(value[index]))
            except UnknownValueError:
                items.append(UNKNOWN)
        return items
    return value


def kubernetes_kind(resource_type: str) -> Optional[tuple[str, str]]:
    """`kubernetes:apps/v1:Deployment` -> ("apps", "Deployment"); None for other types."""
    match = K8S_TYPE.match(resource_type)
    return (match["group"], match["kind"]) if match else None


def kubernetes_object(resource_type: str, props: Any) -> Optional[dict]:
    """The Kubernetes object of a resource (kind from the type token), or None."""
    kind = kubernetes_kind(resource_type)
    if kind is None or kind[1].endswith(("Patch", "List")):
        return None
    return {**plain(props), "kind": kind[1]}


def workload_spec(obj: dict) -> Optional[dict]:
    """The pod spec of a workload (the spec of a StatefulService); None while unknown in preview."""
    try:
        spec = obj["spec"] if obj["kind"] == STATEFUL_SERVICE[1] else checks.pod_spec(obj)
    except (KeyError, TypeError):  # a part of it is UNKNOWN (a string) or absent
        return None
    return spec if isinstance(spec, dict) and isinstance(spec.get("containers"), list) else None


def pod_specs(resource_type: str, props: Any) -> Iterator[tuple[str, str, dict]]:
    """(kind, description, pod-like spec) of a workload or a StatefulService; nothing for others."""
    kind = kubernetes_kind(resource_type)
    if kind is None or (kind[1] not in checks.WORKLOAD_KINDS and kind != STATEFUL_SERVICE):
        return
    obj = kubernetes_object(resource_type, props)
    spec = workload_spec(obj)
    if spec is not None:
        yield kind[1], described(obj), spec


def known_images(spec: dict) -> dict:
    """`spec` without containers whose image is unknown (an image built during `up`)."""
    return {
        **spec,
        **{key: [c for c in spec.get(key) or [] if c.get("image") != UNKNOWN] for key in ("initContainers", "containers")},
    }


def described(obj: dict) -> str:
    """`Kind namespace/name` of an object, for messages."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return f"{obj['kind']} {meta.get('namespace', '')}/{meta.get('name', '')}"


def stack_config() -> dict[str, str]:
    """The stack's config as the engine passes it to the pack (full key -> string)."""
    return pulumi.runtime.get_config_env()


def environment() -> str:
    """`test` or `prod`: the stack's `cloudstation:environment`, else the stack's name."""
    return stack_config().get(f"{PROJECT}:environment") or os.environ.get("PULUMI_STACK", "")


def report_all(report: ReportViolation, problems: list[str], urn: Optional[str] = None) -> None:
    for problem in problems:
        report(problem, urn)


# --- workloads ------------------------------------------------------------------------------------


def _restricted(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for _, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.restricted_violations(name, spec))


def _resources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for kind, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.resource_violations(name, spec))
        if kind == STATEFUL_SERVICE[1]:
            # The operator's proxy sidecar takes its requests and limits from sidecarResources.
            sidecar = {"containers": [{"name": "cloudstate-sidecar", "resources": spec.get("sidecarResources") or {}}]}
            report_all(report, checks.resource_violations(name, sidecar))


def _probes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for kind, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.probe_violations(name, spec, kind))


def _mutable_tags(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for _, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.image_violations(name, known_images(spec)))


def _digests(args: ResourceValidationArgs, report: ReportViolation) -> None:
    prod = environment() == "prod"
    if prod and args.resource_type in ("docker:index/image:Image", "docker-build:index:Image"):
        report("prod never builds images: it deploys the digests promoted from test "
               "(`python -m infra promote --from test --to prod`)")
        return
    require_all = prod and bool(args.get_config().get("requirePlatformDigestsInProd", False))
    for kind, name, spec in pod_specs(args.resource_type, args.props):
        if kind == STATEFUL_SERVICE[1] or require_all:
            report_all(report, checks.digest_violations(name, known_images(spec)))


def _secret_env(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for _, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.secret_env_violations(name, spec))


def _configmaps(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if kubernetes_kind(args.resource_type) == ("core", "ConfigMap"):
        obj = kubernetes_object(args.resource_type, args.props)
        sections = {key: obj[key] for key in ("data", "binaryData") if isinstance(obj.get(key), dict)}
        report_all(report, checks.configmap_violations(described(obj), sections))


# --- the whole stack ------------------------------------------------------------------------------


def stack_objects(args: StackValidationArgs) -> tuple[list[tuple[str, dict]], int]:
    """(urn, Kubernetes object) of every Kubernetes resource in the stack whose name, namespace and
    (for workloads) pod spec are known, and how many were left out as unknown during preview."""
    objects, unknown = [], 0
    for resource in args.resources:
        obj = kubernetes_object(resource.resource_type, resource.props)
        if obj is None:
            continue
        meta = obj.get("metadata")
        if (not isinstance(meta, dict) or UNKNOWN in (meta.get("name"), meta.get("namespace"))
                or (obj["kind"] in checks.WORKLOAD_KINDS and workload_spec(obj) is None)):
            unknown += 1
            continue
        objects.append((resource.urn, obj))
    return objects, unknown


def _urn_of(objects: list[tuple[str, dict]], target: dict) -> Optional[str]:
    return next((urn for urn, obj in objects if obj is target), None)


def _network_policies(args: StackValidationArgs, report: ReportViolation) -> None:
    objects, unknown = stack_objects(args)
    if unknown:
        # A policy or workload whose namespace is not known yet could belong to any namespace.
        args.not_applicable(f"{unknown} objects are unknown during preview; `up` checks them")
    report_all(report, checks.network_policy_violations([obj for _, obj in objects]))


OPEN_RANGES = ("0.0.0.0/0", "::/0")


def _registry_exposure(args: StackValidationArgs, report: ReportViolation) -> None:
    objects, _ = stack_objects(args)  # what is known; exposure found is real either way
    allowed = bool(args.get_config().get("allowRegistryExposure", False))
    for obj in checks.registry_exposure([o for _, o in objects]):
        meta = obj["metadata"]
        what = f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"
        if not allowed:
            report(f"{what} exposes the image registry outside the cluster; if the stack means it "
                   "(platform.registry.loadBalancer or .ingress), run the pack with the policy config "
                   "allowRegistryExposure: true", _urn_of(objects, obj))
        elif obj["kind"] == "Service":
            ranges = obj.get("spec", {}).get("loadBalancerSourceRanges") or []
            if not ranges or set(ranges) & set(OPEN_RANGES):
                report(f"{what}: a registry LoadBalancer admits only listed clients "
                       f"(loadBalancerSourceRanges without {' or '.join(OPEN_RANGES)}), not {ranges}",
                       _urn_of(objects, obj))


def stack_file_secret_keys(directory: Path, stack: str) -> Optional[set[str]]:
    """Keys of `Pulumi.<stack>.yaml` holding `secure:` values; None without the file."""
    path = directory / f"Pulumi.{stack}.yaml"
    if not stack or not path.is_file():
        return None
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    return {key for key, value in config.items() if isinstance(value, dict) and set(value) == {"secure"}}


def _plain_config(args: StackValidationArgs, report: ReportViolation) -> None:
    directory = Path(args.get_config().get("projectDirectory") or REPO)
    stack = os.environ.get("PULUMI_STACK", "")
    secret_keys = stack_file_secret_keys(directory, stack)
    if secret_keys is None:
        args.not_applicable(f"no Pulumi.{stack}.yaml in {directory} to tell secure from plain config "
                            "(set the policy config projectDirectory)")
    report_all(report, checks.plain_config_violations(stack_config(), secret_keys))


# --- the policies ---------------------------------------------------------------------------------

MANDATORY = EnforcementLevel.MANDATORY

restricted_pod_security = ResourceValidationPolicy(
    name="restricted-pod-security",
    description="Every workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, Pod and CloudState "
                "StatefulService) meets the restricted Pod Security Standard: non-root, no privilege escalation, "
                "all capabilities dropped, RuntimeDefault seccomp, no host namespaces, ports or paths, and an "
                "explicit readOnlyRootFilesystem.",
    validate=_restricted,
    enforcement_level=MANDATORY,
)

container_resources = ResourceValidationPolicy(
    name="container-resources",
    description="Every container, init container and CloudState proxy sidecar has cpu and memory requests and limits.",
    validate=_resources,
    enforcement_level=MANDATORY,
)

health_probes = ResourceValidationPolicy(
    name="health-probes",
    description="Long-running containers of images with a health endpoint (infra/checks.py HEALTH_ENDPOINTS: the "
                "registry's /debug/health, /health of Armada's server, scheduler, executor, lookout and binoculars; "
                "PostgreSQL, Redis, Pulsar and Cassandra by command, port or HTTP) have a readiness probe on it and "
                "a liveness probe. Jobs, CronJobs and images without one (Armada's ingesters, the CloudState "
                "operator) are exempt.",
    validate=_probes,
    enforcement_level=MANDATORY,
)

no_mutable_image_tags = ResourceValidationPolicy(
    name="no-mutable-image-tags",
    description="Every container image names an exact version tag or a digest: never `latest`, a floating tag "
                "without a version number (`stable`, `alpine`), or no tag at all. Images built during `up` are "
                "unknown in preview and checked at `up`.",
    validate=_mutable_tags,
    enforcement_level=MANDATORY,
)

digest_pinned_images = ResourceValidationPolicy(
    name="digest-pinned-images",
    description="Entity images (every container of a CloudState StatefulService) are pinned by digest "
                "(`@sha256:`) in every stack, and the prod stack builds nothing (no docker Image resources): it "
                "deploys the digests promoted from test. Third-party platform images in prod stay on the exact "
                "upstream version tags of infra/versions.py, which also hold when mirrored (platform.imageMirror "
                "keeps the tag, a mirror's digest may differ); set requirePlatformDigestsInProd to demand digests "
                "for every image in prod.",
    validate=_digests,
    enforcement_level=MANDATORY,
    config_schema=PolicyConfigSchema(
        properties={"requirePlatformDigestsInProd": {"type": "boolean", "default": False}},
    ),
)

secret_env_from_secrets = ResourceValidationPolicy(
    name="secret-env-from-secrets",
    description="Environment variables named like credentials (PASSWORD, SECRET, TOKEN, …) come from a Secret "
                "(secretKeyRef), never a literal value.",
    validate=_secret_env,
    enforcement_level=MANDATORY,
)

no_secrets_in_configmaps = ResourceValidationPolicy(
    name="no-secrets-in-configmaps",
    description="ConfigMaps hold no credentials: no credential-named keys, no `password: …`-style settings with "
                "literal values in their files, no private keys, password hashes or URLs with passwords.",
    validate=_configmaps,
    enforcement_level=MANDATORY,
)

no_secrets_in_plain_config = StackValidationPolicy(
    name="no-secrets-in-plain-config",
    description="Every credential in the stack's config is a `secure:` value (pulumi config set --secret): no plain "
                "key or nested setting named like a credential with a literal value, no private key, password hash "
                "or URL with a password. The pack reads the config the engine passes it and the stack file "
                "Pulumi.<stack>.yaml in projectDirectory (default: the repository root) for which keys are secure.",
    validate=_plain_config,
    enforcement_level=MANDATORY,
    config_schema=PolicyConfigSchema(properties={"projectDirectory": {"type": "string"}}),
)

registry_not_exposed = StackValidationPolicy(
    name="registry-not-exposed",
    description="The image registry has no LoadBalancer Service and no Ingress unless the stack asks for one "
                "(platform.registry.loadBalancer or .ingress) and the pack runs with allowRegistryExposure: true; "
                "even then a registry LoadBalancer lists its clients in loadBalancerSourceRanges.",
    validate=_registry_exposure,
    enforcement_level=MANDATORY,
    config_schema=PolicyConfigSchema(
        properties={"allowRegistryExposure": {"type": "boolean", "default": False}},
    ),
)

namespace_network_policies = StackValidationPolicy(
    name="namespace-network-policies",
    description="Every namespace the stack creates has a default-deny NetworkPolicy (podSelector {}, policyTypes "
                "[Ingress, Egress], no rules), and every workload in it is selected by a NetworkPolicy that allows "
                "one of its flows beyond DNS.",
    validate=_network_policies,
    enforcement_level=MANDATORY,
)

POLICIES = [
    restricted_pod_security,
    container_resources,
    health_probes,
    no_mutable_image_tags,
    digest_pinned_images,
    secret_env_from_secrets,
    no_secrets_in_configmaps,
    no_secrets_in_plain_config,
    registry_not_exposed,
    namespace_network_policies,
]
