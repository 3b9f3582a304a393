"""Digest-pinned image references: the one pattern every part of the repository checks them with.

Config validation (infra/config.py), promotion (cloudstation_tools/promote.py, components/registry_api.py,
cloudstation_tools/stack_file.py) and the policy pack import from here. Standard library only, so any of them
can import it without the program's dependencies.

A reference is matched whole and in ASCII only: `re.match` with `$` would accept a trailing
newline, and `\\w` without re.ASCII would accept non-ASCII tags, neither of which a registry or
a kubelet accepts.
"""
from __future__ import annotations

import re
from typing import Optional

DIGEST_REF = re.compile(
    r"\A(?P<repository>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+)"
    r"(?::(?P<tag>\w[\w.-]{0,127}))?@(?P<digest>sha256:[0-9a-f]{64})\Z",
    re.ASCII,
)
"""An image reference pinned by digest: `host[:port]/path[:tag]@sha256:<64 hex>`, the whole string.
Anchored with \\A…\\Z, so `.match`, `.search` and `.fullmatch` all mean the whole string."""

DIGEST_REF_FORM = "<registry>/<repository>[:tag]@sha256:<64 hex digits>"


def is_digest_ref(value: object) -> bool:
    """Whether `value` is a string that is, entirely, a digest-pinned reference."""
    return isinstance(value, str) and DIGEST_REF.fullmatch(value) is not None


def split(value: str) -> Optional[tuple[str, str, Optional[str], str]]:
    """(host[:port], repository, tag or None, digest) of a digest-pinned reference, else None."""
    match = DIGEST_REF.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    host, _, repository = match["repository"].partition("/")
    return host, repository, match["tag"], match["digest"]


def entity_repository(prefix: str, project: str, entity: str) -> str:
    """The repository of one entity's image: `<prefix>/<project>/<entity>` (prefix may be empty)."""
    return "/".join(part for part in (prefix.strip("/"), project, entity) if part)


def reference_problem(value: object, pull_host: str, repository: str) -> Optional[str]:
    """Why `value` is not an acceptable image of the entity whose repository is `repository` in a
    stack whose registry is pulled from `pull_host`; None when it is.

    A reference from anywhere else would make prod run an image that was never tested there, or
    send the stack's pull credentials (which are for `pull_host` only) to another registry."""
    parts = split(value) if isinstance(value, str) else None
    if parts is None:
        return f"must be pinned by digest: {DIGEST_REF_FORM}"
    host, path, _, _ = parts
    expected = f"{pull_host}/{repository}[:tag]@sha256:<64 hex digits>"
    if host != pull_host:
        return (f"registry host {host!r} is not this stack's registry ({pull_host}, from platform.registry); "
                f"expected {expected}")
    if path != repository:
        return f"repository {path!r} is not this entity's (<prefix>/<project>/<entity>); expected {expected}"
    return None


def stack_image_problems(config) -> list[str]:
    """`key: value — problem` for every `image:` of a validated stack config (infra/config.py
    StackConfig) that is not in the stack's registry, at its entity's repository."""
    registry = config.platform.registry
    pull_host, prefix = registry.pull_host, registry.repository_prefix
    entities = [
        (f"cloudstation:projects[{i}].entities[{j}].image", project.name, entity)
        for i, project in enumerate(config.projects)
        for j, entity in enumerate(project.entities)
    ]
    entities.append(("cloudstation:platform.projectState.image", "platform", config.platform.project_state))
    problems = []
    for path, project, entity in entities:
        if entity.image is None:
            continue
        problem = reference_problem(entity.image, pull_host, entity_repository(prefix, project, entity.name))
        if problem:
            problems.append(f"{path}: {entity.image!r} — {problem}")
    return problems
