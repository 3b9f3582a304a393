"""components/registry_api.py against a real registry (docker-registry with auth), a bearer-token front
for it, and moto's ECR."""
from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import time

import boto3
import pytest
import requests
from moto import mock_aws

from infra import config as stack_config
from infra import image_refs
from components import registry_api
from components.limits import MAX_MANIFEST_BYTES, Deadline
from components.registry_api import Credentials, DistributionRegistry, EcrRegistry, ImageRef, RegistryError
from tests.registry_server import (
    PASSWORD, USERNAME, CountingProxy, DrippingServer, ScriptedServer, build_oci_image, drip, ecr_manifest,
)

LAYER_BYTES = 1 << 20


@pytest.fixture(scope="module")
def images(registry, tmp_path_factory) -> dict[str, ImageRef]:  # noqa: F811
    """An OCI-manifest image and a Docker-v2 manifest image, each with a 1 MiB layer."""
    layout = tmp_path_factory.mktemp("oci")
    image = build_oci_image(layout, "v1", os.urandom(LAYER_BYTES))
    oci = registry.push(image, "shop/cart", "v1")
    docker = registry.push(image, "shop/likes", "v1", manifest_format="v2s2")
    return {
        "oci": ImageRef.parse(f"{registry.host}/shop/cart:v1@{oci}"),
        "docker": ImageRef.parse(f"{registry.host}/shop/likes:v1@{docker}"),
    }


def client(registry, password: str = PASSWORD) -> DistributionRegistry:  # noqa: F811
    return DistributionRegistry(registry.host, Credentials(USERNAME, password))


def test_image_ref_parses_digest_pinned_refs_and_refuses_others():
    ref = ImageRef.parse("127.0.0.1:5000/shop/cart:v1@sha256:" + "a" * 64)
    parts = (ref.registry, ref.repository, ref.tag, ref.digest)
    assert parts == ("127.0.0.1:5000", "shop/cart", "v1", "sha256:" + "a" * 64)
    assert str(ref) == "127.0.0.1:5000/shop/cart:v1@sha256:" + "a" * 64
    assert ImageRef.parse("r.example/a/b@sha256:" + "0" * 64).tag is None
    with pytest.raises(ValueError, match="not pinned by digest"):
        ImageRef.parse("127.0.0.1:5000/shop/cart:v1")


def test_credentials_from_env_then_docker_config(tmp_path):
    env = {registry_api.USERNAME_ENV: "u", registry_api.PASSWORD_ENV: "p", registry_api.HOST_ENV: "r.example",
           "DOCKER_CONFIG": str(tmp_path)}
    assert registry_api.credentials_for("r.example", env) == Credentials("u", "p")
    auth = base64.b64encode(b"docker-user:docker-pw").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"https://r.example:5000/v1/": {"auth": auth}}}))
    env = {"DOCKER_CONFIG": str(tmp_path)}
    assert registry_api.credentials_for("r.example:5000", env) == Credentials("docker-user", "docker-pw")
    assert registry_api.credentials_for("other.example", env) is None
    assert "docker-pw" not in repr(registry_api.credentials_for("r.example:5000", env))


def test_loopback_and_listed_registries_use_http_others_https():
    assert DistributionRegistry("127.0.0.1:5000", env={}).base == "http://127.0.0.1:5000"
    assert DistributionRegistry("localhost:5000", env={}).base == "http://localhost:5000"
    assert DistributionRegistry("r.example", env={}).base == "https://r.example"
    assert DistributionRegistry("r.example", env={registry_api.INSECURE_ENV: "a, r.example"}).base == "http://r.example"


@pytest.mark.parametrize("kind, media_type", [
    ("oci", "application/vnd.oci.image.manifest.v1+json"),
    ("docker", "application/vnd.docker.distribution.manifest.v2+json"),
])
def test_manifest_by_digest_keeps_the_exact_bytes(registry, images, kind, media_type):  # noqa: F811
    manifest = client(registry).manifest(images[kind])
    assert manifest.media_type == media_type
    assert manifest.digest == images[kind].digest  # sha256 of the body, checked by the client too


def test_without_accept_header_the_registry_would_not_serve_the_oci_manifest(registry, images):  # noqa: F811
    # Why every GET sends Accept: distribution answers 404 for an OCI manifest without it.
    ref = images["oci"]
    bare = requests.get(f"{registry.url}/v2/{ref.repository}/manifests/{ref.digest}", auth=registry.auth, timeout=5)
    assert bare.status_code == 404 and "accept header" in bare.text


@pytest.mark.parametrize("kind", ["oci", "docker"])
def test_tag_copies_the_manifest_inside_the_registry_without_layer_bytes(registry, images, kind):  # noqa: F811
    ref = images[kind]
    registry_client = client(registry)
    manifest = registry_client.manifest(ref)
    registry_client.tag(ref, manifest, "prod")
    registry_client.tag(ref, manifest, "prod-20260101T000000Z")
    assert registry.digest_of(ref.repository, "prod") == ref.digest
    assert registry.digest_of(ref.repository, "prod-20260101T000000Z") == ref.digest
    stats = registry_client.stats
    # 401 challenge + GET + 2 PUTs; only manifests on the wire, never the 1 MiB layer.
    assert stats.requests == 4
    assert stats.bytes_sent == 2 * len(manifest.body)
    assert stats.bytes_received < 4096 < LAYER_BYTES


def test_missing_digest_or_repository_is_none(registry, images):  # noqa: F811
    registry_client = client(registry)
    assert registry_client.manifest(ImageRef.parse(f"{registry.host}/shop/cart@sha256:" + "0" * 64)) is None
    assert registry_client.manifest(ImageRef.parse(f"{registry.host}/no/such@{images['oci'].digest}")) is None


def test_missing_or_wrong_credentials_are_clear_errors_without_the_password(registry, images):  # noqa: F811
    with pytest.raises(RegistryError, match=registry_api.USERNAME_ENV):
        DistributionRegistry(registry.host, None).manifest(images["oci"])
    with pytest.raises(RegistryError, match="rejected the credentials") as error:
        client(registry, password="wrong-password").manifest(images["oci"])
    assert "wrong-password" not in str(error.value)


class _TokenFront(BaseHTTPRequestHandler):
    """A registry front that wants Bearer tokens (like Docker Hub, GHCR, Harbor) and forwards to
    the real registry; its token endpoint takes Basic credentials."""

    token = "issued-token"
    upstream: str
    upstream_auth: tuple[str, str]
    scopes: list[str]

    def log_message(self, *args):  # keep test output clean
        pass

    def _answer(self, status: int, headers: dict, body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        if self.path.startswith("/token"):
            expected = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                return self._answer(401, {})
            self.scopes.append(self.path)
            return self._answer(200, {"Content-Type": "application/json"}, json.dumps({"token": self.token}).encode())
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            realm = f"http://{self.headers['Host']}/token"
            repository = self.path.split("/manifests/")[0].removeprefix("/v2/")
            challenge = f'Bearer realm="{realm}",service="front",scope="repository:{repository}:pull,push"'
            return self._answer(401, {"WWW-Authenticate": challenge})
        length = int(self.headers.get("Content-Length") or 0)
        headers = {k: v for k, v in self.headers.items() if k in ("Accept", "Content-Type")}
        upstream = requests.request(
            self.command, self.upstream + self.path, headers=headers, data=self.rfile.read(length) or None,
            auth=self.upstream_auth, timeout=5,
        )
        keep = {k: v for k, v in upstream.headers.items() if k in ("Content-Type", "Docker-Content-Digest")}
        self._answer(upstream.status_code, keep, upstream.content)

    do_GET = do_HEAD = do_PUT = _handle


def test_bearer_token_challenge(registry, images):  # noqa: F811
    handler = type("Front", (_TokenFront,), {"upstream": registry.url, "upstream_auth": registry.auth, "scopes": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        front = DistributionRegistry(host, Credentials(USERNAME, PASSWORD))
        ref = ImageRef.parse(f"{host}/{images['oci'].repository}@{images['oci'].digest}")
        manifest = front.manifest(ref)
        front.tag(ref, manifest, "via-token")
        assert registry.digest_of(ref.repository, "via-token") == ref.digest
        assert handler.scopes == ["/token?service=front&scope=repository%3Ashop%2Fcart%3Apull%2Cpush"]
        assert front.stats.requests == 4  # challenge, token, GET, PUT (token reused)
        with pytest.raises(RegistryError, match="token service refused"):
            DistributionRegistry(host, Credentials(USERNAME, "nope")).manifest(ref)
    finally:
        server.shutdown()
        server.server_close()


ECR_HOST = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
ECR_MANIFEST = ecr_manifest("d")


@pytest.fixture
def ecr(aws_env):
    with mock_aws():
        client = boto3.client("ecr", region_name="us-east-1")
        client.create_repository(repositoryName="shop/cart")
        pushed = client.put_image(repositoryName="shop/cart", imageManifest=ECR_MANIFEST, imageTag="test-abc")
        # moto's digest is not sha256(manifest) (environment.md §3.1): use the one it reports.
        yield client, pushed["image"]["imageId"]["imageDigest"]


def test_ecr_fetch_and_tag_with_the_exact_manifest_string(ecr):
    client, digest = ecr
    registry_client = registry_api.connect(ECR_HOST)
    assert isinstance(registry_client, EcrRegistry)
    ref = ImageRef.parse(f"{ECR_HOST}/shop/cart:test-abc@{digest}")
    manifest = registry_client.manifest(ref)
    assert manifest.body.decode() == ECR_MANIFEST
    registry_client.tag(ref, manifest, "prod")
    registry_client.tag(ref, manifest, "prod")  # again: already there is fine
    described = client.describe_images(repositoryName="shop/cart")["imageDetails"]
    assert [sorted(d["imageTags"]) for d in described] == [["prod", "test-abc"]]
    assert registry_client.stats.requests == 3


def test_ecr_missing_digest_or_repository_is_none(ecr):
    _, digest = ecr
    registry_client = registry_api.connect(ECR_HOST)
    assert registry_client.manifest(ImageRef.parse(f"{ECR_HOST}/shop/cart@sha256:" + "0" * 64)) is None
    assert registry_client.manifest(ImageRef.parse(f"{ECR_HOST}/shop/none@{digest}")) is None


def test_node_side_registry_address_can_be_mapped_for_the_promoter(registry, images):  # noqa: F811
    env = {
        registry_api.ADDRESSES_ENV: f"other:1=x:2, localhost:32000={registry.host}",
        registry_api.USERNAME_ENV: USERNAME,
        registry_api.PASSWORD_ENV: PASSWORD,
        registry_api.HOST_ENV: "localhost:32000",
    }
    node_side = ImageRef.parse(f"localhost:32000/{images['oci'].repository}@{images['oci'].digest}")
    registry_client = registry_api.connect("localhost:32000", env)
    assert registry_client.base == f"http://{registry.host}"
    assert registry_client.manifest(node_side).digest == images["oci"].digest


# --- references matched whole (issue 11, item 10) ---------------------------------------------

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("ref", [
    f"localhost:32000/shop/cart@{DIGEST}\n",            # `$` would match before a final newline
    f"localhost:32000/shop/cart:t\u00e9st@{DIGEST}",     # `\\w` without re.ASCII matches é
    f"localhost:32000/shop/cart:\u0661@{DIGEST}",        # ... and Arabic-Indic digits
    f"localhost:32000/shop/cart@{DIGEST}\n# more",
    f" localhost:32000/shop/cart@{DIGEST}",
])
def test_digest_references_are_matched_whole_and_in_ascii(ref):
    assert not image_refs.is_digest_ref(ref)
    assert not image_refs.DIGEST_REF.match(ref) and not image_refs.DIGEST_REF.search(ref)
    assert stack_config.DIGEST_REF is image_refs.DIGEST_REF  # one definition for config, promote and policy
    with pytest.raises(ValueError, match="not pinned by digest"):
        ImageRef.parse(ref)


def test_reference_rule_names_host_and_repository():
    ok = f"localhost:32000/team/shop/cart:v1@{DIGEST}"
    assert image_refs.reference_problem(ok, "localhost:32000", image_refs.entity_repository("team", "shop", "cart")) is None
    assert "registry host 'r.example'" in image_refs.reference_problem(
        f"r.example/team/shop/cart@{DIGEST}", "localhost:32000", "team/shop/cart")
    assert "repository 'shop/cart'" in image_refs.reference_problem(
        f"localhost:32000/shop/cart@{DIGEST}", "localhost:32000", "team/shop/cart")


# --- credentials go only to the registry they are for (item 7) --------------------------------


def test_env_credentials_are_scoped_to_one_named_host(tmp_path):
    env = {registry_api.USERNAME_ENV: "u", registry_api.PASSWORD_ENV: "p", "DOCKER_CONFIG": str(tmp_path)}
    with pytest.raises(RegistryError, match=f"{registry_api.HOST_ENV} is not"):
        registry_api.credentials_for("r.example", env)
    env[registry_api.HOST_ENV] = "r.example"
    assert registry_api.credentials_for("r.example", env) == Credentials("u", "p")
    assert registry_api.credentials_for("other.example", env) is None
    assert registry_api.connect("other.example", env).credentials is None


def test_bearer_realm_over_plain_http_elsewhere_gets_no_credentials():
    challenge = 'Bearer realm="http://tokens.example/token",service="front",scope="repository:shop/cart:pull"'
    with ScriptedServer(lambda seen: (401, {"WWW-Authenticate": challenge}, b"")) as server:
        client = DistributionRegistry(server.host, Credentials(USERNAME, PASSWORD), timeout=2)
        with pytest.raises(RegistryError, match=r"token realm http://tokens.example/token is not https"):
            client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{DIGEST}"))
    assert client.stats.requests == 1  # the challenge; the realm was never asked


def _front(registry, elsewhere: str):
    """A registry front that redirects manifest reads: `/here/...` to itself, else to `elsewhere`."""
    def respond(seen):
        expected = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
        if seen.headers.get("Authorization") != expected:
            return 401, {"WWW-Authenticate": 'Basic realm="front"'}, b""
        if seen.path.startswith("/here/"):
            upstream = requests.get(registry.url + seen.path[len("/here"):], headers={"Accept": registry_api.ACCEPT},
                                    auth=registry.auth, timeout=5)
            return upstream.status_code, {"Content-Type": upstream.headers["Content-Type"]}, upstream.content
        if "/same/" in seen.path:
            return 307, {"Location": "/here" + seen.path.replace("/same/", "/")}, b""
        return 307, {"Location": elsewhere + seen.path}, b""
    return respond


def test_redirects_carry_authorization_only_on_the_registry_itself(registry, images):  # noqa: F811
    realm_challenge = {}

    def storage(seen):  # another origin: answers with a Bearer challenge whose realm is itself
        if seen.path.startswith("/token"):
            return 200, {"Content-Type": "application/json"}, b'{"token": "t"}'
        return 401, {"WWW-Authenticate": realm_challenge["value"]}, b""

    with ScriptedServer(storage) as other:
        realm_challenge["value"] = f'Bearer realm="{other.url}/token",service="storage"'
        with ScriptedServer(_front(registry, other.url)) as front:
            client = DistributionRegistry(front.host, Credentials(USERNAME, PASSWORD))
            ref = images["oci"]
            # A redirect on the registry itself keeps the credentials and the read works.
            same = ImageRef.parse(f"{front.host}/same/{ref.repository}@{ref.digest}")
            assert client.manifest(same).digest == ref.digest
            # A redirect elsewhere goes without them; that host asking for credentials is refused.
            with pytest.raises(RegistryError, match=r"redirected to 127.0.0.1:\d+, which asks for credentials"):
                client.manifest(ImageRef.parse(f"{front.host}/{ref.repository}@{ref.digest}"))
    assert [s.path.split("?")[0] for s in other.seen] == [f"/v2/{ref.repository}/manifests/{ref.digest}"]
    assert not any("Authorization" in s.headers for s in other.seen)


# --- size caps and the deadline (item 8) ------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True])
def test_a_manifest_larger_than_4_mib_is_refused_unread(chunked):
    four_mib = 4 * 1024 * 1024
    big = b"x" * (four_mib + 1)
    body = [(big[i:i + (1 << 20)], 0) for i in range(0, len(big), 1 << 20)] if chunked else big
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, body)) as server:
        client = DistributionRegistry(server.host)
        with pytest.raises(RegistryError, match=f"(more|larger) than the {four_mib} bytes allowed"):
            client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{DIGEST}"))
    assert MAX_MANIFEST_BYTES == four_mib


def test_a_slow_registry_cannot_hold_the_run_past_its_deadline():
    drip = [(b"{", 0)] + [(b" ", 0.2)] * 50  # 10 s of a body, each chunk well within the read timeout
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, drip)) as server:
        client = DistributionRegistry(server.host, timeout=30, deadline=Deadline(1))
        started = time.monotonic()
        with pytest.raises(RegistryError, match="deadline"):
            client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{DIGEST}"))
        assert time.monotonic() - started < 3
        with pytest.raises(RegistryError, match="deadline"):  # and nothing more is started after it
            client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{DIGEST}"))


def test_a_registry_dripping_its_headers_cannot_hold_the_run_past_its_deadline():
    """Issue 20 finding 7: each byte of the status line and headers arrives well within the read
    timeout, so only a deadline over the whole exchange stops it (a 3 s deadline was held 20 s)."""
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"x" * 60 + b"\r\n"
    with DrippingServer(drip(headers, 0.2)) as server:  # 20 s of headers, never finished
        client = DistributionRegistry(server.host, timeout=30, deadline=Deadline(1))
        started = time.monotonic()
        with pytest.raises(RegistryError, match="deadline"):
            client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{DIGEST}"))
        assert time.monotonic() - started < 3
        assert server.requests == 1


def test_over_https_an_answer_is_read_whole_and_dripped_headers_meet_the_deadline(tmp_path):
    """The deadline reads go through the TLS socket as through a plain one: a complete answer is
    read and checked, dripped headers are given up on."""
    body = json.dumps({"schemaVersion": 2, "mediaType": registry_api.MANIFEST_MEDIA_TYPES[1]}).encode()
    digest = "sha256:" + __import__("hashlib").sha256(body).hexdigest()
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: " + registry_api.MANIFEST_MEDIA_TYPES[1].encode() +
              b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with DrippingServer([(answer, 0)], tls_dir=tmp_path) as server:
        env = {"REQUESTS_CA_BUNDLE": str(server.ca_file)}
        client = DistributionRegistry(server.host, insecure=False, env=env, deadline=Deadline(5))
        assert client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{digest}")).body == body
    with DrippingServer(drip(answer, 0.2), tls_dir=tmp_path) as server:
        client = DistributionRegistry(server.host, insecure=False, env={"REQUESTS_CA_BUNDLE": str(server.ca_file)},
                                      deadline=Deadline(1))
        started = time.monotonic()
        with pytest.raises(RegistryError, match="deadline"):
            client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{digest}"))
        assert time.monotonic() - started < 3


# --- a registry that lies (issue 20 finding 11): each guard has a test that fails without it ------------


def test_a_manifest_whose_bytes_are_not_the_pinned_digest_is_refused(registry, images):  # noqa: F811
    """A registry answering a digest with other bytes (here: another image's real manifest) is
    refused: the bytes are hashed, never trusted by their name."""
    other = requests.get(f"{registry.url}/v2/shop/likes/manifests/{images['docker'].digest}", auth=registry.auth,
                         headers={"Accept": registry_api.ACCEPT}, timeout=5).content
    with CountingProxy(registry.url, lie=lambda seen, content: other if "/manifests/sha256:" in seen.path else None) as liar:
        client = DistributionRegistry(liar.host, Credentials(USERNAME, PASSWORD))
        ref = images["oci"]
        with pytest.raises(RegistryError, match=rf"returned a manifest whose digest is sha256:(?!{ref.digest[7:]})"):
            client.manifest(ImageRef.parse(f"{liar.host}/{ref.repository}@{ref.digest}"))


@pytest.mark.parametrize("operation", ["tag", "put_manifest"])
def test_a_put_answered_with_another_digest_is_an_error(operation):
    """The registry says it stored the tag under another digest than the bytes sent: refused (the
    tag would point elsewhere than the promotion, or the build context, says)."""
    body = json.dumps({"schemaVersion": 2, "mediaType": registry_api.MANIFEST_MEDIA_TYPES[1]}).encode()
    digest = "sha256:" + __import__("hashlib").sha256(body).hexdigest()
    lie = "sha256:" + "0" * 64
    with ScriptedServer(lambda seen: (201, {"Docker-Content-Digest": lie}, b"")) as server:
        client = DistributionRegistry(server.host)
        with pytest.raises(RegistryError, match=f"stored with digest {lie}, not {digest}"):
            if operation == "tag":
                manifest = registry_api.Manifest(body, registry_api.MANIFEST_MEDIA_TYPES[1], digest)
                client.tag(ImageRef.parse(f"{server.host}/shop/cart@{digest}"), manifest, "prod-20260101T000000Z")
            else:
                client.put_manifest("builds/shop/cart", "t1", body, registry_api.MANIFEST_MEDIA_TYPES[1])
        assert [s.method for s in server.seen] == ["PUT"]


def test_a_redirect_from_https_to_plain_http_is_refused(tmp_path):
    """An https registry redirecting a read to http:// would have the answer (and, on its own host,
    the credentials) cross the network in clear: refused, the http target never asked."""
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, b"{}")) as plain:
        answer = (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + plain.url.encode() +
                  b"/v2/shop/cart/manifests/" + DIGEST.encode() + b"\r\nContent-Length: 0\r\n\r\n")
        with DrippingServer([(answer, 0)], tls_dir=tmp_path) as server:
            client = DistributionRegistry(server.host, insecure=False, env={"REQUESTS_CA_BUNDLE": str(server.ca_file)})
            with pytest.raises(RegistryError, match=r"refused a redirect from https to http://127\.0\.0\.1:\d+/v2/"):
                client.manifest(ImageRef.parse(f"{server.host}/shop/cart@{DIGEST}"))
            assert server.requests == 1
        assert plain.seen == []
