"""In-cluster builds (`platform.builds.mode: armada`, docs/builds.md): the wiring between the
registry, Armada and the entity images.

The areas run in this order (infra/areas.py), each handing the next what it needs through
`StackContext.shared`:

    cloudstation.deploy_platform   the registry                     -> shared[REGISTRY]: RegistryAccess
    armada.deploy                  builds namespace (`namespace`),   -> shared[ARMADA]: ArmadaBuilds
                                   build user, queues, executors
    cloudstation.deploy            one EntityBuild per entity (`entity_build`), gated project environments

so that nothing waits for something registered later: the builds namespace's Secret needs the
registry's password, the executors' RoleBinding in it needs the namespace, a build job needs its
queue, the executors and the namespace, and the StatefulServices need the builds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import pulumi

from components import build_context
from components import k8s as kube
from components.armada.queue import PLATFORM_BUILDS, basic_auth, project_queue_name
from components.build_job import LABEL_CONTENT_TAG, LABEL_ENTITY, LABEL_PROJECT, build_job_item
from components.builds_namespace import BuildsNamespace, BuildsNamespaceArgs
from components.entity_build import EntityBuild, EntityBuildArgs
from components.registry_access import build_secret_name, build_user
from components.registry import PORT as REGISTRY_PORT
from components.transport import is_loopback
from infra import public_egress
from infra.config import Environment, StackConfig

if TYPE_CHECKING:
    from infra.context import StackContext
    from infra.delivery import RegistryAccess

REGISTRY = "registry"
"""shared key: the RegistryAccess of this stack (infra/delivery.py), set by the first area."""
ARMADA = "armada-builds"
"""shared key: ArmadaBuilds, set by infra/armada.py when this stack builds in Armada."""
QUEUE_GRACE_SECONDS = 600
"""How long `pulumi up` waits for a build beyond the pod's own deadline: the job may queue first."""
POLL_SECONDS = 5


def in_armada(config: StackConfig) -> bool:
    """Whether this stack builds its entity images as Armada jobs (prod never builds)."""
    return config.environment is Environment.TEST and config.platform.build_mode == "armada"


def builder(config: StackConfig) -> Optional[dict[str, str]]:
    """What builds this stack's images in the cluster (the pinned builder and fetch images,
    components/build_job.py `rebuild_key`), None for local builds: the one value both the content
    tag (components/entity_image.py `content_tag`, infra/delivery.py) and the EntityBuild's
    `builder` input and clientId are made from, so a builder bump is a new tag and a new job."""
    return config.platform.builds.rebuild_key() if in_armada(config) else None


def registry_service_host(config: StackConfig) -> str:
    """host:port of the managed registry's in-cluster Service: where build pods fetch and push.
    (Config validation allows armada builds with a managed registry only.)"""
    from infra.delivery import REGISTRY_NAME

    return f"{kube.service_dns(REGISTRY_NAME, config.platform.namespace)}:{REGISTRY_PORT}"


def registry_url(access: "RegistryAccess") -> str:
    """How `pulumi up` reaches the registry API: its push host (plain http only to loopback, a
    port-forward; components/registry_api.py refuses credentials over http elsewhere)."""
    host = access.push_host or access.pull_host
    return f"{'http' if is_loopback(host.rsplit(':', 1)[0]) else 'https'}://{host}"


def tunnels_to_registry(config: StackConfig) -> bool:
    """Whether the build provider reaches the registry API through its own port-forward through
    the Kubernetes API (components/kube_tunnel.py), so the deployer's machine needs no registry
    port-forward: armada builds without an explicit `platform.registry.pushHost` (with one, it is
    reached there, as today). Local builds push with the Docker engine, which needs a host port.
    Not with `kubernetes.renderYamlToDirectory`: that stack names no kube context (pulumi-kubernetes
    refuses both), so a tunnel would go to whatever cluster the current context is, and the
    registry's credentials to a pod there; the registry is then reached at its push host as without
    a tunnel (a port-forward `python -m infra port-forwards` lists, or `pushHost`)."""
    return (in_armada(config) and not config.platform.registry.push_host
            and config.kubernetes.render_yaml_to_directory is None)


def registry_tunnel(config: StackConfig) -> dict:
    """The build provider's `registryTunnel` input: the stack's kube context (unset = the current
    one), the registry pods' namespace, selector and container port."""
    from infra.delivery import REGISTRY_NAME

    tunnel = {"namespace": config.platform.namespace, "selector": kube.selector_labels(REGISTRY_NAME),
              "port": REGISTRY_PORT}
    if config.kubernetes.context:
        tunnel["context"] = config.kubernetes.context
    return tunnel


def namespace(stack: "StackContext", opts: pulumi.ResourceOptions) -> Optional[BuildsNamespace]:
    """The builds namespace (components/builds_namespace.py), when this stack builds in Armada;
    infra/armada.py registers it as a job namespace (the executors' RoleBinding and the admission
    policy cover it)."""
    config = stack.config
    if not in_armada(config):
        return None
    from infra.delivery import REGISTRY_NAME

    access: "RegistryAccess" = stack.shared[REGISTRY]
    return BuildsNamespace(
        "builds",
        BuildsNamespaceArgs(
            namespace=config.platform.builds_namespace,
            registry_host=registry_service_host(config),
            registry_namespace=config.platform.namespace,
            registry_pod_labels=kube.selector_labels(REGISTRY_NAME),
            # Each project's builds push with its own build user (components/registry_access.py).
            credentials={project: (build_user(project), password)
                         for project, password in access.registry.build_passwords.items()},
            settings=config.platform.builds,
            registry_port=REGISTRY_PORT,
            # The public-egress rule (opt-in) excepts every block the stack names: nodes, API server, ...
            stack_cidrs=tuple(public_egress.named_cidrs(config.platform.model_dump(by_alias=True, mode="json"))),
        ),
        opts,
    )


@dataclass(frozen=True)
class ArmadaBuilds:
    """What the build jobs need from this stack's Armada (infra/armada.py hands it over)."""

    url: str
    """Armada's REST API as `pulumi up` reaches it (`armada.queueApi.url`, as the queues)."""
    authorization: pulumi.Output[str]
    """Basic auth of the build user (secret)."""
    namespace: BuildsNamespace
    waits: dict[str, list[pulumi.Resource]] = field(default_factory=dict)
    """Project -> what its builds wait for (custom resources only, see `armada_builds`): its build
    queue, each executor's Deployment and RoleBinding in the builds namespace, the builds
    namespace with its policies and Secret."""
    binoculars_url: str = ""
    """Binoculars' REST URL, for a failed build's pod log ("" without one)."""


def build_projects(config: StackConfig) -> list[str]:
    """The projects built in the cluster: every project's, and `platform` for the project-state entity."""
    from infra.delivery import image_projects

    return image_projects(config)


def build_queues(config: StackConfig) -> list[str]:
    """The queues build jobs are submitted to: every project's, and `platform-builds` for the
    project-state entity (components/armada/queue.py `queues_args`)."""
    return [project_queue_name(name) for name in build_projects(config)]


def admission(config: StackConfig) -> dict:
    """The ClusterPrerequisitesArgs fields that confine the builds namespace to build jobs: only
    pods of the build queues run there, only they may carry the build labels, and a pod of
    `<project>-builds` may refer to `<project>`'s build Secret only."""
    if not in_armada(config):
        return {}
    return {"build_namespace": config.platform.builds_namespace, "build_queues": tuple(build_queues(config)),
            "build_labels": (LABEL_PROJECT, LABEL_ENTITY, LABEL_CONTENT_TAG),
            "build_user_namespace": config.platform.builds.user_namespace,
            "build_secrets": {project_queue_name(p): build_secret_name(p) for p in build_projects(config)}}


def armada_builds(config: StackConfig, auth, builds_namespace: BuildsNamespace, queues, executors) -> ArmadaBuilds:
    """What infra/armada.py hands over: the build user's login, and per project its queue, the
    executors (nothing runs a job before one is up) and the builds namespace to wait for.

    Named custom resources, not the components: the SDK turns a dependency on a local component
    into one on each of its children (pulumi sdk/python/lib/pulumi/runtime/rpc.py
    `_add_dependency`), each checked for a cycle by a walk of its whole upstream graph
    (runtime/resource_cycle_breaker.py `declare_dependency`), ~25 edges per build before. The
    guarantee is unchanged: the engine runs no step before the steps of its dependencies are done,
    so a build still starts after each of these exists (tests/test_builds_program.py checks it on
    the registered graph)."""
    binoculars = config.platform.armada.binoculars
    shared = [
        *(executor.deployment for executor in executors),
        *(executor.job_bindings[config.platform.builds_namespace] for executor in executors),
        *builds_namespace.ready,
    ]
    waits = {
        name: [queues.by_name[project_queue_name(name)], *shared]
        for name in [*(p.name for p in config.projects), PLATFORM_BUILDS]
    }
    return ArmadaBuilds(
        url=rest_url(config),
        authorization=pulumi.Output.secret(auth.build_password.apply(lambda p: basic_auth(auth.build_user, p))),
        namespace=builds_namespace,
        waits=waits,
        # Its public URL, when it is one URL (a `{CLUSTER_ID}` template names several).
        binoculars_url=(binoculars.public_url or "") if binoculars.enabled and "{" not in (binoculars.public_url or "") else "",
    )


def hand_over(stack: "StackContext", builds: ArmadaBuilds) -> None:
    stack.shared[ARMADA] = builds


def job_item(config: StackConfig, item: dict) -> dict:
    """The job item as the admission policy admits it: job pods run as `armada.jobServiceAccount`
    only (components/armada/cluster.py), which BuildsNamespace's pods otherwise leave at `default`."""
    account = config.platform.armada.job_service_account
    if account != "default":
        item = {**item, "podSpec": {**item["podSpec"], "serviceAccountName": account}}
    return item


def entity_build(
    stack: "StackContext", access: "RegistryAccess", project: str, entity: str, source: str, dockerfile_text: str,
    tag: str,
) -> EntityBuild:
    """One entity's in-cluster build (components/entity_build.py): the job item the offline
    render shows, and how `pulumi up` reaches the registry and Armada."""
    config = stack.config
    armada: ArmadaBuilds = stack.shared[ARMADA]
    settings = config.platform.builds
    context = stack.root / source
    tar = build_context.context_tar(context, dockerfile_text)
    digest = build_context.context_digest(tar)
    host = registry_service_host(config)
    tunnel = tunnels_to_registry(config)
    repository = access.repository(project, entity)
    item = armada.namespace.secret_names[project].apply(lambda secret: job_item(config, build_job_item(
        project=project, entity=entity, content_tag=tag, context_digest=digest, registry_host=host,
        namespace=config.platform.builds_namespace, secret_name=secret, settings=settings,
        repository_prefix=access.repository_prefix, plain_http=True,
        # The nodes pull the builder and fetch images, kaniko the docker.io base images, through it.
        image_mirror=config.platform.image_mirror,
    )))
    registry_auth = pulumi.Output.secret(
        pulumi.Output.all(access.username, access.password).apply(lambda up: basic_auth(up[0], up[1] or ""))
    )
    return EntityBuild(
        f"build-{project}-{entity}",
        EntityBuildArgs(
            # Relative to the program's directory (the root), where the engine starts the dynamic
            # provider too (infra/engine_paths.py), as EntityImageArgs.context.
            context_dir=stack.path(source),
            dockerfile_text=dockerfile_text,
            content_tag=tag,
            context_digest=digest,
            repository=repository,
            context_repository=build_context.context_repository(access.repository_prefix, project, entity),
            push_ref=f"{host}/{repository}:{tag}",
            pull_host=access.pull_host,
            # Through the tunnel, the URL only names the Host header: the Service's in-cluster name.
            registry_url=f"http://{host}" if tunnel else registry_url(access),
            registry_tunnel=registry_tunnel(config) if tunnel else None,
            registry_authorization=registry_auth,
            armada_url=armada.url,
            armada_authorization=armada.authorization,
            queue=project_queue_name(project),
            job_set_id=f"{project}-{stack.stack}",
            job_item=item,
            builder=builder(config),  # also in `tag` (infra/delivery.py)
            timeout_seconds=settings.timeout_seconds + QUEUE_GRACE_SECONDS,
            poll_seconds=POLL_SECONDS,
            binoculars_url=armada.binoculars_url,
            # The managed registry's gate makes the project's own builds the only writer of its
            # content tags (components/entity_build.py, "Digests are never switched silently").
            adopt_existing=access.registry is not None,
        ),
        # The registry's Deployment, Service and policy, not the component (see `armada_builds`).
        pulumi.ResourceOptions(depends_on=[*armada.waits.get(project, []),
                                           *(access.registry.serving if access.registry else [])]),
    )


def rest_url(config: StackConfig) -> str:
    """The Armada REST URL `pulumi up` submits to: the queues' (`armada.queueApi.url`)."""
    return config.platform.armada.queue_api.url.rstrip("/")

