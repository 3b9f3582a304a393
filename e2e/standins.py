"""What answers behind the pods that `pulumi up` itself talks to, since kwok runs no containers.

- `RegistryStandIn`: the registry pod's own container, run locally. For each registry pod the program
  creates, it materialises the pod's volumes (its ConfigMap, its Secret's items, its claim as a
  directory) and environment (secretKeyRef) exactly as the kubelet would mount them, starts the same
  program the image runs (CNCF distribution `registry serve <config>`, built from the version the
  image pins) on that config with only the listen addresses and mount paths made local, and
  forwards the pod's ports to it (kwok ClusterPortForward). The pod becomes Ready only once the
  registry answers its readiness probe (kwok's pod-ready stage waits for `SERVING`, set here).
- `ClusterArmada`: tests/fake_armada.py's REST API of Armada, with Armada's basic authentication
  against the users of the server's own auth Secret in the cluster (read when a request comes).
- `ClusterExecutor`: tests/fake_executor.py's executor, except that each build pod is created in the
  API server as the executor's ServiceAccount would create it (real validation, Pod Security
  admission and RBAC), with the registry credentials read from the Secret the pod mounts.
"""
from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

import requests
import yaml

from e2e.cluster import SERVING, Cluster, free_port
from tests.fake_armada import UNAUTHENTICATED, FakeArmada, Job, error_body
from tests.fake_executor import CONTEXT_ANNOTATION, CONTEXT_REF, BuildFailed, FakeExecutor

COMPONENT_LABEL = "app.kubernetes.io/component"
REGISTRY_COMPONENT = "registry"
"""components/registry.py labels its pod with component `registry`."""


def _secret_data(cluster: Cluster, namespace: str, name: str) -> dict[str, bytes]:
    secret = cluster.api("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
    if secret is None:
        raise LookupError(f"Secret {namespace}/{name} does not exist")
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _config_map_data(cluster: Cluster, namespace: str, name: str) -> dict[str, bytes]:
    found = cluster.api("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    if found is None:
        raise LookupError(f"ConfigMap {namespace}/{name} does not exist")
    return {k: v.encode() for k, v in (found.get("data") or {}).items()}


class RegistryStandIn:
    """`start()` watches for registry pods and runs their containers here: distribution (`registry
    serve <config>`, the binary the image pins) and the gate in front of it (components/
    registry_gate.py, the ConfigMap's script under this machine's Python). `url` is the pod's
    serving port (the gate) as reached locally."""

    SERVING_PORT = 5000
    """The pod port the registry Service targets (components/registry.py: the gate)."""

    def __init__(self, cluster: Cluster, binary: Path, work: Path):
        self.cluster, self.binary, self.work = cluster, binary, work
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports: dict[int, int] = {}  # port inside the pod -> local port
        self.served: dict[str, str] = {}  # pod uid -> namespace/name, pods marked serving
        self.errors: list[str] = []
        self._signature = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="registry-stand-in")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.get(self.SERVING_PORT, 0)}"

    def start(self) -> "RegistryStandIn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._end_processes()

    def _end_processes(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)
        self.processes.clear()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            try:
                pods = self.cluster.api("GET", "/api/v1/pods", labelSelector=f"{COMPONENT_LABEL}={REGISTRY_COMPONENT}")
                for pod in (pods or {}).get("items", []):
                    if not pod["metadata"].get("deletionTimestamp"):
                        self._serve(pod)
            except Exception as error:  # noqa: BLE001 - report, keep watching
                message = f"{type(error).__name__}: {error}"
                if not self.errors or self.errors[-1] != message:
                    self.errors.append(message)

    def _serve(self, pod: dict) -> None:
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        root = self.work / "root"
        envs = self._materialise(pod, root)
        mounted = sorted(str(p.relative_to(root)) + p.read_text(errors="replace")
                         for p in root.rglob("*") if p.is_file() and "var/lib/registry" not in str(p))
        signature = json.dumps([namespace, pod["spec"]["containers"], mounted, sorted(envs.items())])
        if signature != self._signature or any(p.poll() is not None for p in self.processes.values()):
            self._restart(pod, root, envs)
            self._signature = signature
        if uid not in self.served:
            self.cluster.api("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                             {"metadata": {"annotations": {SERVING: "true"}}})
            self.served[uid] = f"{namespace}/{pod['metadata']['name']}"

    def _materialise(self, pod: dict, root: Path) -> dict[str, str]:
        """Every container's mounts under one local root (kubelet semantics: ConfigMap keys and Secret
        items as files, a claim as a directory that outlives the pod); returns each container's
        environment as JSON text by container name."""
        namespace = pod["metadata"]["namespace"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        envs = {}
        for container in pod["spec"]["containers"]:
            for mount in container.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                target = root / mount["mountPath"].lstrip("/")
                if "persistentVolumeClaim" in volume:
                    claim = self.work / "claims" / namespace / volume["persistentVolumeClaim"]["claimName"]
                    claim.mkdir(parents=True, exist_ok=True)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if not target.is_symlink():
                        target.symlink_to(claim)
                    continue
                if "configMap" in volume:
                    data = _config_map_data(self.cluster, namespace, volume["configMap"]["name"])
                    items = volume["configMap"].get("items")
                elif "secret" in volume:
                    data = _secret_data(self.cluster, namespace, volume["secret"]["secretName"])
                    items = volume["secret"].get("items")
                else:
                    target.mkdir(parents=True, exist_ok=True)  # emptyDir and the like
                    continue
                target.mkdir(parents=True, exist_ok=True)
                for key, path in ([(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]):
                    file = target / path
                    if not file.exists() or file.read_bytes() != data[key]:
                        file.write_bytes(data[key])  # a new mtime: distribution re-reads htpasswd
            env: dict[str, str] = {}
            for variable in container.get("env", []):
                if "value" in variable:
                    env[variable["name"]] = variable["value"]
                elif "secretKeyRef" in variable.get("valueFrom", {}):
                    ref = variable["valueFrom"]["secretKeyRef"]
                    env[variable["name"]] = _secret_data(self.cluster, namespace, ref["name"])[ref["key"]].decode()
            envs[container["name"]] = json.dumps(env, sort_keys=True)
        return envs

    def _local(self, address: str) -> str:
        """An address inside the pod (`:5000`, `127.0.0.1:5002`) as a local one, one free port each."""
        port = int(address.rsplit(":", 1)[1])
        self.ports.setdefault(port, free_port())
        return f"127.0.0.1:{self.ports[port]}"

    def _command(self, container: dict, root: Path) -> list[str]:
        """The container's command here: absolute paths under its mounts local, addresses local;
        distribution's config rewritten the same way (only addresses and paths change)."""
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]

        def local(arg: str) -> str:
            if any(arg == m or arg.startswith(m.rstrip("/") + "/") for m in mounts):
                return str(root / arg.lstrip("/"))
            return self._local(arg) if re.fullmatch(r"(127\.0\.0\.1|0\.0\.0\.0)?:\d+", arg) else arg

        if container["name"] == "registry":
            config_file = Path(local(container["args"][0]))
            settings = yaml.safe_load(config_file.read_text())
            filesystem = settings["storage"]["filesystem"]
            filesystem["rootdirectory"] = local(filesystem["rootdirectory"])
            settings["auth"]["htpasswd"]["path"] = local(settings["auth"]["htpasswd"]["path"])
            settings["http"]["addr"] = self._local(settings["http"]["addr"])
            if settings["http"].get("debug"):
                settings["http"]["debug"]["addr"] = self._local(settings["http"]["debug"]["addr"])
            local_config = self.work / "config.yml"
            local_config.write_text(yaml.safe_dump(settings))
            return [str(self.binary / "registry"), "serve", str(local_config)]
        command = [local(a) for a in [*container.get("command", []), *container.get("args", [])]]
        if command and command[0] == "python3":
            command[0] = sys.executable  # the image's interpreter; the gate runs on 3.11 to 3.13
        return command

    def _restart(self, pod: dict, root: Path, envs: dict[str, str]) -> None:
        self._end_processes()
        namespace = pod["metadata"]["namespace"]
        for container in pod["spec"]["containers"]:
            for port in container.get("ports", []):
                self._local(f":{port['containerPort']}")
            log = (self.work / f"{container['name']}.log").open("ab")
            self.processes[container["name"]] = subprocess.Popen(
                self._command(container, root), env=json.loads(envs[container["name"]]), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, cwd=self.work)
            log.close()
        # Ready as the pod's own probes say (components/registry.py: each container's readinessProbe).
        deadline = time.monotonic() + 30
        def probe_url(container: dict) -> str:
            get = container["readinessProbe"]["httpGet"]
            port = get["port"]
            if isinstance(port, str):  # a named port of the container
                port = next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == port)
            return f"http://{self._local(f':{port}')}{get.get('path', '/')}"
        probes = [probe_url(c) for c in pod["spec"]["containers"] if "httpGet" in c.get("readinessProbe", {})]
        for probe in probes:
            while True:
                try:
                    if requests.get(probe, timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the registry stand-in did not answer {probe}: see {self.work}/*.log")
                time.sleep(0.05)
        for container in pod["spec"]["containers"]:
            for port in container.get("ports", []):
                inside = port["containerPort"]
                self.cluster.forward(f"registry-{namespace}-{inside}", [namespace], inside, self.ports[inside])


class ClusterArmada(FakeArmada):
    """The fake Armada REST API, accepting exactly the users and passwords of the server's auth Secret
    (`<armada namespace>/armada-server-auth`, auth.yaml `auth.basicAuth.users`, components/armada/auth.py)
    as Armada's basic authenticator does (internal/common/auth/basic.go: unknown user or wrong password
    is Unauthenticated)."""

    AUTH_SECRET, AUTH_KEY = "armada-server-auth", "auth.yaml"

    def __init__(self, cluster: Cluster, namespace: str):
        super().__init__()
        self.cluster, self.namespace = cluster, namespace
        self.refused: list[str] = []

    def _users(self) -> dict[str, str]:
        try:
            text = _secret_data(self.cluster, self.namespace, self.AUTH_SECRET)[self.AUTH_KEY]
        except LookupError:
            return {}
        users = (yaml.safe_load(text) or {}).get("auth", {}).get("basicAuth", {}).get("users", {})
        return {name: entry.get("password", "") for name, entry in users.items()}

    def handle(self, method: str, path: str, body, authorization: Optional[str] = None):
        user, password = "", None
        if authorization and authorization.startswith("Basic "):
            try:
                user, password = base64.b64decode(authorization[6:]).decode().split(":", 1)
            except ValueError:
                pass
        if password is None or self._users().get(user) != password:
            self.refused.append(f"{time.strftime('%H:%M:%S')} {method} {path} as {user or 'anonymous'}"
                                f" ({'unknown user' if user not in self._users() else 'wrong password'})")
            return 401, error_body(UNAUTHENTICATED, "Request could not be authenticated")
        return super().handle(method, path, body, authorization)


def executor_pod(job: Job, run_id: str) -> dict:
    """The pod Armada's executor creates for a job run (armada v0.22.7 internal/executor/util/
    kubernetes_object.go CreatePodFromExecutorApiJob): the item's labels plus armada_job_id,
    armada_job_run_id, armada_queue_id, armada_pod_number 0 and armada_pod_count 1; its annotations
    plus armada_jobset_id and armada_owner; restartPolicy Never; ARMADA_JOB_ID, ARMADA_QUEUE and
    ARMADA_JOB_SET_ID in every container that does not set them (injectArmadaEnvVars; no gang
    annotations here). The executor's podDefaults are unset in the program's executor config."""
    spec = copy.deepcopy(job.pod_spec)
    spec["restartPolicy"] = "Never"
    injected = [{"name": "ARMADA_JOB_ID", "value": job.id}, {"name": "ARMADA_QUEUE", "value": job.queue},
                {"name": "ARMADA_JOB_SET_ID", "value": job.job_set_id}]
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        names = {e["name"] for e in container.get("env", [])}
        container["env"] = container.get("env", []) + [e for e in injected if e["name"] not in names]
    labels = {**(job.item.get("labels") or {}), "armada_job_id": job.id, "armada_job_run_id": run_id,
              "armada_queue_id": job.queue, "armada_pod_number": "0", "armada_pod_count": "1"}
    annotations = {**(job.item.get("annotations") or {}), "armada_jobset_id": job.job_set_id, "armada_owner": job.owner}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": job.pod_name, "namespace": job.item.get("namespace", ""), "labels": labels,
                         "annotations": annotations},
            "spec": spec}


class ClusterExecutor(FakeExecutor):
    """Build pods are created in the API server as `service_account` (e.g.
    system:serviceaccount:armada:armada-executor) would create them; the context and the image go to
    the local registry stand-in with the credentials of the Secret the pod mounts."""

    def __init__(self, armada: ClusterArmada, cluster: Cluster, registry: RegistryStandIn,
                 contexts: Callable[[str, str], tuple[Path, str]], service_account: Callable[[], str]):
        self.cluster, self.service_account = cluster, service_account
        self.created: list[str] = []  # namespace/name of the pods the API server admitted
        self.refusals: list[str] = []
        self._credentials = threading.local()
        super().__init__(armada, registry, contexts, registry_host="", credentials=("", ""), builders=True)

    @property
    def credentials(self) -> tuple[str, str]:
        return getattr(self._credentials, "value", ("", ""))

    @credentials.setter
    def credentials(self, value: tuple[str, str]) -> None:
        self._credentials.value = value

    def run(self, job: Job) -> None:
        super().run(job)
        namespace = job.item.get("namespace", "")
        if f"{namespace}/{job.pod_name}" in self.created:  # the executor cleans up its pods
            self.cluster.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{job.pod_name}")

    def _admit(self, job: Job, spec: dict) -> None:
        namespace = job.item.get("namespace", "")
        pod = executor_pod(job, str(uuid.uuid4()))
        user = self.service_account()  # system:serviceaccount:<namespace>:<name>
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}", "system:authenticated")
        created = self.cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False,
                                       as_user=user, as_groups=groups)
        if created.returncode != 0:
            message = created.stderr.strip().removeprefix("Error from server (Forbidden): ")
            self.refusals.append(message)
            raise BuildFailed(message)
        self.created.append(f"{namespace}/{job.pod_name}")
        self.credentials = self._mounted_credentials(namespace, spec)
        if not self.registry_host:
            self.registry_host = self._context_host(job)

    def _mounted_credentials(self, namespace: str, spec: dict) -> tuple[str, str]:
        """The username and password of the dockerconfigjson Secret the build pod mounts."""
        for volume in spec.get("volumes", []):
            secret = volume.get("secret", {}).get("secretName")
            if not secret:
                continue
            data = _secret_data(self.cluster, namespace, secret)
            for key in (".dockerconfigjson", "config.json"):
                if key in data:
                    auths = json.loads(data[key])["auths"]
                    entry = next(iter(auths.values()))
                    return entry["username"], entry["password"]
        raise BuildFailed("the build pod mounts no registry credentials")

    def _context_host(self, job: Job) -> str:
        """The registry host the build pod names, which must be a Service of the cluster
        (`<service>.<namespace>.svc[.cluster.local]:<port>`): pods reach nothing else."""
        match = CONTEXT_REF.fullmatch((job.item.get("annotations") or {}).get(CONTEXT_ANNOTATION, ""))
        if not match:
            return ""
        host, _, port = match["host"].partition(":")
        parts = host.split(".")
        service = None
        if len(parts) >= 3 and parts[2] == "svc" and port.isdigit():
            service = self.cluster.api("GET", f"/api/v1/namespaces/{parts[1]}/services/{parts[0]}")
        if service is None or int(port) not in [p["port"] for p in service["spec"].get("ports", [])]:
            raise BuildFailed(f"the build pod reaches the registry at {match['host']!r}, not a Service of this cluster")
        return match["host"]
