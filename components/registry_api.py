"""Read and tag image manifests in a registry without moving layer bytes.

Two kinds of registry, one interface (`Registry`):

- `DistributionRegistry`: the Registry HTTP API v2 (the built-in registry, any OCI registry).
  A manifest is fetched by digest with an explicit Accept header (without it an OCI manifest is a
  404 and a Docker v2 manifest comes back converted to schema 1 with another digest), and a tag
  is added by PUTting the exact bytes with the exact Content-Type, so the digest cannot change.
  Auth: answers a 401 challenge with Basic credentials or a Bearer token from the challenge's realm.
  One pool of kept-alive connections per registry (http.client: a third of the CPU per request of
  requests.Session, which matters when the promoter shares cores with the registry), safe to use
  from several threads: one challenge per registry (Basic) or per repository (Bearer), then one
  request per manifest read or tag. HTTPS goes through HTTPS_PROXY (CONNECT) unless NO_PROXY
  says otherwise; REQUESTS_CA_BUNDLE or SSL_CERT_FILE name extra CAs.
- `EcrRegistry`: Amazon ECR through its own API (`batch_get_image` / `put_image`), with the
  manifest string passed through unchanged.

Credentials go only to the registry they are for:
- CLOUDSTATION_REGISTRY_USERNAME / CLOUDSTATION_REGISTRY_PASSWORD are used only for the one host
  named in CLOUDSTATION_REGISTRY_HOST (the reference's host or its mapped address); otherwise the
  docker config's `auths` entry for the host ($DOCKER_CONFIG/config.json or ~/.docker/config.json).
- A Bearer realm gets them only over https, on loopback, or at the registry's own address.
- Authorization is sent only to the registry's own origin: a redirect elsewhere is followed
  without it, and a redirect target that then asks for credentials is refused. Credentials are
  never printed.
Loopback registries, and hosts listed in CLOUDSTATION_INSECURE_REGISTRIES (comma separated), are
spoken to over plain HTTP; everything else over HTTPS.

Through a tunnel (`for_url(..., dial=...)`, e.g. components/kube_tunnel.py: a port-forward
through the Kubernetes API), the registry's origin is reached by calling `dial` instead of
opening a TCP connection; the URL's host is then only the Host header (e.g.
`registry.<namespace>.svc.cluster.local:5000`). Credentials may go over plain http there: the
bytes travel inside the tunnel's own connection (the API server's TLS). Every other origin (a
redirect, a token realm) is still reached directly, under the rules above.

Every answer is read against a size cap (4 MiB for a manifest) and the run's deadline
(components/limits.py), status line and headers included (components/transport.py
`response_class`); `exchange_timeout` bounds one request and its answer besides (the build provider's).

A reference names the registry as the cluster's nodes see it (e.g. `localhost:32000`, the built-in
registry's NodePort). Where that address means something else to the promoter, map it:
CLOUDSTATION_REGISTRY_ADDRESSES="localhost:32000=127.0.0.1:5000" (comma separated), e.g. to a
`kubectl port-forward` of the registry Service.
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import ssl
import threading
import urllib.request
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol
from urllib.parse import quote, unquote, urljoin, urlsplit

from infra.image_refs import DIGEST_REF_FORM, split
from components.limits import MAX_MANIFEST_BYTES, MAX_SMALL_ANSWER_BYTES, Deadline, DeadlineExceeded
from components.transport import is_loopback, response_class

MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)

USERNAME_ENV = "CLOUDSTATION_REGISTRY_USERNAME"
PASSWORD_ENV = "CLOUDSTATION_REGISTRY_PASSWORD"
HOST_ENV = "CLOUDSTATION_REGISTRY_HOST"
INSECURE_ENV = "CLOUDSTATION_INSECURE_REGISTRIES"
ADDRESSES_ENV = "CLOUDSTATION_REGISTRY_ADDRESSES"

ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
USER_AGENT = "cloudstation-promote"


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
        parts = split(ref)
        if parts is None:
            raise ValueError(f"{ref!r} is not pinned by digest: {DIGEST_REF_FORM}")
        return cls(*parts)

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
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, sent: int, received: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_sent += sent
            self.bytes_received += received

    def add(self, other: "Stats") -> None:
        with self.lock:
            self.requests += other.requests
            self.bytes_sent += other.bytes_sent
            self.bytes_received += other.bytes_received


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    @classmethod
    def from_basic(cls, authorization: str) -> "Credentials":
        """From a `Basic <base64 user:password>` header value (the build provider's input)."""
        scheme, _, encoded = authorization.strip().partition(" ")
        try:
            if scheme.lower() != "basic":
                raise ValueError
            username, colon, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
            if not colon:
                raise ValueError
        except ValueError:
            raise RegistryError("the registry authorization is not `Basic <base64 user:password>`") from None
        return cls(username, password)


def credentials_for(host: str, env: Mapping[str, str] = os.environ) -> Optional[Credentials]:
    """Credentials for `host`: the environment's, if they name this host, else the docker config's."""
    if env.get(USERNAME_ENV) and env.get(PASSWORD_ENV):
        scoped = env.get(HOST_ENV, "").strip()
        if not scoped:
            raise RegistryError(
                f"{USERNAME_ENV} and {PASSWORD_ENV} are set but {HOST_ENV} is not: set it to the one registry "
                f"host they are for (e.g. localhost:32000); they are sent to no other host"
            )
        if scoped == host:
            return Credentials(env[USERNAME_ENV], env[PASSWORD_ENV])
    config_dir = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else Path.home() / ".docker"
    try:
        auths = json.loads((config_dir / "config.json").read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError):
        return None
    for key, entry in auths.items():
        if re.sub(r"^https?://", "", key).split("/")[0] == host and isinstance(entry, dict) and entry.get("auth"):
            try:
                username, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError:
                raise RegistryError(f"the docker config's auths entry for {host} is not base64 user:password") from None
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


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True)
class Answer:
    """A response read completely (within its size cap)."""

    status_code: int
    headers: Message
    content: bytes
    url: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)
"""What a kept-alive connection the server has closed meanwhile raises: retried once on a new one."""


class _Connections:
    """Kept-alive connections per origin, each used by one thread at a time."""

    def __init__(self, env: Mapping[str, str], dials: Optional[Mapping[tuple, Callable]] = None):
        self.idle: dict[tuple, list[http.client.HTTPConnection]] = {}
        self.dials = dict(dials or {})  # origin -> dial(timeout) for origins reached through a tunnel
        self.lock = threading.Lock()
        self.cafile = env.get("REQUESTS_CA_BUNDLE") or None
        self._context: Optional[ssl.SSLContext] = None
        self.proxies = urllib.request.getproxies_environment()

    @property
    def context(self) -> ssl.SSLContext:
        # Made on first use: loading the CAs costs ~20 ms, and loopback registries never need them.
        if self._context is None:
            self._context = ssl.create_default_context(cafile=self.cafile)
        return self._context

    def take(self, origin: tuple, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """A connection to `origin` and whether it was used before."""
        with self.lock:
            idle = self.idle.get(origin)
            connection = idle.pop() if idle else None
        if connection is not None:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            return connection, True
        scheme, host, port = origin
        if origin in self.dials:
            return _DialedConnection(host, port, self.dials[origin], timeout=timeout), False
        if scheme != "https":
            return http.client.HTTPConnection(host, port, timeout=timeout), False
        proxy = self.proxies.get("https")
        if proxy and not urllib.request.proxy_bypass_environment(host, self.proxies):
            parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            connection = http.client.HTTPSConnection(
                parts.hostname, parts.port or 80, timeout=timeout, context=self.context
            )
            headers = {}
            if parts.username:
                login = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
                headers["Proxy-Authorization"] = "Basic " + base64.b64encode(login.encode()).decode()
            connection.set_tunnel(host, port, headers=headers)  # Authorization travels inside the tunnel's TLS
            return connection, False
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=self.context), False

    def give_back(self, origin: tuple, connection: http.client.HTTPConnection) -> None:
        with self.lock:
            self.idle.setdefault(origin, []).append(connection)

    def close(self) -> None:
        """Close the kept-alive connections (a tunnelled one holds a port-forward: a WebSocket, a socket
        pair and a relay thread, which nothing else ends)."""
        with self.lock:
            idle, self.idle = self.idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()


class _DialedConnection(http.client.HTTPConnection):
    """An HTTP connection whose socket comes from `dial(timeout)` (a tunnel), not from TCP to
    host:port, which only name the Host header."""

    def __init__(self, host: str, port: int, dial: Callable, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._dial = dial

    def connect(self) -> None:
        self.sock = self._dial(self.timeout)


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
        deadline: Optional[Deadline] = None,
        dial: Optional[Callable] = None,
        exchange_timeout: Optional[float] = None,
    ):
        self.host = host
        self.credentials = credentials
        address = address or host
        if insecure is None:
            listed = {h.strip() for h in env.get(INSECURE_ENV, "").split(",") if h.strip()}
            insecure = is_loopback(urlsplit(f"//{address}").hostname) or bool({host, address} & listed)
        self.base = f"{'http' if insecure else 'https'}://{address}"
        self.origin = _origin(self.base)
        self.timeout = timeout  # one socket operation
        self.deadline = deadline or Deadline(None)  # the run's
        self.exchange_timeout = exchange_timeout  # one request and its whole answer (None: the run's deadline only)
        self.stats = Stats()
        self.connections = _Connections(env, {self.origin: dial} if dial else None)
        self._scheme: Optional[str] = None  # None (not known yet), "anonymous", "basic" or "bearer"
        self._tokens: dict[str, str] = {}  # repository -> Authorization for Bearer registries
        self._lock = threading.Lock()
        self._repository_locks: dict[str, threading.Lock] = {}

    def close(self) -> None:
        """End the connections kept alive for the next request (`with` does it on leaving)."""
        self.connections.close()

    def __enter__(self) -> "DistributionRegistry":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # --- authorization ------------------------------------------------------------------------

    def _known(self, repository: str) -> Optional[str]:
        """The Authorization value for `repository` ("" for none needed), or None if not known yet."""
        if self._scheme == "basic":
            return self.credentials.basic()
        if self._scheme == "anonymous":
            return ""
        if self._scheme == "bearer":
            return self._tokens.get(repository)
        return None

    def _lock_for(self, repository: str) -> threading.Lock:
        # Until the scheme is known, one request per registry goes first (one challenge, not one
        # per thread); a Bearer registry then needs one token per repository.
        if self._scheme != "bearer":
            return self._lock
        with self._lock:
            return self._repository_locks.setdefault(repository, threading.Lock())

    def _send(self, method: str, repository: str, path: str, headers: dict, body: bytes, limit: int) -> Answer:
        # `path` may be a whole URL (an upload's Location); _http sends credentials only to our origin.
        url = path if "://" in path else f"{self.base}{path}"
        authorization = self._known(repository)
        if authorization is None:
            with self._lock_for(repository):
                authorization = self._known(repository)
                if authorization is None:
                    answer = self._http(method, url, headers, body, limit)
                    if answer.status_code != 401:
                        self._scheme = self._scheme or "anonymous"
                        return answer
                    self._authenticate(repository, answer)
                    authorization = self._known(repository)
        answer = self._http(method, url, _with(headers, authorization), body, limit)
        if answer.status_code == 401 and not authorization:
            # Anonymous reads, authenticated writes: answer this challenge once.
            with self._lock_for(repository):
                self._authenticate(repository, answer)
                authorization = self._known(repository)
            answer = self._http(method, url, _with(headers, authorization), body, limit)
        if answer.status_code == 401:
            raise RegistryError(f"{self.host}: the registry rejected the credentials for {repository}")
        return answer

    def _authenticate(self, repository: str, answer: Answer) -> None:
        scheme, params = _challenge(answer.headers.get("WWW-Authenticate", ""))
        if self.credentials is None:
            raise RegistryError(
                f"{self.host}: the registry requires authentication; set {USERNAME_ENV}, {PASSWORD_ENV} and "
                f"{HOST_ENV}={self.host}, or log in with `docker login {self.host}`"
            )
        if scheme == "basic":
            self._scheme = "basic"
        elif scheme == "bearer" and params.get("realm"):
            self._tokens[repository] = f"Bearer {self._token(params)}"
            self._scheme = "bearer"
        else:
            raise RegistryError(f"{self.host}: unsupported authentication challenge {scheme!r}")

    def _token(self, params: dict[str, str]) -> str:
        """A token from the challenge's realm, which gets the credentials only if it may."""
        realm = urljoin(self.base, params["realm"])
        scheme, hostname, _ = _origin(realm)
        if not (scheme == "https" or (scheme == "http" and (is_loopback(hostname) or _origin(realm) == self.origin))):
            raise RegistryError(
                f"{self.host}: the token realm {realm.split('?')[0]} is not https; the credentials are sent "
                f"over plain http only to loopback or to the registry itself"
            )
        query = "&".join(
            f"{k}={quote(v, safe='')}" for k, v in params.items() if k in ("service", "scope")
        )
        url = realm + ("&" if "?" in realm else "?") + query if query else realm
        answer = self._http("GET", url, {"Authorization": self.credentials.basic()}, b"", MAX_SMALL_ANSWER_BYTES,
                            trusted=_origin(realm))
        if answer.status_code != 200:
            raise RegistryError(f"{self.host}: the token service refused the credentials (HTTP {answer.status_code})")
        try:
            document = json.loads(answer.content)
        except ValueError:
            raise RegistryError(f"{self.host}: the token service answered something that is not JSON") from None
        token = (document.get("token") or document.get("access_token")) if isinstance(document, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.host}: the token service returned no token")
        return token

    # --- one HTTP exchange, redirects handled here ------------------------------------------------

    def _http(
        self, method: str, url: str, headers: dict, body: bytes, limit: int, trusted: Optional[tuple] = None
    ) -> Answer:
        """One request, following redirects itself: Authorization goes only to the `trusted`
        origin (the registry's own by default), never to a redirect target elsewhere."""
        trusted = trusted or self.origin
        for _ in range(MAX_REDIRECTS + 1):
            here = _origin(url)
            send = headers if here == trusted else {k: v for k, v in headers.items() if k.lower() != "authorization"}
            answer = self._exchange(method, url, send, body, limit)
            if answer.status_code not in REDIRECTS or "Location" not in answer.headers:
                if answer.status_code == 401 and here != trusted:
                    raise RegistryError(
                        f"{self.host}: redirected to {here[1]}:{here[2]}, which asks for credentials; they are "
                        f"sent only to {trusted[1]}:{trusted[2]}"
                    )
                return answer
            target = urljoin(url, answer.headers["Location"])
            if urlsplit(url).scheme == "https" and urlsplit(target).scheme != "https":
                raise RegistryError(f"{self.host}: refused a redirect from https to {target.split('?')[0]}")
            if method != "GET" and answer.status_code not in (307, 308):
                raise RegistryError(f"{self.host}: {method} answered a redirect (HTTP {answer.status_code})")
            url = target
        raise RegistryError(f"{self.host}: more than {MAX_REDIRECTS} redirects")

    def _exchange(self, method: str, url: str, headers: dict, body: bytes, limit: int) -> Answer:
        parts = urlsplit(url)
        origin = _origin(url)
        what = f"{self.host}: {method} {parts.path}"
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        deadline = self.deadline.within(self.exchange_timeout, "one request and its answer")
        try:
            for attempt in (1, 2):
                connection, reused = self.connections.take(origin, deadline.timeout(self.timeout, what))
                # The status line and headers too are read by the deadline, not only per socket read.
                connection.response_class = response_class(deadline.at, lambda: deadline.exceeded(what))
                try:
                    connection.request(method, target, body=body or None, headers={"User-Agent": USER_AGENT, **headers})
                    response = connection.getresponse()
                except STALE:
                    connection.close()
                    if reused and attempt == 1:
                        continue  # the server closed it while it was idle
                    raise
                except BaseException:
                    connection.close()
                    raise
                break
            try:
                content = self._read(response, 0 if method == "HEAD" else limit, what, deadline)
            except BaseException:
                connection.close()
                raise
            if response.will_close:
                connection.close()
            else:
                self.connections.give_back(origin, connection)
        except DeadlineExceeded as error:
            raise RegistryError(str(error)) from None
        except (OSError, http.client.HTTPException) as error:
            raise RegistryError(f"{self.host}: cannot reach the registry ({type(error).__name__})") from None
        self.stats.count(len(body), len(content))
        return Answer(response.status, response.headers, content, url)

    def _read(self, response: http.client.HTTPResponse, limit: int, what: str, deadline: Deadline) -> bytes:
        """The whole body in chunks, within `limit` bytes and the deadline (read1 returns after each
        arrival, so a server dripping bytes is caught). A HEAD answer has no body: its Content-Length
        is the size of what a GET would answer (RFC 9110 9.3.2; a blob's size), not checked against
        the cap, and http.client reads nothing for it (`_method == "HEAD"`); `limit` 0 for HEAD."""
        declared = response.headers.get("Content-Length", "")
        if limit and declared.isdigit() and int(declared) > limit:
            raise RegistryError(f"{what}: the answer has {declared} bytes, more than the {limit} bytes allowed")
        chunks, size = [], 0
        while True:
            chunk = response.read1(64 << 10)
            if not chunk:
                response.read()  # b"": marks the response complete, so the connection can be reused
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise RegistryError(f"{what}: the answer is larger than the {limit} bytes allowed")
            deadline.check(what)
            chunks.append(chunk)

    # --- the two operations -----------------------------------------------------------------------

    def manifest(self, ref: ImageRef) -> Optional[Manifest]:
        path = f"/v2/{ref.repository}/manifests/{ref.digest}"
        answer = self._send("GET", ref.repository, path, {"Accept": ACCEPT}, b"", MAX_MANIFEST_BYTES)
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise RegistryError(f"{ref}: GET manifest answered HTTP {answer.status_code}: {answer.text[:200]}")
        digest = "sha256:" + hashlib.sha256(answer.content).hexdigest()
        if digest != ref.digest:
            raise RegistryError(f"{ref}: the registry returned a manifest whose digest is {digest}")
        return Manifest(answer.content, answer.headers.get("Content-Type", "").split(";")[0], digest)

    def tag(self, ref: ImageRef, manifest: Manifest, tag: str) -> None:
        path = f"/v2/{ref.repository}/manifests/{tag}"
        headers = {"Content-Type": manifest.media_type}
        answer = self._send("PUT", ref.repository, path, headers, manifest.body, MAX_SMALL_ANSWER_BYTES)
        if answer.status_code != 201:
            raise RegistryError(f"{ref}: PUT tag {tag!r} answered HTTP {answer.status_code}: {answer.text[:200]}")
        stored = answer.headers.get("Docker-Content-Digest")
        if stored and stored != manifest.digest:
            raise RegistryError(f"{ref}: tag {tag!r} was stored with digest {stored}, not {manifest.digest}")


    # --- what the build provider needs (components/entity_build.py) ------------------------------

    def manifest_digest(self, repository: str, reference: str) -> Optional[str]:
        """HEAD a manifest by tag or digest: its digest (Docker-Content-Digest), None when absent."""
        path = f"/v2/{repository}/manifests/{reference}"
        answer = self._send("HEAD", repository, path, {"Accept": ACCEPT}, b"", MAX_MANIFEST_BYTES)
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise RegistryError(f"{self.host}/{repository}:{reference}: HEAD manifest answered HTTP {answer.status_code}")
        digest = answer.headers.get("Docker-Content-Digest", "")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RegistryError(f"{self.host}/{repository}:{reference}: no sha256 Docker-Content-Digest in the answer")
        return digest

    def blob_exists(self, repository: str, digest: str) -> bool:
        """HEAD /v2/<repository>/blobs/<digest>."""
        answer = self._send("HEAD", repository, f"/v2/{repository}/blobs/{digest}", {}, b"", MAX_SMALL_ANSWER_BYTES)
        if answer.status_code in (200, 404):
            return answer.status_code == 200
        raise RegistryError(f"{self.host}/{repository}@{digest}: HEAD blob answered HTTP {answer.status_code}")

    def upload_blob(self, repository: str, digest: str, data: bytes) -> None:
        """Upload `data` as one blob: POST an upload session, then PUT the bytes to its Location
        with `?digest=` (the monolithic upload of the distribution spec, push/"Pushing a blob")."""
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise RegistryError(f"{self.host}/{repository}: the blob's bytes do not have digest {digest}")
        answer = self._send("POST", repository, f"/v2/{repository}/blobs/uploads/", {}, b"", MAX_SMALL_ANSWER_BYTES)
        location = answer.headers.get("Location")
        if answer.status_code != 202 or not location:
            raise RegistryError(f"{self.host}/{repository}: starting a blob upload answered HTTP {answer.status_code}: "
                                f"{answer.text[:200]}")
        target = urljoin(self.base + "/", location)
        target += ("&" if "?" in target else "?") + f"digest={quote(digest, safe='')}"
        headers = {"Content-Type": "application/octet-stream"}
        answer = self._send("PUT", repository, target, headers, data, MAX_SMALL_ANSWER_BYTES)
        if answer.status_code != 201:
            raise RegistryError(f"{self.host}/{repository}@{digest}: PUT blob answered HTTP {answer.status_code}: "
                                f"{answer.text[:200]}")

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        """PUT a manifest under a tag (or its digest); returns its digest, checked against the bytes."""
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        path = f"/v2/{repository}/manifests/{reference}"
        answer = self._send("PUT", repository, path, {"Content-Type": media_type}, body, MAX_SMALL_ANSWER_BYTES)
        if answer.status_code != 201:
            raise RegistryError(f"{self.host}/{repository}:{reference}: PUT manifest answered HTTP "
                                f"{answer.status_code}: {answer.text[:200]}")
        stored = answer.headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            raise RegistryError(f"{self.host}/{repository}:{reference}: stored with digest {stored}, not {digest}")
        return digest


def for_url(url: str, credentials: Optional[Credentials] = None, *, timeout: float = 30,
            deadline: Optional[Deadline] = None, env: Mapping[str, str] = os.environ,
            dial: Optional[Callable] = None, exchange_timeout: Optional[float] = None) -> DistributionRegistry:
    """A client of the registry API at `url` (`http(s)://host[:port]`, as `pulumi up` reaches it).
    Credentials go over plain http only to loopback, or through `dial`: a tunnel (e.g.
    components/kube_tunnel.py `PodTunnel.dial`, inside the Kubernetes API's TLS) that `url`'s
    origin is reached through instead of TCP; `url`'s host is then only the Host header. A tunnel
    carries plain http only (the in-cluster registry's)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
        raise RegistryError(f"registry URL {url!r} must be http(s)://host[:port] (no path)")
    if dial is not None and parts.scheme != "http":
        raise RegistryError(f"registry URL {url!r}: a tunnel carries plain http only")
    if credentials is not None and parts.scheme == "http" and not is_loopback(parts.hostname) and dial is None:
        raise RegistryError(f"refusing to send registry credentials over plain http to {parts.netloc}: use https:// "
                            "or a port-forward to localhost")
    return DistributionRegistry(parts.netloc, credentials, insecure=parts.scheme == "http", timeout=timeout,
                                deadline=deadline, env=env, dial=dial, exchange_timeout=exchange_timeout)


def _with(headers: dict, authorization: Optional[str]) -> dict:
    return {**headers, "Authorization": authorization} if authorization else headers


class EcrRegistry:
    """Amazon ECR through its API: the manifest string goes back exactly as it came."""

    def __init__(self, host: str, client=None, *, deadline: Optional[Deadline] = None, timeout: float = 30):
        match = ECR_HOST.match(host)
        if not match:
            raise ValueError(f"{host!r} is not an ECR registry host")
        self.host = host
        self.account = match["account"]
        self.deadline = deadline or Deadline(None)
        if client is None:
            import boto3  # only ECR users need it loaded
            from botocore.config import Config

            limits = Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 3})
            client = boto3.client("ecr", region_name=match["region"], config=limits)
        self.client = client
        self.stats = Stats()

    def manifest(self, ref: ImageRef) -> Optional[Manifest]:
        self._check(ref)
        try:
            answer = self.client.batch_get_image(
                registryId=self.account,
                repositoryName=ref.repository,
                imageIds=[{"imageDigest": ref.digest}],
                acceptedMediaTypes=list(MANIFEST_MEDIA_TYPES),
            )
        except self.client.exceptions.RepositoryNotFoundException:
            self.stats.count(0, 0)
            return None
        images = answer.get("images") or []
        text = images[0]["imageManifest"] if images else ""
        self.stats.count(0, len(text.encode()))
        if not images:
            return None
        if len(text.encode()) > MAX_MANIFEST_BYTES:
            raise RegistryError(f"{ref}: the manifest is larger than the {MAX_MANIFEST_BYTES} bytes allowed")
        media_type = images[0].get("imageManifestMediaType") or json.loads(text).get("mediaType", "")
        return Manifest(text.encode(), media_type, images[0]["imageId"]["imageDigest"])

    def tag(self, ref: ImageRef, manifest: Manifest, tag: str) -> None:
        self._check(ref)
        self.stats.count(len(manifest.body), 0)
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

    def _check(self, ref: ImageRef) -> None:
        try:
            self.deadline.check(f"{ref}")
        except DeadlineExceeded as error:
            raise RegistryError(str(error)) from None


def connect(host: str, env: Mapping[str, str] = os.environ, deadline: Optional[Deadline] = None) -> Registry:
    """The right client for a registry host (as named in image references)."""
    if ECR_HOST.match(host):
        return EcrRegistry(host, deadline=deadline)
    addresses = dict(
        item.strip().split("=", 1) for item in env.get(ADDRESSES_ENV, "").split(",") if "=" in item
    )
    address = addresses.get(host, host).strip()
    credentials = credentials_for(host, env) or credentials_for(address, env)
    return DistributionRegistry(host, credentials, address=address, env=env, deadline=deadline)
