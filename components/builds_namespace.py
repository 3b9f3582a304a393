"""The namespace Armada runs entity build pods in (components/build_job.py), and what they may reach.

The namespace enforces the Pod Security level the builder needs (build_job.POD_SECURITY_LEVEL,
"baseline"; "restricted" is still warned and audited, so every relaxation shows), denies all
traffic by default (components/namespace.py) and lets build pods reach only DNS, the registry's
pods on its port, the destinations `BuildSettings.egress` declares (package and registry
mirrors) and, only with the opt-in `publicEgress`, public addresses. Nothing may connect to a
build pod. One Secret per project, `build-registry-<project>`, holds what that project's build pods
need of the registry, as its own build user (components/registry_access.py: push `<project>/*`,
create-only tags, pull its contexts): `.dockerconfigjson` for kaniko's push and `auth` (base64 of
`user:password`) for the fetch container's HTTP Basic header; pods mount them as files, never env,
and the job admission policy lets a pod of queue `<project>-builds` mount only its project's
(components/armada/cluster.py), so no build can read another project's credential.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import build_job
from components import k8s as kube
from components import network
from components.component import Component
from components.namespace import Namespace, NamespaceArgs
from components.registry import dockerconfigjson
from components.registry_access import build_secret_name
from infra import public_egress

COMPONENT = "entity-build"
BUILD_POD_LABEL = "armada_job_id"
"""The label Armada's executor puts on every pod it creates for a job (armadaproject/armada v0.22.7
internal/executor/domain/pod_metadata.go `JobId`): the build policies select exactly Armada's pods."""
EGRESS_POLICY = public_egress.POLICY
"""`build-egress`: the checks and the policy pack allow the public-egress rule in this policy only."""
INGRESS_POLICY = "build-no-ingress"


@dataclass(frozen=True)
class BuildsNamespaceArgs:
    """What the builds namespace needs to know."""

    namespace: str
    """The namespace's name, e.g. `cloudstation-builds`."""
    registry_host: str
    """host:port of the registry's in-cluster Service, as build pods reach it (the docker config's key)."""
    registry_namespace: str
    """Namespace of the registry's pods."""
    registry_pod_labels: Mapping[str, str]
    """Labels selecting the registry's pods (components/registry.py: `kube.selector_labels(name)`)."""
    credentials: Mapping[str, tuple[pulumi.Input[str], pulumi.Input[str]]]
    """Project (`platform` for project-state) -> its build user and password (a secret Output)."""
    settings: build_job.BuildSettings = field(default_factory=build_job.BuildSettings)
    registry_port: int = 5000
    """The port the registry's pods listen on (the policy names the pod's port, after the Service)."""
    stack_cidrs: tuple = ()
    """Address blocks the stack names (nodes, API server, external servers): the public-egress rule
    excepts them too (infra/public_egress.py `named_cidrs`)."""


def registry_endpoint(args: BuildsNamespaceArgs) -> network.Endpoint:
    return network.Endpoint(
        ports=(args.registry_port,),
        peers=(network.pods(dict(args.registry_pod_labels), namespace=args.registry_namespace),),
    )


def egress_rules(args: BuildsNamespaceArgs) -> list[dict]:
    """Build pods' egress beyond DNS: the registry, then each declared destination, then (opt-in
    `publicEgress`) public addresses on its ports: the only rule of the program that names every
    address, excepting every non-public block and the stack's own (infra/public_egress.py)."""
    rules = [network.to(registry_endpoint(args))]
    for destination in args.settings.egress:
        rules.append(network.egress(destination.peers(), destination.ports))
    public = args.settings.public_egress
    if public.enabled:
        rules.append(network.egress(public_egress.peers([*public.except_cidrs, *args.stack_cidrs]), public.ports))
    return rules


def build_pod_selector() -> dict:
    return network.selector(expressions=[network.label_exists(BUILD_POD_LABEL)])


def egress_policy_spec(args: BuildsNamespaceArgs) -> dict:
    """Egress of build pods: the registry and the declared destinations; DNS is the namespace's `allow-dns`."""
    return network.spec(build_pod_selector(), egress_rules=egress_rules(args))


def ingress_policy_spec() -> dict:
    """Nothing connects to a build pod (already so by default-deny; written down for review)."""
    return network.spec(build_pod_selector(), ingress_rules=[])


def basic_auth(username: str, password: str) -> str:
    """The value of an HTTP Basic Authorization header (RFC 7617)."""
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def build_credentials(registry_host: str, username: str, password: str) -> dict[str, str]:
    """A build Secret's data: kaniko's docker config and the fetch container's Basic value."""
    return {build_job.DOCKERCONFIG_KEY: dockerconfigjson(registry_host, username, password),
            build_job.AUTH_KEY: basic_auth(username, password)}


class BuildsNamespace(Component):
    """Outputs: `namespace` (the builds namespace's name, once it exists), `secret_names` (project ->
    its build Secret's name), `pod_security` (the enforced level). Children: the namespace (with its
    default-deny and allow-dns policies), the build egress and ingress policies, the build Secrets."""

    def __init__(self, name: str, args: BuildsNamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:builds:BuildsNamespace", name, None, opts)
        namespace = Namespace(
            f"{name}-namespace",
            NamespaceArgs(name=args.namespace, pod_security=build_job.POD_SECURITY_LEVEL),
            self.child_opts(),
        )
        ns = namespace.name
        # The policies and the Secret wait for the namespace (its name is read from it).
        egress = k8s.networking.v1.NetworkPolicy(
            f"{name}-egress",
            **network.policy(EGRESS_POLICY, ns, COMPONENT, egress_policy_spec(args)),
            opts=self.child_opts(),
        )
        ingress = k8s.networking.v1.NetworkPolicy(
            f"{name}-no-ingress",
            **network.policy(INGRESS_POLICY, ns, COMPONENT, ingress_policy_spec()),
            opts=self.child_opts(),
        )
        secrets = {}
        for project, (username, password) in sorted(args.credentials.items()):
            data = pulumi.Output.all(username, password).apply(lambda up: build_credentials(args.registry_host, *up))
            secrets[project] = k8s.core.v1.Secret(
                f"{name}-registry-{project}",
                metadata=kube.metadata(build_secret_name(project), ns, COMPONENT),
                type="kubernetes.io/dockerconfigjson",
                string_data=pulumi.Output.secret(data),
                opts=self.child_opts(),
            )
        self.namespace_resource = namespace
        self.namespace: pulumi.Output[str] = ns
        self.secret_names: dict[str, pulumi.Output[str]] = {p: secret.metadata.name for p, secret in secrets.items()}
        self.pod_security: str = build_job.POD_SECURITY_LEVEL
        self.policies = [egress, ingress]
        """What build pods need before their first connection (a job waits for them: default-deny
        would refuse a first attempt)."""
        self.ready: list[pulumi.Resource] = [namespace.resource, *namespace.policies, egress, ingress, *secrets.values()]
        """Everything a build job needs in place before it is submitted: custom resources, not the
        Namespace component, whose dependants the SDK would give an edge per child."""
        self.register_outputs({"namespace": self.namespace, "secretNames": self.secret_names,
                               "podSecurity": self.pod_security})
