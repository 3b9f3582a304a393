"""A real registry for tests and the benchmark: Debian's docker-registry (CNCF distribution 2.8) on a
free loopback port with htpasswd (bcrypt) auth, and small images built by hand as OCI layouts and
pushed with skopeo. Everything lives in one temporary directory; the server is stopped by its PID."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import bcrypt
import pytest
import requests

REGISTRY_BINARY = "/usr/bin/docker-registry"
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

    def __init__(self, workdir: Path, username: str = USERNAME, password: str = PASSWORD, delete_enabled: bool = True):
        require_tools()
        self.workdir = workdir
        self.delete_enabled = delete_enabled  # storage.delete.enabled (tests of the platform's own setting)
        self.username, self.password = username, password
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self.process: Optional[subprocess.Popen] = None
        self.session = requests.Session()

    def __enter__(self) -> "RegistryServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        auth = self.workdir / "auth"
        auth.mkdir(parents=True, exist_ok=True)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=5)).decode()
        (auth / "htpasswd").write_text(f"{self.username}:{hashed}\n")
        config = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}, "delete": {"enabled": self.delete_enabled}},
            "http": {"addr": self.host, "secret": "registry-for-tests"},
            "auth": {"htpasswd": {"realm": "test-registry", "path": str(auth / "htpasswd")}},
        }
        (self.workdir / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        log = open(self.workdir / "registry.log", "wb")
        self.process = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(self.workdir / "config.yml")],
            stdout=log, stderr=subprocess.STDOUT, process_group=0,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/v2/", timeout=1).status_code == 401:
                    return
            except requests.ConnectionError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"docker-registry did not start: {(self.workdir / 'registry.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    @property
    def auth(self) -> tuple[str, str]:
        return (self.username, self.password)

    def digest_of(self, repository: str, reference: str) -> Optional[str]:
        """HEAD a manifest (with the Accept header) and return its digest, or None if absent."""
        from infra.registry_api import ACCEPT

        response = self.session.head(
            f"{self.url}/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT}, auth=self.auth, timeout=5
        )
        return response.headers["Docker-Content-Digest"] if response.status_code == 200 else None

    def push(self, image: "OciImage", repository: str, tag: str, manifest_format: str = "oci") -> str:
        """Copy an OCI layout image into the registry with skopeo; returns the pushed digest."""
        subprocess.run(
            [
                "skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                "--dest-creds", f"{self.username}:{self.password}", "--format", manifest_format,
                f"oci:{image.layout}:{image.tag}", f"docker://{self.host}/{repository}:{tag}",
            ],
            check=True, capture_output=True,
        )
        digest = self.digest_of(repository, tag)
        assert digest, f"{repository}:{tag} not in the registry after skopeo copy"
        return digest


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
