"""Redis for Armada's job-set events: one managed instance, or an existing one.

Armada keeps only events in Redis (queues live in PostgreSQL), and the server's `eventsApiRedis`
and the event ingester's `redis` must be the same instance and db (armada/NOTES.md §3.1, G7).
A single Redis is the least-risk managed choice; use `external` for an HA/Sentinel install.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
from pydantic import Field, model_validator

from components import k8s as kube
from components import network
from components.model import ConfigModel, check_mode_keys
from components.pulsar import mebibytes
from components.component import Component
from infra.versions import image

COMPONENT = "redis"
UID = 999
"""The `redis` user of the official image (bookworm: `useradd -u 999`; alpine: `adduser -u 999`)."""
GID = 1000
"""Any non-root group: Redis writes only /data, which fsGroup makes the group's (the alpine image's
`redis` group is 1000, the bookworm image's 999; infra/versions.py pins the bookworm one)."""
DATA_DIR = "/data"
CONFIG_DIR = "/etc/redis"
CONFIG_KEY = "redis.conf"
PASSWORD_KEY = "password"
SECRET_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MAX_MEMORY_FRACTION = 0.7
"""Share of the container's memory limit Redis may fill with data (`maxmemory`)."""


class RedisSettings(ConfigModel):
    """Redis (stack key `platform.armada.redis`): `managed` runs one instance with a volume,
    `external` points at an existing one whose password is in an existing Secret."""

    mode: Literal["managed", "external"] = "managed"
    """`managed`: this stack runs Redis; `external`: Armada uses yours at `host`."""
    port: int = Field(default=6379, ge=1, le=65535)
    """Port the managed Redis listens on, or the external Redis's port."""
    resources: kube.Resources = kube.Resources(
        cpu_request="25m", memory_request="64Mi", cpu_limit="500m", memory_limit="256Mi"
    )
    """managed: requests and limits of the Redis container (`maxmemory` is 70% of the limit).
    The default suits a developer's cluster; docs/armada.md has a prod size."""
    storage: kube.Storage = kube.Storage(size="2Gi")
    """managed: the data volume (append-only file and snapshots)."""
    append_only: bool = True
    """managed: also log every write (AOF), so a restart loses at most one second of events."""
    host: Optional[str] = Field(default=None, pattern=r"^[^\s:/]+$")
    """external: host name or IP of the Redis server, without the port (required for external)."""
    existing_secret: Optional[str] = Field(default=None, pattern=SECRET_NAME)
    """external: Secret in the Armada namespace that holds the Redis password (required for external)."""
    password_key: str = PASSWORD_KEY
    """external: key of the password in `existingSecret`."""
    cidrs: network.Cidrs = []
    """external: the server's addresses as CIDRs, the only ones its clients' NetworkPolicies allow;
    required unless `host` is an in-cluster Service (`<service>.<namespace>.svc`)."""
    allow_any_address: bool = False
    """external: opt in to letting its clients connect to ANY address on its port (instead of `cidrs`)."""

    @model_validator(mode="after")
    def _mode_fields(self) -> "RedisSettings":
        check_mode_keys(
            self,
            self.mode,
            only={"managed": ("resources", "storage", "append_only"),
                  "external": ("host", "existing_secret", "password_key", "cidrs", "allow_any_address")},
            required={"external": {"host": "the Redis to use", "existing_secret": "the Secret with its password"}},
            more=network.server_address_problems([self.host], self.cidrs, self.allow_any_address)
            if self.mode == "external" else (),
        )
        return self


@dataclass(frozen=True)
class RedisArgs:
    """What the Redis component needs: its settings and where to run."""

    settings: RedisSettings
    namespace: pulumi.Input[str]
    image_mirror: Optional[str] = None


def max_memory_bytes(memory_limit: str) -> int:
    """Redis's `maxmemory` for a container memory limit: room is left for the copy-on-write pages
    of the forked AOF rewrite / snapshot and for allocator overhead."""
    return int(mebibytes(memory_limit) * MAX_MEMORY_FRACTION) * 2**20


def redis_conf(port: int, password: str, append_only: bool, memory_limit: str) -> str:
    """The server config file. It holds the password, so it lives in a Secret, never in args."""
    lines = [
        f"port {port}",
        f"dir {DATA_DIR}",
        f"appendonly {'yes' if append_only else 'no'}",
        # Armada's event streams must not be evicted; a full Redis fails writes loudly instead.
        # Without maxmemory it never is "full": it grows until the kernel OOM-kills it, and replaying
        # the AOF on restart brings it back to the same size (a crash loop).
        f"maxmemory {max_memory_bytes(memory_limit)}",
        "maxmemory-policy noeviction",
        f"requirepass {password}",
    ]
    return "\n".join(lines) + "\n"


def ping_probe(port: int, initial_delay: int, failures: int) -> dict:
    # redis-cli reads the password from REDISCLI_AUTH (set from the Secret), so it is not in the
    # probe's command line; grep because redis-cli exits 0 on an error reply such as NOAUTH.
    return kube.exec_probe(
        ["sh", "-c", f"redis-cli -p {port} ping | grep -q PONG"], initial_delay=initial_delay, failures=failures
    )


def statefulset_spec(name: str, settings: RedisSettings, image_ref: str, secret_name: str) -> dict:
    """The managed Redis StatefulSet's spec (pure, so tests check it without mocks)."""
    container = {
        "name": "redis",
        "image": image_ref,
        # The image's entrypoint only drops privileges when started as root; as uid 999 it execs this.
        "args": ["redis-server", f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "ports": [{"name": "redis", "containerPort": settings.port}],
        "env": [kube.secret_env("REDISCLI_AUTH", secret_name, PASSWORD_KEY)],
        "resources": settings.resources.spec(),
        "securityContext": kube.container_security(read_only_root=True),
        "readinessProbe": ping_probe(settings.port, initial_delay=5, failures=3),
        "livenessProbe": ping_probe(settings.port, initial_delay=20, failures=5),
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
    }
    claim = {"metadata": {"name": "data", "labels": kube.selector_labels(name)}, "spec": settings.storage.claim_spec()}
    return {
        "serviceName": name,
        "replicas": 1,
        "selector": {"matchLabels": kube.selector_labels(name)},
        "template": {
            "metadata": {"labels": kube.labels(name, COMPONENT)},
            "spec": {
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": {
                    **kube.pod_security(UID, GID, fs_group=GID),
                    "fsGroupChangePolicy": "OnRootMismatch",
                },
                "containers": [container],
                "volumes": [
                    {
                        "name": "config",
                        "secret": {
                            "secretName": secret_name,
                            "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
                            "defaultMode": 0o440,
                        },
                    }
                ],
            },
        },
        "volumeClaimTemplates": [claim],
    }


class Redis(Component):
    """Outputs: `host` (in-cluster DNS name), `port` (int), `secret_name` (Secret whose key
    `password_key` holds the password; `password` for a managed Redis), `endpoint`
    (network.Endpoint: what clients' egress policies allow)."""

    host: pulumi.Output[str]
    port: int
    secret_name: pulumi.Output[str]
    password_key: str

    def __init__(self, name: str, args: RedisArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Redis", name, None, opts)
        settings = args.settings
        self.port = settings.port
        if settings.mode == "external":
            self.host = pulumi.Output.from_input(settings.host)
            self.secret_name = pulumi.Output.from_input(settings.existing_secret)
            self.password_key = settings.password_key
            self.endpoint = network.host_endpoint(settings.host, settings.port, settings.cidrs, settings.allow_any_address)
        else:
            self._managed(name, args)
        self.register_outputs({"host": self.host, "port": self.port, "secretName": self.secret_name})

    def _managed(self, name: str, args: RedisArgs) -> None:
        settings = args.settings
        child = self.child_opts()
        # A RandomPassword, not a KeptSecret (components/kept_secret.py): Redis takes its password from
        # this Secret at every start and keeps none in its data, so the Secret is not kept and a stack
        # deployed again may generate a new one.
        password = random.RandomPassword(f"{name}-password", length=32, special=False, opts=child)
        secret = k8s.core.v1.Secret(
            f"{name}-secret",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            type="Opaque",
            string_data={
                PASSWORD_KEY: password.result,
                CONFIG_KEY: password.result.apply(
                    lambda p: redis_conf(settings.port, p, settings.append_only, settings.resources.memory_limit)
                ),
            },
            opts=child,
        )
        # Headless: the StatefulSet's governing Service; with one replica its name is also the
        # address clients use.
        service = k8s.core.v1.Service(
            f"{name}-svc",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            spec={
                "clusterIP": "None",
                "selector": kube.selector_labels(name),
                "ports": [{"name": "redis", "port": settings.port, "targetPort": "redis"}],
            },
            opts=child,
        )
        k8s.apps.v1.StatefulSet(
            f"{name}-sts",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            spec=statefulset_spec(name, settings, image("redis", args.image_mirror), name),
            opts=self.child_opts(depends_on=[secret, service]),
        )
        self.host = pulumi.Output.all(service.metadata.name, service.metadata.namespace).apply(
            lambda parts: kube.service_dns(parts[0], parts[1])
        )
        self.secret_name = secret.metadata.name
        self.password_key = PASSWORD_KEY
        # Clients in the namespace only (the Armada services); they allow their own egress.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            spec=network.same_namespace_ingress(kube.selector_labels(name), [settings.port]),
            opts=child,
        )
        self.endpoint = network.Endpoint(ports=(settings.port,), peers=(network.pods(kube.selector_labels(name)),))
