"""The registry's authorizing gate (components/registry_gate.py) and the tenant policy it enforces
(components/registry_access.py): the path grammar as distribution routes it, the decisions, and the
gate in front of a real registry (tests/registry_server.py), where every refusal is the server's.

The attack chain of issue 20 ("Why", steps 1-2) is `test_a_tenant_build_cannot_push_to_another_project`,
`test_a_tenant_build_cannot_push_to_the_platform` and `test_a_build_cannot_move_its_own_tag`; steps 3-4
are tests/test_entity_build.py and tests/test_promote.py (`..._foreign_digest_...`)."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import pytest
import requests

from components import registry_access as access
from components import registry_gate as gate
from components.registry_api import ACCEPT
from tests.registry_server import RegistryServer, build_oci_image

DEPLOYER = "cloudstation"
PROJECTS = ("shop", "games", "platform")
PASSWORDS = {user: f"pw-{user}-0123456789" for user in access.usernames(PROJECTS, DEPLOYER, True)}
CONTENT_TAG = "0123456789abcdef0123456789abcdef"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def policy(builds_in_cluster: bool = True) -> gate.Policy:
    return gate.load_policy(access.gate_policy(PROJECTS, DEPLOYER, builds_in_cluster))


def decide(user: str, method: str, path: str, query: str = "", content_type: str = "", builds: bool = True):
    return gate.refusal(policy(builds), user, method, path, query, content_type)


# --- the path grammar -----------------------------------------------------------------------------


@pytest.mark.parametrize("path, expected", [
    ("/v2/", gate.Route("base")),
    ("/v2/_catalog", gate.Route("catalog")),
    ("/v2/shop/cart/tags/list", gate.Route("tags", "shop/cart")),
    ("/v2/shop/cart/manifests/v1", gate.Route("manifest", "shop/cart", "v1")),
    ("/v2/shop/cart/manifests/sha256:" + "a" * 64, gate.Route("manifest", "shop/cart")),
    ("/v2/builds/shop/cart/blobs/sha256:" + "b" * 64, gate.Route("blob", "builds/shop/cart")),
    ("/v2/shop/cart/blobs/uploads/", gate.Route("upload", "shop/cart")),
    ("/v2/shop/cart/blobs/uploads/0b4e-aa_1.x=", gate.Route("upload-chunk", "shop/cart")),
    # Names may hold the route's own words: the greedy name takes all but the last one, as mux's regexp.
    ("/v2/a/manifests/b/manifests/c", gate.Route("manifest", "a/manifests/b", "c")),
    ("/v2/a/manifests/tags/list", gate.Route("tags", "a/manifests")),
    ("/v2/a/blobs/uploads/manifests/t", gate.Route("manifest", "a/blobs/uploads", "t")),
    # A domain[:port] first component (reference.NameRegexp), with capitals, is a name too.
    ("/v2/Reg.Example:5000/shop/cart/manifests/v1", gate.Route("manifest", "Reg.Example:5000/shop/cart", "v1")),
    ("/v2/Shop/cart/manifests/v1", gate.Route("manifest", "Shop/cart", "v1")),  # another repository than shop/cart
])
def test_paths_are_routed_as_distribution_routes_them(path, expected):
    assert gate.route(path) == expected


@pytest.mark.parametrize("path", [
    "/v2",                                         # mux redirects (StrictSlash): refused, never forwarded
    "/v2/shop/cart/manifests/v1/",                 # the same
    "/v2/shop//cart/manifests/v1",                 # mux cleans the path before routing
    "/v2/shop/../platform/project-state/manifests/v1",
    "/v2/shop%2Fcart/manifests/v1",                # Go routes the decoded path
    "/v2/shop/cart/manifests/sha256:abc",          # digest-shaped, not a digest: distribution makes it a tag
    "http://registry/v2/shop/cart/manifests/v1",   # absolute-form target
    "/v2/shop/cart/referrers/sha256:" + "a" * 64,  # not a route of v3.1.1
    "/v2/shop/cart/blobs/uploads/..",              # an upload id of dots: mux cleans it (301 to .../blobs)
    "/v2/shop/cart/blobs/uploads/.",
    "/debug/vars",
])
def test_paths_distribution_would_clean_redirect_or_read_otherwise_are_refused(path):
    assert gate.route(path) is None
    refused = decide(DEPLOYER, "GET", path)
    assert refused is not None and "is not a registry API v2 request" in refused[0]


def test_the_grammar_is_distributions_own():
    """The regular expressions are distribution v3.1.1's (reference v0.6.0 regexp.go, go-digest
    v1.0.0), read from the module cache when it is there."""
    from pathlib import Path as P

    source = P.home() / "go/pkg/mod/github.com/distribution/reference@v0.6.0/regexp.go"
    if source.is_file():
        text = source.read_text()
        assert "separator = `(?:[._]|__|[-]+)`" in text
        assert "tag = `[\\w][\\w.-]{0,127}`" in text
    assert re.fullmatch(gate.NAME, "a/b-c/d__e/f.g")
    assert not re.fullmatch(gate.NAME, "a/b_-c")  # one separator kind at a time
    assert re.fullmatch(gate.TAG, "x" * 128) and not re.fullmatch(gate.TAG, "x" * 129)
    assert not re.fullmatch(gate.TAG, "é")  # Go's \w is ASCII


@pytest.mark.parametrize("kind, method, expected", [
    ("manifest", "GET", "pull"), ("manifest", "HEAD", "pull"), ("manifest", "PUT", "push"),
    ("manifest", "DELETE", "delete"), ("manifest", "POST", None),
    ("blob", "GET", "pull"), ("blob", "DELETE", "delete"), ("blob", "PUT", None),
    ("upload", "POST", "push"), ("upload", "GET", None),
    ("upload-chunk", "PATCH", "push"), ("upload-chunk", "PUT", "push"), ("upload-chunk", "GET", "push"),
    ("upload-chunk", "DELETE", "push"),  # cancelling an upload is part of pushing
    ("tags", "GET", "pull"), ("catalog", "GET", "catalog"), ("base", "GET", "login"), ("base", "PUT", None),
])
def test_each_operation_needs_its_action(kind, method, expected):
    assert gate.action(kind, method) == expected


# --- the decisions --------------------------------------------------------------------------------

MANIFEST = "/v2/{}/manifests/{}"


@pytest.mark.parametrize("user, method, path, refused", [
    ("build-games", "PUT", MANIFEST.format("games/snake", CONTENT_TAG), False),
    ("build-games", "PUT", MANIFEST.format("shop/cart", CONTENT_TAG), True),
    ("build-games", "POST", "/v2/shop/cart/blobs/uploads/", True),
    ("build-games", "PUT", MANIFEST.format("platform/project-state", CONTENT_TAG), True),
    ("build-games", "GET", MANIFEST.format("shop/cart", CONTENT_TAG), True),   # no reading others' images
    ("build-games", "GET", "/v2/builds/games/snake/blobs/sha256:" + "a" * 64, False),
    ("build-games", "GET", "/v2/builds/shop/cart/blobs/sha256:" + "a" * 64, True),
    ("build-games", "POST", "/v2/builds/games/snake/blobs/uploads/", True),  # contexts are the deployer's
    ("build-games", "GET", "/v2/_catalog", True),
    ("build-shop", "PUT", MANIFEST.format("Shop/cart", CONTENT_TAG), True),
    ("build-shop", "PUT", MANIFEST.format("shop", CONTENT_TAG), True),  # `shop/*` is below shop/ only
    ("build-platform", "PUT", MANIFEST.format("platform/project-state", CONTENT_TAG), False),
    ("pull-shop", "GET", MANIFEST.format("shop/cart", "sha256:" + "c" * 64), False),
    ("pull-shop", "PUT", MANIFEST.format("shop/cart", "v1"), True),
    ("pull-shop", "GET", MANIFEST.format("games/snake", "v1"), True),
    ("pull-shop", "GET", "/v2/builds/shop/cart/tags/list", True),
    (DEPLOYER, "GET", MANIFEST.format("games/snake", "v1"), False),
    (DEPLOYER, "PUT", MANIFEST.format("builds/shop/cart", CONTENT_TAG), False),
    (DEPLOYER, "PUT", MANIFEST.format("shop/cart", "prod-20260304T050607Z"), False),
    (DEPLOYER, "PUT", MANIFEST.format("shop/cart", CONTENT_TAG), True),   # only builds write content tags
    (DEPLOYER, "POST", "/v2/shop/cart/blobs/uploads/", True),
    (DEPLOYER, "GET", "/v2/_catalog", False),
    (DEPLOYER, "DELETE", MANIFEST.format("shop/cart", "sha256:" + "c" * 64), True),
    ("build-shop", "DELETE", "/v2/shop/cart/blobs/sha256:" + "c" * 64, True),
    ("nobody", "GET", "/v2/", True),
])
def test_each_user_reaches_exactly_its_repositories(user, method, path, refused):
    assert (decide(user, method, path) is not None) == refused, decide(user, method, path)


def test_with_local_builds_the_deployer_pushes_images_create_only_and_there_are_no_build_users():
    assert decide(DEPLOYER, "PUT", MANIFEST.format("shop/cart", CONTENT_TAG), builds=False) is None
    assert decide(DEPLOYER, "POST", "/v2/shop/cart/blobs/uploads/", builds=False) is None
    assert gate.needs_tag_check(policy(False), DEPLOYER, "PUT", MANIFEST.format("shop/cart", CONTENT_TAG))
    assert not any(user.startswith("build-") for user in access.usernames(PROJECTS, DEPLOYER, False))


def test_refusals_name_the_user_the_repository_and_the_action():
    message, detail = decide("build-games", "PUT", MANIFEST.format("shop/cart", CONTENT_TAG))
    assert message == f"user 'build-games' may not push shop/cart:{CONTENT_TAG} (its push rights: games/*)"
    assert detail == {"user": "build-games", "repository": "shop/cart", "action": "push"}
    message, _ = decide("pull-shop", "DELETE", MANIFEST.format("shop/cart", "sha256:" + "c" * 64))
    assert "'pull-shop' may not delete in 'shop/cart': deletes are off" in message


def test_only_builders_and_the_deployers_content_tags_are_create_only():
    tagged = MANIFEST.format("games/snake", CONTENT_TAG)
    assert gate.needs_tag_check(policy(), "build-games", "PUT", tagged) == gate.Route("manifest", "games/snake", CONTENT_TAG)
    assert gate.needs_tag_check(policy(), "build-games", "PUT", MANIFEST.format("games/snake", "sha256:" + "a" * 64)) is None
    assert gate.needs_tag_check(policy(), DEPLOYER, "PUT", MANIFEST.format("shop/cart", "prod")) is None  # a moving tag
    assert gate.needs_tag_check(policy(), DEPLOYER, "PUT", MANIFEST.format("builds/shop/cart", CONTENT_TAG))


def test_a_tag_may_be_created_or_written_again_with_its_own_digest_but_not_moved():
    found = gate.Route("manifest", "games/snake", CONTENT_TAG)
    body = b'{"schemaVersion":2}'
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert gate.tag_refusal("build-games", found, None, body) is None
    assert gate.tag_refusal("build-games", found, digest, body) is None
    other = "sha256:" + "f" * 64
    assert gate.tag_refusal("build-games", found, other, body) == (
        f"user 'build-games' may not move tag games/snake:{CONTENT_TAG} from {other} to {digest}: its tags are "
        "create-only (docs/security.md, tenant model)")


@pytest.mark.parametrize("query, refused", [
    ("mount=sha256:" + "a" * 64 + "&from=games/snake", False),
    ("mount=sha256:" + "a" * 64 + "&from=shop/cart", True),
    ("mount=sha256:" + "a" * 64 + "&fr%6Fm=shop/cart", True),        # Go decodes keys too
    ("mount=sha256:" + "a" * 64 + "&from=games/snake&from=shop/cart", True),  # which one would Go take?
    ("mount=sha256:" + "a" * 64 + "&from=shop%2",  True),            # a bad escape: Go drops the pair
    ("mount=x;from=shop/cart", True),
    ("digest=sha256:" + "a" * 64, False),
    ("", False),
])
def test_a_cross_repository_mount_needs_pull_on_its_source(query, refused):
    assert (decide("build-games", "POST", "/v2/games/snake/blobs/uploads/", query) is not None) == refused


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "Multipart/Form-Data; boundary=x"])
def test_an_upload_with_a_form_body_is_refused(content_type):
    """distribution reads `mount` and `from` with r.FormValue, which reads a form body too."""
    message, _ = decide("build-games", "POST", "/v2/games/snake/blobs/uploads/", "", content_type)
    assert "body is refused" in message


# Content types Go reads as a form and a naive reading does not: mime.ParseMediaType lowercases with
# strings.ToLower (Unicode: U+0130 becomes "i") and trims with strings.TrimSpace (Unicode: U+00A0 and
# U+0085 are spaces), on the header's bytes as UTF-8; the gate reads headers as Latin-1 text.
GO_FORM_TYPES = [
    "application/x-www-form-urlencoded\xc2\xa0",                # ...urlencoded + NO-BREAK SPACE (UTF-8)
    "application/x-www-form-urlencoded\xc2\x85",                # ...urlencoded + NEXT LINE (UTF-8)
    "appl\xc4\xb0cation/x-www-form-urlencoded",                 # U+0130, which Go lowercases to "i"
    "mult\xc4\xb0part/form-data; boundary=x",
]


@pytest.mark.parametrize("content_type", GO_FORM_TYPES)
def test_an_upload_whose_content_type_go_would_read_as_a_form_is_refused(content_type):
    """The header as the gate sees it (http.server decodes header bytes as Latin-1)."""
    for method, path in (("POST", "/v2/games/snake/blobs/uploads/"), ("PUT", "/v2/games/snake/blobs/uploads/u-1"),
                         ("PATCH", "/v2/games/snake/blobs/uploads/u-1")):
        refused = decide("build-games", method, path, "", content_type)
        assert refused is not None and "Content-Type" in refused[0], (method, content_type)
    # Plain ASCII types clients send are still fine.
    for plain in ("application/octet-stream", "application/json", "application/json; charset=utf-8", ""):
        assert decide("build-games", "POST", "/v2/games/snake/blobs/uploads/", "", plain) is None, plain


def test_a_malformed_policy_is_named():
    with pytest.raises(gate.PolicyError, match=r"users.x.rules\[0\].actions: must be a non-empty list of pull, push"):
        gate.load_policy({"users": {"x": {"rules": [{"repositories": ["a/*"], "actions": ["delete"]}]}}})
    with pytest.raises(gate.PolicyError, match="users.x.rules\\[0\\].tags: not a regular expression"):
        gate.load_policy({"users": {"x": {"rules": [{"repositories": ["a/*"], "actions": ["push"], "tags": "("}]}}})


def test_the_gate_imports_only_the_standard_library():
    """Its container has the python image and nothing else (the tests below also run it with -I)."""
    source = Path(gate.__file__).read_text()
    imported = {name.split(".")[0] for name in re.findall(r"^\s*(?:from|import) ([\w.]+)", source, re.M)}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


# --- against a real registry ----------------------------------------------------------------------


def login(user: str) -> tuple[str, str]:
    return user, PASSWORDS[user]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    users = dict(PASSWORDS)
    deployer_password = users.pop(DEPLOYER)
    with RegistryServer(tmp_path_factory.mktemp("gated"), username=DEPLOYER, password=deployer_password, users=users,
                        policy=access.gate_policy(PROJECTS, DEPLOYER, True), delete_enabled=False) as server:
        yield server


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    layout = tmp_path_factory.mktemp("layout")
    return {name: build_oci_image(layout, name, f"payload of {name}".encode() * 50) for name in ("one", "two", "three")}


@pytest.fixture(scope="module")
def seeded(gated, images) -> dict[str, str]:
    """Each project's build pushed its own image: shop/cart and games/snake at CONTENT_TAG."""
    return {"shop/cart": gated.push(images["one"], "shop/cart", CONTENT_TAG, as_user="build-shop"),
            "games/snake": gated.push(images["three"], "games/snake", CONTENT_TAG, as_user="build-games")}


def manifest_of(registry: RegistryServer, repository: str, reference: str) -> tuple[bytes, str]:
    answer = requests.get(f"{registry.url}/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT},
                          auth=login(DEPLOYER), timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.content, answer.headers["Content-Type"]


def errors(answer: requests.Response) -> list[dict]:
    return answer.json()["errors"]


def test_anonymous_and_wrong_passwords_get_the_challenge(gated):
    answer = requests.get(f"{gated.url}/v2/", timeout=5)
    assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == 'Basic realm="cloudstation"'
    assert errors(answer)[0]["code"] == "UNAUTHORIZED"
    wrong = requests.get(f"{gated.url}/v2/shop/cart/tags/list", auth=("pull-shop", "wrong"), timeout=5)
    assert wrong.status_code == 401 and errors(wrong)[0]["code"] == "UNAUTHORIZED"
    assert requests.get(f"{gated.url}/v2/", auth=login("pull-shop"), timeout=5).status_code == 200


def test_a_tenant_build_cannot_push_to_another_project(gated, images, seeded):
    """Issue 20 step 2: project games's build credential pushing to shop/cart, refused by the server."""
    victim = seeded["shop/cart"]
    pushed = gated.skopeo_copy(images["two"], "shop/cart", CONTENT_TAG, as_user="build-games")
    assert pushed.returncode != 0
    assert "403 (Forbidden)" in pushed.stderr, pushed.stderr
    future = gated.skopeo_copy(images["two"], "shop/cart", "f" * 32, as_user="build-games")  # a future content tag
    assert future.returncode != 0
    assert gated.digest_of("shop/cart", CONTENT_TAG) == victim and gated.digest_of("shop/cart", "f" * 32) is None


def test_a_tenant_build_cannot_push_to_the_platform(gated, images, seeded):
    """Issue 20 step 2: ... or to platform/project-state."""
    pushed = gated.skopeo_copy(images["two"], "platform/project-state", CONTENT_TAG, as_user="build-games")
    assert pushed.returncode != 0
    assert gated.digest_of("platform/project-state", CONTENT_TAG) is None
    # Straight at the API: the refusal is a registry error body naming user, repository and action.
    answer = requests.post(f"{gated.url}/v2/platform/project-state/blobs/uploads/", auth=login("build-games"), timeout=5)
    assert answer.status_code == 403
    assert errors(answer) == [{"code": "DENIED", "message": "user 'build-games' may not push platform/project-state "
                               "(its push rights: games/*)", "detail": {"user": "build-games",
                               "repository": "platform/project-state", "action": "push"}}]


def test_a_build_cannot_move_its_own_tag(gated, images, seeded):
    """Issue 20 step 2: ... or over its own existing tag; the same digest again is an idempotent retry."""
    first = seeded["games/snake"]
    assert gated.skopeo_copy(images["three"], "games/snake", CONTENT_TAG, as_user="build-games").returncode == 0
    moved = gated.skopeo_copy(images["two"], "games/snake", CONTENT_TAG, as_user="build-games")
    assert moved.returncode != 0
    assert gated.digest_of("games/snake", CONTENT_TAG) == first
    body, media_type = manifest_of(gated, "games/snake", first)
    # The other image's manifest, straight at the API (skopeo uploaded its blobs before its PUT was refused).
    other = (images["two"].layout / "blobs" / "sha256" / images["two"].digest[7:]).read_bytes()
    answer = requests.put(f"{gated.url}/v2/games/snake/manifests/{CONTENT_TAG}", data=other,
                          headers={"Content-Type": media_type}, auth=login("build-games"), timeout=5)
    assert answer.status_code == 403
    assert errors(answer)[0]["message"] == (
        f"user 'build-games' may not move tag games/snake:{CONTENT_TAG} from {first} to "
        f"sha256:{hashlib.sha256(other).hexdigest()}: its tags are create-only (docs/security.md, tenant model)")
    again = requests.put(f"{gated.url}/v2/games/snake/manifests/{CONTENT_TAG}", data=body,
                         headers={"Content-Type": media_type}, auth=login("build-games"), timeout=5)
    assert again.status_code == 201 and again.headers["Docker-Content-Digest"] == first


def test_two_concurrent_creates_of_one_tag_cannot_both_win(gated, images):
    gated.push(images["one"], "games/race", "base-one", as_user="build-games")
    gated.push(images["two"], "games/race", "base-two", as_user="build-games")
    bodies = [manifest_of(gated, "games/race", tag) for tag in ("base-one", "base-two")]
    barrier = threading.Barrier(2)

    def put(tag, body_and_type):
        barrier.wait()
        body, media_type = body_and_type
        return requests.put(f"{gated.url}/v2/games/race/manifests/{tag}", data=body,
                            headers={"Content-Type": media_type}, auth=login("build-games"), timeout=10).status_code

    for tag in ("c" * 32, "b" * 32, "a" * 32):
        with ThreadPoolExecutor(2) as pool:
            statuses = sorted(pool.map(put, [tag, tag], bodies))
        assert statuses == [201, 403], tag


def test_the_deployer_creates_and_moves_promotion_tags_but_writes_no_content_tag(gated, seeded):
    digest = gated.digest_of("shop/cart", CONTENT_TAG)
    body, media_type = manifest_of(gated, "shop/cart", digest)
    for tag in ("prod-20260304T050607Z", "prod", "prod"):
        answer = requests.put(f"{gated.url}/v2/shop/cart/manifests/{tag}", data=body, headers={"Content-Type": media_type},
                              auth=login(DEPLOYER), timeout=5)
        assert answer.status_code == 201, answer.text
    answer = requests.put(f"{gated.url}/v2/shop/cart/manifests/{'e' * 32}", data=body,
                          headers={"Content-Type": media_type}, auth=login(DEPLOYER), timeout=5)
    assert answer.status_code == 403


def test_pull_credentials_read_only_their_project(gated, seeded):
    digest = gated.digest_of("shop/cart", CONTENT_TAG)
    ok = requests.get(f"{gated.url}/v2/shop/cart/manifests/{digest}", headers={"Accept": ACCEPT},
                      auth=login("pull-shop"), timeout=5)
    assert ok.status_code == 200
    assert requests.get(f"{gated.url}/v2/games/snake/tags/list", auth=login("pull-shop"), timeout=5).status_code == 403
    assert requests.post(f"{gated.url}/v2/shop/cart/blobs/uploads/", auth=login("pull-shop"), timeout=5).status_code == 403


def test_a_mount_from_a_repository_the_user_cannot_pull_is_refused(gated, seeded):
    digest = gated.digest_of("shop/cart", CONTENT_TAG)
    body, _ = manifest_of(gated, "shop/cart", digest)
    layer = json.loads(body)["layers"][0]["digest"]
    url = f"{gated.url}/v2/games/loot/blobs/uploads/"
    refused = requests.post(url, params={"mount": layer, "from": "shop/cart"}, auth=login("build-games"), timeout=5)
    assert refused.status_code == 403 and "may not mount a blob from 'shop/cart'" in errors(refused)[0]["message"]
    # The same through a form body, which distribution would read.
    form = requests.post(url, data={"mount": layer, "from": "shop/cart"}, auth=login("build-games"), timeout=5)
    assert form.status_code == 403
    assert requests.head(f"{gated.url}/v2/games/loot/blobs/{layer}", auth=login("build-games"), timeout=5).status_code == 404
    # Within its own project a mount is fine: distribution answers 201 Created.
    own = gated.digest_of("games/snake", CONTENT_TAG)
    own_layer = json.loads(manifest_of(gated, "games/snake", own)[0])["layers"][0]["digest"]
    mounted = requests.post(url, params={"mount": own_layer, "from": "games/snake"}, auth=login("build-games"), timeout=5)
    assert mounted.status_code == 201, mounted.text


@pytest.mark.parametrize("content_type", GO_FORM_TYPES[:3])
def test_a_mount_through_a_form_body_go_reads_as_a_form_is_refused(gated, seeded, content_type):
    """A tenant's build mounting another project's blob into its own repository through a form body
    whose Content-Type distribution (Go's mime.ParseMediaType: Unicode ToLower and TrimSpace on the
    header's UTF-8) reads as a form and a Latin-1, ASCII-only reading does not: the mount would make
    shop/cart's layer readable as games/*'s (seen: 201 Created, then 200 on GET of the blob)."""
    import socket as sockets

    layer = json.loads(manifest_of(gated, "shop/cart", seeded["shop/cart"])[0])["layers"][0]["digest"]
    repository = f"games/form{GO_FORM_TYPES.index(content_type)}"
    form = f"mount={layer}&from=shop%2Fcart".encode()
    credentials = base64.b64encode(":".join(login("build-games")).encode()).decode()
    request = (f"POST /v2/{repository}/blobs/uploads/ HTTP/1.1\r\nHost: {gated.host}\r\n"
               f"Authorization: Basic {credentials}\r\nConnection: close\r\nContent-Length: {len(form)}\r\n"
               ).encode() + b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + form
    with sockets.create_connection(("127.0.0.1", gated.port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403 "), answer[:300]
    assert requests.get(f"{gated.url}/v2/{repository}/blobs/{layer}", auth=login("build-games"),
                        timeout=5).status_code == 404


def test_deletes_and_the_catalog_are_refused_to_tenants(gated, seeded):
    digest = gated.digest_of("games/snake", CONTENT_TAG)
    for user in ("build-games", DEPLOYER):
        answer = requests.delete(f"{gated.url}/v2/games/snake/manifests/{digest}", auth=login(user), timeout=5)
        assert answer.status_code == 403 and errors(answer)[0]["code"] == "DENIED"
    assert requests.get(f"{gated.url}/v2/_catalog", auth=login("build-games"), timeout=5).status_code == 403
    catalog = requests.get(f"{gated.url}/v2/_catalog", auth=login(DEPLOYER), timeout=5)
    assert catalog.status_code == 200 and "shop/cart" in catalog.json()["repositories"]


def test_upstream_answers_pass_through(gated, seeded):
    missing = requests.get(f"{gated.url}/v2/shop/cart/manifests/nope", headers={"Accept": ACCEPT},
                           auth=login("pull-shop"), timeout=5)
    assert missing.status_code == 404 and errors(missing)[0]["code"] == "MANIFEST_UNKNOWN"
    invalid = requests.put(f"{gated.url}/v2/games/snake/manifests/{'d' * 32}", data=b"not json",
                           headers={"Content-Type": OCI_MANIFEST}, auth=login("build-games"), timeout=5)
    assert invalid.status_code == 400 and errors(invalid)[0]["code"] == "MANIFEST_INVALID"


def test_blobs_stream_through_the_gate_both_ways(gated):
    """A 48 MiB blob uploaded in one chunked PATCH and read back: the gate's memory stays far below it."""
    size, piece = 48 << 20, bytes(range(256)) * 4096  # 1 MiB
    digest = "sha256:" + hashlib.sha256(piece * (size // len(piece))).hexdigest()
    auth = login("build-games")
    start = requests.post(f"{gated.url}/v2/games/big/blobs/uploads/", auth=auth, timeout=10)
    assert start.status_code == 202, start.text
    location = start.headers["Location"]
    patched = requests.patch(location, data=(piece for _ in range(size // len(piece))), auth=auth, timeout=60,
                             headers={"Content-Type": "application/octet-stream"})
    assert patched.status_code == 202, patched.text
    done = requests.put(patched.headers["Location"], params={"digest": digest}, auth=auth, timeout=30)
    assert done.status_code == 201, done.text
    read = hashlib.sha256()
    with requests.get(f"{gated.url}/v2/games/big/blobs/{digest}", auth=auth, stream=True, timeout=60) as answer:
        assert answer.status_code == 200
        for chunk in answer.iter_content(1 << 20):
            read.update(chunk)
    assert "sha256:" + read.hexdigest() == digest
    peak_kib = int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{gated.gate.pid}/status").read_text())[1])
    assert peak_kib < 40 * 1024, f"the gate held {peak_kib} KiB at its peak"


def test_one_kept_alive_connection_carries_a_whole_push(gated):
    """Clients push on one kept-alive connection (components/registry_api.py, kaniko): an answer with
    an empty body (202 of an upload start, 201 of its completion) must leave the gate's connection to
    the registry ready for the next request."""
    data = b"one connection"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with requests.Session() as session:
        session.auth = login("build-games")
        for _ in range(2):
            started = session.post(f"{gated.url}/v2/games/kept/blobs/uploads/", timeout=10)
            assert started.status_code == 202, started.text
            done = session.put(started.headers["Location"], params={"digest": digest}, data=data, timeout=10)
            assert done.status_code == 201, done.text
            assert session.head(f"{gated.url}/v2/games/kept/blobs/{digest}", timeout=10).status_code == 200


# --- bounded: connections and idle time (issue 20 re-review) ---------------------------------------


@contextlib.contextmanager
def gate_with(registry: RegistryServer, exempt_loopback: bool = True, **limits):
    """A second gate, in this process, in front of `registry`'s distribution, with `limits` (serve's
    keyword arguments); yields its base URL, its port and the server. The tests' clients are all on loopback: without
    `exempt_loopback`, the gate gives them the shares it gives any other client address."""
    from tests.registry_server import free_port

    port = free_port()
    server = gate.serve(policy(), ("127.0.0.1", port), gate.listen_address(registry.upstream_host), **limits)
    server.exempt_loopback = exempt_loopback
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", port, server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def gate_process(tmp_path, upstream: str, output=subprocess.DEVNULL) -> tuple[subprocess.Popen, int]:
    """The gate's command line as its container runs it (`python -I`, the example's policy) in front of
    `upstream`, once it answers /healthz; its log (stdout and stderr) to `output`. Yields the process and port."""
    from tests.registry_server import free_port

    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(access.gate_policy(PROJECTS, DEPLOYER, True)))
    port = free_port()
    process = subprocess.Popen([sys.executable, "-I", gate.__file__, "--policy", str(policy_file),
                                "--listen", f"127.0.0.1:{port}", "--upstream", upstream],
                               stdout=output, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            break
        except requests.ConnectionError:
            time.sleep(0.02)
    return process, port


def until(condition, seconds: float = 5.0) -> None:
    """Wait for `condition()` of the gate's own state, so that a test does not race the gate's threads."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"the gate's state did not come within {seconds} s")
        time.sleep(0.01)


def closed_within(connection, seconds: float) -> float:
    """How long until the gate closed `connection` (the test fails if it is still open after `seconds`);
    whatever the gate sends first (an answer already asked for) is read on the way."""
    started = time.monotonic()
    connection.settimeout(seconds)
    try:
        while connection.recv(65536):
            pass
    except TimeoutError:
        pytest.fail(f"the gate still holds the connection after {seconds} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_an_idle_connection_is_closed_after_the_idle_timeout(gated):
    """One thread per connection: a client that connects and sends nothing, or nothing more after an
    answer on a kept-alive connection, or drips a request's head byte by byte, must not hold one for
    the per-read timeout (300 s) or for ever; it gets the idle timeout for the whole head."""
    authorization = "Basic " + base64.b64encode(b"%s:%s" % tuple(p.encode() for p in login("build-games"))).decode()
    with gate_with(gated, idle_seconds=1.0) as (url, port, _):
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert closed_within(silent, 5) < 3
        with socket.create_connection(("127.0.0.1", port)) as kept:
            kept.sendall(f"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {authorization}\r\n\r\n".encode())
            kept.settimeout(5)
            assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
            assert closed_within(kept, 5) < 3
        with socket.create_connection(("127.0.0.1", port)) as dripping:
            dripping.sendall(b"GET /v2/ HTTP/1.1\r\n")
            started = time.monotonic()
            try:
                for _ in range(20):  # 6 s of one header byte every 0.3 s: each read is quick, the head never ends
                    dripping.sendall(b"X")
                    time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert time.monotonic() - started + closed_within(dripping, 5) < 3


def test_a_slow_but_active_upload_outlasts_the_idle_timeouts(gated):
    """The idle timeout is for the request's head: a body may take as long as it keeps coming (each read
    has the body's idle timeout), pauses longer than the head's idle timeout included."""
    auth = login("build-games")
    pieces = [bytes([n]) * 4096 for n in range(8)]
    digest = "sha256:" + hashlib.sha256(b"".join(pieces)).hexdigest()

    def slowly():
        for n, piece in enumerate(pieces):
            time.sleep(1.5 if n == 4 else 0.3)  # 3.6 s in all, one pause of 1.5 s
            yield piece

    # Each read of the body may wait body_idle_seconds (2 s here): the whole body takes longer.
    with gate_with(gated, idle_seconds=1.0, body_idle_seconds=2.0) as (url, _, _), requests.Session() as session:
        session.auth = auth
        started = session.post(f"{url}/v2/games/slow/blobs/uploads/", timeout=10)
        assert started.status_code == 202, started.text
        patched = session.patch(started.headers["Location"], data=slowly(), timeout=30,
                                headers={"Content-Type": "application/octet-stream"})
        assert patched.status_code == 202, patched.text
        done = session.put(patched.headers["Location"], params={"digest": digest}, timeout=10)
        assert done.status_code == 201, done.text
        assert session.head(f"{url}/v2/games/slow/blobs/{digest}", timeout=10).status_code == 200


def test_connections_beyond_the_limit_wait_for_a_free_one_then_are_refused(gated):
    """At most `max_connections` at once, each one thread: one more waits up to `queue_seconds` for a
    connection to end (accepted, no thread), and is then answered 503 with Retry-After and closed;
    beyond twice `max_connections` waiting, a connection is refused at once."""
    auth = login("build-games")
    with gate_with(gated, max_connections=2, idle_seconds=30.0, queue_seconds=1.0) as (url, port, _):
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            time.sleep(0.2)  # both accepted, each holding its thread
            started = time.monotonic()
            refused = requests.get(f"{url}/v2/", auth=auth, timeout=10)
            waited = time.monotonic() - started
            assert refused.status_code == 503, refused.text
            assert 0.9 < waited < 5, waited
            assert refused.headers["Retry-After"] and refused.headers["Connection"] == "close"
            [error] = errors(refused)
            assert error["code"] == "UNAVAILABLE" and "2 connections at once" in error["message"]
            # A connection ending within the wait lets the waiting one in.
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(requests.get, f"{url}/v2/", auth=auth, timeout=10)
                time.sleep(0.4)
                held.pop().close()
                assert waiting.result().status_code == 200
            # Two served (one held, one new), four waiting: the next is refused without waiting.
            held.append(socket.create_connection(("127.0.0.1", port)))
            held.extend(socket.create_connection(("127.0.0.1", port)) for _ in range(4))
            time.sleep(0.2)
            started = time.monotonic()
            assert requests.get(f"{url}/v2/", auth=auth, timeout=10).status_code == 503
            assert time.monotonic() - started < 0.5
            # The waiting ones are refused in turn, each after its wait.
            for waiting_connection in held[-4:]:
                waiting_connection.settimeout(5)
                assert waiting_connection.recv(65536).startswith(b"HTTP/1.1 503 ")
        finally:
            for connection in held:
                connection.close()


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(":".join(login(user)).encode()).decode()


def held_request(port: int, method: str, path: str, user: Optional[str], length: int, sent: bytes = b"",
                 chunked: bool = False) -> socket.socket:
    """A connection that sent a request's head (announcing `length` bytes of body, or chunked) and
    `sent` of its body, and stalls there."""
    connection = socket.create_connection(("127.0.0.1", port))
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            + (f"Authorization: {basic(user)}\r\n" if user else "")
            + f"Content-Type: {OCI_MANIFEST}\r\n{framing}\r\n\r\n")
    connection.sendall(head.encode() + sent)
    return connection


def answer_on(connection: socket.socket, seconds: float = 2.0) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of the answer on `connection`, which must come within `seconds`
    and close the connection."""
    connection.settimeout(seconds)
    data = b""
    try:
        while chunk := connection.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"no whole answer within {seconds} s: {data[:200]!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def rss_kib(pid: int) -> int:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())[1])


def test_a_manifest_larger_than_the_registry_takes_is_refused_before_it_is_read(gated):
    """A create-only manifest PUT announcing more than MAX_MANIFEST_BYTES (distribution's own limit) is
    answered 413 at once, from its head: the gate reads none of it."""
    with gate_with(gated) as (url, port, _):
        connection = held_request(port, "PUT", MANIFEST.format("games/snake", "b" * 32), "build-games",
                                  gate.MAX_MANIFEST_BYTES + 1)
        with connection:
            status, headers, body = answer_on(connection)
    assert status == 413 and headers["Connection"] == "close"
    [error] = body["errors"]
    assert error["code"] == "MANIFEST_INVALID" and f"larger than {gate.MAX_MANIFEST_BYTES} bytes" in error["message"]


def test_manifest_bodies_buffered_at_once_are_bounded_per_user_and_in_all(gated):
    """A create-only manifest PUT is read whole before its check: the gate holds at most
    `manifest_buffer_bytes` of such bodies at once, one user at most `manifest_buffer_bytes_per_user`.
    A request reserves its Content-Length before reading (a chunked one as it reads); one the budget
    cannot take is answered at once, 429 TOOMANYREQUESTS for the user's share, 503 UNAVAILABLE for the
    gate's, with Retry-After."""
    mib = 1 << 20
    held = []

    def park(user: str, tag: str) -> None:
        # 1 MiB announced, all but its last byte sent: the gate holds it.
        reserved = server.RequestHandlerClass.gate.manifest_bytes.held(user)
        held.append(held_request(port, "PUT", MANIFEST.format(user.removeprefix("build-") + "/parked", tag), user,
                                 mib, b" " * (mib - 1)))
        until(lambda: server.RequestHandlerClass.gate.manifest_bytes.held(user) == reserved + mib)

    limits = {"manifest_buffer_bytes": 3 * mib, "manifest_buffer_bytes_per_user": 2 * mib}
    with gate_with(gated, **limits) as (url, port, server):
        try:
            park("build-games", "a" * 32), park("build-games", "b" * 32)
            started = time.monotonic()
            with held_request(port, "PUT", MANIFEST.format("games/parked", "c" * 32), "build-games", mib) as third:
                status, headers, body = answer_on(third)
            assert status == 429 and headers["Retry-After"] and time.monotonic() - started < 1
            [error] = body["errors"]
            assert error["code"] == "TOOMANYREQUESTS" and "build-games" in error["message"], error
            park("build-shop", "a" * 32)  # 3 MiB in all
            with held_request(port, "PUT", MANIFEST.format("shop/parked", "b" * 32), "build-shop", mib) as full:
                status, headers, body = answer_on(full)
            assert status == 503 and headers["Retry-After"] and body["errors"][0]["code"] == "UNAVAILABLE"
            # Chunked: reserved as it is read, so refused at its first piece.
            piece = b"{" * 1024
            with held_request(port, "PUT", MANIFEST.format("platform/parked", "a" * 32), "build-platform", 0,
                              b"%x\r\n%s\r\n" % (len(piece), piece), chunked=True) as chunked:
                status, _, body = answer_on(chunked)
            assert status == 503 and body["errors"][0]["code"] == "UNAVAILABLE"
            # A parked body gone, its bytes are free again: the next create-only PUT goes through to the check.
            held.pop(0).close()
            for _ in range(50):
                answer = requests.put(f"{url}/v2/games/parked/manifests/{'d' * 32}", data=b"not json",
                                      headers={"Content-Type": OCI_MANIFEST}, auth=login("build-games"), timeout=5)
                if answer.status_code != 429:
                    break
                time.sleep(0.05)
            assert answer.status_code == 400 and errors(answer)[0]["code"] == "MANIFEST_INVALID"
        finally:
            for connection in held:
                connection.close()


def test_parked_manifest_bodies_cannot_exhaust_the_gates_memory(gated, tmp_path):
    """The review's attack (issue 20 re-review, dos_memory.py): 40 create-only PUTs of nearly 4 MiB
    each, stalled before their last byte, took the gate from 26 to 190 MiB (its container's limit is
    128 MiB). With the defaults, at most MANIFEST_BUFFER_BYTES of them are held; the rest are refused."""
    process, port = gate_process(tmp_path, gated.upstream_host)
    held = []
    try:
        before = rss_kib(process.pid)
        size = gate.MAX_MANIFEST_BYTES
        body = b"{" + b" " * (size - 2)
        for n in range(40):
            user = ("build-shop", "build-games", "build-platform")[n % 3]
            path = MANIFEST.format(user.removeprefix("build-") + "/dos", f"t{n}")
            connection = held_request(port, "PUT", path, user, size)
            held.append(connection)
            try:
                connection.sendall(body)
            except OSError:
                pass  # refused at once: the gate closed it
        time.sleep(1)
        grown = rss_kib(process.pid) - before
        assert grown < gate.MANIFEST_BUFFER_BYTES // 1024 + 16 * 1024, f"the gate grew by {grown} KiB"
    finally:
        for connection in held:
            connection.close()
        process.terminate()
        process.wait(timeout=10)


def test_a_stalled_body_is_cut_after_the_body_idle_timeout(gated):
    """A request body that stops coming (the review's 64 uploads dripping one byte each) holds its
    thread for `body_idle_seconds` of silence, not SOCKET_TIMEOUT_SECONDS per read."""
    assert gate.BODY_IDLE_SECONDS < gate.SOCKET_TIMEOUT_SECONDS
    with gate_with(gated, body_idle_seconds=1.0) as (url, port, _):
        started = requests.post(f"{url}/v2/games/stalled/blobs/uploads/", auth=login("build-games"), timeout=10)
        assert started.status_code == 202, started.text
        path = started.headers["Location"].split(str(port), 1)[1]
        with held_request(port, "PATCH", path, "build-games", 100_000, b"x") as stalled:
            assert closed_within(stalled, 5) < 3


def test_one_client_address_holds_at_most_its_share_of_connections(gated):
    """A peer address holds at most `per_peer_connections` of the connections served and waiting;
    one more is answered 503 at once, naming the share (the review's 64 half-sent heads without
    credentials, from one address, no longer take every thread). Loopback, where the deployer's
    port-forward arrives, is exempt."""
    auth = login("build-games")
    limits = {"max_connections": 1, "per_peer_connections": 2, "queue_seconds": 5.0}
    with gate_with(gated, exempt_loopback=False, **limits) as (url, port, server):
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # one served, one waiting
        try:
            for connection in held:
                connection.sendall(b"GET /v2/ HTTP/1.1\r\n")
            until(lambda: server._peers["127.0.0.1"] == 2)
            started = time.monotonic()
            refused = requests.get(f"{url}/v2/", auth=auth, timeout=10)
            assert refused.status_code == 503 and time.monotonic() - started < 1
            assert refused.headers["Retry-After"]
            [error] = errors(refused)
            assert error["code"] == "UNAVAILABLE" and "2 connections" in error["message"]
            assert "client address" in error["message"], error
        finally:
            for connection in held:
                connection.close()
        # Both gone: the address has its share again.
        for _ in range(50):
            answer = requests.get(f"{url}/v2/", auth=auth, timeout=10)
            if answer.status_code == 200:
                break
            time.sleep(0.05)
        assert answer.status_code == 200
    with gate_with(gated, **limits) as (url, port, server):  # loopback exempt: the third one waits its turn
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            until(lambda: server._peers["127.0.0.1"] == 2)
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(requests.get, f"{url}/v2/", auth=auth, timeout=10)
                time.sleep(0.3)
                assert not waiting.done()
                for connection in held:
                    connection.close()
                assert waiting.result().status_code == 200
        finally:
            for connection in held:
                connection.close()


@pytest.mark.parametrize("address, exempt", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.42.0.7", False), ("::ffff:10.42.0.7", False), ("fd00::2", False), ("not an address", False),
])
def test_only_loopback_is_exempt_from_the_shares(address, exempt):
    assert gate.loopback(address) is exempt


def test_one_user_holds_at_most_its_share_of_requests_in_flight(gated):
    """After authentication a user has at most `per_user_requests` requests in flight, from any number
    of addresses; one more is answered 429 TOOMANYREQUESTS with Retry-After. Other users are served."""
    with gate_with(gated, per_user_requests=2, exempt_loopback=False) as (url, port, server):
        started = requests.post(f"{url}/v2/games/share/blobs/uploads/", auth=login("build-games"), timeout=10)
        assert started.status_code == 202, started.text
        path = started.headers["Location"].split(str(port), 1)[1]
        held = [held_request(port, "PATCH", path, "build-games", 100_000, b"x") for _ in range(2)]
        try:
            until(lambda: server.RequestHandlerClass.gate.requests.held("build-games") == 2)
            refused = requests.get(f"{url}/v2/", auth=login("build-games"), timeout=10)
            assert refused.status_code == 429 and refused.headers["Retry-After"]
            [error] = errors(refused)
            assert error["code"] == "TOOMANYREQUESTS" and "'build-games'" in error["message"]
            assert "2 requests" in error["message"], error
            assert requests.get(f"{url}/v2/", auth=login("build-shop"), timeout=10).status_code == 200
        finally:
            for connection in held:
                connection.close()
        for _ in range(50):
            answer = requests.get(f"{url}/v2/", auth=login("build-games"), timeout=10)
            if answer.status_code == 200:
                break
            time.sleep(0.05)
        assert answer.status_code == 200


def test_the_gates_limits_are_its_options():
    options = gate.options(["--policy", "p.json"])
    assert (options.max_connections, options.idle_seconds, options.queue_seconds) == (
        gate.MAX_CONNECTIONS, gate.IDLE_SECONDS, gate.QUEUE_SECONDS)
    assert gate.IDLE_SECONDS < gate.SOCKET_TIMEOUT_SECONDS
    options = gate.options(["--policy", "p.json", "--max-connections", "8", "--idle-seconds", "5", "--queue-seconds", "2"])
    assert (options.max_connections, options.idle_seconds, options.queue_seconds) == (8, 5.0, 2.0)


def test_the_gate_answers_its_health_check_without_credentials(gated):
    answer = requests.get(f"{gated.url}/healthz", timeout=5)
    assert answer.status_code == 200 and answer.json() == {"upstream": "ok"}


def test_the_gate_refuses_to_start_on_a_bad_policy(tmp_path):
    (tmp_path / "policy.json").write_text(json.dumps({"users": {"x": {"rules": [{"repositories": [], "actions": []}]}}}))
    done = subprocess.run([sys.executable, "-I", gate.__file__, "--policy", str(tmp_path / "policy.json")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "cannot use the policy" in done.stderr and "users.x.rules[0].repositories" in done.stderr


def test_garbage_collection_and_retention_work_with_the_gate_in_front(tmp_path, images):
    """docs/builds.md "Image clean-up": with deletes off, removing a repository's tags on the storage
    and running `garbage-collect --delete-untagged` frees its blobs; the kept images still pull
    through the gate after the restart."""
    users = dict(PASSWORDS)
    with RegistryServer(tmp_path / "registry", username=DEPLOYER, password=users.pop(DEPLOYER), users=users,
                        policy=access.gate_policy(PROJECTS, DEPLOYER, True), delete_enabled=False) as registry:
        kept = registry.push(images["one"], "shop/cart", CONTENT_TAG, as_user="build-shop")
        gone = registry.push(images["three"], "shop/old", CONTENT_TAG, as_user="build-shop")
        gone_layer = json.loads(manifest_of(registry, "shop/old", gone)[0])["layers"][0]["digest"]
        storage = tmp_path / "registry" / "data" / "docker" / "registry" / "v2"
        blob_file = storage / "blobs" / "sha256" / gone_layer[7:9] / gone_layer[7:] / "data"
        assert blob_file.is_file()
        registry.stop()
        import shutil

        # What docs/builds.md says to remove: the old image's tag (the whole tags directory would fail the run).
        shutil.rmtree(storage / "repositories" / "shop" / "old" / "_manifests" / "tags" / CONTENT_TAG)
        from tests.registry_server import REGISTRY_BINARY

        collected = subprocess.run([REGISTRY_BINARY, "garbage-collect", "--delete-untagged", str(registry.config_file())],
                                   capture_output=True, text=True, timeout=60)
        assert collected.returncode == 0, collected.stdout + collected.stderr
        assert not blob_file.exists()
        registry.start()
        assert registry.digest_of("shop/cart", CONTENT_TAG) == kept
        pulled = requests.get(f"{registry.url}/v2/shop/cart/manifests/{kept}", headers={"Accept": ACCEPT},
                              auth=login("pull-shop"), timeout=5)
        assert pulled.status_code == 200


def test_an_answer_that_breaks_off_upstream_is_cut_off_not_patched_with_an_error(tmp_path):
    """A registry that dies mid-body: the client's answer ends short (the connection closes), never
    continued with an error answer of the gate's that would pass for the rest of the blob."""
    import socket as sockets

    listener = sockets.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536) or b"\r\n\r\n"
                if data.startswith(b"GET /v2/ "):  # the gate's authentication check: accepted
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                else:  # 100 bytes announced, 10 sent, then gone
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)

    threading.Thread(target=serve, daemon=True).start()
    log = open(tmp_path / "gate.log", "wb")
    process, port = gate_process(tmp_path, f"127.0.0.1:{listener.getsockname()[1]}", log)
    try:
        received = b""
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            with requests.get(f"http://127.0.0.1:{port}/v2/games/snake/blobs/sha256:{'a' * 64}",
                              auth=login("build-games"), stream=True, timeout=10) as answer:
                for chunk in answer.iter_content(1):
                    received += chunk
        assert received == b"x" * 10
    finally:
        process.terminate()
        process.wait(timeout=10)
        listener.close()
        log.close()
    assert "the answer broke off" in (tmp_path / "gate.log").read_text()


def test_a_request_head_larger_than_any_registry_client_sends_is_cut(gated):
    """http.server takes 100 header lines of 64 KiB each: a ~6 MiB head, which cost the gate 25-47 MiB
    to parse (six at once passed its 128 MiB limit, no credential needed; the second hostile review).
    The gate closes a connection whose head passes MAX_HEAD_BYTES as soon as it does, not at the idle
    timeout (30 s: without the limit it waits there for the rest of the head), and a head within it
    is still served."""
    assert 16 << 10 <= gate.MAX_HEAD_BYTES <= 256 << 10
    with gate_with(gated) as (url, port, _):
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.sendall(b"GET /v2/ HTTP/1.1\r\nHost: registry\r\n")
            padding = b"X-Padding: " + b"p" * 50_000 + b"\r\n"
            connection.sendall(padding * (2 * gate.MAX_HEAD_BYTES // len(padding) + 1))  # no end of the head
            assert closed_within(connection, 5) < 2
        honest = requests.get(f"{url}/v2/", auth=login("build-games"), headers={"X-Padding": "p" * 4000}, timeout=10)
        assert honest.status_code == 200, honest.text
