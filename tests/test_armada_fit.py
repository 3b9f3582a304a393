"""Armada's share of a developer's cluster (issue 10, F5): everything the test stack file runs
for Armada — its services, their migration Jobs and pruning CronJobs, and its PostgreSQL, Redis
and Pulsar — requests at most 1 CPU and 2.5 GiB, and every limit still lets its process start.

Counted from the rendered test stack: every workload in the Armada namespace, one pod per Job
and CronJob (a migration runs while the old services still run during an upgrade, and a pruner
can run at any time), `replicas` pods per Deployment and StatefulSet, a pod's request being the
larger of its containers' sum and its largest init container (Kubernetes' effective request).
Rollout surges are not counted: the single-writer services use Recreate, the others surge by one
pod for the length of a rollout."""
from __future__ import annotations

import re

import pytest

from components.pulsar import JVM_OVERHEAD_MIB, mebibytes
from cloudstation_tools import checks
from tests.conftest import objects

CPU_BUDGET = 1.0
MEMORY_BUDGET_MIB = 2.5 * 1024
ARMADA_IMAGES = "docker.io/gresearch/armada-"
GO_MEMORY_LIMIT_FLOOR_MIB = 256
"""Smallest memory limit of an Armada (Go) service or task: the binaries load their config,
open their connection pools and run migrations in well under this (GOMEMLIMIT follows it)."""
GO_CPU_LIMIT_FLOOR = 0.5


def cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def pod_requests(spec: dict) -> tuple[float, float]:
    """(CPU, MiB) the scheduler reserves for one pod of `spec`."""
    def requests(containers: list[dict]) -> list[tuple[float, float]]:
        return [
            (cpu(c["resources"]["requests"]["cpu"]), mebibytes(c["resources"]["requests"]["memory"]))
            for c in containers
        ]

    main = requests(spec["containers"])
    init = requests(spec.get("initContainers", []))
    return (
        max([sum(c for c, _ in main), *(c for c, _ in init)]),
        max([sum(m for _, m in main), *(m for _, m in init)]),
    )


def pods(obj: dict) -> int:
    if obj["kind"] in ("Deployment", "StatefulSet"):
        return obj["spec"].get("replicas", 1)
    return 1


def armada_workloads(rendered) -> list[dict]:
    # The namespace of its server (the example's renders have no fixture config to ask).
    [namespace] = {o["metadata"]["namespace"] for o in objects(rendered, "Deployment") if o["metadata"]["name"] == "armada-server"}
    return [
        o for o in objects(rendered)
        if o["kind"] in checks.WORKLOAD_KINDS and o["metadata"].get("namespace") == namespace
    ]


def share(rendered) -> tuple[float, float]:
    total_cpu = total_memory = 0.0
    for obj in armada_workloads(rendered):
        pod_cpu, pod_memory = pod_requests(checks.pod_spec(obj))
        total_cpu += pods(obj) * pod_cpu
        total_memory += pods(obj) * pod_memory
    return total_cpu, total_memory


@pytest.fixture(params=["rendered_stacks", pytest.param("example_rendered", marks=pytest.mark.example_stacks)])
def test_stack(request):
    """The base fixture's test stack (the example's Armada section), and the example's own."""
    return request.getfixturevalue(request.param)["test"]


def test_armada_share_of_the_test_stack_fits_a_developers_cluster(test_stack):
    workloads = armada_workloads(test_stack)
    kinds = {o["kind"] for o in workloads}
    # What is counted: the services, the tasks and the three dependencies.
    assert {"Deployment", "StatefulSet", "Job", "CronJob"} <= kinds
    names = {o["metadata"]["name"] for o in workloads}
    assert {"armada-postgres", "armada-redis", "armada-pulsar", "armada-server", "armada-scheduler"} <= names
    total_cpu, total_memory = share(test_stack)
    assert total_cpu <= CPU_BUDGET, f"Armada requests {total_cpu:.3f} CPU, budget {CPU_BUDGET}"
    assert total_memory <= MEMORY_BUDGET_MIB, f"Armada requests {total_memory:.0f}Mi, budget {MEMORY_BUDGET_MIB:.0f}Mi"


def test_every_armada_limit_lets_its_process_start(test_stack):
    for obj in armada_workloads(test_stack):
        for container in checks.containers(checks.pod_spec(obj)):
            limits = container["resources"]["limits"]
            where = f"{obj['kind']} {obj['metadata']['name']} container {container['name']}"
            if container["image"].startswith(ARMADA_IMAGES):
                assert mebibytes(limits["memory"]) >= GO_MEMORY_LIMIT_FLOOR_MIB, where
                assert cpu(limits["cpu"]) >= GO_CPU_LIMIT_FLOOR, where
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            if "PULSAR_MEM" in env:
                # The JVM's heap and direct memory plus its own overhead fit the container.
                heap = re.search(r"-Xmx([0-9]+[mMgG])", env["PULSAR_MEM"]).group(1)
                direct = re.search(r"-XX:MaxDirectMemorySize=([0-9]+[mMgG])", env["PULSAR_MEM"]).group(1)
                needed = mebibytes(heap) + mebibytes(direct) + JVM_OVERHEAD_MIB
                assert needed <= mebibytes(limits["memory"]), (where, needed, limits["memory"])
                # A JVM touches its heap early: its request covers heap and direct memory.
                requested = mebibytes(container["resources"]["requests"]["memory"])
                assert requested >= mebibytes(heap) + mebibytes(direct), where


def test_the_share_counts_what_runs(test_stack):
    """The counting itself: one more replica of a service, or a bigger init container, shows."""
    spec = {
        "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}],
        "containers": [
            {"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            {"resources": {"requests": {"cpu": "50m", "memory": "1Gi"}}},
        ],
    }
    assert pod_requests(spec) == (2.0, 1088.0)
    assert pods({"kind": "Deployment", "spec": {"replicas": 3}}) == 3
    assert pods({"kind": "CronJob", "spec": {}}) == 1
