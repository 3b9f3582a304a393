"""One entity's in-cluster build, as the Armada job item that runs it (pure functions).

`build_job_item` returns the swagger's `apiJobSubmitRequestItem` (armadaproject/armada v0.22.7
pkg/api/api.swagger.json) for one entity: its pod fetches the build context blob from the in-cluster
registry, checks its sha256, and builds the Dockerfile at the context's root with kaniko, which runs
the entity's tests in the Dockerfile's test stage and pushes `<project>/<entity>:<content tag>`.
docs/builds.md ("Builder") says why kaniko and why the builds namespace is Pod Security "baseline".

The pod: an init container `fetch` (busybox, fully "restricted": non-root, no capabilities,
read-only root) reads the registry's basic-auth value from a mounted Secret file, downloads
`GET /v2/builds/<project>/<entity>/blobs/sha256:<digest>`, verifies it and untars it into an
emptyDir; the container `build` (kaniko) builds from that directory and pushes with the
`.dockerconfigjson` of the same Secret mounted as its docker config. Nothing credential-like is in
args or env: both containers read files. No service-account token, no service links, requests equal
to limits, `activeDeadlineSeconds`, restartPolicy Never, no hostPath.
"""
from __future__ import annotations

import re
from typing import Annotated, Optional

from pydantic import AfterValidator, Field, model_validator

from components import network
from components.k8s import CpuQuantity, MemoryQuantity, StorageSize, container_security
from components.model import ConfigModel, problem
from infra import public_egress, versions

BUILDER_IMAGE = "kaniko"
"""The infra/versions.py pin of the builder (kaniko, osscontainertools fork)."""
FETCH_IMAGE = "build-fetch"
"""The infra/versions.py pin of the fetch init container (busybox)."""

POD_SECURITY_LEVEL = "baseline"
"""The Pod Security Standard the builds namespace enforces. kaniko unpacks base images over its own
root filesystem and runs RUN steps there as the image's users, so it runs as uid 0 with the file
capabilities below: "restricted" refuses both (runAsNonRoot, runAsUser 0 before policy v1.35, and
capabilities beyond NET_BIND_SERVICE at every version); "baseline" allows them and still refuses
privileged, host namespaces, hostPath and Unconfined seccomp/AppArmor. docs/builds.md "Builder"."""

BUILDER_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETFCAP", "SETGID", "SETUID")
"""What kaniko needs of the container runtime's default set (all in the baseline allow-list of
pod-security-admission check_capabilities_baseline.go): CHOWN/FOWNER/FSETID/SETFCAP to unpack base
image layers with their owners, modes and file capabilities, DAC_OVERRIDE to write into directories
of other users, SETUID/SETGID to run RUN steps as the image's USER, KILL to stop the processes those
steps leave. The rest of the default set (AUDIT_WRITE, MKNOD, NET_BIND_SERVICE, SETPCAP,
SYS_CHROOT) is dropped: kaniko creates no device, binds no port and never chroots."""

RELAXED_RESTRICTED_CONTROLS = ("runAsNonRoot", "runAsUser", "capabilities")
"""The "restricted" controls the build container does not meet (the fetch container meets all)."""

WORKSPACE = "/workspace"
"""The build context directory (kaniko's `dir://` context); an emptyDir the fetch container fills."""
DOWNLOAD_DIR = "/download"
"""Where the fetch container keeps the blob while it verifies it (its own emptyDir)."""
CREDENTIALS_DIR = "/var/run/cloudstation/registry"
"""Where the fetch container reads the basic-auth value (`AUTH_KEY`)."""
DOCKER_CONFIG_DIR = "/kaniko/.docker"
"""kaniko's DOCKER_CONFIG (its image's default): config.json there holds the push credentials."""
AUTH_KEY = "auth"
"""Key of the build Secret: base64(`user:password`), the value of an HTTP Basic Authorization header."""
DOCKERCONFIG_KEY = ".dockerconfigjson"
"""Key of the build Secret (type kubernetes.io/dockerconfigjson): the builder's docker config."""
FETCH_UID = 65532
"""The fetch container's uid (no user of busybox's; any non-root uid will do)."""

ANNOTATION_CONTEXT = "cloudstation.io/build-context"
ANNOTATION_IMAGE = "cloudstation.io/build-image"
LABEL_PROJECT = "cloudstation.io/project"
LABEL_ENTITY = "cloudstation.io/entity"
LABEL_CONTENT_TAG = "cloudstation.io/content-tag"

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REGISTRY_HOST = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?$")
_MIRROR = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


def _pinned_image(value: str) -> str:
    # An override must be as exact as the pins (infra/versions.py): a digest, or a tag with a
    # major.minor.patch version; never latest or a moving tag.
    try:
        _, tag, digest = versions.split(value)
    except ValueError:
        raise problem("must be an image reference host/path:tag[@sha256:…]")
    if "." not in value.split("/", 1)[0] or "/" not in value:
        raise problem("must name its registry host, e.g. docker.io/martizih/kaniko:v1.28.3")
    if digest is None and not (tag and re.match(r"^v?[0-9]+\.[0-9]+\.[0-9]+", tag)):
        raise problem("must be pinned exactly: a digest (@sha256:…) or a tag with major.minor.patch, never latest")
    return value


def _mirror(value: str) -> str:
    if not _MIRROR.match(value):
        raise problem("must be host[:port][/path] of a registry mirror, without a scheme, e.g. mirror.example.com:5000/dockerhub")
    return value


PinnedImage = Annotated[str, AfterValidator(_pinned_image)]
RegistryMirror = Annotated[str, AfterValidator(_mirror)]


MirrorCidrs = network.cidr_list(
    f"{network.LIST_THE_NETWORKS}; services behind CDNs, whose addresses cannot be listed, need "
    f"{public_egress.KEY}.enabled: true (public addresses only) instead"
)
"""A build destination's addresses: the one opt-in to many addresses is `publicEgress`."""


class BuildEgress(ConfigModel):
    """A destination build pods may reach besides DNS and the registry: a package mirror (npm,
    Maven) or a registry mirror of base images. NetworkPolicies name addresses, not host names:
    a host outside the cluster needs its CIDRs. (Services behind CDNs, whose addresses cannot be
    listed, are `publicEgress`'s: public addresses only, never the cluster's.)"""

    hosts: list[str] = []
    """Host names, for the record and the check: in-cluster Services `<svc>.<namespace>.svc…`
    become that namespace's pods; any other host needs `cidrs`."""
    cidrs: MirrorCidrs = []
    """The destination's addresses as CIDRs, e.g. [10.20.30.0/24] for a Nexus or Artifactory."""
    ports: list[network.Port] = Field(default=[443], min_length=1)
    """The destination's ports (HTTPS by default)."""

    @model_validator(mode="before")
    @classmethod
    def _no_any_address(cls, data):
        # An egress entry once had allowAnyAddress (0.0.0.0/0 and ::/0, the cluster's own addresses
        # included); publicEgress replaced it with public addresses only.
        if isinstance(data, dict) and ("allowAnyAddress" in data or "allow_any_address" in data):
            raise problem("not a key of an egress entry: to let builds reach services whose addresses cannot be "
                          "listed (docker.io, registry.npmjs.org, GitHub), set platform.builds.publicEgress.enabled: "
                          "true (public addresses only, never the cluster's or private ones)",
                          ".allowAnyAddress", data.get("allowAnyAddress", data.get("allow_any_address")))
        return data

    @model_validator(mode="after")
    def _addresses(self) -> "BuildEgress":
        outside = [h for host in self.hosts for h in network.outside_hosts(host)]
        if outside and not self.cidrs:
            raise problem(f"required for a destination outside the cluster ({', '.join(outside)}): its addresses as "
                          "CIDRs, e.g. [10.20.30.0/24] (build pods' NetworkPolicy names addresses, not hosts); "
                          "for services behind CDNs use platform.builds.publicEgress instead", ".cidrs", [])
        if not self.cidrs and not any(network.SERVICE_HOST.match(h) for h in self.hosts):
            raise problem("names no destination: list cidrs or in-cluster hosts (<svc>.<namespace>.svc)", ".cidrs", [])
        return self

    def peers(self) -> list[dict]:
        """The NetworkPolicy peers of this destination (never empty, never every address)."""
        peers = [network.namespace_peer(m["namespace"]) for m in (network.SERVICE_HOST.match(h) for h in self.hosts) if m]
        peers += network.ip_blocks(self.cidrs)
        unique = []
        for peer in peers:
            if peer not in unique:
                unique.append(peer)
        return unique


class PublicEgress(ConfigModel):
    """Opt-in: build pods may reach PUBLIC addresses (docs/builds.md, "Network access of builds"):
    `0.0.0.0/0` and `::/0` on `ports`, except every private, CGNAT, loopback, link-local (cloud
    metadata), multicast and tunnel block (infra/public_egress.py) and every block the stack names
    (`cidrs`/`nodeCidrs` keys: nodes, API server, external servers). What a build needs without
    mirrors: docker.io for base images, registry.npmjs.org for `npm ci`, GitHub for the CloudState
    SDK's protoc, all behind CDNs whose addresses change. Only the builds namespace's `build-egress`
    policy carries it. A build runs the entity's own scripts: with this on, they can send anything
    to any public host, so prefer mirrors in `egress` where you have them."""

    enabled: bool = False
    """Let build pods reach public addresses on `ports` (off by default; it is the one rule of the
    program open to every public address)."""
    ports: list[network.Port] = Field(default=list(public_egress.DEFAULT_PORTS), min_length=1)
    """TCP ports (HTTPS only by default; add 80 only for a source that needs plain HTTP)."""
    except_cidrs: list[network.Cidr] = []
    """More blocks the rule must not reach, besides the non-public ones and those the stack names:
    e.g. your organisation's public ranges."""

    @model_validator(mode="after")
    def _only_when_enabled(self) -> "PublicEgress":
        if not self.enabled:
            for key in ("ports", "except_cidrs"):
                if key in self.model_fields_set:
                    value = [str(v) if not isinstance(v, int) else v for v in getattr(self, key)]
                    raise problem("only with enabled: true (remove it, or enable public egress knowingly)",
                                  "." + ("ports" if key == "ports" else "exceptCidrs"), value)
        if len(set(self.ports)) != len(self.ports):
            raise problem("each port once", ".ports", self.ports)
        return self


class BuildSettings(ConfigModel):
    """How entity images are built in the cluster (composed into `platform.builds`). Requests equal
    limits: Armada refuses a job whose limits exceed its requests (armadaproject/armada v0.22.7
    internal/server/submit/validation/submit_request.go `validateResources`)."""

    image: Optional[PinnedImage] = None
    """The builder image; unset uses the kaniko pin of infra/versions.py. An override must be a
    kaniko executor image (the pod runs `/kaniko/executor` flags), pinned by digest or exact tag."""
    cpu: CpuQuantity = "1"
    """CPU of the build container (request = limit)."""
    memory: MemoryQuantity = "2Gi"
    """Memory of the build container (request = limit); npm ci and Maven need room."""
    ephemeral_storage: StorageSize = "8Gi"
    """Disk of the build container (request = limit): kaniko unpacks base images and writes layers
    into its own filesystem."""
    timeout_seconds: int = Field(default=1800, ge=60, le=86400)
    """How long a build pod may run (`activeDeadlineSeconds`) before Kubernetes stops it."""
    egress: list[BuildEgress] = []
    """Where builds may connect besides DNS and the registry: package and registry mirrors. Empty
    (the default) means nowhere: base images and packages then need a mirror listed here, or
    `publicEgress` (docs/builds.md)."""
    public_egress: PublicEgress = PublicEgress()
    """Opt-in: builds may reach public addresses (docker.io, registry.npmjs.org, GitHub) on port 443,
    never private or cluster ones. Where neither this nor `egress` is set, a stack in `armada` mode
    is refused: its builds could pull nothing (docs/builds.md, "Network access of builds")."""
    registry_mirrors: list[RegistryMirror] = []
    """Registry mirrors kaniko pulls docker.io base images through (`--registry-mirror`), in order;
    list their addresses in `egress` too."""
    user_namespace: bool = True
    """Run build pods in their own user namespace (`hostUsers: false`): kaniko's root is then an
    unprivileged uid on the node. Needs nodes that support it (Kubernetes 1.33+ with the
    UserNamespacesSupport gate on by default, containerd 2.0+ or CRI-O, Linux 6.3+); set false
    only where they do not (docs/builds.md)."""

    @property
    def builder_image(self) -> str:
        return self.image or versions.image(BUILDER_IMAGE)

    def rebuild_key(self) -> dict[str, str]:
        """The settings whose change must rebuild every image (the EntityBuild input `builder`, also
        hashed into the content tag: infra/builds.py `builder`): the images that build it, as pinned
        (a mirror serves the same manifests: infra/versions.py `image`). Resources, timeout and
        egress do not change what is built."""
        return builder_key(self.builder_image, versions.image(FETCH_IMAGE))

    def nothing_to_pull_from(self, mode_note: str = "") -> Optional[str]:
        """For the stack config's check of `armada` mode (before any resource): what is wrong when build
        pods could reach nothing to pull from (the key is `publicEgress.enabled`), else None. Declared
        `egress` counts (an in-house mirror); `registryMirrors` alone do not (a mirror is reached only
        at an `egress` address), nor does `platform.imageMirror` (kaniko pulls docker.io base images
        through it too, `base_image_mirrors`, but build pods reach it only at an `egress` address)."""
        if self.public_egress.enabled or self.egress:
            return None
        return (
            f"in-cluster builds{mode_note} may reach only DNS and the registry, so they would fail after minutes: "
            "kaniko could not pull the Dockerfiles' base images from docker.io, `npm ci` could not reach "
            "registry.npmjs.org and the CloudState SDK's postinstall could not download protoc from GitHub. "
            "Set cloudstation:platform.builds.publicEgress.enabled: true to let builds reach public addresses "
            "on port 443 knowingly (never private or cluster ones), or list your mirrors in "
            "platform.builds.egress (registryMirrors and platform.imageMirror, which kaniko pulls base images "
            "through, are reached only there), or set platform.builds.mode: local (docs/builds.md, "
            "\"Network access of builds\")"
        )


def builder_key(image: str, fetch_image: str) -> dict[str, str]:
    """What builds an image: the builder (kaniko) and fetch images (`BuildSettings.rebuild_key`)."""
    return {"image": image, "fetchImage": fetch_image}


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def context_url(registry_host: str, project: str, entity: str, context_digest: str, prefix: str = "") -> str:
    """The registry API URL of the context blob (plain HTTP: the in-cluster Service)."""
    return f"http://{registry_host}/v2/{_path(prefix, 'builds', project, entity)}/blobs/{context_digest}"


def _path(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


_FETCH_SCRIPT = """\
set -eu
auth="$(cat {credentials}/{auth_key})"
wget -q -O {download}/context.tar --header "Authorization: Basic $auth" "$CONTEXT_URL"
echo "$CONTEXT_SHA256  {download}/context.tar" | sha256sum -c -
tar -x -f {download}/context.tar -C {workspace}
rm -f {download}/context.tar
test -f {workspace}/Dockerfile
"""


def fetch_script() -> str:
    """The fetch container's shell script: the credential is read from the Secret file at run time
    (never a literal), the blob is refused unless its sha256 is the one the job names."""
    return _FETCH_SCRIPT.format(credentials=CREDENTIALS_DIR, auth_key=AUTH_KEY, download=DOWNLOAD_DIR,
                                workspace=WORKSPACE)


def builder_args(destination: str, registry_host: str, plain_http: bool, mirrors: list[str]) -> list[str]:
    """kaniko executor flags (osscontainertools/kaniko v1.28.3 cmd/executor/cmd/root.go): build
    `Dockerfile` of the context directory and push `destination`. `--insecure-registry` switches
    only that host to plain HTTP, for push and pull (pkg/executor/push.go checks
    `opts.InsecureRegistries.Contains(registryName)`); every other registry keeps TLS. kaniko skips
    stages the target does not depend on (root.go: `--skip-unused-stages` "is the new default"),
    so the entity Dockerfiles make the final stage depend on the test stage."""
    args = [
        f"--context=dir://{WORKSPACE}",
        "--dockerfile=Dockerfile",
        f"--destination={destination}",
        "--push-retry=2",
        "--verbosity=info",
    ]
    if plain_http:
        args.append(f"--insecure-registry={registry_host}")
    args += [f"--registry-mirror={m}" for m in mirrors]
    return args


def base_image_mirrors(settings: BuildSettings, image_mirror: Optional[str] = None) -> list[str]:
    """kaniko's `--registry-mirror`s: `registryMirrors` in order, then `platform.imageMirror`.
    Both lay docker.io out the same way: kaniko maps `docker.io/library/node:22` to
    `<host>/<path>/library/node:22` (osscontainertools/kaniko v1.28.3 cmd/executor/cmd/root.go
    ValidateFlags turns each mirror into a registry map of index.docker.io; pkg/image/remote/remote.go
    parseRegistryMapping splits host and path at the first "/" and remapRepository prefixes the
    path), as infra/versions.py `image` rewrites the pins. So the entities' own `FROM docker.io/...`
    pins come from the mirror the nodes pull the platform from (generated Dockerfiles already name
    it). A base image the mirror lacks falls back to docker.io (no --skip-default-registry-fallback)."""
    mirrors = list(settings.registry_mirrors)
    if image_mirror and image_mirror.rstrip("/") not in mirrors:
        mirrors.append(image_mirror.rstrip("/"))
    return mirrors


def build_job_item(
    *,
    project: str,
    entity: str,
    content_tag: str,
    context_digest: str,
    registry_host: str,
    namespace: str,
    secret_name: str,
    settings: BuildSettings,
    repository_prefix: str = "",
    plain_http: bool = True,
    image_mirror: Optional[str] = None,
) -> dict:
    """The `apiJobSubmitRequestItem` building `<registry_host>/<prefix>/<project>/<entity>:<content_tag>`
    from the context blob `<registry_host>/<prefix>/builds/<project>/<entity>@<context_digest>`.

    `registry_host` is host[:port] of the registry's in-cluster Service (what build pods reach);
    `namespace` the builds namespace and `secret_name` its build Secret (`BuildsNamespace`);
    `plain_http` is true for the in-cluster registry (HTTP inside the cluster); `image_mirror`
    (`platform.imageMirror`) rewrites the pinned builder and fetch images as every platform image."""
    _check(bool(re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", project)), f"project {project!r} is not a DNS label")
    _check(bool(re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", entity)), f"entity {entity!r} is not a DNS label")
    _check(bool(re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$", content_tag)), f"content tag {content_tag!r} is not an image tag and label value")
    _check(bool(_DIGEST.match(context_digest)), f"context digest {context_digest!r} is not sha256:<64 hex>")
    _check(bool(_REGISTRY_HOST.match(registry_host)), f"registry host {registry_host!r} is not host[:port]")
    destination = f"{registry_host}/{_path(repository_prefix, project, entity)}:{content_tag}"
    context_ref = f"{registry_host}/{_path(repository_prefix, 'builds', project, entity)}@{context_digest}"
    labels = {LABEL_PROJECT: project, LABEL_ENTITY: entity, LABEL_CONTENT_TAG: content_tag}
    return {
        "namespace": namespace,
        "labels": labels,
        "annotations": {ANNOTATION_CONTEXT: context_ref, ANNOTATION_IMAGE: destination},
        "podSpec": pod_spec(
            destination=destination,
            context_url=context_url(registry_host, project, entity, context_digest, repository_prefix),
            context_digest=context_digest,
            registry_host=registry_host,
            secret_name=secret_name,
            settings=settings,
            plain_http=plain_http,
            image_mirror=image_mirror,
        ),
    }


def pod_spec(
    *,
    destination: str,
    context_url: str,
    context_digest: str,
    registry_host: str,
    secret_name: str,
    settings: BuildSettings,
    plain_http: bool = True,
    image_mirror: Optional[str] = None,
) -> dict:
    """The build pod's spec (see the module docstring)."""
    fetch = {
        "name": "fetch",
        "image": versions.image(FETCH_IMAGE, image_mirror),
        "command": ["/bin/sh", "-c", fetch_script()],
        "env": [
            {"name": "CONTEXT_URL", "value": context_url},
            {"name": "CONTEXT_SHA256", "value": context_digest.split(":", 1)[1]},
        ],
        # Armada refuses init containers with whole CPUs (submit_request.go `validateInitContainerCpu`).
        "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "32Mi"}},
        # A refused download (401, 404) or a sha256 mismatch writes no /dev/termination-log: the
        # kubelet then keeps the log's tail as the termination message, which Armada's executor
        # reports as the job's error (v0.22.7 internal/executor/util/pod_status.go
        # ExtractPodFailedReason reads terminated.Message), so the reason reaches `pulumi up`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(read_only_root=True, run_as_user=FETCH_UID),
        "volumeMounts": [
            {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
            {"name": "download", "mountPath": DOWNLOAD_DIR},
            {"name": "workspace", "mountPath": WORKSPACE},
        ],
    }
    build_resources = {"cpu": settings.cpu, "memory": settings.memory, "ephemeral-storage": settings.ephemeral_storage}
    build = {
        "name": "build",
        "image": settings.image or versions.image(BUILDER_IMAGE, image_mirror),
        "args": builder_args(destination, registry_host, plain_http, base_image_mirrors(settings, image_mirror)),
        "env": [{"name": "DOCKER_CONFIG", "value": DOCKER_CONFIG_DIR}],
        "resources": {"requests": dict(build_resources), "limits": dict(build_resources)},
        # A failed build has written no digest to /dev/termination-log, so the kubelet takes the
        # log's tail (80 lines, 2 KiB) as the termination message, which Armada's executor reports
        # as the job's error (v0.22.7 internal/executor/util/pod_status.go ExtractPodFailedReason):
        # the failing test's output reaches /v1/job/errors and so `pulumi up`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Baseline, not restricted (POD_SECURITY_LEVEL): root in the container (in its own user
        # namespace by default), the capabilities of BUILDER_CAPABILITIES only, no privilege
        # escalation, RuntimeDefault seccomp; writable root, which kaniko unpacks images into.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": list(BUILDER_CAPABILITIES)},
            "readOnlyRootFilesystem": False,
            "runAsNonRoot": False,
            "runAsUser": 0,
            "runAsGroup": 0,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": WORKSPACE},
            {"name": "docker-config", "mountPath": DOCKER_CONFIG_DIR, "readOnly": True},
        ],
    }
    spec: dict = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": settings.timeout_seconds,
        "terminationGracePeriodSeconds": 10,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": FETCH_UID},
        "initContainers": [fetch],
        "containers": [build],
        "volumes": [
            {"name": "workspace", "emptyDir": {}},
            {"name": "download", "emptyDir": {}},
            # Each container mounts only the key it needs; group-readable for the fetch uid (fsGroup).
            {"name": "credentials", "secret": {"secretName": secret_name, "defaultMode": 0o440,
                                               "items": [{"key": AUTH_KEY, "path": AUTH_KEY}]}},
            {"name": "docker-config", "secret": {"secretName": secret_name, "defaultMode": 0o440,
                                                 "items": [{"key": DOCKERCONFIG_KEY, "path": "config.json"}]}},
        ],
    }
    if settings.user_namespace:
        spec["hostUsers"] = False
    return spec
