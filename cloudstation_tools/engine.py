"""What the Pulumi engine and pulumi-kubernetes 4.34.2 do with a rendered graph, which mocks skip.

Pulumi's mocks record what the program registers; they neither wait for objects to become ready
nor decide whether a change is an in-place update or a replacement (reference pulumi.md §4.4).
This module models both, from the upstream source, so that tests can check the graph for the two
ways a real `pulumi up` goes wrong that a mock run cannot show:

- an await that cannot finish: the provider waits for something (pods behind a Service, a Job's
  completion, a PVC's binding) that no object in the graph makes happen, or that only an object
  created after the await would make happen;
- an update that cannot be applied: a change to a field the API server refuses to update in place,
  or a replacement that creates an object under the name its predecessor still holds.

Sources, read at pulumi/pulumi-kubernetes's newest stored snapshot (4.32.0 plus unreleased changes,
2026-07-01; the v4.34.2 tag is not in the stored mirror, and none of the files below changed after
March 2026) and pulumi/pulumi's (2026-08-21), cited per rule below:

- provider/pkg/await/awaiters.go `awaiters` (which kinds are awaited, and for what), await.go
  `Creation`/`Update` (the await runs after every create and update, with a 10-minute default),
  metadata/overrides.go `ReadyCondition` (`pulumi.com/skipAwait`, `pulumi.com/waitFor`);
- provider/pkg/provider/provider.go `Diff` and diff.go `forceNewProperties` (which changes replace),
  metadata/naming.go (`IsNamed`, `IsAutonamed`: when a replacement deletes first);
- pulumi/pulumi pkg/resource/deploy/step_generator.go (`applyReplaceOnChanges`, and the program's
  `deleteBeforeReplace` overriding the provider's);
- kubernetes/kubernetes pkg/apis/*/validation, the `Validate...Update` functions named in
  `IMMUTABLE` (which fields the API server refuses to change in place).

The installed SDK (pulumi-kubernetes 4.34.2, requirements.txt) documents the same awaited kinds
and `replaceUnready` in its docstrings; tests/test_engine_awaits.py checks the two agree.

Everything here is a pure function of `resources.json` entries (`Rendered.resources()`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

PULUMI_KUBERNETES = "4.34.2"

# --- annotations (provider/pkg/metadata/annotations.go) --------------------------------------------

SKIP_AWAIT = "pulumi.com/skipAwait"
WAIT_FOR = "pulumi.com/waitFor"
REPLACE_UNREADY = "pulumi.com/replaceUnready"
AUTONAMED = "pulumi.com/autonamed"

NOT_OBJECTS = ("kubernetes:yaml", "kubernetes:helm.sh/", "kubernetes:kustomize", "pulumi:providers:")


def annotation_true(body: dict, key: str) -> bool:
    """metadata.IsAnnotationTrue: exactly the string "true" (not "True", not a bool)."""
    return ((body.get("metadata") or {}).get("annotations") or {}).get(key) == "true"


# --- the graph -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One registration as `resources.json` lists it."""

    urn: str
    type: str
    name: str
    custom: bool
    depends_on: tuple[str, ...]
    options: dict
    inputs: dict

    @classmethod
    def of(cls, entry: dict) -> "Resource":
        return cls(entry["urn"], entry["type"], entry["name"], entry["custom"], tuple(entry.get("dependsOn") or ()),
                   dict(entry.get("options") or {}), entry.get("inputs") or {})

    @property
    def is_object(self) -> bool:
        """A Kubernetes object the provider applies (not a provider, nor a yaml/helm wrapper)."""
        return self.custom and self.type.startswith("kubernetes:") and not self.type.startswith(NOT_OBJECTS)

    @property
    def kind(self) -> str:
        return self.inputs.get("kind", "")

    @property
    def api_version(self) -> str:
        return self.inputs.get("apiVersion", "")

    @property
    def gvk(self) -> str:
        """`<apiVersion>/<kind>`, the awaiters table's key (awaiters.go)."""
        return f"{self.api_version}/{self.kind}"

    @property
    def meta(self) -> dict:
        return self.inputs.get("metadata") or {}

    @property
    def object_name(self) -> Optional[str]:
        return self.meta.get("name")

    @property
    def namespace(self) -> str:
        return self.meta.get("namespace") or ""

    @property
    def annotations(self) -> dict:
        return self.meta.get("annotations") or {}

    @property
    def spec(self) -> dict:
        return self.inputs.get("spec") or {}

    def label(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.object_name} ({self.name})"


class Graph:
    """The registrations of one render, with the engine's ordering: a resource is created only
    after everything it depends on was created and, for Kubernetes objects, awaited."""

    def __init__(self, entries: Iterable[dict]):
        self.resources = [Resource.of(e) for e in entries]
        self.by_urn = {r.urn: r for r in self.resources}
        self.objects = [r for r in self.resources if r.is_object]
        self._waits_for: dict[str, frozenset[str]] = {}

    def waits_for(self, urn: str) -> frozenset[str]:
        """Every URN `urn` depends on, directly or through others."""
        if urn in self._waits_for:
            return self._waits_for[urn]
        seen: set[str] = set()
        stack = list(self.by_urn[urn].depends_on) if urn in self.by_urn else []
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(self.by_urn[current].depends_on if current in self.by_urn else ())
        self._waits_for[urn] = frozenset(seen)
        return self._waits_for[urn]

    def find(self, kind: str, name: str, namespace: str = "") -> Optional[Resource]:
        for obj in self.objects:
            if obj.kind == kind and obj.object_name == name and obj.namespace == namespace:
                return obj
        return None

    def provider_config(self) -> dict:
        """Inputs of the program's Kubernetes provider (enableConfigMapMutable, ...)."""
        providers = [r for r in self.resources if r.type == "pulumi:providers:kubernetes"]
        return dict(providers[0].inputs) if providers else {}


# --- awaits ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Await:
    waits_for: str
    source: str


AWAITERS: dict[str, Await] = {
    "apps/v1/Deployment": Await(
        "Available, the new ReplicaSet's pods Ready, and every PVC the pod template mounts Bound",
        "provider/pkg/await/deployment.go deploymentInitAwaiter.checkAndLogStatus, checkPersistentVolumeClaimStatus"),
    "apps/v1/StatefulSet": Await(
        "readyReplicas and currentReplicas equal spec.replicas and currentRevision equals updateRevision",
        "provider/pkg/await/statefulset.go statefulsetInitAwaiter.checkAndLogStatus"),
    "apps/v1/DaemonSet": Await(
        "every scheduled pod updated and available", "provider/pkg/await/daemonset.go"),
    "batch/v1/Job": Await(
        "started and condition Complete; fails at once on Failed (BackoffLimitExceeded, DeadlineExceeded)",
        "provider/pkg/await/job.go, await/checker/job/check.go jobStarted, jobComplete"),
    "v1/Pod": Await("Ready, or Succeeded", "provider/pkg/await/pod.go awaitPodInit, await/checker/pod/check.go"),
    "v1/Service": Await(
        "LoadBalancer: status.loadBalancer.ingress; with a selector (not headless, not ExternalName): the "
        "Endpoints settled (10 s after their last change) with no not-ready address",
        "provider/pkg/await/service.go serviceInitAwaiter.checkAndLogStatus, shouldWaitForPods, processEndpointEvent"),
    "v1/PersistentVolumeClaim": Await(
        "Bound, or Pending when its StorageClass binds WaitForFirstConsumer (5 minutes)",
        "provider/pkg/await/awaiters.go untilCoreV1PersistentVolumeClaimReady, pvcBindMode"),
    "v1/PersistentVolume": Await(
        "Available or Bound", "provider/pkg/await/awaiters.go untilCoreV1PersistentVolumeInitialized"),
    "v1/ReplicationController": Await(
        "availableReplicas equal spec.replicas", "awaiters.go untilCoreV1ReplicationControllerInitialized"),
    "v1/ResourceQuota": Await("status.hard equal spec.hard", "awaiters.go untilCoreV1ResourceQuotaInitialized"),
    "v1/Secret": Await(
        "type kubernetes.io/service-account-token only: data filled by the token controller",
        "awaiters.go untilCoreV1SecretInitialized"),
    "networking.k8s.io/v1/Ingress": Await(
        "status.loadBalancer.ingress set by an ingress controller, and Endpoints of every backend Service",
        "provider/pkg/await/ingress.go ingressInitAwaiter.checkAndLogStatus, checkIfEndpointsReady"),
}
"""The awaiters table's entries with an await function, for the API versions Kubernetes 1.33+
serves (awaiters.go `awaiters`; ConfigMap, RBAC, HPA, LimitRange, StorageClass have none, and a
ServiceAccount waits for nothing on 1.24+: `untilCoreV1ServiceAccountInitialized`). Any other kind,
custom resources included, is ready at once (`ReadyCondition` returns `NewImmediate` unless
PULUMI_K8S_AWAIT_ALL=true, which these checks assume unset)."""

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod")


def awaited(obj: Resource) -> Optional[Await]:
    """What the provider waits for after creating or updating `obj`, or None when nothing.

    await.go `Creation`/`Update`: `metadata.ReadyCondition` first; `pulumi.com/skipAwait: "true"`
    makes it immediate, `pulumi.com/waitFor` replaces the built-in awaiter with the program's
    condition; otherwise the `awaiters` entry for the object's apiVersion/kind runs."""
    if annotation_true(obj.inputs, SKIP_AWAIT):
        return None
    if obj.annotations.get(WAIT_FOR):
        return Await(f"the program's condition {obj.annotations[WAIT_FOR]!r}",
                     "provider/pkg/metadata/overrides.go ReadyCondition")
    rule = AWAITERS.get(obj.gvk)
    if rule is None:
        return None
    if obj.kind == "Secret" and obj.inputs.get("type") != "kubernetes.io/service-account-token":
        return None
    if obj.kind == "Service" and not _service_waits(obj):
        return None
    return rule


def _service_waits(service: Resource) -> bool:
    """service.go `shouldWaitForPods` (no wait when ExternalName, headless or without a selector)
    or type LoadBalancer (`processServiceEvent`)."""
    spec = service.spec
    kind = spec.get("type", "ClusterIP")
    if kind == "LoadBalancer":
        return True
    return kind != "ExternalName" and spec.get("clusterIP") != "None" and bool(spec.get("selector"))


@dataclass(frozen=True)
class Cluster:
    """What the checks assume of the target cluster: the only facts outside the graph they use."""

    default_storage_class: Optional[str] = "standard"
    binding_modes: tuple[tuple[str, str], ...] = (("standard", "WaitForFirstConsumer"),)
    """kind's default class (kubernetes-sigs/kind pkg/build/nodeimage/const_storage.go: `standard`,
    rancher.io/local-path, WaitForFirstConsumer). On another cluster, name its default class here
    when it is not WaitForFirstConsumer or Immediate."""

    def binding_mode(self, storage_class: Optional[str]) -> Optional[str]:
        return dict(self.binding_modes).get(storage_class or self.default_storage_class or "")


KIND_CLUSTER = Cluster()

BUILTIN_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")


def pod_template(obj: Resource) -> Optional[dict]:
    """The pod template (metadata + spec) of a workload; a Pod is its own."""
    if obj.kind == "Pod":
        return {"metadata": obj.meta, "spec": obj.spec}
    if obj.kind in WORKLOAD_KINDS:
        return obj.spec.get("template")
    return None


def pod_references(spec: dict) -> list[tuple[str, str]]:
    """(kind, name) of every namespaced object a pod needs before its containers start (a missing
    one leaves it Pending or in CreateContainerConfigError); `optional: true` ones excluded."""
    refs: list[tuple[str, str]] = []
    account = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if account and account != "default":
        refs.append(("ServiceAccount", account))
    for secret in spec.get("imagePullSecrets") or []:
        refs.append(("Secret", secret["name"]))
    for volume in spec.get("volumes") or []:
        if "configMap" in volume and not volume["configMap"].get("optional"):
            refs.append(("ConfigMap", volume["configMap"]["name"]))
        if "secret" in volume and not volume["secret"].get("optional"):
            refs.append(("Secret", volume["secret"]["secretName"]))
        if "persistentVolumeClaim" in volume:
            refs.append(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
        for source in (volume.get("projected") or {}).get("sources") or []:
            for key, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
                if key in source and not source[key].get("optional"):
                    refs.append((kind, source[key]["name"]))
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for env in container.get("env") or []:
            value_from = env.get("valueFrom") or {}
            for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if key in value_from and not value_from[key].get("optional"):
                    refs.append((kind, value_from[key]["name"]))
        for source in container.get("envFrom") or []:
            for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                if key in source and not source[key].get("optional"):
                    refs.append((kind, source[key]["name"]))
    return sorted(set(refs))


def selects(selector: dict, labels: dict) -> bool:
    """A Service's equality selector (every key/value) matches pod labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def await_problems(graph: Graph, cluster: Cluster = KIND_CLUSTER) -> list[str]:
    """Every awaited object whose await cannot finish from the graph alone: it waits for
    something no object in the graph makes, or something only an object created after it makes
    (a deadlock: the engine creates dependents only once the await is done)."""
    problems: list[str] = []
    for obj in graph.objects:
        rule = awaited(obj)
        if rule is None:
            continue
        problems += [f"{obj.label()}: {p} (awaits {rule.waits_for}; {rule.source})"
                     for p in readiness_problems(graph, obj, cluster)]
    return problems


def readiness_problems(graph: Graph, obj: Resource, cluster: Cluster = KIND_CLUSTER) -> list[str]:
    """Why the provider's await of `obj` (as if awaited) could not finish from the graph alone."""
    if obj.annotations.get(WAIT_FOR):
        return ["a custom waitFor condition cannot be checked against the graph"]
    if obj.kind == "Service":
        return _service_problems(graph, obj)
    if obj.kind == "Ingress":
        return ["only an ingress controller, outside the graph, sets status.loadBalancer: needs skipAwait"]
    if obj.kind == "PersistentVolumeClaim":
        return _claim_problems(graph, obj, cluster)
    if pod_template(obj) is not None:
        return _workload_problems(graph, obj)
    return []


def _service_problems(graph: Graph, service: Resource) -> list[str]:
    if service.spec.get("type") == "LoadBalancer":
        return ["only a load-balancer controller, outside the graph, sets status.loadBalancer: needs skipAwait"]
    # The await passes on an empty Endpoints object once settled but blocks while any selected pod
    # is not ready; pods made outside the graph (by an operator) make its outcome a race.
    selector = service.spec.get("selector") or {}
    backends = [
        w for w in graph.objects
        if w.namespace == service.namespace and pod_template(w) is not None
        and selects(selector, (pod_template(w).get("metadata") or {}).get("labels") or {})
    ]
    if not backends:
        return [f"selector {selector} matches no pod template in the graph (pods made by a controller outside "
                f"the graph decide when it is ready): needs skipAwait"]
    return []


def _workload_problems(graph: Graph, workload: Resource) -> list[str]:
    spec = (pod_template(workload) or {}).get("spec") or {}
    problems = []
    for kind, name in pod_references(spec):
        ref = graph.find(kind, name, workload.namespace)
        if ref is None:
            problems.append(f"its pods need {kind} {workload.namespace}/{name}, which is not in the graph")
        elif workload.urn in graph.waits_for(ref.urn):
            problems.append(f"its pods need {kind} {name}, which is created only after it is ready (deadlock)")
    priority = spec.get("priorityClassName")
    if priority and priority not in BUILTIN_PRIORITY_CLASSES:
        ref = graph.find("PriorityClass", priority)
        if ref is None:
            problems.append(f"its pods need PriorityClass {priority}, which is not in the graph")
        elif workload.urn in graph.waits_for(ref.urn):
            problems.append(f"its pods need PriorityClass {priority}, created only after it is ready (deadlock)")
    return problems


def claim_binding_mode(graph: Graph, claim: Resource, cluster: Cluster) -> Optional[str]:
    """The volumeBindingMode the PVC await reads (awaiters.go `pvcBindMode`: the class named by
    the live claim's storageClassName, which the DefaultStorageClass admission plugin sets when the
    program leaves it unset); None when it cannot be read, and the await then requires Bound."""
    name = claim.spec.get("storageClassName")
    in_graph = graph.find("StorageClass", name) if name else None
    if in_graph is not None:
        return in_graph.inputs.get("volumeBindingMode", "Immediate")
    return cluster.binding_mode(name)


def consumers(graph: Graph, claim: Resource) -> list[Resource]:
    """Workloads in the graph whose pods mount `claim`."""
    return [
        w for w in graph.objects
        if w.namespace == claim.namespace and pod_template(w) is not None
        and ("PersistentVolumeClaim", claim.object_name) in pod_references((pod_template(w) or {}).get("spec") or {})
    ]


def _claim_problems(graph: Graph, claim: Resource, cluster: Cluster) -> list[str]:
    # WaitForFirstConsumer: ready while Pending, so a consumer that waits for the claim is fine.
    # Immediate: the provisioner binds it without a consumer. Unknown: the await needs Bound,
    # which a WaitForFirstConsumer volume reaches only once a pod using it is scheduled.
    if claim_binding_mode(graph, claim, cluster) in ("WaitForFirstConsumer", "Immediate"):
        return []
    waiting = [w.label() for w in consumers(graph, claim) if claim.urn in graph.waits_for(w.urn)]
    if waiting:
        return [f"its StorageClass is unknown, so the await needs Bound, while its consumers {waiting} are "
                f"created only after it (deadlock): set storageClassName or skipAwait"]
    return []


def replace_unready(obj: Resource) -> bool:
    """provider.go `Diff`: with `pulumi.com/replaceUnready: "true"` on a Job, a live Job that is not
    ready (not started, or not Complete: checker/job `NewJobChecker`) is replaced on the next update,
    even with no other change. Without it a failed Job is only re-awaited, never re-run: its
    spec.template cannot change in place."""
    return obj.kind == "Job" and annotation_true(obj.inputs, REPLACE_UNREADY)


# --- replacements ----------------------------------------------------------------------------------

Path = tuple[Any, ...]
"""A property path: keys (str) and list indexes (int); '*' in a pattern matches any one segment."""

_LABEL_SELECTOR = (("matchExpressions",), ("matchLabels",))
_CONTAINER_FIELDS = (
    "args", "command", "env", "image", "imagePullPolicy", "lifecycle", "livenessProbe", "ports",
    "readinessProbe", "resources", "securityContext", "stdin", "stdinOnce", "terminationMessagePath",
    "terminationMessagePolicy", "tty", "volumeDevices", "volumeMounts", "workingDir",
)


def _selector(*prefix: str) -> tuple[Path, ...]:
    return ((*prefix,), *((*prefix, *rest) for rest in _LABEL_SELECTOR))


_POD_FIELDS = (
    "affinity", "automountServiceAccountToken", "dnsConfig", "dnsPolicy", "enableServiceLinks", "hostAliases",
    "hostIPC", "hostNetwork", "hostPID", "hostname", "imagePullSecrets", "nodeName", "nodeSelector", "overhead",
    "preemptionPolicy", "priority", "priorityClassName", "readinessGates", "restartPolicy", "runtimeClassName",
    "schedulerName", "securityContext", "serviceAccount", "serviceAccountName", "shareProcessNamespace",
    "subdomain", "terminationGracePeriodSeconds", "volumes",
)
_PV_SOURCES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "csi", "fc", "flexVolume", "flocker",
    "gcePersistentDisk", "glusterfs", "hostPath", "iscsi", "local", "nfs", "photonPersistentDisk", "portworxVolume",
    "quobyte", "rbd", "scaleIO", "storageos", "vsphereVolume",
)

FORCE_NEW: dict[str, tuple[Path, ...]] = {
    "apps/v1/Deployment": _selector("spec", "selector"),
    "apps/v1/DaemonSet": _selector("spec", "selector"),
    "apps/v1/StatefulSet": (
        ("spec", "podManagementPolicy"), ("spec", "revisionHistoryLimit"), ("spec", "serviceName"),
        ("spec", "volumeClaimTemplates"), *_selector("spec", "selector")),
    "batch/v1/Job": (
        ("spec", "completions"), ("spec", "parallelism"), ("spec", "template"), *_selector("spec", "selector")),
    "v1/PersistentVolume": tuple(("spec", source) for source in _PV_SOURCES),
    "v1/PersistentVolumeClaim": (
        ("spec", "accessModes"), ("spec", "storageClassName"), ("spec", "volumeName"), *_selector("spec", "selector")),
    "v1/Pod": (
        *(("spec", f) for f in _POD_FIELDS),
        *(("spec", containers, "*", f) for containers in ("containers", "initContainers") for f in _CONTAINER_FIELDS)),
    "v1/ResourceQuota": (("spec", "scopes"),),
    "v1/Service": (("spec", "clusterIP"),),
    "policy/v1beta1/PodDisruptionBudget": (("spec",),),
    "rbac.authorization.k8s.io/v1/RoleBinding": (("roleRef",),),
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding": (("roleRef",),),
    "storage.k8s.io/v1/StorageClass": (("parameters",), ("provisioner",)),
}
"""provider/pkg/provider/diff.go `forceNew` (per group/version/kind; served versions only): a change
under one of these paths makes the provider's Diff ask for a replacement."""


def force_new_paths(obj: Resource, provider_config: dict) -> tuple[Path, ...]:
    """diff.go `forceNewProperties`: metadata name and namespace for every kind, the table's paths,
    and a Secret's type/data/stringData (a ConfigMap's data/binaryData) unless the provider is
    configured to mutate them in place (`enableSecretMutable`, `enableConfigMapMutable`, default
    false: provider.go `Configure`) and the object is not `immutable`. *Patch resources: only
    name and namespace (provider.go `Diff`, `kinds.IsPatchResource`)."""
    paths: tuple[Path, ...] = (("metadata", "name"), ("metadata", "namespace"))
    if obj.type.endswith("Patch"):
        return paths
    immutable = obj.inputs.get("immutable") is True
    if obj.gvk == "v1/Secret":
        if not _flag(provider_config, "enableSecretMutable") or immutable:
            return (*paths, ("type",), ("stringData",), ("data",))
        return (*paths, ("type",))
    if obj.gvk == "v1/ConfigMap":
        if not _flag(provider_config, "enableConfigMapMutable") or immutable:
            return (*paths, ("binaryData",), ("data",))
        return paths
    return (*paths, *FORCE_NEW.get(obj.gvk, ()))


def _flag(config: dict, key: str) -> bool:
    value = config.get(key)
    return value is True or value == "true"


IMMUTABLE: dict[str, tuple[tuple[Path, ...], tuple[Path, ...]]] = {
    # ValidateStatefulSetUpdate: "updates to statefulset spec for fields other than 'replicas',
    # 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit',
    # 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden".
    "apps/v1/StatefulSet": ((("spec",),), (
        ("spec", "replicas"), ("spec", "ordinals"), ("spec", "template"), ("spec", "updateStrategy"),
        ("spec", "revisionHistoryLimit"), ("spec", "persistentVolumeClaimRetentionPolicy"),
        ("spec", "minReadySeconds"))),
    # ValidateDeploymentUpdate / ValidateDaemonSetUpdate / ValidateReplicaSetUpdate (apps/v1).
    "apps/v1/Deployment": ((("spec", "selector"),), ()),
    "apps/v1/DaemonSet": ((("spec", "selector"),), ()),
    "apps/v1/ReplicaSet": ((("spec", "selector"),), ()),
    # ValidateJobSpecUpdate (batch): the pod template (but for a suspended Job's scheduling
    # directives), selector, completions (but elastic Indexed Jobs), and the failure policies.
    "batch/v1/Job": ((
        ("spec", "template"), ("spec", "selector"), ("spec", "manualSelector"), ("spec", "completions"),
        ("spec", "completionMode"), ("spec", "podFailurePolicy"), ("spec", "backoffLimitPerIndex"),
        ("spec", "successPolicy"), ("spec", "managedBy")), ()),
    # ValidateServiceUpdate: the allocated cluster IPs.
    "v1/Service": ((("spec", "clusterIP"), ("spec", "clusterIPs")), ()),
    # ValidatePersistentVolumeClaimUpdate: the spec, but a larger storage request and the
    # volume attributes class.
    "v1/PersistentVolumeClaim": ((("spec",),), (
        ("spec", "resources", "requests", "storage"), ("spec", "volumeAttributesClassName"))),
    "v1/PersistentVolume": (tuple(("spec", s) for s in _PV_SOURCES), ()),
    # ValidateSecretUpdate: the type, always.
    "v1/Secret": ((("type",),), ()),
    # ValidateRoleBindingUpdate / ValidateClusterRoleBindingUpdate.
    "rbac.authorization.k8s.io/v1/RoleBinding": ((("roleRef",),), ()),
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding": ((("roleRef",),), ()),
    # ValidatePriorityClassUpdate: value and preemptionPolicy.
    "scheduling.k8s.io/v1/PriorityClass": ((("value",), ("preemptionPolicy",)), ()),
    # ValidateStorageClassUpdate.
    "storage.k8s.io/v1/StorageClass": (
        (("parameters",), ("provisioner",), ("reclaimPolicy",), ("volumeBindingMode",)), ()),
}
"""Fields the API server refuses to change in place (kubernetes/kubernetes pkg/apis/*/validation,
the named `Validate...Update` functions): (immutable prefixes, mutable exceptions below them).
Name and namespace are every object's identity; `immutable: true` ConfigMaps and Secrets also
freeze their data (ValidateConfigMapUpdate, ValidateSecretUpdate)."""


def immutable(obj: Resource, path: Path) -> bool:
    """Whether the API server rejects an in-place change of `path` on `obj`."""
    if path[:2] in (("metadata", "name"), ("metadata", "namespace")):
        return True
    if obj.kind in ("ConfigMap", "Secret") and obj.inputs.get("immutable") is True and path[0] in (
            "data", "binaryData", "stringData"):
        return True
    prefixes, exceptions = IMMUTABLE.get(obj.gvk, ((), ()))
    return any(_prefix(p, path) for p in prefixes) and not any(_prefix(e, path) for e in exceptions)


def _prefix(pattern: Path, path: Path) -> bool:
    return len(pattern) <= len(path) and all(p == "*" or p == q for p, q in zip(pattern, path))


def changed_paths(old: Any, new: Any, at: Path = ()) -> list[tuple[Path, Any]]:
    """Leaf paths where `new` differs from `old`, with the new value there (None when removed);
    lists element by element, as provider.go `addPatchArrayToDiff` does."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if key not in new:
                out.append(((*at, key), None))
            elif key not in old:
                out.append(((*at, key), new[key]))
            else:
                out += changed_paths(old[key], new[key], (*at, key))
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = []
        for index in range(max(len(old), len(new))):
            if index >= len(new):
                out.append(((*at, index), None))
            elif index >= len(old):
                out.append(((*at, index), new[index]))
            else:
                out += changed_paths(old[index], new[index], (*at, index))
        return out
    return [] if old == new else [(at, new)]


def _matches(pattern: Path, path: Path, value: Any) -> bool:
    """openapi/match.go `PatchPropertiesChanged` on `makePatchSlice(path, value)`: the JSONPath
    finds something in the one-path patch, i.e. the pattern is a prefix of the changed path, or
    the changed value holds the rest of the pattern."""
    if _prefix(pattern, path):
        return True
    if len(pattern) > len(path) and _prefix(pattern[: len(path)], path):
        return _holds(value, pattern[len(path):])
    return False


def _holds(value: Any, rest: Path) -> bool:
    if not rest:
        return True
    head, tail = rest[0], rest[1:]
    if head == "*" and isinstance(value, list):
        return any(_holds(v, tail) for v in value)
    if isinstance(value, dict) and head in value:
        return _holds(value[head], tail)
    return False


_SEGMENT = re.compile(r'\[(\d+|\*)\]|\["((?:[^"\\]|\\.)*)"\]|([^.\[\]]+)')


def property_path(text: str) -> Path:
    """sdk/go/common/resource/properties_path.go `ParsePropertyPath`: `a.b[0]["c.d"]`, `*`."""
    path: list[Any] = []
    for index, quoted, name in _SEGMENT.findall(text):
        if index:
            path.append("*" if index == "*" else int(index))
        elif quoted:
            path.append(quoted.replace('\\"', '"'))
        else:
            path.append(name)
    return tuple(path)


def _contains(pattern: Path, path: Path) -> bool:
    """`PropertyPath.Contains`: the pattern is a prefix of the path ('*' matches any segment)."""
    return _prefix(pattern, path)


@dataclass
class Change:
    """What the engine does with one object whose inputs changed between two renders."""

    old: Resource
    new: Resource
    paths: list[Path]
    provider_replaces: list[Path] = field(default_factory=list)
    """Paths whose change the provider's Diff answers with a replacement (forceNew)."""
    program_replaces: list[Path] = field(default_factory=list)
    """Other paths the program's replaceOnChanges turns into a replacement (engine side)."""

    @property
    def replaced(self) -> bool:
        return bool(self.provider_replaces or self.program_replaces)

    @property
    def same_name(self) -> bool:
        """provider.go `Diff`: named, not auto-named, same name and namespace as before."""
        return (bool(self.new.object_name) and not annotation_true(self.new.inputs, AUTONAMED)
                and self.new.object_name == self.old.object_name and self.new.namespace == self.old.namespace)

    def delete_before_replace(self, provider_replaces: bool) -> bool:
        """The replacement's order: the provider asks delete-before-replace when it found a
        replacement and the name stays (provider.go `Diff`); replaceOnChanges keeps the
        provider's answer (step_generator.go `applyReplaceOnChanges`); a program that sets
        `deleteBeforeReplace` either way wins (step_generator.go, `goal.DeleteBeforeReplace`)."""
        chosen = self.new.options.get("deleteBeforeReplace")
        if chosen is not None:
            return bool(chosen)
        return provider_replaces and self.same_name

    def problems(self) -> list[str]:
        """In-place updates the API server refuses, and replacements that collide.

        Per path, so that one diff of many changes answers for every subset of them: each
        immutable path must itself cause a replacement, and each path that causes one must
        delete first when the name stays (a create of the same name fails with AlreadyExists,
        await.go `Creation`; with upsertExistingObjects the later delete removes the new object,
        pulumi-kubernetes#2948)."""
        found = []
        label = self.new.label()
        for path in self.paths:
            shown = _show(path)
            if immutable(self.new, path) and path not in self.provider_replaces and path not in self.program_replaces:
                found.append(f"{label}: in-place update of immutable {shown} (API server rejects it; not in the "
                             f"provider's forceNew list for {self.new.gvk} nor in replaceOnChanges)")
            if path in self.provider_replaces and self.same_name and not self.delete_before_replace(True):
                found.append(f"{label}: {shown} replaces it under the same name with deleteBeforeReplace=False (collides)")
            if path in self.program_replaces and self.same_name and not self.delete_before_replace(False):
                found.append(f"{label}: replaceOnChanges replaces it on {shown} under the same name, but only the "
                             f"provider's replacements delete first: set deleteBeforeReplace=True (collides)")
            # Deleting first does not help a kept object: the engine's delete of a retainOnDelete
            # resource is a no-op, replacements included (pulumi/pulumi pkg/resource/deploy/step.go
            # `DeleteStep.Apply`, `s.old.RetainOnDelete`), so the create meets the old object.
            if (path in self.provider_replaces or path in self.program_replaces) and self.same_name \
                    and self.old.options.get("retainOnDelete"):
                found.append(f"{label}: {shown} replaces it under the same name, but it is retainOnDelete: the "
                             f"engine skips the delete and the create collides with the kept object")
        return found


def _show(path: Path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def diff(old: Resource, new: Resource, provider_config: Optional[dict] = None) -> Optional[Change]:
    """The engine's view of one object between two renders, or None when its inputs are equal.
    provider.go `Diff`: changed paths, minus `ignoreChanges`, those under a forceNew path replace;
    then step_generator.go `applyReplaceOnChanges` adds the program's replaceOnChanges."""
    provider_config = provider_config or {}
    changes = changed_paths(old.inputs, new.inputs)
    ignored = [property_path(p) for p in new.options.get("ignoreChanges", [])]
    changes = [(p, v) for p, v in changes if not any(_contains(i, p) for i in ignored)]
    if not changes:
        return None
    force_new = force_new_paths(new, provider_config)
    on_changes = [property_path(p) for p in new.options.get("replaceOnChanges", [])]
    change = Change(old, new, [p for p, _ in changes])
    for path, value in changes:
        if any(_matches(f, path, value) for f in force_new):
            change.provider_replaces.append(path)
        elif any(_contains(r, path) for r in on_changes):
            change.program_replaces.append(path)
    return change


def changes(before: Graph, after: Graph) -> list[Change]:
    """Every Kubernetes object present in both graphs (by URN) whose inputs changed."""
    config = after.provider_config()
    found = []
    for new in after.objects:
        old = before.by_urn.get(new.urn)
        if old is not None:
            change = diff(old, new, config)
            if change is not None:
                found.append(change)
    return found
