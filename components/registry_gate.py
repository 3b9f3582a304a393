"""The registry's authorizing gate: per-user, per-repository rights and create-only tags in front of
CNCF distribution, which has neither (docs/registry.md, "Who may do what").

Standard library only: this file is the program the gate container runs (components/registry.py ships
it in the ConfigMap `<registry>-gate` and starts `python3 registry_gate.py --policy policy.json ...`
in the pinned python image); tests import the same file. Compatible with Python 3.11 to 3.13.

What it does with each request, in this order:
1. Authentication. HTTP Basic only; the password is checked by distribution itself, whose htpasswd
   file holds one bcrypt entry per user (a bcrypt of cost 10 in pure Python would take seconds per
   check, and the standard library has none): the gate asks `GET /v2/` upstream with the client's
   own Authorization once and remembers the answer for AUTH_CACHE_SECONDS (as a SHA-256 of the
   header, never the header). Every forwarded request carries the client's Authorization, so
   distribution authenticates it again: the cache only decides between UNAUTHORIZED and DENIED.
2. The path, parsed exactly as distribution v3.1.1 routes it (`route`): registry/api/v2/
   descriptors.go `routeDescriptors` in its order, each path a gorilla/mux template whose variables
   are reference.NameRegexp (github.com/distribution/reference v0.6.0 regexp.go: optional
   domain[:port]/, then path components joined by "/"), reference.TagRegexp or go-digest's
   DigestRegexp, matched against the whole path (leftmost-first, greedy: as Go's regexp picks
   submatches). Anything else is refused, never forwarded: a percent-encoded path (Go would decode
   it before routing, registry/api/v2/routes.go uses r.URL.Path), a path mux would clean or
   redirect (`//`, `..`, a trailing slash), an absolute-form target.
3. Authorization (`refusal`): the user's rules (repository patterns -> pull, push, overwrite;
   `tags` narrows a push rule to manifest PUTs by matching tag). Deletes are refused for everyone
   (distribution has them off too: components/registry.py). A cross-repository mount (`POST
   /v2/<name>/blobs/uploads/?mount=<digest>&from=<other>`, OCI distribution-spec v1.1 "Mounting a
   blob from another repository") needs push on <name> and pull on <other>; distribution reads
   `mount`/`from` with r.FormValue (registry/handlers/blobupload.go), which also reads a form body,
   so upload requests with a form Content-Type, or one that is not plain ASCII (Go lowercases and
   trims it as Unicode: `applİcation/x-www-form-urlencoded` is a form to it), are refused and the
   query is parsed strictly (`upload_query`). `/v2/_catalog` only for users whose policy says `catalog`.
4. Create-only tags: a manifest PUT by tag, for a user without `overwrite` on it, is forwarded only
   when distribution has no such tag or has it at the very digest of the body (an idempotent retry);
   otherwise refused, naming both digests. The check (HEAD upstream with every manifest media type
   in Accept: registry/handlers/manifests.go GetManifest answers 404 for a type it is not offered)
   and the PUT happen under one lock per repository:tag, so two concurrent creates cannot both win
   (one gate serves the registry: one replica, filesystem storage).
5. Forwarding: request and response bodies stream in 64 KiB pieces (a create-only manifest PUT is read
   whole, at most MAX_MANIFEST_BYTES: distribution's own limit, manifests.go maxManifestBodySize; one
   announcing more is answered 413 before it is read); upstream answers, errors included, pass through
   unchanged.
6. Bounds (`_Server`, `Handler`), each refusal at once with Retry-After: one thread per connection, at
   most MAX_CONNECTIONS at once; more wait without a thread (QUEUE_SECONDS) or are refused (503). One
   client address holds at most PER_PEER_CONNECTIONS of the connections served and waiting (503), one
   user at most PER_USER_REQUESTS requests in flight (429 TOOMANYREQUESTS); loopback, where the
   deployer's port-forward arrives, has neither share. A request's whole head must arrive within
   IDLE_SECONDS of the connection's opening or the previous answer, in at most MAX_HEAD_BYTES; then each read of its body may wait
   BODY_IDLE_SECONDS (a stalled body is cut, a slow but active upload keeps going) and each write of the
   answer SOCKET_TIMEOUT_SECONDS. Manifest bodies read whole (item 5) hold at most MANIFEST_BUFFER_BYTES
   of memory at once (503), one user's MANIFEST_BUFFER_BYTES_PER_USER (429).

Every refusal is a registry API error body (`{"errors": [{"code": "DENIED"|"UNAUTHORIZED", ...}]}`,
distribution-spec "Error Codes") whose message names the user, the repository and the action.
One JSON line per request goes to stderr (user, method, path, status, refusal).
"""
from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import http.client
import http.server
import io
import ipaddress
import json
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

# --- the path grammar ---------------------------------------------------------------------------

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = _ALPHANUMERIC + r"(?:" + _SEPARATOR + _ALPHANUMERIC + r")*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = _DOMAIN_COMPONENT + r"(?:\." + _DOMAIN_COMPONENT + r")*"
_HOST = r"(?:" + _DOMAIN_NAME + r"|\[(?:[a-fA-F0-9:]+)\])"
NAME = r"(?:" + _HOST + r"(?::[0-9]+)?/)?" + _PATH_COMPONENT + r"(?:/" + _PATH_COMPONENT + r")*"
"""reference.NameRegexp (distribution/reference v0.6.0 regexp.go `namePat`)."""
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
"""reference.TagRegexp: `[\\w][\\w.-]{0,127}` (Go's \\w is ASCII)."""
ROUTE_DIGEST = r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+"
"""go-digest v1.0.0 DigestRegexp, which the blob and manifest routes use."""
VALID_DIGEST = re.compile(r"sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}")
"""What go-digest's Parse accepts with the algorithms the registry binary links; the manifest
handler takes any other reference for a tag (manifests.go `manifestDispatcher`)."""
_UUID = r"(?!\.\.?\Z)[a-zA-Z0-9_.=-]+"
"""The upload id of descriptors.go, but not `.` or `..`: gorilla/mux cleans those path segments
(a 301 to another path), and the gate forwards only paths mux routes as they are."""
_PLAIN_HEADER = re.compile(r"[\t\x20-\x7e]*")
"""A header value of printable ASCII (and tabs) only."""

ROUTES = (
    # (kind, template), in distribution's order: the first that matches is the route.
    ("base", re.compile(r"/v2/")),
    ("tags", re.compile(r"/v2/(?P<name>" + NAME + r")/tags/list")),
    ("manifest", re.compile(r"/v2/(?P<name>" + NAME + r")/manifests/(?P<reference>" + TAG + r"|" + ROUTE_DIGEST + r")")),
    ("blob", re.compile(r"/v2/(?P<name>" + NAME + r")/blobs/(?P<digest>" + ROUTE_DIGEST + r")")),
    ("upload", re.compile(r"/v2/(?P<name>" + NAME + r")/blobs/uploads/")),
    ("upload-chunk", re.compile(r"/v2/(?P<name>" + NAME + r")/blobs/uploads/(?P<uuid>" + _UUID + r")")),
    ("catalog", re.compile(r"/v2/_catalog")),
)

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
MAX_MANIFEST_BYTES = 4 << 20
MANIFEST_BUFFER_BYTES = 24 << 20
"""Bytes of manifest bodies held at once, each read whole before its create-only check: with the rest of
the gate (about 26 MiB) well within its container's 128 MiB (components/registry.py GATE_RESOURCES).
Real manifests are a few KiB."""
MANIFEST_BUFFER_BYTES_PER_USER = 8 << 20
"""One user's share of MANIFEST_BUFFER_BYTES (two of the largest manifests), so one tenant cannot take it all."""
CHUNK = 64 << 10
AUTH_CACHE_SECONDS = 60.0
AUTH_CACHE_ENTRIES = 1024
SOCKET_TIMEOUT_SECONDS = 300.0
"""How long one write of an answer to the client may wait, and one exchange with the registry behind."""
MAX_HEAD_BYTES = 64 << 10
"""A request's line and headers together. http.server alone takes 100 header lines of 64 KiB, a ~6 MiB head
that costs 25-47 MiB to parse (six at once passed the container's 128 MiB, no credential needed); a registry
client's head is a few KiB (its largest part a token or Basic credential)."""
BODY_IDLE_SECONDS = 30.0
"""Once a request's head is in: how long one read of its body may wait. A body that stops coming (a
client dripping a byte now and then to hold a thread) is cut after this much silence; a slow but active
upload keeps going as long as each piece comes within it."""
IDLE_SECONDS = 30.0
"""How long a connection may take to deliver a whole request line and headers, counted from its
opening or from the end of the previous answer (a kept-alive connection between requests): an idle or
dripping client is closed after this, not after SOCKET_TIMEOUT_SECONDS per read. Clients keep idle
connections longer (Go's http.Transport 90 s) and open a new one when the gate has closed theirs;
components/registry_api.py retries once on a new connection."""
MAX_CONNECTIONS = 64
"""Connections served at once, one thread each. One more is accepted only when one ends: it waits up
to QUEUE_SECONDS (in the listen backlog, beyond it in the clients' TCP retries: no thread), then is
answered 503 UNAVAILABLE with `Retry-After` and closed. Sized for the registry's honest peak: kubelets
pulling (containerd fetches 3 layers of an image at once per node), build pods pushing, `pulumi up`."""
PER_PEER_CONNECTIONS = 16
"""Connections (served and waiting) one client address may hold, so one pod or node cannot take every
thread; beyond it, 503 at once. Above an honest client's peak: a kubelet pulls one image at a time,
containerd 3 layers of it, a build pushes 3 or 4 blobs at once. Loopback is exempt (`loopback`)."""
PER_USER_REQUESTS = 32
"""Requests in flight one authenticated user may have, from any number of addresses; beyond it, 429 at
once. Half the threads, so one tenant leaves the other half to everyone else, and above one project's
honest peak (its pull user on ten nodes pulling at once). Loopback is exempt (`loopback`)."""
QUEUE_SECONDS = 10.0
LISTEN_BACKLOG = 128
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
"""Content types whose body Go's Request.ParseForm reads into r.Form (net/http request.go
parsePostForm), and so into FormValue("mount"/"from"/"digest") of the upload handlers."""
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "expect", "proxy-connection"}
ACTIONS = ("pull", "push", "overwrite")
WRITING_METHODS = ("POST", "PUT", "PATCH")


class PolicyError(ValueError):
    """The policy file is not what components/registry_access.py writes; str() says where."""


@dataclass(frozen=True)
class Route:
    """One request as distribution would route it."""

    kind: str
    """base, tags, manifest, blob, upload, upload-chunk or catalog."""
    name: str = ""
    """The repository ("" for base and catalog)."""
    tag: str = ""
    """A manifest reference that is a tag ("" when it is a digest, or not a manifest)."""


@dataclass(frozen=True)
class Rule:
    repositories: tuple[str, ...]
    actions: frozenset
    tags: Optional["re.Pattern[str]"] = None
    """Narrows `push`/`overwrite` to manifest PUTs by a tag matching it whole."""


@dataclass(frozen=True)
class User:
    rules: tuple[Rule, ...] = ()
    catalog: bool = False


@dataclass(frozen=True)
class Policy:
    users: dict = field(default_factory=dict)
    realm: str = "cloudstation"


# --- pure functions -----------------------------------------------------------------------------


def route(path: str) -> Optional[Route]:
    """The route distribution takes for `path` (no query), or None when the gate must refuse it."""
    for kind, template in ROUTES:
        match = template.fullmatch(path)
        if match is None:
            continue
        groups = match.groupdict()
        reference = groups.get("reference") or ""
        tag = ""
        if kind == "manifest" and not VALID_DIGEST.fullmatch(reference):
            if not re.fullmatch(TAG, reference):
                return None  # digest-shaped but not a digest: distribution would take it for a tag
            tag = reference
        return Route(kind, groups.get("name") or "", tag)
    return None


def action(kind: str, method: str) -> Optional[str]:
    """What `method` on a route needs: login (any user), pull, push, delete or catalog; None when
    distribution has no such handler (refused)."""
    reading = method in ("GET", "HEAD")
    if kind == "base":
        return "login" if reading else None
    if kind == "catalog":
        return "catalog" if reading else None
    if kind == "tags":
        return "pull" if reading else None
    if kind in ("manifest", "blob"):
        if reading:
            return "pull"
        if method == "DELETE":
            return "delete"
        return "push" if method == "PUT" and kind == "manifest" else None
    if kind == "upload":
        return "push" if method == "POST" else None
    if kind == "upload-chunk":
        # Status (GET), chunks (PATCH), completion (PUT) and cancel (DELETE) of an upload session:
        # cancelling is part of pushing (go-containerregistry's push check starts and cancels one).
        return "push" if method in ("GET", "HEAD", "PATCH", "PUT", "DELETE") else None
    return None


def _percent_decoded(text: str) -> Optional[str]:
    """`text` with %XX and + decoded as Go's url.QueryUnescape does, None where Go would fail."""
    out, i = bytearray(), 0
    data = text.encode("utf-8")
    while i < len(data):
        byte = data[i]
        if byte == 0x25:  # %
            pair = data[i + 1:i + 3]
            if len(pair) != 2 or not all(chr(c) in "0123456789abcdefABCDEF" for c in pair):
                return None
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if byte == 0x2B else byte)
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def upload_query(query: str) -> tuple[Optional[dict], str]:
    """({key: value} of an upload request's query, "") or (None, why it is refused). Strict where Go's
    url.ParseQuery is lenient, so the gate and distribution cannot read two different `from`s: a
    pair with `;` or a bad escape, or a repeated key, is refused."""
    values: dict[str, str] = {}
    for pair in query.split("&") if query else ():
        if ";" in pair:
            return None, "a query with ';' is ambiguous"
        key, _, value = pair.partition("=")
        key_text, value_text = _percent_decoded(key), _percent_decoded(value)
        if key_text is None or value_text is None:
            return None, "the query has a malformed %-escape"
        if key_text in values:
            return None, f"the query repeats {key_text!r}"
        values[key_text] = value_text
    return values, ""


def loopback(host: str) -> bool:
    """Whether a client address is the pod's loopback, exempt from the per-address and per-user shares:
    the deployer's port-forward tunnel (kubectl port-forward) enters the pod there, no tenant can."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # an IPv4 client of the dual-stack socket
    return (mapped or address).is_loopback


def repository_matches(pattern: str, name: str) -> bool:
    """`*` every repository, `<prefix>/*` every repository below `<prefix>/`, else exactly `name`."""
    if pattern == "*":
        return True
    if pattern.endswith("/*"):
        return name.startswith(pattern[:-1]) and len(name) > len(pattern) - 1
    return name == pattern


def granted(user: User, repository: str, wanted: str, tag: Optional[str] = None) -> bool:
    """Whether a rule of `user` grants `wanted` (pull, push, overwrite) on `repository`. A rule with
    `tags` grants push and overwrite only for a manifest PUT by a tag it matches (`tag`); `tag` None
    is any other push (blobs, uploads, a manifest by digest), which only rules without `tags` grant."""
    for rule in user.rules:
        if wanted not in rule.actions or not any(repository_matches(p, repository) for p in rule.repositories):
            continue
        if rule.tags is not None and wanted != "pull" and (tag is None or not rule.tags.fullmatch(tag)):
            continue
        return True
    return False


def _rights(user: User, wanted: str) -> str:
    places = sorted({p for rule in user.rules if wanted in rule.actions for p in rule.repositories})
    return ", ".join(places) if places else "none"


def refusal(policy: Policy, username: str, method: str, path: str, query: str, content_type: str) -> Optional[tuple[str, dict]]:
    """(message, detail) when the gate refuses the request of an authenticated `username`, else
    None. The manifest-by-tag create-only check needs the registry and is `needs_tag_check`'s."""
    user = policy.users.get(username)
    found = route(path)
    if found is None:
        return (f"user {username!r}: {method} {path} is not a registry API v2 request this registry serves "
                "(paths are matched exactly as the registry routes them, unescaped)",
                {"user": username, "path": path})
    need = action(found.kind, method)
    where = {"user": username, "repository": found.name, "action": need or method}
    if need is None:
        return f"user {username!r}: {method} is not an operation of {path}", where
    if user is None:
        return f"user {username!r} has no rights in this registry", where
    if need == "login":
        return None
    if need == "delete":
        return (f"user {username!r} may not delete in {found.name!r}: deletes are off in this registry "
                "(docs/builds.md, \"Image clean-up\")"), where
    if need == "catalog":
        return None if user.catalog else (f"user {username!r} may not list the registry's repositories", where)
    if found.kind in ("upload", "upload-chunk") and method in WRITING_METHODS:
        if not _PLAIN_HEADER.fullmatch(content_type):
            # Go's mime.ParseMediaType lowercases and trims the header's bytes as UTF-8 Unicode text
            # (strings.ToLower makes U+0130 an "i", strings.TrimSpace drops U+00A0 and U+0085), which
            # the Latin-1 text here cannot mirror: `applİcation/x-www-form-urlencoded` is a form to
            # distribution. In plain ASCII, str.strip() trims all Go trims (and more) and lower() is Go's.
            return (f"user {username!r}: an upload to {found.name!r} with a Content-Type that is not plain ASCII is "
                    "refused (the registry might read a form body from it)", where)
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type in FORM_TYPES:
            return (f"user {username!r}: an upload to {found.name!r} with a {media_type} body is refused (the registry "
                    "would read parameters from it)", where)
    tag = found.tag if found.kind == "manifest" and method == "PUT" else ""
    if not granted(user, found.name, need, tag or None):
        what = f"{need} {found.name}" + (f":{tag}" if tag else "")
        return f"user {username!r} may not {what} (its {need} rights: {_rights(user, need)})", where
    if found.kind == "upload" and method == "POST":
        params, why = upload_query(query)
        if params is None:
            return f"user {username!r}: upload to {found.name!r} refused: {why}", where
        source = params.get("from", "")
        if params.get("mount") and source and not granted(user, source, "pull"):
            return (f"user {username!r} may not mount a blob from {source!r} into {found.name!r}: it may not pull "
                    f"{source!r} (its pull rights: {_rights(user, 'pull')})"), {**where, "from": source}
    return None


def needs_tag_check(policy: Policy, username: str, method: str, path: str) -> Optional[Route]:
    """The route of a manifest PUT by tag that `username` may only create (no `overwrite`), else None."""
    found = route(path)
    if method != "PUT" or found is None or found.kind != "manifest" or not found.tag:
        return None
    user = policy.users.get(username) or User()
    return None if granted(user, found.name, "overwrite", found.tag) else found


def tag_refusal(username: str, found: Route, existing: Optional[str], body: bytes | bytearray) -> Optional[str]:
    """Why a create-only PUT of `body` under `found.tag` is refused, given the digest the tag has now."""
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if existing is None or existing == digest:
        return None
    return (f"user {username!r} may not move tag {found.name}:{found.tag} from {existing} to {digest}: "
            "its tags are create-only (docs/security.md, tenant model)")


def error_body(code: str, message: str, detail: Optional[dict] = None) -> bytes:
    """A registry API error body (distribution-spec "Error Codes")."""
    error = {"code": code, "message": message}
    if detail:
        error["detail"] = detail
    return json.dumps({"errors": [error]}, sort_keys=True).encode()


def basic_user(authorization: str) -> Optional[str]:
    """The user name of a well-formed `Basic <base64 user:password>` header, else None."""
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, _password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return user if colon and user else None


def load_policy(data: dict) -> Policy:
    """The policy of a JSON document {realm, users: {name: {catalog, rules: [{repositories, actions,
    tags?}]}}} (components/registry_access.py `gate_policy`), checked whole."""
    if not isinstance(data, dict) or not isinstance(data.get("users"), dict):
        raise PolicyError("the policy must be an object with `users`")
    users = {}
    for name, entry in data["users"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("rules", []), list):
            raise PolicyError(f"users.{name}: must be an object with `rules`")
        rules = []
        for index, rule in enumerate(entry.get("rules", [])):
            where = f"users.{name}.rules[{index}]"
            repositories, actions = rule.get("repositories"), rule.get("actions")
            if not (isinstance(repositories, list) and repositories and all(isinstance(p, str) and p for p in repositories)):
                raise PolicyError(f"{where}.repositories: must be a non-empty list of patterns")
            if not (isinstance(actions, list) and actions and set(actions) <= set(ACTIONS)):
                raise PolicyError(f"{where}.actions: must be a non-empty list of {', '.join(ACTIONS)}")
            tags = rule.get("tags")
            try:
                pattern = re.compile(tags) if tags is not None else None
            except (re.error, TypeError) as error:
                raise PolicyError(f"{where}.tags: not a regular expression ({error})") from None
            rules.append(Rule(tuple(repositories), frozenset(actions), pattern))
        users[name] = User(tuple(rules), bool(entry.get("catalog", False)))
    return Policy(users, str(data.get("realm") or "cloudstation"))


# --- the server ---------------------------------------------------------------------------------


class Shares:
    """Units (requests, bytes) held at once: at most `each` by one holder (a user), `total` by all."""

    def __init__(self, each: int, total: Optional[int] = None):
        self.each, self.total = each, total
        self._lock = threading.Lock()
        self._held = 0
        self._by_holder: collections.Counter = collections.Counter()

    def take(self, holder: str, units: int = 1) -> str:
        """"" when `units` more fit (now held by `holder`), else the share they would pass: "each" or "total"."""
        with self._lock:
            if self._by_holder[holder] + units > self.each:
                return "each"
            if self.total is not None and self._held + units > self.total:
                return "total"
            self._by_holder[holder] += units
            self._held += units
            return ""

    def held(self, holder: str) -> int:
        with self._lock:
            return self._by_holder[holder]

    def give(self, holder: str, units: int = 1) -> None:
        with self._lock:
            self._held -= units
            self._by_holder[holder] -= units
            if self._by_holder[holder] <= 0:
                del self._by_holder[holder]


class Gate:
    """What the request handlers share: the policy, the upstream address, the authentication cache,
    the tag locks and the users' shares of requests and of manifest bytes."""

    def __init__(self, policy: Policy, upstream: tuple[str, int], per_user_requests: int = PER_USER_REQUESTS,
                 manifest_buffer_bytes: int = MANIFEST_BUFFER_BYTES,
                 manifest_buffer_bytes_per_user: int = MANIFEST_BUFFER_BYTES_PER_USER):
        self.policy = policy
        self.upstream = upstream
        self.requests = Shares(per_user_requests)
        self.manifest_bytes = Shares(manifest_buffer_bytes_per_user, manifest_buffer_bytes)
        self._verified: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._tag_locks: dict[str, list] = {}  # "<name>:<tag>" -> [lock, users]

    def verified(self, authorization: str) -> Optional[str]:
        key = hashlib.sha256(authorization.encode("utf-8", "replace")).hexdigest()
        with self._lock:
            user, until = self._verified.get(key, ("", 0.0))
        return user if until > time.monotonic() else None

    def remember(self, authorization: str, user: str) -> None:
        key = hashlib.sha256(authorization.encode("utf-8", "replace")).hexdigest()
        with self._lock:
            if len(self._verified) >= AUTH_CACHE_ENTRIES:
                self._verified.clear()
            self._verified[key] = (user, time.monotonic() + AUTH_CACHE_SECONDS)

    def tag_lock(self, key: str) -> "_TagLock":
        return _TagLock(self, key)


class _TagLock:
    """One lock per repository:tag, dropped when nobody holds or waits for it."""

    def __init__(self, gate: Gate, key: str):
        self.gate, self.key = gate, key

    def __enter__(self):
        with self.gate._lock:
            entry = self.gate._tag_locks.setdefault(self.key, [threading.Lock(), 0])
            entry[1] += 1
        entry[0].acquire()
        self.entry = entry

    def __exit__(self, *exc):
        self.entry[0].release()
        with self.gate._lock:
            self.entry[1] -= 1
            if self.entry[1] == 0:
                self.gate._tag_locks.pop(self.key, None)


class HeadTooLarge(ConnectionError):
    """A request head passed MAX_HEAD_BYTES: its connection is closed (BaseHTTPRequestHandler ends it)."""


class _HeadDeadline(io.RawIOBase):
    """The connection's reads: while `deadline` is set (waiting for a request's head), no read waits
    past it, however the bytes drip in, and the head's reads stop at `max_head_bytes`; otherwise each
    read (of a body) waits up to `timeout`. Writes keep the socket's own timeout, `write_timeout`."""

    def __init__(self, connection: socket.socket, timeout: float, write_timeout: float, max_head_bytes: int):
        self.connection, self.timeout, self.write_timeout = connection, timeout, write_timeout
        self.max_head_bytes = max_head_bytes
        self.deadline: Optional[float] = None
        self.head_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        wait = self.timeout
        if self.deadline is not None:
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError("no whole request head within the idle timeout")
            if self.head_bytes >= self.max_head_bytes:
                raise HeadTooLarge(f"a request head of more than {self.max_head_bytes} bytes")
        self.connection.settimeout(wait)
        try:
            read = self.connection.recv_into(buffer)
        finally:
            self.connection.settimeout(self.write_timeout)
        if self.deadline is not None:
            self.head_bytes += read
        return read


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cloudstation-registry-gate"
    timeout = SOCKET_TIMEOUT_SECONDS  # per write of an answer
    idle_seconds = IDLE_SECONDS  # for a whole request head (`handle_one_request`)
    body_idle_seconds = BODY_IDLE_SECONDS  # per read of a body
    max_head_bytes = MAX_HEAD_BYTES
    disable_nagle_algorithm = True
    gate: Gate  # set on the subclass `serve` makes

    def setup(self):
        super().setup()
        self.rfile.close()  # the socket's own reader: replaced by one that keeps the head's deadline
        self._reader = _HeadDeadline(self.connection, self.body_idle_seconds, self.timeout, self.max_head_bytes)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self):
        # From the connection's opening or the previous answer's end: the whole head within idle_seconds
        # (BaseHTTPRequestHandler closes the connection on the TimeoutError, answering nothing).
        self._reader.deadline = time.monotonic() + self.idle_seconds
        self._reader.head_bytes = 0
        try:
            super().handle_one_request()
        except HeadTooLarge as error:
            # Closed without an answer: the client is still sending the head (an answer would be reset away).
            self.close_connection = True
            entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "client": str(self.client_address[0]),
                     "status": 431, "refused": str(error)}
            print(json.dumps(entry, sort_keys=True), file=sys.stderr, flush=True)

    def _head_read(self) -> None:
        """The head is in: the body gets the per-read timeout, the answer the per-write one."""
        self._reader.deadline = None

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass  # one JSON line per request instead (`_log`)

    def _log(self, user: str, status: int, refused: str = "") -> None:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "user": user, "method": self.command,
                 "path": self.path, "status": status}
        if refused:
            entry["refused"] = refused
        print(json.dumps(entry, sort_keys=True), file=sys.stderr, flush=True)

    # --- answers of the gate itself ---------------------------------------------------------------

    def _answer(self, status: int, body: bytes, headers: Optional[dict] = None, close: bool = False) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if close:
            # The body of the refused request is not read: the connection cannot carry another one.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _unauthorized(self, message: str) -> None:
        challenge = {"WWW-Authenticate": f'Basic realm="{self.gate.policy.realm}"'}
        self._answer(401, error_body("UNAUTHORIZED", message), challenge, close=self._has_body())
        self._log(basic_user(self.headers.get("Authorization") or "") or "", 401, message)

    def _denied(self, user: str, message: str, detail: Optional[dict] = None) -> None:
        self._answer(403, error_body("DENIED", message, detail), close=True)
        self._log(user, 403, message)

    def _unavailable(self, user: str, message: str) -> None:
        self._answer(502, error_body("UNAVAILABLE", message), close=True)
        self._log(user, 502, message)

    def _busy(self, user: str, status: int, code: str, message: str) -> None:
        """A share is full: try again shortly (the body, if any, is not read)."""
        self._answer(status, error_body(code, message), {"Retry-After": "1"}, close=self._has_body())
        self._log(user, status, message)

    def _has_body(self) -> bool:
        return bool(self.headers.get("Transfer-Encoding")) or (self.headers.get("Content-Length") or "0") != "0"

    # --- upstream -------------------------------------------------------------------------------

    def _upstream(self) -> http.client.HTTPConnection:
        connection = getattr(self, "_connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(*self.gate.upstream, timeout=SOCKET_TIMEOUT_SECONDS)
            self._connection = connection
        return connection

    def _drop_upstream(self) -> None:
        connection = getattr(self, "_connection", None)
        if connection is not None:
            connection.close()
        self._connection = None

    def _exchange(self, method: str, target: str, headers: list, body: Optional[Iterator[bytes]] = None,
                  length: Optional[int] = None) -> http.client.HTTPResponse:
        """Send one request upstream (streaming `body`: with `length`, as that many bytes, else
        chunked) and return the answer's head; the caller reads or discards the body. A kept-alive
        connection the registry closed meanwhile is retried once, when nothing was streamed yet."""
        for attempt in (1, 2):
            connection = self._upstream()
            try:
                connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    connection.putheader(name, value)
                if body is not None and length is None:
                    connection.putheader("Transfer-Encoding", "chunked")
                elif body is not None:
                    connection.putheader("Content-Length", str(length))
                connection.endheaders()
                if body is not None:
                    for piece in body:
                        if length is None:
                            if piece:
                                connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                        else:
                            connection.send(piece)
                    if length is None:
                        connection.send(b"0\r\n\r\n")
                return connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop_upstream()
                if attempt == 2 or body is not None:
                    raise
        raise AssertionError("unreachable")

    def _authenticate(self, authorization: str) -> Optional[str]:
        """The user when the registry accepts `authorization` (cached), None when it refuses it."""
        user = basic_user(authorization)
        if user is None:
            return None
        if self.gate.verified(authorization) == user:
            return user
        answer = self._exchange("GET", "/v2/", [("Host", self.headers.get("Host") or "registry"),
                                                 ("Authorization", authorization)])
        answer.read()
        if answer.will_close:
            self._drop_upstream()
        if answer.status == 200:
            self.gate.remember(authorization, user)
            return user
        if answer.status == 401:
            return None
        raise OSError(f"the registry answered GET /v2/ with HTTP {answer.status}")

    def _existing_digest(self, found: Route, headers: list) -> tuple[Optional[str], int]:
        """(the digest `found.tag` points at, None when absent; the registry's status)."""
        ask = [(k, v) for k, v in headers if k.lower() not in ("accept", "content-type", "content-length", "if-none-match")]
        ask.append(("Accept", ", ".join(MANIFEST_TYPES)))
        answer = self._exchange("HEAD", f"/v2/{found.name}/manifests/{found.tag}", ask)
        answer.read()
        if answer.will_close:
            self._drop_upstream()
        if answer.status == 200:
            return answer.getheader("Docker-Content-Digest") or "", 200
        return None, answer.status

    # --- the request ------------------------------------------------------------------------------

    def _forward_headers(self) -> list:
        # Host and Authorization go upstream as the client sent them: distribution builds upload
        # Locations from Host (registry/api/v2/urls.go NewURLBuilderFromRequest) and authenticates
        # the client itself.
        return [(name, value) for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP
                and name.lower() != "content-length"]

    def _body(self) -> tuple[Optional[Iterator[bytes]], Optional[int]]:
        """The request body as pieces and its length (None: chunked), as the client framed it."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunks(), None
        length = self.headers.get("Content-Length")
        if length is None:
            return None, None
        if not length.isdigit():
            raise ValueError("Content-Length is not a number")
        return self._fixed(int(length)), int(length)

    def _fixed(self, length: int) -> Iterator[bytes]:
        while length > 0:
            piece = self.rfile.read(min(CHUNK, length))
            if not piece:
                raise ConnectionError("the client closed the connection mid-body")
            length -= len(piece)
            yield piece

    def _chunks(self) -> Iterator[bytes]:
        while True:
            line = self.rfile.readline(1024)
            size = int(line.split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            yield from self._fixed(size)
            self.rfile.readline(8)  # the CRLF after the chunk

    def _relay(self, answer: http.client.HTTPResponse, user: str) -> None:
        """The registry's answer to the client as it came (hop-by-hop headers aside), streamed."""
        self.send_response_only(answer.status, answer.reason)
        self._responded = True  # from here on a failure can only end the connection
        length = answer.getheader("Content-Length")
        bodiless = self.command == "HEAD" or answer.status in (204, 304) or 100 <= answer.status < 200
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        if bodiless or length is not None:
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            remaining = 0 if bodiless else int(length)
            while remaining > 0:
                piece = answer.read(min(CHUNK, remaining))
                if not piece:  # http.client returns b"" when the registry closes early; the client must see it end short
                    raise http.client.IncompleteRead(b"", remaining)
                self.wfile.write(piece)
                remaining -= len(piece)
            answer.read()  # b"": marks the answer complete, so the registry connection takes the next request
        else:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                piece = answer.read1(CHUNK)
                if not piece:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        if answer.will_close:
            self._drop_upstream()
        self._log(user, answer.status)

    def _handle(self) -> None:
        self._head_read()
        self._responded = False
        target = self.path
        if target == "/healthz" and self.command in ("GET", "HEAD"):
            return self._health()
        path, _, query = target.partition("?")
        authorization = self.headers.get("Authorization") or ""
        try:
            user = self._authenticate(authorization) if authorization else None
        except (OSError, http.client.HTTPException) as error:
            self._drop_upstream()
            return self._unavailable(basic_user(authorization) or "", f"the registry behind the gate is unreachable: {error}")
        if user is None:
            return self._unauthorized("authentication required" if not authorization else
                                      "the registry does not accept these credentials")
        refused = refusal(self.gate.policy, user, self.command, path, query, self.headers.get("Content-Type") or "")
        if refused is not None:
            return self._denied(user, *refused)
        shared = not self.server.exempt(self.client_address)
        if shared and self.gate.requests.take(user):
            return self._busy(user, 429, "TOOMANYREQUESTS", f"user {user!r} has {self.gate.requests.each} requests "
                                                            "in flight at the registry's gate, its share; try again")
        try:
            self._forward(user, path, target)
        finally:
            if shared:
                self.gate.requests.give(user)

    def _forward(self, user: str, path: str, target: str) -> None:
        headers = self._forward_headers()
        try:
            found = needs_tag_check(self.gate.policy, user, self.command, path)
            if found is not None:
                return self._create_only(user, found, target, headers)
            body, length = self._body()
            answer = self._exchange(self.command, target, headers, body, length)
            self._relay(answer, user)
        except (OSError, http.client.HTTPException, ValueError) as error:
            self._drop_upstream()
            self.close_connection = True
            if self._responded:  # the answer is under way: cutting the connection is all that is left
                self._log(user, 502, f"the answer broke off: {type(error).__name__}: {error}")
                return
            try:
                self._unavailable(user, f"forwarding {self.command} {path} failed: {type(error).__name__}: {error}")
            except OSError:
                pass  # the client is gone too

    def _create_only(self, user: str, found: Route, target: str, headers: list) -> None:
        # The body is read whole for the check, so its bytes come out of the gate's manifest budget (given
        # back when the PUT is done): its Content-Length before anything is read, a chunked body as it comes.
        body, length = self._body()
        if length is not None and length > MAX_MANIFEST_BYTES:
            return self._too_large(user, found)
        reserved = 0
        try:
            if length is not None:
                if not self._reserve(user, length):
                    return
                reserved = length
            data = bytearray()
            for piece in body or ():
                if len(data) + len(piece) > MAX_MANIFEST_BYTES:
                    return self._too_large(user, found)
                if length is None:
                    if not self._reserve(user, len(piece)):
                        return
                    reserved += len(piece)
                data += piece
            self._check_and_put(user, found, target, headers, data)
        finally:
            self.gate.manifest_bytes.give(user, reserved)

    def _reserve(self, user: str, size: int) -> bool:
        """Whether `size` more bytes of manifest bodies fit the budget (now held); if not, answered."""
        full = self.gate.manifest_bytes.take(user, size)
        if full == "each":
            self._busy(user, 429, "TOOMANYREQUESTS", f"user {user!r} has {self.gate.manifest_bytes.each} bytes of "
                                                     "manifests in the registry's gate, its share; try again")
        elif full == "total":
            self._busy(user, 503, "UNAVAILABLE", f"the registry's gate holds {self.gate.manifest_bytes.total} bytes "
                                                 "of manifests, all it takes at once; try again")
        return not full

    def _too_large(self, user: str, found: Route) -> None:
        message = (f"user {user!r}: the manifest for {found.name}:{found.tag} is larger than {MAX_MANIFEST_BYTES} "
                   "bytes, the registry's limit")
        self._answer(413, error_body("MANIFEST_INVALID", message, {"user": user, "repository": found.name}),
                     close=True)
        self._log(user, 413, message)

    def _check_and_put(self, user: str, found: Route, target: str, headers: list, data: bytearray) -> None:
        with self.gate.tag_lock(f"{found.name}:{found.tag}"):
            existing, status = self._existing_digest(found, headers)
            if status == 401:
                return self._unauthorized("the registry does not accept these credentials")
            if status not in (200, 404):
                return self._unavailable(user, f"cannot tell whether {found.name}:{found.tag} exists: the registry "
                                               f"answered HEAD with HTTP {status}")
            why = tag_refusal(user, found, existing, data)
            if why is not None:
                return self._denied(user, why, {"user": user, "repository": found.name, "action": "overwrite",
                                                "tag": found.tag})
            answer = self._exchange("PUT", target, headers, iter([data]), len(data))
            self._relay(answer, user)

    def _health(self) -> None:
        """Ready when the registry behind answers at all (401 without credentials)."""
        try:
            answer = self._exchange("GET", "/v2/", [("Host", "registry")])
            answer.read()
            self._drop_upstream()
            ok = answer.status < 500
        except (OSError, http.client.HTTPException):
            self._drop_upstream()
            ok = False
        body = json.dumps({"upstream": "ok" if ok else "unreachable"}).encode()
        self._answer(200 if ok else 503, body)

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = do_OPTIONS = _handle

    def finish(self):
        self._drop_upstream()
        super().finish()


class _Server(http.server.ThreadingHTTPServer):
    """At most `max_connections` connections served at once, one thread each; up to twice as many more
    wait, accepted but without a thread, for `queue_seconds` each; the rest are refused at once
    (MAX_CONNECTIONS). A thread whose connection ends serves the longest-waiting one next. One client
    address holds at most `per_peer_connections` of those served and waiting, unless it is loopback."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    max_connections = MAX_CONNECTIONS
    queue_seconds = QUEUE_SECONDS
    per_peer_connections = PER_PEER_CONNECTIONS
    exempt_loopback = True

    def __init__(self, *args, **kwargs):
        self._limits = threading.Lock()
        self._serving = 0
        self._waiting: collections.deque = collections.deque()  # (request, client_address, until), oldest first
        self._peers: collections.Counter = collections.Counter()  # client address -> connections served or waiting
        super().__init__(*args, **kwargs)

    def exempt(self, client_address) -> bool:
        """Whether a client has no shares (PER_PEER_CONNECTIONS, PER_USER_REQUESTS): loopback's."""
        return self.exempt_loopback and loopback(client_address[0])

    def process_request(self, request, client_address):
        peer = client_address[0]
        with self._limits:
            if self._peers[peer] >= self.per_peer_connections and not self.exempt(client_address):
                refused = (f"the registry's gate serves one client address at most {self.per_peer_connections} "
                           f"connections at once (served and waiting), and {peer} has them; try again")
            elif self._serving < self.max_connections:
                refused = ""
                self._serving += 1
                self._peers[peer] += 1
            elif len(self._waiting) < 2 * self.max_connections:
                self._waiting.append((request, client_address, time.monotonic() + self.queue_seconds))
                self._peers[peer] += 1
                return
            else:
                refused = self._full()
        if refused:
            return self._refuse(request, client_address, refused)
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._limits:
                self._serving -= 1
                self._left(client_address)
            raise

    def process_request_thread(self, request, client_address):
        while request is not None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                with self._limits:
                    self._left(client_address)
                    expired = self._expired()
                    if self._waiting:
                        request, client_address, _ = self._waiting.popleft()
                    else:
                        request = None
                        self._serving -= 1
                for refused in expired:
                    self._refuse(*refused, self._full())

    def service_actions(self):
        # serve_forever's loop, every poll interval (0.5 s): waiting connections past their time are refused.
        with self._limits:
            expired = self._expired()
        for refused in expired:
            self._refuse(*refused, self._full())

    def server_close(self):
        super().server_close()
        with self._limits:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for request, _, _ in waiting:
            self.shutdown_request(request)

    def _left(self, client_address) -> None:
        """A connection of `client_address` ended or stopped waiting (called under `_limits`)."""
        self._peers[client_address[0]] -= 1
        if self._peers[client_address[0]] <= 0:
            del self._peers[client_address[0]]

    def _expired(self) -> list:
        """The waiting connections past their time, taken out (called under `_limits`)."""
        expired, now = [], time.monotonic()
        while self._waiting and self._waiting[0][2] <= now:
            request, client_address, _ = self._waiting.popleft()
            self._left(client_address)
            expired.append((request, client_address))
        return expired

    def _full(self) -> str:
        return (f"the registry's gate serves {self.max_connections} connections at once and none ended within "
                f"{self.queue_seconds:g} s; try again")

    def _refuse(self, request: socket.socket, client_address, message: str) -> None:
        """503 with Retry-After, without waiting: what the client sent meanwhile is read first (without
        waiting either), so that closing does not reset the answer away; then the connection is closed."""
        body = error_body("UNAVAILABLE", message)
        head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
        try:
            request.setblocking(False)
            try:
                while request.recv(65536):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
            request.send(head + body)  # an idle connection's send buffer takes it at once (or it is cut short)
        except OSError:
            pass
        self.shutdown_request(request)
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "client": str(client_address[0]),
                 "status": 503, "refused": message}
        print(json.dumps(entry, sort_keys=True), file=sys.stderr, flush=True)


def listen_address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def serve(policy: Policy, listen: tuple[str, int], upstream: tuple[str, int], max_connections: int = MAX_CONNECTIONS,
          idle_seconds: float = IDLE_SECONDS, queue_seconds: float = QUEUE_SECONDS,
          per_peer_connections: int = PER_PEER_CONNECTIONS, per_user_requests: int = PER_USER_REQUESTS,
          body_idle_seconds: float = BODY_IDLE_SECONDS, manifest_buffer_bytes: int = MANIFEST_BUFFER_BYTES,
          manifest_buffer_bytes_per_user: int = MANIFEST_BUFFER_BYTES_PER_USER) -> http.server.ThreadingHTTPServer:
    """A server (not yet serving) for `policy` at `listen`, forwarding to `upstream`: at most
    `max_connections` at once (one more waits up to `queue_seconds`, then is refused), each closed when
    a request's head takes longer than `idle_seconds` or a read of its body longer than
    `body_idle_seconds`; the shares of one client address, of one user and of manifest bodies as named
    (the module's constants)."""
    if min(max_connections, per_peer_connections, per_user_requests) < 1 or min(idle_seconds, body_idle_seconds) <= 0 \
            or queue_seconds < 0 or min(manifest_buffer_bytes, manifest_buffer_bytes_per_user) < 0:
        raise ValueError("the connection and request limits and the timeouts must be positive, queue_seconds and "
                         "the manifest budgets not negative")
    gate = Gate(policy, upstream, per_user_requests, manifest_buffer_bytes, manifest_buffer_bytes_per_user)
    handler = type("GateHandler", (Handler,), {"gate": gate, "idle_seconds": idle_seconds,
                                               "body_idle_seconds": body_idle_seconds})
    limits = {"max_connections": max_connections, "queue_seconds": queue_seconds,
              "per_peer_connections": per_peer_connections}
    host, port = listen
    if host in ("", "::"):
        # Every address, IPv4 and IPv6 (a dual-stack pod): one IPv6 socket that also takes IPv4,
        # or IPv4 alone where the pod has no IPv6.
        try:
            server_class = type("DualStack", (_Server,), {"address_family": socket.AF_INET6, **limits})
            server = server_class(("::", port), handler, bind_and_activate=False)
            server.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            server.server_bind()
            server.server_activate()
            return server
        except OSError:
            host = "0.0.0.0"
    return type("Gate", (_Server,), limits)((host, port), handler)


def options(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The registry's authorizing gate (components/registry_gate.py).")
    parser.add_argument("--policy", required=True, help="the policy JSON file")
    parser.add_argument("--listen", default=":5000", help="[host]:port to serve (default every address, 5000)")
    parser.add_argument("--upstream", default="127.0.0.1:5002", help="host:port of the registry behind the gate")
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                        help=f"connections served at once (default {MAX_CONNECTIONS}); more wait, then get 503")
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS,
                        help=f"time for a request's whole head, from the connection's opening or the previous answer "
                             f"(default {IDLE_SECONDS:g})")
    parser.add_argument("--queue-seconds", type=float, default=QUEUE_SECONDS,
                        help=f"how long a connection beyond the limit waits for a free one (default {QUEUE_SECONDS:g})")
    return parser.parse_args(argv)


def main(argv: Optional[list] = None) -> None:
    given = options(argv)
    try:
        with open(given.policy, encoding="utf-8") as policy_file:
            policy = load_policy(json.load(policy_file))
    except (OSError, ValueError) as error:
        raise SystemExit(f"registry gate: cannot use the policy {given.policy}: {error}")
    server = serve(policy, listen_address(given.listen), listen_address(given.upstream), given.max_connections,
                   given.idle_seconds, given.queue_seconds)
    print(json.dumps({"listening": given.listen, "upstream": given.upstream, "users": sorted(policy.users),
                      "maxConnections": given.max_connections, "idleSeconds": given.idle_seconds,
                      "queueSeconds": given.queue_seconds}),
          file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
