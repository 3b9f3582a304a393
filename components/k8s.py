"""Pure builders of the Kubernetes fragments every component repeats.

They return camelCase dicts, exactly as the objects appear in rendered manifests, so components
pass them straight to pulumi-kubernetes and tests compare them without translation.
"""
from __future__ import annotations

from typing import Optional

from pydantic import Field

from components.model import ConfigModel

PART_OF = "cloudstation"


class Resources(ConfigModel):
    """Requests and limits of one container."""

    cpu_request: str = "100m"
    memory_request: str = "128Mi"
    cpu_limit: str = "500m"
    memory_limit: str = "512Mi"

    def spec(self) -> dict:
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        }


class Storage(ConfigModel):
    """A persistent volume claim's size and class."""

    size: str = Field(default="10Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)$")
    storage_class: Optional[str] = None
    """StorageClass name; unset uses the cluster's default class."""

    def claim_spec(self) -> dict:
        """The spec of a ReadWriteOnce PersistentVolumeClaim of this size and class."""
        spec: dict = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": self.size}}}
        if self.storage_class:
            spec["storageClassName"] = self.storage_class
        return spec


def labels(name: str, component: str, instance: Optional[str] = None) -> dict[str, str]:
    """Recommended labels (app.kubernetes.io/*); `selector_labels` is the stable subset."""
    return {
        **selector_labels(name, instance),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
    }


def selector_labels(name: str, instance: Optional[str] = None) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance or name}


def metadata(name: str, namespace: Optional[str], component: str, **extra) -> dict:
    meta = {"name": name, "labels": labels(name, component)}
    if namespace:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


def container_security(read_only_root: bool = True, run_as_user: Optional[int] = None) -> dict:
    """A container securityContext that meets the "restricted" Pod Security Standard."""
    context = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if run_as_user is not None:
        context["runAsUser"] = run_as_user
    return context


def pod_security(run_as_user: int, run_as_group: Optional[int] = None, fs_group: Optional[int] = None) -> dict:
    """A pod securityContext for the "restricted" Pod Security Standard."""
    context = {
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "runAsGroup": run_as_group if run_as_group is not None else run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if fs_group is not None:
        context["fsGroup"] = fs_group
    return context


def _probe(handler: dict, initial_delay: int, period: int, failures: int) -> dict:
    return {
        **handler,
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def http_probe(path: str, port: str | int, initial_delay: int = 5, period: int = 10, failures: int = 3) -> dict:
    return _probe({"httpGet": {"path": path, "port": port}}, initial_delay, period, failures)


def tcp_probe(port: str | int, initial_delay: int = 5, period: int = 10, failures: int = 3) -> dict:
    return _probe({"tcpSocket": {"port": port}}, initial_delay, period, failures)


def exec_probe(command: list[str], initial_delay: int = 5, period: int = 10, failures: int = 3) -> dict:
    return _probe({"exec": {"command": command}}, initial_delay, period, failures)


def disruption_budget(name: str, namespace: Optional[str], component: str, pod_selector: dict) -> dict:
    """A policy/v1 PodDisruptionBudget's metadata and spec: voluntary evictions (node drains,
    upgrades) take at most one of the selected pods at a time. Only for workloads of more than one
    replica: with one, maxUnavailable 1 allows everything and minAvailable 1 would block every drain.
    `unhealthyPodEvictionPolicy: AlwaysAllow` (GA in 1.31) lets a drain evict pods that are not
    Ready anyway, so a crash-looping replica never blocks one."""
    return {
        "metadata": metadata(name, namespace, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": dict(pod_selector)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def spread_over_nodes(pod_selector: dict, match_label_keys: tuple[str, ...] = ()) -> list[dict]:
    """topologySpreadConstraints preferring the replicas on different nodes: a preference
    (ScheduleAnyway), so a one-node cluster still runs them all. `match_label_keys` (e.g. a
    Deployment's `pod-template-hash`) counts only pods of the same revision during a rollout."""
    constraint: dict = {
        "maxSkew": 1,
        "topologyKey": HOSTNAME_TOPOLOGY,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": dict(pod_selector)},
    }
    if match_label_keys:
        constraint["matchLabelKeys"] = list(match_label_keys)
    return [constraint]


def secret_env(name: str, secret: str, key: str) -> dict:
    """An environment variable read from a Secret key (never a literal value)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def service_dns(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.svc.cluster.local"
