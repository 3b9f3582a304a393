"""Delivery: the registry entity images live in, the pull Secret namespaces use, and the images.

infra/cloudstation.py calls, in this order:

    access = deploy_registry(stack, platform_namespace)     # managed registry or external access
    image_pull_secret(name, access, project, namespace, opts)  # per namespace that runs entities
    images = entity_images(stack, access, built)             # (project, entity) -> digest-pinned ref
    outputs = {**access.outputs, **images_output(images)}

The test stack builds every entity without an `image`: as an Armada job in the cluster
(`platform.builds.mode: armada`, components/entity_build.py, wired in infra/builds.py) or with
the local Docker engine (`local`, components/entity_image.py); either way the image is tagged
with the entity's content hash and deployed by digest. The prod stack never builds and deploys
exactly the digest-pinned `image` of each entity.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import k8s as kube
from components.entity_image import DOCKERFILE, EntityImage, EntityImageArgs, content_tag, generated_dockerfile
from components.namespace import Namespace
from components.registry import (AUTH_SECRET_SUFFIX, GATE_IMAGE, PASSWORD_KEY, Registry, RegistryArgs, dockerconfigjson,
                                 pull_secret_name)
from components.registry_access import pull_user
from infra import versions
from infra.config import PROJECT, EntityConfig, Environment, StackConfig

if TYPE_CHECKING:
    from infra.context import StackContext

PULL_SECRET_NAME = "cloudstation-registry"
REGISTRY_NAME = "registry"
"""The managed registry's Service, Deployment and (with AUTH_SECRET_SUFFIX) Secret name."""
PLATFORM_PROJECT = "platform"
"""The project part of the project-state entity's key and repository (`platform/project-state`)."""
GENERATED_DIR = Path(".cloudstation") / "dockerfiles"
"""Generated Dockerfiles, below the directory of Pulumi.yaml (git-ignored): outside the build
context, so they don't change it, and at a stable relative path, so they don't cause diffs."""


@dataclass(frozen=True)
class RegistryAccess:
    pull_host: str
    """host[:port] the kubelet pulls from; the prefix of every entity image reference."""
    pull_secret_name: str
    """Name of the kubernetes.io/dockerconfigjson Secret in each namespace that runs entities."""
    pull_credentials: dict[str, tuple[pulumi.Input[str], pulumi.Output[str]]]
    """Project (`platform` for project-state) -> (username, password, secret) its namespaces pull
    with: the project's read-only pull user of the managed registry (shared: read from the owner's
    kept Secret `registry-pull-<project>`), the configured user of an external registry."""
    outputs: dict[str, pulumi.Output]
    """Stack outputs about the registry."""
    push_host: str = ""
    """host[:port] `pulumi up` pushes to (same storage as pull_host, so the same digests)."""
    repository_prefix: str = ""
    """Path between the host and `<project>/<entity>` (external registries only)."""
    username: pulumi.Input[str] = ""
    password: Optional[pulumi.Output[str]] = None
    registry: Optional[Registry] = None
    """The managed registry, which pushes and builds wait for (`serving`); None for an external registry."""

    def repository(self, project: str, entity: str) -> str:
        return "/".join(part for part in (self.repository_prefix, project, entity) if part)

    def dockerconfigjson(self, project: str) -> pulumi.Output[str]:
        """Secret: the `.dockerconfigjson` of `project`'s pull Secret."""
        if project not in self.pull_credentials:
            raise pulumi.RunError(f"no registry pull credential for project {project!r} (known: "
                                  f"{', '.join(sorted(self.pull_credentials))})")
        username, password = self.pull_credentials[project]
        return pulumi.Output.secret(
            pulumi.Output.all(username, password).apply(lambda up: dockerconfigjson(self.pull_host, *up)))


def client_namespaces(config: StackConfig) -> list[str]:
    """Namespaces that run entities (project-state's and every project's): each gets the pull
    Secret, and their pods may reach the registry."""
    from infra.cluster_sharing import own_namespaces

    return list(own_namespaces(config))


def registry_build_clients(config: StackConfig) -> list[str]:
    """The builds namespace, whose pods the registry admits, when this stack builds in Armada."""
    from infra import builds

    return [config.platform.builds_namespace] if builds.in_armada(config) else []


def image_projects(config: StackConfig) -> list[str]:
    """Every project whose images the stack runs: each project, and `platform` (project-state)."""
    return [*(project.name for project in config.projects), PLATFORM_PROJECT]


def deploy_registry(stack: "StackContext", namespace: Namespace) -> RegistryAccess:
    """managed: the Registry component in the platform namespace; shared: access to the registry
    another stack manages in this cluster (credentials read from its Secrets); external: access only."""
    from infra import builds

    config = stack.config.platform.registry
    outputs: dict[str, pulumi.Output] = {}
    registry = None
    username: pulumi.Input[str] = config.username
    projects = image_projects(stack.config)
    if config.mode == "managed":
        mirror = stack.config.platform.image_mirror
        registry = Registry(
            REGISTRY_NAME,
            RegistryArgs(
                config=config,
                namespace=namespace.name,
                # Build pods fetch contexts and push images too (infra/builds.py).
                client_namespaces=client_namespaces(stack.config) + registry_build_clients(stack.config),
                image=versions.image("registry", mirror),
                metrics=stack.config.platform.monitoring.enabled,  # /metrics on the debug port (docs/monitoring.md)
                cluster=stack.cluster,
                projects=projects,
                builds_in_cluster=builds.in_armada(stack.config),
                gate_image=versions.image(GATE_IMAGE, mirror),
            ),
            stack.opts,
        )
        password = registry.password
        outputs["registryPassword"] = password
        details = {"service": registry.service, "namespace": namespace.name, "nodePort": config.node_port}
        pulls = {project: (pull_user(project), registry.pull_passwords[project]) for project in projects}
    elif config.mode == "shared":
        owner = config.owner_namespace or stack.config.platform.namespace
        credentials = _owner_secret("registry-owner-credentials", f"{owner}/{REGISTRY_NAME}{AUTH_SECRET_SUFFIX}", stack)
        username, password = credentials
        pulls = {project: _owner_secret(f"registry-owner-pull-{project}",
                                        f"{owner}/{pull_secret_name(REGISTRY_NAME, project)}", stack)
                 for project in projects}
        details = {"namespace": owner, "nodePort": config.node_port}
    else:
        password = pulumi.Config(PROJECT).require_secret(PASSWORD_KEY)
        details = {"url": config.url}
        pulls = {project: (username, password) for project in projects}
    outputs["registry"] = pulumi.Output.from_input(
        {
            "mode": config.mode,
            "pullHost": config.pull_host,
            "pushHost": config.effective_push_host,
            "username": username,
            **details,
        }
    )
    return RegistryAccess(
        pull_host=config.pull_host,
        pull_secret_name=PULL_SECRET_NAME,
        pull_credentials=pulls,
        outputs=outputs,
        push_host=config.effective_push_host,
        repository_prefix=config.repository_prefix,
        username=username,
        password=password,
        registry=registry,
    )


def _owner_secret(name: str, secret_id: str, stack: "StackContext") -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """(username, password) of a Secret of the owning stack's registry (`<namespace>/<name>`)."""
    secret = k8s.core.v1.Secret.get(name, secret_id, opts=stack.opts)
    # `data` is secret as a whole; the user name alone is not.
    username = pulumi.Output.unsecret(secret.data.apply(lambda data: _decoded(data, "username", secret_id)))
    password = pulumi.Output.secret(secret.data.apply(lambda data: _decoded(data, "password", secret_id)))
    return username, password


def _decoded(data: Optional[dict], key: str, secret_id: str = "") -> str:
    if not data or key not in data:
        raise pulumi.RunError(f"the shared registry's Secret {secret_id} has no {key!r}: is the owning stack deployed "
                              "with this stack's projects?")
    return base64.b64decode(data[key]).decode()


def image_pull_secret(
    name: str, access: RegistryAccess, project: str, namespace: pulumi.Input[str],
    opts: Optional[pulumi.ResourceOptions] = None,
) -> k8s.core.v1.Secret:
    """The pull Secret for one namespace of `project` (`platform` for project-state's), with the
    project's own read-only credential; pods reference it as `imagePullSecrets: [{name:
    access.pull_secret_name}]`. `opts` should carry the parent (or the Kubernetes provider)."""
    return k8s.core.v1.Secret(
        name,
        metadata=kube.metadata(access.pull_secret_name, namespace, "registry"),
        type="kubernetes.io/dockerconfigjson",
        string_data={".dockerconfigjson": access.dockerconfigjson(project)},
        opts=opts,
    )


def all_entities(config: StackConfig) -> Iterator[tuple[str, EntityConfig]]:
    """(project name, entity) of every entity, the platform's project-state last."""
    for project in config.projects:
        for entity in project.entities:
            yield project.name, entity
    yield PLATFORM_PROJECT, config.platform.project_state


def base_images(mirror: Optional[str]) -> dict[str, str]:
    return {
        "node_build": versions.image("node-cloudstate-build", mirror),
        "node_runtime": versions.image("node-cloudstate", mirror),
        "maven": versions.image("maven", mirror),
        "java_runtime": versions.image("java-runtime", mirror),
    }


def entity_dockerfile(root: Path, project: str, entity: EntityConfig, mirror: Optional[str]) -> tuple[str, str]:
    """(Dockerfile path relative to root, its text): the entity's own, or a generated one
    written below GENERATED_DIR (config validation has checked that the language has one)."""
    own = root / entity.source / DOCKERFILE
    if own.is_file():
        return (Path(entity.source) / DOCKERFILE).as_posix(), own.read_text()
    text = generated_dockerfile(entity.language.value, base_images(mirror))
    relative = GENERATED_DIR / f"{project}-{entity.name}.Dockerfile"
    path = root / relative
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return relative.as_posix(), text


def entity_images(
    stack: "StackContext", access: RegistryAccess, built: Optional[dict[str, list[pulumi.Resource]]] = None
) -> dict[tuple[str, str], pulumi.Output[str]]:
    """Digest-pinned image reference of every entity, keyed (project, entity).

    test: built and pushed (unless the entity sets `image`), in the cluster (`builds.mode: armada`)
    or locally; prod: the entity's `image`, never built. `built` collects each project's builds
    (project -> resources), which its deployment waits for (deploy gating)."""
    from infra import builds

    config = stack.config
    in_armada = builds.in_armada(config)
    builder = builds.builder(config)  # in-cluster builds: the builder is part of the tag
    images: dict[tuple[str, str], pulumi.Output[str]] = {}
    tags: dict[tuple[str, str], str] = {}  # one walk per context and Dockerfile within this run
    for project, entity in all_entities(config):
        if entity.image is not None or config.environment is Environment.PROD:
            images[(project, entity.name)] = pulumi.Output.from_input(entity.image)
            continue
        dockerfile, text = entity_dockerfile(stack.root, project, entity, config.platform.image_mirror)
        if (entity.source, text) not in tags:
            tags[(entity.source, text)] = content_tag(stack.root / entity.source, text, builder)
        if in_armada:
            build = builds.entity_build(stack, access, project, entity.name, entity.source, text, tags[(entity.source, text)])
            images[(project, entity.name)] = build.ref
            if built is not None:
                built.setdefault(project, []).append(build)
            continue
        image = EntityImage(
            f"image-{project}-{entity.name}",
            EntityImageArgs(
                # Relative to the program's directory (the root), where the engine starts
                # pulumi-docker, which opens them as given (infra/engine_paths.py).
                context=stack.path(entity.source),
                dockerfile=stack.path(dockerfile),
                repository=access.repository(project, entity.name),
                tag=tags[(entity.source, text)],
                push_host=access.push_host or access.pull_host,
                pull_host=access.pull_host,
                username=access.username,
                password=access.password,
                platform=config.platform.registry.build_platform,
            ),
            pulumi.ResourceOptions(depends_on=[access.registry] if access.registry else []),
        )
        images[(project, entity.name)] = image.ref
        if built is not None:
            built.setdefault(project, []).append(image)
    return images


def images_output(images: dict[tuple[str, str], pulumi.Output[str]]) -> dict[str, pulumi.Output]:
    """The stack output promotion reads: {"images": {"<project>/<entity>": ref}}."""
    return {"images": pulumi.Output.all(**{f"{project}/{entity}": ref for (project, entity), ref in images.items()})}
