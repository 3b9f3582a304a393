"""Every Job and CronJob the program creates starts only after the NetworkPolicies that admit its
traffic exist: in a namespace with a default-deny policy a pod created before them has its
connections refused, and a setup Job's first attempt fails (then backs off)."""
from __future__ import annotations

import pytest

from cloudstation_tools.mocks import Registration
from tests import stacks

WORKLOADS = ("kubernetes:batch/v1:Job", "kubernetes:batch/v1:CronJob")
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def pod_labels(registration: Registration) -> dict:
    spec = registration.inputs["spec"]
    if registration.type.endswith(":CronJob"):
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels and matchExpressions) selecting pods with `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        present, value = expression["key"] in labels, labels.get(expression["key"])
        if not {"In": present and value in expression.get("values", []),
                "NotIn": not present or value not in expression.get("values", []),
                "Exists": present, "DoesNotExist": not present}[expression["operator"]]:
            return False
    return True


def overlaps(selector: dict, target: dict) -> bool:
    """Whether a policy's pod selector selects the pods a peer selector `target` names (its
    matchLabels are a subset of the target's)."""
    return selects(selector, target.get("matchLabels") or {})


def same_namespace_peers(rule_peers: list[dict]) -> list[dict]:
    return [p["podSelector"] for p in rule_peers if "podSelector" in p and "namespaceSelector" not in p]


def admitting_policies(workload: Registration, policies: list[Registration]) -> list[Registration]:
    """The policies of its namespace that let the workload's pods out (they select them and have
    egress rules), and the ingress policies of the pods it connects to that admit it."""
    namespace, labels = workload.inputs["metadata"]["namespace"], pod_labels(workload)
    local = [p for p in policies if p.inputs["metadata"]["namespace"] == namespace]
    egress = [p for p in local if selects(p.inputs["spec"]["podSelector"], labels) and p.inputs["spec"].get("egress")]
    destinations = [peer for p in egress for rule in p.inputs["spec"]["egress"] for peer in same_namespace_peers(rule.get("to", []))]
    ingress = [
        p for p in local
        if any(overlaps(p.inputs["spec"]["podSelector"], destination) for destination in destinations)
        and any(selects(peer, labels) for rule in p.inputs["spec"].get("ingress") or []
                for peer in same_namespace_peers(rule.get("from", [])))
    ]
    return egress + [p for p in ingress if p not in egress]


def created_before(rendered, registration: Registration) -> set[str]:
    """URNs the engine creates before `registration`: its dependencies, transitively."""
    by_urn = {r.urn: r for r in rendered.registrations}
    seen: set[str] = set()
    pending = list(registration.dependencies)
    while pending:
        urn = pending.pop()
        if urn not in seen:
            seen.add(urn)
            pending += by_urn[urn].dependencies if urn in by_urn else []
    return seen


def unordered(rendered) -> list[str]:
    policies = rendered.of_type(POLICY)
    found = []
    for workload in [r for r in rendered.registrations if r.type in WORKLOADS]:
        before = created_before(rendered, workload)
        found += [f"{workload.name} does not depend on {p.name}" for p in admitting_policies(workload, policies)
                  if p.urn not in before]
    return found


def test_jobs_start_after_the_policies_that_admit_them(rendered):
    jobs = [r for r in rendered.registrations if r.type in WORKLOADS]
    assert jobs, "the stack renders Jobs or CronJobs"
    # The check sees what it checks: each Job has at least its own egress policy.
    policies = rendered.of_type(POLICY)
    assert all(admitting_policies(job, policies) for job in jobs), [j.name for j in jobs if not admitting_policies(j, policies)]
    assert unordered(rendered) == []


@pytest.mark.parametrize("name", ["non-owner", "owner-external-cassandra", stacks.OWN_CLUSTER])
def test_jobs_of_other_store_modes_start_after_their_policies(name):
    """Managed Cassandra's auth Job, an external PostgreSQL's database Job, Armada on its own cluster."""
    rendered = (stacks.rendered(name) if name == stacks.OWN_CLUSTER
                else stacks.rendered(name))
    assert [r for r in rendered.registrations if r.type in WORKLOADS]
    assert unordered(rendered) == []
