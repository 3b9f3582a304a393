"""Stacks that share one cluster (docs/cloudstate.md, "One cluster or two").

One stack per cluster owns the cluster's objects and runs the CloudState operator; the operator
reconciles only the namespaces in its watch list (the Scala operator's `watch.namespaces`: an
explicit list, never `*`). A namespace of another stack that is missing from that list is never
reconciled, and nothing says so: its StatefulServices simply never get pods. So the list is
checked from both sides, from the stack files in the repository, before anything is registered:

- a stack that does not own its cluster names its owner (`platform.clusterOwnerStack`, default
  `test`); each of its entity namespaces must be in the watch list of `Pulumi.<owner>.yaml`;
- the owner reads every other `Pulumi.<stack>.yaml` that names it as owner, and each of those
  stacks' entity namespaces must be in its own `platform.cloudstate.extraWatchedNamespaces`.

Why an explicit list in the owner's file rather than one computed from the other stack files:
the owner's objects (the operator's ConfigMap and RBAC) stay a function of its own file, so a
change to them shows up in a diff of that file; the checks make an omission fail loudly on either
stack instead. The order stays: deploy the owner, then the stacks that share its cluster.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional


if TYPE_CHECKING:
    from infra.config import StackConfig

PROJECT = "cloudstation"
STACK_FILE = re.compile(r"^Pulumi\.(?P<stack>[^/]+)\.yaml$")
OWNER_KEY = "platform.clusterOwnerStack"
WATCH_KEY = "platform.cloudstate.extraWatchedNamespaces"


def project_namespace(project: str, environment: str) -> str:
    return f"{project}-{environment}"


STATE_SUFFIX = "-state"


def project_state_namespace(platform_namespace: str) -> str:
    """The project-state entity's namespace, `<platform namespace>-state`: its own, because the
    operator generates its pods, which only a "baseline" namespace admits, and the platform
    namespace, which holds the registry and its credentials, enforces "restricted"."""
    return f"{platform_namespace}{STATE_SUFFIX}"


def entity_namespaces(platform_namespace: str, environment: str, projects: Iterable[str]) -> dict[str, str]:
    """Every namespace of a stack that holds StatefulServices, with the config key it comes from:
    the project-state entity's and each project's `<project>-<environment>`."""
    found = {project_state_namespace(platform_namespace): f"{PROJECT}:platform.namespace"}
    for index, project in enumerate(projects):
        found[project_namespace(project, environment)] = f"{PROJECT}:projects[{index}].name"
    return found


def own_namespaces(config: "StackConfig") -> dict[str, str]:
    return entity_namespaces(config.platform.namespace, config.environment.value, [p.name for p in config.projects])


def watched_namespaces(config: "StackConfig") -> list[str]:
    """What an owner's operator reconciles: its own entity namespaces and the listed ones."""
    return sorted(set(own_namespaces(config)) | set(config.platform.cloudstate.extra_watched_namespaces))


def default(field: str):
    """The default of a `platform` key, for stack files read without validation."""
    from infra.config import PlatformConfig

    return PlatformConfig.model_fields[field].default


def stack_of(source: str) -> Optional[str]:
    """`test` from `Pulumi.test.yaml` (the `source` every caller of config.load passes)."""
    match = STACK_FILE.match(Path(source).name)
    return match["stack"] if match else None


def _raw(path: Path) -> dict:
    """A stack file's `cloudstation:` values, parsed like the engine passes them (JSON strings)."""
    from infra import stack_yaml  # read as the CLI reads it: a malformed file is a ConfigError naming it
    from infra.config import parse_value

    values = {}
    for key, value in stack_yaml.read(path).items():
        namespace, _, name = key.partition(":")
        if namespace == PROJECT:
            values[name] = parse_value(value) if isinstance(value, str) and value[:1] in "[{" else value
    return values


def owner_config(config: "StackConfig", root: Path) -> "StackConfig":
    """The validated config of the stack that owns this (non-owner) stack's cluster."""
    from infra.config import ConfigError, load

    owner = config.platform.cluster_owner_stack
    path = root / f"Pulumi.{owner}.yaml"
    if not path.is_file():
        raise ConfigError([f"{PROJECT}:{OWNER_KEY}: {owner!r} — no stack file {path.name} in {root}; name the "
                           "stack that owns this cluster (ownsClusterResources: true)"], "stack config")
    values = {f"{PROJECT}:{k}": json.dumps(v) for k, v in _raw(path).items()}
    try:
        # Without root: no cross-stack check of its own; and an owner's images are no concern here
        # (a prod owner is promoted only after the stacks sharing its cluster deployed).
        return load(values, source=path.name, require_images=False)
    except ConfigError as error:
        raise ConfigError([f"{PROJECT}:{OWNER_KEY}: {owner!r} — {path.name}, the owner's stack file, has problems "
                           "of its own; fix them first:", *[f"  {p}" for p in error.problems]], "stack config") from None


def operator_config(config: "StackConfig", root: Path) -> "StackConfig":
    """The config of the stack whose CloudState operator runs this stack's entities: its own when it
    owns the cluster, else its owner's (whose `imageMirror` the operator's proxy images carry)."""
    return config if config.platform.owns_cluster_resources else owner_config(config, root)


def problems(config: "StackConfig", source: str, root: Path) -> list[str]:
    """Namespaces of this stack, or of a stack that shares its cluster, that no operator watches."""
    from infra.config import ConfigError

    stack = stack_of(source)
    if not config.platform.owns_cluster_resources:
        try:
            owner = owner_config(config, root)
        except ConfigError as error:
            return error.problems
        name = config.platform.cluster_owner_stack
        if not owner.platform.owns_cluster_resources:
            return [f"{PROJECT}:{OWNER_KEY}: {name!r} — Pulumi.{name}.yaml does not own its cluster "
                    "(ownsClusterResources: false); name the stack that does"]
        watched = set(watched_namespaces(owner))
        return [
            f"{key}: namespace {namespace!r} — the CloudState operator of the owner stack {name!r} "
            f"({OWNER_KEY}) does not watch it, so its entities would never run; add {namespace!r} to "
            f"{WATCH_KEY} in Pulumi.{name}.yaml and deploy {name} first"
            for namespace, key in own_namespaces(config).items() if namespace not in watched
        ]
    found = []
    watched = set(watched_namespaces(config))
    for path in sorted(root.glob("Pulumi.*.yaml")):
        other = stack_of(path.name)
        if other is None or other == stack:
            continue
        values = _raw(path)
        platform = values.get("platform") if isinstance(values.get("platform"), dict) else {}
        if platform.get("ownsClusterResources", True) is not False or platform.get("clusterOwnerStack", default("cluster_owner_stack")) != stack:
            continue
        namespaces = entity_namespaces(
            platform.get("namespace", default("namespace")), str(values.get("environment")),
            [p.get("name") for p in values.get("projects") if isinstance(p, dict)]
            if isinstance(values.get("projects"), list) else [],
        )
        missing = [ns for ns in namespaces if ns not in watched]
        if missing:
            found.append(
                f"{PROJECT}:{WATCH_KEY}: {sorted(config.platform.cloudstate.extra_watched_namespaces)} — misses "
                f"{', '.join(repr(ns) for ns in missing)} of stack {other!r} ({path.name} shares this cluster: "
                f"{OWNER_KEY}: {stack}); add them, or the operator never runs that stack's entities there"
            )
    return found
