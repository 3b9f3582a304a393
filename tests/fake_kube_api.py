"""A fake Kubernetes API server for the registry tunnel tests (components/kube_tunnel.py): plain
http on 127.0.0.1, a bearer token it requires, the two calls a port-forward needs and the one read of a
kept Secret (components/kept_secret.py):

- `GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...` -> a PodList (equality selectors);
- `GET /api/v1/namespaces/{ns}/secrets/{name}` -> the Secret put in `secrets` (`add_secret`, values
  base64 as the API server answers them), else 404 `secrets "{name}" not found`, as the API server
  answers also when the namespace does not exist;
- `GET /api/v1/namespaces/{ns}/pods/{name}/portforward?ports=N` with a WebSocket upgrade, protocol
  `v4.channel.k8s.io` as kubelet speaks it for port-forward: per port a data channel (0) and an
  error channel (1), the first frame of each carrying the port as a little-endian uint16, then the
  data relayed both ways to the pod's address for that port (a real server, e.g. docker-registry).
  A pod whose address refuses gets an error-channel message, as kubelet sends one: JSON
  `{"closeConnection": true, "message": ...}` (kubernetes pkg/kubelet/cri/streaming/portforward/
  portforward.go `handleStreamPortForwardErr`), or plain text as older kubelets wrote
  (`error_format="text"`).

`tls=True` serves https with a self-signed certificate for 127.0.0.1 (`ca_pem`), e.g. for the
in-cluster configuration, which is always https.

Refusals answer a `Status` object as the API server does: 401 without the token, 403 for a
(verb, resource) in `forbidden` (e.g. ("create", "pods/portforward"), ("get", "secrets")), 404 for an
unknown pod or Secret.
`write_kubeconfig` writes a kubeconfig pointing at the server. Everything it was asked is in
`requests` (method, path, verb-resource), and every opened tunnel in `tunnels` (pod, port, bytes
each way), so a test can tell a tunnel was used."""
from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PROTOCOL = "v4.channel.k8s.io"
TOKEN = "fake-kube-token-for-tests"


@dataclass
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    ports: dict[int, tuple[str, int]]
    """Container port -> the (host, port) this fake connects to for it."""
    phase: str = "Running"
    ready: bool = True

    def as_object(self) -> dict:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(self.labels)},
            "status": {"phase": self.phase,
                       "conditions": [{"type": "Ready", "status": "True" if self.ready else "False"}]},
        }


@dataclass
class Tunnel:
    pod: str
    port: int
    sent: int = 0
    received: int = 0
    relay: Optional["_Relay"] = field(default=None, repr=False, compare=False)


@dataclass
class FakeKubeApi:
    token: str = TOKEN
    pods: list[Pod] = field(default_factory=list)
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    tunnels: list[Tunnel] = field(default_factory=list)
    handshake_delay: float = 0.0
    """Seconds before a port-forward's upgrade is answered (a slow API server or kubelet)."""
    handshake_delays: list[float] = field(default_factory=list)
    """Delays for the next handshakes, one each in order (then `handshake_delay`)."""
    error_format: str = "json"
    tls: bool = False
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """(namespace, name) -> the Secret's `data` (base64 values)."""

    def __post_init__(self):
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.ca_pem = b""
        if self.tls:
            import ssl

            self.ca_pem, key_pem = _self_signed("127.0.0.1")
            directory = Path(tempfile.mkdtemp(prefix="fake-kube-tls-"))
            (directory / "cert.pem").write_bytes(self.ca_pem)
            (directory / "key.pem").write_bytes(key_pem)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeKubeApi":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_pod(self, name: str, namespace: str, labels: dict[str, str], ports: dict[int, tuple[str, int]],
                **status) -> Pod:
        pod = Pod(name, namespace, dict(labels), dict(ports), **status)
        with self.lock:
            self.pods.append(pod)
        return pod

    def add_secret(self, namespace: str, name: str, values: dict[str, str]) -> None:
        """A Secret holding `values` (plain text; stored base64 as `data`, as the API server keeps it)."""
        with self.lock:
            self.secrets[(namespace, name)] = {key: base64.b64encode(value.encode()).decode()
                                               for key, value in values.items()}

    def remove_pod(self, name: str) -> None:
        with self.lock:
            self.pods = [p for p in self.pods if p.name != name]

    def write_kubeconfig(self, path: Path, *, context: str = "fake", token: Optional[str] = None,
                         current: Optional[str] = None, extra_contexts: dict[str, str] = {},
                         server: Optional[str] = None, insecure: bool = False) -> Path:
        """A kubeconfig with context `context` (this server, or `server`; `token` or the right one)
        and, for each `extra_contexts` name -> server URL, another context whose cluster is that URL;
        current-context `current` (default `context`). With TLS, the CA is inline unless `insecure`
        (`insecure-skip-tls-verify: true`)."""
        servers = {context: server or self.url, **extra_contexts}

        def cluster(url: str) -> dict:
            if not url.startswith("https:"):
                return {"server": url}
            if insecure:
                return {"server": url, "insecure-skip-tls-verify": True}
            return {"server": url, "certificate-authority-data": base64.b64encode(self.ca_pem).decode()}

        document = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": name, "cluster": cluster(url)} for name, url in servers.items()],
            "users": [{"name": name, "user": {"token": token or self.token}} for name in servers],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}} for name in servers],
            "current-context": current or context,
        }
        path.write_text(yaml.safe_dump(document))
        return path

    def fail_tunnels(self, message: str) -> None:
        """What the kubelet does when a forwarded connection breaks (its pod deleted, say): the
        error on each open tunnel's error channel, then the WebSocket closed."""
        with self.lock:
            relays = [t.relay for t in self.tunnels if t.relay is not None]
        for relay in relays:
            try:
                relay.send(b"\x01" + (json.dumps({"closeConnection": True, "message": message}) + "\n").encode())
            except OSError:
                pass
            relay.close()

    def forwarded_bytes(self) -> int:
        with self.lock:
            return sum(t.sent + t.received for t in self.tunnels)


def _self_signed(host: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `host` (an IP address), valid for a day."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kube-api")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                   .sign(key, hashes.SHA256()))
    return (certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _status(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message,
                       "reason": reason, "code": code}).encode()


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


def _handler(api: FakeKubeApi):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _answer(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            parts = urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            query = parse_qs(parts.query)
            if segments[:3] == ["api", "v1", "namespaces"] and len(segments) == 5 and segments[4] == "pods":
                what = ("list", "pods")
            elif segments[:3] == ["api", "v1", "namespaces"] and len(segments) == 7 and segments[4] == "pods" \
                    and segments[6] == "portforward":
                # A WebSocket upgrade is a GET; authorized as get (and, since 1.35, also as create).
                what = ("create", "pods/portforward")
            elif segments[:3] == ["api", "v1", "namespaces"] and len(segments) == 6 and segments[4] == "secrets":
                what = ("get", "secrets")
            else:
                what = ("?", parts.path)
            with api.lock:
                api.requests.append(("GET", self.path, f"{what[0]} {what[1]}"))
            scheme, _, credential = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or credential.strip() != api.token:  # the scheme is case-insensitive
                return self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            if what[0] == "?":
                return self._answer(404, _status(404, "NotFound", f"the server could not find {parts.path}"))
            namespace = segments[3]
            if what in api.forbidden or ("get", what[1]) in api.forbidden:
                verb, resource = what
                return self._answer(403, _status(403, "Forbidden", (
                    f'{resource} is forbidden: User "deployer" cannot {verb} resource "{resource}" in API group '
                    f'"" in the namespace "{namespace}"')))
            if what == ("get", "secrets"):
                return self._secret(namespace, segments[5])
            with api.lock:
                pods = [p for p in api.pods if p.namespace == namespace]
            if what == ("list", "pods"):
                selector = (query.get("labelSelector") or [""])[0]
                items = [p.as_object() for p in pods if _matches(p.labels, selector)]
                body = json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}).encode()
                return self._answer(200, body)
            name = segments[5]
            pod = next((p for p in pods if p.name == name), None)
            if pod is None:
                return self._answer(404, _status(404, "NotFound", f'pods "{name}" not found'))
            self._port_forward(pod, query)

        def _secret(self, namespace: str, name: str) -> None:
            with api.lock:
                data = api.secrets.get((namespace, name))
            if data is None:
                return self._answer(404, _status(404, "NotFound", f'secrets "{name}" not found'))
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": name, "namespace": namespace}, "data": dict(data)}
            return self._answer(200, json.dumps(body).encode())

        def _port_forward(self, pod: Pod, query: dict) -> None:
            offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
            ports = (query.get("ports") or [""])[0].split(",")
            if self.headers.get("Upgrade", "").lower() != "websocket" or PROTOCOL not in offered:
                return self._answer(400, _status(400, "BadRequest", f"a WebSocket upgrade with {PROTOCOL} is needed"))
            if len(ports) != 1 or not ports[0].isdigit():
                return self._answer(400, _status(400, "BadRequest", "exactly one port, please"))
            port = int(ports[0])
            with api.lock:
                delay = api.handshake_delays.pop(0) if api.handshake_delays else api.handshake_delay
            time.sleep(delay)
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()
            self.send_response(101, "Switching Protocols")
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.send_header("Sec-WebSocket-Protocol", PROTOCOL)
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            relay = _Relay(self.rfile, self.connection)
            first = struct.pack("<H", port)
            relay.send(b"\x00" + first)
            relay.send(b"\x01" + first)
            address = pod.ports.get(port)
            try:
                if address is None:
                    raise ConnectionRefusedError(f"port {port} is not a port of the pod")
                target = socket.create_connection(address, timeout=10)
            except OSError as error:
                message = f"error forwarding port {port} to pod {pod.name}, uid fake-uid: {error}"
                if api.error_format == "json":  # the kubelet's portForwardErrResponse, then a newline
                    relay.send(b"\x01" + (json.dumps({"closeConnection": True, "message": message}) + "\n").encode())
                else:
                    relay.send(b"\x01" + message.encode())
                relay.close()
                return
            tunnel = Tunnel(pod.name, port, relay=relay)
            with api.lock:
                api.tunnels.append(tunnel)
            target.settimeout(None)
            relay.run(target, tunnel)

    return Handler


class _Relay:
    """Server side of one WebSocket: unmasked binary frames out, masked frames in."""

    def __init__(self, rfile, connection: socket.socket):
        self.rfile, self.connection = rfile, connection
        self.write_lock = threading.Lock()

    def send(self, payload: bytes, opcode: int = 0x2) -> None:
        header = bytes([0x80 | opcode])
        size = len(payload)
        if size < 126:
            header += bytes([size])
        elif size < 1 << 16:
            header += bytes([126]) + struct.pack(">H", size)
        else:
            header += bytes([127]) + struct.pack(">Q", size)
        with self.write_lock:
            self.connection.sendall(header + payload)

    def close(self) -> None:
        try:
            self.send(struct.pack(">H", 1000), opcode=0x8)
        except OSError:
            pass

    def _read_exact(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if data is None or len(data) < size:
            raise EOFError
        return data

    def frames(self):
        """(opcode, payload) of each client frame, masked as clients must (RFC 6455 5.3)."""
        while True:
            first, second = self._read_exact(2)
            opcode, masked, size = first & 0x0F, second & 0x80, second & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._read_exact(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._read_exact(8))[0]
            if not masked:
                raise ValueError("an unmasked client frame")
            mask = self._read_exact(4)
            data = self._read_exact(size)
            key = (mask * (size // 4 + 1))[:size]
            yield opcode, (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")

    def run(self, target: socket.socket, tunnel: Tunnel) -> None:
        def pod_to_client() -> None:
            try:
                while True:
                    data = target.recv(65536)
                    if not data:
                        break
                    tunnel.received += len(data)
                    self.send(b"\x00" + data)
            except OSError:
                pass
            self.close()

        reader = threading.Thread(target=pod_to_client, daemon=True)
        reader.start()
        try:
            for opcode, payload in self.frames():
                if opcode == 0x8:
                    break
                if opcode == 0x2 and payload[:1] == b"\x00" and len(payload) > 1:
                    tunnel.sent += len(payload) - 1
                    target.sendall(payload[1:])
        except (EOFError, OSError, ValueError):
            pass
        finally:
            try:
                target.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            target.close()
            reader.join(5)


@pytest.fixture(autouse=True)
def fresh_kube_configurations():
    """Each test loads its kubeconfig itself (components/kube_tunnel.py caches one load per process);
    autouse in every module that imports it."""
    from components import kube_tunnel

    kube_tunnel._configurations.clear()
    yield
    kube_tunnel._configurations.clear()
