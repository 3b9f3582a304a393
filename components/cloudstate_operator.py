"""The CloudState operator (Scala, `cloudstateio/cloudstate-operator:0.6.0`, the last release),
configured with the 0.5.1 proxies, whose protocol our Node SDK speaks (infra/versions.py), and
installed the way its upstream descriptor (`operator/deploy/*.yaml` at v0.6.0) does, converted to
current Kubernetes APIs. Between v0.5.1 and v0.6.0 the operator only gained Cassandra credentials
and the sidecar's metrics port (docs/cloudstate.md, "Which operator"); its config keys, RBAC needs
and resource schema are unchanged.

Differences from upstream `cloudstate.yaml` (reference cloudstate/NOTES.md §2.1, §5), each on purpose:
- CRDs are `apiextensions.k8s.io/v1` with structural schemas (components/cloudstate_crds.py);
  RBAC is `rbac.authorization.k8s.io/v1`.
- No ClusterRole or ClusterRoleBinding: the operator watches exactly the listed namespaces
  (upstream: `*`) and gets, in each of them only, a Role with what it really does there
  (NAMESPACE_RULES), bound to its ServiceAccount in the namespace it actually runs in (upstream's
  binding hard-codes `cloudstate`, cloudstate issue #123).
- The operator config pins every proxy image (upstream: `latest`).
- The Deployment meets the restricted Pod Security Standard and has requests and limits.

A proxy version bump changes only the ConfigMap, and needs no restart (no checksum annotation on
the pod template): v0.6.0 watches its ConfigMap (cloudstateio/cloudstate v0.6.0
operator/src/main/scala/io/cloudstate/operator/OperatorMain.scala: `Watcher.watchSingle` on
`CONFIG_MAP` in `NAMESPACE`; on MODIFIED `maybeRestart` compares the parsed `OperatorConfig`, which
includes the proxy images, and restarts its watchers; their fresh caches reconcile every
StatefulService again, and StatefulServiceOperatorFactory `reconcileDeployment` updates a Deployment
whose sidecar image differs). Needs: those two env variables, key `config`, get+watch on the name.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from components import cloudstate_crds as crds
from components import k8s as kb
from components import network
from components.model import ConfigModel, DnsLabel, problem
from components.component import Component
from infra import image_pins, versions
from infra.image_pins import parse_operator_config  # noqa: F401  (read back by the checks and the pack too)

NAME = "cloudstate-operator"
CONFIG_MAP = image_pins.OPERATOR_CONFIG_MAP
UID = 1001
"""The operator image's user. v0.6.0 builds it with sbt-native-packager 1.7.4 (project/plugins.sbt) on
`adoptopenjdk/openjdk11:debianslim-jre` (build.sbt): `USER 1001:0`, files owned by 1001:root with
mode u=rX,g=rX; runAsGroup 0 keeps them readable through the group as well."""

PROXY_IMAGES = {
    "cassandra": "cloudstate-proxy-cassandra",
    "postgres": "cloudstate-proxy-postgres",
    "no-store": "cloudstate-proxy-no-store",
    "in-memory": "cloudstate-proxy-in-memory",
}
"""Operator config key (`cloudstate.operator.proxy.image.<key>`; all four are read, v0.6.0
`operator/src/main/scala/io/cloudstate/operator/OperatorConfig.scala`) -> infra/versions.py image
(the 0.5.1 proxies: infra/versions.CLOUDSTATE_PROXY)."""


def proxy_key(store_kind: Optional[str]) -> str:
    """The `proxy.image` key whose image the operator gives an entity's pods: `no-store` for a
    StatefulService without `datastore` (`store_kind` None), else its StatefulStore's type (v0.6.0
    StatefulServiceOperatorFactory.scala: `case None => StatefulStoreSupport.noStoreUsageConfiguration`;
    stores/{Postgres,Cassandra}StoreSupport.scala `proxyImage`: `config.postgres`, `config.cassandra`)."""
    return "no-store" if store_kind is None else store_kind

SIDECAR_DEFAULT_RESOURCES = {"requests": {"cpu": "400m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}
"""What the operator gives the proxy sidecar when a StatefulService has no `sidecarResources`
(v0.6.0 `StatefulServiceOperatorFactory.scala` `createSideCar`); the program always sets them."""
DEPLOYMENT_SUFFIX = "-deployment"
"""The operator names each StatefulService's Deployment `<name>-deployment`, starts it at one
replica and then keeps the scale it finds (`StatefulServiceOperatorFactory.scala` `deploymentNameFor`,
`reconcileDeployment`)."""

NAMESPACE_ROLE = "cloudstate-operator"
NAMESPACE_RULES = [
    # OperatorRunner: Watcher.watch lists and watches both kinds, the factories `getOption` them.
    {"apiGroups": [crds.GROUP], "resources": ["statefulstores", "statefulservices"], "verbs": ["get", "list", "watch"]},
    # OperatorRunner.updateStatus: `client.updateStatus`, a PUT of the status subresource.
    {"apiGroups": [crds.GROUP], "resources": ["statefulstores/status", "statefulservices/status"], "verbs": ["update"]},
    # StatefulServiceOperatorFactory: getOption, create, update (PUT) and delete of
    # `<name>-deployment`; StatefulStoreOperatorFactory.updateDependents: listSelected.
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "create", "update", "delete"]},
]
"""What operator 0.6.0 does in a namespace it watches, read from its source
(`operator/src/main/scala/io/cloudstate/operator/` at v0.6.0), granted per namespace by a Role and
RoleBinding that the stack owning the namespace creates (components/project_environment.py).

Upstream grants its ClusterRole cluster-wide; that role also lists what this operator can never use
on Kubernetes >= 1.22, left out here: `roles`/`rolebindings` (ResourceHelper creates them through
`rbac.authorization.k8s.io/v1beta1`, gone, so those requests fail whatever the grant), `services`
(ResourceHelper reaches them only after those Roles), `pods` and `deployments/scale` (no call at
all), `namespaces` (OperatorMain watches namespaces only for `watch.namespaces = ["*"]`, which
this program never sets). With an explicit list every request is namespaced
(`OperatorMain.watchConfiguredNamespaces` -> `client.usingNamespace`), so the operator holds no
cluster-wide permission at all: no ClusterRole, no ClusterRoleBinding."""


class CloudStateArgs(ConfigModel):
    """CloudState settings (stack key `cloudstation:platform.cloudstate`)."""

    extra_watched_namespaces: list[DnsLabel] = []
    """Namespaces of ANOTHER stack on the same cluster whose entities this stack's operator must
    run (the owning stack lists the other stack's platform and project namespaces). Only allowed
    when this stack owns the cluster resources."""
    operator_resources: kb.Resources = kb.Resources(
        cpu_request="100m", memory_request="256Mi", cpu_limit="500m", memory_limit="256Mi"
    )
    operator_java_opts: str = Field(default="-Xms128m -Xmx128m", pattern=r"^(-X\S+)( -X\S+)*$")
    """JVM options of the operator (upstream default); keep the heap well below the memory limit."""
    # Developer-cluster sizes (both example stacks fit one 4-CPU/8-GiB kind node together,
    # tests/test_cluster_fit.py); docs/cloudstate.md "Sizing" has prod sizes.
    sidecar_resources: kb.Resources = kb.Resources(
        cpu_request="100m", memory_request="256Mi", cpu_limit="1", memory_limit="512Mi"
    )
    """The CloudState proxy sidecar of every entity pod (a JVM: its heap `sidecarJvmMemory` plus
    the JVM's own memory; the operator's own default is 400m/512Mi for a 256m heap)."""
    sidecar_jvm_memory: str = Field(default="128m", pattern=r"^[0-9]+[mMgG]$")
    """Heap of the proxy sidecar: the operator passes it unchecked into the proxy's
    `JAVA_OPTS=-Xms<m> -Xmx<m>`, hence the strict pattern. Keep it at most half the memory limit."""
    entity_resources: kb.Resources = kb.Resources(
        cpu_request="25m", memory_request="64Mi", cpu_limit="500m", memory_limit="256Mi"
    )
    """The user-function container of every entity pod."""

    @model_validator(mode="after")
    def _heap_fits_the_sidecar(self) -> "CloudStateArgs":
        # -Xms = -Xmx: the whole heap is committed, and the JVM needs about as much again
        # (metaspace, code cache, threads, Netty buffers) within the container's memory limit.
        heap = _bytes(self.sidecar_jvm_memory)
        limit = _bytes(self.sidecar_resources.memory_limit)
        if limit is not None and heap is not None and 2 * heap > limit:
            raise problem(
                f"the proxy's heap may use at most half of sidecarResources.memoryLimit "
                f"({self.sidecar_resources.memory_limit}); lower it or raise the limit",
                ".sidecarJvmMemory",
                self.sidecar_jvm_memory,
            )
        return self


def _bytes(size: str) -> Optional[int]:
    """`256m`/`1G` (JVM) or `512Mi`/`1Gi`/`1G` (Kubernetes) in bytes; None if it is neither."""
    match = re.fullmatch(r"([0-9]+)([kKmMgG]i?)?", size)
    if not match:
        return None
    power = {"": 0, "k": 1, "m": 2, "g": 3}[(match[2] or "")[:1].lower()]
    # The JVM's k/m/g are binary; so are Kubernetes' Ki/Mi/Gi (its decimal M/G are close enough here).
    return int(match[1]) * 1024**power


@dataclass(frozen=True)
class OperatorArgs:
    settings: CloudStateArgs
    namespace: pulumi.Input[str]
    """Where the operator runs (the platform namespace); its ServiceAccount is bound there."""
    watch_namespaces: Sequence[str]
    """Exactly the namespaces whose StatefulStores and StatefulServices it reconciles."""
    kubernetes_api: network.KubernetesApi
    """Where it reaches the API server (platform.kubernetesApi), the only egress it gets."""
    image_mirror: Optional[str] = None


# --- pure builders ---------------------------------------------------------------------------


def proxy_images(mirror: Optional[str] = None) -> dict[str, str]:
    return {key: versions.image(image, mirror) for key, image in PROXY_IMAGES.items()}


def operator_config(watch_namespaces: Sequence[str], images: dict[str, str]) -> str:
    """The HOCON the operator reads from its ConfigMap (key `config`); JSON values are valid HOCON."""
    watched = sorted(set(watch_namespaces))
    if not watched or "*" in watched:
        raise ValueError("the operator must watch an explicit, non-empty list of namespaces")
    lines = [
        "cloudstate.operator {",
        f"  watch.namespaces = {json.dumps(watched)}",
        "  proxy.image {",
        *[f"    {key} = {json.dumps(images[key])}" for key in sorted(images)],
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def operator_pod_spec(image: str, settings: CloudStateArgs) -> dict:
    return {
        "serviceAccountName": NAME,
        "securityContext": kb.pod_security(UID, run_as_group=0),
        "containers": [
            {
                "name": "operator",
                "image": image,
                "env": [
                    {"name": "JAVA_OPTS", "value": settings.operator_java_opts},
                    {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "CONFIG_MAP", "value": CONFIG_MAP},
                ],
                "resources": settings.operator_resources.spec(),
                # No probes: the operator serves no HTTP endpoint (it only watches the API server).
                "securityContext": kb.container_security(read_only_root=True, run_as_user=UID),
                # The JVM writes hsperfdata and temporary files under /tmp.
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }


def namespace_access(namespace: pulumi.Input[str], operator_namespace: str) -> tuple[dict, dict]:
    """(Role, RoleBinding) bodies that let the operator (ServiceAccount `cloudstate-operator` in
    `operator_namespace`) reconcile `namespace`, and nothing else."""
    meta = kb.metadata(NAMESPACE_ROLE, namespace, "cloudstate-operator")
    role = {"metadata": meta, "rules": NAMESPACE_RULES}
    binding = {
        "metadata": meta,
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": operator_namespace}],
        "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAMESPACE_ROLE},
    }
    return role, binding


# --- component -------------------------------------------------------------------------------


class CloudStateOperator(Component):
    """Outputs: `crds` (the two CRD resources; custom resources must depend on them),
    `deployment` (the operator), `ready` (both, for depends_on)."""

    def __init__(self, name: str, args: OperatorArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:cloudstate:Operator", name, None, opts)
        child = self.child_opts()
        # Deleting a CRD deletes every custom resource of its kind in the cluster: every stack's
        # StatefulServices and StatefulStores, whichever stack owns them. They outlive this stack.
        self.crds = [
            k8s.apiextensions.v1.CustomResourceDefinition(
                f"{name}-{crd['spec']['names']['plural']}",
                metadata=crd["metadata"],
                spec=crd["spec"],
                opts=self.child_opts(retain_on_delete=True),
            )
            for crd in crds.crds()
        ]
        account = k8s.core.v1.ServiceAccount(
            f"{name}-account", metadata=kb.metadata(NAME, args.namespace, "cloudstate-operator"), opts=child
        )
        config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=kb.metadata(CONFIG_MAP, args.namespace, "cloudstate-operator"),
            data={"config": operator_config(args.watch_namespaces, proxy_images(args.image_mirror))},
            opts=child,
        )
        subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": args.namespace}]
        config_reader = k8s.rbac.v1.Role(
            f"{name}-config-reader",
            metadata=kb.metadata("cloudstate-operator-config-reader", args.namespace, "cloudstate-operator"),
            rules=[{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "watch"], "resourceNames": [CONFIG_MAP]}],
            opts=child,
        )
        config_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-config-reader-binding",
            metadata=kb.metadata("cloudstate-operator-config-reader-binding", args.namespace, "cloudstate-operator"),
            subjects=subject,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cloudstate-operator-config-reader"},
            opts=self.child_opts(depends_on=[config_reader]),
        )
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=kb.metadata(NAME, args.namespace, "cloudstate-operator"),
            spec={
                "replicas": 1,
                # Two operators would reconcile the same resources at once.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": kb.selector_labels(NAME)},
                "template": {
                    "metadata": {
                        "labels": kb.labels(NAME, "cloudstate-operator"),
                        "annotations": {"sidecar.istio.io/inject": "false"},
                    },
                    "spec": operator_pod_spec(versions.image("cloudstate-operator", args.image_mirror), args.settings),
                },
            },
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[*self.crds, account, config, config_binding]
            ),
        )
        # It only talks to the Kubernetes API (it serves no webhook), so nothing may connect to it.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            **network.policy(
                NAME, args.namespace, "cloudstate-operator",
                network.spec({"matchLabels": kb.selector_labels(NAME)}, ingress_rules=[], egress_rules=[network.kubernetes_api(args.kubernetes_api)]),
            ),
            opts=child,
        )
        self.ready: list[pulumi.Resource] = [*self.crds, self.deployment]
        self.register_outputs({"crds": [c.metadata.name for c in self.crds], "deployment": self.deployment.metadata.name})
