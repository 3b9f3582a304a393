"""Both example stack files share one cluster (README), and that cluster must be a developer's:
one kind node with 4 CPUs and 8 GiB, of which kube-system and the kubelet's reserve need about
1 CPU and 2 GiB. That is the test stack's `platform.clusterBudget` (its default, 3 CPU and 6 GiB),
which `cloudstation check` holds every cluster's stacks to (cloudstation_tools/check/, one test per
check in tests/test_check.py); here, the example stacks against it, and how pods are counted
(cloudstation_tools/cluster_fit.py: every Pulumi-managed workload, and the entity pods the CloudState
operator creates from each StatefulService)."""
from __future__ import annotations

import re
from collections import defaultdict
from decimal import Decimal

import pytest

from cloudstation_tools.cluster_fit import pod_requests, pods, quantity, show, totals
from infra import quantities
from cloudstation_tools import render
from tests import stacks
from tests.conftest import ROOT
from tests.conftest import STACKS, objects


def test_quantities_parse_like_kubernetes():
    assert quantity("250m") == Decimal("0.25") and quantity("1") == 1 and quantity("1.5") == Decimal("1.5")
    assert quantity("512Mi") == 512 * 2**20 and quantity("1G") == 10**9 and quantity(2) == 2
    with pytest.raises(ValueError):
        quantity("1X")
    spec = {"initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}],
            "containers": [{"resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Mi"}}},
                           {"resources": {"requests": {"cpu": "1", "memory": "1Mi"}}}]}
    assert pod_requests(spec) == (2, 3 * 2**20)  # init max vs container sum; memory request from the limit


def test_the_entity_pods_the_operator_creates_are_counted(rendered_stacks):
    for stack, rendered in rendered_stacks.items():
        entities = [p.what for p in pods(rendered.manifests()) if p.what.startswith("entity ")]
        assert len(entities) == len(objects(rendered, "StatefulService")) > 0, stack


@pytest.mark.example_stacks  # README's minimum cluster is for the example stack files
def test_both_example_stacks_together_fit_a_developers_cluster(example_rendered):
    rendered_stacks = example_rendered
    budget = render.validate_config("test", ROOT).platform.cluster_budget  # the example owner's setting (its default)
    cpu_budget, memory_budget = quantity(budget.cpu), quantity(budget.memory)
    per_stack = {}
    lines = []
    for stack in STACKS:
        found = pods(rendered_stacks[stack].manifests())
        per_stack[stack] = totals(found)
        by_namespace = defaultdict(lambda: [Decimal(0), Decimal(0)])
        for p in found:
            by_namespace[p.namespace][0] += p.replicas * p.cpu
            by_namespace[p.namespace][1] += p.replicas * p.memory
        lines.append(f"{stack}: {show(*per_stack[stack])}")
        lines += [f"  {ns}: {show(*t)}" for ns, t in sorted(by_namespace.items())]
    cpu = sum(t[0] for t in per_stack.values())
    memory = sum(t[1] for t in per_stack.values())
    lines.append(f"both: {show(cpu, memory)} (budget {show(cpu_budget, memory_budget)})")
    print("\n" + "\n".join(lines))
    assert (cpu_budget, memory_budget) == (3, 6 * quantities.GIB)  # README's minimum cluster
    assert cpu <= cpu_budget and memory <= memory_budget, "\n".join(lines)


def test_the_documented_prod_sizes_are_valid_config():
    """docs/cloudstate.md "Sizing" shows prod sizes instead of the example prod stack: they validate."""
    import yaml

    from infra.config import load
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "cloudstate.md").read_text()
    section = text[text.index("## Sizing"):text.index("\n## ", text.index("## Sizing") + 1)]
    [block] = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    platform = yaml.safe_load(block)["cloudstation:platform"]
    base = yaml.safe_load(stacks.text())["config"]  # Pulumi.prod.yaml, promoted
    merged = {**base, "cloudstation:platform": {**base["cloudstation:platform"], **platform}}
    config = load(merged)
    assert config.platform.cloudstate.sidecar_jvm_memory == platform["cloudstate"]["sidecarJvmMemory"]
    assert config.platform.stores.postgres.storage.size == platform["stores"]["postgres"]["storage"]["size"]
