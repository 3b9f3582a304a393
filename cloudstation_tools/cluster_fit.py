"""What the long-running pods of rendered stacks request, as the scheduler counts it, for the cluster
budget (`platform.clusterBudget`, checked by `cloudstation check`; tests/test_cluster_fit.py).

Read from the rendered objects: every Pulumi-managed workload (replicas x pod request, at least what
its HorizontalPodAutoscaler holds), and the entity pods the CloudState operator creates from each
StatefulService (its user container plus the proxy sidecar). Jobs and CronJobs run to completion and
are left out; a DaemonSet counts once (one node)."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Iterable

from components.cloudstate_operator import DEPLOYMENT_SUFFIX, SIDECAR_DEFAULT_RESOURCES
from infra import quantities

LONG_RUNNING = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod")


@dataclass(frozen=True)
class Pods:
    """One workload's pods: `what` (`Deployment ns/name`, `entity ns/name`), how many, and each one's request."""

    what: str
    replicas: int
    cpu: Decimal
    memory: Decimal

    @property
    def namespace(self) -> str:
        return self.what.split(" ", 1)[1].split("/", 1)[0]


def quantity(value) -> Decimal:
    """A Kubernetes quantity as a number; ValueError if it is not one."""
    parsed = quantities.parse(value)
    if parsed is None:
        raise ValueError(f"not a quantity: {value!r}")
    return parsed


def requests(resources: dict) -> tuple[Decimal, Decimal]:
    """(cpu, memory) a container requests; an unset request defaults to the limit (API defaulting)."""
    asked = (resources or {}).get("requests") or {}
    limits = (resources or {}).get("limits") or {}
    cpu, memory = (quantity(asked.get(r, limits.get(r, 0))) for r in ("cpu", "memory"))
    return cpu, memory


def pod_requests(spec: dict) -> tuple[Decimal, Decimal]:
    """The scheduler's view: the sum of the containers, or the largest init container if more."""
    total = [sum(requests(c.get("resources"))[i] for c in spec["containers"]) for i in (0, 1)]
    for init in spec.get("initContainers", []):
        total = [max(total[i], requests(init.get("resources"))[i]) for i in (0, 1)]
    return total[0], total[1]


def hpa_replicas(objects: Iterable[dict]) -> dict[tuple[str, str, str], int]:
    """(namespace, kind, name) of each HPA's target -> the replicas it holds at least."""
    return {
        (hpa["metadata"]["namespace"], hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]):
            hpa["spec"].get("minReplicas", 1)
        for hpa in objects if hpa["kind"] == "HorizontalPodAutoscaler"
    }


def pods(objects: list[dict]) -> list[Pods]:
    """Every long-running pod of one stack's rendered objects."""
    held = hpa_replicas(objects)
    found = []
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        namespace = meta.get("namespace")
        if kind in LONG_RUNNING:
            spec = obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]
            replicas = 1 if kind in ("Pod", "DaemonSet") else obj["spec"].get("replicas", 1)
            replicas = max(replicas, held.get((namespace, kind, meta["name"]), 0))
            found.append(Pods(f"{kind} {namespace}/{meta['name']}", replicas, *pod_requests(spec)))
        elif kind == "StatefulService":
            # The operator's Deployment: the first container as the user container, plus the sidecar
            # with `sidecarResources` (or the operator's default); one replica unless an HPA holds more.
            spec = obj["spec"]
            sidecar = {"name": "akka-sidecar", "resources": spec.get("sidecarResources", SIDECAR_DEFAULT_RESOURCES)}
            deployment = f"{meta['name']}{DEPLOYMENT_SUFFIX}"
            replicas = max(1, held.get((namespace, "Deployment", deployment), 0))
            found.append(Pods(f"entity {namespace}/{deployment}", replicas,
                              *pod_requests({"containers": [spec["containers"][0], sidecar]})))
    return found


def totals(found: Iterable[Pods]) -> tuple[Decimal, Decimal]:
    found = list(found)
    return sum((p.replicas * p.cpu for p in found), Decimal(0)), sum((p.replicas * p.memory for p in found), Decimal(0))


def show(cpu: Decimal, memory: Decimal) -> str:
    return f"{cpu:.3f} CPU, {memory / quantities.GIB:.2f} GiB"
