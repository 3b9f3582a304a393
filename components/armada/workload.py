"""Pure builders of the Kubernetes objects every Armada service shares: pod template,
Deployment, Service, the Job and CronJob that run a service's binary with its config.

All Armada images run as user `armada` (uid 1000, gid 2000, NOTES §13) from WORKDIR /app, where
the binary and its default config live. We assume (upstream does not document it) that the Go
binaries write nothing but temporary files, so the root filesystem is read-only and /tmp is an
emptyDir; the override config is a read-only ConfigMap volume at /config.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from components import network
from components.armada.auth import AUTH_DIR, AUTH_FILE, AUTH_PATH, ServiceCredentials
from components.armada.config import (
    CA_DIR, CERT_DIR, CONFIG_DIR, CONFIG_FILE, CONFIG_PATH, SCHEDULER, SCHEDULER_PORTS, SERVER, SERVER_PORTS, Endpoints,
    TrustedCa, go_memory_limit_env,
)
from components.k8s import (
    Resources, container_security, disruption_budget, http_probe, labels, metadata, pod_security, selector_labels,
    spread_over_nodes,
)
from components.postgres import PORT as POSTGRES_PORT
from components.pulsar import ADMIN_PORT as PULSAR_ADMIN_PORT, BROKER_PORT as PULSAR_PORT
from components.redis import RedisSettings

ARMADA_UID = 1000
ARMADA_GID = 2000
COMPONENT = "armada"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
SCHEDULER_CLIENT = {"armada.cloudstation.io/scheduler-client": "true"}
"""Pod label of the services allowed to call the scheduler's gRPC API (server, executors)."""


@dataclass(frozen=True)
class ServiceSpec:
    """One Armada service as it runs: everything its objects are built from."""

    name: str
    """Kubernetes name of the ServiceAccount, ConfigMap, Deployment and Service."""
    image: str
    args: list[str]
    """Container args (the image's ENTRYPOINT is the binary)."""
    config: dict
    """The override config (may hold pulumi Outputs)."""
    ports: dict[str, int]
    resources: Resources
    replicas: int = 1
    env: list[dict] = field(default_factory=list)
    health: bool = False
    """Whether the service serves GET /health on its `http` port (probes)."""
    metrics_probe: bool = False
    """Probe GET /metrics on the `metrics` port instead, for services that serve nothing else
    (the ingesters; see `container`)."""
    pod_env: list[dict] = field(default_factory=list)
    """Environment of the service's own pods only, not of its migration and pruning Jobs."""
    service: bool = True
    """Whether it gets a ClusterIP Service (ingesters are only scraped, they get none)."""
    api_access: bool = False
    """Whether the pod needs a Kubernetes API token (executor, binoculars)."""
    termination_grace_seconds: Optional[int] = None
    single_writer: bool = False
    """Two pods must never run at once, not even during a rollout (the scheduler, each executor):
    its Deployment uses the Recreate strategy, so the old pod is gone before the new one starts."""
    pod_labels: dict[str, str] = field(default_factory=dict)
    """Extra labels of its pods (e.g. SCHEDULER_CLIENT)."""
    callers: dict[str, tuple[dict, ...]] = field(default_factory=dict)
    """Port name -> NetworkPolicy peers admitted to it. Ports not listed, or with no peers, admit
    nothing but the kubelet (probes) and port-forwards."""
    credentials: Optional[ServiceCredentials] = None
    """Its basic-auth users and client credentials (components/armada/auth.py): a Secret mounted
    at /secrets and passed as a second `--config`."""
    trust: Optional[TrustedCa] = None
    """The CA its TLS connection to the scheduler checks (config.py TrustedCa)."""
    tls_secret: Any = None
    """The scheduler's serving certificate Secret (tls.crt, tls.key), mounted at CERT_DIR."""


def config_args(*before: str) -> list[str]:
    return [*before, "--config", CONFIG_PATH]


def volumes(
    config_map: Any, credentials: Optional[ServiceCredentials] = None, trust: Optional[TrustedCa] = None,
    tls_secret: Any = None,
) -> list[dict]:
    found = [
        {"name": "config", "configMap": {"name": config_map, "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}]}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if credentials is not None:
        # Group-readable for the armada group (fsGroup), nobody else.
        found.append({
            "name": "auth",
            "secret": {"secretName": credentials.secret, "items": [{"key": AUTH_FILE, "path": AUTH_FILE}],
                       "defaultMode": 0o440},
        })
    if trust is not None:
        found.append(trust.volume())
    if tls_secret is not None:
        # The private key: group-readable for the armada group only, like the credentials.
        found.append({
            "name": "scheduler-tls",
            "secret": {"secretName": tls_secret, "defaultMode": 0o440,
                       "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]},
        })
    return found


def volume_mounts(
    credentials: Optional[ServiceCredentials] = None, trust: Optional[TrustedCa] = None, tls_secret: Any = None
) -> list[dict]:
    found = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if credentials is not None:
        found.append({"name": "auth", "mountPath": AUTH_DIR, "readOnly": True})
    if trust is not None:
        found.append({"name": "scheduler-ca", "mountPath": CA_DIR, "readOnly": True})
    if tls_secret is not None:
        found.append({"name": "scheduler-tls", "mountPath": CERT_DIR, "readOnly": True})
    return found


def container(
    name: str,
    image: str,
    args: list[str],
    env: list[dict],
    resources: Resources,
    ports: Optional[dict[str, int]] = None,
    health: bool = False,
    credentials: Optional[ServiceCredentials] = None,
    metrics_probe: bool = False,
    trust: Optional[TrustedCa] = None,
    tls_secret: Any = None,
) -> dict:
    spec = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        # The credentials file is merged over the override file (repeated --config).
        "args": [*args, "--config", AUTH_PATH] if credentials is not None else list(args),
        "env": [*env, *(trust.env() if trust is not None else []), go_memory_limit_env()],
        "resources": resources.spec(),
        "securityContext": container_security(read_only_root=True),
        "volumeMounts": volume_mounts(credentials, trust, tls_secret),
    }
    if ports:
        spec["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()]
    if health:
        # /health answers 204 once started (about 10 s), 503 otherwise (NOTES §1).
        spec["readinessProbe"] = http_probe(HEALTH_PATH, "http", initial_delay=5, period=10, failures=2)
        spec["livenessProbe"] = http_probe(HEALTH_PATH, "http", initial_delay=20, period=10, failures=3)
    elif metrics_probe:
        # The ingesters serve no health endpoint: their only listener is the Prometheus handler
        # at /metrics on `metricsPort` (v0.22.7 internal/common/startup.go ServeMetricsFor, started
        # by internal/{scheduleringester,lookoutingester,eventingester}/ingester.go Run after the
        # database pool opens, before the Pulsar pipeline runs). A pipeline that fails ends Run
        # and the process, so the probes tell a started, serving process from a stuck or gone
        # one: readiness for rollouts and disruption budgets, liveness for a hung process.
        spec["readinessProbe"] = http_probe(METRICS_PATH, "metrics", initial_delay=5, period=10, failures=3)
        spec["livenessProbe"] = http_probe(METRICS_PATH, "metrics", initial_delay=20, period=20, failures=3)
    return spec


def pod_spec(
    service_account: Any,
    config_map: Any,
    containers: list[dict],
    api_access: bool = False,
    restart_policy: Optional[str] = None,
    termination_grace_seconds: Optional[int] = None,
    credentials: Optional[ServiceCredentials] = None,
    trust: Optional[TrustedCa] = None,
    tls_secret: Any = None,
) -> dict:
    spec = {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": api_access,
        # Service links would inject ARMADA_<SERVICE>_PORT=tcp://... for every Service named
        # armada-*, and Armada reads ARMADA_* variables as config overrides (NOTES §2).
        "enableServiceLinks": False,
        "securityContext": pod_security(ARMADA_UID, ARMADA_GID, fs_group=ARMADA_GID),
        "containers": containers,
        "volumes": volumes(config_map, credentials, trust, tls_secret),
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if termination_grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = termination_grace_seconds
    return spec


def service_container(spec: ServiceSpec) -> dict:
    return container(
        spec.name, spec.image, spec.args, [*spec.env, *spec.pod_env], spec.resources, spec.ports, spec.health,
        spec.credentials, spec.metrics_probe, spec.trust, spec.tls_secret,
    )


ROLLING_UPDATE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
"""Services that may run twice for a moment: the new pod is ready before the old one goes."""


def deployment(
    spec: ServiceSpec, namespace: Any, config_map: Any, config_checksum: Any, service_account: Any = None
) -> dict:
    """The Deployment's metadata and spec; the checksum annotation rolls pods on config changes.
    Replicated services prefer their pods on different nodes (a node's loss or drain takes one)."""
    template_spec = pod_spec(
        service_account or spec.name,
        config_map,
        [service_container(spec)],
        api_access=spec.api_access,
        termination_grace_seconds=spec.termination_grace_seconds,
        credentials=spec.credentials,
        trust=spec.trust,
        tls_secret=spec.tls_secret,
    )
    if spec.replicas > 1:
        # pod-template-hash: only the current ReplicaSet's pods count, so a rollout spreads its
        # new pods too (matchLabelKeys, beta and on by default since 1.27).
        template_spec["topologySpreadConstraints"] = spread_over_nodes(
            selector_labels(spec.name), match_label_keys=("pod-template-hash",)
        )
    return {
        "metadata": metadata(spec.name, namespace, COMPONENT),
        "spec": {
            "replicas": spec.replicas,
            "strategy": {"type": "Recreate"} if spec.single_writer else ROLLING_UPDATE,
            "selector": {"matchLabels": selector_labels(spec.name)},
            "template": {
                "metadata": {
                    "labels": {**labels(spec.name, COMPONENT), **spec.pod_labels},
                    "annotations": {
                        "cloudstation.io/config-checksum": config_checksum,
                        **({"cloudstation.io/credentials-checksum": spec.credentials.checksum} if spec.credentials else {}),
                    },
                },
                "spec": template_spec,
            },
        },
    }


def pod_disruption_budget(spec: ServiceSpec, namespace: Any) -> Optional[dict]:
    """A replicated service's PodDisruptionBudget over exactly its Deployment's pods (its
    selector); None for one replica (components/k8s.py disruption_budget)."""
    if spec.replicas <= 1:
        return None
    return disruption_budget(spec.name, namespace, COMPONENT, selector_labels(spec.name))


def service(spec: ServiceSpec, namespace: Any) -> dict:
    return {
        "metadata": metadata(spec.name, namespace, COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(spec.name),
            "ports": [
                {"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in spec.ports.items()
            ],
        },
    }


SCHEDULER_CLIENTS = (network.pods(SCHEDULER_CLIENT),)
"""Peers admitted to the scheduler's gRPC API: with anonymous auth, any pod reaching it could lease jobs."""


def to_dependency(endpoint: Optional[network.Endpoint], default_port: int) -> dict:
    """Egress to a dependency at its endpoint; none is an error (no rule is open to every address)."""
    if endpoint is None:
        raise ValueError(f"no network endpoint for the dependency on port {default_port}")
    return network.to(endpoint)


def postgres_egress(endpoints: Endpoints) -> dict:
    port = endpoints.postgres_port if isinstance(endpoints.postgres_port, int) else POSTGRES_PORT
    return to_dependency(endpoints.postgres_endpoint, port)


def service_egress(spec: ServiceSpec, endpoints: Endpoints) -> list[dict]:
    """What a service's pods connect to, read from its override config (the keys that carry the
    addresses) and its API access."""
    config = spec.config
    rules = []
    if "postgres" in config:
        rules.append(postgres_egress(endpoints))
    if "redis" in config or "eventsApiRedis" in config:
        rules.append(to_dependency(endpoints.redis_endpoint, RedisSettings.model_fields["port"].default))
    if "pulsar" in config:
        rules.append(to_dependency(endpoints.pulsar_endpoint, PULSAR_PORT))
        if "restURL" in config["pulsar"]:
            rules.append(to_dependency(endpoints.pulsar_admin_endpoint, PULSAR_ADMIN_PORT))
    if "executorApiConnection" in config and endpoints.scheduler_endpoint is not None:
        # Another cluster's scheduler (an executor-only stack): its addresses only.
        rules.append(network.to(endpoints.scheduler_endpoint))
    elif "schedulerApiConnection" in config or "executorApiConnection" in config:
        rules.append(network.egress([network.pods(selector_labels(SCHEDULER))], [SCHEDULER_PORTS["grpc"]]))
    if "armadaApi" in config:
        rules.append(network.egress([network.pods(selector_labels(SERVER))], [SERVER_PORTS["grpc"]]))
    if (config.get("leader") or {}).get("mode") == "kubernetes":
        # A non-leader scheduler proxies scheduling reports to the leader's gRPC port (config.py
        # leader_election); the Lease itself is on the API server (api_access).
        rules.append(network.egress([network.pods(selector_labels(spec.name))], [spec.ports["grpc"]]))
    if spec.api_access:
        rules.append(network.kubernetes_api(endpoints.kubernetes_api))
    return rules


def service_network_policy(spec: ServiceSpec, endpoints: Endpoints) -> dict:
    """The service's pods: reached on the ports of `spec.callers` by those callers (a port with
    no callers gets no rule), and connecting to what their config names."""
    ingress = [network.ingress(peers, [spec.ports[port]]) for port, peers in spec.callers.items() if peers]
    return network.policy(
        spec.name,
        endpoints.namespace,
        COMPONENT,
        network.spec(
            {"matchLabels": selector_labels(spec.name)},
            ingress_rules=ingress,
            egress_rules=service_egress(spec, endpoints),
        ),
    )


def tasks_network_policy(spec: ServiceSpec, tasks: list[str], endpoints: Endpoints) -> dict:
    """A service's migration and pruning Jobs: they only work on its database."""
    return network.policy(
        f"{spec.name}-tasks",
        endpoints.namespace,
        COMPONENT,
        network.spec(
            {"matchExpressions": [network.names_in(tasks)]}, ingress_rules=[], egress_rules=[postgres_egress(endpoints)]
        ),
    )


@dataclass(frozen=True)
class TaskSpec:
    """A run-to-completion use of a service's binary and config (migration, pruning)."""

    name: str
    args: list[str]
    resources: Resources
    backoff_limit: int = 3
    deadline_seconds: int = 900


def job_spec(task: TaskSpec, service: ServiceSpec, config_map: Any, service_account: Any = None) -> dict:
    return {
        "backoffLimit": task.backoff_limit,
        "activeDeadlineSeconds": task.deadline_seconds,
        "template": {
            "metadata": {"labels": labels(task.name, COMPONENT)},
            "spec": pod_spec(
                service_account or service.name,
                config_map,
                [container(task.name, service.image, task.args, service.env, task.resources)],
                restart_policy="Never",
            ),
        },
    }


REPLACE_UNREADY = {"pulumi.com/replaceUnready": "true"}
"""On a migration Job: a Job that failed (or never completed) is replaced on the next `pulumi up`
instead of being awaited again. Without it the failed Job stays in state with an init error, the
engine retries it as an in-place update, which waits on the same failed Job and fails, and so
does every later up. pulumi-kubernetes v4.34.2 `provider/pkg/provider/provider.go` (Diff): when
`metadata.ReplaceUnready` (the annotation's value is exactly the string "true",
`provider/pkg/metadata/annotations.go` IsAnnotationTrue) and the kind is Job, the live Job is read
and, unless the Job checker (`pkg/await/checker/job`: started and condition Complete) passes, the
diff is a replacement; the Job keeps its name, so it is deleted before the new one is created."""


def job(task: TaskSpec, service: ServiceSpec, namespace: Any, config_map: Any, service_account: Any = None) -> dict:
    return {
        "metadata": metadata(task.name, namespace, COMPONENT, annotations=dict(REPLACE_UNREADY)),
        "spec": job_spec(task, service, config_map, service_account),
    }


def cron_job(
    task: TaskSpec, schedule: str, service: ServiceSpec, namespace: Any, config_map: Any, service_account: Any = None
) -> dict:
    return {
        "metadata": metadata(task.name, namespace, COMPONENT),
        "spec": {
            "schedule": schedule,
            # A prune that overruns its interval must not start a second one.
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {"spec": job_spec(task, service, config_map, service_account)},
        },
    }
