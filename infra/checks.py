"""Checks of rendered objects against the team's standards, as pure functions.

The tests run them on the rendered graph of every stack, and the policy pack (policy/rules.py)
on the resources the Pulumi engine passes it; each returns a list of problems
(empty when fine), so a failure names every offending object at once.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterator, Optional

import yaml

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet")

# Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
SECRET_ENV_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY)", re.IGNORECASE)
PINNED_IMAGE = re.compile(r"^[^\s:@]+(:[0-9]+)?(/[^\s:@]+)*(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def pod_spec(obj: dict) -> dict:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def workloads(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    """(name, pod spec) of every workload among `objects`."""
    for obj in objects:
        if obj.get("kind") in WORKLOAD_KINDS:
            meta = obj["metadata"]
            yield f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}", pod_spec(obj)


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def restricted_violations(name: str, spec: dict) -> list[str]:
    """Violations of the "restricted" Pod Security Standard (Kubernetes 1.29+), plus the team's
    rule that every container decides readOnlyRootFilesystem explicitly."""
    problems = []
    pod = spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(f"{name}: {flag} is not allowed")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"{name}: volume {volume['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    for container in containers(spec):
        where = f"{name} container {container['name']}"
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if "ALL" not in (context.get("capabilities", {}).get("drop") or []):
            problems.append(f"{where}: capabilities must drop ALL")
        added = set(context.get("capabilities", {}).get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{where}: adds capabilities {sorted(added)}")
        if not (context.get("runAsNonRoot", pod.get("runAsNonRoot")) is True):
            problems.append(f"{where}: runAsNonRoot must be true")
        if context.get("runAsUser", pod.get("runAsUser")) == 0:
            problems.append(f"{where}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile must be RuntimeDefault")
        if "readOnlyRootFilesystem" not in context:
            problems.append(f"{where}: readOnlyRootFilesystem must be decided explicitly")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']}")
    return problems


def resource_violations(name: str, spec: dict) -> list[str]:
    problems = []
    for container in containers(spec):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(section, {}):
                    problems.append(f"{name} container {container['name']}: no {resource} {section[:-1]}")
    return problems


def image_violations(name: str, spec: dict) -> list[str]:
    """Images must carry an exact tag or a digest, never `latest`."""
    problems = []
    for container in containers(spec):
        image = container.get("image", "")
        last = image.rsplit("/", 1)[-1]
        if not PINNED_IMAGE.match(image) or (":" not in last and "@" not in last):
            problems.append(f"{name} container {container['name']}: image {image!r} is not pinned")
        elif last.split("@")[0].endswith(":latest"):
            problems.append(f"{name} container {container['name']}: image {image!r} uses latest")
        elif "@" not in last and not re.search(r"[0-9]", last.split(":", 1)[1]):
            # `stable`, `alpine`, `edge`… move like `latest`; an exact version has a number in it.
            problems.append(f"{name} container {container['name']}: image {image!r} has a floating tag")
    return problems


def secret_env_violations(name: str, spec: dict) -> list[str]:
    """Environment variables that look like credentials must come from a Secret."""
    problems = []
    for container in containers(spec):
        for env in container.get("env", []):
            if SECRET_ENV_NAME.search(env["name"]) and "value" in env and not env["name"].endswith(("_FILE", "_KEY_NAME")):
                problems.append(f"{name} container {container['name']}: {env['name']} is a literal, not a secretKeyRef")
    return problems


# --- checks shared with the policy pack (policy/rules.py) ---------------------------------------

LONG_RUNNING_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod")
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
# have none), and the stores, whose health is checked by a command, a port or an HTTP path.
HEALTH_ENDPOINTS: dict[str, HealthEndpoint] = {
    "library/registry": HealthEndpoint(("httpGet",), "/debug/health"),
    "gresearch/armada-server": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-scheduler": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-executor": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-lookout": HealthEndpoint(("httpGet",), "/health"),
    "gresearch/armada-binoculars": HealthEndpoint(("httpGet",), "/health"),
    "library/postgres": HealthEndpoint(),
    "library/redis": HealthEndpoint(),
    "apachepulsar/pulsar": HealthEndpoint(),
    "library/cassandra": HealthEndpoint(),
}
NO_HEALTH_ENDPOINT = (
    "gresearch/armada-scheduler-ingester", "gresearch/armada-lookout-ingester", "gresearch/armada-event-ingester",
    "cloudstateio/cloudstate-operator",
)
"""Platform images known to serve no health endpoint (the CloudState operator has none)."""


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


DIGEST_PINNED = re.compile(r"@sha256:[0-9a-f]{64}$")


def digest_violations(name: str, spec: dict) -> list[str]:
    """Every image must be pinned by digest (`…@sha256:<64 hex>`)."""
    return [
        f"{name} container {c['name']}: image {c.get('image', '')!r} is not pinned by digest (@sha256:…)"
        for c in containers(spec)
        if not DIGEST_PINNED.search(c.get("image", ""))
    ]


# Credentials in places that are not Secrets. Names are compared without case and separators, so
# `DB_PASSWORD`, `dbPassword` and `db-password` are alike; names of a *reference* to a credential
# (a Secret's name, a key in a Secret, a file) are not credentials themselves.
CREDENTIAL_WORDS = ("password", "passwd", "passphrase", "secret", "token", "credential", "privatekey", "apikey",
                    "accesskey")
CREDENTIAL_REFERENCE_ENDINGS = ("existingsecret", "secretname", "secretref", "keyref", "keyname", "passwordkey",
                                "tokenkey", "file", "path", "url", "ttl", "enabled")
CREDENTIAL_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"          # PEM private key
    r"|\$2[abxy]?\$[0-9]{2}\$[./A-Za-z0-9]{53}"    # bcrypt hash (htpasswd)
    r"|\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"  # URL with an inline password
    r"|\bAKIA[0-9A-Z]{16}\b"                       # AWS access key id
)
# `key: value`, `key = value`, `"key": "value"` lines of YAML, JSON, HOCON, properties and env files.
ASSIGNMENT = re.compile(r"""^[ \t]*(?:- )?["']?(?P<key>[A-Za-z_][\w.-]*)["']?[ \t]*[:=][ \t]*(?P<value>\S.*?)[ \t,]*$""",
                        re.MULTILINE)
NOT_A_VALUE = ("", '""', "''", "null", "~", "true", "false", "{", "[", "|", ">", "|-", ">-")


def is_credential_name(key: str) -> bool:
    normal = re.sub(r"[^a-z0-9]", "", key.rsplit(".", 1)[-1].lower())
    return any(word in normal for word in CREDENTIAL_WORDS) and not normal.endswith(CREDENTIAL_REFERENCE_ENDINGS)


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
        problems.append(f"{where}: holds a credential (private key, password hash or URL with a password)")
    for match in ASSIGNMENT.finditer(text):
        value = match["value"]
        if is_credential_name(match["key"]) and value not in NOT_A_VALUE and not value.startswith(("${", "$(")):
            problems.append(f"{where}: sets {match['key']} to a literal value")
    return list(dict.fromkeys(problems))


def credential_value_violations(where: str, value) -> list[str]:
    """Credentials in structured data: scalars under credential names, credential-looking strings."""
    if isinstance(value, dict):
        problems = []
        for key, item in value.items():
            path = f"{where}.{key}"
            if is_credential_name(str(key)) and isinstance(item, (str, int, float)) and not isinstance(item, bool) \
                    and item != "" and not str(item).startswith(("${", "$(")):  # an environment reference
                problems.append(f"{path}: a credential in plain text")
            else:
                problems += credential_value_violations(path, item)
        return problems
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in credential_value_violations(f"{where}[{index}]", item)]
    if isinstance(value, str) and CREDENTIAL_VALUE.search(value):
        return [f"{where}: holds a credential (private key, password hash or URL with a password)"]
    return []


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
    if obj["kind"] == "Pod":
        return obj.get("metadata", {}).get("labels") or {}
    template = obj["spec"]["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" else obj["spec"]["template"]
    return (template.get("metadata") or {}).get("labels") or {}


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


def registry_exposure(objects: list[dict]) -> list[dict]:
    """LoadBalancer Services and Ingresses that reach the image registry: objects labelled with the
    registry component, Services selecting pods that run the registry image, and Ingresses routing
    to those Services."""
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
    exposed = [s for s in services if (s.get("spec") or {}).get("type") == "LoadBalancer"]
    for obj in objects:
        if obj.get("kind") != "Ingress":
            continue
        spec = obj.get("spec") or {}
        backends = [spec.get("defaultBackend") or {}] + [
            path.get("backend") or {}
            for rule in spec.get("rules") or [] for path in (rule.get("http") or {}).get("paths") or []
        ]
        routes = {(obj["metadata"].get("namespace"), (b.get("service") or {}).get("name")) for b in backends}
        if is_registry(obj) or routes & names:
            exposed.append(obj)
    return exposed
