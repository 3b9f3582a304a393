"""CloudStation: the platform namespace with the registry (infra/delivery.py) and the CloudState
operator (only in the stack that owns the cluster resources), the entity images, the project-state
entity with its own store in its namespace `<platform namespace>-state`, and one environment per
project."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from components.cloudstate_operator import CloudStateOperator, OperatorArgs, proxy_images
from components.k8s import service_dns
from components.namespace import Namespace, NamespaceArgs
from components.project_environment import EntityService, ProjectEnvironment, ProjectEnvironmentArgs
from infra import builds, cluster_sharing, delivery, monitoring
# What the operator reconciles, one definition, which config validation also checks across the
# stack files sharing a cluster (infra/cluster_sharing.py).
from infra.cluster_sharing import project_namespace, project_state_namespace, watched_namespaces  # noqa: F401

if TYPE_CHECKING:
    from infra.context import StackContext


PLATFORM_NAMESPACE = "platform-namespace"
"""StackContext.shared key: the platform Namespace, from `deploy_platform` to `deploy`."""


def deploy_platform(stack: "StackContext") -> dict[str, pulumi.Output]:
    """The platform namespace and the registry, before Armada (infra/areas.py): the builds
    namespace there needs the registry's credentials (infra/builds.py)."""
    config = stack.config
    if not config.projects:
        return {}  # an Armada worker stack (platform.armada.mode: executor-only) without projects
    platform = config.platform
    # "restricted": it holds the registry, its credentials and the operator, all restricted; the
    # operator-generated entity pods (baseline only, components/project_environment.py) run
    # elsewhere, project-state's in its own namespace. Kept when the stack drops it if it holds the
    # managed registry's images, which a stack sharing the registry runs (docs/cloudstate.md, "What is kept").
    platform_namespace = Namespace(
        "platform",
        NamespaceArgs(name=platform.namespace, pod_security="restricted", keep_on_delete=platform.registry.mode == "managed"),
        stack.opts,
    )
    access = delivery.deploy_registry(stack, platform_namespace)
    monitoring.registry(stack, platform_namespace.name)
    stack.shared[PLATFORM_NAMESPACE] = platform_namespace
    stack.shared[builds.REGISTRY] = access
    return {}


def deploy(stack: "StackContext") -> dict[str, pulumi.Output]:
    config = stack.config
    if not config.projects:
        return {}  # an Armada worker stack (platform.armada.mode: executor-only) without projects
    platform = config.platform
    environment = config.environment.value
    platform_namespace: Namespace = stack.shared[PLATFORM_NAMESPACE]
    access: delivery.RegistryAccess = stack.shared[builds.REGISTRY]
    # Deploy gating: a project's StatefulServices wait for every build of that project, so a
    # failed build (its test, say) leaves the project's running deployment untouched, not half-updated.
    built: dict[str, list[pulumi.Resource]] = {}
    images = delivery.entity_images(stack, access, built)

    cluster_resources: list[pulumi.Resource] = []
    if platform.owns_cluster_resources:
        operator = CloudStateOperator(
            "cloudstate-operator",
            OperatorArgs(
                settings=platform.cloudstate,
                namespace=platform_namespace.name,
                watch_namespaces=watched_namespaces(config),
                kubernetes_api=platform.kubernetes_api,
                image_mirror=platform.image_mirror,
            ),
            stack.opts,
        )
        cluster_resources = operator.ready

    def pull_secret(project: str):
        """The pull Secret factory of `project`'s namespaces: its own read-only registry user."""
        def make(name: str, namespace: pulumi.Input[str], opts: pulumi.ResourceOptions) -> pulumi.Resource:
            return delivery.image_pull_secret(name, access, project, namespace, opts)
        return make

    # The cluster's operator (this stack's, or the owner's, read from its stack file) gives the
    # entity pods their proxy: each StatefulService names that image (infra/image_pins.py).
    operator_stack = cluster_sharing.operator_config(config, stack.stack_dir)
    common = dict(
        environment=environment,
        stores=platform.stores,
        cloudstate=platform.cloudstate,
        pull_secret_name=access.pull_secret_name,
        kubernetes_api=platform.kubernetes_api,
        # The owner's operator; a stack sharing its cluster reads its namespace from the owner's file.
        operator_namespace=operator_stack.platform.namespace,
        proxy_images=proxy_images(operator_stack.platform.image_mirror),
        depends_on=cluster_resources,
        image_mirror=platform.image_mirror,
        cluster=stack.cluster,
    )
    state = platform.project_state
    state_namespace = project_state_namespace(platform.namespace)
    state_environment = ProjectEnvironment(
        "project-state",
        ProjectEnvironmentArgs(
            project=delivery.PLATFORM_PROJECT,
            namespace=state_namespace,
            entities=[
                EntityService(
                    service_name=state.name,
                    needs_store=state.kind.needs_store,
                    replicas=state.replicas,
                    image=images[(delivery.PLATFORM_PROJECT, state.name)],
                )
            ],
            store_kind=platform.project_state_store,
            builds=built.get(delivery.PLATFORM_PROJECT, []),
            pull_secret=pull_secret(delivery.PLATFORM_PROJECT),
            **common,
        ),
        stack.opts,
    )
    monitoring.environment(stack, "project-state-entity", state_environment, state_namespace, platform.project_state_store)

    namespaces: dict[str, pulumi.Output[str]] = {}
    for project in config.projects:
        environment_ = ProjectEnvironment(
            project.name,
            ProjectEnvironmentArgs(
                project=project.name,
                namespace=project_namespace(project.name, environment),
                entities=[
                    EntityService(
                        service_name=f"{project.name}-{entity.name}",
                        needs_store=entity.kind.needs_store,
                        replicas=entity.replicas,
                        image=images[(project.name, entity.name)],
                    )
                    for entity in project.entities
                ],
                store_kind=project.store,
                builds=built.get(project.name, []),
                pull_secret=pull_secret(project.name),
                **common,
            ),
            stack.opts,
        )
        namespaces[project.name] = environment_.namespace
        monitoring.environment(stack, f"{project.name}-entity", environment_, project_namespace(project.name, environment), project.store)
    monitoring.platform_dashboard(
        stack, [state_namespace, *(project_namespace(p.name, environment) for p in config.projects)]
    )

    return {
        "platformNamespace": platform_namespace.name,
        "projectNamespaces": pulumi.Output.all(**namespaces),
        "projectStateNamespace": pulumi.Output.from_input(state_namespace),
        "projectStateService": pulumi.Output.from_input(
            f"{service_dns(state.name, state_namespace)}:80"
        ),
        **access.outputs,
        **delivery.images_output(images),
    }
