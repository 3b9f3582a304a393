"""Checks of rendered objects against the team's standards, as pure functions.

The tests run them on the rendered graph of every stack, and the policy pack (policy/rules.py)
on the resources the Pulumi engine passes it; each returns a list of problems
(empty when fine), so a failure names every offending object at once.

This module imports only the standard library, PyYAML, infra/image_refs.py, infra/public_egress.py,
infra/address_blocks.py, infra/credentials.py, infra/quantities.py and infra/image_pins.py: the policy pack runs it in its own virtualenv
(policy/requirements.txt), without the program's dependencies.
"""
from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import yaml

from infra import address_blocks, image_pins, public_egress, quantities
from infra.credentials import CREDENTIAL_VALUE, LOOKS_LIKE, is_credential_name, plain_credentials
from infra.image_refs import DIGEST_REF

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet",
                  "ReplicationController")
"""Kinds that run pods (each selected by a NetworkPolicy, checked against the Pod Security Standard)."""
POD_SPEC_KINDS = (*WORKLOAD_KINDS, "PodTemplate")
"""Kinds that carry a pod spec: the workloads and PodTemplate (a template other controllers copy)."""

# Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
SECRET_ENV_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY)", re.IGNORECASE)

# Image references, matched whole and ASCII only (a `$` or `\w` would let a trailing newline or a
# non-ASCII tag through): [host[:port]/]path[:tag][@sha256:<64 hex>], after distribution's
# reference grammar (lower-case path components; a tag of word characters, dots and dashes).
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(
    rf"(?:(?P<host>{_HOST})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?",
    re.ASCII,
)
"""Use with `fullmatch` only."""
VERSION_TAG = re.compile(r"v?(?P<version>[0-9]+(?:\.[0-9]+)*)(?:[-_+.][A-Za-z0-9_.+-]*)?", re.ASCII)
"""A tag that starts with a version number: `2.8.3`, `v1.2.3`, `16.6-alpine3.21`, `17.0.13_11-jre-alpine`."""
EXACT_VERSION_PARTS = 3
"""A tag is exact when its version has major, minor and patch numbers: `7.4.1-alpine3.20`, not `7.4` or `7`."""
TWO_PART_VERSIONS = ("library/postgres",)
"""Images whose upstream releases have two numbers (PostgreSQL 10+: `16.6` is a patch release)."""


def parse_image(image: object) -> Optional[re.Match]:
    """The parts of an image reference (host, path, tag, digest), or None if it is not one."""
    return IMAGE_REF.fullmatch(image) if isinstance(image, str) else None


def is_digest_pinned(image: object) -> bool:
    """`host/path[:tag]@sha256:<64 lower-case hex>`, the whole string (infra/image_refs.py, the one
    pattern the repository checks digest references with)."""
    return isinstance(image, str) and DIGEST_REF.fullmatch(image) is not None


def image_digest(image: object) -> Optional[str]:
    match = parse_image(image)
    return match["digest"] if match else None


def floating_tag_problem(image: str) -> Optional[str]:
    """Why an image's reference can move, or None when it is pinned: a digest, or a tag with an
    exact version (major.minor.patch; major.minor for TWO_PART_VERSIONS). Floating: no tag,
    `latest`, names without a version (`stable`, `alpine`), partial versions (`16`, `7.4-alpine`)."""
    match = parse_image(image)
    if match is None:
        return "is not pinned: not a valid image reference (ASCII, [host/]path[:tag][@sha256:<64 hex>])"
    if match["digest"]:
        return None
    tag = match["tag"]
    if tag is None:
        return "is not pinned: no tag and no digest"
    if tag == "latest":
        return "uses latest"
    version = VERSION_TAG.fullmatch(tag)
    repository = image_repository(image)
    needed = 2 if any(repository == r or repository.endswith("/" + r) for r in TWO_PART_VERSIONS) else EXACT_VERSION_PARTS
    if version is None or version["version"].count(".") + 1 < needed:
        return (f"has a floating tag {tag!r} (pin an exact version with {needed} numbers, e.g. "
                f"{'16.6' if needed == 2 else '1.2.3'}, or a digest)")
    return None


def pod_template(obj: dict) -> dict:
    """The pod template (metadata and spec) of any kind that has one (POD_SPEC_KINDS); a Pod is its
    own template. Raises KeyError or TypeError where the object has none."""
    kind = obj["kind"]
    if kind == "Pod":
        return obj
    if kind == "PodTemplate":
        return obj["template"]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]
    if kind not in POD_SPEC_KINDS:
        raise KeyError(f"{kind} has no pod template")
    return obj["spec"]["template"]


def pod_spec(obj: dict) -> dict:
    return pod_template(obj)["spec"]


def workloads(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    """(name, pod spec) of every workload (and PodTemplate) among `objects`."""
    for obj in objects:
        if obj.get("kind") in POD_SPEC_KINDS:
            meta = obj["metadata"]
            yield f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}", pod_spec(obj)


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def all_containers(spec: dict) -> list[dict]:
    """Init, regular and ephemeral containers (the Pod Security Standards cover all three)."""
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []), *(spec.get("ephemeralContainers") or [])]


# The baseline Pod Security Standard's allowed values (kubernetes/kubernetes,
# staging/src/k8s.io/pod-security-admission/policy/check_*.go).
SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start")
"""check_sysctls.go: the safe set every Kubernetes version allows (later versions add a few)."""
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t")
"""check_seLinuxOptions.go; seLinuxOptions.user and .role must stay unset."""
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
"""check_appArmorProfile.go; the annotation form allows runtime/default and localhost/*."""
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")


BASELINE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")
"""check_capabilities_baseline.go: the only capabilities the baseline level lets a container add."""
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")


def baseline_violations(name: str, spec: dict, annotations: Optional[dict] = None) -> list[str]:
    """Violations of the baseline Pod Security Standard (all supported Kubernetes versions): host
    namespaces and ports, privileged, added capabilities beyond the default set, hostPath, sysctls,
    Unconfined seccomp, SELinux/AppArmor, procMount, probe hosts. `annotations` are the pod's."""
    problems = []
    pod = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(f"{name}: {flag} is not allowed")
    if (pod.get("windowsOptions") or {}).get("hostProcess"):
        problems.append(f"{name}: windowsOptions.hostProcess is not allowed")
    for sysctl in pod.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"{name}: sysctl {sysctl.get('name')!r} is not in the safe set {list(SAFE_SYSCTLS)}")
    if (pod.get("seccompProfile") or {}).get("type") not in (None, *SECCOMP_TYPES):
        problems.append(f"{name}: pod seccompProfile {pod['seccompProfile']['type']!r} (RuntimeDefault or Localhost)")
    problems += _selinux_apparmor(name, pod)
    for key, value in sorted((annotations or {}).items()):
        if key.startswith(APPARMOR_ANNOTATION) and value and value != "runtime/default" \
                and not str(value).startswith("localhost/"):
            problems.append(f"{name}: annotation {key}={value!r} (runtime/default or localhost/*)")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            problems.append(f"{name}: volume {volume.get('name')} is a hostPath")
    for container in all_containers(spec):
        where = f"{name} container {container.get('name')}"
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        beyond = set((context.get("capabilities") or {}).get("add") or []) - set(BASELINE_CAPABILITIES)
        if beyond:
            problems.append(f"{where}: adds capabilities {sorted(beyond)} beyond the baseline's default set")
        if (context.get("seccompProfile") or {}).get("type") not in (None, *SECCOMP_TYPES):
            problems.append(f"{where}: seccompProfile {context['seccompProfile']['type']!r} (RuntimeDefault or Localhost)")
        if context.get("procMount") not in (None, "Default"):
            problems.append(f"{where}: procMount {context['procMount']!r} (only Default)")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}: windowsOptions.hostProcess is not allowed")
        problems += _selinux_apparmor(where, context)
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']}")
        for handler_name, handler in _handlers(container):
            for action in ("httpGet", "tcpSocket"):
                if (handler.get(action) or {}).get("host"):
                    problems.append(f"{where}: {handler_name} {action} sets host {handler[action]['host']!r} "
                                    "(probes and hooks reach only the pod)")
    return problems


def restricted_violations(name: str, spec: dict, annotations: Optional[dict] = None) -> list[str]:
    """Violations of the baseline and restricted Pod Security Standards (all supported Kubernetes versions), plus the
    team's rule that every container decides readOnlyRootFilesystem explicitly. `annotations` are
    the pod's (a template's metadata), where the AppArmor annotations live."""
    problems = baseline_violations(name, spec, annotations)
    pod = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        others = set(volume) - {"name", "hostPath"} - RESTRICTED_VOLUMES
        if others:
            problems.append(f"{name}: volume {volume.get('name')} uses {sorted(others)}")
    for container in all_containers(spec):
        where = f"{name} container {container.get('name')}"
        context = container.get("securityContext") or {}
        capabilities = context.get("capabilities") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: capabilities must drop ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{where}: adds capabilities {sorted(added)}")
        if not (context.get("runAsNonRoot", pod.get("runAsNonRoot")) is True):
            problems.append(f"{where}: runAsNonRoot must be true")
        if context.get("runAsUser", pod.get("runAsUser")) == 0:
            problems.append(f"{where}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_TYPES:
            problems.append(f"{where}: seccompProfile must be RuntimeDefault")
        if "readOnlyRootFilesystem" not in context:
            problems.append(f"{where}: readOnlyRootFilesystem must be decided explicitly")
    return problems


def pod_security_violations(name: str, spec: dict, level: str, annotations: Optional[dict] = None) -> list[str]:
    """Violations of the Pod Security Standard `level` (a namespace's pod-security.kubernetes.io/enforce)."""
    if level not in POD_SECURITY_LEVELS:
        raise ValueError(f"Pod Security level {level!r}: one of {list(POD_SECURITY_LEVELS)}")
    if level == "privileged":
        return []
    return (baseline_violations if level == "baseline" else restricted_violations)(name, spec, annotations)


def _selinux_apparmor(where: str, context: dict) -> list[str]:
    problems = []
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        problems.append(f"{where}: seLinuxOptions.type {selinux['type']!r} (one of {list(SELINUX_TYPES[1:])})")
    for field_name in ("user", "role"):
        if selinux.get(field_name):
            problems.append(f"{where}: seLinuxOptions.{field_name} may not be set")
    apparmor = context.get("appArmorProfile")
    if apparmor is not None and (apparmor or {}).get("type") not in APPARMOR_TYPES:
        problems.append(f"{where}: appArmorProfile.type {(apparmor or {}).get('type')!r} (RuntimeDefault or Localhost)")
    return problems


def _handlers(container: dict) -> Iterator[tuple[str, dict]]:
    """(name, handler) of a container's probes and lifecycle hooks."""
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if isinstance(container.get(probe), dict):
            yield probe, container[probe]
    for hook, handler in (container.get("lifecycle") or {}).items():
        if isinstance(handler, dict):
            yield f"lifecycle.{hook}", handler


def resource_violations(name: str, spec: dict) -> list[str]:
    """Every container has cpu and memory requests and limits, each request at most its limit (the
    API server refuses a larger one at apply: ValidateResourceRequirements)."""
    problems = []
    for container in containers(spec):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(section, {}):
                    problems.append(f"{name} container {container['name']}: no {resource} {section[:-1]}")
        for resource in ("cpu", "memory"):
            request = (resources.get("requests") or {}).get(resource)
            limit = (resources.get("limits") or {}).get(resource)
            asked, allowed = quantities.parse(request), quantities.parse(limit)
            if asked is not None and allowed is not None and asked > allowed:
                problems.append(f"{name} container {container['name']}: {resource} request {request} is more than its "
                                f"limit {limit} (the API server refuses it)")
    return problems


def image_violations(name: str, spec: dict) -> list[str]:
    """Images must carry a digest or a tag with an exact version (`floating_tag_problem`)."""
    problems = []
    for container in all_containers(spec):
        image = container.get("image", "")
        problem = floating_tag_problem(image)
        if problem:
            problems.append(f"{name} container {container.get('name')}: image {image!r} {problem}")
    return problems


def secret_env_violations(name: str, spec: dict) -> list[str]:
    """Environment variables that look like credentials must come from a Secret."""
    problems = []
    for container in all_containers(spec):
        for env in container.get("env") or []:
            if SECRET_ENV_NAME.search(env["name"]) and "value" in env and not env["name"].endswith(("_FILE", "_KEY_NAME")):
                problems.append(f"{name} container {container['name']}: {env['name']} is a literal, not a secretKeyRef")
    return problems


# --- checks shared with the policy pack (policy/rules.py) ---------------------------------------

LONG_RUNNING_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Pod")
"""Kinds whose pods serve until stopped; Jobs and CronJobs run to completion and need no probes."""

PROBE_HANDLERS = ("httpGet", "tcpSocket", "exec", "grpc")


@dataclass(frozen=True)
class HealthEndpoint:
    """What the readiness probe of an image's container must use; a liveness probe is required too."""

    handlers: tuple[str, ...] = PROBE_HANDLERS
    path: Optional[str] = None
    """The HTTP path readiness must request (with handlers ("httpGet",))."""


# Images (repository path without registry host or tag, so mirrors match) with a health endpoint,
# from the reference notes: distribution's debug server (components/registry.py), Armada's services
# (armada/NOTES.md §1: /health on server, scheduler, executor, lookout, binoculars; the ingesters
# have none but /metrics), and the stores, whose health is checked by a command, a port or an HTTP path.
HEALTH_ENDPOINTS: dict[str, HealthEndpoint] = {
    "library/registry": HealthEndpoint(("httpGet",), "/debug/health"),
    "gresearch/armada-server": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-scheduler": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-executor": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-lookout": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-binoculars": HealthEndpoint(("httpGet",), "/health"),
    # The ingesters' only listener is the Prometheus handler (v0.22.7 internal/common/startup.go
    # ServeMetricsFor): probed on /metrics (components/armada/workload.py `metrics_probe`).
    "gresearch/armada-scheduler-ingester": HealthEndpoint(("httpGet",), "/metrics"),
    "gresearch/armada-lookout-ingester": HealthEndpoint(("httpGet",), "/metrics"),
    "gresearch/armada-event-ingester": HealthEndpoint(("httpGet",), "/metrics"),
    "library/postgres": HealthEndpoint(),
    "library/redis": HealthEndpoint(),
    "apachepulsar/pulsar": HealthEndpoint(),
    "library/cassandra": HealthEndpoint(),
    # Store exporters (components/exporters.py): postgres_exporter's landing page, redis_exporter's /health.
    "prometheuscommunity/postgres-exporter": HealthEndpoint(("httpGet",), "/"),
    "oliver006/redis_exporter": HealthEndpoint(("httpGet",), "/health"),
}
NO_HEALTH_ENDPOINT = ("cloudstateio/cloudstate-operator", "library/python", "martizih/kaniko", "library/busybox")
"""Platform images known to serve no health endpoint (the CloudState operator has none; python
runs only the stores' backup uploads, kaniko and busybox only the in-cluster builds' Armada job
pods (components/build_job.py), all run to completion)."""


def image_repository(image: str) -> str:
    """`host[:port]/path/name:tag@digest` -> `host[:port]/path/name`."""
    head, _, last = image.split("@", 1)[0].rpartition("/")
    name = last.split(":", 1)[0]
    return f"{head}/{name}" if head else name


def health_endpoint(image: str) -> Optional[HealthEndpoint]:
    """By the end of the repository, so a mirror's `mirror:5000/hub/library/redis` matches too."""
    repository = image_repository(image)
    for known, endpoint in HEALTH_ENDPOINTS.items():
        if repository == known or repository.endswith("/" + known):
            return endpoint
    return None


def probe_violations(name: str, spec: dict, kind: str) -> list[str]:
    """Long-running containers of images with a health endpoint need readiness (on that endpoint)
    and liveness probes."""
    if kind not in LONG_RUNNING_KINDS:
        return []
    problems = []
    for container in spec["containers"]:
        endpoint = health_endpoint(container.get("image", ""))
        if endpoint is None:
            continue
        where = f"{name} container {container['name']}"
        readiness = container.get("readinessProbe") or {}
        handlers = [h for h in PROBE_HANDLERS if h in readiness]
        if not handlers or handlers[0] not in endpoint.handlers:
            problems.append(f"{where}: needs a readinessProbe ({' or '.join(endpoint.handlers)})")
        elif endpoint.path and (readiness["httpGet"].get("path") != endpoint.path):
            problems.append(
                f"{where}: readinessProbe must request {endpoint.path}, not {readiness['httpGet'].get('path')!r}"
            )
        if not any(h in (container.get("livenessProbe") or {}) for h in PROBE_HANDLERS):
            problems.append(f"{where}: needs a livenessProbe")
    return problems


def digest_violations(name: str, spec: dict) -> list[str]:
    """Every image must be pinned by digest (`…@sha256:<64 hex>`, the whole reference valid)."""
    return [
        f"{name} container {c.get('name')}: image {c.get('image', '')!r} is not pinned by digest (@sha256:…)"
        for c in all_containers(spec)
        if not is_digest_pinned(c.get("image", ""))
    ]


def platform_pins(image: str, pins: dict[str, str]) -> list[str]:
    """The pins (references of infra/versions.py IMAGES) of the repository `image` runs, matched by
    repository path without the registry host, so a mirror's `mirror:5000/hub/library/redis`
    matches `docker.io/library/redis`; none for other images (entities, anything else)."""
    repository = image_repository(image)
    matching = []
    for pin in pins.values():
        path = image_repository(pin).split("/", 1)[-1]
        if repository == path or repository.endswith("/" + path):
            matching.append(pin)
    return matching


def platform_image(image: str, pins: dict[str, str]) -> Optional[str]:
    """The pin of the platform image `image` runs (the one with its tag, if any), or None."""
    matching = platform_pins(image, pins)
    tag = (parse_image(image) or {"tag": None})["tag"]
    return next((p for p in matching if (parse_image(p) or {"tag": None})["tag"] == tag), None) \
        or (matching[0] if matching else None)


def platform_digest_violations(name: str, spec: dict, pins: dict[str, str], allowed: frozenset[str] = frozenset()) -> list[str]:
    """Platform images (those `pins` name) of a pod spec's containers must run by digest, and by a
    digest the pins record for that repository when they record one: whatever infra/versions.py
    says is what may run. By tag only a pin named in `allowed` (the stack's
    platform.images.allowUnpinned) that has no digest."""
    found = (platform_digest_problem(f"{name} container {c.get('name')}", c.get("image", ""), pins, allowed)
             for c in all_containers(spec))
    return [problem for problem in found if problem]


def platform_digest_problem(where: str, image: str, pins: dict[str, str], allowed: frozenset[str] = frozenset()) -> Optional[str]:
    """`platform_digest_violations` for one image, `where` naming what runs it."""
    pin = platform_image(image, pins)
    if pin is None:
        return None
    where = f"{where}: platform image {image!r}"
    digests = {image_digest(p) for p in platform_pins(image, pins)} - {None}
    if not is_digest_pinned(image):
        pin_name = next(n for n, ref in pins.items() if ref == pin)
        if image_digest(pin) is None and pin_name in allowed:
            return None
        return f"{where} is not pinned by digest (infra/versions.py pins {pin!r}): " + image_pins.remedy([pin_name])
    if digests and image_digest(image) not in digests:
        return f"{where} is not the digest infra/versions.py pins ({pin!r})"
    return None


PROXY_CONTAINER = "akka-sidecar"
"""The container the operator adds to each entity pod (v0.6.0 StatefulServiceOperatorFactory.scala `createSideCar`)."""


def operator_images(obj: dict) -> Optional[list[tuple[str, str]]]:
    """(where, image) of what the CloudState operator runs for `obj`, which no pod spec shows: the
    proxy a StatefulService's pods run (its annotation, infra/image_pins.py) and the images the
    operator's ConfigMap names (`proxy.image.<key>`); [] for other objects; None for a
    StatefulService that names no proxy (nothing would show what its pods run)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    described = f"{obj.get('kind')} {meta.get('namespace', '')}/{meta.get('name', '')}"
    if obj.get("kind") == "StatefulService":
        proxy = (meta.get("annotations") or {}).get(image_pins.PROXY_ANNOTATION)
        return [(f"{described} pods' {PROXY_CONTAINER}", proxy)] if isinstance(proxy, str) else None
    data = obj.get("data")
    if obj.get("kind") == "ConfigMap" and meta.get("name") == image_pins.OPERATOR_CONFIG_MAP and isinstance(data, dict) \
            and isinstance(data.get("config"), str):
        images = image_pins.parse_operator_config(data["config"])["proxy.image"]
        return [(f"{described} proxy.image.{key}", image) for key, image in images.items()]
    return []


# Credentials in places that are not Secrets: which names and values are credentials is
# infra/credentials.py's (shared with the stack config's checks of Armada's `extra`).
# `key: value`, `key = value`, `"key": "value"` lines of YAML, JSON, HOCON, properties and env files.
ASSIGNMENT = re.compile(r"""^[ \t]*(?:- )?["']?(?P<key>[A-Za-z_][\w.-]*)["']?[ \t]*[:=][ \t]*(?P<value>\S.*?)[ \t,]*$""",
                        re.MULTILINE)
NOT_A_VALUE = ("", '""', "''", "null", "~", "true", "false", "{", "[", "|", ">", "|-", ">-")


def credential_text_violations(where: str, text: str) -> list[str]:
    """Credential-looking values and `password: …`-style assignments in a text (e.g. a config file,
    read as YAML or JSON where it parses, line by line otherwise)."""
    problems = []
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        parsed = None
    if isinstance(parsed, (dict, list)):
        problems += credential_value_violations(where, parsed)
    if CREDENTIAL_VALUE.search(text):
        problems.append(f"{where}: {LOOKS_LIKE}")
    for match in ASSIGNMENT.finditer(text):
        value = match["value"]
        if is_credential_name(match["key"]) and value not in NOT_A_VALUE and not value.startswith(("${", "$(")):
            problems.append(f"{where}: sets {match['key']} to a literal value")
    return list(dict.fromkeys(problems))


def credential_value_violations(where: str, value) -> list[str]:
    """Credentials in structured data: literals under credential names, credential-looking strings
    (infra/credentials.py `plain_credentials`)."""
    return [f"{where}{path}: {what}" for path, what in plain_credentials(value)]


def configmap_violations(name: str, config_map: dict) -> list[str]:
    """ConfigMaps hold no credentials: no credential-named keys, no credential values or assignments."""
    problems = []
    for section in ("data", "binaryData"):
        for key, value in (config_map.get(section) or {}).items():
            where = f"{name} {section}.{key}"
            if is_credential_name(key):
                problems.append(f"{where}: a credential-named key belongs in a Secret")
            if section == "data" and isinstance(value, str):
                problems += credential_text_violations(where, value)
    return problems


def plain_config_violations(config: dict[str, str], secret_keys: set[str]) -> list[str]:
    """Stack config: every credential is a `secure:` value. `config` maps full keys
    (`project:key`) to their values as the engine passes them (structured values as JSON)."""
    problems = []
    for key in sorted(config):
        if key in secret_keys:
            continue
        raw = config[key]
        try:
            value = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            value = raw
        fix = f"set it with `pulumi config set --secret {key.partition(':')[2] or key} …`"
        if isinstance(value, (dict, list)):
            problems += [f"{p} ({fix} or reference a Secret)" for p in credential_value_violations(key, value)]
        elif is_credential_name(key.partition(":")[2] or key) and value not in ("", None):
            problems.append(f"{key}: a credential in plain config ({fix})")
        elif isinstance(value, str) and CREDENTIAL_VALUE.search(value):
            problems.append(f"{key}: holds a credential in plain config ({fix})")
    return problems


# Credentials on command lines: a pod's command and args are visible to anyone who may read the
# workload (and in `ps` on the node), so they may reference a credential (`$(DB_PASSWORD)` from a
# secretKeyRef, a file path) but never hold one.
CREDENTIAL_FLAGS = ("pass", "pwd", "requirepass", "masterauth")
"""Flag names (compared like is_credential_name) that take a credential without saying `password`."""
FLAG = re.compile(r"^--?(?P<key>[A-Za-z][\w.-]*)(?:=(?P<value>.*))?$", re.DOTALL)
SHELL_ASSIGNMENT = re.compile(r"^(?:export )?(?P<key>[A-Za-z_]\w*)=(?P<value>.*)$", re.DOTALL)


def _is_reference(value: str) -> bool:
    """An environment reference (`$(VAR)` expanded by the kubelet, `$VAR`/`${VAR}` by a shell) or nothing."""
    return value in NOT_A_VALUE or value.startswith("$") or value.startswith(("'$", '"$'))


def _is_credential_flag(key: str) -> bool:
    normal = re.sub(r"[^a-z0-9]", "", key.lower())
    return is_credential_name(key) or normal in CREDENTIAL_FLAGS


def command_lines(container: dict) -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of a container: its command and args, and its probes' and hooks' exec commands."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if argv:
        yield "command/args", argv
    for handler_name, handler in _handlers(container):
        if (handler.get("exec") or {}).get("command"):
            yield f"{handler_name} exec", list(handler["exec"]["command"])


def _words(argv: list[str]) -> list[str]:
    """The argv items, and the words of those that are shell scripts (`sh -c "…"`)."""
    words: list[str] = []
    for item in argv:
        item = str(item)
        if any(c.isspace() for c in item):
            try:
                words += shlex.split(item, comments=False)
            except ValueError:  # unbalanced quotes: split on whitespace
                words += item.split()
        else:
            words.append(item)
    return words


def argument_credential_violations(name: str, spec: dict) -> list[str]:
    """Literal credentials in command lines: `--password=…`, `--password …`, `PASSWORD=…` in a
    script, private keys, password hashes and URLs with passwords."""
    problems = []
    for container in all_containers(spec):
        for where, argv in command_lines(container):
            found: list[str] = []
            if any(CREDENTIAL_VALUE.search(str(item)) for item in argv):
                found.append("a credential value (private key, password hash or URL with a password)")
            words = _words(argv)
            for index, word in enumerate(words):
                flag = FLAG.match(word)
                assignment = SHELL_ASSIGNMENT.match(word)
                if flag and _is_credential_flag(flag["key"]):
                    value = flag["value"]
                    if value is None and index + 1 < len(words) and not words[index + 1].startswith("-"):
                        value = words[index + 1]
                    if value is not None and not _is_reference(value):
                        found.append(f"a literal value for {word.split('=', 1)[0]}")
                elif assignment and is_credential_name(assignment["key"]) and not _is_reference(assignment["value"]):
                    found.append(f"a literal value for {assignment['key']}")
            for finding in dict.fromkeys(found):
                problems.append(f"{name} container {container.get('name')} {where}: {finding} "
                                "(pass it from a Secret: env secretKeyRef and $(VAR), or a mounted file)")
    return problems


# NetworkPolicies: every namespace denies by default and allows flows explicitly.


def is_default_deny(policy: dict) -> bool:
    """Selects every pod, covers both directions and allows nothing."""
    spec = policy.get("spec") or {}
    selector = spec.get("podSelector") or {}
    return (
        not selector.get("matchLabels")
        and not selector.get("matchExpressions")
        and {"Ingress", "Egress"} <= set(spec.get("policyTypes") or [])
        and not spec.get("ingress")
        and not spec.get("egress")
    )


def allows_only_dns(policy: dict) -> bool:
    """Every rule is limited to port 53: the namespace-wide DNS allow, not a flow of a workload."""
    spec = policy.get("spec") or {}
    rules = (spec.get("ingress") or []) + (spec.get("egress") or [])
    return all(rule.get("ports") and all(port.get("port") == 53 for port in rule["ports"]) for rule in rules)


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if not {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]:
            return False
    return True


def pod_labels(obj: dict) -> dict:
    return (pod_template(obj).get("metadata") or {}).get("labels") or {}


def pod_annotations(obj: dict) -> dict:
    return (pod_template(obj).get("metadata") or {}).get("annotations") or {}


def network_policy_violations(objects: list[dict]) -> list[str]:
    """Each Namespace among `objects` has a default-deny NetworkPolicy, and every workload in it is
    selected by a NetworkPolicy that allows one of its flows (beyond DNS)."""
    policies: dict[str, list[dict]] = {}
    for obj in objects:
        if obj.get("kind") == "NetworkPolicy":
            policies.setdefault(obj["metadata"].get("namespace", ""), []).append(obj)
    problems = []
    for namespace in sorted(o["metadata"]["name"] for o in objects if o.get("kind") == "Namespace"):
        in_namespace = policies.get(namespace, [])
        if not any(is_default_deny(p) for p in in_namespace):
            problems.append(f"namespace {namespace}: no default-deny NetworkPolicy (podSelector {{}}, "
                            "policyTypes [Ingress, Egress], no rules)")
        allows = [p for p in in_namespace if not is_default_deny(p) and not allows_only_dns(p)]
        for obj in objects:
            if obj.get("kind") in WORKLOAD_KINDS and obj["metadata"].get("namespace") == namespace:
                labels = pod_labels(obj)
                if not any(selects(p["spec"].get("podSelector") or {}, labels) for p in allows):
                    problems.append(f"{obj['kind']} {namespace}/{obj['metadata']['name']}: no NetworkPolicy "
                                    "allows any of its flows beyond DNS")
    return problems


def _every_address(cidr: object) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def _empty_selector(selector: object) -> bool:
    return isinstance(selector, dict) and not selector.get("matchLabels") and not selector.get("matchExpressions")


def open_peer_violations(name: str, spec: dict, allow_any_address: bool = False,
                         public_egress_ports: Optional[Sequence[int]] = None) -> list[str]:
    """NetworkPolicy rules open to every peer: a rule whose `from`/`to` is missing or empty (the
    NetworkPolicy API reads that as every source or destination, in and outside the cluster), an
    empty peer `{}`, and, unless `allow_any_address` (the stacks' allowAnyAddress/allowAnySource
    opt-ins), ipBlocks that together are open (infra/address_blocks.py: 0.0.0.0/0, ::/0, their halves,
    blocks wider than /8) or every pod of every namespace (namespaceSelector {} without a podSelector
    that narrows it).

    `public_egress_ports` is given only for the builds namespace's egress policy of a stack that sets
    `platform.builds.publicEgress.enabled` (infra/public_egress.py `OptIn.covers`): there, and nowhere
    else, an egress rule may name every address if it is exactly the public-egress rule (every
    non-public block excepted, on those ports only)."""
    problems = []
    for direction, key in (("ingress", "from"), ("egress", "to")):
        for index, rule in enumerate(spec.get(direction) or []):
            where = f"{name} {direction}[{index}]"
            peers = (rule or {}).get(key) if isinstance(rule, dict) or rule is None else None
            if not peers:
                problems.append(f"{where}: no `{key}` peers, which admits every peer (name the peers)")
                continue
            if direction == "egress" and public_egress_ports is not None and not allow_any_address \
                    and any(_every_address((p.get("ipBlock") or {}).get("cidr")) for p in peers if isinstance(p, dict)):
                problems += [f"{where}: not the public-egress rule of {public_egress.KEY}: {reason}"
                             for reason in public_egress.rule_problems(rule, public_egress_ports)]
                continue
            # The rule's address blocks together, so that 0.0.0.0/1 and 128.0.0.0/1 are 0.0.0.0/0 (an
            # except only narrows a block: left out).
            cidrs = [str(p["ipBlock"]["cidr"]) for p in peers
                     if isinstance(p, dict) and isinstance(p.get("ipBlock"), dict) and p["ipBlock"].get("cidr") is not None]
            reason = address_blocks.open_reason(cidrs)
            if reason and not allow_any_address:
                problems.append(f"{where}: ipBlocks {', '.join(cidrs)}: {reason} (infra/address_blocks.py; every "
                                "address needs the stack's allowAnyAddress opt-in and the pack's allowAnyAddress config)")
            for number, peer in enumerate(peers):
                at = f"{where}.{key}[{number}]"
                if not peer:
                    problems.append(f"{at}: an empty peer {{}} (name pods, namespaces or address blocks)")
                    continue
                if "namespaceSelector" in peer and _empty_selector(peer["namespaceSelector"]) \
                        and _empty_selector(peer.get("podSelector", {})) and not allow_any_address:
                    problems.append(f"{at}: namespaceSelector {{}} selects every pod of every namespace")
    return problems


def _service_exposure(service: dict) -> bool:
    spec = service.get("spec") or {}
    return spec.get("type") in ("LoadBalancer", "NodePort") or bool(spec.get("externalIPs"))


ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute")
"""Gateway API routes (gateway.networking.k8s.io): each sends a Gateway's traffic to its backendRefs."""


def route_backends(route: dict) -> list[tuple[Optional[str], Optional[str]]]:
    """(namespace, name) of the Services a Gateway API route forwards or mirrors to (a backendRef's
    kind defaults to Service and its namespace to the route's)."""
    namespace = (route.get("metadata") or {}).get("namespace")
    refs = []
    for rule in (route.get("spec") or {}).get("rules") or []:
        refs += rule.get("backendRefs") or []
        for filter_ in [*(rule.get("filters") or []),
                        *[f for ref in rule.get("backendRefs") or [] for f in ref.get("filters") or []]]:
            if (filter_.get("requestMirror") or {}).get("backendRef"):
                refs.append(filter_["requestMirror"]["backendRef"])
    return [(ref.get("namespace") or namespace, ref.get("name")) for ref in refs
            if ref.get("kind", "Service") == "Service" and ref.get("group", "") in ("", "core")]


def registry_exposure(objects: list[dict]) -> list[dict]:
    """Objects that reach the image registry from outside the cluster: its Services of type
    LoadBalancer or NodePort or with externalIPs, Ingresses and Gateway API routes to its Services.
    The registry's are objects labelled with the registry component, Services selecting pods that
    run the registry image, and Ingresses and routes sending traffic to those Services."""
    registry_pods = [
        (o["metadata"].get("namespace"), pod_labels(o))
        for o in objects
        if o.get("kind") in WORKLOAD_KINDS
        and any(image_repository(c.get("image", "")).endswith("library/registry")
                for c in containers(pod_spec(o)))
    ]

    def is_registry(obj: dict) -> bool:
        return (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "registry"

    services = [
        o for o in objects
        if o.get("kind") == "Service" and (is_registry(o) or any(
            namespace == o["metadata"].get("namespace") and (o.get("spec") or {}).get("selector")
            and selects({"matchLabels": o["spec"]["selector"]}, labels)
            for namespace, labels in registry_pods))
    ]
    names = {(s["metadata"].get("namespace"), s["metadata"]["name"]) for s in services}
    exposed = [s for s in services if _service_exposure(s)]
    for obj in objects:
        if obj.get("kind") == "Ingress":
            spec = obj.get("spec") or {}
            backends = [spec.get("defaultBackend") or {}] + [
                path.get("backend") or {}
                for rule in spec.get("rules") or [] for path in (rule.get("http") or {}).get("paths") or []
            ]
            routes = {(obj["metadata"].get("namespace"), (b.get("service") or {}).get("name")) for b in backends}
        elif obj.get("kind") in ROUTE_KINDS:
            routes = set(route_backends(obj))
        else:
            continue
        if is_registry(obj) or routes & names:
            exposed.append(obj)
    return exposed


def is_node_pull_service(service: dict, node_port: int) -> bool:
    """The registry's documented NodePort (docs/registry.md, components/registry.py `service_spec`):
    type NodePort, externalTrafficPolicy Local (outside clients keep their address, so the
    registry's NetworkPolicy can refuse them), no externalIPs, and one port whose nodePort is
    `node_port`: nodes pull `localhost:<node_port>/…` through it."""
    spec = service.get("spec") or {}
    ports = spec.get("ports") or []
    return (
        spec.get("type") == "NodePort"
        and spec.get("externalTrafficPolicy") == "Local"
        and not spec.get("externalIPs")
        and len(ports) == 1
        and ports[0].get("nodePort") == node_port
    )
