"""Apache Cassandra for CloudState's event journal: managed StatefulSet or an external cluster.

Callers get `host` (a contact point), `port` and a Secret `secret_name` with keys `username` and
`password` in their namespace.

- managed: the official `cassandra` image (uid/gid 999) with password authentication switched on,
  a generated login role (a Job creates it with the image's default superuser, then disables that
  superuser), data on PersistentVolumeClaims, a headless Service (gossip, seeds) and a client Service.
- external: contact point from config, credentials copied from an existing Secret named in config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from components import k8s as kb
from components import network
from components.kept_secret import Cluster, KeptSecret, KeptSecretArgs
from components.model import ConfigModel, check_mode_keys
from components.postgres import (
    KEEP_CLAIMS, REPLACE_UNREADY, SecretRef, client_egress_spec, same_namespace_only, secret_value, volume_claim,
)
from components.component import Component
from infra import versions

CQL_PORT = 9042
INTRA_NODE_PORT = 7000
UID = 999
"""The `cassandra` user and group of the official image."""

CONFIG_DIR = "/etc/cassandra"
DEFAULT_RESOURCES = kb.Resources(cpu_request="500m", memory_request="2Gi", cpu_limit="2", memory_limit="2Gi")


class CassandraSettings(ConfigModel):
    """How Cassandra runs (stack config). `managed` deploys a cluster; `external` uses yours."""

    mode: Literal["managed", "external"] = "managed"
    """`managed`: this stack runs Cassandra; `external`: it uses yours at `host` (with `credentialsSecret`)."""
    username: str = Field(default="cloudstate", pattern=r"^[a-z][a-z0-9_]{0,47}$")
    """managed: the login role created for CloudState (its password is generated)."""
    replicas: int = Field(default=1, ge=1, le=9)
    """managed: Cassandra nodes (pod 0 is the seed)."""
    max_heap: str = Field(default="1G", pattern=r"^[0-9]+[MG]$")
    """managed: JVM heap (MAX_HEAP_SIZE); keep it at most half of resources.memoryLimit."""
    storage: kb.Storage = kb.Storage()
    resources: kb.Resources = DEFAULT_RESOURCES
    host: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9]([-.,A-Za-z0-9]*[A-Za-z0-9])?$")
    """external: contact point(s), comma-separated; CQL port 9042 (the CloudState v0.5 store
    schema has no port field)."""
    credentials_secret: Optional[SecretRef] = None
    """external: an existing Secret with keys `username` and `password`."""
    cidrs: network.Cidrs = []
    """external: the server's addresses as CIDRs, the only ones its clients' NetworkPolicies allow;
    required unless `host` is an in-cluster Service (`<service>.<namespace>.svc`)."""
    allow_any_address: bool = False
    """external: opt in to letting its clients connect to ANY address on its port (instead of `cidrs`)."""

    @model_validator(mode="after")
    def _mode_fields(self) -> "CassandraSettings":
        check_mode_keys(
            self,
            self.mode,
            only={"managed": ("username", "replicas", "max_heap", "storage", "resources"),
                  "external": ("host", "credentials_secret", "cidrs", "allow_any_address")},
            required={"external": {
                "host": "the contact point(s) of your cluster",
                "credentials_secret": "an existing Secret with keys username and password: {namespace: <ns>, name: <secret>}",
            }},
            more=network.server_address_problems([self.host], self.cidrs, self.allow_any_address)
            if self.mode == "external" else (),
        )
        return self


@dataclass(frozen=True)
class CassandraArgs:
    settings: CassandraSettings
    namespace: pulumi.Input[str]
    namespace_name: str
    """The namespace as a plain string: seeds are DNS names baked into the pod spec."""
    image_mirror: Optional[str] = None
    cluster: Optional[Cluster] = Cluster()
    """managed: where the kept credentials Secret is read back (postgres.PostgresArgs.cluster)."""


# --- pure builders ---------------------------------------------------------------------------

# Copies the image's configuration into a writable emptyDir (the entrypoint edits cassandra.yaml
# in place, and the root filesystem is read-only) and switches on password authentication, which
# the image's environment variables cannot do. A plain recursive copy: `cp -a` would also try to
# set the emptyDir's own times and mode, which only its owner (root) may, and fail the pod.
CONFIG_SCRIPT = (
    f"cp -R {CONFIG_DIR}/. /config/ && "
    "sed -i -e 's/^authenticator:.*/authenticator: PasswordAuthenticator/' "
    "-e 's/^authorizer:.*/authorizer: CassandraAuthorizer/' /config/cassandra.yaml && "
    "grep -q '^authenticator: PasswordAuthenticator' /config/cassandra.yaml"
)


def seeds(name: str, namespace: str, replicas: int) -> str:
    """Pod 0 (and pod 1 when there are more nodes) of the StatefulSet, by their stable DNS names."""
    count = 1 if replicas == 1 else 2
    return ",".join(f"{name}-{i}.{name}-headless.{namespace}.svc.cluster.local" for i in range(count))


def server_pod_spec(name: str, namespace: str, image: str, settings: CassandraSettings) -> dict:
    security = kb.container_security(read_only_root=True, run_as_user=UID)
    ready = ["sh", "-c", "nodetool statusbinary | grep -q running"]
    mounts = [
        {"name": "data", "mountPath": "/var/lib/cassandra"},
        {"name": "config", "mountPath": CONFIG_DIR},
        {"name": "logs", "mountPath": "/var/log/cassandra"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    return {
        "securityContext": kb.pod_security(UID, UID, fs_group=UID),
        # Cassandra never calls the Kubernetes API (seeds are DNS names): no token in its pod.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "initContainers": [
            {
                "name": "config",
                "image": image,
                "command": ["sh", "-c", CONFIG_SCRIPT],
                "resources": kb.Resources(
                    cpu_request="50m", memory_request="32Mi", cpu_limit="200m", memory_limit="64Mi"
                ).spec(),
                "securityContext": security,
                "volumeMounts": [{"name": "config", "mountPath": "/config"}],
            }
        ],
        "containers": [
            {
                "name": "cassandra",
                "image": image,
                "ports": [
                    {"name": "cql", "containerPort": CQL_PORT},
                    {"name": "intra-node", "containerPort": INTRA_NODE_PORT},
                ],
                "env": [
                    {"name": "CASSANDRA_CLUSTER_NAME", "value": name},
                    {"name": "CASSANDRA_SEEDS", "value": seeds(name, namespace, settings.replicas)},
                    {"name": "CASSANDRA_ENDPOINT_SNITCH", "value": "GossipingPropertyFileSnitch"},
                    {"name": "MAX_HEAP_SIZE", "value": settings.max_heap},
                    {"name": "HEAP_NEWSIZE", "value": "200M"},
                    # nodetool and cqlsh write history files under $HOME.
                    {"name": "HOME", "value": "/tmp"},
                ],
                "resources": settings.resources.spec(),
                "securityContext": security,
                "startupProbe": kb.tcp_probe(CQL_PORT, initial_delay=30, period=10, failures=60),
                # nodetool starts a JVM; it needs more than the default 5 s.
                "readinessProbe": {**kb.exec_probe(ready, initial_delay=0, period=15), "timeoutSeconds": 20},
                "livenessProbe": kb.tcp_probe(CQL_PORT, initial_delay=0, period=20, failures=6),
                "volumeMounts": mounts,
            }
        ],
        "volumes": [
            {"name": "config", "emptyDir": {}},
            {"name": "logs", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }


def auth_script(host: str) -> str:
    """Creates the login role with the default superuser, then locks that superuser out.
    Idempotent: when the role can log in already it only re-applies the lock-out."""
    cql = f"cqlsh {host} {CQL_PORT} --request-timeout=30"
    return (
        f'until {cql} -u "$CQL_USER" -p "$CQL_PASSWORD" -e "SELECT now() FROM system.local" >/dev/null 2>&1; do\n'
        f'  {cql} -u cassandra -p cassandra -e "CREATE ROLE IF NOT EXISTS $CQL_USER WITH PASSWORD = '
        "'$CQL_PASSWORD' AND SUPERUSER = true AND LOGIN = true\" || sleep 10\n"
        "done\n"
        f'{cql} -u "$CQL_USER" -p "$CQL_PASSWORD" -e "ALTER ROLE cassandra WITH PASSWORD = '
        "'$LOCKOUT_PASSWORD' AND SUPERUSER = false AND LOGIN = false\"\n"
    )


def auth_job_spec(name: str, secret: str, host: str, image: str) -> dict:
    return {
        "backoffLimit": 20,
        "template": {
            "metadata": {"labels": kb.labels(f"{name}-auth", "database-setup")},
            "spec": {
                "restartPolicy": "OnFailure",
                "securityContext": kb.pod_security(UID, UID),
                "automountServiceAccountToken": False,  # cqlsh only: no API calls
                "enableServiceLinks": False,
                "containers": [
                    {
                        "name": "create-role",
                        "image": image,
                        "command": ["bash", "-c", auth_script(host)],
                        "env": [
                            kb.secret_env("CQL_USER", secret, "username"),
                            kb.secret_env("CQL_PASSWORD", secret, "password"),
                            kb.secret_env("LOCKOUT_PASSWORD", secret, "lockout-password"),
                            {"name": "HOME", "value": "/tmp"},
                        ],
                        "resources": kb.Resources(
                            cpu_request="100m", memory_request="128Mi", cpu_limit="500m", memory_limit="256Mi"
                        ).spec(),
                        "securityContext": kb.container_security(read_only_root=True, run_as_user=UID),
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }
                ],
                "volumes": [{"name": "tmp", "emptyDir": {}}],
            },
        },
    }


def server_endpoint(name: str, settings: CassandraSettings) -> network.Endpoint:
    """What clients connect to: the managed nodes in their own namespace, or the external hosts."""
    if settings.mode == "managed":
        return network.Endpoint(ports=(CQL_PORT,), peers=(network.pods(kb.selector_labels(name)),))
    return network.host_endpoint(settings.host, CQL_PORT, settings.cidrs, settings.allow_any_address)


def gossip_egress_spec(name: str) -> dict:
    """NetworkPolicy spec: the nodes reach each other's intra-node port (gossip, streaming)."""
    return network.spec(
        {"matchLabels": kb.selector_labels(name)},
        egress_rules=[network.egress([network.pods(kb.selector_labels(name))], [INTRA_NODE_PORT])],
    )


# --- component -------------------------------------------------------------------------------


class Cassandra(Component):
    """Outputs: `host` (Output[str], contact point), `port` (int), `secret_name` (Output[str],
    keys username, password), `service_name` (managed only), `ready` (resources to wait for),
    `endpoint` (network.Endpoint: what clients' egress policies allow)."""

    def __init__(self, name: str, args: CassandraArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:stores:Cassandra", name, None, opts)
        settings = args.settings
        child = self.child_opts()
        image = versions.image("cassandra", args.image_mirror)
        secret_name = f"{name}-credentials"
        self.port = CQL_PORT
        self.ready: list[pulumi.Resource] = []
        self.endpoint = server_endpoint(name, settings)

        if settings.mode == "managed":
            # The roles the kept system_auth holds were made with these, when the Secret is still there.
            kept = KeptSecret(f"{name}-credentials-values", KeptSecretArgs(
                args.namespace, secret_name, {"password": 32, "lockout-password": 32}, args.cluster), child)
            secret = k8s.core.v1.Secret(
                f"{name}-credentials",
                metadata=kb.metadata(secret_name, args.namespace, "database"),
                type="Opaque",
                string_data={
                    "username": settings.username,
                    "password": kept.value("password"),
                    # The default superuser's new password, never used again.
                    "lockout-password": kept.value("lockout-password"),
                },
                # Kept with the data volumes, which outlive the StatefulSet (postgres.py).
                opts=self.child_opts(retain_on_delete=True),
            )
            ports = [{"name": "cql", "port": CQL_PORT, "targetPort": "cql"}]
            headless = k8s.core.v1.Service(
                f"{name}-headless",
                metadata=kb.metadata(f"{name}-headless", args.namespace, "database"),
                spec={
                    "clusterIP": "None",
                    # Seeds must resolve before they are ready, or the first node never starts.
                    "publishNotReadyAddresses": True,
                    "selector": kb.selector_labels(name),
                    "ports": [*ports, {"name": "intra-node", "port": INTRA_NODE_PORT, "targetPort": "intra-node"}],
                },
                opts=child,
            )
            service = k8s.core.v1.Service(
                f"{name}-service",
                metadata=kb.metadata(name, args.namespace, "database"),
                spec={"type": "ClusterIP", "selector": kb.selector_labels(name), "ports": ports},
                opts=child,
            )
            statefulset = k8s.apps.v1.StatefulSet(
                f"{name}-statefulset",
                metadata=kb.metadata(name, args.namespace, "database"),
                spec={
                    "serviceName": f"{name}-headless",
                    "replicas": settings.replicas,
                    "podManagementPolicy": "OrderedReady",
                    "selector": {"matchLabels": kb.selector_labels(name)},
                    "template": {
                        "metadata": {"labels": kb.labels(name, "database")},
                        "spec": {
                            **server_pod_spec(name, args.namespace_name, image, settings),
                            # Nodes on different Kubernetes nodes when the cluster has them.
                            **({"topologySpreadConstraints": kb.spread_over_nodes(kb.selector_labels(name))}
                               if settings.replicas > 1 else {}),
                        },
                    },
                    "volumeClaimTemplates": [volume_claim(settings.storage)],
                    "persistentVolumeClaimRetentionPolicy": KEEP_CLAIMS,
                },
                opts=self.child_opts(depends_on=[headless]),
            )
            if settings.replicas > 1:
                # One Cassandra node down at a time for drains and upgrades (components/k8s.py).
                k8s.policy.v1.PodDisruptionBudget(
                    f"{name}-pdb", **kb.disruption_budget(name, args.namespace, "database", kb.selector_labels(name)),
                    opts=child,
                )
            server_policy = k8s.networking.v1.NetworkPolicy(
                f"{name}-network-policy",
                metadata=kb.metadata(name, args.namespace, "database"),
                spec=same_namespace_only(name, [CQL_PORT, INTRA_NODE_PORT]),
                opts=child,
            )
            k8s.networking.v1.NetworkPolicy(
                f"{name}-gossip-network-policy",
                metadata=kb.metadata(f"{name}-gossip", args.namespace, "database"),
                spec=gossip_egress_spec(name),
                opts=child,
            )
            auth_policy = k8s.networking.v1.NetworkPolicy(
                f"{name}-auth-network-policy",
                metadata=kb.metadata(f"{name}-auth", args.namespace, "database-setup"),
                spec=client_egress_spec(f"{name}-auth", self.endpoint),
                opts=child,
            )
            job = k8s.batch.v1.Job(
                f"{name}-auth",
                # A failed run is replaced on the next `up` instead of awaited again (postgres.REPLACE_UNREADY).
                metadata=kb.metadata(f"{name}-auth", args.namespace, "database-setup", annotations=dict(REPLACE_UNREADY)),
                spec=auth_job_spec(name, secret_name, name, image),
                # Its pod starts once the policies admitting its connection exist (else refused, default deny).
                opts=self.child_opts(
                    depends_on=[secret, service, statefulset, server_policy, auth_policy], delete_before_replace=True
                ),
            )
            self.service_name: Optional[str] = name
            self.host = pulumi.Output.from_input(args.namespace).apply(lambda ns: kb.service_dns(name, ns))
            self.ready += [secret, service, statefulset, job]
        else:
            ref = settings.credentials_secret
            source = k8s.core.v1.Secret.get(f"{name}-source", f"{ref.namespace}/{ref.name}", opts=child)
            secret = k8s.core.v1.Secret(
                f"{name}-credentials",
                metadata=kb.metadata(secret_name, args.namespace, "database"),
                type="Opaque",
                data=pulumi.Output.secret(source.data).apply(
                    lambda data: {"username": secret_value(data, "username", ref), "password": secret_value(data, "password", ref)}
                ),
                opts=child,
            )
            self.service_name = None
            self.host = pulumi.Output.from_input(settings.host)
            self.ready.append(secret)

        self.secret_name: pulumi.Output[str] = secret.metadata.name
        self.register_outputs({"host": self.host, "port": self.port, "secretName": self.secret_name})
