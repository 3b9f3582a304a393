"""Typed settings of the Armada installation (stack key `cloudstation:platform.armada`).

Each service has its own settings model; `ArmadaConfig` composes them with the dependencies
(PostgreSQL, Redis, Pulsar: their models live beside their components) and the queues.
Cross-field rules (executor pools must be scheduler pools, G5 in armada/NOTES.md) are checked
here so a bad stack file fails before any resource is registered.
"""
from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from components.k8s import Resources
from components.postgres import IDENTIFIER as POSTGRES_IDENTIFIER, PostgresSettings
from components.model import NOT_SHOWN, ConfigModel, DnsLabel, ShortDnsLabel, check_mode_keys, problem, problems, unique_names
from components.network import Cidrs, Port, Sources, check_server_addresses, cidr_list, open_problem
from components.armada.queue import ProjectQueueSettings, QueueApiSettings, QueueArgs
from components.pulsar import PulsarSettings
from components.redis import RedisSettings
from infra.credentials import plain_credentials

DNS_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

CRON = r"^(@(hourly|daily|weekly|monthly|yearly|annually|midnight)|(\S+\s+){4}\S+)$"
"""A Kubernetes CronJob schedule: five fields or one of the @ macros."""

# Defaults are sized for a developer's cluster (the whole Armada of Pulumi.test.yaml, with its
# PostgreSQL, Redis and Pulsar, requests at most 1 CPU and 2.5 GiB; tests/test_armada_fit.py):
# requests are what an idle Go service uses, limits leave room to start and to burst (GOMEMLIMIT
# follows the memory limit). Upstream Helm's 200m/512Mi -> 300m/1Gi per service (NOTES §12) is
# the prod-size example in docs/armada.md.
SERVICE_RESOURCES = Resources(cpu_request="25m", memory_request="64Mi", cpu_limit="500m", memory_limit="256Mi")
"""Default of the small services: ingesters, Lookout, binoculars."""
SERVER_RESOURCES = Resources(cpu_request="50m", memory_request="128Mi", cpu_limit="1", memory_limit="512Mi")
SCHEDULER_RESOURCES = Resources(cpu_request="100m", memory_request="192Mi", cpu_limit="1", memory_limit="1Gi")
"""The scheduler keeps the queued and running jobs in memory."""
EXECUTOR_RESOURCES = Resources(cpu_request="50m", memory_request="96Mi", cpu_limit="500m", memory_limit="512Mi")
"""The executor caches the cluster's nodes and its job pods."""

POSTGRES_RESOURCES = Resources(cpu_request="50m", memory_request="128Mi", cpu_limit="1", memory_limit="512Mi")
"""Armada's managed PostgreSQL (two small databases; shared_buffers is 128MB by default)."""

JOB_RESOURCES = Resources(cpu_request="25m", memory_request="64Mi", cpu_limit="500m", memory_limit="256Mi")
"""Migration Jobs and pruning CronJobs (upstream Helm: 100m/128Mi -> 200m/256Mi)."""


EXTRA_CREDENTIALS = (
    "Armada's credentials come from Secrets only: PostgreSQL's from platform.armada.postgres (managed: generated; "
    "external: credentialsSecret), Redis's from platform.armada.redis (managed: generated; external: existingSecret), "
    "API users' from platform.armada.auth.users (generated). Setting it with `pulumi config set --secret --path` "
    "does not help: the program would still write it into the ConfigMap"
)
"""Where a credential found in `extra` belongs instead."""


class ServiceSettings(ConfigModel):
    """What every Armada service has: replicas, resources and a free-form config override."""

    replicas: int = Field(default=1, ge=1, le=10)
    """Pods of the service. More than 1 adds a PodDisruptionBudget (one pod evicted at a time)
    and spreads the pods over nodes (docs/armada.md, "High availability")."""
    resources: Resources = SERVICE_RESOURCES
    """Requests and limits (default 25m/64Mi -> 500m/256Mi; docs/armada.md has prod sizes)."""
    extra: dict[str, Any] = {}
    """Deep-merged over the generated override config (Armada's own camelCase keys). Rendered into the
    service's ConfigMap, so it holds no credential: a literal under a credential's name (password, secret,
    token, credential, private/API/access key…, any case, any depth) or a credential-looking value is refused."""

    @field_validator("extra")
    @classmethod
    def _no_credentials(cls, extra: dict[str, Any]) -> dict[str, Any]:
        # A ConfigMap is readable by whoever may read ConfigMaps of the namespace; Armada's own
        # credentials reach it from Secrets (components/armada/config.py). Never echo the value.
        found = [problem(f"{what}, and `extra` is rendered into the service's ConfigMap (readable by whoever may read "
                         f"ConfigMaps there): remove it. {EXTRA_CREDENTIALS}",
                         path, NOT_SHOWN) for path, what in plain_credentials(extra)]
        if found:
            raise problems(found)
        return extra


class PruningSettings(ConfigModel):
    """A database pruning CronJob."""

    enabled: bool = True
    """Run the database pruner as a CronJob on `schedule` (it deletes finished jobs past their expiry)."""
    schedule: str = Field(default="@hourly", pattern=CRON)
    """CronJob schedule (five fields or @hourly/@daily/...)."""


class ServerSettings(ServiceSettings):
    """The Armada API server (gRPC 50051, REST 8080)."""

    resources: Resources = SERVER_RESOURCES
    """Requests and limits (default 50m/128Mi -> 1/512Mi)."""
    public_rest_url: Optional[str] = Field(default=None, pattern=r"^https?://[^\s/]+(/\S*)?$")
    """The server's REST URL as users' browsers reach it (Lookout calls it from the browser);
    unset means `http://localhost:8080`, a port-forward of the server's Service."""
    public_grpc_address: Optional[str] = Field(default=None, pattern=r"^[^\s/:]+:[0-9]{1,5}$")
    """`host:port` of the gRPC API as users reach it, for the armadactl config output."""


class SchedulerSettings(ServiceSettings):
    """The scheduler; `pools` are the pools it schedules (every executor's pool must be one)."""

    replicas: int = Field(default=1, ge=1, le=3)
    """1 runs standalone (`leader.mode: standalone`, Recreate rollouts); 2 or 3 elect a leader
    through a Lease (`leader.mode: kubernetes`, with a Role on that one Lease) and roll one pod at
    a time. Every replica keeps the job database in memory, so each costs its full `resources`."""
    resources: Resources = SCHEDULER_RESOURCES
    """Requests and limits (default 100m/192Mi -> 1/1Gi)."""
    pools: list[DnsLabel] = Field(default=["default"], min_length=1)
    """Pools the scheduler schedules; every executor's pool must be one of them (G5)."""
    pruning: PruningSettings = PruningSettings()
    restrict_grpc: bool = True
    """Only the server and the executors may connect to the scheduler's gRPC API (they also
    authenticate, with generated users); false admits any source to it."""
    expire_after: str = Field(default="2h", pattern=r"^[0-9]+(s|m|h)$")
    """Pruner: how long finished jobs are kept in the scheduler database."""

    @field_validator("extra")
    @classmethod
    def _leader_follows_replicas(cls, extra: dict[str, Any]) -> dict[str, Any]:
        # Standalone with two replicas would run two leaders; kubernetes mode with one has no Lease RBAC.
        found, value = _config_value(extra, ("leader",))
        if value is not None:
            raise problem(
                "the scheduler's leader election follows `replicas` (1: standalone; more: a Lease with its "
                "Role, docs/armada.md 'High availability'); remove `leader`", f".{found[0]}", value,
            )
        return extra


class ExecutorSettings(ServiceSettings):
    """One executor: leases jobs of its pool from the scheduler and runs them as pods.

    It runs in the stack's cluster (the stack's Kubernetes provider); jobs go to the namespaces
    they are submitted to (create them with `jobNamespaces`)."""

    name: ShortDnsLabel
    """Executor (cluster) id, unique; also the Kubernetes name suffix `armada-executor-<name>`."""
    pool: DnsLabel = "default"
    """The pool this executor's nodes belong to; must be one of the scheduler's pools."""
    cluster_id: Optional[DnsLabel] = None
    """Armada's `application.clusterId`; unset means `name`."""
    replicas: int = 1
    """Only 1: the cluster id is the executor's identity at the scheduler; add an entry
    per cluster instead."""
    resources: Resources = EXECUTOR_RESOURCES
    """Requests and limits (default 50m/96Mi -> 500m/512Mi)."""

    @field_validator("replicas")
    @classmethod
    def _one(cls, value: int) -> int:
        if value != 1:
            raise problem(
                "must be 1: an executor's cluster id is its identity at the scheduler, and two pods with one "
                "id would both be leased the same job runs; scale out with one "
                "`executors` entry per cluster instead"
            )
        return value


class LookoutSettings(ServiceSettings):
    """The Lookout UI and its REST API (port 10000)."""

    pruning: PruningSettings = PruningSettings()
    public_url: Optional[str] = Field(default=None, pattern=r"^https?://[^\s/]+$")
    """Lookout's origin as users' browsers reach it (scheme://host[:port]); allowed as a CORS
    origin on the server. Unset means the in-cluster address."""
    title: str = "CloudStation"
    """Title shown in the Lookout UI."""


class BinocularsSettings(ServiceSettings):
    """Binoculars (job logs and node cordon for Lookout); optional."""

    enabled: bool = False
    """Install Binoculars (Lookout then shows job logs)."""
    public_url: Optional[str] = Field(default=None, pattern=r"^https?://\S+$")
    """Binoculars' URL as browsers reach it (may contain `{CLUSTER_ID}`); unset = in-cluster."""


PERMISSIONS = (
    "submit_any_jobs", "cancel_any_jobs", "preempt_any_jobs", "reprioritize_any_jobs", "watch_all_events",
    "create_queue", "delete_queue", "cordon_queue", "cordon_nodes", "execute_jobs", "update_executor_settings",
    "create_retry_policy", "update_retry_policy", "delete_retry_policy",
)
"""Armada's permissions (armada/NOTES.md §9)."""

EVERYONE = "everyone"
"""The group Armada puts every principal in, the anonymous one and the platform's own users
included (v0.22.7 internal/common/auth/common.go, NewStaticPrincipal)."""

EXECUTOR_PASSWORD_KEY = "armadaExecutorPassword"
"""Secret config key of an executor-only stack: its executor's password at the main scheduler."""

ADMINS = "armada-admins"
"""The group of the generated `admin` user; the default permission mapping grants it everything."""
PLATFORM_PREFIX = "cloudstation-"
"""Users and groups the program generates for Armada's own services (components/armada/auth.py)."""
USER_NAME = r"^[a-z][a-z0-9]{0,30}$"
"""Armada reads its config through Viper, which lowercases map keys (basic-auth user names)."""
GROUP_NAME = r"^[A-Za-z0-9][-A-Za-z0-9_.:@/]{0,127}$"

SERVER_PERMISSIONS = tuple(p for p in PERMISSIONS if p != "execute_jobs")
"""What the server checks (execute_jobs is the scheduler's, for executors)."""
EXECUTORS = f"{PLATFORM_PREFIX}executors"
"""The group of the generated executor users: `execute_jobs` on the scheduler, nothing else."""
QUEUE_MANAGERS = f"{PLATFORM_PREFIX}queue-managers"
"""The group of the user `pulumi up` manages queues as: create_queue and delete_queue only."""
QUEUE_MANAGER_PERMISSIONS = ("create_queue", "delete_queue")
"""UpdateQueue checks create_queue (v0.22.7 internal/server/queue/queue_service.go); reading
queues needs no permission."""


class UserSettings(ConfigModel):
    """A basic-auth user of the Armada API besides `admin`; its password is generated into the
    Secret `armada-user-<name>` (keys username, password, armadactl.yaml)."""

    name: str = Field(pattern=USER_NAME)
    """Lowercase letters and digits (Armada lowercases user names)."""
    groups: list[str] = []
    """Groups the user is in: what `permissionGroupMapping` and queues' `groupOwners` name."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == "admin":
            raise problem("is the generated administrator; pick another name")
        return value

    @field_validator("groups")
    @classmethod
    def _no_platform_groups(cls, groups: list[str]) -> list[str]:
        return [_user_group(group, f"[{index}]") for index, group in enumerate(groups)]


def _user_group(group: str, where: str = "") -> str:
    """A group a stack file may name: not `everyone` (every principal, the platform's own users
    included, is in it) nor a group of the platform's own users."""
    if group == EVERYONE:
        raise problem(
            "every principal is in group 'everyone', the platform's own service users included (and anyone "
            "unauthenticated when anonymous is on); name the group of the users you mean, e.g. armada-admins",
            where, group,
        )
    if group.startswith(PLATFORM_PREFIX):
        raise problem(f"groups starting with '{PLATFORM_PREFIX}' belong to the platform's own service users", where, group)
    if not re.match(GROUP_NAME, group):
        raise problem("must be a group name: letters, digits and -_.:@/", where, group)
    return group


class AuthSettings(ConfigModel):
    """Who may use the Armada API (server, and binoculars when enabled). The scheduler only
    accepts the platform's own users (the server, the executors)."""

    anonymous: bool = False
    """Accept unauthenticated calls as principal `anonymous` (group `everyone`) on the server and
    binoculars. Off by default; refused together with a public address (`server.publicRestUrl`,
    `server.publicGrpcAddress`, `binoculars.publicUrl`) or any `userAccess` source."""
    permission_group_mapping: dict[str, list[str]] = {permission: [ADMINS] for permission in SERVER_PERMISSIONS}
    """Server permissions -> groups allowed them (default: everything to `armada-admins`, the
    generated `admin` user's group). The platform's queue-management user always gets
    create_queue and delete_queue on top."""
    users: list[UserSettings] = []
    """Basic-auth users besides the generated `admin` (each gets a generated password)."""
    executor_groups: list[str] = []
    """Extra groups allowed `execute_jobs` on the scheduler, e.g. executors of other clusters
    that authenticate with OIDC; this stack's executors always may (their generated users)."""

    @field_validator("permission_group_mapping")
    @classmethod
    def _known_permissions(cls, mapping: dict[str, list[str]]) -> dict[str, list[str]]:
        for permission, groups in mapping.items():
            if permission not in SERVER_PERMISSIONS:
                raise problem(
                    f"unknown server permission; allowed: {', '.join(SERVER_PERMISSIONS)}", f".{permission}", permission
                )
            for index, group in enumerate(groups):
                _user_group(group, f".{permission}[{index}]")
        return mapping

    @field_validator("executor_groups")
    @classmethod
    def _executor_groups(cls, groups: list[str]) -> list[str]:
        return [_user_group(group, f"[{index}]") for index, group in enumerate(groups)]

    @field_validator("users")
    @classmethod
    def _unique_users(cls, users: list[UserSettings]) -> list[UserSettings]:
        return unique_names(users, "user")

    def server_mapping(self) -> dict[str, list[str]]:
        """The server's permissionGroupMapping: the configured one plus the queue manager's."""
        mapping = {permission: list(groups) for permission, groups in self.permission_group_mapping.items()}
        for permission in QUEUE_MANAGER_PERMISSIONS:
            mapping[permission] = [*mapping.get(permission, []), QUEUE_MANAGERS]
        return mapping

    def scheduler_mapping(self) -> dict[str, list[str]]:
        """The scheduler's: execute_jobs for this stack's executors (and `executorGroups`)."""
        return {"execute_jobs": [EXECUTORS, *self.executor_groups]}


class PriorityClassSettings(ConfigModel):
    priority: int = Field(ge=0, le=1_000_000_000)
    """Both the scheduler's priority and the Kubernetes PriorityClass value."""
    preemptible: bool
    """Whether the scheduler may preempt jobs of this class for higher-priority ones."""


class DatabaseNames(ConfigModel):
    """PostgreSQL databases; distinct names let stacks share an external server."""

    scheduler: str = Field(default="scheduler", pattern=POSTGRES_IDENTIFIER)
    """Database of the scheduler and its ingester."""
    lookout: str = Field(default="lookout", pattern=POSTGRES_IDENTIFIER)
    """Database of Lookout and its ingester."""


class PulsarTopics(ConfigModel):
    """Pulsar topics (short names resolve to persistent://public/default/<name>)."""

    events: DnsLabel = "events"
    """Topic of job events (the server publishes, the ingesters consume)."""
    control_plane: DnsLabel = "control-plane"
    """Topic of control-plane events (executor settings, preempt or cancel on an executor or queue)."""


SCHEDULER_GRPC_PORT = 50052
"""The scheduler's gRPC port (components/armada/config.py SCHEDULER_PORTS), the default of the
port remote executors reach it on."""
HOST = r"^([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$"
"""A DNS name or an IPv4 address (what a certificate names and a client dials)."""
ADDRESS = r"^(?P<host>[A-Za-z0-9][-A-Za-z0-9.]*[A-Za-z0-9]):(?P<port>[0-9]{1,5})$"


def _no_localhost(host: str, where: str, value: str) -> None:
    # Armada's client turns TLS off for any address that contains "localhost" (v0.22.7
    # pkg/client/connection.go transportCredentials: !ForceNoTls && !strings.Contains(ArmadaUrl,
    # "localhost")), so such an address would carry the executor's password in plaintext.
    if "localhost" in host.lower():
        raise problem(
            "Armada's client never uses TLS for an address containing 'localhost' (pkg/client/connection.go), "
            "and credentials must not cross clusters in plaintext; use the name the certificate is for",
            where, value,
        )


WORKER_ADDRESSES = "list the addresses the workers' executors connect from (their clusters' egress NAT or nodes)"
WorkerCidrs = cidr_list(WORKER_ADDRESSES)
"""A worker's source addresses: no opt-in opens the exposed executor API to everyone."""


class WorkerSettings(ConfigModel):
    """An executor on another cluster (its own stack, `armada.mode: executor-only`) that this
    stack's scheduler accepts: a generated user, its pool, and where it connects from."""

    name: ShortDnsLabel
    """The worker stack's executor name (its `executors[0].name`); its user at the scheduler is
    `cloudstation-executor-<name>`, its password in the Secret `armada-worker-<name>`."""
    pool: DnsLabel
    """The worker's pool (its `executors[0].pool`); the scheduler schedules it (added to
    `scheduler.pools`)."""
    cluster_id: Optional[DnsLabel] = None
    """The worker's `application.clusterId` (its `executors[0].clusterId`); unset means `name`.
    Distinct from every other executor's."""
    cidrs: WorkerCidrs = Field(min_length=1)
    """The addresses the worker's executor connects from, as the scheduler's pods see them (the
    worker cluster's egress NAT or node addresses); the only sources admitted to the exposed
    executor API besides this cluster's own clients."""

    @property
    def id(self) -> str:
        return self.cluster_id or self.name


class ExecutorApiSettings(ConfigModel):
    """The scheduler's executor API exposed to the executors of `workers`: a Service of type
    LoadBalancer or NodePort, TLS from a Secret, a NetworkPolicy admitting only the workers' CIDRs."""

    host: str = Field(pattern=HOST, max_length=253)
    """The DNS name (or IPv4 address) the workers dial; the certificate must name it."""
    port: Port = SCHEDULER_GRPC_PORT
    """The Service's port (LoadBalancer)."""
    service_type: Literal["LoadBalancer", "NodePort"] = "LoadBalancer"
    """How the Service is reached from the other clusters. Both keep the client's address
    (`externalTrafficPolicy: Local`), so the NetworkPolicy sees the workers' CIDRs."""
    node_port: Optional[int] = Field(default=None, ge=30000, le=32767)
    """With `serviceType: NodePort`: the node port (unset: Kubernetes picks one)."""
    tls_secret: DnsLabel
    """A Secret in the Armada namespace with `tls.crt`, `tls.key` and `ca.crt` (cert-manager's
    Certificate writes exactly these; docs/armada.md "Worker clusters"). The certificate must name
    `host` and the scheduler's in-cluster name `armada-scheduler.<namespace>.svc`: with workers
    the scheduler serves TLS to every client, this cluster's server and executors too, which
    trust `ca.crt`."""

    @field_validator("host")
    @classmethod
    def _tls_host(cls, host: str) -> str:
        _no_localhost(host, "", host)
        return host

    @model_validator(mode="after")
    def _node_port_only(self) -> "ExecutorApiSettings":
        if self.node_port is not None and self.service_type != "NodePort":
            raise problem("only with serviceType: NodePort", ".nodePort", self.node_port)
        return self


class RemoteSchedulerSettings(ConfigModel):
    """The main stack's scheduler, as an executor-only stack's executor reaches it (over TLS,
    with the password of the secret config key `armadaExecutorPassword`)."""

    address: str = Field(pattern=ADDRESS)
    """`host:port` of the main stack's exposed executor API (its `armada.executorApi.host` and
    `port`, or a node's address and the node port)."""
    cidrs: Cidrs = []
    """The addresses `address` resolves to: the executor's NetworkPolicy allows only these."""
    allow_any_address: bool = False
    """Opt in to letting the executor connect to ANY address on the port (instead of `cidrs`)."""
    ca_certificate: Optional[str] = Field(default=None, pattern=r"^\s*-----BEGIN CERTIFICATE-----[\s\S]+-----END CERTIFICATE-----\s*$")
    """PEM CA bundle the scheduler's certificate is checked against (the main stack's
    `executorApi.tlsSecret` `ca.crt`); the executor then trusts only it."""
    ca_secret: Optional[DnsLabel] = None
    """Instead of `caCertificate`: a Secret in the Armada namespace whose `ca.crt` is the bundle.
    With neither, the image's public CAs are trusted."""
    main_stack: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """The main stack, when its stack file (`Pulumi.<mainStack>.yaml`) is beside this one: this
    stack's executor, pool, cluster id, address and PriorityClasses are then checked against its
    `armada.workers` entry and `executorApi` before anything is deployed (infra/armada_workers.py)."""

    @field_validator("address")
    @classmethod
    def _port_range(cls, address: str) -> str:
        host, _, port = address.rpartition(":")
        if not 1 <= int(port) <= 65535:
            raise problem("the port must be 1 to 65535")
        _no_localhost(host, "", address)
        return address

    @model_validator(mode="after")
    def _one_ca_and_addresses(self) -> "RemoteSchedulerSettings":
        if self.ca_certificate is not None and self.ca_secret is not None:
            raise problem("set caCertificate or caSecret, not both", ".caSecret", self.ca_secret)
        check_server_addresses([self.host], self.cidrs, self.allow_any_address)
        return self

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


EXECUTOR_ONLY_KEYS = ("remote_scheduler",)
"""What only an executor-only stack sets."""
FULL_ONLY_KEYS = (
    "server", "scheduler", "scheduler_ingester", "lookout", "lookout_ingester", "event_ingester", "binoculars",
    "job_resources", "auth", "user_access", "databases", "topics", "redis_db", "postgres", "postgres_ssl_mode",
    "redis", "pulsar", "queues", "project_queue", "queue_api", "workers", "executor_api",
)
"""What an executor-only stack does not run, so may not configure: every service but the executor,
Armada's stores, queues (managed through the main stack's server) and users."""


class ArmadaConfig(ConfigModel):
    """The Armada batch scheduler and its services."""

    enabled: bool = True
    """Install Armada. One Armada per cluster (an executor deletes the pods of any other Armada's
    jobs in its cluster): only a stack with `ownsClusterResources: true` may."""
    mode: Literal["full", "executor-only"] = "full"
    """`full`: every Armada service with its stores; `executor-only`: only an executor (with its
    job namespaces, RBAC, PriorityClasses and policies) that leases jobs from another stack's
    scheduler (`remoteScheduler`) over TLS: a worker cluster (docs/armada.md "Worker clusters")."""
    remote_scheduler: Optional[RemoteSchedulerSettings] = None
    """executor-only: the main stack's scheduler (address, its CIDRs, the CA)."""
    workers: list[WorkerSettings] = []
    """full: executors on other clusters this scheduler accepts (each a stack of its own with
    `mode: executor-only`); needs `executorApi`."""
    executor_api: Optional[ExecutorApiSettings] = None
    """full: how the `workers` reach the scheduler (Service type, TLS Secret, host)."""
    namespace: DnsLabel = "armada"
    """Namespace of the Armada services."""
    job_namespaces: list[DnsLabel] = Field(default=["armada-jobs"], min_length=1)
    """Namespaces created for Armada jobs (the executors run pods there). Never the Armada namespace,
    the platform namespace, `<platform namespace>-state`, a project's `<project>-test` or
    `<project>-prod`, an `extraWatchedNamespaces` entry, `default` or `kube-*` (a job pod may mount the
    Secrets of its namespace; infra/config.py)."""
    server: ServerSettings = ServerSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    scheduler_ingester: ServiceSettings = ServiceSettings()
    executors: list[ExecutorSettings] = Field(default=[ExecutorSettings(name="default")], min_length=1)
    """One executor per worker cluster / pool."""
    lookout: LookoutSettings = LookoutSettings()
    lookout_ingester: ServiceSettings = ServiceSettings()
    event_ingester: ServiceSettings = ServiceSettings()
    binoculars: BinocularsSettings = BinocularsSettings()
    job_resources: Resources = JOB_RESOURCES
    """Resources of the migration Jobs and the pruning CronJobs."""
    job_namespace_pod_security: Literal["restricted", "baseline"] = "restricted"
    """Pod Security Standard enforced in `jobNamespaces` (jobs are users' pods)."""
    job_service_account: DnsLabel = "default"
    """The only service account job pods may run as (an admission policy refuses any other);
    created in every job namespace unless it is `default`. It is granted nothing."""
    auth: AuthSettings = AuthSettings()
    user_access: Sources = Sources()
    """Who may connect over the network to the user-facing ports (server gRPC and REST, Lookout,
    Binoculars): `namespaces` (e.g. your Ingress controller's), `cidrs` (LoadBalancer clients) or
    `allowAnySource: true`. None by default: `kubectl port-forward` needs no rule."""
    priority_classes: dict[str, PriorityClassSettings] = {
        # Armada's scheduler defaults (config/scheduler/config.yaml).
        "armada-default": PriorityClassSettings(priority=1000, preemptible=False),
        "armada-preemptible": PriorityClassSettings(priority=1000, preemptible=True),
    }
    """Scheduler priority classes; each also becomes a Kubernetes PriorityClass."""
    databases: DatabaseNames = DatabaseNames()
    topics: PulsarTopics = PulsarTopics()
    redis_db: int = Field(default=1, ge=0, le=15)
    """Redis database of the job-set events (server eventsApiRedis = event ingester redis)."""
    postgres: PostgresSettings = PostgresSettings(username="armada", database="lookout", resources=POSTGRES_RESOURCES)
    """PostgreSQL of the `scheduler` and `lookout` databases: `managed` or `external`
    (components/postgres.py); its Job creates both databases. Managed default: 50m/128Mi -> 1/512Mi."""
    postgres_ssl_mode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "disable"
    """libpq `sslmode` of the services' PostgreSQL connections (e.g. `require` for a cloud database)."""
    redis: RedisSettings = RedisSettings()
    """Redis of the job-set events: `managed` (one instance) or `external` (components/redis.py)."""
    pulsar: PulsarSettings = PulsarSettings()
    """Pulsar: `managed` standalone broker (small/test) or `external` cluster (components/pulsar.py)."""
    queues: list[QueueArgs] = []
    """Armada queues managed as Pulumi resources (docs/armada-queues.md)."""
    project_queue: ProjectQueueSettings = ProjectQueueSettings()
    """The build queue `<project>-builds` every CloudStation project gets."""
    queue_api: QueueApiSettings = QueueApiSettings()
    """How `pulumi up` reaches the server's REST API to manage queues."""

    @field_validator("queues")
    @classmethod
    def _unique_queues(cls, queues: list[QueueArgs]) -> list[QueueArgs]:
        return unique_names(queues, "queue")

    # Dependencies (`postgres`, `redis`, `pulsar`) and `queues` are composed here from their
    # components' settings models.

    @field_validator("priority_classes")
    @classmethod
    def _default_class_present(cls, classes: dict[str, PriorityClassSettings]) -> dict[str, PriorityClassSettings]:
        # The scheduler's defaultPriorityClassName and the server's default are armada-default.
        for name in classes:
            if not DNS_NAME.match(name) or len(name) > 63:
                raise problem("must be a Kubernetes PriorityClass name (DNS label)", f".{name}", name)
        if "armada-default" not in classes:
            raise problem(
                "must define armada-default (Armada's default priority class); defined: " + ", ".join(classes)
            )
        return classes

    @field_validator("executors")
    @classmethod
    def _unique_executors(cls, executors: list[ExecutorSettings]) -> list[ExecutorSettings]:
        return unique_names(executors, "executor")

    @model_validator(mode="after")
    def _no_anonymous_exposure(self) -> "ArmadaConfig":
        # Anonymous principals may do whatever `everyone` may; beyond a port-forward (which needs
        # Kubernetes credentials for the Armada namespace) that is anyone on the network. `extra`
        # is deep-merged over the generated config (config.py `_finish`), so its `auth` keys are
        # checked like `auth.anonymous`; Viper matches them in any case and reads "true"/1 as true.
        _no_everyone_in_extra(self)
        if _truthy(_config_value(self.scheduler.extra, ("auth", "anonymousAuth"))[1]):
            found, value = _config_value(self.scheduler.extra, ("auth", "anonymousAuth"))
            raise problem(
                "the scheduler only accepts the platform's own users (the server and the executors, which "
                "authenticate); remove it", f".scheduler.extra.{'.'.join(found)}", value,
            )
        switches = [(".auth.anonymous", True)] if self.auth.anonymous else []
        for where, extra in ((".server.extra", self.server.extra), (".binoculars.extra", self.binoculars.extra)):
            found, value = _config_value(extra, ("auth", "anonymousAuth"))
            if _truthy(value):
                switches.append((f"{where}.{'.'.join(found)}", value))
        if not switches:
            return self
        subpath, switch = switches[0]
        exposed = [
            key for key, value in (
                ("server.publicRestUrl", self.server.public_rest_url),
                ("server.publicGrpcAddress", self.server.public_grpc_address),
                ("binoculars.publicUrl", self.binoculars.public_url if self.binoculars.enabled else None),
                ("userAccess", self.user_access.peers()),
            ) if value
        ]
        if exposed:
            raise problem(
                f"anonymous access is refused while the API is reachable beyond a port-forward ({', '.join(exposed)} "
                "set): set auth.anonymous: false (the default) and log in with the generated admin user "
                "(docs/armada.md, 'Authentication')",
                subpath, switch,
            )
        return self

    @model_validator(mode="after")
    def _queue_groups(self) -> "ArmadaConfig":
        for index, queue in enumerate(self.queues):
            for position, group in enumerate(queue.group_owners):
                _user_group(group, f".queues[{index}].groupOwners[{position}]")
        for position, group in enumerate(self.project_queue.group_owners):
            _user_group(group, f".projectQueue.groupOwners[{position}]")
        return self

    @model_validator(mode="after")
    def _no_extra_kubernetes_privileges(self) -> "ArmadaConfig":
        # The executors' and binoculars' RBAC (components/armada/cluster.py) has no impersonation
        # and no nodes/proxy; these keys would need them. Each service has its own key paths (v0.22.7
        # internal/executor/configuration/types.go KubernetesConfiguration.ImpersonateUsers,
        # MetricConfiguration.ExposeQueueUsageMetrics; internal/binoculars/configuration/types.go
        # BinocularsConfig.ImpersonateUsers, top level), and Viper matches keys in any case.
        executor_needs = {
            ("kubernetes", "impersonateUsers"): "impersonating users (RBAC impersonate)",
            ("metric", "exposeQueueUsageMetrics"): "the kubelet's stats through nodes/proxy",
        }
        binoculars_needs = {("impersonateUsers",): "impersonating users (RBAC impersonate)"}
        extras = [(f".executors[{i}].extra", e.extra, executor_needs) for i, e in enumerate(self.executors)]
        extras.append((".binoculars.extra", self.binoculars.extra, binoculars_needs))
        for where, extra, needs in extras:
            for path, what in needs.items():
                found, value = _config_value(extra, path)
                if value:
                    raise problem(
                        f"needs {what}, which Armada's service account is not granted (least privilege); "
                        "leave it off", f"{where}.{'.'.join(found)}", value,
                    )
        return self

    @model_validator(mode="after")
    def _executor_pools_are_scheduled(self) -> "ArmadaConfig":
        # G5: a pool the scheduler does not list never gets jobs, silently. An executor-only
        # stack's pool is checked against the main stack's workers (tests/test_armada_workers.py).
        if self.mode != "full":
            return self
        pools = self.scheduler.pools
        for index, executor in enumerate(self.executors):
            if executor.pool not in pools:
                raise problem(
                    f"executor '{executor.name}' uses pool '{executor.pool}', which is not a scheduler pool; "
                    f"allowed pools (armada.scheduler.pools): {', '.join(pools)}",
                    subpath=f".executors[{index}].pool",
                    value=executor.pool,
                )
        return self

    @property
    def scheduled_pools(self) -> list[str]:
        """The scheduler's pools: `scheduler.pools` and the workers' pools (G5)."""
        return list(dict.fromkeys([*self.scheduler.pools, *(w.pool for w in self.workers)]))

    @property
    def serves_remote_executors(self) -> bool:
        """Whether the scheduler's gRPC API serves TLS to executors of other clusters."""
        return self.mode == "full" and bool(self.workers)

    @field_validator("workers")
    @classmethod
    def _unique_workers(cls, workers: list[WorkerSettings]) -> list[WorkerSettings]:
        return unique_names(workers, "worker")

    @model_validator(mode="after")
    def _mode_keys(self) -> "ArmadaConfig":
        # A worker stack runs only the executor; what it would ignore is refused, naming the key.
        check_mode_keys(
            self, self.mode, {"full": FULL_ONLY_KEYS, "executor-only": EXECUTOR_ONLY_KEYS},
            {"executor-only": {"remote_scheduler": "the main stack's scheduler (address, cidrs, CA)"}},
        )
        if self.mode == "executor-only" and len(self.executors) != 1:
            raise problem(
                "an executor-only stack runs exactly one executor (its cluster's identity at the main "
                "scheduler, declared there in armada.workers)", ".executors", [e.name for e in self.executors],
            )
        return self

    @model_validator(mode="after")
    def _remote_executor_tls(self, info: ValidationInfo) -> "ArmadaConfig":
        if self.mode != "executor-only":
            return self
        found = []
        extra = self.executors[0].extra
        for path in (("executorApiConnection", "forceNoTls"), ("executorApiConnection", "armadaUrl")):
            keys, value = _config_value(extra, path)
            if value is not None and (path[-1] == "armadaUrl" or _truthy(value)):
                found.append(problem(
                    "the executor of an executor-only stack connects to remoteScheduler.address over TLS only "
                    "(credentials never cross clusters in plaintext); remove it",
                    f".executors[0].extra.{'.'.join(keys)}", value,
                ))
        secrets = (info.context or {}).get("secrets")
        if secrets is not None and EXECUTOR_PASSWORD_KEY not in secrets:
            found.append(problem(
                f"an executor-only stack needs its executor's password at the main scheduler as a secret: "
                f"pulumi config set --secret cloudstation:{EXECUTOR_PASSWORD_KEY} <the main stack's Secret "
                f"armada-worker-{self.executors[0].name}, key password>",
                f" ({EXECUTOR_PASSWORD_KEY})", None,
            ))
        if found:
            raise problems(found)
        return self

    @model_validator(mode="after")
    def _workers(self) -> "ArmadaConfig":
        if self.mode != "full":
            return self
        if self.workers and self.executor_api is None:
            raise problem("workers reach the scheduler through executorApi (host, serviceType, tlsSecret); set it",
                          ".executorApi", None)
        if self.executor_api is not None and not self.workers:
            raise problem("exposes the scheduler to armada.workers, and none is declared; remove it or add workers",
                          ".executorApi", self.executor_api.model_dump(by_alias=True, mode="json"))
        if not self.workers:
            return self
        # Every worker's CIDRs form one rule (and one loadBalancerSourceRanges, components/armada/scheduler.py).
        together = open_problem([c for w in self.workers for c in w.cidrs],
                                f"the workers' cidrs together form that rule; {WORKER_ADDRESSES}", ".workers")
        if together is not None:
            raise together
        local = {e.name for e in self.executors}
        ids: dict[str, str] = {(e.cluster_id or e.name): f"executors[{i}]" for i, e in enumerate(self.executors)}
        for index, worker in enumerate(self.workers):
            if worker.name in local:
                raise problem(
                    f"'{worker.name}' is also a local executor's name; each executor has its own user "
                    "(cloudstation-executor-<name>), so names are unique across executors and workers",
                    f".workers[{index}].name", worker.name,
                )
            if worker.id in ids:
                raise problem(
                    f"cluster id '{worker.id}' is already {ids[worker.id]}'s; two executors with one id would be "
                    "leased the same job runs", f".workers[{index}].clusterId", worker.id,
                )
            ids[worker.id] = f"workers[{index}]"
        if self.scheduler.replicas > 1:
            # With workers the scheduler serves TLS on its one gRPC listener, and a non-leader
            # reaches the leader at its pod IP (config.py leader_election), which no certificate names.
            raise problem(
                "with armada.workers the scheduler serves TLS, and a non-leader would dial the leader at its pod "
                "IP, which the certificate cannot name; run one scheduler replica with workers",
                ".scheduler.replicas", self.scheduler.replicas,
            )
        for path in (("grpc", "tls", "enabled"),):
            keys, value = _config_value(self.scheduler.extra, path)
            if value is not None and not _truthy(value):
                raise problem("with armada.workers the scheduler serves TLS; remove it",
                              f".scheduler.extra.{'.'.join(keys)}", value)
        for where, extra, connection in (
            (".server.extra", self.server.extra, "schedulerApiConnection"),
            *((f".executors[{i}].extra", e.extra, "executorApiConnection") for i, e in enumerate(self.executors)),
        ):
            keys, value = _config_value(extra, (connection, "forceNoTls"))
            if _truthy(value):
                raise problem("with armada.workers the scheduler serves TLS only; remove it",
                              f"{where}.{'.'.join(keys)}", value)
        return self


def _config_value(config: Any, path: tuple[str, ...]) -> tuple[tuple[str, ...], Any]:
    """The value at `path` of an Armada config map, keys matched in any case as Viper does, with
    the keys as written (None when absent)."""
    found: list[str] = []
    for wanted in path:
        if not isinstance(config, dict):
            return tuple(found), None
        key = next((k for k in config if isinstance(k, str) and k.lower() == wanted.lower()), None)
        if key is None:
            return tuple(found), None
        found.append(key)
        config = config[key]
    return tuple(found), config


def _truthy(value: Any) -> bool:
    """Whether Viper reads `value` as a true bool (spf13/cast ToBool: strconv.ParseBool of a
    string, non-zero numbers)."""
    if isinstance(value, str):
        return value.strip() in ("1", "t", "T", "TRUE", "true", "True")
    return bool(value) if isinstance(value, (bool, int, float)) else False


def _no_everyone_in_extra(config: "ArmadaConfig") -> None:
    """No `permissionGroupMapping` in a service's `extra` grants group `everyone` anything (every
    principal, the platform's own users and the anonymous one included, is in it). Lookout too:
    its `auth.anonymousAuth` is upstream's default (true, config/lookout/config.yaml), so whatever
    its mapping grants `everyone` anyone reaching Lookout gets; its anonymous read-only pages stay
    as documented (docs/armada.md, 'Authentication')."""
    for where, extra in (
        (".server.extra", config.server.extra), (".scheduler.extra", config.scheduler.extra),
        (".binoculars.extra", config.binoculars.extra), (".lookout.extra", config.lookout.extra),
    ):
        found, mapping = _config_value(extra, ("auth", "permissionGroupMapping"))
        if not isinstance(mapping, dict):
            continue
        for permission, groups in mapping.items():
            for index, group in enumerate(groups if isinstance(groups, list) else [groups]):
                if group == EVERYONE:
                    _user_group(group, f"{where}.{'.'.join(found)}.{permission}[{index}]")
