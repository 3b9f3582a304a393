"""Every version and image this project deploys, in one place.

`TAGS` pins each third-party image to an exact upstream tag (never `latest`); edit versions here.
`infra/image-digests.yaml` records the digest each of those exact tags resolved to, with where it
came from (a public record, or `python -m infra pin-images`), and `IMAGES`/`image()` give pods and
Dockerfiles `repository:tag@sha256:…`. A digest applies only while its recorded tag is the pin, so
bumping a tag can never run the old digest under the new name: until it is re-pinned the image is
pulled by tag, and `missing_digests()` (tests, docs/security.md "Images") names it. Images of
CloudStation entities are pinned by digest by the delivery flow (infra/delivery.py, promotion).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

# Armada: every service uses the same version (reference: armada/NOTES.md §0; tags have no "v").
ARMADA = "0.22.7"

# CloudState (docs/cloudstate.md, "Which operator"). The operator is the last release, 0.6.0: it
# passes Cassandra credentials to the proxy (0.5.1 does not), and its sidecar differs from 0.5.1's
# only by declaring the metrics port 9090, which the 0.5.1 proxy serves anyway. The proxies stay at
# 0.5.1: v0.6.0 changed the proxy protocol (version check, ActionProtocol, renumbered CRDT
# messages) and the only Node SDK on npm (`cloudstate` 0.0.3, used by entities/) speaks v0.5.
# The project is dead: neither can move (docs/security.md, "Images").
CLOUDSTATE_OPERATOR = "0.6.0"
CLOUDSTATE_PROXY = "0.5.1"

TAGS: dict[str, str] = {
    # CNCF distribution 3.x: 2.8.3 (Oct 2023, Go 1.20) was the last 2.x release. 3.x reads the
    # same config keys and storage layout; only its default config path moved
    # (/etc/distribution/config.yml), so components/registry.py names the file it mounts.
    "registry": "docker.io/library/registry:3.1.1",
    # CloudState operator and its proxies, one per store type (v0.5.1's build publishes each).
    "cloudstate-operator": f"docker.io/cloudstateio/cloudstate-operator:{CLOUDSTATE_OPERATOR}",
    "cloudstate-proxy-no-store": f"docker.io/cloudstateio/cloudstate-proxy-no-store:{CLOUDSTATE_PROXY}",
    "cloudstate-proxy-in-memory": f"docker.io/cloudstateio/cloudstate-proxy-in-memory:{CLOUDSTATE_PROXY}",
    "cloudstate-proxy-postgres": f"docker.io/cloudstateio/cloudstate-proxy-postgres:{CLOUDSTATE_PROXY}",
    "cloudstate-proxy-cassandra": f"docker.io/cloudstateio/cloudstate-proxy-cassandra:{CLOUDSTATE_PROXY}",
    # Stores and Armada's dependencies: newest patch of the same major (stores' data stay
    # readable: PostgreSQL 16 keeps its on-disk format across 16.x, Cassandra 4.1.x its sstables).
    "postgres": "docker.io/library/postgres:16.15-alpine3.24",
    "cassandra": "docker.io/library/cassandra:4.1.12-bookworm",
    # 7.4.11 fixes CVE-2025-49844 and the other 2025 Lua/RESP CVEs of 7.4.1. The bookworm variant:
    # 7.4's alpine images are built on Alpine 3.21, whose support ended on 2026-11-01.
    "redis": "docker.io/library/redis:7.4.11-bookworm",
    "pulsar": "docker.io/apachepulsar/pulsar:4.1.3",
    # The S3 client of the stores' backups (components/postgres_backup.py runs its standard-library
    # uploader with `python3 -c`): the official image, on the postgres pin's Alpine release.
    "backup-s3-client": "docker.io/library/python:3.13.15-alpine3.24",
    # Armada services.
    "armada-server": f"docker.io/gresearch/armada-server:{ARMADA}",
    "armada-scheduler": f"docker.io/gresearch/armada-scheduler:{ARMADA}",
    "armada-scheduler-ingester": f"docker.io/gresearch/armada-scheduler-ingester:{ARMADA}",
    "armada-executor": f"docker.io/gresearch/armada-executor:{ARMADA}",
    "armada-lookout": f"docker.io/gresearch/armada-lookout:{ARMADA}",
    "armada-lookout-ingester": f"docker.io/gresearch/armada-lookout-ingester:{ARMADA}",
    "armada-event-ingester": f"docker.io/gresearch/armada-event-ingester:{ARMADA}",
    "armada-binoculars": f"docker.io/gresearch/armada-binoculars:{ARMADA}",
    # Store exporters, deployed only with platform.monitoring.enabled (components/exporters.py).
    # Not Docker official images, so no docker-library digest record: `python -m infra pin-images
    # --missing` records theirs. postgres_exporter v0.20.1 (2026-07-07), redis_exporter v1.88.0
    # (2026-07-23): the newest releases, tagged with their "v" as their release workflows push them.
    "postgres-exporter": "docker.io/prometheuscommunity/postgres-exporter:v0.20.1",
    "redis-exporter": "docker.io/oliver006/redis_exporter:v1.88.0",
    # Base images of the entities' own Dockerfiles (entities/*/Dockerfile; tests/test_entities.py
    # checks they match). The CloudState Node SDK (npm cloudstate 0.0.3, its only release there)
    # needs Node 12 for its native grpc module: build on the full image, run on the slim one.
    # Node 12 is end of life and cannot move (docs/security.md, "Images").
    "node-cloudstate-build": "docker.io/library/node:12.22.12-bullseye",
    "node-cloudstate": "docker.io/library/node:12.22.12-bullseye-slim",
    # Base images of the Dockerfiles generated for entities without their own Dockerfile.
    "maven": "docker.io/library/maven:3.9.16-eclipse-temurin-17",
    "java-runtime": "docker.io/library/eclipse-temurin:17.0.20_8-jre-alpine-3.24",
    # The test stage of the entity Dockerfiles (ours and the generated JavaScript one): `node --test`
    # needs Node >= 18, while the runtime stays on Node 12 for the CloudState SDK. Node 22 LTS.
    "node-test": "docker.io/library/node:22.23.2-bookworm-slim",
    # In-cluster builds (components/build_job.py, docs/builds.md "Builder"): kaniko, as the
    # maintained community fork osscontainertools/kaniko publishes it (v1.28.3, 2026-08-13; the
    # Google repository was archived in June 2025). Not a Docker official image: no public digest
    # record, so `python -m infra pin-images --missing` records it.
    "kaniko": "docker.io/martizih/kaniko:v1.28.3",
    # The build pod's init container that fetches and verifies the build context (wget,
    # sha256sum, tar); the musl variant is one static binary.
    "build-fetch": "docker.io/library/busybox:1.38.0-musl",
}

DIGESTS_FILE = Path(__file__).resolve().with_name("image-digests.yaml")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REFERENCE = re.compile(r"^(?P<repository>[^\s@]+?)(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


@dataclass(frozen=True)
class DigestRecord:
    """One entry of infra/image-digests.yaml."""

    ref: str
    """The exact tagged reference the digest was resolved for (a pin of TAGS)."""
    digest: str
    source: str
    """Where the digest came from: a public record (repository, path, commit) or pin-images."""
    recorded: str
    """When (YYYY-MM-DD, UTC)."""


def split(ref: str) -> tuple[str, Optional[str], Optional[str]]:
    """`host/path/name:tag@sha256:…` -> (repository, tag or None, digest or None)."""
    host_and_path, slash, last = ref.rpartition("/")
    match = _REFERENCE.match(last)
    if not match:
        raise ValueError(f"not an image reference: {ref!r}")
    return host_and_path + slash + match["repository"], match["tag"], match["digest"]


def tag_of(ref: str) -> Optional[str]:
    return split(ref)[1]


def digest_of(ref: str) -> Optional[str]:
    """The `sha256:…` a reference is pinned to, or None for a tag-only reference."""
    return split(ref)[2]


def load_digests(path: Path = DIGESTS_FILE) -> dict[str, DigestRecord]:
    """The digest records of `path` (missing file: none), checked strictly: a malformed entry is an
    error naming the file and entry, never silently ignored."""
    if not path.is_file():
        return {}
    document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(document, dict):
        raise ValueError(f"{path.name}: expected a mapping of image name -> digest record")
    records = {}
    for name, entry in document.items():
        fields = {"ref", "digest", "source", "recorded"}
        if not isinstance(entry, dict) or set(entry) != fields:
            raise ValueError(f"{path.name}: {name}: expected exactly the keys {sorted(fields)}")
        record = DigestRecord(**{key: str(value) for key, value in entry.items()})
        if not DIGEST.match(record.digest):
            raise ValueError(f"{path.name}: {name}: digest {record.digest!r} is not sha256:<64 lowercase hex>")
        if digest_of(record.ref) is not None or tag_of(record.ref) is None:
            raise ValueError(f"{path.name}: {name}: ref {record.ref!r} must be repository:tag without a digest")
        records[str(name)] = record
    return records


RECORDS: dict[str, DigestRecord] = load_digests()


def pinned(name: str, tags: Optional[dict[str, str]] = None, records: Optional[dict[str, DigestRecord]] = None) -> str:
    """The pin `name` as `repository:tag@sha256:…` when its exact tag has a digest record, else
    `repository:tag` (a record for another tag never applies)."""
    ref = (TAGS if tags is None else tags)[name]
    record = (RECORDS if records is None else records).get(name)
    return f"{ref}@{record.digest}" if record and record.ref == ref else ref


IMAGES: dict[str, str] = {name: pinned(name) for name in TAGS}
"""What pods and Dockerfiles use: every pin, digest-pinned where its tag has a digest record."""


def has_digest(name: str) -> bool:
    """Whether the pin `name` is deployed by digest (policy: platform digests in prod)."""
    return digest_of(IMAGES[name]) is not None


def missing_digests() -> list[str]:
    """The pins deployed by tag only, until `python -m infra pin-images` records their digests."""
    return [name for name in IMAGES if not has_digest(name)]


def image(name: str, mirror: str | None = None) -> str:
    """The pinned reference of a platform image, optionally rewritten to a mirror registry.

    With a mirror `registry.example:5000/mirror`, `docker.io/library/redis:7.4.11-bookworm@sha256:…`
    becomes `registry.example:5000/mirror/library/redis:7.4.11-bookworm@sha256:…`: the digest is
    kept, so a mirror must hold the same manifest (copy with `skopeo copy --all --preserve-digests`);
    one that altered it cannot serve the image (the pull fails, nothing else runs).
    """
    ref = IMAGES[name]
    if mirror:
        ref = mirror.rstrip("/") + "/" + ref.split("/", 1)[1]
    return ref


STORE_MAJORS_BEFORE_RECORDS: dict[str, int] = {"postgres": 16, "cassandra": 4, "redis": 7}
"""The major of each store pin every stack ran before stacks recorded their own
(`platform.storeVersions.<store>.dataMajor`, infra/store_versions.py): the default of that key.
Never change these: a stack that records nothing was created with them. A store major change is
refused unless acknowledged (docs/upgrades.md)."""


def tag_major(ref: str) -> int:
    """The major version in a reference's tag: `postgres:16.15-alpine3.24@sha256:…` -> 16 (tolerant
    of a suffix after the digest, as tests bump references)."""
    tag = ref.rsplit("/", 1)[-1].split("@", 1)[0].partition(":")[2]
    match = re.match(r"v?(\d+)", tag)
    if not match:
        raise ValueError(f"no major version in the tag of {ref!r}")
    return int(match.group(1))


def major(name: str) -> int:
    """The major version of the pin `name` as deployed (IMAGES)."""
    return tag_major(IMAGES[name])
