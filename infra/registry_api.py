"""Read and tag image manifests in a registry without moving layer bytes.

Two kinds of registry, one interface (`Registry`):

- `DistributionRegistry`: the Registry HTTP API v2 (the built-in registry, any OCI registry).
  A manifest is fetched by digest with an explicit Accept header (without it an OCI manifest is a
  404 and a Docker v2 manifest comes back converted to schema 1 with another digest), and a tag
  is added by PUTting the exact bytes with the exact Content-Type, so the digest cannot change.
  Auth: answers a 401 challenge with Basic credentials or a Bearer token from the challenge's realm.
- `EcrRegistry`: Amazon ECR through its own API (`batch_get_image` / `put_image`), with the
  manifest string passed through unchanged.

Credentials come from CLOUDSTATION_REGISTRY_USERNAME / CLOUDSTATION_REGISTRY_PASSWORD or the
docker config (`auths` in $DOCKER_CONFIG/config.json or ~/.docker/config.json); they are never
printed. Loopback registries, and hosts listed in CLOUDSTATION_INSECURE_REGISTRIES (comma
separated), are spoken to over plain HTTP; everything else over HTTPS.

A reference names the registry as the cluster's nodes see it (e.g. `localhost:32000`, the built-in
registry's NodePort). Where that address means something else to the promoter, map it:
CLOUDSTATION_REGISTRY_ADDRESSES="localhost:32000=127.0.0.1:5000" (comma separated), e.g. to a
`kubectl port-forward` of the registry Service.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Protocol

import requests

from infra.config import DIGEST_REF

MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)

USERNAME_ENV = "CLOUDSTATION_REGISTRY_USERNAME"
PASSWORD_ENV = "CLOUDSTATION_REGISTRY_PASSWORD"
INSECURE_ENV = "CLOUDSTATION_INSECURE_REGISTRIES"
ADDRESSES_ENV = "CLOUDSTATION_REGISTRY_ADDRESSES"

ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


class RegistryError(Exception):
    """The registry refused or answered something unexpected; str() says which image and why."""


@dataclass(frozen=True)
class ImageRef:
    """A digest-pinned image reference: `registry/repository[:tag]@sha256:…`."""

    registry: str
    repository: str
    tag: Optional[str]
    digest: str

    @classmethod
    def parse(cls, ref: str) -> "ImageRef":
        match = DIGEST_REF.match(ref)
        if not match:
            raise ValueError(f"{ref!r} is not pinned by digest: <registry>/<repository>[:tag]@sha256:<64 hex digits>")
        registry, _, repository = match["repository"].partition("/")
        return cls(registry, repository, match["tag"], match["digest"])

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        return f"{self.registry}/{self.repository}{tag}@{self.digest}"


@dataclass(frozen=True)
class Manifest:
    """A manifest exactly as the registry stored it."""

    body: bytes
    media_type: str
    digest: str


@dataclass
class Stats:
    """What talking to a registry cost: round trips and bytes on the wire (bodies only)."""

    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def add(self, other: "Stats") -> None:
        self.requests += other.requests
        self.bytes_sent += other.bytes_sent
        self.bytes_received += other.bytes_received


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def credentials_for(host: str, env: Mapping[str, str] = os.environ) -> Optional[Credentials]:
    """Registry credentials from the environment, else from the docker config's `auths`."""
    if env.get(USERNAME_ENV) and env.get(PASSWORD_ENV):
        return Credentials(env[USERNAME_ENV], env[PASSWORD_ENV])
    config_dir = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else Path.home() / ".docker"
    try:
        auths = json.loads((config_dir / "config.json").read_text()).get("auths") or {}
    except (OSError, ValueError):
        return None
    for key, entry in auths.items():
        if re.sub(r"^https?://", "", key).split("/")[0] == host and entry.get("auth"):
            username, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return Credentials(username, password)
    return None


class Registry(Protocol):
    host: str
    stats: Stats

    def manifest(self, ref: ImageRef) -> Optional[Manifest]:
        """The manifest `ref.digest` points at, or None when the registry doesn't have it."""

    def tag(self, ref: ImageRef, manifest: Manifest, tag: str) -> None:
        """Make `tag` in `ref.repository` point at `manifest` (which came from `manifest(ref)`)."""


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…"` -> ("bearer", {"realm": …, "service": …})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class DistributionRegistry:
    """A registry speaking the Registry HTTP API v2."""

    def __init__(
        self,
        host: str,
        credentials: Optional[Credentials] = None,
        *,
        address: Optional[str] = None,
        insecure: Optional[bool] = None,
        timeout: float = 30,
        env: Mapping[str, str] = os.environ,
    ):
        self.host = host
        self.credentials = credentials
        address = address or host
        if insecure is None:
            listed = {h.strip() for h in env.get(INSECURE_ENV, "").split(",") if h.strip()}
            insecure = address.rsplit(":", 1)[0] in LOOPBACK or bool({host, address} & listed)
        self.base = f"{'http' if insecure else 'https'}://{address}"
        self.timeout = timeout
        self.stats = Stats()
        self.session = requests.Session()
        self._authorization: dict[str, str] = {}  # repository -> Authorization header value

    def _send(self, method: str, repository: str, path: str, headers: dict, body: bytes = b"") -> requests.Response:
        headers = dict(headers)
        if repository in self._authorization or "*" in self._authorization:
            headers["Authorization"] = self._authorization.get(repository) or self._authorization["*"]
        response = self._raw(method, f"{self.base}{path}", headers, body)
        if response.status_code == 401:
            self._authenticate(repository, response.headers.get("WWW-Authenticate", ""))
            headers["Authorization"] = self._authorization.get(repository) or self._authorization["*"]
            response = self._raw(method, f"{self.base}{path}", headers, body)
            if response.status_code == 401:
                raise RegistryError(f"{self.host}: the registry rejected the credentials for {repository}")
        return response

    def _raw(self, method: str, url: str, headers: dict, body: bytes = b"", **extra) -> requests.Response:
        try:
            response = self.session.request(
                method, url, headers=headers, data=body or None, timeout=self.timeout, **extra
            )
        except requests.RequestException as error:
            raise RegistryError(f"{self.host}: cannot reach the registry ({type(error).__name__})") from None
        self.stats.requests += 1
        self.stats.bytes_sent += len(body)
        self.stats.bytes_received += len(response.content)
        return response

    def _authenticate(self, repository: str, header: str) -> None:
        scheme, params = _challenge(header)
        if self.credentials is None:
            raise RegistryError(
                f"{self.host}: the registry requires authentication; set {USERNAME_ENV} and {PASSWORD_ENV} "
                f"or log in with `docker login {self.host}`"
            )
        if scheme == "basic":
            self._authorization["*"] = self.credentials.basic()
        elif scheme == "bearer" and params.get("realm"):
            query = {k: v for k, v in params.items() if k in ("service", "scope")}
            login = (self.credentials.username, self.credentials.password)
            response = self._raw("GET", params["realm"], {}, auth=login, params=query)
            if response.status_code != 200:
                raise RegistryError(
                    f"{self.host}: the token service refused the credentials (HTTP {response.status_code})"
                )
            answer = response.json()
            token = answer.get("token") or answer.get("access_token")
            if not token:
                raise RegistryError(f"{self.host}: the token service returned no token")
            self._authorization[repository] = f"Bearer {token}"
        else:
            raise RegistryError(f"{self.host}: unsupported authentication challenge {scheme!r}")

    def manifest(self, ref: ImageRef) -> Optional[Manifest]:
        path = f"/v2/{ref.repository}/manifests/{ref.digest}"
        response = self._send("GET", ref.repository, path, {"Accept": ACCEPT})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise RegistryError(f"{ref}: GET manifest answered HTTP {response.status_code}: {response.text[:200]}")
        body = response.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if digest != ref.digest:
            raise RegistryError(f"{ref}: the registry returned a manifest whose digest is {digest}")
        return Manifest(body, response.headers.get("Content-Type", "").split(";")[0], digest)

    def tag(self, ref: ImageRef, manifest: Manifest, tag: str) -> None:
        path = f"/v2/{ref.repository}/manifests/{tag}"
        response = self._send("PUT", ref.repository, path, {"Content-Type": manifest.media_type}, manifest.body)
        if response.status_code != 201:
            raise RegistryError(f"{ref}: PUT tag {tag!r} answered HTTP {response.status_code}: {response.text[:200]}")
        stored = response.headers.get("Docker-Content-Digest")
        if stored and stored != manifest.digest:
            raise RegistryError(f"{ref}: tag {tag!r} was stored with digest {stored}, not {manifest.digest}")


class EcrRegistry:
    """Amazon ECR through its API: the manifest string goes back exactly as it came."""

    def __init__(self, host: str, client=None):
        match = ECR_HOST.match(host)
        if not match:
            raise ValueError(f"{host!r} is not an ECR registry host")
        import boto3  # only ECR users need it loaded

        self.host = host
        self.account = match["account"]
        self.client = client or boto3.client("ecr", region_name=match["region"])
        self.stats = Stats()

    def manifest(self, ref: ImageRef) -> Optional[Manifest]:
        self.stats.requests += 1
        try:
            answer = self.client.batch_get_image(
                registryId=self.account,
                repositoryName=ref.repository,
                imageIds=[{"imageDigest": ref.digest}],
                acceptedMediaTypes=list(MANIFEST_MEDIA_TYPES),
            )
        except self.client.exceptions.RepositoryNotFoundException:
            return None
        images = answer.get("images") or []
        if not images:
            return None
        text = images[0]["imageManifest"]
        self.stats.bytes_received += len(text.encode())
        media_type = images[0].get("imageManifestMediaType") or json.loads(text).get("mediaType", "")
        return Manifest(text.encode(), media_type, images[0]["imageId"]["imageDigest"])

    def tag(self, ref: ImageRef, manifest: Manifest, tag: str) -> None:
        self.stats.requests += 1
        self.stats.bytes_sent += len(manifest.body)
        try:
            self.client.put_image(
                registryId=self.account,
                repositoryName=ref.repository,
                imageManifest=manifest.body.decode(),
                imageManifestMediaType=manifest.media_type,
                imageTag=tag,
            )
        except self.client.exceptions.ImageAlreadyExistsException:
            pass  # this exact manifest already carries the tag
        except self.client.exceptions.ImageTagAlreadyExistsException:
            raise RegistryError(
                f"{ref}: tag {tag!r} already exists on another image and {ref.repository} has immutable tags"
            ) from None


def connect(host: str, env: Mapping[str, str] = os.environ) -> Registry:
    """The right client for a registry host (as named in image references)."""
    if ECR_HOST.match(host):
        return EcrRegistry(host)
    addresses = dict(
        item.strip().split("=", 1) for item in env.get(ADDRESSES_ENV, "").split(",") if "=" in item
    )
    address = addresses.get(host, host)
    credentials = credentials_for(host, env) or credentials_for(address, env)
    return DistributionRegistry(host, credentials, address=address, env=env)
