"""A real Kubernetes control plane with fake nodes, as local processes, for the end-to-end tier.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are the real binaries
(e2e/build-tools.sh); kwok plays the kubelets of `NODES` fake nodes: pods become Running and Ready,
Job pods complete, claims get a volume, and `pods/portforward` reaches the local process a
ClusterPortForward names (kwok pkg/kwok/server/debugging_port_forword.go), so a port-forward
through the API server (kubectl's, components/kube_tunnel.py's) lands on a local stand-in.

The API server runs as kubeadm would configure it where it matters here: RBAC and Node
authorization, its default admission plugins (Pod Security, ValidatingAdmissionPolicy, default
StorageClass, ...) plus NodeRestriction, service-account tokens; the controller manager uses one
service account per controller, as on a real cluster, so the pods it creates pass the same
admission. Nothing here is a model of Kubernetes; what is fake is only what kwok fakes (no
containers run, no network policy is enforced: there is no CNI).
"""
from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import requests
import yaml

NODES = 3
NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "200Gi"}
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
START_TIMEOUT = 120.0
STAND_IN_COMPONENTS = ("registry",)
"""Pods (by app.kubernetes.io/component) whose container runs locally (e2e/standins.py): kwok makes
them Ready only once the stand-in serves and sets SERVING on the pod, as a readiness probe would."""
SERVING = "e2e.cloudstation.io/serving"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, one serving/client certificate (system:masters, with the API server's names) used by
    the control plane and kwok as kwokctl does, a controller-manager and a scheduler identity, and
    the service-account signing key."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {name: directory / name for name in (
        "ca.key", "ca.crt", "admin.key", "admin.crt", "sa.key", "sa.pub")}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=e2e-ca",
             "-keyout", str(files["ca.key"]), "-out", str(files["ca.crt"]))
    ext = directory / "admin.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
                   "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    csr = directory / "admin.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/O=system:masters/CN=e2e-admin",
             "-keyout", str(files["admin.key"]), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca.crt"]), "-CAkey", str(files["ca.key"]),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(files["admin.crt"]))
    _openssl("genrsa", "-out", str(files["sa.key"]), "2048")
    _openssl("rsa", "-in", str(files["sa.key"]), "-pubout", "-out", str(files["sa.pub"]))
    return files


def with_stand_ins(stages: list[dict]) -> list[dict]:
    """kwok's pod-ready stage for every pod but the stand-ins', and a copy for theirs that also waits
    for SERVING."""
    component = '.metadata.labels.["app.kubernetes.io/component"]'
    result = []
    for stage in stages:
        if stage["metadata"]["name"] != "pod-ready":
            result.append(stage)
            continue
        held = copy.deepcopy(stage)
        stage["spec"]["selector"]["matchExpressions"].append(
            {"key": component, "operator": "NotIn", "values": list(STAND_IN_COMPONENTS)})
        held["metadata"]["name"] = "pod-ready-stand-in"
        held["spec"]["selector"]["matchExpressions"] += [
            {"key": component, "operator": "In", "values": list(STAND_IN_COMPONENTS)},
            {"key": f'.metadata.annotations.["{SERVING}"]', "operator": "In", "values": ["true"]},
        ]
        result += [stage, held]
    return result


def kubeconfig(server: str, pki: dict[str, Path], user: str = "e2e-admin") -> dict:
    """A kubeconfig with embedded credentials (components/kube_tunnel.py and the Kubernetes provider
    read it like any user's)."""
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority-data": b64(pki["ca.crt"])}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(pki["admin.crt"]),
                                          "client-key-data": b64(pki["admin.key"])}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
    }


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Cluster:
    """The control plane of one Kubernetes version; `start()` brings it up, `stop()` ends every
    process it started. `kubeconfig` is a file with the admin's credentials."""

    work: Path
    kubernetes_bin: Path
    etcd_bin: Path
    kwok_bin: Path
    processes: list[Process] = field(default_factory=list)
    api_port: int = 0
    kubelet_port: int = 0
    session: Optional[requests.Session] = None

    @property
    def kubeconfig(self) -> Path:
        return self.work / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def kubectl(self, *args: str, input: Optional[str] = None, check: bool = True,
                as_user: Optional[str] = None, as_groups: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        command = [str(self.kubernetes_bin / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        if as_user:
            command += ["--as", as_user, *(f"--as-group={group}" for group in as_groups)]
        result = subprocess.run([*command, *args], input=input, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def api(self, method: str, path: str, body: Optional[dict] = None, **params) -> Optional[dict]:
        """One call of the API server as the admin; None for 404."""
        if self.session is None:
            self.session = requests.Session()
            self.session.cert = (str(self.work / "pki" / "admin.crt"), str(self.work / "pki" / "admin.key"))
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        # `verify` per request: a session's would lose to REQUESTS_CA_BUNDLE from the environment.
        answer = self.session.request(method, self.server + path, json=body, params=params, headers=headers,
                                      timeout=30, verify=str(self.work / "pki" / "ca.crt"))
        if answer.status_code == 404:
            return None
        if answer.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text[:500]}")
        return answer.json()

    def apply(self, manifest: str | dict | list) -> None:
        if not isinstance(manifest, str):
            items = manifest if isinstance(manifest, list) else [manifest]
            manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=manifest)

    def _spawn(self, name: str, argv: list[str]) -> Process:
        log = self.work / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = log.open("ab")
        popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        handle.close()
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def _wait(self, what: str, ready, process: Optional[Process] = None, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None and process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}")
            try:
                if ready():
                    return
            except (OSError, ValueError, RuntimeError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready after {timeout:.0f} s" + (f":\n{process.tail()}" if process else ""))

    def start(self) -> "Cluster":
        self.work.mkdir(parents=True, exist_ok=True)
        pki = make_pki(self.work / "pki")
        etcd_port, etcd_peer = free_port(), free_port()
        self.api_port, self.kubelet_port = free_port(), free_port()

        etcd = self._spawn("etcd", [
            str(self.etcd_bin / "etcd"), "--data-dir", str(self.work / "etcd"), "--name", "e2e",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"e2e=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])
        self._wait("etcd", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{etcd_port}/health", timeout=2).status == 200, etcd)

        apiserver = self._spawn("kube-apiserver", [
            str(self.kubernetes_bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            # Loopback only: no endpoint for the `kubernetes` Service (it refuses a loopback address),
            # which nothing in this tier reaches from a pod.
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={pki['admin.crt']}", f"--tls-private-key-file={pki['admin.key']}",
            f"--client-ca-file={pki['ca.crt']}",
            f"--kubelet-client-certificate={pki['admin.crt']}", f"--kubelet-client-key={pki['admin.key']}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-key-file={pki['sa.pub']}", f"--service-account-signing-key-file={pki['sa.key']}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            "--profiling=false", "--v=1",
        ])
        self.kubeconfig.write_text(json.dumps(kubeconfig(self.server, pki)))
        context = ssl.create_default_context(cafile=str(pki["ca.crt"]))
        context.load_cert_chain(str(pki["admin.crt"]), str(pki["admin.key"]))
        self._wait("kube-apiserver", lambda: urllib.request.urlopen(
            f"{self.server}/readyz", context=context, timeout=5).status == 200, apiserver)

        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--v=1"]
        self._spawn("kube-controller-manager", [
            str(self.kubernetes_bin / "kube-controller-manager"), *common,
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki['sa.key']}", f"--root-ca-file={pki['ca.crt']}",
            f"--cluster-signing-cert-file={pki['ca.crt']}", f"--cluster-signing-key-file={pki['ca.key']}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ])
        self._spawn("kube-scheduler", [
            str(self.kubernetes_bin / "kube-scheduler"), *common,
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
        ])

        # kwok: its port-forward CRDs and the default StorageClass it provisions for, then the
        # controller with the module's stages, then the nodes it plays.
        manifests = sorted((self.kwok_bin / "manifests").glob("*.yaml"))
        self.kubectl("apply", "--server-side", *(arg for m in manifests for arg in ("-f", str(m))))
        stages = [yaml.safe_load(p.read_text()) for p in sorted((self.kwok_bin / "stages").glob("*.yaml"))]
        (self.work / "kwok.yaml").write_text(yaml.safe_dump_all(with_stand_ins(stages)))
        kwok = self._spawn("kwok", [
            str(self.kwok_bin / "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={self.work / 'kwok.yaml'}",
            "--manage-all-nodes=true", "--node-ip=127.0.0.1", f"--node-port={self.kubelet_port}",
            f"--server-address=127.0.0.1:{self.kubelet_port}",
            f"--tls-cert-file={pki['admin.crt']}", f"--tls-private-key-file={pki['admin.key']}",
            f"--cidr={POD_CIDR}", "--enable-crds=PortForward,ClusterPortForward",
            "--node-lease-duration-seconds=40",
        ])
        self.apply([{
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"kwok-node-{index}", "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": f"kwok-node-{index}", "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY},
        } for index in range(NODES)])

        def nodes_ready() -> bool:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            return len(nodes) == NODES and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
                for n in nodes)
        self._wait("kwok nodes", nodes_ready, kwok)

        def default_service_account() -> bool:
            return self.kubectl("-n", "default", "get", "serviceaccount", "default", check=False).returncode == 0
        self._wait("kube-controller-manager (default service account)", default_service_account)
        return self

    def forward(self, name: str, namespaces: list[str], port: int, target_port: int) -> None:
        """Pods in `namespaces` that a port-forward reaches on `port` answer from 127.0.0.1:`target_port`."""
        self.apply({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterPortForward", "metadata": {"name": name},
            "spec": {"selector": {"matchNamespaces": namespaces},
                     "forwards": [{"ports": [port], "target": {"address": "127.0.0.1", "port": target_port}}]},
        })

    def version(self) -> str:
        return json.loads(self.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.popen.poll() is None:
                try:
                    os.killpg(process.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for process in reversed(self.processes):
            try:
                process.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.popen.pid, signal.SIGKILL)
                process.popen.wait()
        self.processes.clear()


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
