"""PostgreSQL for the platform: a managed single-server StatefulSet, or an external server.

Both modes give callers the same thing: `host`, `port` and a Secret (`secret_name`) in the
caller's namespace with keys `username`, `password` and `database`; and, when asked, extra
databases created by an idempotent Job (Armada needs `scheduler` and `lookout`).

- managed: the official `postgres` image (alpine, uid 70) with PGDATA on a PersistentVolumeClaim,
  a generated password (kept with the data: components/kept_secret.py), a headless Service for the
  StatefulSet and a client Service.
- external: `host`/`port` from config; the credentials are copied from an existing Secret named in
  config (any namespace), because the namespaces that use them are created by this same program.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Literal, Optional

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from components import k8s as kb
from components import network
from components.kept_secret import Cluster, KeptSecret, KeptSecretArgs
from components.model import ConfigModel, DnsLabel, check_mode_keys
from components.component import Component
from infra import versions

PORT = 5432
UID = 70
"""The `postgres` user of the official alpine image."""

IDENTIFIER = r"^[a-z_][a-z0-9_]{0,62}$"
"""A PostgreSQL identifier we never need to quote."""

SECRET_KEYS = ("username", "password", "database")

REPLACE_UNREADY = {"pulumi.com/replaceUnready": "true"}
"""Annotation of the setup Jobs. pulumi-kubernetes awaits a Job until it succeeds, and an `up` in
which it failed leaves it in the state as created; without this annotation every later `up`
waits on that same failed Job again. With it, the provider's Diff reads the live Job and, when
it is not complete, plans a replacement (delete, then create: the name is fixed), so the next
`up` simply runs it again (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go `Diff`,
`metadata.ReplaceUnready` -> `checkjob.NewJobChecker().Ready`; supported for Jobs only)."""

DEFAULT_RESOURCES = kb.Resources(cpu_request="50m", memory_request="128Mi", cpu_limit="1", memory_limit="512Mi")
"""A developer-cluster server (shared_buffers is 128MB by default; tests/test_cluster_fit.py);
docs/cloudstate.md "Sizing" has prod sizes."""


class SecretRef(ConfigModel):
    """An existing Secret (with keys `username` and `password`) in any namespace."""

    namespace: DnsLabel
    """Namespace of the Secret."""
    name: DnsLabel
    """Name of the Secret."""


class PostgresSettings(ConfigModel):
    """How a PostgreSQL server runs (stack config). `managed` deploys one; `external` uses yours."""

    mode: Literal["managed", "external"] = "managed"
    """`managed`: this stack runs the server; `external`: it uses yours at `host` (with `credentialsSecret`)."""
    database: str = Field(default="cloudstate", pattern=IDENTIFIER)
    """Database the credentials Secret names (created by the managed server, or by the Job)."""
    username: str = Field(default="cloudstate", pattern=IDENTIFIER)
    """managed: the owner role (its password is generated). external: taken from the Secret."""
    storage: kb.Storage = kb.Storage()
    """managed: the data volume."""
    resources: kb.Resources = DEFAULT_RESOURCES
    """managed: the server's requests and limits."""
    host: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9]([-.A-Za-z0-9]*[A-Za-z0-9])?$")
    """external: the server's DNS name or IP."""
    port: int = Field(default=PORT, ge=1, le=65535)
    """external: the server's port (managed always listens on 5432)."""
    credentials_secret: Optional[SecretRef] = None
    """external: the Secret holding `username` and `password` of a role that owns the databases."""
    create_databases: bool = True
    """external: create missing databases with a Job (the role needs CREATEDB); false if they exist."""
    cidrs: network.Cidrs = []
    """external: the server's addresses as CIDRs, the only ones its clients' NetworkPolicies allow;
    required unless `host` is an in-cluster Service (`<service>.<namespace>.svc`)."""
    allow_any_address: bool = False
    """external: opt in to letting its clients connect to ANY address on its port (instead of `cidrs`)."""

    @model_validator(mode="after")
    def _mode_fields(self) -> "PostgresSettings":
        check_mode_keys(
            self,
            self.mode,
            only={"managed": ("username", "storage", "resources"),
                  "external": ("host", "port", "credentials_secret", "create_databases", "cidrs", "allow_any_address")},
            required={"external": {
                "host": "the server's host name",
                "credentials_secret": "an existing Secret with keys username and password: {namespace: <ns>, name: <secret>}",
            }},
            more=network.server_address_problems([self.host], self.cidrs, self.allow_any_address)
            if self.mode == "external" else (),
        )
        return self


@dataclass(frozen=True)
class PostgresArgs:
    settings: PostgresSettings
    namespace: pulumi.Input[str]
    """Namespace of the server (managed), the credentials Secret and the Job."""
    database: Optional[str] = None
    """Overrides `settings.database` (e.g. one database per project on a shared external server)."""
    extra_databases: tuple[str, ...] = field(default=())
    """More databases that must exist, owned by the same role."""
    image_mirror: Optional[str] = None
    cluster: Optional[Cluster] = Cluster()
    """managed: where the kept credentials Secret is read back (components/kept_secret.py); None
    when the stack renders to a directory."""


# --- pure builders ---------------------------------------------------------------------------


def databases_to_create(args: PostgresArgs) -> list[str]:
    """Databases the Job creates: the extras, plus the main one on an external server."""
    wanted = list(args.extra_databases)
    if args.settings.mode == "external":
        wanted.insert(0, args.database or args.settings.database)
    seen: list[str] = []
    for name in wanted:
        if name not in seen:
            seen.append(name)
    return seen


def create_databases_script(databases: list[str]) -> str:
    """psql input that creates each database unless it exists (idempotent; \\gexec runs the
    generated statement only when the SELECT returns a row)."""
    lines = []
    for name in databases:
        lines.append(
            f"SELECT 'CREATE DATABASE {name}' WHERE NOT EXISTS "
            f"(SELECT FROM pg_database WHERE datname = '{name}')\\gexec"
        )
    return "\n".join(lines) + "\n"


def credential_env(secret: str) -> list[dict]:
    """libpq's variables, from the credentials Secret."""
    return [
        kb.secret_env("PGUSER", secret, "username"),
        kb.secret_env("PGPASSWORD", secret, "password"),
        kb.secret_env("PGDATABASE", secret, "database"),
    ]


def data_directory(image: str) -> str:
    """PGDATA for the pinned image: one directory per major on the data volume. A PostgreSQL data
    directory is readable only by its own major, so a major upgrade (docs/upgrades.md, acknowledged
    in infra/store_versions.py) starts the new server on an empty directory beside the old one,
    which stays as it was for a rollback. The first major keeps the name it always had."""
    major = versions.tag_major(image)
    first = versions.STORE_MAJORS_BEFORE_RECORDS["postgres"]
    return "/var/lib/postgresql/data/pgdata" if major == first else f"/var/lib/postgresql/data/pgdata-{major}"


def server_pod_spec(name: str, secret: str, image: str, settings: PostgresSettings) -> dict:
    ready = ["sh", "-c", f'pg_isready -h 127.0.0.1 -p {PORT} -U "$POSTGRES_USER" -d "$POSTGRES_DB"']
    return {
        "securityContext": kb.pod_security(UID, UID, fs_group=UID),
        # The server never calls the Kubernetes API: no token in its pod.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [
            {
                "name": "postgres",
                "image": image,
                "ports": [{"name": "postgres", "containerPort": PORT}],
                "env": [
                    kb.secret_env("POSTGRES_USER", secret, "username"),
                    kb.secret_env("POSTGRES_PASSWORD", secret, "password"),
                    kb.secret_env("POSTGRES_DB", secret, "database"),
                    # A subdirectory: the volume's root may hold lost+found, which initdb refuses.
                    {"name": "PGDATA", "value": data_directory(image)},
                ],
                "resources": settings.resources.spec(),
                "securityContext": kb.container_security(read_only_root=True, run_as_user=UID),
                "startupProbe": kb.exec_probe(ready, initial_delay=5, period=5, failures=60),
                "readinessProbe": kb.exec_probe(ready, initial_delay=0, period=10),
                "livenessProbe": kb.exec_probe(ready, initial_delay=0, period=20, failures=6),
                "volumeMounts": [
                    {"name": "data", "mountPath": "/var/lib/postgresql/data"},
                    # Writable paths under a read-only root: the socket directory and temp files.
                    {"name": "run", "mountPath": "/var/run/postgresql"},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
            }
        ],
        "volumes": [
            {"name": "run", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            # The container runtime's 64 MiB /dev/shm is too small for parallel queries.
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}},
        ],
    }


def same_namespace_only(name: str, ports: list[int]) -> dict:
    """NetworkPolicy spec: the server's pods accept connections only from pods of their own
    namespace (its clients, its setup Job and, for Cassandra, the other nodes)."""
    return network.same_namespace_ingress(kb.selector_labels(name), ports)


def server_endpoint(name: str, settings: PostgresSettings) -> network.Endpoint:
    """What clients connect to: the managed server's pods in their own namespace (the server
    admits no other), or the external host."""
    if settings.mode == "managed":
        return network.Endpoint(ports=(PORT,), peers=(network.pods(kb.selector_labels(name)),))
    return network.host_endpoint(settings.host, settings.port, settings.cidrs, settings.allow_any_address)


def client_egress_spec(client: str, endpoint: network.Endpoint) -> dict:
    """NetworkPolicy spec: pods named `client` (a setup Job) may connect to `endpoint`, nothing else."""
    return network.spec({"matchLabels": kb.selector_labels(client)}, egress_rules=[network.to(endpoint)])


KEEP_CLAIMS = {"whenDeleted": "Retain", "whenScaled": "Retain"}
"""A StatefulSet's data volumes outlive it and its scale-downs (the Kubernetes default, stated)."""


def volume_claim(storage: kb.Storage) -> dict:
    """The `data` volumeClaimTemplate of a StatefulSet."""
    return {"metadata": {"name": "data"}, "spec": storage.claim_spec()}


def create_databases_job_spec(name: str, secret: str, host: str, port: int, image: str, databases: list[str]) -> dict:
    script = create_databases_script(databases)
    return {
        "backoffLimit": 10,
        "template": {
            "metadata": {"labels": kb.labels(f"{name}-databases", "database-setup")},
            "spec": {
                "restartPolicy": "OnFailure",
                "securityContext": kb.pod_security(UID, UID),
                "automountServiceAccountToken": False,  # psql only: no API calls
                "enableServiceLinks": False,
                "containers": [
                    {
                        "name": "create-databases",
                        "image": image,
                        "command": ["sh", "-c"],
                        # Waits for the server (a new managed server takes a while), then runs the script.
                        # psql connects to the maintenance database `postgres`: PGDATABASE may be one the
                        # script is about to create (external servers), and connecting to it would fail.
                        "args": [
                            f"until pg_isready -h {host} -p {port}; do sleep 2; done\n"
                            f"psql -v ON_ERROR_STOP=1 -h {host} -p {port} -d postgres <<'SQL'\n{script}SQL\n"
                        ],
                        "env": credential_env(secret),
                        "resources": kb.Resources(
                            cpu_request="50m", memory_request="32Mi", cpu_limit="200m", memory_limit="128Mi"
                        ).spec(),
                        "securityContext": kb.container_security(read_only_root=True, run_as_user=UID),
                    }
                ],
            },
        },
    }


# --- component -------------------------------------------------------------------------------


class Postgres(Component):
    """Outputs: `host` (Output[str]), `port` (int), `secret_name` (Output[str], keys username,
    password, database), `service_name` (str; managed only, else None), `database` (str),
    `databases` (list[str]: the main one and the extras),
    `ready` (resources to depend on before using the server and its databases), `endpoint`
    (network.Endpoint: what clients' egress policies allow), `policies` (the server's
    NetworkPolicy admitting its clients: a client's Job depends on it and on its own egress policy,
    so its first attempt is not refused)."""

    def __init__(self, name: str, args: PostgresArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:stores:Postgres", name, None, opts)
        settings = args.settings
        child = self.child_opts()
        image = versions.image("postgres", args.image_mirror)
        self.database = args.database or settings.database
        # Every database the server holds for its clients (what a backup dumps).
        self.databases: list[str] = list(dict.fromkeys([self.database, *args.extra_databases]))
        secret_name = f"{name}-credentials"
        encoded_database = base64.b64encode(self.database.encode()).decode()
        self.ready: list[pulumi.Resource] = []
        self.policies: list[pulumi.Resource] = []
        self.endpoint = server_endpoint(name, settings)

        if settings.mode == "managed":
            # The password the kept data directory was initialised with, when the Secret is still there.
            kept = KeptSecret(f"{name}-credentials-values",
                              KeptSecretArgs(args.namespace, secret_name, {"password": 32}, args.cluster), child)
            secret = k8s.core.v1.Secret(
                f"{name}-credentials",
                metadata=kb.metadata(secret_name, args.namespace, "database"),
                type="Opaque",
                string_data={"username": settings.username, "password": kept.value("password"), "database": self.database},
                # Kept with the data volume (which outlives the StatefulSet): without it the kept
                # data could not be read (docs/cloudstate.md, "What is kept").
                opts=self.child_opts(retain_on_delete=True),
            )
            self.service_name: Optional[str] = name
            ports = [{"name": "postgres", "port": PORT, "targetPort": "postgres"}]
            headless = k8s.core.v1.Service(
                f"{name}-headless",
                metadata=kb.metadata(f"{name}-headless", args.namespace, "database"),
                spec={
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": kb.selector_labels(name),
                    "ports": ports,
                },
                opts=child,
            )
            service = k8s.core.v1.Service(
                f"{name}-service",
                metadata=kb.metadata(name, args.namespace, "database"),
                spec={
                    "type": "ClusterIP",
                    "selector": kb.selector_labels(name),
                    "ports": ports,
                },
                opts=child,
            )
            statefulset = k8s.apps.v1.StatefulSet(
                f"{name}-statefulset",
                metadata=kb.metadata(name, args.namespace, "database"),
                spec={
                    "serviceName": f"{name}-headless",
                    # One primary; PostgreSQL replication is out of scope here.
                    "replicas": 1,
                    "selector": {"matchLabels": kb.selector_labels(name)},
                    "template": {
                        "metadata": {"labels": kb.labels(name, "database")},
                        "spec": server_pod_spec(name, secret_name, image, settings),
                    },
                    "volumeClaimTemplates": [volume_claim(settings.storage)],
                    "persistentVolumeClaimRetentionPolicy": KEEP_CLAIMS,
                },
                opts=self.child_opts(depends_on=[secret, headless]),
            )
            self.policies.append(k8s.networking.v1.NetworkPolicy(
                f"{name}-network-policy",
                metadata=kb.metadata(name, args.namespace, "database"),
                spec=same_namespace_only(name, [PORT]),
                opts=child,
            ))
            self.host = pulumi.Output.from_input(args.namespace).apply(lambda ns: kb.service_dns(name, ns))
            self.port = PORT
            self.ready += [secret, service, statefulset]
        else:
            ref = settings.credentials_secret
            source = k8s.core.v1.Secret.get(f"{name}-source", f"{ref.namespace}/{ref.name}", opts=child)
            source_data = pulumi.Output.secret(source.data)
            secret = k8s.core.v1.Secret(
                f"{name}-credentials",
                metadata=kb.metadata(secret_name, args.namespace, "database"),
                type="Opaque",
                data=source_data.apply(
                    lambda data: {
                        "username": secret_value(data, "username", ref),
                        "password": secret_value(data, "password", ref),
                        "database": encoded_database,
                    }
                ),
                opts=child,
            )
            self.service_name = None
            self.host = pulumi.Output.from_input(settings.host)
            self.port = settings.port
            self.ready.append(secret)

        self.secret_name: pulumi.Output[str] = secret.metadata.name
        databases = databases_to_create(args)
        if databases and (settings.mode == "managed" or settings.create_databases):
            host = settings.host if settings.mode == "external" else f"{name}"
            egress = k8s.networking.v1.NetworkPolicy(
                f"{name}-databases-network-policy",
                metadata=kb.metadata(f"{name}-databases", args.namespace, "database-setup"),
                spec=client_egress_spec(f"{name}-databases", self.endpoint),
                opts=child,
            )
            # A Job's pod created before the policies that admit it has its connection refused
            # (default deny) and its first attempt fails: it waits for its egress and the server's ingress.
            job = k8s.batch.v1.Job(
                f"{name}-databases",
                metadata=kb.metadata(
                    f"{name}-databases", args.namespace, "database-setup", annotations=dict(REPLACE_UNREADY)
                ),
                spec=create_databases_job_spec(name, secret_name, host, self.port, image, databases),
                opts=self.child_opts(depends_on=[*self.ready, *self.policies, egress], delete_before_replace=True),
            )
            self.ready.append(job)

        self.register_outputs(
            {"host": self.host, "port": self.port, "secretName": self.secret_name, "database": self.database}
        )


def secret_value(data: Optional[dict], key: str, ref: SecretRef) -> str:
    """One (base64) value of a copied Secret, or a clear error naming the Secret and key."""
    if not data or key not in data:
        raise ValueError(f"Secret {ref.namespace}/{ref.name} has no key '{key}' (needs username and password)")
    return data[key]
