"""Pure builders of each Armada service's override config and of its secret environment.

Every service loads its built-in default file (`/app/config/<service>/config.yaml`, copied in
reference/armada/armada-v0.22.7/config/) and then the file we mount at
`/config/application_config.yaml` (armada/NOTES.md §2). These functions build that file: only
keys that wire the installation together (addresses, databases, topics, ports that our Services
expose, auth, pools), then a free-form `extra` from the stack config is deep-merged over it.

Passwords never appear here: they reach the services as `ARMADA_*` environment variables read
from Secrets (`postgres_env`, `redis_env`). Viper applies such a variable only to a key that exists in the
merged YAML; every key we override that way (`postgres.connection.user/password`,
`eventsApiRedis.password`, `redis.password`) is present in the default files.

Values may be plain or `pulumi.Output`s (hosts of managed dependencies); nothing here awaits them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from components.network import Endpoint, KubernetesApi
from components.armada.settings import ArmadaConfig, ExecutorSettings
from components.k8s import secret_env, service_dns

CONFIG_DIR = "/config"
CONFIG_FILE = "application_config.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"

# Ports each service listens on (armada/NOTES.md §1). They are written into the override files
# as well, so the Kubernetes Services and the processes agree by construction.
SERVER_PORTS = {"grpc": 50051, "http": 8080, "metrics": 9000}
SCHEDULER_PORTS = {"grpc": 50052, "http": 8080, "metrics": 9000}
SCHEDULER_INGESTER_PORTS = {"metrics": 9003}
EXECUTOR_PORTS = {"http": 8080, "metrics": 9001}
LOOKOUT_PORTS = {"http": 10000, "metrics": 9003}
LOOKOUT_INGESTER_PORTS = {"metrics": 9002}
EVENT_INGESTER_PORTS = {"metrics": 9001}
BINOCULARS_PORTS = {"grpc": 50051, "http": 8080, "metrics": 9000}

LOCAL_SERVER_REST_URL = f"http://localhost:{SERVER_PORTS['http']}"
"""The server's REST API as `kubectl port-forward svc/armada-server 8080:8080` serves it to a
browser; the server's default CORS origins admit Lookout port-forwarded to localhost:10000."""

# Kubernetes names of the services (Deployments, Services, ServiceAccounts, ConfigMaps).
SERVER = "armada-server"
SCHEDULER = "armada-scheduler"
SCHEDULER_INGESTER = "armada-scheduler-ingester"
LOOKOUT = "armada-lookout"
LOOKOUT_INGESTER = "armada-lookout-ingester"
EVENT_INGESTER = "armada-event-ingester"
BINOCULARS = "armada-binoculars"


UPSTREAM_SUBMISSION_CLASSES = ("armada-default", "armada-preemptible", "armada-resilient")
"""`submission.allowedPriorityClassNames` of the default server config."""

EXECUTOR_UPDATE_FREQUENCY = "5s"
"""The scheduler's `scheduling.executorUpdateFrequency` (default 60s): how often its submit check
re-reads the executors' nodes (v0.22.7 internal/scheduler/submitcheck.go `SubmitChecker.Run`). A job
checked against a snapshot with no node in any pool is REJECTED, terminally (scheduler.go
`submitCheck`), so with 60s every build submitted in the first minute after the executor's first
report failed on a fresh install (issue 19 defect 2). 5s is the executors' own reporting interval
(executor `task.allocateSpareClusterCapacityInterval`; each lease request stores its nodes:
internal/scheduler/api.go `StoreExecutor`); a refresh reads the executors table and rebuilds one
node index per pool, little for the clusters this program sizes (upstream's _local/compose/full.yaml
runs 1s). The build provider also resubmits a job rejected for that reason (components/entity_build.py)."""


def executor_name(executor: ExecutorSettings) -> str:
    return f"armada-executor-{executor.name}"


CA_DIR = "/etc/armada-ca"
CA_FILE = "ca.crt"
CERT_DIR = "/certs"
"""Where the scheduler's serving certificate is mounted (tls.crt, tls.key), as upstream Helm's
deployment/scheduler/values.yaml `grpc.tls.certPath` / `keyPath` say."""


@dataclass(frozen=True)
class TrustedCa:
    """A CA bundle the scheduler's TLS clients trust, mounted at CA_DIR/CA_FILE. Armada's client
    has no CA option: it dials TLS with the system roots (v0.22.7 pkg/client/connection.go
    transportCredentials, credentials.NewClientTLSFromCert(nil, "")), which Go reads from
    SSL_CERT_FILE (replacing its default bundle files) and SSL_CERT_DIR (replacing its default
    directories) (crypto/x509 root_unix.go loadSystemRoots)."""

    secret: Any = None
    """A Secret holding the bundle at `key`..."""
    config_map: Any = None
    """... or a ConfigMap."""
    key: str = CA_FILE
    only: bool = False
    """Trust nothing else (SSL_CERT_DIR too): a remote executor, whose only TLS peer is the
    scheduler. In-cluster clients keep the image's directory of public roots for their other
    connections (e.g. PostgreSQL with sslmode verify-full)."""

    def env(self) -> list[dict]:
        found = [{"name": "SSL_CERT_FILE", "value": f"{CA_DIR}/{CA_FILE}"}]
        if self.only:
            found.append({"name": "SSL_CERT_DIR", "value": CA_DIR})
        return found

    def volume(self) -> dict:
        items = [{"key": self.key, "path": CA_FILE}]
        if self.secret is not None:
            return {"name": "scheduler-ca", "secret": {"secretName": self.secret, "items": items, "defaultMode": 0o444}}
        return {"name": "scheduler-ca", "configMap": {"name": self.config_map, "items": items, "defaultMode": 0o444}}


@dataclass(frozen=True)
class Endpoints:
    """Where the services and their dependencies are reached; values may be pulumi Outputs."""

    namespace: str
    """Namespace of the Armada services."""
    postgres_host: Any
    postgres_port: Any
    redis_address: Any
    """`host:port` of the one Redis shared by the server's events API and the event ingester."""
    pulsar_url: Any
    """`pulsar://host:6650`."""
    pulsar_admin_url: Any = None
    """`http://host:8080` (only used by the ingesters' optional delay monitor)."""
    postgres_sslmode: str = "disable"
    postgres_secret: Any = None
    """Secret with keys `username` and `password` for PostgreSQL."""
    redis_secret: Any = None
    """Secret holding the Redis password; None when Redis has no password."""
    redis_password_key: str = "password"
    postgres_endpoint: Optional[Endpoint] = None
    """The dependencies' network endpoints (their components' `endpoint`), for the services'
    egress policies; a service whose config names a dependency without one gets no policy."""
    redis_endpoint: Optional[Endpoint] = None
    pulsar_endpoint: Optional[Endpoint] = None
    pulsar_admin_endpoint: Optional[Endpoint] = None
    kubernetes_api: Optional[KubernetesApi] = None
    """Where the executors and binoculars reach the API server (platform.kubernetesApi)."""
    scheduler_address: Optional[str] = None
    """`host:port` of another stack's scheduler (an executor-only stack); None: this namespace's."""
    scheduler_endpoint: Optional[Endpoint] = None
    """The executors' egress to `scheduler_address` (its CIDRs and port)."""
    scheduler_ca: Optional["TrustedCa"] = None
    """The CA the scheduler's clients check its certificate against, when it serves TLS."""
    scheduler_tls_secret: Any = None
    """The scheduler's own certificate (tls.crt, tls.key), when it serves TLS (armada.workers)."""

    @property
    def scheduler_tls(self) -> bool:
        """Whether the scheduler's gRPC connection is TLS: always to another cluster's scheduler,
        and to this stack's when it serves remote executors."""
        return self.scheduler_address is not None or self.scheduler_tls_secret is not None

    def scheduler_grpc_address(self) -> str:
        return self.scheduler_address or self.grpc_address(SCHEDULER, SCHEDULER_PORTS["grpc"])

    def grpc_address(self, service: str, port: int) -> str:
        return f"{service_dns(service, self.namespace)}:{port}"

    def http_url(self, service: str, port: int) -> str:
        return f"http://{service_dns(service, self.namespace)}:{port}"


# --- merging ---------------------------------------------------------------------------------


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """`override` over `base`: maps merge key by key, anything else (lists too) is replaced,
    which is how Armada's loader merges its config files."""
    # New dicts all the way down, leaves shared: leaves may be pulumi Outputs, which can't be copied.
    merged = {key: deep_merge(value, {}) if isinstance(value, Mapping) else value for key, value in base.items()}
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = deep_merge(value, {}) if isinstance(value, Mapping) else value
    return merged


# --- shared fragments ------------------------------------------------------------------------


def postgres_section(endpoints: Endpoints, database: str) -> dict:
    # The port is always explicit: lookout's and lookoutingester's defaults say 5433 (NOTES O1).
    # user and password come from the environment (secret_env), their defaults are placeholders.
    return {
        "postgres": {
            "connection": {
                "host": endpoints.postgres_host,
                "port": endpoints.postgres_port,
                "dbname": database,
                "sslmode": endpoints.postgres_sslmode,
            }
        }
    }


def pulsar_section(endpoints: Endpoints, topics: Mapping[str, str], rest: bool = False) -> dict:
    """`topics` maps Armada's topic keys (jobsetEventsTopic, ...) to topic names."""
    pulsar: dict = {"URL": endpoints.pulsar_url, **topics}
    if rest and endpoints.pulsar_admin_url is not None:
        pulsar["restURL"] = endpoints.pulsar_admin_url
    return {"pulsar": pulsar}


def redis_section(key: str, endpoints: Endpoints, db: int) -> dict:
    return {key: {"addrs": [endpoints.redis_address], "db": db}}


def _finish(generated: dict, extra: Mapping) -> dict:
    return deep_merge(generated, extra)


# --- one builder per service -----------------------------------------------------------------


def server_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    server = config.server
    generated = {
        "grpcPort": SERVER_PORTS["grpc"],
        "httpPort": SERVER_PORTS["http"],
        "metricsPort": SERVER_PORTS["metrics"],
        # The default file has no auth and the server refuses to start without one (G4). The
        # users and passwords are in the credentials file (components/armada/auth.py).
        "auth": {"anonymousAuth": config.auth.anonymous, "permissionGroupMapping": config.auth.server_mapping()},
        # G1: without forceNoTls the client turns TLS on for any non-localhost address.
        # With armada.workers the scheduler serves TLS, to this stack's clients too.
        "schedulerApiConnection": {
            "armadaUrl": endpoints.grpc_address(SCHEDULER, SCHEDULER_PORTS["grpc"]),
            "forceNoTls": not endpoints.scheduler_tls,
        },
        # G7: the same Redis and db as the event ingester's `redis`.
        **redis_section("eventsApiRedis", endpoints, config.redis_db),
        # Queues, deduplication and retry policies live in the lookout database (NOTES §3.1).
        **postgres_section(endpoints, config.databases.lookout),
        **pulsar_section(
            endpoints,
            {
                "jobsetEventsTopic": config.topics.events,
                "controlPlaneEventsTopic": config.topics.control_plane,
            },
        ),
    }
    if config.lookout.public_url:
        generated["corsAllowedOrigins"] = [config.lookout.public_url]
    # Accept exactly the classes the scheduler and the cluster know; maps merge, so the default's
    # other classes (armada-resilient) must be switched off explicitly.
    generated["submission"] = {
        "allowedPriorityClassNames": {
            name: name in config.priority_classes
            for name in dict.fromkeys([*UPSTREAM_SUBMISSION_CLASSES, *config.priority_classes])
        }
    }
    return _finish(generated, server.extra)


SCHEDULER_LEASE = "armada-scheduler"
"""The Lease the schedulers elect their leader with (the default file's `leader.leaseLockName`)."""
LEADER_IDENTITY_ENV = "ARMADA_LEADER_PODNAME"
"""`leader.podName`: each scheduler's identity in the Lease (the override file has the key)."""
LEASE_TIMING = {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s"}
"""The default file's values, written out: client-go requires leaseDuration > renewDeadline >
1.2 x retryPeriod (tools/leaderelection/leaderelection.go NewLeaderElector). A new leader takes
over at most leaseDuration after the old one stops renewing."""


def leader_election(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    """The scheduler's `leader` section. One replica stays standalone (the default file's mode:
    the process is always the leader, v0.22.7 internal/leaderelection/leader.go
    StandaloneLeaderController) and the section is left out. More replicas elect a leader through
    a Lease in the Armada namespace (KubernetesLeaderController: client-go LeaseLock, which gets,
    creates and updates that one Lease); only the leader schedules, every replica serves the
    executor API from the database.

    A non-leader proxies scheduling-report calls to the leader at `leaderConnection.armadaUrl`
    with `<name>` replaced by the Lease holder's identity (leader_client.go getClientByName). A
    Deployment's pod names resolve in no DNS (only pods with spec.hostname and a headless
    subdomain, i.e. StatefulSets', get records), so the identity is the pod's IP
    (LEADER_IDENTITY_ENV from status.podIP, unique among running pods) and the URL dials it
    directly; the brackets make an IPv6 address valid and are accepted around IPv4 too (grpc.Dial's
    passthrough target goes to Go's net.Dial, which splits it with net.SplitHostPort). Plaintext
    and basic auth as every in-cluster connection (G1; the user is in the credentials file)."""
    if config.scheduler.replicas == 1:
        return {}
    return {
        "leader": {
            "mode": "kubernetes",
            "leaseLockName": SCHEDULER_LEASE,
            "leaseLockNamespace": endpoints.namespace,
            **LEASE_TIMING,
            # A placeholder, so ARMADA_LEADER_PODNAME overrides a key of this file whatever the
            # image's default file holds (Viper applies an env var only to a key it has; NOTES §2).
            "podName": "",
            "leaderConnection": {"armadaUrl": f"[<name>]:{SCHEDULER_PORTS['grpc']}", "forceNoTls": True},
        }
    }


def leader_identity_env() -> dict:
    """The scheduler's Lease identity: its pod IP, through the downward API (see leader_election)."""
    return {"name": LEADER_IDENTITY_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def scheduler_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    scheduler = config.scheduler
    generated = {
        "grpc": {"port": SCHEDULER_PORTS["grpc"]},
        "http": {"port": SCHEDULER_PORTS["http"]},
        "metrics": {"port": SCHEDULER_PORTS["metrics"]},
        # G4: executors lease jobs only with execute_jobs. Only the platform's own users (the
        # server, the executors; credentials file) call the scheduler, so never anonymously.
        "auth": {"anonymousAuth": False, "permissionGroupMapping": config.auth.scheduler_mapping()},
        "armadaApi": {"armadaUrl": endpoints.grpc_address(SERVER, SERVER_PORTS["grpc"]), "forceNoTls": True},
        **postgres_section(endpoints, config.databases.scheduler),
        **pulsar_section(endpoints, {"jobsetEventsTopic": config.topics.events}),
        "scheduling": {
            # G5: every executor's pool is one of these (checked in settings.py), the pools of
            # the executors on other clusters (armada.workers) included.
            "pools": [{"name": pool} for pool in config.scheduled_pools],
            "executorUpdateFrequency": EXECUTOR_UPDATE_FREQUENCY,
            # The same numbers become the Kubernetes PriorityClasses (priority_classes.py).
            "priorityClasses": {
                name: {"priority": pc.priority, "preemptible": pc.preemptible}
                for name, pc in config.priority_classes.items()
            },
        },
        **leader_election(config, endpoints),
    }
    if endpoints.scheduler_tls_secret is not None:
        # Executors of other clusters connect: the one gRPC listener serves TLS (v0.22.7
        # internal/common/grpc/grpc.go setupTls; the files are re-read every minute by
        # internal/common/certs/cached_certificate.go, so a renewed certificate needs no restart).
        generated["grpc"]["tls"] = {
            "enabled": True, "certPath": f"{CERT_DIR}/tls.crt", "keyPath": f"{CERT_DIR}/tls.key",
        }
    return _finish(generated, scheduler.extra)


def scheduler_ingester_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    generated = {
        # G6: the default file's `metrics.port` is not a key of this service; `metricsPort` is.
        "metricsPort": SCHEDULER_INGESTER_PORTS["metrics"],
        **postgres_section(endpoints, config.databases.scheduler),
        **pulsar_section(
            endpoints,
            {
                "jobsetEventsTopic": config.topics.events,
                "controlPlaneEventsTopic": config.topics.control_plane,
            },
            rest=True,
        ),
    }
    return _finish(generated, config.scheduler_ingester.extra)


def executor_config(config: ArmadaConfig, executor: ExecutorSettings, endpoints: Endpoints) -> dict:
    generated = {
        "httpPort": EXECUTOR_PORTS["http"],
        "metric": {"port": EXECUTOR_PORTS["metrics"]},
        "application": {"clusterId": executor.cluster_id or executor.name, "pool": executor.pool},
        # Executors talk to the scheduler, not the server (NOTES §3.1); G1 again: plaintext only
        # in the cluster to a scheduler without TLS, never to another cluster's.
        "executorApiConnection": {
            "armadaUrl": endpoints.scheduler_grpc_address(),
            "forceNoTls": not endpoints.scheduler_tls,
        },
    }
    return _finish(generated, executor.extra)


def lookout_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    lookout = config.lookout
    ui: dict = {
        # The browser calls the server's REST API directly (e.g. the queue list), so an in-cluster
        # name would never resolve; unset means the port-forward the docs use.
        "armadaApiBaseUrl": config.server.public_rest_url or LOCAL_SERVER_REST_URL,
        "customTitle": lookout.title,
    }
    if config.binoculars.enabled:
        ui["binocularsBaseUrlPattern"] = config.binoculars.public_url or endpoints.http_url(
            BINOCULARS, BINOCULARS_PORTS["http"]
        )
    generated = {
        "apiPort": LOOKOUT_PORTS["http"],
        "metricsPort": LOOKOUT_PORTS["metrics"],
        **postgres_section(endpoints, config.databases.lookout),
        "uiConfig": ui,
    }
    if lookout.public_url:
        generated["corsAllowedOrigins"] = [lookout.public_url]
    return _finish(generated, lookout.extra)


def lookout_ingester_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    generated = {
        "metricsPort": LOOKOUT_INGESTER_PORTS["metrics"],
        **postgres_section(endpoints, config.databases.lookout),
        **pulsar_section(endpoints, {"jobsetEventsTopic": config.topics.events}, rest=True),
    }
    return _finish(generated, config.lookout_ingester.extra)


def event_ingester_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    generated = {
        "metricsPort": EVENT_INGESTER_PORTS["metrics"],
        # G7: the server reads events from this same Redis and db.
        **redis_section("redis", endpoints, config.redis_db),
        **pulsar_section(endpoints, {"jobsetEventsTopic": config.topics.events}, rest=True),
    }
    return _finish(generated, config.event_ingester.extra)


def binoculars_config(config: ArmadaConfig, endpoints: Endpoints) -> dict:
    generated = {
        "grpcPort": BINOCULARS_PORTS["grpc"],
        "httpPort": BINOCULARS_PORTS["http"],
        "metricsPort": BINOCULARS_PORTS["metrics"],
        # Its default is anonymous; the users are in the credentials file. No permission mapping:
        # nobody may cordon nodes through it (it has no RBAC to, components/armada/cluster.py).
        "auth": {"anonymousAuth": config.auth.anonymous},
    }
    if config.lookout.public_url:
        generated["corsAllowedOrigins"] = [config.lookout.public_url]
    return _finish(generated, config.binoculars.extra)


# --- secrets as environment ------------------------------------------------------------------


def postgres_env(endpoints: Endpoints) -> list[dict]:
    return [
        secret_env("ARMADA_POSTGRES_CONNECTION_USER", endpoints.postgres_secret, "username"),
        secret_env("ARMADA_POSTGRES_CONNECTION_PASSWORD", endpoints.postgres_secret, "password"),
    ]


def redis_env(key: str, endpoints: Endpoints) -> list[dict]:
    """`key` is the config section (`eventsApiRedis` on the server, `redis` on the event ingester)."""
    if endpoints.redis_secret is None:
        return []
    return [secret_env(f"ARMADA_{key.upper()}_PASSWORD", endpoints.redis_secret, endpoints.redis_password_key)]


def go_memory_limit_env() -> dict:
    """GOMEMLIMIT from the container's memory limit, as Helm and the operator set it."""
    return {
        "name": "GOMEMLIMIT",
        "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}},
    }


def env_key_path(name: str) -> str:
    """`ARMADA_POSTGRES_CONNECTION_PASSWORD` -> `postgres_connection_password` (Viper's rule:
    the prefix is dropped, nesting is `_`, matching is case-insensitive)."""
    return name.removeprefix("ARMADA_").lower()


def key_paths(config: Mapping, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path of a nested config, leaves and inner maps (list items are not descended)."""
    paths: set[tuple[str, ...]] = set()
    for key, value in config.items():
        path = prefix + (str(key),)
        paths.add(path)
        if isinstance(value, Mapping):
            paths |= key_paths(value, path)
    return paths


def env_overrides_existing_key(name: str, merged: Mapping) -> bool:
    """Whether an `ARMADA_*` variable names a key present in `merged` (else Viper ignores it)."""
    wanted = env_key_path(name)
    return any("_".join(path).lower() == wanted for path in key_paths(merged))


def armadactl_config(context: str, api_address: str, tls: bool = False) -> dict:
    """`.armadactl.yaml` (reference _local/.armadactl.yaml). In-cluster the API is plaintext
    gRPC, which the client must be told (G1); a public address is assumed to be TLS."""
    details: dict = {"armadaUrl": api_address}
    if not tls:
        details["forceNoTls"] = True
    return {"currentContext": context, "contexts": {context: details}}

