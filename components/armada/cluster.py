"""Cluster-scoped prerequisites of Armada: its PriorityClasses, the least-privilege roles of the
executors and binoculars, and the admission policy that keeps job pods in the job namespaces.

Only the stack that owns cluster resources creates them; bindings live with the executor and
binoculars components: one ClusterRoleBinding for what the executor reads cluster-wide, and
RoleBindings in each job namespace for everything either of them writes or reads there.

Upstream's roles (armada/NOTES.md §7) grant far more; what v0.22.7 actually does decides ours:
- executor (internal/executor/context/cluster_context.go): one cluster-wide informer factory over
  pods, nodes, events, services, ingresses and endpointslices (`WaitForCacheSync` waits for all,
  so each needs cluster-wide list/watch); it writes only pods (create, patch of an annotation,
  delete, and a direct get), services and ingresses (create, delete), in the jobs' namespaces.
  Dropped: `impersonate` (only with `kubernetes.impersonateUsers`, off and refused in settings),
  `nodes/proxy` (only the kubelet stats of `metric.exposeQueueUsageMetrics`, off and refused),
  `serviceaccounts/token` and `tokenreviews` (no code path uses them), every write to events,
  `update` and `deletecollection`.
- binoculars (internal/binoculars/service): reads logs of `armada-<job>-<n>` pods with its own
  client (impersonation is off); cordoning patches nodes cluster-wide, which we do not grant:
  cordon nodes with kubectl (docs/armada.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.armada.settings import PriorityClassSettings
from components.k8s import PART_OF
from components.component import Component

EXECUTOR_CLUSTER_ROLE = "cloudstation-armada-executor"
EXECUTOR_JOBS_ROLE = "cloudstation-armada-executor-jobs"
BINOCULARS_JOBS_ROLE = "cloudstation-armada-binoculars-jobs"
READ = ["get", "list", "watch"]

EXECUTOR_RULES = [
    {"apiGroups": [""], "resources": ["pods", "events", "nodes", "services"], "verbs": READ},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": READ},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": READ},
]
"""What the executor reads cluster-wide (its informers); nothing else, nothing written."""

EXECUTOR_JOB_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": ["create", "delete"]},
]
"""What the executor writes, granted only by RoleBindings in the job namespaces."""

BINOCULARS_LOG_RULE = {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}
BINOCULARS_JOB_RULES = [BINOCULARS_LOG_RULE]
"""Binoculars' only permission, in the job namespaces: job logs for Lookout."""

# --- the admission policy --------------------------------------------------------------------

JOB_POLICY = "cloudstation-armada-job-pods"
PLATFORM_LABEL_DOMAIN = "cloudstation.io"
"""Label keys in this domain (and its subdomains) are the platform's own (e.g. the scheduler's
client label); `app.kubernetes.io/part-of: cloudstation` marks the platform's objects."""


def cel_list(values: Sequence[str]) -> str:
    """A CEL list literal of strings (names are DNS labels and service-account user names:
    no quotes or backslashes to escape)."""
    for value in values:
        assert "'" not in value and "\\" not in value, value
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


POD_SPEC = "dyn(object.spec)"
"""A pod's spec in the policy's CEL, dynamically typed: the policy also matches services and ingresses,
whose specs lack the pod's fields (`job_policy_validations`)."""

QUEUE_LABEL = "armada_queue_id"
"""The label Armada's executor sets on a job's pod to the job's queue, over any label the job
asked for (v0.22.7 internal/executor/util/kubernetes_object.go `CreatePodFromExecutorApiJob`:
`util.MergeMaps(job labels, {domain.Queue: job.Queue, ...})`, the later map wins): a job cannot forge it."""


def cel_map(values: Mapping[str, str]) -> str:
    """A CEL map literal of strings (as `cel_list`: names, nothing to escape)."""
    for value in (*values, *values.values()):
        assert "'" not in value and "\\" not in value, value
    return "{" + ", ".join(f"'{k}': '{v}'" for k, v in values.items()) + "}"


SECRET_VOLUME_DRIVERS = ("csi", "flexVolume", "cephfs", "rbd", "azureFile", "iscsi", "scaleIO", "storageos")
"""Volume types that hand a named Secret to a storage driver (core/v1 PodSpec volumes; "baseline"
allows them): not in a build pod, which mounts its Secret as a plain `secret` volume."""


def build_secret_rule(build_namespace: str, build_secrets: Mapping[str, str]) -> dict:
    """In the builds namespace, a pod of queue `<project>-builds` refers to no Secret but
    `build_secrets[queue]` (its project's build credential, components/builds_namespace.py): secret
    and projected volumes, env and envFrom of every container kind, imagePullSecrets; no volume type
    that passes a Secret to a driver. A pod of another (build) queue cannot read another project's
    registry credential (issue 20 item 1)."""
    spec, queue = POD_SPEC, f"object.metadata.labels['{QUEUE_LABEL}']"
    own = f"{cel_map(build_secrets)}[{queue}]"
    volume = (f"(!has(v.secret) || (has(v.secret.secretName) && v.secret.secretName == {own})) && "
              f"(!has(v.projected) || !has(v.projected.sources) || v.projected.sources.all(x, !has(x.secret) || "
              f"(has(x.secret.name) && x.secret.name == {own}))) && "
              + " && ".join(f"!has(v.{driver})" for driver in SECRET_VOLUME_DRIVERS))
    reference = lambda ref: f"(has({ref}.name) && {ref}.name == {own})"  # noqa: E731
    container = (f"(!has(c.env) || c.env.all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef) || "
                 f"{reference('e.valueFrom.secretKeyRef')})) && "
                 f"(!has(c.envFrom) || c.envFrom.all(e, !has(e.secretRef) || {reference('e.secretRef')}))")
    checks = [f"(!has({spec}.volumes) || {spec}.volumes.all(v, {volume}))",
              *(f"(!has({spec}.{kind}) || {spec}.{kind}.all(c, {container}))"
                for kind in ("initContainers", "containers", "ephemeralContainers")),
              f"(!has({spec}.imagePullSecrets) || {spec}.imagePullSecrets.all(p, {reference('p')}))"]
    return {
        "expression": (
            f"request.namespace != '{build_namespace}' || request.kind.kind != 'Pod' || !has(object.metadata.labels) || "
            f"!('{QUEUE_LABEL}' in object.metadata.labels) || !({queue} in {cel_map(build_secrets)}) || ("
            + " && ".join(checks) + ")"
        ),
        "message": (f"a build pod in {build_namespace} may refer to no Secret but its own project's build credential "
                    f"({', '.join(f'queue {q}: {n}' for q, n in build_secrets.items())}), and to no volume type that "
                    "passes a Secret to a driver"),
        "reason": "Forbidden",
    }


IMAGE_ID = "(sha256|sha384|sha512):"
"""An image field that is an image ID (or a prefix of one), not a reference: containerd's CRI image
service resolves a full `sha256:<hex>` as the ID of a local image (LocalResolve: digest.Parse first),
Docker's image store a prefix too; whatever registry the image came from, the node runs it as is."""


def registry_image_pattern(node_port: Optional[int], service_hosts: Sequence[str],
                           pull_prefix: Optional[str] = None) -> str:
    """An RE2 pattern (also Python's `re`), case-insensitive, of the image references that name the
    platform registry, and of image IDs. The registry's names: `pull_prefix` (`host[:port][/path]`, what
    entity pods pull, so the exact name the nodes cache its images under; an external registry's too),
    `localhost:<nodePort>` and the other loopback forms of it (kube-proxy's
    iptables rule for NodePorts matches every local address, all of 127/8; ::1 and leading zeros of the
    port for good measure), and the Service's
    in-cluster names (`<service>.<namespace>[.svc[.<cluster domain>]]`, any port) where build pods push.
    Written for a CEL string literal: no quotes, and each regex backslash doubled."""
    names = []
    if pull_prefix:
        assert re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*", pull_prefix), pull_prefix
        names.append(pull_prefix.replace(".", "[.]") + "/")
    if node_port is not None:
        loopback = (r"localhost[.]?|127([.][0-9]{1,3}){3}|\\[[0:]*1\\]|\\[[0:]*ffff:127([.][0-9]{1,3}){3}\\]")
        names.append(f"({loopback}):0*{node_port}/")
    for host in service_hosts:
        assert re.fullmatch(r"[a-z0-9.-]+(:[0-9]+)?", host), host
        names.append(f"{host.replace('.', '[.]')}([.]svc([.][a-z0-9-]+)*)?[.]?(:[0-9]+)?/")
    return "(?i)^(" + "|".join([IMAGE_ID, *names]) + ")"


def registry_image_rule(node_port: Optional[int], service_hosts: Sequence[str],
                        pull_prefix: Optional[str] = None) -> dict:
    """No job pod names an image of the platform registry, nor an image ID (issue 20 re-review).

    The attack: a job (an Armada user's, not a CloudStation tenant) names `localhost:<nodePort>/shop/
    cart@sha256:…` with imagePullPolicy IfNotPresent; the kubelet finds the copy it pulled for shop's
    entity pods and runs it without asking the registry, so no credential is checked. Requiring
    `imagePullPolicy: Always` for these images would make the kubelet pull, and the registry refuse a
    job (it has no pull credential: job namespaces hold none, and a pod may only name Secrets of its own
    namespace). We refuse them outright instead, whatever the pull policy (the policy sees it after
    defaulting: a digest or a tag other than `latest` defaults to IfNotPresent), because:
    - no job legitimately runs them: build pods run the kaniko and fetch pins (from docker.io or
      `platform.imageMirror`, never this registry: their pods have no credential for it), and kaniko pulls
      base images itself, through `registryMirrors`, not through the kubelet; an Armada user's job has no
      pull credential for it at all, so such a pod could only ever run what a node has cached;
    - `Always` holds only while the nodes themselves hold no credential for the registry (a containerd
      hosts.toml `auth`, a kubelet credential provider): with one, the pull would succeed for any pod;
    - an image ID (`sha256:<hex>`) names a local image whatever its registry, and no pull policy is
      checked against a registry for it: refused in every namespace the policy covers.
    Every container kind (init, regular, ephemeral) and image volume (`volumes[].image.reference`).
    An UPDATE of `pods` is judged only on what it adds: an image the old pod already named is left alone, so
    a job pod created before this rule stays patchable by the executor (annotations). CREATE and the
    subresource pods/ephemeralcontainers are judged whole (a debug container could otherwise reuse an image
    the pod has). The names are the exact ones the nodes cache under (`registry_image_pattern`), and image IDs.
    Not covered by name: the Service's ClusterIP or a node's own address with the NodePort (not known
    when the policy is rendered); no node keeps an image under those names, and a pull from them needs a
    credential the job does not have."""
    spec, pattern = POD_SPEC, registry_image_pattern(node_port, service_hosts, pull_prefix)
    old = "dyn(oldObject.spec)"
    old_images = " + ".join([
        *(f"(has({old}.{kind}) ? {old}.{kind}.map(o, has(o.image) ? o.image : '') : [])"
          for kind in ("initContainers", "containers", "ephemeralContainers")),
        f"(has({old}.volumes) ? {old}.volumes.map(o, has(o.image) && has(o.image.reference) ? o.image.reference : '')"
        " : [])"])
    # Only evaluated for an image that matches: an UPDATE of the pod itself (no subresource) may keep it.
    kept = ("(request.operation == 'UPDATE' && (!has(request.subResource) || request.subResource == '') && "
            "{ref} in (" + old_images + "))")
    clean = lambda ref: f"(!{ref}.matches('{pattern}') || {kept.format(ref=ref)})"  # noqa: E731
    checks = [*(f"(!has({spec}.{kind}) || {spec}.{kind}.all(c, !has(c.image) || {clean('c.image')}))"
                for kind in ("initContainers", "containers", "ephemeralContainers")),
              f"(!has({spec}.volumes) || {spec}.volumes.all(v, !has(v.image) || !has(v.image.reference) || "
              f"{clean('v.image.reference')}))"]
    names = ([f"localhost:{node_port}", f"127.0.0.1:{node_port}"] if node_port is not None else []) + [
        f"{host}[.svc...]" for host in service_hosts]
    if pull_prefix and pull_prefix not in names:
        names.insert(0, f"{pull_prefix}/...")
    registry = f"images of the platform registry ({', '.join(names)}) or " if names else ""
    return {
        "expression": "request.kind.kind != 'Pod' || (" + " && ".join(checks) + ")",
        "message": (f"Armada jobs may not run {registry}an image ID (sha256:...): a node may hold another project's "
                    "image in its cache and would run it without asking the registry for a credential"),
        "reason": "Forbidden",
    }


def job_policy_validations(
    job_namespaces: Sequence[str], job_service_account: str, build_namespace: Optional[str] = None,
    build_queues: Sequence[str] = (), build_labels: Sequence[str] = (), build_user_namespace: bool = False,
    build_secrets: Optional[Mapping[str, str]] = None, registry_node_port: Optional[int] = None,
    registry_service_hosts: Sequence[str] = (), registry_pull_prefix: Optional[str] = None,
) -> list[dict]:
    """The rules: in a job namespace, as the designated service account, without platform labels.
    CEL against the admission request (`request`) and the object after mutating admission
    (`object`, so the ServiceAccount plugin has filled in `serviceAccountName`). With a builds
    namespace: only jobs of the build queues run there (its pods may read the registry's push
    credentials), and only they may carry `build_labels`; with `build_user_namespace`, its pods must
    run in their own user namespace (`hostUsers: false`); with `build_secrets` (queue -> Secret), a
    pod of a build queue refers to its own project's build Secret only (`build_secret_rule`). No pod
    names an image of the platform registry (`registry_pull_prefix`, `registry_node_port`,
    `registry_service_hosts`) or an image ID (`registry_image_rule`).

    Pod-only fields are read through `dyn(object.spec)`, each behind `request.kind.kind != 'Pod' ||`:
    the API server type-checks every validation against each kind `matchConstraints` matches
    (kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/typechecking.go:
    `object` typed as Pod, Service and Ingress in turn) and reports `object.spec.serviceAccountName`
    as an undefined field of Service and Ingress in `status.typeChecking`, although admission compiles
    `object` as dyn (plugin/cel/compile.go) and the guard short-circuits for them. Seen in the
    end-to-end tier (e2e/test_security.py); tests/test_armada_security.py checks it offline."""
    # A key whose prefix is the domain or a subdomain of it (core CEL `matches`, RE2 syntax).
    platform_label = f"k.matches('^([^/]*[.])?{PLATFORM_LABEL_DOMAIN.replace('.', '[.]')}/')"
    if build_namespace:
        platform_label += f" && !(request.namespace == '{build_namespace}' && k in {cel_list(build_labels)})"
    builds = [] if not build_namespace else [{
        "expression": (
            f"request.namespace != '{build_namespace}' || (has(object.metadata.labels) && "
            f"'{QUEUE_LABEL}' in object.metadata.labels && object.metadata.labels['{QUEUE_LABEL}'] in {cel_list(build_queues)})"
        ),
        "message": f"only jobs of the build queues ({', '.join(build_queues)}) run in the builds namespace {build_namespace}",
        "reason": "Forbidden",
    }]
    if build_namespace and build_user_namespace:
        # An API server whose UserNamespacesSupport gate is off drops `hostUsers` before validating
        # admission runs (kubernetes pkg/api/pod/util.go dropDisabledFields, called by the strategy's
        # PrepareForCreate in registry Store.Create ahead of createValidation): kaniko would then run
        # as the node's root with its capabilities. Refuse the pod instead (platform.builds.userNamespace).
        builds.append({
            "expression": (
                f"request.namespace != '{build_namespace}' || request.kind.kind != 'Pod' || "
                f"(has({POD_SPEC}.hostUsers) && {POD_SPEC}.hostUsers == false)"
            ),
            "message": (f"build pods in {build_namespace} must run in their own user namespace (hostUsers: false; "
                        "the API server drops it when its UserNamespacesSupport gate is off): enable user namespaces, "
                        "or set platform.builds.userNamespace: false knowingly (docs/builds.md)"),
            "reason": "Forbidden",
        })
    if build_namespace and build_secrets:
        builds.append(build_secret_rule(build_namespace, build_secrets))
    return [
        {
            "expression": f"request.namespace in {cel_list(job_namespaces)}",
            "message": f"Armada executors may only create objects in the job namespaces {', '.join(job_namespaces)}",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "request.kind.kind != 'Pod' || ("
                f"(!has({POD_SPEC}.serviceAccountName) || {POD_SPEC}.serviceAccountName == '{job_service_account}') && "
                f"(!has({POD_SPEC}.serviceAccount) || {POD_SPEC}.serviceAccount == '{job_service_account}'))"
            ),
            "message": f"Armada job pods run as the service account '{job_service_account}' only",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!has(object.metadata.labels) || ("
                f"!object.metadata.labels.exists(k, {platform_label}) && "
                "!('app.kubernetes.io/part-of' in object.metadata.labels && "
                f"object.metadata.labels['app.kubernetes.io/part-of'] == '{PART_OF}'))"
            ),
            "message": "Armada jobs may not carry the platform's own labels",
            "reason": "Forbidden",
        },
        registry_image_rule(registry_node_port, registry_service_hosts, registry_pull_prefix),
        *builds,
    ]


def job_policy(
    executor_users: Sequence[str], job_namespaces: Sequence[str], job_service_account: str,
    build_namespace: Optional[str] = None, build_queues: Sequence[str] = (), build_labels: Sequence[str] = (),
    build_user_namespace: bool = False, build_secrets: Optional[Mapping[str, str]] = None,
    registry_node_port: Optional[int] = None, registry_service_hosts: Sequence[str] = (),
    registry_pull_prefix: Optional[str] = None,
) -> dict:
    """A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in 1.30) on what the
    executors' service accounts create or change: pods, services, ingresses; and the subresource
    pods/ephemeralcontainers (`kubectl debug`: an UPDATE whose object is the whole Pod, which a rule on
    `pods` alone does not match), so that no rule on a pod's containers hangs on the executor lacking
    that right. The API server type-checks only the rules' resources (its `extractResources` skips
    subresources), so the expressions meet the same kinds as before."""
    return {
        "metadata": {"name": JOB_POLICY, "labels": cluster_labels("armada")},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["pods", "pods/ephemeralcontainers", "services"]},
                    {"apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["ingresses"]},
                ],
            },
            "matchConditions": [
                {"name": "an-armada-executor", "expression": f"request.userInfo.username in {cel_list(executor_users)}"},
            ],
            "validations": job_policy_validations(
                job_namespaces, job_service_account, build_namespace, build_queues, build_labels, build_user_namespace,
                build_secrets, registry_node_port, registry_service_hosts, registry_pull_prefix,
            ),
        },
    }


def job_policy_binding() -> dict:
    """Every namespace (a pod outside the job namespaces must be seen to be refused)."""
    return {
        "metadata": {"name": JOB_POLICY, "labels": cluster_labels("armada")},
        "spec": {"policyName": JOB_POLICY, "validationActions": ["Deny"]},
    }


def cluster_labels(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/component": "armada",
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
    }


def priority_class(name: str, settings: PriorityClassSettings) -> dict:
    # The value is the scheduler's priority for the class, so Kubernetes and Armada agree.
    return {
        "metadata": {"name": name, "labels": cluster_labels("armada")},
        "value": settings.priority,
        "global_default": False,
        "preemption_policy": "PreemptLowerPriority",
        "description": f"Armada jobs of priority class {name}"
        + (" (preemptible)" if settings.preemptible else ""),
    }


def cluster_role(name: str, rules: list[dict]) -> dict:
    return {"metadata": {"name": name, "labels": cluster_labels(name)}, "rules": rules}


def binding_name(namespace: str, service_account: str) -> str:
    # Cluster-scoped: the namespace keeps test's and prod's bindings apart on one cluster.
    return f"{namespace}-{service_account}"


def cluster_role_binding(name: str, role: str, service_account: str, namespace: str) -> dict:
    return {
        "metadata": {"name": name, "labels": cluster_labels(role)},
        "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def role_binding(name: str, namespace: str, role: str, service_account: str, account_namespace: str) -> dict:
    """A RoleBinding in `namespace` granting the ClusterRole `role` there only."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": cluster_labels(role)},
        "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": account_namespace}],
    }


@dataclass(frozen=True)
class ClusterPrerequisitesArgs:
    priority_classes: Mapping[str, PriorityClassSettings]
    binoculars: bool
    """Whether to create binoculars' role too."""
    executor_users: Sequence[str] = ()
    """Kubernetes user names of the executors' service accounts (the admission policy's subjects)."""
    job_namespaces: Sequence[str] = ()
    job_service_account: str = "default"
    build_namespace: Optional[str] = None
    """The builds namespace (also in `job_namespaces`): only jobs of `build_queues` run there."""
    build_queues: Sequence[str] = ()
    build_labels: Sequence[str] = ()
    """The platform labels build jobs carry (components/build_job.py), allowed in the builds namespace only."""
    build_user_namespace: bool = False
    """Build pods must set `hostUsers: false` (platform.builds.userNamespace)."""
    build_secrets: Mapping[str, str] = field(default_factory=dict)
    """Build queue -> the one Secret its pods may refer to (its project's build credential)."""
    registry_node_port: Optional[int] = None
    """The platform registry's NodePort, when it runs in this cluster: job pods may not name its images."""
    registry_service_hosts: Sequence[str] = ()
    """`<service>.<namespace>` of the platform registry in this cluster (the same)."""
    registry_pull_prefix: Optional[str] = None
    """`host[:port][/path]` entity images are pulled from (any registry mode): job pods may not name its images."""


class ClusterPrerequisites(Component):
    """PriorityClasses, ClusterRoles and the job admission policy. Attribute `resources`: what
    the executors must wait for."""

    def __init__(self, name: str, args: ClusterPrerequisitesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:ClusterPrerequisites", name, None, opts)
        child = self.child_opts()
        self.resources: list[pulumi.Resource] = []
        for class_name, settings in args.priority_classes.items():
            self.resources.append(
                k8s.scheduling.v1.PriorityClass(f"{name}-{class_name}", **priority_class(class_name, settings), opts=child)
            )
        self.resources.append(
            k8s.rbac.v1.ClusterRole(f"{name}-executor", **cluster_role(EXECUTOR_CLUSTER_ROLE, EXECUTOR_RULES), opts=child)
        )
        self.resources.append(
            k8s.rbac.v1.ClusterRole(f"{name}-executor-jobs", **cluster_role(EXECUTOR_JOBS_ROLE, EXECUTOR_JOB_RULES), opts=child)
        )
        if args.binoculars:
            self.resources.append(
                k8s.rbac.v1.ClusterRole(
                    f"{name}-binoculars-jobs", **cluster_role(BINOCULARS_JOBS_ROLE, BINOCULARS_JOB_RULES), opts=child
                )
            )
        if args.job_service_account != "default":
            # The designated account of job pods: bound to nothing, no token unless a job asks.
            for job_namespace in args.job_namespaces:
                self.resources.append(
                    k8s.core.v1.ServiceAccount(
                        f"{name}-job-account-{job_namespace}",
                        metadata={"name": args.job_service_account, "namespace": job_namespace,
                                  "labels": cluster_labels("armada-jobs")},
                        automount_service_account_token=False,
                        opts=child,
                    )
                )
        # The policy exists and is bound before any executor runs.
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-job-policy",
            **job_policy(args.executor_users, args.job_namespaces, args.job_service_account,
                         args.build_namespace, args.build_queues, args.build_labels, args.build_user_namespace,
                         args.build_secrets, args.registry_node_port, args.registry_service_hosts,
                         args.registry_pull_prefix),
            opts=child,
        )
        self.resources.append(policy)
        self.resources.append(
            k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                f"{name}-job-policy-binding", **job_policy_binding(), opts=self.child_opts(depends_on=[policy])
            )
        )
        self.register_outputs({})
