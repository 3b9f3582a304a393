"""Checks of rendered objects against the team's standards, as pure functions.

The tests run them on the rendered graph of every stack; each returns a list of problems
(empty when fine), so a failure names every offending object at once.
"""
from __future__ import annotations

import re
from typing import Iterator

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
    return problems


def secret_env_violations(name: str, spec: dict) -> list[str]:
    """Environment variables that look like credentials must come from a Secret."""
    problems = []
    for container in containers(spec):
        for env in container.get("env", []):
            if SECRET_ENV_NAME.search(env["name"]) and "value" in env and not env["name"].endswith(("_FILE", "_KEY_NAME")):
                problems.append(f"{name} container {container['name']}: {env['name']} is a literal, not a secretKeyRef")
    return problems
