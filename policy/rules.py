"""The CloudStation policy pack's rules (CrossGuard, `pulumi_policy`).

Each rule applies a pure check of cloudstation_tools/checks.py (the same checks tests/test_standards.py runs on
the rendered graph) to the engine's view of the resources: `props` are the camelCase inputs, wrapped
in a proxy that raises UnknownValueError on values not known during preview. `plain()` turns them
into ordinary dicts with unknowns marked, so a rule skips only what it cannot see yet; `pulumi up`
runs every rule again with all values known.

Stack config reaches a policy pack as the PULUMI_CONFIG environment variable (decrypted), and the
stack's name as PULUMI_STACK; which keys are `secure:` only the stack file says.

The pack fails closed: a resource whose Kubernetes objects it cannot see (Helm releases and charts,
yaml ConfigFile/ConfigGroup, kustomize Directories, `*Patch` and `*List` kinds) is a violation, and so
is a workload whose pod spec is missing where its kind keeps it; only values the engine marks
unknown during preview are left for `up`.
"""
from __future__ import annotations

import json
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

from infra import address_blocks, image_pins, public_egress, versions
from cloudstation_tools import checks  # noqa: E402  (the repo root is on the path only from here on)

PROJECT = "cloudstation"
"""The Pulumi project (Pulumi.yaml), the namespace of the program's config keys."""
UNKNOWN = "<unknown during preview>"
SENTINELS = (UNKNOWN_STRING_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_BOOLEAN_VALUE, UNKNOWN_ARRAY_VALUE, UNKNOWN_OBJECT_VALUE)
"""How the engine marks unknown values (the proxy raises on reading one; a bare value may be one)."""
ENTITY_BUILD = "pulumi-python:dynamic/builds:EntityBuild"
"""An in-cluster build (components/entity_build.py): its `jobItem` input holds the build pod's spec."""
STATEFUL_SERVICE = ("cloudstate.io", "StatefulService")
"""CloudState's entity deployment: a pod-like spec (containers, volumes) the operator runs with a proxy sidecar."""
K8S_TYPE = re.compile(r"^kubernetes:(?P<group>[\w.-]+)/(?P<version>\w+):(?P<kind>\w+)$")
OPAQUE_TYPE = re.compile(r"^kubernetes:(?P<module>helm\.sh|yaml|kustomize)(/v[0-9]+)?:(?P<kind>\w+)$")
"""Resources whose objects the pack never sees as typed inputs (type tokens of pulumi-kubernetes
4.34.2's SDK: helm.sh/v2|v3:Chart, helm.sh/v3:Release, helm.sh/v4:Chart, yaml[/v2]:ConfigFile and
ConfigGroup, kustomize[/v2]:Directory). A Release is applied by Helm inside the provider; the others
expand templates, files or kustomizations the pack would have to trust unseen."""


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
    if OPAQUE_TYPE.match(resource_type):
        return None
    match = K8S_TYPE.match(resource_type)
    return (match["group"], match["kind"]) if match else None


def uninspectable(resource_type: str) -> Optional[str]:
    """Why the pack cannot inspect a resource of this type, or None when it can."""
    opaque = OPAQUE_TYPE.match(resource_type)
    if opaque:
        return (f"{resource_type} renders Kubernetes objects the policy pack cannot inspect "
                f"({opaque['module']}); declare them as typed resources (components/, pure spec builders)")
    kind = kubernetes_kind(resource_type)
    if kind and kind[1].endswith("Patch"):
        return (f"{resource_type} patches an object the policy pack cannot see whole; declare the object "
                "itself as a typed resource")
    if kind and kind[1].endswith("List"):
        return f"{resource_type} holds a list of objects the policy pack does not inspect; declare each object"
    return None


def kubernetes_object(resource_type: str, props: Any) -> Optional[dict]:
    """The Kubernetes object of a resource (kind from the type token), or None."""
    kind = kubernetes_kind(resource_type)
    if kind is None or uninspectable(resource_type):
        return None
    return {**plain(props), "kind": kind[1]}


def has_unknown(value: Any) -> bool:
    if isinstance(value, dict):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return value == UNKNOWN


def workload_template(obj: dict) -> Optional[dict]:
    """The pod template ({metadata, spec}) of a workload, or a StatefulService's spec as one; None
    when it is missing or malformed (`has_unknown(obj)` tells whether that is preview's doing)."""
    try:
        template = {"spec": obj["spec"]} if obj["kind"] == STATEFUL_SERVICE[1] else checks.pod_template(obj)
    except (KeyError, TypeError):  # a part of it is UNKNOWN (a string) or absent
        return None
    spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) \
            or not all(isinstance(c, dict) for c in checks.all_containers(spec)):
        return None
    metadata = template.get("metadata")
    return {"metadata": metadata if isinstance(metadata, dict) else {}, "spec": spec}


def workload_spec(obj: dict) -> Optional[dict]:
    """The pod spec of a workload (the spec of a StatefulService); None while unknown in preview."""
    template = workload_template(obj)
    return template["spec"] if template else None


def has_pod_spec(kind: Optional[tuple[str, str]]) -> bool:
    return kind is not None and (kind[1] in checks.POD_SPEC_KINDS or kind == STATEFUL_SERVICE)


def pod_specs(resource_type: str, props: Any) -> Iterator[tuple[str, str, dict]]:
    """(kind, description, pod-like spec) of a workload or a StatefulService; nothing for others."""
    for kind, name, template in pod_templates(resource_type, props):
        yield kind, name, template["spec"]


def pod_templates(resource_type: str, props: Any) -> Iterator[tuple[str, str, dict]]:
    """(kind, description, {metadata, spec}) of anything with a pod spec (checks.POD_SPEC_KINDS and
    CloudState StatefulServices); nothing for other kinds or while the spec is unknown."""
    kind = kubernetes_kind(resource_type)
    if not has_pod_spec(kind):
        return
    obj = kubernetes_object(resource_type, props)
    template = workload_template(obj) if obj is not None else None
    if template is not None:
        yield kind[1], described(obj), template


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


def _inspectable(args: ResourceValidationArgs, report: ReportViolation) -> None:
    reason = uninspectable(args.resource_type)
    if reason:
        report(reason)
        return
    kind = kubernetes_kind(args.resource_type)
    if has_pod_spec(kind):
        obj = kubernetes_object(args.resource_type, args.props)
        if workload_template(obj) is None and not has_unknown(obj):
            where = "spec" if kind == STATEFUL_SERVICE else "its pod template's spec"
            report(f"{described(obj)}: no pod spec with a containers list at {where}, so no rule can check it")


def _restricted(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for _, name, template in pod_templates(args.resource_type, args.props):
        annotations = (template["metadata"] or {}).get("annotations") or {}
        report_all(report, checks.restricted_violations(name, template["spec"], annotations))


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
    # The in-cluster build (components/entity_build.py, docs/builds.md) is a build too.
    if environment() == "prod" and args.resource_type in (
        "docker:index/image:Image", "docker-build:index:Image", ENTITY_BUILD
    ):
        report("prod never builds images: it deploys the digests promoted from test "
               "(`python -m infra promote --from test --to prod`)")
        return
    for kind, name, spec in pod_specs(args.resource_type, args.props):
        if kind == STATEFUL_SERVICE[1]:
            report_all(report, checks.digest_violations(name, known_images(spec)))


def _platform_digests(args: ResourceValidationArgs, report: ReportViolation) -> None:
    # Every stack, the one that owns the cluster too (issue 20 finding 6). Read at check time, so the
    # rule follows whatever infra/versions.py pins (and its digest records); by tag only the pins the
    # stack names in platform.images.allowUnpinned (its config refuses a name that has a digest).
    pins, allowed = versions.IMAGES, image_pins.allowed_unpinned(stack_config())
    for _, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.platform_digest_violations(name, known_images(spec), pins, allowed))
    obj = kubernetes_object(args.resource_type, args.props)
    # What the operator runs, which no pod spec shows: the proxies of its ConfigMap and of each
    # StatefulService's pods (prod's are its cluster owner's operator's; infra/image_pins.py).
    found = checks.operator_images(obj) if obj is not None else []
    if found is None and not has_unknown(obj.get("metadata")):
        report(f"{described(obj)} names no proxy image (annotation {image_pins.PROXY_ANNOTATION}), so nothing shows "
               "which image its pods' proxy runs; the program sets it on every StatefulService")
    for where, image in found or []:
        problem = checks.platform_digest_problem(where, image, pins, allowed) if image != UNKNOWN else None
        if problem:
            report(problem)
    if args.resource_type == ENTITY_BUILD:
        # The build pods' spec travels in the job item (components/build_job.py build_job_item).
        item = plain(args.props).get("jobItem") if isinstance(plain(args.props), dict) else None
        spec = _job_pod_spec(item)
        if spec is not None:
            report_all(report, checks.platform_digest_violations(f"EntityBuild {args.name} (Armada job)", spec, pins, allowed))


def _job_pod_spec(item: Any) -> Optional[dict]:
    """The pod spec of an Armada job item (JSON text), None while unknown or not one."""
    if not isinstance(item, str) or item == UNKNOWN:
        return None
    try:
        spec = json.loads(item).get("podSpec")
    except (ValueError, AttributeError):
        return None
    return spec if isinstance(spec, dict) and isinstance(spec.get("containers"), list) else None


def _secret_env(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for _, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.secret_env_violations(name, spec))


def _secret_arguments(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for _, name, spec in pod_specs(args.resource_type, args.props):
        report_all(report, checks.argument_credential_violations(name, spec))


def _open_peers(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if kubernetes_kind(args.resource_type) != ("networking.k8s.io", "NetworkPolicy"):
        return
    obj = kubernetes_object(args.resource_type, args.props)
    spec = obj.get("spec")
    if isinstance(spec, dict):
        allow = bool(args.get_config().get("allowAnyAddress", False))
        # The builds' public egress is allowed by the stack's own named opt-in, in its builds
        # namespace's egress policy only (infra/public_egress.py), not by the pack-wide allowAnyAddress.
        opted = public_egress.opt_in(stack_config(), environment())
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        ports = opted.ports if opted and opted.covers(meta.get("namespace"), meta.get("name")) else None
        report_all(report, checks.open_peer_violations(described(obj), spec, allow, ports))


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
                or (obj["kind"] in checks.POD_SPEC_KINDS and workload_spec(obj) is None)):
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


REGISTRY_NODE_PORT = 32000
"""The registry's documented NodePort (platform.registry.nodePort's default, docs/registry.md)."""


def _registry_exposure(args: StackValidationArgs, report: ReportViolation) -> None:
    objects, _ = stack_objects(args)  # what is known; exposure found is real either way
    config = args.get_config()
    allowed = bool(config.get("allowRegistryExposure", False))
    node_port = config.get("registryNodePort", REGISTRY_NODE_PORT)
    for obj in checks.registry_exposure([o for _, o in objects]):
        meta = obj["metadata"]
        what = f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"
        urn = _urn_of(objects, obj)
        spec = obj.get("spec") or {}
        if obj["kind"] == "Service" and spec.get("externalIPs"):
            report(f"{what} exposes the image registry on externalIPs {spec['externalIPs']}: never allowed "
                   "(any node answers for those addresses)", urn)
        elif obj["kind"] == "Service" and spec.get("type") == "NodePort":
            if not checks.is_node_pull_service(obj, node_port):
                report(f"{what} exposes the image registry on a NodePort other than the documented node-pull "
                       f"one (type NodePort, externalTrafficPolicy Local, one port with nodePort {node_port}, "
                       "the policy config registryNodePort)", urn)
        elif not allowed:
            report(f"{what} exposes the image registry outside the cluster; if the stack means it "
                   "(platform.registry.loadBalancer or .ingress), run the pack with the policy config "
                   "allowRegistryExposure: true", urn)
        elif obj["kind"] == "Service":
            ranges = spec.get("loadBalancerSourceRanges") or []
            reason = address_blocks.open_reason(ranges) if ranges else "none listed, which admits every client"
            if reason:
                report(f"{what}: a registry LoadBalancer admits only listed clients (loadBalancerSourceRanges "
                       f"that together are not open, infra/address_blocks.py), not {ranges}: {reason}", urn)


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
WORKLOADS = ("Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, CronJob, PodTemplate "
             "and CloudState StatefulService")

inspectable_resources = ResourceValidationPolicy(
    name="inspectable-resources",
    description="The pack fails closed: Helm releases and charts, yaml ConfigFile/ConfigGroup, kustomize Directories "
                "and `*Patch`/`*List` kinds are violations (their objects cannot be inspected), and so is a "
                f"workload ({WORKLOADS}) without a pod spec where its kind keeps one.",
    validate=_inspectable,
    enforcement_level=MANDATORY,
)

restricted_pod_security = ResourceValidationPolicy(
    name="restricted-pod-security",
    description=f"Every workload ({WORKLOADS}) meets the baseline and restricted Pod Security Standards: no host "
                "namespaces, HostProcess, hostPath volumes or host ports; only the safe sysctls; no custom SELinux "
                "user, role or type, AppArmor only RuntimeDefault or Localhost, procMount Default; non-root, no "
                "privilege escalation, all capabilities dropped (only NET_BIND_SERVICE added), RuntimeDefault "
                "seccomp, restricted volume types, probes and hooks without a host; and an explicit "
                "readOnlyRootFilesystem.",
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
    description="Long-running containers of images with a health endpoint (cloudstation_tools/checks.py HEALTH_ENDPOINTS: the "
                "registry's /debug/health, /health of Armada's server, scheduler, executor, lookout and binoculars, /metrics of its ingesters; "
                "PostgreSQL, Redis, Pulsar and Cassandra by command, port or HTTP) have a readiness probe on it and "
                "a liveness probe. Jobs, CronJobs and images without one (the CloudState operator) are exempt.",
    validate=_probes,
    enforcement_level=MANDATORY,
)

no_mutable_image_tags = ResourceValidationPolicy(
    name="no-mutable-image-tags",
    description="Every container image is a valid ASCII reference pinned by digest or by an exact version tag: "
                "major.minor.patch (major.minor for PostgreSQL, whose releases have two numbers), e.g. "
                "`redis:7.4.11-bookworm`, `postgres:16.15-alpine3.24`. Floating: no tag, `latest`, tags without a "
                "version (`stable`, `alpine`) and partial versions (`postgres:16`, `redis:7.4-alpine`). Images "
                "built during `up` are unknown in preview and checked at `up`.",
    validate=_mutable_tags,
    enforcement_level=MANDATORY,
)

digest_pinned_images = ResourceValidationPolicy(
    name="digest-pinned-images",
    description="Entity images (every container of a CloudState StatefulService) are pinned by digest "
                "(`host/path[:tag]@sha256:<64 hex>`, matched whole) in every stack, and the prod stack builds "
                "nothing (no docker Image resources): it deploys the digests promoted from test.",
    validate=_digests,
    enforcement_level=MANDATORY,
)

platform_images_by_digest = ResourceValidationPolicy(
    name="platform-images-by-digest",
    description="In every stack, every platform image (a repository infra/versions.py pins, mirrored or not) runs "
                "by digest, and by the pin's own digest where infra/versions.py has one: workloads' containers, "
                "in-cluster build pods (an EntityBuild's job item), the proxies the CloudState operator's ConfigMap "
                "names and the proxy each StatefulService's pods run (its cloudstation.io/proxy-image annotation, "
                "required: in prod the cluster owner's operator runs them). By tag only a pin without a digest "
                "record that the stack names in platform.images.allowUnpinned (a lab cluster's opt-out).",
    validate=_platform_digests,
    enforcement_level=MANDATORY,
)

secret_env_from_secrets = ResourceValidationPolicy(
    name="secret-env-from-secrets",
    description="Environment variables named like credentials (PASSWORD, SECRET, TOKEN, …) come from a Secret "
                "(secretKeyRef), never a literal value.",
    validate=_secret_env,
    enforcement_level=MANDATORY,
)

no_secrets_in_arguments = ResourceValidationPolicy(
    name="no-secrets-in-arguments",
    description="Command lines (command, args, exec probes and hooks, scripts in them) hold no literal credential: "
                "no `--password=…`/`--password …`/`--requirepass …`, no `PASSWORD=…` assignment, private key, "
                "password hash or URL with a password; they reference one ($(VAR) from a secretKeyRef, a file).",
    validate=_secret_arguments,
    enforcement_level=MANDATORY,
)

no_secrets_in_configmaps = ResourceValidationPolicy(
    name="no-secrets-in-configmaps",
    description="ConfigMaps hold no credentials: no credential-named keys, no `password: …`-style settings with "
                "literal values in their files, no private keys, password hashes or URLs with passwords.",
    validate=_configmaps,
    enforcement_level=MANDATORY,
)

no_open_network_peers = ResourceValidationPolicy(
    name="no-open-network-peers",
    description="No NetworkPolicy rule is open to every peer: every ingress rule names its `from` and every egress "
                "rule its `to` (missing or `[]` means everyone), no peer is `{}`, and no rule's ipBlocks are open "
                "together (0.0.0.0/0, ::/0, their halves, a merged block wider than /8 or IPv6 /32, more than a /8's "
                "worth of public addresses: infra/address_blocks.py) and no peer is every pod of every namespace "
                "(namespaceSelector {}) unless the pack "
                "runs with allowAnyAddress: true for a stack that sets an allowAnyAddress/allowAnySource opt-in. The "
                "builds' public-egress rule (infra/public_egress.py) passes without it, exactly as defined and only in "
                "the builds namespace's build-egress policy of a stack that sets platform.builds.publicEgress.enabled.",
    validate=_open_peers,
    enforcement_level=MANDATORY,
    config_schema=PolicyConfigSchema(properties={"allowAnyAddress": {"type": "boolean", "default": False}}),
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
    description="Nothing exposes the image registry beyond the documented node-pull NodePort (type NodePort, "
                "externalTrafficPolicy Local, one port with nodePort registryNodePort, default 32000): no other "
                "NodePort, never externalIPs, and no LoadBalancer, Ingress or Gateway API route (HTTPRoute, "
                "GRPCRoute, TLSRoute, TCPRoute, UDPRoute) unless the stack asks for one (platform.registry."
                "loadBalancer or .ingress) and the pack runs with allowRegistryExposure: true; even then a registry "
                "LoadBalancer lists its clients in loadBalancerSourceRanges, not open together (infra/address_blocks.py).",
    validate=_registry_exposure,
    enforcement_level=MANDATORY,
    config_schema=PolicyConfigSchema(
        properties={"allowRegistryExposure": {"type": "boolean", "default": False},
                    "registryNodePort": {"type": "integer", "default": REGISTRY_NODE_PORT,
                                         "minimum": 30000, "maximum": 32767}},
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
    inspectable_resources,
    restricted_pod_security,
    container_resources,
    health_probes,
    no_mutable_image_tags,
    digest_pinned_images,
    platform_images_by_digest,
    secret_env_from_secrets,
    no_secrets_in_arguments,
    no_secrets_in_configmaps,
    no_open_network_peers,
    no_secrets_in_plain_config,
    registry_not_exposed,
    namespace_network_policies,
]
