"""Monitoring through the Prometheus Operator (stack key `cloudstation:platform.monitoring`):
what Prometheus scrapes (PodMonitors), the alerts an operator acts on (PrometheusRules), Grafana
dashboards (ConfigMaps labelled for Grafana's dashboard sidecar) and the NetworkPolicies that let
Prometheus, and nothing else, reach the metrics ports. docs/monitoring.md explains it all.

One `Monitoring` component per namespace it watches: its PodMonitors, scrape policies and rules
live in that namespace and select only that namespace (so it works with the operator's
`enforcedNamespaceLabel` too). Every scrape is a PodMonitor, because the Armada ingesters have no
Service. The custom resources validate against the operator's CRDs vendored in components/crds/.

Metric names come only from `METRICS`, which cites where each is defined upstream; the tests parse
every rule and dashboard expression (promql-parser) and check each metric it selects is there.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, field_validator

from components import k8s as kb
from components import network
from components.component import Component
from components.model import ConfigModel, DnsLabel, problem

API_VERSION = "monitoring.coreos.com/v1"
COMPONENT = "monitoring"
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
"""The label Grafana's dashboard sidecar looks for (the grafana chart's `sidecar.dashboards.label`
and `labelValue` defaults, which kube-prometheus-stack keeps)."""
METRICS_PATH = "/metrics"
DURATION = r"^[0-9]+(ms|s|m|h)$"
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(|[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")

# --- the metrics the rules and dashboards may use ----------------------------------------------

_ARMADA = "armadaproject/armada v0.22.7"
_KSM = "kubernetes/kube-state-metrics v2.20.0 docs/metrics/workload"
_GRPC = "grpc-ecosystem/go-grpc-middleware providers/prometheus v1.1.0 (armada v0.22.7 go.mod)"
METRICS: dict[str, str] = {
    # Armada: the scheduler's queue metrics (MetricsCollector, internal/scheduler/metrics.go).
    "armada_queue_size": f"{_ARMADA} internal/common/metrics/scheduler_metrics.go QueueSizeDesc: queued jobs "
                         "per queue (labels queue, queueName, state), exported by the scheduler",
    "armada_queue_leased_pod_count": f"{_ARMADA} internal/common/metrics/scheduler_metrics.go QueueLeasedPodCountDesc: "
                                     "non-terminal job runs per queue and phase (labels cluster, pool, queue, phase, ...)",
    "armada_scheduler_leader_status": f"{_ARMADA} internal/leaderelection/leader_metrics.go createLeaderStatusDesc with "
                                      "prefix armada_scheduler_ (internal/scheduler/schedulerapp.go); 1 when leading, "
                                      "always 1 in leader.mode standalone (MarkLeadingInStandaloneMode)",
    "armada_scheduler_scheduled_jobs": f"{_ARMADA} internal/scheduler/metrics/cycle_metrics.go scheduledJobs "
                                       "(counter; labels pool, queue, priority_class, type)",
    "armada_scheduler_failed_jobs": f"{_ARMADA} internal/scheduler/metrics/cycle_metrics.go failedJobs (counter)",
    "armada_scheduler_schedule_cycle_times": f"{_ARMADA} internal/scheduler/metrics/cycle_metrics.go scheduleCycleTime "
                                             "(histogram, milliseconds)",
    "armada_executor_job_pod": f"{_ARMADA} internal/executor/metrics/pod_metrics/cluster_context.go podCountDesc "
                               "(labels queue, phase, nodeType)",
    "grpc_client_handled_total": f"{_GRPC} client_metrics.go; the executor's client to the scheduler "
                                 f"(internal/executor/application.go); a LeaseJobRuns stream ends OK on io.EOF "
                                 "(interceptors/client.go)",
    "grpc_server_handled_total": f"{_GRPC} server_metrics.go; server and scheduler (internal/common/grpc/grpc.go)",
    # Prometheus itself: one sample per scrape target.
    "up": "prometheus/prometheus scrape/scrape.go: 1 if the target's last scrape succeeded, else 0",
    # Stores' exporters (components/exporters.py).
    "pg_up": "prometheus-community/postgres_exporter v0.20.1 exporter/postgres_exporter.go psqlUp",
    "pg_stat_database_numbackends": "prometheus-community/postgres_exporter v0.20.1 collector/pg_stat_database.go",
    "pg_database_size_bytes": "prometheus-community/postgres_exporter v0.20.1 collector/pg_database.go",
    "redis_up": "oliver006/redis_exporter v1.88.0 exporter/exporter.go (registerConstMetricGauge \"up\", namespace redis)",
    "redis_memory_used_bytes": "oliver006/redis_exporter v1.88.0 exporter/exporter.go (INFO used_memory)",
    "redis_memory_max_bytes": "oliver006/redis_exporter v1.88.0 exporter/exporter.go (INFO maxmemory)",
    "redis_connected_clients": "oliver006/redis_exporter v1.88.0 exporter/exporter.go (INFO connected_clients)",
    # The registry (distribution v3.1.1 with http.debug.prometheus.enabled).
    "registry_http_requests_total": "distribution/distribution v3.1.1 registry/handlers/app.go (namespace registry, "
                                    "subsystem http) with docker/go-metrics v0.0.1 namespace.go NewRequestTotalMetric "
                                    "(labels handler, code, method)",
    "registry_http_request_duration_seconds": "distribution/distribution v3.1.1 registry/handlers/app.go with "
                                              "docker/go-metrics v0.0.1 namespace.go NewRequestDurationMetric (histogram)",
    # kube-state-metrics and the kubelet, as kube-prometheus-stack scrapes them.
    "kube_job_failed": f"{_KSM}/job-metrics.md (labels job_name, namespace, condition)",
    "kube_pod_container_status_restarts_total": f"{_KSM}/pod-metrics.md (labels container, namespace, pod)",
    "kube_statefulset_status_replicas_ready": f"{_KSM}/statefulset-metrics.md",
    "kube_statefulset_replicas": f"{_KSM}/statefulset-metrics.md",
    "kube_deployment_status_replicas_available": f"{_KSM}/deployment-metrics.md",
    "kube_deployment_spec_replicas": f"{_KSM}/deployment-metrics.md",
    "kubelet_volume_stats_available_bytes": "kubernetes/kubernetes pkg/kubelet/metrics/collectors/volume_stats.go "
                                            "(labels namespace, persistentvolumeclaim)",
    "kubelet_volume_stats_capacity_bytes": "kubernetes/kubernetes pkg/kubelet/metrics/collectors/volume_stats.go",
}
"""Every metric name a rule or dashboard selects, with where it is defined upstream."""
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def known_metric(name: str) -> bool:
    """Whether `name` is in METRICS, or a histogram series of one (`_bucket`, `_sum`, `_count`)."""
    return name in METRICS or any(name.endswith(s) and name[: -len(s)] in METRICS for s in HISTOGRAM_SUFFIXES)


# --- config --------------------------------------------------------------------------------------


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, label in value.items():
        if not LABEL_KEY.match(key):
            raise problem("must be a Kubernetes label key (e.g. app.kubernetes.io/name)", f".{key}", key)
        if not LABEL_VALUE.match(label):
            raise problem("must be a Kubernetes label value (63 characters of [-A-Za-z0-9_.])", f".{key}", label)
    return value


class MonitoringConfig(ConfigModel):
    """Monitoring with the Prometheus Operator (stack key `cloudstation:platform.monitoring`). Needs
    the operator's CRDs (PodMonitor, PrometheusRule) in the cluster, e.g. from kube-prometheus-stack,
    plus kube-state-metrics and the kubelet's metrics for some alerts."""

    enabled: bool = False
    """Render PodMonitors, PrometheusRules, dashboards, the stores' exporters and the scrape policies."""
    prometheus_namespace: DnsLabel = "monitoring"
    """Namespace of the Prometheus pods; only they may reach the metrics ports."""
    prometheus_pod_labels: dict[str, str] = Field(default={"app.kubernetes.io/name": "prometheus"}, min_length=1)
    """Labels of the Prometheus pods (the operator sets `app.kubernetes.io/name: prometheus` on every
    Prometheus pod; add `operator.prometheus.io/name: <Prometheus>` to admit one of several)."""
    resource_labels: dict[str, str] = {}
    """Labels on every PodMonitor and PrometheusRule, for your Prometheus' selectors (e.g.
    `release: kube-prometheus-stack`: that chart selects only its release's by default)."""
    scrape_interval: str = Field(default="30s", pattern=DURATION)
    """How often Prometheus scrapes each target."""
    dashboards_namespace: Optional[DnsLabel] = None
    """Where the dashboard ConfigMaps go; unset means `prometheusNamespace` (kube-prometheus-stack's
    Grafana sidecar reads its own namespace by default)."""
    exporter_resources: kb.Resources = kb.Resources(
        cpu_request="10m", memory_request="32Mi", cpu_limit="200m", memory_limit="128Mi"
    )
    """Requests and limits of each store exporter (postgres_exporter, redis_exporter)."""

    @field_validator("prometheus_pod_labels", "resource_labels")
    @classmethod
    def _label_syntax(cls, value: dict[str, str]) -> dict[str, str]:
        return _labels(value)

    @property
    def dashboards_in(self) -> str:
        return self.dashboards_namespace or self.prometheus_namespace

    def scrapers(self) -> tuple[dict, ...]:
        """The NetworkPolicy peers of the Prometheus pods (never every pod, nor every namespace)."""
        return (network.pods(self.prometheus_pod_labels, namespace=self.prometheus_namespace),)


# --- what to scrape, what to alert on, what to show ---------------------------------------------


@dataclass(frozen=True)
class ScrapeTarget:
    """Pods whose named container port serves Prometheus metrics."""

    name: str
    """Name of the PodMonitor and of its scrape NetworkPolicy (unique in the namespace)."""
    selector: dict
    """Label selector of the pods (matchLabels / matchExpressions)."""
    port: str
    """The container port's name."""
    port_number: int
    """Its number (NetworkPolicies need numbers for ports other pods may not have)."""
    path: str = METRICS_PATH


@dataclass(frozen=True)
class Alert:
    """One alerting rule; `description` is the runbook: what it means, what to check, what to do."""

    name: str
    expr: str
    summary: str
    description: str
    for_: str = "10m"
    severity: str = "warning"
    labels: dict[str, str] = field(default_factory=dict)

    def rule(self) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {"summary": self.summary, "description": self.description},
        }


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    legend: str = ""
    unit: str = "short"


@dataclass(frozen=True)
class Dashboard:
    name: str
    """The ConfigMap's name (unique in the dashboards namespace: prefix it with a namespace of the stack)."""
    title: str
    panels: tuple[Panel, ...]


def pod_monitor(target: ScrapeTarget, namespace: pulumi.Input[str], settings: MonitoringConfig) -> dict:
    """A PodMonitor of `target` in its own namespace (no namespaceSelector: that namespace only)."""
    return {
        "metadata": {**kb.metadata(target.name, namespace, COMPONENT),
                     "labels": {**kb.labels(target.name, COMPONENT), **settings.resource_labels}},
        "spec": {
            "selector": dict(target.selector),
            "podMetricsEndpoints": [
                {"port": target.port, "path": target.path, "interval": settings.scrape_interval}
            ],
        },
    }


def scrape_policy(target: ScrapeTarget, namespace: pulumi.Input[str], settings: MonitoringConfig) -> dict:
    """Prometheus' pods, and no others, reach the target's metrics port."""
    return network.policy(
        f"{target.name}-scrape", namespace, COMPONENT,
        network.scrape_ingress(target.selector, [target.port_number], settings.scrapers()),
    )


def prometheus_rule(name: str, namespace: pulumi.Input[str], group: str, alerts: Sequence[Alert],
                    settings: MonitoringConfig) -> dict:
    return {
        "metadata": {**kb.metadata(name, namespace, COMPONENT),
                     "labels": {**kb.labels(name, COMPONENT), **settings.resource_labels}},
        "spec": {"groups": [{"name": group, "rules": [alert.rule() for alert in alerts]}]},
    }


def dashboard_json(dashboard: Dashboard) -> str:
    """A Grafana dashboard (schemaVersion 39) of time series panels, two per row, on a Prometheus
    data source chosen with the `datasource` variable."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    panels = []
    for index, panel in enumerate(dashboard.panels):
        panels.append({
            "id": index + 1,
            "type": "timeseries",
            "title": panel.title,
            "datasource": source,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "targets": [{"refId": "A", "datasource": source, "expr": panel.expr, "legendFormat": panel.legend}],
        })
    body = {
        "uid": "cs-" + hashlib.sha256(dashboard.name.encode()).hexdigest()[:16],
        "title": dashboard.title,
        "tags": ["cloudstation"],
        "timezone": "browser",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}]},
        "panels": panels,
    }
    return json.dumps(body, indent=1, sort_keys=True)


def dashboard_config_map(dashboard: Dashboard, settings: MonitoringConfig) -> dict:
    return {
        "metadata": {**kb.metadata(dashboard.name, settings.dashboards_in, COMPONENT),
                     "labels": {**kb.labels(dashboard.name, COMPONENT), **DASHBOARD_LABEL}},
        "data": {f"{dashboard.name}.json": dashboard_json(dashboard)},
    }


# --- alerts every watched namespace gets -----------------------------------------------------------


def crash_loop_alert(namespace: str, what: str) -> Alert:
    return Alert(
        name="CloudStationContainerRestarting",
        expr=(f'sum by (namespace, pod, container) (increase(kube_pod_container_status_restarts_total'
              f'{{namespace="{namespace}"}}[15m])) > 2'),
        for_="5m",
        summary=f"A container of {what} keeps restarting (crash loop)",
        description=(
            "{{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }} restarted more than twice "
            "in 15 minutes. Check why it exits: `kubectl -n {{ $labels.namespace }} logs {{ $labels.pod }} -c "
            "{{ $labels.container }} --previous` and `kubectl -n {{ $labels.namespace }} describe pod "
            "{{ $labels.pod }}` (OOMKilled: raise its memory limit in the stack file; a failing liveness probe: "
            "check what it probes; a configuration error: fix the stack file and `pulumi up`)."
        ),
    )


def volume_alert(namespace: str, what: str, claim: Optional[str] = None, name: str = "CloudStationVolumeNearlyFull",
                 free: float = 0.15, severity: str = "warning") -> Alert:
    selector = f'namespace="{namespace}"' + (f', persistentvolumeclaim="{claim}"' if claim else "")
    return Alert(
        name=name,
        expr=(f"kubelet_volume_stats_available_bytes{{{selector}}} / "
              f"kubelet_volume_stats_capacity_bytes{{{selector}}} < {free}"),
        for_="15m",
        severity=severity,
        summary=f"{what}: volume less than {round(free * 100)}% free",
        description=(
            "PersistentVolumeClaim {{ $labels.namespace }}/{{ $labels.persistentvolumeclaim }} has "
            "{{ $value | humanizePercentage }} of its space left. When it is full, writes fail. Grow it "
            "(`kubectl -n {{ $labels.namespace }} edit pvc {{ $labels.persistentvolumeclaim }}` if its StorageClass "
            "allows volume expansion, then set the same size in the stack file), or free space: see docs/monitoring.md."
        ),
    )


def target_down_alert(namespace: str, container: str, what: str, name: str, severity: str = "warning") -> Alert:
    """The metrics endpoint of `container` in `namespace` stopped answering, or its pods are gone."""
    selector = f'namespace="{namespace}", container="{container}"'
    return Alert(
        name=name,
        expr=f"up{{{selector}}} == 0 or absent(up{{{selector}}})",
        for_="10m",
        severity=severity,
        summary=f"{what} is down or its metrics cannot be scraped",
        description=(
            f"Prometheus cannot scrape {what} (container {container} in namespace {namespace}), or no such pod runs. "
            f"Check `kubectl -n {namespace} get pods` and the pod's events and logs. If the pod runs and is ready, "
            "check the scrape: the PodMonitor and the NetworkPolicy `*-scrape` admit only the Prometheus pods of "
            "platform.monitoring (prometheusNamespace, prometheusPodLabels)."
        ),
    )


def statefulset_not_ready_alert(namespace: str, statefulset: str, what: str) -> Alert:
    selector = f'namespace="{namespace}", statefulset="{statefulset}"'
    return Alert(
        name="CloudStationStoreNotReady",
        expr=f"kube_statefulset_status_replicas_ready{{{selector}}} < kube_statefulset_replicas{{{selector}}}",
        for_="10m",
        severity="critical",
        summary=f"{what} has pods that are not ready",
        description=(
            f"StatefulSet {namespace}/{statefulset} ({what}) has {{{{ $value }}}} ready pods, fewer than it should. "
            "Its clients fail while it is down. Check `kubectl -n {{ $labels.namespace }} get pods` and the pod's "
            "events and logs; a full volume, a lost node or a failed probe are the usual causes."
        ),
    )


# --- the component ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitoringArgs:
    settings: MonitoringConfig
    namespace: pulumi.Input[str]
    """The watched namespace (an Output of its Namespace, so everything here waits for it)."""
    targets: Sequence[ScrapeTarget] = ()
    alerts: Sequence[Alert] = ()
    group: str = "cloudstation"
    """The rule group's name."""
    dashboards: Sequence[Dashboard] = ()


class Monitoring(Component):
    """Per target a PodMonitor and a NetworkPolicy admitting Prometheus to its metrics port; one
    PrometheusRule with the alerts; one ConfigMap per dashboard. Outputs: `monitors` (PodMonitor
    names)."""

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:monitoring:Monitoring", name, None, opts)
        child = self.child_opts()
        settings = args.settings
        names = [t.name for t in args.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"scrape targets must have unique names: {names}")
        for target in args.targets:
            # The CRD is the cluster's (the Prometheus Operator's); pulumi-kubernetes treats custom
            # resources as ready once applied (provider/pkg/await/awaiters.go has no entry for them).
            k8s.apiextensions.CustomResource(
                f"{name}-{target.name}-monitor", api_version=API_VERSION, kind="PodMonitor",
                **pod_monitor(target, args.namespace, settings), opts=child,
            )
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{target.name}-scrape", **scrape_policy(target, args.namespace, settings), opts=child
            )
        if args.alerts:
            k8s.apiextensions.CustomResource(
                f"{name}-rules", api_version=API_VERSION, kind="PrometheusRule",
                **prometheus_rule(f"{args.group}-alerts", args.namespace, args.group, args.alerts, settings), opts=child,
            )
        for dashboard in args.dashboards:
            k8s.core.v1.ConfigMap(f"{name}-{dashboard.name}", **dashboard_config_map(dashboard, settings), opts=child)
        self.monitors = names
        self.register_outputs({"monitors": names})
