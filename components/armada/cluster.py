"""Cluster-scoped prerequisites of Armada: its PriorityClasses and the executor's and
binoculars' ClusterRoles as upstream defines them (armada/NOTES.md §6, §7), plus binoculars'
reading of pod logs (BINOCULARS_LOG_RULE).

Only the stack that owns cluster resources creates them; ClusterRoleBindings (per stack, named
after the stack's Armada namespace) live with the executor and binoculars components."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components.armada.settings import PriorityClassSettings
from components.k8s import PART_OF
from components.component import Component

EXECUTOR_CLUSTER_ROLE = "cloudstation-armada-executor"
BINOCULARS_CLUSTER_ROLE = "cloudstation-armada-binoculars"

EXECUTOR_RULES = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "delete", "deletecollection", "patch", "update"]},
    {"apiGroups": [""], "resources": ["events"],
     "verbs": ["get", "list", "watch", "delete", "deletecollection", "patch"]},
    {"apiGroups": [""], "resources": ["services"],
     "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
     "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]},
    {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
]
"""The executor's ClusterRole (Helm and operator agree; NOTES §7)."""

BINOCULARS_LOG_RULE = {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}
"""Not in upstream's role: binoculars reads job logs with its own token unless it impersonates
users (`impersonateUsers`, off by default; v0.22.7 internal/binoculars/service/logs.go), so
without it Lookout's log view gets 403 (upstream leaves it to additionalClusterRoleBindings)."""

BINOCULARS_RULES = [
    {"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    BINOCULARS_LOG_RULE,
]
"""Binoculars' ClusterRole (NOTES §7) plus reading pod logs."""


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


@dataclass(frozen=True)
class ClusterPrerequisitesArgs:
    priority_classes: Mapping[str, PriorityClassSettings]
    binoculars: bool
    """Whether to create binoculars' ClusterRole too."""


class ClusterPrerequisites(Component):
    """PriorityClasses and ClusterRoles. Attribute `resources`: what bindings must wait for."""

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
        if args.binoculars:
            self.resources.append(
                k8s.rbac.v1.ClusterRole(
                    f"{name}-binoculars", **cluster_role(BINOCULARS_CLUSTER_ROLE, BINOCULARS_RULES), opts=child
                )
            )
        self.register_outputs({})
