"""Pulsar for Armada: one standalone broker for small and test installs, or an existing cluster.

Armada publishes to `events` and `control-plane` (and `metrics` if enabled) in `public/default` and
relies on topic auto-creation (armada/NOTES.md §3.2, G8), so the managed broker turns it on with
non-partitioned topics, as Armada's own dev/CI stack does (`_local/compose/stack.yaml`).
`bin/pulsar standalone` runs broker, bookie and a RocksDB metadata store in one JVM: no
replication, so prod-size installs point `external` at a real Pulsar cluster.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from components import k8s as kube
from components import network
from components.model import ConfigModel, check_mode_keys, problem
from components.component import Component
from infra.versions import image

COMPONENT = "pulsar"
UID = 10000
"""The image's user (`adduser -u 10000`); its writable dirs are owned by 10000."""
GID = 10001
"""Any group but 0 works for uid 10000 (upstream docker/pulsar/Dockerfile); fsGroup for the volume."""
BROKER_PORT = 6650
ADMIN_PORT = 8080
HOME = "/pulsar"
BROKER_READY_PATH = "/admin/v2/brokers/ready"

# The only paths the standalone broker writes once functions worker and stream storage are off:
# conf/ (apply-config-from-env.py rewrites standalone.conf), data/ (bookie ledgers, RocksDB
# metadata), logs/ (log files and the pid file, PULSAR_PID_DIR) and /tmp (JVM perf data, Netty's
# native libraries). Everything else stays on a read-only root filesystem.
SCRATCH_MOUNTS = {"conf": f"{HOME}/conf", "logs": f"{HOME}/logs", "tmp": "/tmp"}

JVM_SIZE = r"^[0-9]+[mMgG]$"
JVM_OVERHEAD_MIB = 512
"""Memory the JVM uses beyond heap and direct memory (metaspace, threads, RocksDB caches)."""


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity or JVM size (`512m`, `2g`) in MiB."""
    match = re.fullmatch(r"([0-9.]+)([KMGT]i?|[kmgt])?", quantity)
    if not match:
        raise ValueError(f"not a memory quantity: {quantity}")
    number, unit = float(match.group(1)), (match.group(2) or "")
    factor = {"": 1 / 2**20, "K": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20, "T": 1e12 / 2**20,
              "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2,
              "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}[unit]
    return number * factor


class PulsarSettings(ConfigModel):
    """Pulsar (stack key `platform.armada.pulsar`): `managed` runs one standalone broker with a
    volume (small and test installs); `external` uses an existing Pulsar cluster (prod-size)."""

    mode: Literal["managed", "external"] = "managed"
    """`managed`: this stack runs Pulsar standalone; `external`: Armada uses yours at `url`."""
    # The defaults fit a developer's cluster: broker, bookie and metadata store in one JVM with
    # the heap of Pulsar's small-cluster examples plus some (they give broker and bookie 256m each).
    # Standalone sizes the bookie's write and read-ahead caches from the direct memory
    # (apache/pulsar PulsarStandalone.calculateCacheSize: direct / 2 instances / 4 each, 32 MB here).
    resources: kube.Resources = kube.Resources(
        cpu_request="250m", memory_request="1Gi", cpu_limit="1", memory_limit="1152Mi"
    )
    """managed: requests and limits of the broker container (the JVM sizes below must fit)."""
    heap: str = Field(default="384m", pattern=JVM_SIZE)
    """managed: JVM heap (-Xms/-Xmx), e.g. `384m`, `1g`."""
    direct_memory: str = Field(default="256m", pattern=JVM_SIZE)
    """managed: JVM direct memory (-XX:MaxDirectMemorySize) for Netty and BookKeeper buffers."""
    storage: kube.Storage = kube.Storage(size="10Gi")
    """managed: the data volume (bookie ledgers and metadata)."""
    url: Optional[str] = Field(default=None, pattern=r"^pulsar(\+ssl)?://[^/\s]+$")
    """external: broker service URL, `pulsar://host:6650` (required for external)."""
    admin_url: Optional[str] = Field(default=None, pattern=r"^https?://[^\s]+$")
    """external: admin (web service) URL, `http://host:8080` (required for external)."""
    cidrs: network.Cidrs = []
    """external: the server's addresses as CIDRs, the only ones its clients' NetworkPolicies allow;
    required unless the URLs' hosts are in-cluster Services (`<service>.<namespace>.svc`)."""
    allow_any_address: bool = False
    """external: opt in to letting its clients connect to ANY address on its port (instead of `cidrs`)."""

    @model_validator(mode="after")
    def _mode_fields(self) -> "PulsarSettings":
        check_mode_keys(
            self,
            self.mode,
            only={"managed": ("resources", "heap", "direct_memory", "storage"),
                  "external": ("url", "admin_url", "cidrs", "allow_any_address")},
            required={"external": {"url": "the Pulsar cluster to use", "admin_url": "its admin (web service) URL"}},
            more=network.server_address_problems([network.url_host(self.url), network.url_host(self.admin_url)],
                                                 self.cidrs, self.allow_any_address)
            if self.mode == "external" else (),
        )
        if self.mode == "managed":
            needed = mebibytes(self.heap) + mebibytes(self.direct_memory) + JVM_OVERHEAD_MIB
            if needed > mebibytes(self.resources.memory_limit):
                raise problem(
                    f"heap ({self.heap}) + directMemory ({self.direct_memory}) + {JVM_OVERHEAD_MIB}Mi JVM overhead "
                    f"must fit in the memory limit; raise resources.memoryLimit or lower the JVM sizes",
                    ".resources.memoryLimit",
                    self.resources.memory_limit,
                )
        return self


@dataclass(frozen=True)
class PulsarArgs:
    """What the Pulsar component needs: its settings and where to run."""

    settings: PulsarSettings
    namespace: pulumi.Input[str]
    image_mirror: Optional[str] = None


def broker_env(settings: PulsarSettings) -> list[dict]:
    """Environment of the standalone broker; PULSAR_PREFIX_* become standalone.conf keys."""
    return [
        {"name": "PULSAR_MEM", "value": f"-Xms{settings.heap} -Xmx{settings.heap} "
                                        f"-XX:MaxDirectMemorySize={settings.direct_memory}"},
        {"name": "PULSAR_PREFIX_allowAutoTopicCreation", "value": "true"},
        {"name": "PULSAR_PREFIX_allowAutoTopicCreationType", "value": "non-partitioned"},
        # As in Armada's dev stack: a damaged ledger is skipped instead of blocking a topic forever.
        {"name": "PULSAR_PREFIX_autoSkipNonRecoverableData", "value": "true"},
    ]


def statefulset_spec(name: str, settings: PulsarSettings, image_ref: str, advertised_address: str) -> dict:
    """The managed broker's StatefulSet spec (pure, so tests check it without mocks).

    `advertised_address` is what topic lookups return to clients; standalone would otherwise
    advertise `localhost`, which no other pod can reach.
    """
    mounts = [{"name": volume, "mountPath": path} for volume, path in SCRATCH_MOUNTS.items()]
    security = kube.container_security(read_only_root=True)
    broker = {
        "name": "pulsar",
        "image": image_ref,
        "command": ["sh", "-c"],
        "args": [
            "bin/apply-config-from-env.py conf/standalone.conf && exec bin/pulsar standalone "
            f"--no-functions-worker --no-stream-storage --advertised-address {advertised_address}"
        ],
        "workingDir": HOME,
        "ports": [
            {"name": "pulsar", "containerPort": BROKER_PORT},
            {"name": "http", "containerPort": ADMIN_PORT},
        ],
        "env": broker_env(settings),
        "resources": settings.resources.spec(),
        "securityContext": security,
        # GET /admin/v2/brokers/ready: 200 once the broker has started, 500 before (upstream
        # BrokersBase.isReady). Not /status.html: it answers 404 unless statusFilePath names an
        # existing file, and standalone.conf's default does not.
        # First start initialises bookie and metadata: allow it 5 minutes before liveness counts.
        "startupProbe": kube.http_probe(BROKER_READY_PATH, "http", initial_delay=10, period=10, failures=30),
        "livenessProbe": kube.http_probe(BROKER_READY_PATH, "http", initial_delay=0, period=20, failures=3),
        # Ready only when the broker can actually produce and consume (its heartbeat topic).
        "readinessProbe": kube.http_probe("/admin/v2/brokers/health", "http", initial_delay=0, period=15, failures=3),
        "volumeMounts": [{"name": "data", "mountPath": f"{HOME}/data"}, *mounts],
    }
    # The image's conf/ holds the defaults apply-config-from-env.py edits; copy them to a
    # writable emptyDir so the root filesystem can stay read-only.
    copy_conf = {
        "name": "copy-conf",
        "image": image_ref,
        "command": ["sh", "-c", f"cp -R {HOME}/conf/. /writable-conf/"],
        "resources": kube.Resources(cpu_request="50m", memory_request="32Mi", cpu_limit="200m",
                                    memory_limit="64Mi").spec(),
        "securityContext": security,
        "volumeMounts": [{"name": "conf", "mountPath": "/writable-conf"}],
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
                "terminationGracePeriodSeconds": 60,
                "securityContext": {
                    **kube.pod_security(UID, GID, fs_group=GID),
                    "fsGroupChangePolicy": "OnRootMismatch",
                },
                "initContainers": [copy_conf],
                "containers": [broker],
                "volumes": [{"name": volume, "emptyDir": {}} for volume in SCRATCH_MOUNTS],
            },
        },
        "volumeClaimTemplates": [claim],
    }


def broker_network_policy_spec(name: str) -> dict:
    """Clients in the namespace reach the broker and admin ports; the broker reaches itself at
    its advertised address while starting (usually over loopback, which no policy filters, but
    some CNIs route a pod's own address through its interface)."""
    broker = [network.pods(kube.selector_labels(name))]
    return network.spec(
        {"matchLabels": kube.selector_labels(name)},
        ingress_rules=[network.ingress([network.pods()], [BROKER_PORT, ADMIN_PORT])],
        egress_rules=[network.egress(broker, [BROKER_PORT, ADMIN_PORT])],
    )


class Pulsar(Component):
    """Outputs: `url` (`pulsar://…:6650`) and `admin_url` (`http://…:8080`); `endpoint` and
    `admin_endpoint` (network.Endpoint: what clients' egress policies allow)."""

    url: pulumi.Output[str]
    admin_url: pulumi.Output[str]

    def __init__(self, name: str, args: PulsarArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Pulsar", name, None, opts)
        settings = args.settings
        if settings.mode == "external":
            self.url = pulumi.Output.from_input(settings.url)
            self.admin_url = pulumi.Output.from_input(settings.admin_url)
            self.endpoint = network.url_endpoint(settings.url, BROKER_PORT, settings.cidrs, settings.allow_any_address)
            self.admin_endpoint = network.url_endpoint(
                settings.admin_url, ADMIN_PORT, settings.cidrs, settings.allow_any_address
            )
        else:
            self._managed(name, args)
        self.register_outputs({"url": self.url, "adminUrl": self.admin_url})

    def _managed(self, name: str, args: PulsarArgs) -> None:
        child = self.child_opts()
        # Headless: the StatefulSet's governing Service; with one broker its name is the address
        # clients connect to and the one the broker advertises. The broker calls itself at that
        # address while starting (default namespace creation, the health check behind readiness),
        # so the name must resolve before the pod is ready.
        service = k8s.core.v1.Service(
            f"{name}-svc",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            spec={
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": kube.selector_labels(name),
                "ports": [
                    {"name": "pulsar", "port": BROKER_PORT, "targetPort": "pulsar"},
                    {"name": "http", "port": ADMIN_PORT, "targetPort": "http"},
                ],
            },
            opts=child,
        )
        host = pulumi.Output.all(service.metadata.name, service.metadata.namespace).apply(
            lambda parts: kube.service_dns(parts[0], parts[1])
        )
        image_ref = image("pulsar", args.image_mirror)
        policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            spec=broker_network_policy_spec(name),
            opts=child,
        )
        k8s.apps.v1.StatefulSet(
            f"{name}-sts",
            metadata=kube.metadata(name, args.namespace, COMPONENT),
            spec=host.apply(lambda address: statefulset_spec(name, args.settings, image_ref, address)),
            # The broker calls itself while starting, which its policy allows.
            opts=self.child_opts(depends_on=[service, policy]),
        )
        self.url = host.apply(lambda h: f"pulsar://{h}:{BROKER_PORT}")
        self.admin_url = host.apply(lambda h: f"http://{h}:{ADMIN_PORT}")
        broker = (network.pods(kube.selector_labels(name)),)
        self.endpoint = network.Endpoint(ports=(BROKER_PORT,), peers=broker)
        self.admin_endpoint = network.Endpoint(ports=(ADMIN_PORT,), peers=broker)
