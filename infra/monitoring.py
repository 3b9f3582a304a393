"""Monitoring wiring (stack key `platform.monitoring`, docs/monitoring.md): which pods each
watched namespace's `Monitoring` scrapes, which alerts it carries and which dashboards, built from
the components the areas created. Nothing here runs unless `platform.monitoring.enabled`.

- Armada's namespace (infra/armada.py): every Armada service's metrics port, exporters for the
  managed PostgreSQL and Redis, Armada's alerts, the Armada dashboard.
- The platform namespace (infra/cloudstation.py): the managed registry's debug port.
- Each entity namespace (project-state's and every project's): the CloudState proxies' metrics
  port (9090, the `akka-sidecar` container the operator adds), the managed PostgreSQL store's
  exporter; and one CloudStation dashboard over all of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import k8s as kb
from components.armada.config import LOOKOUT, SCHEDULER
from components.armada.service import ArmadaService
from components.exporters import StoreExporter, StoreExporterArgs
from components.monitoring import (
    Alert, Dashboard, Monitoring, MonitoringArgs, MonitoringConfig, Panel, ScrapeTarget, crash_loop_alert,
    statefulset_not_ready_alert, target_down_alert, volume_alert,
)
from components.project_environment import SERVICE_LABEL
from components.registry import DEBUG_PORT, METRICS_PATH
from infra.delivery import REGISTRY_NAME
from infra.versions import image

if TYPE_CHECKING:
    from infra.context import StackContext

PROXY_CONTAINER = "akka-sidecar"
PROXY_METRICS_PORT = ("metrics", 9090)
"""The proxy sidecar's metrics port, named by CloudState operator 0.6.0 (OperatorConstants.scala
`MetricsPort`/`MetricsPortName`, StatefulServiceOperatorFactory.scala); the 0.5.1 proxy serves
/metrics there (proxy/core AkkaHttpPrometheusExporter.scala, `metrics-port = 9090`)."""
REGISTRY_PVC_SUFFIX = "-data"
EXECUTOR_API = ('grpc_service="executorapi.ExecutorApi"', 'grpc_method="LeaseJobRuns"')
"""What an executor calls every lease cycle (armada v0.22.7 pkg/executorapi/executorapi.proto,
internal/executor/service/lease_requester.go: one stream per cycle, closed with io.EOF = OK)."""


def settings_of(stack: "StackContext") -> Optional[MonitoringConfig]:
    monitoring = stack.config.platform.monitoring
    return monitoring if monitoring.enabled else None


def _exporter(stack: "StackContext", settings: MonitoringConfig, name: str, kind: str, store: str, namespace,
              namespace_name: str, port: int, secret, password_key: str, after: Sequence[pulumi.Resource]) -> StoreExporter:
    return StoreExporter(
        name,
        StoreExporterArgs(
            kind=kind, store=store, namespace=namespace, namespace_name=namespace_name, store_port=port, secret=secret,
            image=image(f"{kind}-exporter", stack.config.platform.image_mirror),
            resources=settings.exporter_resources, password_key=password_key,
        ),
        pulumi.ResourceOptions(provider=stack.provider, depends_on=list(after)),
    )


def store_down_alert(namespace: str, exporter: StoreExporter, what: str) -> Alert:
    selector = f'namespace="{namespace}", container="{exporter.container}"'
    return Alert(
        name="CloudStationStoreDown",
        # No sample at all (the exporter is gone) counts as down too.
        expr=f"(max({exporter.up_metric}{{{selector}}}) or vector(0)) < 1",
        for_="3m",
        severity="critical",
        labels={"namespace": namespace, "store": what},
        summary=f"{what} does not answer its exporter",
        description=(
            f"{exporter.up_metric} of {exporter.container} is 0 or missing: the exporter cannot connect to {what}, "
            f"or the exporter itself is not running. Every client of the store fails meanwhile. Check "
            f"`kubectl -n {namespace} get pods`, the store's logs, and the exporter's logs "
            f"(`kubectl -n {namespace} logs deploy/{exporter.container}`: an authentication error means the "
            "store's credentials Secret changed; the exporter reads it at start, so restart it)."
        ),
    )


# --- Armada ----------------------------------------------------------------------------------------


def armada_alerts(namespace: str, services: Sequence[ArmadaService], executors: Sequence[str],
                  migrations: Sequence[str], stores: Sequence[tuple[str, str]]) -> list[Alert]:
    """Armada's alerts; `executors`: their containers, `migrations`: the Job names that must
    complete before the services start, `stores`: (StatefulSet, what) of the managed dependencies."""
    ns = f'namespace="{namespace}"'
    alerts = [
        Alert(
            name="ArmadaQueueNotLeasing",
            expr=(f"(sum by (namespace, queue) (armada_queue_size{{{ns}}}) > 0) unless on (namespace, queue) "
                  f"(sum by (namespace, queue) (armada_queue_leased_pod_count{{{ns}}}) > 0)"),
            for_="15m",
            summary="Armada queue {{ $labels.queue }} has queued jobs but none leased",
            description=(
                "Queue {{ $labels.queue }} has {{ $value }} queued jobs and not one leased or running for 15 minutes: "
                "no executor takes its jobs. Check, in order: an executor runs and reports (ArmadaExecutorNotReporting); "
                "the executor's pool is one of the scheduler's pools (platform.armada.executors[].pool, "
                "scheduler.pools; Armada G5); the jobs' requests fit a node and name a priority class the cluster "
                "has; the queue is not cordoned (`armadactl get queue {{ $labels.queue }}`). Lookout shows each "
                "job's scheduling failure reason."
            ),
        ),
        Alert(
            name="ArmadaSchedulerNotLeading",
            # Standalone mode reports 1 while the scheduler runs (leader_metrics.go): no series,
            # or 0, means no scheduler is scheduling.
            expr=f"(max(armada_scheduler_leader_status{{{ns}}}) or vector(0)) < 1",
            for_="5m",
            severity="critical",
            labels={"namespace": namespace},
            summary="No Armada scheduler is leading: nothing gets scheduled",
            description=(
                f"armada_scheduler_leader_status is 0 or absent in {namespace}: no scheduler runs, or it cannot "
                f"lead. No job is scheduled, leased or cancelled meanwhile. Check `kubectl -n {namespace} get pods "
                f"-l app.kubernetes.io/name=armada-scheduler` and its logs (database or Pulsar unreachable, a failed "
                f"migration: ArmadaMigrationFailed). The scheduler runs one replica (leader.mode standalone)."
            ),
        ),
        Alert(
            name="ArmadaMigrationFailed",
            expr=(f'kube_job_failed{{{ns}, job_name=~"{"|".join(sorted(migrations))}", condition="true"}} == 1'),
            for_="1m",
            severity="critical",
            summary="Armada setup Job {{ $labels.job_name }} failed",
            description=(
                "Job {{ $labels.namespace }}/{{ $labels.job_name }} (a database creation or migration) failed; the "
                "services that need it do not start or start on an old schema. Read why: `kubectl -n "
                "{{ $labels.namespace }} logs job/{{ $labels.job_name }}`. Fix the cause (database unreachable, wrong "
                "credentials, no space), then run `pulumi up` again: the Job carries pulumi.com/replaceUnready, so "
                "the failed one is replaced and runs again."
            ),
        ),
        crash_loop_alert(namespace, "Armada"),
        volume_alert(namespace, "Armada's PostgreSQL, Redis or Pulsar"),
    ]
    for container in executors:
        selector = f'{ns}, container="{container}"'
        alerts.append(Alert(
            name="ArmadaExecutorNotReporting",
            expr=(f"(max by (namespace, container) (up{{{selector}}}) unless on (namespace, container) "
                  f"(sum by (namespace, container) (increase(grpc_client_handled_total{{{selector}, "
                  f'{", ".join(EXECUTOR_API)}, grpc_code="OK"}}[10m])) > 0)) or absent(up{{{selector}}})'),
            for_="5m",
            severity="critical",
            summary=f"Armada executor {container} stopped reporting to the scheduler",
            description=(
                f"{container} has not completed a lease call (ExecutorApi/LeaseJobRuns) in 10 minutes, or does not run. "
                "The scheduler stops sending it jobs, and its running jobs' states are not reported. Check its pod "
                f"(`kubectl -n {namespace} get pods -l app.kubernetes.io/name={container}`) and logs: Unauthenticated "
                "or PermissionDenied means its generated user or execute_jobs changed (docs/armada.md, "
                "Authentication); Unavailable means the scheduler's gRPC port is unreachable (scheduler down, or "
                "its NetworkPolicy)."
            ),
        ))
    for service in services:
        alerts.append(target_down_alert(namespace, service.spec.name, f"Armada's {service.spec.name}", "ArmadaServiceDown"))
    for statefulset, what in stores:
        alerts.append(statefulset_not_ready_alert(namespace, statefulset, what))
    return alerts


def armada_dashboard(namespace: str) -> Dashboard:
    ns = f'namespace="{namespace}"'
    return Dashboard(
        name=f"cloudstation-armada-{namespace}",
        title=f"Armada ({namespace})",
        panels=(
            Panel("Queued jobs by queue", f"sum by (queue) (armada_queue_size{{{ns}}})", "{{queue}}"),
            Panel("Leased and running jobs by queue", f"sum by (queue, phase) (armada_queue_leased_pod_count{{{ns}}})",
                  "{{queue}} {{phase}}"),
            Panel("Jobs scheduled per minute", f"sum by (queue) (rate(armada_scheduler_scheduled_jobs{{{ns}}}[5m])) * 60",
                  "{{queue}}"),
            Panel("Jobs failed per minute", f"sum by (queue) (rate(armada_scheduler_failed_jobs{{{ns}}}[5m])) * 60",
                  "{{queue}}"),
            Panel("Scheduling cycle time (p95)",
                  f"histogram_quantile(0.95, sum by (le) (rate(armada_scheduler_schedule_cycle_times_bucket{{{ns}}}[5m])))",
                  "p95", "ms"),
            Panel("Executor lease calls by result",
                  f'sum by (container, grpc_code) (rate(grpc_client_handled_total{{{ns}, {", ".join(EXECUTOR_API)}}}[5m]))',
                  "{{container}} {{grpc_code}}", "reqps"),
            Panel("Job pods by executor and phase", f"sum by (container, phase) (armada_executor_job_pod{{{ns}}})",
                  "{{container}} {{phase}}"),
            Panel("API calls by method and code",
                  f'sum by (grpc_method, grpc_code) (rate(grpc_server_handled_total{{{ns}, container="armada-server"}}[5m]))',
                  "{{grpc_method}} {{grpc_code}}", "reqps"),
            Panel("Services up", f"up{{{ns}}}", "{{container}}"),
            Panel("Stores up", f"pg_up{{{ns}}} or redis_up{{{ns}}}", "{{container}}"),
            Panel("Redis memory used / max", f"redis_memory_used_bytes{{{ns}}} / redis_memory_max_bytes{{{ns}}}",
                  "{{container}}", "percentunit"),
            Panel("Volumes: free space",
                  f"kubelet_volume_stats_available_bytes{{{ns}}} / kubelet_volume_stats_capacity_bytes{{{ns}}}",
                  "{{persistentvolumeclaim}}", "percentunit"),
        ),
    )


ARMADA_POSTGRES, ARMADA_REDIS, ARMADA_PULSAR = "armada-postgres", "armada-redis", "armada-pulsar"
"""The names infra/armada.py gives Armada's dependencies: their StatefulSets, Services and pods."""


def armada_setup_jobs(config) -> list[str]:
    """The Jobs that must complete before Armada's services start: both migrations
    (components/armada/scheduler.py, lookout.py `migration_task`) and, with a managed or
    database-creating PostgreSQL, its `<name>-databases` Job (components/postgres.py)."""
    jobs = [f"{SCHEDULER}-migration", f"{LOOKOUT}-migration"]
    if config.postgres.mode == "managed" or config.postgres.create_databases:
        jobs.append(f"{ARMADA_POSTGRES}-databases")
    return jobs


def armada(stack: "StackContext", namespace, services: Sequence[ArmadaService], executors: Sequence[ArmadaService],
           postgres, redis) -> Optional[Monitoring]:
    """Armada's namespace. `namespace` is the Namespace component's name Output; `postgres` and
    `redis` the dependency components (exporters only where they are managed)."""
    settings = settings_of(stack)
    if settings is None:
        return None
    config = stack.config.platform.armada
    name = config.namespace
    targets = [
        ScrapeTarget(name=service.spec.name, selector={"matchLabels": kb.selector_labels(service.spec.name)},
                     port="metrics", port_number=service.spec.ports["metrics"])
        for service in [*services, *executors]
    ]
    exporters: list[tuple[StoreExporter, str]] = []
    stores: list[tuple[str, str]] = []
    if config.postgres.mode == "managed":
        # After the server and its Secret, not the databases Job: a failed Job must not hold it back.
        server = [r for r in postgres.ready if not isinstance(r, k8s.batch.v1.Job)]
        exporters.append((_exporter(stack, settings, f"{ARMADA_POSTGRES}-exporter", "postgres", ARMADA_POSTGRES, namespace,
                                    name, postgres.port, postgres.secret_name, "password", server),
                          "Armada's PostgreSQL"))
        stores.append((ARMADA_POSTGRES, "Armada's PostgreSQL"))
    if config.redis.mode == "managed":
        exporters.append((_exporter(stack, settings, f"{ARMADA_REDIS}-exporter", "redis", ARMADA_REDIS, namespace, name,
                                    redis.port, redis.secret_name, redis.password_key, [redis]), "Armada's Redis"))
        stores.append((ARMADA_REDIS, "Armada's Redis"))
    if config.pulsar.mode == "managed":
        stores.append((ARMADA_PULSAR, "Armada's Pulsar"))
    alerts = armada_alerts(name, [*services, *executors], [e.spec.name for e in executors], armada_setup_jobs(config),
                           stores)
    alerts += [store_down_alert(name, exporter, what) for exporter, what in exporters]
    # Waits for nothing but the namespace: the alerts must exist when what they watch fails.
    return Monitoring(
        "armada-monitoring",
        MonitoringArgs(settings=settings, namespace=namespace, targets=[*targets, *(e.target for e, _ in exporters)],
                       alerts=alerts, group="armada", dashboards=[armada_dashboard(name)]),
        stack.opts,
    )


# --- the platform namespace: the registry ----------------------------------------------------------


def registry(stack: "StackContext", namespace, registry_name: str = REGISTRY_NAME) -> Optional[Monitoring]:
    """The managed registry's metrics (its debug port) and storage."""
    settings = settings_of(stack)
    if settings is None or stack.config.platform.registry.mode != "managed":
        return None
    name = stack.config.platform.namespace
    target = ScrapeTarget(name=registry_name, selector={"matchLabels": kb.selector_labels(registry_name)},
                          port="debug", port_number=DEBUG_PORT, path=METRICS_PATH)
    alerts = [
        volume_alert(name, "The registry's image storage", claim=f"{registry_name}{REGISTRY_PVC_SUFFIX}",
                     name="CloudStationRegistryStorageNearlyFull", free=0.15),
        volume_alert(name, "The registry's image storage", claim=f"{registry_name}{REGISTRY_PVC_SUFFIX}",
                     name="CloudStationRegistryStorageNearlyFull", free=0.05, severity="critical"),
        target_down_alert(name, "registry", "The registry", "CloudStationRegistryDown", severity="critical"),
        crash_loop_alert(name, "the platform (registry, CloudState operator)"),
    ]
    return Monitoring(
        "registry-monitoring",
        MonitoringArgs(settings=settings, namespace=namespace, targets=[target], alerts=alerts, group="registry"),
        stack.opts,
    )


# --- entity namespaces -----------------------------------------------------------------------------


def environment(stack: "StackContext", name: str, environment_, namespace_name: str, store_kind: str) -> Optional[Monitoring]:
    """One entity namespace (a ProjectEnvironment): its proxies, and its managed PostgreSQL store
    through an exporter (a managed Cassandra: its readiness only)."""
    settings = settings_of(stack)
    if settings is None:
        return None
    namespace = environment_.namespace
    proxies = ScrapeTarget(name="cloudstate-proxies", selector={"matchExpressions": [{"key": SERVICE_LABEL, "operator": "Exists"}]},
                           port=PROXY_METRICS_PORT[0], port_number=PROXY_METRICS_PORT[1])
    alerts = [
        target_down_alert(namespace_name, PROXY_CONTAINER, "An entity's CloudState proxy", "CloudStationEntityProxyDown"),
        crash_loop_alert(namespace_name, "an entity or its store"),
        volume_alert(namespace_name, "The entities' store"),
    ]
    targets = [proxies]
    store = environment_.store_name
    managed = store is not None and getattr(stack.config.platform.stores, store_kind).mode == "managed"
    if managed and store_kind == "postgres":
        # components/postgres.py names the server's pods and Service after the store and its
        # credentials Secret `<store>-credentials` (keys username, password).
        exporter = _exporter(stack, settings, f"{name}-store-exporter", "postgres", store, namespace, namespace_name,
                             5432, f"{store}-credentials", "password", [environment_])
        targets.append(exporter.target)
        alerts.append(store_down_alert(namespace_name, exporter, f"the store {store}"))
    if managed:
        alerts.append(statefulset_not_ready_alert(namespace_name, store, f"the store {store}"))
    return Monitoring(
        f"{name}-monitoring",
        MonitoringArgs(settings=settings, namespace=namespace, targets=targets, alerts=alerts, group="cloudstation"),
        stack.opts,
    )


def platform_dashboard(stack: "StackContext", namespaces: Sequence[str]) -> Optional[Monitoring]:
    """One dashboard over the registry, the entities' proxies and stores of this stack."""
    settings = settings_of(stack)
    if settings is None:
        return None
    platform = stack.config.platform.namespace
    entities = f'namespace=~"{"|".join(sorted(namespaces))}"'
    panels = [
        Panel("Entity proxies up", f'sum by (namespace) (up{{{entities}, container="{PROXY_CONTAINER}"}})', "{{namespace}}"),
        Panel("Stores up", f"pg_up{{{entities}}}", "{{namespace}}"),
        Panel("Store connections", f"sum by (namespace) (pg_stat_database_numbackends{{{entities}}})", "{{namespace}}"),
        Panel("Store size", f"sum by (namespace) (pg_database_size_bytes{{{entities}}})", "{{namespace}}", "bytes"),
        Panel("Container restarts (1h)",
              f"sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total{{{entities}}}[1h]))",
              "{{namespace}}/{{pod}}"),
    ]
    if stack.config.platform.registry.mode == "managed":
        ns = f'namespace="{platform}"'
        panels[:0] = [
            Panel("Registry requests by handler and code",
                  f"sum by (handler, code) (rate(registry_http_requests_total{{{ns}}}[5m]))", "{{handler}} {{code}}", "reqps"),
            Panel("Registry latency (p95)",
                  f"histogram_quantile(0.95, sum by (le, handler) (rate(registry_http_request_duration_seconds_bucket{{{ns}}}[5m])))",
                  "{{handler}}", "s"),
            Panel("Registry storage: free space",
                  f'kubelet_volume_stats_available_bytes{{{ns}, persistentvolumeclaim="{REGISTRY_NAME}{REGISTRY_PVC_SUFFIX}"}} / '
                  f'kubelet_volume_stats_capacity_bytes{{{ns}, persistentvolumeclaim="{REGISTRY_NAME}{REGISTRY_PVC_SUFFIX}"}}',
                  "{{persistentvolumeclaim}}", "percentunit"),
        ]
    dashboard = Dashboard(name=f"cloudstation-platform-{platform}", title=f"CloudStation ({platform})", panels=tuple(panels))
    return Monitoring(
        "platform-dashboards",
        MonitoringArgs(settings=settings, namespace=platform, dashboards=[dashboard]),
        stack.opts,
    )
