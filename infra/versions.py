"""Every version and image this project deploys, in one place.

Third-party images are pinned to exact upstream tags (never `latest`). Images of CloudStation
entities are pinned by digest in prod (see `infra/config.py`); the platform's own images below are
pinned by exact version, and can be mirrored with `platform.imageMirror`.
"""
from __future__ import annotations

# Armada: every service uses the same version (reference: armada/NOTES.md §0; tags have no "v").
ARMADA = "0.22.7"

# CloudState (docs/cloudstate.md, "Which operator"). The operator is the last release, 0.6.0: it
# passes Cassandra credentials to the proxy (0.5.1 does not), and its sidecar differs from 0.5.1's
# only by declaring the metrics port 9090, which the 0.5.1 proxy serves anyway. The proxies stay at
# 0.5.1: v0.6.0 changed the proxy protocol (version check, ActionProtocol, renumbered CRDT
# messages) and the only Node SDK on npm (`cloudstate` 0.0.3, used by entities/) speaks v0.5.
CLOUDSTATE_OPERATOR = "0.6.0"
CLOUDSTATE_PROXY = "0.5.1"

IMAGES: dict[str, str] = {
    # CNCF distribution registry (the "registry" image on Docker Hub).
    "registry": "docker.io/library/registry:2.8.3",
    # CloudState operator and its proxies, one per store type (v0.5.1's build publishes each).
    "cloudstate-operator": f"docker.io/cloudstateio/cloudstate-operator:{CLOUDSTATE_OPERATOR}",
    "cloudstate-proxy-no-store": f"docker.io/cloudstateio/cloudstate-proxy-no-store:{CLOUDSTATE_PROXY}",
    "cloudstate-proxy-in-memory": f"docker.io/cloudstateio/cloudstate-proxy-in-memory:{CLOUDSTATE_PROXY}",
    "cloudstate-proxy-postgres": f"docker.io/cloudstateio/cloudstate-proxy-postgres:{CLOUDSTATE_PROXY}",
    "cloudstate-proxy-cassandra": f"docker.io/cloudstateio/cloudstate-proxy-cassandra:{CLOUDSTATE_PROXY}",
    # Stores and Armada's dependencies.
    "postgres": "docker.io/library/postgres:16.6-alpine3.21",
    "cassandra": "docker.io/library/cassandra:4.1.7",
    "redis": "docker.io/library/redis:7.4.1-alpine3.20",
    "pulsar": "docker.io/apachepulsar/pulsar:4.1.0",
    # Armada services.
    "armada-server": f"docker.io/gresearch/armada-server:{ARMADA}",
    "armada-scheduler": f"docker.io/gresearch/armada-scheduler:{ARMADA}",
    "armada-scheduler-ingester": f"docker.io/gresearch/armada-scheduler-ingester:{ARMADA}",
    "armada-executor": f"docker.io/gresearch/armada-executor:{ARMADA}",
    "armada-lookout": f"docker.io/gresearch/armada-lookout:{ARMADA}",
    "armada-lookout-ingester": f"docker.io/gresearch/armada-lookout-ingester:{ARMADA}",
    "armada-event-ingester": f"docker.io/gresearch/armada-event-ingester:{ARMADA}",
    "armada-binoculars": f"docker.io/gresearch/armada-binoculars:{ARMADA}",
    # Base images of the entities' own Dockerfiles (entities/*/Dockerfile; tests/test_entities.py
    # checks they match). The CloudState Node SDK (npm cloudstate 0.0.3, its only release there)
    # needs Node 12 for its native grpc module: build on the full image, run on the slim one.
    "node-cloudstate-build": "docker.io/library/node:12.22.12-bullseye",
    "node-cloudstate": "docker.io/library/node:12.22.12-bullseye-slim",
    # Base images of the Dockerfiles generated for entities without their own Dockerfile.
    "maven": "docker.io/library/maven:3.9.9-eclipse-temurin-17",
    "java-runtime": "docker.io/library/eclipse-temurin:17.0.13_11-jre-alpine",
}


def image(name: str, mirror: str | None = None) -> str:
    """The pinned reference of a platform image, optionally rewritten to a mirror registry.

    With a mirror `registry.example:5000/mirror`, `docker.io/library/redis:7.4.1-alpine3.20`
    becomes `registry.example:5000/mirror/library/redis:7.4.1-alpine3.20`.
    """
    ref = IMAGES[name]
    if mirror:
        ref = mirror.rstrip("/") + "/" + ref.split("/", 1)[1]
    return ref
