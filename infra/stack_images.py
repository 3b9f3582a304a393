"""Which platform images a stack runs, decided from its config before anything is registered, and
the refusal of those that would be pulled by tag (issue 20 finding 6; docs/security.md "Images").

A pin of infra/versions.py runs by digest once infra/image-digests.yaml records one for its tag.
`images()` lists every pin the stack's pods run: its own workloads, the build pods of in-cluster
builds, the CloudState operator's ConfigMap (which names all four proxies) in the stack that owns
the cluster, and the proxy of each entity's pods, which the cluster's operator picks (a stack
sharing the cluster runs the proxies its owner's operator names). `problems()` refuses, in one
message naming each image and `python -m infra pin-images --missing`, every one without a digest
that `platform.images.allowUnpinned` does not name.

`images()` mirrors what the areas register (infra/cloudstation.py, infra/armada.py, infra/builds.py,
infra/monitoring.py and their components); tests/test_images.py compares it with the renders of the
example stacks and of variants (monitoring, a mirror, local builds, Cassandra, external stores,
prod on its own cluster), so a new image in the program fails there until it is listed here.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from infra import image_pins, versions

if TYPE_CHECKING:
    from infra.config import StackConfig


@dataclass(frozen=True)
class StackImage:
    name: str
    """The pin of infra/versions.py."""
    ref: str
    """The reference the pods get (the mirror applied; kaniko: `platform.builds.image` when set)."""
    where: str
    """What runs it, for messages."""


def images(config: "StackConfig", owner: Optional["StackConfig"]) -> list[StackImage]:
    """Every platform image the stack's pods run, once per pin. `owner` is the config of the stack
    whose operator runs this stack's entities when it does not own its cluster (else unused)."""
    from components.cloudstate_operator import PROXY_IMAGES, proxy_key
    from components.registry import GATE_IMAGE
    from infra import builds

    platform = config.platform
    mirror = platform.image_mirror
    found: dict[str, StackImage] = {}

    def add(name: str, where: str, ref: Optional[str] = None, image_mirror: Optional[str] = mirror) -> None:
        found.setdefault(name, StackImage(name, ref or versions.image(name, image_mirror), where))

    def postgres(settings, where: str) -> None:
        # components/postgres.py: the server (managed), or the Job creating its databases.
        if settings.mode == "managed" or settings.create_databases:
            add("postgres", where)
        if settings.mode == "managed":
            backups = platform.stores.backups  # components/postgres_backup.py backup_for: pg_dump, then S3
            if backups.enabled and backups.target == "s3":
                add("backup-s3-client", f"backups of {where} to S3")
            if platform.monitoring.enabled:  # infra/monitoring.py _exporter
                add("postgres-exporter", f"the exporter of {where}")

    if config.projects:  # an Armada worker stack without projects runs none of this (infra/cloudstation.py)
        if platform.registry.mode == "managed":
            add("registry", "the registry")
            add(GATE_IMAGE, "the registry's authorizing gate")
        operator = platform if platform.owns_cluster_resources else (owner.platform if owner else None)
        if platform.owns_cluster_resources:
            add("cloudstate-operator", "the CloudState operator")
            for key, name in PROXY_IMAGES.items():
                add(name, f"the operator's proxy.image.{key}")
        environments = [(platform.project_state_store, [platform.project_state])]
        environments += [(project.store, project.entities) for project in config.projects]
        for store_kind, entities in environments:
            if not any(entity.kind.needs_store for entity in entities):
                continue
            settings = getattr(platform.stores, store_kind)
            if store_kind == "postgres":
                postgres(settings, "an entity store")
            elif settings.mode == "managed":
                add("cassandra", "an entity store")
        if operator is not None:
            source = "" if operator is platform else f" of stack {platform.cluster_owner_stack!r}"
            for store_kind, entities in environments:
                for entity in entities:
                    key = proxy_key(store_kind if entity.kind.needs_store else None)
                    add(PROXY_IMAGES[key], f"entity pods' proxy: proxy.image.{key} of the operator{source}",
                        image_mirror=operator.image_mirror)

    armada = platform.armada
    if armada.enabled and armada.mode == "executor-only":
        add("armada-executor", "Armada's executor")
    elif armada.enabled:
        postgres(armada.postgres, "Armada's PostgreSQL")
        if armada.redis.mode == "managed":
            add("redis", "Armada's Redis")
            if platform.monitoring.enabled:
                add("redis-exporter", "the exporter of Armada's Redis")
        if armada.pulsar.mode == "managed":
            add("pulsar", "Armada's Pulsar")
        for service in ("lookout", "scheduler", "server", "scheduler-ingester", "lookout-ingester", "event-ingester",
                        "executor", *(("binoculars",) if armada.binoculars.enabled else ())):
            add(f"armada-{service}", f"Armada's {service}")

    if builds.in_armada(config):  # components/build_job.py: the fetch init container and the builder
        add("build-fetch", "in-cluster builds (fetch)")
        add("kaniko", "in-cluster builds" + (" (platform.builds.image)" if platform.builds.image else ""),
            ref=platform.builds.image)
    return list(found.values())


def runs_by_tag(image: StackImage) -> bool:
    return not _by_digest(image.ref)


def _by_digest(ref: str) -> bool:
    # References here are versions.image()'s (`tag@sha256:…` or `tag`) or a validated
    # platform.builds.image; only the digest's presence matters (upgrade tests bump them with suffixes).
    return "@sha256:" in ref


def problems(config: "StackConfig", root: Path) -> list[str]:
    """One problem naming every image the stack would pull by tag that its opt-out does not name."""
    from infra import cluster_sharing
    from infra.config import ConfigError

    owner = None
    if not config.platform.owns_cluster_resources:
        try:
            owner = cluster_sharing.owner_config(config, root)
        except ConfigError:
            pass  # reported by infra/cluster_sharing.py; the proxies are checked once it loads
    allowed = config.platform.images.allow_unpinned
    found = [image for image in images(config, owner) if runs_by_tag(image) and image.name not in allowed]
    if not found:
        return []
    listed = "; ".join(f"{image.name} ({image.ref}: {image.where})" for image in found)
    value = json.dumps(allowed) if "allow_unpinned" in config.platform.images.model_fields_set else "(not set)"
    return [f"{image_pins.KEY}: {value} — {len(found)} platform image{'s' if len(found) > 1 else ''} of this stack "
            f"{'have' if len(found) > 1 else 'has'} no digest recorded in infra/image-digests.yaml, so nodes would "
            f"pull {'them' if len(found) > 1 else 'it'} by tag, and a tag can be moved: {listed}; "
            + image_pins.remedy(image.name for image in found)]


def opt_out_problems(names: list[str]) -> list:
    """Config problems of `platform.images.allowUnpinned`: each entry a pin still without a digest, once."""
    from components.model import problem

    found = []
    for index, name in enumerate(names):
        if name not in versions.TAGS:
            hint = difflib.get_close_matches(name, list(versions.TAGS), n=1)
            found.append(problem(f"not a pin of infra/versions.py{f' (did you mean {hint[0]!r}?)' if hint else ''}; "
                                 f"the pins: {', '.join(versions.TAGS)}", f"[{index}]", name))
        elif _by_digest(versions.IMAGES[name]):
            found.append(problem("has a digest recorded in infra/image-digests.yaml and runs by it; remove it from "
                                 "the list", f"[{index}]", name))
        elif name in names[:index]:
            found.append(problem("listed twice; name each pin once", f"[{index}]", name))
    return found
