"""Checks across the stack files of one folder, which no single stack's validation can make.

- Which stacks deploy to one cluster: a stack that does not own its cluster is on its owner's
  (`clusterOwnerStack`); stacks that own theirs are on one cluster when they name the same kube
  context (unset in both: the current context, so the same cluster for whoever deploys them).
- Objects two stacks of one cluster would both deploy (namespaces and what is in them,
  cluster-scoped objects, NodePorts): each `pulumi up` would overwrite the other's, and destroying
  either deletes them for both.
- Secrets a stack reads but no stack of its cluster creates where it reads them (a shared registry's
  `registry-auth` and `registry-pull-<project>` in the owner's namespace); Secrets in namespaces no stack manages are the user's to
  create (a notice).
- The cluster budget (`platform.clusterBudget` of the owner stack) against everything the cluster's
  stacks run (cloudstation_tools/cluster_fit.py).
- Promotion: entities of the source stack (test) that the prod stack lacks or has no image for yet
  are steps of the flow (notices), with the command to run.

The watch list of the owner's operator and `clusterOwnerStack` itself are checked by the config
model (infra/cluster_sharing.py), which `check` runs on every file.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Optional

from cloudstation_tools import cluster_fit, promote
from cloudstation_tools.check.findings import ERROR, NOTICE, Finding, keyed, show
from cloudstation_tools.check.stacks import Stack
from infra import cluster_sharing, quantities
from components.registry import AUTH_SECRET_SUFFIX, pull_secret_name
from infra.delivery import REGISTRY_NAME
from infra.config import PROJECT

EXAMPLES = 4
"""Objects a collision names by name; the rest are counted."""


# --- which stacks share a cluster ------------------------------------------------------------------


def cluster_of(stack: Stack, stacks: dict[str, Stack]) -> str:
    """An identifier of the cluster a valid stack deploys to, equal for stacks on one cluster."""
    seen = {stack.name}
    owner = stack
    while not owner.config.platform.owns_cluster_resources:
        name = owner.config.platform.cluster_owner_stack
        if name in seen or name not in stacks or not stacks[name].valid:
            return f"owner:{name}"  # its own validation says what is wrong with that owner
        seen.add(name)
        owner = stacks[name]
    if owner.config.kubernetes.render_yaml_to_directory:
        return f"render:{owner.name}"  # writes manifests: deploys to no cluster
    return f"context:{owner.config.kubernetes.context or ''}"


def describe(cluster: str) -> str:
    kind, _, name = cluster.partition(":")
    if kind == "context":
        return f"kube context '{name}'" if name else "the current kube context: cloudstation:kubernetes.context is unset"
    return f"the cluster of stack '{name}'"


def clusters(stacks: dict[str, Stack]) -> dict[str, list[Stack]]:
    groups: dict[str, list[Stack]] = defaultdict(list)
    for stack in stacks.values():
        if stack.valid and stack.rendered is not None:
            groups[cluster_of(stack, stacks)].append(stack)
    # The owner first (the one other stacks name as theirs, if two claim it): a finding about a pair
    # goes to the stack that should yield.
    named = {s.config.platform.cluster_owner_stack for s in stacks.values()
             if s.valid and not s.config.platform.owns_cluster_resources}
    return {k: sorted(v, key=lambda s: (not s.config.platform.owns_cluster_resources, s.name not in named, s.name))
            for k, v in groups.items()}


# --- objects both would own --------------------------------------------------------------------------


def identities(stack: Stack) -> dict[tuple[str, str, str], dict]:
    """(kind, namespace, name) -> object, for every object the stack deploys."""
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in stack.rendered.manifests()}


def value_path(raw: dict[str, Any], wanted: Any) -> Optional[str]:
    """The first config key path whose value is `wanted` (a namespace, a port)."""

    def walk(value: Any, path: str) -> Optional[str]:
        if value == wanted and not isinstance(value, bool):
            return path
        if isinstance(value, dict):
            for key, item in value.items():
                found = walk(item, f"{path}.{key}")
                if found:
                    return found
        elif isinstance(value, list):
            for index, item in enumerate(value):
                found = walk(item, f"{path}[{index}]")
                if found:
                    return found
        return None

    for key, value in raw.items():
        if key.partition(":")[0] == PROJECT:
            found = walk(value, key)
            if found:
                return found
    return None


def namespace_key(stack: Stack, namespace: str) -> tuple[str, Any]:
    """The config key that names `namespace` in this stack, and its value."""
    config, platform = stack.config, stack.config.platform
    if namespace in (platform.namespace, cluster_sharing.project_state_namespace(platform.namespace),
                     platform.builds_namespace):
        return f"{PROJECT}:platform.namespace", platform.namespace
    for index, project in enumerate(config.projects):
        if namespace == cluster_sharing.project_namespace(project.name, config.environment.value):
            return f"{PROJECT}:projects[{index}].name", project.name
    if platform.armada.enabled and namespace == platform.armada.namespace:
        return f"{PROJECT}:platform.armada.namespace", namespace
    return value_path(stack.raw, namespace) or f"{PROJECT}:platform.namespace", namespace


def _named(objects: Iterable[tuple[str, str, str]]) -> str:
    objects = sorted(objects)
    shown = ", ".join(f"{kind} {name}" for kind, _, name in objects[:EXAMPLES])
    return shown + (f" and {len(objects) - EXAMPLES} more" if len(objects) > EXAMPLES else "")


def collisions(group: list[Stack], cluster: str) -> list[Finding]:
    found = []
    seen = {stack.name: identities(stack) for stack in group}
    for i, first in enumerate(group):
        for second in group[i + 1:]:
            shared = set(seen[first.name]) & set(seen[second.name])
            by_key: dict[tuple[str, Any], dict[str, list]] = defaultdict(lambda: defaultdict(list))
            for kind, namespace, name in shared:
                namespace = name if kind == "Namespace" else namespace
                key = namespace_key(second, namespace) if namespace else (f"{PROJECT}:platform.ownsClusterResources", None)
                by_key[key][namespace].append((kind, namespace, name))
            for (key, value), namespaces in sorted(by_key.items(), key=lambda item: item[0][0]):
                found.append(_collision(first, second, key, value, namespaces, cluster))
            found += _node_ports(first, second, seen, cluster)
    return found


def _collision(first: Stack, second: Stack, key: str, value: Any, namespaces: dict[str, list], cluster: str) -> Finding:
    where = f"on one cluster ({describe(cluster)})"
    objects = [o for found in namespaces.values() for o in found]
    if "" in namespaces:
        return keyed(
            ERROR, second.file, second.lines, key, show(second.config.platform.owns_cluster_resources),
            f"{len(objects)} cluster-scoped objects ({_named(objects)}) would be deployed by both {second.file} and "
            f"{first.file} {where}; exactly one stack per cluster owns them: set ownsClusterResources: false and "
            f"clusterOwnerStack: {first.name} here (and armada.enabled: false: one Armada per cluster), or deploy "
            f"this stack to a cluster of its own (cloudstation:kubernetes.context)",
            "clusters", related=(first.file,))
    names = sorted(namespaces)
    listed = ", ".join(f"'{n}'" for n in names)
    return keyed(
        ERROR, second.file, second.lines, key, show(value),
        f"namespace{'s' if len(names) > 1 else ''} {listed} and the {len(objects)} objects in "
        f"{'them' if len(names) > 1 else 'it'} ({_named(objects)}) would be deployed by both {second.file} and "
        f"{first.file} {where}: each `pulumi up` overwrites the other's, and destroying either deletes them for both; "
        "choose another name here, or another cluster (cloudstation:kubernetes.context)",
        "clusters", related=(first.file,))


def _node_ports(first: Stack, second: Stack, seen: dict, cluster: str) -> list[Finding]:
    def ports(stack: Stack) -> dict[int, tuple[str, str, str]]:
        return {port["nodePort"]: identity for identity, obj in seen[stack.name].items() if identity[0] == "Service"
                for port in (obj.get("spec") or {}).get("ports") or [] if isinstance(port.get("nodePort"), int)}

    theirs, mine = ports(first), ports(second)
    found = []
    for port in sorted(set(theirs) & set(mine)):
        if theirs[port] == mine[port]:
            continue  # the same Service: a collision of objects, reported above
        kind, namespace, name = mine[port]
        key = f"{PROJECT}:platform.registry.nodePort" if name == "registry" else value_path(second.raw, port)
        found.append(keyed(
            ERROR, second.file, second.lines, key, show(port),
            f"NodePort {port} of Service {namespace}/{name} is also Service {theirs[port][1]}/{theirs[port][2]}'s in "
            f"{first.file}, on one cluster ({describe(cluster)}): a NodePort is cluster-wide and the API server refuses "
            "the second; choose another port (30000-32767)", "clusters", related=(first.file,)))
    return found


# --- Secrets read across stacks ------------------------------------------------------------------------


def secret_reads(group: list[Stack], cluster: str) -> list[Finding]:
    created = {(ns, name): stack for stack in group for (kind, ns, name) in identities(stack) if kind == "Secret"}
    namespaces = {name: stack for stack in group for (kind, _, name) in identities(stack) if kind == "Namespace"}
    found = []
    for stack in group:
        # Missing Secrets, grouped: a shared registry's (registry-auth, each project's registry-pull-<project>)
        # are one mistake, its ownerNamespace, so one finding names them all.
        missing: dict[tuple[str, str], list[str]] = {}
        for read in sorted(set(stack.rendered.reads.values())):
            type_, _, ident = read.partition(" ")
            namespace, _, name = ident.partition("/")
            if type_.endswith(":Secret") and (namespace, name) not in created:
                shared_registry = _reader_key(stack, namespace, name) == f"{PROJECT}:platform.registry.ownerNamespace"
                missing.setdefault((namespace, "" if shared_registry else name), []).append(name)
        for (namespace, _), names in missing.items():
            name = names[0]
            key = _reader_key(stack, namespace, name)
            shared_registry = key == f"{PROJECT}:platform.registry.ownerNamespace"  # never made by hand
            also = f" (and {', '.join(names[1:])})" if names[1:] else ""
            if namespace not in namespaces and not shared_registry:
                found.append(keyed(
                    NOTICE, stack.file, stack.lines, key, show(f"{namespace}/{name}"),
                    f"reads the Secret {namespace}/{name}, which no stack in this folder deploys: create it before "
                    f"`pulumi up` (kubectl -n {namespace} create secret generic {name} ...; docs/operations.md)",
                    "clusters"))
                continue
            owner = namespaces.get(namespace)
            whose = f"namespace '{namespace}' is {owner.file}'s" if owner else f"no stack creates namespace '{namespace}'"
            elsewhere = sorted(f"{ns}" for (ns, secret) in created if secret == name)
            hint = (f"; the stacks of this cluster create '{name}' in {', '.join(elsewhere)}: name that namespace"
                    if elsewhere else "")
            found.append(keyed(
                ERROR, stack.file, stack.lines, key,
                show(stack.config.platform.registry.owner_namespace) if shared_registry else show(namespace),
                f"reads the Secret {namespace}/{name}{also}, which no stack of its cluster ({describe(cluster)}) creates "
                f"there ({whose}): the deployment would wait for it and fail{hint}",
                "clusters", related=tuple({owner.file} - {stack.file}) if owner else ()))
    return found


def _reader_key(stack: Stack, namespace: str, name: str) -> Optional[str]:
    """The config key that makes the stack read Secret namespace/name: a shared registry's credentials
    (infra/delivery.py), a `{namespace, name}` reference (credentialsSecret, caSecret, ...), else a
    key holding the namespace."""
    registry = stack.config.platform.registry
    if registry.mode == "shared" and (name == REGISTRY_NAME + AUTH_SECRET_SUFFIX
                                      or name.startswith(pull_secret_name(REGISTRY_NAME, ""))):
        return f"{PROJECT}:platform.registry.ownerNamespace"
    return value_path(stack.raw, {"namespace": namespace, "name": name}) or value_path(stack.raw, namespace)


# --- the cluster budget -------------------------------------------------------------------------------


def budget(group: list[Stack], cluster: str) -> list[Finding]:
    owner = next((s for s in group if s.config.platform.owns_cluster_resources), None)
    if owner is None:
        return []
    setting = owner.config.platform.cluster_budget
    cpu_budget, memory_budget = quantities.parse(setting.cpu), quantities.parse(setting.memory)
    per_stack = {stack.name: cluster_fit.pods(stack.rendered.manifests()) for stack in group}
    cpu, memory = cluster_fit.totals(p for pods in per_stack.values() for p in pods)
    if cpu <= cpu_budget and memory <= memory_budget:
        return []
    over = " and ".join(part for part, excess in (
        (f"{quantities.cpu_text(cpu)} > {setting.cpu}", cpu > cpu_budget),
        (f"{quantities.memory_text(memory)} > {setting.memory}", memory > memory_budget)) if excess)
    stacks = "; ".join(f"{name}: {cluster_fit.show(*cluster_fit.totals(pods))}" for name, pods in per_stack.items())
    largest = sorted((p for pods in per_stack.values() for p in pods), key=lambda p: -(p.replicas * p.memory))[:3]
    biggest = ", ".join(f"{p.what} ({p.replicas} x {cluster_fit.show(p.cpu, p.memory)})" for p in largest)
    return [keyed(
        ERROR, owner.file, owner.lines, f"{PROJECT}:platform.clusterBudget",
        show({"cpu": setting.cpu, "memory": setting.memory}),
        f"the long-running pods of the stacks on this cluster ({describe(cluster)}) request {over} ({stacks}; "
        f"largest: {biggest}): lower replicas or sizes, or set clusterBudget to what the cluster can allocate",
        "budget", related=tuple(s.file for s in group if s is not owner))]


# --- promotion -----------------------------------------------------------------------------------------


def _entity_keys(stack: Stack) -> dict[str, str]:
    """`<project>/<entity>` -> its config key path, the platform's project-state entity included."""
    keys = {f"platform/{stack.config.platform.project_state.name}": f"{PROJECT}:platform.projectState"}
    for i, project in enumerate(stack.config.projects):
        for j, entity in enumerate(project.entities):
            keys[f"{project.name}/{entity.name}"] = f"{PROJECT}:projects[{i}].entities[{j}]"
    return keys


def promotion(prod: Stack, source: Optional[Stack]) -> list[Finding]:
    """What the flow still asks between the source stack and a prod stack, as notices."""
    if source is None:
        return []
    mine, theirs = _entity_keys(prod), _entity_keys(source)
    images = _images(prod)
    missing = sorted(k for k in mine if images.get(k) is None)
    # Never promoted: the first promotion promotes every entity at once (and refuses an entity that is
    # in only one of the stacks, so those are named too).
    first = bool(missing) and len(missing) == len(mine)
    command = lambda keys: promote.promote_command(source.name, prod.name, [] if first else keys)  # noqa: E731
    found = []
    if first:
        found.append(keyed(NOTICE, prod.file, prod.lines, f"{PROJECT}:projects", None,
                           f"{prod.file} was never promoted: deploy {source.name} (`bash scripts/up.sh {source.name}`), "
                           f"then run {command([])}", "promotion", related=(source.file,)))
    for key in missing:
        if key in theirs:
            if first:
                continue  # the notice above says it
            fix = f"deploy {source.name}, then promote it: {command([key])}"
        else:
            fix = f"add it to {source.file}, deploy {source.name}, then promote it: {command([key])}"
        found.append(keyed(NOTICE, prod.file, prod.lines, mine[key], None,
                           f"{key} has no image in {prod.file} yet (prod cannot deploy it): {fix}", "promotion",
                           related=(source.file,)))
    for key in sorted(set(theirs) - set(mine)):
        project = key.partition("/")[0]
        where = next((path.rsplit(".entities", 1)[0] for k, path in mine.items() if k.partition("/")[0] == project),
                     f"{PROJECT}:projects")
        found.append(keyed(NOTICE, prod.file, prod.lines, where, None,
                           f"{key} is in {source.file} and not in {prod.file}: add it here without `image:`, deploy "
                           f"{source.name}, then promote it: {command([key])}", "promotion", related=(source.file,)))
    for key in sorted(set(mine) - set(theirs) - set(missing)):
        found.append(keyed(NOTICE, prod.file, prod.lines, mine[key], None,
                           f"{key} is no longer in {source.file}: remove it here too when prod should stop running it "
                           f"(`promote` refuses an entity that is in only one of the stacks)", "promotion",
                           related=(source.file,)))
    return found


def _images(stack: Stack) -> dict[str, Optional[str]]:
    config = stack.config
    found = {f"platform/{config.platform.project_state.name}": config.platform.project_state.image}
    for project in config.projects:
        for entity in project.entities:
            found[f"{project.name}/{entity.name}"] = entity.image
    return found
