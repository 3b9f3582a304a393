"""The stack config: one pydantic model of everything a stack file may say.

A stack file holds these Pulumi config keys (namespace `cloudstation:`):

    environment   test | prod                     what this stack is (test builds, prod promotes)
    kubernetes    KubernetesConfig                 which cluster, and optional YAML rendering
    platform      PlatformConfig                   cluster-level services (registry, CloudState, Armada)
    projects      list[ProjectConfig]              CloudStation projects and their entities

Secrets are separate `secure:` keys listed in SECRET_KEYS and read with `require_secret`; they
never pass through this model. `load()` validates everything before the program registers a
resource and raises ConfigError with one line per problem: `key.path: bad value — what is allowed`.
"""
from __future__ import annotations

import difflib
import json
import re
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Mapping, Optional

from pydantic import AfterValidator, BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from components.model import ConfigModel, DnsLabel, NotShown, ShortDnsLabel, problem, unique_names
from components.armada.queue import QUEUE_API_PASSWORD_KEY, project_queue_clashes
from components.armada.settings import EXECUTOR_PASSWORD_KEY, ArmadaConfig
from components.build_job import BuildSettings
from components.build_context import CONTEXT_REPOSITORY_PART
from components.entity_image import DOCKERFILE, GENERATED_LANGUAGES
from components.registry import PASSWORD_KEY as REGISTRY_PASSWORD_KEY, RegistryConfig
from components.k8s import CpuQuantity, MemoryQuantity
from components.cloudstate_operator import CloudStateArgs
from components.cloudstate_store import StoresConfig
from components import network
from components.network import KubernetesApi
from components.monitoring import MonitoringConfig
from components.model import problems as several_problems

PROJECT = "cloudstation"
"""The Pulumi project name (Pulumi.yaml) and so the namespace of every config key."""

# An image reference pinned by digest, matched whole and ASCII-only; one definition for the
# config, promotion and the policy pack (infra/image_refs.py).
from infra.image_refs import DIGEST_REF, is_digest_ref, stack_image_problems  # noqa: E402
from infra import store_versions  # noqa: E402
from infra.store_versions import StoreVersions  # noqa: E402

SECRET_KEYS: dict[str, str] = {}
"""`secure:` config keys the program reads, with what each holds. Areas register theirs here."""
SECRET_KEYS[REGISTRY_PASSWORD_KEY] = "password or token of the external registry (platform.registry.mode: external)"
SECRET_KEYS[QUEUE_API_PASSWORD_KEY] = "password of platform.armada.queueApi.username (Armada queue API basic auth)"
SECRET_KEYS[EXECUTOR_PASSWORD_KEY] = ("an executor-only stack's executor password at the main scheduler "
                                      "(the main stack's Secret armada-worker-<name>, platform.armada.mode: executor-only)")

PROMOTE_HINT = "deploy test (`pulumi up -s test`), then run `python -m infra promote --from test --to prod`"
"""What a prod stack without real images needs (docs/promotion.md)."""


def is_placeholder_digest(ref: str) -> bool:
    """A digest no image can have: 56 or more leading zero hex digits (224 zero bits of a SHA-256),
    as example files write placeholders (`sha256:000...0001`)."""
    return ref.rpartition("@sha256:")[2].startswith("0" * 56)


PROVIDER_NAMESPACE = "kubernetes"
PROVIDER_KEYS = {
    "context": f"set {PROJECT}:kubernetes.context instead",
    "renderYamlToDirectory": f"set {PROJECT}:kubernetes.renderYamlToDirectory instead",
    "cluster": f"choose the cluster through its kubeconfig context: {PROJECT}:kubernetes.context",
    "kubeconfig": "set the KUBECONFIG environment variable instead (the program's provider reads it: "
                  "pulumi_kubernetes/provider.py), and the context in " + f"{PROJECT}:kubernetes.context",
    "namespace": "every object names its own namespace here (platform.namespace, `<project>-<environment>`); "
                 "remove it",
}
"""`kubernetes:*` config configures only the engine's default Kubernetes provider (pulumi/pulumi
pkg/resource/deploy/default_providers.go `newRegisterDefaultProviderEvent` reads the package's
config); this program deploys every object through its own `k8s.Provider` (infra/program.py), which
takes only its arguments. Such keys would be silently ignored, so they are refused, naming the key to use."""


def provider_key_problem(key: str) -> str:
    name = key.partition(":")[2]
    fix = PROVIDER_KEYS.get(name, f"the program sets the provider's options itself (infra/program.py provider_args); "
                                  f"only {PROJECT}:kubernetes configures it")
    return (f"{key}: not read — this program deploys through its own Kubernetes provider, configured by "
            f"{PROJECT}:kubernetes; {fix} (and `pulumi config rm {key}`)")


def near_namespace_problem(key: str) -> Optional[str]:
    """A key whose namespace is a misspelling of ours (`cloudstaton:`, `CloudStation:`,
    `cloudstation-prod:`) or of the provider's: no package reads it, so the engine passes it on and
    nothing notices; the setting it was meant to be is silently absent (a missing
    `cloudstation:kubernetes` deploys to the current kube context). Any other namespace belongs to
    a package or to the user and stays allowed."""
    namespace, _, name = key.partition(":")
    near = difflib.get_close_matches(namespace.lower(), [PROJECT, PROVIDER_NAMESPACE], n=1, cutoff=0.8)
    if not near:
        return None
    if near[0] == PROVIDER_NAMESPACE:
        fix = PROVIDER_KEYS.get(name, f"only {PROJECT}:kubernetes configures the program's Kubernetes provider")
        return (f"{key}: not read — no package reads the namespace '{namespace}' (did you mean "
                f"'{PROVIDER_NAMESPACE}:{name}'? that is not read either: {fix})")
    return (f"{key}: not read — no package reads the namespace '{namespace}', so the deployment would silently go "
            f"without this setting (did you mean '{PROJECT}:{name}'?); rename the key in the stack file")


def flat_key_problem(key: str, value: Any) -> str:
    """`pulumi config set cloudstation:platform.registry.nodePort 32001` without `--path` stores one key
    whose name holds the dots (pulumi/pulumi sdk/go/common/resource/config/key.go: the path is
    parsed only with --path); the program never reads it."""
    shown = value if isinstance(value, str) else json.dumps(value)
    return (f"{key}: {_show(value)} — a flat key: `pulumi config set` without --path wrote one key whose name "
            f"holds the path, which nothing reads; run `pulumi config rm '{key}'` and "
            f"`pulumi config set --path '{key}' {shown}` (or write it nested in the stack file)")


def plain_secret_problem(key: str) -> str:
    return (f"{key}: set in plain text — {SECRET_KEYS[key.partition(':')[2]]} must be a secret: run "
            f"`pulumi config set --secret {key}` (it prompts for the value and replaces the plain one)")


def _has_image(data: Mapping[str, Any]) -> bool:
    """Whether any entity of a stack's raw config (projects, platform.projectState) names an image."""
    entities = []
    projects = data.get("projects")
    for project in projects if isinstance(projects, list) else []:
        if isinstance(project, dict) and isinstance(project.get("entities"), list):
            entities += project["entities"]
    platform = data.get("platform")
    if isinstance(platform, dict):
        entities.append(platform.get("projectState"))
    return any(isinstance(entity, dict) and entity.get("image") is not None for entity in entities)


class Environment(str, Enum):
    TEST = "test"
    PROD = "prod"


class EntityKind(str, Enum):
    EVENT_SOURCED = "event-sourced"
    REPLICATED = "replicated"
    ACTION = "action"

    @property
    def needs_store(self) -> bool:
        return self is EntityKind.EVENT_SOURCED


class Language(str, Enum):
    """CloudState user-function languages. Entities in languages without a generated Dockerfile
    (see components/entity_image.py) must bring their own Dockerfile."""

    JAVASCRIPT = "javascript"
    JAVA = "java"
    GO = "go"
    PYTHON = "python"
    DART = "dart"
    SCALA = "scala"
    KOTLIN = "kotlin"
    CSHARP = "csharp"
    RUST = "rust"


def _relative_source(value: str) -> str:
    # The source is the image's build context: a directory inside the repository, never `..`,
    # an absolute path or the repository itself (which holds the stack files).
    parts = value.replace("\\", "/").split("/")
    if not value.strip() or value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value) or ".." in parts \
            or all(part in ("", ".") for part in parts):
        raise problem("must be a directory inside the repository, relative to the directory of Pulumi.yaml "
                      "(no absolute path, no `..`), e.g. entities/shop/cart")
    return value


class EntityConfig(ConfigModel):
    """One CloudState entity: built into one image and deployed as one StatefulService."""

    name: ShortDnsLabel
    """Entity name, unique in its project; the StatefulService is `<project>-<name>`."""
    kind: EntityKind
    """`event-sourced` (needs the project's store), `replicated` (CRDT) or `action` (stateless)."""
    language: Language
    """The CloudState SDK language of its source."""
    source: Annotated[str, AfterValidator(_relative_source)]
    """Directory of the entity's source, relative to the directory of Pulumi.yaml (the program
    passes it to pulumi-docker relative to its own directory, infra/)."""
    image: Optional[str] = None
    """Digest-pinned image (`repo[:tag]@sha256:…`). Required in prod, where it is written by
    `python -m infra promote`; in test, when set, it is deployed instead of building `source`."""
    replicas: int = Field(default=1, ge=1, le=100)
    """Replicas of the entity's StatefulService."""

    @field_validator("image")
    @classmethod
    def _digest_pinned(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not is_digest_ref(value):
            raise problem("must be pinned by digest: <registry>/<repository>[:tag]@sha256:<64 hex digits>")
        if value is not None and is_placeholder_digest(value):
            raise problem(f"is a placeholder digest, not an image any registry holds; {PROMOTE_HINT}")
        return value

    @model_validator(mode="after")
    def _per_environment(self, info: ValidationInfo) -> "EntityConfig":
        context = info.context or {}
        if context.get("environment") == Environment.PROD and self.image is None and not context.get("images_optional"):
            raise problem(
                "a prod entity needs a digest-pinned image; promote one from test with "
                "`python -m infra promote --from test --to prod`",
                subpath=".image",
                value=None,
            )
        root = context.get("root")
        if root is not None and not (Path(root) / self.source).resolve().is_relative_to(Path(root).resolve()):
            # A symlink inside the repository that points out of it: the build context would be outside.
            raise problem(
                f"resolves to {(Path(root) / self.source).resolve()}, outside the repository ({root}); "
                "the source must be a directory inside it", subpath=".source", value=self.source,
            )
        if context.get("environment") == Environment.TEST and self.image is None and root is not None:
            if not (Path(root) / self.source).is_dir():
                raise problem(
                    f"directory not found (paths are relative to {root})", subpath=".source", value=self.source
                )
            if self.language.value not in GENERATED_LANGUAGES and not (Path(root) / self.source / DOCKERFILE).is_file():
                raise problem(
                    f"{self.source}/{DOCKERFILE} not found: a Dockerfile is generated only for "
                    f"{', '.join(GENERATED_LANGUAGES)}; add one to the source directory",
                    subpath=".language",
                    value=self.language.value,
                )
        return self


class ProjectConfig(ConfigModel):
    """A CloudStation project: one namespace per environment (`<name>-<environment>`)."""

    name: ShortDnsLabel
    """Project id; also the prefix of its namespaces, images and Armada queue."""
    store: Literal["postgres", "cassandra"] = "postgres"
    """The store of its event-sourced entities (the platform's `stores` section says how it runs)."""
    entities: list[EntityConfig] = Field(min_length=1)
    """The project's entities."""

    @field_validator("entities")
    @classmethod
    def _unique_names(cls, entities: list[EntityConfig]) -> list[EntityConfig]:
        return unique_names(entities, "entity")


class ProjectStateConfig(EntityConfig):
    """CloudStation's own Project entity (entities/project-state), in `<platform namespace>-state`."""

    name: ShortDnsLabel = "project-state"
    kind: EntityKind = EntityKind.EVENT_SOURCED
    language: Language = Language.JAVASCRIPT
    source: Annotated[str, AfterValidator(_relative_source)] = "entities/project-state"


class KubernetesConfig(ConfigModel):
    """The Kubernetes provider of this stack."""

    context: Optional[str] = None
    """kubeconfig context to deploy to; unset means the current context."""
    render_yaml_to_directory: Optional[str] = None
    """With the Pulumi CLI: write manifests to this directory instead of applying them
    (pulumi-kubernetes `renderYamlToDirectory`; Secrets are written in plain text there). Relative
    to the directory of Pulumi.yaml, like every path in stack config; the program passes it to the
    provider relative to its own directory, infra/ (infra/engine_paths.py)."""

    @field_validator("render_yaml_to_directory")
    @classmethod
    def _relative(cls, value: Optional[str]) -> Optional[str]:
        # An absolute path differs between checkouts, and pulumi-kubernetes' DiffConfig replaces
        # the provider, so every object, when renderYamlToDirectory changes (provider.go).
        if value is not None and (not value or Path(value).is_absolute() or value.startswith("~")):
            raise problem("must be a directory relative to the directory of Pulumi.yaml, e.g. rendered/test")
        return value

    @model_validator(mode="after")
    def _render_without_context(self) -> "KubernetesConfig":
        # pulumi-kubernetes provider.go CheckConfig: `"context" arg is not compatible with
        # "renderYamlToDirectory" arg`; say so before anything is registered.
        if self.render_yaml_to_directory is not None and self.context is not None:
            raise problem("not allowed together with renderYamlToDirectory (the provider rejects both)", ".context", self.context)
        return self


class BuildsConfig(BuildSettings):
    """How the test stack builds entity images (docs/builds.md). Prod never builds. Besides `mode`,
    the in-cluster builder's settings (components/build_job.py BuildSettings, one definition)."""

    mode: Optional[Literal["armada", "local"]] = None
    """`armada`: every changed entity is built, tested and pushed inside the cluster, as one Armada
    job in its project's `<project>-builds` queue (no Docker engine on the machine running
    `pulumi up`); `local`: pulumi-docker builds with the Docker engine of that machine and pushes
    through the registry's push host. Unset: `armada` in a stack that runs Armada
    (`platform.armada.enabled`), manages its build queues (`armada.queueApi.enabled`,
    `armada.projectQueue.enabled`) and its registry (`registry.mode: managed`) and has no
    `armada.workers` (a build job could run on a worker cluster: `armada` is refused there), else
    `local`. Build pods run in the namespace `<platform namespace>-build`."""


class ClusterBudget(ConfigModel):
    """What the long-running pods of every stack deployed to one cluster may request together."""

    cpu: CpuQuantity = "3"
    """CPU the pods may request together."""
    memory: MemoryQuantity = "6Gi"
    """Memory the pods may request together."""


class ImagesConfig(ConfigModel):
    """Platform images (the pins of infra/versions.py) and how they run (docs/security.md, "Images")."""

    allow_unpinned: list[str] = []
    """Pins of infra/versions.py this stack may run by their exact tag because infra/image-digests.yaml
    records no digest for them yet, each by name (a lab cluster's opt-out; there is no blanket switch).
    A stack that would pull an unnamed one by tag (its pods, its build pods, the CloudState operator's
    proxies, and in a stack sharing a cluster the proxies its owner's operator gives its entity pods)
    is refused before anything is deployed, naming each. `python -m infra pin-images --missing`, run
    where the registries are reachable, records the digests; then remove each recorded name (a name
    with a digest is refused here, as is an unknown one)."""

    @field_validator("allow_unpinned")
    @classmethod
    def _pins_without_a_digest(cls, names: list[str]) -> list[str]:
        from infra import stack_images

        found = stack_images.opt_out_problems(names)
        if found:
            raise several_problems(found)
        return names


class PlatformConfig(ConfigModel):
    """Cluster-level services shared by all projects of the stack."""

    namespace: DnsLabel = "cloudstation"
    """Namespace of the platform's own services."""
    image_mirror: Optional[str] = None
    """Registry path that mirrors the pinned third-party images (e.g. `mirror.example:5000/hub`)."""
    images: ImagesConfig = ImagesConfig()
    """Which platform images may run by tag (a lab cluster's named opt-out; infra/stack_images.py)."""
    owns_cluster_resources: bool = True
    """Whether this stack owns the cluster-scoped objects (CRDs, ClusterRoles, PriorityClasses,
    the CloudState operator) and runs the cluster's one Armada. When test and prod share one
    cluster, exactly one stack sets true; the other sets false, reuses them and sets
    `armada.enabled: false`."""
    cluster_owner_stack: str = Field(default="test", pattern=r"^[A-Za-z0-9_.-]+$")
    """With `ownsClusterResources: false`: the stack that owns this cluster. Its stack file
    (`Pulumi.<stack>.yaml` beside this one) must list this stack's namespaces in
    `platform.cloudstate.extraWatchedNamespaces`, which is checked before anything is deployed
    (infra/cluster_sharing.py)."""
    cluster_budget: ClusterBudget = ClusterBudget()
    """What the long-running pods of every stack deployed to this cluster (this stack and those naming
    it in `clusterOwnerStack`) may request together: the cluster's allocatable capacity you plan for,
    after kube-system. `cloudstation check` sums every Deployment, StatefulSet, DaemonSet (once) and
    entity pod of the rendered stacks and reports the excess. Only in the stack that owns the cluster
    (ownsClusterResources: true); the default fits one node of 4 CPU and 8 GiB, e.g. kind on a laptop."""
    project_state: ProjectStateConfig = Field(default={}, validate_default=True)
    """CloudStation's own event-sourced Project entity, built and promoted like any entity."""
    armada: ArmadaConfig = ArmadaConfig()
    """The Armada batch scheduler (components/armada/settings.py)."""
    registry: RegistryConfig = Field(default={}, validate_default=True)
    """Where entity images are pushed and pulled: a managed registry or an external one
    (components/registry.py, docs/registry.md)."""
    cloudstate: CloudStateArgs = CloudStateArgs()
    """The CloudState operator and entity pods (components/cloudstate_operator.py, docs/cloudstate.md)."""
    stores: StoresConfig = StoresConfig()
    """How the projects' stores run: managed per project namespace, or external (docs/cloudstate.md)."""
    project_state_store: Literal["postgres", "cassandra"] = "postgres"
    """The store of the project-state entity, in its namespace `<platform namespace>-state`."""
    kubernetes_api: KubernetesApi = Field(default={}, validate_default=True)
    """The Kubernetes API server's addresses and port, the only ones its clients' NetworkPolicies
    allow (components/network.py, docs/network-policies.md). The default fits kind."""
    monitoring: MonitoringConfig = MonitoringConfig()
    """Prometheus Operator monitoring: PodMonitors, alerts, dashboards, store exporters (off by
    default; components/monitoring.py, docs/monitoring.md)."""
    store_versions: StoreVersions = StoreVersions()
    """The major version each kind of managed store's data was created with, and a major upgrade in
    progress (infra/store_versions.py, docs/upgrades.md)."""
    builds: BuildsConfig = BuildsConfig()
    """How the test stack builds entity images: in the cluster as Armada jobs, or locally
    (docs/builds.md)."""

    @property
    def build_mode(self) -> str:
        """The effective `builds.mode`: as set, else `armada` where this stack runs Armada and
        manages its build queues, else `local`."""
        return self.build_mode_why[0]

    @property
    def build_mode_why(self) -> tuple[str, Optional[str], str]:
        """(effective builds.mode, the key that chose it, why): a default `local` is said, not silent
        (`cloudstation check`, preflight's Docker check)."""
        if self.builds.mode:
            return self.builds.mode, "builds.mode", f"platform.builds.mode: {self.builds.mode}"
        armada = self.armada
        # A worker stack (armada.mode: executor-only) has no server to submit builds to; a main
        # stack with workers could see its builds scheduled on a worker cluster (_armada_builds_need_armada).
        local = "platform.builds.mode: local, the default"
        if not armada.enabled:
            return "local", "armada.enabled", f"{local} without Armada (platform.armada.enabled: false)"
        if armada.mode != "full":
            return "local", "armada.mode", f"{local} in an Armada worker stack (platform.armada.mode: {armada.mode})"
        if not armada.queue_api.enabled or not armada.project_queue.enabled:
            key = "queueApi" if not armada.queue_api.enabled else "projectQueue"
            return "local", f"armada.{key}.enabled", f"{local} when platform.armada.{key}.enabled is false"
        if armada.workers:
            return "local", "armada.workers", f"{local} in a stack with platform.armada.workers"
        if self.registry.mode != "managed":
            return ("local", "registry.mode", f"{local} with registry.mode: {self.registry.mode} (in-cluster builds "
                    "push to this stack's managed registry)")
        return "armada", None, "platform.builds.mode: armada, the default where the stack runs Armada"

    @property
    def builds_namespace(self) -> str:
        """Where Armada runs the build pods (`<platform namespace>-build`: as long as the
        project-state namespace `-state`, whose length check covers both)."""
        return f"{self.namespace}-build"

    @field_validator("registry")
    @classmethod
    def _registry_addresses_not_open(cls, registry: RegistryConfig) -> RegistryConfig:
        # RegistryConfig's address lists are plain networks (not components/network.py `Cidrs`); both
        # go into one ingress rule of the registry's NetworkPolicy, so their union is checked too.
        remedy = network.LIST_THE_NETWORKS + " (the nodes' addresses, the LoadBalancer's clients)"
        lists = [(".nodeCidrs", registry.node_cidrs), (".loadBalancerSourceRanges", registry.load_balancer_source_ranges)]
        found = [p for subpath, blocks in lists if (p := network.open_problem(blocks, remedy, subpath)) is not None]
        if not found and registry.load_balancer:
            together = network.open_problem([*registry.node_cidrs, *registry.load_balancer_source_ranges],
                                            "nodeCidrs and loadBalancerSourceRanges together form that rule; " + remedy,
                                            ".nodeCidrs")
            found = [together] if together is not None else []
        if found:
            raise several_problems(found)
        return registry

    @model_validator(mode="after")
    def _watch_only_when_owner(self) -> "PlatformConfig":
        # Only the owning stack runs an operator, so only it can watch other stacks' namespaces.
        if self.cloudstate.extra_watched_namespaces and not self.owns_cluster_resources:
            raise problem(
                "only the stack that owns the cluster resources (ownsClusterResources: true) runs the "
                "operator; list this stack's namespaces in the owning stack's "
                "platform.cloudstate.extraWatchedNamespaces instead",
                ".cloudstate.extraWatchedNamespaces",
                self.cloudstate.extra_watched_namespaces,
            )
        return self

    @model_validator(mode="after")
    def _budget_only_when_owner(self) -> "PlatformConfig":
        if "cluster_budget" in self.model_fields_set and not self.owns_cluster_resources:
            raise problem(f"the cluster's budget is a setting of the stack that owns it: set it in "
                          f"Pulumi.{self.cluster_owner_stack}.yaml (clusterOwnerStack) and remove it here",
                          ".clusterBudget", self.cluster_budget.model_dump(by_alias=True, mode="json"))
        return self

    @model_validator(mode="after")
    def _owner_stack_only_when_not_owner(self) -> "PlatformConfig":
        if "cluster_owner_stack" in self.model_fields_set and self.owns_cluster_resources:
            raise problem("only for a stack that does not own its cluster (ownsClusterResources: false)",
                          ".clusterOwnerStack", self.cluster_owner_stack)
        return self

    @model_validator(mode="after")
    def _armada_builds_need_armada(self, info: ValidationInfo) -> "PlatformConfig":
        # Build jobs go to this stack's Armada: its `<project>-builds` queues (managed here, so the
        # build user's submit right is set on them) and its builds namespace.
        mode = self.builds.mode
        if (info.context or {}).get("environment") == Environment.PROD and "builds" in self.model_fields_set:
            raise problem("prod never builds: it deploys the images promoted from test; remove platform.builds",
                          ".builds", self.builds.model_dump(by_alias=True, mode="json"))
        if mode != "armada":
            return self
        armada = self.armada
        if armada.enabled and armada.mode != "full":
            raise problem(
                "builds are submitted to this stack's Armada server, and a worker stack (platform.armada.mode: "
                "executor-only) has none; set builds.mode: local", ".builds.mode", mode,
            )
        if not armada.enabled:
            raise problem(
                "builds run as jobs of this stack's Armada, but platform.armada.enabled is false; "
                "set builds.mode: local (pulumi-docker on the machine running `pulumi up`) or enable Armada",
                ".builds.mode", mode,
            )
        if armada.workers:
            # Armada v0.22.7 finds a job eligible in every pool where it fits (internal/scheduler/
            # submitcheck.go), a worker cluster's pool included, and nothing in a build job pins it to
            # this cluster, where alone the builds namespace, its Secret and the registry Service exist.
            raise problem(
                "build jobs could be scheduled onto a worker cluster (platform.armada.workers: "
                f"{', '.join(w.name for w in armada.workers)}), which has no builds namespace and no registry; "
                "in-cluster builds are refused in a stack with workers until build jobs can be pinned to this "
                "cluster. Set platform.builds.mode: local (the default with workers) or remove platform.armada.workers",
                ".builds.mode", mode,
            )
        if not armada.queue_api.enabled or not armada.project_queue.enabled:
            key = "queueApi.enabled" if not armada.queue_api.enabled else "projectQueue.enabled"
            raise problem(
                f"builds are submitted to the `<project>-builds` queues this stack manages, but "
                f"platform.armada.{key} is false; set it to true, or builds.mode: local",
                ".builds.mode", mode,
            )
        if self.registry.mode != "managed":
            raise problem(
                f"build pods push to this stack's managed registry through its in-cluster Service, but "
                f"platform.registry.mode is '{self.registry.mode}'; use builds.mode: local with it",
                ".builds.mode", mode,
            )
        return self

    @model_validator(mode="after")
    def _builds_namespace_free(self, info: ValidationInfo) -> "PlatformConfig":
        if self.build_mode != "armada" or (info.context or {}).get("environment") == Environment.PROD:
            return self
        if self.registry.build_platform is not None:
            # pulumi-docker's platform; kaniko builds for the node its pod runs on.
            raise problem("only for platform.builds.mode: local (pulumi-docker); in-cluster builds build for the "
                          "nodes' own platform — remove it, or set builds.mode: local",
                          ".registry.buildPlatform", self.registry.build_platform)
        name = self.builds_namespace
        for key, taken in ((".armada.namespace", [self.armada.namespace]), (".armada.jobNamespaces", self.armada.job_namespaces)):
            if name in taken:
                raise problem(f"'{name}' is the builds namespace (`<platform namespace>-build`, its own Pod Security "
                              "level and policies); choose another name", key, name)
        return self

    @model_validator(mode="after")
    def _builds_can_pull(self, info: ValidationInfo) -> "PlatformConfig":
        # Build pods reach only DNS, the registry and what the stack declares (components/builds_namespace.py):
        # with nothing declared, every build would fail after minutes on a real cluster. Checked for a
        # test stack being loaded (not for the reference's defaults; prod never builds).
        if self.build_mode != "armada" or (info.context or {}).get("environment") != Environment.TEST:
            return self
        note = " (platform.builds.mode: armada" + ("" if self.builds.mode else ", the default in a stack running Armada") + ")"
        reason = self.builds.nothing_to_pull_from(note)
        if reason:
            raise problem(reason, ".builds.publicEgress.enabled", False)
        return self

    @model_validator(mode="after")
    def _armada_only_when_owner(self) -> "PlatformConfig":
        # An Armada executor tracks every Armada job pod of the cluster, in all namespaces, and
        # deletes those its scheduler does not know (docs/armada.md, "One Armada per cluster").
        if self.armada.enabled and not self.owns_cluster_resources:
            raise problem(
                "one Armada per cluster: its executors delete the pods of any other Armada's jobs in the "
                "cluster; the stack that owns the cluster's resources runs it — set armada.enabled: false "
                "here, or give this stack its own cluster (ownsClusterResources: true)",
                ".armada.enabled",
                True,
            )
        return self


KUBERNETES_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
"""Namespaces every cluster has, holding the cluster's own objects (kube-system: its controllers' credentials)."""

WORKER_UNUSED_PLATFORM_KEYS = (
    "namespace", "project_state", "registry", "cloudstate", "stores", "project_state_store", "builds",
)
"""Platform settings of CloudStation's own services, which a worker stack without projects does not run."""


def _plain(value: Any) -> Any:
    return value.model_dump(by_alias=True, mode="json") if isinstance(value, BaseModel) else value


class StackConfig(ConfigModel):
    """Everything one stack file configures."""

    environment: Environment
    """`test` builds entity images from source; `prod` deploys promoted, digest-pinned images only."""
    kubernetes: KubernetesConfig = Field(default={}, validate_default=True)
    platform: PlatformConfig = Field(default={}, validate_default=True)
    projects: list[ProjectConfig]
    """At least one, except in an Armada worker stack (`platform.armada.mode: executor-only`):
    `[]` there runs none of CloudStation's own services."""

    @model_validator(mode="after")
    def _projects_or_worker(self) -> "StackConfig":
        armada = self.platform.armada
        worker = armada.enabled and armada.mode == "executor-only"
        if not self.projects and not worker:
            raise problem("list should have at least 1 item (only an Armada worker stack, platform.armada.mode: "
                          "executor-only, may have none)", "projects", [])
        if worker and not self.projects:
            # Without projects a worker stack deploys no registry, CloudState or project-state
            # (infra/cloudstation.py): settings for them would be ignored.
            unused = sorted(self.platform.model_fields_set & set(WORKER_UNUSED_PLATFORM_KEYS))
            if unused:
                field = unused[0]
                alias = PlatformConfig.model_fields[field].alias or field
                raise problem(
                    "an Armada worker stack without projects runs no registry, CloudState or project-state; "
                    "remove it (or list the projects this cluster also runs)",
                    f"platform.{alias}", _plain(getattr(self.platform, field)),
                )
        return self

    @field_validator("projects")
    @classmethod
    def _unique_projects(cls, projects: list[ProjectConfig]) -> list[ProjectConfig]:
        unique_names(projects, "project")
        for index, project in enumerate(projects):
            if project.name == "platform":
                raise problem("'platform' is reserved (the project-state entity's image is platform/project-state)",
                              f"[{index}].name", project.name)
            if project.name == CONTEXT_REPOSITORY_PART:
                # Its images would be `builds/<entity>` and its build user's rights `builds/*`: every
                # project's build contexts (components/registry_access.py).
                raise problem(f"'{CONTEXT_REPOSITORY_PART}' is reserved (every project's build contexts are "
                              f"{CONTEXT_REPOSITORY_PART}/<project>/<entity> in the registry)", f"[{index}].name", project.name)
        return projects

    @model_validator(mode="after")
    def _cloudstate_names_fit(self) -> "StackConfig":
        # Project namespaces are `<project>-<environment>`; the platform namespace must differ.
        platform = self.platform.namespace
        state = f"{platform}-state"  # the project-state entity's namespace (infra/cluster_sharing.py)
        if len(state) > 63:
            raise problem(f"project-state runs in '{state}', longer than a namespace name may be (63); "
                          "shorten the platform namespace to at most 57 characters", "platform.namespace", platform)
        for index, project in enumerate(self.projects):
            if f"{project.name}-{self.environment.value}" == platform:
                raise problem(
                    f"its namespace '{platform}' is the platform namespace (platform.namespace); "
                    "rename the project or the platform namespace",
                    f"projects[{index}].name",
                    project.name,
                )
            for position, entity in enumerate(project.entities):
                # The StatefulService `<project>-<entity>` names the entity's Service: a DNS label.
                service = f"{project.name}-{entity.name}"
                if len(service) > 63:
                    raise problem(
                        f"'{service}' (the entity's StatefulService and Service name) has {len(service)} "
                        "characters; project and entity name together may have at most 62",
                        f"projects[{index}].entities[{position}].name",
                        entity.name,
                    )
                # The store's objects share the namespace (and the entity's pods would carry the
                # store's selector labels): `<project>-<store>` and its suffixed Services/policies.
                store = f"{project.name}-{project.store}"
                taken = {store, *(f"{store}-{suffix}" for suffix in ("headless", "gossip", "auth", "databases", "backup", "restore")),
                         "default-deny", "allow-dns"}
                if self.platform.monitoring.enabled:  # infra/monitoring.py: the exporter and scrape policies
                    taken |= {f"{store}-exporter", f"{store}-exporter-scrape", "cloudstate-proxies-scrape"}
                if service in taken:
                    raise problem(
                        f"'{service}' (the entity's Service and NetworkPolicy name) is already used by the "
                        f"project's {project.store} store or its namespace; rename the entity",
                        f"projects[{index}].entities[{position}].name",
                        entity.name,
                    )
        return self

    @model_validator(mode="after")
    def _job_namespaces_stay_out_of_the_platform(self) -> "StackConfig":
        # A job pod may mount any Secret of its namespace, and Armada's executor is granted a Role in
        # each job namespace (components/armada/cluster.py): never beside the platform's, a project's
        # or the cluster's own objects. One Armada serves both stacks of a shared cluster: both
        # environments of every project are refused.
        from infra import cluster_sharing

        armada, platform = self.platform.armada, self.platform.namespace
        reserved = {
            armada.namespace: f"the Armada namespace '{armada.namespace}' (platform.armada.namespace)",
            platform: "the platform namespace (platform.namespace)",
            cluster_sharing.project_state_namespace(platform): "the project-state namespace (`<platform namespace>-state`)",
        }
        for project in self.projects:
            for environment in Environment:
                reserved.setdefault(cluster_sharing.project_namespace(project.name, environment.value),
                                    f"a namespace of project '{project.name}' (`<project>-test`, `<project>-prod`)")
        for namespace in self.platform.cloudstate.extra_watched_namespaces:
            reserved.setdefault(namespace, "an entity namespace of a stack sharing this cluster "
                                           "(platform.cloudstate.extraWatchedNamespaces)")
        for namespace in KUBERNETES_NAMESPACES:
            reserved.setdefault(namespace, "a Kubernetes system namespace")
        found = [
            problem(f"job namespaces must not include {reserved[namespace]}: a job pod could mount its Secrets, and "
                    "Armada's executor is granted a Role there; use namespaces of their own, e.g. armada-jobs",
                    f"platform.armada.jobNamespaces[{index}]", namespace)
            for index, namespace in enumerate(armada.job_namespaces) if namespace in reserved
        ]
        if found:
            raise several_problems(found)
        return self

    @model_validator(mode="after")
    def _store_majors_match_their_data(self) -> "StackConfig":
        # A store pin of another major than the data on the volume is refused before any resource
        # (infra/store_versions.py, docs/upgrades.md).
        found = store_versions.check(self)
        if found:
            raise several_problems(found)
        return self

    @model_validator(mode="after")
    def _queue_names_free(self) -> "StackConfig":
        # Each project's build queue is `<project>-builds` (components/armada/queue.py).
        armada = self.platform.armada
        names = [project.name for project in self.projects]
        if self.environment is Environment.TEST and self.platform.build_mode == "armada":
            names.append("platform")  # the project-state entity builds in `platform-builds` (infra/builds.py)
        for index, name in project_queue_clashes(armada.queues, names, armada.project_queue.enabled):
            raise problem(
                "already the build queue of a project (`<project>-builds`); choose another queue name",
                f"platform.armada.queues[{index}].name",
                name,
            )
        return self


# --- loading and error reporting -------------------------------------------------------------


class ConfigError(Exception):
    """A stack config with problems; str() is the message shown to the user."""

    def __init__(self, problems: list[str], source: str = "stack config"):
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{source} has {len(problems)} {noun}:\n" + "\n".join(f"  {p}" for p in problems))


def parse_value(raw: Any) -> Any:
    """Pulumi passes structured config as JSON strings and plain values as strings."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def load(
    raw: Mapping[str, Any], *, root: Path | None = None, source: str = "stack config",
    secret_keys: Optional[Iterable[str]] = None, require_images: bool = True, stack_dir: Path | None = None,
) -> StackConfig:
    """Validate the `cloudstation:` keys of a stack's config (full key -> raw value).

    `root` is the directory of Pulumi.yaml; when given, entity source directories must exist, and
    the stack files in `stack_dir` (default: `root`, where the engine keeps them) that share this
    stack's cluster or serve it as main stack are checked against it.
    `secret_keys` are the keys set with `secure:` values; when given, a SECRET_KEYS key outside
    them (plain text) is refused. `kubernetes:*` keys are refused (PROVIDER_KEYS); keys of other
    namespaces are left alone. `require_images=False` reads a prod stack for its other settings
    (another stack reading its cluster owner's namespaces), before or after its promotion.
    """
    problems: list[str] = []
    data: dict[str, Any] = {}
    fields = {info.alias or name for name, info in StackConfig.model_fields.items()}
    secret_keys = None if secret_keys is None else set(secret_keys)
    for key, value in raw.items():
        namespace, _, name = key.partition(":")
        if namespace == PROVIDER_NAMESPACE:
            problems.append(provider_key_problem(key))
            continue
        if namespace != PROJECT:
            if (near := near_namespace_problem(key)) is not None:
                problems.append(near)
            continue
        if name in SECRET_KEYS:
            if secret_keys is not None and key not in secret_keys:
                problems.append(plain_secret_problem(key))
            continue
        if name in fields:
            data[name] = parse_value(value)
        elif re.split(r"[.\[]", name, maxsplit=1)[0] in fields:
            problems.append(flat_key_problem(key, parse_value(value)))
        else:
            problems.append(f"{key}: unknown key — {_allowed_keys(StackConfig, name, extra=sorted(SECRET_KEYS))}")
    environment = data.get("environment")
    context = {"environment": environment if environment in ("test", "prod") else None, "root": root,
               "images_optional": not require_images}
    # Which secure keys are set (not their values), for checks such as the external registry's password.
    context["secrets"] = {k.partition(":")[2] for k in raw if k.partition(":")[0] == PROJECT} & set(SECRET_KEYS)
    if context["environment"]:
        context["environment"] = Environment(environment)
    if context["environment"] == Environment.PROD and require_images and not _has_image(data) and data.get("projects"):
        # A prod stack before its first promotion: one problem that says what to run, not one per entity.
        context["images_optional"] = True  # reported once above, not per entity
        problems.append(f"{PROJECT}:projects[*].entities[*].image: (not set) — {source} was never promoted: prod "
                        f"deploys only the digest-pinned images promoted from test; {PROMOTE_HINT}")
    try:
        config = StackConfig.model_validate(data, context=context)
        problems.extend(stack_image_problems(config))  # images only from this stack's registry, per entity
        if root is not None and not problems:
            # Every entity namespace of the stacks sharing this cluster is watched by its operator.
            from infra import cluster_sharing

            stacks = Path(stack_dir if stack_dir is not None else root)
            problems.extend(cluster_sharing.problems(config, source, stacks))
            # An Armada worker stack agrees with its main stack's file (infra/armada_workers.py).
            from infra import armada_workers

            problems.extend(armada_workers.problems(config, stacks))
        if root is not None:
            # No platform image by tag unless named in platform.images.allowUnpinned, the proxies
            # of this stack's entity pods (its cluster owner's operator names them) included.
            from infra import stack_images

            problems.extend(stack_images.problems(config, Path(stack_dir if stack_dir is not None else root)))
    except ValidationError as error:
        # A model check may report several problems at once (components/model.py `problems`).
        problems.extend(_describe({**e, "ctx": c}) for e in error.errors() for c in _contexts(e))
        config = None
    if problems:
        raise ConfigError(problems, source)
    return config


def _contexts(error: dict) -> list:
    ctx = error.get("ctx")
    return [ctx, *ctx.get("more", ())] if isinstance(ctx, dict) else [ctx]


def _describe(error: dict) -> str:
    """One pydantic error as `key.path: bad value — what is allowed`."""
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    path = _path(loc) + ctx.get("subpath", "")
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown key — {_allowed_keys(_model_at(StackConfig, loc[:-1]), str(loc[-1]))}"
    if kind == "missing":
        return f"{path}: missing — this key is required"
    if kind == "string_type" and isinstance(error.get("input"), (int, float)):
        # `pulumi config set --path` stores 2 or true as a number or boolean (pulumi/pulumi
        # sdk/go/common/resource/config/value.go `coerceObject`); this key is text.
        return (f"{path}: {_show(error.get('input'))} — must be text, not a number or true/false: quote it in the "
                "stack file, or set it with `pulumi config set --path --type string ...`")
    value = ctx["value"] if ctx.get("subpath") else error.get("input")
    if kind == "cloudstation":
        allowed = ctx["allowed"]
    elif kind in ("enum", "literal_error"):
        allowed = "must be one of " + str(ctx.get("expected"))
    else:
        allowed = error["msg"][:1].lower() + error["msg"][1:]
    return f"{path}: {_show(value)} — {allowed}"


def _path(loc: list) -> str:
    out = f"{PROJECT}:"
    for index, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        model = _model_at(StackConfig, loc[:index])
        info = model.model_fields.get(part) if model else None
        out += ("." if index else "") + ((info.alias or part) if info else str(part))
    return out


def _show(value: Any) -> str:
    if value is None:
        return "(not set)"
    if isinstance(value, NotShown):
        return "(value not shown)"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _allowed_keys(model: Optional[type[BaseModel]], bad: str, extra: list[str] = ()) -> str:
    if model is None:
        return "not allowed here"
    keys = [info.alias or name for name, info in model.model_fields.items()] + list(extra)
    hint = difflib.get_close_matches(bad, keys, n=1)
    return "allowed keys: " + ", ".join(keys) + (f" (did you mean '{hint[0]}'?)" if hint else "")


def _model_at(model: type[BaseModel], loc: list) -> Optional[type[BaseModel]]:
    """The model class at a validation location (camelCase keys, list indexes)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, int) or (typing.get_origin(current) in (list, dict)):
            args = typing.get_args(current)
            current = args[-1] if args else None
            if isinstance(part, int) or typing.get_origin(_unwrap(current)) is not None:
                continue
        if isinstance(current, type) and issubclass(current, BaseModel):
            by_alias = {info.alias or name: info for name, info in current.model_fields.items()}
            info = by_alias.get(part) or current.model_fields.get(part)
            current = info.annotation if info else None
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional[...] and Annotated[...] from a field annotation."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation
