"""Kubernetes objects registered exactly as pulumi-kubernetes' classes register them, without loading them.

`from components import kube as k8s` stands in for `import pulumi_kubernetes as k8s`: the kinds in
KINDS (`k8s.apps.v1.Deployment(name, metadata=..., spec=..., opts=...)`) are small subclasses of
pulumi.CustomResource; every other name (`k8s.Provider`, `k8s.apiextensions.CustomResource`,
`k8s.core.v1.Secret.get`, a kind not listed) is pulumi-kubernetes' own.

Why: a generated class pulls in its whole API group version (every kind, input and output type of
it) and resolves the type hints of every nested input type at registration. For the test stack that
was a third of the render's CPU time, more than the rest of Pulumi (bench/render_cost.py).

What the engine receives is what pulumi-kubernetes 4.34.2 sends (each class's `_internal_init`,
e.g. pulumi_kubernetes/apps/v1/Deployment.py; summarised per kind in KINDS by scripts reading that
source): the type token; inputs under their wire names (`apiVersion`, `stringData`, ...), with
`apiVersion` and `kind` fixed, output-only properties left out (None is not sent: pulumi
sdk/python/lib/pulumi/runtime/rpc.py `serialize_properties`), Secret's `data`/`stringData` wrapped as
secrets; the options merged as the class merges them: the package's version
(`_utilities.get_resource_opts_defaults`), then `additional_secret_outputs`, then the aliases of the
kind's older API versions; the same required-property errors. Nested keys are sent as written:
components write wire names (components/k8s.py), which the generated classes send unchanged too;
only a snake_case name of a field they know would differ (they translate `resource_names` inside a
PolicyRule, from their input types' metadata: rpc.py `serialize_property`).
tests/test_kube_light.py registers every kind both ways and both stacks both ways and compares the
RegisterResourceRequests byte for byte (stack traces included), so such a key fails the suite.

Program-visible difference: an object's outputs are attributes by wire name (`stringData`, not
`string_data`), and only `metadata` is typed (ObjectMeta, so `obj.metadata.name` works as before);
the components read nothing else.
"""
from __future__ import annotations

import importlib
from typing import Any, NamedTuple, Optional

import pulumi
import pulumi_kubernetes
from pulumi_kubernetes import _utilities
from pulumi_kubernetes import meta as _meta  # noqa: F401  (lazy; resolves the `metadata` hint below)

UPSTREAM = False
"""True: every kind is pulumi-kubernetes' generated class (tests compare the two ways)."""


class Kind(NamedTuple):
    """One kind's `_internal_init`, as data."""

    token: str
    inputs: tuple[str, ...]
    """Python names of its inputs, in the class's order (apiVersion and kind are fixed)."""
    required: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    """Inputs wrapped in Output.secret."""
    additional_secret_outputs: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    """Types of the kind's older API versions."""


_STANDARD = ("api_version", "kind", "metadata", "spec")
_RBAC = "rbac.authorization.k8s.io"
_ADMISSION = "admissionregistration.k8s.io"

KINDS: dict[tuple[str, str, str], Kind] = {
    # (module path under pulumi_kubernetes, version, kind) -> what its class registers
    ("core", "v1", "ConfigMap"): Kind(
        "kubernetes:core/v1:ConfigMap", ("api_version", "binary_data", "data", "immutable", "kind", "metadata")),
    ("core", "v1", "Namespace"): Kind("kubernetes:core/v1:Namespace", _STANDARD),
    ("core", "v1", "PersistentVolumeClaim"): Kind("kubernetes:core/v1:PersistentVolumeClaim", _STANDARD),
    ("core", "v1", "Secret"): Kind(
        "kubernetes:core/v1:Secret", ("api_version", "data", "immutable", "kind", "metadata", "string_data", "type"),
        secret=("data", "string_data"), additional_secret_outputs=("data", "stringData")),
    ("core", "v1", "Service"): Kind("kubernetes:core/v1:Service", _STANDARD),
    ("core", "v1", "ServiceAccount"): Kind(
        "kubernetes:core/v1:ServiceAccount",
        ("api_version", "automount_service_account_token", "image_pull_secrets", "kind", "metadata", "secrets")),
    ("apps", "v1", "Deployment"): Kind(
        "kubernetes:apps/v1:Deployment", _STANDARD, required=("spec",),
        aliases=("kubernetes:apps/v1beta1:Deployment", "kubernetes:apps/v1beta2:Deployment",
                 "kubernetes:extensions/v1beta1:Deployment")),
    ("apps", "v1", "StatefulSet"): Kind(
        "kubernetes:apps/v1:StatefulSet", _STANDARD, required=("spec",),
        aliases=("kubernetes:apps/v1beta1:StatefulSet", "kubernetes:apps/v1beta2:StatefulSet")),
    ("batch", "v1", "CronJob"): Kind(
        "kubernetes:batch/v1:CronJob", _STANDARD, required=("spec",),
        aliases=("kubernetes:batch/v1beta1:CronJob", "kubernetes:batch/v2alpha1:CronJob")),
    ("batch", "v1", "Job"): Kind("kubernetes:batch/v1:Job", _STANDARD),
    ("networking", "v1", "NetworkPolicy"): Kind(
        "kubernetes:networking.k8s.io/v1:NetworkPolicy", _STANDARD,
        aliases=("kubernetes:extensions/v1beta1:NetworkPolicy",)),
    ("networking", "v1", "Ingress"): Kind(
        "kubernetes:networking.k8s.io/v1:Ingress", _STANDARD,
        aliases=("kubernetes:extensions/v1beta1:Ingress", "kubernetes:networking.k8s.io/v1beta1:Ingress")),
    ("rbac", "v1", "Role"): Kind(
        f"kubernetes:{_RBAC}/v1:Role", ("api_version", "kind", "metadata", "rules"),
        aliases=(f"kubernetes:{_RBAC}/v1alpha1:Role", f"kubernetes:{_RBAC}/v1beta1:Role")),
    ("rbac", "v1", "RoleBinding"): Kind(
        f"kubernetes:{_RBAC}/v1:RoleBinding", ("api_version", "kind", "metadata", "role_ref", "subjects"),
        required=("role_ref",),
        aliases=(f"kubernetes:{_RBAC}/v1alpha1:RoleBinding", f"kubernetes:{_RBAC}/v1beta1:RoleBinding")),
    ("rbac", "v1", "ClusterRole"): Kind(
        f"kubernetes:{_RBAC}/v1:ClusterRole", ("aggregation_rule", "api_version", "kind", "metadata", "rules"),
        aliases=(f"kubernetes:{_RBAC}/v1alpha1:ClusterRole", f"kubernetes:{_RBAC}/v1beta1:ClusterRole")),
    ("rbac", "v1", "ClusterRoleBinding"): Kind(
        f"kubernetes:{_RBAC}/v1:ClusterRoleBinding", ("api_version", "kind", "metadata", "role_ref", "subjects"),
        required=("role_ref",),
        aliases=(f"kubernetes:{_RBAC}/v1alpha1:ClusterRoleBinding", f"kubernetes:{_RBAC}/v1beta1:ClusterRoleBinding")),
    ("autoscaling", "v2", "HorizontalPodAutoscaler"): Kind(
        "kubernetes:autoscaling/v2:HorizontalPodAutoscaler", _STANDARD, required=("spec",),
        aliases=("kubernetes:autoscaling/v1:HorizontalPodAutoscaler", "kubernetes:autoscaling/v2beta1:HorizontalPodAutoscaler",
                 "kubernetes:autoscaling/v2beta2:HorizontalPodAutoscaler")),
    ("policy", "v1", "PodDisruptionBudget"): Kind(
        "kubernetes:policy/v1:PodDisruptionBudget", _STANDARD, aliases=("kubernetes:policy/v1beta1:PodDisruptionBudget",)),
    ("scheduling", "v1", "PriorityClass"): Kind(
        "kubernetes:scheduling.k8s.io/v1:PriorityClass",
        ("api_version", "description", "global_default", "kind", "metadata", "preemption_policy", "value"),
        required=("value",),
        aliases=("kubernetes:scheduling.k8s.io/v1alpha1:PriorityClass", "kubernetes:scheduling.k8s.io/v1beta1:PriorityClass")),
    ("apiextensions", "v1", "CustomResourceDefinition"): Kind(
        "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", _STANDARD, required=("spec",),
        aliases=("kubernetes:apiextensions.k8s.io/v1beta1:CustomResourceDefinition",)),
    ("admissionregistration", "v1", "ValidatingAdmissionPolicy"): Kind(
        f"kubernetes:{_ADMISSION}/v1:ValidatingAdmissionPolicy", _STANDARD,
        aliases=(f"kubernetes:{_ADMISSION}/v1alpha1:ValidatingAdmissionPolicy",
                 f"kubernetes:{_ADMISSION}/v1beta1:ValidatingAdmissionPolicy")),
    ("admissionregistration", "v1", "ValidatingAdmissionPolicyBinding"): Kind(
        f"kubernetes:{_ADMISSION}/v1:ValidatingAdmissionPolicyBinding", _STANDARD, required=("spec",),
        aliases=(f"kubernetes:{_ADMISSION}/v1alpha1:ValidatingAdmissionPolicyBinding",
                 f"kubernetes:{_ADMISSION}/v1beta1:ValidatingAdmissionPolicyBinding")),
}


def wire_name(python_name: str) -> str:
    """`string_data` -> `stringData`: the generated classes' names (checked per kind by the tests)."""
    first, *rest = python_name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


class KubernetesObject(pulumi.CustomResource):
    """A Kubernetes object of one kind in KINDS (a subclass per kind sets `_kind`)."""

    _kind: Kind

    def __init__(self, resource_name: str, opts: Optional[pulumi.ResourceOptions] = None, **inputs: Any) -> None:
        # One __init__ frame, as the generated class has (its work is in `_internal_init`): the SDK
        # takes the resource's source position from the third __init__ frame up the stack
        # (sdk/python/lib/pulumi/runtime/resource.py `_get_stack_trace`).
        kind = self._kind
        opts = pulumi.ResourceOptions.merge(_utilities.get_resource_opts_defaults(), opts)
        if not isinstance(opts, pulumi.ResourceOptions):
            raise TypeError("Expected resource options to be a ResourceOptions instance")
        if opts.id is not None:
            raise TypeError(f"{type(self).__name__}: read existing objects with .get (pulumi-kubernetes' class)")
        unknown = sorted(set(inputs) - set(kind.inputs))  # apiVersion and kind are accepted and ignored, as there
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments: {', '.join(unknown)}")
        props: dict[str, Any] = {}
        api_version, _, kind_name = kind.token.removeprefix("kubernetes:").rpartition(":")
        for name in kind.inputs:
            if name == "api_version":
                value: Any = api_version.removeprefix("core/")
            elif name == "kind":
                value = kind_name
            else:
                value = inputs.get(name)
                if value is None and name in kind.required and not opts.urn:
                    raise TypeError(f"Missing required property '{name}'")
                if value is not None and name in kind.secret:
                    value = pulumi.Output.secret(value)
            props[wire_name(name)] = value
        if kind.additional_secret_outputs:
            opts = pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(additional_secret_outputs=list(kind.additional_secret_outputs)))
        if kind.aliases:
            opts = pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=alias) for alias in kind.aliases]))
        super().__init__(kind.token, resource_name, props, opts)

    @property
    @pulumi.getter
    def metadata(self) -> pulumi.Output["_meta.v1.outputs.ObjectMeta"]:
        """Typed as pulumi-kubernetes types it, so `obj.metadata.name` is an Output[str]."""
        return pulumi.get(self, "metadata")

    class _Get:
        """`Kind.get(name, id, opts)` is pulumi-kubernetes' own (a read, not a registration), called
        directly, so the read's stack trace has no frame of ours either."""

        def __get__(self, instance: Any, owner: type) -> Any:
            return _upstream(*owner._path).get

    get = _Get()


_CLASSES: dict[tuple[str, str, str], type] = {}


def _upstream(module: str, version: str, kind: str) -> type:
    return getattr(importlib.import_module(f"pulumi_kubernetes.{module}.{version}"), kind)


def _light(path: tuple[str, str, str]) -> type:
    found = _CLASSES.get(path)
    if found is None:
        found = _CLASSES[path] = type(path[2], (KubernetesObject,), {
            "_kind": KINDS[path], "_path": path, "__module__": __name__,
            "__qualname__": path[2]})
    return found


class _Version:
    def __init__(self, module: str, version: str):
        self._module, self._version = module, version

    def __getattr__(self, kind: str) -> Any:
        path = (self._module, self._version, kind)
        if path in KINDS and not UPSTREAM:
            return _light(path)
        return _upstream(*path)


class _Module:
    def __init__(self, module: str):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if any(path[:2] == (self._module, name) for path in KINDS):
            return _Version(self._module, name)
        return getattr(importlib.import_module(f"pulumi_kubernetes.{self._module}"), name)


_MODULES = {module: _Module(module) for module, _, _ in KINDS}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return _MODULES[name]
    return getattr(pulumi_kubernetes, name)
