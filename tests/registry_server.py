"""A real registry for tests and the benchmark: Debian's docker-registry (CNCF distribution 2.8) on a
free loopback port with htpasswd (bcrypt) auth, and small images built by hand as OCI layouts and
pushed with skopeo. Everything lives in one temporary directory; the server is stopped by its PID.

With `policy`, the registry runs as the platform deploys it: distribution on a loopback port of its
own with one htpasswd line per user (`users`), behind the authorizing gate (components/registry_gate.py,
run by this Python in isolated mode, so with the standard library only), which answers on `host`.
Debian's 2.8 is the unit suite's registry because scripts/test.sh installs it on any machine; it
routes the API v2 paths with the same grammar and answers the same error codes as v3.1.1, the
version the program deploys. CLOUDSTATION_REGISTRY_BINARY runs the same tests against another
binary (e.g. the v3.1.1 the end-to-end tier builds: `bash e2e/build-tools.sh registry`).

Also `CountingProxy` (forwards to the registry and logs every request on the wire, for exact
request counts), `ScriptedServer` (answers what a test says, and logs what it was sent: for
redirects, oversized or slow answers and hostile token realms) and `DrippingServer` (writes raw
bytes with delays, status line and headers included: for answers that never finish arriving)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, Optional

import bcrypt
import pytest
import requests

from components.registry import registry_settings

REGISTRY_BINARY = os.environ.get("CLOUDSTATION_REGISTRY_BINARY") or "/usr/bin/docker-registry"
GATE = Path(__file__).resolve().parent.parent / "components" / "registry_gate.py"
USERNAME = "promoter"
PASSWORD = "s3cret-pw-for-tests"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def require_tools() -> None:
    """Fail loudly (never skip) when the registry tools are missing; scripts/test.sh installs them."""
    missing = [tool for tool in (REGISTRY_BINARY, "skopeo") if not shutil.which(tool)]
    if missing:
        raise RuntimeError(
            f"missing {', '.join(missing)}: apt-get install docker-registry skopeo (scripts/test.sh does it as root)"
        )


class RegistryServer:
    """`with RegistryServer(workdir) as registry:` — a registry answering on `registry.host`."""

    def __init__(self, workdir: Path, username: str = USERNAME, password: str = PASSWORD, delete_enabled: bool = True,
                 users: Optional[dict[str, str]] = None, policy: Optional[dict] = None):
        require_tools()
        self.workdir = workdir
        self.delete_enabled = delete_enabled  # storage.delete.enabled (tests of the platform's own setting)
        self.username, self.password = username, password
        self.users = {username: password, **(users or {})}  # one htpasswd line each
        self.policy = policy  # the gate's (components/registry_access.py gate_policy); None: no gate
        self.port = free_port()
        self.upstream_port = free_port() if policy is not None else self.port
        self.host = f"127.0.0.1:{self.port}"
        self.upstream_host = f"127.0.0.1:{self.upstream_port}"
        """distribution itself: the host too without a gate, a loopback port behind it with one."""
        self.url = f"http://{self.host}"
        self.process: Optional[subprocess.Popen] = None
        self.gate: Optional[subprocess.Popen] = None
        self.session = requests.Session()

    def __enter__(self) -> "RegistryServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        auth = self.workdir / "auth"
        auth.mkdir(parents=True, exist_ok=True)
        (auth / "htpasswd").write_text("".join(
            f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"
            for user, password in self.users.items()))
        config = {
            "version": 0.1,
            "log": {"level": "warn"},
            # The deployed registry's storage cache (components/registry.py registry_settings).
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}, "delete": {"enabled": self.delete_enabled},
                        "cache": registry_settings()["storage"]["cache"]},
            "http": {"addr": self.upstream_host, "secret": "registry-for-tests"},
            "auth": {"htpasswd": {"realm": "test-registry", "path": str(auth / "htpasswd")}},
        }
        (self.workdir / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        log = open(self.workdir / "registry.log", "wb")
        self.process = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(self.workdir / "config.yml")],
            stdout=log, stderr=subprocess.STDOUT, process_group=0,
        )
        log.close()
        if self.policy is not None:
            (self.workdir / "policy.json").write_text(json.dumps(self.policy))
            gate_log = open(self.workdir / "gate.log", "wb")
            # -I: isolated, so the gate runs with the standard library only, as in its container.
            self.gate = subprocess.Popen(
                [sys.executable, "-I", str(GATE), "--policy", str(self.workdir / "policy.json"),
                 "--listen", self.host, "--upstream", self.upstream_host],
                stdout=gate_log, stderr=subprocess.STDOUT, process_group=0,
            )
            gate_log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/v2/", timeout=1).status_code == 401:
                    return
            except requests.ConnectionError:
                pass
            if self.process.poll() is not None or (self.gate is not None and self.gate.poll() is not None):
                break
            time.sleep(0.01)
        self.stop()
        logs = [(self.workdir / name) for name in ("registry.log", "gate.log")]
        raise RuntimeError("the registry did not start: " + " / ".join(f.read_text()[-2000:] for f in logs if f.exists()))

    def stop(self) -> None:
        for process in (self.gate, self.process):
            if process and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.process = self.gate = None

    def restart(self) -> None:
        """Stop and start again on the same ports and storage (e.g. after garbage collection, which
        the registry's in-memory blob-descriptor cache does not see)."""
        self.stop()
        self.start()

    def config_file(self) -> Path:
        return self.workdir / "config.yml"

    @property
    def auth(self) -> tuple[str, str]:
        return (self.username, self.password)

    def digest_of(self, repository: str, reference: str) -> Optional[str]:
        """HEAD a manifest (with the Accept header) and return its digest, or None if absent."""
        from components.registry_api import ACCEPT

        response = self.session.head(
            f"{self.url}/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT}, auth=self.auth, timeout=5
        )
        return response.headers["Docker-Content-Digest"] if response.status_code == 200 else None

    def push(self, image: "OciImage", repository: str, tag: str, manifest_format: str = "oci",
             as_user: Optional[str] = None, direct: bool = False) -> str:
        """Copy an OCI layout image into the registry with skopeo; returns the pushed digest. `as_user`
        pushes with that user's credentials (through the gate, if any); `direct` to distribution
        itself, past the gate (a test setting the stage)."""
        self.skopeo_copy(image, repository, tag, manifest_format, as_user, direct).check_returncode()
        digest = self.digest_of(repository, tag)
        assert digest, f"{repository}:{tag} not in the registry after skopeo copy"
        return digest

    def skopeo_copy(self, image: "OciImage", repository: str, tag: str, manifest_format: str = "oci",
                    as_user: Optional[str] = None, direct: bool = False) -> subprocess.CompletedProcess:
        """`skopeo copy` of an OCI layout image to `repository:tag` (a real client's push), unchecked."""
        user = as_user or self.username
        host = self.upstream_host if direct else self.host
        return subprocess.run(
            [
                "skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                "--dest-creds", f"{user}:{self.users[user]}", "--format", manifest_format,
                f"oci:{image.layout}:{image.tag}", f"docker://{host}/{repository}:{tag}",
            ],
            capture_output=True, text=True,
        )


@dataclass(frozen=True)
class OciImage:
    layout: Path
    tag: str
    digest: str
    layer_size: int


def _blob(layout: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def build_oci_image(layout: Path, tag: str, payload: bytes, label: str = "") -> OciImage:
    """One image with one file (`/payload`) into an OCI layout, reproducibly (mtime 0).

    Several images can share a layout (one index entry per tag)."""
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("payload")
        info.size, info.mtime, info.mode = len(payload), 0, 0o644
        tar.addfile(info, io.BytesIO(payload))
    uncompressed = buffer.getvalue()
    layer_blob = _blob(layout, gzip.compress(uncompressed, mtime=0))
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_blob}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {"test.label": label or tag}, "Cmd": ["/payload"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(uncompressed).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/registry_server.py"}],
    }
    config_blob = {
        "mediaType": "application/vnd.oci.image.config.v1+json", **_blob(layout, json.dumps(config).encode())
    }
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_blob, "layers": [layer]}
    manifest_blob = _blob(layout, json.dumps(manifest).encode())
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"schemaVersion": 2, "manifests": []}
    index["manifests"] = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] != tag]
    index["manifests"].append(
        {"mediaType": OCI_MANIFEST, **manifest_blob, "annotations": {"org.opencontainers.image.ref.name": tag}}
    )
    index_path.write_text(json.dumps(index))
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return OciImage(layout, tag, manifest_blob["digest"], layer["size"])


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[RegistryServer]:
    """A running registry with auth for the tests of one module; stopped by PID afterwards."""
    with RegistryServer(tmp_path_factory.mktemp("registry")) as server:
        yield server


def ecr_manifest(layer_hex: str) -> str:
    """A Docker v2 manifest string for moto's ECR (which never checks that blobs exist)."""
    return json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 7,
                   "digest": "sha256:" + "c" * 64},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": 9,
                    "digest": "sha256:" + layer_hex * 64}],
    })


HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te", "upgrade"}


@dataclass(frozen=True)
class Seen:
    """One request a test server received."""

    method: str
    path: str
    headers: dict
    status: int = 0


class _Server:
    """A ThreadingHTTPServer on a free loopback port in a background thread, with a request log."""

    def __init__(self, handler: type):
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.server.owner = self
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.host}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def log(self, seen: Seen) -> None:
        with self.lock:
            self.seen.append(seen)

    def take(self) -> list[Seen]:
        with self.lock:
            seen, self.seen = self.seen, []
            return seen


class CountingProxy(_Server):
    """Forwards every request to `upstream` on kept-alive connections and logs it with its status;
    `bytes` counts request and response bodies. `lie(seen, content)`, when given, is a hostile
    registry: bytes it returns replace the answer's body (None keeps it)."""

    def __init__(self, upstream: str, lie: Optional[Callable[[Seen, bytes], Optional[bytes]]] = None):
        self.upstream = upstream
        self.lie = lie
        self.bytes = 0
        local = threading.local()

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stalls

            def log_message(self, *args):
                pass

            def _forward(self):
                proxy = self.server.owner
                if not hasattr(local, "session"):
                    local.session = requests.Session()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                # skopeo sends several Accept headers: keep them all (as one comma-separated list).
                headers = {k: ", ".join(self.headers.get_all(k)) for k in set(self.headers) if k.lower() not in HOP_BY_HOP}
                answer = local.session.request(
                    self.command, proxy.upstream + self.path, headers=headers, data=body or None,
                    allow_redirects=False, stream=False, timeout=60,
                )
                content = answer.content if self.command != "HEAD" else b""
                if proxy.lie is not None:
                    content = proxy.lie(Seen(self.command, self.path, dict(self.headers)), content) or content
                with proxy.lock:
                    proxy.bytes += len(body) + len(content)
                proxy.log(Seen(self.command, self.path, dict(self.headers), answer.status_code))
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        self.send_header(name, value)
                length = answer.headers.get("Content-Length", str(len(content))) if self.command == "HEAD" else str(len(content))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(content)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

        super().__init__(Forward)

    def reset(self) -> tuple[list[Seen], int]:
        with self.lock:
            seen, count = self.seen, self.bytes
            self.seen, self.bytes = [], 0
            return seen, count


Reply = tuple[int, dict, object]
"""(status, headers, body): body is bytes, or an iterable of (bytes, seconds to wait before it)."""


class ScriptedServer(_Server):
    """Answers each request with `respond(seen)` and logs it; HTTP/1.1 with Content-Length unless the
    body is a list of timed chunks (sent chunked, each after its delay)."""

    def __init__(self, respond: Callable[[Seen], Reply]):
        self.respond = respond

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stalls

            def log_message(self, *args):
                pass

            def _handle(self):
                server = self.server.owner
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen = Seen(self.command, self.path, dict(self.headers))
                server.log(seen)
                status, headers, body = server.respond(seen)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                try:
                    if isinstance(body, (bytes, bytearray)):
                        if "Content-Length" not in headers:
                            self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk, delay in body:
                        time.sleep(delay)
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as the test wanted

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        super().__init__(Handler)


class DrippingServer:
    """A hostile server below HTTP: reads each request (headers and Content-Length body) and writes
    `answer`, a list of (bytes, seconds to wait before them), as raw bytes: the status line and
    headers can arrive one byte at a time, a body line may never end. `requests` counts requests."""

    def __init__(self, answer: list[tuple[bytes, float]], tls_dir: Optional[Path] = None):
        self.answer = answer
        self.requests = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.host = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.url = f"http://{self.host}"
        self.tls: Optional[ssl.SSLContext] = None
        if tls_dir is not None:  # https with a self-signed certificate for 127.0.0.1, at `self.ca_file`
            from tests.fake_kube_api import _self_signed

            certificate, key = _self_signed("127.0.0.1")
            self.ca_file = tls_dir / "drip-ca.pem"
            self.ca_file.write_bytes(certificate)
            (tls_dir / "drip-key.pem").write_bytes(key)
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.load_cert_chain(self.ca_file, tls_dir / "drip-key.pem")
            self.url = f"https://{self.host}"
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "DrippingServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                if self.tls is not None:
                    connection = self.tls.wrap_socket(connection, server_side=True)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += connection.recv(65536)
                self.requests += 1
                for piece, delay in self.answer:
                    if self.closing.wait(delay):
                        return
                    connection.sendall(piece)
            except OSError:
                pass  # the client gave up, as the test wanted


def drip(data: bytes, every: float) -> list[tuple[bytes, float]]:
    """`data` one byte at a time, `every` seconds apart (the first at once)."""
    return [(data[i:i + 1], every if i else 0) for i in range(len(data))]
