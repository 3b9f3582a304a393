"""Pure builders of the Kubernetes fragments every component repeats.

They return camelCase dicts, exactly as the objects appear in rendered manifests, so components
pass them straight to pulumi-kubernetes and tests compare them without translation.
"""
from __future__ import annotations

import math
import re
from typing import Annotated, Optional

from pydantic import AfterValidator, BeforeValidator, model_validator

from components.model import ConfigModel, problem, problems
from infra import quantities

PART_OF = "cloudstation"


def _number_to_quantity(milli: bool):
    """A quantity written as a number is meant as that quantity: `pulumi config set --path ... 2`
    stores the integer 2 (pulumi/pulumi sdk/go/common/resource/config/value.go `coerceObject`), and
    YAML reads `cpuLimit: 0.5` as a float. Kubernetes quantities are text: 2 -> "2", and for CPU
    0.5 -> "500m" (the form the API server stores)."""

    def convert(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value  # text is checked by the pattern; true/false is refused as not text
        if isinstance(value, float) and not math.isfinite(value):
            return value
        if value == int(value):
            return str(int(value))
        millis = value * 1000
        if milli and abs(millis - round(millis)) < 1e-6:
            return f"{round(millis)}m"
        return repr(value)

    return BeforeValidator(convert)


_CPU = re.compile(r"[0-9]+(\.[0-9]{1,3})?|[0-9]+m")
_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE])?")
_MEMORY_FACTOR = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                  "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def _cpu(value: str) -> str:
    if not _CPU.fullmatch(value):
        raise problem("must be a CPU quantity: cores (1, 0.5, at most 3 decimals) or millicores (500m)")
    return value


def _memory(value: str) -> str:
    match = _MEMORY.fullmatch(value)
    if not match:
        raise problem("must be a memory quantity in bytes with a unit: 512Mi, 2Gi (binary) or 500M, 1G (decimal); "
                      "not m, which means thousandths of a byte")
    if float(match[1]) * _MEMORY_FACTOR[match[2] or ""] < 2**20:
        raise problem(f"is {value} bytes, less than 1Mi: no container runs in that; write the unit, e.g. 512Mi or 2Gi")
    return value


CpuQuantity = Annotated[str, _number_to_quantity(milli=True), AfterValidator(_cpu)]
"""A CPU quantity; numbers are accepted (2 -> "2", 0.5 -> "500m")."""

MemoryQuantity = Annotated[str, _number_to_quantity(milli=False), AfterValidator(_memory)]
"""A memory quantity of at least 1Mi; numbers are bytes."""


def _storage_size(value: str) -> str:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)", value):
        raise problem("must be a size with a binary unit: Ki, Mi, Gi or Ti, e.g. 10Gi (a bare number would be bytes)")
    return value


StorageSize = Annotated[str, _number_to_quantity(milli=False), AfterValidator(_storage_size)]
"""A volume size such as 10Gi; a number is turned into text and refused for its missing unit."""


class Resources(ConfigModel):
    """Requests and limits of one container."""

    cpu_request: CpuQuantity = "100m"
    """CPU the scheduler reserves for the container (a Kubernetes quantity: `250m`, `1`)."""
    memory_request: MemoryQuantity = "128Mi"
    """Memory the scheduler reserves for the container (`128Mi`, `1Gi`)."""
    cpu_limit: CpuQuantity = "500m"
    """CPU the container is throttled at."""
    memory_limit: MemoryQuantity = "512Mi"
    """Memory at which the container is killed (OOMKilled) and restarted."""

    @model_validator(mode="after")
    def _requests_within_limits(self) -> "Resources":
        # The API server refuses such a container at apply (ValidateResourceRequirements: "must be
        # less than or equal to ... limit"), long after render and the schemas passed it.
        found = [
            problem(f"more than {limit_key} {limit!r}: the API server refuses a container whose request exceeds its "
                    "limit; lower the request or raise the limit", "." + request_key, request)
            for request_key, request, limit_key, limit in (
                ("cpuRequest", self.cpu_request, "cpuLimit", self.cpu_limit),
                ("memoryRequest", self.memory_request, "memoryLimit", self.memory_limit))
            if quantities.parse(request) > quantities.parse(limit)
        ]
        if found:
            raise problems(found)
        return self

    def spec(self) -> dict:
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        }


class Storage(ConfigModel):
    """A persistent volume claim's size and class."""

    size: StorageSize = "10Gi"
    """Size the PersistentVolumeClaim requests (a quantity with a unit, e.g. `10Gi`)."""
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
