"""Data a change leaves behind: claims (PersistentVolumeClaims) of the baseline render
(cloudstation_tools/baseline.py: the last deployment, else git HEAD, or `--against`) that the working
tree no longer has, and which stay in the cluster with their data.

A StatefulSet's claims outlive it (`persistentVolumeClaimRetentionPolicy.whenDeleted` defaults to
Retain, and every store here sets Retain), and a claim registered with `retainOnDelete` is dropped
from the state, not deleted (pulumi/pulumi pkg/resource/deploy/step.go `DeleteStep.Apply`). So
switching a store to external or to another kind, removing a project or disabling a managed service
keeps its volumes, which go on costing storage and hold data nobody reads: a warning that names
them, the key that caused it, and the command to delete them knowingly.
"""
from __future__ import annotations

from typing import Optional

from cloudstation_tools import engine
from cloudstation_tools.baseline import Baseline
from cloudstation_tools.check.findings import WARNING, Finding, keyed, show
from cloudstation_tools.check.stacks import Stack
from infra import cluster_sharing
from infra.config import PROJECT

STORE_KINDS = ("postgres", "cassandra")
ARMADA_STORES = {"armada-postgres": "postgres", "armada-redis": "redis", "armada-pulsar": "pulsar"}


def claims(graph: engine.Graph) -> dict[tuple[str, str], str]:
    """(namespace, claim) -> what keeps it (`StatefulSet ns/name`, `PersistentVolumeClaim ns/name`)."""
    found = {}
    for obj in graph.objects:
        if obj.kind == "StatefulSet":
            policy = (obj.spec.get("persistentVolumeClaimRetentionPolicy") or {}).get("whenDeleted", "Retain")
            if policy != "Retain":
                continue  # deleted with the StatefulSet: gone, not left behind
            for template in obj.spec.get("volumeClaimTemplates") or []:
                for ordinal in range(obj.spec.get("replicas", 1)):
                    name = f"{template['metadata']['name']}-{obj.object_name}-{ordinal}"
                    found[(obj.namespace, name)] = f"StatefulSet {obj.namespace}/{obj.object_name}"
        elif obj.kind == "PersistentVolumeClaim" and obj.options.get("retainOnDelete"):
            found[(obj.namespace, obj.object_name)] = f"PersistentVolumeClaim {obj.namespace}/{obj.object_name}"
    return found


def _owner_name(owner: str) -> str:
    return owner.split("/", 1)[1]


def cause(stack: Stack, namespace: str, owner: str) -> tuple[str, object, str]:
    """(key, value, what went away) for a claim of `owner` in `namespace` that the stack no longer keeps."""
    config, platform = stack.config, stack.config.platform
    name = _owner_name(owner)
    store = next((kind for kind in STORE_KINDS if name.endswith((f"-{kind}", f"-{kind}-backups"))), None)
    for index, project in enumerate(config.projects):
        if namespace != cluster_sharing.project_namespace(project.name, config.environment.value):
            continue
        if store and project.store != store:
            return (f"{PROJECT}:projects[{index}].store", project.store,
                    f"project {project.name}'s {store} store (its store is now {project.store})")
        if store and getattr(platform.stores, store).mode == "external":
            return f"{PROJECT}:platform.stores.{store}.mode", "external", f"project {project.name}'s managed {store}"
        return f"{PROJECT}:projects[{index}]", project.name, f"a volume of project {project.name}"
    if namespace.endswith(f"-{config.environment.value}") and namespace != platform.namespace:
        return f"{PROJECT}:projects", None, f"the volumes of namespace {namespace} (its project was removed)"
    if namespace == cluster_sharing.project_state_namespace(platform.namespace) and store:
        if platform.project_state_store != store:
            return (f"{PROJECT}:platform.projectStateStore", platform.project_state_store,
                    f"the project-state entity's {store} store")
        return f"{PROJECT}:platform.stores.{store}.mode", getattr(platform.stores, store).mode, \
            f"the project-state entity's managed {store}"
    armada = platform.armada
    service = next((s for prefix, s in ARMADA_STORES.items() if name.startswith(prefix)), None)
    if service:
        if not armada.enabled:
            return f"{PROJECT}:platform.armada.enabled", False, f"Armada's {service}"
        return f"{PROJECT}:platform.armada.{service}.mode", getattr(armada, service).mode, f"Armada's managed {service}"
    if name.startswith("registry"):
        return f"{PROJECT}:platform.registry.mode", platform.registry.mode, "the managed registry's images"
    return f"{PROJECT}:platform.namespace", platform.namespace, f"{owner}'s volumes"


def kept_claims(stack: Stack, baseline: Baseline) -> list[Finding]:
    """One warning per key that caused claims to be left behind, naming every claim and the commands
    that delete them."""
    before = claims(engine.Graph(baseline.resources))
    after = claims(engine.Graph(stack.rendered.resources()))
    by_cause: dict[str, list] = {}
    for namespace, claim in sorted(set(before) - set(after)):
        owner = before[(namespace, claim)]
        key, value, what = cause(stack, namespace, owner)
        by_cause.setdefault(key, [value, {}, {}])
        by_cause[key][1].setdefault(what, set()).add(owner)
        by_cause[key][2].setdefault(namespace, []).append(claim)
    context = stack.config.kubernetes.context or f"$(python -m infra preflight --stack {stack.name} --context-only)"
    found = []
    for key, (value, whats, namespaces) in by_cause.items():
        gone = "; ".join(f"{what} ({', '.join(sorted(owners))})" for what, owners in sorted(whats.items()))
        kept = ", ".join(f"{namespace}/{claim}" for namespace, names in namespaces.items() for claim in names)
        commands = "; ".join(f'kubectl --context "{context}" -n {namespace} delete pvc {" ".join(names)}'
                             for namespace, names in namespaces.items())
        found.append(keyed(
            WARNING, stack.file, stack.lines, key, show(value),
            f"goes away: {gone}; their claims stay, with their data: {kept} (compared with {baseline.described}), "
            f"and nothing reads them any more. Once you no longer need that data: {commands}", "data"))
    return found


def no_baseline(stack: Stack, why: Optional[str]) -> list[Finding]:
    return [Finding("notice", stack.file, f"data left behind not checked: {why}", "data")] if why else []
