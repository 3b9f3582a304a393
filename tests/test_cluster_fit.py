"""Both example stack files share one cluster (README), and that cluster must be a developer's:
one kind node with 4 CPUs and 8 GiB, of which kube-system and the kubelet's reserve need about
1 CPU and 2 GiB. So everything long-running that both stacks run together may request at most
3 CPU and 6 GiB.

Everything is read from the rendered objects: every Pulumi-managed workload (replicas x pod
request), and the entity pods the CloudState operator creates from each StatefulService (its user
container plus the proxy sidecar, times the replicas its HorizontalPodAutoscaler holds)."""
from __future__ import annotations

import re
from collections import defaultdict
from decimal import Decimal

import pytest

from components.cloudstate_operator import DEPLOYMENT_SUFFIX, SIDECAR_DEFAULT_RESOURCES
from tests import promoted
from tests.conftest import STACKS, objects

CPU_BUDGET = Decimal(3)
MEMORY_BUDGET = Decimal(6 * 2**30)
LONG_RUNNING = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod")
"""Jobs and CronJobs run to completion and are left out; a DaemonSet counts once (one node)."""

_SUFFIXES = {
    "m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
}


def quantity(value) -> Decimal:
    """A Kubernetes resource quantity (`250m`, `1`, `1.5`, `512Mi`, `1G`) as a number."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)", str(value))
    assert match and match[2] in _SUFFIXES, f"not a quantity: {value!r}"
    return Decimal(match[1]) * _SUFFIXES[match[2]]


def requests(resources: dict) -> tuple[Decimal, Decimal]:
    asked = (resources or {}).get("requests") or {}
    limits = (resources or {}).get("limits") or {}
    # An unset request defaults to the limit (Kubernetes API defaulting).
    return tuple(quantity(asked.get(r, limits.get(r, 0))) for r in ("cpu", "memory"))


def pod_requests(spec: dict) -> tuple[Decimal, Decimal]:
    """The scheduler's view: the sum of the containers, or the largest init container if more."""
    total = [sum(requests(c.get("resources"))[i] for c in spec["containers"]) for i in (0, 1)]
    for init in spec.get("initContainers", []):
        total = [max(total[i], requests(init.get("resources"))[i]) for i in (0, 1)]
    return total[0], total[1]


def hpa_replicas(rendered) -> dict[tuple[str, str, str], int]:
    """(namespace, kind, name) of each HPA's target -> the replicas it holds at least."""
    return {
        (hpa["metadata"]["namespace"], hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]):
            hpa["spec"].get("minReplicas", 1)
        for hpa in objects(rendered, "HorizontalPodAutoscaler")
    }


def pods(rendered) -> list[tuple[str, int, Decimal, Decimal]]:
    """(what, replicas, cpu per pod, memory per pod) of every long-running pod of one stack."""
    held = hpa_replicas(rendered)
    found = []
    for obj in rendered.manifests():
        kind, meta = obj["kind"], obj["metadata"]
        namespace = meta.get("namespace")
        if kind in LONG_RUNNING:
            spec = obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]
            replicas = 1 if kind in ("Pod", "DaemonSet") else obj["spec"].get("replicas", 1)
            replicas = max(replicas, held.get((namespace, kind, meta["name"]), 0))
            found.append((f"{kind} {namespace}/{meta['name']}", replicas, *pod_requests(spec)))
        elif kind == "StatefulService":
            # The operator's Deployment: the first container as the user container, plus the
            # sidecar with `sidecarResources` (or the operator's default); one replica unless an
            # HPA holds more.
            spec = obj["spec"]
            sidecar = {"name": "akka-sidecar", "resources": spec.get("sidecarResources", SIDECAR_DEFAULT_RESOURCES)}
            deployment = f"{meta['name']}{DEPLOYMENT_SUFFIX}"
            replicas = max(1, held.get((namespace, "Deployment", deployment), 0))
            found.append((f"entity {namespace}/{deployment}", replicas,
                          *pod_requests({"containers": [spec["containers"][0], sidecar]})))
    return found


def totals(found) -> tuple[Decimal, Decimal]:
    return (sum(n * cpu for _, n, cpu, _ in found), sum(n * memory for _, n, _, memory in found))


def show(cpu: Decimal, memory: Decimal) -> str:
    return f"{cpu:.3f} CPU, {memory / 2**30:.2f} GiB"


def test_quantities_parse_like_kubernetes():
    assert quantity("250m") == Decimal("0.25") and quantity("1") == 1 and quantity("1.5") == Decimal("1.5")
    assert quantity("512Mi") == 512 * 2**20 and quantity("1G") == 10**9 and quantity(2) == 2
    with pytest.raises(AssertionError):
        quantity("1X")
    spec = {"initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}],
            "containers": [{"resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Mi"}}},
                           {"resources": {"requests": {"cpu": "1", "memory": "1Mi"}}}]}
    assert pod_requests(spec) == (2, 3 * 2**20)  # init max vs container sum; memory request from the limit


def test_the_entity_pods_the_operator_creates_are_counted(rendered_stacks):
    for stack, rendered in rendered_stacks.items():
        entities = [what for what, *_ in pods(rendered) if what.startswith("entity ")]
        assert len(entities) == len(objects(rendered, "StatefulService")) > 0, stack


@pytest.mark.example_stacks  # README's minimum cluster is for the example stack files
def test_both_example_stacks_together_fit_a_developers_cluster(rendered_stacks):
    per_stack = {}
    lines = []
    for stack in STACKS:
        found = pods(rendered_stacks[stack])
        per_stack[stack] = totals(found)
        by_namespace = defaultdict(lambda: [Decimal(0), Decimal(0)])
        for what, n, cpu, memory in found:
            namespace = what.split(" ", 1)[1].split("/", 1)[0]
            by_namespace[namespace][0] += n * cpu
            by_namespace[namespace][1] += n * memory
        lines.append(f"{stack}: {show(*per_stack[stack])}")
        lines += [f"  {ns}: {show(*t)}" for ns, t in sorted(by_namespace.items())]
    cpu = sum(t[0] for t in per_stack.values())
    memory = sum(t[1] for t in per_stack.values())
    lines.append(f"both: {show(cpu, memory)} (budget {show(CPU_BUDGET, MEMORY_BUDGET)})")
    print("\n" + "\n".join(lines))
    assert cpu <= CPU_BUDGET and memory <= MEMORY_BUDGET, "\n".join(lines)


def test_the_documented_prod_sizes_are_valid_config():
    """docs/cloudstate.md "Sizing" shows prod sizes instead of the example prod stack: they validate."""
    import yaml

    from infra.config import load
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "cloudstate.md").read_text()
    section = text[text.index("## Sizing"):text.index("\n## ", text.index("## Sizing") + 1)]
    [block] = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    platform = yaml.safe_load(block)["cloudstation:platform"]
    base = yaml.safe_load(promoted.text())["config"]  # Pulumi.prod.yaml, promoted
    merged = {**base, "cloudstation:platform": {**base["cloudstation:platform"], **platform}}
    config = load(merged)
    assert config.platform.cloudstate.sidecar_jvm_memory == platform["cloudstate"]["sidecarJvmMemory"]
    assert config.platform.stores.postgres.storage.size == platform["stores"]["postgres"]["storage"]["size"]
