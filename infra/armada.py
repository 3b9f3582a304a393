"""The Armada area: dependencies, every Armada service in start order, cluster prerequisites,
job namespaces and queues (armada/NOTES.md §4, §15).

Order (Pulumi waits for Jobs to complete and Deployments to be ready):
    PostgreSQL (+ its Job creating `scheduler` and `lookout`), Redis, Pulsar
    -> lookout migration -> lookout, lookout ingester, server (G3)
    -> scheduler migration -> scheduler, scheduler ingester -> executors
    -> queues (through the server's REST API)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import pulumi
import yaml

from components.armada.auth import ArmadaAuth, ArmadaAuthArgs, ServiceCredentials
from components.armada.binoculars import Binoculars
from components.armada.cluster import ClusterPrerequisites, ClusterPrerequisitesArgs, service_account_user
from components.armada.config import LOOKOUT_PORTS, SERVER_PORTS, Endpoints, TrustedCa, armadactl_config, executor_name
from components.armada.event_ingester import EventIngester
from components.armada.executor import Executor, ExecutorArgs
from components.armada.lookout import Lookout
from components.armada.lookout_ingester import LookoutIngester
from components.armada.queue import Queues, queues_args
from components.armada.scheduler import Scheduler
from components.armada.scheduler_ingester import SchedulerIngester
from components.armada.server import Server
from components.armada.service import ArmadaArgs
from components.armada.settings import EXECUTOR_PASSWORD_KEY
from components.k8s import service_dns
from components.namespace import Namespace, NamespaceArgs
from components.network import Endpoint, any_address, ip_blocks
from components.postgres import Postgres, PostgresArgs
from components.postgres_backup import backup_for
from components.pulsar import Pulsar, PulsarArgs
from components.redis import Redis, RedisArgs
from infra import builds, monitoring
from infra.config import PROJECT
from infra.versions import image

if TYPE_CHECKING:
    from infra.context import StackContext


def deploy(stack: "StackContext") -> dict[str, pulumi.Output]:
    config = stack.config
    armada = config.platform.armada
    if not armada.enabled:
        return {}
    if armada.mode == "executor-only":
        return deploy_worker(stack)
    mirror = config.platform.image_mirror
    namespace, job_namespaces = _namespaces(stack)
    # The builds namespace (infra/builds.py) is one more job namespace: the executors' RoleBindings
    # and the admission policy cover it; BuildsNamespace creates it with the builder's Pod Security level.
    builds_namespace = builds.namespace(stack, stack.opts)
    if builds_namespace is not None:
        job_namespaces.append(builds_namespace)
        armada = armada.model_copy(update={"job_namespaces": [*armada.job_namespaces, config.platform.builds_namespace]})
    # Everything below lives in the Armada namespace, so it waits for it.
    opts = pulumi.ResourceOptions(provider=stack.provider, depends_on=[namespace])

    postgres = Postgres(
        "armada-postgres",
        PostgresArgs(
            settings=armada.postgres,
            namespace=armada.namespace,
            database=armada.databases.lookout,
            extra_databases=(armada.databases.scheduler, armada.databases.lookout),
            image_mirror=mirror,
            cluster=stack.cluster,
        ),
        opts,
    )
    backup_for(postgres, config.platform.stores.backups, armada.namespace, armada.namespace, mirror, opts)
    redis = Redis("armada-redis", RedisArgs(settings=armada.redis, namespace=armada.namespace, image_mirror=mirror), opts)
    pulsar = Pulsar(
        "armada-pulsar", PulsarArgs(settings=armada.pulsar, namespace=armada.namespace, image_mirror=mirror), opts
    )

    endpoints = Endpoints(
        namespace=armada.namespace,
        postgres_host=postgres.host,
        postgres_port=postgres.port,
        postgres_sslmode=armada.postgres_ssl_mode,
        postgres_secret=postgres.secret_name,
        redis_address=pulumi.Output.concat(redis.host, ":", str(redis.port)),
        redis_secret=redis.secret_name,
        redis_password_key=redis.password_key,
        pulsar_url=pulsar.url,
        pulsar_admin_url=pulsar.admin_url,
        postgres_endpoint=postgres.endpoint,
        redis_endpoint=redis.endpoint,
        pulsar_endpoint=pulsar.endpoint,
        pulsar_admin_endpoint=pulsar.admin_endpoint,
        kubernetes_api=config.platform.kubernetes_api,
        # With workers the scheduler serves TLS (its certificate and CA from one Secret), to this
        # stack's server and executors too (docs/armada.md "Worker clusters").
        **({"scheduler_tls_secret": armada.executor_api.tls_secret,
            "scheduler_ca": TrustedCa(secret=armada.executor_api.tls_secret)} if armada.serves_remote_executors else {}),
    )

    # Generated users and passwords of every caller of the server and scheduler, in Secrets
    # (components/armada/auth.py); the login files point at the public address, else a port-forward.
    public_grpc = armada.server.public_grpc_address
    auth = ArmadaAuth(
        "armada-auth",
        ArmadaAuthArgs(
            config=armada,
            namespace=armada.namespace,
            context=f"cloudstation-{stack.stack}",
            api_address=public_grpc or f"localhost:{SERVER_PORTS['grpc']}",
            api_tls=public_grpc is not None,
            builds=builds_namespace is not None,
        ),
        opts,
    )

    def service_args(
        image_name: str, start_after: list[pulumi.Resource], credentials: Optional[ServiceCredentials] = None
    ) -> ArmadaArgs:
        return ArmadaArgs(armada, endpoints, image(image_name, mirror), tuple(start_after), credentials)

    lookout = Lookout("armada-lookout", service_args("armada-lookout", postgres.ready), opts)
    scheduler = Scheduler(
        "armada-scheduler", service_args("armada-scheduler", [*postgres.ready, pulsar], auth.scheduler), opts
    )
    # G3: the server reads queues from tables the lookout migration creates.
    server = Server("armada-server", service_args("armada-server", [lookout.migration, redis, pulsar], auth.server), opts)
    services = [lookout, scheduler, server]
    services.append(SchedulerIngester(
        "armada-scheduler-ingester", service_args("armada-scheduler-ingester", [scheduler.migration, pulsar]), opts
    ))
    services.append(LookoutIngester(
        "armada-lookout-ingester", service_args("armada-lookout-ingester", [lookout.migration, pulsar]), opts
    ))
    services.append(EventIngester("armada-event-ingester", service_args("armada-event-ingester", [redis, pulsar]), opts))

    # Config validation admits Armada only in the stack that owns the cluster's resources (one
    # Armada per cluster), so the cluster-scoped prerequisites are always this stack's.
    cluster = ClusterPrerequisites(
        "armada-cluster",
        ClusterPrerequisitesArgs(
            priority_classes=armada.priority_classes,
            binoculars=armada.binoculars.enabled,
            executor_users=[service_account_user(armada.namespace, executor_name(e)) for e in armada.executors],
            job_namespaces=armada.job_namespaces,
            job_service_account=armada.job_service_account,
            **builds.admission(config),
            **registry_admission(config),
        ),
        pulumi.ResourceOptions(provider=stack.provider, depends_on=job_namespaces),
    )
    prerequisites: list[pulumi.Resource] = cluster.resources
    executors = []
    for executor in armada.executors:
        after = service_args(
            "armada-executor", [scheduler.deployment, *prerequisites, *job_namespaces], auth.executors[executor.name]
        )
        executors.append(Executor(f"armada-executor-{executor.name}", ExecutorArgs(**vars(after), executor=executor), opts))
    if armada.binoculars.enabled:
        services.append(Binoculars(
            "armada-binoculars", service_args("armada-binoculars", [*prerequisites, *job_namespaces], auth.binoculars), opts
        ))
    # PodMonitors, alerts, dashboard and store exporters, with platform.monitoring.enabled only.
    monitoring.armada(stack, namespace.name, services, executors, postgres, redis)

    # Queues go through the server's REST API, so they need the server up (and not the
    # Kubernetes provider: they belong to their dynamic provider).
    queue_names = pulumi.Output.from_input([])
    queue_settings = queues_args(config, default_login=(auth.queue_user, auth.queue_password), build_user=auth.build_user)
    if queue_settings is not None:
        queues = Queues("armada-queues", queue_settings, pulumi.ResourceOptions(depends_on=[server.deployment]))
        queue_names = queues.names
        if builds_namespace is not None:
            builds.hand_over(stack, builds.armada_builds(config, auth, builds_namespace, queues, executors))

    grpc_address = server.service_name.apply(
        lambda name: f"{service_dns(name, armada.namespace)}:{SERVER_PORTS['grpc']}"
    )
    rest_url = server.service_name.apply(
        lambda name: f"http://{service_dns(name, armada.namespace)}:{SERVER_PORTS['http']}"
    )
    lookout_url = lookout.service_name.apply(
        lambda name: armada.lookout.public_url
        or f"http://{service_dns(name, armada.namespace)}:{LOOKOUT_PORTS['http']}"
    )
    armadactl = grpc_address.apply(
        lambda address: yaml.safe_dump(
            armadactl_config(f"cloudstation-{stack.stack}", public_grpc or address, tls=public_grpc is not None),
            sort_keys=False,
        )
    )
    workers = {}
    if armada.serves_remote_executors:
        api = armada.executor_api
        workers = {
            "armadaExecutorApi": pulumi.Output.from_input(f"{api.host}:{api.port}"),
            "armadaWorkers": pulumi.Output.from_input({
                w.name: {"secret": auth.workers[w.name], "pool": w.pool, "clusterId": w.id} for w in armada.workers
            }),
        }
    return {
        **workers,
        "armadaNamespace": namespace.name,
        "armadaApiGrpc": grpc_address,
        "armadaApiRest": rest_url,
        "armadaLookoutUrl": lookout_url,
        "armadactlConfig": armadactl,
        "armadaQueues": queue_names,
    }


def registry_admission(config) -> dict:
    """The ClusterPrerequisitesArgs fields naming the registry entity images come from, whose images no job
    pod may name (components/armada/cluster.py `registry_image_rule`: a node's cache would serve another
    project's image without a credential): in every mode the exact `host[:port][/path]` entity pods pull
    (the name the nodes cache under, an external registry's too); for the registry of this cluster (managed,
    or the other stack's when shared) also its NodePort and Service."""
    from infra.delivery import REGISTRY_NAME

    registry = config.platform.registry
    pull = {"registry_pull_prefix": "/".join(part for part in (registry.pull_host, registry.repository_prefix) if part)}
    if registry.mode == "external":
        return pull
    namespace = config.platform.namespace
    if registry.mode == "shared" and registry.owner_namespace:
        namespace = registry.owner_namespace
    return {"registry_node_port": registry.node_port, "registry_service_hosts": (f"{REGISTRY_NAME}.{namespace}",),
            **pull}


def _namespaces(stack: "StackContext") -> tuple[Namespace, list[Namespace]]:
    """Armada's own namespace and the namespaces its jobs run in (full and executor-only stacks)."""
    armada = stack.config.platform.armada
    namespace = Namespace("armada", NamespaceArgs(name=armada.namespace), stack.opts)
    job_namespaces = [
        Namespace(
            f"armada-jobs-{name}",
            NamespaceArgs(name=name, pod_security=armada.job_namespace_pod_security),
            stack.opts,
        )
        for name in armada.job_namespaces
    ]
    return namespace, job_namespaces


def deploy_worker(stack: "StackContext") -> dict[str, pulumi.Output]:
    """An executor-only stack (a worker cluster): the executor, its job namespaces and the
    cluster prerequisites it needs (PriorityClasses: the job pods name them, and the API server
    refuses a pod whose class does not exist; its roles and admission policy). Its scheduler is
    the main stack's, reached over TLS at `remoteScheduler.address`; no store, server or queue."""
    config = stack.config
    armada = config.platform.armada
    remote = armada.remote_scheduler
    namespace, job_namespaces = _namespaces(stack)
    opts = pulumi.ResourceOptions(provider=stack.provider, depends_on=[namespace])
    endpoints = Endpoints(
        namespace=armada.namespace,
        postgres_host=None,
        postgres_port=None,
        redis_address=None,
        pulsar_url=None,
        kubernetes_api=config.platform.kubernetes_api,
        scheduler_address=remote.address,
        scheduler_endpoint=Endpoint(ports=(remote.port,), peers=tuple(any_address() if remote.allow_any_address else ip_blocks(remote.cidrs))),
        # caCertificate becomes the executor's own ConfigMap (components/armada/executor.py).
        scheduler_ca=TrustedCa(secret=remote.ca_secret, only=True) if remote.ca_secret else None,
    )
    [executor] = armada.executors
    cluster = ClusterPrerequisites(
        "armada-cluster",
        ClusterPrerequisitesArgs(
            priority_classes=armada.priority_classes,
            binoculars=False,
            executor_users=[service_account_user(armada.namespace, executor_name(executor))],
            job_namespaces=armada.job_namespaces,
            job_service_account=armada.job_service_account,
        ),
        pulumi.ResourceOptions(provider=stack.provider, depends_on=job_namespaces),
    )
    component = Executor(
        f"armada-executor-{executor.name}",
        ExecutorArgs(
            config=armada,
            endpoints=endpoints,
            image=image("armada-executor", config.platform.image_mirror),
            start_after=(*cluster.resources, *job_namespaces),
            executor=executor,
            remote_password=pulumi.Config(PROJECT).require_secret(EXECUTOR_PASSWORD_KEY),
            remote_ca_certificate=remote.ca_certificate,
        ),
        opts,
    )
    return {
        "armadaNamespace": namespace.name,
        "armadaExecutor": component.service_name,
        "armadaScheduler": pulumi.Output.from_input(remote.address),
    }
