"""A Prometheus exporter beside a managed store that serves no metrics itself, created only with
`platform.monitoring.enabled` (docs/monitoring.md):

- PostgreSQL: prometheus-community/postgres_exporter (`pg_*`, port 9187), connecting with the
  store's own credentials Secret (libpq keywords `DATA_SOURCE_URI`, `_USER`, `_PASS`; v0.20.1
  cmd/postgres_exporter/main.go and README.md) to the maintenance database `postgres`;
- Redis: oliver006/redis_exporter (`redis_*`, port 9121), with the password from the Redis Secret
  (`REDIS_PASSWORD`, v1.88.0 main.go) and its multi-target `/scrape` endpoint switched off.

Each is its own Deployment (not a sidecar: the store's pod and its rollout stay as they are) with
a NetworkPolicy that lets it reach only its store; Prometheus reaches it through the scrape policy
of components/monitoring.py. Both images are static Go binaries that write nothing, so the root
filesystem is read-only; they run as the non-root users their images declare.

Cassandra and Pulsar are left to kube-state-metrics (readiness) and the kubelet (volumes): the
official Cassandra image has no exporter and exposes JMX on localhost only, and Pulsar's only
metrics port is its unauthenticated admin API, which Prometheus should not be able to call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import k8s as kb
from components import network
from components.component import Component
from components.monitoring import ScrapeTarget

COMPONENT = "metrics-exporter"
METRICS_PORT_NAME = "metrics"


@dataclass(frozen=True)
class ExporterKind:
    port: int
    run_as: int
    """The image's user (postgres_exporter: `USER nobody`, 65534; redis_exporter: `USER 59000:59000`)."""
    health_path: str
    """An HTTP path that answers 200 while the exporter serves (whether or not its store is up, so
    that a store outage shows as `pg_up`/`redis_up` 0, not as a missing target)."""
    up_metric: str


KINDS: dict[str, ExporterKind] = {
    # postgres_exporter: `/` is its landing page (cmd/postgres_exporter/main.go), default :9187.
    "postgres": ExporterKind(port=9187, run_as=65534, health_path="/", up_metric="pg_up"),
    # redis_exporter: `/health` answers "ok" (exporter/http.go healthHandler), default :9121.
    "redis": ExporterKind(port=9121, run_as=59000, health_path="/health", up_metric="redis_up"),
}


@dataclass(frozen=True)
class StoreExporterArgs:
    kind: Literal["postgres", "redis"]
    store: str
    """The store's name: its pods' `app.kubernetes.io/name` and, in its namespace, its Service."""
    namespace: pulumi.Input[str]
    namespace_name: str
    store_port: int
    secret: pulumi.Input[str]
    """The store's credentials Secret: `username` and `password` (PostgreSQL), the password (Redis)."""
    image: str
    """The pinned exporter image (infra/versions.py)."""
    resources: kb.Resources
    password_key: str = "password"


def exporter_name(store: str) -> str:
    return f"{store}-exporter"


def exporter_env(args: StoreExporterArgs) -> list[dict]:
    host = kb.service_dns(args.store, args.namespace_name)
    if args.kind == "postgres":
        return [
            # `postgres`, the maintenance database, exists on every server; the store's owner role
            # (the image's POSTGRES_USER, a superuser) reads every database's statistics from it.
            {"name": "DATA_SOURCE_URI", "value": f"{host}:{args.store_port}/postgres?sslmode=disable"},
            kb.secret_env("DATA_SOURCE_USER", args.secret, "username"),
            kb.secret_env("DATA_SOURCE_PASS", args.secret, args.password_key),
        ]
    return [
        {"name": "REDIS_ADDR", "value": f"redis://{host}:{args.store_port}"},
        kb.secret_env("REDIS_PASSWORD", args.secret, args.password_key),
    ]


def exporter_args(args: StoreExporterArgs) -> list[str]:
    if args.kind == "redis":
        # /scrape?target=… would let any caller aim the exporter at another Redis.
        return ["--disable-scrape-endpoint"]
    return []


def deployment_spec(args: StoreExporterArgs) -> dict:
    kind = KINDS[args.kind]
    name = exporter_name(args.store)
    probe_path = kind.health_path
    container = {
        "name": name,
        "image": args.image,
        "args": exporter_args(args),
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": kind.port, "protocol": "TCP"}],
        "env": exporter_env(args),
        "resources": args.resources.spec(),
        "securityContext": kb.container_security(read_only_root=True, run_as_user=kind.run_as),
        "readinessProbe": kb.http_probe(probe_path, METRICS_PORT_NAME, initial_delay=2),
        "livenessProbe": kb.http_probe(probe_path, METRICS_PORT_NAME, initial_delay=10, failures=6),
    }
    return {
        "replicas": 1,
        "selector": {"matchLabels": kb.selector_labels(name)},
        "template": {
            "metadata": {"labels": kb.labels(name, COMPONENT)},
            "spec": {
                "automountServiceAccountToken": False,  # no API calls
                "enableServiceLinks": False,
                "securityContext": kb.pod_security(kind.run_as),
                "containers": [container],
            },
        },
    }


def network_policy_spec(args: StoreExporterArgs) -> dict:
    """Egress to its store's pods on the store's port only (DNS: the namespace's allow-dns)."""
    store = network.Endpoint(ports=(args.store_port,), peers=(network.pods(kb.selector_labels(args.store)),))
    return network.spec({"matchLabels": kb.selector_labels(exporter_name(args.store))}, egress_rules=[network.to(store)])


def scrape_target(args: StoreExporterArgs) -> ScrapeTarget:
    name = exporter_name(args.store)
    return ScrapeTarget(name=name, selector={"matchLabels": kb.selector_labels(name)}, port=METRICS_PORT_NAME,
                        port_number=KINDS[args.kind].port)


class StoreExporter(Component):
    """Attributes: `target` (its ScrapeTarget), `container` (the container name, the `container`
    label of its series), `up_metric` (`pg_up` / `redis_up`)."""

    def __init__(self, name: str, args: StoreExporterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:monitoring:StoreExporter", name, None, opts)
        child = self.child_opts()
        object_name = exporter_name(args.store)
        policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy", metadata=kb.metadata(object_name, args.namespace, COMPONENT),
            spec=network_policy_spec(args), opts=child,
        )
        k8s.apps.v1.Deployment(
            f"{name}-deploy", metadata=kb.metadata(object_name, args.namespace, COMPONENT),
            spec=deployment_spec(args), opts=self.child_opts(depends_on=[policy]),
        )
        self.target = scrape_target(args)
        self.container = object_name
        self.up_metric = KINDS[args.kind].up_metric
        self.register_outputs({"name": object_name})
