"""The platform's private image registry (CNCF distribution behind an authorizing gate), and the
stack config that picks it.

`RegistryConfig` (stack key `platform.registry`) chooses `managed` (this component, in the platform
namespace), `shared` (the managed registry another stack runs in the same cluster; no workload) or
`external` (any OCI registry, ECR included; no workload). docs/registry.md explains how nodes pull
from the managed registry:

    pods use  localhost:<nodePort>/<project>/<entity>:<tag>@sha256:…

The Service is a NodePort, and kube-proxy (iptables mode) forwards `localhost:<nodePort>` on every
node to the registry, so the kubelet pulls under that name over plain HTTP, which containerd and
Docker allow for localhost only. The machine running `pulumi up` pushes under the same name through
`kubectl port-forward svc/<registry> <nodePort>:5000`.

The registry pod runs two containers: distribution, serving the API on loopback only
(127.0.0.1:UPSTREAM_PORT) with one htpasswd (bcrypt) line per user, and the gate
(components/registry_gate.py, standard-library Python in the pinned python image) on PORT, the only
port the Service and the NetworkPolicy name: per-user rights and create-only tags, which
distribution lacks (docs/registry.md, "Who may do what"; the users: components/registry_access.py).
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml
from pydantic import Field, IPvAnyNetwork, ValidationInfo, field_validator, model_validator

from components import k8s as kube
from components import network
from components.model import ConfigModel, DnsLabel, problem, problems
from components.component import Component
from components.entity_image import BuildPlatform
from components import registry_access as access
from components.kept_secret import Cluster, Htpasswd, KeptSecret, KeptSecretArgs, htpasswd

PORT = 5000
"""The gate's port: the registry API as every client reaches it (Service, NetworkPolicy, tunnels)."""
UPSTREAM_PORT = 5002
"""distribution's API, on 127.0.0.1 in the pod: only the gate reaches it (and a port-forward, with a
registry user's password: distribution authenticates every request itself)."""
DEBUG_PORT = 5001
"""distribution's debug server (`http.debug.addr`): /debug/health reports the storage driver's
health without auth, whereas /v2/ answers 401 once htpasswd auth is on."""
DATA_PATH = "/var/lib/registry"
CONFIG_DIR = "/etc/distribution"
"""Where the ConfigMap's config.yml is mounted: distribution 3.x's default path (2.x read
/etc/docker/registry). The container names the file explicitly (`args`), so that an image whose
default differs can never start on its built-in config instead of ours (the 3.x image's CMD is
/etc/distribution/config.yml, docker-library/repo-info repos/registry/remote/3.1.1.md; its
entrypoint, distribution/distribution-library-image docker-entrypoint.sh, runs `registry serve
<file>` when the argument is a file)."""
METRICS_PATH = "/metrics"
"""Where the debug server serves Prometheus metrics when they are on (distribution's default)."""
AUTH_PATH = "/auth"
GATE_DIR = "/etc/registry-gate"
"""Where the gate's ConfigMap (its program and policy) is mounted."""
GATE_PROGRAM = "registry_gate.py"
GATE_POLICY = "policy.json"
GATE_SOURCE = Path(__file__).with_name(GATE_PROGRAM)
GATE_RESOURCES = kube.Resources(cpu_request="20m", memory_request="48Mi", cpu_limit="500m", memory_limit="128Mi")
"""The gate streams bodies in 64 KiB pieces and holds at most one 4 MiB manifest per request."""
GATE_IMAGE = "backup-s3-client"
"""The infra/versions.py pin of the python image (standard library only) that runs the gate."""
RUN_AS = 1000
"""The registry image has no user of its own; it runs fine as any uid that owns its storage."""
PASSWORD_KEY = "registryPassword"
"""The `secure:` config key with the external registry's password (or token)."""

_HOST = r"(?P<host>[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)"
REGISTRY_URL = re.compile(
    r"^((?P<scheme>https?)://)?" + _HOST + r"(:(?P<port>[0-9]{1,5}))?"
    r"(?P<path>(/[a-z0-9]+([._-][a-z0-9]+)*)*)/?$"
)
PUSH_HOST = re.compile(r"^" + _HOST + r"(:(?P<port>[0-9]{1,5}))?$")
LOOPBACK = ("localhost", "127.0.0.1")
MODE_KEYS = {
    "managed": ("node_port", "push_host", "storage", "resources", "node_cidrs", "load_balancer",
                "load_balancer_source_ranges", "ingress", "username"),
    "shared": ("node_port", "push_host", "owner_namespace"),
    "external": ("url", "username"),
}
"""The mode-specific keys each mode accepts (the others apply to every mode)."""
AUTH_SECRET_SUFFIX = "-auth"
"""The managed registry's Secret is `<registry name>-auth` (keys htpasswd, username, password,
http-secret): the deployer's credential (components/registry_access.py)."""
HTPASSWD_SECRET_SUFFIX = "-htpasswd"
"""`<registry name>-htpasswd`: one line per user, what distribution authenticates with."""
PULL_SECRET_INFIX = "-pull-"
"""`<registry name>-pull-<project>`: a project's pull credential (username, password, htpasswd),
kept like `-auth`; a `shared` stack reads it for its pull Secrets."""


def pull_secret_name(name: str, project: str) -> str:
    return f"{name}{PULL_SECRET_INFIX}{project}"


class RegistryIngress(ConfigModel):
    """An Ingress for pushing from outside the cluster (e.g. CI) under a TLS host name."""

    host: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$")
    """Host name clients push to; set `pushHost` to it to push there instead of a port-forward."""
    class_name: Optional[str] = None
    """IngressClass; unset uses the cluster's default class."""
    tls_secret_name: Optional[DnsLabel] = None
    """kubernetes.io/tls Secret in the platform namespace; unset means the controller's default cert."""
    controller_namespace: DnsLabel
    """Namespace of the ingress controller, admitted by the registry's NetworkPolicy."""
    annotations: dict[str, str] = {}
    """Controller-specific settings, e.g. `nginx.ingress.kubernetes.io/proxy-body-size: "0"`
    (image layers are larger than most controllers' default body limit)."""


class RegistryConfig(ConfigModel):
    """Where entity images are pushed and pulled (stack key `platform.registry`)."""

    mode: Literal["managed", "shared", "external"] = "managed"
    """`managed`: a registry in the platform namespace; `shared`: the managed registry of the other
    stack in this cluster (exactly one stack per cluster runs it); `external`: an existing OCI registry."""
    username: str = Field(default="cloudstation", pattern=r"^[^:\s]+$")
    """Registry user. Managed: the deployer's user (`pulumi up`, `promote`; its password is
    generated; builds and pulls have users of their own, docs/registry.md). External: required
    (`AWS` for ECR); the password is the secure key `registryPassword`. Shared: read from the
    owner's Secret."""
    url: Optional[str] = None
    """External only: `[https://]host[:port][/path]`; images go to `<host>[/path]/<project>/<entity>`."""
    node_port: int = Field(default=32000, ge=30000, le=32767)
    """Managed and shared: the NodePort every node forwards from localhost; pods pull
    `localhost:<nodePort>/…` (shared: the owning stack's value)."""
    owner_namespace: Optional[DnsLabel] = None
    """Shared: the platform namespace of the stack that runs the registry; unset means this
    stack's own platform namespace (one platform namespace shared by both stacks)."""
    push_host: Optional[str] = None
    """Managed and shared: host[:port] at which `pulumi up` reaches the registry (local builds push
    there; in-cluster builds upload contexts and read digests there). Unset: in-cluster builds use
    `pulumi up`'s own tunnel through the Kubernetes API (no port-forward), local builds
    `localhost:<nodePort>` through a port-forward. Set it to the Ingress or LoadBalancer address to
    reach the registry without either."""
    build_platform: Optional[BuildPlatform] = None
    """Platform of the entity images the test stack builds, `os/arch[/variant]` (e.g. `linux/arm64`):
    the nodes' OS/architecture. Unset builds for the architecture of the machine running `pulumi up`
    (pulumi-docker's default; docs/registry.md); set it when the nodes' architecture differs."""
    storage: kube.Storage = kube.Storage(size="20Gi")
    """Managed: the registry's persistent volume."""
    resources: kube.Resources = kube.Resources(
        cpu_request="50m", memory_request="64Mi", cpu_limit="1", memory_limit="512Mi"
    )
    """Managed: the registry container's requests and limits."""
    node_cidrs: list[IPvAnyNetwork] = []
    """Managed: CIDRs of the nodes' IPs, admitted by the NetworkPolicy. Kubelet pulls from other
    nodes arrive source-NATed to the pulling node's IP; set this wherever the CNI enforces policy on
    such traffic (Calico, Cilium, ...). See docs/registry.md."""
    load_balancer: bool = False
    """Managed: make the Service a LoadBalancer (off: reachable only inside the cluster and via
    the nodes' localhost)."""
    load_balancer_source_ranges: list[IPvAnyNetwork] = []
    """Managed: client CIDRs allowed through the LoadBalancer; required with `loadBalancer`."""
    ingress: Optional[RegistryIngress] = None
    """Managed: an Ingress for the registry (off by default)."""

    @field_validator("url")
    @classmethod
    def _url_form(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        match = REGISTRY_URL.match(value)
        if not match or (match["port"] and not 0 < int(match["port"]) < 65536):
            raise problem(
                "must be [https://]host[:port][/path] with a lowercase repository path, "
                "e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/cloudstation or registry.example.com:5000"
            )
        if match["scheme"] == "http" and match["host"] not in LOOPBACK:
            raise problem("plain http:// is only possible for localhost (kubelets pull over HTTPS)")
        return value

    @field_validator("username")
    @classmethod
    def _not_a_tenant_user(cls, value: str) -> str:
        if value.startswith(access.RESERVED_USER_PREFIXES):
            raise problem("the managed registry names its build and pull users build-<project> and pull-<project>; "
                          "choose a user name that starts with neither")
        return value

    @field_validator("push_host")
    @classmethod
    def _push_host_form(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not PUSH_HOST.match(value):
            raise problem("must be host[:port] without a scheme or path, e.g. registry.example.com")
        return value

    @model_validator(mode="after")
    def _per_mode(self, info: ValidationInfo) -> "RegistryConfig":
        # Every problem at once (components/model.py `problems`): a mode switch names all it needs.
        found = []
        allowed = MODE_KEYS[self.mode]
        for modes_key in sorted({k for keys in MODE_KEYS.values() for k in keys} - set(allowed)):
            if modes_key in self.model_fields_set:
                modes = [mode for mode, keys in MODE_KEYS.items() if modes_key in keys]
                alias = type(self).model_fields[modes_key].alias or modes_key
                found.append(problem(f"only for mode: {' or '.join(modes)}", "." + alias, _plain(getattr(self, modes_key))))
        if self.mode == "managed" and self.load_balancer and not self.load_balancer_source_ranges:
            found.append(problem(
                "loadBalancer needs the client CIDRs it admits (the NetworkPolicy denies all others)",
                ".loadBalancerSourceRanges",
                [],
            ))
        if self.mode == "external":
            if self.url is None:
                found.append(problem("mode: external needs the registry's url", ".url", None))
            if "username" not in self.model_fields_set:
                found.append(problem("mode: external needs the registry's username (`AWS` for ECR)", ".username", None))
            secrets = (info.context or {}).get("secrets")
            if secrets is not None and PASSWORD_KEY not in secrets:
                found.append(problem(
                    f"mode: external needs the password as a secret: "
                    f"pulumi config set --secret cloudstation:{PASSWORD_KEY} <password>",
                    f" ({PASSWORD_KEY})",
                    None,
                ))
        if found:
            raise problems(found)
        return self

    @property
    def pull_host(self) -> str:
        """host[:port] in every entity image reference (and the pull Secret's key)."""
        if self.mode != "external":
            return f"localhost:{self.node_port}"
        match = REGISTRY_URL.match(self.url)
        return match["host"] + (f":{match['port']}" if match["port"] else "")

    @property
    def repository_prefix(self) -> str:
        """Path below the host that entity repositories go under ('' or e.g. 'team/cloudstation')."""
        return "" if self.mode != "external" else REGISTRY_URL.match(self.url)["path"].strip("/")

    @property
    def effective_push_host(self) -> str:
        """host[:port] the machine running `pulumi up` pushes to."""
        if self.mode != "external" and self.push_host:
            return self.push_host
        return self.pull_host


def _plain(value):
    if isinstance(value, ConfigModel):
        return value.model_dump(by_alias=True, mode="json")
    if isinstance(value, list):
        return [str(v) for v in value]
    return value


# --- pure builders ----------------------------------------------------------------------------


def dockerconfigjson(host: str, username: str, password: str) -> str:
    """The `.dockerconfigjson` of a kubernetes.io/dockerconfigjson pull Secret for `host`."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"username": username, "password": password, "auth": auth}}}, sort_keys=True)


def registry_settings(realm: str = "cloudstation", metrics: bool = False) -> dict:
    """distribution's config.yml (no secrets: the htpasswd file and the HTTP secret come from the
    Secret). A file rather than REGISTRY_* variables, so that the htpasswd path and realm are not
    mistaken for credentials in the pod spec. `metrics` serves Prometheus metrics at /metrics on
    the debug address (distribution v3.1.1 registry/registry.go `configurePrometheus`, reached only
    when `http.debug.addr` is set; registry/handlers/app.go instruments every route then)."""
    debug: dict = {"addr": f":{DEBUG_PORT}"}
    if metrics:
        debug["prometheus"] = {"enabled": True, "path": METRICS_PATH}
    return {
        "version": 0.1,
        "log": {"level": "info", "fields": {"service": "registry"}},
        "storage": {
            "filesystem": {"rootdirectory": DATA_PATH},
            # No deletion through the API: nothing in the platform deletes (the gate refuses it
            # too), so no credential can remove an image a stack runs (docs/security.md).
            "delete": {"enabled": False},
            "cache": {"blobdescriptor": "inmemory"},
        },
        "http": {
            # Loopback: every client goes through the gate (module docstring).
            "addr": f"127.0.0.1:{UPSTREAM_PORT}",
            "debug": debug,
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "auth": {"htpasswd": {"realm": realm, "path": f"{AUTH_PATH}/htpasswd"}},
        "health": {"storagedriver": {"enabled": True, "interval": "10s", "threshold": 3}},
    }


def registry_config_yaml(metrics: bool = False) -> str:
    return yaml.safe_dump(registry_settings(metrics=metrics), sort_keys=True)


def gate_program() -> str:
    """The gate's source, as its container runs it (components/registry_gate.py)."""
    return GATE_SOURCE.read_text()


def gate_config(projects: Sequence[str], deployer: str, builds_in_cluster: bool) -> dict[str, str]:
    """The gate's ConfigMap: its program and its policy (no secrets: passwords are distribution's)."""
    return {GATE_PROGRAM: gate_program(), GATE_POLICY: access.gate_policy_json(projects, deployer, builds_in_cluster)}


def gate_container(image: str, resources: dict) -> dict:
    return {
        "name": "gate",
        "image": image,
        # -I: the standard library only, nothing from the environment or the working directory.
        "command": ["python3", "-I", f"{GATE_DIR}/{GATE_PROGRAM}"],
        "args": ["--policy", f"{GATE_DIR}/{GATE_POLICY}", "--listen", f":{PORT}",
                 "--upstream", f"127.0.0.1:{UPSTREAM_PORT}"],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": resources,
        "securityContext": kube.container_security(read_only_root=True),
        # Ready when distribution behind it answers; alive while it accepts connections.
        "readinessProbe": kube.http_probe("/healthz", "http", initial_delay=2),
        "livenessProbe": kube.tcp_probe("http", initial_delay=10, failures=6),
        "volumeMounts": [{"name": "gate", "mountPath": GATE_DIR, "readOnly": True}],
    }


def deployment_spec(name: str, image: str, config: RegistryConfig, gate_image: str, gate: dict[str, str],
                    metrics: bool = False) -> dict:
    """One registry pod (filesystem storage allows one writer), replaced with Recreate: distribution
    on loopback and the gate in front of it (`gate` is the gate's ConfigMap data, `gate_config`)."""
    container = {
        "name": "registry",
        "image": image,
        "args": [f"{CONFIG_DIR}/config.yml"],
        # The API listens on 127.0.0.1 only (registry_settings): no port of it to declare.
        "ports": [{"name": "debug", "containerPort": DEBUG_PORT, "protocol": "TCP"}],
        # Overrides http.secret (signs upload state), so that it stays out of the ConfigMap.
        "env": [kube.secret_env("REGISTRY_HTTP_SECRET", f"{name}{AUTH_SECRET_SUFFIX}", "http-secret")],
        "resources": config.resources.spec(),
        "securityContext": kube.container_security(read_only_root=True),
        "readinessProbe": kube.http_probe("/debug/health", "debug", initial_delay=2),
        # Liveness only asks whether the server answers: a storage failure makes it unready, and
        # restarting would not repair the volume.
        "livenessProbe": kube.tcp_probe("debug", initial_delay=10, failures=6),
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_PATH},
            {"name": "auth", "mountPath": AUTH_PATH, "readOnly": True},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_security = {**kube.pod_security(RUN_AS, fs_group=RUN_AS), "fsGroupChangePolicy": "OnRootMismatch"}
    # A change of the config, the gate's program or its policy rolls the pod (a mounted ConfigMap
    # alone would not restart it).
    rolled = hashlib.sha256(registry_config_yaml(metrics).encode())
    for key in sorted(gate):
        rolled.update(f"\0{key}\0{gate[key]}".encode())
    return {
        "replicas": 1,
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": kube.selector_labels(name)},
        "template": {
            "metadata": {
                "labels": kube.labels(name, "registry"),
                "annotations": {"cloudstation.io/config-sha256": rolled.hexdigest()},
            },
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": pod_security,
                "containers": [container, gate_container(gate_image, GATE_RESOURCES.spec())],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": f"{name}-data"}},
                    {
                        "name": "auth",
                        "secret": {
                            "secretName": f"{name}{HTPASSWD_SECRET_SUFFIX}",
                            "items": [{"key": "htpasswd", "path": "htpasswd"}],
                            "defaultMode": 0o440,
                        },
                    },
                    {"name": "config", "configMap": {"name": f"{name}-config"}},
                    {"name": "gate", "configMap": {"name": f"{name}-gate"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                ],
            },
        },
    }


def service_spec(name: str, config: RegistryConfig) -> dict:
    """NodePort (or LoadBalancer, which has the same node port) for pulls via the nodes' localhost.

    externalTrafficPolicy Local keeps outside clients' source IPs, so the NetworkPolicy can refuse
    them; kube-proxy still routes the nodes' own (localhost) traffic to the pod on any node."""
    spec = {
        "type": "LoadBalancer" if config.load_balancer else "NodePort",
        "externalTrafficPolicy": "Local",
        "selector": kube.selector_labels(name),
        "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP", "nodePort": config.node_port}],
    }
    if config.load_balancer:
        spec["loadBalancerSourceRanges"] = [str(c) for c in config.load_balancer_source_ranges]
    return spec


def network_policy_spec(name: str, config: RegistryConfig, client_namespaces: list[str]) -> dict:
    """Ingress to the registry port only from the platform and project namespaces, the nodes (pulls
    through the NodePort), and the ingress controller / LoadBalancer clients when enabled; no egress
    (filesystem storage needs none). The debug port is left to the kubelet's probes."""
    peers: list[dict] = [
        {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": network.NAMESPACE_LABEL, "operator": "In", "values": sorted(set(client_namespaces))}
                ]
            }
        }
    ]
    peers += [{"ipBlock": {"cidr": str(cidr)}} for cidr in config.node_cidrs]
    if config.ingress:
        peers.append(network.namespace_peer(config.ingress.controller_namespace))
    if config.load_balancer:
        peers += [{"ipBlock": {"cidr": str(cidr)}} for cidr in config.load_balancer_source_ranges]
    return network.spec(
        {"matchLabels": kube.selector_labels(name)}, ingress_rules=[network.ingress(peers, [PORT])], egress_rules=[]
    )


def ingress_spec(name: str, ingress: RegistryIngress) -> dict:
    spec: dict = {
        "rules": [
            {
                "host": ingress.host,
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": name, "port": {"number": PORT}}},
                        }
                    ]
                },
            }
        ]
    }
    if ingress.class_name:
        spec["ingressClassName"] = ingress.class_name
    if ingress.tls_secret_name:
        spec["tls"] = [{"hosts": [ingress.host], "secretName": ingress.tls_secret_name}]
    return spec


# --- the component ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryArgs:
    config: RegistryConfig
    namespace: pulumi.Input[str]
    client_namespaces: list[str]
    """Namespaces whose pods may reach the registry (platform and projects)."""
    image: str
    """Pinned distribution image (infra/versions.py)."""
    metrics: bool = False
    """Serve Prometheus metrics on the debug port (platform.monitoring.enabled)."""
    cluster: Optional[Cluster] = Cluster()
    """Where the kept Secret `registry-auth` is read back (components/kept_secret.py); None when the
    stack renders to a directory."""
    projects: Sequence[str] = ()
    """Every project whose images live here, `platform` (project-state) included: each gets a pull
    user, and with `builds_in_cluster` a build user (components/registry_access.py)."""
    builds_in_cluster: bool = False
    """Images are built by Armada jobs (build users), not pushed by the deployer (local builds)."""
    gate_image: str = ""
    """The pinned python image the gate runs in (infra/versions.py GATE_IMAGE)."""


class Registry(Component):
    """Outputs: `service` (Service name), `username` and `password` (secret): the deployer's;
    `pull_passwords` and `build_passwords` (project -> secret): the other users' (their names:
    components/registry_access.py)."""

    def __init__(self, name: str, args: RegistryArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:delivery:Registry", name, None, opts)
        child = self.child_opts()
        config = args.config

        secret_name = f"{name}{AUTH_SECRET_SUFFIX}"
        # The credentials the kept images are pulled with (prod's pull Secrets hold them), when the
        # Secret is still there; the htpasswd entry is the kept one while it verifies.
        kept = KeptSecret(f"{secret_name}-values", KeptSecretArgs(
            args.namespace, secret_name, {"password": 32, "http-secret": 48}, args.cluster,
            htpasswd=Htpasswd(key="htpasswd", username=config.username, password_key="password")), child)
        secret = k8s.core.v1.Secret(
            secret_name,
            metadata=kube.metadata(secret_name, args.namespace, "registry"),
            type="Opaque",
            string_data={
                "htpasswd": kept.value("htpasswd"),
                "username": config.username,
                "password": kept.value("password"),
                "http-secret": kept.value("http-secret"),
            },
            # Kept, like the images: a stack sharing this registry reads its credentials here
            # (docs/cloudstate.md, "What is kept").
            opts=self.child_opts(retain_on_delete=True),
        )
        lines = [kept.value("htpasswd")]
        self.pull_passwords: dict[str, pulumi.Output[str]] = {}
        for project in args.projects:
            password, line = self._pull_credential(name, project, args)
            self.pull_passwords[project] = password
            lines.append(line)
        # Build credentials open no kept data: new ones after a destroy are fine (components/kept_secret.py).
        self.build_passwords: dict[str, pulumi.Output[str]] = {}
        for project in args.projects if args.builds_in_cluster else ():
            generated = random.RandomPassword(f"{name}-build-{project}-password", length=32, special=False, opts=child)
            self.build_passwords[project] = pulumi.Output.secret(generated.result)
            user = access.build_user(project)
            lines.append(generated.bcrypt_hash.apply(lambda hashed, user=user: htpasswd(user, hashed)))
        users = k8s.core.v1.Secret(
            f"{name}{HTPASSWD_SECRET_SUFFIX}",
            metadata=kube.metadata(f"{name}{HTPASSWD_SECRET_SUFFIX}", args.namespace, "registry"),
            type="Opaque",
            # Sorted, so that the file only changes with a user (bcrypt lines are salted, so stable only as kept).
            string_data={"htpasswd": pulumi.Output.secret(pulumi.Output.all(*lines).apply(lambda ls: "".join(sorted(ls))))},
            opts=child,
        )
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=kube.metadata(f"{name}-config", args.namespace, "registry"),
            data={"config.yml": registry_config_yaml(args.metrics)},
            opts=child,
        )
        gate = gate_config(args.projects, config.username, args.builds_in_cluster)
        gate_map = k8s.core.v1.ConfigMap(
            f"{name}-gate",
            metadata=kube.metadata(f"{name}-gate", args.namespace, "registry"),
            data=gate,
            opts=child,
        )
        claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-data",
            metadata=kube.metadata(f"{name}-data", args.namespace, "registry"),
            spec=config.storage.claim_spec(),
            # The images, among them the digests other stacks (prod) run: kept when this stack
            # is destroyed or the registry removed.
            opts=self.child_opts(retain_on_delete=True),
        )
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deploy",
            metadata=kube.metadata(name, args.namespace, "registry"),
            spec=deployment_spec(name, args.image, config, args.gate_image, gate, args.metrics),
            opts=self.child_opts(depends_on=[secret, users, config_map, gate_map, claim]),
        )
        service = k8s.core.v1.Service(
            f"{name}-svc",
            metadata=kube.metadata(name, args.namespace, "registry"),
            spec=service_spec(name, config),
            opts=child,
        )
        policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-netpol",
            metadata=kube.metadata(name, args.namespace, "registry"),
            spec=network_policy_spec(name, config, args.client_namespaces),
            opts=child,
        )
        if config.ingress:
            k8s.networking.v1.Ingress(
                f"{name}-ingress",
                metadata=kube.metadata(
                    name, args.namespace, "registry",
                    **({"annotations": dict(config.ingress.annotations)} if config.ingress.annotations else {}),
                ),
                spec=ingress_spec(name, config.ingress),
                opts=self.child_opts(depends_on=[service]),
            )
        self.service: pulumi.Output[str] = service.metadata.name
        self.serving: list[pulumi.Resource] = [deployment, service, policy]
        """The custom resources an in-cluster client (a build job) waits for: depending on these,
        not on the component, keeps a dependant's edges few (infra/builds.py `armada_builds`)."""
        self.username: str = config.username
        self.password: pulumi.Output[str] = kept.value("password")
        self.register_outputs({"service": self.service, "password": self.password})

    def _pull_credential(self, name: str, project: str, args: RegistryArgs) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        """A project's pull credential in its own kept Secret `<name>-pull-<project>`: its password
        (secret) and htpasswd line. Kept, like `-auth`: the pull Secrets of prod's namespaces hold it,
        and prod keeps pulling the kept images with it after this stack is destroyed and deployed again."""
        secret_name = pull_secret_name(name, project)
        user = access.pull_user(project)
        kept = KeptSecret(f"{secret_name}-values", KeptSecretArgs(
            args.namespace, secret_name, {"password": 32}, args.cluster,
            htpasswd=Htpasswd(key="htpasswd", username=user, password_key="password")), self.child_opts())
        k8s.core.v1.Secret(
            secret_name,
            metadata=kube.metadata(secret_name, args.namespace, "registry"),
            type="Opaque",
            string_data={"username": user, "password": kept.value("password"), "htpasswd": kept.value("htpasswd")},
            opts=self.child_opts(retain_on_delete=True),
        )
        return kept.value("password"), kept.value("htpasswd")
