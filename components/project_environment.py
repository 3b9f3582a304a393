"""One CloudStation project in one environment: its namespace, pull Secret, store and one
CloudState `StatefulService` per entity, plus what the released operator can no longer create.

The Scala operator 0.6.0 builds each entity's Deployment (`<service>-deployment`: the user
container and the `akka-sidecar` proxy), but on Kubernetes >= 1.22 it then fails: it creates the
pod-reader Role/RoleBinding through `rbac.authorization.k8s.io/v1beta1` (skuber 2.4.0, still its
client at v0.6.0), which no longer exists, and it creates the entity's Service only after those
succeed (v0.6.0
`operator/src/main/scala/io/cloudstate/operator/{StatefulServiceOperatorFactory,ResourceHelper}.scala`;
the Deployment is created concurrently, so it still appears). So this component creates, per
namespace, the ServiceAccount the entity pods run as (carrying the registry pull Secret, since
the v0.5 schema has no imagePullSecrets), the pod-reader Role and RoleBinding the Akka cluster
bootstrap needs, and per entity the Service (port 80 -> proxy 8013). It also grants the operator,
in this namespace only, what it does here (components/cloudstate_operator.py NAMESPACE_RULES): the
stack that owns a namespace grants it, whichever stack runs the operator.

The v0.5 schema has no `replicas` either, and the operator starts every Deployment at one replica
and then keeps whatever scale it finds; a HorizontalPodAutoscaler with minReplicas = maxReplicas
= the configured replicas sets and holds that scale (the HPA controller enforces the bounds even
without a metrics server).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import cloudstate_crds as crds
from components import k8s as kb
from components import network
from components.cloudstate_operator import DEPLOYMENT_SUFFIX, CloudStateArgs, namespace_access, proxy_key
from components.cloudstate_store import CloudStateStore, CloudStateStoreArgs, StoreKind, StoresConfig
from components.kept_secret import Cluster
from components.namespace import Namespace, NamespaceArgs
from components.component import Component
from infra.image_pins import PROXY_ANNOTATION

SERVICE_ACCOUNT = "cloudstate-entities"
POD_READER = "cloudstate-entities-pod-reader"
PROXY_PORT = 8013
REMOTING_PORT = 2552
MANAGEMENT_PORT = 8558
"""The proxies' Akka remoting and management (cluster bootstrap, health) ports."""
USER_PORT = 8080
NO_TOKEN = "no-api-token"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the ServiceAccount admission plugin mounts the API token into every container, except a
container that already mounts something there (kubernetes plugin/pkg/admission/serviceaccount/
admission.go `mountServiceAccountToken`: "Existing mounts at the default mount path prevent
mounting of the API token")."""
ENTITY_UID = 1000
"""The user the entity images run as (`USER 1000:1000` in their Dockerfiles)."""
SERVICE_LABEL = "cloudstate.io/statefulService"
"""The label the operator puts on each entity's pods (value: the StatefulService name)."""
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
"""Annotation of each entity's Service. pulumi-kubernetes awaits a Service with a selector until
its endpoints are ready, for up to 10 minutes (pulumi/pulumi-kubernetes provider/pkg/await/service.go
`serviceInitAwaiter`, `DefaultServiceTimeoutMins = 10`; the SDK's Service docstring says the same).
The pods behind an entity Service are not Pulumi's: the operator creates them from the
StatefulService, and they become ready only once the image is pulled and the proxies' Akka
cluster has formed, so awaiting them would fail or stall `up` on anything the program cannot
influence. The provider skips the await for this annotation (provider/pkg/await/await.go
`Creation`/`Update` -> provider/pkg/metadata/overrides.go `SkipAwaitLogic`)."""

PullSecretFactory = Callable[[str, pulumi.Input[str], pulumi.ResourceOptions], pulumi.Resource]
"""(resource name, namespace, opts) -> the registry pull Secret (infra/delivery.image_pull_secret)."""


@dataclass(frozen=True)
class EntityService:
    """One entity as deployed: its StatefulService name, whether it needs the store, its image."""

    service_name: str
    needs_store: bool
    replicas: int
    image: pulumi.Input[str]


@dataclass(frozen=True)
class ProjectEnvironmentArgs:
    project: str
    environment: str
    namespace: str
    """The namespace's name (`<project>-<environment>`, or `<platform namespace>-state`)."""
    entities: Sequence[EntityService]
    store_kind: StoreKind
    stores: StoresConfig
    cloudstate: CloudStateArgs
    pull_secret_name: str
    pull_secret: PullSecretFactory
    kubernetes_api: network.KubernetesApi
    """Where the proxies reach the API server (platform.kubernetesApi): Akka's Kubernetes discovery."""
    operator_namespace: str
    """The namespace of the cluster's CloudState operator (its ServiceAccount), granted access here."""
    proxy_images: Mapping[str, str]
    """The `proxy.image` map of the cluster's operator (this stack's, or its cluster owner's): the
    proxy each entity's pods run, which its StatefulService names (`proxy_annotation`)."""
    depends_on: Sequence[pulumi.Resource] = ()
    """The CloudState CRDs and operator, when this stack owns them (else they exist already)."""
    image_mirror: Optional[str] = None
    cluster: Optional[Cluster] = Cluster()
    """Where the store's kept credentials Secret is read back (components/kept_secret.py)."""
    builds: Sequence[pulumi.Resource] = ()
    """Every image build of the project (infra/delivery.py): each StatefulService waits for all of
    them, not only its own image, so a failed build changes none of the project's entities (deploy
    gating; the engine runs no step of a resource whose dependency failed). Through one gate, the
    ConfigMap `<project>-images` (`images_config_map`), not an edge per build and service."""


# --- pure builders ---------------------------------------------------------------------------


def holds_store_data(entities: Sequence[EntityService], store_kind: StoreKind, stores: StoresConfig) -> bool:
    """Whether the environment's namespace holds its store's data: a managed server, when an
    entity needs the store."""
    return any(entity.needs_store for entity in entities) and getattr(stores, store_kind).mode == "managed"


def namespace_args(name: str, project: str, environment: str, keep_on_delete: bool = False) -> NamespaceArgs:
    # Enforce "baseline", not "restricted": the operator generates the entity pods and sets no
    # securityContext on the proxy sidecar or the pod (the v0.5 schema offers no way to), and
    # skuber 2.4.0's SecurityContext has no seccompProfile, so the operator drops the user
    # container's; "restricted" admission would reject every entity pod. Restricted violations are
    # still warned and audited, and every workload this program writes itself is restricted.
    return NamespaceArgs(
        name=name,
        pod_security="baseline",
        labels={"cloudstation.io/project": project, "cloudstation.io/environment": environment},
        keep_on_delete=keep_on_delete,
    )


def store_key(project: str, environment: str) -> str:
    """Database / keyspace name of a project's journal: unique per project and environment, so
    several of them can share one external server."""
    return f"{project}_{environment}".replace("-", "_")


def stateful_service_spec(
    entity: EntityService, image: str, store_name: Optional[str], store_kind: StoreKind, keyspace: str,
    settings: CloudStateArgs,
) -> dict:
    """The v0.5 StatefulService spec of one entity (Scala operator `StatefulService.Spec`).

    Operator 0.6.0 renames the first container `user-container`, keeps only its first port (as
    `user-port`, default 8080), passes that port to the proxy and to the user container as `PORT`,
    and adds a `/var/log` emptyDir; later containers are ignored."""
    jvm = settings.sidecar_jvm_memory
    spec: dict = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "containers": [
            {
                "name": "user-function",
                "image": image,
                "ports": [{"name": "user-port", "containerPort": USER_PORT}],
                "resources": settings.entity_resources.spec(),
                "securityContext": kb.container_security(read_only_root=True, run_as_user=ENTITY_UID),
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    # The proxy sidecar needs the pod's API token (Akka's Kubernetes discovery lists
                    # the entity's pods), so the pod mounts one; the user function never calls the
                    # API, and an empty directory here keeps the token out of its container.
                    {"name": NO_TOKEN, "mountPath": TOKEN_PATH, "readOnly": True},
                ],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}, {"name": NO_TOKEN, "emptyDir": {"sizeLimit": "1Mi"}}],
        "sidecarResources": settings.sidecar_resources.spec(),
        "sidecarJvmMemory": jvm,
    }
    if entity.needs_store:
        datastore: dict = {"name": store_name}
        if store_kind == "cassandra":
            # Required by the operator for Cassandra ("No keyspace declared for unmanaged Cassandra journal").
            datastore["config"] = {"keyspace": keyspace}
        spec["datastore"] = datastore
    return spec


def proxy_annotation(entity: EntityService, store_kind: StoreKind, proxy_images: Mapping[str, str]) -> dict[str, str]:
    """The StatefulService's annotation naming the proxy image its pods run (infra/image_pins.py):
    the operator creates those pods, so this is how the checks and the policy pack see that image.
    The operator copies it onto the entity's Deployment and pod template (v0.6.0
    StatefulServiceOperatorFactory.scala `createDeployment`), so it changes, and rolls the pods,
    together with the proxy image."""
    return {PROXY_ANNOTATION: proxy_images[proxy_key(store_kind if entity.needs_store else None)]}


IMAGES_KEY = "images"


def images_config_map(project: str) -> str:
    """The deploy gate's name: `<project>-images`, in the project's namespace."""
    return f"{project}-images"


def images_data(refs: Sequence[str]) -> dict:
    """The gate's data: the digest-pinned image of every entity, one per line, in entity order. Only
    references (`host/project/entity:tag@sha256:...`); one key, so no entity name becomes a key."""
    return {IMAGES_KEY: "".join(f"{ref}\n" for ref in refs)}


def entity_service_spec(service_name: str) -> dict:
    return {
        "type": "ClusterIP",
        "selector": {SERVICE_LABEL: service_name},
        "ports": [{"name": "grpc", "port": 80, "targetPort": PROXY_PORT, "appProtocol": "kubernetes.io/h2c"}],
    }


ENTITIES_POLICY = "entities.shared"
"""The name of the NetworkPolicy every entity pod of a namespace shares. NetworkPolicy names are DNS
subdomains (kubernetes pkg/apis/networking/validation `ValidateNetworkPolicyName`), Services' are DNS
labels, so a name with a dot is no entity's: each entity's own policy is named after its Service
(`<project>-<entity>`, or project-state's configurable name, which could be `entities`)."""


def entities_network_policy_spec(service_names: Sequence[str], kubernetes_api: network.KubernetesApi) -> dict:
    """NetworkPolicy spec shared by the entity pods of a namespace: every entity pod may call every
    entity's proxy (entities call each other through their Services, port 80 -> 8013), and the
    proxies list their pods through the Kubernetes API (Akka's Kubernetes discovery). What differs
    per entity is in `entity_network_policy_spec`; policies add up (docs/network-policies.md). One
    policy per namespace rather than these rules in each entity's keeps the render linear in small
    objects.

    It selects the pods of `service_names` (this environment's entities) only, not every pod with
    the operator's label: a labelled pod without a policy of its own (a StatefulService outside the
    stack, a deleted entity's pods still terminating, a new entity's pods before its policy) keeps
    DNS only, as with the per-entity policies this replaces. The peers stay every labelled pod of
    the namespace, as those policies had them: a flow needs both ends' policies, so the rules are
    exactly the union of the old per-entity ones, in one object."""
    if not service_names:
        raise ValueError("the shared entity policy needs at least one entity (an `In` selector needs values)")
    selected = {"key": SERVICE_LABEL, "operator": "In", "values": sorted(set(service_names))}
    entities = network.pods(expressions=[network.label_exists(SERVICE_LABEL)])
    return network.spec(
        {"matchExpressions": [selected]},
        ingress_rules=[network.ingress([entities], [PROXY_PORT])],
        egress_rules=[network.egress([entities], [PROXY_PORT]), network.kubernetes_api(kubernetes_api)],
    )


def entity_network_policy_spec(service_name: str, store: Optional[network.Endpoint]) -> dict:
    """NetworkPolicy spec of one entity's pods (selected by the operator's label), beside the shared
    `entities_network_policy_spec`: its proxies form an Akka cluster with each other, and it may call
    its store. Nothing else: a policy selects pods, not containers, so the user container shares the
    proxy's egress (docs/network-policies.md). Callers from other namespaces need a policy of their own."""
    own = network.pods({SERVICE_LABEL: service_name})
    cluster_ports = [REMOTING_PORT, MANAGEMENT_PORT]
    egress = [network.egress([own], cluster_ports)]
    if store is not None:
        egress.append(network.to(store))
    return network.spec(
        {"matchLabels": {SERVICE_LABEL: service_name}},
        ingress_rules=[network.ingress([own], cluster_ports)],
        egress_rules=egress,
    )


def replicas_hpa_spec(service_name: str, replicas: int) -> dict:
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{service_name}{DEPLOYMENT_SUFFIX}"},
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}
        ],
    }


# --- component -------------------------------------------------------------------------------


class ProjectEnvironment(Component):
    """Outputs: `namespace` (Output[str]), `services` (the StatefulService names), `store_name`
    (None when no entity needs a store)."""

    def __init__(self, name: str, args: ProjectEnvironmentArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:cloudstate:ProjectEnvironment", name, None, opts)
        child = self.child_opts()
        # Removing the project from the stack file must not take its journal with it: a
        # namespace holding a managed store's volume stays (docs/cloudstate.md, "What is kept").
        keep = holds_store_data(args.entities, args.store_kind, args.stores)
        namespace = Namespace(
            f"{name}-namespace", namespace_args(args.namespace, args.project, args.environment, keep), child
        )
        ns: pulumi.Input[str] = namespace.name
        self.namespace = pulumi.Output.from_input(ns)
        component = "cloudstate-entity"

        # The operator may reconcile this namespace, and only what it does here (no cluster-wide grant).
        role_body, binding_body = namespace_access(ns, args.operator_namespace)
        operator_role = k8s.rbac.v1.Role(f"{name}-operator-role", **role_body, opts=child)
        operator_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-operator-binding", **binding_body, opts=self.child_opts(depends_on=[operator_role])
        )

        pull_secret = args.pull_secret(f"{name}-pull-secret", ns, child)
        account = k8s.core.v1.ServiceAccount(
            f"{name}-entities-account",
            metadata=kb.metadata(SERVICE_ACCOUNT, ns, component),
            image_pull_secrets=[{"name": args.pull_secret_name}],
            opts=child,
        )
        role = k8s.rbac.v1.Role(
            f"{name}-pod-reader",
            metadata=kb.metadata(POD_READER, ns, component),
            rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]}],
            opts=child,
        )
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-pod-reader-binding",
            metadata=kb.metadata(POD_READER, ns, component),
            subjects=[{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": ns}],
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": POD_READER},
            opts=self.child_opts(depends_on=[role, account]),
        )

        store: Optional[CloudStateStore] = None
        if any(entity.needs_store for entity in args.entities):
            store = CloudStateStore(
                f"{name}-{args.store_kind}",
                CloudStateStoreArgs(
                    kind=args.store_kind,
                    stores=args.stores,
                    namespace=ns,
                    namespace_name=args.namespace,
                    database=store_key(args.project, args.environment),
                    depends_on=[*args.depends_on, operator_binding],
                    image_mirror=args.image_mirror,
                    cluster=args.cluster,
                ),
                # Its Jobs and CronJobs wait for the namespace's allow-dns policy too (their first run resolves the store).
                self.child_opts(depends_on=[namespace]),
            )
        self.store_name = store.store_name if store else None
        store_endpoint = store.endpoint if store else None
        keyspace = store_key(args.project, args.environment)

        # Deploy gating through one object: the gate waits for every build of the project and every
        # StatefulService waits for the gate, 2n dependencies instead of n^2. The Python SDK checks
        # each dependency for cycles by walking what it reaches (pulumi 3.272.0
        # sdk/python/lib/pulumi/runtime/resource_cycle_breaker.py `declare_dependency`/`_reachable`),
        # which per-build edges made quadratic in builds. A custom resource, not a component: a
        # dependency on a local component is one on each of its children (runtime/rpc.py
        # `_add_dependency`, from resource.py `prepare_resource` and _depends_on.py). The SDK sends
        # a registration once its dependencies' URNs resolve, and the engine answers one only when
        # its step is done (pulumi/pulumi pkg/resource/deploy/source_eval.go resmon.RegisterResource,
        # "block waiting for the operation to finish"), so a failed build leaves the gate and every
        # StatefulService of its project unregistered, i.e. unchanged.
        # Replacing the gate (new images; a named ConfigMap is deleted first) replaces no
        # StatefulService: the engine replaces dependents of a delete-before-replace only through
        # property dependencies (pulumi/pulumi pkg/resource/deploy/step_generator.go
        # `calculateDependentReplacements`), and these only depend on it by `dependsOn`.
        gate: list[pulumi.Resource] = []
        if args.builds:
            gate.append(k8s.core.v1.ConfigMap(
                f"{name}-images",
                metadata=kb.metadata(images_config_map(args.project), ns, component),
                data=pulumi.Output.all(*[entity.image for entity in args.entities]).apply(images_data),
                opts=self.child_opts(depends_on=list(args.builds)),
            ))

        # Every entity pod's rules but its own Akka cluster's and its store's, for this environment's
        # entities only (their names, not any pod with the operator's label). Each entity's policy
        # depends on it: on an upgrade from per-entity policies that held these rules too, the engine
        # creates this one before it narrows any entity's, and a new entity's policy is created after
        # this one's update has added it. The SDK registers a resource only once its dependencies'
        # URNs resolve (pulumi 3.272.0 sdk/python/lib/pulumi/runtime/resource.py `prepare_resource`
        # -> _depends_on.py `_resolve_depends_on_urns` -> rpc.py `_add_dependency`, which awaits
        # `res.urn.future()`), and the engine answers a registration when its step is done
        # (pulumi/pulumi pkg/resource/deploy/source_eval.go resmon.RegisterResource).
        # tests/test_entity_network_policies.py::test_an_upgrade_creates_the_shared_policy_before_it_narrows_any_entitys
        # and ::test_a_new_entity_is_added_to_the_shared_policy_before_its_own_is_created check the
        # order on the engine model.
        shared_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-{ENTITIES_POLICY}-network-policy",  # entities' carry their Service name: no dot
            metadata=kb.metadata(ENTITIES_POLICY, ns, component),
            spec=entities_network_policy_spec([e.service_name for e in args.entities], args.kubernetes_api),
            opts=child,
        )

        self.services: list[str] = []
        for entity in args.entities:
            waits = [*args.depends_on, operator_binding, pull_secret, account, binding,
                     *(store.ready if store and entity.needs_store else []), *gate]
            k8s.apiextensions.CustomResource(
                f"{name}-{entity.service_name}",
                api_version=crds.API_VERSION,
                kind="StatefulService",
                metadata=kb.metadata(entity.service_name, ns, component,
                                     annotations=proxy_annotation(entity, args.store_kind, args.proxy_images)),
                spec=pulumi.Output.from_input(entity.image).apply(
                    lambda image, entity=entity: stateful_service_spec(
                        entity, image, self.store_name, args.store_kind, keyspace, args.cloudstate
                    )
                ),
                opts=self.child_opts(depends_on=waits),
            )
            k8s.core.v1.Service(
                f"{name}-{entity.service_name}-service",
                metadata=kb.metadata(entity.service_name, ns, component, annotations=dict(SKIP_AWAIT)),
                spec=entity_service_spec(entity.service_name),
                opts=child,
            )
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{entity.service_name}-network-policy",
                metadata=kb.metadata(entity.service_name, ns, component),
                spec=entity_network_policy_spec(entity.service_name, store_endpoint if entity.needs_store else None),
                opts=self.child_opts(depends_on=[shared_policy]),
            )
            k8s.autoscaling.v2.HorizontalPodAutoscaler(
                f"{name}-{entity.service_name}-replicas",
                metadata=kb.metadata(entity.service_name, ns, component),
                spec=replicas_hpa_spec(entity.service_name, entity.replicas),
                opts=child,
            )
            if entity.replicas > 1:
                # The pods are the operator's, but a budget only selects pods: it holds whatever
                # carries the label the operator puts on them (as the NetworkPolicy above), and the
                # disruption controller finds their Deployment through the ReplicaSet. A drain then
                # evicts one proxy at a time and the Akka cluster hands its shards over. Their
                # spreading over nodes is not ours to set: the v0.5 schema has no affinity.
                k8s.policy.v1.PodDisruptionBudget(
                    f"{name}-{entity.service_name}-pdb",
                    **kb.disruption_budget(entity.service_name, ns, component, {SERVICE_LABEL: entity.service_name}),
                    opts=child,
                )
            self.services.append(entity.service_name)
        self.register_outputs({"namespace": self.namespace, "services": self.services})
